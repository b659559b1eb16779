/*
 * engine/gpt_model_gpu.h — the one-rank GPT on a CUDA GPU, in mixed precision.
 *
 * The same model and the same flat parameter layout as the CPU model (gpt_model.h): fp32 master
 * weights, AdamW moments and gradients on the device, a bf16 working copy of the weights that the
 * kernels read, and bf16 activations. GEMMs run on cuBLAS tensor cores in bf16 with fp32
 * accumulation; weight gradients accumulate in fp32 across micro-batches. Every kernel is a CUDA
 * twin of a layers/ CPU kernel, tested against it.
 *
 * Attention is fused (flash attention: no T x T matrix kept) for the head sizes the fused kernels
 * support, and cuBLAS batched GEMMs around a softmax otherwise; MPENGINE_ATTENTION=cublas in the
 * environment forces the latter, for benchmarks. Everything runs on CUDA's default stream, in
 * order. It is the whole model as one GPU pipeline stage (engine/gpt_stage_gpu.h) at tp = 1, so
 * one-GPU and multi-rank runs share one model code. A build without CUDA compiles
 * gpt_model_gpu_none.c instead, whose create says so.
 */
#ifndef MPENGINE_ENGINE_GPT_MODEL_GPU_H
#define MPENGINE_ENGINE_GPT_MODEL_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/gpt_model.h"
#include "engine/gpt_stage_gpu.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_gpt_gpu mp_gpt_gpu;

/* Lays the model out (refusing what the runtime cannot run, like mp_gpt_create) and allocates
 * weights, gradients, optimizer state and one micro-batch of (micro_batch, seq_len) activations
 * on the current GPU. Parameters start at zero: set them with mp_gpt_gpu_set_params. */
mp_status mp_gpt_gpu_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt_gpu **out,
                            mp_error *err);
void mp_gpt_gpu_free(mp_gpt_gpu *gpt);

const mp_gpt_layout *mp_gpt_gpu_layout(const mp_gpt_gpu *gpt);

/* Bytes of device memory the model holds. */
size_t mp_gpt_gpu_device_bytes(const mp_gpt_gpu *gpt);

/* Copies fp32 parameters in the layout's flat order (mp_gpt_layout_num_params floats) to the
 * master weights and their bf16 copy; resets the AdamW moments. */
mp_status mp_gpt_gpu_set_params(mp_gpt_gpu *gpt, const float *host_params, mp_error *err);
mp_status mp_gpt_gpu_get_params(mp_gpt_gpu *gpt, float *host_params, mp_error *err);
mp_status mp_gpt_gpu_get_grads(mp_gpt_gpu *gpt, float *host_grads, mp_error *err);

/* For checkpoints: the master weights and the AdamW moments (mp_gpt_layout_num_params floats
 * each, host memory) from the device, and back (the bf16 copy refreshed). Synchronise. */
mp_status mp_gpt_gpu_get_state(mp_gpt_gpu *gpt, float *host_params, float *adam_m, float *adam_v,
                               mp_error *err);
mp_status mp_gpt_gpu_set_state(mp_gpt_gpu *gpt, const float *host_params, const float *adam_m,
                               const float *adam_v, mp_error *err);

mp_status mp_gpt_gpu_zero_grads(mp_gpt_gpu *gpt, mp_error *err);

/* Forward of one micro-batch of (B, T) host token ids; the loss kernel also leaves the logits'
 * gradient for dloss x the mean loss in place, ready for mp_gpt_gpu_backward. *loss is the mean
 * cross-entropy over the B * T tokens. */
mp_status mp_gpt_gpu_forward(mp_gpt_gpu *gpt, const int32_t *inputs, const int32_t *targets,
                             float dloss, double *loss, mp_error *err);

/* Backward of the last forward, accumulating (+=) into the fp32 gradients. */
mp_status mp_gpt_gpu_backward(mp_gpt_gpu *gpt, mp_error *err);

/* The fp32 gradient array on the device (mp_gpt_layout_num_params floats), for the
 * data-parallel all-reduce. The model's kernels run on the default stream: synchronise
 * (mp_device_synchronize) before a communicator reads it. */
float *mp_gpt_gpu_device_grads(mp_gpt_gpu *gpt);

/* gradients *= scale on the device (the 1/dp of a data-parallel mean); synchronises. */
mp_status mp_gpt_gpu_scale_grads(mp_gpt_gpu *gpt, float scale, mp_error *err);


/* Global gradient norm (before clipping) into *grad_norm, clipping, and AdamW on every tensor;
 * refreshes the bf16 weights from the updated fp32 masters. */
mp_status mp_gpt_gpu_optimizer_step(mp_gpt_gpu *gpt, const mp_gpu_adamw *adamw,
                                    double *grad_norm, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_GPT_MODEL_GPU_H */
