/* engine/comm/comm_mpi_collectives.c — comm.h's collectives on Open MPI: all-reduce (blocking and
 * posted), reduce-scatter, all-gather (even and uneven), all-to-all (even and uneven), broadcast,
 * barrier and agreement, each bounded by the world's timeout and split into int-sized MPI calls
 * (comm_mpi.c says how). */
#define _POSIX_C_SOURCE 200809L
#include "engine/comm/comm.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_mpi_internal.h"
#include "engine/comm/comm_staging.h"

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
      comm_request_new(comm, "all-reduce", -1, count * sizeof(float), num_chunks);
  if (request == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory posting an all-reduce");
  if (comm->size > 1) { /* a GPU buffer is summed in a pinned block, copied back by the wait */
    const mp_status staged = comm_stage_in(comm, "all-reduce", buffer, count * sizeof(float), true,
                                           &request->staged, err);
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
      comm_request_abandon(request);
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
  MP_TRY(comm_stage_in(comm, "reduce-scatter", input, count * comm->size * sizeof(float), true, &in,
                       err));
  mp_status status =
      comm_stage_in(comm, "reduce-scatter", output, count * sizeof(float), false, &out, err);
  if (status != MP_OK) {
    comm_stage_drop(comm, &in);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Ireduce_scatter_block,
                    (in.host, out.host, (int)count, MPI_FLOAT, MPI_SUM, comm->comm, &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  status = comm_stage_out(comm, "reduce-scatter", &in, false, status, err);
  return comm_stage_out(comm, "reduce-scatter", &out, true, status, err);
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
      comm_stage_in(comm, "reduce-scatter", input, total * sizeof(float), true, &in, err);
  if (status != MP_OK) {
    free(recv_counts);
    return status;
  }
  status = comm_stage_in(comm, "reduce-scatter", output, mine * sizeof(float), false, &out, err);
  if (status != MP_OK) {
    comm_stage_drop(comm, &in);
    free(recv_counts);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Ireduce_scatter,
                    (in.host, out.host, recv_counts, MPI_FLOAT, MPI_SUM, comm->comm, &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  free(recv_counts);
  status = comm_stage_out(comm, "reduce-scatter", &in, false, status, err);
  return comm_stage_out(comm, "reduce-scatter", &out, true, status, err);
}

mp_status mp_comm_all_gather_f32(mp_comm *comm, const float *input, float *output, size_t count,
                                 mp_error *err) {
  MP_TRY(check_collective(comm, "all-gather", input, output, count, err));
  MP_TRY(check_int_count(comm, "all-gather", count, err));
  if (comm->size == 1) return copy_alone(comm, "all-gather", output, input, count, err);
  comm_op op = comm_op_begin(comm, "all-gather", -1, count * comm->size * sizeof(float));
  staged_buffer in, out;
  MP_TRY(comm_stage_in(comm, "all-gather", input, count * sizeof(float), true, &in, err));
  mp_status status = comm_stage_in(comm, "all-gather", output, count * comm->size * sizeof(float),
                                   false, &out, err);
  if (status != MP_OK) {
    comm_stage_drop(comm, &in);
    return status;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  status = MPI_CALL(comm->world->rank, MPI_Iallgather,
                    (in.host, (int)count, MPI_FLOAT, out.host, (int)count, MPI_FLOAT, comm->comm,
                     &request),
                    err);
  if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  status = comm_stage_out(comm, "all-gather", &in, false, status, err);
  return comm_stage_out(comm, "all-gather", &out, true, status, err);
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

mp_status mp_comm_all_to_all_i32(mp_comm *comm, const int32_t *input, int32_t *output,
                                 size_t count, mp_error *err) {
  MP_TRY(check_collective(comm, "all-to-all", input, output, count, err));
  MP_TRY(check_int_count(comm, "all-to-all", count, err));
  if (mp_staging_is_device(output) || mp_staging_is_device(input)) {
    return mp_fail(err, MP_ERR_INPUT, "rank %d: all-to-all in group %s takes host buffers only",
                   comm->world->rank, comm->name);
  }
  if (comm->size == 1) {
    if (count > 0 && output != input) memmove(output, input, count * sizeof(int32_t));
    return MP_OK;
  }
  comm_op op = comm_op_begin(comm, "all-to-all", -1, count * comm->size * sizeof(int32_t));
  MPI_Request request = MPI_REQUEST_NULL;
  MP_TRY(MPI_CALL(comm->world->rank, MPI_Ialltoall,
                  (input, (int)count, MPI_INT32_T, output, (int)count, MPI_INT32_T, comm->comm,
                   &request),
                  err));
  return comm_wait(comm, &request, &op, err);
}

mp_status mp_comm_all_to_all_v_f32(mp_comm *comm, const float *input, const size_t *send_counts,
                                   float *output, const size_t *recv_counts, mp_error *err) {
  MP_TRY(check_collective(comm, "all-to-all", input, output, 0, err)); /* usable */
  if ((input != NULL && mp_staging_is_device(input)) ||
      (output != NULL && mp_staging_is_device(output))) {
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d: all-to-all (uneven) in group %s takes host buffers only",
                   comm->world->rank, comm->name);
  }
  size_t send_total = 0, recv_total = 0;
  int *send = NULL, *recv = NULL; /* each: counts, then displacements */
  MP_TRY(uneven_counts(comm, "all-to-all", send_counts, &send_total, &send, err));
  mp_status status = uneven_counts(comm, "all-to-all", recv_counts, &recv_total, &recv, err);
  if (status == MP_OK &&
      ((input == NULL && send_total > 0) || (output == NULL && recv_total > 0))) {
    status = mp_fail(err, MP_ERR_INPUT, "rank %d: all-to-all in group %s: NULL buffer",
                     comm->world->rank, comm->name);
  }
  if (status == MP_OK && comm->size == 1) {
    if (send_counts[0] != recv_counts[0]) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "rank %d: all-to-all in group %s: sends %zu floats to itself but expects "
                       "%zu",
                       comm->world->rank, comm->name, send_counts[0], recv_counts[0]);
    } else if (send_total > 0 && output != input) {
      memmove(output, input, send_total * sizeof(float));
    }
  } else if (status == MP_OK) {
    comm_op op = comm_op_begin(comm, "all-to-all", -1, (send_total + recv_total) * sizeof(float));
    MPI_Request request = MPI_REQUEST_NULL;
    status = MPI_CALL(comm->world->rank, MPI_Ialltoallv,
                      (input, send, send + comm->size, MPI_FLOAT, output, recv, recv + comm->size,
                       MPI_FLOAT, comm->comm, &request),
                      err);
    if (status == MP_OK) status = comm_wait(comm, &request, &op, err);
  }
  free(send);
  free(recv);
  return status;
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
  MP_TRY(comm_stage_in(comm, "broadcast", buffer, bytes, is_root, &staged, err));
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
  return comm_stage_out(comm, "broadcast", &staged, !is_root, status, err);
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
