/*
 * engine/comm/comm_mpi_internal.h — private to the MPI communicators: what comm_mpi.c (the world,
 * groups, waits, staging of GPU buffers, point-to-point) and comm_mpi_collectives.c share.
 */
#ifndef MPENGINE_ENGINE_COMM_MPI_INTERNAL_H
#define MPENGINE_ENGINE_COMM_MPI_INTERNAL_H

/* Debian puts Open MPI's headers under /usr/include/<triplet>/mpi, which gcc searches through the
 * multiarch directory; @system//:mpi's -isystem copt does not reach dependents (Bazel copts do not
 * propagate), so the header is named with its directory. */
#include <mpi/mpi.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "engine/comm/comm.h"

enum {
  kTagP2P = 1,
  kNameBytes = 32,
  kMembersTextBytes = 160,
  kBrokenBytes = 512,
  kStagingSlots = 8,               /* pinned blocks a world keeps for reuse */
};
static const size_t kChunkBytes = (size_t)1 << 30;
static const size_t kChunkFloats = (size_t)1 << 28;

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

/* MPI_CALL(rank, MPI_Foo, (args), err): calls MPI_Foo(args); yields MP_OK or an error naming the
 * rank (when >= 0), the MPI function, the file and the line. */
mp_status comm_mpi_check(int world_rank, int code, const char *call, const char *file, int line,
                         mp_error *err);
#define MPI_CALL(world_rank, function, args, err) \
  comm_mpi_check((world_rank), function args, #function, __FILE__, __LINE__, (err))

/* A group's operation being waited on. */
typedef struct {
  const char *operation; /* "send", "recv", "all-reduce", ... */
  int peer;              /* group rank for send/recv; -1 for collectives */
  size_t bytes;          /* the caller's whole message, for the message */
  double deadline;
} comm_op;

/* A caller's buffer as MPI sees it: the buffer itself when it is host memory, else a pinned block
 * of the world's (or one of its own when every slot is taken). */
typedef struct {
  void *user;   /* the caller's buffer */
  void *host;   /* what MPI reads or writes: user, or the pinned block */
  size_t bytes;
  bool device;  /* user is GPU memory, host is a pinned block */
} staged_buffer;

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
/* Starts an operation's clock: its deadline is now + the world's timeout. */
comm_op comm_op_begin(const mp_comm *comm, const char *operation, int peer, size_t bytes);
/* Waits for request against op's deadline; a timeout names the rank, the group, the peer or the
 * members and the bytes, and marks the group broken when MPI still holds the operation. */
mp_status comm_wait(mp_comm *comm, MPI_Request *request, const comm_op *op, mp_error *err);
/* MP_ERR_RUNTIME with the reason when an earlier timeout left the group unusable. */
mp_status comm_usable(const mp_comm *comm, mp_error *err);

/* The host view of `user` for an operation that reads it (fill: copied from the GPU) or only
 * writes it; host memory is its own view. comm_stage_drop returns the block of a buffer MPI never
 * saw; comm_stage_out, after the operation, copies what it wrote back to the GPU (copy_back) and
 * returns the block, or after a failure abandons it (MPI may still use it). */
mp_status comm_stage_in(mp_comm *comm, const char *operation, const void *user, size_t bytes,
                        bool fill, staged_buffer *staged, mp_error *err);
void comm_stage_drop(mp_comm *comm, staged_buffer *staged);
mp_status comm_stage_out(mp_comm *comm, const char *operation, staged_buffer *staged,
                         bool copy_back, mp_status status, mp_error *err);

/* A request for up to num_chunks MPI requests (NULL when out of memory); comm_request_abandon
 * frees one that failed while posting, abandoning its pinned block with it. */
mp_comm_request *comm_request_new(mp_comm *comm, const char *operation, int peer, size_t bytes,
                                  size_t num_chunks);
void comm_request_abandon(mp_comm_request *request);

#endif /* MPENGINE_ENGINE_COMM_MPI_INTERNAL_H */
