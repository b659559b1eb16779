/*
 * layers/moe_cuda_kernels.cu — the kernels of the mixture of experts on the GPU (moe_cuda.h,
 * moe_cuda_internal.h): the router's fp32 GEMMs on cuBLAS, softmax and top-k, the permutation of
 * the (token, slot) pairs to their experts and its inverse, the weighted combine, the shared
 * MLP's gate, and their backwards.
 *
 * Deterministic throughout: no floating-point atomics; every reduction has a fixed order (a warp's
 * butterfly, a block's mp_block_sum, or one thread's loop). The permutation: one block per expert
 * counts its pairs, one thread scans the counts into offsets, then one block per expert walks the
 * pairs in token order, 256 at a time, and places each of its own at offset + a block-wide prefix
 * sum (cub::BlockScan): the CPU's order (tokens in order within an expert), the same on every
 * run. Softmax, top-k and the router's backward are one thread per token with moe.c's formulas
 * (double exp and sums): E is small (8 to 256) and the work is tiny next to the experts' GEMMs.
 */
#include <cub/block/block_scan.cuh>
#include <math.h>
#include <stdlib.h>

#include "layers/cublas_context_internal.cuh"
#include "layers/cuda_check.cuh"
#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/moe_cuda.h"
#include "layers/moe_cuda_internal.h"

static constexpr int kThreads = 256;
static constexpr int kWarpsPerBlock = kThreads / 32;

// ---------------------------------------------------------------------------------------------
// kernels: the route

// probs (N, E) = softmax(logits); selected (N, K) the K largest by falling value, ties to the
// lowest index; weights (N, K) their probabilities, renormalised when `normalize`. One thread per
// token, moe.c's arithmetic.
__global__ void moe_softmax_top_k_kernel(float *probs, int *selected, float *weights,
                                         const float *logits, int N, int E, int K,
                                         bool normalize) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float *l = logits + (size_t)t * E;
  float *p = probs + (size_t)t * E;
  float max = l[0];
  for (int e = 1; e < E; ++e) max = l[e] > max ? l[e] : max;
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += exp((double)(l[e] - max));
  for (int e = 0; e < E; ++e) p[e] = (float)(exp((double)(l[e] - max)) / sum);
  int *chosen = selected + (size_t)t * K;
  for (int s = 0; s < K; ++s) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < s; ++j) taken = taken || chosen[j] == e;
      if (taken) continue;
      if (best < 0 || p[e] > p[best]) best = e;  // strict: an equal later index loses
    }
    chosen[s] = best;
  }
  double chosen_sum = 0.0;
  for (int s = 0; s < K; ++s) chosen_sum += p[chosen[s]];
  for (int s = 0; s < K; ++s) {
    weights[(size_t)t * K + s] =
        normalize ? (float)(p[chosen[s]] / chosen_sum) : p[chosen[s]];
  }
}

// offset[e + 1] = the pairs sent to expert e (blockIdx.x); offset[0] = 0. Integer sums: exact.
__global__ void moe_count_kernel(int *offset, const int *selected, int pairs) {
  __shared__ int partial[32];
  const int e = blockIdx.x;
  int count = 0;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) count += selected[i] == e;
  count = mp_block_sum(count, partial);
  if (threadIdx.x == 0) {
    offset[e + 1] = count;
    if (e == 0) offset[0] = 0;
  }
}

// offset (E + 1): the counts in [1..E] made offsets, by one thread.
__global__ void moe_scan_kernel(int *offset, int E) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
}

// Expert e's (blockIdx.x) pairs in token order: routed_slot[offset[e] + j] = the j-th pair i with
// selected[i] == e, and slot_row[i] its row.
__global__ void moe_place_kernel(int *routed_slot, int *slot_row, const int *offset,
                                 const int *selected, int pairs) {
  typedef cub::BlockScan<int, kThreads> Scan;
  __shared__ typename Scan::TempStorage scan;
  const int e = blockIdx.x;
  int row = offset[e];
  for (int start = 0; start < pairs; start += kThreads) {
    const int i = start + threadIdx.x;
    const int mine = i < pairs && selected[i] == e;
    int before = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, before, total);
    if (mine) {
      routed_slot[row + before] = i;
      slot_row[i] = row + before;
    }
    row += total;
    __syncthreads();  // the scan's storage is reused by the next chunk
  }
}

// routed_in (R, C) = x of each row's token; one thread per element.
__global__ void moe_gather_kernel(mp_bf16 *routed_in, const mp_bf16 *x, const int *routed_slot,
                                  size_t n, int K, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / C, c = i % C;
  routed_in[i] = x[(size_t)(routed_slot[row] / K) * C + c];
}

// ---------------------------------------------------------------------------------------------
// kernels: the combine and the shared MLP's gate

// gate (N) = sigmoid(x . gate_weight) (or 1 without a weight); one warp per token.
__global__ void moe_gate_kernel(float *gate, const mp_bf16 *x, const mp_bf16 *gate_weight, int N,
                                int C) {
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  float dot = 0.0f;
  if (gate_weight != nullptr) {
    for (int c = lane; c < C; c += 32) {
      dot += mp_bf16_to_float_device(x[(size_t)t * C + c]) *
             mp_bf16_to_float_device(gate_weight[c]);
    }
  }
  dot = mp_warp_sum(dot);
  if (lane == 0) gate[t] = gate_weight != nullptr ? 1.0f / (1.0f + expf(-dot)) : 1.0f;
}

// out (N, C) = bf16(sum over slots of weight * routed_out row + gate * shared_out); one thread
// per element, slots in order.
__global__ void moe_weighted_sum_kernel(mp_bf16 *out, const mp_bf16 *routed_out,
                                        const float *weights, const int *slot_row,
                                        const mp_bf16 *shared_out, const float *gate, size_t n,
                                        int K, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / C, c = i % C;
  float sum = 0.0f;
  for (int s = 0; s < K; ++s) {
    const size_t slot = t * K + s;
    sum += weights[slot] * mp_bf16_to_float_device(routed_out[(size_t)slot_row[slot] * C + c]);
  }
  if (shared_out != nullptr) sum += gate[t] * mp_bf16_to_float_device(shared_out[i]);
  out[i] = mp_bf16_from_float_device(sum);
}

// drouted (R, C) = bf16(weight * dout of the row's token); dweights[slot] = dout . routed_out
// (fp32, the warp's fixed order). One warp per routed row.
__global__ void moe_combine_backward_kernel(mp_bf16 *drouted, float *dweights,
                                            const mp_bf16 *dout, const mp_bf16 *routed_out,
                                            const float *weights, const int *routed_slot,
                                            int rows, int K, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int slot = routed_slot[row];
  const size_t t = (size_t)(slot / K);
  const float w = weights[slot];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float g = mp_bf16_to_float_device(dout[t * C + c]);
    drouted[(size_t)row * C + c] = mp_bf16_from_float_device(w * g);
    dot += g * mp_bf16_to_float_device(routed_out[(size_t)row * C + c]);
  }
  dot = mp_warp_sum(dot);
  if (lane == 0) dweights[slot] = dot;
}

// dlogit (N) = (dout . shared_out) g (1 - g); one warp per token.
__global__ void moe_gate_dlogit_kernel(float *dlogit, const mp_bf16 *dout,
                                       const mp_bf16 *shared_out, const float *gate, int N,
                                       int C) {
  const int t = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) {
    dot += mp_bf16_to_float_device(dout[(size_t)t * C + c]) *
           mp_bf16_to_float_device(shared_out[(size_t)t * C + c]);
  }
  dot = mp_warp_sum(dot);
  const float g = gate[t];
  if (lane == 0) dlogit[t] = dot * g * (1.0f - g);
}

// dshared (N, C) = bf16(g dout); with a gate weight, dx += (one rounding) dlogit * gate_weight.
__global__ void moe_gate_backward_kernel(mp_bf16 *dshared, mp_bf16 *dx, const float *dlogit,
                                         const mp_bf16 *dout, const mp_bf16 *gate_weight,
                                         const float *gate, size_t n, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / C, c = i % C;
  dshared[i] = mp_bf16_from_float_device(gate[t] * mp_bf16_to_float_device(dout[i]));
  if (gate_weight != nullptr) {
    dx[i] = mp_bf16_from_float_device(mp_bf16_to_float_device(dx[i]) +
                                      dlogit[t] * mp_bf16_to_float_device(gate_weight[c]));
  }
}

// dgate_weight (C) += sum over tokens, in order, of dlogit * x; one thread per channel.
__global__ void moe_gate_weight_backward_kernel(float *dgate_weight, const float *dlogit,
                                                const mp_bf16 *x, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int t = 0; t < N; ++t) sum += dlogit[t] * mp_bf16_to_float_device(x[(size_t)t * C + c]);
  dgate_weight[c] += sum;
}

// ---------------------------------------------------------------------------------------------
// kernels: the route's backward

// out (n) = in widened to fp32.
__global__ void moe_widen_kernel(float *out, const mp_bf16 *in, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mp_bf16_to_float_device(in[i]);
}

// dlogits (N, E): the weights' gradient through the (renormalised) top-k to the probabilities,
// plus the load-balancing loss's aux_grad[e], through the softmax; plus the z-loss's
// z_scale lse p (z_scale = 2 z_coeff / n). One thread per token, moe.c's arithmetic.
__global__ void moe_router_backward_kernel(float *dlogits, const float *dweights,
                                           const float *probs, const float *logits,
                                           const int *selected, const double *aux_grad, int N,
                                           int E, int K, bool normalize, double z_scale) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float *p = probs + (size_t)t * E, *l = logits + (size_t)t * E;
  const int *chosen = selected + (size_t)t * K;
  const float *dw = dweights + (size_t)t * K;
  double sum = 0.0, dot = 0.0;
  if (normalize) {
    for (int s = 0; s < K; ++s) sum += p[chosen[s]];
    for (int s = 0; s < K; ++s) dot += (double)dw[s] * (p[chosen[s]] / sum);
  }
  // d(probability e) = aux_grad[e] + the weights' share (e is chosen at most once).
  auto dprob = [&](int e) {
    double d = aux_grad[e];
    for (int s = 0; s < K; ++s) {
      if (chosen[s] == e) d += normalize ? ((double)dw[s] - dot) / sum : (double)dw[s];
    }
    return d;
  };
  double p_dot_dp = 0.0;
  for (int e = 0; e < E; ++e) p_dot_dp += p[e] * dprob(e);
  double lse = 0.0;
  if (z_scale != 0.0) {
    float max = l[0];
    for (int e = 0; e < E; ++e) max = l[e] > max ? l[e] : max;
    double s = 0.0;
    for (int e = 0; e < E; ++e) s += exp((double)(l[e] - max));
    lse = (double)max + log(s);
  }
  for (int e = 0; e < E; ++e) {
    dlogits[(size_t)t * E + e] = (float)(p[e] * (dprob(e) - p_dot_dp) + z_scale * lse * p[e]);
  }
}

// dx (N, C) = bf16(dx + dx_router + the token's K routed rows of drouted_in, slots in order).
__global__ void moe_scatter_add_kernel(mp_bf16 *dx, const float *dx_router,
                                       const mp_bf16 *drouted_in, const int *slot_row, size_t n,
                                       int K, int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / C, c = i % C;
  float sum = dx_router[i];
  for (int s = 0; s < K; ++s) {
    sum += mp_bf16_to_float_device(drouted_in[(size_t)slot_row[t * K + s] * C + c]);
  }
  dx[i] = mp_bf16_from_float_device(mp_bf16_to_float_device(dx[i]) + sum);
}

// scratch (E + 1): blocks 0..E-1 the sum over tokens of probs[:, e], block E the sum of
// logsumexp(logits)^2; each a fixed-order block sum in double.
__global__ void moe_stats_kernel(double *scratch, const float *probs, const float *logits, int N,
                                 int E) {
  __shared__ double partial[32];
  const int e = blockIdx.x;
  double sum = 0.0;
  for (int t = threadIdx.x; t < N; t += blockDim.x) {
    if (e < E) {
      sum += probs[(size_t)t * E + e];
    } else {
      const float *l = logits + (size_t)t * E;
      float max = l[0];
      for (int j = 0; j < E; ++j) max = l[j] > max ? l[j] : max;
      double s = 0.0;
      for (int j = 0; j < E; ++j) s += exp((double)(l[j] - max));
      const double lse = (double)max + log(s);
      sum += lse * lse;
    }
  }
  sum = mp_block_sum(sum, partial);
  if (threadIdx.x == 0) scratch[e] = sum;
}

// ---------------------------------------------------------------------------------------------
// launchers

static unsigned blocks_for(size_t n, size_t per_block) {
  return (unsigned)mp_ceil_div(n, per_block);
}

// Row-major out (M, Nc) = a (M, Kd) @ b^T, with b (Nc, Kd), or its transposes, in cuBLAS's
// column-major terms: the caller passes them. fp32 accumulation (CUBLAS_COMPUTE_32F).
static void gemm(mp_cublas *cublas, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
                 int k, const void *a, cudaDataType type_a, int lda, const void *b,
                 cudaDataType type_b, int ldb, float beta, float *c, int ldc) {
  const float alpha = 1.0f;
  MP_CUBLAS_OK(cublas, cublasGemmEx(cublas->blas, op_a, op_b, m, n, k, &alpha, a, type_a, lda, b,
                                    type_b, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

extern "C" void mp_moe_cuda_grouped_gemm(mp_cublas *cublas, int count, bool trans_a,
                                         const int *m, const int *n, const int *k,
                                         const mp_bf16 *const *a, const int *lda,
                                         const mp_bf16 *const *b, const int *ldb, float beta,
                                         mp_bf16 *const *c, const int *ldc,
                                         void **pointer_scratch, mp_cuda_stream stream) {
  if (count <= 0) return;
  if (count > MP_MOE_GEMM_GROUP) {
    mp_cublas_record_failure(cublas, MP_ERR_INPUT, "moe grouped GEMM: %d problems, at most %d",
                             count, (int)MP_MOE_GEMM_GROUP);
    return;
  }
  // One group per expert (their row counts differ), one problem each. The pointer arrays go to
  // the device in stream order: from pageable memory the copy has read them when it returns, and
  // a later call's copy waits behind this call's GEMMs.
  const void *pointers[3 * MP_MOE_GEMM_GROUP];
  cublasOperation_t op_a[MP_MOE_GEMM_GROUP], op_b[MP_MOE_GEMM_GROUP];
  float alpha[MP_MOE_GEMM_GROUP], betas[MP_MOE_GEMM_GROUP];
  int group_size[MP_MOE_GEMM_GROUP];
  for (int p = 0; p < count; ++p) {
    pointers[p] = a[p];
    pointers[MP_MOE_GEMM_GROUP + p] = b[p];
    pointers[2 * MP_MOE_GEMM_GROUP + p] = c[p];
    op_a[p] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    op_b[p] = CUBLAS_OP_N;
    alpha[p] = 1.0f;
    betas[p] = beta;
    group_size[p] = 1;
  }
  const cudaError_t copied = cudaMemcpyAsync(pointer_scratch, pointers, sizeof pointers,
                                             cudaMemcpyHostToDevice, stream);
  if (copied != cudaSuccess) {
    mp_cublas_record_failure(cublas, MP_ERR_RUNTIME,
                             "cudaMemcpyAsync of the grouped GEMM's pointers failed: %s at %s:%d",
                             cudaGetErrorString(copied), __FILE__, __LINE__);
    return;
  }
  if (!mp_cublas_bind_stream(cublas, stream)) return;
  const void *const *a_device = (const void *const *)pointer_scratch;
  MP_CUBLAS_OK(cublas, cublasGemmGroupedBatchedEx(
                           cublas->blas, op_a, op_b, m, n, k, alpha, a_device, CUDA_R_16BF, lda,
                           a_device + MP_MOE_GEMM_GROUP, CUDA_R_16BF, ldb, betas,
                           pointer_scratch + 2 * MP_MOE_GEMM_GROUP, CUDA_R_16BF, ldc, count,
                           group_size, CUBLAS_COMPUTE_32F));
}

extern "C" void mp_moe_cuda_route(mp_cublas *cublas, const mp_bf16 *x, const mp_bf16 *router,
                                  mp_moe_cache_cuda *cache, mp_cuda_stream stream) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  const int pairs = N * K;
  if (N > 0) {
    // logits (N, E) = x (N, C) @ router^T: column-major logits^T (E, N) = router^T (E, C) x^T.
    if (!mp_cublas_bind_stream(cublas, stream)) return;
    gemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, E, N, C, router, CUDA_R_16BF, C, x, CUDA_R_16BF, C,
         0.0f, cache->logits, E);
    moe_softmax_top_k_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(
        cache->probs, cache->selected, cache->weights, cache->logits, N, E, K,
        shape->normalize_top_k);
    MP_CUDA_CHECK_LAUNCH("moe_softmax_top_k_kernel");
  }
  moe_count_kernel<<<E, kThreads, 0, stream>>>(cache->expert_offset, cache->selected, pairs);
  MP_CUDA_CHECK_LAUNCH("moe_count_kernel");
  moe_scan_kernel<<<1, 1, 0, stream>>>(cache->expert_offset, E);
  MP_CUDA_CHECK_LAUNCH("moe_scan_kernel");
  if (pairs == 0) return;
  moe_place_kernel<<<E, kThreads, 0, stream>>>(cache->routed_slot, cache->slot_row,
                                               cache->expert_offset, cache->selected, pairs);
  MP_CUDA_CHECK_LAUNCH("moe_place_kernel");
  const size_t n = (size_t)pairs * C;
  moe_gather_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      cache->routed_in, x, cache->routed_slot, n, K, C);
  MP_CUDA_CHECK_LAUNCH("moe_gather_kernel");
}

extern "C" mp_status mp_moe_cuda_copy_offsets(int *host, const int *device, int n,
                                              mp_cuda_stream stream, mp_error *err) {
  MP_CUDA_CHECK(cudaMemcpyAsync(host, device, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost,
                                stream));
  MP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return MP_OK;
}

extern "C" void mp_moe_cuda_zero(void *p, size_t bytes, mp_cuda_stream stream) {
  if (bytes == 0) return;
  const cudaError_t status = cudaMemsetAsync(p, 0, bytes, stream);
  if (status != cudaSuccess) {
    mp_cuda_record_launch_failure("cudaMemsetAsync (moe)", __FILE__, __LINE__,
                                  cudaGetErrorString(status));
  }
}

extern "C" void mp_moe_cuda_gate(float *gate, const mp_bf16 *x, const mp_bf16 *gate_weight,
                                 int N, int C, mp_cuda_stream stream) {
  if (N <= 0) return;
  moe_gate_kernel<<<blocks_for(N, kWarpsPerBlock), kThreads, 0, stream>>>(gate, x, gate_weight,
                                                                           N, C);
  MP_CUDA_CHECK_LAUNCH("moe_gate_kernel");
}

extern "C" void mp_moe_cuda_weighted_sum(mp_bf16 *out, const mp_bf16 *routed_out,
                                         const float *weights, const int *routed_slot,
                                         const int *slot_row, const mp_bf16 *shared_out,
                                         const float *gate, int N, int K, int C,
                                         mp_cuda_stream stream) {
  (void)routed_slot;
  const size_t n = (size_t)N * C;
  if (n == 0) return;
  moe_weighted_sum_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      out, routed_out, weights, slot_row, shared_out, gate, n, K, C);
  MP_CUDA_CHECK_LAUNCH("moe_weighted_sum_kernel");
}

extern "C" void mp_moe_cuda_shared_gate_backward(mp_bf16 *dshared, mp_bf16 *dx,
                                                 float *dgate_weight, float *dlogit,
                                                 const mp_bf16 *dout, const mp_bf16 *x,
                                                 const mp_bf16 *gate_weight,
                                                 const mp_bf16 *shared_out, const float *gate,
                                                 int N, int C, mp_cuda_stream stream) {
  const size_t n = (size_t)N * C;
  if (n == 0) return;
  if (gate_weight != nullptr) {
    moe_gate_dlogit_kernel<<<blocks_for(N, kWarpsPerBlock), kThreads, 0, stream>>>(
        dlogit, dout, shared_out, gate, N, C);
    MP_CUDA_CHECK_LAUNCH("moe_gate_dlogit_kernel");
  }
  moe_gate_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      dshared, dx, dlogit, dout, gate_weight, gate, n, C);
  MP_CUDA_CHECK_LAUNCH("moe_gate_backward_kernel");
  if (gate_weight != nullptr) {
    moe_gate_weight_backward_kernel<<<blocks_for(C, kThreads), kThreads, 0, stream>>>(
        dgate_weight, dlogit, x, N, C);
    MP_CUDA_CHECK_LAUNCH("moe_gate_weight_backward_kernel");
  }
}

extern "C" void mp_moe_combine_backward_cuda(mp_bf16 *drouted, float *dweights,
                                             const mp_bf16 *dout, const mp_moe_cache_cuda *cache,
                                             mp_cuda_stream stream) {
  const int rows = cache->shape.tokens * cache->shape.top_k;
  if (rows == 0) return;
  moe_combine_backward_kernel<<<blocks_for(rows, kWarpsPerBlock), kThreads, 0, stream>>>(
      drouted, dweights, dout, cache->routed_out, cache->weights, cache->routed_slot, rows,
      cache->shape.top_k, cache->shape.channels);
  MP_CUDA_CHECK_LAUNCH("moe_combine_backward_kernel");
}

extern "C" mp_status mp_moe_route_backward_cuda(
    mp_cublas *cublas, mp_bf16 *dx, float *drouter, const mp_bf16 *drouted_in,
    const float *dweights, const mp_bf16 *x, const mp_bf16 *router,
    const mp_moe_cache_cuda *cache, const mp_moe_stats *stats, double aux_coeff, double z_coeff,
    mp_moe_workspace_cuda *workspace, mp_cuda_stream stream, mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  if (N == 0) return MP_OK;
  // The load-balancing loss's gradient on each probability, E routed_e / n^2 (moe.c), uploaded.
  const double n = stats->tokens > 0.0 ? stats->tokens : 1.0;
  double *aux_grad = (double *)malloc((size_t)E * sizeof(double));
  if (aux_grad == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "moe (CUDA): out of host memory for %d experts", E);
  }
  for (int e = 0; e < E; ++e) aux_grad[e] = aux_coeff * (double)E * stats->routed[e] / (n * n);
  const cudaError_t copied = cudaMemcpyAsync(workspace->aux_grad, aux_grad,
                                             (size_t)E * sizeof(double), cudaMemcpyHostToDevice,
                                             stream);
  // From pageable memory the copy has left aux_grad when cudaMemcpyAsync returns.
  free(aux_grad);
  MP_CUDA_CHECK(copied);

  moe_router_backward_kernel<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(
      workspace->dlogits, dweights, cache->probs, cache->logits, cache->selected,
      workspace->aux_grad, N, E, K, shape->normalize_top_k, z_coeff * 2.0 / n);
  MP_CUDA_CHECK_LAUNCH("moe_router_backward_kernel");
  const size_t nc = (size_t)N * C, ec = (size_t)E * C;
  moe_widen_kernel<<<blocks_for(nc, kThreads), kThreads, 0, stream>>>(workspace->x_wide, x, nc);
  MP_CUDA_CHECK_LAUNCH("moe_widen_kernel");
  moe_widen_kernel<<<blocks_for(ec, kThreads), kThreads, 0, stream>>>(workspace->router_wide,
                                                                       router, ec);
  MP_CUDA_CHECK_LAUNCH("moe_widen_kernel");
  if (mp_cublas_bind_stream(cublas, stream)) {
    // dx_router (N, C) = dlogits (N, E) @ router (E, C): column-major (C, N) = router^T dlogits^T.
    gemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, E, workspace->router_wide, CUDA_R_32F, C,
         workspace->dlogits, CUDA_R_32F, E, 0.0f, workspace->dx_router, C);
    // drouter (E, C) += dlogits^T (E, N) @ x (N, C): column-major (C, E) += x^T dlogits.
    gemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, E, N, workspace->x_wide, CUDA_R_32F, C,
         workspace->dlogits, CUDA_R_32F, E, 1.0f, drouter, C);
  }
  moe_scatter_add_kernel<<<blocks_for(nc, kThreads), kThreads, 0, stream>>>(
      dx, workspace->dx_router, drouted_in, cache->slot_row, nc, K, C);
  MP_CUDA_CHECK_LAUNCH("moe_scatter_add_kernel");
  return MP_OK;
}

extern "C" mp_status mp_moe_stats_add_cuda(mp_moe_stats *stats, const mp_moe_cache_cuda *cache,
                                           double *scratch, mp_cuda_stream stream,
                                           mp_error *err) {
  const int N = cache->shape.tokens, E = cache->shape.experts;
  const int *offset = cache->expert_offset_host;
  for (int e = 0; e < E; ++e) stats->routed[e] += offset[e + 1] - offset[e];
  stats->tokens += N;
  if (N == 0) return MP_OK;
  moe_stats_kernel<<<E + 1, kThreads, 0, stream>>>(scratch, cache->probs, cache->logits, N, E);
  MP_CUDA_CHECK_LAUNCH("moe_stats_kernel");
  double *sums = (double *)malloc((size_t)(E + 1) * sizeof(double));
  if (sums == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "moe (CUDA): out of host memory for %d experts", E);
  }
  cudaError_t status = cudaMemcpyAsync(sums, scratch, (size_t)(E + 1) * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  if (status == cudaSuccess) {
    for (int e = 0; e < E; ++e) stats->prob_sum[e] += sums[e];
    stats->logsumexp_sq += sums[E];
  }
  free(sums);
  MP_CUDA_CHECK(status);
  return MP_OK;
}
