// tests/layers/embedding_test.cc — token plus position embedding against a double reference, its
// backward against central finite differences (with repeated tokens), and the token check.
#include "layers/embedding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::Rng;

constexpr int B = 2, T = 5, C = 8, V = 11, maxT = 7;

struct Embedding {
  Rng rng{31};
  // Token 3 appears three times, so its row of dwte must gather three contributions.
  std::vector<int32_t> tokens = {3, 0, 10, 3, 5, 7, 3, 1, 9, 2};         // (B, T)
  std::vector<float> wte = rng.uniform_vector(V * C, -1.0f, 1.0f);       // (V, C)
  std::vector<float> wpe = rng.uniform_vector(maxT * C, -1.0f, 1.0f);    // (maxT, C)
  std::vector<float> out = std::vector<float>(B * T * C);                // (B, T, C)
  std::vector<float> dout = rng.uniform_vector(B * T * C, -1.0f, 1.0f);  // loss weights

  void forward() {
    mp_embedding_forward_cpu(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  }
};

TEST(Embedding, ForwardMatchesDoubleReference) {
  Embedding e;
  e.forward();
  EXPECT_TRUE(mp_test::NearlyEqual("out", e.out.data(),
                                   mp_test::ref_embedding(e.tokens, mp_test::to_double(e.wte),
                                                          mp_test::to_double(e.wpe), B, T, C),
                                   1e-7));
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Embedding e;
  std::vector<float> dwte(V * C, 0.0f), dwpe(maxT * C, 0.0f);
  mp_embedding_backward_cpu(dwte.data(), dwpe.data(), e.dout.data(), e.tokens.data(), B, T, C);
  auto loss = [&] {
    e.forward();
    return mp_test::weighted_sum(e.out.data(), e.dout.data(), e.out.size());
  };
  // Rows of tokens that never occur (4, 6, 8) and positions past T keep a zero gradient; the
  // finite differences agree because the forward never reads them.
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dwte", e.wte.data(), e.wte.size(),
                                                        dwte.data(), loss));
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dwpe", e.wpe.data(), e.wpe.size(),
                                                        dwpe.data(), loss));
  for (int i = 0; i < C; i++) {
    EXPECT_EQ(dwte[4 * C + i], 0.0f);
    EXPECT_EQ(dwpe[(maxT - 1) * C + i], 0.0f);
    // Token 3 at (b, t) = (0, 0), (0, 3), (1, 1).
    EXPECT_NEAR(dwte[3 * C + i],
                (double)e.dout[0 * C + i] + e.dout[3 * C + i] + e.dout[(T + 1) * C + i], 1e-6);
  }
}

TEST(Embedding, CheckTokensAcceptsTheVocabulary) {
  Embedding e;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_embedding_check_tokens(e.tokens.data(), e.tokens.size(), V, &err), MP_OK);
  EXPECT_EQ(err.status, MP_OK);
}

TEST(Embedding, CheckTokensNamesTheFirstBadOne) {
  const int32_t tokens[] = {1, 2, 11, -1};
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_embedding_check_tokens(tokens, 4, V, &err), MP_ERR_INPUT);
  EXPECT_EQ(err.status, MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "token 11 at position 2 is outside the vocabulary [0, 11); the data was tokenized "
            "for a different vocabulary or the file is damaged");
  const int32_t negative[] = {-1};
  EXPECT_EQ(mp_embedding_check_tokens(negative, 1, V, nullptr), MP_ERR_INPUT);
}

}  // namespace
