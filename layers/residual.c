/* layers/residual.c — the residual connection on the CPU; see residual.h. Four lanes at a time
 * (GCC vector extensions; -O2 leaves these loops scalar), the same sums as the scalar loop. */
#include "layers/residual.h"

#include <string.h>

typedef float mp_v4f __attribute__((vector_size(16)));

static inline mp_v4f load4(const float *p) {
  mp_v4f x;
  memcpy(&x, p, sizeof x);
  return x;
}

static inline void store4(float *p, mp_v4f x) { memcpy(p, &x, sizeof x); }

void mp_residual_forward_cpu(float *out, const float *inp1, const float *inp2, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) store4(out + i, load4(inp1 + i) + load4(inp2 + i));
  for (; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void mp_residual_backward_cpu(float *dinp1, float *dinp2, const float *dout, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const mp_v4f d = load4(dout + i);
    store4(dinp1 + i, load4(dinp1 + i) + d);
    store4(dinp2 + i, load4(dinp2 + i) + d);
  }
  for (; i < n; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}
