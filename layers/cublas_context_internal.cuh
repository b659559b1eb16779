/*
 * layers/cublas_context_internal.cuh — private to the CUDA sources of //layers:cuda_gemm
 * (cublas_context_cuda.cu, matmul_cuda.cu, attention_cuda.cu) and of //layers:cuda_moe_kernels
 * (moe_cuda_kernels.cu, the router's fp32 GEMMs): the mp_cublas context's struct
 * (layers/cublas_context.h) and the macros that record a failed cuBLAS or CUDA call in it from the
 * void launchers.
 *
 * Launchers cannot return a status (they are asynchronous, like kernel launches), so every cuBLAS
 * call goes through MP_CUBLAS_OK, which names the call, the file and the line, and keeps the
 * first failure for mp_cublas_check (cublas_context.h).
 */
#ifndef MPENGINE_LAYERS_CUBLAS_CONTEXT_INTERNAL_CUH
#define MPENGINE_LAYERS_CUBLAS_CONTEXT_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/cublas_context.h"

// cuBLAS's recommendation for Hopper; enough for every split-K reduction at GPT-2 sizes.
constexpr size_t MP_CUBLAS_WORKSPACE_BYTES = (size_t)32 << 20;

struct mp_cublas {
  cublasHandle_t blas;    // cublasGemmEx, cublasGemmStridedBatchedEx
  cublasLtHandle_t lt;    // cublasLtMatmul (the linear layer, with its bias epilogue)
  void *workspace;        // device, MP_CUBLAS_WORKSPACE_BYTES, shared by both handles
  mp_status failure;      // MP_OK until a launcher fails; the first failure is kept
  char failure_message[MP_ERROR_MESSAGE_BYTES];
};

// Keeps status and message in cublas unless an earlier failure is already kept.
void mp_cublas_record_failure(mp_cublas *cublas, mp_status status, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

// True when `status` is success; otherwise records "<call> failed: ..." and returns false.
bool mp_cublas_status_ok(mp_cublas *cublas, cublasStatus_t status, const char *call,
                         const char *file, int line);

// Binds the handles to `stream` (cublasSetStream resets the workspace, so it is set again).
bool mp_cublas_bind_stream(mp_cublas *cublas, cudaStream_t stream);

// Evaluates a cuBLAS call; records a failure (call text, status, file, line); yields success.
#define MP_CUBLAS_OK(cublas, call) mp_cublas_status_ok((cublas), (call), #call, __FILE__, __LINE__)

// After a kernel launch: records a launch error (bad configuration, no kernel image for this GPU).
#define MP_CUDA_RECORD_LAUNCH(cublas, kernel_name)                                            \
  do {                                                                                        \
    cudaError_t mp_launch_status_ = cudaGetLastError();                                       \
    if (mp_launch_status_ != cudaSuccess) {                                                   \
      mp_cublas_record_failure((cublas), MP_ERR_RUNTIME, "launch of %s failed: %s (%s) at %s:%d", \
                               (kernel_name), cudaGetErrorString(mp_launch_status_),          \
                               cudaGetErrorName(mp_launch_status_), __FILE__, __LINE__);      \
    }                                                                                         \
  } while (0)

#endif  // MPENGINE_LAYERS_CUBLAS_CONTEXT_INTERNAL_CUH
