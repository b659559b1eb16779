/*
 * engine/comm/comm.h — communicators: the process's place in the MPI job and one handle per group of
 * the grid (topology/grid.h), with point-to-point send/recv and the collectives tensor, pipeline
 * and data parallelism need. Buffers are host memory, or GPU memory, which is staged through
 * pinned host blocks (engine/comm/comm_staging.h) so that several ranks can share one GPU where NCCL
 * refuses to; the caller synchronises the stream that wrote a GPU buffer first. The NCCL
 * communicators are engine/comm/comm_nccl.h.
 *
 * The implementation (comm_mpi.c) is Open MPI. It follows two rules:
 *
 * Every wait has a deadline. Each operation is posted non-blocking (MPI_Isend, MPI_Irecv,
 * MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ialltoall(v), MPI_Ibcast,
 * MPI_Ibarrier) and then
 * polled with MPI_Test until it completes or the world's timeout (mp_comm_world_init) has passed
 * since the operation began: spinning with sched_yield for the first 10 s (Open MPI progresses a
 * non-blocking operation only inside MPI calls, so sleeping would slow transfers), then sleeping
 * up to 1 ms between polls, so waiting out a long timeout on a stuck peer costs little CPU. A
 * wait that passes the deadline fails with MP_ERR_RUNTIME and a message naming this world rank,
 * the operation, the peer (world rank) or the group's members, the group and the byte count:
 *     rank 1: recv from rank 0 in group tp timed out after 2.0 s (1024 bytes); the peer may have
 *     died or hung
 *     rank 3: all-reduce in group dp (ranks 1,3) timed out after 300.0 s (4096 bytes); a member
 *     may have died or hung
 * A hung peer is therefore an error, never a silent hang (DESIGN.md, principle 5).
 *
 * What a timeout leaves behind. A receive that timed out is cancelled (MPI_Cancel) and completes
 * as cancelled, so the group stays usable: the test of this behaviour goes on to use the group.
 * (If the message arrived while cancelling, the receive simply succeeds.) A send or a collective
 * cannot be withdrawn (MPI forbids cancelling collectives; Open MPI does not cancel sends), so its
 * request is left pending inside MPI, which may still read or write the caller's buffer later.
 * The group is then marked broken: every later operation on it fails at once, saying so. The run
 * is expected to stop: report the error and exit non-zero; mp_comm_world_finalize then skips
 * MPI_Finalize (it could block on the lost peer) and mpirun ends the remaining ranks.
 *
 * Every MPI call is checked: a failure becomes MP_ERR_RUNTIME naming this rank, the MPI function,
 * the file and line, and MPI's own error text (communicators use MPI_ERRORS_RETURN).
 *
 * Determinism. Sums are MPI's own (Open MPI's libnbc algorithms for the non-blocking
 * collectives). The MPI standard only recommends, and Open MPI provides, that the same inputs on
 * the same group give the same result run after run; the algorithm, and thus the order of the
 * additions, depends on the group size and message size, so a sum over a tp group of 2 may differ
 * from a serial left-to-right sum in the last bits. Every member of a group receives the same
 * bits (tests/engine/comm_test.cc checks it), which is what keeps replicated parameters identical;
 * the parallel-equals-serial tests compare within float round-off.
 *
 * Threads: MPI is initialised with MPI_THREAD_FUNNELED; call these from the thread that called
 * mp_comm_world_init. A group is not shared between threads.
 */
#ifndef MPENGINE_ENGINE_COMM_H
#define MPENGINE_ENGINE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_comm_world mp_comm_world; /* the process's MPI context */
typedef struct mp_comm mp_comm;             /* one group */

/* Initialises MPI (MPI_Init_thread; if MPI is already initialised, uses it and leaves finalising
 * to its owner) and duplicates MPI_COMM_WORLD. timeout_s (> 0) bounds every wait of every group.
 * Fails with MP_ERR_INPUT on a bad timeout, MP_ERR_RUNTIME when MPI does not start. */
mp_status mp_comm_world_init(int *argc, char ***argv, double timeout_s, mp_comm_world **out,
                             mp_error *err);

/* Waits (up to the timeout) for every rank to arrive, then MPI_Finalize and frees world. When a
 * rank does not arrive in time, or a timed-out operation is still pending, it does not call
 * MPI_Finalize, which could block forever: the caller should exit non-zero and let mpirun end the
 * job. Free the groups first. NULL is a no-op. */
void mp_comm_world_finalize(mp_comm_world *world);

int mp_comm_world_rank(const mp_comm_world *world);
int mp_comm_world_size(const mp_comm_world *world);

/* The timeout of every later wait, in seconds (> 0). Tests shorten it around a wait that must
 * time out. */
void mp_comm_world_set_timeout(mp_comm_world *world, double timeout_s);
double mp_comm_world_timeout(const mp_comm_world *world);

/* Collective over the world: every rank calls it with the group it belongs to (members
 * ascending, world ranks, itself included), for example from mp_grid_tp_group. The groups must
 * partition the world: ranks that name the same group must list the same members. name ("tp",
 * "dp", "pp", "embedding") appears in every message about the group. Fails with MP_ERR_INPUT on
 * all ranks when any rank passes a bad list or the ranks disagree, naming the first offending
 * rank; with MP_ERR_RUNTIME when a rank does not arrive within the timeout. */
mp_status mp_comm_group_create(mp_comm_world *world, const int *members, int count,
                               const char *name, mp_comm **out, mp_error *err);

/* Frees the group (MPI_Comm_free; a broken group's communicator is left to MPI). NULL is a no-op. */
void mp_comm_free(mp_comm *comm);

/* text (capacity bytes) = members as messages name a group: "0,1,2,3", or past 12 members
 * "0,1,...,63 (64 ranks)". */
void mp_comm_format_members(char *text, size_t capacity, const int *members, int count);

int mp_comm_rank(const mp_comm *comm); /* index in members */
int mp_comm_size(const mp_comm *comm);
/* World rank of group rank `group_rank`. */
int mp_comm_member(const mp_comm *comm, int group_rank);
const char *mp_comm_name(const mp_comm *comm);

/* Point-to-point, peer is a group rank other than the caller's. Messages between two ranks of a
 * group arrive in the order they were sent. send returns when the buffer may be reused. bytes
 * must match on both sides. MP_ERR_INPUT for a bad peer; MP_ERR_RUNTIME on timeout. */
mp_status mp_comm_send(mp_comm *comm, const void *buffer, size_t bytes, int peer, mp_error *err);
mp_status mp_comm_recv(mp_comm *comm, void *buffer, size_t bytes, int peer, mp_error *err);

/* A send that returns at once (the pipeline's eager sends, schedules/p2p.h): the buffer must not
 * be written or freed until mp_comm_wait has returned. Sends to one peer are received in the
 * order they were posted, interleaved with blocking sends in posting order too. *out is NULL on
 * failure. The deadline of the wait counts from the post. */
typedef struct mp_comm_request mp_comm_request;
mp_status mp_comm_isend(mp_comm *comm, const void *buffer, size_t bytes, int peer,
                        mp_comm_request **out, mp_error *err);

/* mp_comm_all_reduce_sum_f32 that returns at once: buffer must not be touched until
 * mp_comm_wait. Every member posts the group's collectives in the same order. Open MPI moves it
 * forward inside later MPI calls (on any group), so it overlaps with compute that communicates. */
mp_status mp_comm_iall_reduce_sum_f32(mp_comm *comm, float *buffer, size_t count,
                                      mp_comm_request **out, mp_error *err);

/* Waits for a posted operation to complete (up to the timeout, counted from its post) and frees
 * the request, whatever the outcome. The timeout message is the blocking operation's. NULL is
 * MP_OK. */
mp_status mp_comm_wait(mp_comm_request *request, mp_error *err);

/* Collectives: every member calls them in the same order with the same count. */

/* buffer (count) <- the element-wise sum of every member's buffer, in place. */
mp_status mp_comm_all_reduce_sum_f32(mp_comm *comm, float *buffer, size_t count, mp_error *err);

/* Group rank r gets output (count) = the sum over members of input[r * count .. (r+1) * count).
 * input is (size * count). count * size must fit an int. */
mp_status mp_comm_reduce_scatter_sum_f32(mp_comm *comm, const float *input, float *output,
                                         size_t count, mp_error *err);

/* The same with counts[r] floats for group rank r (some may be 0): input is the counts' sum,
 * rank r's run after those of ranks 0..r-1 (ZeRO-2: a window of gradients over the dp ranks'
 * contiguous parts). The sum must fit an int. */
mp_status mp_comm_reduce_scatter_v_sum_f32(mp_comm *comm, const float *input, float *output,
                                           const size_t *counts, mp_error *err);

/* output (size * count) = every member's input (count), in group rank order. */
mp_status mp_comm_all_gather_f32(mp_comm *comm, const float *input, float *output, size_t count,
                                 mp_error *err);

/* The same with counts[r] floats from group rank r (some may be 0): output = every member's run
 * in rank order. input NULL: in place, this rank's run already at its position in output
 * (ZeRO-3's block gathers, the parameters after a ZeRO update). Host memory; the sum must fit
 * an int. */
mp_status mp_comm_all_gather_v_f32(mp_comm *comm, const float *input, float *output,
                                   const size_t *counts, mp_error *err);
/* The same over bf16 elements, moved bit for bit (ZeRO-3's block weights for a GPU whose dp
 * group has no NCCL communicator, staged through the host by the caller); bf16 storage is
 * uint16_t (layers/cuda_types.h). */
mp_status mp_comm_all_gather_v_bf16(mp_comm *comm, const uint16_t *input, uint16_t *output,
                                    const size_t *counts, mp_error *err);

/* All-to-all (expert parallelism's per-expert row counts): input (size * count) holds count
 * elements for each group rank, in rank order; output (size * count) gets at chunk r what group
 * rank r's input held for this rank. Host memory, input and output apart; count * size must fit
 * an int. */
mp_status mp_comm_all_to_all_i32(mp_comm *comm, const int32_t *input, int32_t *output,
                                 size_t count, mp_error *err);

/* All-to-all with variable counts (expert parallelism's dispatch and combine of token rows):
 * send_counts[r] floats of input go to group rank r and recv_counts[r] floats from group rank r
 * land in output, each side's runs in rank order (this rank's own run is copied). Any count may
 * be 0; what rank a sends to b must be what b expects from a. Host memory, input and output
 * apart; each side's sum must fit an int. */
mp_status mp_comm_all_to_all_v_f32(mp_comm *comm, const float *input, const size_t *send_counts,
                                   float *output, const size_t *recv_counts, mp_error *err);

/* buffer (bytes) <- root's buffer; root is a group rank. */
mp_status mp_comm_broadcast(mp_comm *comm, void *buffer, size_t bytes, int root, mp_error *err);

mp_status mp_comm_barrier(mp_comm *comm, mp_error *err);

/* One outcome for the whole group: every member returns the status and message of the lowest
 * group rank whose status is not MP_OK, or MP_OK when there is none, so all members stop (or go
 * on) together and rank 0 can print the reason. Allocates nothing, so a member short of memory
 * still reaches every collective: one one-float all-reduce when all succeeded, and a binary
 * search of one-float all-reduces for the first failure. comm NULL returns status. */
mp_status mp_comm_agree(mp_comm *comm, mp_status status, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_H */
