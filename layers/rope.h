/*
 * layers/rope.h — rotary position embeddings (Su et al. 2021) in Hugging Face's rotate-half
 * convention, so that Llama-family weights load without permuting their q and k rows.
 *
 * Within each head of HS channels, channel i < HS/2 pairs with channel i + HS/2; the pair at
 * token position t turns by the angle t * inv_freq[i]:
 *   x'[i]        = x[i] cos - x[i + HS/2] sin
 *   x'[i + HS/2] = x[i + HS/2] cos + x[i] sin
 * inv_freq[i] = 1 / theta^(2i / HS), as Hugging Face computes it in fp32, optionally with Llama
 * 3.1's frequency scaling (wavelengths above original_max_positions / low_freq_factor divided by
 * factor, below original_max_positions / high_freq_factor kept, interpolated between). The
 * rotation is orthogonal: the backward turns the gradient back by the opposite angle. The calls
 * cannot fail. The CUDA twin (_cuda, at the end of this header) rotates bf16 in place.
 */
#ifndef MPENGINE_LAYERS_ROPE_H
#define MPENGINE_LAYERS_ROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  double theta;                 /* rope_theta: Llama 3 500000, Llama 2 10000 */
  bool llama3;                  /* Llama 3.1's scaling of the frequencies below */
  double factor, low_freq_factor, high_freq_factor;
  double original_max_positions;
} mp_rope_spec;

/* inv_freq (HS / 2) written; HS even. */
void mp_rope_inv_freq(float *inv_freq, int HS, const mp_rope_spec *spec);

/* Rotates, in place, `heads` heads of HS channels of every token: head h of token (b, t) is at
 * x + (b * T + t) * row_stride + h * HS (so the q or k part of a (B, T, row_stride) qkv tensor),
 * at position t.
 *   x        (B, T, row_stride) the heads rotated in place, the rest untouched
 *   inv_freq (HS / 2)           from mp_rope_inv_freq */
void mp_rope_forward_cpu(float *x, const float *inv_freq, int B, int T, int heads, int HS,
                         size_t row_stride);

/* Backward: the gradient of the rotated heads turned back, in place (dx = R(-angle) dx'). */
void mp_rope_backward_cpu(float *dx, const float *inv_freq, int B, int T, int heads, int HS,
                          size_t row_stride);

/* The same with token t of every sequence at position positions[t] (T entries; NULL: t), for a
 * context-parallel rank whose tokens are two pieces of the sequence
 * (context_parallel/sequence_split.h). */
void mp_rope_forward_at_cpu(float *x, const float *inv_freq, const int32_t *positions, int B,
                            int T, int heads, int HS, size_t row_stride);
void mp_rope_backward_at_cpu(float *dx, const float *inv_freq, const int32_t *positions, int B,
                             int T, int heads, int HS, size_t row_stride);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/rope_cuda.cu, Bazel target //layers:cuda_elementwise): x in device memory as
 * bf16, rotated in place in fp32 (angle t * inv_freq[i] and its cosine and sine as the CPU twin
 * forms them) and rounded to bf16 once; inv_freq (HS / 2) fp32 in device memory
 * (mp_rope_inv_freq's values, copied there). Only the `heads` heads of each row are read and
 * written, so the q and k parts of one qkv tensor may be rotated by two calls. Enqueued on
 * `stream` without waiting. Shapes as mp_rope_forward_cpu's; the backward turns dx back by the
 * opposite angle (the sine negated, exactly). No reductions: the same bits on every run. */
void mp_rope_forward_cuda(mp_bf16 *x, const float *inv_freq, int B, int T, int heads, int HS,
                          size_t row_stride, mp_cuda_stream stream);
void mp_rope_backward_cuda(mp_bf16 *dx, const float *inv_freq, int B, int T, int heads, int HS,
                           size_t row_stride, mp_cuda_stream stream);
/* The same at positions[t] (T device ints; NULL: t), as the CPU twins' _at. */
void mp_rope_forward_at_cuda(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int B,
                             int T, int heads, int HS, size_t row_stride, mp_cuda_stream stream);
void mp_rope_backward_at_cuda(mp_bf16 *dx, const float *inv_freq, const int32_t *positions,
                              int B, int T, int heads, int HS, size_t row_stride,
                              mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_ROPE_H */
