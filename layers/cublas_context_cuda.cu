/*
 * layers/cublas_context_cuda.cu — the mp_cublas context on the GPU (see cublas_context.h): the
 * cuBLAS and cuBLASLt handles, their shared workspace, and the first failure of a launcher, which
 * the matmul and the attention record through cublas_context_internal.cuh.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "layers/cublas_context.h"
#include "layers/cublas_context_internal.cuh"
#include "layers/cuda_check.cuh"

// For functions that return mp_status with an mp_error *err in scope (mp_cublas_create).
#define MP_CUBLAS_CHECK_GOTO(call, label)                                                    \
  do {                                                                                       \
    cublasStatus_t mp_cublas_status_ = (call);                                               \
    if (mp_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                        \
      mp_fail(err, MP_ERR_RUNTIME, "%s failed: %s (%s) at %s:%d", #call,                     \
              cublasGetStatusString(mp_cublas_status_), cublasGetStatusName(mp_cublas_status_), \
              __FILE__, __LINE__);                                                           \
      goto label;                                                                            \
    }                                                                                        \
  } while (0)

void mp_cublas_record_failure(mp_cublas *cublas, mp_status status, const char *format, ...) {
  if (cublas == NULL || cublas->failure != MP_OK) return;
  cublas->failure = status;
  va_list args;
  va_start(args, format);
  vsnprintf(cublas->failure_message, sizeof cublas->failure_message, format, args);
  va_end(args);
}

bool mp_cublas_status_ok(mp_cublas *cublas, cublasStatus_t status, const char *call,
                         const char *file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  mp_cublas_record_failure(cublas, MP_ERR_RUNTIME, "%s failed: %s (%s) at %s:%d", call,
                           cublasGetStatusString(status), cublasGetStatusName(status), file, line);
  return false;
}

bool mp_cublas_bind_stream(mp_cublas *cublas, cudaStream_t stream) {
  return MP_CUBLAS_OK(cublas, cublasSetStream(cublas->blas, stream)) &&
         MP_CUBLAS_OK(cublas, cublasSetWorkspace(cublas->blas, cublas->workspace,
                                                 MP_CUBLAS_WORKSPACE_BYTES));
}

// bf16 GEMMs with CUBLAS_COMPUTE_32F run on tensor cores in the default math mode; split-K
// reductions must stay in fp32 rather than the bf16 output type.
static const cublasMath_t kMathMode =
    (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

extern "C" mp_status mp_cublas_create(mp_cublas **out, mp_error *err) {
  *out = NULL;
  mp_cublas *cublas = (mp_cublas *)calloc(1, sizeof *cublas);
  if (cublas == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory for mp_cublas");
  cublas->failure = MP_OK;
  MP_CUBLAS_CHECK_GOTO(cublasCreate(&cublas->blas), fail);
  MP_CUBLAS_CHECK_GOTO(cublasLtCreate(&cublas->lt), fail);
  MP_CUDA_CHECK_GOTO(cudaMalloc(&cublas->workspace, MP_CUBLAS_WORKSPACE_BYTES), fail);
  MP_CUBLAS_CHECK_GOTO(cublasSetMathMode(cublas->blas, kMathMode), fail);
  MP_CUBLAS_CHECK_GOTO(
      cublasSetWorkspace(cublas->blas, cublas->workspace, MP_CUBLAS_WORKSPACE_BYTES), fail);
  *out = cublas;
  return MP_OK;
fail:
  mp_cublas_free(cublas);
  return MP_ERR_RUNTIME;
}

extern "C" void mp_cublas_free(mp_cublas *cublas) {
  if (cublas == NULL) return;
  if (cublas->workspace != NULL) cudaFree(cublas->workspace);  // waits for work that uses it
  if (cublas->lt != NULL) cublasLtDestroy(cublas->lt);
  if (cublas->blas != NULL) cublasDestroy(cublas->blas);
  free(cublas);
}

extern "C" mp_status mp_cublas_check(mp_cublas *cublas, mp_error *err) {
  if (cublas == NULL) return mp_fail(err, MP_ERR_INPUT, "mp_cublas_check: no mp_cublas (NULL)");
  if (cublas->failure == MP_OK) return MP_OK;
  const mp_status status = cublas->failure;
  mp_fail(err, status, "%s", cublas->failure_message);
  cublas->failure = MP_OK;
  cublas->failure_message[0] = '\0';
  return status;
}
