// tests/layers/adamw_test.cc — AdamW against the scalar formula over one and several steps
// (bias correction, decoupled weight decay), and global gradient-norm clipping.
#include "layers/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/layers/finite_difference.h"

namespace {

using mp_test::Rng;

constexpr int N = 37;
constexpr float kLr = 1e-2f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kDecay = 0.1f;

// The textbook step in double, one element at a time.
struct ScalarAdamW {
  double param, m = 0.0, v = 0.0;
  void step(double g, int t, double lr, double beta1, double beta2, double eps, double decay) {
    m = beta1 * m + (1.0 - beta1) * g;
    v = beta2 * v + (1.0 - beta2) * g * g;
    const double m_hat = m / (1.0 - std::pow(beta1, t));
    const double v_hat = v / (1.0 - std::pow(beta2, t));
    param -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * param);
  }
};

TEST(AdamW, StepsMatchTheScalarFormula) {
  Rng rng(51);
  std::vector<float> params = rng.uniform_vector(N, -1.0f, 1.0f);
  std::vector<float> m(N, 0.0f), v(N, 0.0f);
  std::vector<ScalarAdamW> want(N);
  for (int i = 0; i < N; i++) want[i].param = params[i];

  for (int t = 1; t <= 6; t++) {
    std::vector<float> grads = rng.uniform_vector(N, -2.0f, 2.0f);
    grads[0] = 0.0f;  // an element with no gradient still decays
    mp_adamw_update_cpu(params.data(), grads.data(), m.data(), v.data(), N, kLr, kBeta1, kBeta2,
                        kEps, kDecay, t);
    for (int i = 0; i < N; i++) {
      want[i].step(grads[i], t, kLr, kBeta1, kBeta2, kEps, kDecay);
      // float32 round-off over a few operations per step, relative to values of size 1.
      EXPECT_NEAR(params[i], want[i].param, 2e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(m[i], want[i].m, 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(v[i], want[i].v, 1e-6) << "step " << t << " element " << i;
    }
  }
}

TEST(AdamW, FirstStepIsBiasCorrected) {
  // After bias correction m_hat = g and v_hat = g^2, so the first step moves every parameter by
  // lr against the sign of its gradient (uncorrected, it would be lr * 0.1 / sqrt(0.001) = 3.2 lr).
  Rng rng(52);
  std::vector<float> params = rng.uniform_vector(N, -1.0f, 1.0f), before = params;
  std::vector<float> grads = rng.uniform_vector(N, -2.0f, 2.0f);
  std::vector<float> m(N, 0.0f), v(N, 0.0f);
  mp_adamw_update_cpu(params.data(), grads.data(), m.data(), v.data(), N, kLr, kBeta1, kBeta2, kEps,
                      0.0f, 1);
  for (int i = 0; i < N; i++) {
    EXPECT_NEAR(params[i] - before[i], grads[i] > 0 ? -kLr : kLr, 1e-6) << i;
  }
}

TEST(AdamW, WeightDecayIsDecoupled) {
  // With zero gradients Adam's term is 0 and the parameter shrinks by exactly (1 - lr * decay).
  // Decay folded into the gradient (L2, Adam's way) would instead be normalised to a step of lr.
  Rng rng(53);
  std::vector<float> params = rng.uniform_vector(N, -1.0f, 1.0f), before = params;
  std::vector<float> grads(N, 0.0f), m(N, 0.0f), v(N, 0.0f);
  mp_adamw_update_cpu(params.data(), grads.data(), m.data(), v.data(), N, kLr, kBeta1, kBeta2, kEps,
                      kDecay, 1);
  for (int i = 0; i < N; i++) EXPECT_NEAR(params[i], before[i] * (1.0 - kLr * kDecay), 1e-7) << i;
}

// The float formula of adamw.h, one element at a time, in the order the header writes it.
void float_adamw(float *param, float g, float *m, float *v, float lr, float beta1, float beta2,
                 float eps, float decay, int t) {
  const float c1 = (float)(1.0 - std::pow((double)beta1, (double)t));
  const float c2 = (float)(1.0 - std::pow((double)beta2, (double)t));
  *m = beta1 * *m + (1.0f - beta1) * g;
  *v = beta2 * *v + (1.0f - beta2) * g * g;
  *param -= lr * ((*m / c1) / (std::sqrt(*v / c2) + eps) + decay * *param);
}

TEST(AdamW, EveryElementGetsTheFloatFormulaBits) {
  // The vector loop (four at a time) and its tail (N = 37: one left over) must both give exactly
  // the bits of the scalar float formula, whichever element lands where.
  Rng rng(56);
  std::vector<float> params = rng.uniform_vector(N, -1.0f, 1.0f), want = params;
  std::vector<float> m(N, 0.0f), v(N, 0.0f), want_m(N, 0.0f), want_v(N, 0.0f);
  for (int t = 1; t <= 4; t++) {
    std::vector<float> grads = rng.uniform_vector(N, -2.0f, 2.0f);
    mp_adamw_update_cpu(params.data(), grads.data(), m.data(), v.data(), N, kLr, kBeta1, kBeta2,
                        kEps, kDecay, t);
    for (int i = 0; i < N; i++) {
      float_adamw(&want[i], grads[i], &want_m[i], &want_v[i], kLr, kBeta1, kBeta2, kEps, kDecay,
                  t);
    }
    EXPECT_EQ(params, want) << "step " << t;
    EXPECT_EQ(m, want_m) << "step " << t;
    EXPECT_EQ(v, want_v) << "step " << t;
  }
}

TEST(AdamW, ScaledUpdateIsClippingThenTheUpdate) {
  // Folding the clip factor into the update gives the bits of scaling the gradients first, and
  // leaves the gradients as they were.
  Rng rng(57);
  std::vector<float> a = rng.uniform_vector(N, -1.0f, 1.0f), b = a;
  std::vector<float> am(N, 0.0f), av(N, 0.0f), bm(N, 0.0f), bv(N, 0.0f);
  for (int t = 1; t <= 3; t++) {
    std::vector<float> grads = rng.uniform_vector(N, -5.0f, 5.0f);
    const std::vector<float> before = grads;
    const float scale = 0.3178f;
    mp_adamw_update_scaled_cpu(a.data(), grads.data(), am.data(), av.data(), N, kLr, kBeta1,
                               kBeta2, kEps, kDecay, t, scale);
    EXPECT_EQ(grads, before);
    mp_grad_scale_cpu(grads.data(), N, scale);
    mp_adamw_update_cpu(b.data(), grads.data(), bm.data(), bv.data(), N, kLr, kBeta1, kBeta2,
                        kEps, kDecay, t);
    EXPECT_EQ(a, b) << "step " << t;
    EXPECT_EQ(am, bm) << "step " << t;
    EXPECT_EQ(av, bv) << "step " << t;
  }
}

TEST(GradClip, NormSquaredSumsInDouble) {
  const float three_four[] = {3.0f, -4.0f};
  EXPECT_EQ(mp_grad_norm_squared_cpu(three_four, 2), 25.0);
  EXPECT_EQ(mp_grad_norm_squared_cpu(three_four, 0), 0.0);

  // One large gradient and 100000 small ones: each small square (1e-8) is below half a float ulp
  // of the running sum (6e-8 near 1), so a float accumulator would return 1.0 and lose 1e-3.
  std::vector<float> grads(100001, 1e-4f);
  grads[0] = 1.0f;
  double want = 0.0;
  for (float g : grads) want += (double)g * g;
  const double got = mp_grad_norm_squared_cpu(grads.data(), grads.size());
  // The sum runs in eight fixed interleaved lanes, so it differs from the sequential one only in
  // double round-off.
  EXPECT_NEAR(got, want, 1e-12);
  EXPECT_EQ(got, mp_grad_norm_squared_cpu(grads.data(), grads.size()));  // and is repeatable
  EXPECT_NEAR(got, 1.001, 1e-6);
}

TEST(GradClip, NormSquaredHasAFixedOrder) {
  // The order adamw.h promises, written out: lane k sums elements 8j + k in j order, the lanes
  // are added in order, then the n % 8 left over in order. n = 8 * 5 + 3 reaches every part.
  Rng rng(58);
  const std::vector<float> grads = rng.uniform_vector(43, -3.0f, 3.0f);
  double lanes[8] = {0.0};
  size_t i = 0;
  for (; i + 8 <= grads.size(); i += 8) {
    for (int k = 0; k < 8; k++) lanes[k] += (double)grads[i + k] * (double)grads[i + k];
  }
  double want = 0.0;
  for (double lane : lanes) want += lane;
  for (; i < grads.size(); i++) want += (double)grads[i] * (double)grads[i];
  EXPECT_EQ(mp_grad_norm_squared_cpu(grads.data(), grads.size()), want);
}

TEST(GradClip, ScaleIsOneMultiplyPerElement) {
  Rng rng(59);
  std::vector<float> grads = rng.uniform_vector(N, -3.0f, 3.0f);
  const std::vector<float> before = grads;
  mp_grad_scale_cpu(grads.data(), N, 0.37f);
  for (int i = 0; i < N; i++) EXPECT_EQ(grads[i], before[i] * 0.37f) << i;
}

TEST(GradClip, ScaleClipsOnlyAboveTheMaximum) {
  EXPECT_FLOAT_EQ(mp_clip_scale(10.0, 1.0), 0.1f);
  EXPECT_EQ(mp_clip_scale(0.5, 1.0), 1.0f);
  EXPECT_EQ(mp_clip_scale(1.0, 1.0), 1.0f);
  EXPECT_EQ(mp_clip_scale(10.0, 0.0), 1.0f);  // clipping off
  EXPECT_EQ(mp_clip_scale(NAN, 1.0), 1.0f);
}

TEST(GradClip, ClippedGradientsHaveTheMaximumNorm) {
  // Two tensors, as a model has many: the norm is global, one scale for all of them.
  Rng rng(55);
  std::vector<float> a = rng.uniform_vector(40, -1.0f, 1.0f),
                     b = rng.uniform_vector(9, -3.0f, 3.0f);
  const std::vector<float> a0 = a, b0 = b;
  const double norm = std::sqrt(mp_grad_norm_squared_cpu(a.data(), a.size()) +
                                mp_grad_norm_squared_cpu(b.data(), b.size()));
  const double max_norm = 1.0;
  ASSERT_GT(norm, 2.0);
  const float scale = mp_clip_scale(norm, max_norm);
  mp_grad_scale_cpu(a.data(), a.size(), scale);
  mp_grad_scale_cpu(b.data(), b.size(), scale);
  const double clipped = std::sqrt(mp_grad_norm_squared_cpu(a.data(), a.size()) +
                                   mp_grad_norm_squared_cpu(b.data(), b.size()));
  EXPECT_NEAR(clipped, max_norm, 1e-6);
  // Direction kept: every element scaled by the same factor.
  for (size_t i = 0; i < a.size(); i++) EXPECT_FLOAT_EQ(a[i], a0[i] * scale) << i;
  for (size_t i = 0; i < b.size(); i++) EXPECT_FLOAT_EQ(b[i], b0[i] * scale) << i;
}

}  // namespace
