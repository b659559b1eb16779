/*
 * common/rng.h — the one random number generator of mpengine: SplitMix64 (Steele, Lea and Flood,
 * 2014), small, fast and fully determined by its key.
 *
 * Everything random in mpengine (parameter initialisation, the synthetic Markov source, the
 * per-epoch sample order) draws from a stream keyed by (seed, purpose), never from global state,
 * so results are a pure function of the seed on every layout and after every resume.
 */
#ifndef MPENGINE_COMMON_RNG_H
#define MPENGINE_COMMON_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t state;
} mp_rng;

/* SplitMix64's output function: a bijective mix of all 64 bits. */
uint64_t mp_mix64(uint64_t z);

/* SplitMix64 of x: one step of the generator from state x (mix of x + the golden gamma). */
uint64_t mp_splitmix64(uint64_t x);

/* A stream keyed by (seed, key): state = mix(seed + gamma) ^ mix(key). Callers build `key` from
 * their purpose so that different purposes under one seed never share a stream. */
mp_rng mp_rng_keyed(uint64_t seed, uint64_t key);

uint64_t mp_rng_next(mp_rng *rng);

/* Uniform in [0, 1) from 53 random bits. */
double mp_rng_uniform(mp_rng *rng);

/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t mp_rng_below(mp_rng *rng, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_RNG_H */
