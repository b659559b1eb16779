// tests/engine/router_stats_test.cc — engine/model/router_stats.h: the router statistics a
// micro-batch carries through the pipeline travel bit for bit (doubles in pairs of floats, at the
// end of the stage boundary), and the auxiliary loss of the sums is layers/moe.h's, weighted.
// Their sums across stages, tp and cp are held to the one-rank run by
// tests/tools/moe_parallel_equals_serial_test.sh.
#include <gtest/gtest.h>

#include <vector>

#include "engine/model/router_stats.h"

namespace {

TEST(RouterStats, BoundaryTailHoldsTwoEPlusTwoDoubles) {
  EXPECT_EQ(mp_router_stats_boundary_floats(0), 0u);  // a dense model sends nothing more
  EXPECT_EQ(mp_router_stats_boundary_floats(8), 2u * (2 * 8 + 2));
}

TEST(RouterStats, PackThenUnpackIsBitExact) {
  const int E = 3;
  std::vector<double> a = {1.0 / 3.0, 2.0, 1e-300}, b = {0.1, 0.7, 3.0e10};
  mp_moe_stats in = {E, 12345.0 / 7.0, a.data(), b.data(), 1.0 / 9.0};
  std::vector<float> tail(mp_router_stats_boundary_floats(E));
  mp_router_stats_pack(&in, tail.data());
  std::vector<double> c(E), d(E);
  mp_moe_stats out = {E, 0.0, c.data(), d.data(), 0.0};
  mp_router_stats_unpack(&out, tail.data());
  EXPECT_EQ(out.tokens, in.tokens);
  EXPECT_EQ(out.logsumexp_sq, in.logsumexp_sq);
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(out.routed[e], a[e]) << e;
    EXPECT_EQ(out.prob_sum[e], b[e]) << e;
  }
}

TEST(RouterStats, AuxiliaryLossIsTheWeightedSumOfLoadBalancingAndZLoss) {
  // E 2, 4 tokens: aux = E sum_e (routed_e / n)(prob_e / n) = 2 (3 x 2.5 + 1 x 1.5) / 16 = 1.125,
  // z = 8 / 4 = 2.
  std::vector<double> routed = {3.0, 1.0}, probs = {2.5, 1.5};
  mp_moe_stats s = {2, 4.0, routed.data(), probs.data(), 8.0};
  EXPECT_DOUBLE_EQ(mp_router_stats_loss(&s, 0.1, 0.01), 0.1 * 1.125 + 0.01 * 2.0);
  EXPECT_DOUBLE_EQ(mp_router_stats_loss(&s, 0.0, 0.0), 0.0);
  std::vector<double> r2 = {1.0, 2.0}, p2 = {0.5, 0.25};
  mp_moe_stats more = {2, 3.0, r2.data(), p2.data(), 1.0};
  mp_router_stats_add(&s, &more);
  EXPECT_EQ(s.tokens, 7.0);
  EXPECT_EQ(s.logsumexp_sq, 9.0);
  EXPECT_EQ(routed[1], 3.0);
  EXPECT_EQ(probs[0], 3.0);
  // A one-rank group's sum is the stats themselves.
  mp_error err = MP_ERROR_INITIALIZER;
  const mp_tp_comm single = mp_tp_comm_single();
  ASSERT_EQ(MP_OK, mp_router_stats_sum(&s, &single, &err)) << err.message;
  EXPECT_EQ(s.tokens, 7.0);
  EXPECT_EQ(routed[0], 4.0);
}

}  // namespace
