/* layers/gelu.c — the tanh GELU on the CPU, llm.c's math; see gelu.h. */
#include "layers/gelu.h"

#include <math.h>

/* sqrt(2 / pi), written out because C11 has no M_PI. */
#define MP_GELU_SCALE 0.7978845608028654f
#define MP_GELU_CUBE 0.044715f

void mp_gelu_forward_cpu(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = MP_GELU_CUBE * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(MP_GELU_SCALE * (x + cube)));
  }
}

void mp_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = MP_GELU_CUBE * x * x * x;
    float tanh_arg = MP_GELU_SCALE * (x + cube);
    float tanh_out = tanhf(tanh_arg);
    float cosh_out = coshf(tanh_arg);
    float sech2 = 1.0f / (cosh_out * cosh_out);
    float local_grad = 0.5f * (1.0f + tanh_out) +
                       x * 0.5f * sech2 * MP_GELU_SCALE * (1.0f + 3.0f * MP_GELU_CUBE * x * x);
    dinp[i] += local_grad * dout[i];
  }
}
