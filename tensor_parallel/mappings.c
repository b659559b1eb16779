/* tensor_parallel/mappings.c — forward/backward communication pairs; see mappings.h. */
#include "tensor_parallel/mappings.h"

mp_status mp_tp_copy_to_region_forward(const mp_tp_comm *tp, float *x, size_t n, mp_error *err) {
  (void)tp, (void)x, (void)n, (void)err;
  return MP_OK;
}

mp_status mp_tp_copy_to_region_backward(const mp_tp_comm *tp, float *dx, size_t n, mp_error *err) {
  return mp_tp_all_reduce_sum(tp, dx, n, err);
}

mp_status mp_tp_reduce_from_region_forward(const mp_tp_comm *tp, float *x, size_t n,
                                           mp_error *err) {
  return mp_tp_all_reduce_sum(tp, x, n, err);
}

mp_status mp_tp_reduce_from_region_backward(const mp_tp_comm *tp, float *dx, size_t n,
                                            mp_error *err) {
  (void)tp, (void)dx, (void)n, (void)err;
  return MP_OK;
}

mp_status mp_tp_gather_from_sequence_forward(const mp_tp_comm *tp, const float *slice, float *full,
                                             size_t n_local, mp_error *err) {
  return mp_tp_all_gather(tp, slice, full, n_local, err);
}

mp_status mp_tp_gather_from_sequence_backward(const mp_tp_comm *tp, const float *dfull,
                                              float *dslice, size_t n_local, mp_error *err) {
  return mp_tp_reduce_scatter_sum(tp, dfull, dslice, n_local, err);
}

mp_status mp_tp_reduce_scatter_to_sequence_forward(const mp_tp_comm *tp, const float *partial,
                                                   float *slice, size_t n_local, mp_error *err) {
  return mp_tp_reduce_scatter_sum(tp, partial, slice, n_local, err);
}

mp_status mp_tp_reduce_scatter_to_sequence_backward(const mp_tp_comm *tp, const float *dslice,
                                                    float *dfull, size_t n_local, mp_error *err) {
  return mp_tp_all_gather(tp, dslice, dfull, n_local, err);
}
