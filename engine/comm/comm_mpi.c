/*
 * engine/comm/comm_mpi.c — engine/comm/comm.h on Open MPI, CPU buffers.
 *
 * Every operation is posted non-blocking and then polled against a deadline (wait_for), so a hung
 * peer turns into an error that names it; comm.h says what a timed-out operation leaves behind.
 * Every MPI call goes through MPI_CALL, which turns a failure into an mp_error naming the rank,
 * the MPI function, this file and the line. Messages over 2^30 bytes (or 2^28 floats for the
 * all-reduce) go as several MPI operations under one deadline, because MPI counts are ints.
 *
 * GPU buffers are staged through pinned host memory (comm_staging.h): a buffer the operation reads
 * is copied from the GPU into a pinned block first, a buffer it writes is received into a block
 * and copied to the GPU afterwards. Host buffers go to MPI as they are, as before. The world keeps
 * a few pinned blocks for reuse; a block whose operation failed is never reused or freed, because
 * MPI may still read or write it (comm.h: what a timeout leaves behind).
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/comm/comm.h"

#include "engine/comm/comm_staging.h"
#include "engine/comm/poll_wait.h"

#include <limits.h>
/* Debian puts Open MPI's headers under /usr/include/<triplet>/mpi, which gcc searches through the
 * multiarch directory; @system//:mpi's -isystem copt does not reach dependents (Bazel copts do not
 * propagate), so the header is named with its directory. */
#include <mpi/mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  kTagP2P = 1,
  kNameBytes = 32,
  kMembersTextBytes = 160,
  kBrokenBytes = 512,
  kStagingSlots = 8,               /* pinned blocks a world keeps for reuse */
};
static const size_t kChunkBytes = (size_t)1 << 30;
static const size_t kChunkFloats = (size_t)1 << 28;
static const double kCancelGraceS = 1.0; /* how long a cancelled receive may take to complete */
/* Open MPI moves a non-blocking operation forward only inside MPI calls, so a sleep between polls
 * stalls the transfer (a 16 MiB all-reduce ran 6x slower with 1 ms sleeps). A wait therefore
 * spins on MPI_Test, yielding the core to other ranks between polls (what Open MPI's own
 * MPI_Wait does when oversubscribed), for its first kSpinSeconds; a wait that has lasted that
 * long is almost surely on a stuck or far-behind peer, and from then on it sleeps between polls
 * (poll_wait.h) so that waiting out a long timeout costs little CPU. */
static const double kSpinSeconds = 10.0;

struct mp_comm_world {
  MPI_Comm comm;     /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
  int rank, size;
  double timeout_s;
  bool owns_mpi;     /* this world called MPI_Init_thread, so it calls MPI_Finalize */
  int pending;       /* requests left inside MPI by timeouts that could not be withdrawn */
  struct {
    void *pointer;   /* pinned host memory, NULL for an empty slot */
    size_t capacity; /* bytes */
    bool in_use;
  } staging[kStagingSlots];
};

struct mp_comm {
  mp_comm_world *world;
  MPI_Comm comm;
  char name[kNameBytes];
  int rank, size;
  int *members;                     /* (size) world ranks, ascending */
  char members_text[kMembersTextBytes]; /* "0,1,2,3", for messages */
  char broken[kBrokenBytes];        /* why the group can no longer be used; "" while it can */
};

/* ---------------------------------------------------------------------------------------------
 * Checks and clocks
 * ------------------------------------------------------------------------------------------- */

static mp_status mpi_check(int world_rank, int code, const char *call, const char *file, int line,
                           mp_error *err) {
  if (code == MPI_SUCCESS) return MP_OK;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    snprintf(text, sizeof text, "MPI error code %d", code);
  }
  if (world_rank < 0) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s failed (%s:%d): %s", call, file, line, text);
  }
  return mp_fail(err, MP_ERR_RUNTIME, "rank %d: %s failed (%s:%d): %s", world_rank, call, file,
                 line, text);
}

/* MPI_CALL(rank, MPI_Foo, (args), err): calls MPI_Foo(args); yields MP_OK or the failure. */
#define MPI_CALL(world_rank, function, args, err) \
  mpi_check((world_rank), function args, #function, __FILE__, __LINE__, (err))

/* Outcome of a wait that did not fail in MPI itself. */
typedef enum {
  WAIT_DONE,          /* the operation completed */
  WAIT_WITHDRAWN,     /* timed out, and was cancelled: nothing of it remains */
  WAIT_LEFT_PENDING,  /* timed out, and is still inside MPI */
} wait_outcome;

/* An MPI request under mp_poll_wait. After MPI_Cancel the poll also asks whether the request was
 * cancelled (cancelled, set when it completes). */
typedef struct {
  int world_rank;
  MPI_Request *request;
  bool after_cancel;
  bool cancelled;
} request_poll;

static mp_status poll_request(void *context, bool *done, mp_error *err) {
  request_poll *poll = context;
  int completed = 0;
  MPI_Status status;
  MP_TRY(MPI_CALL(poll->world_rank, MPI_Test,
                  (poll->request, &completed, poll->after_cancel ? &status : MPI_STATUS_IGNORE),
                  err));
  if (completed && poll->after_cancel) {
    int cancelled = 0;
    MP_TRY(MPI_CALL(poll->world_rank, MPI_Test_cancelled, (&status, &cancelled), err));
    poll->cancelled = cancelled != 0;
  }
  *done = completed != 0;
  return MP_OK;
}

/* Polls *request until it completes or the deadline passes (mp_poll_wait: spinning with
 * sched_yield for the first kSpinSeconds, then sleeping between polls with a doubling backoff up
 * to 1 ms). On timeout a cancellable (point-to-point) request is cancelled, and polled for
 * kCancelGraceS more; if it then turns out to have completed after all, the outcome is
 * WAIT_DONE. */
static mp_status wait_for(mp_comm_world *world, MPI_Request *request, double deadline,
                          bool cancellable, wait_outcome *outcome, mp_error *err) {
  request_poll poll = {world->rank, request, false, false};
  bool timed_out = false;
  MP_TRY(mp_poll_wait(poll_request, &poll, deadline, kSpinSeconds, &timed_out, err));
  if (!timed_out) {
    *outcome = WAIT_DONE;
    return MP_OK;
  }
  *outcome = WAIT_LEFT_PENDING;
  if (!cancellable) {
    world->pending++;
    return MP_OK;
  }
  MP_TRY(MPI_CALL(world->rank, MPI_Cancel, (request), err));
  poll.after_cancel = true;
  MP_TRY(mp_poll_wait(poll_request, &poll, mp_poll_now_s() + kCancelGraceS, 0.0, &timed_out, err));
  if (!timed_out) {
    *outcome = poll.cancelled ? WAIT_WITHDRAWN : WAIT_DONE;
    return MP_OK;
  }
  world->pending++;
  return MP_OK;
}

void mp_comm_format_members(char *text, size_t capacity, const int *members, int count) {
  size_t used = 0;
  text[0] = '\0';
  for (int i = 0; i < count && used < capacity; ++i) {
    if (count > 12 && i == 8) {
      snprintf(text + used, capacity - used, ",...,%d (%d ranks)", members[count - 1], count);
      return;
    }
    int n = snprintf(text + used, capacity - used, i == 0 ? "%d" : ",%d", members[i]);
    if (n < 0) return;
    used += (size_t)n;
  }
}

/* ---------------------------------------------------------------------------------------------
 * Waiting on a group's operation, and what a timeout says
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const char *operation; /* "send", "recv", "all-reduce", ... */
  int peer;              /* group rank for send/recv; -1 for collectives */
  size_t bytes;          /* the caller's whole message, for the message */
  double deadline;
} comm_op;

static comm_op comm_op_begin(const mp_comm *comm, const char *operation, int peer, size_t bytes) {
  comm_op op = {operation, peer, bytes, mp_poll_now_s() + comm->world->timeout_s};
  return op;
}

static mp_status comm_wait(mp_comm *comm, MPI_Request *request, const comm_op *op,
                           mp_error *err) {
  wait_outcome outcome = WAIT_DONE;
  bool p2p = op->peer >= 0;
  MP_TRY(wait_for(comm->world, request, op->deadline, p2p, &outcome, err));
  if (outcome == WAIT_DONE) return MP_OK;

  int rank = comm->world->rank;
  double timeout_s = comm->world->timeout_s;
  char what[256];
  if (p2p) {
    bool send = strcmp(op->operation, "send") == 0;
    snprintf(what, sizeof what, "%s %s rank %d in group %s", op->operation, send ? "to" : "from",
             comm->members[op->peer], comm->name);
  } else {
    snprintf(what, sizeof what, "%s in group %s (ranks %s)", op->operation, comm->name,
             comm->members_text);
  }
  const char *who = p2p ? "the peer" : "a member";
  if (outcome == WAIT_WITHDRAWN) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: %s timed out after %.1f s (%zu bytes); %s may have died or hung", rank,
                   what, timeout_s, op->bytes, who);
  }
  snprintf(comm->broken, sizeof comm->broken,
           "rank %d: group %s (ranks %s) can no longer be used: an earlier %s timed out and is "
           "still pending inside MPI; stop the run",
           rank, comm->name, comm->members_text, op->operation);
  return mp_fail(err, MP_ERR_RUNTIME,
                 "rank %d: %s timed out after %.1f s (%zu bytes); %s may have died or hung (the "
                 "operation cannot be withdrawn, so group %s can no longer be used)",
                 rank, what, timeout_s, op->bytes, who, comm->name);
}

static mp_status comm_usable(const mp_comm *comm, mp_error *err) {
  if (comm->broken[0] != '\0') return mp_fail(err, MP_ERR_RUNTIME, "%s", comm->broken);
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * GPU buffers, staged through pinned host memory
 * ------------------------------------------------------------------------------------------- */

/* A caller's buffer as MPI sees it: the buffer itself when it is host memory, else a pinned block
 * of the world's (or one of its own when every slot is taken). */
typedef struct {
  void *user;   /* the caller's buffer */
  void *host;   /* what MPI reads or writes: user, or the pinned block */
  size_t bytes;
  bool device;  /* user is GPU memory, host is a pinned block */
} staged_buffer;

/* A pinned block of at least `bytes`: the smallest free one that fits, else a new one in a free
 * slot (replacing the smallest free block too small), else one outside the slots. */
static mp_status staging_acquire(mp_comm_world *world, size_t bytes, void **out, mp_error *err) {
  int fit = -1, spare = -1;
  for (int i = 0; i < kStagingSlots; ++i) {
    if (world->staging[i].in_use) continue;
    if (world->staging[i].pointer != NULL && world->staging[i].capacity >= bytes) {
      if (fit < 0 || world->staging[i].capacity < world->staging[fit].capacity) fit = i;
    } else if (spare < 0 || world->staging[i].pointer == NULL ||
               (world->staging[spare].pointer != NULL &&
                world->staging[i].capacity < world->staging[spare].capacity)) {
      spare = i;
    }
  }
  if (fit >= 0) {
    world->staging[fit].in_use = true;
    *out = world->staging[fit].pointer;
    return MP_OK;
  }
  void *block = NULL;
  MP_TRY(mp_staging_host_alloc(&block, bytes, err));
  if (spare >= 0) {
    mp_staging_host_free(world->staging[spare].pointer);
    world->staging[spare].pointer = block;
    world->staging[spare].capacity = bytes;
    world->staging[spare].in_use = true;
  }
  *out = block;
  return MP_OK;
}

/* Returns a block for reuse (or frees one outside the slots). */
static void staging_release(mp_comm_world *world, void *block) {
  for (int i = 0; i < kStagingSlots; ++i) {
    if (world->staging[i].pointer == block) {
      world->staging[i].in_use = false;
      return;
    }
  }
  mp_staging_host_free(block);
}

/* The host view of `user` for an operation that reads it (fill: copied from the GPU) or only
 * writes it. Host memory is its own view. */
static mp_status stage_in(mp_comm *comm, const char *operation, const void *user, size_t bytes,
                          bool fill, staged_buffer *staged, mp_error *err) {
  staged->user = (void *)user;
  staged->host = (void *)user;
  staged->bytes = bytes;
  staged->device = bytes > 0 && mp_staging_is_device(user);
  if (!staged->device) return MP_OK;
  staged->host = NULL;
  mp_status status = staging_acquire(comm->world, bytes, &staged->host, err);
  if (status == MP_OK && fill) status = mp_staging_copy(staged->host, user, bytes, err);
  if (status != MP_OK) {
    if (staged->host != NULL) staging_release(comm->world, staged->host);
    staged->host = NULL;
    staged->device = false;
    return mp_error_prefix(err, "rank %d: %s in group %s: staging %zu bytes of a GPU buffer through "
                           "host memory", comm->world->rank, operation, comm->name, bytes);
  }
  return MP_OK;
}

/* Returns the block of a buffer that MPI never saw. */
static void stage_drop(mp_comm *comm, staged_buffer *staged) {
  if (staged->device) staging_release(comm->world, staged->host);
  staged->device = false;
}

/* After the operation: on success copies what it wrote back to the GPU (copy_back) and returns the
 * block; after a failure the block is abandoned, since MPI may still use it. */
static mp_status stage_out(mp_comm *comm, const char *operation, staged_buffer *staged,
                           bool copy_back, mp_status status, mp_error *err) {
  if (!staged->device) return status;
  if (status != MP_OK) return status; /* the block stays in use: a pending request may hold it */
  if (copy_back) status = mp_staging_copy(staged->user, staged->host, staged->bytes, err);
  staging_release(comm->world, staged->host);
  staged->device = false;
  if (status != MP_OK) {
    return mp_error_prefix(err, "rank %d: %s in group %s: copying %zu bytes back to a GPU buffer",
                           comm->world->rank, operation, comm->name, staged->bytes);
  }
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The world
 * ------------------------------------------------------------------------------------------- */

mp_status mp_comm_world_init(int *argc, char ***argv, double timeout_s, mp_comm_world **out,
                             mp_error *err) {
  *out = NULL;
  if (!(timeout_s > 0)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "communication timeout must be a positive number of seconds, got %g",
                   timeout_s);
  }
  int initialized = 0, finalized = 0;
  MP_TRY(MPI_CALL(-1, MPI_Initialized, (&initialized), err));
  MP_TRY(MPI_CALL(-1, MPI_Finalized, (&finalized), err));
  if (finalized) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "MPI was already finalized in this process; it cannot be started again");
  }
  bool owns_mpi = false;
  if (!initialized) {
    int provided = 0;
    MP_TRY(MPI_CALL(-1, MPI_Init_thread, (argc, argv, MPI_THREAD_FUNNELED, &provided), err));
    owns_mpi = true;
  }
  mp_comm_world *world = calloc(1, sizeof *world);
  if (world == NULL) {
    if (owns_mpi) MPI_Finalize();
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the MPI context");
  }
  world->timeout_s = timeout_s;
  world->owns_mpi = owns_mpi;
  world->comm = MPI_COMM_NULL;
  mp_status status = MPI_CALL(-1, MPI_Comm_dup, (MPI_COMM_WORLD, &world->comm), err);
  if (status == MP_OK) {
    status = MPI_CALL(-1, MPI_Comm_set_errhandler, (world->comm, MPI_ERRORS_RETURN), err);
  }
  if (status == MP_OK) status = MPI_CALL(-1, MPI_Comm_rank, (world->comm, &world->rank), err);
  if (status == MP_OK) status = MPI_CALL(-1, MPI_Comm_size, (world->comm, &world->size), err);
  if (status != MP_OK) {
    if (world->comm != MPI_COMM_NULL) MPI_Comm_free(&world->comm);
    if (owns_mpi) MPI_Finalize();
    free(world);
    return status;
  }
  *out = world;
  return MP_OK;
}

void mp_comm_world_finalize(mp_comm_world *world) {
  if (world == NULL) return;
  bool clean = world->pending == 0;
  if (clean) {
    /* Everyone must arrive before MPI_Finalize, whose own synchronisation has no timeout. */
    MPI_Request request = MPI_REQUEST_NULL;
    wait_outcome outcome = WAIT_LEFT_PENDING;
    mp_error ignored = MP_ERROR_INITIALIZER;
    const double deadline = mp_poll_now_s() + world->timeout_s;
    clean = MPI_CALL(world->rank, MPI_Ibarrier, (world->comm, &request), &ignored) == MP_OK &&
            wait_for(world, &request, deadline, false, &outcome, &ignored) == MP_OK &&
            outcome == WAIT_DONE;
  }
  if (clean) {
    MPI_Comm_free(&world->comm);
    if (world->owns_mpi) MPI_Finalize();
  }
  for (int i = 0; i < kStagingSlots; ++i) {
    /* A block still in use belongs to a failed operation that MPI may still hold. */
    if (!world->staging[i].in_use) mp_staging_host_free(world->staging[i].pointer);
  }
  free(world);
}

int mp_comm_world_rank(const mp_comm_world *world) { return world->rank; }
int mp_comm_world_size(const mp_comm_world *world) { return world->size; }
void mp_comm_world_set_timeout(mp_comm_world *world, double timeout_s) {
  if (timeout_s > 0) world->timeout_s = timeout_s;
}
double mp_comm_world_timeout(const mp_comm_world *world) { return world->timeout_s; }

/* ---------------------------------------------------------------------------------------------
 * Groups
 * ------------------------------------------------------------------------------------------- */

/* An all-reduce of one int over the world under the world's timeout (for agreeing on whether a
 * group may be created). */
static mp_status world_all_reduce_int(mp_comm_world *world, int *value, MPI_Op op,
                                      const char *name, mp_error *err) {
  MPI_Request request = MPI_REQUEST_NULL;
  MP_TRY(MPI_CALL(world->rank, MPI_Iallreduce,
                  (MPI_IN_PLACE, value, 1, MPI_INT, op, world->comm, &request), err));
  wait_outcome outcome = WAIT_DONE;
  MP_TRY(wait_for(world, &request, mp_poll_now_s() + world->timeout_s, false, &outcome, err));
  if (outcome != WAIT_DONE) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "rank %d: creating group %s timed out after %.1f s waiting for all %d ranks; a "
                   "rank may have died or hung, or not every rank creates the group",
                   world->rank, name, world->timeout_s, world->size);
  }
  return MP_OK;
}

static bool check_members(const mp_comm_world *world, const int *members, int count,
                          const char *name, mp_error *err) {
  if (members == NULL || count < 1 || count > world->size) {
    mp_fail(err, MP_ERR_INPUT, "rank %d: group %s: %d members for a world of %d ranks",
            world->rank, name, count, world->size);
    return false;
  }
  bool self = false;
  for (int i = 0; i < count; ++i) {
    if (members[i] < 0 || members[i] >= world->size || (i > 0 && members[i] <= members[i - 1])) {
      mp_fail(err, MP_ERR_INPUT,
              "rank %d: group %s: members must be world ranks in [0, %d), ascending, without "
              "repeats; member %d is %d",
              world->rank, name, world->size, i, members[i]);
      return false;
    }
    if (members[i] == world->rank) self = true;
  }
  if (!self) {
    mp_fail(err, MP_ERR_INPUT, "rank %d: group %s: the members do not include this rank",
            world->rank, name);
    return false;
  }
  return true;
}

mp_status mp_comm_group_create(mp_comm_world *world, const int *members, int count,
                               const char *name, mp_comm **out, mp_error *err) {
  *out = NULL;
  if (name == NULL || name[0] == '\0') name = "?";

  /* 1. Every rank checks its own list; all fail together if any list is bad. */
  mp_error local = MP_ERROR_INITIALIZER;
  bool ok = check_members(world, members, count, name, &local);
  int first_bad = ok ? world->size : world->rank;
  MP_TRY(world_all_reduce_int(world, &first_bad, MPI_MIN, name, err));
  if (!ok) return mp_fail(err, local.status, "%s", local.message);
  if (first_bad < world->size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: group %s not created: rank %d passed an invalid member list (see its "
                   "message)",
                   world->rank, name, first_bad);
  }

  /* 2. Groups partition the world, so the lowest member names the group. Every rank has arrived
   *    (step 1), so the blocking split cannot wait on a missing rank. */
  mp_comm *comm = calloc(1, sizeof *comm);
  int *copy = malloc((size_t)count * sizeof *copy);
  if (comm == NULL || copy == NULL) {
    free(comm);
    free(copy);
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for group %s", world->rank, name);
  }
  memcpy(copy, members, (size_t)count * sizeof *copy);
  comm->world = world;
  comm->comm = MPI_COMM_NULL;
  comm->members = copy;
  comm->size = count;
  snprintf(comm->name, sizeof comm->name, "%s", name);
  mp_comm_format_members(comm->members_text, sizeof comm->members_text, members, count);
  for (int i = 0; i < count; ++i) {
    if (members[i] == world->rank) comm->rank = i;
  }
  mp_status status =
      MPI_CALL(world->rank, MPI_Comm_split, (world->comm, members[0], world->rank, &comm->comm),
               err);

  /* 3. The group MPI formed must be the one this rank named; otherwise ranks disagreed. */
  int agrees = 0, mpi_size = 0, mpi_rank = -1;
  if (status == MP_OK) status = MPI_CALL(world->rank, MPI_Comm_size, (comm->comm, &mpi_size), err);
  if (status == MP_OK) status = MPI_CALL(world->rank, MPI_Comm_rank, (comm->comm, &mpi_rank), err);
  int *formed = calloc((size_t)(mpi_size > 0 ? mpi_size : 1), sizeof *formed);
  if (status == MP_OK && formed == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for group %s", world->rank,
                     name);
  }
  if (status == MP_OK) {
    /* The split ordered the group by world rank (the key), so its ranks in MPI_COMM_WORLD's
     * group, gathered in order, are the members it formed. */
    MPI_Request request = MPI_REQUEST_NULL;
    status = MPI_CALL(world->rank, MPI_Iallgather,
                      (&world->rank, 1, MPI_INT, formed, 1, MPI_INT, comm->comm, &request), err);
    wait_outcome outcome = WAIT_DONE;
    if (status == MP_OK) {
      status = wait_for(world, &request, mp_poll_now_s() + world->timeout_s, false, &outcome, err);
    }
    if (status == MP_OK && outcome != WAIT_DONE) {
      comm->comm = MPI_COMM_NULL; /* the exchange is still pending on it: left to MPI */
      status = mp_fail(err, MP_ERR_RUNTIME,
                       "rank %d: creating group %s timed out after %.1f s while its members "
                       "exchanged ranks; a member may have died or hung",
                       world->rank, name, world->timeout_s);
    }
  }
  if (status == MP_OK) {
    agrees = mpi_size == count && mpi_rank == comm->rank;
    for (int i = 0; agrees && i < count; ++i) agrees = formed[i] == members[i];
    int first_disagreeing = agrees ? world->size : world->rank;
    status = world_all_reduce_int(world, &first_disagreeing, MPI_MIN, name, err);
    if (status == MP_OK && first_disagreeing < world->size) {
      char formed_text[kMembersTextBytes];
      mp_comm_format_members(formed_text, sizeof formed_text, formed, mpi_size);
      status = mp_fail(
          err, MP_ERR_INPUT,
          "rank %d: group %s not created: ranks disagree on its members (rank %d first); this "
          "rank listed %s, and the ranks whose lowest member is %d are %s. Every rank must pass "
          "its group from one partition of the world (topology/grid.h)",
          world->rank, name, first_disagreeing, comm->members_text, members[0], formed_text);
    }
  }
  free(formed);
  if (status != MP_OK) {
    if (comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
    free(comm->members);
    free(comm);
    return status;
  }
  *out = comm;
  return MP_OK;
}

void mp_comm_free(mp_comm *comm) {
  if (comm == NULL) return;
  /* A broken group may still have an operation inside MPI; its communicator is left alone. */
  if (comm->broken[0] == '\0' && comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
  free(comm->members);
  free(comm);
}

int mp_comm_rank(const mp_comm *comm) { return comm->rank; }
int mp_comm_size(const mp_comm *comm) { return comm->size; }
int mp_comm_member(const mp_comm *comm, int group_rank) {
  return group_rank >= 0 && group_rank < comm->size ? comm->members[group_rank] : -1;
}
const char *mp_comm_name(const mp_comm *comm) { return comm->name; }

/* ---------------------------------------------------------------------------------------------
 * Point to point
 * ------------------------------------------------------------------------------------------- */

static mp_status check_peer(const mp_comm *comm, int peer, const char *operation,
                            const void *buffer, size_t bytes, mp_error *err) {
  if (peer < 0 || peer >= comm->size || peer == comm->rank) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s (ranks %s): peer %d is not another member's group "
                   "rank (0 .. %d, this rank is %d)",
                   comm->world->rank, operation, comm->name, comm->members_text, peer,
                   comm->size - 1, comm->rank);
  }
  if (buffer == NULL && bytes > 0) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: NULL buffer of %zu bytes",
                   comm->world->rank, operation, comm->name, bytes);
  }
  return comm_usable(comm, err);
}

/* A posted operation: one MPI request per chunk of at most kChunkBytes (sends) or kChunkFloats
 * (all-reduces), waited on in order against the deadline of its post. */
struct mp_comm_request {
  mp_comm *comm;
  comm_op op;
  staged_buffer staged; /* the caller's buffer and, for a GPU buffer, its pinned block */
  bool copy_back;       /* the operation writes the buffer: copy the block back to the GPU */
  int num_chunks;
  MPI_Request chunks[]; /* (num_chunks) */
};

static mp_comm_request *request_new(mp_comm *comm, const char *operation, int peer, size_t bytes,
                                    size_t num_chunks) {
  mp_comm_request *request = malloc(sizeof *request + num_chunks * sizeof(MPI_Request));
  if (request == NULL) return NULL;
  request->comm = comm;
  request->op = comm_op_begin(comm, operation, peer, bytes);
  request->staged.device = false;
  request->copy_back = false;
  request->num_chunks = 0;
  return request;
}

/* Frees a request that failed while posting; its pinned block, if any, is abandoned with it
 * (chunks already posted may still read it). */
static void request_abandon(mp_comm_request *request) { free(request); }

mp_status mp_comm_isend(mp_comm *comm, const void *buffer, size_t bytes, int peer,
                        mp_comm_request **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_peer(comm, peer, "send", buffer, bytes, err));
  const size_t num_chunks = bytes == 0 ? 1 : (bytes + kChunkBytes - 1) / kChunkBytes;
  mp_comm_request *request = request_new(comm, "send", peer, bytes, num_chunks);
  if (request == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory posting a send");
  /* A GPU buffer is copied out now, so the caller may reuse it as soon as this returns. */
  const mp_status staged = stage_in(comm, "send", buffer, bytes, true, &request->staged, err);
  if (staged != MP_OK) {
    free(request);
    return staged;
  }
  const char *host = request->staged.host;
  size_t offset = 0;
  do {
    size_t chunk = bytes - offset < kChunkBytes ? bytes - offset : kChunkBytes;
    MPI_Request *slot = &request->chunks[request->num_chunks];
    *slot = MPI_REQUEST_NULL;
    const mp_status status =
        MPI_CALL(comm->world->rank, MPI_Isend,
                 (host + offset, (int)chunk, MPI_BYTE, peer, kTagP2P, comm->comm, slot), err);
    if (status != MP_OK) {
      /* The chunks already posted cannot be withdrawn; the caller stops the run. */
      request_abandon(request);
      return status;
    }
    request->num_chunks++;
    offset += chunk;
  } while (offset < bytes);
  *out = request;
  return MP_OK;
}

mp_status mp_comm_wait(mp_comm_request *request, mp_error *err) {
  if (request == NULL) return MP_OK;
  mp_status status = MP_OK;
  for (int i = 0; i < request->num_chunks && status == MP_OK; ++i) {
    status = comm_wait(request->comm, &request->chunks[i], &request->op, err);
  }
  status = stage_out(request->comm, request->op.operation, &request->staged, request->copy_back,
                     status, err);
  free(request);
  return status;
}

mp_status mp_comm_send(mp_comm *comm, const void *buffer, size_t bytes, int peer, mp_error *err) {
  mp_comm_request *request = NULL;
  MP_TRY(mp_comm_isend(comm, buffer, bytes, peer, &request, err));
  return mp_comm_wait(request, err);
}

mp_status mp_comm_recv(mp_comm *comm, void *buffer, size_t bytes, int peer, mp_error *err) {
  MP_TRY(check_peer(comm, peer, "recv", buffer, bytes, err));
  comm_op op = comm_op_begin(comm, "recv", peer, bytes);
  staged_buffer staged;
  MP_TRY(stage_in(comm, "recv", buffer, bytes, false, &staged, err));
  char *host = staged.host;
  mp_status status = MP_OK;
  size_t offset = 0;
  do {
    size_t chunk = bytes - offset < kChunkBytes ? bytes - offset : kChunkBytes;
    MPI_Request request = MPI_REQUEST_NULL;
    status = MPI_CALL(comm->world->rank, MPI_Irecv,
                      (host + offset, (int)chunk, MPI_BYTE, peer, kTagP2P, comm->comm, &request),
                      err);
    if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
    offset += chunk;
  } while (status == MP_OK && offset < bytes);
  return stage_out(comm, "recv", &staged, true, status, err);
}

/* ---------------------------------------------------------------------------------------------
 * Collectives
 * ------------------------------------------------------------------------------------------- */

static mp_status check_collective(const mp_comm *comm, const char *operation, const void *a,
                                  const void *b, size_t count, mp_error *err) {
  if ((a == NULL || b == NULL) && count > 0) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: NULL buffer for %zu elements",
                   comm->world->rank, operation, comm->name, count);
  }
  return comm_usable(comm, err);
}

/* A one-member reduce-scatter or all-gather: output = input (either may be GPU memory). */
static mp_status copy_alone(const mp_comm *comm, const char *operation, float *output,
                            const float *input, size_t count, mp_error *err) {
  if (output == input || count == 0) return MP_OK;
  if (!mp_staging_is_device(output) && !mp_staging_is_device(input)) {
    memmove(output, input, count * sizeof(float));
    return MP_OK;
  }
  if (mp_staging_copy(output, input, count * sizeof(float), err) != MP_OK) {
    return mp_error_prefix(err, "rank %d: %s in group %s", comm->world->rank, operation,
                           comm->name);
  }
  return MP_OK;
}

static mp_status check_int_count(const mp_comm *comm, const char *operation, size_t count,
                                 mp_error *err) {
  if (count > (size_t)INT_MAX / (size_t)comm->size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: %zu floats per member x %d members is more than one "
                   "MPI call carries (%d); split the buffer",
                   comm->world->rank, operation, comm->name, count, comm->size, INT_MAX);
  }
  return MP_OK;
}

mp_status mp_comm_iall_reduce_sum_f32(mp_comm *comm, float *buffer, size_t count,
                                      mp_comm_request **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_collective(comm, "all-reduce", buffer, buffer, count, err));
  const size_t num_chunks = count == 0 ? 1 : (count + kChunkFloats - 1) / kChunkFloats;
  mp_comm_request *request =
      request_new(comm, "all-reduce", -1, count * sizeof(float), num_chunks);
  if (request == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory posting an all-reduce");
  if (comm->size > 1) { /* a GPU buffer is summed in a pinned block, copied back by the wait */
    const mp_status staged =
        stage_in(comm, "all-reduce", buffer, count * sizeof(float), true, &request->staged, err);
    if (staged != MP_OK) {
      free(request);
      return staged;
    }
    request->copy_back = true;
    buffer = request->staged.host;
  }
  size_t offset = 0;
  while (comm->size > 1 && offset < count) { /* one rank: nothing to sum, the wait is free */
    size_t chunk = count - offset < kChunkFloats ? count - offset : kChunkFloats;
    MPI_Request *slot = &request->chunks[request->num_chunks];
    *slot = MPI_REQUEST_NULL;
    const mp_status status =
        MPI_CALL(comm->world->rank, MPI_Iallreduce,
                 (MPI_IN_PLACE, buffer + offset, (int)chunk, MPI_FLOAT, MPI_SUM, comm->comm,
                  slot),
                 err);
    if (status != MP_OK) {
      request_abandon(request);
      return status;
    }
    request->num_chunks++;
    offset += chunk;
  }
  *out = request;
  return MP_OK;
}

mp_status mp_comm_all_reduce_sum_f32(mp_comm *comm, float *buffer, size_t count, mp_error *err) {
  mp_comm_request *request = NULL;
  MP_TRY(mp_comm_iall_reduce_sum_f32(comm, buffer, count, &request, err));
  return mp_comm_wait(request, err);
}

mp_status mp_comm_reduce_scatter_sum_f32(mp_comm *comm, const float *input, float *output,
                                         size_t count, mp_error *err) {
  MP_TRY(check_collective(comm, "reduce-scatter", input, output, count, err));
  MP_TRY(check_int_count(comm, "reduce-scatter", count, err));
  if (comm->size == 1) return copy_alone(comm, "reduce-scatter", output, input, count, err);
  comm_op op = comm_op_begin(comm, "reduce-scatter", -1, count * comm->size * sizeof(float));
  staged_buffer in, out;
  MP_TRY(stage_in(comm, "reduce-scatter", input, count * comm->size * sizeof(float), true, &in,
                  err));
  mp_status status = stage_in(comm, "reduce-scatter", output, count * sizeof(float), false, &out,
                              err);
  if (status != MP_OK) {
    stage_drop(comm, &in);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Ireduce_scatter_block,
                    (in.host, out.host, (int)count, MPI_FLOAT, MPI_SUM, comm->comm, &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  status = stage_out(comm, "reduce-scatter", &in, false, status, err);
  return stage_out(comm, "reduce-scatter", &out, true, status, err);
}

/* The uneven collectives' counts (counts[r] floats for group rank r) as MPI takes them: *total
 * their sum, which must fit an int, and *out the int counts followed by their displacements
 * (2 x size ints, the caller frees). */
static mp_status uneven_counts(const mp_comm *comm, const char *operation, const size_t *counts,
                               size_t *total, int **out, mp_error *err) {
  *total = 0;
  for (int r = 0; r < comm->size; ++r) *total += counts[r];
  if (*total > (size_t)INT_MAX) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: %zu floats is more than one MPI call carries (%d); "
                   "split the buffer",
                   comm->world->rank, operation, comm->name, *total, INT_MAX);
  }
  *out = malloc((size_t)comm->size * 2 * sizeof **out);
  if (*out == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  size_t at = 0;
  for (int r = 0; r < comm->size; ++r) {
    (*out)[r] = (int)counts[r];
    (*out)[comm->size + r] = (int)at;
    at += counts[r];
  }
  return MP_OK;
}

mp_status mp_comm_reduce_scatter_v_sum_f32(mp_comm *comm, const float *input, float *output,
                                           const size_t *counts, mp_error *err) {
  MP_TRY(check_collective(comm, "reduce-scatter", input, output, 0, err)); /* usable */
  const size_t mine = counts[comm->rank];
  size_t total = 0;
  int *recv_counts = NULL;
  MP_TRY(uneven_counts(comm, "reduce-scatter", counts, &total, &recv_counts, err));
  if ((input == NULL && total > 0) || (output == NULL && mine > 0)) {
    free(recv_counts);
    return mp_fail(err, MP_ERR_INPUT, "rank %d: reduce-scatter in group %s: NULL buffer",
                   comm->world->rank, comm->name);
  }
  if (comm->size == 1) {
    free(recv_counts);
    return copy_alone(comm, "reduce-scatter", output, input, mine, err);
  }
  comm_op op = comm_op_begin(comm, "reduce-scatter", -1, total * sizeof(float));
  staged_buffer in, out;
  mp_status status =
      stage_in(comm, "reduce-scatter", input, total * sizeof(float), true, &in, err);
  if (status != MP_OK) {
    free(recv_counts);
    return status;
  }
  status = stage_in(comm, "reduce-scatter", output, mine * sizeof(float), false, &out, err);
  if (status != MP_OK) {
    stage_drop(comm, &in);
    free(recv_counts);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Ireduce_scatter,
                    (in.host, out.host, recv_counts, MPI_FLOAT, MPI_SUM, comm->comm, &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  free(recv_counts);
  status = stage_out(comm, "reduce-scatter", &in, false, status, err);
  return stage_out(comm, "reduce-scatter", &out, true, status, err);
}

mp_status mp_comm_all_gather_f32(mp_comm *comm, const float *input, float *output, size_t count,
                                 mp_error *err) {
  MP_TRY(check_collective(comm, "all-gather", input, output, count, err));
  MP_TRY(check_int_count(comm, "all-gather", count, err));
  if (comm->size == 1) return copy_alone(comm, "all-gather", output, input, count, err);
  comm_op op = comm_op_begin(comm, "all-gather", -1, count * comm->size * sizeof(float));
  staged_buffer in, out;
  MP_TRY(stage_in(comm, "all-gather", input, count * sizeof(float), true, &in, err));
  mp_status status = stage_in(comm, "all-gather", output, count * comm->size * sizeof(float),
                              false, &out, err);
  if (status != MP_OK) {
    stage_drop(comm, &in);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Iallgather,
                    (in.host, (int)count, MPI_FLOAT, out.host, (int)count, MPI_FLOAT, comm->comm,
                     &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  status = stage_out(comm, "all-gather", &in, false, status, err);
  return stage_out(comm, "all-gather", &out, true, status, err);
}

/* The uneven all-gathers' one body: counts in elements of `type` (elem_bytes each). */
static mp_status all_gather_v(mp_comm *comm, const void *input, void *output,
                              const size_t *counts, MPI_Datatype type, size_t elem_bytes,
                              mp_error *err) {
  MP_TRY(check_collective(comm, "all-gather", output, output, 0, err)); /* usable */
  const size_t mine = counts[comm->rank];
  if (mp_staging_is_device(output) || (input != NULL && mp_staging_is_device(input))) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: all-gather (uneven) in group %s takes host buffers only",
                   comm->world->rank, comm->name);
  }
  size_t total = 0;
  int *recv_counts = NULL;
  MP_TRY(uneven_counts(comm, "all-gather", counts, &total, &recv_counts, err));
  const int *displacements = recv_counts + comm->size;
  if (output == NULL && total > 0) {
    free(recv_counts);
    return mp_fail(err, MP_ERR_INPUT, "rank %d: all-gather in group %s: NULL output",
                   comm->world->rank, comm->name);
  }
  mp_status status = MP_OK;
  if (comm->size == 1) {
    if (input != NULL && mine > 0) memmove(output, input, mine * elem_bytes);
  } else {
    comm_op op = comm_op_begin(comm, "all-gather", -1, total * elem_bytes);
    MPI_Request request = MPI_REQUEST_NULL;
    status = MPI_CALL(comm->world->rank, MPI_Iallgatherv,
                      (input != NULL ? input : MPI_IN_PLACE, (int)mine, type, output,
                       recv_counts, displacements, type, comm->comm, &request),
                      err);
    if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  }
  free(recv_counts);
  return status;
}

mp_status mp_comm_all_gather_v_f32(mp_comm *comm, const float *input, float *output,
                                   const size_t *counts, mp_error *err) {
  return all_gather_v(comm, input, output, counts, MPI_FLOAT, sizeof(float), err);
}

mp_status mp_comm_all_gather_v_bf16(mp_comm *comm, const uint16_t *input, uint16_t *output,
                                    const size_t *counts, mp_error *err) {
  return all_gather_v(comm, input, output, counts, MPI_UINT16_T, sizeof(uint16_t), err);
}

mp_status mp_comm_broadcast(mp_comm *comm, void *buffer, size_t bytes, int root, mp_error *err) {
  MP_TRY(check_collective(comm, "broadcast", buffer, buffer, bytes, err));
  if (root < 0 || root >= comm->size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: broadcast in group %s (ranks %s): root %d is not a group rank "
                   "(0 .. %d)",
                   comm->world->rank, comm->name, comm->members_text, root, comm->size - 1);
  }
  if (comm->size == 1) return MP_OK;
  comm_op op = comm_op_begin(comm, "broadcast", -1, bytes);
  const bool is_root = comm->rank == root;
  staged_buffer staged;
  MP_TRY(stage_in(comm, "broadcast", buffer, bytes, is_root, &staged, err));
  char *host = staged.host;
  mp_status status = MP_OK;
  size_t offset = 0;
  do {
    size_t chunk = bytes - offset < kChunkBytes ? bytes - offset : kChunkBytes;
    MPI_Request request = MPI_REQUEST_NULL;
    status = MPI_CALL(comm->world->rank, MPI_Ibcast,
                      (host + offset, (int)chunk, MPI_BYTE, root, comm->comm, &request), err);
    if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
    offset += chunk;
  } while (status == MP_OK && offset < bytes);
  return stage_out(comm, "broadcast", &staged, !is_root, status, err);
}

mp_status mp_comm_barrier(mp_comm *comm, mp_error *err) {
  MP_TRY(comm_usable(comm, err));
  if (comm->size == 1) return MP_OK;
  comm_op op = comm_op_begin(comm, "barrier", -1, 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MP_TRY(MPI_CALL(comm->world->rank, MPI_Ibarrier, (comm->comm, &request), err));
  return comm_wait(comm, &request, &op, err);
}

mp_status mp_comm_agree(mp_comm *comm, mp_status status, mp_error *err) {
  if (comm == NULL) return status;
  mp_error mine = MP_ERROR_INITIALIZER;
  if (status != MP_OK) {
    if (err != NULL) mine = *err;
    mine.status = status;
  }
  const bool failed = status != MP_OK;
  float failures = failed ? 1.0f : 0.0f;
  MP_TRY(mp_comm_all_reduce_sum_f32(comm, &failures, 1, err));
  if (failures == 0.0f) return MP_OK;
  /* The lowest failing rank lies in [lo, hi): halve by counting the failures below the middle. */
  int lo = 0, hi = mp_comm_size(comm);
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    float below = failed && mp_comm_rank(comm) < mid ? 1.0f : 0.0f;
    MP_TRY(mp_comm_all_reduce_sum_f32(comm, &below, 1, err));
    if (below > 0.0f) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  MP_TRY(mp_comm_broadcast(comm, &mine, sizeof mine, lo, err));
  if (err != NULL) *err = mine;
  return mine.status != MP_OK ? mine.status : MP_ERR_RUNTIME;
}
