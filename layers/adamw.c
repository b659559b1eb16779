/* layers/adamw.c — AdamW and gradient-norm clipping on the CPU; see adamw.h. */
#include "layers/adamw.h"

#include <math.h>

void mp_adamw_update_cpu(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t) {
  /* Bias corrections in double: beta^t for large t is where float loses the most. */
  const float beta1_correction = (float)(1.0 - pow((double)beta1, (double)t));
  const float beta2_correction = (float)(1.0 - pow((double)beta2, (double)t));
  for (size_t i = 0; i < n; i++) {
    const float g = grads[i];
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i / beta1_correction;
    const float v_hat = v_i / beta2_correction;
    params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
  }
}

double mp_grad_norm_squared_cpu(const float *grads, size_t n) {
  /* Eight interleaved partial sums let the compiler use vector lanes; their order is fixed, so
   * the result is the same on every run. */
  double partial[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int lane = 0; lane < 8; lane++) {
      partial[lane] += (double)grads[i + lane] * (double)grads[i + lane];
    }
  }
  double sum = 0.0;
  for (int lane = 0; lane < 8; lane++) sum += partial[lane];
  for (; i < n; i++) sum += (double)grads[i] * (double)grads[i];
  return sum;
}

float mp_clip_scale(double norm, double max_norm) {
  if (max_norm > 0.0 && norm > max_norm) return (float)(max_norm / norm);
  return 1.0f;
}

void mp_grad_scale_cpu(float *grads, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) grads[i] *= scale;
}
