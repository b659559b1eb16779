/* engine/train/zero.c — ZeRO 1-3 and hybrid sharding: each dp rank's part of a chunk, gradients
 * reduce-scattered into the parts (ZeRO-2), block weights gathered around each pass (ZeRO-3,
 * prefetched when the dp communicator enqueues), the norm over the parts, and the parameters
 * gathered after the update; on either backend through the stage's table
 * (engine/model/stage_state.h), over either transport through the dp communicator
 * (engine/comm/dp_comm.h). */
#include "engine/train/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_chain.h"
#include "layers/adamw.h"

/* ZeRO 2 and 3: counts[d] = how many of elements [first, first + count) of chunk c's flat layout dp
 * rank d's part holds (its part is contiguous, the parts in dp-rank order). */
static void part_counts(const mp_trainer *trainer, int c, size_t first, size_t count,
                        size_t *counts) {
  const size_t n = mp_stage_layout_num_params(trainer->layouts[c]);
  for (int d = 0; d < trainer->zero_size; ++d) {
    size_t part_first = 0, part_count = 0;
    mp_zero_part(n, trainer->zero_size, d, &part_first, &part_count);
    const size_t lo = first > part_first ? first : part_first;
    const size_t hi = first + count < part_first + part_count ? first + count
                                                              : part_first + part_count;
    counts[d] = hi > lo ? hi - lo : 0;
  }
}

/* grads (count floats, elements [first, first + count) of chunk c's flat layout, in the stage's
 * memory) summed over dp, each dp rank adding the elements of its part ([zero_first,
 * + zero_count), the moments' too) into its gradients of the part: one reduce-scatter, since the
 * parts are contiguous and in dp-rank order. */
static mp_status scatter_add_grads(mp_trainer *trainer, int c, const float *grads, size_t first,
                                   size_t count, mp_error *err) {
  mp_dp_comm *dp = trainer->zero_dp;
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  const size_t mine = trainer->scatter_counts[trainer->zero_rank];
  const size_t mine_first = first > trainer->zero_first[c] ? first : trainer->zero_first[c];
  const float *sum = grads + (mine > 0 ? mine_first - first : 0); /* alone: grads themselves */
  mp_cuda_stream after = NULL; /* where the sums are ready */
  if (dp != NULL && trainer->zero_size > 1) {
    const double start = mp_train_trace_now(trainer);
    /* Overlapped with the next block's backward (Megatron's gradient buckets): the kernels
     * enqueued after this point, which write the other gradient window, wait for the
     * reduce-scatters posted so far, the last of which reads it (engine/model/stage_chain.h);
     * this one runs after the kernels that wrote grads, and its add into the part follows it on
     * the communicator's stream. mp_train_reduce_step_grads waits for the last. (Over MPI it is
     * done on return.) */
    MP_TRY(mp_dp_comm_before_compute(dp, err));
    MP_TRY(mp_dp_comm_after_compute(dp, err));
    MP_TRY(mp_dp_comm_reduce_scatter_v_sum_f32(dp, grads, trainer->scatter_out,
                                               trainer->scatter_counts, err));
    if (trainer->options.trace != NULL) {
      mp_trace_comm(trainer->options.trace, trainer->step, "reduce-scatter", mp_dp_comm_name(dp),
                    -1, count * sizeof(float), NULL, start, mp_train_trace_now(trainer));
    }
    sum = trainer->scatter_out;
    after = mp_dp_comm_stream(dp);
  }
  if (mine == 0) return MP_OK;
  const mp_stage_state *chunk = &trainer->stages[c];
  return chunk->ops->add_to_part(chunk->stage, sum, mine_first, mine, after, err);
}

/* The chain's hook after each block's backward: the window's gradients into the parts. */
mp_status mp_train_zero2_block_grads(void *context, float *grads, size_t first, size_t count,
                                     mp_error *err) {
  const struct zero2_hook *hook = context;
  return scatter_add_grads(hook->trainer, hook->chunk, grads, first, count, err);
}

/* ZeRO-3: block weights [first, first + count) of chunk c gathered over dp from the parts into
 * window (the chain's working copy: fp32 on the CPU, bf16 on the GPU), after the kernels
 * enqueued so far (those that read window before), traced. Over NCCL it is enqueued: the caller
 * orders the compute after it. */
static mp_status zero3_gather(mp_trainer *trainer, int c, void *window, size_t first,
                              size_t count, mp_error *err) {
  const mp_stage_state *chunk = &trainer->stages[c];
  const size_t elem = chunk->ops->weight_bytes;
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  const size_t mine = trainer->scatter_counts[trainer->zero_rank];
  const size_t mine_first = first > trainer->zero_first[c] ? first : trainer->zero_first[c];
  const void *own = NULL;
  if (mine > 0) {
    own = chunk->ops->weights_at(chunk->stage, mine_first, mine);
    if (own == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "ZeRO-3: this rank does not hold its part [%zu, +%zu)",
                     mine_first, mine);
    }
  }
  mp_dp_comm *dp = trainer->zero_dp;
  if (dp == NULL) return chunk->ops->copy(window, own, count * elem, err); /* alone */
  const double start = mp_train_trace_now(trainer);
  MP_TRY(mp_dp_comm_after_compute(dp, err));
  MP_TRY(mp_dp_comm_all_gather_v(dp, own, window, trainer->scatter_counts,
                                 elem == sizeof(float) ? MP_DP_FLOAT32 : MP_DP_BFLOAT16, err));
  if (trainer->options.trace != NULL) {
    mp_trace_comm(trainer->options.trace, trainer->step, "all-gather", mp_dp_comm_name(dp), -1,
                  count * elem, NULL, start, mp_train_trace_now(trainer));
  }
  return MP_OK;
}

/* ZeRO-3, the chain's weights hook: block weights [first, first + count) of chunk c into the
 * window before a pass over the block. When the dp communicator enqueues (NCCL) and there is a
 * next block (two windows), that block's gather is posted now into the other window, ahead of
 * its pass (torchtitan's and FSDP's prefetch): it runs while this pass computes, and the next
 * call only makes the compute stream wait for it, through its mark, not for the reduce-scatters
 * posted behind it. */
mp_status mp_train_zero3_block_weights(void *context, void *window, size_t first, size_t count,
                                       const mp_stage_weights_next *next, mp_error *err) {
  const struct zero2_hook *hook = context;
  mp_trainer *trainer = hook->trainer;
  mp_dp_comm *dp = trainer->zero_dp;
  if (dp == NULL || !mp_dp_comm_enqueues(dp)) {
    return zero3_gather(trainer, hook->chunk, window, first, count, err);
  }
  const bool prefetched = trainer->zero3_prefetch.window == window &&
                          trainer->zero3_prefetch.first == first &&
                          trainer->zero3_prefetch.count == count;
  trainer->zero3_prefetch.window = NULL;
  if (prefetched) {
    MP_TRY(mp_dp_comm_before_compute_to_mark(dp, trainer->zero3_prefetch.mark, err));
  } else {
    MP_TRY(zero3_gather(trainer, hook->chunk, window, first, count, err));
    MP_TRY(mp_dp_comm_before_compute(dp, err));
  }
  if (next == NULL) return MP_OK;
  /* After the kernels enqueued so far, the last pass's, which read next->window. */
  MP_TRY(zero3_gather(trainer, hook->chunk, next->window, next->first, next->count, err));
  const int mark = 1 - trainer->zero3_prefetch.mark;
  MP_TRY(mp_dp_comm_mark(dp, mark, err));
  trainer->zero3_prefetch.window = next->window;
  trainer->zero3_prefetch.first = next->first;
  trainer->zero3_prefetch.count = next->count;
  trainer->zero3_prefetch.mark = mark;
  return MP_OK;
}

/* ZeRO-3 after the update: the tensors outside chunk c's blocks, which every rank keeps whole,
 * gathered from the parts in place (the blocks' stay in the parts); on the GPU the master
 * weights, whose working copy the caller refreshes. */
static mp_status zero3_gather_outside(mp_trainer *trainer, int c, mp_error *err) {
  const mp_stage_state *chunk = &trainer->stages[c];
  mp_dp_comm *dp = trainer->zero_dp;
  size_t blocks_first = 0, blocks_end = 0, largest = 0;
  mp_stage_layout_blocks_range(trainer->layouts[c], &blocks_first, &blocks_end, &largest);
  const size_t n = mp_stage_layout_num_params(trainer->layouts[c]);
  const size_t runs[2][2] = {{0, blocks_first}, {blocks_end, n - blocks_end}};
  for (int r = 0; r < 2 && dp != NULL; ++r) {
    if (runs[r][1] == 0) continue;
    float *run = chunk->ops->params_at(chunk->stage, runs[r][0], runs[r][1]);
    part_counts(trainer, c, runs[r][0], runs[r][1], trainer->scatter_counts);
    MP_TRY(mp_dp_comm_after_compute(dp, err));
    MP_TRY(mp_dp_comm_all_gather_v(dp, NULL, run, trainer->scatter_counts, MP_DP_FLOAT32, err));
    MP_TRY(mp_dp_comm_before_compute(dp, err));
  }
  return MP_OK;
}

/* ZeRO-3, --save-weights: elements [first, first + count) of chunk c's flat parameters onto dp
 * rank 0's dest, from the dp ranks whose parts hold them (every dp rank calls it; the others'
 * dest is a send buffer of count floats). */
mp_status mp_train_zero3_collect(mp_trainer *trainer, int c, size_t first, size_t count,
                               float *dest, mp_error *err) {
  if (trainer->zero_comm == NULL) return mp_train_read_params(trainer, c, first, count, dest, err);
  part_counts(trainer, c, first, count, trainer->scatter_counts);
  size_t at = 0;
  for (int d = 0; d < trainer->zero_size; ++d) {
    const size_t len = trainer->scatter_counts[d];
    if (len > 0 && d == trainer->zero_rank) {
      MP_TRY(mp_train_read_params(trainer, c, first + at, len, dest + at, err));
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
mp_status mp_train_zero2_array_grads(mp_trainer *trainer, int c, mp_error *err) {
  const mp_stage_state *chunk = &trainer->stages[c];
  const mp_grad_window window =
      mp_grad_window_for(true, trainer->schedule.kind == MP_SCHEDULE_ZB_H1);
  const float *packed = chunk->ops->grads(chunk->stage);
  size_t run_first = 0, run_packed = 0, run_count = 0; /* flat first, packed first, floats */
  size_t at = 0; /* the packed array's cursor: its tensors are in the layout's order */
  for (int j = 0; j < mp_stage_layout_num_tensors(trainer->layouts[c]); ++j) {
    if (mp_stage_layout_grad_in_window(trainer->layouts[c], j, window)) continue;
    const mp_stage_tensor *t = mp_stage_layout_tensor(trainer->layouts[c], j);
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

mp_status mp_train_zero2_sum_over_ep(mp_trainer *trainer, int c, float *part, mp_error *err) {
  const mp_stage_layout *layout = trainer->layouts[c];
  /* After the adds into the part (the default stream's work on the GPU); the sums in place
   * before what follows. */
  MP_TRY(mp_dp_comm_after_compute(trainer->zero_ep, err));
  const size_t lo = trainer->zero_first[c], hi = lo + trainer->zero_count[c];
  size_t run_first = lo, run_end = lo; /* a run of the part's non-expert elements */
  for (int i = 0; i <= mp_stage_layout_num_tensors(layout); ++i) {
    const mp_stage_tensor *t = i < mp_stage_layout_num_tensors(layout)
                                   ? mp_stage_layout_tensor(layout, i)
                                   : NULL;
    if (t != NULL && t->ep_size <= 1) continue;
    /* An expert tensor (or the end) closes the run before it. */
    run_end = t != NULL ? (t->offset < hi ? (t->offset > lo ? t->offset : lo) : hi) : hi;
    for (size_t at = run_first; at < run_end; at += MP_TRAINER_BUCKET_FLOATS) {
      const size_t n = run_end - at < MP_TRAINER_BUCKET_FLOATS ? run_end - at
                                                               : MP_TRAINER_BUCKET_FLOATS;
      MP_TRY(mp_dp_comm_all_reduce_sum_f32(trainer->zero_ep, part + (at - lo), n, err));
    }
    if (t != NULL) {
      const size_t end = t->offset + t->count;
      run_first = end < lo ? lo : end > hi ? hi : end;
    }
  }
  return mp_dp_comm_before_compute(trainer->zero_ep, err);
}

/* The squared global norm of chunk c's gradient from the dp ranks' parts: each tensor's squares
 * over this rank's part of it, summed over dp in rank order (so bitwise the same everywhere),
 * then over tp as the stage counts them (mp_stage_norm_from_squares). Collective over dp and
 * tp. */
mp_status mp_train_zero2_norm_squared(mp_trainer *trainer, int c, double *out, mp_error *err) {
  const int num_tensors = mp_stage_layout_num_tensors(trainer->layouts[c]);
  const int dp = trainer->zero_dp != NULL ? trainer->zero_size : 1;
  double *squares = calloc((size_t)num_tensors * ((size_t)dp + 1) + 1, sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  double *gathered = squares + num_tensors;
  const mp_stage_state *chunk = &trainer->stages[c];
  mp_status status = chunk->ops->part_squares(chunk->stage, squares, err);
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
  if (status == MP_OK) {
    status = mp_stage_norm_from_squares(trainer->layouts[c], &trainer->tp_table, squares, out,
                                        err);
  }
  if (status == MP_OK && trainer->options.ep != NULL) {
    /* Expert parallelism: the experts, which the stage leaves out, over the ep group (each rank
     * holds its own), in rank order. */
    double experts = 0.0;
    for (int i = 0; i < num_tensors; ++i) {
      if (mp_stage_layout_tensor(trainer->layouts[c], i)->ep_size > 1) experts += squares[i];
    }
    status = mp_train_sum_double_over(trainer->options.ep, &experts, err);
    *out += experts;
  }
  free(squares);
  return status;
}

/* ZeRO-1's parameter all-gather moves at most this many floats (over all dp ranks) a call: 4 MiB,
 * large enough for the links' bandwidth, small beside any rank's state. */
enum { ZERO_GATHER_PIECE_FLOATS = 1 << 20 };

/* Floats per dp rank in one piece of ZeRO-1's parameter all-gather: all of a part when it is
 * small, else its share of ZERO_GATHER_PIECE_FLOATS. */
size_t mp_train_zero_piece_floats(size_t part, int dp) {
  size_t piece = ZERO_GATHER_PIECE_FLOATS / (size_t)dp;
  if (piece < 1) piece = 1;
  return part < piece ? part : piece;
}

/* ZeRO-1, after each dp rank updated its part of a chunk's n parameters (dp parts of `part`
 * floats, the last one shorter): the whole array on every rank, gathered piece by piece through
 * gathered (dp pieces of `piece` floats) and mine (one), in the stage's memory (ops's copy and
 * clear). */
/* One piece's all-gather, ordered by the dp communicator after the copy into input, and the
 * copies out of output after it (over NCCL on the GPU, the host going on; the caller waits once,
 * after the last piece). */
static mp_status gather_piece(mp_dp_comm *dp, const float *input, float *output, size_t count,
                              mp_error *err) {
  MP_TRY(mp_dp_comm_after_compute(dp, err));
  MP_TRY(mp_dp_comm_all_gather_f32(dp, input, output, count, err));
  return mp_dp_comm_before_compute(dp, err);
}

static mp_status zero_gather_params(float *params, size_t n, size_t part, int size, int rank,
                                    float *gathered, float *mine, size_t piece,
                                    const mp_stage_state_ops *ops, mp_dp_comm *dp,
                                    mp_error *err) {
  const size_t first = part * (size_t)rank < n ? part * (size_t)rank : n;
  for (size_t at = 0; at < part; at += piece) {
    const size_t count = part - at < piece ? part - at : piece;
    /* This rank's floats [first + at, + count), zero-padded past the end of the array. */
    const size_t own = first + at < n ? (n - (first + at) < count ? n - (first + at) : count) : 0;
    if (own < count) MP_TRY(ops->clear(mine + own, (count - own) * sizeof(float), err));
    if (own > 0) MP_TRY(ops->copy(mine, params + first + at, own * sizeof(float), err));
    MP_TRY(gather_piece(dp, mine, gathered, count, err));
    for (int d = 0; d < size; ++d) {
      const size_t to = (size_t)d * part + at;
      if (to >= n) continue;
      const size_t len = n - to < count ? n - to : count;
      MP_TRY(ops->copy(params + to, gathered + (size_t)d * count, len * sizeof(float), err));
    }
  }
  return MP_OK;
}

mp_status mp_train_zero_gather_updated(mp_trainer *trainer, int c, mp_error *err) {
  if (trainer->plan->zero_stage < 1 || trainer->zero_comm == NULL || trainer->zero_size == 1) {
    return MP_OK;
  }
  const mp_stage_state *chunk = &trainer->stages[c];
  if (trainer->zero3) {
    /* Only the tensors every rank keeps whole; the blocks' stay in the parts (on the GPU AdamW
     * refreshed the part's bf16 weights already). */
    MP_TRY(zero3_gather_outside(trainer, c, err));
  } else {
    /* ZeRO 1 and 2: the whole array from every dp rank's part (over the shard group with HSDP:
     * the replicas updated the same parts alike), on the GPU the master weights, over NCCL or
     * over MPI through the host. */
    const size_t n = mp_stage_layout_num_params(trainer->layouts[c]);
    const int size = trainer->zero_size;
    const size_t part = (n + (size_t)size - 1) / (size_t)size;
    MP_TRY(zero_gather_params(chunk->ops->params(chunk->stage), n, part, size,
                              trainer->zero_rank, trainer->zero_gather, trainer->zero_part,
                              trainer->zero_piece, chunk->ops, trainer->zero_dp, err));
  }
  /* Then the gathered master weights' working copy (bf16 on the GPU). */
  MP_TRY(mp_dp_comm_synchronize(trainer->zero_dp, err));
  chunk->ops->refresh_weights(chunk->stage);
  return MP_OK;
}
