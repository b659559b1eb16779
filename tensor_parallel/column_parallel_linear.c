/* tensor_parallel/column_parallel_linear.c — output-channel-split linear; see the header. */
#include "tensor_parallel/column_parallel_linear.h"

#include <string.h>

#include "layers/matmul.h"
#include "tensor_parallel/mappings.h"

mp_status mp_tp_column_linear_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                      float *inp_total, const float *inp, const float *weight,
                                      const float *bias, int BT, int C, int OCl, mp_error *err) {
  const float *x = inp;
  if (sequence_parallel) {
    const size_t n_local = (size_t)(BT / tp->size) * C;
    MP_TRY(mp_tp_gather_from_sequence_forward(tp, inp, inp_total, n_local, err));
    x = inp_total;
  }
  /* copy_to_region's forward is the identity: x is used as it is. */
  mp_matmul_forward_cpu(out, x, weight, bias, BT, C, OCl);
  return MP_OK;
}

size_t mp_tp_column_linear_work_floats(const mp_tp_comm *tp, bool sequence_parallel, int BT,
                                       int C) {
  const size_t n = (size_t)BT * C;
  return sequence_parallel ? n + n / (size_t)tp->size : n;
}

mp_status mp_tp_column_linear_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                       float *dweight, float *dbias, const float *dout,
                                       const float *inp_total, const float *weight, float *work,
                                       int BT, int C, int OCl, mp_error *err) {
  if (dweight != NULL || dbias != NULL) {
    mp_matmul_backward_cpu(NULL, dweight, dbias, dout, inp_total, weight, BT, C, OCl);
  }
  if (dinp == NULL) return MP_OK;
  const size_t n = (size_t)BT * C;
  memset(work, 0, n * sizeof(float));
  mp_matmul_backward_cpu(work, NULL, NULL, dout, inp_total, weight, BT, C, OCl);
  if (sequence_parallel) {
    /* The reduce-scatter may not write over its input: its slice goes after the partial. */
    const size_t n_local = n / (size_t)tp->size;
    float *slice = work + n;
    MP_TRY(mp_tp_gather_from_sequence_backward(tp, work, slice, n_local, err));
    for (size_t i = 0; i < n_local; i++) dinp[i] += slice[i];
    return MP_OK;
  }
  MP_TRY(mp_tp_copy_to_region_backward(tp, work, n, err));
  for (size_t i = 0; i < n; i++) dinp[i] += work[i];
  return MP_OK;
}
