/* tests/fuzz/checkpoint_manifest_stubs.c — for tools/fuzz.sh only: engine/checkpoint.c's saving
 * and loading call the trainer, its model chunks and the communicator, which the manifest checks
 * never reach; these stand-ins let clang link the target without the trainer's and MPI's whole
 * closure. Each aborts, so a call that should not happen is a crash the fuzzer reports. (bazel's
 * replay test links the real //engine:checkpoint and does not use this file.) */
#include <stdlib.h>

#include "engine/comm.h"
#include "engine/gpt_model_tp.h"
#include "engine/trainer.h"

const mp_gpt_layout *mp_trainer_layout(const mp_trainer *trainer) {
  (void)trainer;
  abort();
}

mp_status mp_trainer_cpu_state(mp_trainer *trainer, float **params, float **adam_m,
                               float **adam_v, size_t *count, mp_error *err) {
  (void)trainer, (void)params, (void)adam_m, (void)adam_v, (void)count, (void)err;
  abort();
}

int mp_trainer_num_chunks(const mp_trainer *trainer) {
  (void)trainer;
  abort();
}

mp_gpt_tp *mp_trainer_chunk(mp_trainer *trainer, int chunk) {
  (void)trainer, (void)chunk;
  abort();
}

mp_status mp_trainer_chunk_cpu_state(mp_trainer *trainer, int chunk, mp_trainer_chunk_state *out,
                                     mp_error *err) {
  (void)trainer, (void)chunk, (void)out, (void)err;
  abort();
}

mp_gpt_stage mp_gpt_stage_whole(int num_layers) {
  (void)num_layers;
  abort();
}

const mp_gpt_stage *mp_gpt_tp_stage(const mp_gpt_tp *gpt) {
  (void)gpt;
  abort();
}

const mp_tp_comm *mp_gpt_tp_comm(const mp_gpt_tp *gpt) {
  (void)gpt;
  abort();
}

int mp_gpt_tp_num_tensors(const mp_gpt_tp *gpt) {
  (void)gpt;
  abort();
}

const mp_gpt_tp_tensor *mp_gpt_tp_tensor_at(const mp_gpt_tp *gpt, int index) {
  (void)gpt, (void)index;
  abort();
}

int mp_comm_rank(const mp_comm *comm) {
  (void)comm;
  abort();
}

int mp_comm_size(const mp_comm *comm) {
  (void)comm;
  abort();
}

mp_status mp_comm_send(mp_comm *comm, const void *buffer, size_t bytes, int peer, mp_error *err) {
  (void)comm, (void)buffer, (void)bytes, (void)peer, (void)err;
  abort();
}

mp_status mp_comm_recv(mp_comm *comm, void *buffer, size_t bytes, int peer, mp_error *err) {
  (void)comm, (void)buffer, (void)bytes, (void)peer, (void)err;
  abort();
}

mp_status mp_comm_all_gather_f32(mp_comm *comm, const float *input, float *output, size_t count,
                                 mp_error *err) {
  (void)comm, (void)input, (void)output, (void)count, (void)err;
  abort();
}

mp_status mp_comm_broadcast(mp_comm *comm, void *buffer, size_t bytes, int root, mp_error *err) {
  (void)comm, (void)buffer, (void)bytes, (void)root, (void)err;
  abort();
}
