/*
 * expert_parallel/ep_comm.h — the expert-parallel group as expert_parallel/ sees it: a rank, a
 * size and the two all-to-alls that move token rows to the ranks holding their experts and back,
 * behind a small table of function pointers.
 *
 * Why a table and not engine/comm/comm.h: dependencies point downward only (tools -> engine ->
 * pipeline -> tensor_parallel, expert_parallel -> layers, DESIGN.md), and the communicators live
 * in engine/. As tensor_parallel/tp_comm.h does, this layer names the operations it needs and the
 * engine fills the table from its communicator (engine/comm/ep_comm_mpi.h over an MPI group),
 * passing the communicator as `context`; tests fill it the same way. A one-rank table
 * (mp_ep_comm_single) needs no communicator.
 *
 * Contract every implementation keeps: every rank of the group calls the same operations in the
 * same order; what rank a sends to rank b is exactly what b expects from a (the counts are
 * exchanged first for that); runs are laid out in group rank order on both sides.
 */
#ifndef MPENGINE_EXPERT_PARALLEL_EP_COMM_H
#define MPENGINE_EXPERT_PARALLEL_EP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void *context; /* the implementation's communicator (engine/comm/comm.h's mp_comm *, ...) */
  int rank;      /* this process's rank in the expert-parallel group, in [0, size) */
  int size;      /* ep, the number of ranks in the group */
  /* input (size * count): chunk r goes to rank r; output (size * count): chunk r came from rank
   * r. No overlap. */
  mp_status (*all_to_all_i32)(void *context, const int32_t *input, int32_t *output, size_t count,
                              mp_error *err);
  /* send_counts[r] floats of input go to rank r, recv_counts[r] floats from rank r land in
   * output, runs in rank order on both sides; counts may be 0. No overlap. */
  mp_status (*all_to_all_v_f32)(void *context, const float *input, const size_t *send_counts,
                                float *output, const size_t *recv_counts, mp_error *err);
} mp_ep_comm;

/* The one-rank group: rank 0, size 1; both all-to-alls copy. For ep = 1 without a communicator. */
mp_ep_comm mp_ep_comm_single(void);

/* The operations through the table. Each returns MP_OK, or the implementation's status with its
 * message prefixed by "expert-parallel rank R of S: <operation>: ". Size 1 is handled here (a
 * copy; MP_ERR_INPUT when a one-rank all-to-all-v's two counts differ). Every rank must call
 * them, whatever its own counts (a rank with nothing to send still takes part). */
mp_status mp_ep_all_to_all_i32(const mp_ep_comm *ep, const int32_t *input, int32_t *output,
                               size_t count, mp_error *err);
mp_status mp_ep_all_to_all_v_f32(const mp_ep_comm *ep, const float *input,
                                 const size_t *send_counts, float *output,
                                 const size_t *recv_counts, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_EXPERT_PARALLEL_EP_COMM_H */
