/*
 * engine/comm/comm_nccl.h — NCCL communicators: one per group of the grid, on device buffers, with a
 * watchdog that turns a hung peer into an error. The GPU twin of engine/comm/comm.h.
 *
 * Creation. Every rank first builds its MPI groups (engine/comm/comm.h, from topology/grid.h), then
 * calls mp_nccl_comm_create for each of them in the same fixed order on every rank: group rank 0
 * makes an ncclUniqueId and broadcasts it over the group's MPI communicator (mp_comm_broadcast),
 * and every member joins with ncclCommInitRankConfig. Creating communicators lazily, in an order
 * that differs between ranks, is a known source of hangs (Megatron-LM); here the order is the
 * caller's, visible in one place. A process with no MPI job can create a one-member communicator
 * (group NULL) for one-GPU use and tests.
 *
 * Streams. Each communicator has a communication stream of its own (non-blocking, high priority).
 * Operations return once they are enqueued on it; they are ordered against compute by CUDA events:
 *   mp_nccl_comm_wait_stream(comm, compute)  later operations of comm start after the work
 *                                            enqueued on `compute` so far (e.g. the backward
 *                                            that produced the gradients);
 *   mp_nccl_stream_wait_comm(compute, comm)  later work on `compute` starts after comm's
 *                                            operations so far (the host does not wait);
 *   mp_nccl_comm_synchronize(comm)           the host waits, under the watchdog, until comm's
 *                                            operations so far are complete.
 * So the data-parallel all-reduce of a bucket can run while the next backward computes.
 *
 * Point-to-point. mp_nccl_p2p posts several sends and receives inside one ncclGroupStart/End, so
 * a pipeline stage's send to the next stage and receive from the previous one never wait on each
 * other, whatever order the neighbours post them in.
 *
 * The watchdog. Communicators are non-blocking (ncclConfig_t.blocking = 0): no NCCL call blocks
 * the host, not even creation. Every wait (creation, enqueueing, synchronize, free) polls the
 * operation's completion (cudaEventQuery, or the communicator's state) and
 * ncclCommGetAsyncError against a deadline, --comm-timeout seconds after the operation was posted
 * (the MPI world's timeout; mp_nccl_world_set_timeout). Past it, or on an asynchronous NCCL error,
 * every NCCL communicator of the process is aborted (ncclCommAbort: kernels still spinning on a
 * lost peer exit) and the wait fails with MP_ERR_RUNTIME naming this rank, the group, the peer or
 * the members, the operation and its bytes:
 *     rank 1: all-reduce in group dp (ranks 1,3) timed out after 2.0 s (4096 bytes) on NCCL;
 *     communicators aborted
 * Every later call on any communicator of the process then fails at once, saying why. The run is
 * expected to stop (exit 1); it never hangs. Work the caller made wait on a communicator
 * (mp_nccl_stream_wait_comm) is only as bounded as that: before the host blocks on such a stream,
 * call mp_nccl_comm_synchronize, which is.
 *
 * Every CUDA and NCCL call is checked; a failure is MP_ERR_RUNTIME naming this rank, the call as
 * written, NCCL's or CUDA's error text (and ncclGetLastError's detail), the file and the line.
 * NCCL refuses two ranks of one communicator on one GPU; to share a GPU between ranks for testing,
 * use the MPI communicators, which stage GPU buffers through the host (engine/comm/comm.h).
 *
 * Builds without CUDA implement this header by failing every creation with MP_ERR_INPUT ("built
 * without CUDA/NCCL"); mp_nccl_available says which build this is. Threads: like engine/comm/comm.h,
 * call from the thread that created the world.
 */
#ifndef MPENGINE_ENGINE_COMM_NCCL_H
#define MPENGINE_ENGINE_COMM_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_nccl_world mp_nccl_world; /* the process's GPU and its communicators' watchdog */
typedef struct mp_nccl_comm mp_nccl_comm;   /* one group */

/* Element types of the collectives. */
typedef enum {
  MP_NCCL_FLOAT32 = 0,
  MP_NCCL_BFLOAT16 = 1,
} mp_nccl_dtype;

/* True in a build with CUDA and NCCL (it says nothing about a GPU being visible). */
bool mp_nccl_available(void);

/* NCCL's version as ncclGetVersion reports it (22809 for 2.28.9); 0 without NCCL. */
int mp_nccl_version(void);

/* Selects CUDA device `device` (>= 0; -1 keeps the current one) for this process and starts the
 * watchdog's bookkeeping. mpi (may be NULL in a process outside an MPI job) gives this process's
 * rank for messages and the timeout of every wait, mp_comm_world_timeout (300 s without MPI).
 * Fails with MP_ERR_INPUT without CUDA/NCCL in the build, without a visible GPU, or for a device
 * that does not exist, saying which; MP_ERR_RUNTIME when CUDA fails. */
mp_status mp_nccl_world_create(mp_comm_world *mpi, int device, mp_nccl_world **out,
                               mp_error *err);

/* Frees world. Free its communicators first. NULL is a no-op. */
void mp_nccl_world_free(mp_nccl_world *world);

/* The timeout of every later wait, in seconds (> 0); also sets the MPI world's. */
void mp_nccl_world_set_timeout(mp_nccl_world *world, double timeout_s);
double mp_nccl_world_timeout(const mp_nccl_world *world);
int mp_nccl_world_device(const mp_nccl_world *world);

/* True once the watchdog (or an asynchronous error) aborted the process's communicators. */
bool mp_nccl_world_aborted(const mp_nccl_world *world);

/* Collective over `group` (every member calls it, in the same order as its other group
 * creations): the NCCL communicator of the group's members, with the group's name and members in
 * every message. group NULL makes a one-member communicator of this process, named "self",
 * without MPI. Fails with MP_ERR_RUNTIME when a member does not arrive within the timeout (then
 * every communicator is aborted) or NCCL refuses (two ranks on one GPU, say: the message says so),
 * MP_ERR_INPUT when the world is unusable. */
mp_status mp_nccl_comm_create(mp_nccl_world *world, mp_comm *group, mp_nccl_comm **out,
                              mp_error *err);

/* Waits (under the watchdog) for the communicator's operations, then releases it (ncclCommFinalize
 * and ncclCommDestroy, or nothing more after an abort). Past the timeout it aborts instead. NULL is
 * a no-op. */
void mp_nccl_comm_free(mp_nccl_comm *comm);

int mp_nccl_comm_rank(const mp_nccl_comm *comm); /* index in members */
int mp_nccl_comm_size(const mp_nccl_comm *comm);
const char *mp_nccl_comm_name(const mp_nccl_comm *comm);
/* The communication stream (a cudaStream_t) its operations are enqueued on. */
mp_cuda_stream mp_nccl_comm_stream(const mp_nccl_comm *comm);

/* --- Ordering against compute (see the head comment) --- */

/* Later operations of comm wait (on the GPU) for the work enqueued on `stream` so far. stream NULL
 * is the legacy default stream. */
mp_status mp_nccl_comm_wait_stream(mp_nccl_comm *comm, mp_cuda_stream stream, mp_error *err);

/* Later work on `stream` waits (on the GPU) for comm's operations so far; the host goes on. */
mp_status mp_nccl_stream_wait_comm(mp_cuda_stream stream, mp_nccl_comm *comm, mp_error *err);

/* Marks: slot (0 .. MP_NCCL_MARKS - 1) remembers the point comm's operations so far reach, and a
 * stream can then wait for those without waiting for the operations posted after (ZeRO-3's
 * prefetched block weights, with reduce-scatters queued behind them). mp_nccl_stream_wait_mark:
 * later work on `stream` waits (on the GPU) for comm's operations up to slot's last mark (none
 * before the first). MP_ERR_INPUT for another slot. */
enum { MP_NCCL_MARKS = 2 };
mp_status mp_nccl_comm_mark(mp_nccl_comm *comm, int slot, mp_error *err);
mp_status mp_nccl_stream_wait_mark(mp_cuda_stream stream, mp_nccl_comm *comm, int slot,
                                   mp_error *err);

/* The host waits until comm's operations so far are complete: each polled against the deadline of
 * its post (the watchdog). The first failure aborts every communicator and names its operation. */
mp_status mp_nccl_comm_synchronize(mp_nccl_comm *comm, mp_error *err);

/* --- Operations: enqueued on comm's stream; buffers are device memory and must stay valid and
 * untouched by other streams until the operation completes (after mp_nccl_comm_synchronize, or on
 * a stream made to wait with mp_nccl_stream_wait_comm). Every member posts the group's collectives
 * in the same order with the same count. MP_ERR_INPUT for a bad argument (naming it and the
 * group); MP_ERR_RUNTIME when NCCL fails or after an abort. --- */

typedef enum { MP_NCCL_SEND = 0, MP_NCCL_RECV = 1 } mp_nccl_p2p_kind;

typedef struct {
  mp_nccl_p2p_kind kind;
  int peer;      /* a group rank; may be this rank's own (a copy through NCCL) */
  void *buffer;  /* device memory: read by a send, written by a receive */
  size_t bytes;  /* must equal the matching operation's on the peer */
} mp_nccl_p2p_op;

/* Posts ops[0 .. count) together in one ncclGroupStart/End: none waits for another. Sends to one
 * peer arrive in the order posted, here and across calls. */
mp_status mp_nccl_p2p(mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count, mp_error *err);

/* buffer (count elements) <- the element-wise sum over members, in place. */
mp_status mp_nccl_all_reduce_sum(mp_nccl_comm *comm, void *buffer, size_t count,
                                 mp_nccl_dtype dtype, mp_error *err);

/* output (count) = the sum over members of input[rank * count .. (rank + 1) * count); input is
 * (size * count). */
mp_status mp_nccl_reduce_scatter_sum(mp_nccl_comm *comm, const void *input, void *output,
                                     size_t count, mp_nccl_dtype dtype, mp_error *err);

/* The same over fp32 with counts[r] floats for group rank r (some may be 0): input is the counts'
 * sum, rank r's run after those of ranks 0..r-1; output gets this rank's run (ZeRO-2's windows
 * over the dp parts). One reduce per non-empty run, rooted at its rank, in one group. */
mp_status mp_nccl_reduce_scatter_v_sum_f32(mp_nccl_comm *comm, const float *input, float *output,
                                           const size_t *counts, mp_error *err);

/* output (size * count) = every member's input (count), in group rank order. */
mp_status mp_nccl_all_gather(mp_nccl_comm *comm, const void *input, void *output, size_t count,
                             mp_nccl_dtype dtype, mp_error *err);

/* The same with counts[r] elements from group rank r (some may be 0): output = every member's
 * run in rank order (ZeRO-3: a block's bf16 weights from the dp parts; the master weights outside
 * the blocks after the update). input NULL: in place, this rank's run already at its position in
 * output. One broadcast per non-empty run, rooted at its rank, in one group. */
mp_status mp_nccl_all_gather_v(mp_nccl_comm *comm, const void *input, void *output,
                               const size_t *counts, mp_nccl_dtype dtype, mp_error *err);

/* buffer (bytes) <- root's buffer; root is a group rank. */
mp_status mp_nccl_broadcast(mp_nccl_comm *comm, void *buffer, size_t bytes, int root,
                            mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_NCCL_H */
