/*
 * layers/layernorm_cuda.cu — layer normalisation on the GPU over bf16 activations; see
 * layernorm.h.
 *
 * Forward: one warp per row (llm.c's layout). The warp reads its row three times (mean, variance
 * of the shifted values as in layernorm.c, then the output), the second and third from L1/L2,
 * with 128-bit loads of 8 channels when C is a multiple of 8 and the pointers are aligned.
 * Statistics are fp32 and written as fp32.
 *
 * Backward: a block owns a tile of MP_NORM_TILE_ROWS rows. Its warps compute dinp row by row (the
 * two row reductions of layernorm.c, then dinp += ..., rounded to bf16); then its threads walk the
 * tile channel by channel, in row order, and write the tile's partial dweight and dbias sums to
 * scratch. A second kernel adds the partials of all tiles in tile order into dweight and dbias.
 * No atomics: the result is the same bits on every run. The row and tile scaffold is
 * cuda_norm_reduce.cuh's, shared with RMSNorm; this file holds layernorm's arithmetic.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"
#include "layers/cuda_norm_reduce.cuh"
#include "layers/layernorm.h"

// ---------------------------------------------------------------------------------------------
// kernels

// out (rows, C), mean (rows) or NULL, rstd (rows) or NULL from inp (rows, C), weight (C),
// bias (C); one warp per row.
template <int VEC>
__global__ void layernorm_forward_kernel(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *inp,
                                         const mp_bf16 *weight, const mp_bf16 *bias, int rows,
                                         int C) {
  const int row = mp_norm_warp_row(rows);
  if (row < 0) return;
  const mp_bf16 *x = inp + (size_t)row * C;
  mp_bf16 *y = out + (size_t)row * C;

  const float total = mp_norm_warp_row_sum<VEC>(C, [&](int c, float &sum) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += v[k];
  });
  const float m = total / (float)C;
  const float squares = mp_norm_warp_row_sum<VEC>(C, [&](int c, float &sum) {
    float v[VEC];
    mp_load_bf16<VEC>(v, x + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float shift = v[k] - m;
      sum += shift * shift;
    }
  });
  const float s = 1.0f / sqrtf(squares / (float)C + MP_LAYERNORM_EPS);

  mp_norm_warp_row_each<VEC>(C, [&](int c) {
    float v[VEC], w[VEC], b[VEC];
    mp_load_bf16<VEC>(v, x + c);
    mp_load_bf16<VEC>(w, weight + c);
    mp_load_bf16<VEC>(b, bias + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = (s * (v[k] - m)) * w[k] + b[k];
    mp_store_bf16<VEC>(y + c, v);
  });
  if (threadIdx.x % MP_NORM_WARP == 0) {
    if (mean != NULL) mean[row] = m;
    if (rstd != NULL) rstd[row] = s;
  }
}

// dinp (rows, C) += ..., and this tile's partial sums of dweight and dbias:
//   partials[tile * C + c]           sum over the tile's rows of norm * dout
//   partials[(tiles + tile) * C + c] sum over the tile's rows of dout
// Tile = blockIdx.x, its rows [tile * MP_NORM_TILE_ROWS, ...). VEC applies to the dinp pass.
template <int VEC>
__global__ void layernorm_backward_kernel(mp_bf16 *dinp, float *partials, const mp_bf16 *dout,
                                          const mp_bf16 *inp, const mp_bf16 *weight,
                                          const float *mean, const float *rstd, int rows, int C) {
  const mp_norm_tile tile = mp_norm_block_tile(rows);

  // dinp, one warp per row.
  mp_norm_tile_rows(tile, [&](int row) {
    const mp_bf16 *dy_row = dout + (size_t)row * C;
    const mp_bf16 *x_row = inp + (size_t)row * C;
    mp_bf16 *dx_row = dinp + (size_t)row * C;
    const float m = mean[row];
    const float s = rstd[row];
    float sums[2];  // dnorm, dnorm * norm
    mp_norm_warp_row_sums<VEC>(sums, C, [&](int c, float (&sum)[2]) {
      float dy[VEC], x[VEC], w[VEC];
      mp_load_bf16<VEC>(dy, dy_row + c);
      mp_load_bf16<VEC>(x, x_row + c);
      mp_load_bf16<VEC>(w, weight + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float norm = (x[k] - m) * s;
        const float dnorm = w[k] * dy[k];
        sum[0] += dnorm;
        sum[1] += dnorm * norm;
      }
    });
    const float dnorm_mean = sums[0] / (float)C;
    const float dnorm_norm_mean = sums[1] / (float)C;
    mp_norm_warp_row_each<VEC>(C, [&](int c) {
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
    });
  });

  // Partial dweight (0) and dbias (1) of the tile; the rows are warm in L1/L2.
  mp_norm_tile_partials<2>(partials, tile, C, [&](int row, int c, float (&sum)[2]) {
    const float dy = mp_bf16_to_float_device(dout[(size_t)row * C + c]);
    const float norm = (mp_bf16_to_float_device(inp[(size_t)row * C + c]) - mean[row]) * rstd[row];
    sum[1] += dy;
    sum[0] += norm * dy;
  });
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_layernorm_forward_cuda(mp_bf16 *out, float *mean, float *rstd,
                                          const mp_bf16 *inp, const mp_bf16 *weight,
                                          const mp_bf16 *bias, int B, int T, int C,
                                          mp_cuda_stream stream) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const bool vec8 = C % 8 == 0 && mp_aligned16(out) && mp_aligned16(inp) &&
                    mp_aligned16(weight) && mp_aligned16(bias);
  mp_norm_launch_vec(vec8, [&](auto vec) {
    layernorm_forward_kernel<decltype(vec)::value>
        <<<mp_norm_forward_blocks(rows), MP_NORM_FORWARD_THREADS, 0, stream>>>(
            out, mean, rstd, inp, weight, bias, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  });
}

extern "C" size_t mp_layernorm_backward_cuda_scratch_floats(int B, int T, int C) {
  return 2 * (size_t)mp_norm_tiles(B * T) * (size_t)C;
}

extern "C" void mp_layernorm_backward_cuda(mp_bf16 *dinp, float *dweight, float *dbias,
                                           const mp_bf16 *dout, const mp_bf16 *inp,
                                           const mp_bf16 *weight, const float *mean,
                                           const float *rstd, float *scratch, int B, int T, int C,
                                           mp_cuda_stream stream) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const int tiles = mp_norm_tiles(rows);
  const bool vec8 = C % 8 == 0 && mp_aligned16(dinp) && mp_aligned16(dout) &&
                    mp_aligned16(inp) && mp_aligned16(weight);
  mp_norm_launch_vec(vec8, [&](auto vec) {
    layernorm_backward_kernel<decltype(vec)::value>
        <<<(unsigned)tiles, MP_NORM_BACKWARD_THREADS, 0, stream>>>(dinp, scratch, dout, inp,
                                                                    weight, mean, rstd, rows, C);
    MP_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  });
  mp_norm_launch_param_grads<2>(dweight, dbias, scratch, tiles, C, stream);
}
