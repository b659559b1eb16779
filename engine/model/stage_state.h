/*
 * engine/model/stage_state.h — the operations on a pipeline stage's training state that the
 * trainer (engine/train/) runs between the stage chain's passes, as one table that the CPU stage
 * (engine/model/stage_cpu.h, mp_stage_cpu_state_ops) and the GPU stage (engine/model/stage_gpu.h,
 * mp_stage_gpu_state_ops) both fill: zeroing and scaling the gradients, their norm, ZeRO's part
 * of them, the parameters and the AdamW moments in pieces, AdamW itself, and the memory the
 * trainer's own buffers for them live in (host memory, or the GPU's).
 *
 * Why a table: the trainer's sync, ZeRO and optimizer code is the same on either backend; only
 * where the numbers live and which kernels touch them differ. With the table, the trainer holds
 * one mp_stage_state per chunk and never asks which backend it runs on (Megatron's layer spec
 * idea, DESIGN.md: swapping the backend changes no trainer code). The forward and backward are
 * the stage chain's (engine/model/stage_chain.h), reached through the table too.
 *
 * Pointers the table hands out (grads, params_at, moments_at, a buffer from alloc) are in the
 * backend's memory: host memory on the CPU, device memory on the GPU. Copy them to or from the
 * host with to_host and from_host, never by dereferencing. On the GPU every call returns once
 * its work is enqueued on CUDA's default stream unless it says it synchronises; synchronize
 * waits for it (nothing on the CPU, where every call is done on return).
 */
#ifndef MPENGINE_ENGINE_MODEL_STAGE_STATE_H
#define MPENGINE_ENGINE_MODEL_STAGE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/model/stage_chain.h"
#include "engine/model/stage_layout.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step's numbers, as both stages apply them (tensor by tensor: weight_decay applies to
 * decaying tensors only). */
typedef struct {
  float learning_rate, beta1, beta2, eps, weight_decay;
  int step;         /* 1-based, for bias correction */
  float grad_scale; /* the gradients are taken times this (the clip factor; 1: as they are) */
} mp_stage_adamw;

/* The table; `stage` is an mp_stage_cpu or an mp_stage_gpu, as the table's filler says. Every
 * mp_status call fails as the stage's own function of the same name does (stage_cpu.h,
 * stage_gpu.h), with its message. */
typedef struct {
  const char *backend; /* "cpu" or "cuda", for messages */
  void (*free)(void *stage);
  const mp_stage_layout *(*layout)(const void *stage);
  mp_stage_chain *(*chain)(void *stage);
  size_t (*device_bytes)(const void *stage); /* device memory the stage holds (0 on the CPU) */

  /* --- Parameters: by their place in the flat layout, between host memory and the stage. --- */
  mp_status (*init_params)(void *stage, uint64_t seed, mp_error *err);
  mp_status (*fill_params)(void *stage, mp_stage_fill_fn fill, void *context, mp_error *err);
  mp_status (*read_params)(void *stage, size_t first, size_t count, float *dest, mp_error *err);
  mp_status (*write_params)(void *stage, size_t first, size_t count, const float *src,
                            mp_error *err);
  /* The stored fp32 array (mp_stage_layout_params_floats floats), elements [first, first +
   * count) of it where they are one stretch (else NULL), and the working copy the chain's kernels
   * read for them (the same floats on the CPU; bf16 on the GPU), for ZeRO's gathers. */
  float *(*params)(void *stage);
  float *(*params_at)(void *stage, size_t first, size_t count);
  void *(*weights_at)(void *stage, size_t first, size_t count);
  size_t weight_bytes; /* bytes of one element of the working copy */
  /* The working copy from the fp32 parameters after something other than AdamW changed them
   * (ZeRO's gather); nothing on the CPU. */
  void (*refresh_weights)(void *stage);

  /* --- Gradients --- */
  /* The gradient array (grads_floats floats: the flat layout's, or with windowed block
   * gradients the tensors outside the window, packed) and tensor index's gradient in it. */
  float *(*grads)(void *stage);
  size_t (*grads_floats)(const void *stage);
  float *(*tensor_grad)(void *stage, int index);
  /* Zeroes the gradients (and ZeRO-2's part of them). */
  mp_status (*zero_grads)(void *stage, mp_error *err);
  /* gradients *= scale (the dp mean); with windowed block gradients ZeRO-2's part. */
  void (*scale_grads)(void *stage, float scale);
  /* The squared global norm of the whole gradient (not a windowed stage's); collective over tp. */
  mp_status (*grad_norm_squared)(void *stage, double *out, mp_error *err);

  /* --- ZeRO: this dp rank's part [first, first + count) of the flat layout --- */
  /* Keeps the AdamW moments of the part only (zeroed), and with windowed block gradients the
   * part's gradients; without the call the moments are the whole stage's, made when first
   * needed. */
  mp_status (*keep_moments)(void *stage, size_t first, size_t count, mp_error *err);
  /* ZeRO-2: part += sums (count floats in the stage's memory, elements [first, first + count)
   * inside the part), after the work on stream (NULL: the default stream; ignored on the CPU). */
  mp_status (*add_to_part)(void *stage, const float *sums, size_t first, size_t count,
                           mp_cuda_stream stream, mp_error *err);
  /* ZeRO-2: the part's summed gradients (count floats, in the stage's memory), for a sum over
   * HSDP's replicas (host memory only: HSDP runs on the CPU) or over the ep group; NULL without
   * a part. */
  float *(*grad_part)(void *stage);
  /* ZeRO-2: each tensor's squares over the part (num_tensors doubles of host memory, 0 for a
   * tensor outside it), for a norm the caller sums over dp. */
  mp_status (*part_squares)(void *stage, double *squares, mp_error *err);
  /* The moments of elements [first, first + count) in the stage's memory, for checkpoints. */
  mp_status (*moments_at)(void *stage, size_t first, size_t count, float **adam_m,
                          float **adam_v, mp_error *err);
  /* AdamW on the elements whose moments the stage keeps (the working copy refreshed).
   * Synchronises. */
  mp_status (*adamw)(void *stage, const mp_stage_adamw *adamw, mp_error *err);

  /* --- The backend's memory, for the trainer's buffers beside the stages --- */
  mp_status (*alloc)(void **out, size_t bytes, mp_error *err); /* zeroed on the CPU */
  void (*release)(void *pointer);                             /* NULL is a no-op */
  mp_status (*copy)(void *dest, const void *src, size_t bytes, mp_error *err);
  mp_status (*clear)(void *dest, size_t bytes, mp_error *err);
  mp_status (*to_host)(void *host_dest, const void *src, size_t bytes, mp_error *err);
  mp_status (*from_host)(void *dest, const void *host_src, size_t bytes, mp_error *err);
  mp_status (*synchronize)(mp_error *err); /* the host waits for the work enqueued so far */
  bool on_device;                          /* the memory is the GPU's */
} mp_stage_state_ops;

/* One stage with its table: what the trainer holds per chunk. */
typedef struct {
  const mp_stage_state_ops *ops;
  void *stage;
} mp_stage_state;

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_STAGE_STATE_H */
