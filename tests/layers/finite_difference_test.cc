// tests/layers/finite_difference_test.cc — the gradient checker itself: it finds exact
// derivatives of known functions and rejects gradients that are slightly wrong, so a passing
// layer test means something.
#include "tests/layers/finite_difference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

// loss(x) = sum_i w_i * sin(x_i) + x_0 * x_1, with gradient w_i cos(x_i) (+ x_1, + x_0).
struct Known {
  std::vector<float> x = {0.3f, -1.2f, 2.0f, 0.01f};
  std::vector<float> w = {1.0f, -0.5f, 2.0f, 0.25f};
  double loss() const {
    double sum = x[0] * (double)x[1];
    for (size_t i = 0; i < x.size(); i++) sum += w[i] * std::sin((double)x[i]);
    return sum;
  }
  std::vector<float> gradient() const {
    std::vector<float> g(x.size());
    for (size_t i = 0; i < x.size(); i++) g[i] = (float)(w[i] * std::cos((double)x[i]));
    g[0] += x[1];
    g[1] += x[0];
    return g;
  }
};

TEST(FiniteDifference, FindsKnownDerivatives) {
  Known k;
  const std::vector<float> before = k.x;
  std::vector<double> numeric = mp_test::central_differences(k.x.data(), k.x.size(), mp_test::kStep,
                                                             [&] { return k.loss(); });
  EXPECT_EQ(k.x, before);  // restored bit for bit
  const std::vector<float> exact = k.gradient();
  // The loss is exact in double, so only truncation remains: h^2 / 6 * |w cos x| <= 3e-6.
  for (size_t i = 0; i < exact.size(); i++) EXPECT_NEAR(numeric[i], exact[i], 1e-5) << i;
  EXPECT_TRUE(mp_test::GradientsMatch("known", exact.data(), numeric, mp_test::kFloatTolerance));
}

TEST(FiniteDifference, RejectsAGradientFivePercentOff) {
  Known k;
  std::vector<double> numeric = mp_test::central_differences(k.x.data(), k.x.size(), mp_test::kStep,
                                                             [&] { return k.loss(); });
  std::vector<float> wrong = k.gradient();
  wrong[2] *= 1.05f;
  EXPECT_FALSE(mp_test::GradientsMatch("wrong", wrong.data(), numeric, mp_test::kFloatTolerance));
}

TEST(FiniteDifference, RejectsAMissingSmallTerm) {
  // Dropping the x_0 x_1 cross term from element 1 (0.3 out of about 0.5) must be caught.
  Known k;
  std::vector<double> numeric = mp_test::central_differences(k.x.data(), k.x.size(), mp_test::kStep,
                                                             [&] { return k.loss(); });
  std::vector<float> wrong = k.gradient();
  wrong[1] -= k.x[0];
  EXPECT_FALSE(mp_test::GradientsMatch("wrong", wrong.data(), numeric, mp_test::kFloatTolerance));
}

TEST(FiniteDifference, RejectsNaNAndAllZero) {
  std::vector<double> numeric = {1.0, 2.0};
  const float nan_grad[] = {1.0f, NAN};
  EXPECT_FALSE(mp_test::GradientsMatch("nan", nan_grad, numeric, mp_test::kFloatTolerance));
  const float zeros[] = {0.0f, 0.0f};
  EXPECT_FALSE(mp_test::GradientsMatch("zero", zeros, {0.0, 0.0}, mp_test::kFloatTolerance));
}

}  // namespace
