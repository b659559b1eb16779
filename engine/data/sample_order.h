/*
 * engine/data/sample_order.h — the order of an epoch's samples: a keyed bijection of 0 .. S - 1
 * computed one position at a time, in O(1) memory.
 *
 * Why not a stored shuffle: a permutation of S samples is 8 S bytes per rank (a 10-billion-token
 * corpus at sequence length 1024 is ten million samples, 80 MB on every rank, rebuilt every epoch
 * in time proportional to S before the first step can start). This order instead maps a position
 * to its sample directly, so a rank computes only the positions of its own rows.
 *
 * The map is a balanced Feistel network on the 2k-bit numbers, 4^k the smallest power of 4 that
 * is >= S, with MP_SAMPLE_ORDER_ROUNDS rounds whose round function is SplitMix64's mixer of the
 * right half and a round key; a Feistel network is a bijection whatever its round function, and
 * "cycle walking" (apply it again while the value is >= S) restricts it to a bijection of
 * 0 .. S - 1 (Black and Rogaway, "Ciphers with arbitrary finite domains", 2002). Since 4^k < 4 S,
 * a position needs fewer than 4 applications on average. The round keys are drawn from a
 * SplitMix64 stream keyed by (seed, epoch), so the order is a pure function of
 * (seed, epoch, S): the same on every rank, after every resume, and new every epoch.
 *
 * This is data order 2 (MP_DATA_ORDER_VERSION in data_loader.h); order 1 was a Fisher-Yates
 * shuffle materialised per epoch.
 */
#ifndef MPENGINE_ENGINE_SAMPLE_ORDER_H
#define MPENGINE_ENGINE_SAMPLE_ORDER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_SAMPLE_ORDER_ROUNDS = 6 };

/* One epoch's order: plain data, computed by mp_sample_order_init, then only read. */
typedef struct {
  int64_t samples;    /* S */
  int half_bits;      /* k: each Feistel half has k bits; 4^k >= S */
  uint64_t half_mask; /* 2^k - 1 */
  uint64_t round_keys[MP_SAMPLE_ORDER_ROUNDS];
} mp_sample_order;

/* The order of epoch `epoch` (>= 0) of `samples` samples (>= 1) under seed. */
void mp_sample_order_init(mp_sample_order *order, uint64_t seed, int64_t epoch, int64_t samples);

/* The sample at position 0 .. S - 1 of the epoch: a bijection of 0 .. S - 1. */
int64_t mp_sample_order_at(const mp_sample_order *order, int64_t position);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_SAMPLE_ORDER_H */
