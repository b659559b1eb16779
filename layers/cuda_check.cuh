/*
 * layers/cuda_check.cuh — check macros for CUDA, cuBLAS and NCCL calls, for .cu files only.
 *
 * Every call goes through one of them: on failure it fills the mp_error `err` in scope with the
 * call as written, its error string, the file and the line, and returns MP_ERR_RUNTIME from the
 * enclosing function (or jumps to a cleanup label with the _GOTO forms).
 */
#ifndef MPENGINE_ENGINE_CUDA_CHECK_CUH
#define MPENGINE_ENGINE_CUDA_CHECK_CUH

#include <cuda_runtime.h>

#include "common/error.h"

#define MP_CUDA_CHECK(call)                                                                 \
  do {                                                                                      \
    cudaError_t mp_cuda_status_ = (call);                                                   \
    if (mp_cuda_status_ != cudaSuccess) {                                                   \
      return mp_fail(err, MP_ERR_RUNTIME, "%s failed: %s (%s) at %s:%d", #call,             \
                     cudaGetErrorString(mp_cuda_status_), cudaGetErrorName(mp_cuda_status_), \
                     __FILE__, __LINE__);                                                   \
    }                                                                                       \
  } while (0)

#define MP_CUDA_CHECK_GOTO(call, label)                                                     \
  do {                                                                                      \
    cudaError_t mp_cuda_status_ = (call);                                                   \
    if (mp_cuda_status_ != cudaSuccess) {                                                   \
      mp_fail(err, MP_ERR_RUNTIME, "%s failed: %s (%s) at %s:%d", #call,                    \
              cudaGetErrorString(mp_cuda_status_), cudaGetErrorName(mp_cuda_status_),      \
              __FILE__, __LINE__);                                                          \
      goto label;                                                                           \
    }                                                                                       \
  } while (0)

#endif /* MPENGINE_ENGINE_CUDA_CHECK_CUH */
