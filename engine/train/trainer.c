/* engine/train/trainer.c — the optimizer step on one rank or one tensor-parallel group; see trainer.h. */
#include "engine/train/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/device/device.h"
#include "engine/model/gpt_stage_gpu.h"
#include "engine/weights/weight_source.h"
#include "engine/model/stage_chain.h"
#include "engine/comm/tp_comm_mpi.h"
#include "layers/adamw.h"
#include "pipeline/stage_worker.h"
#include "topology/cost_model.h"
#include "topology/layer_cost.h"

struct mp_trainer {
  const mp_plan *plan;
  mp_data_loader *data;
  mp_backend backend;
  const mp_gpt_layout *layout;
  double flops_per_step;  /* forward + backward over the global batch */
  int32_t *inputs;        /* (num_micro_batches * micro_batch, T) this step's rows */
  int32_t *targets;       /* same shape */
  /* This rank's chunks (one on one rank) and how a step drives them. */
  mp_trainer_options options;
  mp_tp_comm tp_table;    /* options->tp, or the one-rank table */
  int num_chunks;         /* virtual_stages */
  mp_gpt_tp **chunks;     /* (num_chunks) chunk c holds stage c x pp + pp_rank */
  mp_gpt_stage_gpu **gpu_chunks; /* CUDA backend: chunk c on the GPU, the twin of chunks[c]
                                    (which then is its tensor table, and keeps no arrays) */
  mp_stage_chain **chains; /* (num_chunks) chunk c's forward and backward, on either backend */
  float **chunk_m, **chunk_v; /* CPU: AdamW moments per chunk: its whole array, or with ZeRO
                                 this dp rank's part [zero_first, zero_first + zero_count) */
  size_t *zero_first, *zero_count; /* (num_chunks) */
  float *zero_gather;     /* ZeRO-1: the parameter all-gather's output, dp pieces of zero_piece
                             floats, then its input (zero_part), one piece */
  float *zero_part;
  size_t zero_piece;
  float *zero_gather_device; /* the same on the GPU, for a GPU run */
  size_t device_buffer_bytes; /* what the trainer itself holds on the GPU (the two above) */
  /* ZeRO-2: each chunk's blocks form their gradients in a window that each block's backward
   * reduce-scatters over dp into this rank's part (the same elements as the moments'): on the
   * CPU grad_part, on the GPU the stage's (mp_gpt_stage_gpu_add_to_part); the tensors outside
   * the blocks accumulate whole and are reduce-scattered once, at the step's end. */
  bool zero2;             /* ZeRO 2 and 3 */
  bool zero3;             /* ZeRO-3: the blocks' parameters sharded too; each block's gathered
                             into the chain's weights window before every pass (on the GPU
                             its bf16 working copy) */
  float *zero3_outside_piece; /* the same: a host piece of the tensors outside the blocks
                                 (MP_TRAINER_BUCKET_FLOATS at most), made at the first update */
  uint16_t *zero3_staging; /* ZeRO-3 on a GPU whose dp group has no NCCL: a block's bf16
                              weights (the largest block's), staged through the host */
  struct {                 /* ZeRO-3 over NCCL: the block gather posted ahead of its pass */
    void *window;          /* NULL: none */
    size_t first, count;
    int mark;              /* its mp_nccl_comm_mark slot */
  } zero3_prefetch;
  /* ZeRO's cut: zero_size dp ranks (all of dp, or with HSDP one shard group), this rank the
   * zero_rank-th, over zero_comm (NULL alone). */
  int zero_size, zero_rank;
  mp_comm *zero_comm;
  float **grad_part;      /* CPU: (num_chunks) zero_count floats each */
  struct zero2_hook *zero2_hooks; /* (num_chunks) the chains' hook contexts */
  float *scatter_out;     /* a reduce-scatter's output before it is added into a part (device
                             memory on the GPU) */
  size_t scatter_floats;
  size_t *scatter_counts; /* (dp) */
  mp_schedule schedule;
  mp_stage_worker *worker;
  mp_schedule eval_schedule;  /* the same layout's forward-only list (a held-out loss) */
  mp_stage_worker *eval_worker;
  bool evaluating;            /* the eval worker runs: its messages stay out of the trace */
  mp_comm_request **dp_requests; /* this step's posted dp all-reduces, one per bucket */
  double *dp_posted_s;    /* when each was posted, for the trace */
  size_t *dp_bytes;
  int num_dp_requests, dp_request_capacity;
  int dp_requests_waited; /* dp_requests[0, this) finished already (a staged GPU run's) */
  bool nccl_dp_posted;    /* dp all-reduces enqueued on options->nccl_dp, not yet waited for */
  mp_nccl_p2p_op *nccl_sends; /* NCCL pipeline: sends posted but not yet enqueued, which go with
                                 this rank's next receive (or the step's end) in one group */
  int num_nccl_sends, nccl_send_capacity;
  int64_t step;           /* the step being run, for the trace */
  double loss_sum;        /* the last stage's micro-batch losses of the step */
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *mp_backend_name(mp_backend backend) {
  return backend == MP_BACKEND_CUDA ? "cuda" : "cpu";
}

/* Megatron's FLOP count of one step: forward and backward of every layer, every micro-batch. */
static double step_flops(const mp_plan *plan, const mp_model *model) {
  const mp_cost_shape shape = {plan->micro_batch, plan->seq_len, 2, false}; /* FLOPs only */
  double flops = 0.0;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    mp_layer_cost cost;
    mp_layer_cost_compute(mp_model_layer(model, i), &shape, &cost);
    flops += cost.forward_flops + cost.backward_flops;
  }
  return flops * (double)plan->num_micro_batches * (double)plan->dp;
}

mp_status mp_trainer_check_layout(const mp_plan *plan, mp_backend backend, mp_error *err) {
  /* The GPU stage (engine/model/gpt_stage_gpu.h) runs every layout the CPU runs. */
  (void)backend;
  if (plan->recompute == MP_RECOMPUTE_FULL && strcmp(plan->schedule, "zb-h1") == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: recompute \"full\" cannot run schedule zb-h1: its weight pass needs the "
                   "activations that recomputing the next micro-batch overwrites; use recompute "
                   "\"selective\" or \"none\", or another schedule",
                   plan->source);
  }
  if (plan->zero_stage == 3 && strcmp(plan->schedule, "zb-h1") == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: parallel.zero_stage 3 gathers each block's parameters around its whole "
                   "backward, but schedule zb-h1 splits the backward and defers the weight "
                   "gradients; use 1f1b or interleaved-1f1b, or zero_stage 2",
                   plan->source);
  }
  if (backend == MP_BACKEND_CUDA && mp_plan_zero_shard(plan) < plan->dp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: parallel.zero_shard_size %d (hybrid sharding) runs on the CPU backend "
                   "only for now; drop it, or use --backend cpu",
                   plan->source, plan->zero_shard_size);
  }
  return MP_OK;
}

mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err) {
  return mp_trainer_create_parallel(plan, model, data, backend, NULL, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * A parallel run: the rank's chunks, the worker's callbacks, the step's reductions
 * ------------------------------------------------------------------------------------------- */

/* The plan's stage split over the chain (embedding, blocks, final norm, head): layers_per_stage,
 * or the cost model's, which is what `mpengine plan` writes. counts has pp x v entries. */
static mp_status stage_split(const mp_plan *plan, const mp_model *model, int *counts,
                             mp_error *err) {
  const int stages = plan->pp * plan->virtual_stages;
  if (plan->num_stage_counts > 0) {
    memcpy(counts, plan->layers_per_stage, (size_t)stages * sizeof(int));
    return MP_OK;
  }
  if (stages == 1) {
    counts[0] = mp_model_num_layers(model);
    return MP_OK;
  }
  mp_estimate *estimate = malloc(sizeof *estimate);
  if (estimate == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const mp_status status = mp_cost_estimate_plan(plan, model, estimate, err);
  if (status == MP_OK) memcpy(counts, estimate->layers_per_stage, (size_t)stages * sizeof(int));
  free(estimate);
  if (status != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, status, "%s: splitting the model into %d stages: %s", plan->source,
                   stages, inner.message);
  }
  return MP_OK;
}

static const int32_t *micro_batch_rows(const mp_trainer *trainer, const int32_t *rows,
                                       int micro_batch) {
  const size_t tokens = (size_t)(trainer->plan->micro_batch * trainer->plan->seq_len);
  return rows + (size_t)micro_batch * tokens;
}

static mp_status chunk_forward(void *context, int chunk, int micro_batch, int slot,
                               const float *input, float *output, mp_error *err) {
  mp_trainer *trainer = context;
  double loss = 0.0;
  const int32_t *inputs = micro_batch_rows(trainer, trainer->inputs, micro_batch);
  const int32_t *targets = micro_batch_rows(trainer, trainer->targets, micro_batch);
  /* The loss gradient is formed at forward time. */
  const float dloss = 1.0f / (float)trainer->plan->num_micro_batches;
  MP_TRY(mp_stage_chain_forward(trainer->chains[chunk], slot, inputs, targets, input, output,
                                dloss, &loss, err));
  if (mp_gpt_tp_stage(trainer->chunks[chunk])->head) trainer->loss_sum += loss;
  return MP_OK;
}

/* A forward-only schedule's F is done with its slot: no backward will read it. */
static void chunk_release(void *context, int chunk, int micro_batch, int slot) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain_discard(trainer->chains[chunk], slot);
}

static mp_status block_grads_ready(void *context, float *grads, size_t first, size_t count,
                                   mp_error *err);

/* A chunk's gradients complete inside its last gradient action of the step (the worker knows
 * which: a whole backward, or with zb-h1 a W). On a GPU with dp > 1 the blocks' all-reduces are
 * posted there as they finish (block_grads_ready; post_chunk_all_reduce posts the rest); a CPU
 * rank posts the chunk at once, so that no more than one copy of its gradients is in flight. */
static bool overlap_dp(mp_trainer *trainer, int chunk) {
  return trainer->gpu_chunks != NULL && trainer->options.dp != NULL && trainer->plan->dp > 1 &&
         !trainer->zero2 && mp_stage_worker_completes_chunk(trainer->worker, chunk);
}

static mp_status chunk_backward(void *context, int chunk, int micro_batch, int slot,
                                const float *doutput, float *dinput, bool defer_weights,
                                mp_error *err) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain *chain = trainer->chains[chunk];
  const bool overlap = overlap_dp(trainer, chunk);
  if (overlap) mp_stage_chain_set_grads_hook(chain, block_grads_ready, trainer);
  const mp_status status =
      mp_stage_chain_backward(chain, slot, doutput, dinput, defer_weights, err);
  if (overlap) mp_stage_chain_set_grads_hook(chain, NULL, NULL);
  return status;
}

static mp_status chunk_backward_weights(void *context, int chunk, int micro_batch, int slot,
                                        mp_error *err) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain *chain = trainer->chains[chunk];
  const bool overlap = overlap_dp(trainer, chunk);
  if (overlap) mp_stage_chain_set_grads_hook(chain, block_grads_ready, trainer);
  const mp_status status = mp_stage_chain_backward_weights(chain, slot, err);
  if (overlap) mp_stage_chain_set_grads_hook(chain, NULL, NULL);
  return status;
}

/* A posted send and when it was posted (for the trace). */
typedef struct {
  mp_comm_request *request;
  mp_message message;
  int peer;
  size_t bytes;
  double posted_s;
} posted_send;

static double trace_now(const mp_trainer *trainer) {
  return trainer->options.trace != NULL ? mp_trace_now(trainer->options.trace) : 0.0;
}

/* NCCL pipeline: sends wait for this rank's next receive (or the step's end), and go with it in
 * one group: NCCL's send blocks until the peer receives, so a send enqueued alone could wait on a
 * peer that waits on our receive; in one group none waits for another (engine/comm/comm_nccl.h). No
 * deadlock: a rank blocks only in a flush, which holds every send it has pending, and messages
 * between two ranks are matched in order (as over MPI), so whatever a blocked rank waits for is
 * either posted or in the future of a rank that is not blocked. */
static mp_status nccl_pp_pend(mp_trainer *trainer, const mp_nccl_p2p_op *op, mp_error *err) {
  if (trainer->num_nccl_sends == trainer->nccl_send_capacity) {
    const int capacity = trainer->nccl_send_capacity > 0 ? 2 * trainer->nccl_send_capacity : 8;
    mp_nccl_p2p_op *grown =
        realloc(trainer->nccl_sends, (size_t)capacity * sizeof *trainer->nccl_sends);
    if (grown == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    trainer->nccl_sends = grown;
    trainer->nccl_send_capacity = capacity;
  }
  trainer->nccl_sends[trainer->num_nccl_sends++] = *op;
  return MP_OK;
}

/* Enqueues the pending operations in one group, after the compute that wrote the sends' buffers,
 * and waits for them (under NCCL's watchdog). */
static mp_status nccl_pp_flush(mp_trainer *trainer, mp_error *err) {
  mp_nccl_comm *comm = trainer->options.nccl_pp;
  const int count = trainer->num_nccl_sends;
  trainer->num_nccl_sends = 0;
  if (count == 0) return MP_OK;
  MP_TRY(mp_nccl_comm_wait_stream(comm, NULL, err));
  MP_TRY(mp_nccl_p2p(comm, trainer->nccl_sends, count, err));
  return mp_nccl_comm_synchronize(comm, err);
}

static mp_status pp_post_send(void *context, const float *buffer, size_t count, int peer,
                              const mp_message *message, void **request, mp_error *err) {
  mp_trainer *trainer = context;
  posted_send *send = malloc(sizeof *send);
  if (send == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  send->message = *message;
  send->peer = peer;
  send->bytes = count * sizeof(float);
  send->posted_s = trace_now(trainer);
  send->request = NULL;
  mp_status status;
  if (trainer->options.nccl_pp != NULL) {
    /* The worker leaves the buffer untouched until wait_send, after the flush. */
    const mp_nccl_p2p_op op = {MP_NCCL_SEND, peer, (void *)buffer, send->bytes};
    status = nccl_pp_pend(trainer, &op, err);
  } else {
    status = mp_comm_isend(trainer->options.pp, buffer, send->bytes, peer, &send->request, err);
  }
  if (status != MP_OK) {
    free(send);
    return status;
  }
  *request = send;
  return MP_OK;
}

static mp_status pp_wait_send(void *context, void *request, mp_error *err) {
  mp_trainer *trainer = context;
  posted_send *send = request;
  const mp_status status = trainer->options.nccl_pp != NULL ? nccl_pp_flush(trainer, err)
                                                            : mp_comm_wait(send->request, err);
  if (trainer->options.trace != NULL && !trainer->evaluating) {
    mp_trace_comm(trainer->options.trace, trainer->step, "send", "pp",
                  mp_comm_member(trainer->options.pp, send->peer), send->bytes, &send->message,
                  send->posted_s, trace_now(trainer));
  }
  free(send);
  return status;
}

static mp_status pp_recv(void *context, float *buffer, size_t count, int peer,
                         const mp_message *message, mp_error *err) {
  mp_trainer *trainer = context;
  const double start = trace_now(trainer);
  if (trainer->options.nccl_pp != NULL) {
    const mp_nccl_p2p_op op = {MP_NCCL_RECV, peer, buffer, count * sizeof(float)};
    MP_TRY(nccl_pp_pend(trainer, &op, err));
    MP_TRY(nccl_pp_flush(trainer, err));
  } else {
    MP_TRY(mp_comm_recv(trainer->options.pp, buffer, count * sizeof(float), peer, err));
  }
  if (trainer->options.trace != NULL && !trainer->evaluating) {
    mp_trace_comm(trainer->options.trace, trainer->step, "recv", "pp",
                  mp_comm_member(trainer->options.pp, peer), count * sizeof(float), message,
                  start, trace_now(trainer));
  }
  return MP_OK;
}

/* CUDA backend: the stage worker's boundary buffers live on the GPU. */
static float *device_buffer_alloc(void *context, size_t count) {
  (void)context;
  void *buffer = NULL;
  mp_error ignored = MP_ERROR_INITIALIZER;
  return mp_device_alloc(&buffer, count * sizeof(float), &ignored) == MP_OK ? buffer : NULL;
}

static void device_buffer_free(void *context, float *buffer) {
  (void)context;
  mp_device_free(buffer);
}

static double observer_now(void *context) { return trace_now(context); }

static void observer_action_done(void *context, const mp_action *action, int stage,
                                 double start, double end) {
  mp_trainer *trainer = context;
  mp_trace_action(trainer->options.trace, trainer->step, action->kind, action->micro_batch,
                  action->chunk, stage, start, end);
}

/* A collective of the step, timed into the trace. */
static mp_status traced_all_reduce(mp_trainer *trainer, mp_comm *comm, float *buffer,
                                   size_t count, mp_error *err) {
  const double start = trace_now(trainer);
  MP_TRY(mp_comm_all_reduce_sum_f32(comm, buffer, count, err));
  if (trainer->options.trace != NULL) {
    mp_trace_comm(trainer->options.trace, trainer->step, "all-reduce", mp_comm_name(comm), -1,
                  count * sizeof(float), NULL, start, trace_now(trainer));
  }
  return MP_OK;
}

/* *value summed over comm's members in rank order, bitwise the same on every member. */
static mp_status sum_double_over(mp_comm *comm, double *value, mp_error *err) {
  const mp_tp_comm group = mp_tp_comm_over_group(comm);
  return mp_tp_sum_double(&group, value, err);
}

/* Waits for the dp all-reduce request k, traced. */
static mp_status wait_dp_request(mp_trainer *trainer, int k, mp_error *err) {
  const mp_status status = mp_comm_wait(trainer->dp_requests[k], err);
  if (trainer->options.trace != NULL) {
    mp_trace_comm(trainer->options.trace, trainer->step, "all-reduce", "dp", -1,
                  trainer->dp_bytes[k], NULL, trainer->dp_posted_s[k], trace_now(trainer));
  }
  return status;
}

/* The worker's hook: chunk's gradients are final for the step, so its data-parallel all-reduce
 * starts now, bucket by bucket, and runs while the other chunks' backwards do. */
/* Posts the dp all-reduce of grads [0, n) in buckets without waiting: non-blocking MPI
 * (mp_comm_iall_reduce_sum_f32, which stages GPU memory through the host), or on the CUDA backend
 * with the dp group on NCCL, enqueued on its stream after the compute so far (the host goes on;
 * the GPU overlaps it with the backward still to come). wait_dp_all_reduces finishes them. */
static mp_status post_dp_all_reduce(mp_trainer *trainer, float *grads, size_t n, mp_error *err) {
  mp_nccl_comm *nccl = trainer->options.nccl_dp;
  /* GPU gradients over MPI are staged through a pinned host block per all-reduce in flight:
   * with every bucket in flight that is a host copy of the gradients, so a few at most. */
  const bool staged = trainer->gpu_chunks != NULL && nccl == NULL;
  if (nccl != NULL && n > 0) MP_TRY(mp_nccl_comm_wait_stream(nccl, NULL, err));
  for (size_t offset = 0; offset < n; offset += MP_TRAINER_BUCKET_FLOATS) {
    const size_t count = n - offset < MP_TRAINER_BUCKET_FLOATS ? n - offset
                                                               : MP_TRAINER_BUCKET_FLOATS;
    if (nccl != NULL) {
      MP_TRY(mp_nccl_all_reduce_sum(nccl, grads + offset, count, MP_NCCL_FLOAT32, err));
      trainer->nccl_dp_posted = true;
      continue;
    }
    if (trainer->num_dp_requests == trainer->dp_request_capacity) {
      const int capacity = trainer->dp_request_capacity > 0 ? 2 * trainer->dp_request_capacity : 8;
      mp_comm_request **requests =
          realloc(trainer->dp_requests, (size_t)capacity * sizeof *requests);
      double *posted = realloc(trainer->dp_posted_s, (size_t)capacity * sizeof *posted);
      size_t *bytes = realloc(trainer->dp_bytes, (size_t)capacity * sizeof *bytes);
      if (requests != NULL) trainer->dp_requests = requests;
      if (posted != NULL) trainer->dp_posted_s = posted;
      if (bytes != NULL) trainer->dp_bytes = bytes;
      if (requests == NULL || posted == NULL || bytes == NULL) {
        return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
      }
      trainer->dp_request_capacity = capacity;
    }
    while (staged && trainer->num_dp_requests - trainer->dp_requests_waited >=
                         MP_TRAINER_STAGED_IN_FLIGHT) {
      MP_TRY(wait_dp_request(trainer, trainer->dp_requests_waited++, err));
    }
    const int k = trainer->num_dp_requests;
    trainer->dp_posted_s[k] = trace_now(trainer);
    trainer->dp_bytes[k] = count * sizeof(float);
    MP_TRY(mp_comm_iall_reduce_sum_f32(trainer->options.dp, grads + offset, count,
                                       &trainer->dp_requests[k], err));
    trainer->num_dp_requests++;
  }
  return MP_OK;
}

/* The stage worker's hook after a chunk's last backward (or W): its dp all-reduce starts while the
 * other chunks' backwards run. On the GPU the blocks' gradients were posted one by one inside that
 * action (gpu_overlap_dp, block_grads_ready): only the tensors outside the blocks remain. */
static mp_status post_chunk_all_reduce(void *context, int chunk, mp_error *err) {
  mp_trainer *trainer = context;
  if (trainer->gpu_chunks == NULL) {
    return post_dp_all_reduce(trainer, mp_gpt_tp_grads(trainer->chunks[chunk]),
                              mp_gpt_tp_num_params(trainer->chunks[chunk]), err);
  }
  float *grads = mp_gpt_stage_gpu_device_grads(trainer->gpu_chunks[chunk]);
  const size_t n = mp_gpt_tp_num_params(trainer->chunks[chunk]);
  size_t first = 0, end = 0; /* the blocks' range */
  mp_stage_chain_blocks_range(trainer->chains[chunk], &first, &end);
  MP_TRY(post_dp_all_reduce(trainer, grads, first, err));
  return post_dp_all_reduce(trainer, grads + end, n - end, err);
}

/* During a GPU chunk's last backward of the step: block gradients [offset, offset + count) are
 * complete once the kernels enqueued so far ran; their dp all-reduce goes now (Megatron's
 * overlapped gradient buckets). */
static mp_status block_grads_ready(void *context, float *grads, size_t first, size_t count,
                                   mp_error *err) {
  (void)first;
  return post_dp_all_reduce(context, grads, count, err);
}

/* ---- ZeRO-2: the gradients reduce-scattered over dp into each rank's part ------------------ */

struct zero2_hook {
  mp_trainer *trainer;
  int chunk;
};

/* ZeRO 2 and 3: counts[d] = how many of elements [first, first + count) of chunk c's flat layout dp
 * rank d's part holds (its part is contiguous, the parts in dp-rank order). */
static void part_counts(const mp_trainer *trainer, int c, size_t first, size_t count,
                        size_t *counts) {
  const size_t n = mp_gpt_tp_num_params(trainer->chunks[c]);
  for (int d = 0; d < trainer->zero_size; ++d) {
    size_t part_first = 0, part_count = 0;
    mp_zero_part(n, trainer->zero_size, d, &part_first, &part_count);
    const size_t lo = first > part_first ? first : part_first;
    const size_t hi = first + count < part_first + part_count ? first + count
                                                              : part_first + part_count;
    counts[d] = hi > lo ? hi - lo : 0;
  }
}

/* grads (count floats, elements [first, first + count) of chunk c's flat layout; device memory
 * on the GPU) summed over dp, each dp rank adding the elements of its part ([zero_first,
 * + zero_count), the moments' too) into its gradients of the part: one reduce-scatter, since the
 * parts are contiguous and in dp-rank order (NCCL on the GPU with the dp group on it, else MPI,
 * which stages device memory through the host). */
static mp_status scatter_add_grads(mp_trainer *trainer, int c, const float *grads, size_t first,
                                   size_t count, mp_error *err) {
  mp_comm *dp = trainer->zero_comm;
  mp_nccl_comm *nccl = trainer->gpu_chunks != NULL ? trainer->options.nccl_dp : NULL;
  const int size = trainer->zero_size;
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  const size_t mine = trainer->scatter_counts[trainer->zero_rank];
  const size_t mine_first = first > trainer->zero_first[c] ? first : trainer->zero_first[c];
  const float *sum = grads + (mine > 0 ? mine_first - first : 0); /* alone: grads themselves */
  if (dp != NULL && size > 1) {
    const double start = trace_now(trainer);
    if (nccl != NULL) {
      /* Overlapped with the next block's backward (Megatron's gradient buckets): the kernels
       * enqueued after this point, which write the other gradient window, wait for the
       * reduce-scatters posted so far, the last of which reads it (engine/model/stage_chain.h); this
       * one runs after the kernels that wrote grads, and its add into the part follows it on the
       * communicator's stream. reduce_step_grads waits for the last. */
      MP_TRY(mp_nccl_stream_wait_comm(NULL, nccl, err));
      MP_TRY(mp_nccl_comm_wait_stream(nccl, NULL, err));
      MP_TRY(mp_nccl_reduce_scatter_v_sum_f32(nccl, grads, trainer->scatter_out,
                                              trainer->scatter_counts, err));
    } else {
      if (trainer->gpu_chunks != NULL) MP_TRY(mp_device_synchronize(err));
      MP_TRY(mp_comm_reduce_scatter_v_sum_f32(dp, grads, trainer->scatter_out,
                                              trainer->scatter_counts, err));
    }
    if (trainer->options.trace != NULL) {
      mp_trace_comm(trainer->options.trace, trainer->step, "reduce-scatter", mp_comm_name(dp), -1,
                    count * sizeof(float), NULL, start, trace_now(trainer));
    }
    sum = trainer->scatter_out;
  }
  if (mine == 0) return MP_OK;
  if (trainer->gpu_chunks != NULL) {
    const bool on_comm = nccl != NULL && dp != NULL && size > 1;
    return mp_gpt_stage_gpu_add_to_part(trainer->gpu_chunks[c], sum, mine_first, mine,
                                        on_comm ? mp_nccl_comm_stream(nccl) : NULL, err);
  }
  float *to = trainer->grad_part[c] + (mine_first - trainer->zero_first[c]);
  for (size_t i = 0; i < mine; ++i) to[i] += sum[i];
  return MP_OK;
}

/* The chain's hook after each block's backward: the window's gradients into the parts. */
static mp_status zero2_block_grads(void *context, float *grads, size_t first, size_t count,
                                   mp_error *err) {
  const struct zero2_hook *hook = context;
  return scatter_add_grads(hook->trainer, hook->chunk, grads, first, count, err);
}

/* ZeRO-3 on the GPU: this rank's run of block weights (own, device memory, bf16) into its place
 * in window, and every other rank's run from its owner (trainer->scatter_counts): over NCCL on
 * the dp communicator's stream, after the kernels enqueued so far (those that read window
 * before), or through the host over MPI. */
static mp_status zero3_gather_device_weights(mp_trainer *trainer, const void *own, void *window,
                                             size_t first, size_t count, size_t mine_first,
                                             size_t mine, mp_error *err) {
  mp_nccl_comm *nccl = trainer->options.nccl_dp;
  if (trainer->zero_comm == NULL) {
    return mp_device_copy_on_device(window, own, count * sizeof(uint16_t), err);
  }
  if (nccl != NULL) {
    MP_TRY(mp_nccl_comm_wait_stream(nccl, NULL, err));
    return mp_nccl_all_gather_v(nccl, own, window, trainer->scatter_counts, MP_NCCL_BFLOAT16,
                                err);
  }
  uint16_t *staging = trainer->zero3_staging;
  MP_TRY(mp_device_synchronize(err));
  if (mine > 0) {
    MP_TRY(mp_device_copy_to_host(staging + (mine_first - first), own, mine * sizeof(uint16_t),
                                  err));
  }
  MP_TRY(mp_comm_all_gather_v_bf16(trainer->zero_comm, NULL, staging, trainer->scatter_counts,
                                   err));
  return mp_device_copy_to_device(window, staging, count * sizeof(uint16_t), err);
}

/* ZeRO-3: block weights [first, first + count) of chunk c gathered over dp from the parts into
 * window (on the GPU the bf16 working copy's), traced. */
static mp_status zero3_gather(mp_trainer *trainer, int c, void *window, size_t first,
                              size_t count, mp_error *err) {
  mp_gpt_tp *chunk = trainer->chunks[c];
  mp_gpt_stage_gpu *gpu = trainer->gpu_chunks != NULL ? trainer->gpu_chunks[c] : NULL;
  if (trainer->zero_comm == NULL && gpu == NULL) {
    return mp_gpt_tp_read_params(chunk, first, count, window, err);
  }
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  const size_t mine = trainer->scatter_counts[trainer->zero_rank];
  const size_t mine_first = first > trainer->zero_first[c] ? first : trainer->zero_first[c];
  const void *own = NULL;
  if (mine > 0) {
    own = gpu != NULL ? mp_gpt_stage_gpu_weights_at(gpu, mine_first, mine)
                      : (const void *)mp_gpt_tp_params_at(chunk, mine_first, mine);
    if (own == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "ZeRO-3: this rank does not hold its part [%zu, +%zu)",
                     mine_first, mine);
    }
  }
  const double start = trace_now(trainer);
  if (gpu != NULL) {
    MP_TRY(zero3_gather_device_weights(trainer, own, window, first, count, mine_first, mine,
                                       err));
  } else {
    MP_TRY(mp_comm_all_gather_v_f32(trainer->zero_comm, own, window, trainer->scatter_counts,
                                    err));
  }
  if (trainer->options.trace != NULL && trainer->zero_comm != NULL) {
    mp_trace_comm(trainer->options.trace, trainer->step, "all-gather",
                  mp_comm_name(trainer->zero_comm), -1,
                  count * (gpu != NULL ? sizeof(uint16_t) : sizeof(float)), NULL, start,
                  trace_now(trainer));
  }
  return MP_OK;
}

/* ZeRO-3, the chain's weights hook: block weights [first, first + count) of chunk c into the
 * window before a pass over the block. Over NCCL with a next block (two windows), that block's
 * gather is posted now into the other window, ahead of its pass (torchtitan's and FSDP's
 * prefetch): it runs while this pass computes, and the next call only makes the compute stream
 * wait for it, through its mark, not for the reduce-scatters posted behind it. */
static mp_status zero3_block_weights(void *context, void *window, size_t first, size_t count,
                                     const mp_stage_weights_next *next, mp_error *err) {
  const struct zero2_hook *hook = context;
  mp_trainer *trainer = hook->trainer;
  mp_nccl_comm *nccl = trainer->gpu_chunks != NULL && trainer->zero_comm != NULL
                           ? trainer->options.nccl_dp
                           : NULL;
  if (nccl == NULL) return zero3_gather(trainer, hook->chunk, window, first, count, err);
  const bool prefetched = trainer->zero3_prefetch.window == window &&
                          trainer->zero3_prefetch.first == first &&
                          trainer->zero3_prefetch.count == count;
  trainer->zero3_prefetch.window = NULL;
  if (prefetched) {
    MP_TRY(mp_nccl_stream_wait_mark(NULL, nccl, trainer->zero3_prefetch.mark, err));
  } else {
    MP_TRY(zero3_gather(trainer, hook->chunk, window, first, count, err));
    MP_TRY(mp_nccl_stream_wait_comm(NULL, nccl, err));
  }
  if (next == NULL) return MP_OK;
  /* After the kernels enqueued so far, the last pass's, which read next->window. */
  MP_TRY(zero3_gather(trainer, hook->chunk, next->window, next->first, next->count, err));
  const int mark = 1 - trainer->zero3_prefetch.mark;
  MP_TRY(mp_nccl_comm_mark(nccl, mark, err));
  trainer->zero3_prefetch.window = next->window;
  trainer->zero3_prefetch.first = next->first;
  trainer->zero3_prefetch.count = next->count;
  trainer->zero3_prefetch.mark = mark;
  return MP_OK;
}

/* ZeRO-3 over MPI on the GPU: device_run (count floats, flat elements [first, first + count) of
 * chunk c's master weights) all-gathered from the parts in place, through a host buffer of at
 * most MP_TRAINER_BUCKET_FLOATS, piece by piece. */
static mp_status zero3_gather_outside_staged(mp_trainer *trainer, int c, float *device_run,
                                             size_t first, size_t count, mp_error *err) {
  const size_t most = MP_TRAINER_BUCKET_FLOATS;
  if (trainer->zero3_outside_piece == NULL) {
    trainer->zero3_outside_piece = malloc(most * sizeof(float));
    if (trainer->zero3_outside_piece == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a ZeRO-3 piece");
    }
  }
  float *piece = trainer->zero3_outside_piece;
  mp_status status = mp_device_synchronize(err);
  for (size_t at = 0; at < count && status == MP_OK; at += most) {
    const size_t n = count - at < most ? count - at : most;
    part_counts(trainer, c, first + at, n, trainer->scatter_counts);
    size_t mine_at = 0;
    for (int d = 0; d < trainer->zero_rank; ++d) mine_at += trainer->scatter_counts[d];
    const size_t mine = trainer->scatter_counts[trainer->zero_rank];
    if (mine > 0) {
      status = mp_device_copy_to_host(piece + mine_at, device_run + at + mine_at,
                                      mine * sizeof(float), err);
    }
    if (status == MP_OK) {
      status = mp_comm_all_gather_v_f32(trainer->zero_comm, NULL, piece, trainer->scatter_counts,
                                        err);
    }
    if (status == MP_OK) {
      status = mp_device_copy_to_device(device_run + at, piece, n * sizeof(float), err);
    }
  }
  return status;
}

/* ZeRO-3 after the update: the tensors outside chunk c's blocks, which every rank keeps whole,
 * gathered from the parts in place (the blocks' stay in the parts). On the GPU the master
 * weights: over NCCL in place, or over MPI staged through the host in pieces; the caller
 * refreshes the bf16 copy. */
static mp_status zero3_gather_outside(mp_trainer *trainer, int c, mp_error *err) {
  mp_gpt_tp *chunk = trainer->chunks[c];
  mp_gpt_stage_gpu *gpu = trainer->gpu_chunks != NULL ? trainer->gpu_chunks[c] : NULL;
  mp_nccl_comm *nccl = gpu != NULL ? trainer->options.nccl_dp : NULL;
  size_t blocks_first = 0, blocks_end = 0, largest = 0;
  mp_gpt_tp_blocks_range(chunk, &blocks_first, &blocks_end, &largest);
  const size_t n = mp_gpt_tp_num_params(chunk);
  const size_t runs[2][2] = {{0, blocks_first}, {blocks_end, n - blocks_end}};
  for (int r = 0; r < 2 && trainer->zero_comm != NULL; ++r) {
    if (runs[r][1] == 0) continue;
    if (gpu == NULL) {
      float *run = mp_gpt_tp_params_at(chunk, runs[r][0], runs[r][1]);
      part_counts(trainer, c, runs[r][0], runs[r][1], trainer->scatter_counts);
      MP_TRY(mp_comm_all_gather_v_f32(trainer->zero_comm, NULL, run, trainer->scatter_counts,
                                      err));
      continue;
    }
    float *device_run = mp_gpt_stage_gpu_params_at(gpu, runs[r][0], runs[r][1]);
    if (nccl == NULL) {
      MP_TRY(zero3_gather_outside_staged(trainer, c, device_run, runs[r][0], runs[r][1], err));
      continue;
    }
    part_counts(trainer, c, runs[r][0], runs[r][1], trainer->scatter_counts);
    MP_TRY(mp_nccl_comm_wait_stream(nccl, NULL, err));
    MP_TRY(mp_nccl_all_gather_v(nccl, NULL, device_run, trainer->scatter_counts,
                                MP_NCCL_FLOAT32, err));
    MP_TRY(mp_nccl_stream_wait_comm(NULL, nccl, err));
  }
  return MP_OK;
}

/* ZeRO-3, --save-weights: elements [first, first + count) of chunk c's flat parameters onto dp
 * rank 0's dest, from the dp ranks whose parts hold them (every dp rank calls it; the others'
 * dest is a send buffer of count floats). */
static mp_status zero3_collect(mp_trainer *trainer, int c, size_t first, size_t count,
                               float *dest, mp_error *err) {
  mp_gpt_tp *chunk = trainer->chunks[c];
  if (trainer->zero_comm == NULL) return mp_gpt_tp_read_params(chunk, first, count, dest, err);
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  size_t at = 0;
  for (int d = 0; d < trainer->zero_size; ++d) {
    const size_t len = trainer->scatter_counts[d];
    if (len > 0 && d == trainer->zero_rank) {
      MP_TRY(mp_gpt_tp_read_params(chunk, first + at, len, dest + at, err));
      if (d != 0) MP_TRY(mp_comm_send(trainer->zero_comm, dest + at, len * sizeof(float), 0, err));
    } else if (len > 0 && trainer->zero_rank == 0) {
      MP_TRY(mp_comm_recv(trainer->zero_comm, dest + at, len * sizeof(float), d, err));
    }
    at += len;
  }
  return MP_OK;
}

/* scatter_add_grads of a run of count floats (flat elements [first, first + count), at packed)
 * in buckets of MP_TRAINER_BUCKET_FLOATS, so no transient buffer grows with the model. */
static mp_status scatter_add_run(mp_trainer *trainer, int c, const float *packed, size_t first,
                                  size_t count, mp_error *err) {
  for (size_t at = 0; at < count; at += MP_TRAINER_BUCKET_FLOATS) {
    const size_t n = count - at < MP_TRAINER_BUCKET_FLOATS ? count - at : MP_TRAINER_BUCKET_FLOATS;
    MP_TRY(scatter_add_grads(trainer, c, packed + at, first + at, n, err));
  }
  return MP_OK;
}

/* At the step's end: the gradients that stayed in chunk c's packed array (the tensors outside
 * the blocks; with zb-h1 the blocks' norms and biases too), run by run of tensors adjacent in
 * the flat layout, into the parts in buckets. */
static mp_status zero2_array_grads(mp_trainer *trainer, int c, mp_error *err) {
  mp_gpt_tp *chunk = trainer->chunks[c];
  const mp_grad_window window =
      mp_grad_window_for(true, trainer->schedule.kind == MP_SCHEDULE_ZB_H1);
  const float *packed = trainer->gpu_chunks != NULL
                            ? mp_gpt_stage_gpu_device_grads(trainer->gpu_chunks[c])
                            : mp_gpt_tp_grads(chunk);
  size_t run_first = 0, run_packed = 0, run_count = 0; /* flat first, packed first, floats */
  size_t at = 0; /* the packed array's cursor: its tensors are in the layout's order */
  for (int j = 0; j < mp_gpt_tp_num_tensors(chunk); ++j) {
    if (mp_gpt_tp_grad_in_window(chunk, j, window)) continue;
    const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(chunk, j);
    if (run_count > 0 && t->offset == run_first + run_count) {
      run_count += t->count;
    } else {
      MP_TRY(scatter_add_run(trainer, c, packed + run_packed, run_first, run_count, err));
      run_first = t->offset;
      run_packed = at;
      run_count = t->count;
    }
    at += t->count;
  }
  return scatter_add_run(trainer, c, packed + run_packed, run_first, run_count, err);
}

/* The squared global norm of chunk c's gradient from the dp ranks' parts: each tensor's squares
 * over this rank's part of it, summed over dp in rank order (so bitwise the same everywhere),
 * then over tp as the stage counts them (mp_gpt_tp_norm_from_squares). Collective over dp and
 * tp. */
static mp_status zero2_norm_squared(mp_trainer *trainer, int c, double *out, mp_error *err) {
  mp_gpt_tp *chunk = trainer->chunks[c];
  const int num_tensors = mp_gpt_tp_num_tensors(chunk);
  const int dp = trainer->zero_comm != NULL ? trainer->zero_size : 1;
  const size_t first = trainer->zero_first[c], end = first + trainer->zero_count[c];
  double *squares = calloc((size_t)num_tensors * ((size_t)dp + 1) + 1, sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  double *gathered = squares + num_tensors;
  mp_status status = MP_OK;
  if (trainer->gpu_chunks != NULL) {
    status = mp_gpt_stage_gpu_part_squares(trainer->gpu_chunks[c], squares, err);
  }
  for (int i = 0; i < num_tensors && trainer->gpu_chunks == NULL; ++i) {
    const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(chunk, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    if (lo < hi) {
      squares[i] = mp_grad_norm_squared_cpu(trainer->grad_part[c] + (lo - first), hi - lo);
    }
  }
  if (dp > 1 && status == MP_OK) {
    /* Doubles travel as pairs of floats: an all-gather only copies them. */
    status = mp_comm_all_gather_f32(trainer->zero_comm, (const float *)squares,
                                    (float *)gathered, 2 * (size_t)num_tensors, err);
    for (int i = 0; i < num_tensors && status == MP_OK; ++i) {
      double sum = 0.0;
      for (int d = 0; d < dp; ++d) sum += gathered[(size_t)d * num_tensors + i];
      squares[i] = sum;
    }
  }
  if (status == MP_OK) status = mp_gpt_tp_norm_from_squares(chunk, squares, out, err);
  free(squares);
  return status;
}

/* Waits for every posted dp all-reduce (all of them, even after a failure, so none is left
 * pending on a buffer the trainer may free). */
static mp_status wait_dp_all_reduces(mp_trainer *trainer, mp_error *err) {
  mp_status status = MP_OK;
  if (trainer->nccl_dp_posted) {
    const double start = trace_now(trainer);
    trainer->nccl_dp_posted = false;
    status = mp_nccl_comm_synchronize(trainer->options.nccl_dp, err);
    if (trainer->options.trace != NULL) {
      mp_trace_comm(trainer->options.trace, trainer->step, "all-reduce", "dp", -1, 0, NULL, start,
                    trace_now(trainer));
    }
  }
  for (int k = trainer->dp_requests_waited; k < trainer->num_dp_requests; ++k) {
    mp_error ignored = MP_ERROR_INITIALIZER;
    const mp_status one = wait_dp_request(trainer, k, status == MP_OK ? err : &ignored);
    if (status == MP_OK) status = one;
  }
  trainer->num_dp_requests = 0;
  trainer->dp_requests_waited = 0;
  return status;
}

static mp_status check_group(const mp_plan *plan, const char *name, mp_comm *comm, int wanted,
                             mp_error *err) {
  const int size = comm != NULL ? mp_comm_size(comm) : 1;
  if (size == wanted) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the plan has %s = %d but this process's %s group has %d rank%s; start it "
                 "with `mpengine run`, which launches dp x pp x tp = %d ranks under mpirun",
                 plan->source, name, wanted, name, size, size == 1 ? "" : "s",
                 plan->dp * plan->pp * plan->tp);
}

/* ZeRO-1's parameter all-gather moves at most this many floats (over all dp ranks) a call: 4 MiB,
 * large enough for the links' bandwidth, small beside any rank's state. */
enum { ZERO_GATHER_PIECE_FLOATS = 1 << 20 };

/* Floats per dp rank in one piece of ZeRO-1's parameter all-gather: all of a part when it is
 * small, else its share of ZERO_GATHER_PIECE_FLOATS. */
static size_t zero_piece_floats(size_t part, int dp) {
  size_t piece = ZERO_GATHER_PIECE_FLOATS / (size_t)dp;
  if (piece < 1) piece = 1;
  return part < piece ? part : piece;
}

/* ZeRO-1, after each dp rank updated its part of a chunk's n parameters (dp parts of `part`
 * floats, the last one shorter): the whole array on every rank, gathered piece by piece.
 * gather(context, input, output, count) all-gathers count floats per rank; copy(context, dest,
 * source, count) copies floats and zero(context, dest, NULL, count) clears them (host or device
 * memory). */
typedef mp_status (*zero_gather_fn)(void *context, const float *input, float *output,
                                    size_t count, mp_error *err);
typedef mp_status (*zero_copy_fn)(void *context, float *dest, const float *source, size_t count,
                                  mp_error *err);

static mp_status zero_gather_params(float *params, size_t n, size_t part, int dp, int dp_rank,
                                    float *gathered, float *mine, size_t piece,
                                    zero_gather_fn gather, zero_copy_fn copy, zero_copy_fn zero,
                                    void *context, mp_error *err) {
  const size_t first = part * (size_t)dp_rank < n ? part * (size_t)dp_rank : n;
  for (size_t at = 0; at < part; at += piece) {
    const size_t count = part - at < piece ? part - at : piece;
    /* This rank's floats [first + at, + count), zero-padded past the end of the array. */
    const size_t own = first + at < n ? (n - (first + at) < count ? n - (first + at) : count) : 0;
    if (own < count) MP_TRY(zero(context, mine + own, NULL, count - own, err));
    if (own > 0) MP_TRY(copy(context, mine, params + first + at, own, err));
    MP_TRY(gather(context, mine, gathered, count, err));
    for (int d = 0; d < dp; ++d) {
      const size_t to = (size_t)d * part + at;
      if (to >= n) continue;
      const size_t len = n - to < count ? n - to : count;
      MP_TRY(copy(context, params + to, gathered + (size_t)d * count, len, err));
    }
  }
  return MP_OK;
}

typedef struct {
  mp_comm *dp;
  mp_nccl_comm *nccl;
} zero_comms;

static mp_status host_gather(void *context, const float *input, float *output, size_t count,
                             mp_error *err) {
  return mp_comm_all_gather_f32(((const zero_comms *)context)->dp, input, output, count, err);
}

static mp_status host_copy(void *context, float *dest, const float *source, size_t count,
                           mp_error *err) {
  memcpy(dest, source, count * sizeof(float));
  return MP_OK;
}

static mp_status host_zero(void *context, float *dest, const float *source, size_t count,
                           mp_error *err) {
  memset(dest, 0, count * sizeof(float));
  return MP_OK;
}

static mp_status device_gather(void *context, const float *input, float *output, size_t count,
                               mp_error *err) {
  const zero_comms *comms = context;
  if (comms->nccl == NULL) return mp_comm_all_gather_f32(comms->dp, input, output, count, err);
  /* Ordered by events on the GPU, the host going on: the gather after the copy into input, the
   * copies out of output after the gather; the caller waits once, after the last piece. */
  MP_TRY(mp_nccl_comm_wait_stream(comms->nccl, NULL, err));
  MP_TRY(mp_nccl_all_gather(comms->nccl, input, output, count, MP_NCCL_FLOAT32, err));
  return mp_nccl_stream_wait_comm(NULL, comms->nccl, err);
}

static mp_status device_copy(void *context, float *dest, const float *source, size_t count,
                             mp_error *err) {
  return mp_device_copy_on_device(dest, source, count * sizeof(float), err);
}

static mp_status device_zero(void *context, float *dest, const float *source, size_t count,
                             mp_error *err) {
  return mp_device_memset(dest, 0, count * sizeof(float), err);
}

static mp_status create_chunks(mp_trainer *trainer, const mp_model *model, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const int pp = plan->pp, v = plan->virtual_stages, stages = pp * v;
  const int pp_rank = trainer->options.pp_rank;
  int *counts = malloc((size_t)stages * sizeof(int));
  if (counts == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = stage_split(plan, model, counts, err);
  mp_gpt_layout *layout = NULL;
  if (status == MP_OK) status = mp_gpt_layout_create(model, (int)plan->seq_len, &layout, err);
  const int num_layers = layout != NULL ? mp_gpt_layout_config(layout)->num_layers : 0;
  mp_gpt_layout_free(layout);
  if (status == MP_OK) {
    int sum = 0;
    for (int st = 0; st < stages; ++st) sum += counts[st];
    if (sum != num_layers + 3) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: layers_per_stage sums to %d, but model %s has %d layers (embedding, "
                       "%d blocks, final norm and LM head each count one)",
                       plan->source, sum, mp_model_name(model), num_layers + 3, num_layers);
    }
  }
  trainer->num_chunks = v;
  trainer->chunks = calloc((size_t)v, sizeof *trainer->chunks);
  trainer->chains = calloc((size_t)v, sizeof *trainer->chains);
  trainer->chunk_m = calloc((size_t)v, sizeof *trainer->chunk_m);
  trainer->chunk_v = calloc((size_t)v, sizeof *trainer->chunk_v);
  trainer->zero_first = calloc((size_t)v, sizeof *trainer->zero_first);
  trainer->zero_count = calloc((size_t)v, sizeof *trainer->zero_count);
  const bool on_gpu = trainer->backend == MP_BACKEND_CUDA;
  const bool zero2 = plan->zero_stage >= 2;
  trainer->zero2 = zero2;
  trainer->zero3 = plan->zero_stage == 3;
  if (zero2) {
    if (!on_gpu) trainer->grad_part = calloc((size_t)v, sizeof *trainer->grad_part);
    trainer->zero2_hooks = calloc((size_t)v, sizeof *trainer->zero2_hooks);
    trainer->scatter_counts = calloc((size_t)trainer->zero_size, sizeof *trainer->scatter_counts);
    if (status == MP_OK && ((!on_gpu && trainer->grad_part == NULL) ||
                            trainer->zero2_hooks == NULL || trainer->scatter_counts == NULL)) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  if (on_gpu) trainer->gpu_chunks = calloc((size_t)v, sizeof *trainer->gpu_chunks);
  if (status == MP_OK && on_gpu && trainer->gpu_chunks == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK && (trainer->chunks == NULL || trainer->chains == NULL ||
                          trainer->chunk_m == NULL || trainer->chunk_v == NULL ||
                          trainer->zero_first == NULL ||
                          trainer->zero_count == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  const bool zero_bubble = trainer->schedule.kind == MP_SCHEDULE_ZB_H1;
  /* ZeRO's parts: over the dp ranks of this rank's shard group (all of dp without HSDP). */
  const int dp = trainer->zero_size, dp_rank = trainer->zero_rank;
  size_t largest = 0, largest_block = 0;
  for (int c = 0; c < v && status == MP_OK; ++c) {
    const int stage = mp_stage_index(pp, pp_rank, c);
    int first = 0;
    for (int s = 0; s < stage; ++s) first += counts[s];
    mp_gpt_stage range;
    status = mp_gpt_stage_of_chain(num_layers, first, first + counts[stage], &range, err);
    if (status != MP_OK) {
      mp_error inner = *err;
      status = mp_fail(err, status, "%s: layers_per_stage[%d]: %s", plan->source, stage,
                       inner.message);
      break;
    }
    const int slots = mp_stage_worker_slots(&trainer->schedule, pp_rank, c);
    /* On the GPU the host stage is the tensor table and layout the GPU stage mirrors: no
     * activation slots, no arrays (the GPU stage is its parameter store). */
    /* ZeRO's cut of the host stage: its gradients and (ZeRO-3) parameters. A GPU stage's host
     * side has no gradients (the GPU stage windows its own), and with ZeRO-3 lays out the same
     * parts of the parameters as the device. */
    const mp_gpt_tp_zero zero = {dp, dp_rank, zero2 && !on_gpu, trainer->zero3};
    status = mp_gpt_tp_create_stage(model, (int)plan->micro_batch, (int)plan->seq_len,
                                    &trainer->tp_table, plan->sequence_parallel, &range,
                                    on_gpu ? 0 : slots, zero_bubble && !on_gpu,
                                    on_gpu ? MP_RECOMPUTE_NONE : plan->recompute,
                                    (zero2 && !on_gpu) || trainer->zero3 ? &zero : NULL,
                                    &trainer->chunks[c], err);
    if (status == MP_OK && !on_gpu) {
      status = mp_gpt_tp_init_params(trainer->chunks[c], plan->training.seed, err);
    }
    if (status == MP_OK && on_gpu) {
      status = mp_gpt_stage_gpu_create(trainer->chunks[c], trainer->options.tp_device,
                                       (int)plan->micro_batch,
                                       (int)plan->seq_len, slots, zero_bubble, plan->recompute,
                                       zero2, &trainer->gpu_chunks[c], err);
      if (status != MP_OK) {
        mp_error inner = *err;
        status = mp_fail(err, status, "%s: stage %d on the GPU: %s", plan->source, stage,
                         inner.message);
      }
      if (status != MP_OK) break;
    }
    if (status != MP_OK) break;
    trainer->chains[c] = on_gpu ? mp_gpt_stage_gpu_chain(trainer->gpu_chunks[c])
                                : mp_gpt_tp_chain(trainer->chunks[c]);
    const size_t n = mp_gpt_tp_num_params(trainer->chunks[c]);
    size_t first_param = 0, count = n;
    if (plan->zero_stage >= 1) {
      mp_zero_part(n, dp, dp_rank, &first_param, &count);
      const size_t part = (n + (size_t)dp - 1) / (size_t)dp;
      if (part * (size_t)dp > largest) largest = part * (size_t)dp;
    }
    trainer->zero_first[c] = first_param;
    trainer->zero_count[c] = count;
    if (zero2) {
      size_t blocks_first = 0, blocks_end = 0, block = 0;
      mp_gpt_tp_blocks_range(trainer->chunks[c], &blocks_first, &blocks_end, &block);
      if (block > largest_block) largest_block = block;
      if (!on_gpu) trainer->grad_part[c] = calloc(count > 0 ? count : 1, sizeof(float));
      if (!on_gpu && trainer->grad_part[c] == NULL) {
        status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for a gradient part (%zu floats)",
                         count);
        break;
      }
      trainer->zero2_hooks[c].trainer = trainer;
      trainer->zero2_hooks[c].chunk = c;
      mp_stage_chain_set_grads_hook(trainer->chains[c], zero2_block_grads,
                                    &trainer->zero2_hooks[c]);
      if (trainer->zero3) {
        mp_stage_chain_set_weights_hook(trainer->chains[c], zero3_block_weights,
                                        &trainer->zero2_hooks[c]);
      }
    }
    if (on_gpu) {
      /* The AdamW moments live on the GPU (this rank's part with ZeRO; with ZeRO-2 the part's
       * gradients too), and so do the parameters, initialised through a bounded host buffer:
       * the host holds no copy of the state. */
      if (plan->zero_stage >= 1) {
        status = mp_gpt_stage_gpu_keep_moments(trainer->gpu_chunks[c], first_param, count, err);
      }
      if (status == MP_OK) {
        status = mp_gpt_tp_init_params(trainer->chunks[c], plan->training.seed, err);
      }
      if (status != MP_OK) {
        mp_error inner = *err;
        status = mp_fail(err, status, "%s: stage %d on the GPU: %s", plan->source, stage,
                         inner.message);
        break;
      }
      continue;
    }
    trainer->chunk_m[c] = calloc(count > 0 ? count : 1, sizeof(float));
    trainer->chunk_v[c] = calloc(count > 0 ? count : 1, sizeof(float));
    if (trainer->chunk_m[c] == NULL || trainer->chunk_v[c] == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for optimizer state (%zu floats)",
                       count);
    }
  }
  if (status == MP_OK && zero2) {
    /* A reduce-scatter's output: at most one window, or one bucket of the tensors outside the
     * blocks. */
    trainer->scatter_floats =
        largest_block > MP_TRAINER_BUCKET_FLOATS ? largest_block : MP_TRAINER_BUCKET_FLOATS;
    if (trainer->scatter_floats > largest / (size_t)dp + 1) {
      trainer->scatter_floats = largest / (size_t)dp + 1;
    }
    if (on_gpu) {
      void *memory = NULL;
      status = mp_device_alloc(&memory, trainer->scatter_floats * sizeof(float), err);
      trainer->scatter_out = memory;
      if (status == MP_OK) trainer->device_buffer_bytes += trainer->scatter_floats * sizeof(float);
      if (status == MP_OK && trainer->zero3 && trainer->options.nccl_dp == NULL) {
        trainer->zero3_staging = calloc(largest_block > 0 ? largest_block : 1, sizeof(uint16_t));
        if (trainer->zero3_staging == NULL) {
          status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for a block's weights");
        }
      }
    } else {
      trainer->scatter_out = calloc(trainer->scatter_floats, sizeof(float));
      if (trainer->scatter_out == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  if (status == MP_OK && largest > 0) {
    /* The parameter all-gather goes in pieces: dp pieces of at most zero_piece floats (its
     * output), then one (its input), on the GPU for a GPU run: a bounded buffer, not a chunk. */
    const size_t largest_part = largest / (size_t)dp;
    trainer->zero_piece = zero_piece_floats(largest_part, dp);
    const size_t floats = trainer->zero_piece * ((size_t)dp + 1);
    if (on_gpu) {
      void *memory = NULL;
      status = mp_device_alloc(&memory, floats * sizeof(float), err);
      trainer->zero_gather_device = memory;
      if (status == MP_OK) trainer->device_buffer_bytes += floats * sizeof(float);
    } else {
      trainer->zero_gather = calloc(floats, sizeof(float));
      if (trainer->zero_gather == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
    float *gather = on_gpu ? trainer->zero_gather_device : trainer->zero_gather;
    if (gather != NULL) trainer->zero_part = gather + trainer->zero_piece * (size_t)dp;
  }
  free(counts);
  return status;
}

static mp_status create_parallel(mp_trainer *trainer, const mp_model *model, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  mp_trainer_options *o = &trainer->options;
  trainer->tp_table = o->tp != NULL ? *o->tp : mp_tp_comm_single();
  const bool hybrid = mp_plan_zero_shard(plan) < plan->dp;
  trainer->zero_comm = hybrid ? o->zero_shard : plan->dp > 1 ? o->dp : NULL;
  trainer->zero_size = trainer->zero_comm != NULL ? mp_comm_size(trainer->zero_comm) : 1;
  trainer->zero_rank = trainer->zero_comm != NULL ? mp_comm_rank(trainer->zero_comm) : 0;
  if (!hybrid) o->zero_replica = NULL;
  mp_schedule_kind kind;
  MP_TRY(mp_schedule_kind_parse(plan->schedule, &kind, err));
  mp_status status = mp_schedule_generate(kind, plan->pp, (int)plan->num_micro_batches,
                                          plan->virtual_stages, &trainer->schedule, err);
  if (status != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, status, "%s: schedule %s: %s", plan->source, plan->schedule,
                   inner.message);
  }
  /* The layout (config, tensor table) every chunk is cut from. */
  MP_TRY(create_chunks(trainer, model, err));
  trainer->layout = mp_gpt_tp_layout(trainer->chunks[0]);
  const mp_stage_ops ops = {trainer, chunk_forward, chunk_backward, chunk_backward_weights,
                            chunk_release};
  mp_stage_p2p p2p = {trainer, pp_post_send, pp_wait_send, pp_recv, NULL, NULL};
  if (trainer->gpu_chunks != NULL) {
    p2p.alloc_buffer = device_buffer_alloc;
    p2p.free_buffer = device_buffer_free;
  }
  const mp_stage_observer observer = {trainer, observer_now, observer_action_done};
  const size_t boundary = mp_gpt_tp_boundary_floats(trainer->chunks[0]);
  status = mp_stage_worker_create(&trainer->schedule, o->pp_rank, boundary, &ops, &p2p,
                                  o->trace != NULL ? &observer : NULL, &trainer->worker, err);
  if (status == MP_OK && o->dp != NULL && plan->dp > 1 && plan->zero_stage < 2) {
    mp_stage_worker_on_chunk_done(trainer->worker, post_chunk_all_reduce);
  }
  /* Evaluation runs the same stages through the same worker code, forwards only (untraced: the
   * trace holds training steps). */
  if (status == MP_OK) {
    status = mp_schedule_generate_forward_only(kind, plan->pp, (int)plan->num_micro_batches,
                                               plan->virtual_stages, &trainer->eval_schedule,
                                               err);
  }
  if (status == MP_OK) {
    status = mp_stage_worker_create(&trainer->eval_schedule, o->pp_rank, boundary, &ops, &p2p,
                                    NULL, &trainer->eval_worker, err);
  }
  return status;
}

mp_status mp_trainer_create_parallel(const mp_plan *plan, const mp_model *model,
                                     mp_data_loader *data, mp_backend backend,
                                     const mp_trainer_options *options, mp_trainer **out,
                                     mp_error *err) {
  *out = NULL;
  mp_trainer_options o = MP_TRAINER_OPTIONS_INITIALIZER;
  if (options != NULL) o = *options;
  MP_TRY(mp_trainer_check_layout(plan, backend, err));
  const int tp_size = o.tp != NULL ? o.tp->size : 1;
  if (tp_size != plan->tp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the plan has tp = %d but this process's tensor-parallel group has %d "
                   "rank%s; start it with `mpengine run`, which launches dp x pp x tp = %d "
                   "ranks under mpirun",
                   plan->source, plan->tp, tp_size, tp_size == 1 ? "" : "s",
                   plan->dp * plan->pp * plan->tp);
  }
  MP_TRY(check_group(plan, "pp", o.pp, plan->pp, err));
  MP_TRY(check_group(plan, "dp", o.dp, plan->dp, err));
  if (mp_plan_zero_shard(plan) < plan->dp) {
    const int shard = mp_plan_zero_shard(plan);
    MP_TRY(check_group(plan, "zero-shard", o.zero_shard, shard, err));
    MP_TRY(check_group(plan, "zero-replica", o.zero_replica, plan->dp / shard, err));
  }
  MP_TRY(mp_data_loader_check(data, plan->seq_len, err));
  mp_trainer *trainer = calloc(1, sizeof *trainer);
  if (trainer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the trainer");
  trainer->plan = plan;
  trainer->data = data;
  trainer->backend = backend;
  trainer->options = o;
  trainer->flops_per_step = step_flops(plan, model);
  const size_t rows = (size_t)(plan->num_micro_batches * plan->micro_batch);
  trainer->inputs = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  trainer->targets = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  if (trainer->inputs == NULL || trainer->targets == NULL) {
    mp_trainer_free(trainer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the batch");
  }
  mp_status status;
  /* The one-rank model is the stage at dp = pp = tp = 1: every run, on either backend, takes
   * the same path (stage worker, schedule, chunk arrays). */
  status = create_parallel(trainer, model, err);
  if (status != MP_OK) {
    mp_trainer_free(trainer);
    return status;
  }
  *out = trainer;
  return MP_OK;
}

void mp_trainer_free(mp_trainer *trainer) {
  if (trainer == NULL) return;
  mp_error ignored = MP_ERROR_INITIALIZER;
  wait_dp_all_reduces(trainer, &ignored);
  free(trainer->dp_requests);
  free(trainer->dp_posted_s);
  free(trainer->dp_bytes);
  mp_stage_worker_free(trainer->worker);
  mp_stage_worker_free(trainer->eval_worker);
  mp_schedule_free(&trainer->eval_schedule);
  for (int c = 0; c < trainer->num_chunks; ++c) {
    if (trainer->gpu_chunks != NULL) mp_gpt_stage_gpu_free(trainer->gpu_chunks[c]);
    if (trainer->chunks != NULL) mp_gpt_tp_free(trainer->chunks[c]);
    if (trainer->chunk_m != NULL) free(trainer->chunk_m[c]);
    if (trainer->chunk_v != NULL) free(trainer->chunk_v[c]);
  }
  free(trainer->gpu_chunks);
  free(trainer->nccl_sends);
  free(trainer->chunks);
  free(trainer->chains);
  free(trainer->chunk_m);
  free(trainer->chunk_v);
  for (int c = 0; trainer->grad_part != NULL && c < trainer->num_chunks; ++c) {
    free(trainer->grad_part[c]);
  }
  free(trainer->grad_part);
  free(trainer->zero2_hooks);
  if (trainer->gpu_chunks != NULL) {
    mp_device_free(trainer->scatter_out);
  } else {
    free(trainer->scatter_out);
  }
  free(trainer->scatter_counts);
  free(trainer->zero3_staging);
  free(trainer->zero3_outside_piece);
  free(trainer->zero_first);
  free(trainer->zero_count);
  free(trainer->zero_gather);
  mp_device_free(trainer->zero_gather_device);
  mp_schedule_free(&trainer->schedule);
  free(trainer->targets);
  free(trainer->inputs);
  free(trainer);
}

mp_gpt_tp *mp_trainer_model_tp(mp_trainer *trainer) {
  return trainer->plan->pp == 1 && trainer->plan->virtual_stages <= 1 ? trainer->chunks[0]
                                                                         : NULL;
}

int mp_trainer_num_chunks(const mp_trainer *trainer) { return trainer->num_chunks; }

size_t mp_trainer_device_bytes(const mp_trainer *trainer) {
  size_t bytes = trainer->device_buffer_bytes;
  for (int c = 0; trainer->gpu_chunks != NULL && c < trainer->num_chunks; ++c) {
    if (trainer->gpu_chunks[c] != NULL) {
      bytes += mp_gpt_stage_gpu_device_bytes(trainer->gpu_chunks[c]);
    }
  }
  return bytes;
}

mp_gpt_tp *mp_trainer_chunk(mp_trainer *trainer, int chunk) {
  return chunk >= 0 && chunk < trainer->num_chunks ? trainer->chunks[chunk] : NULL;
}

int mp_trainer_tp(const mp_trainer *trainer) { return trainer->plan->tp; }

const mp_gpt_layout *mp_trainer_layout(const mp_trainer *trainer) { return trainer->layout; }

mp_status mp_trainer_load_weights(mp_trainer *trainer, const char *path, mp_error *err) {
  /* Shard-first: each chunk reads the byte ranges of its own shard. */
  mp_weight_source *reader = NULL;
  MP_TRY(mp_weight_source_open(trainer->layout, path, &reader, err));
  mp_status status = MP_OK;
  for (int c = 0; c < trainer->num_chunks && status == MP_OK; ++c) {
    /* On the GPU straight into the device's weights, through a bounded host buffer. */
    status = mp_weight_source_load_stage(reader, trainer->chunks[c], err);
  }
  mp_weight_source_close(reader);
  return status;
}

/* A streamed save moves each shard in pieces of at most this many floats per tp rank. */
enum { SAVE_PIECE_FLOATS = 1 << 18 };

/* What a pipeline rank sends world rank 0 before each piece: the tensor (layout index; -1 ends
 * the rank's pieces), the first element of every tp rank's piece in its shard, and their floats
 * (replicated tensors: tp rank 0's only). */
typedef struct {
  int64_t tensor, first, count, ranks;
} save_piece;

/* Writes piece (ranks x count floats, rank r's at r x count) of a tensor into the file: each tp
 * rank's elements [first, first + count) of its shard, run by run. */
typedef struct {
  mp_llmc_writer *writer;
  int tensor;
  const float *data; /* element `first` of the rank's shard */
  size_t first;
} piece_sink;

static mp_status write_run(void *context, size_t full_offset, size_t shard_offset, size_t count,
                           mp_error *err) {
  const piece_sink *sink = context;
  mp_llmc_writer_write(sink->writer, sink->tensor, full_offset,
                       sink->data + (shard_offset - sink->first), count);
  return MP_OK;
}

static mp_status write_piece(mp_llmc_writer *writer, const mp_gpt_layout *layout,
                             const save_piece *piece, const float *data, int tp_size,
                             mp_error *err) {
  if (writer == NULL) return MP_OK; /* the file could not be opened: pieces are drained */
  const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, (int)piece->tensor);
  for (int r = 0; r < (int)piece->ranks; ++r) {
    const piece_sink sink = {writer, (int)piece->tensor, data + (size_t)r * (size_t)piece->count,
                             (size_t)piece->first};
    MP_TRY(mp_tp_shard_runs(t->split, t->rows, t->cols, r, piece->ranks == 1 ? 1 : tp_size,
                            (size_t)piece->first, (size_t)piece->count, write_run, (void *)&sink,
                            err));
  }
  return MP_OK;
}

/* The parallel save: every pipeline rank at dp rank 0 walks its chunks' tensors in pieces; the
 * tp group all-gathers each piece of a split tensor; tp rank 0 writes it (pipeline rank 0, which
 * is world rank 0) or sends it to pipeline rank 0, which takes the other pipeline ranks' pieces
 * in turn. No rank holds more than its state and tp x SAVE_PIECE_FLOATS floats. */
static mp_status save_parallel(mp_trainer *trainer, const char *path, mp_error *err) {
  const mp_trainer_options *o = &trainer->options;
  /* Every dp replica holds the same parameters; with ZeRO-3 the blocks' are spread over the dp
   * ranks, which send dp rank 0 their parts of each piece. */
  if (o->dp_rank != 0 && !trainer->zero3) return MP_OK;
  const mp_tp_comm *tp = &trainer->tp_table;
  const int P = trainer->plan->pp;
  const bool writer_rank = o->dp_rank == 0 && o->pp_rank == 0 && tp->rank == 0;
  mp_status status = MP_OK, file_status = MP_OK;
  mp_error file_err = MP_ERROR_INITIALIZER;
  mp_llmc_writer *writer = NULL;
  if (writer_rank) file_status = mp_llmc_writer_open(trainer->layout, path, &writer, &file_err);
  float *gathered = malloc((size_t)(tp->size + 1) * SAVE_PIECE_FLOATS * sizeof(float));
  if (gathered == NULL) {
    if (writer != NULL) mp_llmc_writer_abort(writer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a save's piece");
  }
  /* This rank's piece, read from wherever it keeps it (host memory, the GPU) or with ZeRO-3
   * collected from the dp ranks' parts. */
  float *own = gathered + (size_t)tp->size * SAVE_PIECE_FLOATS;
  for (int c = 0; c < trainer->num_chunks && status == MP_OK; ++c) {
    mp_gpt_tp *chunk = trainer->chunks[c];
    size_t blocks_first = 0, blocks_end = 0, largest = 0;
    mp_gpt_tp_blocks_range(chunk, &blocks_first, &blocks_end, &largest);
    /* Each chunk has its own copy of the layout: indices, not pointers, cross between them. */
    const mp_gpt_tensor *first_tensor = mp_gpt_layout_tensor(mp_gpt_tp_layout(chunk), 0);
    for (int j = 0; j < mp_gpt_tp_num_tensors(chunk) && status == MP_OK; ++j) {
      const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(chunk, j);
      if (t->tied_copy) continue; /* the first stage writes wte */
      const bool replicated = t->split == MP_TP_REPLICATED;
      for (size_t at = 0; at < t->count && status == MP_OK; at += SAVE_PIECE_FLOATS) {
        const size_t n = t->count - at < SAVE_PIECE_FLOATS ? t->count - at : SAVE_PIECE_FLOATS;
        const save_piece piece = {t->full - first_tensor, (int64_t)at, (int64_t)n,
                                  replicated ? 1 : tp->size};
        if (trainer->zero3 && t->offset >= blocks_first && t->offset < blocks_end) {
          status = zero3_collect(trainer, c, t->offset + at, n, own, err);
        } else if (o->dp_rank == 0) {
          status = mp_gpt_tp_read_params(chunk, t->offset + at, n, own, err);
        }
        if (status != MP_OK || o->dp_rank != 0) continue;
        if (replicated) {
          if (tp->rank == 0) memcpy(gathered, own, n * sizeof(float));
        } else {
          status = mp_tp_all_gather(tp, own, gathered, n, err);
        }
        if (status != MP_OK || tp->rank != 0) continue;
        if (o->pp_rank == 0) {
          status = write_piece(writer, trainer->layout, &piece, gathered, tp->size, err);
        } else {
          status = mp_comm_send(o->pp, &piece, sizeof piece, 0, err);
          if (status == MP_OK) {
            status = mp_comm_send(o->pp, gathered, (size_t)piece.ranks * n * sizeof(float), 0,
                                  err);
          }
        }
      }
    }
  }
  if (status == MP_OK && o->dp_rank == 0 && tp->rank == 0 && o->pp_rank > 0) {
    const save_piece end = {-1, 0, 0, 0};
    status = mp_comm_send(o->pp, &end, sizeof end, 0, err);
  }
  /* Pipeline rank 0 takes the other pipeline ranks' pieces, in pipeline-rank order. */
  for (int p = 1; p < P && writer_rank && status == MP_OK; ++p) {
    for (;;) {
      save_piece piece;
      status = mp_comm_recv(o->pp, &piece, sizeof piece, p, err);
      if (status != MP_OK || piece.tensor < 0) break;
      const mp_gpt_tensor *t = mp_gpt_layout_tensor(trainer->layout, (int)piece.tensor);
      if (t == NULL || piece.ranks < 1 || piece.ranks > tp->size || piece.count < 0 ||
          piece.count > SAVE_PIECE_FLOATS) {
        status = mp_fail(err, MP_ERR_RUNTIME, "pipeline rank %d sent a bad piece of a save", p);
        break;
      }
      status = mp_comm_recv(o->pp, gathered, (size_t)(piece.ranks * piece.count) * sizeof(float),
                            p, err);
      if (status == MP_OK) {
        status = write_piece(writer, trainer->layout, &piece, gathered, tp->size, err);
      }
    }
  }
  free(gathered);
  if (writer != NULL) {
    if (status == MP_OK) {
      status = mp_llmc_writer_commit(writer, err);
    } else {
      mp_llmc_writer_abort(writer);
    }
  }
  if (status == MP_OK && file_status != MP_OK) {
    if (err != NULL) *err = file_err;
    status = file_status;
  }
  return status;
}

mp_status mp_trainer_save_llmc(mp_trainer *trainer, const char *path, mp_error *err) {
  return save_parallel(trainer, path, err);
}

mp_status mp_trainer_chunk_state_of(const mp_trainer *trainer, int chunk,
                                    mp_trainer_chunk_state *out, mp_error *err) {
  if (chunk < 0 || chunk >= trainer->num_chunks) {
    return mp_fail(err, MP_ERR_INPUT, "chunk %d: the run has %d model chunks on this rank", chunk,
                   trainer->num_chunks);
  }
  out->params_count = mp_gpt_tp_num_params(trainer->chunks[chunk]);
  out->moments_first = trainer->zero_first[chunk];
  out->moments_count = trainer->zero_count[chunk];
  return MP_OK;
}

/* Moves elements [first, first + count) of chunk's array between host memory (dest or src) and
 * where the backend keeps it. */
static mp_status move_state(mp_trainer *trainer, int chunk, mp_trainer_array array, size_t first,
                            size_t count, float *dest, const float *src, mp_error *err) {
  mp_trainer_chunk_state state;
  MP_TRY(mp_trainer_chunk_state_of(trainer, chunk, &state, err));
  if (array == MP_TRAINER_PARAMS) {
    return dest != NULL ? mp_gpt_tp_read_params(trainer->chunks[chunk], first, count, dest, err)
                        : mp_gpt_tp_write_params(trainer->chunks[chunk], first, count, src, err);
  }
  if (array != MP_TRAINER_ADAM_M && array != MP_TRAINER_ADAM_V) {
    return mp_fail(err, MP_ERR_INPUT, "state array %d: not parameters or a moment", (int)array);
  }
  const size_t lo = state.moments_first;
  if (first < lo || first - lo > state.moments_count || count > state.moments_count - (first - lo)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moments of elements [%zu, %zu) of chunk %d: this rank keeps those of [%zu, "
                   "%zu)",
                   first, first + count, chunk, lo, lo + state.moments_count);
  }
  const size_t bytes = count * sizeof(float);
  if (trainer->gpu_chunks == NULL) {
    float *moment = (array == MP_TRAINER_ADAM_M ? trainer->chunk_m : trainer->chunk_v)[chunk];
    if (dest != NULL) memcpy(dest, moment + (first - lo), bytes);
    if (src != NULL) memcpy(moment + (first - lo), src, bytes);
    return MP_OK;
  }
  float *adam_m = NULL, *adam_v = NULL;
  MP_TRY(mp_gpt_stage_gpu_moments_at(trainer->gpu_chunks[chunk], first, count, &adam_m, &adam_v,
                                     err));
  float *moment = array == MP_TRAINER_ADAM_M ? adam_m : adam_v;
  return dest != NULL ? mp_device_copy_to_host(dest, moment, bytes, err)
                      : mp_device_copy_to_device(moment, src, bytes, err);
}

mp_status mp_trainer_read_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                size_t first, size_t count, float *dest, mp_error *err) {
  return move_state(trainer, chunk, array, first, count, dest, NULL, err);
}

mp_status mp_trainer_write_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                 size_t first, size_t count, const float *src, mp_error *err) {
  return move_state(trainer, chunk, array, first, count, NULL, src, err);
}

/* This dp rank's rows of the global batch of `step` from data, for the stage worker's
 * micro-batches. */
static mp_status load_batch(mp_trainer *trainer, mp_data_loader *data, int64_t step,
                            mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const int64_t rows = plan->num_micro_batches * plan->micro_batch;
  const int64_t first_row = (int64_t)trainer->options.dp_rank * rows;
  return mp_data_loader_batch(data, plan->training.seed, plan->seq_len, plan->global_batch, step,
                              first_row, rows, trainer->inputs, trainer->targets, err);
}

static mp_status parallel_step_loss(mp_trainer *trainer, double *loss, mp_error *err);

mp_status mp_trainer_evaluate(mp_trainer *trainer, mp_data_loader *data, int64_t batch,
                              double *loss, mp_error *err) {
  if (data == NULL) data = trainer->data;
  MP_TRY(mp_data_loader_check(data, trainer->plan->seq_len, err));
  MP_TRY(load_batch(trainer, data, batch, err));
  trainer->loss_sum = 0.0;
  trainer->evaluating = true;
  const mp_status status = mp_stage_worker_run(trainer->eval_worker, err);
  trainer->evaluating = false;
  MP_TRY(status);
  return parallel_step_loss(trainer, loss, err);
}

/* AdamW over elements [first, first + count) of a chunk's parameters, tensor by tensor (weight
 * decay is a property of the tensor), with the gradients times grad_scale (the clip factor);
 * grads, m and v hold that range only. */
static void adamw_range(mp_gpt_tp *chunk, size_t first, size_t count, float *grads, float *m,
                        float *v, const mp_training_config *t, double lr, int64_t step,
                        float grad_scale) {
  const size_t end = first + count;
  for (int i = 0; i < mp_gpt_tp_num_tensors(chunk); ++i) {
    const mp_gpt_tp_tensor *tensor = mp_gpt_tp_tensor_at(chunk, i);
    const size_t lo = tensor->offset > first ? tensor->offset : first;
    const size_t hi = tensor->offset + tensor->count < end ? tensor->offset + tensor->count : end;
    if (lo >= hi) continue;
    /* Where the stage keeps them (with ZeRO-3 not at their offsets: the part's own). */
    float *params = mp_gpt_tp_params_at(chunk, lo, hi - lo);
    mp_adamw_update_scaled_cpu(params, grads + (lo - first), m + (lo - first),
                               v + (lo - first),
                               hi - lo, (float)lr, (float)t->beta1, (float)t->beta2,
                               (float)t->eps,
                               tensor->full->weight_decay ? (float)t->weight_decay : 0.0f,
                               (int)(step + 1), grad_scale);
  }
}

/* Steps 3-4 of the file comment, after the stage worker has run the step's actions (the dp
 * all-reduces already started inside it), on the chunks' host or GPU gradients: the dp mean, the
 * sequence-parallel layernorm sums, the tied embedding, and the global norm into *grad_norm. */
static mp_status reduce_step_grads(mp_trainer *trainer, double *grad_norm, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_trainer_options *o = &trainer->options;
  mp_gpt_stage_gpu **gpu = trainer->gpu_chunks;
  /* First the dp all-reduces posted as the chunks' gradients completed: until they end, MPI or
   * NCCL may still write the gradients. */
  const bool zero2 = trainer->zero2;
  if (o->dp != NULL && plan->dp > 1 && !zero2) {
    MP_TRY(wait_dp_all_reduces(trainer, err));
    const float scale = 1.0f / (float)plan->dp;
    for (int c = 0; c < trainer->num_chunks; ++c) {
      if (gpu != NULL) {
        mp_gpt_stage_gpu_scale_grads(gpu[c], scale);
      } else {
        mp_grad_scale_cpu(mp_gpt_tp_grads(trainer->chunks[c]),
                          mp_gpt_tp_num_params(trainer->chunks[c]), scale);
      }
    }
  }
  for (int c = 0; c < trainer->num_chunks; ++c) {
    MP_TRY(mp_stage_chain_finish_grads(trainer->chains[c], err));
  }
  if (gpu != NULL) MP_TRY(mp_device_synchronize(err));
  /* The tied embedding: the first stage's wte gradient plus the last stage's copy's (an untied
   * head is the last stage's own). */
  const bool tied = mp_gpt_layout_config(mp_gpt_tp_layout(trainer->chunks[0]))->tied_head;
  if (tied && o->embedding != NULL && mp_comm_size(o->embedding) > 1) {
    for (int c = 0; c < trainer->num_chunks; ++c) {
      mp_gpt_tp *chunk = trainer->chunks[c];
      const mp_gpt_stage *stage = mp_gpt_tp_stage(chunk);
      const bool first = stage->embedding && c == 0;
      const bool last = stage->head && c == trainer->num_chunks - 1;
      if (!first && !last) continue;
      const mp_gpt_tp_tensor *wte = mp_gpt_tp_tensor_at(chunk, 0);
      float *grads = gpu != NULL ? mp_gpt_stage_gpu_tensor_grad(gpu[c], 0)
                                 : mp_gpt_tp_tensor_grad(chunk, 0);
      /* In buckets: a transient buffer of the whole table (the collective's, or the staging's
       * for device memory) would be the rank's largest allocation after its state. */
      for (size_t at = 0; at < wte->count; at += MP_TRAINER_BUCKET_FLOATS) {
        const size_t n = wte->count - at < MP_TRAINER_BUCKET_FLOATS ? wte->count - at
                                                                    : MP_TRAINER_BUCKET_FLOATS;
        MP_TRY(traced_all_reduce(trainer, o->embedding, grads + at, n, err));
      }
    }
  }
  if (zero2) {
    /* The blocks' gradients are in the parts already; the rest joins them, then the dp mean. */
    const float scale = 1.0f / (float)plan->dp;
    for (int c = 0; c < trainer->num_chunks; ++c) {
      MP_TRY(zero2_array_grads(trainer, c, err));
      /* On the GPU the reduce-scatters and their adds into the part ran on the dp
       * communicator's stream: what follows on the default stream waits for them. */
      if (gpu != NULL && o->nccl_dp != NULL) {
        MP_TRY(mp_nccl_stream_wait_comm(NULL, o->nccl_dp, err));
      }
      /* HSDP: each shard group summed its own dp ranks; the replicas' parts add up to dp's. */
      for (size_t at = 0; o->zero_replica != NULL && at < trainer->zero_count[c];
           at += MP_TRAINER_BUCKET_FLOATS) {
        const size_t count = trainer->zero_count[c] - at < MP_TRAINER_BUCKET_FLOATS
                                 ? trainer->zero_count[c] - at
                                 : MP_TRAINER_BUCKET_FLOATS;
        MP_TRY(traced_all_reduce(trainer, o->zero_replica, trainer->grad_part[c] + at, count,
                                 err));
      }
      if (gpu != NULL) {
        mp_gpt_stage_gpu_scale_grads(gpu[c], scale);
      } else {
        mp_grad_scale_cpu(trainer->grad_part[c], trainer->zero_count[c], scale);
      }
    }
  }
  double squares = 0.0;
  for (int c = 0; c < trainer->num_chunks; ++c) {
    double chunk_squares = 0.0;
    if (zero2) {
      MP_TRY(zero2_norm_squared(trainer, c, &chunk_squares, err));
    } else {
      MP_TRY(gpu != NULL ? mp_gpt_stage_gpu_grad_norm_squared(gpu[c], &chunk_squares, err)
                         : mp_gpt_tp_grad_norm_squared(trainer->chunks[c], &chunk_squares, err));
    }
    squares += chunk_squares;
  }
  if (o->pp != NULL) MP_TRY(sum_double_over(o->pp, &squares, err));
  *grad_norm = sqrt(squares);
  return MP_OK;
}

/* Step 5 of the file comment after reduce_step_grads, on the CPU: clipping, AdamW, ZeRO 1 and
 * 2. */
static mp_status finish_parallel_step(mp_trainer *trainer, double lr, double *grad_norm,
                                      mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_training_config *t = &plan->training;
  MP_TRY(reduce_step_grads(trainer, grad_norm, err));
  const float scale = mp_clip_scale(*grad_norm, t->grad_clip);
  for (int c = 0; c < trainer->num_chunks; ++c) {
    mp_gpt_tp *chunk = trainer->chunks[c];
    const size_t n = mp_gpt_tp_num_params(chunk);
    const size_t first = trainer->zero_first[c], count = trainer->zero_count[c];
    /* The clip factor multiplies each gradient inside AdamW: no pass of its own. */
    float *grads = trainer->grad_part != NULL ? trainer->grad_part[c]
                                              : mp_gpt_tp_grads(chunk) + first;
    adamw_range(chunk, first, count, grads, trainer->chunk_m[c], trainer->chunk_v[c], t, lr,
                trainer->step, scale);
    if (plan->zero_stage < 1 || trainer->zero_comm == NULL || trainer->zero_size == 1) continue;
    /* ZeRO-3: only the tensors every rank keeps whole; the blocks' stay in the parts. */
    if (trainer->zero3) {
      MP_TRY(zero3_gather_outside(trainer, c, err));
      continue;
    }
    /* ZeRO-1 and 2: every dp rank updated its part; gather the whole array (over the shard
     * group with HSDP: the replicas updated the same parts alike). */
    const int size = trainer->zero_size;
    const size_t part = (n + (size_t)size - 1) / (size_t)size;
    zero_comms comms = {trainer->zero_comm, NULL};
    MP_TRY(zero_gather_params(mp_gpt_tp_params(chunk), n, part, size, trainer->zero_rank,
                              trainer->zero_gather, trainer->zero_part, trainer->zero_piece,
                              host_gather, host_copy, host_zero, &comms, err));
  }
  return MP_OK;
}

/* The step's loss on every rank: the last stage's mean over its micro-batches, broadcast over
 * pp, averaged over dp. */
static mp_status parallel_step_loss(mp_trainer *trainer, double *loss, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_trainer_options *o = &trainer->options;
  double value = trainer->loss_sum / (double)plan->num_micro_batches;
  if (o->pp != NULL) {
    MP_TRY(mp_comm_broadcast(o->pp, &value, sizeof value, mp_comm_size(o->pp) - 1, err));
  }
  if (o->dp != NULL && plan->dp > 1) {
    MP_TRY(sum_double_over(o->dp, &value, err));
    value /= (double)plan->dp;
  }
  *loss = value;
  return MP_OK;
}

/* `--gpu-comm nccl` without data parallelism: the chunks' gradients through the dp group's NCCL
 * communicator anyway (a sum over one member leaves them as they are: a check of NCCL on one
 * GPU). */
static mp_status sum_grads_over_nccl_alone(mp_trainer *trainer, mp_error *err) {
  mp_nccl_comm *nccl = trainer->options.nccl_dp;
  MP_TRY(mp_nccl_comm_wait_stream(nccl, NULL, err));
  for (int c = 0; c < trainer->num_chunks; ++c) {
    /* The stage's gradient array as it is (with ZeRO-2 the packed tensors outside the blocks). */
    MP_TRY(mp_nccl_all_reduce_sum(nccl, mp_gpt_stage_gpu_device_grads(trainer->gpu_chunks[c]),
                                  mp_gpt_stage_gpu_grads_floats(trainer->gpu_chunks[c]),
                                  MP_NCCL_FLOAT32, err));
  }
  return mp_nccl_comm_synchronize(nccl, err);
}

/* finish_parallel_step with the chunks on the GPU: clipping, AdamW and ZeRO-1 on the device. */
static mp_status finish_gpu_step(mp_trainer *trainer, double lr, double *grad_norm,
                                 mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_training_config *t = &plan->training;
  const mp_trainer_options *o = &trainer->options;
  MP_TRY(reduce_step_grads(trainer, grad_norm, err));
  const float scale = mp_clip_scale(*grad_norm, t->grad_clip);
  const mp_gpu_adamw adamw = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->eps,
                              (float)t->weight_decay, (int)(trainer->step + 1), t->grad_clip};
  for (int c = 0; c < trainer->num_chunks; ++c) {
    mp_gpt_stage_gpu *gpu = trainer->gpu_chunks[c];
    if (scale != 1.0f) mp_gpt_stage_gpu_scale_grads(gpu, scale);
    MP_TRY(mp_gpt_stage_gpu_adamw(gpu, &adamw, err));
    if (plan->zero_stage < 1 || trainer->zero_comm == NULL || trainer->zero_size == 1) continue;
    /* ZeRO-3: AdamW refreshed the part's bf16 weights; the tensors outside the blocks are
     * gathered, then their bf16 copy refreshed. */
    if (trainer->zero3) {
      MP_TRY(zero3_gather_outside(trainer, c, err));
      if (o->nccl_dp != NULL) MP_TRY(mp_nccl_comm_synchronize(o->nccl_dp, err));
      mp_gpt_stage_gpu_refresh_weights(gpu);
      continue;
    }
    /* ZeRO 1 and 2: every dp rank updated its part of the master weights; gather the whole
     * array on the device (NCCL, or MPI through the host), then refresh the bf16 copy. */
    const size_t n = mp_gpt_tp_num_params(trainer->chunks[c]);
    const size_t part = (n + (size_t)plan->dp - 1) / (size_t)plan->dp;
    zero_comms comms = {o->dp, o->nccl_dp};
    MP_TRY(zero_gather_params(mp_gpt_stage_gpu_device_params(gpu), n, part, plan->dp, o->dp_rank,
                              trainer->zero_gather_device, trainer->zero_part,
                              trainer->zero_piece, device_gather, device_copy, device_zero,
                              &comms, err));
    if (o->nccl_dp != NULL) MP_TRY(mp_nccl_comm_synchronize(o->nccl_dp, err));
    mp_gpt_stage_gpu_refresh_weights(gpu);
  }
  return MP_OK;
}

mp_status mp_trainer_step(mp_trainer *trainer, int64_t step, mp_step_metrics *metrics,
                          mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_training_config *t = &plan->training;
  const double start = now_seconds();
  const double lr = mp_training_learning_rate(t, step);
  double loss = 0.0, grad_norm = 0.0;
  trainer->step = step;
  trainer->zero3_prefetch.window = NULL; /* the weights changed: no gather of the last step's */
  if (trainer->gpu_chunks != NULL) {
    for (int c = 0; c < trainer->num_chunks; ++c) {
      MP_TRY(mp_gpt_stage_gpu_zero_grads(trainer->gpu_chunks[c], err));
    }
  } else {
    for (int c = 0; c < trainer->num_chunks; ++c) {
      mp_gpt_tp_zero_grads(trainer->chunks[c]);
      if (trainer->grad_part != NULL) {
        memset(trainer->grad_part[c], 0, trainer->zero_count[c] * sizeof(float));
      }
    }
  }
  MP_TRY(load_batch(trainer, trainer->data, step, err));
  trainer->loss_sum = 0.0;
  MP_TRY(mp_stage_worker_run(trainer->worker, err));
  MP_TRY(parallel_step_loss(trainer, &loss, err));
  if (trainer->gpu_chunks != NULL && trainer->options.nccl_dp != NULL && plan->dp == 1) {
    MP_TRY(sum_grads_over_nccl_alone(trainer, err));
  }
  if (!isfinite(loss)) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "step %lld: the loss is %g; lower the learning rate (%g) or check the data",
                   (long long)step, loss, t->learning_rate);
  }
  if (trainer->gpu_chunks != NULL) {
    MP_TRY(finish_gpu_step(trainer, lr, &grad_norm, err));
  } else {
    MP_TRY(finish_parallel_step(trainer, lr, &grad_norm, err));
  }
  const double seconds = now_seconds() - start;
  if (trainer->options.trace != NULL) {
    const double end_s = mp_trace_now(trainer->options.trace);
    mp_trace_step(trainer->options.trace, step, end_s - seconds, end_s);
  }
  metrics->step = step;
  metrics->loss = loss;
  metrics->learning_rate = lr;
  metrics->grad_norm = grad_norm;
  metrics->seconds = seconds;
  metrics->tokens_per_s = (double)(plan->global_batch * plan->seq_len) / seconds;
  metrics->flops = trainer->flops_per_step;
  return MP_OK;
}
