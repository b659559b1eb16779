/* tests/fuzz/checkpoint_manifest_stubs.c — for tools/fuzz.sh only: engine/checkpoint.c's saving
 * and loading call the trainer and the communicator, which the manifest checks never reach; these
 * stand-ins let clang link the target without the trainer's and MPI's whole closure. Each aborts,
 * so a call that should not happen is a crash the fuzzer reports. (bazel's replay test links the
 * real //engine:checkpoint and does not use this file.) */
#include <stdlib.h>

#include "engine/comm.h"
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

mp_status mp_comm_broadcast(mp_comm *comm, void *buffer, size_t bytes, int root, mp_error *err) {
  (void)comm, (void)buffer, (void)bytes, (void)root, (void)err;
  abort();
}

mp_status mp_comm_barrier(mp_comm *comm, mp_error *err) {
  (void)comm, (void)err;
  abort();
}
