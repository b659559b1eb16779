/*
 * engine/model/param_init.h — parameter initialisation as a pure function of (seed, parameter name,
 * global element index).
 *
 * Never a function of the rank or of the order tensors are allocated in: a tensor-parallel shard
 * or a pipeline stage draws exactly the numbers the one-rank model holds at the same global
 * positions, which is what lets every parallel layout start from, and so train like, the serial
 * one (DESIGN.md, Principle 2). The generator is counter-based (SplitMix64 over a hash of the
 * name, the seed and the index, then Box-Muller), so any element can be drawn on its own.
 */
#ifndef MPENGINE_ENGINE_PARAM_INIT_H
#define MPENGINE_ENGINE_PARAM_INIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 64-bit FNV-1a of a parameter name ("block.3.qkv.weight"). */
uint64_t mp_init_name_hash(const char *name);

/* A standard normal sample for element `index` of parameter `name` under `seed`. */
double mp_init_standard_normal(uint64_t seed, const char *name, uint64_t index);

/* out[i] = std * N(seed, name, first_index + i) for i < count: a contiguous run of a tensor. */
void mp_init_fill_normal(float *out, size_t count, uint64_t seed, const char *name,
                         uint64_t first_index, float std);

/* A (rows, cols) block of a row-major (full_rows, full_cols) tensor starting at (row_offset,
 * col_offset): the shard a tensor-parallel rank holds. out is (rows, cols), row-major. */
void mp_init_fill_normal_block(float *out, size_t rows, size_t cols, size_t row_offset,
                               size_t col_offset, size_t full_cols, uint64_t seed,
                               const char *name, float std);

void mp_init_fill_constant(float *out, size_t count, float value);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_PARAM_INIT_H */
