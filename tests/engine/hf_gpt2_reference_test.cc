// tests/engine/hf_gpt2_reference_test.cc — GPT-2 against Hugging Face transformers itself: the
// golden GPT2LMHeadModel checkpoint of tools/bench/hf_gpt2_golden.py (testdata/hf_gpt2_tiny/,
// transformers 4.46.3) is imported (config.json -> model description, topology/hf_config.h),
// loaded (engine/weights/weight_source.h) and run through the one-rank chain on the golden's
// batch; the loss and every parameter's gradient must be transformers' fp32 loss.backward()
// (testdata/hf_gpt2_tiny_grads.json): the loss within 1e-5 of itself, each gradient's L2 norm
// within kBound of itself and its first and spread-out values within kBound of the tensor's own
// norm. Every bound is the tensor's own, so a tensor of small gradients (a layernorm's: 1/300 of
// the embedding's) that is 1% off fails as surely as a large one. Measured on the committed
// golden (the test prints each tensor's): worst norm error 1.2e-7 of the norm (block.2.ln1.weight,
// block.3.ln2.bias), worst value error 2.3e-7 of the norm (block.2.ln1.weight); kBound = 1e-5 is
// about 50 times that, and 1/1000 of a 1% error.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/weights/weight_source.h"
#include "tests/support/one_rank_model.h"
#include "topology/hf_config.h"
#include "topology/model.h"

namespace {

const char kDir[] = "tests/engine/testdata/hf_gpt2_tiny";
const char kGrads[] = "tests/engine/testdata/hf_gpt2_tiny_grads.json";
const char kTokens[] = "tests/engine/testdata/hf_gpt2_tiny_tokens.bin";
constexpr double kBound = 1e-5;

std::string Read(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// transformers' name of each of our tensors (written out here, not taken from the loader).
std::string HfName(const std::string &ours) {
  static const std::map<std::string, std::string> kBlock = {
      {"ln1.weight", "ln_1.weight"},
      {"ln1.bias", "ln_1.bias"},
      {"qkv.weight", "attn.c_attn.weight"},
      {"qkv.bias", "attn.c_attn.bias"},
      {"attn_proj.weight", "attn.c_proj.weight"},
      {"attn_proj.bias", "attn.c_proj.bias"},
      {"ln2.weight", "ln_2.weight"},
      {"ln2.bias", "ln_2.bias"},
      {"fc.weight", "mlp.c_fc.weight"},
      {"fc.bias", "mlp.c_fc.bias"},
      {"fc_proj.weight", "mlp.c_proj.weight"},
      {"fc_proj.bias", "mlp.c_proj.bias"},
  };
  if (ours == "embedding.wte") return "transformer.wte.weight";
  if (ours == "embedding.wpe") return "transformer.wpe.weight";
  if (ours == "final_norm.weight") return "transformer.ln_f.weight";
  if (ours == "final_norm.bias") return "transformer.ln_f.bias";
  int layer = -1, used = 0;
  if (std::sscanf(ours.c_str(), "block.%d.%n", &layer, &used) != 1) return "";
  const auto it = kBlock.find(ours.substr((size_t)used));
  return it == kBlock.end() ? "" : "transformer.h." + std::to_string(layer) + "." + it->second;
}

// The golden's batch: sample k of the shard's G T + 1 tokens is [k T, k T + T], as the script's.
void Batch(int G, int T, std::vector<int32_t> *inputs, std::vector<int32_t> *targets) {
  const std::string bytes = Read(kTokens);
  ASSERT_EQ(bytes.size(), 1024 + 2 * (size_t)(G * T + 1)) << kTokens;
  const uint16_t *tokens = reinterpret_cast<const uint16_t *>(bytes.data() + 1024);
  for (int k = 0; k < G; ++k) {
    for (int t = 0; t < T; ++t) {
      inputs->push_back(tokens[k * T + t]);
      targets->push_back(tokens[k * T + t + 1]);
    }
  }
}

TEST(HfGpt2Reference, LossAndEveryGradientAreTransformers) {
  cJSON *golden = cJSON_Parse(Read(kGrads).c_str());
  ASSERT_NE(golden, nullptr) << kGrads;
  const int B = cJSON_GetObjectItem(golden, "B")->valueint;
  const int T = cJSON_GetObjectItem(golden, "T")->valueint;
  const int spread = cJSON_GetObjectItem(golden, "spread")->valueint;
  std::vector<int32_t> inputs, targets;
  Batch(B, T, &inputs, &targets);

  mp_error err = MP_ERROR_INITIALIZER;
  mp_hf_import_options options = MP_HF_IMPORT_OPTIONS_INITIALIZER;
  options.seq_len = T;
  cJSON *description = nullptr;
  ASSERT_EQ(MP_OK, mp_hf_config_to_model_json(kDir, &options, &description, nullptr, &err))
      << err.message;
  char *text = cJSON_PrintUnformatted(description);
  cJSON_Delete(description);
  mp_model *model = nullptr;
  ASSERT_EQ(MP_OK, mp_model_parse_text(text, "hf_gpt2_tiny.json", &model, &err)) << err.message;
  free(text);
  mp_gpt *gpt = nullptr;
  ASSERT_EQ(MP_OK, mp_gpt_create(model, B, T, &gpt, &err)) << err.message;
  mp_weight_source *source = nullptr;
  ASSERT_EQ(MP_OK, mp_weight_source_open(mp_gpt_get_layout(gpt), kDir, &source, &err))
      << err.message;
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    ASSERT_EQ(MP_OK, mp_weight_source_read(source, i, 0, t->rows, 0, t->cols,
                                           mp_gpt_params(gpt) + t->offset, &err))
        << err.message;
  }
  mp_weight_source_close(source);

  mp_gpt_zero_grads(gpt);
  const double loss = mp_gpt_forward(gpt, inputs.data(), targets.data(), 1.0f);
  mp_gpt_backward(gpt);
  const double expected = cJSON_GetObjectItem(golden, "loss")->valuedouble;
  EXPECT_NEAR(loss, expected, 1e-5 * expected) << "the mean cross-entropy";

  // A test-only fault for showing that the bounds catch a small tensor's gradient 1% off:
  // MP_TEST_SCALE_GRAD=NAME scales our gradient of NAME by 1.01 before the comparison.
  const char *scaled = std::getenv("MP_TEST_SCALE_GRAD");
  if (scaled != nullptr && mp_gpt_find_tensor(gpt, scaled) != nullptr) {
    const mp_param_tensor *t = mp_gpt_find_tensor(gpt, scaled);
    for (size_t k = 0; k < t->rows * t->cols; ++k) mp_gpt_grads(gpt)[t->offset + k] *= 1.01f;
  }

  const cJSON *grads = cJSON_GetObjectItem(golden, "grads");
  const size_t vocab = (size_t)mp_gpt_get_config(gpt)->vocab_size;
  int compared = 0;
  double worst_norm = 0, worst_value = 0;
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    const std::string hf = HfName(t->name);
    const cJSON *g = cJSON_GetObjectItem(grads, hf.c_str());
    ASSERT_NE(g, nullptr) << "no gradient of " << hf << " (ours " << t->name << ")";
    // The vocabulary table's padding rows (none at vocab 128) are not transformers'.
    const size_t rows = std::string(t->name) == "embedding.wte" ? vocab : t->rows;
    const size_t n = rows * t->cols;
    const cJSON *shape = cJSON_GetObjectItem(g, "shape");
    size_t expected_n = 1;
    const cJSON *x = nullptr;
    cJSON_ArrayForEach(x, shape) expected_n *= (size_t)x->valueint;
    ASSERT_EQ(n, expected_n) << t->name << ": elements";
    const float *ours = mp_gpt_grads(gpt) + t->offset;
    double squares = 0;
    for (size_t k = 0; k < n; ++k) squares += (double)ours[k] * ours[k];
    const double norm = cJSON_GetObjectItem(g, "norm")->valuedouble;
    EXPECT_NEAR(std::sqrt(squares), norm, kBound * norm) << "|gradient| of " << t->name;
    double value_error = 0;
    size_t k = 0;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(g, "first")) {
      EXPECT_NEAR(ours[k], x->valuedouble, kBound * norm) << t->name << "[" << k << "]";
      value_error = std::fmax(value_error, std::fabs(ours[k] - x->valuedouble));
      ++k;
    }
    EXPECT_EQ(k, 8u) << t->name;
    k = 0;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(g, "spread")) {
      const size_t at = k * n / (size_t)spread;
      EXPECT_NEAR(ours[at], x->valuedouble, kBound * norm) << t->name << "[" << at << "]";
      value_error = std::fmax(value_error, std::fabs(ours[at] - x->valuedouble));
      ++k;
    }
    EXPECT_EQ(k, (size_t)spread) << t->name;
    const double norm_error = std::fabs(std::sqrt(squares) - norm) / norm;
    std::printf("%-26s |g| %.3e  norm error %.1e  value error %.1e (of |g|)\n", t->name, norm,
                norm_error, value_error / norm);
    worst_norm = std::fmax(worst_norm, norm_error);
    worst_value = std::fmax(worst_value, value_error / norm);
    ++compared;
  }
  // Every parameter of the checkpoint is one of ours (the tied head is wte).
  EXPECT_EQ(compared, cJSON_GetArraySize(grads));
  EXPECT_EQ(compared, 4 + 12 * mp_gpt_get_config(gpt)->num_layers);
  std::printf("loss %.7f (transformers %.7f), %d gradients compared; worst norm error %.1e, "
              "worst value error %.1e, of the tensor's norm\n",
              loss, expected, compared, worst_norm, worst_value);
  mp_gpt_free(gpt);
  mp_model_free(model);
  cJSON_Delete(golden);
}

}  // namespace
