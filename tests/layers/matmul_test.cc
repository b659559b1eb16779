// tests/layers/matmul_test.cc — the linear layer against a double reference and its backward
// against central finite differences.
#include "layers/matmul.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::GradientMatchesFiniteDifferences;
using mp_test::NearlyEqual;
using mp_test::Rng;
using mp_test::to_double;

constexpr int B = 2, T = 5, C = 8, OC = 24;  // OC = 3C, the qkv projection
constexpr int BT = B * T;

struct Matmul {
  Rng rng{7};
  std::vector<float> inp = rng.uniform_vector(BT * C, -1.0f, 1.0f);     // (BT, C)
  std::vector<float> weight = rng.uniform_vector(OC * C, -1.0f, 1.0f);  // (OC, C)
  std::vector<float> bias = rng.uniform_vector(OC, -1.0f, 1.0f);        // (OC)
  std::vector<float> out = std::vector<float>(BT * OC);                 // (BT, OC)
  std::vector<float> dout = rng.uniform_vector(BT * OC, -1.0f, 1.0f);   // loss weights
};

TEST(Matmul, ForwardMatchesDoubleReference) {
  Matmul m;
  mp_matmul_forward_cpu(m.out.data(), m.inp.data(), m.weight.data(), m.bias.data(), BT, C, OC);
  EXPECT_TRUE(NearlyEqual(
      "out", m.out.data(),
      mp_test::ref_matmul(to_double(m.inp), to_double(m.weight), to_double(m.bias), BT, C, OC),
      1e-6));
}

TEST(Matmul, ForwardWithoutBias) {
  Matmul m;
  m.out.assign(m.out.size(), 123.0f);  // garbage that must not survive
  mp_matmul_forward_cpu(m.out.data(), m.inp.data(), m.weight.data(), nullptr, BT, C, OC);
  EXPECT_TRUE(NearlyEqual("out", m.out.data(),
                          mp_test::ref_matmul(to_double(m.inp), to_double(m.weight), {}, BT, C, OC),
                          1e-6));
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  Matmul m;
  std::vector<float> dinp(BT * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
  mp_matmul_forward_cpu(m.out.data(), m.inp.data(), m.weight.data(), m.bias.data(), BT, C, OC);
  mp_matmul_backward_cpu(dinp.data(), dweight.data(), dbias.data(), m.dout.data(), m.inp.data(),
                         m.weight.data(), BT, C, OC);
  auto loss = [&] {
    mp_matmul_forward_cpu(m.out.data(), m.inp.data(), m.weight.data(), m.bias.data(), BT, C, OC);
    return mp_test::weighted_sum(m.out.data(), m.dout.data(), m.out.size());
  };
  EXPECT_TRUE(
      GradientMatchesFiniteDifferences("dinp", m.inp.data(), m.inp.size(), dinp.data(), loss));
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dweight", m.weight.data(), m.weight.size(),
                                               dweight.data(), loss));
  EXPECT_TRUE(
      GradientMatchesFiniteDifferences("dbias", m.bias.data(), m.bias.size(), dbias.data(), loss));
}

TEST(Matmul, BackwardAddsIntoGradients) {
  Matmul m;
  std::vector<float> dinp(BT * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
  mp_matmul_backward_cpu(dinp.data(), dweight.data(), dbias.data(), m.dout.data(), m.inp.data(),
                         m.weight.data(), BT, C, OC);
  // A second micro-batch onto gradients that already hold something.
  Rng rng(99);
  std::vector<float> dinp0 = rng.uniform_vector(BT * C, -1.0f, 1.0f);
  std::vector<float> dweight0 = rng.uniform_vector(OC * C, -1.0f, 1.0f);
  std::vector<float> dbias0 = rng.uniform_vector(OC, -1.0f, 1.0f);
  std::vector<float> dinp2 = dinp0, dweight2 = dweight0, dbias2 = dbias0;
  mp_matmul_backward_cpu(dinp2.data(), dweight2.data(), dbias2.data(), m.dout.data(), m.inp.data(),
                         m.weight.data(), BT, C, OC);
  std::vector<double> want_dinp(BT * C), want_dweight(OC * C), want_dbias(OC);
  for (size_t i = 0; i < want_dinp.size(); i++) want_dinp[i] = (double)dinp0[i] + dinp[i];
  for (size_t i = 0; i < want_dweight.size(); i++)
    want_dweight[i] = (double)dweight0[i] + dweight[i];
  for (size_t i = 0; i < want_dbias.size(); i++) want_dbias[i] = (double)dbias0[i] + dbias[i];
  EXPECT_TRUE(NearlyEqual("dinp", dinp2.data(), want_dinp, 1e-6));
  EXPECT_TRUE(NearlyEqual("dweight", dweight2.data(), want_dweight, 1e-6));
  EXPECT_TRUE(NearlyEqual("dbias", dbias2.data(), want_dbias, 1e-6));
}

TEST(Matmul, NullGradientsAreSkipped) {
  Matmul m;
  std::vector<float> dinp(BT * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
  mp_matmul_backward_cpu(dinp.data(), dweight.data(), dbias.data(), m.dout.data(), m.inp.data(),
                         m.weight.data(), BT, C, OC);
  // Backward-input alone, then backward-weight alone (zero-bubble's split), give the same numbers.
  std::vector<float> dinp_only(BT * C, 0.0f), dweight_only(OC * C, 0.0f), dbias_only(OC, 0.0f);
  mp_matmul_backward_cpu(dinp_only.data(), nullptr, nullptr, m.dout.data(), nullptr,
                         m.weight.data(), BT, C, OC);
  mp_matmul_backward_cpu(nullptr, dweight_only.data(), dbias_only.data(), m.dout.data(),
                         m.inp.data(), nullptr, BT, C, OC);
  EXPECT_EQ(dinp_only, dinp);
  EXPECT_EQ(dweight_only, dweight);
  EXPECT_EQ(dbias_only, dbias);
}

}  // namespace
