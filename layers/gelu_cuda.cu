/*
 * layers/gelu_cuda.cu — the tanh GELU on the GPU over bf16 activations; see gelu.h.
 *
 * The same formula as gelu.c, evaluated in fp32 on bf16 inputs and rounded once to bf16 on the
 * way out. Both kernels are memory-bound, so each thread moves 8 values with 128-bit loads and
 * stores when n is a multiple of 8 and every pointer is 16-byte aligned (the usual case: device
 * allocations are 256-byte aligned and B*T*4C is a multiple of 8); otherwise one value per thread.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/gelu.h"
#include "layers/cuda_launch.h"

#define MP_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi), as in gelu.c */
#define MP_GELU_CUBE 0.044715f

// ---------------------------------------------------------------------------------------------
// kernels

static __device__ __forceinline__ float gelu_value(float x) {
  const float cube = MP_GELU_CUBE * x * x * x;
  return 0.5f * x * (1.0f + tanhf(MP_GELU_SCALE * (x + cube)));
}

static __device__ __forceinline__ float gelu_local_grad(float x) {
  const float cube = MP_GELU_CUBE * x * x * x;
  const float tanh_arg = MP_GELU_SCALE * (x + cube);
  const float tanh_out = tanhf(tanh_arg);
  const float sech2 = 1.0f - tanh_out * tanh_out;  // sech^2 = 1 - tanh^2, as gelu.c
  return 0.5f * (1.0f + tanh_out) +
         x * 0.5f * sech2 * MP_GELU_SCALE * (1.0f + 3.0f * MP_GELU_CUBE * x * x);
}

// out (n) = gelu(inp (n)); one thread per VEC values. out may be inp: each value is read before
// it is written, by the same thread.
template <int VEC>
__global__ void gelu_forward_kernel(mp_bf16 *out, const mp_bf16 *inp, size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float x[VEC];
  mp_load_bf16<VEC>(x, inp + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) x[k] = gelu_value(x[k]);
  mp_store_bf16<VEC>(out + i, x);
}

// dinp (n) += gelu'(inp (n)) * dout (n); one thread per VEC values.
template <int VEC>
__global__ void gelu_backward_kernel(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout,
                                     size_t n) {
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i >= n) return;
  float x[VEC], dy[VEC], dx[VEC];
  mp_load_bf16<VEC>(x, inp + i);
  mp_load_bf16<VEC>(dy, dout + i);
  mp_load_bf16<VEC>(dx, dinp + i);
#pragma unroll
  for (int k = 0; k < VEC; k++) dx[k] += gelu_local_grad(x[k]) * dy[k];
  mp_store_bf16<VEC>(dinp + i, dx);
}

// ---------------------------------------------------------------------------------------------
// launchers

static constexpr int kGeluThreads = 256;

extern "C" void mp_gelu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, size_t n,
                                     mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp)) {
    const size_t blocks = mp_ceil_div(n / 8, kGeluThreads);
    gelu_forward_kernel<8><<<(unsigned)blocks, kGeluThreads, 0, stream>>>(out, inp, n);
    MP_CUDA_CHECK_LAUNCH("gelu_forward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kGeluThreads);
    gelu_forward_kernel<1><<<(unsigned)blocks, kGeluThreads, 0, stream>>>(out, inp, n);
    MP_CUDA_CHECK_LAUNCH("gelu_forward_kernel");
  }
}

extern "C" void mp_gelu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout,
                                      size_t n, mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(inp) && mp_aligned16(dout)) {
    const size_t blocks = mp_ceil_div(n / 8, kGeluThreads);
    gelu_backward_kernel<8><<<(unsigned)blocks, kGeluThreads, 0, stream>>>(dinp, inp, dout, n);
    MP_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
  } else {
    const size_t blocks = mp_ceil_div(n, kGeluThreads);
    gelu_backward_kernel<1><<<(unsigned)blocks, kGeluThreads, 0, stream>>>(dinp, inp, dout, n);
    MP_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
  }
}
