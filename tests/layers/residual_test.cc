// tests/layers/residual_test.cc — the residual add and its backward, exactly and against
// central finite differences.
#include "layers/residual.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/layers/finite_difference.h"

namespace {

using mp_test::Rng;

constexpr int N = 2 * 5 * 8;  // (B, T, C)

TEST(Residual, ForwardAdds) {
  Rng rng(21);
  std::vector<float> a = rng.uniform_vector(N, -1.0f, 1.0f), b = rng.uniform_vector(N, -1.0f, 1.0f);
  std::vector<float> out(N);
  mp_residual_forward_cpu(out.data(), a.data(), b.data(), N);
  for (int i = 0; i < N; i++) EXPECT_EQ(out[i], a[i] + b[i]) << i;
  // In place, into the stream.
  mp_residual_forward_cpu(a.data(), a.data(), b.data(), N);
  EXPECT_EQ(a, out);
}

TEST(Residual, BackwardMatchesFiniteDifferences) {
  Rng rng(22);
  std::vector<float> a = rng.uniform_vector(N, -1.0f, 1.0f), b = rng.uniform_vector(N, -1.0f, 1.0f);
  std::vector<float> dout = rng.uniform_vector(N, -1.0f, 1.0f);
  std::vector<float> out(N), da(N, 0.0f), db(N, 0.5f);
  mp_residual_backward_cpu(da.data(), db.data(), dout.data(), N);
  for (int i = 0; i < N; i++) {
    EXPECT_EQ(da[i], dout[i]) << i;
    EXPECT_EQ(db[i], 0.5f + dout[i]) << i;  // adds into what was there
    db[i] -= 0.5f;
  }
  auto loss = [&] {
    mp_residual_forward_cpu(out.data(), a.data(), b.data(), N);
    return mp_test::weighted_sum(out.data(), dout.data(), N);
  };
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dinp1", a.data(), N, da.data(), loss));
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dinp2", b.data(), N, db.data(), loss));
}

}  // namespace
