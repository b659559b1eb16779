/* expert_parallel/ep_comm.c — the one-rank table and the checked calls; see ep_comm.h. */
#include "expert_parallel/ep_comm.h"

#include <string.h>

static mp_status single_all_to_all_i32(void *context, const int32_t *input, int32_t *output,
                                       size_t count, mp_error *err) {
  (void)context, (void)err;
  if (count > 0) memmove(output, input, count * sizeof(int32_t));
  return MP_OK;
}

static mp_status single_all_to_all_v_f32(void *context, const float *input,
                                         const size_t *send_counts, float *output,
                                         const size_t *recv_counts, mp_error *err) {
  (void)context;
  if (send_counts[0] != recv_counts[0]) {
    return mp_fail(err, MP_ERR_INPUT, "one rank sends itself %zu floats but expects %zu",
                   send_counts[0], recv_counts[0]);
  }
  if (send_counts[0] > 0) memmove(output, input, send_counts[0] * sizeof(float));
  return MP_OK;
}

mp_ep_comm mp_ep_comm_single(void) {
  mp_ep_comm ep = {NULL, 0, 1, single_all_to_all_i32, single_all_to_all_v_f32};
  return ep;
}

static mp_status prefixed(const mp_ep_comm *ep, mp_status status, const char *operation,
                          mp_error *err) {
  if (status == MP_OK) return MP_OK;
  if (err != NULL) {
    err->status = status;
    mp_error_prefix(err, "expert-parallel rank %d of %d: %s", ep->rank, ep->size, operation);
  }
  return status;
}

mp_status mp_ep_all_to_all_i32(const mp_ep_comm *ep, const int32_t *input, int32_t *output,
                               size_t count, mp_error *err) {
  if (ep->size == 1) return single_all_to_all_i32(NULL, input, output, count, err);
  return prefixed(ep, ep->all_to_all_i32(ep->context, input, output, count, err),
                  "all-to-all of counts", err);
}

mp_status mp_ep_all_to_all_v_f32(const mp_ep_comm *ep, const float *input,
                                 const size_t *send_counts, float *output,
                                 const size_t *recv_counts, mp_error *err) {
  const mp_status status =
      ep->size == 1
          ? single_all_to_all_v_f32(NULL, input, send_counts, output, recv_counts, err)
          : ep->all_to_all_v_f32(ep->context, input, send_counts, output, recv_counts, err);
  return prefixed(ep, status, "all-to-all of token rows", err);
}
