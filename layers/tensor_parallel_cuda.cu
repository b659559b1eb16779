/*
 * layers/tensor_parallel_cuda.cu — the GPU kernels tensor parallelism adds around its collectives:
 * bf16 <-> fp32 conversions, the vocabulary-parallel embedding and the three phases of the
 * vocabulary-parallel cross-entropy; see tensor_parallel_cuda.h.
 *
 * Elementwise kernels are grid-stride loops over packs of VEC values: 8 bf16 (one 128-bit load)
 * or 4 fp32 (one float4) per step when the launcher has checked that the sizes divide and the
 * pointers are 16-byte aligned, else one value. All arithmetic is fp32, with one rounding to bf16
 * per bf16 output.
 *
 * The cross-entropy phases run one block per token row, like mp_cross_entropy_fused_cuda: each
 * thread walks the row's valid columns [0, valid) with valid = clamp(V - vocab_start, 0, Vl), and
 * a warp-shuffle + shared-memory reduction in a fixed tree (cuda_common.cuh) combines the threads,
 * so every run gives the same bits. Phase 3 computes the loss as log(sum) - (logit[target] - max)
 * and the gradient as exp(logit - max) * (1 / sum), the fused kernel's expressions, so that with
 * one rank the two agree up to the order of the fp32 sum.
 */
#include <math.h>

#include "layers/cuda_common.cuh"
#include "layers/tensor_parallel_cuda.h"
#include "layers/cuda_launch.h"

static constexpr int kElementwiseThreads = 256;
// Grid-stride loops cover larger sizes; 8192 blocks of 256 threads fill any sm_80/sm_90 part.
static constexpr size_t kMaxElementwiseBlocks = 8192;
static constexpr int kRowThreads = 1024;

// ---------------------------------------------------------------------------------------------
// device helpers

// VEC consecutive floats (VEC 1, 4 or 8; 8 as two float4 accesses, src 16-byte aligned).
template <int VEC>
static __device__ __forceinline__ void load_floats(float (&out)[VEC], const float *src) {
  if constexpr (VEC == 8) {
    float low[4], high[4];
    mp_load_float<4>(low, src);
    mp_load_float<4>(high, src + 4);
#pragma unroll
    for (int k = 0; k < 4; k++) {
      out[k] = low[k];
      out[4 + k] = high[k];
    }
  } else {
    mp_load_float<VEC>(out, src);
  }
}

template <int VEC>
static __device__ __forceinline__ void store_floats(float *dst, const float (&in)[VEC]) {
  if constexpr (VEC == 8) {
    const float low[4] = {in[0], in[1], in[2], in[3]};
    const float high[4] = {in[4], in[5], in[6], in[7]};
    mp_store_float<4>(dst, low);
    mp_store_float<4>(dst + 4, high);
  } else {
    mp_store_float<VEC>(dst, in);
  }
}

static __device__ __forceinline__ size_t grid_start() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

static __device__ __forceinline__ size_t grid_stride() { return (size_t)gridDim.x * blockDim.x; }

// ---------------------------------------------------------------------------------------------
// kernels: conversions

// out (n) fp32 = in (n) bf16; VEC divides n.
template <int VEC>
__global__ void float_from_bf16_kernel(float *out, const mp_bf16 *in, size_t n) {
  for (size_t i = grid_start() * VEC; i < n; i += grid_stride() * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, in + i);
    store_floats<VEC>(out + i, x);
  }
}

// out (rows, cols) bf16 = sum (rows, cols) fp32 + bias (cols) bf16 (or none); VEC divides cols.
template <int VEC>
__global__ void bf16_from_float_bias_kernel(mp_bf16 *out, const float *sum, const mp_bf16 *bias,
                                            size_t n, int cols) {
  for (size_t i = grid_start() * VEC; i < n; i += grid_stride() * VEC) {
    float x[VEC];
    load_floats<VEC>(x, sum + i);
    if (bias != NULL) {
      float b[VEC];
      mp_load_bf16<VEC>(b, bias + i % (size_t)cols);
#pragma unroll
      for (int k = 0; k < VEC; k++) x[k] += b[k];
    }
    mp_store_bf16<VEC>(out + i, x);
  }
}

// out (n) += in (n), fp32; VEC divides n. out may be in (each element is read, then written, by
// one thread).
template <int VEC>
__global__ void add_f32_kernel(float *out, const float *in, size_t n) {
  for (size_t i = grid_start() * VEC; i < n; i += grid_stride() * VEC) {
    float a[VEC], b[VEC];
    mp_load_float<VEC>(a, out + i);
    mp_load_float<VEC>(b, in + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) a[k] += b[k];
    mp_store_float<VEC>(out + i, a);
  }
}

// ---------------------------------------------------------------------------------------------
// kernels: vocabulary-parallel embedding

// out (BT, C) fp32 = wte_shard[tokens - vocab_start] (Vl, C) widened, or 0 for tokens outside
// [vocab_start, vocab_start + Vl); VEC divides C.
template <int VEC>
__global__ void vocab_embedding_lookup_kernel(float *out, const int32_t *tokens,
                                              const mp_bf16 *wte_shard, int vocab_start, int Vl,
                                              size_t n, int C) {
  for (size_t i = grid_start() * VEC; i < n; i += grid_stride() * VEC) {
    const size_t bt = i / (size_t)C;
    const size_t c = i % (size_t)C;
    const long long row = (long long)tokens[bt] - vocab_start;
    float x[VEC];
    if (row >= 0 && row < Vl) {
      mp_load_bf16<VEC>(x, wte_shard + (size_t)row * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; k++) x[k] = 0.0f;
    }
    store_floats<VEC>(out + i, x);
  }
}

// out (rows, C) bf16 = sum (rows, C) fp32 + wpe[t] (T, C) widened, row i at position
// t = (first_row + i) % T; VEC divides C.
template <int VEC>
__global__ void add_position_kernel(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, size_t n,
                                    size_t first_row, int T, int C) {
  for (size_t i = grid_start() * VEC; i < n; i += grid_stride() * VEC) {
    const size_t bt = i / (size_t)C;
    const size_t c = i % (size_t)C;
    const size_t t = (first_row + bt) % (size_t)T;
    float x[VEC], position[VEC];
    load_floats<VEC>(x, sum + i);
    mp_load_bf16<VEC>(position, wpe + t * C + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) x[k] += position[k];
    mp_store_bf16<VEC>(out + i, x);
  }
}

// ---------------------------------------------------------------------------------------------
// kernels: vocabulary-parallel cross-entropy (block = row; logits (rows, Vl), valid <= Vl real
// columns; VEC divides Vl)

// Phase 1: row_max (rows) = max over the row's valid columns, -inf when valid == 0.
template <int VEC>
__global__ void __launch_bounds__(kRowThreads)
    vocab_ce_max_kernel(float *row_max, const mp_bf16 *logits, int Vl, int valid) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const mp_bf16 *row_logits = logits + row * (size_t)Vl;
  float thread_max = -INFINITY;
  for (int i = threadIdx.x * VEC; i < valid; i += blockDim.x * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, row_logits + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      if (i + k < valid) thread_max = fmaxf(thread_max, x[k]);
    }
  }
  const float block_max = mp_block_max(thread_max, shared);
  if (threadIdx.x == 0) row_max[row] = block_max;
}

// row_max (BT) = max over ranks of gathered (ranks, BT), ranks in increasing order.
__global__ void max_over_ranks_kernel(float *row_max, const float *gathered, int ranks, int BT) {
  for (size_t i = grid_start(); i < (size_t)BT; i += grid_stride()) {
    float m = -INFINITY;
    for (int r = 0; r < ranks; r++) m = fmaxf(m, gathered[(size_t)r * BT + i]);
    row_max[i] = m;
  }
}

// Phase 2: stats[row] = sum of exp(logit - row_max[row]) over the valid columns;
// stats[rows + row] = the target's logit when this rank holds it among its valid columns, else 0.
template <int VEC>
__global__ void __launch_bounds__(kRowThreads)
    vocab_ce_partials_kernel(float *stats, const mp_bf16 *logits, const int32_t *targets,
                             const float *row_max, int Vl, int vocab_start, int valid) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const size_t rows = gridDim.x;
  const mp_bf16 *row_logits = logits + row * (size_t)Vl;
  const float m = row_max[row];
  float thread_sum = 0.0f;
  for (int i = threadIdx.x * VEC; i < valid; i += blockDim.x * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, row_logits + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      if (i + k < valid) thread_sum += expf(x[k] - m);
    }
  }
  const float row_sum = mp_block_sum(thread_sum, shared);
  if (threadIdx.x == 0) {
    const long long target = (long long)targets[row] - vocab_start;
    stats[row] = row_sum;
    stats[rows + row] =
        target >= 0 && target < valid ? mp_bf16_to_float_device(row_logits[target]) : 0.0f;
  }
}

// Phase 3: losses (rows) and the row overwritten with its gradient; stats (2, rows) summed over
// the group. No reduction: the block only walks its row.
template <int VEC>
__global__ void __launch_bounds__(kRowThreads)
    vocab_ce_finish_kernel(float *losses, mp_bf16 *logits, const int32_t *targets,
                           const float *row_max, const float *stats, float dloss_per_token, int Vl,
                           int vocab_start, int valid) {
  const size_t row = blockIdx.x;
  const size_t rows = gridDim.x;
  mp_bf16 *row_logits = logits + row * (size_t)Vl;
  const float m = row_max[row];
  const float sum = stats[row];
  const long long target = (long long)targets[row] - vocab_start;  // may lie outside [0, Vl)
  if (threadIdx.x == 0) losses[row] = logf(sum) - (stats[rows + row] - m);

  const float sum_inv = 1.0f / sum;
  for (int i = threadIdx.x * VEC; i < Vl; i += blockDim.x * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, row_logits + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const int column = i + k;
      if (column < valid) {
        const float prob = expf(x[k] - m) * sum_inv;
        const float indicator = column == target ? 1.0f : 0.0f;
        x[k] = (prob - indicator) * dloss_per_token;
      } else {
        x[k] = 0.0f;
      }
    }
    mp_store_bf16<VEC>(row_logits + i, x);
  }
}

// ---------------------------------------------------------------------------------------------
// launchers

// Blocks for `packs` grid-stride iterations of kElementwiseThreads threads (packs > 0).
static unsigned elementwise_blocks(size_t packs) {
  const size_t blocks = mp_ceil_div(packs, kElementwiseThreads);
  return (unsigned)(blocks < kMaxElementwiseBlocks ? blocks : kMaxElementwiseBlocks);
}

// The number of this rank's columns that are real vocabulary entries: clamp(V - start, 0, Vl).
static int valid_columns(int Vl, int vocab_start, int V) {
  const long long valid = (long long)V - vocab_start;
  return valid <= 0 ? 0 : valid >= Vl ? Vl : (int)valid;
}

extern "C" void mp_float_from_bf16_cuda(float *out, const mp_bf16 *in, size_t n,
                                        mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 8 == 0 && mp_aligned16(out) && mp_aligned16(in)) {
    float_from_bf16_kernel<8>
        <<<elementwise_blocks(n / 8), kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("float_from_bf16_kernel");
  } else {
    float_from_bf16_kernel<1>
        <<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("float_from_bf16_kernel");
  }
}

extern "C" void mp_bf16_from_float_bias_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *bias,
                                             int rows, int cols, mp_cuda_stream stream) {
  if (rows <= 0 || cols <= 0) return;
  const size_t n = (size_t)rows * cols;
  if (cols % 8 == 0 && mp_aligned16(out) && mp_aligned16(sum) &&
      (bias == NULL || mp_aligned16(bias))) {
    bf16_from_float_bias_kernel<8>
        <<<elementwise_blocks(n / 8), kElementwiseThreads, 0, stream>>>(out, sum, bias, n, cols);
    MP_CUDA_CHECK_LAUNCH("bf16_from_float_bias_kernel");
  } else {
    bf16_from_float_bias_kernel<1>
        <<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(out, sum, bias, n, cols);
    MP_CUDA_CHECK_LAUNCH("bf16_from_float_bias_kernel");
  }
}

extern "C" void mp_add_f32_cuda(float *out, const float *in, size_t n, mp_cuda_stream stream) {
  if (n == 0) return;
  if (n % 4 == 0 && mp_aligned16(out) && mp_aligned16(in)) {
    add_f32_kernel<4><<<elementwise_blocks(n / 4), kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("add_f32_kernel");
  } else {
    add_f32_kernel<1><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(out, in, n);
    MP_CUDA_CHECK_LAUNCH("add_f32_kernel");
  }
}

extern "C" void mp_vocab_embedding_lookup_cuda(float *out, const int32_t *tokens,
                                               const mp_bf16 *wte_shard, int vocab_start, int Vl,
                                               int BT, int C, mp_cuda_stream stream) {
  if (BT <= 0 || C <= 0) return;
  const size_t n = (size_t)BT * C;
  if (C % 8 == 0 && mp_aligned16(out) && mp_aligned16(wte_shard)) {
    vocab_embedding_lookup_kernel<8><<<elementwise_blocks(n / 8), kElementwiseThreads, 0, stream>>>(
        out, tokens, wte_shard, vocab_start, Vl, n, C);
    MP_CUDA_CHECK_LAUNCH("vocab_embedding_lookup_kernel");
  } else {
    vocab_embedding_lookup_kernel<1><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        out, tokens, wte_shard, vocab_start, Vl, n, C);
    MP_CUDA_CHECK_LAUNCH("vocab_embedding_lookup_kernel");
  }
}

extern "C" void mp_add_position_rows_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe,
                                          int first_row, int rows, int T, int C,
                                          mp_cuda_stream stream) {
  if (rows <= 0 || T <= 0 || C <= 0 || first_row < 0) return;
  const size_t n = (size_t)rows * C;
  if (C % 8 == 0 && mp_aligned16(out) && mp_aligned16(sum) && mp_aligned16(wpe)) {
    add_position_kernel<8><<<elementwise_blocks(n / 8), kElementwiseThreads, 0, stream>>>(
        out, sum, wpe, n, (size_t)first_row, T, C);
    MP_CUDA_CHECK_LAUNCH("add_position_kernel");
  } else {
    add_position_kernel<1><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        out, sum, wpe, n, (size_t)first_row, T, C);
    MP_CUDA_CHECK_LAUNCH("add_position_kernel");
  }
}

extern "C" void mp_add_position_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int B,
                                     int T, int C, mp_cuda_stream stream) {
  if (B <= 0) return;
  mp_add_position_rows_cuda(out, sum, wpe, 0, B * T, T, C, stream);
}

extern "C" void mp_vocab_ce_max_cuda(float *row_max, const mp_bf16 *logits, int BT, int Vl,
                                     int vocab_start, int V, mp_cuda_stream stream) {
  if (BT <= 0) return;
  const int valid = valid_columns(Vl, vocab_start, V);
  if (Vl % 8 == 0 && mp_aligned16(logits)) {
    vocab_ce_max_kernel<8><<<(unsigned)BT, kRowThreads, 0, stream>>>(row_max, logits, Vl, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_max_kernel");
  } else {
    vocab_ce_max_kernel<1><<<(unsigned)BT, kRowThreads, 0, stream>>>(row_max, logits, Vl, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_max_kernel");
  }
}

extern "C" void mp_max_over_ranks_cuda(float *row_max, const float *gathered, int ranks, int BT,
                                       mp_cuda_stream stream) {
  if (BT <= 0) return;
  max_over_ranks_kernel<<<elementwise_blocks((size_t)BT), kElementwiseThreads, 0, stream>>>(
      row_max, gathered, ranks, BT);
  MP_CUDA_CHECK_LAUNCH("max_over_ranks_kernel");
}

extern "C" void mp_vocab_ce_partials_cuda(float *stats, const mp_bf16 *logits,
                                          const int32_t *targets, const float *row_max, int BT,
                                          int Vl, int vocab_start, int V, mp_cuda_stream stream) {
  if (BT <= 0) return;
  const int valid = valid_columns(Vl, vocab_start, V);
  if (Vl % 8 == 0 && mp_aligned16(logits)) {
    vocab_ce_partials_kernel<8><<<(unsigned)BT, kRowThreads, 0, stream>>>(
        stats, logits, targets, row_max, Vl, vocab_start, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_partials_kernel");
  } else {
    vocab_ce_partials_kernel<1><<<(unsigned)BT, kRowThreads, 0, stream>>>(
        stats, logits, targets, row_max, Vl, vocab_start, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_partials_kernel");
  }
}

extern "C" void mp_vocab_ce_finish_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                                        const float *row_max, const float *stats, float dloss,
                                        int BT, int Vl, int vocab_start, int V,
                                        mp_cuda_stream stream) {
  if (BT <= 0) return;
  const int valid = valid_columns(Vl, vocab_start, V);
  const float dloss_per_token = dloss / (float)BT;  // as mp_cross_entropy_fused_cuda
  if (Vl % 8 == 0 && mp_aligned16(logits)) {
    vocab_ce_finish_kernel<8><<<(unsigned)BT, kRowThreads, 0, stream>>>(
        losses, logits, targets, row_max, stats, dloss_per_token, Vl, vocab_start, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_finish_kernel");
  } else {
    vocab_ce_finish_kernel<1><<<(unsigned)BT, kRowThreads, 0, stream>>>(
        losses, logits, targets, row_max, stats, dloss_per_token, Vl, vocab_start, valid);
    MP_CUDA_CHECK_LAUNCH("vocab_ce_finish_kernel");
  }
}
