/*
 * layers/rope_cuda.cu — rotary position embeddings on the GPU, in place on bf16; see rope.h.
 *
 * One block per token row (b, t). Its threads first form the row's HS/2 angles t * inv_freq[i]
 * as fp32 products and their cosines and sines with sincosf (the accurate functions, full range
 * reduction, not the fast __sinf; the same fp32 angle rope.c passes to cosf and sinf) into shared
 * memory, once for all the row's heads; then each thread rotates VEC pairs (i, i + HS/2) of one
 * head at a time in fp32 and rounds each result to bf16 once. With HS/2 and row_stride multiples
 * of 8 and x 16-byte aligned, the VEC = 8 low and 8 high channels move with 128-bit loads and
 * stores; otherwise one pair per thread. Only the `heads` heads of each row are read or written.
 * No reductions: the same bits on every run. The backward is the same kernel turning by the
 * opposite angle (sine negated, exactly).
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/rope.h"

static constexpr int kWarp = 32;
static constexpr int kMaxRopeThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

// Rotates heads [0, heads) of row blockIdx.x of x (rows, row_stride) by sign * p * inv_freq,
// p = positions[row % T] (device; NULL: row % T). Dynamic shared memory: HS floats (cosines,
// then sines, HS / 2 each).
template <int VEC>
__global__ void rope_kernel(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int T,
                            int heads, int HS, size_t row_stride, float sign) {
  extern __shared__ float rope_shared[];
  const int half = HS / 2;
  float *cosines = rope_shared, *sines = rope_shared + half;
  const int row = blockIdx.x;
  const int t = positions != nullptr ? positions[row % T] : row % T;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = (float)t * inv_freq[i];  // one fp32 product, as rope.c
    sincosf(angle, &sines[i], &cosines[i]);
  }
  __syncthreads();

  mp_bf16 *base = x + (size_t)row * row_stride;
  const int chunks = half / VEC;  // VEC pairs per chunk
  for (int j = threadIdx.x; j < heads * chunks; j += blockDim.x) {
    const int h = j / chunks, i = (j % chunks) * VEC;
    mp_bf16 *head = base + (size_t)h * HS;
    float lo[VEC], hi[VEC], out_lo[VEC], out_hi[VEC];
    mp_load_bf16<VEC>(lo, head + i);
    mp_load_bf16<VEC>(hi, head + half + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float c = cosines[i + k], s = sign * sines[i + k];
      out_lo[k] = lo[k] * c - hi[k] * s;
      out_hi[k] = hi[k] * c + lo[k] * s;
    }
    mp_store_bf16<VEC>(head + i, out_lo);
    mp_store_bf16<VEC>(head + half + i, out_hi);
  }
}

// ---------------------------------------------------------------------------------------------
// launchers

static void rope_launch(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int B, int T,
                        int heads, int HS, size_t row_stride, float sign,
                        mp_cuda_stream stream) {
  const int half = HS / 2;
  if (B <= 0 || T <= 0 || heads <= 0 || half <= 0) return;
  const unsigned rows = (unsigned)((size_t)B * T);
  const size_t shared = (size_t)HS * sizeof(float);
  const bool vectorised = half % 8 == 0 && row_stride % 8 == 0 && mp_aligned16(x);
  // Enough threads for the row's work (and for its angles), in whole warps.
  const size_t work = (size_t)heads * (vectorised ? half / 8 : half);
  const size_t wanted = mp_ceil_div(work > (size_t)half ? work : (size_t)half, kWarp) * kWarp;
  const int threads = wanted < (size_t)kMaxRopeThreads ? (int)wanted : kMaxRopeThreads;
  if (vectorised) {
    rope_kernel<8><<<rows, threads, shared, stream>>>(x, inv_freq, positions, T, heads, HS,
                                                      row_stride, sign);
    MP_CUDA_CHECK_LAUNCH("rope_kernel");
  } else {
    rope_kernel<1><<<rows, threads, shared, stream>>>(x, inv_freq, positions, T, heads, HS,
                                                      row_stride, sign);
    MP_CUDA_CHECK_LAUNCH("rope_kernel");
  }
}

extern "C" void mp_rope_forward_cuda(mp_bf16 *x, const float *inv_freq, int B, int T, int heads,
                                     int HS, size_t row_stride, mp_cuda_stream stream) {
  rope_launch(x, inv_freq, nullptr, B, T, heads, HS, row_stride, 1.0f, stream);
}

extern "C" void mp_rope_backward_cuda(mp_bf16 *dx, const float *inv_freq, int B, int T,
                                      int heads, int HS, size_t row_stride,
                                      mp_cuda_stream stream) {
  rope_launch(dx, inv_freq, nullptr, B, T, heads, HS, row_stride, -1.0f, stream);
}

extern "C" void mp_rope_forward_at_cuda(mp_bf16 *x, const float *inv_freq,
                                        const int32_t *positions, int B, int T, int heads, int HS,
                                        size_t row_stride, mp_cuda_stream stream) {
  rope_launch(x, inv_freq, positions, B, T, heads, HS, row_stride, 1.0f, stream);
}

extern "C" void mp_rope_backward_at_cuda(mp_bf16 *dx, const float *inv_freq,
                                         const int32_t *positions, int B, int T, int heads,
                                         int HS, size_t row_stride, mp_cuda_stream stream) {
  rope_launch(dx, inv_freq, positions, B, T, heads, HS, row_stride, -1.0f, stream);
}
