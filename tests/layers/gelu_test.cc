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

}  // namespace
