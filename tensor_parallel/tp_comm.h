/*
 * tensor_parallel/tp_comm.h — the tensor-parallel group as tensor_parallel/ sees it: a rank, a
 * size and three collectives behind a small table of function pointers.
 *
 * Why a table and not engine/comm/comm.h: dependencies point downward only (tools -> engine ->
 * pipeline -> tensor_parallel -> layers, DESIGN.md), and the communicators live in engine/. So
 * this layer names the three operations it needs and the engine fills the table from its
 * communicator (MPI today, NCCL later), passing the communicator as `context`; tests fill it the
 * same way. A one-rank table (mp_tp_comm_single) needs no communicator at all.
 *
 * Contract every implementation must keep (the MPI and NCCL collectives do):
 *   - every rank of the group calls the same operations in the same order with the same counts;
 *   - results are bitwise identical on every rank (one sum per element, then distributed, or a
 *     symmetric order of commutative float additions). Replicated tensors (layernorm weights,
 *     the residual stream without sequence parallelism) stay identical across the group only
 *     because of this; tests/tensor_parallel checks it.
 *   - chunk r of an all-gather's output and of a reduce-scatter's input belong to group rank r.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_TP_COMM_H
#define MPENGINE_TENSOR_PARALLEL_TP_COMM_H

#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void *context; /* the implementation's communicator (engine/comm/comm.h's mp_comm *, ...) */
  int rank;      /* this process's rank in the tensor-parallel group, in [0, size) */
  int size;      /* tp, the number of ranks in the group */
  /* buffer (count) summed over the group, in place. */
  mp_status (*all_reduce_sum_f32)(void *context, float *buffer, size_t count, mp_error *err);
  /* output (size * count): chunk r is rank r's input (count). input and output do not overlap. */
  mp_status (*all_gather_f32)(void *context, const float *input, float *output, size_t count,
                              mp_error *err);
  /* output (count) = sum over ranks of chunk `rank` of their input (size * count). No overlap. */
  mp_status (*reduce_scatter_sum_f32)(void *context, const float *input, float *output,
                                      size_t count, mp_error *err);
} mp_tp_comm;

/* The one-rank group: rank 0, size 1; all-reduce does nothing, all-gather and reduce-scatter
 * copy. For tp = 1 runs without a communicator. */
mp_tp_comm mp_tp_comm_single(void);

/* The three operations through the table. Each returns MP_OK, or the implementation's status with
 * its message prefixed by "tensor-parallel rank R of S: <operation> of N floats: ". count 0 and
 * size 1 are handled here (nothing to send). */
mp_status mp_tp_all_reduce_sum(const mp_tp_comm *tp, float *buffer, size_t count, mp_error *err);
mp_status mp_tp_all_gather(const mp_tp_comm *tp, const float *input, float *output, size_t count,
                           mp_error *err);
mp_status mp_tp_reduce_scatter_sum(const mp_tp_comm *tp, const float *input, float *output,
                                   size_t count, mp_error *err);

/* buffer (count) = elementwise max over the group, in place. The table has no max operation, so
 * this all-gathers the group's buffers into gathered (size * count floats of the caller's) and
 * takes the max in rank order; identical on every rank. */
mp_status mp_tp_all_reduce_max(const mp_tp_comm *tp, float *buffer, float *gathered, size_t count,
                               mp_error *err);

/* *value = the sum of every rank's *value, added in rank order, so bitwise the same on every
 * rank (the double's bits travel through an all-gather of floats). For norms and losses that
 * every rank must agree on. */
mp_status mp_tp_sum_double(const mp_tp_comm *tp, double *value, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_TP_COMM_H */
