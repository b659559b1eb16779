// tests/engine/comm_nccl_testing.h — what the NCCL communicator tests need from CUDA directly: a
// stream held still from the host, so that an NCCL operation ordered after it cannot complete and
// the watchdog must act, and a wait for one stream. The tests are C++ compiled without CUDA's headers, hence this C API.
#ifndef MPENGINE_TESTS_ENGINE_COMM_NCCL_TESTING_H
#define MPENGINE_TESTS_ENGINE_COMM_NCCL_TESTING_H

#include "common/error.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

// Enqueues on `stream` a host function that holds the stream until *release becomes non-zero or
// max_s seconds have passed, whichever is first (so a test that fails cannot hang the stream for
// ever). MP_ERR_RUNTIME without CUDA or on a CUDA error.
mp_status mp_test_stall_stream(mp_cuda_stream stream, volatile int *release, double max_s,
                               mp_error *err);

// Waits on the host for every operation enqueued on `stream` so far (cudaStreamSynchronize).
mp_status mp_test_stream_synchronize(mp_cuda_stream stream, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif  // MPENGINE_TESTS_ENGINE_COMM_NCCL_TESTING_H
