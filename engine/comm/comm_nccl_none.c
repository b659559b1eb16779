/* engine/comm/comm_nccl_none.c — comm_nccl.h for builds without CUDA: no world can be created, so no
 * communicator exists; every call says why, with MP_ERR_INPUT (the user can fix it by building
 * where /usr/local/cuda exists, or by using the MPI communicators). */
#include <stddef.h>

#include "engine/comm/comm_nccl.h"

static mp_status no_nccl(mp_error *err) {
  return mp_fail(err, MP_ERR_INPUT,
                 "this mpengine was built without CUDA/NCCL (no /usr/local/cuda at build time): "
                 "NCCL communicators need a CUDA build; the MPI communicators work without one");
}

bool mp_nccl_available(void) { return false; }
int mp_nccl_version(void) { return 0; }

mp_status mp_nccl_world_create(mp_comm_world *mpi, int device, mp_nccl_world **out,
                               mp_error *err) {
  (void)mpi, (void)device;
  *out = NULL;
  return no_nccl(err);
}
void mp_nccl_world_free(mp_nccl_world *world) { (void)world; }
void mp_nccl_world_set_timeout(mp_nccl_world *world, double timeout_s) {
  (void)world, (void)timeout_s;
}
double mp_nccl_world_timeout(const mp_nccl_world *world) {
  (void)world;
  return 0;
}
int mp_nccl_world_device(const mp_nccl_world *world) {
  (void)world;
  return -1;
}
bool mp_nccl_world_aborted(const mp_nccl_world *world) {
  (void)world;
  return false;
}

mp_status mp_nccl_comm_create(mp_nccl_world *world, mp_comm *group, mp_nccl_comm **out,
                              mp_error *err) {
  (void)world, (void)group;
  *out = NULL;
  return no_nccl(err);
}
void mp_nccl_comm_free(mp_nccl_comm *comm) { (void)comm; }
int mp_nccl_comm_rank(const mp_nccl_comm *comm) {
  (void)comm;
  return 0;
}
int mp_nccl_comm_size(const mp_nccl_comm *comm) {
  (void)comm;
  return 0;
}
const char *mp_nccl_comm_name(const mp_nccl_comm *comm) {
  (void)comm;
  return "";
}
mp_cuda_stream mp_nccl_comm_stream(const mp_nccl_comm *comm) {
  (void)comm;
  return NULL;
}

mp_status mp_nccl_comm_wait_stream(mp_nccl_comm *comm, mp_cuda_stream stream, mp_error *err) {
  (void)comm, (void)stream;
  return no_nccl(err);
}
mp_status mp_nccl_stream_wait_comm(mp_cuda_stream stream, mp_nccl_comm *comm, mp_error *err) {
  (void)comm, (void)stream;
  return no_nccl(err);
}
mp_status mp_nccl_comm_mark(mp_nccl_comm *comm, int slot, mp_error *err) {
  (void)comm, (void)slot;
  return no_nccl(err);
}
mp_status mp_nccl_stream_wait_mark(mp_cuda_stream stream, mp_nccl_comm *comm, int slot,
                                   mp_error *err) {
  (void)stream, (void)comm, (void)slot;
  return no_nccl(err);
}
mp_status mp_nccl_comm_synchronize(mp_nccl_comm *comm, mp_error *err) {
  (void)comm;
  return no_nccl(err);
}

mp_status mp_nccl_p2p(mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count, mp_error *err) {
  (void)comm, (void)ops, (void)count;
  return no_nccl(err);
}
mp_status mp_nccl_all_reduce_sum(mp_nccl_comm *comm, void *buffer, size_t count,
                                 mp_nccl_dtype dtype, mp_error *err) {
  (void)comm, (void)buffer, (void)count, (void)dtype;
  return no_nccl(err);
}
mp_status mp_nccl_reduce_scatter_sum(mp_nccl_comm *comm, const void *input, void *output,
                                     size_t count, mp_nccl_dtype dtype, mp_error *err) {
  (void)comm, (void)input, (void)output, (void)count, (void)dtype;
  return no_nccl(err);
}
mp_status mp_nccl_reduce_scatter_v_sum_f32(mp_nccl_comm *comm, const float *input, float *output,
                                           const size_t *counts, mp_error *err) {
  (void)comm, (void)input, (void)output, (void)counts;
  return no_nccl(err);
}
mp_status mp_nccl_all_gather(mp_nccl_comm *comm, const void *input, void *output, size_t count,
                             mp_nccl_dtype dtype, mp_error *err) {
  (void)comm, (void)input, (void)output, (void)count, (void)dtype;
  return no_nccl(err);
}
mp_status mp_nccl_all_gather_v(mp_nccl_comm *comm, const void *input, void *output,
                               const size_t *counts, mp_nccl_dtype dtype, mp_error *err) {
  (void)comm, (void)input, (void)output, (void)counts, (void)dtype;
  return no_nccl(err);
}
mp_status mp_nccl_broadcast(mp_nccl_comm *comm, void *buffer, size_t bytes, int root,
                            mp_error *err) {
  (void)comm, (void)buffer, (void)bytes, (void)root;
  return no_nccl(err);
}
