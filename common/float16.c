/* common/float16.c — float32 <-> bfloat16 and fp16 on the host; see float16.h. */
#include "common/float16.h"

#include <string.h>

static uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

uint16_t mp_float16_bf16_from_float(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((bits >> 16) & 0x8000u) | 0x7fc0u);
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float mp_float16_bf16_to_float(uint16_t bits) { return bits_float((uint32_t)bits << 16); }

void mp_float16_bf16_from_floats(uint16_t *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = mp_float16_bf16_from_float(in[i]);
}

void mp_float16_bf16_to_floats(float *out, const uint16_t *in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = mp_float16_bf16_to_float(in[i]);
}

uint16_t mp_float16_fp16_from_float(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00;
  if (magnitude >= 0x477ff000u) return sign | 0x7c00; /* >= 65520, half-way past 65504: inf */
  if (magnitude >= 0x38800000u) {                     /* >= 2^-14: a normal fp16 */
    uint32_t h = ((magnitude >> 23) - 112) << 10 | ((magnitude >> 13) & 0x3ff);
    const uint32_t rest = magnitude & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h; /* a carry moves into the exponent */
    return (uint16_t)(sign | h);
  }
  if (magnitude <= 0x33000000u) return sign; /* <= 2^-25, half the smallest subnormal: to zero */
  /* A subnormal fp16: the value in units of 2^-24 is the 24-bit significand shifted right. */
  const uint32_t exponent = magnitude >> 23; /* 102 .. 112 */
  const uint32_t significand = (magnitude & 0x7fffff) | 0x800000;
  const uint32_t shift = 126 - exponent; /* 14 .. 24 */
  uint32_t h = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}

float mp_float16_fp16_to_float(uint16_t bits) {
  const uint32_t sign = (uint32_t)(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    /* Zero or subnormal: mantissa x 2^-24, exact in fp32. */
    const float magnitude = (float)mantissa * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | mantissa << 13); /* inf, NaN */
  return bits_float(sign | (exponent + 112) << 23 | mantissa << 13);
}
