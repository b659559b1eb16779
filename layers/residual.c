/* layers/residual.c — the residual connection on the CPU; see residual.h. */
#include "layers/residual.h"

void mp_residual_forward_cpu(float *out, const float *inp1, const float *inp2, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void mp_residual_backward_cpu(float *dinp1, float *dinp2, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}
