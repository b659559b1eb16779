// tests/topology/partition_test.cc — the stage partitioner against brute force on random layer
// costs, the embedding/LM-head case users complain about, and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "topology/partition.h"

namespace {

// The smallest bottleneck over every way to cut costs into k non-empty contiguous parts.
double brute_force(const std::vector<double> &costs, int k, size_t start = 0) {
  const size_t n = costs.size();
  if (k == 1) {
    double sum = 0;
    for (size_t i = start; i < n; ++i) sum += costs[i];
    return sum;
  }
  double best = INFINITY, first = 0;
  for (size_t end = start + 1; end + (size_t)(k - 1) <= n; ++end) {
    first += costs[end - 1];
    best = std::min(best, std::max(first, brute_force(costs, k - 1, end)));
  }
  return best;
}

TEST(Partition, MatchesBruteForceOnRandomCosts) {
  std::mt19937 rng(20240520);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + (int)(rng() % 11);
    const int k = 1 + (int)(rng() % n);
    std::vector<double> costs(n);
    for (double &c : costs) c = (trial % 7 == 0) ? (double)(rng() % 3) : cost(rng);
    std::vector<int> counts(k);
    double bottleneck = -1;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_partition_chain(costs.data(), n, k, counts.data(), &bottleneck, &err), MP_OK)
        << err.message;
    const double want = brute_force(costs, k);
    EXPECT_NEAR(bottleneck, want, 1e-9 * (1 + want)) << "n " << n << " k " << k;
    // The counts are a real split achieving the bottleneck.
    int at = 0;
    double worst = 0;
    for (int part = 0; part < k; ++part) {
      ASSERT_GE(counts[part], 1);
      double sum = 0;
      for (int i = 0; i < counts[part]; ++i) sum += costs[at++];
      worst = std::max(worst, sum);
    }
    EXPECT_EQ(at, n);
    EXPECT_NEAR(worst, bottleneck, 1e-9 * (1 + want));
  }
}

TEST(Partition, GivesTheHeavyEndsFewerBlocks) {
  // embedding, 8 blocks, final norm, LM head: the LM head costs two blocks.
  std::vector<double> costs = {0.1, 1, 1, 1, 1, 1, 1, 1, 1, 0.05, 2.0};
  std::vector<int> counts(4);
  double bottleneck = 0;
  ASSERT_EQ(mp_partition_chain(costs.data(), (int)costs.size(), 4, counts.data(), &bottleneck,
                               nullptr),
            MP_OK);
  // An even split by blocks (embedding + 2, 2, 2, 2 + norm + head = 4.05) leaves the last
  // stage slowest; the best gives it no block at all.
  EXPECT_NEAR(bottleneck, 3.0, 1e-12);
  EXPECT_EQ(counts, (std::vector<int>{3, 3, 3, 2}));
}

// The partitioner as it was before the pointer walk replaced the bisection (one k per call, each
// row only over the prefixes a k-part split can use): the splits it gives are the ones plans hold,
// so the faster walk must give the same ones, ties included.
std::vector<int> bisection_split(const std::vector<double> &costs, int k, double *bottleneck) {
  const int n = (int)costs.size();
  std::vector<double> prefix(n + 1, 0.0), best((size_t)(k + 1) * (n + 1), 0.0);
  std::vector<int> cut((size_t)(k + 1) * (n + 1), 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto B = [&](int j, int i) -> double & { return best[(size_t)j * (n + 1) + i]; };
  auto C = [&](int j, int i) -> int & { return cut[(size_t)j * (n + 1) + i]; };
  for (int i = 1; i <= n; ++i) B(1, i) = prefix[i];
  for (int j = 2; j <= k; ++j) {
    for (int i = j; i <= n - (k - j); ++i) {
      int lo = j - 1, hi = i - 1;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (B(j - 1, mid) >= prefix[i] - prefix[mid]) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      int best_s = lo;
      double best_value = std::fmax(B(j - 1, lo), prefix[i] - prefix[lo]);
      if (lo - 1 >= j - 1) {
        const double value = std::fmax(B(j - 1, lo - 1), prefix[i] - prefix[lo - 1]);
        if (value <= best_value) {
          best_value = value;
          best_s = lo - 1;
        }
      }
      B(j, i) = best_value;
      C(j, i) = best_s;
    }
  }
  *bottleneck = B(k, n);
  std::vector<int> counts(k);
  int end = n;
  for (int j = k; j >= 1; --j) {
    counts[j - 1] = end - C(j, end);
    end = C(j, end);
  }
  return counts;
}

TEST(Partition, AllSplitsAtOnceAreEachSplitAlone) {
  // Random chains, some of small integers (many ties between splits), some with a heavy end.
  std::mt19937 rng(20240521);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + (int)(rng() % 140);
    std::vector<double> costs(n);
    for (double &c : costs) c = (trial % 3 == 0) ? (double)(rng() % 3) : cost(rng);
    if (trial % 5 == 1) costs.back() = 40.0;
    const int most = 1 + (int)(rng() % n);
    std::vector<int> all((size_t)most * (most + 1) / 2);
    std::vector<double> bottlenecks(most + 1);
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_partition_chain_all(costs.data(), n, most, all.data(), bottlenecks.data(), &err),
              MP_OK)
        << err.message;
    for (int k = 1; k <= most; ++k) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", n " + std::to_string(n) + ", k " +
                   std::to_string(k));
      std::vector<int> alone(k);
      double bottleneck = -1;
      ASSERT_EQ(mp_partition_chain(costs.data(), n, k, alone.data(), &bottleneck, &err), MP_OK);
      const std::vector<int> together(all.begin() + (size_t)k * (k - 1) / 2,
                                      all.begin() + (size_t)k * (k + 1) / 2);
      EXPECT_EQ(together, alone);
      EXPECT_EQ(bottlenecks[k], bottleneck);
      double reference_bottleneck = -1;
      EXPECT_EQ(alone, bisection_split(costs, k, &reference_bottleneck));
      EXPECT_EQ(bottleneck, reference_bottleneck);
    }
  }
}

TEST(Partition, RefusesMoreStagesThanLayers) {
  double costs[3] = {1, 1, 1};
  int counts[4];
  double bottleneck;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_partition_chain(costs, 3, 4, counts, &bottleneck, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "cannot cut 3 layers into 4 stages: every stage needs at least one layer (use at "
               "most 3 stages)");
  costs[1] = -1;
  EXPECT_EQ(mp_partition_chain(costs, 3, 2, counts, &bottleneck, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message, "layer 1: cost -1 is not a finite non-negative number");
}

// The staged split (a pipeline rank's memory: parameters times their state bytes, activations
// times the micro-batches alive on that rank, the last stage's tied head) against brute force
// over every split, on random chains: the same smallest largest-stage cost, and counts that
// reach it.
double staged_cost(const std::vector<double> &a, const std::vector<double> &b,
                   const std::vector<double> &aw, const std::vector<double> &bw,
                   const std::vector<double> &fixed, const std::vector<int> &counts) {
  double worst = 0;
  size_t at = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    double sa = 0, sb = 0;
    for (int i = 0; i < counts[j]; ++i, ++at) sa += a[at], sb += b[at];
    worst = std::max(worst, fixed[j] + aw[j] * sa + bw[j] * sb);
  }
  return worst;
}

void every_split(int n, int k, std::vector<int> *counts, int used,
                 const std::function<void(const std::vector<int> &)> &visit) {
  const int j = (int)counts->size();
  if (j == k - 1) {
    counts->push_back(n - used);
    visit(*counts);
    counts->pop_back();
    return;
  }
  for (int c = 1; used + c + (k - j - 1) <= n; ++c) {
    counts->push_back(c);
    every_split(n, k, counts, used + c, visit);
    counts->pop_back();
  }
}

TEST(Partition, StagedSplitMatchesBruteForce) {
  std::mt19937 rng(20261202);
  std::uniform_real_distribution<double> value(0.0, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + (int)(rng() % 10);
    const int k = 1 + (int)(rng() % n);
    std::vector<double> a(n), b(n), aw(k), bw(k), fixed(k);
    for (int i = 0; i < n; ++i) a[i] = value(rng), b[i] = (trial % 5 == 0) ? 0.0 : value(rng);
    for (int j = 0; j < k; ++j) {
      aw[j] = 1.0 + (double)(rng() % 4);
      bw[j] = (double)(k - j);  // 1F1B: the first stage keeps the most micro-batches alive
      fixed[j] = j == k - 1 ? value(rng) : 0.0;
    }
    std::vector<int> counts(k);
    double bottleneck = -1;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_partition_chain_staged(a.data(), b.data(), n, k, aw.data(), bw.data(),
                                        fixed.data(), counts.data(), &bottleneck, &err),
              MP_OK)
        << err.message;
    double best = INFINITY;
    std::vector<int> scratch;
    every_split(n, k, &scratch, 0, [&](const std::vector<int> &split) {
      best = std::min(best, staged_cost(a, b, aw, bw, fixed, split));
    });
    int sum = 0;
    for (int c : counts) {
      EXPECT_GE(c, 1);
      sum += c;
    }
    EXPECT_EQ(sum, n);
    EXPECT_NEAR(bottleneck, best, 1e-9 * (1 + best)) << "trial " << trial;
    EXPECT_NEAR(staged_cost(a, b, aw, bw, fixed, counts), bottleneck, 1e-9 * (1 + best));
  }
}

// A first stage that holds the embedding and keeps four micro-batches alive gets fewer blocks
// than the time split's even cut, the last (with the tied head) fewer than the middle ones.
TEST(Partition, StagedSplitLightensTheFullEnds) {
  // embedding, 8 equal blocks, final norm, head (its weights are the embedding's: no params)
  const std::vector<double> params = {4, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  const std::vector<double> acts = {0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0, 0.5};
  const std::vector<double> state = {16, 16, 16, 16}, live = {4, 3, 2, 1}, fixed = {0, 0, 0, 64};
  int counts[4];
  double bottleneck = 0;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_partition_chain_staged(params.data(), acts.data(), 11, 4, state.data(),
                                      live.data(), fixed.data(), counts, &bottleneck, &err),
            MP_OK)
      << err.message;
  EXPECT_LT(counts[0], counts[1]);
  EXPECT_LT(counts[3], counts[1]);
  EXPECT_LE(bottleneck, 16 * 4 + 16 * 1 + 4 * 0.1 + 1e-9);  // the embedding and one block
}

TEST(Partition, StagedSplitRefusesBadValues) {
  const double ones[3] = {1, 1, 1}, bad[2] = {1, -2};
  int counts[3];
  double bottleneck;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_partition_chain_staged(ones, ones, 3, 4, ones, ones, ones, counts, &bottleneck,
                                      &err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("cannot cut 3 layers into 4 stages"), std::string::npos)
      << err.message;
  EXPECT_EQ(mp_partition_chain_staged(ones, ones, 3, 2, ones, bad, ones, counts, &bottleneck,
                                      &err),
            MP_ERR_INPUT);
  EXPECT_STREQ(err.message, "stage 1: -2 is not a finite non-negative number");
}

}  // namespace
