/* tensor_parallel/row_parallel_linear.c — input-channel-split linear; see the header. */
#include "tensor_parallel/row_parallel_linear.h"

#include "layers/matmul.h"
#include "tensor_parallel/mappings.h"

/* out (rows, OC) += bias in every row. */
static void add_bias(float *out, const float *bias, int rows, int OC) {
  if (bias == NULL) return;
  for (int r = 0; r < rows; r++) {
    float *row = out + (size_t)r * OC;
    for (int o = 0; o < OC; o++) row[o] += bias[o];
  }
}

mp_status mp_tp_row_linear_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                   const float *inp, const float *weight, const float *bias,
                                   float *work, int BT, int Cl, int OC, mp_error *err) {
  const size_t n = (size_t)BT * OC;
  if (sequence_parallel) {
    const int rows_local = BT / tp->size;
    mp_matmul_forward_cpu(work, inp, weight, NULL, BT, Cl, OC);
    MP_TRY(mp_tp_reduce_scatter_to_sequence_forward(tp, work, out, n / (size_t)tp->size, err));
    add_bias(out, bias, rows_local, OC);
    return MP_OK;
  }
  mp_matmul_forward_cpu(out, inp, weight, NULL, BT, Cl, OC);
  MP_TRY(mp_tp_reduce_from_region_forward(tp, out, n, err));
  add_bias(out, bias, BT, OC);
  return MP_OK;
}

mp_status mp_tp_row_linear_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                    float *dweight, float *dbias, const float *dout,
                                    float *dout_total, const float *inp, const float *weight,
                                    int BT, int Cl, int OC, mp_error *err) {
  const float *g = dout;
  if (sequence_parallel) {
    const size_t n_local = (size_t)(BT / tp->size) * OC;
    MP_TRY(mp_tp_reduce_scatter_to_sequence_backward(tp, dout, dout_total, n_local, err));
    g = dout_total;
  }
  /* Without sequence parallelism dout is replicated: reduce_from_region's backward is the
   * identity. */
  mp_matmul_backward_cpu(dinp, dweight, dbias, g, inp, weight, BT, Cl, OC);
  return MP_OK;
}
