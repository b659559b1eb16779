/*
 * layers/adamw_cuda.cu — the optimizer step on the GPU: AdamW on fp32 master weights with an
 * optional bf16 working copy, the squared gradient norm, gradient scaling, and float -> bf16; see
 * adamw.h.
 *
 * AdamW performs the same fp32 operations in the same order as adamw.c, written with the _rn
 * intrinsics so nvcc cannot contract them into fused multiply-adds: on a host compiler that does
 * not contract either (x86-64 without -mfma), master weights and moments match the CPU bit for bit.
 * The bias corrections are computed on the host exactly as the CPU does.
 *
 * The squared norm is reduced in two passes with no atomics: a fixed number of blocks that
 * depends only on n each sum a fixed stride of squares in double, then one block adds those
 * partials in order. The same input gives the same bits on every run and on every GPU.
 *
 * Elementwise kernels move 4 floats per 128-bit access when n % 4 == 0 and pointers are aligned.
 */
#include <math.h>

#include "layers/cuda_check.cuh"
#include "layers/adamw.h"
#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"

static constexpr int kElementwiseThreads = 256;
static constexpr int kNormThreads = 256;
static constexpr size_t kNormMaxBlocks = 1024;
static constexpr int kNormItemsPerThread = 16;  // work per thread before the grid hits its cap

// ---------------------------------------------------------------------------------------------
// kernels

// params, m, v (n) updated; params_bf16 (n) written from the new params when not NULL;
// grads (n). One thread per VEC elements.
template <int VEC>
__global__ void adamw_update_kernel(float *params, mp_bf16 *params_bf16, const float *grads,
                                    float *m, float *v, size_t n, float lr, float beta1,
                                    float beta2, float beta1_correction, float beta2_correction,
                                    float eps, float weight_decay) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float p[VEC], g[VEC], m_i[VEC], v_i[VEC];
  mp_load_float<VEC>(p, params + i);
  mp_load_float<VEC>(g, grads + i);
  mp_load_float<VEC>(m_i, m + i);
  mp_load_float<VEC>(v_i, v + i);
  const float one_minus_beta1 = __fsub_rn(1.0f, beta1);
  const float one_minus_beta2 = __fsub_rn(1.0f, beta2);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    // m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g g
    m_i[k] = __fadd_rn(__fmul_rn(beta1, m_i[k]), __fmul_rn(one_minus_beta1, g[k]));
    v_i[k] = __fadd_rn(__fmul_rn(beta2, v_i[k]), __fmul_rn(__fmul_rn(one_minus_beta2, g[k]), g[k]));
    const float m_hat = __fdiv_rn(m_i[k], beta1_correction);
    const float v_hat = __fdiv_rn(v_i[k], beta2_correction);
    // param -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay param)
    const float step = __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), eps)),
                                 __fmul_rn(weight_decay, p[k]));
    p[k] = __fsub_rn(p[k], __fmul_rn(lr, step));
  }
  mp_store_float<VEC>(params + i, p);
  mp_store_float<VEC>(m + i, m_i);
  mp_store_float<VEC>(v + i, v_i);
  if (params_bf16 != NULL) {
#pragma unroll
    for (int k = 0; k < VEC; k++) params_bf16[i + k] = mp_bf16_from_float_device(p[k]);
  }
}

// partials[block] = sum of grads[i]^2 in double over i = (block * threads + thread) * VEC + k,
// stepping by the whole grid; fixed order for a fixed grid.
template <int VEC>
__global__ void grad_norm_partial_kernel(double *partials, const float *grads, size_t n) {
  __shared__ double shared[32];
  const size_t stride = (size_t)gridDim.x * blockDim.x * VEC;
  double sum = 0.0;
  for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    float g[VEC];
    mp_load_float<VEC>(g, grads + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += (double)g[k] * (double)g[k];
  }
  sum = mp_block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *total = sum of partials (count); one block.
__global__ void grad_norm_final_kernel(double *total, const double *partials, int count) {
  __shared__ double shared[32];
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = mp_block_sum(sum, shared);
  if (threadIdx.x == 0) *total = sum;
}

// grads (n) *= scale.
template <int VEC>
__global__ void grad_scale_kernel(float *grads, size_t n, float scale) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float g[VEC];
  mp_load_float<VEC>(g, grads + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) g[k] *= scale;
  mp_store_float<VEC>(grads + i, g);
}

// out (n) = bf16(in (n)), rounded to nearest even.
template <int VEC>
__global__ void bf16_from_float_kernel(mp_bf16 *out, const float *in, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float x[VEC];
  mp_load_float<VEC>(x, in + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) out[i + k] = mp_bf16_from_float_device(x[k]);
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_adamw_update_cuda(float *params, mp_bf16 *params_bf16, const float *grads,
                                     float *m, float *v, size_t n, float lr, float beta1,
                                     float beta2, float eps, float weight_decay, int t,
                                     mp_cuda_stream stream) {
  if (n == 0) return;
  // As mp_adamw_update_cpu: bias corrections in double, then float.
  const float beta1_correction = (float)(1.0 - pow((double)beta1, (double)t));
  const float beta2_correction = (float)(1.0 - pow((double)beta2, (double)t));
  if (n % 4 == 0 && mp_aligned16(params) && mp_aligned16(grads) && mp_aligned16(m) &&
      mp_aligned16(v)) {
    const size_t blocks = mp_ceil_div(n / 4, kElementwiseThreads);
    adamw_update_kernel<4><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(
        params, params_bf16, grads, m, v, n, lr, beta1, beta2, beta1_correction, beta2_correction,
        eps, weight_decay);
    MP_CUDA_CHECK_LAUNCH("adamw_update_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kElementwiseThreads);
    adamw_update_kernel<1><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(
        params, params_bf16, grads, m, v, n, lr, beta1, beta2, beta1_correction, beta2_correction,
        eps, weight_decay);
    MP_CUDA_CHECK_LAUNCH("adamw_update_kernel");
  }
}

// Blocks of the first pass: enough for kNormItemsPerThread elements per thread, at most
// kNormMaxBlocks; a function of n only, so the summation order is too.
static size_t grad_norm_blocks(size_t n) {
  size_t blocks = mp_ceil_div(n, (size_t)kNormThreads * kNormItemsPerThread);
  if (blocks < 1) blocks = 1;
  if (blocks > kNormMaxBlocks) blocks = kNormMaxBlocks;
  return blocks;
}

extern "C" size_t mp_grad_norm_cuda_scratch_floats(size_t n) {
  return 2 * (grad_norm_blocks(n) + 1);  // one double per block, then the total
}

extern "C" mp_status mp_grad_norm_squared_cuda(const float *grads, size_t n, float *scratch,
                                               double *out_host, mp_cuda_stream stream,
                                               mp_error *err) {
  *out_host = 0.0;
  if (n == 0) return MP_OK;
  if (((uintptr_t)scratch & 7u) != 0) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "mp_grad_norm_squared_cuda: scratch %p is not 8-byte aligned; it holds doubles "
                   "(pass memory from mp_device_alloc)",
                   (void *)scratch);
  }
  double *partials = (double *)scratch;
  const size_t blocks = grad_norm_blocks(n);
  double *total = partials + blocks;
  // The vector path is taken for aligned grads with n % 4 == 0; each path is deterministic.
  if (n % 4 == 0 && mp_aligned16(grads)) {
    grad_norm_partial_kernel<4><<<(unsigned)blocks, kNormThreads, 0, stream>>>(partials, grads, n);
    MP_CUDA_CHECK_LAUNCH("grad_norm_partial_kernel");
  } else {
    grad_norm_partial_kernel<1><<<(unsigned)blocks, kNormThreads, 0, stream>>>(partials, grads, n);
    MP_CUDA_CHECK_LAUNCH("grad_norm_partial_kernel");
  }
  MP_CUDA_CHECK(cudaGetLastError());
  grad_norm_final_kernel<<<1, kNormThreads, 0, stream>>>(total, partials, (int)blocks);
  MP_CUDA_CHECK_LAUNCH("grad_norm_final_kernel");
  MP_CUDA_CHECK(cudaGetLastError());
  double result = 0.0;
  MP_CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof result, cudaMemcpyDeviceToHost, stream));
  MP_CUDA_CHECK(cudaStreamSynchronize(stream));
  *out_host = result;
  return MP_OK;
}

extern "C" void mp_grad_scale_cuda(float *grads, size_t n, float scale, mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 4 == 0 && mp_aligned16(grads)) {
    const size_t blocks = mp_ceil_div(n / 4, kElementwiseThreads);
    grad_scale_kernel<4><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(grads, n, scale);
    MP_CUDA_CHECK_LAUNCH("grad_scale_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kElementwiseThreads);
    grad_scale_kernel<1><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(grads, n, scale);
    MP_CUDA_CHECK_LAUNCH("grad_scale_kernel");
  }
}

extern "C" void mp_bf16_from_float_cuda(mp_bf16 *out, const float *in, size_t n,
                                        mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 4 == 0 && mp_aligned16(in)) {
    const size_t blocks = mp_ceil_div(n / 4, kElementwiseThreads);
    bf16_from_float_kernel<4><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("bf16_from_float_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kElementwiseThreads);
    bf16_from_float_kernel<1><<<(unsigned)blocks, kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("bf16_from_float_kernel");
  }
}
