/*
 * engine/data/markov_source.c — the random Markov source with a known entropy floor; see
 * markov_source.h.
 *
 * The chain is stored sparsely (compressed rows): the successors of token i are
 * successor[row_start[i] .. row_start[i+1]) with their probabilities, so V = 50257 with 4
 * successors each costs a few MiB, and one sampled token costs a walk over at most `successors`
 * entries.
 */
#include "engine/data/markov_source.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

struct mp_markov_source {
  int64_t vocab_size;     /* V */
  int64_t *row_start;     /* (V + 1,) row i is entries [row_start[i], row_start[i + 1]) */
  int32_t *successor;     /* (E,) token ids */
  double *probability;    /* (E,) P(successor | row), each row sums to 1 */
  double *stationary;     /* (V,) pi, pi P = pi, sums to 1 */
  double entropy_rate;    /* nats per token */
  double unigram_entropy; /* nats, entropy of pi */
};

/* ---- randomness: splitmix64 (Steele, Lea, Flood 2014), one stream per (seed, purpose) ---- */

enum { kStreamBuild = 1, kStreamSample = 2 };

typedef mp_rng rng;

static rng rng_for(uint64_t seed, uint64_t purpose) {
  return mp_rng_keyed(seed, purpose * 0xD1B54A32D192ED03ull + 1);
}

/* ---- construction ---- */

static mp_markov_source *allocate(int64_t vocab_size, int64_t entries) {
  mp_markov_source *source = calloc(1, sizeof *source);
  if (source == NULL) return NULL;
  source->vocab_size = vocab_size;
  source->row_start = malloc((size_t)(vocab_size + 1) * sizeof *source->row_start);
  source->successor = malloc((size_t)entries * sizeof *source->successor);
  source->probability = malloc((size_t)entries * sizeof *source->probability);
  source->stationary = malloc((size_t)vocab_size * sizeof *source->stationary);
  if (source->row_start == NULL || source->successor == NULL || source->probability == NULL ||
      source->stationary == NULL) {
    mp_markov_source_free(source);
    return NULL;
  }
  return source;
}

void mp_markov_source_free(mp_markov_source *source) {
  if (source == NULL) return;
  free(source->row_start);
  free(source->successor);
  free(source->probability);
  free(source->stationary);
  free(source);
}

/* Marks every state reachable from state 0, following edges forward (reverse = false) or
 * backward; returns the first state not marked, or -1 when all are. */
static int64_t first_unreached(const mp_markov_source *source, bool reverse, int64_t *stack,
                               bool *seen) {
  const int64_t V = source->vocab_size;
  memset(seen, 0, (size_t)V * sizeof *seen);
  int64_t top = 0;
  stack[top++] = 0;
  seen[0] = true;
  while (top > 0) {
    const int64_t state = stack[--top];
    if (!reverse) {
      for (int64_t e = source->row_start[state]; e < source->row_start[state + 1]; ++e) {
        const int64_t next = source->successor[e];
        if (!seen[next]) {
          seen[next] = true;
          stack[top++] = next;
        }
      }
    } else {
      /* Backward search without a transposed copy: scan all rows for edges into `state`.
       * O(V * E) worst case, so it runs only on hand-built (small) chains. */
      for (int64_t from = 0; from < V; ++from) {
        if (seen[from]) continue;
        for (int64_t e = source->row_start[from]; e < source->row_start[from + 1]; ++e) {
          if (source->successor[e] == state) {
            seen[from] = true;
            stack[top++] = from;
            break;
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < V; ++i) {
    if (!seen[i]) return i;
  }
  return -1;
}

/* Fails unless every state reaches every other (state 0 reaches all and all reach state 0). */
static mp_status check_irreducible(const mp_markov_source *source, mp_error *err) {
  const int64_t V = source->vocab_size;
  int64_t *stack = malloc((size_t)V * sizeof *stack);
  bool *seen = malloc((size_t)V * sizeof *seen);
  mp_status status = MP_OK;
  if (stack == NULL || seen == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "Markov chain: out of memory for %lld states",
                     (long long)V);
  } else {
    int64_t missing = first_unreached(source, false, stack, seen);
    if (missing >= 0) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "Markov chain: state %lld cannot be reached from state 0; the chain must "
                       "be irreducible so its stationary distribution and entropy rate are "
                       "unique",
                       (long long)missing);
    } else if ((missing = first_unreached(source, true, stack, seen)) >= 0) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "Markov chain: state 0 cannot be reached from state %lld; the chain must "
                       "be irreducible so its stationary distribution and entropy rate are "
                       "unique",
                       (long long)missing);
    }
  }
  free(stack);
  free(seen);
  return status;
}

/* Power iteration on the lazy chain (I + P) / 2, which has the same stationary distribution as
 * P and converges even when P is periodic; then the entropy rate and the unigram entropy. */
static mp_status finish(mp_markov_source *source, mp_error *err) {
  const int64_t V = source->vocab_size;
  double *next = malloc((size_t)V * sizeof *next);
  if (next == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "Markov chain: out of memory for %lld states",
                   (long long)V);
  }
  double *pi = source->stationary;
  for (int64_t i = 0; i < V; ++i) pi[i] = 1.0 / (double)V;
  enum { kMaxIterations = 1000000 };
  const double kTolerance = 1e-14;
  bool converged = false;
  for (int iteration = 0; iteration < kMaxIterations && !converged; ++iteration) {
    for (int64_t i = 0; i < V; ++i) next[i] = 0.5 * pi[i];
    for (int64_t i = 0; i < V; ++i) {
      const double half = 0.5 * pi[i];
      for (int64_t e = source->row_start[i]; e < source->row_start[i + 1]; ++e) {
        next[source->successor[e]] += half * source->probability[e];
      }
    }
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i) total += next[i];
    double change = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      next[i] /= total;
      change += fabs(next[i] - pi[i]);
      pi[i] = next[i];
    }
    converged = change < kTolerance;
  }
  free(next);
  if (!converged) {
    return mp_fail(err, MP_ERR_INPUT,
                   "Markov chain: the stationary distribution did not converge in %d iterations; "
                   "the chain mixes too slowly (raise its smallest transition probabilities)",
                   (int)kMaxIterations);
  }
  double rate = 0.0, unigram = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    double row_entropy = 0.0;
    for (int64_t e = source->row_start[i]; e < source->row_start[i + 1]; ++e) {
      const double p = source->probability[e];
      if (p > 0.0) row_entropy -= p * log(p);
    }
    rate += pi[i] * row_entropy;
    if (pi[i] > 0.0) unigram -= pi[i] * log(pi[i]);
  }
  source->entropy_rate = rate;
  source->unigram_entropy = unigram;
  return MP_OK;
}

mp_status mp_markov_source_build(int64_t vocab_size, int successors, uint64_t seed,
                                 mp_markov_source **out, mp_error *err) {
  *out = NULL;
  if (vocab_size < 1 || vocab_size > MP_MARKOV_MAX_VOCAB) {
    return mp_fail(err, MP_ERR_INPUT,
                   "vocabulary size %lld is outside 1 .. %d (tokens are stored as uint16)",
                   (long long)vocab_size, MP_MARKOV_MAX_VOCAB);
  }
  if (successors > MP_MARKOV_MAX_SUCCESSORS || successors < 1 ||
      (successors < 2 && vocab_size > 1)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "successors per token %d is outside 2 .. %d; each token needs at least a "
                   "self-loop and a step to the next token so the chain is irreducible and "
                   "aperiodic",
                   successors, MP_MARKOV_MAX_SUCCESSORS);
  }
  const int64_t per_row = successors < vocab_size ? successors : vocab_size;
  mp_markov_source *source = allocate(vocab_size, vocab_size * per_row);
  if (source == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a Markov chain of %lld states",
                   (long long)vocab_size);
  }
  rng r = rng_for(seed, kStreamBuild);
  double weight[MP_MARKOV_MAX_SUCCESSORS];
  /* The floor on each Dirichlet(1) weight: keeps every transition probability above about
   * 0.05 / (per_row + 0.05 * per_row), so the chain mixes fast and sampling visits all rows. */
  const double kWeightFloor = 0.05;
  for (int64_t i = 0; i < vocab_size; ++i) {
    const int64_t first = i * per_row;
    int32_t *row = source->successor + first;
    source->row_start[i] = first;
    if (per_row == vocab_size) {
      for (int64_t j = 0; j < per_row; ++j) row[j] = (int32_t)j;
    } else {
      row[0] = (int32_t)i;
      row[1] = (int32_t)((i + 1) % vocab_size);
      for (int64_t j = 2; j < per_row; ++j) {
        bool fresh;
        int32_t candidate;
        do {
          candidate = (int32_t)mp_rng_below(&r, (uint64_t)vocab_size);
          fresh = true;
          for (int64_t k = 0; k < j; ++k) fresh = fresh && row[k] != candidate;
        } while (!fresh);
        row[j] = candidate;
      }
    }
    double total = 0.0;
    for (int64_t j = 0; j < per_row; ++j) {
      weight[j] = kWeightFloor - log(1.0 - mp_rng_uniform(&r)); /* Exp(1) + floor */
      total += weight[j];
    }
    for (int64_t j = 0; j < per_row; ++j) source->probability[first + j] = weight[j] / total;
  }
  source->row_start[vocab_size] = vocab_size * per_row;
  mp_status status = finish(source, err);
  if (status != MP_OK) {
    mp_markov_source_free(source);
    return status;
  }
  *out = source;
  return MP_OK;
}

mp_status mp_markov_source_from_matrix(int64_t vocab_size, const double *transition,
                                       mp_markov_source **out, mp_error *err) {
  *out = NULL;
  if (vocab_size < 1 || vocab_size > MP_MARKOV_MAX_VOCAB) {
    return mp_fail(err, MP_ERR_INPUT,
                   "Markov chain: %lld states is outside 1 .. %d (tokens are stored as uint16)",
                   (long long)vocab_size, MP_MARKOV_MAX_VOCAB);
  }
  const int64_t V = vocab_size;
  int64_t entries = 0;
  for (int64_t i = 0; i < V; ++i) {
    double total = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      const double p = transition[i * V + j];
      if (!(p >= 0.0 && p <= 1.0)) {
        return mp_fail(err, MP_ERR_INPUT,
                       "Markov chain: P[%lld][%lld] = %g is not a probability in [0, 1]",
                       (long long)i, (long long)j, p);
      }
      total += p;
      entries += p > 0.0;
    }
    if (fabs(total - 1.0) > 1e-9) {
      return mp_fail(err, MP_ERR_INPUT,
                     "Markov chain: row %lld sums to %.12g, not 1; each row is the distribution "
                     "of the token that follows",
                     (long long)i, total);
    }
  }
  mp_markov_source *source = allocate(V, entries);
  if (source == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a Markov chain of %lld states",
                   (long long)V);
  }
  int64_t e = 0;
  for (int64_t i = 0; i < V; ++i) {
    source->row_start[i] = e;
    double total = 0.0;
    for (int64_t j = 0; j < V; ++j) total += transition[i * V + j];
    for (int64_t j = 0; j < V; ++j) {
      if (transition[i * V + j] > 0.0) {
        source->successor[e] = (int32_t)j;
        source->probability[e] = transition[i * V + j] / total;
        ++e;
      }
    }
  }
  source->row_start[V] = e;
  mp_status status = check_irreducible(source, err);
  if (status == MP_OK) status = finish(source, err);
  if (status != MP_OK) {
    mp_markov_source_free(source);
    return status;
  }
  *out = source;
  return MP_OK;
}

/* ---- queries ---- */

int64_t mp_markov_source_vocab_size(const mp_markov_source *source) {
  return source->vocab_size;
}

double mp_markov_source_entropy_rate(const mp_markov_source *source) {
  return source->entropy_rate;
}

double mp_markov_source_unigram_entropy(const mp_markov_source *source) {
  return source->unigram_entropy;
}

double mp_markov_source_stationary(const mp_markov_source *source, int64_t token) {
  if (token < 0 || token >= source->vocab_size) return 0.0;
  return source->stationary[token];
}

double mp_markov_source_transition(const mp_markov_source *source, int64_t from, int64_t to) {
  if (from < 0 || from >= source->vocab_size) return 0.0;
  for (int64_t e = source->row_start[from]; e < source->row_start[from + 1]; ++e) {
    if (source->successor[e] == to) return source->probability[e];
  }
  return 0.0;
}

void mp_markov_source_sample(const mp_markov_source *source, uint64_t seed, int64_t count,
                             uint16_t *out_tokens) {
  if (count <= 0) return;
  rng r = rng_for(seed, kStreamSample);
  const int64_t V = source->vocab_size;
  /* The first token from pi, so the whole sample is stationary. */
  double u = mp_rng_uniform(&r);
  int64_t state = V - 1;
  for (int64_t i = 0; i < V; ++i) {
    u -= source->stationary[i];
    if (u < 0.0) {
      state = i;
      break;
    }
  }
  out_tokens[0] = (uint16_t)state;
  for (int64_t t = 1; t < count; ++t) {
    u = mp_rng_uniform(&r);
    const int64_t first = source->row_start[state], end = source->row_start[state + 1];
    int64_t next = source->successor[end - 1]; /* round-off lands on the last entry */
    for (int64_t e = first; e < end; ++e) {
      u -= source->probability[e];
      if (u < 0.0) {
        next = source->successor[e];
        break;
      }
    }
    state = next;
    out_tokens[t] = (uint16_t)state;
  }
}

double mp_markov_source_mean_nll(const mp_markov_source *source, const uint16_t *tokens,
                                 int64_t count) {
  if (count < 2) return 0.0;
  double total = 0.0;
  for (int64_t t = 1; t < count; ++t) {
    const double p = mp_markov_source_transition(source, tokens[t - 1], tokens[t]);
    if (p <= 0.0) return INFINITY;
    total -= log(p);
  }
  return total / (double)(count - 1);
}
