// tests/engine/gpt_model_gpu_test.cc — the GPU model against the CPU model: the same weights and
// tokens give the same loss and gradients to bf16 precision, optimizer steps track each other,
// and a GPU training run learns. Skipped, by name, where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/gpt_model.h"
#include "engine/gpt_model_tp.h"
#include "engine/gpt_model_gpu.h"
#include "layers/adamw.h"
#include "topology/model.h"

namespace {

#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    if (mp_device_count() == 0) {                                                     \
      GTEST_SKIP() << "no GPU visible: " << ::testing::UnitTest::GetInstance()        \
                                                ->current_test_info()->name()         \
                   << " needs CUDA";                                                  \
    }                                                                                 \
  } while (0)

const char *kModel =
    "{\"name\": \"t\", \"vocab_size\": 50, \"seq_len\": 32, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 64},"
    "{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"repeat\": 2},"
    "{\"type\": \"layernorm\", \"hidden\": 64},"
    "{\"type\": \"lm_head\", \"hidden\": 64}]}";

struct Pair {
  mp_model *model = nullptr;
  mp_gpt *cpu = nullptr;
  mp_gpt_gpu *gpu = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Pair() {
    mp_gpt_gpu_free(gpu);
    mp_gpt_free(cpu);
    mp_model_free(model);
  }
};

double relative_error(const float *a, const float *b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    diff += (double)(a[i] - b[i]) * (a[i] - b[i]);
    norm += (double)b[i] * b[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

TEST(GptModelGpu, LossAndGradientsMatchTheCpuModel) {
  REQUIRE_GPU();
  Pair p;
  const int B = 2, T = 32;
  ASSERT_EQ(mp_model_parse_text(kModel, "m.json", &p.model, &p.err), MP_OK);
  ASSERT_EQ(mp_gpt_create(p.model, B, T, &p.cpu, &p.err), MP_OK) << p.err.message;
  ASSERT_EQ(mp_gpt_gpu_create(p.model, B, T, &p.gpu, &p.err), MP_OK) << p.err.message;
  mp_gpt_init_params(p.cpu, 42);
  // bf16 weights on the GPU: give the CPU the same rounded values so only arithmetic differs.
  const size_t n = mp_gpt_num_params(p.cpu);
  float *params = mp_gpt_params(p.cpu);
  for (size_t i = 0; i < n; ++i) params[i] = mp_bf16_to_float(mp_bf16_from_float(params[i]));
  ASSERT_EQ(mp_gpt_gpu_set_params(p.gpu, params, &p.err), MP_OK) << p.err.message;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = (i * 7 + 3) % 50;
    targets[i] = (i * 13 + 1) % 50;
  }
  mp_gpt_zero_grads(p.cpu);
  const double cpu_loss = mp_gpt_forward(p.cpu, inputs.data(), targets.data(), 1.0f);
  mp_gpt_backward(p.cpu);
  double gpu_loss = 0;
  ASSERT_EQ(mp_gpt_gpu_zero_grads(p.gpu, &p.err), MP_OK);
  ASSERT_EQ(mp_gpt_gpu_forward(p.gpu, inputs.data(), targets.data(), 1.0f, &gpu_loss, &p.err),
            MP_OK)
      << p.err.message;
  ASSERT_EQ(mp_gpt_gpu_backward(p.gpu, &p.err), MP_OK) << p.err.message;
  ASSERT_EQ(mp_device_synchronize(&p.err), MP_OK) << p.err.message;
  printf("model loss: cpu %.6f gpu %.6f (rel diff %.2e)\n", cpu_loss, gpu_loss,
         std::fabs(gpu_loss - cpu_loss) / cpu_loss);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-2 * cpu_loss);
  std::vector<float> gpu_grads(n);
  ASSERT_EQ(mp_gpt_gpu_get_grads(p.gpu, gpu_grads.data(), &p.err), MP_OK);
  const float *cpu_grads = mp_gpt_grads(p.cpu);
  double worst = 0;
  std::string worst_name;
  for (int t = 0; t < mp_gpt_num_tensors(p.cpu); ++t) {
    const mp_gpt_tensor *tensor = mp_gpt_tensor_at(p.cpu, t);
    // The padded vocabulary rows carry no gradient on either side; compare the real ones.
    size_t rows = tensor->rows;
    if (t == 0) rows = 50;
    const double error = relative_error(gpu_grads.data() + tensor->offset,
                                        cpu_grads + tensor->offset, rows * tensor->cols);
    if (error > worst) {
      worst = error;
      worst_name = tensor->name;
    }
    EXPECT_LT(error, 5e-2) << tensor->name;
  }
  printf("model gradients: worst relative error %.2e (%s), tolerance 5e-2 for bf16 activations\n",
         worst, worst_name.c_str());
}

// The same AdamW steps on the same batch from the same (bf16-rounded) weights: the GPU model's
// loss follows the CPU model's step by step. The CPU side is the one-rank model with the CPU's
// clipping and AdamW (layers/adamw.h); the GPU keeps fp32 masters, gradients and moments as the
// CPU does, so what differs is the GPU's bf16 (weights rounded for every GEMM, activations
// stored in bf16). On an H200 one forward's loss was within 2.4e-5 of the CPU's and the
// gradients within 1e-2 per tensor (docs/gpu_results.md); thirty steps on such gradients drift
// the loss apart by about 2e-3 (measured in the emulated build, printed below). Each step's loss
// must agree within 1e-2 relative, five times that, and the gradient norm within 5e-2 (the
// per-tensor gradient bound, loosened for the drifted weights). A GPU step that gets the update
// wrong (an off-by-one bias correction: 1.9e-2 off at step 2, its norm at step 3; a wrong
// sign; no clipping) leaves the band, where memorising the batch alone proved nothing.
TEST(GptModelGpu, TrainingStepsTrackTheCpuModel) {
  REQUIRE_GPU();
  Pair p;
  const int B = 2, T = 32;
  ASSERT_EQ(mp_model_parse_text(kModel, "m.json", &p.model, &p.err), MP_OK);
  ASSERT_EQ(mp_gpt_create(p.model, B, T, &p.cpu, &p.err), MP_OK);
  ASSERT_EQ(mp_gpt_gpu_create(p.model, B, T, &p.gpu, &p.err), MP_OK) << p.err.message;
  mp_gpt_init_params(p.cpu, 7);
  const size_t n = mp_gpt_num_params(p.cpu);
  float *params = mp_gpt_params(p.cpu);
  for (size_t i = 0; i < n; ++i) params[i] = mp_bf16_to_float(mp_bf16_from_float(params[i]));
  ASSERT_EQ(mp_gpt_gpu_set_params(p.gpu, params, &p.err), MP_OK);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = (i * 3) % 50;
    targets[i] = (i * 3 + 3) % 50;
  }
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip = 1.0f;
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  double first = 0, last = 0, worst = 0, worst_norm = 0;
  int worst_step = 0;
  for (int step = 1; step <= 30; ++step) {
    mp_gpt_zero_grads(p.cpu);
    const double cpu_loss = mp_gpt_forward(p.cpu, inputs.data(), targets.data(), 1.0f);
    mp_gpt_backward(p.cpu);
    const float *grads = mp_gpt_grads(p.cpu);
    const double cpu_norm = std::sqrt(mp_grad_norm_squared_cpu(grads, n));
    mp_adamw_update_scaled_cpu(params, grads, m.data(), v.data(), n, lr, beta1, beta2, eps, 0.0f,
                               step, mp_clip_scale(cpu_norm, clip));

    double loss = 0, norm = 0;
    ASSERT_EQ(mp_gpt_gpu_zero_grads(p.gpu, &p.err), MP_OK);
    ASSERT_EQ(mp_gpt_gpu_forward(p.gpu, inputs.data(), targets.data(), 1.0f, &loss, &p.err),
              MP_OK);
    ASSERT_EQ(mp_gpt_gpu_backward(p.gpu, &p.err), MP_OK);
    const mp_gpu_adamw adamw = {lr, beta1, beta2, eps, 0.0f, step, clip};
    ASSERT_EQ(mp_gpt_gpu_optimizer_step(p.gpu, &adamw, &norm, &p.err), MP_OK) << p.err.message;
    const double error = std::fabs(loss - cpu_loss) / cpu_loss;
    EXPECT_LT(error, 1e-2) << "step " << step << ": gpu loss " << loss << ", cpu " << cpu_loss;
    EXPECT_NEAR(norm, cpu_norm, 5e-2 * cpu_norm) << "step " << step << ": gradient norm";
    worst_norm = std::fmax(worst_norm, std::fabs(norm - cpu_norm) / cpu_norm);
    if (error > worst) {
      worst = error;
      worst_step = step;
    }
    if (step == 1) first = loss;
    last = loss;
  }
  printf("30 steps on a fixed batch: gpu loss %.4f -> %.4f; worst relative difference from the "
         "cpu's loss %.2e (step %d), tolerance 1e-2; gradient norm %.2e, tolerance 5e-2\n",
         first, last, worst, worst_step, worst_norm);
  EXPECT_LT(last, 0.5 * first);  // a repeated batch is memorised
}

TEST(GptModelGpu, WithoutAGpuCreateSaysSo) {
  if (mp_device_count() > 0) GTEST_SKIP() << "a GPU is visible: this checks the no-GPU message";
  Pair p;
  ASSERT_EQ(mp_model_parse_text(kModel, "m.json", &p.model, &p.err), MP_OK);
  EXPECT_NE(mp_gpt_gpu_create(p.model, 1, 8, &p.gpu, &p.err), MP_OK);
  EXPECT_EQ(p.err.status, MP_ERR_INPUT);
  EXPECT_NE(std::string(p.err.message).find("--backend cuda"), std::string::npos)
      << p.err.message;
}

}  // namespace
