/* engine/comm/comm_nccl_internal.c — the NCCL communicators' group description and argument
 * checks; see comm_nccl_internal.h. */
#include "engine/comm/comm_nccl_internal.h"

#include <stdio.h>
#include <stdlib.h>

mp_status mp_nccl_group_info_init(mp_nccl_group_info *info, int world_rank, mp_comm *group,
                                  mp_error *err) {
  const int size = group != NULL ? mp_comm_size(group) : 1;
  int *members = malloc((size_t)size * sizeof *members);
  if (members == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for an NCCL communicator",
                   world_rank);
  }
  info->world_rank = world_rank;
  info->members = members;
  info->size = size;
  info->is_device_memory = NULL;
  if (group != NULL) {
    info->rank = mp_comm_rank(group);
    for (int i = 0; i < size; ++i) members[i] = mp_comm_member(group, i);
    snprintf(info->name, sizeof info->name, "%s", mp_comm_name(group));
  } else {
    info->rank = 0;
    members[0] = world_rank;
    snprintf(info->name, sizeof info->name, "self");
  }
  mp_comm_format_members(info->members_text, sizeof info->members_text, members, size);
  return MP_OK;
}

void mp_nccl_group_info_free(mp_nccl_group_info *info) {
  free(info->members);
  info->members = NULL;
}

void mp_nccl_describe(const mp_nccl_group_info *info, const char *operation, char *what,
                      size_t capacity) {
  snprintf(what, capacity, "%s in group %s (ranks %s)", operation, info->name,
           info->members_text);
}

size_t mp_nccl_dtype_bytes(mp_nccl_dtype dtype) {
  switch (dtype) {
    case MP_NCCL_FLOAT32: return 4;
    case MP_NCCL_BFLOAT16: return 2;
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The pieces
 * ------------------------------------------------------------------------------------------- */

mp_status mp_nccl_check_comm(const mp_nccl_group_info *info, const char *operation,
                             mp_error *err) {
  if (info == NULL) return mp_fail(err, MP_ERR_INPUT, "%s: NULL NCCL communicator", operation);
  return MP_OK;
}

static mp_status check_dtype(const mp_nccl_group_info *info, const char *operation,
                             mp_nccl_dtype dtype, mp_error *err) {
  if (mp_nccl_dtype_bytes(dtype) == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: unknown element type %d (MP_NCCL_FLOAT32 or "
                   "MP_NCCL_BFLOAT16)",
                   info->world_rank, operation, info->name, (int)dtype);
  }
  return MP_OK;
}

/* A buffer of bytes > 0 is not NULL, and is memory the collectives can use (NCCL faults on host
 * memory). */
static mp_status check_buffer(const mp_nccl_group_info *info, const char *operation,
                              const char *which, const void *buffer, size_t bytes,
                              mp_error *err) {
  if (bytes == 0) return MP_OK;
  if (buffer == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: NULL %s of %zu bytes",
                   info->world_rank, operation, info->name, which, bytes);
  }
  if (info->is_device_memory != NULL && !info->is_device_memory(buffer)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: %s in group %s: the %s (%zu bytes) is host memory; NCCL needs GPU "
                   "memory (cudaMalloc). The MPI communicators (engine/comm/comm.h) take host "
                   "buffers",
                   info->world_rank, operation, info->name, which, bytes);
  }
  return MP_OK;
}

/* count * multiple elements of dtype (and an implementation's fp32 temporaries for them) fit a
 * size_t. */
static mp_status check_count(const mp_nccl_group_info *info, const char *operation, size_t count,
                             size_t multiple, mp_nccl_dtype dtype, mp_error *err) {
  if (count > ((size_t)-1 / 2) / multiple / mp_nccl_dtype_bytes(dtype)) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: %s in group %s: %zu elements is too many",
                   info->world_rank, operation, info->name, count);
  }
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The calls
 * ------------------------------------------------------------------------------------------- */

mp_status mp_nccl_check_mark(const mp_nccl_group_info *info, const char *operation, int slot,
                             mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, operation, err));
  if (slot >= 0 && slot < MP_NCCL_MARKS) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT, "rank %d: group %s: mark %d is not one of 0 .. %d",
                 info->world_rank, info->name, slot, MP_NCCL_MARKS - 1);
}

mp_status mp_nccl_check_p2p(const mp_nccl_group_info *info, const mp_nccl_p2p_op *ops, int count,
                            char *what, size_t capacity, size_t *bytes, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "send/recv", err));
  if (count < 0 || (ops == NULL && count > 0)) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: send/recv in group %s: %d operations at %p",
                   info->world_rank, info->name, count, (const void *)ops);
  }
  size_t used = 0;
  what[0] = '\0';
  *bytes = 0;
  for (int i = 0; i < count; ++i) {
    const mp_nccl_p2p_op *op = &ops[i];
    if (op->kind != MP_NCCL_SEND && op->kind != MP_NCCL_RECV) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d: send/recv in group %s: operation %d has kind %d (MP_NCCL_SEND or "
                     "MP_NCCL_RECV)",
                     info->world_rank, info->name, i, (int)op->kind);
    }
    const bool send = op->kind == MP_NCCL_SEND;
    const char *kind = send ? "send" : "recv";
    if (op->peer < 0 || op->peer >= info->size) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d: %s in group %s (ranks %s): peer %d is not a group rank (0 .. %d)",
                     info->world_rank, kind, info->name, info->members_text, op->peer,
                     info->size - 1);
    }
    MP_TRY(check_buffer(info, kind, send ? "send buffer" : "receive buffer", op->buffer,
                        op->bytes, err));
    *bytes += op->bytes;
    if (used < capacity) {
      int n = snprintf(what + used, capacity - used, "%s%s %s rank %d", i > 0 ? " and " : "",
                       kind, send ? "to" : "from", info->members[op->peer]);
      if (n > 0) used += (size_t)n;
    }
  }
  if (used < capacity) snprintf(what + used, capacity - used, " in group %s", info->name);
  return MP_OK;
}

mp_status mp_nccl_check_all_reduce(const mp_nccl_group_info *info, const void *buffer,
                                   size_t count, mp_nccl_dtype dtype, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "all-reduce", err));
  MP_TRY(check_dtype(info, "all-reduce", dtype, err));
  MP_TRY(check_count(info, "all-reduce", count, 1, dtype, err));
  return check_buffer(info, "all-reduce", "buffer", buffer, count * mp_nccl_dtype_bytes(dtype),
                      err);
}

mp_status mp_nccl_check_reduce_scatter(const mp_nccl_group_info *info, const void *input,
                                       const void *output, size_t count, mp_nccl_dtype dtype,
                                       mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "reduce-scatter", err));
  MP_TRY(check_dtype(info, "reduce-scatter", dtype, err));
  MP_TRY(check_count(info, "reduce-scatter", count, (size_t)info->size, dtype, err));
  const size_t bytes = count * mp_nccl_dtype_bytes(dtype);
  MP_TRY(check_buffer(info, "reduce-scatter", "input", input, bytes * info->size, err));
  return check_buffer(info, "reduce-scatter", "output", output, bytes, err);
}

mp_status mp_nccl_check_reduce_scatter_v(const mp_nccl_group_info *info, const float *input,
                                         const float *output, const size_t *counts,
                                         size_t *total, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "reduce-scatter", err));
  *total = 0;
  for (int r = 0; r < info->size; ++r) {
    MP_TRY(check_count(info, "reduce-scatter", counts[r], 1, MP_NCCL_FLOAT32, err));
    *total += counts[r];
  }
  const size_t mine = counts[info->rank];
  MP_TRY(check_buffer(info, "reduce-scatter", "input", input, *total * sizeof(float), err));
  return check_buffer(info, "reduce-scatter", "output", output, mine * sizeof(float), err);
}

mp_status mp_nccl_check_all_gather(const mp_nccl_group_info *info, const void *input,
                                   const void *output, size_t count, mp_nccl_dtype dtype,
                                   mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "all-gather", err));
  MP_TRY(check_dtype(info, "all-gather", dtype, err));
  MP_TRY(check_count(info, "all-gather", count, (size_t)info->size, dtype, err));
  const size_t bytes = count * mp_nccl_dtype_bytes(dtype);
  MP_TRY(check_buffer(info, "all-gather", "input", input, bytes, err));
  return check_buffer(info, "all-gather", "output", output, bytes * info->size, err);
}

mp_status mp_nccl_check_all_gather_v(const mp_nccl_group_info *info, const void *input,
                                     const void *output, const size_t *counts,
                                     mp_nccl_dtype dtype, size_t *total, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "all-gather", err));
  MP_TRY(check_dtype(info, "all-gather", dtype, err));
  const size_t elem = mp_nccl_dtype_bytes(dtype);
  *total = 0;
  for (int r = 0; r < info->size; ++r) {
    MP_TRY(check_count(info, "all-gather", counts[r], 1, dtype, err));
    *total += counts[r];
  }
  const size_t mine = counts[info->rank];
  if (input != NULL) MP_TRY(check_buffer(info, "all-gather", "input", input, mine * elem, err));
  return check_buffer(info, "all-gather", "output", output, *total * elem, err);
}

mp_status mp_nccl_check_broadcast(const mp_nccl_group_info *info, const void *buffer,
                                  size_t bytes, int root, mp_error *err) {
  MP_TRY(mp_nccl_check_comm(info, "broadcast", err));
  if (root < 0 || root >= info->size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: broadcast in group %s (ranks %s): root %d is not a group rank "
                   "(0 .. %d)",
                   info->world_rank, info->name, info->members_text, root, info->size - 1);
  }
  return check_buffer(info, "broadcast", "buffer", buffer, bytes, err);
}
