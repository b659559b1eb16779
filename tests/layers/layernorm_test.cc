// tests/layers/layernorm_test.cc — layernorm against a double reference and its backward against
// central finite differences.
#include "layers/layernorm.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::GradientMatchesFiniteDifferences;
using mp_test::NearlyEqual;
using mp_test::Rng;
using mp_test::to_double;

constexpr int B = 2, T = 5, C = 8;
constexpr int BT = B * T;

struct Layernorm {
  Rng rng{11};
  std::vector<float> inp = rng.uniform_vector(BT * C, -1.0f, 1.0f);   // (B, T, C)
  std::vector<float> weight = rng.uniform_vector(C, 0.5f, 1.5f);      // (C)
  std::vector<float> bias = rng.uniform_vector(C, -0.5f, 0.5f);       // (C)
  std::vector<float> out = std::vector<float>(BT * C);                // (B, T, C)
  std::vector<float> mean = std::vector<float>(BT);                   // (B, T)
  std::vector<float> rstd = std::vector<float>(BT);                   // (B, T)
  std::vector<float> dout = rng.uniform_vector(BT * C, -1.0f, 1.0f);  // loss weights

  void forward() {
    mp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                             bias.data(), B, T, C);
  }
};

TEST(Layernorm, ForwardMatchesDoubleReference) {
  Layernorm l;
  l.forward();
  std::vector<double> mean, rstd;
  std::vector<double> want = mp_test::ref_layernorm(to_double(l.inp), to_double(l.weight),
                                                    to_double(l.bias), BT, C, 1e-5, &mean, &rstd);
  EXPECT_TRUE(NearlyEqual("out", l.out.data(), want, 1e-5));
  EXPECT_TRUE(NearlyEqual("mean", l.mean.data(), mean, 1e-6));
  EXPECT_TRUE(NearlyEqual("rstd", l.rstd.data(), rstd, 1e-5));
}

TEST(Layernorm, OutputRowsHaveMeanBiasAndScale) {
  // With weight 1 and bias 0 each row has mean 0 and (biased) variance 1 / (1 + eps / var).
  Layernorm l;
  l.weight.assign(C, 1.0f);
  l.bias.assign(C, 0.0f);
  l.forward();
  for (int r = 0; r < BT; r++) {
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < C; i++) {
      sum += l.out[r * C + i];
      sq += (double)l.out[r * C + i] * l.out[r * C + i];
    }
    EXPECT_NEAR(sum / C, 0.0, 1e-6) << "row " << r;
    EXPECT_NEAR(sq / C, 1.0, 1e-3) << "row " << r;
  }
}

TEST(Layernorm, BackwardMatchesFiniteDifferences) {
  Layernorm l;
  l.forward();
  std::vector<float> dinp(BT * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  mp_layernorm_backward_cpu(dinp.data(), dweight.data(), dbias.data(), l.dout.data(), l.inp.data(),
                            l.weight.data(), l.mean.data(), l.rstd.data(), B, T, C);
  auto loss = [&] {
    l.forward();
    return mp_test::weighted_sum(l.out.data(), l.dout.data(), l.out.size());
  };
  EXPECT_TRUE(
      GradientMatchesFiniteDifferences("dinp", l.inp.data(), l.inp.size(), dinp.data(), loss));
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dweight", l.weight.data(), l.weight.size(),
                                               dweight.data(), loss));
  EXPECT_TRUE(
      GradientMatchesFiniteDifferences("dbias", l.bias.data(), l.bias.size(), dbias.data(), loss));
}

TEST(Layernorm, BackwardAddsIntoGradients) {
  Layernorm l;
  l.forward();
  std::vector<float> dinp(BT * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
  mp_layernorm_backward_cpu(dinp.data(), dweight.data(), dbias.data(), l.dout.data(), l.inp.data(),
                            l.weight.data(), l.mean.data(), l.rstd.data(), B, T, C);
  std::vector<float> dinp2(BT * C, 1.0f), dweight2(C, 1.0f), dbias2(C, 1.0f);
  mp_layernorm_backward_cpu(dinp2.data(), dweight2.data(), dbias2.data(), l.dout.data(),
                            l.inp.data(), l.weight.data(), l.mean.data(), l.rstd.data(), B, T, C);
  // dinp gets one addition per element; dweight and dbias sum over rows, so round-off differs.
  for (int i = 0; i < BT * C; i++) EXPECT_EQ(dinp2[i], 1.0f + dinp[i]) << i;
  for (int i = 0; i < C; i++) EXPECT_NEAR(dweight2[i], 1.0f + dweight[i], 1e-6) << i;
  for (int i = 0; i < C; i++) EXPECT_NEAR(dbias2[i], 1.0f + dbias[i], 1e-6) << i;
}

TEST(Layernorm, RowsOfEveryWidthMatch) {
  // The kernels take eight channels at a time (four in the last pass); widths with 4, 1..7 and 0
  // channels left over, checked against the reference forward and finite differences.
  for (int c : {3, 12, 13, 36, 768}) {
    Rng rng(12 + c);
    std::vector<float> inp = rng.uniform_vector(BT * c, -1.0f, 1.0f);
    std::vector<float> weight = rng.uniform_vector(c, 0.5f, 1.5f);
    std::vector<float> bias = rng.uniform_vector(c, -0.5f, 0.5f);
    std::vector<float> dout = rng.uniform_vector(BT * c, -1.0f, 1.0f);
    std::vector<float> out(BT * c), mean(BT), rstd(BT);
    auto forward = [&] {
      mp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                               bias.data(), B, T, c);
    };
    forward();
    std::vector<double> want_mean, want_rstd;
    std::vector<double> want = mp_test::ref_layernorm(to_double(inp), to_double(weight),
                                                      to_double(bias), BT, c, 1e-5, &want_mean,
                                                      &want_rstd);
    EXPECT_TRUE(NearlyEqual("out", out.data(), want, 1e-5)) << "C = " << c;
    EXPECT_TRUE(NearlyEqual("mean", mean.data(), want_mean, 1e-6)) << "C = " << c;
    EXPECT_TRUE(NearlyEqual("rstd", rstd.data(), want_rstd, 1e-5)) << "C = " << c;
    if (c > 40) continue;  // finite differences on the narrow rows only
    std::vector<float> dinp(BT * c, 0.0f), dweight(c, 0.0f), dbias(c, 0.0f);
    mp_layernorm_backward_cpu(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                              weight.data(), mean.data(), rstd.data(), B, T, c);
    auto loss = [&] {
      forward();
      return mp_test::weighted_sum(out.data(), dout.data(), out.size());
    };
    EXPECT_TRUE(GradientMatchesFiniteDifferences("dinp", inp.data(), inp.size(), dinp.data(), loss))
        << "C = " << c;
    EXPECT_TRUE(GradientMatchesFiniteDifferences("dweight", weight.data(), weight.size(),
                                                 dweight.data(), loss))
        << "C = " << c;
    EXPECT_TRUE(
        GradientMatchesFiniteDifferences("dbias", bias.data(), bias.size(), dbias.data(), loss))
        << "C = " << c;
  }
}

}  // namespace
