/*
 * tensor_parallel/mappings.h — tensor-parallel communication as forward/backward pairs, after
 * Megatron-LM's tensor_parallel/mappings.py.
 *
 * Each pair is one autograd function: what the forward does to an activation, and what the
 * backward must then do to its gradient. Layers are written from these pairs, so every collective
 * of the forward has its mirror in the backward and nothing is forgotten:
 *
 *   copy_to_region             forward identity         backward all-reduce
 *   reduce_from_region         forward all-reduce       backward identity
 *   gather_from_sequence       forward all-gather       backward reduce-scatter
 *   reduce_scatter_to_sequence forward reduce-scatter   backward all-gather
 *
 * The last two are sequence parallelism's: activations outside the tensor-parallel GEMMs
 * (layernorm, residual) live on a slice of the tokens. Activations are row-major (B*T, C) with one
 * token per row, so a token slice is contiguous: rank r holds rows [r*BT/tp, (r+1)*BT/tp) of the
 * flattened batch (with B = 1 that is T/tp positions of the sequence). BT must be a multiple of tp.
 *
 * Counts are floats. Every call returns MP_OK or the collective's error (see tp_comm.h); identity
 * halves return MP_OK and exist so that callers read as pairs.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_MAPPINGS_H
#define MPENGINE_TENSOR_PARALLEL_MAPPINGS_H

#include <stddef.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enter a tensor-parallel region with a replicated activation x (n): every rank uses all of it. */
mp_status mp_tp_copy_to_region_forward(const mp_tp_comm *tp, float *x, size_t n, mp_error *err);
/* dx (n): each rank's partial gradient, summed over the group in place. */
mp_status mp_tp_copy_to_region_backward(const mp_tp_comm *tp, float *dx, size_t n, mp_error *err);

/* Leave a tensor-parallel region: x (n) holds each rank's partial sum, summed in place. */
mp_status mp_tp_reduce_from_region_forward(const mp_tp_comm *tp, float *x, size_t n, mp_error *err);
/* The gradient of a replicated result is already replicated: nothing to do. */
mp_status mp_tp_reduce_from_region_backward(const mp_tp_comm *tp, float *dx, size_t n,
                                            mp_error *err);

/* Sequence parallelism into a tensor-parallel region.
 *   forward:  full (tp * n_local) written = all ranks' slices (n_local each) in rank order
 *   backward: dslice (n_local) written = this rank's chunk of dfull (tp * n_local) summed over
 *             the group (each rank's dfull is a partial gradient of the whole) */
mp_status mp_tp_gather_from_sequence_forward(const mp_tp_comm *tp, const float *slice, float *full,
                                             size_t n_local, mp_error *err);
mp_status mp_tp_gather_from_sequence_backward(const mp_tp_comm *tp, const float *dfull,
                                              float *dslice, size_t n_local, mp_error *err);

/* Sequence parallelism out of a tensor-parallel region.
 *   forward:  slice (n_local) written = this rank's chunk of partial (tp * n_local) summed over
 *             the group
 *   backward: dfull (tp * n_local) written = all ranks' dslice in rank order */
mp_status mp_tp_reduce_scatter_to_sequence_forward(const mp_tp_comm *tp, const float *partial,
                                                   float *slice, size_t n_local, mp_error *err);
mp_status mp_tp_reduce_scatter_to_sequence_backward(const mp_tp_comm *tp, const float *dslice,
                                                    float *dfull, size_t n_local, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_MAPPINGS_H */
