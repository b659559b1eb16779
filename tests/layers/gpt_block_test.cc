// tests/layers/gpt_block_test.cc — one whole transformer block against a double reference, and
// the gradient of every parameter and of the input against central finite differences.
#include "layers/gpt_block.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/layers/finite_difference.h"
#include "tests/layers/reference.h"

namespace {

using mp_test::Rng;

constexpr mp_gpt_block_shape kShape = {2, 5, 8, 2, 32};  // B, T, C, NH, F = 4C
constexpr int B = kShape.B, T = kShape.T, C = kShape.C, NH = kShape.NH, F = kShape.F;

struct Block {
  Rng rng{61};
  std::vector<float> param_memory = std::vector<float>(mp_gpt_block_params_count(C, F));
  std::vector<float> act_memory = std::vector<float>(mp_gpt_block_acts_count(&kShape));
  mp_gpt_block_params params;
  mp_gpt_block_acts acts;
  std::vector<float> inp = rng.uniform_vector(B * T * C, -1.0f, 1.0f);   // (B, T, C)
  std::vector<float> dout = rng.uniform_vector(B * T * C, -1.0f, 1.0f);  // loss weights

  Block() {
    mp_gpt_block_params_point(&params, param_memory.data(), C, F);
    mp_gpt_block_acts_point(&acts, act_memory.data(), &kShape);
    // Weights around GPT-2's scale for these widths, layernorm gains near 1.
    for (float &x : param_memory) x = rng.uniform(-0.4f, 0.4f);
    for (float *gain : {params.ln1w, params.ln2w}) {
      for (int i = 0; i < C; i++) gain[i] = rng.uniform(0.6f, 1.4f);
    }
  }
  void forward() { mp_gpt_block_forward_cpu(&kShape, &params, &acts, inp.data()); }
  double loss() {
    forward();
    return mp_test::weighted_sum(acts.out, dout.data(), dout.size());
  }
};

TEST(GptBlock, ParameterCountMatchesGpt2) {
  // GPT-2 small: 124,439,808 parameters, of which each of the 12 blocks holds 7,087,872.
  EXPECT_EQ(mp_gpt_block_params_count(768, 3072), 7087872u);
  mp_gpt_block_params p;
  EXPECT_EQ(mp_gpt_block_params_point(&p, nullptr, C, F), mp_gpt_block_params_count(C, F));
}

TEST(GptBlock, ShapeCheck) {
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_gpt_block_shape_check(&kShape, &err), MP_OK);
  const mp_gpt_block_shape bad_heads = {2, 5, 8, 3, 32};
  EXPECT_EQ(mp_gpt_block_shape_check(&bad_heads, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "transformer block: hidden size 8 is not a multiple of the 3 heads; choose heads that "
            "divide hidden");
  const mp_gpt_block_shape zero = {2, 0, 8, 2, 32};
  EXPECT_EQ(mp_gpt_block_shape_check(&zero, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "transformer block sizes must be positive, got B=2 T=0 C=8 NH=2 F=32");
}

TEST(GptBlock, ForwardMatchesDoubleReference) {
  Block blk;
  blk.forward();
  std::vector<double> want = mp_test::ref_gpt_block(
      mp_test::to_double(blk.inp), mp_test::to_double(blk.param_memory), B, T, C, NH, F);
  EXPECT_TRUE(mp_test::NearlyEqual("out", blk.acts.out, want, 1e-5));
}

TEST(GptBlock, BackwardMatchesFiniteDifferences) {
  Block blk;
  blk.forward();
  std::vector<float> grad_memory(blk.param_memory.size(), 0.0f);
  std::vector<float> scratch_memory(mp_gpt_block_scratch_count(&kShape), 9.0f);  // garbage
  std::vector<float> dinp(blk.inp.size(), 0.0f);
  mp_gpt_block_params grads;
  mp_gpt_block_scratch scratch;
  mp_gpt_block_params_point(&grads, grad_memory.data(), C, F);
  mp_gpt_block_scratch_point(&scratch, scratch_memory.data(), &kShape);
  mp_gpt_block_backward_cpu(&kShape, dinp.data(), &grads, &scratch, blk.dout.data(), blk.inp.data(),
                            &blk.params, &blk.acts);

  auto loss = [&] { return blk.loss(); };
  EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences("dinp", blk.inp.data(), blk.inp.size(),
                                                        dinp.data(), loss));
  struct Named {
    const char *name;
    float *param;
    float *grad;
    size_t n;
  };
  const Named tensors[] = {
      {"ln1w", blk.params.ln1w, grads.ln1w, (size_t)C},
      {"ln1b", blk.params.ln1b, grads.ln1b, (size_t)C},
      {"qkvw", blk.params.qkvw, grads.qkvw, (size_t)3 * C * C},
      {"qkvb", blk.params.qkvb, grads.qkvb, (size_t)3 * C},
      {"attprojw", blk.params.attprojw, grads.attprojw, (size_t)C * C},
      {"attprojb", blk.params.attprojb, grads.attprojb, (size_t)C},
      {"ln2w", blk.params.ln2w, grads.ln2w, (size_t)C},
      {"ln2b", blk.params.ln2b, grads.ln2b, (size_t)C},
      {"fcw", blk.params.fcw, grads.fcw, (size_t)F * C},
      {"fcb", blk.params.fcb, grads.fcb, (size_t)F},
      {"fcprojw", blk.params.fcprojw, grads.fcprojw, (size_t)C * F},
      {"fcprojb", blk.params.fcprojb, grads.fcprojb, (size_t)C},
  };
  size_t covered = 0;
  for (const Named &t : tensors) {
    EXPECT_TRUE(mp_test::GradientMatchesFiniteDifferences(t.name, t.param, t.n, t.grad, loss));
    covered += t.n;
  }
  EXPECT_EQ(covered, blk.param_memory.size());  // every parameter was checked
}

TEST(GptBlock, BackwardAddsIntoGradientsAndDinp) {
  Block blk;
  blk.forward();
  std::vector<float> scratch_memory(mp_gpt_block_scratch_count(&kShape));
  mp_gpt_block_scratch scratch;
  mp_gpt_block_scratch_point(&scratch, scratch_memory.data(), &kShape);

  std::vector<float> grad_once(blk.param_memory.size(), 0.0f), dinp_once(blk.inp.size(), 0.0f);
  mp_gpt_block_params grads;
  mp_gpt_block_params_point(&grads, grad_once.data(), C, F);
  mp_gpt_block_backward_cpu(&kShape, dinp_once.data(), &grads, &scratch, blk.dout.data(),
                            blk.inp.data(), &blk.params, &blk.acts);

  // Two micro-batches' worth (the same one twice) is twice one.
  std::vector<float> grad_twice(blk.param_memory.size(), 0.0f), dinp_twice(blk.inp.size(), 0.0f);
  mp_gpt_block_params_point(&grads, grad_twice.data(), C, F);
  for (int k = 0; k < 2; k++) {
    mp_gpt_block_backward_cpu(&kShape, dinp_twice.data(), &grads, &scratch, blk.dout.data(),
                              blk.inp.data(), &blk.params, &blk.acts);
  }
  std::vector<double> want_grad(grad_once.size()), want_dinp(dinp_once.size());
  for (size_t i = 0; i < want_grad.size(); i++) want_grad[i] = 2.0 * grad_once[i];
  for (size_t i = 0; i < want_dinp.size(); i++) want_dinp[i] = 2.0 * dinp_once[i];
  EXPECT_TRUE(mp_test::NearlyEqual("parameter gradients", grad_twice.data(), want_grad, 1e-6));
  EXPECT_TRUE(mp_test::NearlyEqual("dinp", dinp_twice.data(), want_dinp, 1e-6));
}

}  // namespace
