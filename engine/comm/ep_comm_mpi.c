/* engine/comm/ep_comm_mpi.c — the expert-parallel table over engine/comm/comm.h; see the header. */
#include "engine/comm/ep_comm_mpi.h"

static mp_status all_to_all_i32(void *context, const int32_t *input, int32_t *output,
                                size_t count, mp_error *err) {
  return mp_comm_all_to_all_i32((mp_comm *)context, input, output, count, err);
}

static mp_status all_to_all_v_f32(void *context, const float *input, const size_t *send_counts,
                                  float *output, const size_t *recv_counts, mp_error *err) {
  return mp_comm_all_to_all_v_f32((mp_comm *)context, input, send_counts, output, recv_counts,
                                  err);
}

mp_ep_comm mp_ep_comm_over_group(mp_comm *comm) {
  mp_ep_comm ep = {comm, mp_comm_rank(comm), mp_comm_size(comm), all_to_all_i32,
                   all_to_all_v_f32};
  return ep;
}
