/*
 * layers/matmul_cuda.cu — the linear layer on the GPU (see matmul.h): bf16 GEMMs with fp32
 * accumulation through cuBLASLt, on the mp_cublas context it shares with the attention
 * (cublas_context.h).
 *
 * Why cuBLASLt: its bias epilogue adds the bias in fp32 inside the GEMM, before the one rounding to
 * bf16, so the forward needs no second pass over `out` (for GPT-2 1.5B's MLP that pass would
 * cost about a fifth of the GEMM). Where the heuristic offers no kernel (unusual shapes or
 * alignments) the same product runs through cublasGemmEx, with the bias broadcast into `out`
 * first and beta = 1, which still rounds once.
 *
 * Row-major buffers seen by column-major cuBLAS: a row-major (R, K) matrix is a column-major
 * (K x R) one with leading dimension K, so each product is written for the transposes:
 *   forward  out^T (OC x BT)     = op_T(weight as C x OC) @ inp as (C x BT)
 *   dinp     dinp^T (C x BT)    += weight as (C x OC) @ dout as (OC x BT)
 *   dweight  dweight^T (C x OC) += inp as (C x BT) @ op_T(dout as OC x BT)
 * The forward is cuBLAS's "TN" case, the layout its bf16 tensor-core kernels are fastest in.
 * The dbias is a column sum of dout in two fixed-order passes (per-block partials, then a sum of
 * the partials), never atomics, so it is the same on every run.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/error.h"
#include "layers/cublas_context_internal.cuh"
#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/matmul.h"
#include "layers/matmul_internal.h"

// ---------------------------------------------------------------------------------------------
// kernels

// out (BT, OC) = bias broadcast over rows; the fallback's start for beta = 1.
__global__ static void broadcast_bias_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *bias, int BT,
                                             int OC) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)BT * OC) return;
  out[idx] = bias[idx % OC];
}

// dbias, pass 1. Block (32, 8) sums rows [blockIdx.y * ROWS, +ROWS) of channels
// [blockIdx.x * 32, +32): each thread walks its rows in order, then row 0 of the block adds the
// 8 thread sums in order.
//   partial (row_blocks, OC) written; dout (BT, OC)
__global__ static void dbias_partial_kernel(float *partial, const __nv_bfloat16 *dout, int BT,
                                            int OC) {
  __shared__ float sums[8][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int row_begin = blockIdx.y * MP_MATMUL_DBIAS_ROWS;
  const int row_end = min(row_begin + (int)MP_MATMUL_DBIAS_ROWS, BT);
  float sum = 0.0f;
  if (c < OC) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += 8) {
      sum += __bfloat162float(dout[(size_t)r * OC + c]);
    }
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float total = 0.0f;
    for (int y = 0; y < 8; y++) total += sums[y][threadIdx.x];
    partial[(size_t)blockIdx.y * OC + c] = total;
  }
}

// dbias, pass 2: dbias[c] += the partials of channel c, in row-block order.
//   dbias (OC) +=; partial (row_blocks, OC)
__global__ static void dbias_reduce_kernel(float *dbias, const float *partial, int row_blocks,
                                           int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float sum = 0.0f;
  for (int b = 0; b < row_blocks; b++) sum += partial[(size_t)b * OC + c];
  dbias[c] += sum;
}

// ---------------------------------------------------------------------------------------------
// GEMM helpers (column-major, as cuBLAS sees the buffers)

// Largest power of two (at most 256) that divides the address: cuBLASLt's heuristic must only
// offer kernels whose vector loads this buffer allows.
static uint32_t alignment_of(const void *pointer) {
  const uintptr_t address = (uintptr_t)pointer;
  uint32_t alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

enum lt_result { LT_DONE, LT_NO_KERNEL, LT_FAILED };

// D (m, n; ld ldd; d_type bf16 or fp32) = op(A) (m, k) @ op(B) (k, n) + beta * D [+ bias (m)
// broadcast over the n columns], A and B bf16, fp32 accumulation and scale. LT_NO_KERNEL when
// the heuristic has nothing for these shapes and alignments (nothing was launched).
static lt_result lt_matmul(mp_cublas *cublas, cudaStream_t stream, bool trans_a, bool trans_b,
                           int m, int n, int k, const __nv_bfloat16 *A, int lda,
                           const __nv_bfloat16 *B, int ldb, void *D, cudaDataType_t d_type, int ldd,
                           float beta, const __nv_bfloat16 *bias) {
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t a_layout = NULL, b_layout = NULL, d_layout = NULL;
  cublasLtMatmulPreference_t preference = NULL;
  lt_result result = LT_FAILED;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = 1.0f;
  const uint64_t workspace_bytes = MP_CUBLAS_WORKSPACE_BYTES;
  // Split-K partial sums in fp32 in the workspace only, never in the bf16 output.
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint32_t align_a = alignment_of(A), align_b = alignment_of(B), align_d = alignment_of(D);
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  cublasStatus_t status;

  if (!MP_CUBLAS_OK(cublas, cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))) {
    goto done;
  }
  if (!MP_CUBLAS_OK(cublas, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &op_a, sizeof op_a)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &op_b, sizeof op_b))) {
    goto done;
  }
  if (bias != NULL) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_16BF;
    if (!MP_CUBLAS_OK(cublas, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                             &epilogue, sizeof epilogue)) ||
        !MP_CUBLAS_OK(cublas, cublasLtMatmulDescSetAttribute(
                                  desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) ||
        !MP_CUBLAS_OK(cublas, cublasLtMatmulDescSetAttribute(
                                  desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                  sizeof bias_type))) {
      goto done;
    }
  }
  // Layouts describe the stored matrices: op_T reads a (k, m) matrix as (m, k).
  if (!MP_CUBLAS_OK(cublas, cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, trans_a ? k : m,
                                                       trans_a ? m : k, lda)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, trans_b ? n : k,
                                                       trans_b ? k : n, ldb)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatrixLayoutCreate(&d_layout, d_type, m, n, ldd))) {
    goto done;
  }
  if (!MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceCreate(&preference)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                &workspace_bytes, sizeof workspace_bytes)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                &reduction_mask, sizeof reduction_mask)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                sizeof align_a)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                sizeof align_b)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                sizeof align_d)) ||
      !MP_CUBLAS_OK(cublas, cublasLtMatmulPreferenceSetAttribute(
                                preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                sizeof align_d))) {
    goto done;
  }
  status = cublasLtMatmulAlgoGetHeuristic(cublas->lt, desc, a_layout, b_layout, d_layout, d_layout,
                                          preference, 1, &heuristic, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    result = LT_NO_KERNEL;
    goto done;
  }
  if (!mp_cublas_status_ok(cublas, status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__)) {
    goto done;
  }
  // C is D (beta = 0 does not read it); descriptors may go as soon as the call is enqueued.
  if (!MP_CUBLAS_OK(cublas, cublasLtMatmul(cublas->lt, desc, &alpha, A, a_layout, B, b_layout,
                                           &beta, D, d_layout, D, d_layout, &heuristic.algo,
                                           cublas->workspace, MP_CUBLAS_WORKSPACE_BYTES, stream))) {
    goto done;
  }
  result = LT_DONE;
done:
  if (preference != NULL) cublasLtMatmulPreferenceDestroy(preference);
  if (d_layout != NULL) cublasLtMatrixLayoutDestroy(d_layout);
  if (b_layout != NULL) cublasLtMatrixLayoutDestroy(b_layout);
  if (a_layout != NULL) cublasLtMatrixLayoutDestroy(a_layout);
  if (desc != NULL) cublasLtMatmulDescDestroy(desc);
  return result;
}

// The same product as lt_matmul without a bias, through cublasGemmEx (stream already bound).
static void gemm_ex(mp_cublas *cublas, bool trans_a, bool trans_b, int m, int n, int k,
                    const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, void *D,
                    cudaDataType_t d_type, int ldd, float beta) {
  const float alpha = 1.0f;
  MP_CUBLAS_OK(cublas, cublasGemmEx(cublas->blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A,
                                    CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, D, d_type, ldd,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// lt_matmul, falling back to gemm_ex (bias: broadcast into D first, then beta = 1; callers with
// a bias pass beta = 0).
static void matmul(mp_cublas *cublas, cudaStream_t stream, bool trans_a, bool trans_b, int m,
                   int n, int k, const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb,
                   void *D, cudaDataType_t d_type, int ldd, float beta,
                   const __nv_bfloat16 *bias) {
  if (lt_matmul(cublas, stream, trans_a, trans_b, m, n, k, A, lda, B, ldb, D, d_type, ldd, beta,
                bias) != LT_NO_KERNEL) {
    return;
  }
  if (bias != NULL) {
    // Only the forward has a bias: D is out^T (OC = m, BT = n), i.e. row-major (BT, OC).
    const int block = 256;
    broadcast_bias_kernel<<<(unsigned)mp_ceil_div((size_t)m * n, block), block, 0, stream>>>(
        (__nv_bfloat16 *)D, bias, n, m);
    MP_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
    MP_CUDA_RECORD_LAUNCH(cublas, "broadcast_bias_kernel");
    beta = 1.0f;
  }
  gemm_ex(cublas, trans_a, trans_b, m, n, k, A, lda, B, ldb, D, d_type, ldd, beta);
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_matmul_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *inp,
                                       const mp_bf16 *weight, const mp_bf16 *bias, int BT, int C,
                                       int OC, mp_cuda_stream stream) {
  if (BT < 0 || C < 0 || OC < 0) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT,
                             "mp_matmul_forward_cuda: negative shape BT=%d C=%d OC=%d", BT, C, OC);
    return;
  }
  if (BT == 0 || OC == 0) return;
  if (!mp_cublas_bind_stream(cublas, stream)) return;
  __nv_bfloat16 *out_ = (__nv_bfloat16 *)out;
  const __nv_bfloat16 *bias_ = (const __nv_bfloat16 *)bias;
  if (C == 0) {  // an empty product: out is the bias, or zero
    if (bias_ != NULL) {
      const int block = 256;
      broadcast_bias_kernel<<<(unsigned)mp_ceil_div((size_t)BT * OC, block), block, 0, stream>>>(
          out_, bias_, BT, OC);
      MP_CUDA_CHECK_LAUNCH("broadcast_bias_kernel");
      MP_CUDA_RECORD_LAUNCH(cublas, "broadcast_bias_kernel");
    } else {
      const cudaError_t status = cudaMemsetAsync(out_, 0, (size_t)BT * OC * sizeof *out_, stream);
      if (status != cudaSuccess) {
        mp_cublas_record_failure(cublas, MP_ERR_RUNTIME,
                                 "cudaMemsetAsync(out) failed: %s (%s) at %s:%d",
                                 cudaGetErrorString(status), cudaGetErrorName(status), __FILE__,
                                 __LINE__);
      }
    }
    return;
  }
  // out^T (OC, BT), ld OC = op_T(weight stored as (C, OC), ld C) @ inp stored as (C, BT), ld C.
  matmul(cublas, stream, true, false, OC, BT, C, (const __nv_bfloat16 *)weight, C,
         (const __nv_bfloat16 *)inp, C, out_, CUDA_R_16BF, OC, 0.0f, bias_);
}

extern "C" size_t mp_matmul_backward_cuda_scratch_floats(int BT, int OC) {
  return OC > 0 ? mp_matmul_dbias_row_blocks(BT) * (size_t)OC : 0;
}

extern "C" void mp_matmul_backward_cuda(mp_cublas *cublas, mp_bf16 *dinp, float *dweight,
                                        float *dbias, const mp_bf16 *dout, const mp_bf16 *inp,
                                        const mp_bf16 *weight, float *scratch, int BT, int C,
                                        int OC, mp_cuda_stream stream) {
  if (BT < 0 || C < 0 || OC < 0) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT,
                             "mp_matmul_backward_cuda: negative shape BT=%d C=%d OC=%d", BT, C, OC);
    return;
  }
  if (dbias != NULL && scratch == NULL && BT > 0 && OC > 0) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT,
                             "mp_matmul_backward_cuda: dbias needs scratch of "
                             "mp_matmul_backward_cuda_scratch_floats(%d, %d) = %zu floats, "
                             "got NULL",
                             BT, OC, mp_matmul_backward_cuda_scratch_floats(BT, OC));
    return;
  }
  if (BT == 0 || OC == 0) return;
  if (!mp_cublas_bind_stream(cublas, stream)) return;
  const __nv_bfloat16 *dout_ = (const __nv_bfloat16 *)dout;
  if (dinp != NULL && C > 0) {
    // dinp^T (C, BT), ld C += weight stored as (C, OC), ld C @ dout stored as (OC, BT), ld OC.
    matmul(cublas, stream, false, false, C, BT, OC, (const __nv_bfloat16 *)weight, C, dout_, OC,
           dinp, CUDA_R_16BF, C, 1.0f, NULL);
  }
  if (dweight != NULL && C > 0) {
    // dweight^T (C, OC), ld C += inp stored as (C, BT), ld C @ op_T(dout stored as (OC, BT)).
    matmul(cublas, stream, false, true, C, OC, BT, (const __nv_bfloat16 *)inp, C, dout_, OC,
           dweight, CUDA_R_32F, C, 1.0f, NULL);
  }
  if (dbias != NULL) {
    const int row_blocks = (int)mp_matmul_dbias_row_blocks(BT);
    const dim3 partial_grid((unsigned)mp_ceil_div((size_t)OC, 32), (unsigned)row_blocks);
    dbias_partial_kernel<<<partial_grid, dim3(32, 8), 0, stream>>>(scratch, dout_, BT, OC);
    MP_CUDA_CHECK_LAUNCH("dbias_partial_kernel");
    MP_CUDA_RECORD_LAUNCH(cublas, "dbias_partial_kernel");
    const int block = 256;
    dbias_reduce_kernel<<<(unsigned)mp_ceil_div((size_t)OC, block), block, 0, stream>>>(dbias, scratch,
                                                                             row_blocks, OC);
    MP_CUDA_CHECK_LAUNCH("dbias_reduce_kernel");
    MP_CUDA_RECORD_LAUNCH(cublas, "dbias_reduce_kernel");
  }
}
