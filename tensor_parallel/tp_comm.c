/* tensor_parallel/tp_comm.c — the one-rank table and the checked calls; see tp_comm.h. */
#include "tensor_parallel/tp_comm.h"

#include <stdlib.h>
#include <string.h>

static mp_status single_all_reduce(void *context, float *buffer, size_t count, mp_error *err) {
  (void)context, (void)buffer, (void)count, (void)err;
  return MP_OK;
}

static mp_status single_copy(void *context, const float *input, float *output, size_t count,
                             mp_error *err) {
  (void)context, (void)err;
  if (count > 0) memmove(output, input, count * sizeof(float));
  return MP_OK;
}

mp_tp_comm mp_tp_comm_single(void) {
  mp_tp_comm tp = {NULL, 0, 1, single_all_reduce, single_copy, single_copy};
  return tp;
}

static mp_status prefixed(const mp_tp_comm *tp, mp_status status, const char *operation,
                          size_t count, mp_error *err) {
  if (status == MP_OK) return MP_OK;
  if (err != NULL) {
    err->status = status;
    mp_error_prefix(err, "tensor-parallel rank %d of %d: %s of %zu floats", tp->rank, tp->size,
                    operation, count);
  }
  return status;
}

mp_status mp_tp_all_reduce_sum(const mp_tp_comm *tp, float *buffer, size_t count, mp_error *err) {
  if (tp->size == 1 || count == 0) return MP_OK;
  return prefixed(tp, tp->all_reduce_sum_f32(tp->context, buffer, count, err), "all-reduce", count,
                  err);
}

mp_status mp_tp_all_gather(const mp_tp_comm *tp, const float *input, float *output, size_t count,
                           mp_error *err) {
  if (count == 0) return MP_OK;
  if (tp->size == 1) return single_copy(NULL, input, output, count, err);
  return prefixed(tp, tp->all_gather_f32(tp->context, input, output, count, err), "all-gather",
                  count, err);
}

mp_status mp_tp_reduce_scatter_sum(const mp_tp_comm *tp, const float *input, float *output,
                                   size_t count, mp_error *err) {
  if (count == 0) return MP_OK;
  if (tp->size == 1) return single_copy(NULL, input, output, count, err);
  return prefixed(tp, tp->reduce_scatter_sum_f32(tp->context, input, output, count, err),
                  "reduce-scatter", count, err);
}

mp_status mp_tp_all_reduce_max(const mp_tp_comm *tp, float *buffer, float *gathered, size_t count,
                               mp_error *err) {
  if (tp->size == 1 || count == 0) return MP_OK;
  MP_TRY(mp_tp_all_gather(tp, buffer, gathered, count, err));
  for (size_t i = 0; i < count; i++) {
    float m = gathered[i];
    for (int r = 1; r < tp->size; r++) {
      const float v = gathered[(size_t)r * count + i];
      if (v > m) m = v;
    }
    buffer[i] = m;
  }
  return MP_OK;
}

mp_status mp_tp_sum_double(const mp_tp_comm *tp, double *value, mp_error *err) {
  if (tp->size == 1) return MP_OK;
  float packed[sizeof(double) / sizeof(float)];
  const size_t words = sizeof packed / sizeof packed[0];
  float *gathered = malloc((size_t)tp->size * sizeof packed);
  if (gathered == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  memcpy(packed, value, sizeof *value);
  const mp_status status = mp_tp_all_gather(tp, packed, gathered, words, err);
  double total = 0.0;
  for (int r = 0; r < tp->size && status == MP_OK; ++r) {
    double part;
    memcpy(&part, gathered + (size_t)r * words, sizeof part);
    total += part;
  }
  free(gathered);
  if (status == MP_OK) *value = total;
  return status;
}
