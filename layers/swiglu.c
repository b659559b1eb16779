/* layers/swiglu.c — SwiGLU on the CPU; see swiglu.h. */
#include "layers/swiglu.h"

#include <math.h>
#include <stddef.h>

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void mp_swiglu_forward_cpu(float *out, const float *inp, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F;
    float *y = out + (size_t)n * F;
    for (int f = 0; f < F; f++) y[f] = gate[f] * sigmoid(gate[f]) * up[f];
  }
}

/* d silu(g) / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))). */
void mp_swiglu_backward_cpu(float *dinp, const float *inp, const float *dout, int N, int F) {
  for (int n = 0; n < N; n++) {
    const float *gate = inp + (size_t)n * 2 * F, *up = gate + F;
    const float *dy = dout + (size_t)n * F;
    float *dgate = dinp + (size_t)n * 2 * F, *dup = dgate + F;
    for (int f = 0; f < F; f++) {
      const float g = gate[f], s = sigmoid(g);
      dgate[f] += dy[f] * up[f] * s * (1.0f + g * (1.0f - s));
      dup[f] += dy[f] * g * s;
    }
  }
}
