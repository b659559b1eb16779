/* layers/rmsnorm.c — RMSNorm on the CPU; see rmsnorm.h. Row sums are formed in order, in fp32,
 * as Hugging Face's fp32 path does (x.pow(2).mean(-1)). */
#include "layers/rmsnorm.h"

#include <math.h>
#include <stddef.h>

void mp_rmsnorm_forward_cpu(float *out, float *rstd, const float *inp, const float *weight,
                            int rows, int C, float eps) {
  for (int r = 0; r < rows; r++) {
    const float *x = inp + (size_t)r * C;
    float *y = out + (size_t)r * C;
    float squares = 0.0f;
    for (int i = 0; i < C; i++) squares += x[i] * x[i];
    const float s = 1.0f / sqrtf(squares / (float)C + eps);
    for (int i = 0; i < C; i++) y[i] = (x[i] * s) * weight[i];
    if (rstd != NULL) rstd[r] = s;
  }
}

/* With g = dout * weight and y = x * s: dx = s * g - s^3 * x * mean(g * x), dweight = dout * y. */
void mp_rmsnorm_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int rows, int C) {
  for (int r = 0; r < rows; r++) {
    const float *x = inp + (size_t)r * C;
    const float *dy = dout + (size_t)r * C;
    float *dx = dinp + (size_t)r * C;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int i = 0; i < C; i++) dot += dy[i] * weight[i] * x[i];
    const float k = s * s * s * dot / (float)C;
    for (int i = 0; i < C; i++) {
      dx[i] += s * dy[i] * weight[i] - k * x[i];
      dweight[i] += dy[i] * x[i] * s;
    }
  }
}
