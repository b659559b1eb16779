/* engine/comm/tp_comm_nccl.c — the tensor-parallel table over NCCL; see the header. */
#include "engine/comm/tp_comm_nccl.h"

/* Orders the collective after the default stream's work, then waits for it. */
static mp_status before(mp_nccl_comm *comm, mp_error *err) {
  return mp_nccl_comm_wait_stream(comm, NULL, err);
}

static mp_status all_reduce(void *context, float *buffer, size_t count, mp_error *err) {
  mp_nccl_comm *comm = context;
  MP_TRY(before(comm, err));
  MP_TRY(mp_nccl_all_reduce_sum(comm, buffer, count, MP_NCCL_FLOAT32, err));
  return mp_nccl_comm_synchronize(comm, err);
}

static mp_status all_gather(void *context, const float *input, float *output, size_t count,
                            mp_error *err) {
  mp_nccl_comm *comm = context;
  MP_TRY(before(comm, err));
  MP_TRY(mp_nccl_all_gather(comm, input, output, count, MP_NCCL_FLOAT32, err));
  return mp_nccl_comm_synchronize(comm, err);
}

static mp_status reduce_scatter(void *context, const float *input, float *output, size_t count,
                                mp_error *err) {
  mp_nccl_comm *comm = context;
  MP_TRY(before(comm, err));
  MP_TRY(mp_nccl_reduce_scatter_sum(comm, input, output, count, MP_NCCL_FLOAT32, err));
  return mp_nccl_comm_synchronize(comm, err);
}

mp_tp_comm mp_tp_comm_over_nccl(mp_nccl_comm *comm) {
  mp_tp_comm tp = {comm,       mp_nccl_comm_rank(comm), mp_nccl_comm_size(comm),
                   all_reduce, all_gather,              reduce_scatter};
  return tp;
}
