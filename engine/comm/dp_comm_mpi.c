/* engine/comm/dp_comm_mpi.c — dp_comm.h over an MPI group (comm.h): operations complete on return
 * except the posted all-reduces (non-blocking, kept until mp_dp_comm_synchronize), device
 * buffers staged through the host where comm.h does not stage them itself. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/comm/dp_comm_internal.h"
#include "engine/device/device.h"

typedef struct {
  mp_comm *group;
  bool device;       /* buffers are GPU memory */
  int max_in_flight; /* 0: no limit */
  /* The posted all-reduces: requests [waited, count) still pending. */
  mp_comm_request **requests;
  double *posted_s;
  size_t *bytes;
  int count, capacity, waited;
  void *staging;     /* MP_DP_COMM_STAGING_BYTES of host memory, made when first needed */
  size_t *piece_counts; /* (size) */
} mpi_dp;

static void mpi_free(void *impl) {
  mpi_dp *dp = impl;
  free(dp->requests);
  free(dp->posted_s);
  free(dp->bytes);
  free(dp->staging);
  free(dp->piece_counts);
  free(dp);
}

static int mpi_rank(const void *impl) { return mp_comm_rank(((const mpi_dp *)impl)->group); }
static int mpi_size(const void *impl) { return mp_comm_size(((const mpi_dp *)impl)->group); }
static const char *mpi_name(const void *impl) {
  return mp_comm_name(((const mpi_dp *)impl)->group);
}
static mp_cuda_stream mpi_stream(const void *impl) {
  (void)impl;
  return NULL;
}

/* MPI reads device buffers through the host: the kernels that wrote them must have run. */
static mp_status mpi_after_compute(void *impl, mp_error *err) {
  const mpi_dp *dp = impl;
  return dp->device ? mp_device_synchronize(err) : MP_OK;
}

/* Every operation returned complete: compute has nothing to wait for. */
static mp_status mpi_nothing(void *impl, mp_error *err) {
  (void)impl, (void)err;
  return MP_OK;
}
static mp_status mpi_nothing_at(void *impl, int slot, mp_error *err) {
  (void)impl, (void)slot, (void)err;
  return MP_OK;
}

static mp_status wait_request(mpi_dp *dp, int k, const mp_dp_comm_observer *observer,
                              mp_error *err) {
  const mp_status status = mp_comm_wait(dp->requests[k], err);
  if (observer != NULL) {
    observer->completed(observer->context, dp->bytes[k], dp->posted_s[k],
                        observer->now(observer->context));
  }
  return status;
}

static mp_status mpi_synchronize(void *impl, const mp_dp_comm_observer *observer,
                                 mp_error *err) {
  mpi_dp *dp = impl;
  mp_status status = MP_OK;
  for (int k = dp->waited; k < dp->count; ++k) {
    mp_error ignored = MP_ERROR_INITIALIZER;
    const mp_status one = wait_request(dp, k, observer, status == MP_OK ? err : &ignored);
    if (status == MP_OK) status = one;
  }
  dp->count = 0;
  dp->waited = 0;
  return status;
}

static mp_status mpi_post_all_reduce(void *impl, float *buffer, size_t count,
                                     const mp_dp_comm_observer *observer, mp_error *err) {
  mpi_dp *dp = impl;
  if (dp->count == dp->capacity) {
    const int capacity = dp->capacity > 0 ? 2 * dp->capacity : 8;
    mp_comm_request **requests = realloc(dp->requests, (size_t)capacity * sizeof *requests);
    if (requests != NULL) dp->requests = requests;
    double *posted = realloc(dp->posted_s, (size_t)capacity * sizeof *posted);
    if (posted != NULL) dp->posted_s = posted;
    size_t *bytes = realloc(dp->bytes, (size_t)capacity * sizeof *bytes);
    if (bytes != NULL) dp->bytes = bytes;
    if (requests == NULL || posted == NULL || bytes == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
    dp->capacity = capacity;
  }
  /* Each pending all-reduce of device memory holds a staging block of its bytes. */
  while (dp->max_in_flight > 0 && dp->count - dp->waited >= dp->max_in_flight) {
    MP_TRY(wait_request(dp, dp->waited++, observer, err));
  }
  const int k = dp->count;
  dp->posted_s[k] = observer != NULL ? observer->now(observer->context) : 0.0;
  dp->bytes[k] = count * sizeof(float);
  MP_TRY(mp_comm_iall_reduce_sum_f32(dp->group, buffer, count, &dp->requests[k], err));
  dp->count++;
  return MP_OK;
}

static mp_status mpi_all_reduce(void *impl, float *buffer, size_t count, mp_error *err) {
  return mp_comm_all_reduce_sum_f32(((mpi_dp *)impl)->group, buffer, count, err);
}

static mp_status mpi_reduce_scatter_v(void *impl, const float *input, float *output,
                                      const size_t *counts, mp_error *err) {
  return mp_comm_reduce_scatter_v_sum_f32(((mpi_dp *)impl)->group, input, output, counts, err);
}

static mp_status mpi_all_gather(void *impl, const float *input, float *output, size_t count,
                                mp_error *err) {
  return mp_comm_all_gather_f32(((mpi_dp *)impl)->group, input, output, count, err);
}

static mp_status host_all_gather_v(mp_comm *group, const void *input, void *output,
                                   const size_t *counts, mp_dp_dtype dtype, mp_error *err) {
  return dtype == MP_DP_BFLOAT16
             ? mp_comm_all_gather_v_bf16(group, input, output, counts, err)
             : mp_comm_all_gather_v_f32(group, input, output, counts, err);
}

/* Device buffers: piece by piece through the staging buffer, each piece in place there (this
 * rank's share of it copied in, the others' gathered around it, the whole copied out). */
static mp_status mpi_all_gather_v(void *impl, const void *input, void *output,
                                  const size_t *counts, mp_dp_dtype dtype, mp_error *err) {
  mpi_dp *dp = impl;
  if (!dp->device) return host_all_gather_v(dp->group, input, output, counts, dtype, err);
  const int size = mp_comm_size(dp->group), rank = mp_comm_rank(dp->group);
  const size_t elem = dtype == MP_DP_BFLOAT16 ? sizeof(uint16_t) : sizeof(float);
  const size_t most = MP_DP_COMM_STAGING_BYTES / elem;
  if (dp->staging == NULL) dp->staging = malloc(MP_DP_COMM_STAGING_BYTES);
  if (dp->piece_counts == NULL) dp->piece_counts = calloc((size_t)size, sizeof(size_t));
  if (dp->staging == NULL || dp->piece_counts == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a staged all-gather");
  }
  size_t total = 0, mine_at = 0; /* this rank's run in the output */
  for (int r = 0; r < size; ++r) {
    if (r < rank) mine_at += counts[r];
    total += counts[r];
  }
  const char *own = input != NULL ? input : (const char *)output + mine_at * elem;
  char *host = dp->staging;
  for (size_t at = 0; at < total; at += most) {
    const size_t n = total - at < most ? total - at : most;
    size_t mine_from = 0;
    mp_dp_comm_piece_counts(counts, size, rank, at, n, dp->piece_counts, &mine_from);
    const size_t mine = dp->piece_counts[rank];
    if (mine > 0) {
      const size_t offset = mine_at + mine_from - at; /* in the piece */
      MP_TRY(mp_device_copy_to_host(host + offset * elem, own + mine_from * elem, mine * elem,
                                    err));
    }
    MP_TRY(host_all_gather_v(dp->group, NULL, host, dp->piece_counts, dtype, err));
    MP_TRY(mp_device_copy_to_device((char *)output + at * elem, host, n * elem, err));
  }
  return MP_OK;
}

static const mp_dp_comm_ops mpi_ops = {
    .free = mpi_free,
    .rank = mpi_rank,
    .size = mpi_size,
    .name = mpi_name,
    .enqueues = false,
    .stream = mpi_stream,
    .after_compute = mpi_after_compute,
    .before_compute = mpi_nothing,
    .synchronize = mpi_synchronize,
    .mark = mpi_nothing_at,
    .before_compute_to_mark = mpi_nothing_at,
    .post_all_reduce_sum_f32 = mpi_post_all_reduce,
    .all_reduce_sum_f32 = mpi_all_reduce,
    .reduce_scatter_v_sum_f32 = mpi_reduce_scatter_v,
    .all_gather_f32 = mpi_all_gather,
    .all_gather_v = mpi_all_gather_v,
};

mp_status mp_dp_comm_over_mpi(mp_comm *group, bool device_buffers, int max_in_flight,
                              const mp_dp_comm_observer *observer, mp_dp_comm **out,
                              mp_error *err) {
  *out = NULL;
  mpi_dp *dp = calloc(1, sizeof *dp);
  if (dp == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a dp communicator");
  dp->group = group;
  dp->device = device_buffers;
  dp->max_in_flight = max_in_flight;
  return mp_dp_comm_wrap(&mpi_ops, dp, observer, out, err);
}
