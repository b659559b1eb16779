// tests/layers/gelu_test.cc — the tanh GELU against a double reference and its backward against
// central finite differences.
#include "layers/gelu.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::Rng;

constexpr int N = 2 * 5 * 32;  // (B, T, 4C)

TEST(Gelu, ForwardMatchesDoubleReference) {
  Rng rng(3);
  std::vector<float> inp = rng.uniform_vector(N, -4.0f, 4.0f);
  std::vector<float> out(N);
  mp_gelu_forward_cpu(out.data(), inp.data(), N);
  EXPECT_TRUE(
      mp_test::NearlyEqual("out", out.data(), mp_test::ref_gelu(mp_test::to_double(inp)), 1e-6));
}

TEST(Gelu, KnownValues) {
  // gelu(0) = 0, gelu(x) -> x for large x, -> 0 for very negative x; gelu(1) = 0.841192 (tanh form;
  // the erf form gives 0.841345, so this also tells the two apart).
  const float inp[4] = {0.0f, 1.0f, 10.0f, -10.0f};
  float out[4];
  mp_gelu_forward_cpu(out, inp, 4);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 0.8411920f, 1e-6);
  EXPECT_NEAR(out[2], 10.0f, 1e-5);
  EXPECT_NEAR(out[3], 0.0f, 1e-5);
}

TEST(Gelu, InPlaceForward) {
  Rng rng(4);
  std::vector<float> inp = rng.uniform_vector(N, -3.0f, 3.0f);
  std::vector<float> out(N), buf = inp;
  mp_gelu_forward_cpu(out.data(), inp.data(), N);
  mp_gelu_forward_cpu(buf.data(), buf.data(), N);
  EXPECT_EQ(buf, out);
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  Rng rng(5);
  std::vector<float> inp = rng.uniform_vector(N, -4.0f, 4.0f);
  std::vector<float> dout = rng.uniform_vector(N, -1.0f, 1.0f);
  std::vector<float> out(N), dinp(N, 0.0f);
  mp_gelu_backward_cpu(dinp.data(), inp.data(), dout.data(), N);
  auto loss = [&] {
    mp_gelu_forward_cpu(out.data(), inp.data(), N);
    return mp_test::weighted_sum(out.data(), dout.data(), N);
  };
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dinp", inp.data(), N, dinp.data(), loss));

  // And it adds: a second call doubles the gradient.
  std::vector<float> twice = dinp;
  mp_gelu_backward_cpu(twice.data(), inp.data(), dout.data(), N);
  for (int i = 0; i < N; i++) EXPECT_FLOAT_EQ(twice[i], 2.0f * dinp[i]) << i;
}

TEST(Gelu, EveryPositionGetsTheSameValue) {
  // The kernel takes sixteen values at a time and pads the rest: a value's result must not depend
  // on where it sits, nor on n (here 16 * 3 + 7, every value also run alone), and the padded
  // tail must match the reference like the rest.
  constexpr int kN = 55;
  Rng rng(6);
  std::vector<float> inp = rng.uniform_vector(kN, -6.0f, 6.0f);
  std::vector<float> dout = rng.uniform_vector(kN, -1.0f, 1.0f);
  std::vector<float> out(kN), dinp(kN, 0.25f);
  mp_gelu_forward_cpu(out.data(), inp.data(), kN);
  mp_gelu_backward_cpu(dinp.data(), inp.data(), dout.data(), kN);
  EXPECT_TRUE(
      mp_test::NearlyEqual("out", out.data(), mp_test::ref_gelu(mp_test::to_double(inp)), 1e-6));
  for (int i = 0; i < kN; i++) {
    float alone, dalone = 0.25f;
    mp_gelu_forward_cpu(&alone, &inp[i], 1);
    mp_gelu_backward_cpu(&dalone, &inp[i], &dout[i], 1);
    EXPECT_EQ(alone, out[i]) << i;
    EXPECT_EQ(dalone, dinp[i]) << i;
  }
}

TEST(Gelu, ExtremesStayFinite) {
  // tanh's exponential overflows to inf or underflows to 0 out here: gelu(x) -> x and 0, the
  // gradient -> 1 and 0, with no NaN (while x^3 and x^2 stay finite: the formula multiplies
  // them by sech^2 = 0).
  const float inp[6] = {60.0f, 200.0f, 1e4f, -60.0f, -200.0f, -1e4f};
  float out[6], dinp[6] = {0}, dout[6] = {1, 1, 1, 1, 1, 1};
  mp_gelu_forward_cpu(out, inp, 6);
  mp_gelu_backward_cpu(dinp, inp, dout, 6);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(out[i], inp[i]) << i;
    EXPECT_EQ(dinp[i], 1.0f) << i;
  }
  for (int i = 3; i < 6; i++) {
    EXPECT_EQ(out[i], 0.0f) << i;
    EXPECT_EQ(dinp[i], 0.0f) << i;
  }
}

}  // namespace
