/*
 * layers/cublas_context.h — the mp_cublas context that the CUDA twins of matmul.h and attention.h
 * share: the cuBLAS and cuBLASLt handles of the current device, their workspace, and the first
 * failure of any launcher that used them.
 *
 * Its own module so that both GEMM users sit above it (matmul -> cublas_context <- attention)
 * rather than the attention reaching into the matmul for it. Implemented by
 * layers/cublas_context_cuda.cu (Bazel target //layers:cuda_gemm); without CUDA by
 * cuda_gemm_none.c, emulated by cuda_gemm_emulated.c. The CUDA sources' private part (the struct,
 * the recording macros) is cublas_context_internal.cuh.
 *
 * Launchers return nothing (they are asynchronous, like kernel launches). A failure (a cuBLAS or
 * CUDA call, or a negative shape) is recorded in the mp_cublas, the first one wins, and
 * mp_cublas_check reports it with the call, the file and the line; call it where the caller
 * synchronises anyway (end of a step).
 */
#ifndef MPENGINE_LAYERS_CUBLAS_CONTEXT_H
#define MPENGINE_LAYERS_CUBLAS_CONTEXT_H

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLAS and cuBLASLt handles of the current device and their 32 MiB workspace. Calls that use
 * one mp_cublas must not overlap: the workspace is shared, so work on two streams that may run
 * at the same time needs two of them. */
typedef struct mp_cublas mp_cublas;

/* Creates handles and workspace on the current device; *out is NULL on failure (no device, out
 * of memory, a build without CUDA). */
mp_status mp_cublas_create(mp_cublas **out, mp_error *err);
/* Frees what mp_cublas_create made (waits for the device); NULL is allowed. */
void mp_cublas_free(mp_cublas *cublas);
/* MP_OK if no launcher has failed since the last check; otherwise the first failure's status
 * (MP_ERR_RUNTIME for cuBLAS and CUDA, MP_ERR_INPUT for a negative shape) and its message
 * ("<call> failed: <status string> (<status name>) at <file>:<line>"), then forgets it. */
mp_status mp_cublas_check(mp_cublas *cublas, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_CUBLAS_CONTEXT_H */
