/* engine/data/sample_order.c — a cycle-walking Feistel permutation of 0 .. S - 1; see
 * sample_order.h. */
#include "engine/data/sample_order.h"

#include "common/rng.h"

/* The stream of round keys for epoch `epoch`; the constant keeps it apart from the other streams
 * drawn from the same seed (initialisation, the Markov source). */
static mp_rng round_key_stream(uint64_t seed, int64_t epoch) {
  const uint64_t kShuffleStream = 0x53485546464C45ull; /* "SHUFFLE" */
  return mp_rng_keyed(seed, kShuffleStream + (uint64_t)epoch * 0xD1B54A32D192ED03ull);
}

void mp_sample_order_init(mp_sample_order *order, uint64_t seed, int64_t epoch, int64_t samples) {
  order->samples = samples;
  /* The smallest k with 4^k >= S; k <= 32 since S < 2^63. */
  int k = 0;
  while (k < 32 && ((uint64_t)1 << (2 * k)) < (uint64_t)samples) ++k;
  order->half_bits = k;
  order->half_mask = k == 0 ? 0 : ((uint64_t)1 << k) - 1;
  mp_rng keys = round_key_stream(seed, epoch);
  for (int r = 0; r < MP_SAMPLE_ORDER_ROUNDS; ++r) order->round_keys[r] = mp_rng_next(&keys);
}

/* One pass of the Feistel network over the 2k-bit value x: (L, R) -> (R, L ^ F_r(R)). */
static uint64_t feistel(const mp_sample_order *order, uint64_t x) {
  const int k = order->half_bits;
  const uint64_t mask = order->half_mask;
  uint64_t left = x >> k, right = x & mask;
  for (int r = 0; r < MP_SAMPLE_ORDER_ROUNDS; ++r) {
    const uint64_t mixed = left ^ (mp_mix64(right ^ order->round_keys[r]) & mask);
    left = right;
    right = mixed;
  }
  return left << k | right;
}

int64_t mp_sample_order_at(const mp_sample_order *order, int64_t position) {
  if (order->half_bits == 0) return 0; /* S = 1 */
  /* Cycle walking: position < S lies on a cycle of the permutation of 0 .. 4^k - 1 that holds
   * position itself, so walking it reaches a value below S, and distinct positions reach
   * distinct values. */
  uint64_t x = (uint64_t)position;
  do {
    x = feistel(order, x);
  } while (x >= (uint64_t)order->samples);
  return (int64_t)x;
}
