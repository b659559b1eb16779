/*
 * layers/rmsnorm_cuda.cu — RMSNorm on the GPU over bf16 activations; see rmsnorm.h.
 *
 * Built as layernorm_cuda.cu is, less the mean. Forward: one warp per row (8 rows per block). The
 * warp reads its row twice (the sum of squares, then the output), the second time from L1/L2,
 * with 128-bit loads of 8 channels when C is a multiple of 8 and the pointers are aligned. rstd is
 * fp32, written as fp32; each output is (x * rstd) * weight as in rmsnorm.c, rounded once.
 *
 * Backward: a block owns a tile of kRowsPerBlock rows. Its warps compute dinp row by row (the one
 * row reduction of rmsnorm.c, mean(dout * weight * x), then dinp += ..., rounded to bf16 once);
 * then its threads walk the tile channel by channel, in row order, and write the tile's partial
 * dweight sums to scratch. A second kernel adds the partials of all tiles in tile order into
 * dweight. No atomics: the result is the same bits on every run.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/rmsnorm.h"

static constexpr int kWarp = 32;
static constexpr int kForwardThreads = 256;   // 8 rows per block, one per warp
static constexpr int kBackwardThreads = 256;  // 8 warps share a tile
static constexpr int kRowsPerBlock = 16;      // rows per backward tile: partial sums per tile
static constexpr int kReduceThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

// out (rows, C), rstd (rows) or NULL from inp (rows, C), weight (C); one warp per row.
template <int VEC>
__global__ void rmsnorm_forward_kernel(mp_bf16 *out, float *rstd, const mp_bf16 *inp,
                                       const mp_bf16 *weight, int rows, int C, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const mp_bf16 *x = inp + (size_t)row * C;
  mp_bf16 *y = out + (size_t)row * C;

  float squares = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) squares += v[k] * v[k];
  }
  const float s = 1.0f / sqrtf(mp_warp_sum(squares) / (float)C + eps);

  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC], w[VEC];
    mp_load_bf16<VEC>(v, x + c);
    mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = (v[k] * s) * w[k];
    mp_store_bf16<VEC>(y + c, v);
  }
  if (lane == 0 && rstd != NULL) rstd[row] = s;
}

// dinp (rows, C) += ..., and this tile's partial sums of dweight:
//   partials[tile * C + c]  sum over the tile's rows of dout * inp * rstd
// Tile = blockIdx.x, its rows [tile * kRowsPerBlock, ...). VEC applies to the dinp pass.
template <int VEC>
__global__ void rmsnorm_backward_kernel(mp_bf16 *dinp, float *partials, const mp_bf16 *dout,
                                        const mp_bf16 *inp, const mp_bf16 *weight,
                                        const float *rstd, int rows, int C) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int tile = blockIdx.x;
  const int first_row = tile * kRowsPerBlock;
  const int end_row = min(first_row + kRowsPerBlock, rows);

  // dinp, one warp per row: with g = dout * weight, dx += s * g - s^3 * x * mean(g * x).
  for (int row = first_row + warp; row < end_row; row += warps) {
    const mp_bf16 *dy_row = dout + (size_t)row * C;
    const mp_bf16 *x_row = inp + (size_t)row * C;
    mp_bf16 *dx_row = dinp + (size_t)row * C;
    const float s = rstd[row];
    float dot = 0.0f;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float dy[VEC], x[VEC], w[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) dot += dy[k] * w[k] * x[k];
    }
    const float scale = s * s * s * mp_warp_sum(dot) / (float)C;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float dy[VEC], x[VEC], w[VEC], dx[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
      mp_load_bf16<VEC>(dx, dx_row + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) dx[k] += s * dy[k] * w[k] - scale * x[k];
      mp_store_bf16<VEC>(dx_row + c, dx);
    }
  }

  // Partial dweight of the tile, one thread per channel, rows in order. Reads only the inputs,
  // so it needs no barrier after the dinp pass; the rows are warm in L1/L2.
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float dweight_sum = 0.0f;
    for (int row = first_row; row < end_row; row++) {
      const float dy = mp_bf16_to_float_device(dout[(size_t)row * C + c]);
      const float x = mp_bf16_to_float_device(inp[(size_t)row * C + c]);
      dweight_sum += dy * x * rstd[row];
    }
    partials[(size_t)tile * C + c] = dweight_sum;
  }
}

// dweight (C) += sum over tiles of partials[tile][c], in tile order.
__global__ void rmsnorm_weight_grad_kernel(float *dweight, const float *partials, int tiles,
                                           int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  dweight[c] += mp_tile_sum(partials, tiles, C, c);
}

// ---------------------------------------------------------------------------------------------
// launchers

static int rmsnorm_tiles(int rows) { return (int)mp_ceil_div((size_t)rows, kRowsPerBlock); }

extern "C" void mp_rmsnorm_forward_cuda(mp_bf16 *out, float *rstd, const mp_bf16 *inp,
                                        const mp_bf16 *weight, int rows, int C, float eps,
                                        mp_cuda_stream stream) {
  if (rows <= 0 || C <= 0) return;
  const size_t blocks = mp_ceil_div(rows, kForwardThreads / kWarp);
  if (C % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp) && mp_aligned16(weight)) {
    rmsnorm_forward_kernel<8><<<(unsigned)blocks, kForwardThreads, 0, stream>>>(
        out, rstd, inp, weight, rows, C, eps);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
  } else {
    rmsnorm_forward_kernel<1><<<(unsigned)blocks, kForwardThreads, 0, stream>>>(
        out, rstd, inp, weight, rows, C, eps);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
  }
}

extern "C" size_t mp_rmsnorm_backward_cuda_scratch_floats(int rows, int C) {
  const size_t floats = rows > 0 && C > 0 ? (size_t)rmsnorm_tiles(rows) * (size_t)C : 0;
  return floats > 0 ? floats : 1;
}

extern "C" void mp_rmsnorm_backward_cuda(mp_bf16 *dinp, float *dweight, const mp_bf16 *dout,
                                         const mp_bf16 *inp, const mp_bf16 *weight,
                                         const float *rstd, float *scratch, int rows, int C,
                                         mp_cuda_stream stream) {
  if (rows <= 0 || C <= 0) return;
  const int tiles = rmsnorm_tiles(rows);
  if (C % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(dout) && mp_aligned16(inp) &&
      mp_aligned16(weight)) {
    rmsnorm_backward_kernel<8><<<(unsigned)tiles, kBackwardThreads, 0, stream>>>(
        dinp, scratch, dout, inp, weight, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_backward_kernel");
  } else {
    rmsnorm_backward_kernel<1><<<(unsigned)tiles, kBackwardThreads, 0, stream>>>(
        dinp, scratch, dout, inp, weight, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_backward_kernel");
  }
  const size_t reduce_blocks = mp_ceil_div(C, kReduceThreads);
  rmsnorm_weight_grad_kernel<<<(unsigned)reduce_blocks, kReduceThreads, 0, stream>>>(
      dweight, scratch, tiles, C);
  MP_CUDA_CHECK_LAUNCH("rmsnorm_weight_grad_kernel");
}
