/*
 * engine/trainer.h — one optimizer step at a time, on one rank or on one tensor-parallel group:
 * the global batch of the step from the data loader, split into micro-batches whose gradients
 * accumulate, global gradient-norm clipping, and AdamW with the plan's learning-rate schedule.
 *
 * Tensor parallelism (dp = pp = 1, tp >= 1, CPU backend; mp_trainer_create_parallel): every rank
 * of the group reads the same global batch and trains its shard (engine/gpt_model_tp.h). Once per
 * step, after the last micro-batch, the sequence-parallel layernorm gradients are summed over the
 * group; the global gradient norm sums every sharded tensor's squares over the group and counts
 * each replicated tensor once, identically on every rank, so clipping agrees; AdamW then updates
 * each rank's shard. The loss, learning rate and norm are the same on every rank.
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
#include "engine/gpt_model_tp.h"
#include "tensor_parallel/tp_comm.h"
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
 * outlive it. MP_ERR_INPUT naming the plan file for any other plan. */
mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err);

/* MP_OK when this trainer can run the plan's layout (dp = pp = 1, any tp); else MP_ERR_INPUT
 * naming the plan file and the layout. mp_trainer_create_parallel checks it too; `mpengine run`
 * calls it before launching ranks. */
mp_status mp_trainer_check_layout(const mp_plan *plan, mp_error *err);

/* What a parallel run adds to mp_trainer_create. Start from MP_TRAINER_OPTIONS_INITIALIZER so
 * fields added later get their defaults. */
typedef struct {
  size_t size;          /* sizeof(mp_trainer_options) */
  const mp_tp_comm *tp; /* this rank's tensor-parallel group (engine/tp_comm_mpi.h), copied; its
                           context must outlive the trainer. NULL: one rank */
} mp_trainer_options;

#define MP_TRAINER_OPTIONS_INITIALIZER {sizeof(mp_trainer_options), NULL}

/* mp_trainer_create for a plan with dp = pp = 1 and any tp: with tp > 1 on the CPU backend, over
 * options->tp (size tp), training this rank's shard; every rank of the group calls it, and every
 * later call, in the same order. tp = 1 is the one-rank trainer. MP_ERR_INPUT naming the plan
 * file when dp or pp is not 1, tp > 1 on the CUDA backend, the group's size differs from the
 * plan's tp, or the model does not divide over tp (gpt_model_tp.h). options may be NULL. */
mp_status mp_trainer_create_parallel(const mp_plan *plan, const mp_model *model,
                                     mp_data_loader *data, mp_backend backend,
                                     const mp_trainer_options *options, mp_trainer **out,
                                     mp_error *err);
void mp_trainer_free(mp_trainer *trainer);

/* The one-rank CPU model being trained, or NULL on the CUDA backend or with tp > 1. */
mp_gpt *mp_trainer_model(mp_trainer *trainer);

/* The tensor-parallel shard being trained (tp > 1), or NULL. */
mp_gpt_tp *mp_trainer_model_tp(mp_trainer *trainer);

/* Tensor-parallel size of the run (1 on one rank). */
int mp_trainer_tp(const mp_trainer *trainer);

/* The parameter layout (config, tensors) of the model on any backend. */
const mp_gpt_layout *mp_trainer_layout(const mp_trainer *trainer);

/* Replaces the weights with llm.c's GPT-2 checkpoint (see mp_gpt_load_llmc); with tp > 1 every
 * rank reads the file and keeps its shard. */
mp_status mp_trainer_load_llmc(mp_trainer *trainer, const char *path, mp_error *err);

/* Copies the fp32 (master) weights to host, mp_gpt_layout_num_params floats: the full model in
 * the one-rank layout. With tp > 1 it gathers the shards (collective: every rank calls it, and
 * every rank gets the full model). */
mp_status mp_trainer_get_params(mp_trainer *trainer, float *host_params, mp_error *err);

/* This rank's CPU training state, for checkpoints (engine/checkpoint.h): the flat fp32 parameter
 * array (this rank's shard in mp_gpt_tp's order with tp > 1, else the one-rank layout's array) and
 * AdamW's first and second moments in the same order, *count floats each. AdamW keeps no other
 * state: its bias correction is a function of the step. The caller may read or overwrite them
 * between steps. MP_ERR_INPUT on the CUDA backend, whose optimizer state lives on the GPU
 * (checkpointing it is not implemented yet; use --backend cpu). */
mp_status mp_trainer_cpu_state(mp_trainer *trainer, float **params, float **adam_m,
                               float **adam_v, size_t *count, mp_error *err);

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
