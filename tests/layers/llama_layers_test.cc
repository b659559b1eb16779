// tests/layers/llama_layers_test.cc — the Llama family's layers (RMSNorm, SwiGLU, rotary
// embeddings) against double references, their backwards against central finite differences,
// and the frequencies against Hugging Face's published formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"
#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::GradientMatchesFiniteDifferences;
using mp_test::NearlyEqual;
using mp_test::Rng;
using mp_test::to_double;
using mp_test::weighted_sum;
using fvec = std::vector<float>;

constexpr int kRows = 7;

// ---- RMSNorm ----

TEST(Rmsnorm, ForwardMatchesDoubleReferenceOnEveryWidth) {
  for (int C : {1, 8, 13, 64}) {
    Rng rng(40 + C);
    const fvec inp = rng.uniform_vector(kRows * C, -2.0f, 2.0f);
    const fvec weight = rng.uniform_vector(C, 0.5f, 1.5f);
    fvec out(kRows * C), rstd(kRows);
    mp_rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), kRows, C, 1e-5f);
    EXPECT_TRUE(NearlyEqual("out", out.data(),
                            mp_test::ref_rmsnorm(to_double(inp), to_double(weight), kRows, C, 1e-5),
                            1e-5))
        << "C " << C;
  }
}

TEST(Rmsnorm, EpsilonMatters) {
  // A row of tiny values: eps dominates mean(x^2), so 1e-5 and 1e-6 give different outputs.
  const int C = 4;
  const fvec inp = {1e-3f, -1e-3f, 2e-3f, 0.0f}, weight(C, 1.0f);
  fvec a(C), b(C);
  mp_rmsnorm_forward_cpu(a.data(), nullptr, inp.data(), weight.data(), 1, C, 1e-5f);
  mp_rmsnorm_forward_cpu(b.data(), nullptr, inp.data(), weight.data(), 1, C, 1e-6f);
  EXPECT_TRUE(NearlyEqual("eps 1e-6", b.data(),
                          mp_test::ref_rmsnorm(to_double(inp), to_double(weight), 1, C, 1e-6),
                          1e-5));
  EXPECT_GT(std::fabs(b[2]), 1.5f * std::fabs(a[2]));
}

TEST(Rmsnorm, BackwardMatchesFiniteDifferencesAndAdds) {
  const int C = 12;
  Rng rng(45);
  fvec inp = rng.uniform_vector(kRows * C, -2.0f, 2.0f), weight = rng.uniform_vector(C, 0.5f, 1.5f);
  const fvec dout = rng.uniform_vector(kRows * C, -1.0f, 1.0f);
  fvec out(kRows * C), rstd(kRows);
  auto forward = [&] {
    mp_rmsnorm_forward_cpu(out.data(), rstd.data(), inp.data(), weight.data(), kRows, C, 1e-5f);
    return weighted_sum(out.data(), dout.data(), out.size());
  };
  forward();
  fvec dinp(inp.size(), 0.0f), dweight(C, 0.0f);
  mp_rmsnorm_backward_cpu(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                          rstd.data(), kRows, C);
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dinp", inp.data(), inp.size(), dinp.data(), forward));
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dweight", weight.data(), weight.size(),
                                               dweight.data(), forward));
  fvec dinp2(inp.size(), 0.5f), dweight2(C, 0.5f);
  forward();
  mp_rmsnorm_backward_cpu(dinp2.data(), dweight2.data(), dout.data(), inp.data(), weight.data(),
                          rstd.data(), kRows, C);
  for (size_t i = 0; i < dinp.size(); i++) EXPECT_FLOAT_EQ(dinp2[i], 0.5f + dinp[i]) << i;
  for (int i = 0; i < C; i++) EXPECT_NEAR(dweight2[i], 0.5f + dweight[i], 1e-5) << i;
}

// ---- SwiGLU ----

TEST(Swiglu, ForwardMatchesDoubleReference) {
  const int F = 9;
  Rng rng(50);
  const fvec inp = rng.uniform_vector(kRows * 2 * F, -4.0f, 4.0f);
  fvec out(kRows * F);
  mp_swiglu_forward_cpu(out.data(), inp.data(), kRows, F);
  EXPECT_TRUE(NearlyEqual("out", out.data(), mp_test::ref_swiglu(to_double(inp), kRows, F), 1e-6));
}

TEST(Swiglu, GateHalfComesFirst) {
  // gate 0 gives silu 0 whatever up holds; up 0 gives 0 whatever the gate.
  const fvec inp = {0.0f, 3.0f, /* up */ 5.0f, 0.0f};
  fvec out(2);
  mp_swiglu_forward_cpu(out.data(), inp.data(), 1, 2);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(Swiglu, BackwardMatchesFiniteDifferencesAndAdds) {
  const int F = 6;
  Rng rng(51);
  fvec inp = rng.uniform_vector(kRows * 2 * F, -3.0f, 3.0f);
  const fvec dout = rng.uniform_vector(kRows * F, -1.0f, 1.0f);
  fvec out(kRows * F);
  auto forward = [&] {
    mp_swiglu_forward_cpu(out.data(), inp.data(), kRows, F);
    return weighted_sum(out.data(), dout.data(), out.size());
  };
  fvec dinp(inp.size(), 0.0f);
  mp_swiglu_backward_cpu(dinp.data(), inp.data(), dout.data(), kRows, F);
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dinp (gate, up)", inp.data(), inp.size(),
                                               dinp.data(), forward));
  fvec dinp2(inp.size(), -1.0f);
  mp_swiglu_backward_cpu(dinp2.data(), inp.data(), dout.data(), kRows, F);
  for (size_t i = 0; i < dinp.size(); i++) EXPECT_FLOAT_EQ(dinp2[i], -1.0f + dinp[i]) << i;
}

// ---- rotary embeddings ----

TEST(Rope, FrequenciesAreHuggingFacesWithoutScaling) {
  const mp_rope_spec spec = {10000.0, false, 0, 0, 0, 0};
  fvec inv_freq(4);
  mp_rope_inv_freq(inv_freq.data(), 8, &spec);
  for (int i = 0; i < 4; i++) {
    EXPECT_FLOAT_EQ(inv_freq[i], (float)(1.0 / std::pow(10000.0, 2.0 * i / 8.0))) << i;
  }
}

TEST(Rope, Llama3ScalingKeepsHighDividesLowAndBlendsBetween) {
  // Llama 3.1 8B's rope_scaling: factor 8, low 1, high 4, original 8192; theta 500000, HS 128.
  const mp_rope_spec plain = {500000.0, false, 0, 0, 0, 0};
  const mp_rope_spec scaled = {500000.0, true, 8.0, 1.0, 4.0, 8192.0};
  fvec base(64), inv(64);
  mp_rope_inv_freq(base.data(), 128, &plain);
  mp_rope_inv_freq(inv.data(), 128, &scaled);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; i++) {
    const double wavelen = 2 * M_PI / base[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_EQ(inv[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(inv[i], base[i] / 8.0f) << i;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(inv[i], (1 - smooth) * base[i] / 8.0 + smooth * base[i], 1e-6 * base[i]) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, ForwardMatchesDoubleReferenceAndLeavesTheRestOfTheRow) {
  // Two q heads and one k head of HS 8 in rows of width 40 (4 heads): rotate the first two only.
  const int B = 2, T = 6, HS = 8, stride = 40;
  const mp_rope_spec spec = {10000.0, false, 0, 0, 0, 0};
  fvec inv_freq(HS / 2);
  mp_rope_inv_freq(inv_freq.data(), HS, &spec);
  Rng rng(60);
  fvec x = rng.uniform_vector(B * T * stride, -1.0f, 1.0f);
  const fvec before = x;
  mp_rope_forward_cpu(x.data(), inv_freq.data(), B, T, 2, HS, stride);
  EXPECT_TRUE(NearlyEqual("rotated", x.data(),
                          mp_test::ref_rope(to_double(before), to_double(inv_freq), B, T, 2, HS,
                                            stride),
                          1e-6));
  for (int row = 0; row < B * T; row++) {
    for (int i = 2 * HS; i < stride; i++) EXPECT_EQ(x[row * stride + i], before[row * stride + i]);
  }
  // Position 0 does not turn.
  for (int i = 0; i < 2 * HS; i++) EXPECT_EQ(x[i], before[i]);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int B = 1, T = 5, HS = 6, stride = 12;
  const mp_rope_spec spec = {500000.0, true, 8.0, 1.0, 4.0, 4.0};
  fvec inv_freq(HS / 2);
  mp_rope_inv_freq(inv_freq.data(), HS, &spec);
  Rng rng(61);
  fvec x = rng.uniform_vector(B * T * stride, -1.0f, 1.0f);
  const fvec dout = rng.uniform_vector(x.size(), -1.0f, 1.0f);
  auto loss = [&] {
    fvec y = x;
    mp_rope_forward_cpu(y.data(), inv_freq.data(), B, T, 2, HS, stride);
    return weighted_sum(y.data(), dout.data(), y.size());
  };
  fvec dx = dout;
  mp_rope_backward_cpu(dx.data(), inv_freq.data(), B, T, 2, HS, stride);
  EXPECT_TRUE(GradientMatchesFiniteDifferences("dx", x.data(), x.size(), dx.data(), loss));
}

}  // namespace
