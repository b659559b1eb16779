// tests/layers/attention_test.cc — causal multi-head attention against a double reference, its
// mask, and its backward against central finite differences, for several head splits, with
// grouped-query (kv heads < heads) and multi-query (one kv head) attention among them.
#include "layers/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::Rng;

constexpr int B = 2, T = 5;

struct Heads {
  int NH;
  int HS;
  int KVH;  // kv heads, dividing NH
};

class Attention : public ::testing::TestWithParam<Heads> {
 protected:
  int NH = GetParam().NH;
  int HS = GetParam().HS;
  int KVH = GetParam().KVH;
  int C = NH * HS;
  int W = (NH + 2 * KVH) * HS;  // a token's q, k, v
  Rng rng{static_cast<uint64_t>(100 + NH + 10 * KVH)};
  std::vector<float> inp = rng.uniform_vector(B * T * W, -1.5f, 1.5f);      // (B, T, W)
  std::vector<float> out = std::vector<float>(B * T * C);                   // (B, T, C)
  std::vector<float> preatt = std::vector<float>(B * NH * T * T);           // (B, NH, T, T)
  std::vector<float> att = std::vector<float>(B * NH * T * T);              // (B, NH, T, T)
  std::vector<float> dout = rng.uniform_vector(B * T * C, -1.0f, 1.0f);     // loss weights

  void forward() {
    mp_attention_forward_cpu(out.data(), preatt.data(), att.data(), inp.data(), B, T, NH, KVH, HS);
  }
};

TEST_P(Attention, ForwardMatchesDoubleReference) {
  forward();
  std::vector<double> want_att;
  std::vector<double> want =
      mp_test::ref_attention(mp_test::to_double(inp), B, T, NH, HS, &want_att, KVH);
  EXPECT_TRUE(mp_test::NearlyEqual("out", out.data(), want, 1e-6));
  EXPECT_TRUE(mp_test::NearlyEqual("att", att.data(), want_att, 1e-6));
}

TEST_P(Attention, PreattHoldsScaledScores) {
  forward();
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        for (int t2 = 0; t2 < T; t2++) {
          double want = 0.0;
          if (t2 <= t) {
            for (int i = 0; i < HS; i++) {
              want += (double)inp[(b * T + t) * W + h * HS + i] *
                      inp[(b * T + t2) * W + (NH + h / (NH / KVH)) * HS + i];
            }
            want /= std::sqrt((double)HS);
          }
          EXPECT_NEAR(preatt[((b * NH + h) * T + t) * T + t2], want, 1e-6);
        }
      }
    }
  }
}

TEST_P(Attention, IsCausal) {
  forward();
  // Rows are probabilities over t2 <= t and exactly 0 above the diagonal.
  for (int row = 0; row < B * NH * T; row++) {
    const int t = row % T;
    double sum = 0.0;
    for (int t2 = 0; t2 < T; t2++) {
      const float a = att[row * T + t2];
      if (t2 > t) {
        EXPECT_EQ(a, 0.0f) << "row " << row << " key " << t2;
      }
      sum += a;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
  // Changing the last token's q, k, v changes no earlier token's output.
  std::vector<float> before = out;
  for (int b = 0; b < B; b++) {
    for (int i = 0; i < W; i++) inp[(b * T + T - 1) * W + i] += 0.5f;
  }
  forward();
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T - 1; t++) {
      for (int i = 0; i < C; i++) {
        const int at = (b * T + t) * C + i;
        EXPECT_EQ(out[at], before[at]) << "b " << b << " t " << t << " i " << i;
      }
    }
    bool last_changed = false;
    for (int i = 0; i < C; i++) {
      const int at = (b * T + T - 1) * C + i;
      last_changed |= out[at] != before[at];
    }
    EXPECT_TRUE(last_changed) << "b " << b;
  }
}

TEST_P(Attention, PreattMayBeNull) {
  forward();
  std::vector<float> out2(out.size()), att2(att.size());
  mp_attention_forward_cpu(out2.data(), nullptr, att2.data(), inp.data(), B, T, NH, KVH, HS);
  EXPECT_EQ(out2, out);
  EXPECT_EQ(att2, att);
}

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  forward();
  std::vector<float> dinp(inp.size(), 0.0f);
  // The scratch is overwritten, so garbage in it must not matter.
  std::vector<float> dpreatt(att.size(), 7.0f), datt(att.size(), -3.0f);
  mp_attention_backward_cpu(dinp.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(),
                            att.data(), B, T, NH, KVH, HS);
  auto loss = [&] {
    forward();
    return mp_test::weighted_sum(out.data(), dout.data(), out.size());
  };
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dinp (q, k, v)", inp.data(), inp.size(),
                                                        dinp.data(), loss));
}

TEST_P(Attention, BackwardAddsIntoDinp) {
  forward();
  std::vector<float> dpreatt(att.size()), datt(att.size());
  std::vector<float> dinp(inp.size(), 0.0f);
  mp_attention_backward_cpu(dinp.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(),
                            att.data(), B, T, NH, KVH, HS);
  std::vector<float> dinp2(inp.size(), 0.25f);
  mp_attention_backward_cpu(dinp2.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(),
                            att.data(), B, T, NH, KVH, HS);
  for (size_t i = 0; i < dinp.size(); i++) EXPECT_NEAR(dinp2[i], 0.25f + dinp[i], 1e-6) << i;
}

INSTANTIATE_TEST_SUITE_P(HeadSplits, Attention,
                         ::testing::Values(Heads{2, 4, 2}, Heads{1, 8, 1}, Heads{3, 2, 3},
                                           Heads{4, 4, 2}, Heads{6, 2, 3}, Heads{4, 2, 1}),
                         [](const ::testing::TestParamInfo<Heads> &info) {
                           return "NH" + std::to_string(info.param.NH) + "_HS" +
                                  std::to_string(info.param.HS) + "_KV" +
                                  std::to_string(info.param.KVH);
                         });

}  // namespace
