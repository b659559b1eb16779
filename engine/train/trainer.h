/*
 * engine/train/trainer.h — one optimizer step at a time, on one rank or on a dp x pp x tp grid of
 * ranks: the global batch of the step from the data loader, split into micro-batches whose
 * gradients accumulate, global gradient-norm clipping, and AdamW with the plan's learning-rate
 * schedule.
 *
 * Parallel runs (CPU backend; mp_trainer_create_parallel with the rank's groups). Each pipeline
 * rank holds its chunks (virtual_stages of them), each one stage of the chain embedding, blocks,
 * final norm, LM head cut by the plan's layers_per_stage (or, when the plan has none, by the cost
 * model's split, topology/cost_model.h, as `mpengine plan` would), as its tensor-parallel shard
 * (engine/model/stage_cpu.h). A step:
 *   1. dp rank d reads its slice of the global batch: samples [d x n, (d+1) x n), n = micro_batch
 *      x num_micro_batches (engine/data/data_loader.h reshuffles every epoch from the seed, the
 * same
 *      on every layout);
 *   2. the stage worker (pipeline/stage_worker.h) runs this rank's action list of the plan's
 *      schedule: activations and input gradients cross pipeline ranks with eager sends;
 *   3. sequence-parallel layernorm gradients are summed over tp; the tied embedding's gradient is
 *      summed over the embedding group (first and last pipeline rank); gradients are averaged
 *      over dp in all-reduces of MP_TRAINER_BUCKET_FLOATS-float buckets, each chunk's posted
 *      (non-blocking) as soon as its last backward ends, so with interleaving or zb-h1 they
 *      overlap the backwards still to run; they are waited on after the last action;
 *   4. the global gradient norm: every stage's squares (tp shards summed, replicated tensors and
 *      the tied copy counted once) summed over pp in rank order, identical on every rank;
 *   5. clipping and AdamW; with zero_stage 1 (ZeRO-1) dp rank d keeps AdamW's moments of its
 *      1/dp of each chunk's parameters only, updates that part and all-gathers the parameters
 *      in pieces (a bounded buffer, not one of the chunk).
 * ZeRO-2 (zero_stage 2) keeps the gradients of the same part only: the chunk's chain forms
 * each block's gradient in a one-block window (engine/model/stage_cpu.h, windowed_block_grads)
 * that its hook reduce-scatters over dp into the rank's part after every block of every
 * micro-batch's backward (summed over tp first with sequence parallelism; with zb-h1 only the
 * GEMM weights', after every block of every W); the other tensors (embedding, final norm, head;
 * with zb-h1 the blocks' norms and biases) accumulate whole and are reduce-scattered once, after
 * step 3's tied-embedding sum; the norm (each tensor's squares over
 * the parts, summed over dp in rank order), clipping and AdamW run on the parts, then the
 * parameters are all-gathered as with ZeRO-1. ZeRO-3 (zero_stage 3, CPU backend, not zb-h1)
 * keeps of the blocks' parameters only the part too (mp_stage_zero): each block's weights are
 * gathered over dp into the chain's weights window before its forward, recomputed forward and
 * backward (its weights hook), and after the update only the tensors outside the blocks, which
 * every rank keeps whole, are gathered.
 * Expert parallelism (the plan's ep > 1, options->ep and expert_dp): each chunk holds its ep
 * rank's experts only and its MoE layers send tokens to them over the ep group
 * (expert_parallel/ep_dispatch.h); the experts' gradients are summed over the
 * expert-data-parallel group (the rest over dp x cp as above, both then divided by dp x cp), the
 * norm counts each expert once (its squares summed over the ep group), and ZeRO cuts the state
 * over the expert-data-parallel group (ZeRO 2-3 then sum the parts of the other tensors over the
 * ep group too).
 * The loss, averaged over the global batch, is known on every rank after the step. Every rank of
 * the job calls every function in the same order.
 *
 * One step path for every layout and backend: the one-rank run is the same path at dp = pp =
 * tp = 1 (one chunk holding the whole chain, the stage worker running the schedule's actions on
 * it).
 *
 * The CUDA backend runs each chunk on the rank's GPU (engine/model/stage_gpu.h, the twin of the CPU
 * chunk, which keeps only the tensor table: the state is on the device) through the same stage
 * worker and schedule; on one GPU with
 * options->nccl_dp the gradients still pass through that one-member communicator (a check of
 * NCCL). Boundary buffers live on the GPU and
 * travel over NCCL (options->nccl_pp; a send waits in this rank's next group of point-to-point
 * operations, with its next receive, as Megatron batches send_forward_recv_backward) or MPI
 * staging; steps 2-5 run on device gradients, the dp all-reduce of each block posted during the
 * chunk's last backward or, with zb-h1, its last W (NCCL with options->nccl_dp, else non-blocking
 * MPI staging; ZeRO-2 reduce-scatters each block from a device window instead), ZeRO 1 and 2
 * gathering the parameters on the device. Sequence parallelism, zb-h1 and
 * full recomputation run as on the CPU.
 *
 * The caller (tools/cmd_run.c) owns the loop, so it decides what to print, when to stop, and
 * (later) when to save. Accumulation scales each micro-batch's loss by 1 / num_micro_batches, so
 * the update equals the one the whole global batch would give at once.
 */
#ifndef MPENGINE_ENGINE_TRAINER_H
#define MPENGINE_ENGINE_TRAINER_H

#include <stdint.h>

#include "common/error.h"
#include "engine/data/data_loader.h"
#include "engine/model/param_layout.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "engine/model/stage_cpu.h"
#include "engine/trace/trace.h"
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

/* The AdamW settings of 0-based step `step` of `training`, as mp_trainer_step hands them to
 * every stage: the schedule's learning rate (mp_training_learning_rate), beta1, beta2, eps and
 * weight_decay (applied by the stage to its decaying tensors only), the 1-based step for bias
 * correction, and the clip factor of the global gradient norm grad_norm against grad_clip
 * (mp_clip_scale). Pure; it cannot fail. */
mp_stage_adamw mp_trainer_adamw_settings(const mp_training_config *training, int64_t step,
                                         double grad_norm);

/* Builds the model of a one-rank plan (dp = pp = tp = 1) on `backend` and its optimizer state,
 * initialised from plan->training.seed. The trainer borrows plan, model and data; they must
 * outlive it. MP_ERR_INPUT naming the plan file for any other plan. */
mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err);

/* MP_OK when this trainer can run the plan's layout on `backend` (both backends run the same
 * layouts, but ZeRO-3 and hybrid sharding on the CPU only); else MP_ERR_INPUT naming the plan
 * file and what to change (full recomputation or ZeRO-3 with zb-h1; ZeRO-3 or hybrid sharding
 * on the CUDA backend). mp_trainer_create_parallel checks it too; `mpengine run` calls it
 * before launching ranks. */
mp_status mp_trainer_check_layout(const mp_plan *plan, mp_backend backend, mp_error *err);

/* What a parallel run adds to mp_trainer_create. Start from MP_TRAINER_OPTIONS_INITIALIZER so
 * fields added later get their defaults. */
typedef struct {
  size_t size;          /* sizeof(mp_trainer_options) */
  const mp_tp_comm *tp; /* this rank's tensor-parallel group (engine/comm/tp_comm_mpi.h), copied;
                           its context must outlive the trainer. NULL: tp = 1 */
  mp_comm *pp;          /* the pipeline group, members in pipeline-rank order; NULL: pp = 1 */
  mp_comm *dp;          /* the ranks that hold the same weights: the dp x cp group
                           (topology/grid.h's dp-cp; the dp group when cp = 1), which gradients
                           are summed and ZeRO's state cut over; NULL: dp = cp = 1 */
  mp_comm *cp;          /* the context-parallel group (the ranks sharing each sequence); NULL:
                           cp = 1 */
  mp_comm *embedding;   /* the first and last pipeline rank (topology/grid.h); NULL: pp = 1 */
  int dp_rank, pp_rank; /* this rank's coordinates (topology/grid.h); dp_rank picks its rows of
                           the global batch */
  mp_trace *trace;      /* records actions and communication (engine/trace/trace.h); NULL: none */
  mp_nccl_comm *nccl_dp; /* CUDA backend: the data-parallel group on NCCL (on one rank: the
                            gradients still pass through it, a check of NCCL); NULL: they go
                            through options->dp, which stages them through the host (several
                            ranks may then share one GPU) */
  mp_nccl_comm *nccl_pp; /* CUDA backend, pp > 1: the pipeline group on NCCL (same members, same
                            order as options->pp) for the activations and their gradients; NULL:
                            over options->pp through the host */
  const mp_tp_comm *cp_device; /* CUDA backend, cp > 1: the context-parallel group on NCCL for
                                  the key/value exchange, copied; NULL: options->cp (MPI, through
                                  the host) */
  const mp_tp_comm *tp_device; /* CUDA backend, tp > 1: the tensor-parallel group for collectives
                                  on device buffers (engine/comm/tp_comm_nccl.h), copied; NULL:
                                  options->tp through the host */
  /* HSDP (the plan's zero_shard_size below dp): this rank's group of zero_shard_size
   * consecutive dp ranks, which cut the ZeRO state between them (group rank = dp rank mod the
   * size), and its replica group (the dp ranks of the same group rank in the other groups);
   * NULL: ZeRO over all of options->dp. */
  mp_comm *zero_shard, *zero_replica;
  /* Expert parallelism (the plan's ep > 1, either backend), folded over the dp x cp replicas
   * (topology/grid.h): ep, this rank's ep group (its chunks hold that ep rank's experts, and
   * their MoE layers send tokens over it); expert_dp, the replicas holding the same experts,
   * which the experts' gradients are summed over (everything else over dp as before). NULL:
   * ep 1. */
  mp_comm *ep, *expert_dp;
  /* CUDA backend, ep > 1: the ep group on NCCL for the MoE rows on device buffers
   * (engine/comm/ep_comm_nccl.h), copied; NULL: over options->ep through the host. */
  const mp_ep_comm *ep_device;
} mp_trainer_options;

#define MP_TRAINER_OPTIONS_INITIALIZER \
  {sizeof(mp_trainer_options), NULL, NULL, NULL, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, \
   NULL, NULL, NULL, NULL, NULL}

/* Gradients cross the data-parallel group in all-reduces of at most this many floats. */
enum { MP_TRAINER_BUCKET_FLOATS = 1 << 22 };
/* GPU gradients all-reduced over MPI (several ranks on one GPU) are staged through a pinned host
 * block of a bucket each: at most this many buckets are in flight, so the staging stays a few
 * buckets, not a host copy of the gradients. */
enum { MP_TRAINER_STAGED_IN_FLIGHT = 2 };

/* mp_trainer_create for any layout: dp x pp x tp > 1 on either backend, over the groups in
 * options, training this rank's chunks (see the file comment); every rank of the job calls it,
 * and every later call, in the same order. dp = pp = tp = 1 is the one-rank trainer. MP_ERR_INPUT
 * naming the plan file when the layout cannot run on backend, a group's size differs from the
 * plan, the schedule cannot run the plan's numbers, the stage split is bad, or the model does not
 * divide over tp (stage_cpu.h). options may be NULL on one rank. */
mp_status mp_trainer_create_parallel(const mp_plan *plan, const mp_model *model,
                                     mp_data_loader *data, mp_backend backend,
                                     const mp_trainer_options *options, mp_trainer **out,
                                     mp_error *err);
void mp_trainer_free(mp_trainer *trainer);

/* The CPU shard of the whole model being trained (pp = 1, one chunk; on one rank the whole model
 * in the one-rank layout's order), or NULL (another layout, or the CUDA backend). */
mp_stage_cpu *mp_trainer_model_tp(mp_trainer *trainer);

/* This rank's model chunks (virtual_stages of them, chunk c holds stage c x pp + pp_rank; one on
 * one rank): each one's layout on either backend, and its CPU stage (NULL on the CUDA backend,
 * whose GPU stages own their state on the device; read and write it with
 * mp_trainer_read_state and mp_trainer_write_state). */
int mp_trainer_num_chunks(const mp_trainer *trainer);
const mp_stage_layout *mp_trainer_chunk_layout(const mp_trainer *trainer, int chunk);
mp_stage_cpu *mp_trainer_chunk(mp_trainer *trainer, int chunk);

/* Bytes of device memory this rank's GPU stages hold (parameters, their bf16 copy, gradients,
 * moments, activation slots, windows, kernels' workspace), with the trainer's own device
 * buffers (ZeRO's pieces); 0 on the CPU backend. */
size_t mp_trainer_device_bytes(const mp_trainer *trainer);

/* What the trainer really runs, read from its chunks rather than from the plan, so that an option
 * the trainer dropped shows (`run` prints it; the tests assert it):
 *   zero_stage     3 when the chunks gather their block weights into a window before each pass,
 *                  2 when they form block gradients in a window, 1 when this rank keeps the AdamW
 *                  moments of a part of its chunks only, else 0
 *   zero_ranks     the ranks ZeRO's parts are cut over (1 without ZeRO)
 *   zero_replicas  hybrid sharding: the groups that hold the same parts (1 otherwise)
 *   recompute      the chunks' recomputation (mp_stage_chain_recompute) */
typedef struct {
  int zero_stage, zero_ranks, zero_replicas;
  mp_recompute recompute;
} mp_trainer_effective;
void mp_trainer_effective_of(const mp_trainer *trainer, mp_trainer_effective *out);

/* Tensor-parallel size of the run (1 on one rank). */
int mp_trainer_tp(const mp_trainer *trainer);

/* The parameter layout (config, tensors) of the model on any backend. */
const mp_param_layout *mp_trainer_layout(const mp_trainer *trainer);

/* Replaces the weights with those at path (engine/weights/weight_source.h: an llm.c GPT-2 file, or
 * a Hugging Face GPT2LMHeadModel directory); in a parallel run each rank reads only the byte ranges
 * of its own shards. Errors of the source. */
mp_status mp_trainer_load_weights(mp_trainer *trainer, const char *path, mp_error *err);

/* Writes the fp32 (master) weights as llm.c's GPT-2 checkpoint (version 3) at path. In a parallel
 * run it is collective: the file is written by world rank 0 (dp, pp, tp = 0), the shards streamed
 * to it tensor by tensor in bounded pieces (no rank holds the full model); the bytes equal the
 * one-rank run's file at the same weights. */
mp_status mp_trainer_save_llmc(mp_trainer *trainer, const char *path, mp_error *err);

/* A chunk's training state (0 .. mp_trainer_num_chunks - 1), for checkpoints
 * (engine/checkpoint/checkpoint.h): its fp32 parameters, params_count floats in the flat shard
 * layout of mp_trainer_chunk_layout (with ZeRO-3 this rank keeps of its blocks only its part,
 * mp_stage_layout_held_params), and AdamW's first and second moments of elements [moments_first,
 * moments_first + moments_count) of that layout: all of them without ZeRO, this dp rank's part
 * with ZeRO (dp rank d holds part d of dp equal parts of ceil(params_count / dp) floats, the
 * last one shorter). AdamW keeps no other state: its bias correction is a function of the step.
 * MP_ERR_INPUT when chunk is out of range. */
typedef struct {
  size_t params_count;
  size_t moments_first, moments_count;
} mp_trainer_chunk_state;

mp_status mp_trainer_chunk_state_of(const mp_trainer *trainer, int chunk,
                                    mp_trainer_chunk_state *out, mp_error *err);

typedef enum { MP_TRAINER_PARAMS = 0, MP_TRAINER_ADAM_M, MP_TRAINER_ADAM_V } mp_trainer_array;

/* Elements [first, first + count) (flat indices of the chunk's layout) of one of its arrays,
 * copied into dest (host memory) or written from src, wherever the backend keeps them: the host
 * arrays on the CPU, the GPU's on CUDA (the bf16 copy follows a write), so that a checkpoint
 * moves the state in pieces and no host copy of it exists. Between steps; synchronise on the
 * GPU. MP_ERR_INPUT for elements this rank does not keep (another dp rank's ZeRO part). */
mp_status mp_trainer_read_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                size_t first, size_t count, float *dest, mp_error *err);
mp_status mp_trainer_write_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                 size_t first, size_t count, const float *src, mp_error *err);

/* Runs optimizer step `step` (0-based) and fills metrics. */
mp_status mp_trainer_step(mp_trainer *trainer, int64_t step, mp_step_metrics *metrics,
                          mp_error *err);

/* Mean loss of the model, without updating it, over global batch number `batch` of data (NULL:
 * the training data; a held-out loader measures generalisation): the same layout's forward-only
 * schedule (schedules/schedule.h, mp_schedule_generate_forward_only) run by the same stage
 * worker, the head stage's losses broadcast over pp and averaged over dp, so every rank of every
 * layout returns the one-rank run's number (to float round-off of the dp mean). Collective over
 * every group, like a step; leaves the weights, gradients and optimizer state as they were. */
mp_status mp_trainer_evaluate(mp_trainer *trainer, mp_data_loader *data, int64_t batch,
                              double *loss, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TRAINER_H */
