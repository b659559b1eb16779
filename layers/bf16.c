/* layers/bf16.c — float <-> bfloat16 on the host for mp_bf16 (cuda_types.h): common/float16.h's
 * rounding, the one host definition (round to nearest even; a NaN becomes sign | 0x7fc0). */
#include "common/float16.h"
#include "layers/cuda_types.h"

mp_bf16 mp_bf16_from_float(float value) { return mp_float16_bf16_from_float(value); }

float mp_bf16_to_float(mp_bf16 value) { return mp_float16_bf16_to_float(value); }

void mp_bf16_from_floats(mp_bf16 *out, const float *in, size_t n) {
  mp_float16_bf16_from_floats(out, in, n);
}

void mp_bf16_to_floats(float *out, const mp_bf16 *in, size_t n) {
  mp_float16_bf16_to_floats(out, in, n);
}
