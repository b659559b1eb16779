/* layers/layernorm.c — layer normalisation on the CPU, llm.c's math; see layernorm.h. */
#include "layers/layernorm.h"

#include <math.h>
#include <stddef.h>

void mp_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int B, int T, int C) {
  const size_t rows = (size_t)B * T;
  for (size_t r = 0; r < rows; r++) {
    const float *x = inp + r * C;
    float *y = out + r * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    float var = 0.0f;
    for (int i = 0; i < C; i++) {
      float shift = x[i] - m;
      var += shift * shift;
    }
    var /= (float)C;
    float s = 1.0f / sqrtf(var + MP_LAYERNORM_EPS);
    for (int i = 0; i < C; i++) y[i] = (s * (x[i] - m)) * weight[i] + bias[i];
    if (mean != NULL) mean[r] = m;
    if (rstd != NULL) rstd[r] = s;
  }
}

void mp_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C) {
  const size_t rows = (size_t)B * T;
  for (size_t r = 0; r < rows; r++) {
    const float *dy = dout + r * C;
    const float *x = inp + r * C;
    float *dx = dinp + r * C;
    const float m = mean[r];
    const float s = rstd[r];

    /* Two reductions over the row: mean of dnorm and mean of dnorm * norm. */
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int i = 0; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;

    for (int i = 0; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = weight[i] * dy[i];
      dbias[i] += dy[i];
      dweight[i] += norm * dy[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}
