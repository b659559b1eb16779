/* layers/bf16.c — float <-> bfloat16 on the host; see cuda_types.h. */
#include <string.h>

#include "layers/cuda_types.h"

mp_bf16 mp_bf16_from_float(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return (mp_bf16)((bits >> 16) | 0x0040u); /* keep NaN a quiet NaN */
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (mp_bf16)((bits + rounding) >> 16);
}

float mp_bf16_to_float(mp_bf16 value) {
  const uint32_t bits = (uint32_t)value << 16;
  float result;
  memcpy(&result, &bits, sizeof result);
  return result;
}

void mp_bf16_from_floats(mp_bf16 *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = mp_bf16_from_float(in[i]);
}

void mp_bf16_to_floats(float *out, const mp_bf16 *in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = mp_bf16_to_float(in[i]);
}
