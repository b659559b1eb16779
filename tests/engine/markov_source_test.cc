// tests/engine/markov_source_test.cc — the synthetic source's entropy floor: exact on chains with
// a closed form, equal to the empirical loss of a long sample, and the same numbers for the same
// seed on every run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/data/markov_source.h"

namespace {

struct Source {
  mp_markov_source *source = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Source() { mp_markov_source_free(source); }
  mp_status build(int64_t vocab, int successors, uint64_t seed) {
    return mp_markov_source_build(vocab, successors, seed, &source, &err);
  }
  mp_status from_matrix(const std::vector<double> &p, int64_t vocab) {
    return mp_markov_source_from_matrix(vocab, p.data(), &source, &err);
  }
};

double binary_entropy(double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); }

TEST(MarkovSource, TwoStateChainMatchesClosedForm) {
  // 0 -> 1 with probability a, 1 -> 0 with probability b: pi = (b, a) / (a + b) and
  // H = pi_0 h(a) + pi_1 h(b).
  const double a = 0.1, b = 0.3;
  Source s;
  ASSERT_EQ(s.from_matrix({1 - a, a, b, 1 - b}, 2), MP_OK) << s.err.message;
  EXPECT_NEAR(mp_markov_source_stationary(s.source, 0), b / (a + b), 1e-12);
  EXPECT_NEAR(mp_markov_source_stationary(s.source, 1), a / (a + b), 1e-12);
  const double rate = b / (a + b) * binary_entropy(a) + a / (a + b) * binary_entropy(b);
  EXPECT_NEAR(mp_markov_source_entropy_rate(s.source), rate, 1e-12);
  EXPECT_NEAR(mp_markov_source_unigram_entropy(s.source), binary_entropy(0.25), 1e-12);
  EXPECT_DOUBLE_EQ(mp_markov_source_transition(s.source, 0, 1), a);
}

TEST(MarkovSource, PeriodicAndDeterministicChains) {
  // A periodic chain still has a unique stationary distribution; the lazy power iteration finds
  // it. Its entropy rate is 0: the next token is certain.
  Source cycle;
  ASSERT_EQ(cycle.from_matrix({0, 1, 0, 0, 0, 1, 1, 0, 0}, 3), MP_OK) << cycle.err.message;
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(mp_markov_source_stationary(cycle.source, i), 1.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(mp_markov_source_entropy_rate(cycle.source), 0.0);
  EXPECT_NEAR(mp_markov_source_unigram_entropy(cycle.source), std::log(3.0), 1e-12);
  std::vector<uint16_t> tokens(10);
  mp_markov_source_sample(cycle.source, 5, 10, tokens.data());
  for (int t = 1; t < 10; ++t) EXPECT_EQ(tokens[t], (tokens[t - 1] + 1) % 3);
  EXPECT_DOUBLE_EQ(mp_markov_source_mean_nll(cycle.source, tokens.data(), 10), 0.0);
}

TEST(MarkovSource, IidChainHasRowEntropy) {
  // Every row the same distribution q: the tokens are independent and H = H(q) = H(pi).
  const std::vector<double> q = {0.5, 0.25, 0.125, 0.125};
  std::vector<double> p;
  for (int i = 0; i < 4; ++i) p.insert(p.end(), q.begin(), q.end());
  Source s;
  ASSERT_EQ(s.from_matrix(p, 4), MP_OK) << s.err.message;
  const double h = 1.75 * std::log(2.0);
  EXPECT_NEAR(mp_markov_source_entropy_rate(s.source), h, 1e-12);
  EXPECT_NEAR(mp_markov_source_unigram_entropy(s.source), h, 1e-12);
}

TEST(MarkovSource, RandomChainIsStochasticIrreducibleAndStationary) {
  Source s;
  const int64_t V = 300;
  ASSERT_EQ(s.build(V, 4, 42), MP_OK) << s.err.message;
  std::vector<double> pi_p(V, 0.0);
  double pi_total = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    double row = 0.0;
    int successors = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double p = mp_markov_source_transition(s.source, i, j);
      row += p;
      successors += p > 0;
      pi_p[j] += mp_markov_source_stationary(s.source, i) * p;
    }
    EXPECT_NEAR(row, 1.0, 1e-12) << "row " << i;
    EXPECT_EQ(successors, 4) << "row " << i;
    EXPECT_GT(mp_markov_source_transition(s.source, i, i), 0.0);            // aperiodic
    EXPECT_GT(mp_markov_source_transition(s.source, i, (i + 1) % V), 0.0);  // irreducible
    pi_total += mp_markov_source_stationary(s.source, i);
  }
  EXPECT_NEAR(pi_total, 1.0, 1e-12);
  for (int64_t j = 0; j < V; ++j) {
    EXPECT_NEAR(pi_p[j], mp_markov_source_stationary(s.source, j), 1e-13) << "pi P = pi at " << j;
  }
  const double rate = mp_markov_source_entropy_rate(s.source);
  EXPECT_GT(rate, 0.3);
  EXPECT_LT(rate, std::log(4.0));
  EXPECT_GT(mp_markov_source_unigram_entropy(s.source), rate + 3.0);  // context is worth learning
}

TEST(MarkovSource, EmpiricalLossOfALongSampleApproachesTheEntropyRate) {
  Source s;
  ASSERT_EQ(s.build(64, 4, 1337), MP_OK) << s.err.message;
  const int64_t n = 1000000;
  std::vector<uint16_t> tokens(n);
  mp_markov_source_sample(s.source, 1337, n, tokens.data());
  const double nll = mp_markov_source_mean_nll(s.source, tokens.data(), n);
  EXPECT_NEAR(nll, mp_markov_source_entropy_rate(s.source), 0.01);
  // The visit frequencies approach pi too.
  std::vector<double> visits(64, 0.0);
  for (uint16_t t : tokens) visits[t] += 1.0 / n;
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(visits[i], mp_markov_source_stationary(s.source, i), 0.005) << "token " << i;
  }
}

TEST(MarkovSource, SameSeedSameChainAndTokens) {
  Source a, b, c;
  ASSERT_EQ(a.build(1000, 4, 7), MP_OK);
  ASSERT_EQ(b.build(1000, 4, 7), MP_OK);
  ASSERT_EQ(c.build(1000, 4, 8), MP_OK);
  EXPECT_EQ(mp_markov_source_entropy_rate(a.source), mp_markov_source_entropy_rate(b.source));
  EXPECT_NE(mp_markov_source_entropy_rate(a.source), mp_markov_source_entropy_rate(c.source));
  std::vector<uint16_t> x(5000), y(5000), prefix(100), other(5000);
  mp_markov_source_sample(a.source, 99, 5000, x.data());
  mp_markov_source_sample(b.source, 99, 5000, y.data());
  mp_markov_source_sample(a.source, 99, 100, prefix.data());
  mp_markov_source_sample(a.source, 100, 5000, other.data());
  EXPECT_EQ(x, y);
  EXPECT_EQ(std::vector<uint16_t>(x.begin(), x.begin() + 100), prefix);
  EXPECT_NE(x, other);
}

TEST(MarkovSource, SmallVocabularies) {
  Source one;
  ASSERT_EQ(one.build(1, 4, 1), MP_OK) << one.err.message;
  EXPECT_DOUBLE_EQ(mp_markov_source_entropy_rate(one.source), 0.0);
  std::vector<uint16_t> zeros(8, 9);
  mp_markov_source_sample(one.source, 1, 8, zeros.data());
  EXPECT_EQ(zeros, std::vector<uint16_t>(8, 0));

  Source three;  // 4 successors but only 3 tokens: every token moves to every token
  ASSERT_EQ(three.build(3, 4, 1), MP_OK) << three.err.message;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_GT(mp_markov_source_transition(three.source, i, j), 0.0);
  }
  EXPECT_LT(mp_markov_source_entropy_rate(three.source), std::log(3.0));
}

// The source `run` uses for gpt2-124m's vocabulary: every token keeps its self-loop and its step
// to the next token, the rows are distributions, and the floor is what Dirichlet(1) rows over 4
// successors give: E[H] = psi(5) - psi(2) = 1/2 + 1/3 + 1/4 = 1.083 nats per row (the weight floor
// of 0.05 lifts it a little), averaged over 50257 rows, so far from both 0 and ln 4. How long the
// build takes is tools/bench/markov_build.c's business, not a test's.
TEST(MarkovSource, Gpt2SizedVocabularyHasFourSuccessorsPerTokenAndItsFloor) {
  const int64_t vocab = 50257;
  Source s;
  ASSERT_EQ(s.build(vocab, 4, 1337), MP_OK) << s.err.message;
  ASSERT_EQ(mp_markov_source_vocab_size(s.source), vocab);
  double pi_total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) pi_total += mp_markov_source_stationary(s.source, i);
  EXPECT_NEAR(pi_total, 1.0, 1e-9);
  for (int64_t i = 0; i < vocab; i += 997) {
    EXPECT_GT(mp_markov_source_transition(s.source, i, i), 0.0) << "token " << i;
    EXPECT_GT(mp_markov_source_transition(s.source, i, (i + 1) % vocab), 0.0) << "token " << i;
  }
  const double rate = mp_markov_source_entropy_rate(s.source);
  EXPECT_GT(rate, 1.0);
  EXPECT_LT(rate, 1.2);
  EXPECT_GT(mp_markov_source_unigram_entropy(s.source), 10.0);  // close to ln 50257 = 10.8
  EXPECT_LE(mp_markov_source_unigram_entropy(s.source), std::log((double)vocab) + 1e-9);
  // A long sample scores the floor under the true chain (every transition it takes exists) and
  // walks most of the vocabulary.
  const int64_t count = 1 << 20;
  std::vector<uint16_t> tokens((size_t)count);
  mp_markov_source_sample(s.source, 7, count, tokens.data());
  EXPECT_NEAR(mp_markov_source_mean_nll(s.source, tokens.data(), count), rate, 0.01);
  std::vector<bool> seen((size_t)vocab, false);
  int64_t distinct = 0;
  for (uint16_t t : tokens) {
    ASSERT_LT(t, vocab);
    if (!seen[t]) {
      seen[t] = true;
      ++distinct;
    }
  }
  EXPECT_GT(distinct, vocab / 2);
}

void expect_build_error(int64_t vocab, int successors, const std::string &message) {
  Source s;
  EXPECT_EQ(s.build(vocab, successors, 1), MP_ERR_INPUT);
  EXPECT_EQ(s.source, nullptr);
  EXPECT_EQ(std::string(s.err.message), message);
}

TEST(MarkovSourceBadInput, BuildArguments) {
  expect_build_error(0, 4, "vocabulary size 0 is outside 1 .. 65536 (tokens are stored as uint16)");
  expect_build_error(65537, 4,
                     "vocabulary size 65537 is outside 1 .. 65536 (tokens are stored as uint16)");
  expect_build_error(10, 1,
                     "successors per token 1 is outside 2 .. 256; each token needs at least a "
                     "self-loop and a step to the next token so the chain is irreducible and "
                     "aperiodic");
  expect_build_error(10, 257,
                     "successors per token 257 is outside 2 .. 256; each token needs at least a "
                     "self-loop and a step to the next token so the chain is irreducible and "
                     "aperiodic");
}

void expect_matrix_error(const std::vector<double> &p, int64_t vocab, const std::string &message) {
  Source s;
  EXPECT_EQ(s.from_matrix(p, vocab), MP_ERR_INPUT);
  EXPECT_EQ(s.source, nullptr);
  EXPECT_EQ(std::string(s.err.message), message);
}

TEST(MarkovSourceBadInput, MatrixNotStochasticOrReducible) {
  expect_matrix_error({0.5, 0.4, 0.5, 0.5}, 2,
                      "Markov chain: row 0 sums to 0.9, not 1; each row is the distribution of "
                      "the token that follows");
  expect_matrix_error({1.5, -0.5, 0.5, 0.5}, 2,
                      "Markov chain: P[0][0] = 1.5 is not a probability in [0, 1]");
  expect_matrix_error({1, 0, 0, 1}, 2,
                      "Markov chain: state 1 cannot be reached from state 0; the chain must be "
                      "irreducible so its stationary distribution and entropy rate are unique");
  expect_matrix_error({0, 1, 0, 0, 1, 0, 0, 0, 1}, 3,  // 2 absorbs: nothing returns to 0
                      "Markov chain: state 2 cannot be reached from state 0; the chain must be "
                      "irreducible so its stationary distribution and entropy rate are unique");
  expect_matrix_error({0.5, 0.5, 0, 0, 0, 1, 0, 0, 1}, 3,
                      "Markov chain: state 0 cannot be reached from state 1; the chain must be "
                      "irreducible so its stationary distribution and entropy rate are unique");
}

}  // namespace
