/*
 * layers/attention_cuda.cu — causal multi-head attention on the GPU (see attention.h), llm.c's
 * cuBLAS formulation: permute, two strided-batched bf16 GEMMs over the B * NH heads with a causal
 * softmax between them, unpermute. The backward runs the same GEMMs transposed.
 *
 * Grouped-query attention (KVH kv heads, each read by group = NH / KVH query heads) is done in
 * the permutes, as Hugging Face's repeat_kv: the forward copies kv head g to query heads
 * g*group .. (g+1)*group - 1, so the GEMMs are the multi-head ones, and the backward sums the
 * group's fp32 dk and dv, in head order, when it adds them into dqkv. No atomics; with KVH = NH
 * every kernel does what it did before grouping (the same bits).
 *
 * Why this shape and not a fused (flash) kernel: it is the CPU twin's math step for step, so the
 * two compare element for element, and every FLOP but the softmax is a cuBLAS tensor-core GEMM.
 * The T x T matrices (scores, att, datt, dpreatt) are bf16, as in llm.c: at GPT-2 sizes their
 * memory traffic, not the FLOPs, is what attention costs. The softmax works in place on the
 * scores (one warp per row, fp32 math) and its backward in place on datt; the gradients of q, k
 * and v come out of their GEMMs in fp32 and are rounded once, when added into dqkv.
 *
 * Per head (b, h), row-major (T, HS) q, k, v, y, dy and (T, T) att are column-major (HS x T) and
 * (T x T) to cuBLAS, element (t2, t) of the latter being att[t][t2]. So, per head:
 *   scores (T x T)  = scale * op_T(k) @ q   att[t][t2]  = scale * q_t . k_t2
 *   y      (HS x T) = v @ att               y_t         = sum_t2 att[t][t2] v_t2
 *   datt   (T x T)  = op_T(v) @ dy          datt[t][t2] = dy_t . v_t2
 *   dv     (HS x T) = dy @ op_T(att)        dv_t2       = sum_t att[t][t2] dy_t
 *   dq     (HS x T) = scale * k @ dpreatt   dq_t        = scale * sum_t2 dpreatt[t][t2] k_t2
 *   dk     (HS x T) = scale * q @ op_T(dp)  dk_t2       = scale * sum_t dpreatt[t][t2] q_t
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/attention.h"
#include "layers/attention_internal.h"
#include "layers/cublas_context_internal.cuh"
#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"

// ---------------------------------------------------------------------------------------------
// kernels

// float -> bf16, round to nearest even, a NaN to sign | 0x7fc0: cuda_common.cuh's rounding, the
// host's bits (common/float16.h).
static __device__ __forceinline__ __nv_bfloat16 round_bf16(float value) {
  return __ushort_as_bfloat16(mp_bf16_from_float_device(value));
}

// qkv (B, T, W) -> q, k, v (B, NH, T, HS), W = (NH + 2 KVH) HS: query head h gets its own q and
// the k and v of kv head h / (NH / KVH) (a kv head is copied to each query head of its group).
// One thread per element of q.
__global__ static void permute_qkv_kernel(__nv_bfloat16 *q, __nv_bfloat16 *k, __nv_bfloat16 *v,
                                          const __nv_bfloat16 *qkv, int B, int T, int NH, int KVH,
                                          int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * NH * T * HS) return;
  const int i = (int)(idx % HS);
  size_t rest = idx / HS;
  const int t = (int)(rest % T);
  rest /= T;
  const int h = (int)(rest % NH);
  const int b = (int)(rest / NH);
  const int g = h / (NH / KVH);
  const size_t row = ((size_t)b * T + t) * (size_t)(NH + 2 * KVH) * HS;
  q[idx] = qkv[row + (size_t)h * HS + i];
  k[idx] = qkv[row + (size_t)(NH + g) * HS + i];
  v[idx] = qkv[row + (size_t)(NH + KVH + g) * HS + i];
}

// heads (B, NH, T, HS) -> tokens (B, T, NH, HS) = (B, T, C); one thread per output element.
__global__ static void heads_to_tokens_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *y, int B,
                                              int T, int NH, int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * T * NH * HS) return;
  const int i = (int)(idx % HS);
  size_t rest = idx / HS;
  const int h = (int)(rest % NH);
  rest /= NH;
  const int t = (int)(rest % T);
  const int b = (int)(rest / T);
  out[idx] = y[(((size_t)b * NH + h) * T + t) * HS + i];
}

// tokens (B, T, C) -> heads (B, NH, T, HS); one thread per output element.
__global__ static void tokens_to_heads_kernel(__nv_bfloat16 *dy, const __nv_bfloat16 *dout, int B,
                                              int T, int NH, int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * NH * T * HS) return;
  const int i = (int)(idx % HS);
  size_t rest = idx / HS;
  const int t = (int)(rest % T);
  rest /= T;
  const int h = (int)(rest % NH);
  const int b = (int)(rest / NH);
  dy[idx] = dout[((size_t)b * T + t) * NH * HS + (size_t)h * HS + i];
}

// dqkv (B, T, W) += dq, dk, dv (B, NH, T, HS) fp32, W = (NH + 2 KVH) HS: a query head's channels
// take its dq, a kv head's take the sum of its group's dk (or dv), in fp32 in head order; one
// rounding to bf16 per element (for KVH = NH, the sum is the one head's value). One thread per
// element of dqkv.
__global__ static void accumulate_dqkv_kernel(__nv_bfloat16 *dqkv, const float *dq, const float *dk,
                                              const float *dv, int B, int T, int NH, int KVH,
                                              int HS) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int W = (NH + 2 * KVH) * HS;
  if (idx >= (size_t)B * T * W) return;
  const int column = (int)(idx % W);
  const size_t bt = idx / W;
  const int t = (int)(bt % T);
  const int b = (int)(bt / T);
  const int i = column % HS, head = column / HS;  // head of q (< NH), then of k, then of v
  const size_t per_head = (size_t)T * HS;
  float g;
  if (head < NH) {
    g = dq[((size_t)b * NH + head) * per_head + (size_t)t * HS + i];
  } else {
    const bool is_k = head < NH + KVH;
    const float *grad = is_k ? dk : dv;
    const int group = NH / KVH, first = (head - NH - (is_k ? 0 : KVH)) * group;
    const float *from = grad + ((size_t)b * NH + first) * per_head + (size_t)t * HS + i;
    g = from[0];
    for (int j = 1; j < group; j++) g += from[j * per_head];
  }
  dqkv[idx] = round_bf16(__bfloat162float(dqkv[idx]) + g);
}

// In place over att (rows, T), rows = B * NH * T, row r being query t = r % T: scores of keys
// t2 <= t become softmax probabilities (fp32 math, as the CPU twin: exp(x - max) * (1 / sum)),
// keys t2 > t become exactly 0. One warp per row; each lane reads and writes only its own
// elements, so working in place is safe.
__global__ static void causal_softmax_kernel(__nv_bfloat16 *att, int rows, int T) {
  const int row = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  const int t = row % T;
  __nv_bfloat16 *x = att + (size_t)row * T;

  float maxval = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) maxval = fmaxf(maxval, __bfloat162float(x[t2]));
  maxval = mp_warp_max(maxval);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) sum += expf(__bfloat162float(x[t2]) - maxval);
  sum = mp_warp_sum(sum);
  const float inv_sum = 1.0f / sum;
  for (int t2 = lane; t2 < T; t2 += 32) {
    const float p = t2 <= t ? expf(__bfloat162float(x[t2]) - maxval) * inv_sum : 0.0f;
    x[t2] = round_bf16(p);
  }
}

// In place over datt (rows, T): dpreatt = att * (datt - sum_t2 att * datt) for t2 <= t (fp32
// math, as the CPU twin), exactly 0 for t2 > t. One warp per row.
__global__ static void causal_softmax_backward_kernel(__nv_bfloat16 *datt,
                                                      const __nv_bfloat16 *att, int rows, int T) {
  const int row = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = row % T;
  __nv_bfloat16 *d = datt + (size_t)row * T;
  const __nv_bfloat16 *a = att + (size_t)row * T;

  float dot = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) dot += __bfloat162float(a[t2]) * __bfloat162float(d[t2]);
  dot = mp_warp_sum(dot);
  for (int t2 = lane; t2 < T; t2 += 32) {
    const float g =
        t2 <= t ? __bfloat162float(a[t2]) * (__bfloat162float(d[t2]) - dot) : 0.0f;
    d[t2] = round_bf16(g);
  }
}

// ---------------------------------------------------------------------------------------------
// launchers

// C_i (m x n, ld ldc; bf16 or fp32) = alpha * op(A_i) (m x k) @ op(B_i) (k x n) for the `batch`
// heads i, A and B bf16 with the given strides between heads, fp32 accumulation.
static void batched_gemm(mp_cublas *cublas, bool trans_a, bool trans_b, int m, int n, int k,
                         float alpha, const __nv_bfloat16 *A, int lda, long long stride_a,
                         const __nv_bfloat16 *B, int ldb, long long stride_b, void *C,
                         cudaDataType_t c_type, int ldc, long long stride_c, int batch) {
  const float beta = 0.0f;
  MP_CUBLAS_OK(cublas, cublasGemmStridedBatchedEx(
                           cublas->blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, CUDA_R_16BF,
                           lda, stride_a, B, CUDA_R_16BF, ldb, stride_b, &beta, C, c_type, ldc,
                           stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Checks the shape; false (and nothing to do) for a negative one or a KVH that does not divide
// NH, recorded, or an empty one.
static bool attention_shape_ok(mp_cublas *cublas, const char *who, int B, int T, int NH, int KVH,
                               int HS) {
  if (B < 0 || T < 0 || NH < 0 || KVH < 0 || HS < 0) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT,
                             "%s: negative shape B=%d T=%d NH=%d KVH=%d HS=%d", who, B, T, NH, KVH,
                             HS);
    return false;
  }
  if (B == 0 || T == 0 || NH == 0 || HS == 0) return false;
  if (KVH == 0 || NH % KVH != 0) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT,
                             "%s: KVH=%d kv heads must divide NH=%d query heads", who, KVH, NH);
    return false;
  }
  return true;
}

extern "C" size_t mp_attention_cuda_scratch_bytes(int B, int T, int NH, int HS) {
  return mp_attention_cuda_layout_of(B, T, NH, HS).total;
}

extern "C" void mp_attention_forward_cuda(mp_cublas *cublas, mp_bf16 *out, mp_bf16 *att,
                                          const mp_bf16 *qkv, void *scratch, int B, int T, int NH,
                                          int KVH, int HS, mp_cuda_stream stream) {
  if (!attention_shape_ok(cublas, "mp_attention_forward_cuda", B, T, NH, KVH, HS)) return;
  if (!mp_cublas_bind_stream(cublas, stream)) return;
  const mp_attention_cuda_layout layout = mp_attention_cuda_layout_of(B, T, NH, HS);
  char *base = (char *)scratch;
  __nv_bfloat16 *q = (__nv_bfloat16 *)(base + layout.q);  // (B, NH, T, HS)
  __nv_bfloat16 *k = (__nv_bfloat16 *)(base + layout.k);  // (B, NH, T, HS), kv heads repeated
  __nv_bfloat16 *v = (__nv_bfloat16 *)(base + layout.v);  // (B, NH, T, HS), kv heads repeated
  __nv_bfloat16 *y = (__nv_bfloat16 *)(base + layout.y);  // (B, NH, T, HS)
  __nv_bfloat16 *att_ = (__nv_bfloat16 *)att;              // (B, NH, T, T)
  const size_t n = (size_t)B * NH * T * HS;
  const int heads = B * NH, rows = B * NH * T;
  const long long head_stride = (long long)T * HS, att_stride = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)HS);
  const int block = 256;

  permute_qkv_kernel<<<(unsigned)mp_ceil_div(n, block), block, 0, stream>>>(
      q, k, v, (const __nv_bfloat16 *)qkv, B, T, NH, KVH, HS);
  MP_CUDA_CHECK_LAUNCH("permute_qkv_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "permute_qkv_kernel");
  // att[t][t2] = scale * q_t . k_t2, for all t2 (the softmax masks).
  batched_gemm(cublas, true, false, T, T, HS, scale, k, HS, head_stride, q, HS, head_stride, att_,
               CUDA_R_16BF, T, att_stride, heads);
  causal_softmax_kernel<<<(unsigned)mp_ceil_div((size_t)rows * 32, block), block, 0, stream>>>(
      att_, rows, T);
  MP_CUDA_CHECK_LAUNCH("causal_softmax_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "causal_softmax_kernel");
  // y[t] = sum_t2 att[t][t2] v_t2 (masked probabilities are exactly 0).
  batched_gemm(cublas, false, false, HS, T, T, 1.0f, v, HS, head_stride, att_, T, att_stride, y,
               CUDA_R_16BF, HS, head_stride, heads);
  heads_to_tokens_kernel<<<(unsigned)mp_ceil_div(n, block), block, 0, stream>>>(
      (__nv_bfloat16 *)out, y, B, T, NH, HS);
  MP_CUDA_CHECK_LAUNCH("heads_to_tokens_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "heads_to_tokens_kernel");
}

extern "C" void mp_attention_backward_cuda(mp_cublas *cublas, mp_bf16 *dqkv, const mp_bf16 *dout,
                                           const mp_bf16 *qkv, const mp_bf16 *att, void *scratch,
                                           int B, int T, int NH, int KVH, int HS,
                                           mp_cuda_stream stream) {
  if (!attention_shape_ok(cublas, "mp_attention_backward_cuda", B, T, NH, KVH, HS)) return;
  if (!mp_cublas_bind_stream(cublas, stream)) return;
  const mp_attention_cuda_layout layout = mp_attention_cuda_layout_of(B, T, NH, HS);
  char *base = (char *)scratch;
  __nv_bfloat16 *q = (__nv_bfloat16 *)(base + layout.q);        // (B, NH, T, HS)
  __nv_bfloat16 *k = (__nv_bfloat16 *)(base + layout.k);        // (B, NH, T, HS), repeated
  __nv_bfloat16 *v = (__nv_bfloat16 *)(base + layout.v);        // (B, NH, T, HS), repeated
  __nv_bfloat16 *dy = (__nv_bfloat16 *)(base + layout.y);       // (B, NH, T, HS)
  float *dq = (float *)(base + layout.dq);                      // (B, NH, T, HS)
  float *dk = (float *)(base + layout.dk);                      // (B, NH, T, HS) per query head
  float *dv = (float *)(base + layout.dv);                      // (B, NH, T, HS) per query head
  __nv_bfloat16 *datt = (__nv_bfloat16 *)(base + layout.datt);  // (B, NH, T, T)
  const __nv_bfloat16 *att_ = (const __nv_bfloat16 *)att;      // (B, NH, T, T)
  const size_t n = (size_t)B * NH * T * HS;
  const int heads = B * NH, rows = B * NH * T;
  const long long head_stride = (long long)T * HS, att_stride = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)HS);
  const int block = 256;

  permute_qkv_kernel<<<(unsigned)mp_ceil_div(n, block), block, 0, stream>>>(
      q, k, v, (const __nv_bfloat16 *)qkv, B, T, NH, KVH, HS);
  MP_CUDA_CHECK_LAUNCH("permute_qkv_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "permute_qkv_kernel");
  tokens_to_heads_kernel<<<(unsigned)mp_ceil_div(n, block), block, 0, stream>>>(
      dy, (const __nv_bfloat16 *)dout, B, T, NH, HS);
  MP_CUDA_CHECK_LAUNCH("tokens_to_heads_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "tokens_to_heads_kernel");
  // datt[t][t2] = dy_t . v_t2
  batched_gemm(cublas, true, false, T, T, HS, 1.0f, v, HS, head_stride, dy, HS, head_stride, datt,
               CUDA_R_16BF, T, att_stride, heads);
  // dv[t2] = sum_t att[t][t2] dy_t
  batched_gemm(cublas, false, true, HS, T, T, 1.0f, dy, HS, head_stride, att_, T, att_stride, dv,
               CUDA_R_32F, HS, head_stride, heads);
  causal_softmax_backward_kernel<<<(unsigned)mp_ceil_div((size_t)rows * 32, block), block, 0, stream>>>(
      datt, att_, rows, T);
  MP_CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "causal_softmax_backward_kernel");
  // dq[t] = scale * sum_t2 dpreatt[t][t2] k_t2
  batched_gemm(cublas, false, false, HS, T, T, scale, k, HS, head_stride, datt, T, att_stride, dq,
               CUDA_R_32F, HS, head_stride, heads);
  // dk[t2] = scale * sum_t dpreatt[t][t2] q_t
  batched_gemm(cublas, false, true, HS, T, T, scale, q, HS, head_stride, datt, T, att_stride, dk,
               CUDA_R_32F, HS, head_stride, heads);
  accumulate_dqkv_kernel<<<(unsigned)mp_ceil_div((size_t)B * T * (NH + 2 * KVH) * HS, block), block,
                           0, stream>>>((__nv_bfloat16 *)dqkv, dq, dk, dv, B, T, NH, KVH, HS);
  MP_CUDA_CHECK_LAUNCH("accumulate_dqkv_kernel");
  MP_CUDA_RECORD_LAUNCH(cublas, "accumulate_dqkv_kernel");
}
