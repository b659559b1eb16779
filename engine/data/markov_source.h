/*
 * engine/data/markov_source.h — a random first-order Markov source of tokens with a known entropy
 * floor: the synthetic corpus of `mpengine data synth` and of `run` without --data.
 *
 * Why: a training run on real text cannot say how far its loss is from the best possible. On a
 * stationary Markov chain it can: no model, however large, predicts the next token with a lower
 * expected cross-entropy than the chain's entropy rate
 *     H = sum_i pi_i * H(P_i) = -sum_i pi_i sum_j P_ij ln P_ij      (nats per token)
 * where pi is the stationary distribution (pi P = pi) and P_i row i of the transition matrix.
 * A small transformer reaches it by learning the table P from the previous token alone, so the
 * loss curve of a correct engine approaches H, and a broken one (a wrong gradient, a mis-wired
 * pipeline stage) stalls visibly above it.
 *
 * Built from a seed, state i moves to at most `successors` states: always to itself and to
 * (i + 1) mod V, and to successors - 2 others drawn at random, with probabilities drawn from
 * a Dirichlet(1) distribution (plus a small floor so no transition is vanishingly rare). The
 * ring i -> i + 1 makes the chain irreducible and the self-loop makes it aperiodic, so pi is
 * unique and a long sample's empirical loss under the true chain converges to H. With
 * successors >= V every state moves to every state.
 *
 * Randomness is a splitmix64 stream seeded from (seed, purpose), never rand(): the same seed
 * gives the same chain and the same tokens on every machine.
 */
#ifndef MPENGINE_ENGINE_MARKOV_SOURCE_H
#define MPENGINE_ENGINE_MARKOV_SOURCE_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  MP_MARKOV_DEFAULT_SUCCESSORS = 4,
  MP_MARKOV_MAX_SUCCESSORS = 256,
  MP_MARKOV_MAX_VOCAB = 65536, /* tokens are written as uint16 */
};

typedef struct mp_markov_source mp_markov_source;

/* Builds the random chain over vocab_size tokens (1 .. 65536) in which each token has
 * min(successors, vocab_size) successors (successors 2 .. 256; 1 is allowed only when
 * vocab_size is 1), drawn from seed; computes its stationary distribution and entropy rate.
 * MP_ERR_INPUT names the argument out of range; MP_ERR_RUNTIME when memory runs out. On success
 * *out is freed with mp_markov_source_free. */
mp_status mp_markov_source_build(int64_t vocab_size, int successors, uint64_t seed,
                                 mp_markov_source **out, mp_error *err);

/* A chain given by its dense transition matrix, (V, V) row-major, row i the distribution of the
 * token after i (for tests and hand-built sources). Fails with MP_ERR_INPUT when an entry is not
 * a probability, a row does not sum to 1 (within 1e-9; rows are then renormalised), or the chain
 * is not irreducible (a state cannot be reached from another), naming the row or state. */
mp_status mp_markov_source_from_matrix(int64_t vocab_size, const double *transition,
                                       mp_markov_source **out, mp_error *err);

void mp_markov_source_free(mp_markov_source *source);

int64_t mp_markov_source_vocab_size(const mp_markov_source *source);

/* The entropy rate H in nats per token: the lowest expected loss any model can reach. */
double mp_markov_source_entropy_rate(const mp_markov_source *source);

/* The entropy of the stationary distribution in nats: the loss of the best model that ignores
 * context (a unigram model). The gap down to the entropy rate is what learning the transitions
 * buys. */
double mp_markov_source_unigram_entropy(const mp_markov_source *source);

/* pi[token], the stationary probability (power iteration on the lazy chain (I + P) / 2 until
 * successive iterates differ by less than 1e-14 in L1). */
double mp_markov_source_stationary(const mp_markov_source *source, int64_t token);

/* P(next = to | current = from); 0 when to is not a successor of from. */
double mp_markov_source_transition(const mp_markov_source *source, int64_t from, int64_t to);

/* Writes count tokens (count >= 0) drawn from the chain into out_tokens (count,): the first from
 * the stationary distribution, each next from its predecessor's row. A pure function of
 * (source, seed, count): a longer sample with the same seed extends a shorter one. */
void mp_markov_source_sample(const mp_markov_source *source, uint64_t seed, int64_t count,
                             uint16_t *out_tokens);

/* The mean of -ln P(tokens[i+1] | tokens[i]) over the count - 1 transitions of tokens (count >=
 * 2, every id < V): the loss the true chain itself scores on that sample, which approaches the
 * entropy rate as count grows. +infinity if some transition has probability 0. */
double mp_markov_source_mean_nll(const mp_markov_source *source, const uint16_t *tokens,
                                 int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MARKOV_SOURCE_H */
