// tests/layers/attention_test.cc — causal multi-head attention against a double reference, its
// mask, and its backward against central finite differences, for several head splits, with
// grouped-query (kv heads < heads) and multi-query (one kv head) attention among them; and the
// context-parallel form: each cp rank's queries at their global positions against the gathered
// keys give the whole sequence's outputs at those positions, and its gradients sum to the whole's.
#include "layers/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "context_parallel/sequence_split.h"
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

// Context parallelism: the sequence (T = 8) cut into 2 cp chunks, rank r holding chunks r and
// 2cp-1-r. Every rank's outputs are the double reference's rows at its positions; its query
// gradients are the whole backward's rows there, and the ranks' key/value gradients, summed, are
// the whole backward's (itself checked against finite differences above).
struct CpCase {
  Heads heads;
  int cp;
};

class ContextParallelAttention : public ::testing::TestWithParam<CpCase> {};

TEST_P(ContextParallelAttention, RanksTogetherAreTheWholeSequence) {
  constexpr int kT = 8;
  const int NH = GetParam().heads.NH, HS = GetParam().heads.HS, KVH = GetParam().heads.KVH;
  const int cp = GetParam().cp, Tl = kT / cp, C = NH * HS, W = (NH + 2 * KVH) * HS;
  const int KV = 2 * KVH * HS;
  Rng rng{static_cast<uint64_t>(7 + NH + 10 * KVH + 100 * cp)};
  std::vector<float> inp = rng.uniform_vector(B * kT * W, -1.5f, 1.5f);
  std::vector<float> dout = rng.uniform_vector(B * kT * C, -1.0f, 1.0f);
  std::vector<double> want = mp_test::ref_attention(mp_test::to_double(inp), B, kT, NH, HS,
                                                    nullptr, KVH);
  // The whole sequence's backward.
  std::vector<float> out(B * kT * C), att(B * NH * kT * kT);
  mp_attention_forward_cpu(out.data(), nullptr, att.data(), inp.data(), B, kT, NH, KVH, HS);
  std::vector<float> dpreatt(att.size()), datt(att.size()), dinp(inp.size(), 0.0f);
  mp_attention_backward_cpu(dinp.data(), dpreatt.data(), datt.data(), dout.data(), inp.data(),
                            att.data(), B, kT, NH, KVH, HS);
  // The gathered keys and values (B, T, k | v), as context_parallel/kv_exchange.h lays them.
  std::vector<float> kv(B * kT * KV);
  for (int i = 0; i < B * kT; ++i) {
    std::copy(inp.begin() + i * W + NH * HS, inp.begin() + (i + 1) * W, kv.begin() + i * KV);
  }
  std::vector<float> dkv_sum(kv.size(), 0.0f);
  int compared = 0;
  for (int r = 0; r < cp; ++r) {
    std::vector<int32_t> positions(Tl);
    mp_cp_positions(positions.data(), kT, cp, r);
    std::vector<float> qkv_local(B * Tl * W), dout_local(B * Tl * C);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const int whole = b * kT + positions[t], local = b * Tl + t;
        std::copy(inp.begin() + whole * W, inp.begin() + (whole + 1) * W,
                  qkv_local.begin() + local * W);
        std::copy(dout.begin() + whole * C, dout.begin() + (whole + 1) * C,
                  dout_local.begin() + local * C);
      }
    }
    std::vector<float> out_local(B * Tl * C), att_local(B * NH * Tl * kT);
    mp_attention_forward_at_cpu(out_local.data(), nullptr, att_local.data(), qkv_local.data(),
                                kv.data(), positions.data(), B, Tl, kT, NH, KVH, HS);
    std::vector<float> scratch1(att_local.size()), scratch2(att_local.size());
    std::vector<float> dqkv_local(qkv_local.size(), 0.0f), dkv(kv.size(), 0.0f);
    mp_attention_backward_at_cpu(dqkv_local.data(), dkv.data(), scratch1.data(), scratch2.data(),
                                 dout_local.data(), qkv_local.data(), kv.data(), att_local.data(),
                                 positions.data(), B, Tl, kT, NH, KVH, HS);
    for (size_t i = 0; i < dkv.size(); ++i) dkv_sum[i] += dkv[i];
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const int whole = b * kT + positions[t], local = b * Tl + t;
        for (int c = 0; c < C; ++c) {
          ASSERT_NEAR(out_local[local * C + c], want[whole * C + c], 1e-6)
              << "rank " << r << " token " << positions[t];
        }
        for (int c = 0; c < NH * HS; ++c) {  // the queries' gradient
          ASSERT_NEAR(dqkv_local[local * W + c], dinp[whole * W + c], 1e-5)
              << "rank " << r << " dq of token " << positions[t];
        }
        for (int c = NH * HS; c < W; ++c) {  // its keys and values are left to the exchange
          ASSERT_EQ(dqkv_local[local * W + c], 0.0f);
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, B * kT);  // every token on exactly one rank
  for (int i = 0; i < B * kT; ++i) {
    for (int c = 0; c < KV; ++c) {
      ASSERT_NEAR(dkv_sum[i * KV + c], dinp[i * W + NH * HS + c], 1e-5) << "token " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpSizes, ContextParallelAttention,
                         ::testing::Values(CpCase{{2, 4, 2}, 2}, CpCase{{2, 4, 2}, 4},
                                           CpCase{{4, 4, 2}, 2}, CpCase{{4, 2, 1}, 4},
                                           CpCase{{6, 2, 3}, 2}),
                         [](const ::testing::TestParamInfo<CpCase> &info) {
                           return "NH" + std::to_string(info.param.heads.NH) + "_KV" +
                                  std::to_string(info.param.heads.KVH) + "_cp" +
                                  std::to_string(info.param.cp);
                         });

}  // namespace
