/* engine/comm/dp_comm_nccl.c — dp_comm.h over an NCCL communicator (comm_nccl.h): operations
 * enqueued on its stream, ordered against compute by its events, the host waiting only in
 * mp_dp_comm_synchronize (under NCCL's watchdog). */
#include <stdlib.h>

#include "engine/comm/dp_comm_internal.h"

typedef struct {
  mp_nccl_comm *comm;
  bool posted; /* all-reduces posted since the last synchronize, for the observer */
} nccl_dp;

static void nccl_free(void *impl) { free(impl); }
static int nccl_rank(const void *impl) { return mp_nccl_comm_rank(((const nccl_dp *)impl)->comm); }
static int nccl_size(const void *impl) { return mp_nccl_comm_size(((const nccl_dp *)impl)->comm); }
static const char *nccl_name(const void *impl) {
  return mp_nccl_comm_name(((const nccl_dp *)impl)->comm);
}
static mp_cuda_stream nccl_stream(const void *impl) {
  return mp_nccl_comm_stream(((const nccl_dp *)impl)->comm);
}
static mp_status nccl_after_compute(void *impl, mp_error *err) {
  return mp_nccl_comm_wait_stream(((nccl_dp *)impl)->comm, NULL, err);
}
static mp_status nccl_before_compute(void *impl, mp_error *err) {
  return mp_nccl_stream_wait_comm(NULL, ((nccl_dp *)impl)->comm, err);
}
static mp_status nccl_synchronize(void *impl, const mp_dp_comm_observer *observer,
                                  mp_error *err) {
  nccl_dp *dp = impl;
  const bool report = dp->posted && observer != NULL;
  const double start = report ? observer->now(observer->context) : 0.0;
  dp->posted = false;
  const mp_status status = mp_nccl_comm_synchronize(dp->comm, err);
  if (report) observer->completed(observer->context, 0, start, observer->now(observer->context));
  return status;
}
static mp_status nccl_mark(void *impl, int slot, mp_error *err) {
  return mp_nccl_comm_mark(((nccl_dp *)impl)->comm, slot, err);
}
static mp_status nccl_before_compute_to_mark(void *impl, int slot, mp_error *err) {
  return mp_nccl_stream_wait_mark(NULL, ((nccl_dp *)impl)->comm, slot, err);
}
static mp_status nccl_all_reduce(void *impl, float *buffer, size_t count, mp_error *err) {
  return mp_nccl_all_reduce_sum(((nccl_dp *)impl)->comm, buffer, count, MP_NCCL_FLOAT32, err);
}
static mp_status nccl_post_all_reduce(void *impl, float *buffer, size_t count,
                                      const mp_dp_comm_observer *observer, mp_error *err) {
  (void)observer;
  nccl_dp *dp = impl;
  MP_TRY(nccl_all_reduce(impl, buffer, count, err));
  dp->posted = true;
  return MP_OK;
}
static mp_status nccl_reduce_scatter_v(void *impl, const float *input, float *output,
                                       const size_t *counts, mp_error *err) {
  return mp_nccl_reduce_scatter_v_sum_f32(((nccl_dp *)impl)->comm, input, output, counts, err);
}
static mp_status nccl_all_gather(void *impl, const float *input, float *output, size_t count,
                                 mp_error *err) {
  return mp_nccl_all_gather(((nccl_dp *)impl)->comm, input, output, count, MP_NCCL_FLOAT32, err);
}
static mp_status nccl_all_gather_v(void *impl, const void *input, void *output,
                                   const size_t *counts, mp_dp_dtype dtype, mp_error *err) {
  return mp_nccl_all_gather_v(((nccl_dp *)impl)->comm, input, output, counts,
                              dtype == MP_DP_BFLOAT16 ? MP_NCCL_BFLOAT16 : MP_NCCL_FLOAT32, err);
}

static const mp_dp_comm_ops nccl_ops = {
    .free = nccl_free,
    .rank = nccl_rank,
    .size = nccl_size,
    .name = nccl_name,
    .enqueues = true,
    .stream = nccl_stream,
    .after_compute = nccl_after_compute,
    .before_compute = nccl_before_compute,
    .synchronize = nccl_synchronize,
    .mark = nccl_mark,
    .before_compute_to_mark = nccl_before_compute_to_mark,
    .post_all_reduce_sum_f32 = nccl_post_all_reduce,
    .all_reduce_sum_f32 = nccl_all_reduce,
    .reduce_scatter_v_sum_f32 = nccl_reduce_scatter_v,
    .all_gather_f32 = nccl_all_gather,
    .all_gather_v = nccl_all_gather_v,
};

mp_status mp_dp_comm_over_nccl(mp_nccl_comm *comm, const mp_dp_comm_observer *observer,
                               mp_dp_comm **out, mp_error *err) {
  *out = NULL;
  nccl_dp *dp = calloc(1, sizeof *dp);
  if (dp == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a dp communicator");
  dp->comm = comm;
  return mp_dp_comm_wrap(&nccl_ops, dp, observer, out, err);
}
