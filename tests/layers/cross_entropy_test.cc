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

TEST(CrossEntropy, InPlaceBackwardIsTheBackwardOntoZeros) {
  CrossEntropy ce;
  ce.forward();
  const float dloss = 0.75f;
  std::vector<float> want(BT * Vp, 0.0f);
  mp_cross_entropy_backward_cpu(want.data(), ce.probs.data(), ce.targets.data(), dloss, B, T, V,
                                Vp);
  std::vector<float> got = ce.probs;
  for (int r = 0; r < BT; r++) {
    for (int i = V; i < Vp; i++) got[r * Vp + i] = 7.0f;  // padded columns are written to 0
  }
  mp_cross_entropy_backward_in_place_cpu(got.data(), ce.targets.data(), dloss, B, T, V, Vp);
  EXPECT_EQ(got, want);
}

TEST(CrossEntropy, ForwardInPlaceOverTheLogits) {
  CrossEntropy ce;
  const double mean = ce.forward();
  std::vector<float> buffer = ce.logits, losses(BT);
  EXPECT_EQ(mp_cross_entropy_forward_cpu(losses.data(), buffer.data(), buffer.data(),
                                         ce.targets.data(), B, T, V, Vp),
            mean);
  EXPECT_EQ(losses, ce.losses);
  EXPECT_EQ(buffer, ce.probs);
}

TEST(CrossEntropy, WideRowsMatchTheReference) {
  // Rows wider than the kernel's vectors (sixteen lanes), with a tail (V % 16 = 11), targets
  // spread over the row, and one column far above the rest: the whole-vector and tail paths of
  // the maximum, the exponentials and their sum.
  constexpr int kRows = 6, kV = 4011, kVp = 4032;
  Rng rng(43);
  std::vector<float> logits = rng.uniform_vector(kRows * kVp, -8.0f, 8.0f);
  std::vector<int32_t> targets(kRows);
  for (int r = 0; r < kRows; r++) targets[r] = (int32_t)((r * 1543 + 7) % kV);
  targets[kRows - 1] = kV - 1;
  logits[2 * kVp + 100] = 40.0f;
  logits[3 * kVp + kV - 2] = 40.0f;  // the maximum in the tail
  std::vector<float> probs(kRows * kVp), losses(kRows);
  const double mean = mp_cross_entropy_forward_cpu(losses.data(), probs.data(), logits.data(),
                                                   targets.data(), kRows, 1, kV, kVp);
  std::vector<double> want_probs;
  std::vector<double> want = mp_test::ref_cross_entropy(mp_test::to_double(logits), targets, kRows,
                                                        kV, kVp, &want_probs);
  double want_mean = 0.0;
  for (double l : want) want_mean += l / kRows;
  EXPECT_NEAR(mean, want_mean, 1e-5);
  EXPECT_TRUE(mp_test::NearlyEqual("losses", losses.data(), want, 1e-5));
  EXPECT_TRUE(mp_test::NearlyEqual("probs", probs.data(), want_probs, 1e-6));
  for (int r = 0; r < kRows; r++) {
    double sum = 0.0;
    for (int i = 0; i < kV; i++) sum += probs[r * kVp + i];
    EXPECT_NEAR(sum, 1.0, 1e-5) << r;
    for (int i = kV; i < kVp; i++) EXPECT_EQ(probs[r * kVp + i], 0.0f) << r << "," << i;
  }
}

TEST(CrossEntropy, NanLogitGivesNanLoss) {
  // The trainer stops on a non-finite loss; a NaN logit must not be hidden by the softmax.
  CrossEntropy ce;
  ce.logits[3 * Vp + 2] = NAN;
  EXPECT_TRUE(std::isnan(ce.forward()));
  EXPECT_TRUE(std::isnan(ce.losses[3]));
  EXPECT_FALSE(std::isnan(ce.losses[2]));

  // And in a row wide enough for the whole-vector paths, NaN early or late in it.
  constexpr int kV = 100, kVp = 128;
  for (int at : {0, 5, 37, 98}) {
    Rng rng(44);
    std::vector<float> logits = rng.uniform_vector(kVp, -2.0f, 2.0f), probs(kVp);
    logits[at] = NAN;
    const int32_t target = 50;
    EXPECT_TRUE(std::isnan(mp_cross_entropy_forward_cpu(nullptr, probs.data(), logits.data(),
                                                        &target, 1, 1, kV, kVp)))
        << at;
  }
}

}  // namespace
