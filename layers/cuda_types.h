/*
 * layers/cuda_types.h — the types the CUDA twins of the layers/ kernels share with C callers.
 *
 * C code (the engine, tests) never includes CUDA headers, so the GPU API is written in these
 * plain types: a bf16 value is its 16 bits (the top half of a float32), a stream is CUDA's own
 * opaque pointer type under its real struct name, and a cuBLAS handle likewise. Conversions
 * between float and bf16 round to nearest even, as the hardware does; they are common/float16.h's,
 * the one host definition of the rounding (the kernels' device twin is cuda_common.cuh's).
 */
#ifndef MPENGINE_LAYERS_CUDA_TYPES_H
#define MPENGINE_LAYERS_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t mp_bf16; /* bfloat16 storage: sign, 8 exponent bits, 7 mantissa bits */

struct CUstream_st;
typedef struct CUstream_st *mp_cuda_stream; /* == cudaStream_t; NULL is the default stream */

struct cublasLtContext;
typedef struct cublasLtContext *mp_cublaslt_handle; /* == cublasLtHandle_t */

/* float -> bf16 with round-to-nearest-even; a NaN becomes the quiet NaN sign | 0x7fc0. */
mp_bf16 mp_bf16_from_float(float value);
float mp_bf16_to_float(mp_bf16 value);
void mp_bf16_from_floats(mp_bf16 *out, const float *in, size_t n);
void mp_bf16_to_floats(float *out, const mp_bf16 *in, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_CUDA_TYPES_H */
