/*
 * layers/vector16.h — private to layers/: sixteen-lane float vectors (GCC vector extensions) and
 * the exponential the CPU elementwise kernels share (gelu.c, cross_entropy.c).
 *
 * The kernels that include it are compiled three times, for AVX-512, AVX2 and plain x86-64,
 * picked at run time; with -ffp-contract=off (MP_AVX512, MP_AVX2) and no comparisons (masks come
 * from sign bits: comparisons would be scalarised where the vectors are wider than the CPU's) the
 * three give the same bits. Vectors go by pointer: by value, a 64-byte vector in a plain x86-64
 * function draws a psABI note from GCC.
 */
#ifndef MPENGINE_LAYERS_VECTOR16_H
#define MPENGINE_LAYERS_VECTOR16_H

#include <stdint.h>

enum { kLanes = 16 };
typedef float mp_vf __attribute__((vector_size(4 * kLanes)));
typedef int32_t mp_vi __attribute__((vector_size(4 * kLanes)));

#define MP_INLINE static inline __attribute__((always_inline))
#define MP_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=off")))
#define MP_AVX2 __attribute__((target("avx2"), optimize("fp-contract=off")))

/* All ones in the lanes where x is negative (sign bit set), zeros elsewhere. */
#define MP_NEGATIVE(x) ((mp_vi)(x) >> 31)
/* mask ? a : b per lane, for a mask of all-ones or all-zeros lanes. */
#define MP_SELECT(mask, a, b) ((mp_vf)(((mask) & (mp_vi)(a)) | (~(mask) & (mp_vi)(b))))

/* *x = e^x per lane, within 1 ulp of the exact value over the whole float range (checked
 * against double exp for every float in (-120, 100)): x = n ln2 + r with n the nearest integer
 * (the 1.5 * 2^23 rounding trick) and |r| <= ln2 / 2 (ln2 split in two so n ln2 is exact),
 * Cephes' degree-6 polynomial for e^r, then 2^n applied as two powers of two so that overflow
 * gives inf and underflow rounds once, into the subnormals or to 0. NaN stays NaN. */
MP_INLINE void exp16(mp_vf *x) {
  const mp_vf lo = (mp_vf){0} - 104.0f, hi = (mp_vf){0} + 89.0f;
  const mp_vf in = *x;
  mp_vf xc = MP_SELECT(MP_NEGATIVE(in - lo), lo, in);
  xc = MP_SELECT(MP_NEGATIVE(hi - xc), hi, xc);
  const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const mp_vf shifted = xc * 1.44269504088896341f + round;
  const mp_vf fn = shifted - round;
  const mp_vi n = (mp_vi)shifted - 0x4b400000; /* the bits of round */
  mp_vf r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  mp_vf p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const mp_vi half = n >> 1, rest = n - half;
  const mp_vf y = p * (mp_vf)((half + 127) << 23) * (mp_vf)((rest + 127) << 23);
  const mp_vi is_nan = MP_NEGATIVE(0x7f800000 - ((mp_vi)in & 0x7fffffff));
  *x = MP_SELECT(is_nan, in, y);
}

#endif /* MPENGINE_LAYERS_VECTOR16_H */
