/*
 * layers/rmsnorm_cuda.cu — RMSNorm on the GPU over bf16 activations; see rmsnorm.h.
 *
 * Built as layernorm_cuda.cu is, less the mean. Forward: one warp per row (8 rows per block). The
 * warp reads its row twice (the sum of squares, then the output), the second time from L1/L2,
 * with 128-bit loads of 8 channels when C is a multiple of 8 and the pointers are aligned. rstd is
 * fp32, written as fp32; each output is (x * rstd) * weight as in rmsnorm.c, rounded once.
 *
 * Backward: a block owns a tile of MP_NORM_TILE_ROWS rows. Its warps compute dinp row by row (the
 * one row reduction of rmsnorm.c, mean(dout * weight * x), then dinp += ..., rounded to bf16
 * once); then its threads walk the tile channel by channel, in row order, and write the tile's
 * partial dweight sums to scratch. A second kernel adds the partials of all tiles in tile order
 * into dweight. No atomics: the result is the same bits on every run. The row and tile scaffold
 * is cuda_norm_reduce.cuh's, shared with layernorm; this file holds RMSNorm's arithmetic.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/cuda_norm_reduce.cuh"
#include "layers/rmsnorm.h"

// ---------------------------------------------------------------------------------------------
// kernels

// out (rows, C), rstd (rows) or NULL from inp (rows, C), weight (C); one warp per row.
template <int VEC>
__global__ void rmsnorm_forward_kernel(mp_bf16 *out, float *rstd, const mp_bf16 *inp,
                                       const mp_bf16 *weight, int rows, int C, float eps) {
  const int row = mp_norm_warp_row(rows);
  if (row < 0) return;
  const mp_bf16 *x = inp + (size_t)row * C;
  mp_bf16 *y = out + (size_t)row * C;

  const float squares = mp_norm_warp_row_sum<VEC>(C, [&](int c, float &sum) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += v[k] * v[k];
  });
  const float s = 1.0f / sqrtf(squares / (float)C + eps);

  mp_norm_warp_row_each<VEC>(C, [&](int c) {
    float v[VEC], w[VEC];
    mp_load_bf16<VEC>(v, x + c);
    mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = (v[k] * s) * w[k];
    mp_store_bf16<VEC>(y + c, v);
  });
  if (threadIdx.x % MP_NORM_WARP == 0 && rstd != NULL) rstd[row] = s;
}

// dinp (rows, C) += ..., and this tile's partial sums of dweight:
//   partials[tile * C + c]  sum over the tile's rows of dout * inp * rstd
// Tile = blockIdx.x, its rows [tile * MP_NORM_TILE_ROWS, ...). VEC applies to the dinp pass.
template <int VEC>
__global__ void rmsnorm_backward_kernel(mp_bf16 *dinp, float *partials, const mp_bf16 *dout,
                                        const mp_bf16 *inp, const mp_bf16 *weight,
                                        const float *rstd, int rows, int C) {
  const mp_norm_tile tile = mp_norm_block_tile(rows);

  // dinp, one warp per row: with g = dout * weight, dx += s * g - s^3 * x * mean(g * x).
  mp_norm_tile_rows(tile, [&](int row) {
    const mp_bf16 *dy_row = dout + (size_t)row * C;
    const mp_bf16 *x_row = inp + (size_t)row * C;
    mp_bf16 *dx_row = dinp + (size_t)row * C;
    const float s = rstd[row];
    const float dot = mp_norm_warp_row_sum<VEC>(C, [&](int c, float &sum) {
      float dy[VEC], x[VEC], w[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) sum += dy[k] * w[k] * x[k];
    });
    const float scale = s * s * s * dot / (float)C;
    mp_norm_warp_row_each<VEC>(C, [&](int c) {
      float dy[VEC], x[VEC], w[VEC], dx[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
      mp_load_bf16<VEC>(dx, dx_row + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) dx[k] += s * dy[k] * w[k] - scale * x[k];
      mp_store_bf16<VEC>(dx_row + c, dx);
    });
  });

  // Partial dweight of the tile; the rows are warm in L1/L2.
  mp_norm_tile_partials<1>(partials, tile, C, [&](int row, int c, float (&sum)[1]) {
    const float dy = mp_bf16_to_float_device(dout[(size_t)row * C + c]);
    const float x = mp_bf16_to_float_device(inp[(size_t)row * C + c]);
    sum[0] += dy * x * rstd[row];
  });
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_rmsnorm_forward_cuda(mp_bf16 *out, float *rstd, const mp_bf16 *inp,
                                        const mp_bf16 *weight, int rows, int C, float eps,
                                        mp_cuda_stream stream) {
  if (rows <= 0 || C <= 0) return;
  const bool vec8 = C % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp) && mp_aligned16(weight);
  mp_norm_launch_vec(vec8, [&](auto vec) {
    rmsnorm_forward_kernel<decltype(vec)::value>
        <<<mp_norm_forward_blocks(rows), MP_NORM_FORWARD_THREADS, 0, stream>>>(out, rstd, inp,
                                                                               weight, rows, C,
                                                                               eps);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
  });
}

extern "C" size_t mp_rmsnorm_backward_cuda_scratch_floats(int rows, int C) {
  const size_t floats = rows > 0 && C > 0 ? (size_t)mp_norm_tiles(rows) * (size_t)C : 0;
  return floats > 0 ? floats : 1;
}

extern "C" void mp_rmsnorm_backward_cuda(mp_bf16 *dinp, float *dweight, const mp_bf16 *dout,
                                         const mp_bf16 *inp, const mp_bf16 *weight,
                                         const float *rstd, float *scratch, int rows, int C,
                                         mp_cuda_stream stream) {
  if (rows <= 0 || C <= 0) return;
  const int tiles = mp_norm_tiles(rows);
  const bool vec8 = C % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(dout) &&
                    mp_aligned16(inp) && mp_aligned16(weight);
  mp_norm_launch_vec(vec8, [&](auto vec) {
    rmsnorm_backward_kernel<decltype(vec)::value>
        <<<(unsigned)tiles, MP_NORM_BACKWARD_THREADS, 0, stream>>>(dinp, scratch, dout, inp,
                                                                    weight, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("rmsnorm_backward_kernel");
  });
  mp_norm_launch_param_grads<1>(dweight, NULL, scratch, tiles, C, stream);
}
