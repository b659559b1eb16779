/*
 * engine/train/trainer_internal.h — what the trainer's parts share, private to engine/train/.
 * The trainer (trainer.h) is one object whose work is split by concept, one file each:
 *   trainer.c       its lifecycle and one step (batch, actions, loss, reductions, update)
 *   chunks.c        building this rank's chunks (stages, ZeRO cuts, moments, buffers), weights
 *                   loaded into them, their state in pieces for checkpoints
 *   pipeline_p2p.c  the stage worker's actions and the pipeline's messages (MPI or NCCL)
 *   dp_sync.c       the data-parallel all-reduces with overlap, the sequence-parallel and
 *                   tied-embedding sums, the global norm
 *   zero.c          ZeRO 1-3 and hybrid sharding
 *   optimizer.c     clipping and AdamW on either backend
 *   save_llmc.c     the collective llm.c save
 */
#ifndef MPENGINE_ENGINE_TRAIN_TRAINER_INTERNAL_H
#define MPENGINE_ENGINE_TRAIN_TRAINER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "engine/comm/dp_comm.h"
#include "engine/comm/ep_comm_mpi.h"
#include "engine/model/stage_chain.h"
#include "engine/model/stage_state.h"
#include "engine/train/trainer.h"
#include "pipeline/stage_worker.h"
#include "schedules/schedule.h"

struct zero2_hook;

struct mp_trainer {
  const mp_plan *plan;
  mp_data_loader *data;
  mp_backend backend;
  const mp_param_layout *layout;
  double flops_per_step;  /* forward + backward over the global batch */
  int32_t *inputs;        /* (num_micro_batches * micro_batch, local_seq_len) this step's rows:
                             with context parallelism this cp rank's tokens of them */
  int32_t *targets;       /* same shape */
  int32_t *whole_inputs, *whole_targets; /* cp > 1: the rows whole (seq_len each), cut into
                                            inputs and targets; else NULL */
  int64_t local_seq_len;  /* seq_len / cp: the tokens of each sequence this rank holds */
  /* This rank's chunks (one on one rank) and how a step drives them. */
  mp_trainer_options options;
  mp_tp_comm tp_table;    /* options->tp, or the one-rank table */
  mp_tp_comm cp_table;    /* options->cp, or the one-rank table */
  mp_ep_comm ep_table;    /* options->ep (engine/comm/ep_comm_mpi.h), or the one-rank table */
  int replica_rank;       /* this rank's place among the dp x cp replicas (options->dp) */
  int num_chunks;         /* virtual_stages */
  /* The backend's stage table (engine/model/stage_state.h): every chunk's, and the memory of
   * the trainer's buffers beside them (host memory, or the GPU's). */
  const mp_stage_state_ops *state_ops;
  mp_stage_state *stages;  /* (num_chunks) chunk c holds stage c x pp + pp_rank */
  const mp_stage_layout **layouts; /* (num_chunks) chunk c's layout */
  mp_stage_chain **chains; /* (num_chunks) chunk c's forward and backward */
  size_t *zero_first, *zero_count; /* (num_chunks) */
  float *zero_gather;     /* ZeRO-1: the parameter all-gather's output, dp pieces of zero_piece
                             floats, then its input (zero_part), one piece (the stages'
                             memory) */
  float *zero_part;
  size_t zero_piece;
  size_t device_buffer_bytes; /* what the trainer itself holds on the GPU (zero_gather,
                                 scatter_out) */
  /* ZeRO-2: each chunk's blocks form their gradients in a window that each block's backward
   * reduce-scatters over dp into this rank's part (the same elements as the moments'), which
   * the stage keeps (its table's add_to_part); the tensors outside the blocks accumulate whole
   * and are reduce-scattered once, at the step's end. */
  bool zero2;             /* ZeRO 2 and 3 */
  bool zero3;             /* ZeRO-3: the blocks' parameters sharded too; each block's gathered
                             into the chain's weights window before every pass (on the GPU
                             its bf16 working copy) */
  struct {                 /* ZeRO-3 over NCCL: the block gather posted ahead of its pass */
    void *window;          /* NULL: none */
    size_t first, count;
    int mark;              /* its mp_nccl_comm_mark slot */
  } zero3_prefetch;
  /* ZeRO's cut: zero_size dp ranks (all of dp, or with HSDP one shard group), this rank the
   * zero_rank-th, over zero_comm (NULL alone). */
  int zero_size, zero_rank;
  mp_comm *zero_comm;
  /* The data-parallel collectives on the stages' buffers (engine/comm/dp_comm.h: over NCCL on a
   * GPU whose dp group has it, else over MPI): dp_sync the gradient all-reduces over dp (NULL
   * at dp = 1 unless NCCL checks itself alone), zero_dp ZeRO's over zero_comm (NULL alone),
   * zero_ep ZeRO 2-3's sum of the parts' non-expert gradients over the ep group (MPI, staged
   * through the host on the GPU; NULL without ep or below ZeRO-2). */
  mp_dp_comm *dp_sync;
  mp_dp_comm *zero_dp;
  mp_dp_comm *zero_ep;
  struct zero2_hook *zero2_hooks; /* (num_chunks) the chains' hook contexts */
  float *scatter_out;     /* a reduce-scatter's output before it is added into a part (the
                             stages' memory) */
  size_t scatter_floats;
  size_t *scatter_counts; /* (dp) */
  mp_schedule schedule;
  mp_stage_worker *worker;
  mp_schedule eval_schedule;  /* the same layout's forward-only list (a held-out loss) */
  mp_stage_worker *eval_worker;
  bool evaluating;            /* the eval worker runs: its messages stay out of the trace */
  mp_nccl_p2p_op *nccl_sends; /* NCCL pipeline: sends posted but not yet enqueued, which go with
                                 this rank's next receive (or the step's end) in one group */
  int num_nccl_sends, nccl_send_capacity;
  int64_t step;           /* the step being run, for the trace */
  double loss_sum;        /* the last stage's micro-batch losses of the step */
};

/* ---- ZeRO-2: the gradients reduce-scattered over dp into each rank's part ------------------ */

struct zero2_hook {
  mp_trainer *trainer;
  int chunk;
};

/* ---- trainer.c: the lifecycle and the step ---- */

double mp_train_trace_now(const mp_trainer *trainer);

/* ---- chunks.c: this rank's chunks ---- */

mp_status mp_train_create_chunks(mp_trainer *trainer, const mp_model *model, mp_error *err);

/* Flat elements [first, first + count) of chunk c's parameters between host memory and wherever
 * the backend keeps them (the stage table's read_params and write_params). */
mp_status mp_train_read_params(mp_trainer *trainer, int c, size_t first, size_t count,
                               float *dest, mp_error *err);
mp_status mp_train_write_params(mp_trainer *trainer, int c, size_t first, size_t count,
                                const float *src, mp_error *err);

/* ---- pipeline_p2p.c: the stage worker's actions and pipeline messages ---- */

/* The stage worker's callbacks over this trainer: its chunks' actions, the pipeline's
 * point-to-point messages (device buffers on the GPU), and the trace's observer. */
void mp_train_worker_callbacks(mp_trainer *trainer, mp_stage_ops *ops, mp_stage_p2p *p2p,
                               mp_stage_observer *observer);

/* ---- dp_sync.c: the data-parallel sync and the gradients' finalisation ---- */

/* *value summed over comm's members in rank order, bitwise the same on every member. */
mp_status mp_train_sum_double_over(mp_comm *comm, double *value, mp_error *err);

/* The stage worker's hook after a chunk's last backward (or W): its dp all-reduce starts while the
 * other chunks' backwards run. On the GPU the blocks' gradients were posted one by one inside that
 * action (gpu_overlap_dp, block_grads_ready): only the tensors outside the blocks remain. */
mp_status mp_train_post_chunk_all_reduce(void *context, int chunk, mp_error *err);

/* During a GPU chunk's last backward of the step: block gradients [offset, offset + count) are
 * complete once the kernels enqueued so far ran; their dp all-reduce goes now (Megatron's
 * overlapped gradient buckets). */
mp_status mp_train_block_grads_ready(void *context, float *grads, size_t first, size_t count,
                                     mp_error *err);

/* Waits for every posted dp all-reduce (all of them, even after a failure, so none is left
 * pending on a buffer the trainer may free). */
mp_status mp_train_wait_dp_all_reduces(mp_trainer *trainer, mp_error *err);

/* Steps 3-4 of the file comment, after the stage worker has run the step's actions (the dp
 * all-reduces already started inside it), on the chunks' host or GPU gradients: the dp mean, the
 * sequence-parallel layernorm sums, the tied embedding, and the global norm into *grad_norm. */
mp_status mp_train_reduce_step_grads(mp_trainer *trainer, double *grad_norm, mp_error *err);

/* `--gpu-comm nccl` without data parallelism: the chunks' gradients through the dp group's
 * communicator anyway (a sum over one member leaves them as they are: a check of NCCL on one
 * GPU). */
mp_status mp_train_sum_grads_alone(mp_trainer *trainer, mp_error *err);

/* ---- zero.c: ZeRO 1-3 and hybrid sharding ---- */

/* The chain's hook after each block's backward: the window's gradients into the parts. */
mp_status mp_train_zero2_block_grads(void *context, float *grads, size_t first, size_t count,
                                     mp_error *err);

/* ZeRO-3, the chain's weights hook: block weights [first, first + count) of chunk c into the
 * window before a pass over the block. Over NCCL with a next block (two windows), that block's
 * gather is posted now into the other window, ahead of its pass (torchtitan's and FSDP's
 * prefetch): it runs while this pass computes, and the next call only makes the compute stream
 * wait for it, through its mark, not for the reduce-scatters posted behind it. */
mp_status mp_train_zero3_block_weights(void *context, void *window, size_t first, size_t count,
                                       const mp_stage_weights_next *next, mp_error *err);

/* ZeRO-3, --save-weights: elements [first, first + count) of chunk c's flat parameters onto dp
 * rank 0's dest, from the dp ranks whose parts hold them (every dp rank calls it; the others'
 * dest is a send buffer of count floats). */
mp_status mp_train_zero3_collect(mp_trainer *trainer, int c, size_t first, size_t count,
                                 float *dest, mp_error *err);

/* At the step's end: the gradients that stayed in chunk c's packed array (the tensors outside
 * the blocks; with zb-h1 the blocks' norms and biases too), run by run of tensors adjacent in
 * the flat layout, into the parts in buckets. */
mp_status mp_train_zero2_array_grads(mp_trainer *trainer, int c, mp_error *err);

/* ZeRO 2-3 with expert parallelism: the part's gradients of the tensors other than the experts
 * (part: chunk c's gradient part, elements [zero_first, + zero_count) of its flat layout), which
 * the reduce-scatters summed over the expert-dp group only, summed over the ep group too (whose
 * ranks hold the same part of the same tensors there); the experts' parts stay: they hold their
 * own experts. */
mp_status mp_train_zero2_sum_over_ep(mp_trainer *trainer, int c, float *part, mp_error *err);

/* The squared global norm of chunk c's gradient from the dp ranks' parts: each tensor's squares
 * over this rank's part of it, summed over dp in rank order (so bitwise the same everywhere),
 * then over tp as the stage counts them (mp_stage_norm_from_squares). Collective over dp and
 * tp. */
mp_status mp_train_zero2_norm_squared(mp_trainer *trainer, int c, double *out, mp_error *err);

/* Floats per dp rank in one piece of ZeRO-1's parameter all-gather: all of a part when it is
 * small, else its share of ZERO_GATHER_PIECE_FLOATS. */
size_t mp_train_zero_piece_floats(size_t part, int dp);

/* After chunk c's update: its parameters whole again on every dp rank of its ZeRO group
 * (ZeRO 1-2: all of them; ZeRO-3: the tensors outside the blocks), and on the GPU the bf16
 * working copy refreshed. Nothing without ZeRO. */
mp_status mp_train_zero_gather_updated(mp_trainer *trainer, int c, mp_error *err);

/* ---- optimizer.c: clipping and AdamW ---- */

/* After mp_train_reduce_step_grads: every chunk's AdamW step (its ZeRO part) with the settings
 * of trainer->step (mp_trainer_adamw_settings: the schedule's learning rate, the gradients
 * clipped to the global norm grad_norm), then ZeRO's parameter gather. */
mp_status mp_train_optimizer_step(mp_trainer *trainer, double grad_norm, mp_error *err);

#endif /* MPENGINE_ENGINE_TRAIN_TRAINER_INTERNAL_H */
