/*
 * layers/tensor_parallel_cuda_emulated.c — //layers:cuda_tensor_parallel under
 * `--define mpengine_cuda=emulated` (third_party/cuda.bzl): the kernels of tensor_parallel_cuda.h
 * run on the CPU, so that tensor-parallel GPU code can be tested on machines without a GPU.
 * Test-only.
 *
 * "Device" pointers are host memory (engine/device/device_emulated.c) and streams are ignored: every call
 * has finished when it returns. There is no CPU twin of these kernels in layers/, so each is a
 * plain loop with the kernel's fp32 expressions and its one rounding per bf16 output: the
 * conversions, additions, maxima and the embedding lookup give the CUDA build's bits; the
 * cross-entropy sums of exponentials run in column order instead of the kernel's reduction tree
 * (same values up to fp32 reordering). Nothing is allocated, so no call can fail.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layers/cuda_types.h"
#include "layers/tensor_parallel_cuda.h"

/* ---- helpers ---- */

/* The number of this rank's columns that are real vocabulary entries: clamp(V - start, 0, Vl). */
static int valid_columns(int Vl, int vocab_start, int V) {
  const long long valid = (long long)V - vocab_start;
  return valid <= 0 ? 0 : valid >= Vl ? Vl : (int)valid;
}

/* ---- conversions around an all-reduce ---- */

void mp_float_from_bf16_cuda(float *out, const mp_bf16 *in, size_t n, mp_cuda_stream stream) {
  (void)stream;
  mp_bf16_to_floats(out, in, n);
}

void mp_bf16_from_float_bias_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *bias, int rows,
                                  int cols, mp_cuda_stream stream) {
  (void)stream;
  if (rows <= 0 || cols <= 0) return;
  for (size_t i = 0; i < (size_t)rows * cols; i++) {
    float x = sum[i];
    if (bias != NULL) x += mp_bf16_to_float(bias[i % (size_t)cols]);
    out[i] = mp_bf16_from_float(x);
  }
}

void mp_add_f32_cuda(float *out, const float *in, size_t n, mp_cuda_stream stream) {
  (void)stream;
  for (size_t i = 0; i < n; i++) out[i] += in[i];
}

/* ---- vocabulary-parallel embedding ---- */

void mp_vocab_embedding_lookup_cuda(float *out, const int32_t *tokens, const mp_bf16 *wte_shard,
                                    int vocab_start, int Vl, int BT, int C,
                                    mp_cuda_stream stream) {
  (void)stream;
  if (BT <= 0 || C <= 0) return;
  for (size_t bt = 0; bt < (size_t)BT; bt++) {
    const long long row = (long long)tokens[bt] - vocab_start;
    float *out_row = out + bt * C;
    if (row >= 0 && row < Vl) {
      mp_bf16_to_floats(out_row, wte_shard + (size_t)row * C, (size_t)C);
    } else {
      for (int c = 0; c < C; c++) out_row[c] = 0.0f;
    }
  }
}

void mp_add_position_rows_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int first_row,
                               int rows, int T, int C, mp_cuda_stream stream) {
  (void)stream;
  if (rows <= 0 || T <= 0 || C <= 0 || first_row < 0) return;
  for (size_t i = 0; i < (size_t)rows; i++) {
    const mp_bf16 *position = wpe + (((size_t)first_row + i) % (size_t)T) * C;
    for (int c = 0; c < C; c++) {
      out[i * C + c] = mp_bf16_from_float(sum[i * C + c] + mp_bf16_to_float(position[c]));
    }
  }
}

void mp_add_position_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int B, int T, int C,
                          mp_cuda_stream stream) {
  if (B <= 0) return;
  mp_add_position_rows_cuda(out, sum, wpe, 0, B * T, T, C, stream);
}

/* ---- vocabulary-parallel cross-entropy ---- */

void mp_vocab_ce_max_cuda(float *row_max, const mp_bf16 *logits, int BT, int Vl, int vocab_start,
                          int V, mp_cuda_stream stream) {
  (void)stream;
  const int valid = valid_columns(Vl, vocab_start, V);
  for (int i = 0; i < BT; i++) {
    const mp_bf16 *row = logits + (size_t)i * Vl;
    float m = -INFINITY;
    for (int j = 0; j < valid; j++) m = fmaxf(m, mp_bf16_to_float(row[j]));
    row_max[i] = m;
  }
}

void mp_max_over_ranks_cuda(float *row_max, const float *gathered, int ranks, int BT,
                            mp_cuda_stream stream) {
  (void)stream;
  for (size_t i = 0; i < (size_t)(BT > 0 ? BT : 0); i++) {
    float m = -INFINITY;
    for (int r = 0; r < ranks; r++) m = fmaxf(m, gathered[(size_t)r * BT + i]);
    row_max[i] = m; /* after every read of column i: row_max may be gathered itself */
  }
}

void mp_vocab_ce_partials_cuda(float *stats, const mp_bf16 *logits, const int32_t *targets,
                               const float *row_max, int BT, int Vl, int vocab_start, int V,
                               mp_cuda_stream stream) {
  (void)stream;
  const int valid = valid_columns(Vl, vocab_start, V);
  for (int i = 0; i < BT; i++) {
    const mp_bf16 *row = logits + (size_t)i * Vl;
    float sum = 0.0f;
    for (int j = 0; j < valid; j++) sum += expf(mp_bf16_to_float(row[j]) - row_max[i]);
    const long long target = (long long)targets[i] - vocab_start;
    stats[i] = sum;
    stats[BT + i] = target >= 0 && target < valid ? mp_bf16_to_float(row[target]) : 0.0f;
  }
}

void mp_vocab_ce_finish_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                             const float *row_max, const float *stats, float dloss, int BT, int Vl,
                             int vocab_start, int V, mp_cuda_stream stream) {
  (void)stream;
  if (BT <= 0) return;
  const int valid = valid_columns(Vl, vocab_start, V);
  const float dloss_per_token = dloss / (float)BT; /* as mp_cross_entropy_fused_cuda */
  for (int i = 0; i < BT; i++) {
    mp_bf16 *row = logits + (size_t)i * Vl;
    const float m = row_max[i], sum = stats[i];
    const long long target = (long long)targets[i] - vocab_start; /* may lie outside [0, Vl) */
    losses[i] = logf(sum) - (stats[BT + i] - m);
    const float sum_inv = 1.0f / sum;
    for (int j = 0; j < Vl; j++) {
      float g = 0.0f; /* padding columns: 0, whatever they held */
      if (j < valid) {
        const float prob = expf(mp_bf16_to_float(row[j]) - m) * sum_inv;
        g = (prob - (j == target ? 1.0f : 0.0f)) * dloss_per_token;
      }
      row[j] = mp_bf16_from_float(g);
    }
  }
}
