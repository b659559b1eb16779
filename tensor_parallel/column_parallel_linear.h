/*
 * tensor_parallel/column_parallel_linear.h — a linear layer split by output channel across the
 * tensor-parallel group (Megatron's ColumnParallelLinear).
 *
 * The full layer is out = inp @ W^T + b with W (OC, C). Rank r holds rows [r*OC/tp, (r+1)*OC/tp)
 * of W and b, OCl = OC/tp of them, and computes those output channels for every token; its output
 * stays local (the next layer, attention or GELU then a row-parallel linear, works on it as is).
 * The input enters through copy_to_region (identity forward, all-reduce of the input gradient),
 * or with sequence parallelism through gather_from_sequence (all-gather of the token slices,
 * reduce-scatter of the input gradient). The math is layers/matmul.h on the shard.
 *
 * The LM head tied to a vocab-parallel embedding is this layer with W = this rank's rows of wte
 * and no bias (vocab_parallel_embedding.h).
 *
 * Returns MP_OK, or a collective's error (tp_comm.h). No memory is allocated: the caller gives
 * the buffers that a gather or a partial gradient needs.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_COLUMN_PARALLEL_LINEAR_H
#define MPENGINE_TENSOR_PARALLEL_COLUMN_PARALLEL_LINEAR_H

#include <stdbool.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BT is the number of tokens of the whole micro-batch (B*T); with sequence parallelism a rank's
 * slice has BT/tp of them.
 *   out       (BT, OCl)  written: this rank's output channels
 *   inp_total (BT, C)    with sequence parallelism: written with the all-gathered input, which
 *                        the backward needs; without: NULL
 *   inp       (BT, C)    the replicated input, or with sequence parallelism (BT/tp, C), this
 *                        rank's token slice
 *   weight    (OCl, C)   this rank's rows of W
 *   bias      (OCl)      this rank's entries of b, or NULL */
mp_status mp_tp_column_linear_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                      float *inp_total, const float *inp, const float *weight,
                                      const float *bias, int BT, int C, int OCl, mp_error *err);

/* Floats of scratch the backward needs for dinp: (BT, C) for the partial input gradient, plus
 * (BT/tp, C) for the reduce-scatter's result with sequence parallelism. */
size_t mp_tp_column_linear_work_floats(const mp_tp_comm *tp, bool sequence_parallel, int BT, int C);

/* Backward; adds (+=) into every gradient it is given and skips a NULL one (dinp alone is the
 * backward-input pass of a zero-bubble schedule, dweight and dbias alone the weight pass; every
 * rank of the group must make the same choice, since dinp needs a collective).
 *   dinp      (BT, C), or with sequence parallelism (BT/tp, C)  += the whole input gradient
 *             (this rank's dout @ weight, summed over the group), or NULL
 *   dweight   (OCl, C)  += dout^T @ inp_total, or NULL
 *   dbias     (OCl)     += column sums of dout, or NULL
 *   dout      (BT, OCl)
 *   inp_total (BT, C)   the forward's whole input: inp without sequence parallelism, inp_total
 *                       with it
 *   weight    (OCl, C)
 *   work      mp_tp_column_linear_work_floats floats of scratch, overwritten (needed only
 *             when dinp is given) */
mp_status mp_tp_column_linear_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                       float *dweight, float *dbias, const float *dout,
                                       const float *inp_total, const float *weight, float *work,
                                       int BT, int C, int OCl, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_COLUMN_PARALLEL_LINEAR_H */
