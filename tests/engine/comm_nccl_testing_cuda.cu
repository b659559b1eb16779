// tests/engine/comm_nccl_testing_cuda.cu — comm_nccl_testing.h over the CUDA runtime: the stall is
// a host function (cudaLaunchHostFunc), which CUDA runs in stream order on a thread of its own.
#include <cuda_runtime.h>
#include <stdlib.h>
#include <time.h>

#include "layers/cuda_check.cuh"
#include "tests/engine/comm_nccl_testing.h"

namespace {

struct stall {
  volatile int *release;
  double max_s;
};

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void CUDART_CB hold(void *data) {
  stall *s = (stall *)data;
  const double until = now_s() + s->max_s;
  while (*s->release == 0 && now_s() < until) {
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  free(s);
}

}  // namespace

extern "C" mp_status mp_test_stall_stream(mp_cuda_stream stream, volatile int *release,
                                          double max_s, mp_error *err) {
  stall *s = (stall *)malloc(sizeof *s);
  if (s == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  s->release = release;
  s->max_s = max_s;
  cudaError_t status = cudaLaunchHostFunc((cudaStream_t)stream, hold, s);
  if (status != cudaSuccess) free(s);
  MP_CUDA_CHECK(status);
  return MP_OK;
}

extern "C" mp_status mp_test_stream_synchronize(mp_cuda_stream stream, mp_error *err) {
  MP_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return MP_OK;
}
