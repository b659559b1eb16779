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

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm_mpi_internal.h" /* the structs, MPI_CALL, the waits and the staging */
#include "engine/comm/comm_staging.h"
#include "engine/comm/poll_wait.h"

static const double kCancelGraceS = 1.0; /* how long a cancelled receive may take to complete */
/* Open MPI moves a non-blocking operation forward only inside MPI calls, so a sleep between polls
 * stalls the transfer (a 16 MiB all-reduce ran 6x slower with 1 ms sleeps). A wait therefore
 * spins on MPI_Test, yielding the core to other ranks between polls (what Open MPI's own
 * MPI_Wait does when oversubscribed), for its first kSpinSeconds; a wait that has lasted that
 * long is almost surely on a stuck or far-behind peer, and from then on it sleeps between polls
 * (poll_wait.h) so that waiting out a long timeout costs little CPU. */
static const double kSpinSeconds = 10.0;

/* ---------------------------------------------------------------------------------------------
 * Checks and clocks
 * ------------------------------------------------------------------------------------------- */

mp_status comm_mpi_check(int world_rank, int code, const char *call, const char *file, int line,
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

comm_op comm_op_begin(const mp_comm *comm, const char *operation, int peer, size_t bytes) {
  comm_op op = {operation, peer, bytes, mp_poll_now_s() + comm->world->timeout_s};
  return op;
}

mp_status comm_wait(mp_comm *comm, MPI_Request *request, const comm_op *op, mp_error *err) {
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

mp_status comm_usable(const mp_comm *comm, mp_error *err) {
  if (comm->broken[0] != '\0') return mp_fail(err, MP_ERR_RUNTIME, "%s", comm->broken);
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * GPU buffers, staged through pinned host memory
 * ------------------------------------------------------------------------------------------- */

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
mp_status comm_stage_in(mp_comm *comm, const char *operation, const void *user, size_t bytes,
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
    return mp_error_prefix(err,
                           "rank %d: %s in group %s: staging %zu bytes of a GPU buffer through "
                           "host memory",
                           comm->world->rank, operation, comm->name, bytes);
  }
  return MP_OK;
}

/* Returns the block of a buffer that MPI never saw. */
void comm_stage_drop(mp_comm *comm, staged_buffer *staged) {
  if (staged->device) staging_release(comm->world, staged->host);
  staged->device = false;
}

/* After the operation: on success copies what it wrote back to the GPU (copy_back) and returns the
 * block; after a failure the block is abandoned, since MPI may still use it. */
mp_status comm_stage_out(mp_comm *comm, const char *operation, staged_buffer *staged,
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

/* The first message between the ranks, before any blocking MPI call: every rank sends one int to
 * and receives one from each peer below, nonblocking, and polls until all have arrived or
 * timeout_s has passed. MPI's transports connect on the first message, and the first collective
 * (MPI_Comm_dup below) is blocking: behind a firewall that drops packets its TCP connect never
 * completes and MPI_Comm_dup would wait forever, printing nothing. Here the wait has a deadline and
 * the error names the peers that did not answer. The peers: every other rank up to 256 ranks
 * (N - 1 tiny messages a rank), beyond that rank +- 2^k (a dissemination pattern, log N peers),
 * so that a large job does not open N^2 connections only to check them. */
enum { kHandshakeTag = 0x6d70, kHandshakeAllPairsUpTo = 256 };

static mp_status world_handshake(int rank, int size, double timeout_s, mp_error *err) {
  if (size <= 1) return MP_OK;
  int *peers = malloc((size_t)2 * (size_t)size * sizeof *peers);
  MPI_Request *requests = malloc((size_t)4 * (size_t)size * sizeof *requests);
  int *words = calloc((size_t)2 * (size_t)size, sizeof *words);
  if (peers == NULL || requests == NULL || words == NULL) {
    free(peers);
    free(requests);
    free(words);
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for the start-up handshake", rank);
  }
  int count = 0;
  if (size <= kHandshakeAllPairsUpTo) {
    for (int r = 0; r < size; ++r) {
      if (r != rank) peers[count++] = r;
    }
  } else {
    for (int step = 1; step < size; step *= 2) {
      peers[count++] = (rank + step) % size;
      peers[count++] = (rank - step % size + size) % size;
    }
  }
  mp_status status = MP_OK;
  for (int i = 0; i < count && status == MP_OK; ++i) {
    words[i] = rank;
    status = MPI_CALL(rank, MPI_Irecv,
                      (&words[size + i], 1, MPI_INT, peers[i], kHandshakeTag, MPI_COMM_WORLD,
                       &requests[2 * i]),
                      err);
    if (status == MP_OK) {
      status = MPI_CALL(rank, MPI_Isend,
                        (&words[i], 1, MPI_INT, peers[i], kHandshakeTag, MPI_COMM_WORLD,
                         &requests[2 * i + 1]),
                        err);
    }
  }
  const double deadline = mp_poll_now_s() + timeout_s;
  int left = 2 * count;
  while (status == MP_OK && left > 0) {
    left = 0;
    for (int i = 0; i < 2 * count && status == MP_OK; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      status = MPI_CALL(rank, MPI_Test, (&requests[i], &done, MPI_STATUS_IGNORE), err);
      if (!done) ++left;
    }
    if (left > 0 && mp_poll_now_s() > deadline) break;
    if (left > 0) nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
  }
  if (status == MP_OK && left > 0) {
    /* The peers still pending, as a list; the requests are left to MPI (the caller ends the
     * process: a transport stuck in connect cannot be withdrawn from). */
    char list[1024] = "";
    size_t used = 0;
    int named = 0;
    for (int i = 0; i < count; ++i) {
      if (requests[2 * i] == MPI_REQUEST_NULL && requests[2 * i + 1] == MPI_REQUEST_NULL) continue;
      if (used < sizeof list - 16) {
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", named > 0 ? ", " : "",
                                 peers[i]);
      }
      ++named;
    }
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "rank %d: start-up: no connection within %g s (--comm-timeout) to world "
                     "rank%s %s: the network between their hosts drops or blocks MPI's "
                     "connections (a firewall, a route, the wrong interface); check the hosts "
                     "with `mpengine doctor`",
                     rank, timeout_s, named == 1 ? "" : "s", list);
  }
  free(peers);
  free(requests);
  free(words);
  return status;
}

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
  int world_rank = 0, world_size = 1;
  mp_status status = MPI_CALL(-1, MPI_Comm_rank, (MPI_COMM_WORLD, &world_rank), err);
  if (status == MP_OK) status = MPI_CALL(-1, MPI_Comm_size, (MPI_COMM_WORLD, &world_size), err);
  if (status == MP_OK) status = world_handshake(world_rank, world_size, timeout_s, err);
  if (status != MP_OK) {
    /* No MPI_Finalize: it would wait on the peers that never answered. */
    free(world);
    return status;
  }
  status = MPI_CALL(-1, MPI_Comm_dup, (MPI_COMM_WORLD, &world->comm), err);
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

mp_comm_request *comm_request_new(mp_comm *comm, const char *operation, int peer, size_t bytes,
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
void comm_request_abandon(mp_comm_request *request) { free(request); }

mp_status mp_comm_isend(mp_comm *comm, const void *buffer, size_t bytes, int peer,
                        mp_comm_request **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_peer(comm, peer, "send", buffer, bytes, err));
  const size_t num_chunks = bytes == 0 ? 1 : (bytes + kChunkBytes - 1) / kChunkBytes;
  mp_comm_request *request = comm_request_new(comm, "send", peer, bytes, num_chunks);
  if (request == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory posting a send");
  /* A GPU buffer is copied out now, so the caller may reuse it as soon as this returns. */
  const mp_status staged = comm_stage_in(comm, "send", buffer, bytes, true, &request->staged, err);
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
      comm_request_abandon(request);
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
  status = comm_stage_out(request->comm, request->op.operation, &request->staged,
                          request->copy_back, status, err);
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
  MP_TRY(comm_stage_in(comm, "recv", buffer, bytes, false, &staged, err));
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
  return comm_stage_out(comm, "recv", &staged, true, status, err);
}
