/*
 * engine/comm/comm_nccl_cuda.cu — engine/comm/comm_nccl.h over NCCL: non-blocking communicators, one
 * communication stream each, every wait polled against a deadline by the watchdog.
 *
 * Bookkeeping. Each communicator keeps the operations it has enqueued and not yet seen complete
 * (pending_op: a CUDA event recorded after the operation on the communication stream, the
 * operation's description for messages, its bytes and when it was posted). Waits walk them in
 * order. Completed events go back to a free list; posting reaps completed operations first, so a
 * caller that orders streams with events and rarely synchronises does not grow the list.
 *
 * The watchdog is not a thread: every wait is a polling loop (cudaEventQuery, or the
 * communicator's state, then ncclCommGetAsyncError), spinning with sched_yield for its first
 * second and then sleeping with a backoff up to 1 ms, against the operation's deadline (the
 * communicators' one wait, poll_wait.h). On a timeout or an asynchronous NCCL error it aborts every
 * communicator of the process (the list g_comms), because a rank that stops here leaves its peers
 * in other groups waiting too.
 *
 * Non-blocking communicators (config.blocking = 0) return ncclInProgress from calls that have not
 * finished (creation, ncclGroupEnd, a collective whose launch is deferred); such a communicator
 * must be polled until it leaves that state before the next call on it, and before the event that
 * marks the operation's end is recorded (the operation may not be on the stream yet).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_nccl.h"
#include "engine/comm/comm_nccl_internal.h"
#include "engine/comm/poll_wait.h"
#include "layers/cuda_check.cuh"

namespace {

const double kSpinSeconds = 1.0;  // poll without sleeping this long, then sleep between polls
const double kDefaultTimeoutS = 300.0;
enum { kWhatBytes = MP_NCCL_WHAT_BYTES, kReasonBytes = 1024 };

struct pending_op {
  cudaEvent_t event;       // recorded after the operation on the communication stream
  char what[kWhatBytes];   // "all-reduce in group dp (ranks 1,3)", "send to rank 2 in group pp"
  size_t bytes;            // for messages
  double posted_s, deadline_s;
};

}  // namespace

struct mp_nccl_world {
  mp_comm_world *mpi;  // NULL outside an MPI job
  int rank;            // world rank, for messages
  int device;
  double timeout_s;    // used without mpi
};

struct mp_nccl_comm {
  mp_nccl_group_info info;  // name, members, rank: what checks and messages say
  mp_nccl_world *world;
  ncclComm_t nccl;     // NULL once aborted
  cudaStream_t stream; // the communication stream
  cudaEvent_t order;   // scratch event for mp_nccl_comm_wait_stream / mp_nccl_stream_wait_comm
  cudaEvent_t marks[MP_NCCL_MARKS];  // mp_nccl_comm_mark's
  pending_op *pending; // (num_pending) oldest first
  int num_pending, pending_capacity;
  cudaEvent_t *spare;  // (num_spare) events ready for reuse
  int num_spare, spare_capacity;
  mp_nccl_comm *next;  // g_comms
};

namespace {

mp_nccl_comm *g_comms = NULL;          // every live communicator of the process
char g_abort_reason[kReasonBytes] = "";  // why they were aborted; "" while they were not

double world_timeout(const mp_nccl_world *world) {
  return world->mpi != NULL ? mp_comm_world_timeout(world->mpi) : world->timeout_s;
}

const char *nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t";
  }
}

// NCCL's text for a failure: its error string, the result's name, and the last error's detail, with
// a hint for the refusal that testers meet first.
void nccl_describe(ncclResult_t result, char *text, size_t capacity) {
  const char *detail = ncclGetLastError(NULL);
  if (detail == NULL) detail = "";
  const char *hint = strstr(detail, "Duplicate GPU") != NULL
                         ? " (NCCL needs one GPU per rank; to share a GPU between ranks for "
                           "testing use the MPI communicators, which stage GPU buffers through the "
                           "host)"
                         : "";
  snprintf(text, capacity, "%s (%s)%s%s%s", ncclGetErrorString(result), nccl_result_name(result),
           detail[0] != '\0' ? ": " : "", detail, hint);
}

// Aborts every NCCL communicator of the process (once) and records why; later calls on any of
// them fail with the reason.
void abort_all(const char *reason) {
  if (g_abort_reason[0] == '\0') snprintf(g_abort_reason, sizeof g_abort_reason, "%s", reason);
  for (mp_nccl_comm *comm = g_comms; comm != NULL; comm = comm->next) {
    if (comm->nccl == NULL) continue;
    (void)ncclCommAbort(comm->nccl);  // ncclSuccess or ncclInProgress; the handle is gone either way
    comm->nccl = NULL;
  }
}

// Fills err with `message` + "; communicators aborted", aborting them all first.
mp_status fail_and_abort(mp_error *err, const char *message) {
  abort_all(message);
  return mp_fail(err, MP_ERR_RUNTIME, "%s; communicators aborted", message);
}

mp_status usable(const mp_nccl_comm *comm, mp_error *err) {
  if (g_abort_reason[0] == '\0' && comm->nccl != NULL) return MP_OK;
  return mp_fail(err, MP_ERR_RUNTIME,
                 "rank %d: group %s (ranks %s) can no longer be used: the NCCL communicators of "
                 "this process were aborted after: %s; stop the run",
                 comm->world->rank, comm->info.name, comm->info.members_text,
                 g_abort_reason[0] != '\0' ? g_abort_reason : "an earlier failure");
}

// A CUDA or NCCL call that failed, with this rank, the call, file and line. Every failure on a
// communicator aborts them all: its state is unknown, and its peers would wait on it.
mp_status cuda_failed(const mp_nccl_world *world, cudaError_t status, const char *call,
                      const char *file, int line, bool abort, mp_error *err) {
  char message[kReasonBytes];
  snprintf(message, sizeof message, "rank %d: %s failed: %s (%s) at %s:%d", world->rank, call,
           cudaGetErrorString(status), cudaGetErrorName(status), file, line);
  cudaGetLastError();  // clear a non-sticky error
  if (abort) return fail_and_abort(err, message);
  return mp_fail(err, MP_ERR_RUNTIME, "%s", message);
}

mp_status nccl_failed(const mp_nccl_world *world, ncclResult_t result, const char *call,
                      const char *file, int line, mp_error *err) {
  char text[kReasonBytes / 2], message[kReasonBytes];
  nccl_describe(result, text, sizeof text);
  snprintf(message, sizeof message, "rank %d: %s failed: %s at %s:%d", world->rank, call, text,
           file, line);
  return fail_and_abort(err, message);
}

}  // namespace

// Checks: CUDA_TRY / NCCL_TRY return the failure (naming the call, file and line) from the
// enclosing function, which has `err` in scope. NCCL_TRY accepts ncclInProgress: the caller then
// settles the communicator. The _KEEP form of CUDA_TRY does not abort the communicators (for calls
// outside any communicator's life).
#define CUDA_TRY(world, call)                                                               \
  do {                                                                                      \
    cudaError_t mp_cuda_status_ = (call);                                                   \
    if (mp_cuda_status_ != cudaSuccess) {                                                   \
      return cuda_failed((world), mp_cuda_status_, #call, __FILE__, __LINE__, true, err);   \
    }                                                                                       \
  } while (0)
#define CUDA_TRY_KEEP(world, call)                                                          \
  do {                                                                                      \
    cudaError_t mp_cuda_status_ = (call);                                                   \
    if (mp_cuda_status_ != cudaSuccess) {                                                   \
      return cuda_failed((world), mp_cuda_status_, #call, __FILE__, __LINE__, false, err);  \
    }                                                                                       \
  } while (0)
#define NCCL_TRY(world, call)                                                               \
  do {                                                                                      \
    ncclResult_t mp_nccl_status_ = (call);                                                  \
    if (mp_nccl_status_ != ncclSuccess && mp_nccl_status_ != ncclInProgress) {              \
      return nccl_failed((world), mp_nccl_status_, #call, __FILE__, __LINE__, err);        \
    }                                                                                       \
  } while (0)

namespace {

// " (4096 bytes)" for messages about an operation; "" for creation, which moves no data.
struct bytes_note {
  char text[48];
};
bytes_note bytes_text(size_t bytes) {
  bytes_note note = {""};
  if (bytes > 0) snprintf(note.text, sizeof note.text, " (%zu bytes)", bytes);
  return note;
}

// A wait for an operation of comm under mp_poll_wait: until `event` completes (NULL: until the
// non-blocking communicator has finished its last call, state ncclSuccess), with the
// communicator's asynchronous error polled too. what, size_note (" (4096 bytes)" or "") and
// posted_s are for messages.
struct op_poll {
  mp_nccl_comm *comm;
  cudaEvent_t event;
  const char *what;
  const char *size_note;
  double posted_s;
};

// One poll (an mp_poll_fn): the event if any, then the communicator's state. A failure (of the
// event, or an asynchronous NCCL error) aborts every communicator, naming the operation.
mp_status poll_op(void *context, bool *done, mp_error *err) {
  const op_poll *op = static_cast<const op_poll *>(context);
  mp_nccl_comm *comm = op->comm;
  *done = false;
  if (op->event != NULL) {
    cudaError_t status = cudaEventQuery(op->event);
    if (status == cudaSuccess) {
      *done = true;
      return MP_OK;
    }
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error; keep it from the caller's next check
    } else {
      char call[kWhatBytes + 64];
      snprintf(call, sizeof call, "cudaEventQuery (the end of %s)", op->what);
      return cuda_failed(comm->world, status, call, __FILE__, __LINE__, true, err);
    }
  }
  if (comm->nccl == NULL) return usable(comm, err);
  ncclResult_t state = ncclSuccess;
  NCCL_TRY(comm->world, ncclCommGetAsyncError(comm->nccl, &state));
  if (state == ncclSuccess || state == ncclInProgress) {
    *done = op->event == NULL && state == ncclSuccess;
    return MP_OK;
  }
  char text[kReasonBytes / 2], message[kReasonBytes];
  nccl_describe(state, text, sizeof text);
  snprintf(message, sizeof message, "rank %d: %s failed on NCCL after %.1f s%s: %s",
           comm->world->rank, op->what, mp_poll_now_s() - op->posted_s, op->size_note, text);
  return fail_and_abort(err, message);
}

// Polls op (poll_op) against deadline_s, the watchdog's wait; past it, aborts every communicator.
mp_status wait_polled(const op_poll *op, double deadline_s, mp_error *err) {
  bool timed_out = false;
  MP_TRY(mp_poll_wait(poll_op, const_cast<op_poll *>(op), deadline_s, kSpinSeconds, &timed_out,
                      err));
  if (!timed_out) return MP_OK;
  char message[kReasonBytes];
  snprintf(message, sizeof message, "rank %d: %s timed out after %.1f s%s on NCCL",
           op->comm->world->rank, op->what, deadline_s - op->posted_s, op->size_note);
  return fail_and_abort(err, message);
}

// Waits until the non-blocking communicator has finished its last call (state ncclSuccess), or
// fails (its asynchronous error, or the deadline) naming `what`; both abort every communicator.
mp_status settle(mp_nccl_comm *comm, const char *what, size_t bytes, double posted_s,
                 double deadline_s, mp_error *err) {
  const bytes_note note = bytes_text(bytes);
  const op_poll op = {comm, NULL, what, note.text, posted_s};
  return wait_polled(&op, deadline_s, err);
}

// Waits for one posted operation: its event, polled with the communicator's asynchronous error,
// against its deadline.
mp_status wait_op(mp_nccl_comm *comm, const pending_op *pending, mp_error *err) {
  char note[48];
  snprintf(note, sizeof note, " (%zu bytes)", pending->bytes);
  const op_poll op = {comm, pending->event, pending->what, note, pending->posted_s};
  return wait_polled(&op, pending->deadline_s, err);
}

// Moves the completed operations at the front of the list to the spare events.
void reap(mp_nccl_comm *comm) {
  int done = 0;
  while (done < comm->num_pending && cudaEventQuery(comm->pending[done].event) == cudaSuccess) {
    comm->spare[comm->num_spare++] = comm->pending[done].event;
    ++done;
  }
  cudaGetLastError();
  if (done == 0) return;
  memmove(comm->pending, comm->pending + done,
          (size_t)(comm->num_pending - done) * sizeof *comm->pending);
  comm->num_pending -= done;
}

// Room for one more pending operation (and its event in the spare list later).
mp_status reserve(mp_nccl_comm *comm, mp_error *err) {
  if (comm->num_pending + comm->num_spare + 1 <= comm->pending_capacity &&
      comm->num_pending + comm->num_spare + 1 <= comm->spare_capacity) {
    return MP_OK;
  }
  int capacity = comm->pending_capacity > 0 ? comm->pending_capacity * 2 : 16;
  pending_op *pending = (pending_op *)realloc(comm->pending, (size_t)capacity * sizeof *pending);
  if (pending == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for NCCL bookkeeping");
  comm->pending = pending;
  comm->pending_capacity = capacity;
  cudaEvent_t *spare = (cudaEvent_t *)realloc(comm->spare, (size_t)capacity * sizeof *spare);
  if (spare == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for NCCL bookkeeping");
  comm->spare = spare;
  comm->spare_capacity = capacity;
  return MP_OK;
}

// The start of an operation: the communicator is usable, completed operations are reaped.
mp_status begin(mp_nccl_comm *comm, mp_error *err) {
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaSetDevice(comm->world->device));
  reap(comm);
  return reserve(comm, err);
}

// The end of an operation whose NCCL calls were accepted: settles the communicator (a deferred
// launch reaches the stream), then records the operation's end on the stream.
mp_status finish(mp_nccl_comm *comm, const char *what, size_t bytes, double posted_s,
                 mp_error *err) {
  const double deadline_s = posted_s + world_timeout(comm->world);
  MP_TRY(settle(comm, what, bytes, posted_s, deadline_s, err));
  cudaEvent_t event = NULL;
  if (comm->num_spare > 0) {
    event = comm->spare[--comm->num_spare];
  } else {
    CUDA_TRY(comm->world, cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  cudaError_t recorded = cudaEventRecord(event, comm->stream);
  if (recorded != cudaSuccess) {
    cudaEventDestroy(event);
    return cuda_failed(comm->world, recorded, "cudaEventRecord(event, comm->stream)", __FILE__,
                       __LINE__, true, err);
  }
  pending_op *op = &comm->pending[comm->num_pending++];
  op->event = event;
  snprintf(op->what, sizeof op->what, "%s", what);
  op->bytes = bytes;
  op->posted_s = posted_s;
  op->deadline_s = deadline_s;
  return MP_OK;
}

// --- argument checks (MP_ERR_INPUT, nothing posted): comm_nccl_internal.h, shared with the
// emulated communicators ---

// The communicator's group for the checks; NULL for a NULL communicator.
const mp_nccl_group_info *info_of(const mp_nccl_comm *comm) {
  return comm != NULL ? &comm->info : NULL;
}

// The checks' test of a buffer: device (or managed) memory, as NCCL needs; it faults on host
// memory.
bool is_device_memory(const void *buffer) {
  cudaPointerAttributes attributes;
  cudaError_t status = cudaPointerGetAttributes(&attributes, buffer);
  if (status != cudaSuccess) cudaGetLastError();
  return status == cudaSuccess &&
         (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
}

ncclDataType_t dtype_nccl(mp_nccl_dtype dtype) {
  return dtype == MP_NCCL_BFLOAT16 ? ncclBfloat16 : ncclFloat32;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The world

extern "C" bool mp_nccl_available(void) { return true; }

extern "C" int mp_nccl_version(void) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

extern "C" mp_status mp_nccl_world_create(mp_comm_world *mpi, int device, mp_nccl_world **out,
                                          mp_error *err) {
  *out = NULL;
  mp_nccl_world probe = {mpi, mpi != NULL ? mp_comm_world_rank(mpi) : 0, device, kDefaultTimeoutS};
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    char reason[256];
    snprintf(reason, sizeof reason, "%s", status != cudaSuccess ? cudaGetErrorString(status)
                                                                : "no CUDA device visible");
    cudaGetLastError();
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: no GPU visible (%s): NCCL communicators need one GPU per rank; on a "
                   "machine without a GPU use the MPI communicators",
                   probe.rank, reason);
  }
  if (device < -1 || device >= count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: CUDA device %d does not exist (%d visible: 0 .. %d)", probe.rank,
                   device, count, count - 1);
  }
  if (device == -1) {
    CUDA_TRY_KEEP(&probe, cudaGetDevice(&probe.device));
  }
  CUDA_TRY_KEEP(&probe, cudaSetDevice(probe.device));
  mp_nccl_world *world = (mp_nccl_world *)calloc(1, sizeof *world);
  if (world == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the NCCL context");
  *world = probe;
  *out = world;
  return MP_OK;
}

extern "C" void mp_nccl_world_free(mp_nccl_world *world) { free(world); }

extern "C" void mp_nccl_world_set_timeout(mp_nccl_world *world, double timeout_s) {
  if (!(timeout_s > 0)) return;
  world->timeout_s = timeout_s;
  if (world->mpi != NULL) mp_comm_world_set_timeout(world->mpi, timeout_s);
}

extern "C" double mp_nccl_world_timeout(const mp_nccl_world *world) {
  return world_timeout(world);
}

extern "C" int mp_nccl_world_device(const mp_nccl_world *world) { return world->device; }

extern "C" bool mp_nccl_world_aborted(const mp_nccl_world *world) {
  (void)world;
  return g_abort_reason[0] != '\0';
}

// ---------------------------------------------------------------------------------------------
// Communicators

namespace {

void unregister(mp_nccl_comm *comm) {
  for (mp_nccl_comm **link = &g_comms; *link != NULL; link = &(*link)->next) {
    if (*link == comm) {
      *link = comm->next;
      return;
    }
  }
}

// Releases what the communicator holds besides its NCCL handle.
void release(mp_nccl_comm *comm) {
  unregister(comm);
  for (int i = 0; i < comm->num_pending; ++i) cudaEventDestroy(comm->pending[i].event);
  for (int i = 0; i < comm->num_spare; ++i) cudaEventDestroy(comm->spare[i]);
  if (comm->order != NULL) cudaEventDestroy(comm->order);
  for (int i = 0; i < MP_NCCL_MARKS; ++i) {
    if (comm->marks[i] != NULL) cudaEventDestroy(comm->marks[i]);
  }
  if (comm->stream != NULL) cudaStreamDestroy(comm->stream);
  cudaGetLastError();
  free(comm->pending);
  free(comm->spare);
  mp_nccl_group_info_free(&comm->info);
  free(comm);
}

// What group rank 0 broadcasts: the id, or that it could not make one (so nobody waits for it).
struct id_message {
  int ok;
  ncclUniqueId id;
};

mp_status create(mp_nccl_world *world, mp_comm *group, mp_nccl_comm *comm, mp_error *err) {
  CUDA_TRY_KEEP(world, cudaSetDevice(world->device));
  CUDA_TRY_KEEP(world, cudaEventCreateWithFlags(&comm->order, cudaEventDisableTiming));
  for (int i = 0; i < MP_NCCL_MARKS; ++i) {
    CUDA_TRY_KEEP(world, cudaEventCreateWithFlags(&comm->marks[i], cudaEventDisableTiming));
  }
  int lowest = 0, highest = 0;
  CUDA_TRY_KEEP(world, cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  CUDA_TRY_KEEP(world, cudaStreamCreateWithPriority(&comm->stream, cudaStreamNonBlocking, highest));

  // Group rank 0 makes the id; the group's MPI communicator carries it to the others.
  id_message message;
  memset(&message, 0, sizeof message);
  mp_error local = MP_ERROR_INITIALIZER;
  if (comm->info.rank == 0) {
    ncclResult_t made = ncclGetUniqueId(&message.id);
    message.ok = made == ncclSuccess;
    if (!message.ok) {
      char text[kReasonBytes / 2];
      nccl_describe(made, text, sizeof text);
      mp_fail(&local, MP_ERR_RUNTIME, "rank %d: ncclGetUniqueId(&message.id) failed: %s at %s:%d",
              world->rank, text, __FILE__, __LINE__);
    }
  }
  if (group != NULL && comm->info.size > 1) {
    mp_error broadcast = MP_ERROR_INITIALIZER;
    if (mp_comm_broadcast(group, &message, sizeof message, 0, &broadcast) != MP_OK) {
      // A member that does not arrive stops the run: the other groups' peers are told by abort.
      char reason[kReasonBytes];
      snprintf(reason, sizeof reason,
               "rank %d: creating the NCCL communicator of group %s (ranks %s): %s", world->rank,
               comm->info.name, comm->info.members_text, broadcast.message);
      return fail_and_abort(err, reason);
    }
  }
  if (!message.ok) {
    if (comm->info.rank == 0) return mp_fail(err, local.status, "%s", local.message);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: creating the NCCL communicator of group %s (ranks %s): its rank 0 "
                   "could not make an NCCL id (see its message)",
                   world->rank, comm->info.name, comm->info.members_text);
  }

  // Join, without blocking: the communicator is polled to readiness under the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = comm->info.name;
  const double posted_s = mp_poll_now_s();
  comm->next = g_comms;  // registered first: an abort while it forms must reach it too
  g_comms = comm;
  const int size = comm->info.size, rank = comm->info.rank;
  ncclResult_t joined = ncclCommInitRankConfig(&comm->nccl, size, message.id, rank, &config);
  if (joined != ncclSuccess && joined != ncclInProgress) {
    char text[kReasonBytes / 2], reason[kReasonBytes];
    nccl_describe(joined, text, sizeof text);
    snprintf(reason, sizeof reason,
             "rank %d: creating the NCCL communicator of group %s (ranks %s): "
             "ncclCommInitRankConfig(&comm->nccl, size, message.id, rank, &config) failed: %s at "
             "%s:%d",
             world->rank, comm->info.name, comm->info.members_text, text, __FILE__, __LINE__);
    if (comm->nccl != NULL) (void)ncclCommAbort(comm->nccl);
    comm->nccl = NULL;
    return mp_fail(err, MP_ERR_RUNTIME, "%s", reason);
  }
  char what[kWhatBytes];
  snprintf(what, sizeof what, "creating the NCCL communicator of group %s (ranks %s)",
           comm->info.name, comm->info.members_text);
  return settle(comm, what, 0, posted_s, posted_s + world_timeout(world), err);
}

}  // namespace

extern "C" mp_status mp_nccl_comm_create(mp_nccl_world *world, mp_comm *group, mp_nccl_comm **out,
                                         mp_error *err) {
  *out = NULL;
  if (world == NULL) return mp_fail(err, MP_ERR_INPUT, "NCCL communicator: NULL world");
  if (g_abort_reason[0] != '\0') {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: no NCCL communicator can be created: this process's were aborted "
                   "after: %s; stop the run",
                   world->rank, g_abort_reason);
  }
  mp_nccl_comm *comm = (mp_nccl_comm *)calloc(1, sizeof *comm);
  if (comm == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for an NCCL communicator",
                   world->rank);
  }
  const mp_status made = mp_nccl_group_info_init(&comm->info, world->rank, group, err);
  if (made != MP_OK) {
    free(comm);
    return made;
  }
  comm->info.is_device_memory = is_device_memory;
  comm->world = world;
  const mp_status status = create(world, group, comm, err);
  if (status != MP_OK) {
    if (comm->nccl != NULL) {
      (void)ncclCommAbort(comm->nccl);
      comm->nccl = NULL;
    }
    release(comm);
    return status;
  }
  *out = comm;
  return MP_OK;
}

namespace {

// One poll of a finalizing communicator (an mp_poll_fn): done at state ncclSuccess; a state other
// than ncclInProgress, or a query that fails, is a failure.
mp_status poll_finalized(void *context, bool *done, mp_error *err) {
  mp_nccl_comm *comm = static_cast<mp_nccl_comm *>(context);
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm->nccl, &state);
  *done = queried == ncclSuccess && state == ncclSuccess;
  if (queried == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return MP_OK;
  return mp_fail(err, MP_ERR_RUNTIME, "rank %d: finalizing the NCCL communicator of group %s",
                 comm->world->rank, comm->info.name);
}

}  // namespace

extern "C" void mp_nccl_comm_free(mp_nccl_comm *comm) {
  if (comm == NULL) return;
  mp_error ignored = MP_ERROR_INITIALIZER;
  if (comm->nccl != NULL) {
    cudaSetDevice(comm->world->device);
    mp_status status = mp_nccl_comm_synchronize(comm, &ignored);  // aborts all on failure
    if (status == MP_OK && comm->nccl != NULL) {
      // Finalize flushes and waits for the peers to be quiescent: polled, under the timeout.
      const double posted_s = mp_poll_now_s();
      ncclResult_t finalized = ncclCommFinalize(comm->nccl);
      bool clean = finalized == ncclSuccess || finalized == ncclInProgress;
      bool timed_out = false;
      clean = clean &&
              mp_poll_wait(poll_finalized, comm, posted_s + world_timeout(comm->world),
                           kSpinSeconds, &timed_out, &ignored) == MP_OK &&
              !timed_out;
      if (clean) {
        (void)ncclCommDestroy(comm->nccl);
      } else {
        (void)ncclCommAbort(comm->nccl);
      }
      comm->nccl = NULL;
    }
  }
  release(comm);
}

extern "C" int mp_nccl_comm_rank(const mp_nccl_comm *comm) { return comm->info.rank; }
extern "C" int mp_nccl_comm_size(const mp_nccl_comm *comm) { return comm->info.size; }
extern "C" const char *mp_nccl_comm_name(const mp_nccl_comm *comm) { return comm->info.name; }
extern "C" mp_cuda_stream mp_nccl_comm_stream(const mp_nccl_comm *comm) { return comm->stream; }

// ---------------------------------------------------------------------------------------------
// Ordering and waiting

extern "C" mp_status mp_nccl_comm_wait_stream(mp_nccl_comm *comm, mp_cuda_stream stream,
                                              mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info_of(comm), "waiting for a stream", err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->order, (cudaStream_t)stream));
  CUDA_TRY(comm->world, cudaStreamWaitEvent(comm->stream, comm->order, 0));
  return MP_OK;
}

extern "C" mp_status mp_nccl_stream_wait_comm(mp_cuda_stream stream, mp_nccl_comm *comm,
                                              mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info_of(comm), "making a stream wait", err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->order, comm->stream));
  CUDA_TRY(comm->world, cudaStreamWaitEvent((cudaStream_t)stream, comm->order, 0));
  return MP_OK;
}

extern "C" mp_status mp_nccl_comm_mark(mp_nccl_comm *comm, int slot, mp_error *err) {
  MP_TRY(mp_nccl_check_mark(info_of(comm), "marking", slot, err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->marks[slot], comm->stream));
  return MP_OK;
}

extern "C" mp_status mp_nccl_stream_wait_mark(mp_cuda_stream stream, mp_nccl_comm *comm, int slot,
                                              mp_error *err) {
  MP_TRY(mp_nccl_check_mark(info_of(comm), "making a stream wait", slot, err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaStreamWaitEvent((cudaStream_t)stream, comm->marks[slot], 0));
  return MP_OK;
}

extern "C" mp_status mp_nccl_comm_synchronize(mp_nccl_comm *comm, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info_of(comm), "synchronize", err));
  int done = 0;
  mp_status status = MP_OK;
  for (; done < comm->num_pending; ++done) {
    status = wait_op(comm, &comm->pending[done], err);
    if (status != MP_OK) break;
    comm->spare[comm->num_spare++] = comm->pending[done].event;
  }
  memmove(comm->pending, comm->pending + done,
          (size_t)(comm->num_pending - done) * sizeof *comm->pending);
  comm->num_pending -= done;
  if (status != MP_OK) return status;
  return usable(comm, err);
}

// ---------------------------------------------------------------------------------------------
// Operations

extern "C" mp_status mp_nccl_p2p(mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count,
                                 mp_error *err) {
  // The description for messages: "send to rank 3 and recv from rank 1 in group pp".
  char what[kWhatBytes];
  size_t bytes = 0;
  MP_TRY(mp_nccl_check_p2p(info_of(comm), ops, count, what, sizeof what, &bytes, err));
  if (count == 0) return MP_OK;

  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  NCCL_TRY(comm->world, ncclGroupStart());
  ncclResult_t failed = ncclSuccess;
  const char *failed_call = NULL;
  for (int i = 0; i < count && failed_call == NULL; ++i) {
    const mp_nccl_p2p_op *op = &ops[i];
    ncclResult_t result =
        op->kind == MP_NCCL_SEND
            ? ncclSend(op->buffer, op->bytes, ncclUint8, op->peer, comm->nccl, comm->stream)
            : ncclRecv(op->buffer, op->bytes, ncclUint8, op->peer, comm->nccl, comm->stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      failed = result;
      failed_call = op->kind == MP_NCCL_SEND
                        ? "ncclSend(op->buffer, op->bytes, ncclUint8, op->peer, comm->nccl, "
                          "comm->stream)"
                        : "ncclRecv(op->buffer, op->bytes, ncclUint8, op->peer, comm->nccl, "
                          "comm->stream)";
    }
  }
  ncclResult_t ended = ncclGroupEnd();  // closes the group even after a failed call in it
  if (failed_call != NULL) return nccl_failed(comm->world, failed, failed_call, __FILE__, __LINE__, err);
  if (ended != ncclSuccess && ended != ncclInProgress) {
    return nccl_failed(comm->world, ended, "ncclGroupEnd()", __FILE__, __LINE__, err);
  }
  return finish(comm, what, bytes, posted_s, err);
}

extern "C" mp_status mp_nccl_all_reduce_sum(mp_nccl_comm *comm, void *buffer, size_t count,
                                            mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_all_reduce(info_of(comm), buffer, count, dtype, err));
  const size_t bytes = count * mp_nccl_dtype_bytes(dtype);
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  NCCL_TRY(comm->world, ncclAllReduce(buffer, buffer, count, dtype_nccl(dtype), ncclSum,
                                      comm->nccl, comm->stream));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "all-reduce", what, sizeof what);
  return finish(comm, what, bytes, posted_s, err);
}

extern "C" mp_status mp_nccl_reduce_scatter_sum(mp_nccl_comm *comm, const void *input,
                                                void *output, size_t count, mp_nccl_dtype dtype,
                                                mp_error *err) {
  MP_TRY(mp_nccl_check_reduce_scatter(info_of(comm), input, output, count, dtype, err));
  const size_t bytes = count * mp_nccl_dtype_bytes(dtype);
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  NCCL_TRY(comm->world, ncclReduceScatter(input, output, count, dtype_nccl(dtype), ncclSum,
                                          comm->nccl, comm->stream));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "reduce-scatter", what, sizeof what);
  return finish(comm, what, bytes * comm->info.size, posted_s, err);
}

// NCCL's reduce-scatter and all-gather take equal counts: the uneven ones post one rooted
// collective per non-empty run of counts (rank r's run after those of ranks 0..r-1), post(r, at)
// making rank r's at element `at`, in one group so that they progress together (the same bytes
// cross the links). call names what post calls, for the message of a failure.
namespace {

template <typename Post>
mp_status post_rooted_runs(mp_nccl_comm *comm, const size_t *counts, const char *call, Post post,
                           mp_error *err) {
  NCCL_TRY(comm->world, ncclGroupStart());
  ncclResult_t failed = ncclSuccess;
  size_t at = 0;
  for (int r = 0; r < comm->info.size && failed == ncclSuccess; ++r) {
    if (counts[r] > 0) {
      ncclResult_t result = post(r, at);
      if (result != ncclSuccess && result != ncclInProgress) failed = result;
    }
    at += counts[r];
  }
  ncclResult_t ended = ncclGroupEnd();  // closes the group even after a failed call in it
  if (failed != ncclSuccess) return nccl_failed(comm->world, failed, call, __FILE__, __LINE__, err);
  if (ended != ncclSuccess && ended != ncclInProgress) {
    return nccl_failed(comm->world, ended, "ncclGroupEnd()", __FILE__, __LINE__, err);
  }
  return MP_OK;
}

}  // namespace

extern "C" mp_status mp_nccl_reduce_scatter_v_sum_f32(mp_nccl_comm *comm, const float *input,
                                                      float *output, const size_t *counts,
                                                      mp_error *err) {
  size_t total = 0;
  MP_TRY(mp_nccl_check_reduce_scatter_v(info_of(comm), input, output, counts, &total, err));
  if (total == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  // One reduce per rank's run, rooted there. recvbuff is read on the root only; the others pass
  // their own (valid) buffer.
  MP_TRY(post_rooted_runs(
      comm, counts,
      "ncclReduce(input + at, output, counts[r], ncclFloat32, ncclSum, r, comm->nccl, "
      "comm->stream)",
      [&](int r, size_t at) {
        return ncclReduce(input + at, output, counts[r], ncclFloat32, ncclSum, r, comm->nccl,
                          comm->stream);
      },
      err));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "reduce-scatter", what, sizeof what);
  return finish(comm, what, total * sizeof(float), posted_s, err);
}

extern "C" mp_status mp_nccl_all_gather(mp_nccl_comm *comm, const void *input, void *output,
                                        size_t count, mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_all_gather(info_of(comm), input, output, count, dtype, err));
  const size_t bytes = count * mp_nccl_dtype_bytes(dtype);
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  NCCL_TRY(comm->world, ncclAllGather(input, output, count, dtype_nccl(dtype), comm->nccl,
                                      comm->stream));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "all-gather", what, sizeof what);
  return finish(comm, what, bytes * comm->info.size, posted_s, err);
}

extern "C" mp_status mp_nccl_all_gather_v(mp_nccl_comm *comm, const void *input, void *output,
                                          const size_t *counts, mp_nccl_dtype dtype,
                                          mp_error *err) {
  size_t total = 0;
  MP_TRY(mp_nccl_check_all_gather_v(info_of(comm), input, output, counts, dtype, &total, err));
  const size_t elem = mp_nccl_dtype_bytes(dtype);
  if (total == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  // One broadcast per rank's run, rooted there. sendbuff is read on the root only; in place it is
  // the run's own place in output.
  char *out = static_cast<char *>(output);
  MP_TRY(post_rooted_runs(
      comm, counts,
      "ncclBroadcast(send, out + at * elem, counts[r], dtype_nccl(dtype), r, comm->nccl, "
      "comm->stream)",
      [&](int r, size_t at) {
        const void *send = r == comm->info.rank && input != NULL ? input : out + at * elem;
        return ncclBroadcast(send, out + at * elem, counts[r], dtype_nccl(dtype), r, comm->nccl,
                             comm->stream);
      },
      err));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "all-gather", what, sizeof what);
  return finish(comm, what, total * elem, posted_s, err);
}

extern "C" mp_status mp_nccl_broadcast(mp_nccl_comm *comm, void *buffer, size_t bytes, int root,
                                       mp_error *err) {
  MP_TRY(mp_nccl_check_broadcast(info_of(comm), buffer, bytes, root, err));
  if (bytes == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = mp_poll_now_s();
  NCCL_TRY(comm->world, ncclBroadcast(buffer, buffer, bytes, ncclUint8, root, comm->nccl,
                                      comm->stream));
  char what[kWhatBytes];
  mp_nccl_describe(&comm->info, "broadcast", what, sizeof what);
  return finish(comm, what, bytes, posted_s, err);
}
