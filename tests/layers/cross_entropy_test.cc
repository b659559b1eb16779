// tests/layers/cross_entropy_test.cc — fused softmax + cross-entropy: the loss is -mean(log
// softmax) over the real vocabulary, padded columns take no part, and the backward of the mean
// matches central finite differences.
#include "layers/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::Rng;

constexpr int B = 2, T = 5, V = 11, Vp = 16;
constexpr int BT = B * T;

struct CrossEntropy {
  Rng rng{41};
  std::vector<float> logits = rng.uniform_vector(BT * Vp, -2.0f, 2.0f);  // (B, T, Vp)
  std::vector<int32_t> targets = std::vector<int32_t>(BT);               // (B, T)
  std::vector<float> losses = std::vector<float>(BT);                    // (B, T)
  std::vector<float> probs = std::vector<float>(BT * Vp);                // (B, T, Vp)

  CrossEntropy() {
    for (int &t : targets) t = rng.below(V);
    targets[BT - 1] = V - 1;  // the last real column is a target too
  }
  double forward() {
    return mp_cross_entropy_forward_cpu(losses.data(), probs.data(), logits.data(), targets.data(),
                                        B, T, V, Vp);
  }
};

TEST(CrossEntropy, LossIsMinusMeanLogSoftmax) {
  CrossEntropy ce;
  const double mean = ce.forward();
  std::vector<double> want_probs;
  std::vector<double> want =
      mp_test::ref_cross_entropy(mp_test::to_double(ce.logits), ce.targets, BT, V, Vp, &want_probs);
  double want_mean = 0.0;
  for (double l : want) want_mean += l;
  want_mean /= BT;
  EXPECT_NEAR(mean, want_mean, 1e-6);
  EXPECT_GT(mean, 1.0);  // near log(11) = 2.4 for these logits: not a vacuous zero
  EXPECT_TRUE(mp_test::NearlyEqual("losses", ce.losses.data(), want, 1e-6));
  EXPECT_TRUE(mp_test::NearlyEqual("probs", ce.probs.data(), want_probs, 1e-6));
  for (int r = 0; r < BT; r++) {
    for (int i = V; i < Vp; i++) EXPECT_EQ(ce.probs[r * Vp + i], 0.0f) << r << "," << i;
  }
}

TEST(CrossEntropy, PaddedLogitsAreIgnored) {
  CrossEntropy ce;
  const double mean = ce.forward();
  std::vector<float> losses = ce.losses, probs = ce.probs;
  for (int r = 0; r < BT; r++) {
    for (int i = V; i < Vp; i++) ce.logits[r * Vp + i] = 1000.0f;  // would dominate a softmax
  }
  EXPECT_EQ(ce.forward(), mean);
  EXPECT_EQ(ce.losses, losses);
  EXPECT_EQ(ce.probs, probs);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  CrossEntropy ce;
  for (float &x : ce.logits) x *= 500.0f;  // up to 1000: exp overflows, probabilities round to 0
  const double mean = ce.forward();
  EXPECT_TRUE(std::isfinite(mean));
  for (int r = 0; r < BT; r++) {
    // log-sum-exp with the maximum taken out, in double.
    double maxval = -INFINITY;
    for (int i = 0; i < V; i++) maxval = std::fmax(maxval, ce.logits[r * Vp + i]);
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += std::exp(ce.logits[r * Vp + i] - maxval);
    const double want = std::log(sum) + maxval - ce.logits[r * Vp + ce.targets[r]];
    EXPECT_NEAR(ce.losses[r], want, 1e-5 * (1.0 + want)) << r;
  }
}

TEST(CrossEntropy, BackwardIsProbsMinusOneHotOverTokens) {
  CrossEntropy ce;
  ce.forward();
  const float dloss = 0.75f;
  std::vector<float> dlogits(BT * Vp, 0.0f);
  mp_cross_entropy_backward_cpu(dlogits.data(), ce.probs.data(), ce.targets.data(), dloss, B, T, V,
                                Vp);
  for (int r = 0; r < BT; r++) {
    for (int i = 0; i < Vp; i++) {
      const double want =
          i < V ? (ce.probs[r * Vp + i] - (i == ce.targets[r] ? 1.0 : 0.0)) * dloss / BT : 0.0;
      EXPECT_NEAR(dlogits[r * Vp + i], want, 1e-7) << r << "," << i;
    }
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  CrossEntropy ce;
  ce.forward();
  const float dloss = 0.75f;
  // Start the gradient from a sentinel: padded columns must keep it exactly (gradient 0), real
  // columns must add to it.
  const float sentinel = 0.5f;
  std::vector<float> dlogits(BT * Vp, sentinel);
  mp_cross_entropy_backward_cpu(dlogits.data(), ce.probs.data(), ce.targets.data(), dloss, B, T, V,
                                Vp);
  for (int r = 0; r < BT; r++) {
    for (int i = V; i < Vp; i++) EXPECT_EQ(dlogits[r * Vp + i], sentinel) << r << "," << i;
  }
  for (float &g : dlogits) g -= sentinel;
  auto loss = [&] { return dloss * ce.forward(); };
  std::vector<double> numeric =
      mp_test::central_differences(ce.logits.data(), ce.logits.size(), mp_test::kStep, loss);
  EXPECT_TRUE(
      mp_test::GradientsMatch("dlogits", dlogits.data(), numeric, mp_test::kFloatTolerance));
  for (int r = 0; r < BT; r++) {
    for (int i = V; i < Vp; i++) EXPECT_EQ(numeric[r * Vp + i], 0.0) << r << "," << i;
  }
}

}  // namespace
