/*
 * layers/cuda_common.cuh — private helpers of the CUDA twins in layers/ (.cu only).
 *
 * bf16 is carried as its 16 bits (mp_bf16) so the C API needs no CUDA header; here it is widened
 * to float for all arithmetic and rounded back to nearest even, to the same bits as
 * mp_bf16_from_float on the host (common/float16.h, NaN included). Eight bf16 values (16 bytes) move with one 128-bit load or store where a launcher has
 * checked the alignment. Reductions go through warp shuffles and one shared-memory step in a fixed
 * tree, never atomics, so every reduction gives the same bits on every run.
 */
#ifndef MPENGINE_LAYERS_CUDA_COMMON_CUH
#define MPENGINE_LAYERS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layers/cuda_types.h"

static_assert(sizeof(mp_bf16) == sizeof(__nv_bfloat16), "mp_bf16 must be the 16 bits of a bf16");

// ---------------------------------------------------------------------------------------------
// host helpers

// Ceiling division for grid sizes.
static inline size_t mp_ceil_div(size_t numerator, size_t denominator) {
  return (numerator + denominator - 1) / denominator;
}

// True when the pointer can be used for 16-byte (128-bit) vector loads and stores.
static inline bool mp_aligned16(const void *pointer) { return ((uintptr_t)pointer & 15u) == 0; }

// ---------------------------------------------------------------------------------------------
// device helpers: bf16 <-> float

static __device__ __forceinline__ float mp_bf16_to_float_device(mp_bf16 value) {
  return __uint_as_float((unsigned)value << 16);
}

// Round to nearest even, the same bits as the host reference, common/float16.c
// (mp_float16_bf16_from_float): a NaN becomes sign | 0x7fc0, where cvt.rn.bf16.f32 alone would
// give 0x7fff.
static __device__ __forceinline__ mp_bf16 mp_bf16_from_float_device(float value) {
  if (isnan(value)) return (mp_bf16)(((__float_as_uint(value) >> 16) & 0x8000u) | 0x7fc0u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

// VEC consecutive bf16 values from src into floats: one 128-bit load for VEC == 8 (src 16-byte
// aligned), one 16-bit load for VEC == 1.
template <int VEC>
static __device__ __forceinline__ void mp_load_bf16(float (&out)[VEC], const mp_bf16 *src) {
  static_assert(VEC == 1 || VEC == 8, "bf16 packs are 1 or 8 values");
  if constexpr (VEC == 8) {
    const uint4 bits = *reinterpret_cast<const uint4 *>(src);
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      out[2 * k] = __uint_as_float(words[k] << 16);              // low half: element 2k
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);  // high half: element 2k+1
    }
  } else {
    out[0] = mp_bf16_to_float_device(src[0]);
  }
}

// VEC floats rounded to bf16 and stored at dst, with one store (dst 16-byte aligned for VEC 8).
template <int VEC>
static __device__ __forceinline__ void mp_store_bf16(mp_bf16 *dst, const float (&in)[VEC]) {
  static_assert(VEC == 1 || VEC == 8, "bf16 packs are 1 or 8 values");
  if constexpr (VEC == 8) {
    unsigned words[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      words[k] = (unsigned)mp_bf16_from_float_device(in[2 * k]) |
                 ((unsigned)mp_bf16_from_float_device(in[2 * k + 1]) << 16);
    }
    *reinterpret_cast<uint4 *>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    dst[0] = mp_bf16_from_float_device(in[0]);
  }
}

// VEC consecutive floats: one 128-bit load for VEC == 4 (src 16-byte aligned).
template <int VEC>
static __device__ __forceinline__ void mp_load_float(float (&out)[VEC], const float *src) {
  static_assert(VEC == 1 || VEC == 4, "float packs are 1 or 4 values");
  if constexpr (VEC == 4) {
    const float4 pack = *reinterpret_cast<const float4 *>(src);
    out[0] = pack.x;
    out[1] = pack.y;
    out[2] = pack.z;
    out[3] = pack.w;
  } else {
    out[0] = src[0];
  }
}

template <int VEC>
static __device__ __forceinline__ void mp_store_float(float *dst, const float (&in)[VEC]) {
  static_assert(VEC == 1 || VEC == 4, "float packs are 1 or 4 values");
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4 *>(dst) = make_float4(in[0], in[1], in[2], in[3]);
  } else {
    dst[0] = in[0];
  }
}

// ---------------------------------------------------------------------------------------------
// device helpers: reductions in a fixed order

// Butterfly sum over the 32 lanes; every lane ends with the same bits (each step adds the same
// two partial sums, only commuted).
template <typename Number>
static __device__ __forceinline__ Number mp_warp_sum(Number value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

static __device__ __forceinline__ float mp_warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum over the whole block, returned to every thread. blockDim.x must be a multiple of 32 and at
// most 1024; `shared` holds 32 values and may be reused by the next call (the leading barrier
// protects it). Every thread of the block must call it.
template <typename Number>
static __device__ __forceinline__ Number mp_block_sum(Number value, Number *shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  value = mp_warp_sum(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : (Number)0;
  return mp_warp_sum(value);
}

// Column c of partials (tiles, C) summed in tile order: the second pass of a deterministic
// weight gradient whose first pass wrote one row of partial sums per tile of rows.
static __device__ __forceinline__ float mp_tile_sum(const float *partials, int tiles, int C,
                                                    int c) {
  float sum = 0.0f;
  for (int tile = 0; tile < tiles; tile++) sum += partials[(size_t)tile * C + c];
  return sum;
}

// Maximum over the whole block, returned to every thread; same contract as mp_block_sum.
static __device__ __forceinline__ float mp_block_max(float value, float *shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  value = mp_warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : -INFINITY;
  return mp_warp_max(value);
}

#endif /* MPENGINE_LAYERS_CUDA_COMMON_CUH */
