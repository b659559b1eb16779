// tests/topology/partition_test.cc — the stage partitioner against brute force on random layer
// costs, the embedding/LM-head case users complain about, and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
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

}  // namespace
