/*
 * layers/residual_cuda.cu — the residual connection on the GPU over bf16; see residual.h.
 *
 * Sums are taken in fp32 and rounded once to bf16. Memory-bound: each thread moves 8 values with
 * 128-bit loads and stores when n is a multiple of 8 and every pointer is 16-byte aligned,
 * otherwise one value.
 */
#include "layers/cuda_common.cuh"
#include "layers/residual.h"
#include "layers/cuda_launch.h"

// ---------------------------------------------------------------------------------------------
// kernels

// out (n) = inp1 (n) + inp2 (n); out may be inp1 or inp2 (each value is read, then written, by
// one thread).
template <int VEC>
__global__ void residual_forward_kernel(mp_bf16 *out, const mp_bf16 *inp1, const mp_bf16 *inp2,
                                        size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float a[VEC], b[VEC];
  mp_load_bf16<VEC>(a, inp1 + i);
  mp_load_bf16<VEC>(b, inp2 + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) a[k] += b[k];
  mp_store_bf16<VEC>(out + i, a);
}

// dinp1 (n) += dout (n); dinp2 (n) += dout (n).
template <int VEC>
__global__ void residual_backward_kernel(mp_bf16 *dinp1, mp_bf16 *dinp2, const mp_bf16 *dout,
                                         size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float dy[VEC], d1[VEC], d2[VEC];
  mp_load_bf16<VEC>(dy, dout + i);
  mp_load_bf16<VEC>(d1, dinp1 + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) d1[k] += dy[k];
  mp_store_bf16<VEC>(dinp1 + i, d1);
  mp_load_bf16<VEC>(d2, dinp2 + i);  // after the store, so dinp1 == dinp2 adds twice, as on the CPU
#pragma unroll
  for (int k = 0; k < VEC; k++) d2[k] += dy[k];
  mp_store_bf16<VEC>(dinp2 + i, d2);
}

// ---------------------------------------------------------------------------------------------
// launchers

static constexpr int kResidualThreads = 256;

extern "C" void mp_residual_forward_cuda(mp_bf16 *out, const mp_bf16 *inp1, const mp_bf16 *inp2,
                                         size_t n, mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp1) && mp_aligned16(inp2)) {
    const size_t blocks = mp_ceil_div(n / 8, kResidualThreads);
    residual_forward_kernel<8>
        <<<(unsigned)blocks, kResidualThreads, 0, stream>>>(out, inp1, inp2, n);
    MP_CUDA_CHECK_LAUNCH("residual_forward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kResidualThreads);
    residual_forward_kernel<1>
        <<<(unsigned)blocks, kResidualThreads, 0, stream>>>(out, inp1, inp2, n);
    MP_CUDA_CHECK_LAUNCH("residual_forward_kernel");
  }
}

extern "C" void mp_residual_backward_cuda(mp_bf16 *dinp1, mp_bf16 *dinp2, const mp_bf16 *dout,
                                          size_t n, mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 8 == 0 && mp_aligned16(dinp1) && mp_aligned16(dinp2) && mp_aligned16(dout)) {
    const size_t blocks = mp_ceil_div(n / 8, kResidualThreads);
    residual_backward_kernel<8>
        <<<(unsigned)blocks, kResidualThreads, 0, stream>>>(dinp1, dinp2, dout, n);
    MP_CUDA_CHECK_LAUNCH("residual_backward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kResidualThreads);
    residual_backward_kernel<1>
        <<<(unsigned)blocks, kResidualThreads, 0, stream>>>(dinp1, dinp2, dout, n);
    MP_CUDA_CHECK_LAUNCH("residual_backward_kernel");
  }
}
