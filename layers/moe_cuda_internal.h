/*
 * layers/moe_cuda_internal.h — private to //layers:cuda_moe: the kernels that moe_cuda.c composes
 * with the matmul and SwiGLU twins into the steps of moe_cuda.h. Implemented by
 * moe_cuda_kernels.cu, emulated by moe_cuda_emulated.c. Device pointers, asynchronous on
 * `stream`, launch failures recorded by layers/cuda_launch.h.
 */
#ifndef MPENGINE_LAYERS_MOE_CUDA_INTERNAL_H
#define MPENGINE_LAYERS_MOE_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/cublas_context.h"
#include "layers/cuda_types.h"
#include "layers/moe_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The route's device part (the shape already checked): logits = x @ router^T (fp32), probs,
 * selected, weights, expert_offset, routed_slot, slot_row and routed_in of cache. */
void mp_moe_cuda_route(mp_cublas *cublas, const mp_bf16 *x, const mp_bf16 *router,
                       mp_moe_cache_cuda *cache, mp_cuda_stream stream);

/* Waits for `stream`, then copies n ints from device to host; MP_ERR_RUNTIME naming the CUDA
 * call (an earlier kernel's fault included). */
mp_status mp_moe_cuda_copy_offsets(int *host, const int *device, int n, mp_cuda_stream stream,
                                   mp_error *err);

/* bytes of device memory at p set to zero. */
void mp_moe_cuda_zero(void *p, size_t bytes, mp_cuda_stream stream);

/* Experts per grouped GEMM call: the host arrays are this long, the pointer scratch 3 times. */
enum { MP_MOE_GEMM_GROUP = 64 };

/* `count` (<= MP_MOE_GEMM_GROUP) independent bf16 GEMMs in cuBLAS's column-major terms, one
 * cublasGemmGroupedBatchedEx: for each p, C_p (m_p x n_p, ldc_p) = bf16(op(A_p) B_p + beta C_p),
 * op(A_p) (m_p x k_p) = A_p (lda_p) transposed when trans_a, B_p (k_p x n_p, ldb_p), fp32
 * accumulation (CUBLAS_COMPUTE_32F). The arrays are host arrays; the CUDA build copies the
 * pointers into pointer_scratch (device, 3 MP_MOE_GEMM_GROUP pointers) on `stream` first.
 * Failures are recorded in the mp_cublas. */
void mp_moe_cuda_grouped_gemm(mp_cublas *cublas, int count, bool trans_a, const int *m,
                              const int *n, const int *k, const mp_bf16 *const *a, const int *lda,
                              const mp_bf16 *const *b, const int *ldb, float beta,
                              mp_bf16 *const *c, const int *ldc, void **pointer_scratch,
                              mp_cuda_stream stream);

/* gate (N) = sigmoid(x . gate_weight) per token (fp32 dot in a fixed order), or 1 when
 * gate_weight is NULL. x (N, C), gate_weight (C). */
void mp_moe_cuda_gate(float *gate, const mp_bf16 *x, const mp_bf16 *gate_weight, int N, int C,
                      mp_cuda_stream stream);

/* out (N, C) = bf16( sum over slots k of weights[t K + k] * routed_out[slot_row[t K + k]]
 *                    + gate[t] * shared_out[t] )   (the shared term only when shared_out). */
void mp_moe_cuda_weighted_sum(mp_bf16 *out, const mp_bf16 *routed_out, const float *weights,
                              const int *routed_slot, const int *slot_row,
                              const mp_bf16 *shared_out, const float *gate, int N, int K, int C,
                              mp_cuda_stream stream);

/* Backward of the shared MLP's gate: dshared (N, C) = bf16(gate * dout) (written); with a gate
 * weight, dlogit (N) = (dout . shared_out) g (1 - g) (scratch, written), dx (N, C) += (one
 * rounding) dlogit * gate_weight, dgate_weight (C) += sum over tokens in order of dlogit * x. */
void mp_moe_cuda_shared_gate_backward(mp_bf16 *dshared, mp_bf16 *dx, float *dgate_weight,
                                      float *dlogit, const mp_bf16 *dout, const mp_bf16 *x,
                                      const mp_bf16 *gate_weight, const mp_bf16 *shared_out,
                                      const float *gate, int N, int C, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_MOE_CUDA_INTERNAL_H */
