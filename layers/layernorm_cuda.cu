/*
 * layers/layernorm_cuda.cu — layer normalisation on the GPU over bf16 activations; see
 * layernorm.h.
 *
 * Forward: one warp per row (llm.c's layout). The warp reads its row three times (mean, variance
 * of the shifted values as in layernorm.c, then the output), the second and third from L1/L2,
 * with 128-bit loads of 8 channels when C is a multiple of 8 and the pointers are aligned.
 * Statistics are fp32 and written as fp32.
 *
 * Backward: a block owns a tile of kRowsPerBlock rows. Its warps compute dinp row by row (the two
 * row reductions of layernorm.c, then dinp += ..., rounded to bf16); then its threads walk the
 * tile channel by channel, in row order, and write the tile's partial dweight and dbias sums to
 * scratch. A second kernel adds the partials of all tiles in tile order into dweight and dbias.
 * No atomics: the result is the same bits on every run.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/layernorm.h"
#include "layers/cuda_launch.h"

static constexpr int kWarp = 32;
static constexpr int kForwardThreads = 256;   // 8 rows per block, one per warp
static constexpr int kBackwardThreads = 256;  // 8 warps share a tile
static constexpr int kRowsPerBlock = 16;      // rows per backward tile: partial sums per tile
static constexpr int kReduceThreads = 256;

// ---------------------------------------------------------------------------------------------
// kernels

// out (rows, C), mean (rows) or NULL, rstd (rows) or NULL from inp (rows, C), weight (C),
// bias (C); one warp per row.
template <int VEC>
__global__ void layernorm_forward_kernel(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *inp,
                                         const mp_bf16 *weight, const mp_bf16 *bias, int rows,
                                         int C) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const mp_bf16 *x = inp + (size_t)row * C;
  mp_bf16 *y = out + (size_t)row * C;

  float sum = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += v[k];
  }
  const float m = mp_warp_sum(sum) / (float)C;

  float squares = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float shift = v[k] - m;
      squares += shift * shift;
    }
  }
  const float s = 1.0f / sqrtf(mp_warp_sum(squares) / (float)C + MP_LAYERNORM_EPS);

  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC], w[VEC], b[VEC];
    mp_load_bf16<VEC>(v, x + c);
    mp_load_bf16<VEC>(w, weight + c);
    mp_load_bf16<VEC>(b, bias + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = (s * (v[k] - m)) * w[k] + b[k];
    mp_store_bf16<VEC>(y + c, v);
  }
  if (lane == 0) {
    if (mean != NULL) mean[row] = m;
    if (rstd != NULL) rstd[row] = s;
  }
}

// dinp (rows, C) += ..., and this tile's partial sums of dweight and dbias:
//   partials[tile * C + c]           sum over the tile's rows of norm * dout
//   partials[(tiles + tile) * C + c] sum over the tile's rows of dout
// Tile = blockIdx.x, its rows [tile * kRowsPerBlock, ...). VEC applies to the dinp pass.
template <int VEC>
__global__ void layernorm_backward_kernel(mp_bf16 *dinp, float *partials, const mp_bf16 *dout,
                                          const mp_bf16 *inp, const mp_bf16 *weight,
                                          const float *mean, const float *rstd, int rows, int C) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int tile = blockIdx.x;
  const int tiles = gridDim.x;
  const int first_row = tile * kRowsPerBlock;
  const int end_row = min(first_row + kRowsPerBlock, rows);

  // dinp, one warp per row.
  for (int row = first_row + warp; row < end_row; row += warps) {
    const mp_bf16 *dy_row = dout + (size_t)row * C;
    const mp_bf16 *x_row = inp + (size_t)row * C;
    mp_bf16 *dx_row = dinp + (size_t)row * C;
    const float m = mean[row];
    const float s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float dy[VEC], x[VEC], w[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float norm = (x[k] - m) * s;
        const float dnorm = w[k] * dy[k];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
      }
    }
    const float dnorm_mean = mp_warp_sum(dnorm_sum) / (float)C;
    const float dnorm_norm_mean = mp_warp_sum(dnorm_norm_sum) / (float)C;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float dy[VEC], x[VEC], w[VEC], dx[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
      mp_load_bf16<VEC>(dx, dx_row + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float norm = (x[k] - m) * s;
        const float dnorm = w[k] * dy[k];
        dx[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
      mp_store_bf16<VEC>(dx_row + c, dx);
    }
  }

  // Partial dweight and dbias of the tile, one thread per channel, rows in order. Reads only the
  // inputs, so it needs no barrier after the dinp pass; the rows are warm in L1/L2.
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float dweight_sum = 0.0f, dbias_sum = 0.0f;
    for (int row = first_row; row < end_row; row++) {
      const float dy = mp_bf16_to_float_device(dout[(size_t)row * C + c]);
      const float norm =
          (mp_bf16_to_float_device(inp[(size_t)row * C + c]) - mean[row]) * rstd[row];
      dbias_sum += dy;
      dweight_sum += norm * dy;
    }
    partials[(size_t)tile * C + c] = dweight_sum;
    partials[(size_t)(tiles + tile) * C + c] = dbias_sum;
  }
}

// dweight (C) += sum over tiles of partials[tile][c]; dbias likewise from the second half.
__global__ void layernorm_param_grad_kernel(float *dweight, float *dbias, const float *partials,
                                            int tiles, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  dweight[c] += mp_tile_sum(partials, tiles, C, c);
  dbias[c] += mp_tile_sum(partials + (size_t)tiles * C, tiles, C, c);
}

// ---------------------------------------------------------------------------------------------
// launchers

static int layernorm_tiles(int B, int T) { return (int)mp_ceil_div((size_t)B * T, kRowsPerBlock); }

extern "C" void mp_layernorm_forward_cuda(mp_bf16 *out, float *mean, float *rstd,
                                          const mp_bf16 *inp, const mp_bf16 *weight,
                                          const mp_bf16 *bias, int B, int T, int C,
                                          mp_cuda_stream stream) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const size_t blocks = mp_ceil_div(rows, kForwardThreads / kWarp);
  if (C % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp) && mp_aligned16(weight) &&
      mp_aligned16(bias)) {
    layernorm_forward_kernel<8><<<(unsigned)blocks, kForwardThreads, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  } else {
    layernorm_forward_kernel<1><<<(unsigned)blocks, kForwardThreads, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  }
}

extern "C" size_t mp_layernorm_backward_cuda_scratch_floats(int B, int T, int C) {
  return 2 * (size_t)layernorm_tiles(B, T) * (size_t)C;
}

extern "C" void mp_layernorm_backward_cuda(mp_bf16 *dinp, float *dweight, float *dbias,
                                           const mp_bf16 *dout, const mp_bf16 *inp,
                                           const mp_bf16 *weight, const float *mean,
                                           const float *rstd, float *scratch, int B, int T, int C,
                                           mp_cuda_stream stream) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const int tiles = layernorm_tiles(B, T);
  if (C % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(dout) && mp_aligned16(inp) &&
      mp_aligned16(weight)) {
    layernorm_backward_kernel<8><<<(unsigned)tiles, kBackwardThreads, 0, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  } else {
    layernorm_backward_kernel<1><<<(unsigned)tiles, kBackwardThreads, 0, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  }
  const size_t reduce_blocks = mp_ceil_div(C, kReduceThreads);
  layernorm_param_grad_kernel<<<(unsigned)reduce_blocks, kReduceThreads, 0, stream>>>(
      dweight, dbias, scratch, tiles, C);
  MP_CUDA_CHECK_LAUNCH("layernorm_param_grad_kernel");
}
