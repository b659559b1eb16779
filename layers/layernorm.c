/*
 * layers/layernorm.c — layer normalisation on the CPU, llm.c's math; see layernorm.h.
 *
 * The row loops run four lanes at a time with GCC vector extensions (SSE2 on every x86-64). The
 * row sums (mean, variance, and the backward's two means) are kept in eight lane sums, combined
 * in a fixed order, then the last C % 8 channels are added in order: the same result on every
 * run and every CPU (no fused multiply-adds). Elementwise steps are the scalar formulas per lane.
 */
#include "layers/layernorm.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

typedef float mp_v4f __attribute__((vector_size(16)));

static inline mp_v4f load4(const float *p) {
  mp_v4f x;
  memcpy(&x, p, sizeof x);
  return x;
}

static inline void store4(float *p, mp_v4f x) { memcpy(p, &x, sizeof x); }

/* The eight lane sums a and b as one number, in a fixed order. */
static inline float sum8(mp_v4f a, mp_v4f b) {
  const mp_v4f s = a + b;
  return (s[0] + s[1]) + (s[2] + s[3]);
}

void mp_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int B, int T, int C) {
  const size_t rows = (size_t)B * T;
  const mp_v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
  const int C8 = C - C % 8;
  for (size_t r = 0; r < rows; r++) {
    const float *x = inp + r * C;
    float *y = out + r * C;
    mp_v4f a = zero, b = zero;
    for (int i = 0; i < C8; i += 8) {
      a += load4(x + i);
      b += load4(x + i + 4);
    }
    float m = sum8(a, b);
    for (int i = C8; i < C; i++) m += x[i];
    m /= (float)C;
    a = zero;
    b = zero;
    for (int i = 0; i < C8; i += 8) {
      const mp_v4f shift_a = load4(x + i) - m, shift_b = load4(x + i + 4) - m;
      a += shift_a * shift_a;
      b += shift_b * shift_b;
    }
    float var = sum8(a, b);
    for (int i = C8; i < C; i++) {
      float shift = x[i] - m;
      var += shift * shift;
    }
    var /= (float)C;
    float s = 1.0f / sqrtf(var + MP_LAYERNORM_EPS);
    int i = 0;
    for (; i + 4 <= C; i += 4) {
      store4(y + i, (s * (load4(x + i) - m)) * load4(weight + i) + load4(bias + i));
    }
    for (; i < C; i++) y[i] = (s * (x[i] - m)) * weight[i] + bias[i];
    if (mean != NULL) mean[r] = m;
    if (rstd != NULL) rstd[r] = s;
  }
}

void mp_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C) {
  const size_t rows = (size_t)B * T;
  const mp_v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
  const int C8 = C - C % 8;
  for (size_t r = 0; r < rows; r++) {
    const float *dy = dout + r * C;
    const float *x = inp + r * C;
    float *dx = dinp + r * C;
    const float m = mean[r];
    const float s = rstd[r];

    /* Two reductions over the row: mean of dnorm and mean of dnorm * norm. */
    mp_v4f mean_a = zero, mean_b = zero, norm_a = zero, norm_b = zero;
    for (int i = 0; i < C8; i += 8) {
      const mp_v4f norm_lo = (load4(x + i) - m) * s, norm_hi = (load4(x + i + 4) - m) * s;
      const mp_v4f dnorm_lo = load4(weight + i) * load4(dy + i);
      const mp_v4f dnorm_hi = load4(weight + i + 4) * load4(dy + i + 4);
      mean_a += dnorm_lo;
      mean_b += dnorm_hi;
      norm_a += dnorm_lo * norm_lo;
      norm_b += dnorm_hi * norm_hi;
    }
    float dnorm_mean = sum8(mean_a, mean_b);
    float dnorm_norm_mean = sum8(norm_a, norm_b);
    for (int i = C8; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;

    int i = 0;
    for (; i + 4 <= C; i += 4) {
      const mp_v4f norm = (load4(x + i) - m) * s;
      const mp_v4f dyv = load4(dy + i);
      const mp_v4f dnorm = load4(weight + i) * dyv;
      store4(dbias + i, load4(dbias + i) + dyv);
      store4(dweight + i, load4(dweight + i) + norm * dyv);
      store4(dx + i, load4(dx + i) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
    for (; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * dy[i];
      dbias[i] += dy[i];
      dweight[i] += norm * dy[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}
