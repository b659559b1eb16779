/* engine/comm/dp_comm.c — dp_comm.h's handle: each call dispatched to its implementation's table
 * (dp_comm_mpi.c, dp_comm_nccl.c), and the piece arithmetic of staged gathers. */
#include "engine/comm/dp_comm_internal.h"

#include <stdlib.h>

struct mp_dp_comm {
  const mp_dp_comm_ops *ops;
  void *impl;
  mp_dp_comm_observer observer;
  bool observed;
};

mp_status mp_dp_comm_wrap(const mp_dp_comm_ops *ops, void *impl,
                          const mp_dp_comm_observer *observer, mp_dp_comm **out, mp_error *err) {
  *out = NULL;
  mp_dp_comm *dp = calloc(1, sizeof *dp);
  if (dp == NULL) {
    ops->free(impl);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a dp communicator");
  }
  dp->ops = ops;
  dp->impl = impl;
  dp->observed = observer != NULL;
  if (observer != NULL) dp->observer = *observer;
  *out = dp;
  return MP_OK;
}

static const mp_dp_comm_observer *observer_of(const mp_dp_comm *dp) {
  return dp->observed ? &dp->observer : NULL;
}

void mp_dp_comm_free(mp_dp_comm *dp) {
  if (dp == NULL) return;
  mp_error ignored = MP_ERROR_INITIALIZER;
  mp_dp_comm_synchronize(dp, &ignored);
  dp->ops->free(dp->impl);
  free(dp);
}

int mp_dp_comm_rank(const mp_dp_comm *dp) { return dp->ops->rank(dp->impl); }
int mp_dp_comm_size(const mp_dp_comm *dp) { return dp->ops->size(dp->impl); }
const char *mp_dp_comm_name(const mp_dp_comm *dp) { return dp->ops->name(dp->impl); }
bool mp_dp_comm_enqueues(const mp_dp_comm *dp) { return dp->ops->enqueues; }
mp_cuda_stream mp_dp_comm_stream(const mp_dp_comm *dp) { return dp->ops->stream(dp->impl); }

mp_status mp_dp_comm_after_compute(mp_dp_comm *dp, mp_error *err) {
  return dp->ops->after_compute(dp->impl, err);
}
mp_status mp_dp_comm_before_compute(mp_dp_comm *dp, mp_error *err) {
  return dp->ops->before_compute(dp->impl, err);
}
mp_status mp_dp_comm_synchronize(mp_dp_comm *dp, mp_error *err) {
  return dp->ops->synchronize(dp->impl, observer_of(dp), err);
}
mp_status mp_dp_comm_mark(mp_dp_comm *dp, int slot, mp_error *err) {
  return dp->ops->mark(dp->impl, slot, err);
}
mp_status mp_dp_comm_before_compute_to_mark(mp_dp_comm *dp, int slot, mp_error *err) {
  return dp->ops->before_compute_to_mark(dp->impl, slot, err);
}
mp_status mp_dp_comm_post_all_reduce_sum_f32(mp_dp_comm *dp, float *buffer, size_t count,
                                             mp_error *err) {
  return dp->ops->post_all_reduce_sum_f32(dp->impl, buffer, count, observer_of(dp), err);
}
mp_status mp_dp_comm_all_reduce_sum_f32(mp_dp_comm *dp, float *buffer, size_t count,
                                        mp_error *err) {
  return dp->ops->all_reduce_sum_f32(dp->impl, buffer, count, err);
}
mp_status mp_dp_comm_reduce_scatter_v_sum_f32(mp_dp_comm *dp, const float *input, float *output,
                                              const size_t *counts, mp_error *err) {
  return dp->ops->reduce_scatter_v_sum_f32(dp->impl, input, output, counts, err);
}
mp_status mp_dp_comm_all_gather_f32(mp_dp_comm *dp, const float *input, float *output,
                                    size_t count, mp_error *err) {
  return dp->ops->all_gather_f32(dp->impl, input, output, count, err);
}
mp_status mp_dp_comm_all_gather_v(mp_dp_comm *dp, const void *input, void *output,
                                  const size_t *counts, mp_dp_dtype dtype, mp_error *err) {
  return dp->ops->all_gather_v(dp->impl, input, output, counts, dtype, err);
}

void mp_dp_comm_piece_counts(const size_t *counts, int size, int rank, size_t at, size_t n,
                             size_t *counts_out, size_t *mine_from) {
  size_t run = 0; /* where rank r's run starts in the output */
  *mine_from = 0;
  for (int r = 0; r < size; ++r) {
    const size_t lo = run > at ? run : at;
    const size_t hi = run + counts[r] < at + n ? run + counts[r] : at + n;
    counts_out[r] = hi > lo ? hi - lo : 0;
    if (r == rank) *mine_from = lo > run ? lo - run : 0;
    run += counts[r];
  }
}
