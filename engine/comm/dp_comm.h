/*
 * engine/comm/dp_comm.h — the data-parallel group's collectives on the trainer's gradient and
 * parameter buffers (engine/train/: the gradient all-reduces, ZeRO's reduce-scatters and
 * gathers), over MPI (engine/comm/comm.h, dp_comm_mpi.c) or NCCL (engine/comm/comm_nccl.h,
 * dp_comm_nccl.c), so that the trainer's code is one whichever carries them.
 *
 * One ordering model for both, NCCL's (comm_nccl.h's head comment): operations are ordered
 * against the compute stream explicitly.
 *   mp_dp_comm_after_compute   later operations start after the compute enqueued so far (the
 *                              backward that wrote the gradients)
 *   mp_dp_comm_before_compute  compute enqueued later starts after the operations so far
 *   mp_dp_comm_synchronize     the host waits until every operation so far is complete
 * Over NCCL an operation returns once enqueued on the communicator's stream (mp_dp_comm_enqueues
 * says so) and these are CUDA events; over MPI it returns complete (or, posted, after
 * mp_dp_comm_synchronize), after_compute synchronises the GPU when the buffers are device memory
 * (MPI reads them through the host) and before_compute does nothing. The trainer writes the
 * NCCL order once and MPI keeps it for free.
 *
 * Device buffers over MPI: comm.h stages them through pinned host blocks, but its uneven
 * all-gathers take host buffers only; this module stages those itself, through one host buffer
 * of at most MP_DP_COMM_STAGING_BYTES, piece by piece (ZeRO-3's block weights and the
 * parameters outside the blocks).
 *
 * Every call returns comm.h's or comm_nccl.h's status and message (timeouts name the rank, the
 * group and the members). Every member makes the same calls in the same order.
 */
#ifndef MPENGINE_ENGINE_COMM_DP_COMM_H
#define MPENGINE_ENGINE_COMM_DP_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_dp_comm mp_dp_comm;

typedef enum { MP_DP_FLOAT32 = 0, MP_DP_BFLOAT16 = 1 } mp_dp_dtype;

/* The largest host buffer an MPI dp communicator stages device memory through: 16 MiB. */
enum { MP_DP_COMM_STAGING_BYTES = 16 << 20 };

/* Sees each posted all-reduce complete (mp_dp_comm_synchronize), for the trace: its bytes and
 * when it was posted in now's clock (over NCCL one report for all of them, bytes 0). */
typedef struct {
  void *context;
  double (*now)(void *context);
  void (*completed)(void *context, size_t bytes, double posted_s, double end_s);
} mp_dp_comm_observer;

/* Over MPI group `group` (must outlive it). device_buffers: the buffers are GPU memory (staged
 * through the host). max_in_flight: posted all-reduces that may be pending at once (each holds a
 * staging block of its bytes), 0 for no limit. observer may be NULL (copied). */
mp_status mp_dp_comm_over_mpi(mp_comm *group, bool device_buffers, int max_in_flight,
                              const mp_dp_comm_observer *observer, mp_dp_comm **out,
                              mp_error *err);

/* Over NCCL communicator comm (must outlive it); buffers are device memory. */
mp_status mp_dp_comm_over_nccl(mp_nccl_comm *comm, const mp_dp_comm_observer *observer,
                               mp_dp_comm **out, mp_error *err);

/* Waits for what is posted (errors ignored), then frees. NULL is a no-op. */
void mp_dp_comm_free(mp_dp_comm *dp);

int mp_dp_comm_rank(const mp_dp_comm *dp);
int mp_dp_comm_size(const mp_dp_comm *dp);
const char *mp_dp_comm_name(const mp_dp_comm *dp);

/* True when operations return enqueued on a GPU stream (NCCL), so that one posted ahead (a
 * prefetch) overlaps compute; false when they return complete (MPI). */
bool mp_dp_comm_enqueues(const mp_dp_comm *dp);

/* The stream operations run on, for work that must follow them there (NULL: the default stream,
 * which MPI's results are on by the time an operation returns). */
mp_cuda_stream mp_dp_comm_stream(const mp_dp_comm *dp);

/* --- Ordering (see the head comment) --- */
mp_status mp_dp_comm_after_compute(mp_dp_comm *dp, mp_error *err);
mp_status mp_dp_comm_before_compute(mp_dp_comm *dp, mp_error *err);
/* Every operation so far complete, posted all-reduces included, each reported to the observer;
 * all are waited for even after a failure (none left pending on a buffer), the first error
 * returned. */
mp_status mp_dp_comm_synchronize(mp_dp_comm *dp, mp_error *err);
/* Marks (slot 0 or 1): compute made to wait for the operations up to slot's mark only, not those
 * posted after it (comm_nccl.h's mp_nccl_comm_mark). Nothing over MPI. */
mp_status mp_dp_comm_mark(mp_dp_comm *dp, int slot, mp_error *err);
mp_status mp_dp_comm_before_compute_to_mark(mp_dp_comm *dp, int slot, mp_error *err);

/* --- Collectives (fp32 sums; buffers host or device memory as created) --- */

/* buffer (count) <- the sum over members, posted: over MPI non-blocking (at most max_in_flight
 * pending: the oldest is waited for first), over NCCL enqueued; mp_dp_comm_synchronize finishes
 * it. */
mp_status mp_dp_comm_post_all_reduce_sum_f32(mp_dp_comm *dp, float *buffer, size_t count,
                                             mp_error *err);
/* buffer (count) <- the sum over members. */
mp_status mp_dp_comm_all_reduce_sum_f32(mp_dp_comm *dp, float *buffer, size_t count,
                                        mp_error *err);
/* output (counts[rank]) = the sum over members of input's run of this rank, input being
 * counts[0] + ... + counts[size - 1] floats, the ranks' runs in rank order. */
mp_status mp_dp_comm_reduce_scatter_v_sum_f32(mp_dp_comm *dp, const float *input, float *output,
                                              const size_t *counts, mp_error *err);
/* output (size * count) = every member's input (count floats), in rank order. */
mp_status mp_dp_comm_all_gather_f32(mp_dp_comm *dp, const float *input, float *output,
                                    size_t count, mp_error *err);
/* output = every member's run (counts[r] elements of dtype from rank r) in rank order; input
 * NULL: in place, this rank's run already at its position in output. */
mp_status mp_dp_comm_all_gather_v(mp_dp_comm *dp, const void *input, void *output,
                                  const size_t *counts, mp_dp_dtype dtype, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_DP_COMM_H */
