// tests/engine/torch_adamw_reference_test.cc — mpengine's optimizer path against PyTorch's own:
// five steps of torch.optim.AdamW after torch.nn.utils.clip_grad_norm_, under the plan's
// learning-rate schedule (warmup, then cosine to min_lr_ratio), weight decay on the matrices and
// embeddings only (tools/bench/torch_adamw_golden.py; testdata/torch_adamw_golden.json and .f32).
// Ours is what mp_trainer_step does at one rank: the stage's global gradient norm, the step's
// settings (mp_trainer_adamw_settings: learning rate, clip factor, 1-based step for bias
// correction) and the stage's AdamW, which picks the decaying tensors from the parameter layout.
// Every parameter is compared after every step, and the padding rows of the vocabulary table
// must stay zero. Measured: the worst difference from PyTorch's is 2.4e-7 at step 5 (growing
// from 6e-8 at step 1: a few float32 roundings of parameters of size 1); kBound is about ten
// times that, and a five-hundredth of what bias correction one step off moves step 1 (1e-3).
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "tests/support/one_rank_model.h"
#include "topology/model.h"
#include "topology/plan.h"

namespace {

const char kJson[] = "tests/engine/testdata/torch_adamw_golden.json";
const char kF32[] = "tests/engine/testdata/torch_adamw_golden.f32";
constexpr double kBound = 2.5e-6;

std::string Read(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The golden's values (torch_adamw_golden.py's value()): splitmix64 of (stream << 32) + k, taken
// to [-1, 1] in steps of 1e-4, a double.
double Value(uint64_t stream, uint64_t k) {
  uint64_t x = (stream << 32) + k + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return ((double)(x % 20001) - 10000.0) / 10000.0;
}

double Number(const cJSON *object, const char *key) {
  const cJSON *item = cJSON_GetObjectItem(object, key);
  EXPECT_NE(item, nullptr) << kJson << ": no " << key;
  return item != nullptr ? item->valuedouble : NAN;
}

TEST(TorchAdamwReference, EveryParameterAfterEveryStepIsPyTorchs) {
  cJSON *golden = cJSON_Parse(Read(kJson).c_str());
  ASSERT_NE(golden, nullptr) << kJson;
  const cJSON *m = cJSON_GetObjectItem(golden, "model");
  const cJSON *tr = cJSON_GetObjectItem(golden, "training");
  const int num_params = (int)Number(golden, "num_params");
  const int steps = (int)Number(tr, "steps");
  const std::string after_bytes = Read(kF32);
  ASSERT_EQ(after_bytes.size(), sizeof(float) * (size_t)steps * num_params) << kF32;
  std::vector<float> after((size_t)steps * num_params);
  std::memcpy(after.data(), after_bytes.data(), after_bytes.size());

  char text[1024];
  std::snprintf(text, sizeof text,
                "{\"name\": \"adamw\", \"vocab_size\": %d, \"seq_len\": %d, \"layers\": ["
                "{\"type\": \"embedding\", \"hidden\": %d},"
                "{\"type\": \"transformer\", \"hidden\": %d, \"heads\": %d, \"repeat\": %d},"
                "{\"type\": \"layernorm\", \"hidden\": %d},"
                "{\"type\": \"lm_head\", \"hidden\": %d}]}",
                (int)Number(m, "vocab_size"), (int)Number(m, "seq_len"), (int)Number(m, "hidden"),
                (int)Number(m, "hidden"), (int)Number(m, "heads"), (int)Number(m, "layers"),
                (int)Number(m, "hidden"), (int)Number(m, "hidden"));
  mp_error err = MP_ERROR_INITIALIZER;
  mp_model *model = nullptr;
  ASSERT_EQ(MP_OK, mp_model_parse_text(text, "adamw.json", &model, &err)) << err.message;
  mp_gpt *gpt = nullptr;
  ASSERT_EQ(MP_OK, mp_gpt_create(model, 1, (int)Number(m, "seq_len"), &gpt, &err))
      << err.message;

  mp_training_config training = {};
  training.steps = steps;
  training.learning_rate = Number(tr, "learning_rate");
  training.warmup_steps = (int64_t)Number(tr, "warmup_steps");
  training.min_lr_ratio = Number(tr, "min_lr_ratio");
  training.weight_decay = Number(tr, "weight_decay");
  training.beta1 = Number(tr, "beta1");
  training.beta2 = Number(tr, "beta2");
  training.eps = Number(tr, "eps");
  training.grad_clip = Number(tr, "grad_clip");

  // Each golden tensor's place in our flat arrays: its first `count` elements (the vocabulary
  // table's padding rows beyond them stay zero, parameters and gradients alike).
  struct Place {
    std::string name;
    size_t ours, golden, count;
  };
  std::vector<Place> places;
  const cJSON *t = nullptr;
  cJSON_ArrayForEach(t, cJSON_GetObjectItem(golden, "tensors")) {
    const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
    const mp_param_tensor *ours = mp_gpt_find_tensor(gpt, name);
    ASSERT_NE(ours, nullptr) << "no tensor " << name << " in the layout";
    size_t count = 1;
    const cJSON *d = nullptr;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(t, "shape")) count *= (size_t)d->valueint;
    ASSERT_LE(count, ours->rows * ours->cols) << name;
    if (std::strcmp(name, "embedding.wte") != 0) {
      ASSERT_EQ(count, ours->rows * ours->cols) << name;
    }
    EXPECT_EQ(ours->weight_decay, cJSON_IsTrue(cJSON_GetObjectItem(t, "decay")))
        << name << ": decayed by one and not the other";
    places.push_back({name, ours->offset, (size_t)Number(t, "offset"), count});
  }
  ASSERT_EQ((int)places.size(), mp_gpt_num_tensors(gpt)) << "the golden covers every tensor";

  float *params = mp_gpt_params(gpt);
  float *grads = mp_gpt_grads(gpt);
  std::memset(params, 0, mp_gpt_num_params(gpt) * sizeof(float));
  for (const Place &p : places) {
    for (size_t k = 0; k < p.count; ++k) params[p.ours + k] = (float)Value(0, p.golden + k);
  }
  const cJSON *grad_scale = cJSON_GetObjectItem(golden, "grad_scale");
  const cJSON *golden_steps = cJSON_GetObjectItem(golden, "steps");
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const double scale = cJSON_GetArrayItem(grad_scale, s)->valuedouble;
    mp_gpt_zero_grads(gpt);
    for (const Place &p : places) {
      for (size_t k = 0; k < p.count; ++k) {
        grads[p.ours + k] = (float)(Value((uint64_t)s + 1, p.golden + k) * scale);
      }
    }
    const double norm = mp_gpt_grad_norm(gpt);
    const cJSON *expected = cJSON_GetArrayItem(golden_steps, s);
    EXPECT_NEAR(norm, Number(expected, "grad_norm"), 1e-6 * norm) << "step " << s + 1;
    const mp_stage_adamw settings = mp_trainer_adamw_settings(&training, s, norm);
    EXPECT_FLOAT_EQ(settings.learning_rate, (float)Number(expected, "learning_rate"))
        << "step " << s + 1 << ": the schedule's learning rate";
    ASSERT_EQ(MP_OK, mp_gpt_adamw(gpt, &settings, &err)) << err.message;
    double step_worst = 0;
    int compared = 0;
    for (const Place &p : places) {
      const mp_param_tensor *tensor = mp_gpt_find_tensor(gpt, p.name.c_str());
      for (size_t k = 0; k < tensor->rows * tensor->cols; ++k) {
        const double want = k < p.count ? after[(size_t)s * num_params + p.golden + k] : 0.0;
        const double diff = std::fabs(params[p.ours + k] - want);
        step_worst = std::fmax(step_worst, diff);
        if (k < p.count) ++compared;
        ASSERT_LE(diff, kBound) << "step " << s + 1 << ": " << p.name << "[" << k << "] is "
                                << params[p.ours + k] << ", PyTorch's " << want;
      }
    }
    EXPECT_EQ(compared, num_params) << "step " << s + 1;
    std::printf("step %d: lr %.6g, grad norm %.6f (clip factor %.6f), %d parameters, worst "
                "difference from PyTorch %.2e\n",
                s + 1, settings.learning_rate, norm, settings.grad_scale, compared, step_worst);
    worst = std::fmax(worst, step_worst);
  }
  std::printf("worst difference over %d steps: %.2e (bound %.1e)\n", steps, worst, kBound);
  mp_gpt_free(gpt);
  mp_model_free(model);
  cJSON_Delete(golden);
}

}  // namespace
