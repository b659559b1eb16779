/* common/rng.c — SplitMix64 streams; see rng.h. */
#include "common/rng.h"

static const uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

uint64_t mp_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mp_splitmix64(uint64_t x) { return mp_mix64(x + kGoldenGamma); }

mp_rng mp_rng_keyed(uint64_t seed, uint64_t key) {
  mp_rng rng = {mp_mix64(seed + kGoldenGamma) ^ mp_mix64(key)};
  return rng;
}

uint64_t mp_rng_next(mp_rng *rng) {
  rng->state += kGoldenGamma;
  return mp_mix64(rng->state);
}

double mp_rng_uniform(mp_rng *rng) { return (double)(mp_rng_next(rng) >> 11) * 0x1.0p-53; }

uint64_t mp_rng_below(mp_rng *rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = mp_rng_next(rng);
  } while (x >= limit);
  return x % n;
}
