/*
 * tensor_parallel/row_parallel_linear.h — a linear layer split by input channel across the
 * tensor-parallel group (Megatron's RowParallelLinear).
 *
 * The full layer is out = inp @ W^T + b with W (OC, C). Rank r holds columns [r*C/tp, (r+1)*C/tp)
 * of W, Cl = C/tp of them, and the matching channels of the input, which is a column-parallel
 * layer's local output (attention over this rank's heads, or the GELU of its MLP channels). Each
 * rank's product is a partial sum of the output; it leaves the region through reduce_from_region
 * (all-reduce; the output gradient is then replicated and used as it is) or, with sequence
 * parallelism, through reduce_scatter_to_sequence (each rank keeps the sum for its token slice;
 * the backward all-gathers the slices' gradients). The bias is replicated and added once, after
 * the reduction, so it is not counted tp times. The math is layers/matmul.h on the shard.
 *
 * Returns MP_OK, or a collective's error (tp_comm.h). No memory is allocated.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_ROW_PARALLEL_LINEAR_H
#define MPENGINE_TENSOR_PARALLEL_ROW_PARALLEL_LINEAR_H

#include <stdbool.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BT is the number of tokens of the whole micro-batch; with sequence parallelism a rank's slice
 * has BT/tp of them.
 *   out    (BT, OC) written, replicated; or with sequence parallelism (BT/tp, OC), this rank's
 *          token slice
 *   inp    (BT, Cl)  this rank's input channels
 *   weight (OC, Cl)  this rank's columns of W
 *   bias   (OC)      the whole b (replicated), or NULL
 *   work   (BT, OC)  scratch for the partial product with sequence parallelism; NULL without */
mp_status mp_tp_row_linear_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                   const float *inp, const float *weight, const float *bias,
                                   float *work, int BT, int Cl, int OC, mp_error *err);

/* Backward; adds (+=) into every gradient it is given and skips a NULL one (as
 * column_parallel_linear.h; with sequence parallelism the all-gather of dout runs whatever is
 * skipped, so every rank must make the same choice).
 *   dinp       (BT, Cl)  += dout_total @ weight, or NULL
 *   dweight    (OC, Cl)  += dout_total^T @ inp, or NULL
 *   dbias      (OC)      += column sums of dout_total over all BT tokens, or NULL: the whole
 *                        bias gradient, identical on every rank (nothing to all-reduce)
 *   dout       (BT, OC) replicated, or with sequence parallelism (BT/tp, OC), this rank's slice
 *   dout_total (BT, OC)  with sequence parallelism: written with the all-gathered dout; NULL
 *                        without
 *   inp        (BT, Cl)  the forward's input
 *   weight     (OC, Cl) */
mp_status mp_tp_row_linear_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                    float *dweight, float *dbias, const float *dout,
                                    float *dout_total, const float *inp, const float *weight,
                                    int BT, int Cl, int OC, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_ROW_PARALLEL_LINEAR_H */
