/* engine/comm/ep_comm_nccl.c — the expert-parallel table over NCCL; see the header. */
#include "engine/comm/ep_comm_nccl.h"

#include <stdlib.h>

/* Sends run r of input (send_bytes[r] bytes, runs in rank order) to rank r and receives
 * recv_bytes[r] bytes from rank r into output's run r, every non-empty one in one p2p batch, after
 * the default stream's work; the host waits for them. */
static mp_status exchange(mp_nccl_comm *comm, const char *input, const size_t *send_bytes,
                          char *output, const size_t *recv_bytes, mp_error *err) {
  const int size = mp_nccl_comm_size(comm);
  mp_nccl_p2p_op *ops = calloc(2 * (size_t)size, sizeof *ops);
  if (ops == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory for %d sends", size);
  int count = 0;
  size_t sent = 0, received = 0;
  for (int r = 0; r < size; ++r) {
    if (send_bytes[r] > 0) {
      const mp_nccl_p2p_op op = {MP_NCCL_SEND, r, (void *)(input + sent), send_bytes[r]};
      ops[count++] = op;
    }
    if (recv_bytes[r] > 0) {
      const mp_nccl_p2p_op op = {MP_NCCL_RECV, r, output + received, recv_bytes[r]};
      ops[count++] = op;
    }
    sent += send_bytes[r];
    received += recv_bytes[r];
  }
  mp_status status = mp_nccl_comm_wait_stream(comm, NULL, err);
  if (status == MP_OK && count > 0) status = mp_nccl_p2p(comm, ops, count, err);
  if (status == MP_OK) status = mp_nccl_comm_synchronize(comm, err);
  free(ops);
  return status;
}

static mp_status all_to_all_i32(void *context, const int32_t *input, int32_t *output,
                                size_t count, mp_error *err) {
  mp_nccl_comm *comm = context;
  const int size = mp_nccl_comm_size(comm);
  size_t *bytes = malloc((size_t)size * sizeof *bytes);
  if (bytes == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  for (int r = 0; r < size; ++r) bytes[r] = count * sizeof(int32_t);
  const mp_status status =
      exchange(comm, (const char *)input, bytes, (char *)output, bytes, err);
  free(bytes);
  return status;
}

static mp_status all_to_all_v_f32(void *context, const float *input, const size_t *send_counts,
                                  float *output, const size_t *recv_counts, mp_error *err) {
  mp_nccl_comm *comm = context;
  const int size = mp_nccl_comm_size(comm);
  size_t *bytes = malloc(2 * (size_t)size * sizeof *bytes); /* send (size), then receive (size) */
  if (bytes == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  for (int r = 0; r < size; ++r) {
    bytes[r] = send_counts[r] * sizeof(float);
    bytes[size + r] = recv_counts[r] * sizeof(float);
  }
  const mp_status status =
      exchange(comm, (const char *)input, bytes, (char *)output, bytes + size, err);
  free(bytes);
  return status;
}

mp_ep_comm mp_ep_comm_over_nccl(mp_nccl_comm *comm) {
  mp_ep_comm ep = {comm, mp_nccl_comm_rank(comm), mp_nccl_comm_size(comm), all_to_all_i32,
                   all_to_all_v_f32};
  return ep;
}
