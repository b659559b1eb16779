/*
 * layers/cross_entropy.c — fused softmax and cross-entropy on the CPU; see cross_entropy.h.
 *
 * The loss is computed as log(sum exp(logit - max)) - (logit[target] - max), not -log(prob), so a
 * probability that rounds to 0 still gives a finite loss.
 *
 * A GPT-2 row is 50257 logits, and B * T rows make the largest elementwise work of a step, so
 * the row passes run sixteen lanes at a time with GCC vector extensions and the exponential is a
 * polynomial (exp16, layers/vector16.h) instead of glibc's scalar expf. As in gelu.c, the forward is written
 * once and compiled for AVX-512, AVX2 and plain x86-64 (SSE2), picked at run time; all three
 * give the same bits: the sum of exponentials is kept in sixteen lane sums added in a fixed
 * order, there are no fused multiply-adds (-ffp-contract=off), and no comparisons (they would be
 * scalarised where the vectors are wider than the CPU's; masks come from sign bits instead).
 */
#include "layers/cross_entropy.h"
#include "layers/vector16.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* The maximum of logits[0, n): lane maxima (x - max < 0 picks x), then the lanes and the tail in
 * order; -inf for n = 0. A NaN logit can leave a lane's maximum NaN; the loss is NaN either way. */
MP_INLINE float row_max(const float *logits, int n) {
  const int full = n - n % kLanes;
  mp_vf x;
  mp_vf lane_max = (mp_vf){0} - INFINITY;
  for (int i = 0; i < full; i += kLanes) {
    memcpy(&x, logits + i, sizeof x);
    lane_max = MP_SELECT(MP_NEGATIVE(lane_max - x), x, lane_max);
  }
  float maxval = -INFINITY;
  for (int lane = 0; lane < kLanes; lane++) {
    if (lane_max[lane] > maxval) maxval = lane_max[lane];
  }
  for (int i = full; i < n; i++) {
    if (logits[i] > maxval) maxval = logits[i];
  }
  return maxval;
}

/* probs[i] = e^(logits[i] - maxval) for i < n (probs may be logits); returns their sum, kept in
 * sixteen lanes added in a fixed order; the tail through a padded vector whose extra lanes are
 * masked to 0. */
MP_INLINE float row_exp_sum(float *probs, const float *logits, int n, float maxval) {
  const int full = n - n % kLanes;
  mp_vf x;
  mp_vf lane_sum = (mp_vf){0};
  for (int i = 0; i < full; i += kLanes) {
    memcpy(&x, logits + i, sizeof x);
    x = x - maxval;
    exp16(&x);
    memcpy(probs + i, &x, sizeof x);
    lane_sum += x;
  }
  if (full < n) {
    const int k = n - full;
    x = (mp_vf){0};
    memcpy(&x, logits + full, (size_t)k * sizeof(float));
    x = x - maxval;
    exp16(&x);
    const mp_vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    x = MP_SELECT((lane - k) >> 31, x, (mp_vf){0});
    memcpy(probs + full, &x, (size_t)k * sizeof(float));
    lane_sum += x;
  }
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; lane++) sum += lane_sum[lane];
  return sum;
}

/* probs[i] *= scale for i < n. */
MP_INLINE void row_scale(float *probs, int n, float scale) {
  const int full = n - n % kLanes;
  mp_vf x;
  for (int i = 0; i < full; i += kLanes) {
    memcpy(&x, probs + i, sizeof x);
    x = x * scale;
    memcpy(probs + i, &x, sizeof x);
  }
  for (int i = full; i < n; i++) probs[i] *= scale;
}

/* One row: softmax of logits[0, V) into probs (which may be logits), 0 in [V, Vp); returns the
 * row's loss. */
MP_INLINE float forward_row(float *probs, const float *logits, int target, int V, int Vp) {
  /* Read before probs is written: probs may be the logits' own buffer. */
  const float target_logit = logits[target];
  const float maxval = row_max(logits, V);
  const float sum = row_exp_sum(probs, logits, V, maxval);
  row_scale(probs, V, 1.0f / sum);
  for (int i = V; i < Vp; i++) probs[i] = 0.0f;
  return logf(sum) - (target_logit - maxval);
}

/* The row pieces on their own, one build per instruction set like the forward. */
static MP_AVX512 float row_max_avx512(const float *l, int n) { return row_max(l, n); }
static MP_AVX2 float row_max_avx2(const float *l, int n) { return row_max(l, n); }
static float row_max_x86_64(const float *l, int n) { return row_max(l, n); }
static MP_AVX512 float row_exp_avx512(float *p, const float *l, int n, float m) {
  return row_exp_sum(p, l, n, m);
}
static MP_AVX2 float row_exp_avx2(float *p, const float *l, int n, float m) {
  return row_exp_sum(p, l, n, m);
}
static float row_exp_x86_64(float *p, const float *l, int n, float m) {
  return row_exp_sum(p, l, n, m);
}

float mp_softmax_row_max_cpu(const float *logits, int n) {
  if (__builtin_cpu_supports("avx512f")) return row_max_avx512(logits, n);
  if (__builtin_cpu_supports("avx2")) return row_max_avx2(logits, n);
  return row_max_x86_64(logits, n);
}

float mp_softmax_row_exp_cpu(float *probs, const float *logits, int n, float max) {
  if (__builtin_cpu_supports("avx512f")) return row_exp_avx512(probs, logits, n, max);
  if (__builtin_cpu_supports("avx2")) return row_exp_avx2(probs, logits, n, max);
  return row_exp_x86_64(probs, logits, n, max);
}

/* A multiply per element, bound by memory: one plain build (as the backward passes below). */
void mp_softmax_row_scale_cpu(float *probs, int n, float scale) { row_scale(probs, n, scale); }

MP_INLINE double forward_kernel(float *losses, float *probs, const float *logits,
                                const int32_t *targets, int B, int T, int V, int Vp) {
  const size_t rows = (size_t)B * T;
  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; r++) {
    const float loss = forward_row(probs + r * Vp, logits + r * Vp, targets[r], V, Vp);
    if (losses != NULL) losses[r] = loss;
    loss_sum += loss;
  }
  return loss_sum / (double)rows;
}

static MP_AVX512 double forward_avx512(float *losses, float *probs, const float *logits,
                                       const int32_t *targets, int B, int T, int V, int Vp) {
  return forward_kernel(losses, probs, logits, targets, B, T, V, Vp);
}
static MP_AVX2 double forward_avx2(float *losses, float *probs, const float *logits,
                                   const int32_t *targets, int B, int T, int V, int Vp) {
  return forward_kernel(losses, probs, logits, targets, B, T, V, Vp);
}
static double forward_x86_64(float *losses, float *probs, const float *logits,
                             const int32_t *targets, int B, int T, int V, int Vp) {
  return forward_kernel(losses, probs, logits, targets, B, T, V, Vp);
}

double mp_cross_entropy_forward_cpu(float *losses, float *probs, const float *logits,
                                    const int32_t *targets, int B, int T, int V, int Vp) {
  if (__builtin_cpu_supports("avx512f")) {
    return forward_avx512(losses, probs, logits, targets, B, T, V, Vp);
  }
  if (__builtin_cpu_supports("avx2")) {
    return forward_avx2(losses, probs, logits, targets, B, T, V, Vp);
  }
  return forward_x86_64(losses, probs, logits, targets, B, T, V, Vp);
}

/* The backward passes are one multiply (and add) per element, bound by memory: one plain build,
 * sixteen lanes at a time. */

void mp_cross_entropy_backward_cpu(float *dlogits, const float *probs, const int32_t *targets,
                                   float dloss, int B, int T, int V, int Vp) {
  const size_t rows = (size_t)B * T;
  const float dloss_token = dloss / (float)rows;
  const int full = V - V % kLanes;
  for (size_t r = 0; r < rows; r++) {
    const float *probs_r = probs + r * Vp;
    float *dlogits_r = dlogits + r * Vp;
    const int target = targets[r];
    /* (p - 0) is p exactly: every column takes p * dloss_token, then the target column is
     * redone from its old value with the indicator. */
    const float target_before = dlogits_r[target];
    for (int i = 0; i < full; i += kLanes) {
      mp_vf d, p;
      memcpy(&d, dlogits_r + i, sizeof d);
      memcpy(&p, probs_r + i, sizeof p);
      d = d + p * dloss_token;
      memcpy(dlogits_r + i, &d, sizeof d);
    }
    for (int i = full; i < V; i++) dlogits_r[i] += probs_r[i] * dloss_token;
    dlogits_r[target] = target_before + (probs_r[target] - 1.0f) * dloss_token;
  }
}

void mp_cross_entropy_row_backward_in_place_cpu(float *row, int n, int width, int target,
                                                float dloss_token) {
  const float target_prob = target >= 0 ? row[target] : 0.0f;
  const int full = n - n % kLanes;
  for (int i = 0; i < full; i += kLanes) {
    mp_vf p;
    memcpy(&p, row + i, sizeof p);
    p = p * dloss_token;
    memcpy(row + i, &p, sizeof p);
  }
  for (int i = full; i < n; i++) row[i] *= dloss_token;
  for (int i = n; i < width; i++) row[i] = 0.0f;
  if (target >= 0) row[target] = (target_prob - 1.0f) * dloss_token;
}

void mp_cross_entropy_backward_in_place_cpu(float *probs_dlogits, const int32_t *targets,
                                            float dloss, int B, int T, int V, int Vp) {
  const size_t rows = (size_t)B * T;
  const float dloss_token = dloss / (float)rows;
  for (size_t r = 0; r < rows; r++) {
    mp_cross_entropy_row_backward_in_place_cpu(probs_dlogits + r * Vp, V, Vp, targets[r],
                                               dloss_token);
  }
}
