/*
 * context_parallel/sequence_split.h — which tokens of every sequence a context-parallel rank
 * holds: the sequence of T tokens is cut into 2 cp chunks of T / (2 cp) and cp rank i holds chunks
 * i and 2 cp - 1 - i (Megatron-Core's load balancing: under the causal mask a chunk near the start
 * attends to few keys and one near the end to many, so every rank gets one of each and the same
 * work). The rank's T / cp local tokens are its first chunk, then its second.
 *
 * Pure functions with no communicator: the data loader cuts its rows with them, the stage gives
 * rotary and learned positions from them, the key/value exchange (kv_exchange.h) places every
 * rank's keys at their global positions with them.
 */
#ifndef MPENGINE_CONTEXT_PARALLEL_SEQUENCE_SPLIT_H
#define MPENGINE_CONTEXT_PARALLEL_SEQUENCE_SPLIT_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MP_OK when seq_len tokens cut into 2 cp chunks (cp >= 1; with cp = 1 every length does), else
 * MP_ERR_INPUT naming both numbers. */
mp_status mp_cp_check(int64_t seq_len, int cp, mp_error *err);

/* The position in the whole sequence (0 .. seq_len - 1) of local token t (0 .. seq_len / cp - 1)
 * of cp rank `rank`. With cp = 1, t itself. */
int64_t mp_cp_position(int64_t seq_len, int cp, int rank, int64_t t);

/* positions (seq_len / cp): mp_cp_position of every local token, in order. */
void mp_cp_positions(int32_t *positions, int64_t seq_len, int cp, int rank);

/* local (rows, seq_len / cp) = this rank's tokens of each of the rows of full (rows, seq_len). */
void mp_cp_take_local(int32_t *local, const int32_t *full, int64_t rows, int64_t seq_len, int cp,
                      int rank);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_CONTEXT_PARALLEL_SEQUENCE_SPLIT_H */
