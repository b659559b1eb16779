/*
 * engine/comm/comm_nccl_internal.h — comm_nccl.h's private header, for its implementations
 * (comm_nccl_cuda.cu and comm_nccl_emulated.c): what both know of a communicator's group (its
 * name, members and this process's place, for messages), and the argument checks of every
 * comm_nccl.h call, written once so that the two implementations refuse the same arguments with
 * the same words.
 *
 * Every check fails with MP_ERR_INPUT naming this rank, the operation, the group and the argument,
 * and posts nothing. Checks take the communicator's mp_nccl_group_info, NULL for a NULL
 * communicator, which is refused first ("<operation>: NULL NCCL communicator").
 */
#ifndef MPENGINE_ENGINE_COMM_NCCL_INTERNAL_H
#define MPENGINE_ENGINE_COMM_NCCL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  MP_NCCL_NAME_BYTES = 32,
  MP_NCCL_MEMBERS_TEXT_BYTES = 160,
  MP_NCCL_WHAT_BYTES = 320, /* "send to rank 3 and recv from rank 1 in group pp" */
};

/* The group of a communicator as the checks and messages see it; each implementation's
 * mp_nccl_comm holds one. */
typedef struct {
  int world_rank;                              /* this process, for messages */
  char name[MP_NCCL_NAME_BYTES];               /* the MPI group's name, or "self" */
  int rank, size;                              /* this process's group rank; members */
  int *members;                                /* (size) world ranks */
  char members_text[MP_NCCL_MEMBERS_TEXT_BYTES]; /* "1,3", for messages */
  /* True when the collectives can use `buffer` (CUDA: device or managed memory); NULL accepts any
   * non-NULL pointer (emulated device memory is host memory). */
  bool (*is_device_memory)(const void *buffer);
} mp_nccl_group_info;

/* Fills *info for `group` (NULL: a one-member group "self" of this process, world rank
 * world_rank). MP_ERR_RUNTIME when out of memory; free with mp_nccl_group_info_free. */
mp_status mp_nccl_group_info_init(mp_nccl_group_info *info, int world_rank, mp_comm *group,
                                  mp_error *err);
void mp_nccl_group_info_free(mp_nccl_group_info *info);

/* "all-reduce in group dp (ranks 1,3)" into what (capacity bytes). */
void mp_nccl_describe(const mp_nccl_group_info *info, const char *operation, char *what,
                      size_t capacity);

/* Bytes of one element: 4, 2, or 0 for a type that is not an mp_nccl_dtype. */
size_t mp_nccl_dtype_bytes(mp_nccl_dtype dtype);

/* --- Checks of the comm_nccl.h calls (info NULL: the call's communicator was NULL) --- */

/* The communicator alone (waits, ordering, synchronize). */
mp_status mp_nccl_check_comm(const mp_nccl_group_info *info, const char *operation,
                             mp_error *err);

/* mp_nccl_comm_mark and mp_nccl_stream_wait_mark: the communicator and the slot. */
mp_status mp_nccl_check_mark(const mp_nccl_group_info *info, const char *operation, int slot,
                             mp_error *err);

/* mp_nccl_p2p: count and ops, each op's kind, peer and buffer. Writes the description for
 * messages, "send to rank 3 and recv from rank 1 in group pp", into what (capacity bytes), and
 * the operations' bytes to *bytes. */
mp_status mp_nccl_check_p2p(const mp_nccl_group_info *info, const mp_nccl_p2p_op *ops, int count,
                            char *what, size_t capacity, size_t *bytes, mp_error *err);

mp_status mp_nccl_check_all_reduce(const mp_nccl_group_info *info, const void *buffer,
                                   size_t count, mp_nccl_dtype dtype, mp_error *err);

mp_status mp_nccl_check_reduce_scatter(const mp_nccl_group_info *info, const void *input,
                                       const void *output, size_t count, mp_nccl_dtype dtype,
                                       mp_error *err);

/* mp_nccl_reduce_scatter_v_sum_f32; *total = the counts' sum. */
mp_status mp_nccl_check_reduce_scatter_v(const mp_nccl_group_info *info, const float *input,
                                         const float *output, const size_t *counts,
                                         size_t *total, mp_error *err);

mp_status mp_nccl_check_all_gather(const mp_nccl_group_info *info, const void *input,
                                   const void *output, size_t count, mp_nccl_dtype dtype,
                                   mp_error *err);

/* mp_nccl_all_gather_v (input NULL: in place); *total = the counts' sum. */
mp_status mp_nccl_check_all_gather_v(const mp_nccl_group_info *info, const void *input,
                                     const void *output, const size_t *counts,
                                     mp_nccl_dtype dtype, size_t *total, mp_error *err);

mp_status mp_nccl_check_broadcast(const mp_nccl_group_info *info, const void *buffer,
                                  size_t bytes, int root, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_NCCL_INTERNAL_H */
