/*
 * engine/trainer.h — one optimizer step at a time, on one rank: the global batch of the step from
 * the data loader, split into micro-batches whose gradients accumulate, global gradient-norm
 * clipping, and AdamW with the plan's learning-rate schedule.
 *
 * The caller (tools/cmd_run.c) owns the loop, so it decides what to print, when to stop, and
 * (later) when to save. Accumulation scales each micro-batch's loss by 1 / num_micro_batches, so
 * the update equals the one the whole global batch would give at once.
 */
#ifndef MPENGINE_ENGINE_TRAINER_H
#define MPENGINE_ENGINE_TRAINER_H

#include <stdint.h>

#include "common/error.h"
#include "engine/data_loader.h"
#include "engine/gpt_model.h"
#include "topology/model.h"
#include "topology/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the model computes. */
typedef enum {
  MP_BACKEND_CPU = 0, /* fp32, OpenBLAS */
  MP_BACKEND_CUDA,    /* bf16 weights and activations, fp32 master weights, one GPU */
} mp_backend;

const char *mp_backend_name(mp_backend backend);

typedef struct {
  int64_t step;            /* 0-based */
  double loss;             /* mean over the global batch, nats per token */
  double learning_rate;    /* used by this step's update */
  double grad_norm;        /* global norm before clipping */
  double seconds;          /* wall time of the step */
  double tokens_per_s;     /* global batch tokens / seconds */
  double flops;            /* model FLOPs of the step (forward + backward, Megatron's count) */
} mp_step_metrics;

typedef struct mp_trainer mp_trainer;

/* Builds the model of a one-rank plan (dp = pp = tp = 1) on `backend` and its optimizer state,
 * initialised from plan->training.seed. The trainer borrows plan, model and data; they must
 * outlive it. */
mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err);
void mp_trainer_free(mp_trainer *trainer);

/* The CPU model being trained, or NULL on the CUDA backend. */
mp_gpt *mp_trainer_model(mp_trainer *trainer);

/* The parameter layout (config, tensors) of the model on any backend. */
const mp_gpt_layout *mp_trainer_layout(const mp_trainer *trainer);

/* Replaces the weights with llm.c's GPT-2 checkpoint (see mp_gpt_load_llmc). */
mp_status mp_trainer_load_llmc(mp_trainer *trainer, const char *path, mp_error *err);

/* Copies the fp32 (master) weights to host, mp_gpt_layout_num_params floats. */
mp_status mp_trainer_get_params(mp_trainer *trainer, float *host_params, mp_error *err);

/* Runs optimizer step `step` (0-based) and fills metrics. */
mp_status mp_trainer_step(mp_trainer *trainer, int64_t step, mp_step_metrics *metrics,
                          mp_error *err);

/* Mean loss of the model, without updating it, over the global batch of `step` drawn from data
 * (NULL: the training data). A held-out loader measures generalisation. */
mp_status mp_trainer_evaluate(mp_trainer *trainer, mp_data_loader *data, int64_t step,
                              double *loss, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TRAINER_H */
