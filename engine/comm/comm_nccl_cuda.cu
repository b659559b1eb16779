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
 * second and then sleeping with a backoff up to 1 ms, against the operation's deadline. On a
 * timeout or an asynchronous NCCL error it aborts every communicator of the process (the list
 * g_comms), because a rank that stops here leaves its peers in other groups waiting too.
 *
 * Non-blocking communicators (config.blocking = 0) return ncclInProgress from calls that have not
 * finished (creation, ncclGroupEnd, a collective whose launch is deferred); such a communicator
 * must be polled until it leaves that state before the next call on it, and before the event that
 * marks the operation's end is recorded (the operation may not be on the stream yet).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm_nccl.h"
#include "layers/cuda_check.cuh"

namespace {

const double kSpinSeconds = 1.0;  // poll without sleeping this long, then sleep between polls
const long kFirstSleepNs = 10000;
const long kMaxSleepNs = 1000000;
const double kDefaultTimeoutS = 300.0;
enum { kNameBytes = 32, kMembersTextBytes = 160, kWhatBytes = 320, kReasonBytes = 1024 };

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
  mp_nccl_world *world;
  ncclComm_t nccl;     // NULL once aborted
  cudaStream_t stream; // the communication stream
  cudaEvent_t order;   // scratch event for mp_nccl_comm_wait_stream / mp_nccl_stream_wait_comm
  cudaEvent_t marks[MP_NCCL_MARKS];  // mp_nccl_comm_mark's
  char name[kNameBytes];
  int rank, size;
  int *members;        // (size) world ranks
  char members_text[kMembersTextBytes];
  pending_op *pending; // (num_pending) oldest first
  int num_pending, pending_capacity;
  cudaEvent_t *spare;  // (num_spare) events ready for reuse
  int num_spare, spare_capacity;
  mp_nccl_comm *next;  // g_comms
};

namespace {

mp_nccl_comm *g_comms = NULL;          // every live communicator of the process
char g_abort_reason[kReasonBytes] = "";  // why they were aborted; "" while they were not

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One poll-loop pause: yield while young, then sleep with a doubling backoff.
struct backoff {
  double spin_until;
  long sleep_ns;
};
backoff backoff_begin(void) { return backoff{now_s() + kSpinSeconds, kFirstSleepNs}; }
void backoff_pause(backoff *b) {
  if (now_s() < b->spin_until) {
    sched_yield();
    return;
  }
  struct timespec pause = {0, b->sleep_ns};
  nanosleep(&pause, NULL);
  b->sleep_ns = b->sleep_ns * 2 < kMaxSleepNs ? b->sleep_ns * 2 : kMaxSleepNs;
}

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
                 comm->world->rank, comm->name, comm->members_text,
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

// Waits until the non-blocking communicator has finished its last call (state ncclSuccess), or
// fails (its asynchronous error, or the deadline) naming `what`; both abort every communicator.
mp_status settle(mp_nccl_comm *comm, const char *what, size_t bytes, double posted_s,
                 double deadline_s, mp_error *err) {
  backoff b = backoff_begin();
  for (;;) {
    if (comm->nccl == NULL) return usable(comm, err);
    ncclResult_t state = ncclSuccess;
    NCCL_TRY(comm->world, ncclCommGetAsyncError(comm->nccl, &state));
    if (state == ncclSuccess) return MP_OK;
    char message[kReasonBytes];
    if (state != ncclInProgress) {
      char text[kReasonBytes / 2];
      nccl_describe(state, text, sizeof text);
      snprintf(message, sizeof message, "rank %d: %s failed on NCCL after %.1f s%s: %s",
               comm->world->rank, what, now_s() - posted_s, bytes_text(bytes).text, text);
      return fail_and_abort(err, message);
    }
    if (now_s() >= deadline_s) {
      snprintf(message, sizeof message, "rank %d: %s timed out after %.1f s%s on NCCL",
               comm->world->rank, what, deadline_s - posted_s, bytes_text(bytes).text);
      return fail_and_abort(err, message);
    }
    backoff_pause(&b);
  }
}

// Waits for one posted operation: its event, polled with the communicator's asynchronous error,
// against its deadline.
mp_status wait_op(mp_nccl_comm *comm, const pending_op *op, mp_error *err) {
  backoff b = backoff_begin();
  for (;;) {
    cudaError_t done = cudaEventQuery(op->event);
    if (done == cudaSuccess) return MP_OK;
    if (done == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is no error; keep it from the caller's next check
    } else {
      char call[kWhatBytes + 64];
      snprintf(call, sizeof call, "cudaEventQuery (the end of %s)", op->what);
      return cuda_failed(comm->world, done, call, __FILE__, __LINE__, true, err);
    }
    if (comm->nccl == NULL) return usable(comm, err);
    ncclResult_t state = ncclSuccess;
    NCCL_TRY(comm->world, ncclCommGetAsyncError(comm->nccl, &state));
    char message[kReasonBytes];
    if (state != ncclSuccess && state != ncclInProgress) {
      char text[kReasonBytes / 2];
      nccl_describe(state, text, sizeof text);
      snprintf(message, sizeof message, "rank %d: %s failed on NCCL after %.1f s (%zu bytes): %s",
               comm->world->rank, op->what, now_s() - op->posted_s, op->bytes, text);
      return fail_and_abort(err, message);
    }
    if (now_s() >= op->deadline_s) {
      snprintf(message, sizeof message, "rank %d: %s timed out after %.1f s (%zu bytes) on NCCL",
               comm->world->rank, op->what, op->deadline_s - op->posted_s, op->bytes);
      return fail_and_abort(err, message);
    }
    backoff_pause(&b);
  }
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

// --- argument checks (MP_ERR_INPUT, nothing posted) ---

mp_status check_comm(const mp_nccl_comm *comm, const char *operation, mp_error *err) {
  if (comm == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: NULL NCCL communicator", operation);
  }
  return MP_OK;
}

size_t dtype_bytes(mp_nccl_dtype dtype) {
  switch (dtype) {
    case MP_NCCL_FLOAT32: return 4;
    case MP_NCCL_BFLOAT16: return 2;
  }
  return 0;
}

ncclDataType_t dtype_nccl(mp_nccl_dtype dtype) {
  return dtype == MP_NCCL_BFLOAT16 ? ncclBfloat16 : ncclFloat32;
}

mp_status check_dtype(const mp_nccl_comm *comm, const char *operation, mp_nccl_dtype dtype,
                      mp_error *err) {
  if (dtype_bytes(dtype) == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: unknown element type %d (MP_NCCL_FLOAT32 or "
                   "MP_NCCL_BFLOAT16)",
                   comm->world->rank, operation, comm->name, (int)dtype);
  }
  return MP_OK;
}

// buffer must be device memory (or managed) when bytes > 0: NCCL faults on host memory.
mp_status check_buffer(const mp_nccl_comm *comm, const char *operation, const char *which,
                       const void *buffer, size_t bytes, mp_error *err) {
  if (bytes == 0) return MP_OK;
  if (buffer == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: NULL %s of %zu bytes",
                   comm->world->rank, operation, comm->name, which, bytes);
  }
  cudaPointerAttributes attributes;
  cudaError_t status = cudaPointerGetAttributes(&attributes, buffer);
  if (status != cudaSuccess) cudaGetLastError();
  if (status != cudaSuccess || (attributes.type != cudaMemoryTypeDevice &&
                                attributes.type != cudaMemoryTypeManaged)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: the %s (%zu bytes) is host memory; NCCL needs GPU "
                   "memory (cudaMalloc). The MPI communicators (engine/comm/comm.h) take host buffers",
                   comm->world->rank, operation, comm->name, which, bytes);
  }
  return MP_OK;
}

mp_status check_count(const mp_nccl_comm *comm, const char *operation, size_t count,
                      size_t multiple, mp_nccl_dtype dtype, mp_error *err) {
  if (count > ((size_t)-1 / 2) / multiple / dtype_bytes(dtype)) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: %zu elements is too many",
                   comm->world->rank, operation, comm->name, count);
  }
  return MP_OK;
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
  free(comm->members);
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
  if (comm->rank == 0) {
    ncclResult_t made = ncclGetUniqueId(&message.id);
    message.ok = made == ncclSuccess;
    if (!message.ok) {
      char text[kReasonBytes / 2];
      nccl_describe(made, text, sizeof text);
      mp_fail(&local, MP_ERR_RUNTIME, "rank %d: ncclGetUniqueId(&message.id) failed: %s at %s:%d",
              world->rank, text, __FILE__, __LINE__);
    }
  }
  if (group != NULL && comm->size > 1) {
    mp_error broadcast = MP_ERROR_INITIALIZER;
    if (mp_comm_broadcast(group, &message, sizeof message, 0, &broadcast) != MP_OK) {
      // A member that does not arrive stops the run: the other groups' peers are told by abort.
      char reason[kReasonBytes];
      snprintf(reason, sizeof reason,
               "rank %d: creating the NCCL communicator of group %s (ranks %s): %s", world->rank,
               comm->name, comm->members_text, broadcast.message);
      return fail_and_abort(err, reason);
    }
  }
  if (!message.ok) {
    if (comm->rank == 0) return mp_fail(err, local.status, "%s", local.message);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: creating the NCCL communicator of group %s (ranks %s): its rank 0 "
                   "could not make an NCCL id (see its message)",
                   world->rank, comm->name, comm->members_text);
  }

  // Join, without blocking: the communicator is polled to readiness under the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = comm->name;
  const double posted_s = now_s();
  comm->next = g_comms;  // registered first: an abort while it forms must reach it too
  g_comms = comm;
  ncclResult_t joined = ncclCommInitRankConfig(&comm->nccl, comm->size, message.id, comm->rank,
                                               &config);
  if (joined != ncclSuccess && joined != ncclInProgress) {
    char text[kReasonBytes / 2], reason[kReasonBytes];
    nccl_describe(joined, text, sizeof text);
    snprintf(reason, sizeof reason,
             "rank %d: creating the NCCL communicator of group %s (ranks %s): "
             "ncclCommInitRankConfig(&comm->nccl, comm->size, message.id, comm->rank, &config) "
             "failed: %s at %s:%d",
             world->rank, comm->name, comm->members_text, text, __FILE__, __LINE__);
    if (comm->nccl != NULL) (void)ncclCommAbort(comm->nccl);
    comm->nccl = NULL;
    return mp_fail(err, MP_ERR_RUNTIME, "%s", reason);
  }
  char what[kWhatBytes];
  snprintf(what, sizeof what, "creating the NCCL communicator of group %s (ranks %s)", comm->name,
           comm->members_text);
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
  int size = group != NULL ? mp_comm_size(group) : 1;
  int *members = (int *)malloc((size_t)size * sizeof *members);
  if (comm == NULL || members == NULL) {
    free(comm);
    free(members);
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for an NCCL communicator",
                   world->rank);
  }
  comm->world = world;
  comm->members = members;
  comm->size = size;
  if (group != NULL) {
    comm->rank = mp_comm_rank(group);
    for (int i = 0; i < size; ++i) members[i] = mp_comm_member(group, i);
    snprintf(comm->name, sizeof comm->name, "%s", mp_comm_name(group));
  } else {
    comm->rank = 0;
    members[0] = world->rank;
    snprintf(comm->name, sizeof comm->name, "self");
  }
  mp_comm_format_members(comm->members_text, sizeof comm->members_text, members, size);
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

extern "C" void mp_nccl_comm_free(mp_nccl_comm *comm) {
  if (comm == NULL) return;
  mp_error ignored = MP_ERROR_INITIALIZER;
  if (comm->nccl != NULL) {
    cudaSetDevice(comm->world->device);
    mp_status status = mp_nccl_comm_synchronize(comm, &ignored);  // aborts all on failure
    if (status == MP_OK && comm->nccl != NULL) {
      // Finalize flushes and waits for the peers to be quiescent: polled, under the timeout.
      const double posted_s = now_s();
      ncclResult_t finalized = ncclCommFinalize(comm->nccl);
      bool clean = finalized == ncclSuccess || finalized == ncclInProgress;
      backoff b = backoff_begin();
      while (clean) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm->nccl, &state) != ncclSuccess) clean = false;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || now_s() >= posted_s + world_timeout(comm->world)) {
          clean = false;
        }
        backoff_pause(&b);
      }
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

extern "C" int mp_nccl_comm_rank(const mp_nccl_comm *comm) { return comm->rank; }
extern "C" int mp_nccl_comm_size(const mp_nccl_comm *comm) { return comm->size; }
extern "C" const char *mp_nccl_comm_name(const mp_nccl_comm *comm) { return comm->name; }
extern "C" mp_cuda_stream mp_nccl_comm_stream(const mp_nccl_comm *comm) { return comm->stream; }

// ---------------------------------------------------------------------------------------------
// Ordering and waiting

extern "C" mp_status mp_nccl_comm_wait_stream(mp_nccl_comm *comm, mp_cuda_stream stream,
                                              mp_error *err) {
  MP_TRY(check_comm(comm, "waiting for a stream", err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->order, (cudaStream_t)stream));
  CUDA_TRY(comm->world, cudaStreamWaitEvent(comm->stream, comm->order, 0));
  return MP_OK;
}

extern "C" mp_status mp_nccl_stream_wait_comm(mp_cuda_stream stream, mp_nccl_comm *comm,
                                              mp_error *err) {
  MP_TRY(check_comm(comm, "making a stream wait", err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->order, comm->stream));
  CUDA_TRY(comm->world, cudaStreamWaitEvent((cudaStream_t)stream, comm->order, 0));
  return MP_OK;
}

namespace {

mp_status check_mark(const mp_nccl_comm *comm, int slot, mp_error *err) {
  if (slot >= 0 && slot < MP_NCCL_MARKS) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT, "rank %d: group %s: mark %d is not one of 0 .. %d",
                 comm->world->rank, comm->name, slot, MP_NCCL_MARKS - 1);
}

}  // namespace

extern "C" mp_status mp_nccl_comm_mark(mp_nccl_comm *comm, int slot, mp_error *err) {
  MP_TRY(check_comm(comm, "marking", err));
  MP_TRY(check_mark(comm, slot, err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaEventRecord(comm->marks[slot], comm->stream));
  return MP_OK;
}

extern "C" mp_status mp_nccl_stream_wait_mark(mp_cuda_stream stream, mp_nccl_comm *comm, int slot,
                                              mp_error *err) {
  MP_TRY(check_comm(comm, "making a stream wait", err));
  MP_TRY(check_mark(comm, slot, err));
  MP_TRY(usable(comm, err));
  CUDA_TRY(comm->world, cudaStreamWaitEvent((cudaStream_t)stream, comm->marks[slot], 0));
  return MP_OK;
}

extern "C" mp_status mp_nccl_comm_synchronize(mp_nccl_comm *comm, mp_error *err) {
  MP_TRY(check_comm(comm, "synchronize", err));
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
  MP_TRY(check_comm(comm, "send/recv", err));
  if (count < 0 || (ops == NULL && count > 0)) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: send/recv in group %s: %d operations at %p",
                   comm->world->rank, comm->name, count, (const void *)ops);
  }
  if (count == 0) return MP_OK;
  // Checks, and the description for messages: "send to rank 3 and recv from rank 1 in group pp".
  char what[kWhatBytes] = "";
  size_t used = 0, bytes = 0;
  for (int i = 0; i < count; ++i) {
    const mp_nccl_p2p_op *op = &ops[i];
    const char *kind = op->kind == MP_NCCL_SEND ? "send" : "recv";
    if (op->kind != MP_NCCL_SEND && op->kind != MP_NCCL_RECV) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d: send/recv in group %s: operation %d has kind %d (MP_NCCL_SEND or "
                     "MP_NCCL_RECV)",
                     comm->world->rank, comm->name, i, (int)op->kind);
    }
    if (op->peer < 0 || op->peer >= comm->size) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d: %s in group %s (ranks %s): peer %d is not a group rank (0 .. %d)",
                     comm->world->rank, kind, comm->name, comm->members_text, op->peer,
                     comm->size - 1);
    }
    MP_TRY(check_buffer(comm, kind, op->kind == MP_NCCL_SEND ? "send buffer" : "receive buffer",
                        op->buffer, op->bytes, err));
    bytes += op->bytes;
    if (used < sizeof what) {
      int n = snprintf(what + used, sizeof what - used, "%s%s %s rank %d", i > 0 ? " and " : "",
                       kind, op->kind == MP_NCCL_SEND ? "to" : "from",
                       comm->members[op->peer]);
      if (n > 0) used += (size_t)n;
    }
  }
  if (used < sizeof what) snprintf(what + used, sizeof what - used, " in group %s", comm->name);

  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
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
  MP_TRY(check_comm(comm, "all-reduce", err));
  MP_TRY(check_dtype(comm, "all-reduce", dtype, err));
  MP_TRY(check_count(comm, "all-reduce", count, 1, dtype, err));
  const size_t bytes = count * dtype_bytes(dtype);
  MP_TRY(check_buffer(comm, "all-reduce", "buffer", buffer, bytes, err));
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
  NCCL_TRY(comm->world, ncclAllReduce(buffer, buffer, count, dtype_nccl(dtype), ncclSum,
                                      comm->nccl, comm->stream));
  char what[kWhatBytes];
  snprintf(what, sizeof what, "all-reduce in group %s (ranks %s)", comm->name, comm->members_text);
  return finish(comm, what, bytes, posted_s, err);
}

extern "C" mp_status mp_nccl_reduce_scatter_sum(mp_nccl_comm *comm, const void *input,
                                                void *output, size_t count, mp_nccl_dtype dtype,
                                                mp_error *err) {
  MP_TRY(check_comm(comm, "reduce-scatter", err));
  MP_TRY(check_dtype(comm, "reduce-scatter", dtype, err));
  MP_TRY(check_count(comm, "reduce-scatter", count, (size_t)comm->size, dtype, err));
  const size_t bytes = count * dtype_bytes(dtype);
  MP_TRY(check_buffer(comm, "reduce-scatter", "input", input, bytes * comm->size, err));
  MP_TRY(check_buffer(comm, "reduce-scatter", "output", output, bytes, err));
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
  NCCL_TRY(comm->world, ncclReduceScatter(input, output, count, dtype_nccl(dtype), ncclSum,
                                          comm->nccl, comm->stream));
  char what[kWhatBytes];
  snprintf(what, sizeof what, "reduce-scatter in group %s (ranks %s)", comm->name,
           comm->members_text);
  return finish(comm, what, bytes * comm->size, posted_s, err);
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
  for (int r = 0; r < comm->size && failed == ncclSuccess; ++r) {
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
  MP_TRY(check_comm(comm, "reduce-scatter", err));
  size_t total = 0;
  for (int r = 0; r < comm->size; ++r) {
    MP_TRY(check_count(comm, "reduce-scatter", counts[r], 1, MP_NCCL_FLOAT32, err));
    total += counts[r];
  }
  const size_t mine = counts[comm->rank];
  MP_TRY(check_buffer(comm, "reduce-scatter", "input", input, total * sizeof(float), err));
  MP_TRY(check_buffer(comm, "reduce-scatter", "output", output, mine * sizeof(float), err));
  if (total == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
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
  snprintf(what, sizeof what, "reduce-scatter in group %s (ranks %s)", comm->name,
           comm->members_text);
  return finish(comm, what, total * sizeof(float), posted_s, err);
}

extern "C" mp_status mp_nccl_all_gather(mp_nccl_comm *comm, const void *input, void *output,
                                        size_t count, mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(check_comm(comm, "all-gather", err));
  MP_TRY(check_dtype(comm, "all-gather", dtype, err));
  MP_TRY(check_count(comm, "all-gather", count, (size_t)comm->size, dtype, err));
  const size_t bytes = count * dtype_bytes(dtype);
  MP_TRY(check_buffer(comm, "all-gather", "input", input, bytes, err));
  MP_TRY(check_buffer(comm, "all-gather", "output", output, bytes * comm->size, err));
  if (count == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
  NCCL_TRY(comm->world, ncclAllGather(input, output, count, dtype_nccl(dtype), comm->nccl,
                                      comm->stream));
  char what[kWhatBytes];
  snprintf(what, sizeof what, "all-gather in group %s (ranks %s)", comm->name, comm->members_text);
  return finish(comm, what, bytes * comm->size, posted_s, err);
}

extern "C" mp_status mp_nccl_all_gather_v(mp_nccl_comm *comm, const void *input, void *output,
                                          const size_t *counts, mp_nccl_dtype dtype,
                                          mp_error *err) {
  MP_TRY(check_comm(comm, "all-gather", err));
  MP_TRY(check_dtype(comm, "all-gather", dtype, err));
  const size_t elem = dtype_bytes(dtype);
  size_t total = 0;
  for (int r = 0; r < comm->size; ++r) {
    MP_TRY(check_count(comm, "all-gather", counts[r], 1, dtype, err));
    total += counts[r];
  }
  const size_t mine = counts[comm->rank];
  if (input != NULL) {
    MP_TRY(check_buffer(comm, "all-gather", "input", input, mine * elem, err));
  }
  MP_TRY(check_buffer(comm, "all-gather", "output", output, total * elem, err));
  if (total == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
  // One broadcast per rank's run, rooted there. sendbuff is read on the root only; in place it is
  // the run's own place in output.
  char *out = static_cast<char *>(output);
  MP_TRY(post_rooted_runs(
      comm, counts,
      "ncclBroadcast(send, out + at * elem, counts[r], dtype_nccl(dtype), r, comm->nccl, "
      "comm->stream)",
      [&](int r, size_t at) {
        const void *send = r == comm->rank && input != NULL ? input : out + at * elem;
        return ncclBroadcast(send, out + at * elem, counts[r], dtype_nccl(dtype), r, comm->nccl,
                             comm->stream);
      },
      err));
  char what[kWhatBytes];
  snprintf(what, sizeof what, "all-gather in group %s (ranks %s)", comm->name, comm->members_text);
  return finish(comm, what, total * elem, posted_s, err);
}

extern "C" mp_status mp_nccl_broadcast(mp_nccl_comm *comm, void *buffer, size_t bytes, int root,
                                       mp_error *err) {
  MP_TRY(check_comm(comm, "broadcast", err));
  if (root < 0 || root >= comm->size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: broadcast in group %s (ranks %s): root %d is not a group rank "
                   "(0 .. %d)",
                   comm->world->rank, comm->name, comm->members_text, root, comm->size - 1);
  }
  MP_TRY(check_buffer(comm, "broadcast", "buffer", buffer, bytes, err));
  if (bytes == 0) return MP_OK;
  MP_TRY(begin(comm, err));
  const double posted_s = now_s();
  NCCL_TRY(comm->world, ncclBroadcast(buffer, buffer, bytes, ncclUint8, root, comm->nccl,
                                      comm->stream));
  char what[kWhatBytes];
  snprintf(what, sizeof what, "broadcast in group %s (ranks %s)", comm->name, comm->members_text);
  return finish(comm, what, bytes, posted_s, err);
}
