/* engine/train/dp_sync.c — the data-parallel gradient sync and the step's gradient
 * finalisation: bucketed all-reduces posted as chunks (or, on the GPU, blocks) finish,
 * overlapping the backwards still to run; the dp mean, the sequence-parallel and tied-embedding
 * sums, and the global norm. */
#include "engine/train/trainer_internal.h"

#include <math.h>
#include <stdlib.h>

#include "engine/model/stage_chain.h"
#include "engine/comm/tp_comm_mpi.h"
#include "layers/adamw.h"

/* A collective of the step, timed into the trace. */
static mp_status traced_all_reduce(mp_trainer *trainer, mp_comm *comm, float *buffer,
                                   size_t count, mp_error *err) {
  const double start = mp_train_trace_now(trainer);
  MP_TRY(mp_comm_all_reduce_sum_f32(comm, buffer, count, err));
  if (trainer->options.trace != NULL) {
    mp_trace_comm(trainer->options.trace, trainer->step, "all-reduce", mp_comm_name(comm), -1,
                  count * sizeof(float), NULL, start, mp_train_trace_now(trainer));
  }
  return MP_OK;
}

/* *value summed over comm's members in rank order, bitwise the same on every member. */
mp_status mp_train_sum_double_over(mp_comm *comm, double *value, mp_error *err) {
  const mp_tp_comm group = mp_tp_comm_over_group(comm);
  return mp_tp_sum_double(&group, value, err);
}

/* Posts the dp all-reduce of grads [0, n) in buckets without waiting, after the compute so far
 * (engine/comm/dp_comm.h: non-blocking MPI, which stages GPU memory through the host with a few
 * buckets in flight at most, or enqueued on NCCL's stream, the GPU overlapping it with the
 * backward still to come). mp_train_wait_dp_all_reduces finishes them. */
static mp_status post_dp_all_reduce(mp_trainer *trainer, float *grads, size_t n, mp_error *err) {
  mp_dp_comm *dp = trainer->dp_sync;
  if (n > 0) MP_TRY(mp_dp_comm_after_compute(dp, err));
  for (size_t offset = 0; offset < n; offset += MP_TRAINER_BUCKET_FLOATS) {
    const size_t count = n - offset < MP_TRAINER_BUCKET_FLOATS ? n - offset
                                                               : MP_TRAINER_BUCKET_FLOATS;
    MP_TRY(mp_dp_comm_post_all_reduce_sum_f32(dp, grads + offset, count, err));
  }
  return MP_OK;
}

/* The stage worker's hook after a chunk's last backward (or W): its dp all-reduce starts while the
 * other chunks' backwards run. On the GPU the blocks' gradients were posted one by one inside that
 * action (gpu_overlap_dp, mp_train_block_grads_ready): only the tensors outside the blocks remain.
 * */
mp_status mp_train_post_chunk_all_reduce(void *context, int chunk, mp_error *err) {
  mp_trainer *trainer = context;
  const mp_stage_state *stage = &trainer->stages[chunk];
  float *grads = stage->ops->grads(stage->stage);
  const mp_stage_layout *layout = trainer->layouts[chunk];
  const size_t n = mp_stage_layout_num_params(layout);
  if (trainer->ep_table.size > 1) {
    /* Expert parallelism: the runs of tensors between the experts over dp now; the experts
     * (each ep rank's own) over the expert-dp group at the step's end (sum_expert_grads). */
    size_t run = 0;
    for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
      if (t->ep_size <= 1) continue;
      MP_TRY(post_dp_all_reduce(trainer, grads + run, t->offset - run, err));
      run = t->offset + t->count;
    }
    return post_dp_all_reduce(trainer, grads + run, n - run, err);
  }
  if (!stage->ops->on_device) return post_dp_all_reduce(trainer, grads, n, err);
  size_t first = 0, end = 0; /* the blocks' range */
  mp_stage_chain_blocks_range(trainer->chains[chunk], &first, &end);
  MP_TRY(post_dp_all_reduce(trainer, grads, first, err));
  return post_dp_all_reduce(trainer, grads + end, n - end, err);
}

/* During a GPU chunk's last backward of the step: block gradients [offset, offset + count) are
 * complete once the kernels enqueued so far ran; their dp all-reduce goes now (Megatron's
 * overlapped gradient buckets). */
mp_status mp_train_block_grads_ready(void *context, float *grads, size_t first, size_t count,
                                   mp_error *err) {
  (void)first;
  return post_dp_all_reduce(context, grads, count, err);
}

/* Waits for every posted dp all-reduce (all of them, even after a failure, so none is left
 * pending on a buffer the trainer may free). */
mp_status mp_train_wait_dp_all_reduces(mp_trainer *trainer, mp_error *err) {
  return trainer->dp_sync != NULL ? mp_dp_comm_synchronize(trainer->dp_sync, err) : MP_OK;
}

/* Expert parallelism: each chunk's experts' gradients (this ep rank's experts) summed over the
 * expert-data-parallel group, the replicas holding the same experts (expert_parallel/
 * ep_dispatch.h: each ep rank's hold the sum over its ep group's tokens already, so with the
 * expert-dp sum they hold all dp x cp replicas' and take the dp mean as the rest does). */
static mp_status sum_expert_grads(mp_trainer *trainer, mp_error *err) {
  mp_comm *expert_dp = trainer->options.expert_dp;
  if (expert_dp == NULL || mp_comm_size(expert_dp) <= 1) return MP_OK;
  for (int c = 0; c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    const mp_stage_layout *layout = trainer->layouts[c];
    for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
      if (t->ep_size <= 1) continue;
      float *grads = chunk->ops->tensor_grad(chunk->stage, i);
      for (size_t at = 0; at < t->count; at += MP_TRAINER_BUCKET_FLOATS) {
        const size_t n = t->count - at < MP_TRAINER_BUCKET_FLOATS ? t->count - at
                                                                  : MP_TRAINER_BUCKET_FLOATS;
        MP_TRY(traced_all_reduce(trainer, expert_dp, grads + at, n, err));
      }
    }
  }
  return MP_OK;
}

/* Expert parallelism: the squares of the experts' gradients, which the stages leave out of their
 * norm (mp_stage_norm_from_squares): this ep rank's experts' summed over the ep group in rank
 * order, so every expert counts once and every rank gets bitwise the same sum. */
static mp_status expert_squares(mp_trainer *trainer, double *out, mp_error *err) {
  *out = 0.0;
  if (trainer->ep_table.size <= 1 || trainer->zero2) return MP_OK; /* ZeRO 2-3: zero.c's */
  for (int c = 0; c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    const mp_stage_layout *layout = trainer->layouts[c];
    for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
      if (t->ep_size <= 1) continue;
      const float *grad = chunk->ops->tensor_grad(chunk->stage, i);
      if (chunk->ops->on_device) { /* a GPU stage's gradients, read on the host */
        float *host = malloc(t->count * sizeof(float) + 1);
        if (host == NULL) {
          return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %s", t->full->name);
        }
        const mp_status status = chunk->ops->to_host(host, grad, t->count * sizeof(float), err);
        if (status == MP_OK) *out += mp_grad_norm_squared_cpu(host, t->count);
        free(host);
        MP_TRY(status);
        continue;
      }
      *out += mp_grad_norm_squared_cpu(grad, t->count);
    }
  }
  return mp_train_sum_double_over(trainer->options.ep, out, err);
}

/* Steps 3-4 of the file comment, after the stage worker has run the step's actions (the dp
 * all-reduces already started inside it), on the chunks' host or GPU gradients: the dp mean, the
 * sequence-parallel layernorm sums, the tied embedding, and the global norm into *grad_norm. */
mp_status mp_train_reduce_step_grads(mp_trainer *trainer, double *grad_norm, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_trainer_options *o = &trainer->options;
  /* First the dp all-reduces posted as the chunks' gradients completed: until they end, MPI or
   * NCCL may still write the gradients. */
  const bool zero2 = trainer->zero2;
  const int replicas = mp_plan_replicas(plan);
  if (trainer->dp_sync != NULL && replicas > 1 && !zero2) {
    MP_TRY(mp_train_wait_dp_all_reduces(trainer, err));
    MP_TRY(sum_expert_grads(trainer, err));
    /* The mean over the replicas: dp ranks' batches and cp ranks' tokens, each the same count. */
    const float scale = 1.0f / (float)replicas;
    for (int c = 0; c < trainer->num_chunks; ++c) {
      trainer->stages[c].ops->scale_grads(trainer->stages[c].stage, scale);
    }
  }
  for (int c = 0; c < trainer->num_chunks; ++c) {
    MP_TRY(mp_stage_chain_finish_grads(trainer->chains[c], err));
  }
  MP_TRY(trainer->state_ops->synchronize(err));
  /* The tied embedding: the first stage's wte gradient plus the last stage's copy's (an untied
   * head is the last stage's own). */
  const bool tied =
      mp_param_layout_config(mp_stage_layout_model(trainer->layouts[0]))
          ->tied_head;
  if (tied && o->embedding != NULL && mp_comm_size(o->embedding) > 1) {
    for (int c = 0; c < trainer->num_chunks; ++c) {
      const mp_stage_state *chunk = &trainer->stages[c];
      const mp_stage_span *stage = mp_stage_layout_span(trainer->layouts[c]);
      const bool first = stage->embedding && c == 0;
      const bool last = stage->head && c == trainer->num_chunks - 1;
      if (!first && !last) continue;
      const mp_stage_tensor *wte = mp_stage_layout_tensor(trainer->layouts[c], 0);
      float *grads = chunk->ops->tensor_grad(chunk->stage, 0);
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
    /* The blocks' gradients are in the parts already; the rest joins them, then the mean over
     * the dp x cp replicas. */
    const float scale = 1.0f / (float)replicas;
    for (int c = 0; c < trainer->num_chunks; ++c) {
      const mp_stage_state *chunk = &trainer->stages[c];
      MP_TRY(mp_train_zero2_array_grads(trainer, c, err));
      /* Over NCCL the reduce-scatters and their adds into the part ran on the dp
       * communicator's stream: what follows on the default stream waits for them. */
      if (trainer->zero_dp != NULL) MP_TRY(mp_dp_comm_before_compute(trainer->zero_dp, err));
      /* HSDP (host memory only): each shard group summed its own dp ranks; the replicas' parts
       * add up to dp's. */
      float *part = chunk->ops->grad_part(chunk->stage);
      if ((o->zero_replica != NULL || o->ep != NULL) && part == NULL) {
        return mp_fail(err, MP_ERR_INPUT,
                       "hybrid sharding or expert parallelism: the %s stage keeps no gradient "
                       "part",
                       chunk->ops->backend);
      }
      for (size_t at = 0; o->zero_replica != NULL && at < trainer->zero_count[c];
           at += MP_TRAINER_BUCKET_FLOATS) {
        const size_t count = trainer->zero_count[c] - at < MP_TRAINER_BUCKET_FLOATS
                                 ? trainer->zero_count[c] - at
                                 : MP_TRAINER_BUCKET_FLOATS;
        MP_TRY(traced_all_reduce(trainer, o->zero_replica, part + at, count, err));
      }
      if (o->ep != NULL) MP_TRY(mp_train_zero2_sum_over_ep(trainer, c, part, err));
      chunk->ops->scale_grads(chunk->stage, scale);
    }
  }
  double squares = 0.0;
  for (int c = 0; c < trainer->num_chunks; ++c) {
    double chunk_squares = 0.0;
    if (zero2) {
      MP_TRY(mp_train_zero2_norm_squared(trainer, c, &chunk_squares, err));
    } else {
      const mp_stage_state *chunk = &trainer->stages[c];
      MP_TRY(chunk->ops->grad_norm_squared(chunk->stage, &chunk_squares, err));
    }
    squares += chunk_squares;
  }
  double experts = 0.0;
  MP_TRY(expert_squares(trainer, &experts, err));
  squares += experts;
  if (o->pp != NULL) MP_TRY(mp_train_sum_double_over(o->pp, &squares, err));
  *grad_norm = sqrt(squares);
  return MP_OK;
}

/* `--gpu-comm nccl` without data parallelism: the chunks' gradients through the dp group's
 * communicator anyway (a sum over one member leaves them as they are: a check of NCCL on one
 * GPU). */
mp_status mp_train_sum_grads_alone(mp_trainer *trainer, mp_error *err) {
  mp_dp_comm *dp = trainer->dp_sync;
  MP_TRY(mp_dp_comm_after_compute(dp, err));
  for (int c = 0; c < trainer->num_chunks; ++c) {
    /* The stage's gradient array as it is (with ZeRO-2 the packed tensors outside the blocks). */
    const mp_stage_state *chunk = &trainer->stages[c];
    MP_TRY(mp_dp_comm_all_reduce_sum_f32(dp, chunk->ops->grads(chunk->stage),
                                         chunk->ops->grads_floats(chunk->stage), err));
  }
  return mp_dp_comm_synchronize(dp, err);
}
