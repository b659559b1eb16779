/* engine/comm/tp_comm_mpi.c — the tensor-parallel table over engine/comm/comm.h; see the header. */
#include "engine/comm/tp_comm_mpi.h"

static mp_status all_reduce(void *context, float *buffer, size_t count, mp_error *err) {
  return mp_comm_all_reduce_sum_f32((mp_comm *)context, buffer, count, err);
}

static mp_status all_gather(void *context, const float *input, float *output, size_t count,
                            mp_error *err) {
  return mp_comm_all_gather_f32((mp_comm *)context, input, output, count, err);
}

static mp_status reduce_scatter(void *context, const float *input, float *output, size_t count,
                                mp_error *err) {
  return mp_comm_reduce_scatter_sum_f32((mp_comm *)context, input, output, count, err);
}

mp_tp_comm mp_tp_comm_over_group(mp_comm *comm) {
  mp_tp_comm tp = {comm,       mp_comm_rank(comm), mp_comm_size(comm),
                   all_reduce, all_gather,         reduce_scatter};
  return tp;
}
