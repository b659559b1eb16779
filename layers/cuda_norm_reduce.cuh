/*
 * layers/cuda_norm_reduce.cuh — private to the norms' CUDA twins (layernorm_cuda.cu,
 * rmsnorm_cuda.cu): the reduction scaffold they share, written once; each norm supplies only its
 * arithmetic, as lambdas.
 *
 * Forward: one warp per row, 8 rows per block. A row statistic is a sum over the row's channels,
 * each lane walking its channels in order (c = lane * VEC, then + 32 * VEC), then a warp
 * butterfly (mp_norm_warp_row_sums).
 *
 * Backward, in two passes, no atomics (the same bits on every run). Pass 1: a block owns a tile of
 * MP_NORM_TILE_ROWS rows; its warps take the tile's rows in turn for dinp (mp_norm_tile_rows,
 * with the row sums above), then its threads take a channel each and sum the parameter gradients'
 * terms over the tile's rows in row order into scratch, one row of partials per tile and
 * gradient (mp_norm_tile_partials). Pass 2: mp_norm_launch_param_grads adds each channel's
 * partials, in tile order, into the gradients.
 *
 * VEC is the channels a lane moves at once: 8 (one 128-bit load of bf16) where C is a multiple of
 * 8 and the row pointers are 16-byte aligned, else 1; mp_norm_launch_vec picks it.
 */
#ifndef MPENGINE_LAYERS_CUDA_NORM_REDUCE_CUH
#define MPENGINE_LAYERS_CUDA_NORM_REDUCE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#include <type_traits>

#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"

constexpr int MP_NORM_WARP = 32;
constexpr int MP_NORM_FORWARD_THREADS = 256;   // 8 rows per block, one per warp
constexpr int MP_NORM_BACKWARD_THREADS = 256;  // 8 warps share a tile
constexpr int MP_NORM_TILE_ROWS = 16;          // rows per backward tile: partial sums per tile
constexpr int MP_NORM_REDUCE_THREADS = 256;    // pass 2: one thread per channel

// ---------------------------------------------------------------------------------------------
// device side

// The row of this thread's warp when each warp of the grid owns one row; -1 past the last row (the
// whole warp leaves together).
static __device__ __forceinline__ int mp_norm_warp_row(int rows) {
  const int row = blockIdx.x * (blockDim.x / MP_NORM_WARP) + threadIdx.x / MP_NORM_WARP;
  return row < rows ? row : -1;
}

// sums[0 .. N) = the warp's sums over a row of C channels: each lane calls add(c, sums) for its
// channels c .. c + VEC - 1 (c = lane * VEC, then + 32 * VEC, in order), adding its terms to
// sums, then every sum is added across the warp (every lane gets the same bits).
template <int VEC, int N, typename Add>
static __device__ __forceinline__ void mp_norm_warp_row_sums(float (&sums)[N], int C, Add add) {
  const int lane = threadIdx.x % MP_NORM_WARP;
#pragma unroll
  for (int k = 0; k < N; k++) sums[k] = 0.0f;
  for (int c = lane * VEC; c < C; c += MP_NORM_WARP * VEC) add(c, sums);
#pragma unroll
  for (int k = 0; k < N; k++) sums[k] = mp_warp_sum(sums[k]);
}

// The one-sum form: add(c, sum) adds the lane's terms for channels c .. c + VEC - 1 to sum.
template <int VEC, typename Add>
static __device__ __forceinline__ float mp_norm_warp_row_sum(int C, Add add) {
  float sums[1];
  mp_norm_warp_row_sums<VEC>(sums, C, [&](int c, float (&partial)[1]) { add(c, partial[0]); });
  return sums[0];
}

// Calls each(c) for the lane's channel packs c .. c + VEC - 1 of a row, in order (the pass that
// writes the row once its sums are known).
template <int VEC, typename Each>
static __device__ __forceinline__ void mp_norm_warp_row_each(int C, Each each) {
  const int lane = threadIdx.x % MP_NORM_WARP;
  for (int c = lane * VEC; c < C; c += MP_NORM_WARP * VEC) each(c);
}

// The backward tile of this block: tile blockIdx.x of gridDim.x, rows [first_row, end_row).
struct mp_norm_tile {
  int index, count;
  int first_row, end_row;
};

static __device__ __forceinline__ mp_norm_tile mp_norm_block_tile(int rows) {
  mp_norm_tile tile;
  tile.index = blockIdx.x;
  tile.count = gridDim.x;
  tile.first_row = tile.index * MP_NORM_TILE_ROWS;
  tile.end_row = min(tile.first_row + MP_NORM_TILE_ROWS, rows);
  return tile;
}

// Calls row(r) for the tile's rows, one warp per row: warp w of the block takes rows
// first_row + w, first_row + w + warps, ...
template <typename Row>
static __device__ __forceinline__ void mp_norm_tile_rows(const mp_norm_tile &tile, Row row) {
  const int warp = threadIdx.x / MP_NORM_WARP;
  const int warps = blockDim.x / MP_NORM_WARP;
  for (int r = tile.first_row + warp; r < tile.end_row; r += warps) row(r);
}

// Pass 1 of the parameter gradients, one thread per channel: for each of N gradients, the sum over
// the tile's rows, in row order, of the terms add(r, c, sums) adds, written to
//   partials[(k * tile.count + tile.index) * C + c]   (gradient k's row of partials for this tile)
// Reads only the kernel's inputs, so it needs no barrier after a dinp pass over the same rows.
template <int N, typename Add>
static __device__ __forceinline__ void mp_norm_tile_partials(float *partials,
                                                             const mp_norm_tile &tile, int C,
                                                             Add add) {
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sums[N];
#pragma unroll
    for (int k = 0; k < N; k++) sums[k] = 0.0f;
    for (int r = tile.first_row; r < tile.end_row; r++) add(r, c, sums);
#pragma unroll
    for (int k = 0; k < N; k++) {
      partials[((size_t)k * tile.count + tile.index) * C + c] = sums[k];
    }
  }
}

// Pass 2: grad0[c] (and grad1[c] for N == 2) += the sum over tiles of the partials of channel c,
// in tile order.
template <int N>
__global__ void mp_norm_param_grad_kernel(float *grad0, float *grad1, const float *partials,
                                          int tiles, int C) {
  static_assert(N == 1 || N == 2, "one or two parameter gradients");
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  grad0[c] += mp_tile_sum(partials, tiles, C, c);
  if (N == 2) grad1[c] += mp_tile_sum(partials + (size_t)tiles * C, tiles, C, c);
}

// ---------------------------------------------------------------------------------------------
// host side

// Backward tiles (and blocks) for `rows` rows.
static inline int mp_norm_tiles(int rows) {
  return (int)mp_ceil_div((size_t)rows, MP_NORM_TILE_ROWS);
}

// Blocks of the one-warp-per-row forward.
static inline unsigned mp_norm_forward_blocks(int rows) {
  return (unsigned)mp_ceil_div((size_t)rows, MP_NORM_FORWARD_THREADS / MP_NORM_WARP);
}

// Calls launch(std::integral_constant<int, 8>()) when vec8 (C a multiple of 8 and every row
// pointer 16-byte aligned), else launch(std::integral_constant<int, 1>()): the launcher's kernel
// then takes decltype(vec)::value as its VEC.
template <typename Launch>
static inline void mp_norm_launch_vec(bool vec8, Launch launch) {
  if (vec8) {
    launch(std::integral_constant<int, 8>());
  } else {
    launch(std::integral_constant<int, 1>());
  }
}

// Pass 2 on `stream`: N gradients (grad1 NULL for N == 1) += the partials of `tiles` tiles.
template <int N>
static inline void mp_norm_launch_param_grads(float *grad0, float *grad1, const float *partials,
                                              int tiles, int C, cudaStream_t stream) {
  const unsigned blocks = (unsigned)mp_ceil_div((size_t)C, MP_NORM_REDUCE_THREADS);
  mp_norm_param_grad_kernel<N><<<blocks, MP_NORM_REDUCE_THREADS, 0, stream>>>(grad0, grad1,
                                                                              partials, tiles, C);
  MP_CUDA_CHECK_LAUNCH("mp_norm_param_grad_kernel");
}

#endif /* MPENGINE_LAYERS_CUDA_NORM_REDUCE_CUH */
