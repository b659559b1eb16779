/*
 * common/float16.h — float32 <-> bfloat16 and IEEE binary16 (fp16) on the host, the one
 * definition of the rounding: layers/ (mp_bf16, layers/cuda_types.h), the emulated CUDA kernels
 * and collectives, and the safetensors reader and writer (engine/weights/safetensors.c) all call
 * these.
 *
 * Rounding is to nearest, ties to even, as the hardware and torch's .to() do. A NaN becomes the
 * canonical quiet NaN with its sign: bf16 sign | 0x7fc0, fp16 sign | 0x7e00 (torch's scalar
 * conversions, c10::BFloat16 and c10::Half; safetensors files written here match torch's byte
 * for byte). The CUDA kernels round on the device with their own code
 * (layers/cuda_common.cuh, mp_bf16_from_float_device), which gives these same bits; only what
 * cuBLAS and the fused attention's tensor-core conversions write is the hardware's (a NaN there
 * is 0x7fff).
 *
 * Widening (to float) is exact: bf16 is the top half of a float32; fp16 subnormals, infinities
 * and NaNs (payload kept) map to their float32 values.
 */
#ifndef MPENGINE_COMMON_FLOAT16_H
#define MPENGINE_COMMON_FLOAT16_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The bf16 bits nearest to value (ties to even); a NaN gives sign | 0x7fc0. */
uint16_t mp_float16_bf16_from_float(float value);
/* The float32 whose top 16 bits are `bits` (exact). */
float mp_float16_bf16_to_float(uint16_t bits);

/* out[i] = mp_float16_bf16_from_float(in[i]) for i < n. */
void mp_float16_bf16_from_floats(uint16_t *out, const float *in, size_t n);
/* out[i] = mp_float16_bf16_to_float(in[i]) for i < n. */
void mp_float16_bf16_to_floats(float *out, const uint16_t *in, size_t n);

/* The IEEE binary16 bits nearest to value (ties to even, with subnormals); at or beyond 65520 in
 * magnitude, infinity; a NaN gives sign | 0x7e00. */
uint16_t mp_float16_fp16_from_float(float value);
/* The float32 value of the binary16 `bits` (exact). */
float mp_float16_fp16_to_float(uint16_t bits);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_FLOAT16_H */
