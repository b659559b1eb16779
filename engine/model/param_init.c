/* engine/model/param_init.c — counter-based normal initialisation; see param_init.h. */
#include "engine/model/param_init.h"

#include <math.h>

#include "common/rng.h"

uint64_t mp_init_name_hash(const char *name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; ++p) {
    hash ^= *p;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

/* A uniform in (0, 1] from 53 random bits; never 0, so log() below is finite. */
static double unit_interval(uint64_t bits) {
  return ((double)(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static double standard_normal(uint64_t stream, uint64_t index) {
  const uint64_t key = mp_splitmix64(stream ^ mp_splitmix64(index));
  const double u1 = unit_interval(mp_splitmix64(key));
  const double u2 = unit_interval(mp_splitmix64(key ^ 0x5851f42d4c957f2dULL));
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

static uint64_t stream_of(uint64_t seed, const char *name) {
  return mp_splitmix64(seed) ^ mp_init_name_hash(name);
}

double mp_init_standard_normal(uint64_t seed, const char *name, uint64_t index) {
  return standard_normal(stream_of(seed, name), index);
}

void mp_init_fill_normal(float *out, size_t count, uint64_t seed, const char *name,
                         uint64_t first_index, float std) {
  const uint64_t stream = stream_of(seed, name);
  /* Each element is a pure function of its index, so threads change the speed, never the
   * numbers (a 1.5B-parameter model draws 1.5e9 normals). */
#pragma omp parallel for schedule(static) if (count > 65536)
  for (size_t i = 0; i < count; ++i) {
    out[i] = (float)(std * standard_normal(stream, first_index + i));
  }
}

void mp_init_fill_normal_block(float *out, size_t rows, size_t cols, size_t row_offset,
                               size_t col_offset, size_t full_cols, uint64_t seed,
                               const char *name, float std) {
  const uint64_t stream = stream_of(seed, name);
  /* As mp_init_fill_normal: threads change the speed, never the numbers. */
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (size_t r = 0; r < rows; ++r) {
    const uint64_t base = (uint64_t)(row_offset + r) * full_cols + col_offset;
    for (size_t c = 0; c < cols; ++c) {
      out[r * cols + c] = (float)(std * standard_normal(stream, base + c));
    }
  }
}

void mp_init_fill_constant(float *out, size_t count, float value) {
  for (size_t i = 0; i < count; ++i) out[i] = value;
}
