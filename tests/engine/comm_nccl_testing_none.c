/* tests/engine/comm_nccl_testing_none.c — comm_nccl_testing.h without CUDA: nothing to stall. */
#include "tests/engine/comm_nccl_testing.h"

mp_status mp_test_stall_stream(mp_cuda_stream stream, volatile int *release, double max_s,
                               mp_error *err) {
  (void)stream, (void)release, (void)max_s;
  return mp_fail(err, MP_ERR_RUNTIME, "this build has no CUDA: no stream to stall");
}

mp_status mp_test_stream_synchronize(mp_cuda_stream stream, mp_error *err) {
  (void)stream;
  return mp_fail(err, MP_ERR_RUNTIME, "this build has no CUDA: no stream to wait for");
}
