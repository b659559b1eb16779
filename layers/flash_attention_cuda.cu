/*
 * layers/flash_attention_cuda.cu — fused causal attention on tensor cores (see attention.h,
 * "CUDA twin: fused (flash) attention"), after FlashAttention-2 (Tri Dao, 2023).
 *
 * Why: the cuBLAS twin (attention_cuda.cu) writes and reads the (B, NH, T, T) bf16 matrices
 * several times, and at GPT-2 sizes that memory traffic, not the FLOPs, is what attention costs.
 * Here the scores live only in registers, one tile at a time, and the T x T matrix never reaches
 * device memory: the forward keeps, per query row, its output and the log-sum-exp of its scaled
 * scores (lse), and the backward recomputes the probabilities from q, k and lse.
 *
 * Tiling. A block is 4 warps (128 threads). q, k and v are read straight from the (B, T, W)
 * activations (W = (NH + 2 KVH) HS), tiles of 64 tokens x HS staged in shared memory with
 * cp.async (rows padded by 16 bytes so ldmatrix is free of bank conflicts), the next key/value (or
 * query) tile copied while the current one is used. All products are mma.sync m16n8k16 bf16 with
 * fp32 accumulation; the accumulator of one product becomes, rounded to bf16, the A operand of the
 * next without leaving registers (FlashAttention-2's layout trick; see flash_attention_ptx.cuh for
 * the fragments).
 *   forward      block = (head, 64 query rows), warp = 16 rows. Loops over key tiles of 64 up to
 *                the diagonal (tiles wholly above it are never computed; the diagonal tile is
 *                masked), with an online softmax in fp32: running row max m and sum l, the
 *                output rescaled by exp(m_old - m_new) as m grows; out = O / l at the end.
 *   backward dkv block = (kv head, 64 keys), warp = 16 keys. Loops over the query heads of the
 *                kv head's group and, for each, over query tiles from the diagonal down;
 *                computes the transposed scores S^T = K Q^T and dP^T = V dO^T for its keys,
 *                P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D), and accumulates dV += P^T dO
 *                and dK += dS^T Q in registers over the whole group (P^T is held as the bf16 A
 *                operand of dV's product, and dS^T is formed from it, to save registers).
 *   backward dq  block = (head, 64 query rows), warp = 16 rows. Loops over key tiles up to the
 *                diagonal; S, P, dP and dS again (per row instead of per key), dQ += dS K.
 * D = rowsum(dO o O) per query row is computed first (one thread per row) into the scratch.
 *
 * Grouped-query attention (KVH kv heads, group = NH / KVH query heads each): forward and dq blocks
 * are per query head h and read kv head h / group; a dkv block is per kv head and walks its
 * group's query heads one after the other (the next head's first query tile prefetched like any
 * other), so a kv head's dK and dV are summed over the group in fp32 registers, in head order,
 * and rounded once. With KVH = NH the group is one head and every block does what it did before
 * grouping (the same bits). The dkv grid has B * KVH * ceil(T / 64) blocks, each group times the
 * work: few blocks when B * KVH is small (multi-query attention at small batch).
 *
 * No atomics: FlashAttention-2 adds each key tile's share of dQ into fp32 memory with atomicAdd,
 * whose order, and so whose rounding, varies between runs. The project requires bitwise
 * reproducible gradients, so dQ gets its own pass over the key tiles instead (S and dP are
 * recomputed there: 7 tile products per (query, key) tile instead of 5). Every output element
 * is then written by one thread, after a fixed sequence of fp32 operations, and rounded to bf16
 * once when added into dqkv.
 *
 * The longest work goes first: forward and dq blocks take query tiles from the last (the most
 * key tiles) to the first, dkv blocks key tiles from the first (the most query tiles) on, and the
 * (query or kv) head is the fast grid dimension, so short blocks fill the tail of the grid.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layers/attention.h"
#include "layers/cuda_types.h"
#include "layers/flash_attention_ptx.cuh"
#include "layers/cuda_launch.h"

static_assert(sizeof(mp_bf16) == sizeof(__nv_bfloat16), "mp_bf16 must be the 16 bits of a bf16");

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;  // query rows per forward and dq block: 16 per warp
constexpr int kKeys = 64;  // keys per tile (forward, dq) and per dkv block: 16 per warp
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kRows == kKeys, "the diagonal tile of query block i is key tile i");
static_assert(kRows == 16 * kWarps && kKeys == 16 * kWarps, "one m16 strip per warp");

// Query rows per tile of the dkv kernel's loop: 16 for HS = 128, where dK and dV alone take 128
// registers a thread (ptxas: 231 registers, no spills; 32 rows spilled).
template <int HS>
__host__ __device__ constexpr int DkvQueryRows() {
  return HS > 64 ? 16 : 64;
}

// Shared-memory row stride of a (rows, HS) bf16 tile, in elements: padded by 16 bytes so the 8
// rows an ldmatrix reads fall in 8 different groups of 4 banks.
template <int HS>
__host__ __device__ constexpr int Stride() {
  return HS + 8;
}

template <int HS>
constexpr size_t ForwardSharedBytes() {  // Q (64), K (2 x 64), V (2 x 64)
  return (size_t)(kRows + 4 * kKeys) * Stride<HS>() * sizeof(__nv_bfloat16);
}
template <int HS>
constexpr size_t DqSharedBytes() {  // Q, dO (64 each), K, V (2 x 64 each)
  return (size_t)(2 * kRows + 4 * kKeys) * Stride<HS>() * sizeof(__nv_bfloat16);
}
template <int HS>
constexpr size_t DkvSharedBytes() {  // K, V (64 each), Q, dO (2 x BR each), lse, D (2 x BR each)
  constexpr int BR = DkvQueryRows<HS>();
  return (size_t)(2 * kKeys + 4 * BR) * Stride<HS>() * sizeof(__nv_bfloat16) +
         (size_t)4 * BR * sizeof(float);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// kernels

// Rows [t0, t0 + ROWS) of one head's q, k, v or dout, (ROWS, HS) bf16, into shared memory with
// row stride HS + 8, asynchronously (the caller commits and waits). `head` points at the head's
// token 0 and consecutive tokens are `stride` elements apart; rows at or past T are zeroed.
template <int ROWS, int HS>
static __device__ __forceinline__ void load_tile_async(__nv_bfloat16 *tile,
                                                       const __nv_bfloat16 *head, size_t stride,
                                                       int t0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte pieces per row
  static_assert((ROWS * kChunks) % kThreads == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int round = 0; round < ROWS * kChunks / kThreads; round++) {
    const int c = round * kThreads + threadIdx.x;
    const int row = c / kChunks, col = (c % kChunks) * 8;
    const int t = t0 + row;
    const bool valid = t < T;
    mp_cp_async_16(tile + row * Stride<HS>() + col, head + (size_t)(valid ? t : 0) * stride + col,
                   valid);
  }
}

// Entries [t0, t0 + ROWS) of a per-row fp32 vector (lse or D of one head) into shared memory,
// asynchronously; entries at or past T are zeroed. ROWS <= kThreads.
template <int ROWS>
static __device__ __forceinline__ void load_row_values_async(float *shared, const float *values,
                                                             int t0, int T) {
  const int i = threadIdx.x;
  if (i < ROWS) {
    const bool valid = t0 + i < T;
    mp_cp_async_4(shared + i, values + (valid ? t0 + i : 0), valid);
  }
}

// acc (16 x 8*N_TILES per warp, fp32) += A (16 x 16*K_STEPS) @ B^T, with A's 16 rows starting at
// `a` and B's 8*N_TILES rows starting at `b` (both row-major (rows, 16*K_STEPS) shared tiles of
// row stride LD): the "rows times rows" product of S = Q K^T, dP = dO V^T and their transposes.
template <int K_STEPS, int N_TILES, int LD>
static __device__ __forceinline__ void mma_rows_by_rows(float (&acc)[N_TILES][4],
                                                        const __nv_bfloat16 *a,
                                                        const __nv_bfloat16 *b, int lane) {
  static_assert(N_TILES % 2 == 0, "n tiles come in pairs (one ldmatrix.x4)");
#pragma unroll
  for (int kk = 0; kk < K_STEPS; kk++) {
    uint32_t af[4];
    mp_ldmatrix_x4(af, a + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < N_TILES / 2; np++) {
      uint32_t bf[4];
      mp_ldmatrix_x4(bf, b + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                             ((lane >> 3) & 1) * 8);
      mp_mma_bf16_16x8x16(acc[2 * np], af, bf[0], bf[1]);
      mp_mma_bf16_16x8x16(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x 8*N_TILES per warp, fp32) += A (16 x 16*K_STEPS, bf16 A fragments `a`) @ M, M the
// row-major shared tile (16*K_STEPS rows, 8*N_TILES columns, row stride LD) at `m`.
template <int K_STEPS, int N_TILES, int LD>
static __device__ __forceinline__ void mma_packed_by_tile(float (&acc)[N_TILES][4],
                                                          const uint32_t (&a)[K_STEPS][4],
                                                          const __nv_bfloat16 *m, int lane) {
  static_assert(N_TILES % 2 == 0, "n tiles come in pairs (one ldmatrix.x4)");
#pragma unroll
  for (int kk = 0; kk < K_STEPS; kk++) {
#pragma unroll
    for (int np = 0; np < N_TILES / 2; np++) {
      uint32_t bf[4];
      mp_ldmatrix_x4_trans(bf, m + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 +
                                   (lane >> 4) * 8);
      mp_mma_bf16_16x8x16(acc[2 * np], a[kk], bf[0], bf[1]);
      mp_mma_bf16_16x8x16(acc[2 * np + 1], a[kk], bf[2], bf[3]);
    }
  }
}

// acc (16 x 8*N_TILES per warp, fp32) += P (16 x 16*K_STEPS) @ M, P the fp32 accumulator
// fragments `p` (16 x 8 each, 2*K_STEPS of them) rounded to bf16 (the C layout of two adjacent n
// tiles is the A layout of one k step), M as above: O += P V, dK += dS^T Q, dQ += dS K.
template <int K_STEPS, int N_TILES, int LD>
static __device__ __forceinline__ void mma_regs_by_tile(float (&acc)[N_TILES][4],
                                                        const float (&p)[2 * K_STEPS][4],
                                                        const __nv_bfloat16 *m, int lane) {
  static_assert(N_TILES % 2 == 0, "n tiles come in pairs (one ldmatrix.x4)");
#pragma unroll
  for (int kk = 0; kk < K_STEPS; kk++) {  // packed one k step at a time: fewer live registers
    const uint32_t a[4] = {
        mp_pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), mp_pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
        mp_pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
        mp_pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < N_TILES / 2; np++) {
      uint32_t bf[4];
      mp_ldmatrix_x4_trans(bf, m + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + np * 16 +
                                   (lane >> 4) * 8);
      mp_mma_bf16_16x8x16(acc[2 * np], a, bf[0], bf[1]);
      mp_mma_bf16_16x8x16(acc[2 * np + 1], a, bf[2], bf[3]);
    }
  }
}

// dst (16 rows of one warp, HS columns, bf16, row stride `stride`) (+)= scale * acc, for this
// lane's rows first_row + lane / 4 and + 8 where they are below `limit` rows. dst points at the
// warp's first row; accumulate adds onto what dst holds (fp32 sum, one rounding).
template <int HS>
static __device__ __forceinline__ void store_rows(__nv_bfloat16 *dst, size_t stride,
                                                  const float (&acc)[HS / 8][4], float scale,
                                                  int first_row, int limit, int lane,
                                                  bool accumulate) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = (lane >> 2) + 8 * r;
    if (first_row + row >= limit) continue;
    __nv_bfloat16 *out = dst + (size_t)row * stride + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      float lo = scale * acc[n][2 * r], hi = scale * acc[n][2 * r + 1];
      uint32_t *pair = reinterpret_cast<uint32_t *>(out + n * 8);
      if (accumulate) {
        const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162 *>(pair);
        lo += __low2float(old);
        hi += __high2float(old);
      }
      *pair = mp_pack_bf16x2(lo, hi);
    }
  }
}

// Forward. grid (B * NH, ceil(w.q_rows / 64)), kThreads threads, ForwardSharedBytes<HS>() bytes.
//   out (B, w.out_rows, C) = ; lse (B, NH, w.out_rows) = ; qkv (B, T, W), W = (NH + 2 KVH) HS.
// Block (bh, y) computes the window's query rows [q0, q0 + 64), q0 = 64 * (gridDim.y - 1 - y),
// at global positions gq0 = w.q_begin + q0 on, of head bh (against kv head h / (NH / KVH)); warp
// w rows q0 + 16w .. + 15. scale_log2 = log2(e) / sqrt(HS): exp(scale * x) = exp2(x *
// scale_log2). With the whole-sequence window (q_begin 0) the key tiles are 0 .. q0 / 64 and only
// the last is masked, as before windows existed.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int T, int NH,
                         int KVH, mp_attention_window w, float scale, float scale_log2) {
  constexpr int LD = Stride<HS>();
  __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(mp_flash_shared_memory());
  __nv_bfloat16 *k_tiles = q_tile + kRows * LD;   // [2][kKeys][LD]
  __nv_bfloat16 *v_tiles = k_tiles + 2 * kKeys * LD;  // [2][kKeys][LD]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / KVH);
  const int q_block = gridDim.y - 1 - blockIdx.y;
  const int q0 = q_block * kRows, gq0 = w.q_begin + q0;
  const int q_end = w.q_begin + w.q_rows;  // keys at or past it are no query's
  const int last_key_tile = min(gq0 + kRows - 1, q_end - 1) / kKeys;
  const size_t C = (size_t)NH * HS, stride = (size_t)(NH + 2 * KVH) * HS;
  const __nv_bfloat16 *q_head = qkv + (size_t)b * T * stride + (size_t)h * HS;
  const __nv_bfloat16 *k_head = qkv + (size_t)b * T * stride + (size_t)(NH + g) * HS;
  const __nv_bfloat16 *v_head = k_head + (size_t)KVH * HS;

  load_tile_async<kRows, HS>(q_tile, q_head, stride, gq0, q_end);
  load_tile_async<kKeys, HS>(k_tiles, k_head, stride, 0, q_end);
  load_tile_async<kKeys, HS>(v_tiles, v_head, stride, 0, q_end);
  mp_cp_async_commit();
  mp_cp_async_wait<0>();
  __syncthreads();

  // The warp's 16 query rows as A fragments, for all of HS.
  uint32_t q_frag[HS / 16][4];
  const __nv_bfloat16 *q_warp = q_tile + warp * 16 * LD;
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    mp_ldmatrix_x4(q_frag[kk],
                   q_warp + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 + (lane >> 4) * 8);
  }

  float o[HS / 8][4];  // (16, HS) per warp: the unnormalised output
#pragma unroll
  for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the raw scores, rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running sum of exp

  // Key tiles 0 .. last_key_tile; those reaching past gq0 are masked.
  for (int j = 0; j <= last_key_tile; j++) {
    const int buffer = j & 1;
    if (j < last_key_tile) {  // prefetch tile j + 1 into the other buffer (free since j - 1)
      load_tile_async<kKeys, HS>(k_tiles + (buffer ^ 1) * kKeys * LD, k_head, stride,
                                 (j + 1) * kKeys, q_end);
      load_tile_async<kKeys, HS>(v_tiles + (buffer ^ 1) * kKeys * LD, v_head, stride,
                                 (j + 1) * kKeys, q_end);
    }
    mp_cp_async_commit();
    mp_cp_async_wait<1>();  // tile j has landed (tile j + 1 may still be in flight)
    __syncthreads();
    const __nv_bfloat16 *k_tile = k_tiles + buffer * kKeys * LD;
    const __nv_bfloat16 *v_tile = v_tiles + buffer * kKeys * LD;

    // s (16, 64) = q k^T, raw (unscaled) scores.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; np++) {
        uint32_t kf[4];
        mp_ldmatrix_x4(kf, k_tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                               ((lane >> 3) & 1) * 8);
        mp_mma_bf16_16x8x16(s[2 * np], q_frag[kk], kf[0], kf[1]);
        mp_mma_bf16_16x8x16(s[2 * np + 1], q_frag[kk], kf[2], kf[3]);
      }
    }

    // The causal mask by global position, on the tiles that reach past the block's first query
    // (it also covers keys at or past q_end, which lie above every valid row; rows at or past
    // the window's end are computed but never stored).
    if (j * kKeys + kKeys - 1 > gq0) {
      const int k0 = j * kKeys;
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
          const int row = gq0 + warp * 16 + (lane >> 2) + 8 * (e >> 1);
          if (key > row) s[n][e] = -INFINITY;
        }
      }
    }

    // Online softmax. Tile 0 holds key 0, which every row sees, so m is finite from then on and
    // alpha = exp2(-inf) = 0 on the first tile clears nothing that was not already 0.
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float tile_max = m[r];
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++) {
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));  // the row's 4 lanes
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float alpha = exp2f((m[r] - tile_max) * scale_log2);
      m[r] = tile_max;
      l[r] *= alpha;
#pragma unroll
      for (int n = 0; n < HS / 8; n++) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
      const float offset = tile_max * scale_log2;
#pragma unroll
      for (int n = 0; n < kKeys / 8; n++) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; e++) {
          const float p = exp2f(fmaf(s[n][e], scale_log2, -offset));
          s[n][e] = p;
          l[r] += p;
        }
      }
    }

    // o (16, HS) += p (16, 64) v (64, HS)
    mma_regs_by_tile<kKeys / 16, HS / 8, LD>(o, s, v_tile, lane);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }

  // out = o / l; lse = scale * m + log(l), both per row.
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv_l[r] = 1.0f / l[r];
  }
#pragma unroll
  for (int n = 0; n < HS / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) o[n][e] *= inv_l[e >> 1];
  }
  const int first_row = q0 + warp * 16;  // in the window
  const size_t out_row = (size_t)b * w.out_rows + w.out_row0 + first_row;
  store_rows<HS>(out + out_row * C + (size_t)h * HS, C, o, 1.0f, first_row, w.q_rows, lane,
                 false);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = first_row + (lane >> 2) + 8 * r;
      if (row < w.q_rows) {
        lse[(size_t)bh * w.out_rows + w.out_row0 + row] = scale * m[r] + logf(l[r]);
      }
    }
  }
}

// D (B, NH, w.out_rows) = rowsum(dout o out) per head and token of the window, in fp32 from the
// bf16 values; one thread per (b, t, h), h fastest. dout, out (B, w.out_rows, C).
template <int HS>
__global__ void __launch_bounds__(256)
    flash_backward_dot_kernel(float *D, const __nv_bfloat16 *dout, const __nv_bfloat16 *out,
                              int B, int NH, mp_attention_window w) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)B * w.q_rows * NH) return;
  const int h = (int)(idx % NH);
  const size_t bt = idx / NH;
  const int t = w.out_row0 + (int)(bt % w.q_rows), b = (int)(bt / w.q_rows);
  // Row (b, t), head h; 16-byte aligned (HS % 8 == 0).
  const size_t at = (((size_t)b * w.out_rows + t) * NH + h) * HS;
  const uint4 *dy = reinterpret_cast<const uint4 *>(dout + at);
  const uint4 *y = reinterpret_cast<const uint4 *>(out + at);
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < HS / 8; c++) {
    const uint4 a = dy[c], v = y[c];
    const unsigned as[4] = {a.x, a.y, a.z, a.w}, vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      sum = fmaf(__uint_as_float(as[k] << 16), __uint_as_float(vs[k] << 16), sum);
      sum = fmaf(__uint_as_float(as[k] & 0xffff0000u), __uint_as_float(vs[k] & 0xffff0000u), sum);
    }
  }
  D[((size_t)b * NH + h) * w.out_rows + t] = sum;
}

// Backward, dK and dV. grid (B * KVH, ceil((w.q_begin + w.q_rows) / 64)), kThreads threads,
// DkvSharedBytes<HS>() bytes.
//   dqkv (B, T, W) += (the k and v parts of keys 0 .. q_end - 1); dout (B, w.out_rows, C); qkv
//   (B, T, W); lse, D (B, NH, w.out_rows).
// Block (bg, y) owns keys [k0, k0 + 64), k0 = 64 * y, of kv head g of batch b (bg = b KVH + g);
// warp w keys k0 + 16w .. + 15. For each query head h of the group (g * group .. + group - 1, in
// order) it loops over the window's query tiles of BR rows that reach its keys (from the one
// holding global position k0, or the window's first, to the last), one flat sequence of steps
// with the next step's tiles prefetched, and keeps dK, dV (16, HS) per warp in registers over all
// of them.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkv_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
                              const __nv_bfloat16 *qkv, const float *lse, const float *D, int T,
                              int NH, int KVH, mp_attention_window w, float scale,
                              float scale_log2) {
  constexpr int LD = Stride<HS>();
  constexpr int BR = DkvQueryRows<HS>();
  __nv_bfloat16 *k_tile = reinterpret_cast<__nv_bfloat16 *>(mp_flash_shared_memory());
  __nv_bfloat16 *v_tile = k_tile + kKeys * LD;
  __nv_bfloat16 *q_tiles = v_tile + kKeys * LD;   // [2][BR][LD]
  __nv_bfloat16 *do_tiles = q_tiles + 2 * BR * LD;  // [2][BR][LD]
  float *lse_tiles = reinterpret_cast<float *>(do_tiles + 2 * BR * LD);  // [2][BR]
  float *d_tiles = lse_tiles + 2 * BR;                                   // [2][BR]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bg = blockIdx.x, b = bg / KVH, g = bg % KVH;
  const int group = NH / KVH;
  const int k0 = blockIdx.y * kKeys;
  const int q_end = w.q_begin + w.q_rows, Tq = w.q_rows;
  const size_t C = (size_t)NH * HS, stride = (size_t)(NH + 2 * KVH) * HS;
  const __nv_bfloat16 *qkv_b = qkv + (size_t)b * T * stride;  // batch b's token 0
  const __nv_bfloat16 *q_b = qkv_b + (size_t)w.q_begin * stride;  // the window's first query
  const __nv_bfloat16 *k_head = qkv_b + (size_t)(NH + g) * HS;
  const __nv_bfloat16 *v_head = k_head + (size_t)KVH * HS;
  const size_t row0 = (size_t)b * w.out_rows + w.out_row0;  // the window's first out row
  const __nv_bfloat16 *dout_b = dout + row0 * C;
  const float *lse_b = lse + (size_t)b * NH * w.out_rows + w.out_row0;
  const float *d_b = D + (size_t)b * NH * w.out_rows + w.out_row0;

  // Query head h's tile of BR window rows from t0 (q, dout, lse, D) into buffer `buffer`.
  auto load_query_tiles = [&](int h, int t0, int buffer) {
    load_tile_async<BR, HS>(q_tiles + buffer * BR * LD, q_b + (size_t)h * HS, stride, t0, Tq);
    load_tile_async<BR, HS>(do_tiles + buffer * BR * LD, dout_b + (size_t)h * HS, C, t0, Tq);
    load_row_values_async<BR>(lse_tiles + buffer * BR, lse_b + (size_t)h * w.out_rows, t0, Tq);
    load_row_values_async<BR>(d_tiles + buffer * BR, d_b + (size_t)h * w.out_rows, t0, Tq);
  };

  // Step s of the loop below: query head g * group + s / (n_tiles - first_tile), its query tile
  // first_tile + s % (n_tiles - first_tile). The first tile reaching key k0 is the one holding
  // global position k0 (k0 < q_end, so there is one), or the window's first.
  const int first_tile = k0 > w.q_begin ? (k0 - w.q_begin) / BR : 0;
  const int n_tiles = (Tq + BR - 1) / BR;
  const int steps = group * (n_tiles - first_tile);
  load_tile_async<kKeys, HS>(k_tile, k_head, stride, k0, q_end);
  load_tile_async<kKeys, HS>(v_tile, v_head, stride, k0, q_end);
  load_query_tiles(g * group, first_tile * BR, 0);
  mp_cp_async_commit();

  float dk[HS / 8][4], dv[HS / 8][4];  // (16 keys, HS) per warp
#pragma unroll
  for (int n = 0; n < HS / 8; n++) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  const int warp_key0 = k0 + warp * 16;

  int h = g * group, i = first_tile;  // this step's query head and query tile
  for (int step = 0; step < steps; step++) {
    const int buffer = step & 1;
    int next_h = h, next_i = i + 1;
    if (next_i == n_tiles) {  // the next step starts the group's next query head
      next_h = h + 1;
      next_i = first_tile;
    }
    if (step + 1 < steps) load_query_tiles(next_h, next_i * BR, buffer ^ 1);  // prefetch
    mp_cp_async_commit();
    mp_cp_async_wait<1>();
    __syncthreads();
    const __nv_bfloat16 *q_tile = q_tiles + buffer * BR * LD;
    const __nv_bfloat16 *do_tile = do_tiles + buffer * BR * LD;
    const float *lse_tile = lse_tiles + buffer * BR;
    const float *d_tile = d_tiles + buffer * BR;
    const int q0 = i * BR, gq0 = w.q_begin + q0;  // in the window, and its global position

    // st (16 keys, BR queries) = k q^T.
    float st[BR / 8][4];
#pragma unroll
    for (int n = 0; n < BR / 8; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
    mma_rows_by_rows<HS / 16, BR / 8, LD>(st, k_tile + warp * 16 * LD, q_tile, lane);

    // pt = exp(scale st - lse), 0 where key > query or the query is past the window (checked
    // only in tiles that reach the warp's keys from above or run past the window), kept as bf16
    // A fragments (st[n][e] is pt[n / 2][2 (n % 2) + e / 2], half e % 2): 16 registers instead
    // of 32 while dP^T is formed, which brings HS = 64 to 168 registers, 3 blocks per
    // multiprocessor.
    const bool masked = warp_key0 + 15 > gq0 || q0 + BR > Tq;
    uint32_t pt[BR / 16][4];
#pragma unroll
    for (int n = 0; n < BR / 8; n++) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = warp_key0 + (lane >> 2) + 8 * (e >> 1);
        const int qi = n * 8 + 2 * (lane & 3) + (e & 1);
        p[e] = exp2f(fmaf(st[n][e], scale_log2, -lse_tile[qi] * kLog2e));
        if (masked && (key > gq0 + qi || q0 + qi >= Tq)) p[e] = 0.0f;
      }
      pt[n / 2][(n & 1) * 2] = mp_pack_bf16x2(p[0], p[1]);
      pt[n / 2][(n & 1) * 2 + 1] = mp_pack_bf16x2(p[2], p[3]);
    }

    // dv (16, HS) += pt (16, BR) dout (BR, HS).
    mma_packed_by_tile<BR / 16, HS / 8, LD>(dv, pt, do_tile, lane);

    // dpt (16 keys, BR queries) = v dout^T, then dst = pt (dpt - D) in place.
    float dpt[BR / 8][4];
#pragma unroll
    for (int n = 0; n < BR / 8; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
    mma_rows_by_rows<HS / 16, BR / 8, LD>(dpt, v_tile + warp * 16 * LD, do_tile, lane);
#pragma unroll
    for (int n = 0; n < BR / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int qi = n * 8 + 2 * (lane & 3) + (e & 1);
        const uint32_t pair = pt[n / 2][(n & 1) * 2 + (e >> 1)];
        const float p = __uint_as_float((e & 1) ? (pair & 0xffff0000u) : (pair << 16));
        dpt[n][e] = p * (dpt[n][e] - d_tile[qi]);
      }
    }

    // dk (16, HS) += dst (16, BR) q (BR, HS).
    mma_regs_by_tile<BR / 16, HS / 8, LD>(dk, dpt, q_tile, lane);
    __syncthreads();  // everyone is done with this buffer before it is refilled
    h = next_h;
    i = next_i;
  }

  __nv_bfloat16 *dk_warp = dqkv + ((size_t)b * T + warp_key0) * stride + (size_t)(NH + g) * HS;
  store_rows<HS>(dk_warp, stride, dk, scale, warp_key0, q_end, lane, true);
  store_rows<HS>(dk_warp + (size_t)KVH * HS, stride, dv, 1.0f, warp_key0, q_end, lane, true);
}

// Backward, dQ. grid (B * NH, ceil(w.q_rows / 64)), kThreads threads, DqSharedBytes<HS>() bytes.
//   dqkv (B, T, W) += (the q part of the window's rows); dout (B, w.out_rows, C); qkv (B, T, W);
//   lse, D (B, NH, w.out_rows).
// Block (bh, y) owns the window's query rows [q0, q0 + 64), q0 = 64 * (gridDim.y - 1 - y), at
// global positions gq0 = w.q_begin + q0 on, of head bh (against kv head h / (NH / KVH)); warp w
// rows q0 + 16w .. + 15. Loops over key tiles 0 .. the one holding its last query, dQ (16, HS)
// per warp in registers.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
                             const __nv_bfloat16 *qkv, const float *lse, const float *D, int T,
                             int NH, int KVH, mp_attention_window w, float scale,
                             float scale_log2) {
  constexpr int LD = Stride<HS>();
  __nv_bfloat16 *q_tile = reinterpret_cast<__nv_bfloat16 *>(mp_flash_shared_memory());
  __nv_bfloat16 *do_tile = q_tile + kRows * LD;
  __nv_bfloat16 *k_tiles = do_tile + kRows * LD;     // [2][kKeys][LD]
  __nv_bfloat16 *v_tiles = k_tiles + 2 * kKeys * LD;  // [2][kKeys][LD]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / KVH);
  const int q_block = gridDim.y - 1 - blockIdx.y;
  const int q0 = q_block * kRows, gq0 = w.q_begin + q0;
  const int q_end = w.q_begin + w.q_rows;
  const int last_key_tile = min(gq0 + kRows - 1, q_end - 1) / kKeys;
  const size_t C = (size_t)NH * HS, stride = (size_t)(NH + 2 * KVH) * HS;
  const size_t row0 = (size_t)b * w.out_rows + w.out_row0;  // the window's first out row
  const __nv_bfloat16 *q_head = qkv + (size_t)b * T * stride + (size_t)h * HS;
  const __nv_bfloat16 *k_head = qkv + (size_t)b * T * stride + (size_t)(NH + g) * HS;
  const __nv_bfloat16 *v_head = k_head + (size_t)KVH * HS;
  const __nv_bfloat16 *do_head = dout + row0 * C + (size_t)h * HS;

  load_tile_async<kRows, HS>(q_tile, q_head, stride, gq0, q_end);
  load_tile_async<kRows, HS>(do_tile, do_head, C, q0, w.q_rows);
  load_tile_async<kKeys, HS>(k_tiles, k_head, stride, 0, q_end);
  load_tile_async<kKeys, HS>(v_tiles, v_head, stride, 0, q_end);
  mp_cp_async_commit();

  // This lane's rows g and g + 8 (in the window): lse in log2 units, and D.
  const int first_row = q0 + warp * 16;
  const size_t stats = (size_t)bh * w.out_rows + w.out_row0;
  float lse2[2], d_row[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = first_row + (lane >> 2) + 8 * r;
    lse2[r] = row < w.q_rows ? lse[stats + row] * kLog2e : 0.0f;
    d_row[r] = row < w.q_rows ? D[stats + row] : 0.0f;
  }

  float dq[HS / 8][4];  // (16, HS) per warp
#pragma unroll
  for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const __nv_bfloat16 *q_warp = q_tile + warp * 16 * LD;
  const __nv_bfloat16 *do_warp = do_tile + warp * 16 * LD;

  for (int j = 0; j <= last_key_tile; j++) {
    const int buffer = j & 1;
    if (j < last_key_tile) {
      load_tile_async<kKeys, HS>(k_tiles + (buffer ^ 1) * kKeys * LD, k_head, stride,
                                 (j + 1) * kKeys, q_end);
      load_tile_async<kKeys, HS>(v_tiles + (buffer ^ 1) * kKeys * LD, v_head, stride,
                                 (j + 1) * kKeys, q_end);
    }
    mp_cp_async_commit();
    mp_cp_async_wait<1>();
    __syncthreads();
    const __nv_bfloat16 *k_tile = k_tiles + buffer * kKeys * LD;
    const __nv_bfloat16 *v_tile = v_tiles + buffer * kKeys * LD;

    // s (16, 64) = q k^T;  dp (16, 64) = dout v^T.
    float s[kKeys / 8][4], dp[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
    }
    mma_rows_by_rows<HS / 16, kKeys / 8, LD>(s, q_warp, k_tile, lane);
    mma_rows_by_rows<HS / 16, kKeys / 8, LD>(dp, do_warp, v_tile, lane);

    // p = exp(scale s - lse), 0 where key > query (by global position, on the tiles reaching past
    // gq0 only); ds = p (dp - D) in dp.
    const int k0 = j * kKeys;
    const bool masked = k0 + kKeys - 1 > gq0;
#pragma unroll
    for (int n = 0; n < kKeys / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1;
        const int key = k0 + n * 8 + 2 * (lane & 3) + (e & 1);
        const int row = w.q_begin + first_row + (lane >> 2) + 8 * r;
        float p = exp2f(fmaf(s[n][e], scale_log2, -lse2[r]));
        if (masked && key > row) p = 0.0f;
        dp[n][e] = p * (dp[n][e] - d_row[r]);
      }
    }

    // dq (16, HS) += ds (16, 64) k (64, HS)
    mma_regs_by_tile<kKeys / 16, HS / 8, LD>(dq, dp, k_tile, lane);
    __syncthreads();
  }

  store_rows<HS>(dqkv + ((size_t)b * T + w.q_begin + first_row) * stride + (size_t)h * HS,
                 stride, dq, scale, first_row, w.q_rows, lane, true);
}

// ---------------------------------------------------------------------------------------------
// launchers

static inline unsigned ceil_div(size_t n, size_t d) { return (unsigned)((n + d - 1) / d); }

static bool shape_ok(int B, int T, int NH, int KVH, int HS) {
  return B > 0 && T > 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && mp_flash_attention_supported(HS);
}

// The scratch: D (B, NH, T) fp32, then padding to a multiple of 256 bytes.
extern "C" size_t mp_flash_attention_scratch_bytes(int B, int T, int NH, int HS) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return 0;
  const size_t bytes = (size_t)B * NH * T * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

extern "C" bool mp_flash_attention_supported(int HS) { return HS == 32 || HS == 64 || HS == 128; }

// Kernels with more than 48 KB of dynamic shared memory must say so before launch; the
// attribute is per device, so it is set on every launch (a host-side call, no device work).
template <typename Kernel>
static void allow_shared_bytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  }
}

// A window inside qkv's rows and out's, or nothing to do.
static bool window_ok(int T, mp_attention_window w) {
  return w.q_begin >= 0 && w.q_rows > 0 && w.q_begin + w.q_rows <= T && w.out_row0 >= 0 &&
         w.out_row0 + w.q_rows <= w.out_rows;
}

template <int HS>
static void forward(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B, int T, int NH, int KVH,
                    mp_attention_window w, cudaStream_t stream) {
  const float scale = 1.0f / sqrtf((float)HS);
  const dim3 grid((unsigned)(B * NH), ceil_div((size_t)w.q_rows, kRows));
  allow_shared_bytes(flash_forward_kernel<HS>, ForwardSharedBytes<HS>());
  flash_forward_kernel<HS><<<grid, kThreads, ForwardSharedBytes<HS>(), stream>>>(
      reinterpret_cast<__nv_bfloat16 *>(out), lse,
      reinterpret_cast<const __nv_bfloat16 *>(qkv), T, NH, KVH, w, scale, scale * kLog2e);
  MP_CUDA_CHECK_LAUNCH("flash_forward_kernel");
}

template <int HS>
static void backward(mp_bf16 *dqkv, const mp_bf16 *dout, const mp_bf16 *qkv, const mp_bf16 *out,
                     const float *lse, float *D, int B, int T, int NH, int KVH,
                     mp_attention_window w, cudaStream_t stream) {
  const float scale = 1.0f / sqrtf((float)HS);
  const __nv_bfloat16 *dout_ = reinterpret_cast<const __nv_bfloat16 *>(dout);
  const __nv_bfloat16 *qkv_ = reinterpret_cast<const __nv_bfloat16 *>(qkv);
  __nv_bfloat16 *dqkv_ = reinterpret_cast<__nv_bfloat16 *>(dqkv);
  const size_t rows = (size_t)B * w.q_rows * NH;
  flash_backward_dot_kernel<HS><<<ceil_div(rows, 256), 256, 0, stream>>>(
      D, dout_, reinterpret_cast<const __nv_bfloat16 *>(out), B, NH, w);
  MP_CUDA_CHECK_LAUNCH("flash_backward_dot_kernel");
  const dim3 kv_grid((unsigned)(B * KVH), ceil_div((size_t)(w.q_begin + w.q_rows), kKeys));
  allow_shared_bytes(flash_backward_dkv_kernel<HS>, DkvSharedBytes<HS>());
  flash_backward_dkv_kernel<HS><<<kv_grid, kThreads, DkvSharedBytes<HS>(), stream>>>(
      dqkv_, dout_, qkv_, lse, D, T, NH, KVH, w, scale, scale * kLog2e);
  MP_CUDA_CHECK_LAUNCH("flash_backward_dkv_kernel");
  const dim3 grid((unsigned)(B * NH), ceil_div((size_t)w.q_rows, kRows));
  allow_shared_bytes(flash_backward_dq_kernel<HS>, DqSharedBytes<HS>());
  flash_backward_dq_kernel<HS><<<grid, kThreads, DqSharedBytes<HS>(), stream>>>(
      dqkv_, dout_, qkv_, lse, D, T, NH, KVH, w, scale, scale * kLog2e);
  MP_CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
}

extern "C" void mp_flash_attention_forward_window_cuda(mp_bf16 *out, float *lse,
                                                       const mp_bf16 *qkv, int B, int T, int NH,
                                                       int KVH, int HS, mp_attention_window w,
                                                       mp_cuda_stream stream) {
  if (!shape_ok(B, T, NH, KVH, HS) || !window_ok(T, w)) return;
  switch (HS) {
    case 32: forward<32>(out, lse, qkv, B, T, NH, KVH, w, stream); break;
    case 64: forward<64>(out, lse, qkv, B, T, NH, KVH, w, stream); break;
    case 128: forward<128>(out, lse, qkv, B, T, NH, KVH, w, stream); break;
    default: break;
  }
}

extern "C" void mp_flash_attention_backward_window_cuda(mp_bf16 *dqkv, const mp_bf16 *dout,
                                                        const mp_bf16 *qkv, const mp_bf16 *out,
                                                        const float *lse, void *scratch, int B,
                                                        int T, int NH, int KVH, int HS,
                                                        mp_attention_window w,
                                                        mp_cuda_stream stream) {
  if (!shape_ok(B, T, NH, KVH, HS) || !window_ok(T, w)) return;
  float *D = static_cast<float *>(scratch);  // (B, NH, w.out_rows)
  switch (HS) {
    case 32: backward<32>(dqkv, dout, qkv, out, lse, D, B, T, NH, KVH, w, stream); break;
    case 64: backward<64>(dqkv, dout, qkv, out, lse, D, B, T, NH, KVH, w, stream); break;
    case 128: backward<128>(dqkv, dout, qkv, out, lse, D, B, T, NH, KVH, w, stream); break;
    default: break;
  }
}

extern "C" void mp_flash_attention_forward_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv,
                                                int B, int T, int NH, int KVH, int HS,
                                                mp_cuda_stream stream) {
  mp_flash_attention_forward_window_cuda(out, lse, qkv, B, T, NH, KVH, HS,
                                         mp_attention_whole_sequence(T), stream);
}

extern "C" void mp_flash_attention_backward_cuda(mp_bf16 *dqkv, const mp_bf16 *dout,
                                                 const mp_bf16 *qkv, const mp_bf16 *out,
                                                 const float *lse, void *scratch, int B, int T,
                                                 int NH, int KVH, int HS,
                                                 mp_cuda_stream stream) {
  mp_flash_attention_backward_window_cuda(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KVH, HS,
                                          mp_attention_whole_sequence(T), stream);
}
