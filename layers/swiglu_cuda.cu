/*
 * layers/swiglu_cuda.cu — SwiGLU (silu(gate) * up) on the GPU over bf16 activations; see
 * swiglu.h.
 *
 * The formulas of swiglu.c, evaluated in fp32 on bf16 inputs (expf, not the fast __expf) and
 * rounded once to bf16 on the way out; a += is one rounding of old + new. Both kernels are
 * memory-bound and elementwise over the (N, F) output: each thread takes VEC consecutive channels
 * f of one row n and reads the gate at inp[n, f] and the up value at inp[n, F + f]. With F a
 * multiple of 8 and every pointer 16-byte aligned (the usual case: device allocations are
 * 256-byte aligned and Llama's F is a multiple of 256) the 8 channels never straddle a row and
 * move with 128-bit loads and stores; otherwise one channel per thread. No reductions: the same
 * bits on every run.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/swiglu.h"

static constexpr int kSwigluThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

static __device__ __forceinline__ float swiglu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// out (N, F) = silu(gate) * up of inp (N, 2F); one thread per VEC outputs of one row.
template <int VEC>
__global__ void swiglu_forward_kernel(mp_bf16 *out, const mp_bf16 *inp, size_t n, int F) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  const size_t row = i / (size_t)F, f = i % (size_t)F;
  const mp_bf16 *gate = inp + row * 2 * (size_t)F + f;
  float g[VEC], u[VEC];
  mp_load_bf16<VEC>(g, gate);
  mp_load_bf16<VEC>(u, gate + F);
#pragma unroll
  for (int k = 0; k < VEC; k++) g[k] = g[k] * swiglu_sigmoid(g[k]) * u[k];
  mp_store_bf16<VEC>(out + i, g);
}

// dinp (N, 2F) += d(gate), d(up) from dout (N, F); one thread per VEC channels of one row.
// d silu(g) / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))), as swiglu.c.
template <int VEC>
__global__ void swiglu_backward_kernel(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout,
                                       size_t n, int F) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  const size_t row = i / (size_t)F, f = i % (size_t)F;
  const size_t at = row * 2 * (size_t)F + f;
  float g[VEC], u[VEC], dy[VEC], dg[VEC], du[VEC];
  mp_load_bf16<VEC>(g, inp + at);
  mp_load_bf16<VEC>(u, inp + at + F);
  mp_load_bf16<VEC>(dy, dout + i);
  mp_load_bf16<VEC>(dg, dinp + at);
  mp_load_bf16<VEC>(du, dinp + at + F);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    const float s = swiglu_sigmoid(g[k]);
    dg[k] += dy[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
    du[k] += dy[k] * g[k] * s;
  }
  mp_store_bf16<VEC>(dinp + at, dg);
  mp_store_bf16<VEC>(dinp + at + F, du);
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_swiglu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, int N, int F,
                                       mp_cuda_stream stream) {
  if (N <= 0 || F <= 0) return;
  const size_t n = (size_t)N * F;
  if (F % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp)) {
    const size_t blocks = mp_ceil_div(n / 8, kSwigluThreads);
    swiglu_forward_kernel<8><<<(unsigned)blocks, kSwigluThreads, 0, stream>>>(out, inp, n, F);
    MP_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kSwigluThreads);
    swiglu_forward_kernel<1><<<(unsigned)blocks, kSwigluThreads, 0, stream>>>(out, inp, n, F);
    MP_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
  }
}

extern "C" void mp_swiglu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout,
                                        int N, int F, mp_cuda_stream stream) {
  if (N <= 0 || F <= 0) return;
  const size_t n = (size_t)N * F;
  if (F % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(inp) && mp_aligned16(dout)) {
    const size_t blocks = mp_ceil_div(n / 8, kSwigluThreads);
    swiglu_backward_kernel<8><<<(unsigned)blocks, kSwigluThreads, 0, stream>>>(dinp, inp, dout,
                                                                              n, F);
    MP_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kSwigluThreads);
    swiglu_backward_kernel<1><<<(unsigned)blocks, kSwigluThreads, 0, stream>>>(dinp, inp, dout,
                                                                              n, F);
    MP_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
  }
}
