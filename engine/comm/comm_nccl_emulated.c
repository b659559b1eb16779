/*
 * engine/comm/comm_nccl_emulated.c — engine/comm/comm_nccl.h for `--define mpengine_cuda=emulated`
 * (third_party/cuda.bzl): the NCCL communicators emulated over engine/comm/comm.h's MPI groups, on
 * host memory, so that the engine's NCCL code paths (the trainer's gradients over NCCL, the
 * tensor- and pipeline-parallel collectives and send/recv) run and are tested under mpirun on
 * machines without a GPU. Test-only.
 *
 * "Device" buffers are host memory (engine/device/device_emulated.c), streams are NULL and ignored, and
 * every operation has completed, as far as the caller can tell, when it returns: wait_stream,
 * stream_wait_comm and synchronize have nothing to wait for. Unlike NCCL, any number of ranks
 * may share the one emulated GPU (device 0): that is the point of the emulation.
 *
 * Each communicator wraps its MPI group (group NULL: a one-member communicator "self" with no
 * MPI at all). Collectives are the group's MPI ones: fp32 as they are; bf16 widened to fp32
 * temporaries, summed or gathered in fp32, rounded back to bf16 (round to nearest even), which is
 * what NCCL's bf16 sums approximate (NCCL rounds after each addition of its ring or tree, so the
 * last bit may differ from a GPU run). One-member communicators never call MPI: all-reduce and
 * broadcast leave the buffer as it is, reduce-scatter and all-gather copy.
 *
 * Point-to-point has NCCL's group semantics without a group call: mp_nccl_p2p posts every send
 * to another rank (mp_comm_isend, which returns at once), copies each send to this rank itself
 * into the matching receive from itself (the k-th send to self feeds the k-th receive from self),
 * then receives from the other ranks in the order given (mp_comm_recv). No operation of the call
 * waits for another, so a ring where every rank posts {send to next, recv from previous} cannot
 * deadlock, whatever order the neighbours post them in. Messages to one peer arrive in the order
 * posted, here and across calls (MPI's non-overtaking rule).
 *
 * Sends are buffered, as NCCL's are. An NCCL send completes once its data is in the connection's
 * buffers on the peer (megabytes per channel), before the peer posts the matching receive; the
 * trainer's pipeline relies on it (a stage's call may hold two sends and one receive while its
 * neighbour's holds one of each, the second send being received in the neighbour's next call).
 * MPI completes a send that early only under its eager limit (4 KiB on shared memory), so each
 * send is copied into a block of its own and posted from there; the call returns without waiting
 * for it, and the caller may reuse its buffer at once. The blocks stay with the communicator
 * until MPI is done with them: the oldest are waited for (and freed) once more than
 * kMaxBufferedBytes or kMaxBufferedSends are outstanding, by which time their receives have long
 * been posted (NCCL too blocks a sender whose buffers are full), and the rest by
 * mp_nccl_comm_free. mp_nccl_comm_synchronize does not wait for them, as NCCL's does not wait for
 * the peer to receive a completed send.
 * Limitation: the emulated communicator shares its MPI group's messages, so a program that mixes
 * mp_comm_send/recv and mp_nccl_p2p between the same two ranks of one group must post them in the
 * same order on both sides (real NCCL keeps the two apart).
 *
 * The watchdog. engine/comm/comm.h already bounds every wait by the MPI world's timeout and turns a
 * hung peer into an error naming this rank, the operation, the peer or members, the group and
 * the bytes. Here, as in the real watchdog, the first operation that fails at run time (a timeout,
 * an MPI error, a member that never arrives at creation) "aborts" every communicator of the
 * process: its error ends in "; communicators aborted", mp_nccl_world_aborted turns true, and
 * every later call on any communicator fails at once, saying which failure aborted them. Bad
 * arguments are MP_ERR_INPUT naming the argument and the group, and abort nothing: the real
 * communicators' checks (comm_nccl_internal.h), and here also a send to this rank itself without
 * its matching receive.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_nccl.h"
#include "engine/comm/comm_nccl_internal.h"

enum {
  kWhatBytes = MP_NCCL_WHAT_BYTES,
  kReasonBytes = 1536,
};

/* NCCL's version for emulated builds: a made-up 0.0.1 (no real NCCL release), non-zero so that
 * mp_nccl_version() > 0 exactly when mp_nccl_available(), as the header promises. */
static const int kEmulatedVersion = 1;
static const double kDefaultTimeoutS = 300.0; /* without an MPI world, as the real one */
/* Buffered sends a communicator keeps before waiting for the oldest (see the head comment). */
static const size_t kMaxBufferedBytes = (size_t)64 << 20;
static const int kMaxBufferedSends = 1024;

/* A send posted from a copy, not yet waited for. */
typedef struct {
  mp_comm_request *request;
  void *copy; /* (bytes) what MPI sends; freed after the wait */
  size_t bytes;
  int peer;   /* world rank, for messages */
} buffered_send;

struct mp_nccl_world {
  mp_comm_world *mpi; /* NULL outside an MPI job */
  int rank;           /* world rank, for messages */
  int device;         /* always 0: the one emulated GPU */
  double timeout_s;   /* used without mpi */
};

struct mp_nccl_comm {
  mp_nccl_group_info info; /* name, members, rank: what checks and messages say */
  mp_nccl_world *world;
  mp_comm *group; /* the MPI group (not owned); NULL for "self" */
  buffered_send *sends; /* (num_sends) oldest first */
  int num_sends, sends_capacity;
  size_t sends_bytes;   /* the sum of their bytes */
};

/* Why the process's communicators were aborted; "" while they were not. */
static char g_abort_reason[kReasonBytes] = "";

/* ---------------------------------------------------------------------------------------------
 * Failures
 * ------------------------------------------------------------------------------------------- */

static mp_status usable(const mp_nccl_comm *comm, mp_error *err) {
  if (g_abort_reason[0] == '\0') return MP_OK;
  return mp_fail(err, MP_ERR_RUNTIME,
                 "rank %d: group %s (ranks %s) can no longer be used: the NCCL communicators of "
                 "this process were aborted after: %s; stop the run",
                 comm->world->rank, comm->info.name, comm->info.members_text, g_abort_reason);
}

/* `inner`, a message of engine/comm/comm.h, without its leading "rank N: " when N is this rank (the
 * prefix added here names the rank already). */
static const char *without_rank(const mp_nccl_world *world, const char *inner) {
  char prefix[32];
  int n = snprintf(prefix, sizeof prefix, "rank %d: ", world->rank);
  if (n > 0 && strncmp(inner, prefix, (size_t)n) == 0) return inner + n;
  return inner;
}

/* An engine/comm/comm.h call of `what` (e.g. "all-reduce in group dp (ranks 1,3)") that failed with
 * *inner. MP_ERR_INPUT (a count MPI cannot carry, say) is passed on with the prefix; a run-time
 * failure aborts every communicator, records why, and says so. */
static mp_status mpi_failed(const mp_nccl_world *world, const char *what, const mp_error *inner,
                            mp_error *err) {
  char message[kReasonBytes];
  snprintf(message, sizeof message, "rank %d: %s on emulated NCCL (over MPI): %s", world->rank,
           what, without_rank(world, inner->message));
  if (inner->status == MP_ERR_INPUT) return mp_fail(err, MP_ERR_INPUT, "%s", message);
  if (g_abort_reason[0] == '\0') {
    snprintf(g_abort_reason, sizeof g_abort_reason, "%s", message);
  }
  return mp_fail(err, MP_ERR_RUNTIME, "%s; communicators aborted", message);
}

/* ---------------------------------------------------------------------------------------------
 * Argument checks: comm_nccl_internal.h, shared with the real communicators
 * ------------------------------------------------------------------------------------------- */

/* The communicator's group for the checks; NULL for a NULL communicator. */
static const mp_nccl_group_info *info_of(const mp_nccl_comm *comm) {
  return comm != NULL ? &comm->info : NULL;
}

/* fp32 temporaries for bf16 operations. */
static mp_status alloc_floats(const mp_nccl_comm *comm, const char *operation, size_t count,
                              float **out, mp_error *err) {
  *out = malloc(count > 0 ? count * sizeof(float) : 1);
  if (*out == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: %s in group %s: out of host memory for %zu fp32 temporaries",
                   comm->world->rank, operation, comm->info.name, count);
  }
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The world
 * ------------------------------------------------------------------------------------------- */

bool mp_nccl_available(void) { return true; }

int mp_nccl_version(void) { return kEmulatedVersion; }

mp_status mp_nccl_world_create(mp_comm_world *mpi, int device, mp_nccl_world **out,
                               mp_error *err) {
  *out = NULL;
  const int rank = mpi != NULL ? mp_comm_world_rank(mpi) : 0;
  if (device != 0 && device != -1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: CUDA device %d does not exist (emulated CUDA has one device: 0)",
                   rank, device);
  }
  mp_nccl_world *world = calloc(1, sizeof *world);
  if (world == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the NCCL context");
  world->mpi = mpi;
  world->rank = rank;
  world->device = 0;
  world->timeout_s = kDefaultTimeoutS;
  *out = world;
  return MP_OK;
}

void mp_nccl_world_free(mp_nccl_world *world) { free(world); }

void mp_nccl_world_set_timeout(mp_nccl_world *world, double timeout_s) {
  if (!(timeout_s > 0)) return;
  world->timeout_s = timeout_s;
  if (world->mpi != NULL) mp_comm_world_set_timeout(world->mpi, timeout_s);
}

double mp_nccl_world_timeout(const mp_nccl_world *world) {
  return world->mpi != NULL ? mp_comm_world_timeout(world->mpi) : world->timeout_s;
}

int mp_nccl_world_device(const mp_nccl_world *world) { return world->device; }

bool mp_nccl_world_aborted(const mp_nccl_world *world) {
  (void)world;
  return g_abort_reason[0] != '\0';
}

/* ---------------------------------------------------------------------------------------------
 * Communicators
 * ------------------------------------------------------------------------------------------- */

static void release(mp_nccl_comm *comm) {
  free(comm->sends);
  mp_nccl_group_info_free(&comm->info);
  free(comm);
}

mp_status mp_nccl_comm_create(mp_nccl_world *world, mp_comm *group, mp_nccl_comm **out,
                              mp_error *err) {
  *out = NULL;
  if (world == NULL) return mp_fail(err, MP_ERR_INPUT, "NCCL communicator: NULL world");
  if (g_abort_reason[0] != '\0') {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: no NCCL communicator can be created: this process's were aborted "
                   "after: %s; stop the run",
                   world->rank, g_abort_reason);
  }
  mp_nccl_comm *comm = calloc(1, sizeof *comm);
  if (comm == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for an NCCL communicator",
                   world->rank);
  }
  const mp_status made = mp_nccl_group_info_init(&comm->info, world->rank, group, err);
  if (made != MP_OK) {
    free(comm);
    return made;
  }
  comm->world = world;
  comm->group = group;

  /* Creation is collective over the group, as ncclCommInitRank is: a barrier, bounded by the
   * timeout, so a member that never arrives is an error here too, and aborts. */
  if (group != NULL && comm->info.size > 1) {
    mp_error inner = MP_ERROR_INITIALIZER;
    if (mp_comm_barrier(group, &inner) != MP_OK) {
      char what[kWhatBytes];
      snprintf(what, sizeof what, "creating the NCCL communicator of group %s (ranks %s)",
               comm->info.name, comm->info.members_text);
      const mp_status status = mpi_failed(world, what, &inner, err);
      release(comm);
      return status;
    }
  }
  *out = comm;
  return MP_OK;
}

/* Waits for the oldest `count` buffered sends and frees their blocks. The first failure aborts
 * the communicators; the remaining of the `count` are still waited for (each wait is bounded by
 * the timeout from its post), so that no block is freed while MPI may read it. */
static mp_status wait_buffered(mp_nccl_comm *comm, int count, mp_error *err) {
  mp_error inner = MP_ERROR_INITIALIZER, ignored = MP_ERROR_INITIALIZER;
  mp_status status = MP_OK;
  int failed_peer = -1;
  size_t failed_bytes = 0;
  for (int i = 0; i < count; ++i) {
    buffered_send *send = &comm->sends[i];
    const mp_status done = mp_comm_wait(send->request, status == MP_OK ? &inner : &ignored);
    if (done != MP_OK && status == MP_OK) {
      status = done;
      failed_peer = send->peer;
      failed_bytes = send->bytes;
    }
    free(send->copy);
    comm->sends_bytes -= send->bytes;
  }
  memmove(comm->sends, comm->sends + count,
          (size_t)(comm->num_sends - count) * sizeof *comm->sends);
  comm->num_sends -= count;
  if (status == MP_OK) return MP_OK;
  char what[kWhatBytes];
  snprintf(what, sizeof what, "buffered send to rank %d in group %s (%zu bytes)", failed_peer,
           comm->info.name, failed_bytes);
  return mpi_failed(comm->world, what, &inner, err);
}

/* Waits for the communicator's buffered sends (under the timeout), then frees it; the MPI group
 * stays the caller's. After an abort the sends are left to MPI, blocks and all: the run is
 * stopping, and a wait on a lost peer would only delay it. */
void mp_nccl_comm_free(mp_nccl_comm *comm) {
  if (comm == NULL) return;
  if (g_abort_reason[0] == '\0' && comm->num_sends > 0) {
    mp_error ignored = MP_ERROR_INITIALIZER;
    (void)wait_buffered(comm, comm->num_sends, &ignored);
  }
  release(comm);
}

int mp_nccl_comm_rank(const mp_nccl_comm *comm) { return comm->info.rank; }
int mp_nccl_comm_size(const mp_nccl_comm *comm) { return comm->info.size; }
const char *mp_nccl_comm_name(const mp_nccl_comm *comm) { return comm->info.name; }

/* Emulated streams are NULL (engine/device/device_emulated.c). */
mp_cuda_stream mp_nccl_comm_stream(const mp_nccl_comm *comm) {
  (void)comm;
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Ordering and waiting: everything has completed already
 * ------------------------------------------------------------------------------------------- */

mp_status mp_nccl_comm_wait_stream(mp_nccl_comm *comm, mp_cuda_stream stream, mp_error *err) {
  (void)stream;
  MP_TRY(mp_nccl_check_comm(info_of(comm), "waiting for a stream", err));
  return usable(comm, err);
}

mp_status mp_nccl_stream_wait_comm(mp_cuda_stream stream, mp_nccl_comm *comm, mp_error *err) {
  (void)stream;
  MP_TRY(mp_nccl_check_comm(info_of(comm), "making a stream wait", err));
  return usable(comm, err);
}

/* Every operation here completes before its call returns: a mark only checks its slot. */
mp_status mp_nccl_comm_mark(mp_nccl_comm *comm, int slot, mp_error *err) {
  MP_TRY(mp_nccl_check_mark(info_of(comm), "marking", slot, err));
  return usable(comm, err);
}

mp_status mp_nccl_stream_wait_mark(mp_cuda_stream stream, mp_nccl_comm *comm, int slot,
                                   mp_error *err) {
  (void)stream;
  MP_TRY(mp_nccl_check_mark(info_of(comm), "making a stream wait", slot, err));
  return usable(comm, err);
}

mp_status mp_nccl_comm_synchronize(mp_nccl_comm *comm, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info_of(comm), "synchronize", err));
  return usable(comm, err);
}

/* ---------------------------------------------------------------------------------------------
 * Point to point
 * ------------------------------------------------------------------------------------------- */

/* Beyond the shared checks: sends to this rank itself must pair, in order, with receives from it,
 * byte counts equal (NCCL would hang on an unmatched one; here it is refused before anything is
 * posted). what describes the call for messages. */
static mp_status check_self_pairs(const mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count,
                                  const char *what, mp_error *err) {
  int self_sends = 0, self_recvs = 0;
  for (int i = 0; i < count; ++i) {
    if (ops[i].peer != comm->info.rank) continue;
    if (ops[i].kind == MP_NCCL_SEND) {
      ++self_sends;
    } else {
      ++self_recvs;
    }
  }
  if (self_sends != self_recvs) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s: %d send%s to this rank itself but %d receive%s from it; each "
                   "send to itself needs a receive from itself in the same call",
                   comm->world->rank, what, self_sends, self_sends == 1 ? "" : "s", self_recvs,
                   self_recvs == 1 ? "" : "s");
  }
  for (int s = 0, r = 0, pair = 0; pair < self_sends; ++pair, ++s, ++r) {
    while (ops[s].kind != MP_NCCL_SEND || ops[s].peer != comm->info.rank) ++s;
    while (ops[r].kind != MP_NCCL_RECV || ops[r].peer != comm->info.rank) ++r;
    if (ops[s].bytes != ops[r].bytes) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d: %s: send %d to this rank itself has %zu bytes but its receive "
                     "(operation %d) has %zu",
                     comm->world->rank, what, s, ops[s].bytes, r, ops[r].bytes);
    }
  }
  return MP_OK;
}

mp_status mp_nccl_p2p(mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count, mp_error *err) {
  char what[kWhatBytes];
  size_t bytes = 0;
  MP_TRY(mp_nccl_check_p2p(info_of(comm), ops, count, what, sizeof what, &bytes, err));
  if (count == 0) return MP_OK;
  MP_TRY(check_self_pairs(comm, ops, count, what, err));
  MP_TRY(usable(comm, err));

  /* Room for this call's sends; past the limits, the oldest buffered sends are waited for. */
  int new_sends = 0;
  size_t new_bytes = 0;
  for (int i = 0; i < count; ++i) {
    if (ops[i].kind != MP_NCCL_SEND || ops[i].peer == comm->info.rank) continue;
    ++new_sends;
    new_bytes += ops[i].bytes;
  }
  int oldest = 0;
  size_t kept_bytes = comm->sends_bytes;
  while (oldest < comm->num_sends &&
         (comm->num_sends - oldest + new_sends > kMaxBufferedSends ||
          kept_bytes + new_bytes > kMaxBufferedBytes)) {
    kept_bytes -= comm->sends[oldest++].bytes;
  }
  if (oldest > 0) MP_TRY(wait_buffered(comm, oldest, err));
  if (comm->num_sends + new_sends > comm->sends_capacity) {
    int capacity = comm->sends_capacity > 0 ? comm->sends_capacity : 16;
    while (capacity < comm->num_sends + new_sends) capacity *= 2;
    buffered_send *grown = realloc(comm->sends, (size_t)capacity * sizeof *grown);
    if (grown == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "rank %d: %s: out of memory", comm->world->rank, what);
    }
    comm->sends = grown;
    comm->sends_capacity = capacity;
  }
  mp_error inner = MP_ERROR_INITIALIZER;
  mp_status status = MP_OK;

  /* 1. Every send to another rank, copied and posted at once; not waited for (see the head
   * comment). */
  for (int i = 0; i < count && status == MP_OK; ++i) {
    const mp_nccl_p2p_op *op = &ops[i];
    if (op->kind != MP_NCCL_SEND || op->peer == comm->info.rank) continue;
    buffered_send *send = &comm->sends[comm->num_sends];
    send->copy = malloc(op->bytes > 0 ? op->bytes : 1);
    if (send->copy == NULL) {
      status = mp_fail(&inner, MP_ERR_RUNTIME, "out of host memory for a send of %zu bytes",
                       op->bytes);
      break;
    }
    if (op->bytes > 0) memcpy(send->copy, op->buffer, op->bytes);
    send->bytes = op->bytes;
    send->peer = comm->info.members[op->peer];
    status = mp_comm_isend(comm->group, send->copy, op->bytes, op->peer, &send->request, &inner);
    if (status != MP_OK) break; /* the copy stays: chunks already posted may still read it */
    comm->sends_bytes += op->bytes;
    comm->num_sends++;
  }
  /* 2. Sends to itself, into the matching receives from itself. */
  for (int s = 0, r = 0; status == MP_OK; ++s, ++r) {
    while (s < count && (ops[s].kind != MP_NCCL_SEND || ops[s].peer != comm->info.rank)) ++s;
    while (r < count && (ops[r].kind != MP_NCCL_RECV || ops[r].peer != comm->info.rank)) ++r;
    if (s >= count || r >= count) break;
    if (ops[r].bytes > 0 && ops[r].buffer != ops[s].buffer) {
      memmove(ops[r].buffer, ops[s].buffer, ops[r].bytes);
    }
  }
  /* 3. Receives from the other ranks, in the order given. */
  for (int i = 0; i < count && status == MP_OK; ++i) {
    const mp_nccl_p2p_op *op = &ops[i];
    if (op->kind != MP_NCCL_RECV || op->peer == comm->info.rank) continue;
    status = mp_comm_recv(comm->group, op->buffer, op->bytes, op->peer, &inner);
  }
  if (status != MP_OK) return mpi_failed(comm->world, what, &inner, err);
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Collectives
 * ------------------------------------------------------------------------------------------- */

/* What every collective does once its arguments are checked, before MPI: nothing for no elements,
 * a communicator aborted by the watchdog refused, and a one-rank group's result, which is its input
 * (`own_bytes` of it copied to `own_output`), made here. *left_to_mpi is false when that was all. */
static mp_status collective_begin(const mp_nccl_comm *comm, size_t total_elements,
                                  const void *input, void *own_output, size_t own_bytes,
                                  bool *left_to_mpi, mp_error *err) {
  *left_to_mpi = false;
  if (total_elements == 0) return MP_OK;
  MP_TRY(usable(comm, err));
  if (comm->info.size == 1) {
    if (input != NULL && own_output != input && own_bytes > 0) {
      memmove(own_output, input, own_bytes);
    }
    return MP_OK;
  }
  *left_to_mpi = true;
  return MP_OK;
}

/* One of comm.h's fp32 collectives (count: its count argument) run on NCCL's dtype: bf16 buffers
 * go through fp32 copies of input_count and output_count elements (bf16 -> fp32 -> bf16 is exact,
 * so a gather moves the bits unchanged, NaNs aside, and a sum is rounded to bf16 once). */
typedef mp_status (*fp32_collective)(mp_comm *group, const float *input, float *output,
                                     size_t count, mp_error *err);
static mp_status over_floats(mp_nccl_comm *comm, const char *operation, fp32_collective run,
                             const void *input, size_t input_count, void *output,
                             size_t output_count, size_t count, mp_nccl_dtype dtype,
                             mp_error *err) {
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, operation, what, sizeof what);
  mp_error inner = MP_ERROR_INITIALIZER;
  mp_status status;
  if (dtype == MP_NCCL_FLOAT32) {
    status = run(comm->group, input, output, count, &inner);
  } else {
    float *wide = NULL;
    MP_TRY(alloc_floats(comm, operation, input_count + output_count, &wide, err));
    mp_bf16_to_floats(wide, input, input_count);
    status = run(comm->group, wide, wide + input_count, count, &inner);
    if (status == MP_OK) mp_bf16_from_floats(output, wide + input_count, output_count);
    free(wide);
  }
  if (status != MP_OK) return mpi_failed(comm->world, what, &inner, err);
  return MP_OK;
}

mp_status mp_nccl_all_reduce_sum(mp_nccl_comm *comm, void *buffer, size_t count,
                                 mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_all_reduce(info_of(comm), buffer, count, dtype, err));
  bool left_to_mpi; /* one member: the sum is the buffer */
  MP_TRY(collective_begin(comm, count, buffer, buffer, 0, &left_to_mpi, err));
  if (!left_to_mpi) return MP_OK;
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "all-reduce", what, sizeof what);
  mp_error inner = MP_ERROR_INITIALIZER;
  mp_status status;
  if (dtype == MP_NCCL_FLOAT32) {
    status = mp_comm_all_reduce_sum_f32(comm->group, buffer, count, &inner);
  } else {
    float *wide = NULL;
    MP_TRY(alloc_floats(comm, "all-reduce", count, &wide, err));
    mp_bf16_to_floats(wide, buffer, count);
    status = mp_comm_all_reduce_sum_f32(comm->group, wide, count, &inner);
    if (status == MP_OK) mp_bf16_from_floats(buffer, wide, count);
    free(wide);
  }
  if (status != MP_OK) return mpi_failed(comm->world, what, &inner, err);
  return MP_OK;
}

mp_status mp_nccl_reduce_scatter_sum(mp_nccl_comm *comm, const void *input, void *output,
                                     size_t count, mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_reduce_scatter(info_of(comm), input, output, count, dtype, err));
  bool left_to_mpi;
  MP_TRY(collective_begin(comm, count, input, output, count * mp_nccl_dtype_bytes(dtype),
                          &left_to_mpi, err));
  if (!left_to_mpi) return MP_OK;
  return over_floats(comm, "reduce-scatter", mp_comm_reduce_scatter_sum_f32, input,
                     count * (size_t)comm->info.size, output, count, count, dtype, err);
}

mp_status mp_nccl_reduce_scatter_v_sum_f32(mp_nccl_comm *comm, const float *input, float *output,
                                           const size_t *counts, mp_error *err) {
  size_t total = 0;
  MP_TRY(mp_nccl_check_reduce_scatter_v(info_of(comm), input, output, counts, &total, err));
  bool left_to_mpi;
  MP_TRY(collective_begin(comm, total, input, output, counts[comm->info.rank] * sizeof(float),
                          &left_to_mpi, err));
  if (!left_to_mpi) return MP_OK;
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "reduce-scatter", what, sizeof what);
  mp_error inner = MP_ERROR_INITIALIZER;
  const mp_status status = mp_comm_reduce_scatter_v_sum_f32(comm->group, input, output, counts,
                                                            &inner);
  if (status != MP_OK) return mpi_failed(comm->world, what, &inner, err);
  return MP_OK;
}

mp_status mp_nccl_all_gather(mp_nccl_comm *comm, const void *input, void *output, size_t count,
                             mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_all_gather(info_of(comm), input, output, count, dtype, err));
  bool left_to_mpi;
  MP_TRY(collective_begin(comm, count, input, output, count * mp_nccl_dtype_bytes(dtype),
                          &left_to_mpi, err));
  if (!left_to_mpi) return MP_OK;
  return over_floats(comm, "all-gather", mp_comm_all_gather_f32, input, count, output,
                     count * (size_t)comm->info.size, count, dtype, err);
}

mp_status mp_nccl_all_gather_v(mp_nccl_comm *comm, const void *input, void *output,
                               const size_t *counts, mp_nccl_dtype dtype, mp_error *err) {
  size_t total = 0;
  MP_TRY(mp_nccl_check_all_gather_v(info_of(comm), input, output, counts, dtype, &total, err));
  const size_t elem = mp_nccl_dtype_bytes(dtype);
  size_t mine_at = 0;
  for (int r = 0; r < comm->info.rank; ++r) mine_at += counts[r];
  const size_t mine = counts[comm->info.rank];
  char *out = output;
  bool left_to_mpi; /* input NULL: this rank's part is already in place */
  MP_TRY(collective_begin(comm, total, input, out + mine_at * elem, mine * elem, &left_to_mpi,
                          err));
  if (!left_to_mpi) return MP_OK;
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "all-gather", what, sizeof what);
  /* Emulated device memory is host memory: the gather runs over MPI in place in an fp32 copy
   * (bf16 -> fp32 -> bf16 is exact: the bits go through unchanged, NaNs aside). */
  float *wide = NULL;
  MP_TRY(alloc_floats(comm, "all-gather", total, &wide, err));
  const void *own = input != NULL ? input : out + mine_at * elem;
  if (dtype == MP_NCCL_FLOAT32) {
    memcpy(wide + mine_at, own, mine * sizeof(float));
  } else {
    mp_bf16_to_floats(wide + mine_at, own, mine);
  }
  mp_error inner = MP_ERROR_INITIALIZER;
  const mp_status status = mp_comm_all_gather_v_f32(comm->group, NULL, wide, counts, &inner);
  if (status == MP_OK && dtype == MP_NCCL_FLOAT32) memcpy(out, wide, total * sizeof(float));
  if (status == MP_OK && dtype != MP_NCCL_FLOAT32) mp_bf16_from_floats(output, wide, total);
  free(wide);
  if (status != MP_OK) return mpi_failed(comm->world, what, &inner, err);
  return MP_OK;
}

mp_status mp_nccl_broadcast(mp_nccl_comm *comm, void *buffer, size_t bytes, int root,
                            mp_error *err) {
  MP_TRY(mp_nccl_check_broadcast(info_of(comm), buffer, bytes, root, err));
  bool left_to_mpi; /* one member: it is the root */
  MP_TRY(collective_begin(comm, bytes, buffer, buffer, 0, &left_to_mpi, err));
  if (!left_to_mpi) return MP_OK;
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "broadcast", what, sizeof what);
  mp_error inner = MP_ERROR_INITIALIZER;
  if (mp_comm_broadcast(comm->group, buffer, bytes, root, &inner) != MP_OK) {
    return mpi_failed(comm->world, what, &inner, err);
  }
  return MP_OK;
}
