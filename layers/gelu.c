/*
 * layers/gelu.c — the tanh GELU on the CPU, llm.c's math; see gelu.h.
 *
 * tanh goes through one exponential, tanh(a) = 1 - 2 / (e^(2a) + 1), and the exponential is a
 * polynomial (exp16, layers/vector16.h) evaluated sixteen lanes at a time with GCC vector extensions: glibc's
 * scalar tanhf, then expf, were a fifth, then a tenth, of a CPU training step.
 *
 * The kernels are written once over 16-lane vectors and compiled three times: for AVX-512, for
 * AVX2 and for plain x86-64 (SSE2), picked at run time by what the CPU has. The lanes never
 * interact and every lane goes through the same IEEE operations in the same order (the vector
 * versions are built with -ffp-contract=off, so no fused multiply-adds), so the three give the
 * same bits, and an element's result does not depend on where it sits in the array (the last
 * n % 16 go through the same code, padded). No comparisons: they would be scalarised where the
 * vectors are wider than the CPU's; masks come from sign bits instead.
 *
 * The vector helpers take pointers: passing a 64-byte vector by value in a function built for
 * plain x86-64 draws a note about the psABI from GCC, though every helper here is inlined.
 */
#include "layers/gelu.h"
#include "layers/vector16.h"

#include <stdint.h>
#include <string.h>

/* sqrt(2 / pi), written out because C11 has no M_PI. */
#define MP_GELU_SCALE 0.7978845608028654f
#define MP_GELU_CUBE 0.044715f

/* *x = tanh(*x) = 1 - 2 / (e^(2x) + 1): exact at the ends (e^(2x) = inf gives 1, 0 gives -1);
 * near 0 the absolute error stays at float epsilon, which the 0.5 x factor of GELU keeps
 * negligible. */
MP_INLINE void tanh16(mp_vf *x) {
  mp_vf e = 2.0f * *x;
  exp16(&e);
  *x = 1.0f - 2.0f / (e + 1.0f);
}

/* *x = gelu(*x). */
MP_INLINE void gelu16(mp_vf *x) {
  const mp_vf in = *x;
  const mp_vf cube = MP_GELU_CUBE * in * in * in;
  mp_vf t = MP_GELU_SCALE * (in + cube);
  tanh16(&t);
  *x = 0.5f * in * (1.0f + t);
}

/* *x = gelu'(*x). */
MP_INLINE void gelu_grad16(mp_vf *x) {
  const mp_vf in = *x;
  const mp_vf cube = MP_GELU_CUBE * in * in * in;
  mp_vf tanh_out = MP_GELU_SCALE * (in + cube);
  tanh16(&tanh_out);
  const mp_vf sech2 = 1.0f - tanh_out * tanh_out; /* sech^2 = 1 - tanh^2 */
  *x = 0.5f * (1.0f + tanh_out) +
       in * 0.5f * sech2 * MP_GELU_SCALE * (1.0f + 3.0f * MP_GELU_CUBE * in * in);
}

/* The k <= 16 floats at p in the first lanes of *x, zeros after (and back). */
MP_INLINE void load_lanes(mp_vf *x, const float *p, size_t k) {
  *x = (mp_vf){0};
  memcpy(x, p, k * sizeof(float));
}

MP_INLINE void forward_kernel(float *out, const float *inp, size_t n) {
  mp_vf x;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    memcpy(&x, inp + i, sizeof x);
    gelu16(&x);
    memcpy(out + i, &x, sizeof x);
  }
  if (i < n) {
    load_lanes(&x, inp + i, n - i);
    gelu16(&x);
    memcpy(out + i, &x, (n - i) * sizeof(float));
  }
}

MP_INLINE void backward_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
  mp_vf x, d, g;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    memcpy(&x, inp + i, sizeof x);
    memcpy(&d, dout + i, sizeof d);
    memcpy(&g, dinp + i, sizeof g);
    gelu_grad16(&x);
    g = g + x * d;
    memcpy(dinp + i, &g, sizeof g);
  }
  if (i < n) {
    const size_t k = n - i;
    load_lanes(&x, inp + i, k);
    load_lanes(&d, dout + i, k);
    load_lanes(&g, dinp + i, k);
    gelu_grad16(&x);
    g = g + x * d;
    memcpy(dinp + i, &g, k * sizeof(float));
  }
}

static MP_AVX512 void forward_avx512(float *out, const float *inp, size_t n) {
  forward_kernel(out, inp, n);
}
static MP_AVX2 void forward_avx2(float *out, const float *inp, size_t n) {
  forward_kernel(out, inp, n);
}
static void forward_x86_64(float *out, const float *inp, size_t n) { forward_kernel(out, inp, n); }

static MP_AVX512 void backward_avx512(float *dinp, const float *inp, const float *dout, size_t n) {
  backward_kernel(dinp, inp, dout, n);
}
static MP_AVX2 void backward_avx2(float *dinp, const float *inp, const float *dout, size_t n) {
  backward_kernel(dinp, inp, dout, n);
}
static void backward_x86_64(float *dinp, const float *inp, const float *dout, size_t n) {
  backward_kernel(dinp, inp, dout, n);
}

void mp_gelu_forward_cpu(float *out, const float *inp, size_t n) {
  if (__builtin_cpu_supports("avx512f")) {
    forward_avx512(out, inp, n);
  } else if (__builtin_cpu_supports("avx2")) {
    forward_avx2(out, inp, n);
  } else {
    forward_x86_64(out, inp, n);
  }
}

void mp_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t n) {
  if (__builtin_cpu_supports("avx512f")) {
    backward_avx512(dinp, inp, dout, n);
  } else if (__builtin_cpu_supports("avx2")) {
    backward_avx2(dinp, inp, dout, n);
  } else {
    backward_x86_64(dinp, inp, dout, n);
  }
}
