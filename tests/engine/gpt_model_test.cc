// tests/engine/gpt_model_test.cc — the one-rank GPT as a whole: its gradient against finite
// differences, its parameter count against the model description, its initialisation, and
// llm.c's checkpoint format in both directions with the refusals users hit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/model/stage_cpu.h"
#include "tests/support/one_rank_model.h"
#include "engine/model/param_init.h"
#include "engine/weights/llmc_file.h"
#include "topology/layer_cost.h"
#include "topology/model.h"

namespace {

std::string model_json(int vocab, int seq, int hidden, int heads, int layers,
                       const std::string &extra_block = "") {
  char text[1024];
  snprintf(text, sizeof text,
           "{\"name\": \"t\", \"vocab_size\": %d, \"seq_len\": %d, \"layers\": ["
           "{\"type\": \"embedding\", \"hidden\": %d},"
           "{\"type\": \"transformer\", \"hidden\": %d, \"heads\": %d, \"repeat\": %d%s},"
           "{\"type\": \"layernorm\", \"hidden\": %d},"
           "{\"type\": \"lm_head\", \"hidden\": %d}]}",
           vocab, seq, hidden, hidden, heads, layers, extra_block.c_str(), hidden, hidden);
  return text;
}

struct Fixture {
  mp_model *model = nullptr;
  mp_gpt *gpt = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Fixture() {
    mp_gpt_free(gpt);
    mp_model_free(model);
  }
  bool make(const std::string &json, int B, int T) {
    if (mp_model_parse_text(json.c_str(), "m.json", &model, &err) != MP_OK) return false;
    return mp_gpt_create(model, B, T, &gpt, &err) == MP_OK;
  }
};

std::string temp_path(const char *name) {
  const char *dir = getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(GptModel, ParameterCountMatchesTheDescription) {
  Fixture f;
  ASSERT_TRUE(f.make(model_json(50, 8, 16, 2, 2), 2, 8)) << f.err.message;
  const mp_model_config *c = mp_gpt_get_config(f.gpt);
  EXPECT_EQ(c->padded_vocab_size, 64);
  // The flat array holds the padded vocabulary rows too; beyond them it equals the description.
  EXPECT_EQ((int64_t)mp_gpt_num_params(f.gpt), mp_model_params(f.model) + (64 - 50) * 16);
  EXPECT_NE(mp_gpt_find_tensor(f.gpt, "block.1.fc_proj.weight"), nullptr);
  EXPECT_TRUE(mp_gpt_find_tensor(f.gpt, "block.1.fc_proj.weight")->weight_decay);
  EXPECT_FALSE(mp_gpt_find_tensor(f.gpt, "block.1.fc_proj.bias")->weight_decay);
}

TEST(GptModel, InitialisationFollowsGpt2AndIsAFunctionOfNameAndIndex) {
  Fixture f;
  ASSERT_TRUE(f.make(model_json(50, 8, 64, 4, 2), 1, 8)) << f.err.message;
  mp_gpt_init_params(f.gpt, 7);
  const mp_param_tensor *qkv = mp_gpt_find_tensor(f.gpt, "block.1.qkv.weight");
  const float *p = mp_gpt_params(f.gpt) + qkv->offset;
  EXPECT_FLOAT_EQ(p[5], (float)(0.02 * mp_init_standard_normal(7, "block.1.qkv.weight", 5)));
  double sum2 = 0;
  const size_t n = qkv->rows * qkv->cols;
  for (size_t i = 0; i < n; ++i) sum2 += (double)p[i] * p[i];
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.02, 0.001);
  const mp_param_tensor *proj = mp_gpt_find_tensor(f.gpt, "block.0.fc_proj.weight");
  EXPECT_FLOAT_EQ(mp_gpt_params(f.gpt)[proj->offset + 3],
                  (float)(0.02 / std::sqrt(4.0) *
                          mp_init_standard_normal(7, "block.0.fc_proj.weight", 3)));
  EXPECT_FLOAT_EQ(mp_gpt_params(f.gpt)[mp_gpt_find_tensor(f.gpt, "block.0.ln2.weight")->offset],
                  1.0f);
  EXPECT_FLOAT_EQ(mp_gpt_params(f.gpt)[mp_gpt_find_tensor(f.gpt, "final_norm.bias")->offset],
                  0.0f);
}

TEST(GptModel, UntrainedLossIsNearLogVocab) {
  Fixture f;
  ASSERT_TRUE(f.make(model_json(50, 8, 32, 4, 2), 2, 8)) << f.err.message;
  mp_gpt_init_params(f.gpt, 1);
  std::vector<int32_t> inputs(16), targets(16);
  for (int i = 0; i < 16; ++i) {
    inputs[i] = (i * 7) % 50;
    targets[i] = (i * 11 + 3) % 50;
  }
  EXPECT_NEAR(mp_gpt_forward(f.gpt, inputs.data(), targets.data(), 1.0f), std::log(50.0), 0.05);
}

// A Llama-family description: RMSNorm, SwiGLU, rotary embeddings, no position table; extra
// goes into the block (kv_heads, bias), head into the lm_head node.
std::string llama_json(int vocab, int seq, int hidden, int heads, int layers,
                       const std::string &extra_block, const std::string &head = "") {
  char text[1536];
  snprintf(text, sizeof text,
           "{\"name\": \"l\", \"vocab_size\": %d, \"seq_len\": %d, \"layers\": ["
           "{\"type\": \"embedding\", \"hidden\": %d, \"max_positions\": 0},"
           "{\"type\": \"transformer\", \"hidden\": %d, \"heads\": %d, \"ffn_hidden\": %d, "
           "\"norm\": \"rmsnorm\", \"norm_eps\": 1e-5, \"activation\": \"swiglu\", "
           "\"rope_theta\": 10000, \"repeat\": %d%s},"
           "{\"type\": \"layernorm\", \"hidden\": %d, \"norm\": \"rmsnorm\", \"norm_eps\": 1e-5},"
           "{\"type\": \"lm_head\", \"hidden\": %d%s}]}",
           vocab, seq, hidden, hidden, heads, 3 * hidden / 2, layers, extra_block.c_str(), hidden,
           hidden, head.c_str());
  return text;
}

// The gradient of the mean loss against central differences in double, tensor by tensor, on a
// sample of each tensor: three elements spread through it and its kLargest elements of largest
// gradient. Every bound is the tensor's own (a norm's gradients are 1/100 of the head's): each
// element within 1e-2 of itself plus 2e-3 of the tensor's largest gradient, and the sample's
// relative L2 error, |analytic - numeric| / |numeric| over the tensor's sampled elements, within
// kRelativeL2, which fails a tensor whose gradient is 1% off as a whole (a wrong scale on a small
// tensor, that a bound relative to the model's largest gradient let through).
//
// The step is the tensor's own too: h = min(kMaxStep, kStepTimesGradient / largest gradient), so
// a tensor of small gradients (where rounding noise, about 1e-7 / h absolute, is what limits) gets
// a long step and one of large gradients (strongly curved: the embeddings) a short one. Measured
// over the four models below, the worst tensor's relative L2 error is 5.4e-4 (GPT-2's
// block.1.ln1.weight, largest gradient 1.8e-3; Qwen2's block.0.k.bias 5.0e-4); with one step
// for every tensor no step worked (3e-3: 1.3e-2 on small tensors; 3e-2: 4e-2 on the embeddings).
// kRelativeL2 is 4.6 times the worst, and a quarter of the 1% a scaled gradient shows.
constexpr int kLargest = 5;
constexpr double kRelativeL2 = 2.5e-3;
constexpr double kMaxStep = 0.1;
constexpr double kStepTimesGradient = 1e-3;

// d(loss)/d(*x) by Richardson's extrapolation of central differences at steps h and 2 h,
// (4 D(h) - D(2 h)) / 3, whose truncation error is of order h^4, so the step can be large enough
// that the float forward's rounding (about 1e-7 of the loss, divided by the step) is small next
// to a small tensor's gradients. Each difference divides by the float values actually stored.
double Derivative(Fixture *f, float *x, float h, const std::vector<int32_t> &inputs,
                  const std::vector<int32_t> &targets) {
  const float saved = *x;
  double d[2];
  for (int k = 0; k < 2; ++k) {
    *x = saved + (float)(k + 1) * h;
    const float up = *x;
    const double loss_up = mp_gpt_forward(f->gpt, inputs.data(), targets.data(), 1.0f);
    *x = saved - (float)(k + 1) * h;
    const float down = *x;
    const double loss_down = mp_gpt_forward(f->gpt, inputs.data(), targets.data(), 1.0f);
    d[k] = (loss_up - loss_down) / ((double)up - (double)down);
  }
  *x = saved;
  return (4 * d[0] - d[1]) / 3;
}

void CheckGradientAgainstFiniteDifferences(const std::string &json) {
  Fixture f;
  ASSERT_TRUE(f.make(json, 2, 4)) << f.err.message;
  mp_gpt_init_params(f.gpt, 3);
  float *params = mp_gpt_params(f.gpt);
  // Larger weights than GPT-2's 0.02 so every path carries a visible gradient; norm weights
  // (initialised to 1) and biases (0) moved off their start too.
  for (size_t i = 0; i < mp_gpt_num_params(f.gpt); ++i) params[i] *= 3.0f;
  for (int t = 0; t < mp_gpt_num_tensors(f.gpt); ++t) {
    const mp_param_tensor *tensor = mp_gpt_tensor_at(f.gpt, t);
    if (tensor->cols > 1) continue;
    for (size_t i = 0; i < tensor->rows; ++i) {
      params[tensor->offset + i] += 0.3f * (float)mp_init_standard_normal(9, tensor->name, i);
    }
  }
  std::vector<int32_t> inputs = {1, 5, 9, 2, 7, 7, 0, 19};
  std::vector<int32_t> targets = {5, 9, 2, 3, 7, 0, 19, 4};
  mp_gpt_zero_grads(f.gpt);
  mp_gpt_forward(f.gpt, inputs.data(), targets.data(), 1.0f);
  mp_gpt_backward(f.gpt);
  float *grads = mp_gpt_grads(f.gpt);
  // A test-only fault for showing what the bounds catch: MP_TEST_SCALE_GRAD=NAME scales the
  // backward's gradient of tensor NAME by 1.01.
  const char *scaled = std::getenv("MP_TEST_SCALE_GRAD");
  if (scaled != nullptr && mp_gpt_find_tensor(f.gpt, scaled) != nullptr) {
    const mp_param_tensor *t = mp_gpt_find_tensor(f.gpt, scaled);
    for (size_t k = 0; k < t->rows * t->cols; ++k) grads[t->offset + k] *= 1.01f;
  }
  int checked = 0;
  double worst_l2 = 0;
  std::string worst_tensor;
  for (int t = 0; t < mp_gpt_num_tensors(f.gpt); ++t) {
    const mp_param_tensor *tensor = mp_gpt_tensor_at(f.gpt, t);
    const size_t n = tensor->rows * tensor->cols;
    const float *g = grads + tensor->offset;
    double tensor_max = 0;
    for (size_t i = 0; i < n; ++i) tensor_max = std::fmax(tensor_max, std::fabs(g[i]));
    std::vector<size_t> sample;
    for (size_t k = 0; k < 3; ++k) sample.push_back((k * 7919) % n);
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    const size_t largest = std::min(n, (size_t)kLargest);
    std::partial_sort(order.begin(), order.begin() + largest, order.end(),
                      [g](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
    for (size_t k = 0; k < largest; ++k) {
      if (std::find(sample.begin(), sample.end(), order[k]) == sample.end()) {
        sample.push_back(order[k]);
      }
    }
    const float h = (float)std::fmin(kMaxStep, kStepTimesGradient / tensor_max);
    double error2 = 0, numeric2 = 0;
    for (const size_t e : sample) {
      const size_t i = tensor->offset + e;
      const double numeric = Derivative(&f, &params[i], h, inputs, targets);
      EXPECT_NEAR(grads[i], numeric, 1e-2 * std::fabs(numeric) + 2e-3 * tensor_max)
          << tensor->name << " element " << e;
      error2 += (grads[i] - numeric) * (grads[i] - numeric);
      numeric2 += numeric * numeric;
    }
    ASSERT_GT(numeric2, 0) << tensor->name << ": no gradient in the sample checks nothing";
    const double relative_l2 = std::sqrt(error2 / numeric2);
    EXPECT_LE(relative_l2, kRelativeL2)
        << tensor->name << ": relative L2 error of the gradient over " << sample.size()
        << " sampled elements (largest gradient " << tensor_max << ")";
    if (relative_l2 > worst_l2) {
      worst_l2 = relative_l2;
      worst_tensor = tensor->name;
    }
    if (std::getenv("MP_TEST_VERBOSE") != nullptr) {  // each tensor's numbers, for tuning
      std::printf("%-24s largest %.2e  relative L2 %.2e\n", tensor->name, tensor_max,
                  relative_l2);
    }
    ++checked;
  }
  EXPECT_EQ(checked, mp_gpt_num_tensors(f.gpt));
  std::printf("%d tensors; worst relative L2 error %.2e (%s)\n", checked, worst_l2,
              worst_tensor.c_str());
}

TEST(GptModel, GradientMatchesFiniteDifferences) {
  CheckGradientAgainstFiniteDifferences(model_json(20, 4, 8, 2, 2));
}

// Llama 3's block: grouped-query attention (2 query heads per kv head), no biases, untied head.
TEST(GptModel, LlamaGradientMatchesFiniteDifferences) {
  CheckGradientAgainstFiniteDifferences(
      llama_json(20, 4, 16, 4, 2, ", \"kv_heads\": 2, \"bias\": false",
                 ", \"tie_embedding\": false"));
}

// Qwen2's: biases on q, k and v only, multi-query attention (one kv head), tied head.
TEST(GptModel, QwenGradientMatchesFiniteDifferences) {
  CheckGradientAgainstFiniteDifferences(
      llama_json(20, 4, 16, 4, 2, ", \"kv_heads\": 1, \"bias\": \"qkv\""));
}

// Biases everywhere (gate, up and both projections too), multi-head.
TEST(GptModel, LlamaWithEveryBiasGradientMatchesFiniteDifferences) {
  CheckGradientAgainstFiniteDifferences(
      llama_json(20, 4, 16, 4, 1, ", \"bias\": true", ", \"tie_embedding\": false"));
}

// The Llama family's tensor table: q, k, v and gate, up apart (Hugging Face's tensors), no
// position table, RMSNorm without biases, an untied head at the end; as many parameters as the
// description counts.
TEST(GptModel, LaysOutTheLlamaFamily) {
  Fixture f;
  ASSERT_TRUE(f.make(llama_json(64, 8, 16, 4, 2, ", \"kv_heads\": 2, \"bias\": false",
                                ", \"tie_embedding\": false"),
                     1, 8))
      << f.err.message;
  const char *const names[] = {
      "embedding.wte",        "block.0.ln1.weight",     "block.0.q.weight",
      "block.0.k.weight",     "block.0.v.weight",       "block.0.attn_proj.weight",
      "block.0.ln2.weight",   "block.0.gate.weight",    "block.0.up.weight",
      "block.0.fc_proj.weight"};
  const size_t shapes[][2] = {{64, 16}, {16, 1}, {16, 16}, {8, 16}, {8, 16},
                              {16, 16}, {16, 1}, {24, 16}, {24, 16}, {16, 24}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(f.gpt, (int)i);
    EXPECT_STREQ(t->name, names[i]);
    EXPECT_EQ(t->rows, shapes[i][0]) << names[i];
    EXPECT_EQ(t->cols, shapes[i][1]) << names[i];
  }
  const int n = mp_gpt_num_tensors(f.gpt);
  ASSERT_EQ(n, 1 + 2 * 9 + 2);
  EXPECT_STREQ(mp_gpt_tensor_at(f.gpt, n - 2)->name, "final_norm.weight");
  EXPECT_STREQ(mp_gpt_tensor_at(f.gpt, n - 1)->name, "lm_head.weight");
  EXPECT_EQ(mp_gpt_find_tensor(f.gpt, "embedding.wpe"), nullptr);
  EXPECT_EQ(mp_gpt_find_tensor(f.gpt, "block.0.ln1.bias"), nullptr);
  EXPECT_EQ((int64_t)mp_gpt_num_params(f.gpt), mp_model_params(f.model));
  // Qwen2's q-k-v biases, and a tied head: no lm_head.weight.
  Fixture q;
  ASSERT_TRUE(q.make(llama_json(64, 8, 16, 4, 1, ", \"kv_heads\": 1, \"bias\": \"qkv\""), 1, 8))
      << q.err.message;
  EXPECT_EQ(mp_gpt_find_tensor(q.gpt, "block.0.q.bias")->rows, 16u);
  EXPECT_EQ(mp_gpt_find_tensor(q.gpt, "block.0.k.bias")->rows, 4u);
  EXPECT_EQ(mp_gpt_find_tensor(q.gpt, "block.0.attn_proj.bias"), nullptr);
  EXPECT_EQ(mp_gpt_find_tensor(q.gpt, "lm_head.weight"), nullptr);
  EXPECT_EQ((int64_t)mp_gpt_num_params(q.gpt), mp_model_params(q.model));
}

TEST(GptModel, MicroBatchesAccumulateToTheWholeBatchGradient) {
  Fixture whole, half;
  const std::string json = model_json(20, 4, 8, 2, 1);
  ASSERT_TRUE(whole.make(json, 2, 4)) << whole.err.message;
  ASSERT_TRUE(half.make(json, 1, 4)) << half.err.message;
  mp_gpt_init_params(whole.gpt, 5);
  mp_gpt_init_params(half.gpt, 5);
  std::vector<int32_t> inputs = {1, 5, 9, 2, 7, 7, 0, 19}, targets = {5, 9, 2, 3, 7, 0, 19, 4};
  mp_gpt_zero_grads(whole.gpt);
  double loss = mp_gpt_forward(whole.gpt, inputs.data(), targets.data(), 1.0f);
  mp_gpt_backward(whole.gpt);
  mp_gpt_zero_grads(half.gpt);
  double loss_sum = 0;
  for (int m = 0; m < 2; ++m) {
    loss_sum += mp_gpt_forward(half.gpt, inputs.data() + 4 * m, targets.data() + 4 * m, 0.5f);
    mp_gpt_backward(half.gpt);
  }
  EXPECT_NEAR(loss, loss_sum / 2, 1e-6);
  for (size_t i = 0; i < mp_gpt_num_params(whole.gpt); ++i) {
    ASSERT_NEAR(mp_gpt_grads(whole.gpt)[i], mp_gpt_grads(half.gpt)[i], 1e-6) << i;
  }
}

TEST(GptModel, LlmcCheckpointRoundTrip) {
  Fixture a, b;
  const std::string json = model_json(50, 8, 16, 2, 2);
  ASSERT_TRUE(a.make(json, 1, 8));
  ASSERT_TRUE(b.make(json, 1, 8));
  mp_gpt_init_params(a.gpt, 11);
  const std::string path = temp_path("roundtrip.bin");
  ASSERT_EQ(mp_gpt_save_llmc(a.gpt, path.c_str(), &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_gpt_load_llmc(b.gpt, path.c_str(), &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(std::memcmp(mp_gpt_params(a.gpt), mp_gpt_params(b.gpt),
                        mp_gpt_num_params(a.gpt) * sizeof(float)),
            0);
  // The header's fields; the tensors' order is LlmcFileIsWhatLlmcWrites's business.
  FILE *file = fopen(path.c_str(), "rb");
  ASSERT_NE(file, nullptr);
  std::vector<int32_t> header(256);
  ASSERT_EQ(fread(header.data(), 4, 256, file), 256u);
  EXPECT_EQ(header[0], 20240326);
  EXPECT_EQ(header[1], 3);
  EXPECT_EQ(header[7], 64);
  fclose(file);
}

// llm.c's tensor of each of ours: its index in llm.c's file order and the layer (-1: none).
struct LlmcPlace {
  int index;
  int layer;
};

LlmcPlace llmc_place(const std::string &name) {
  static const char *const kBlock[] = {"ln1.weight",     "ln1.bias",       "qkv.weight",
                                       "qkv.bias",       "attn_proj.weight", "attn_proj.bias",
                                       "ln2.weight",     "ln2.bias",       "fc.weight",
                                       "fc.bias",        "fc_proj.weight", "fc_proj.bias"};
  if (name == "embedding.wte") return {0, -1};
  if (name == "embedding.wpe") return {1, -1};
  if (name == "final_norm.weight") return {14, -1};
  if (name == "final_norm.bias") return {15, -1};
  int layer = -1, consumed = 0;
  if (std::sscanf(name.c_str(), "block.%d.%n", &layer, &consumed) == 1 && consumed > 0) {
    for (int k = 0; k < 12; ++k) {
      if (name.substr((size_t)consumed) == kBlock[k]) return {2 + k, layer};
    }
  }
  return {-1, -1};
}

// The file mpengine writes for llm.c is the one llm.c's own train_gpt2.py write_model writes:
// tests/engine/testdata/llmc_tiny_gpt2.bin comes from tools/bench/llmc_golden.py, which follows
// write_model with no knowledge of mpengine (element j of llm.c's k-th tensor, stacked over the
// layers, is (k + 1) * 1000 + j; wte's padding rows are zero). Here the same numbers go into
// the flat array by tensor name through the tensor table, and the writer must produce those
// very bytes (a tensor or a layer out of llm.c's order, a wrong header field: different bytes),
// and the reader must put the golden file's numbers back under the right names.
TEST(GptModel, LlmcFileIsWhatLlmcWrites) {
  mp_model *model = nullptr;
  mp_param_layout *layout = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_parse_text(model_json(10, 4, 8, 2, 2).c_str(), "m.json", &model, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_param_layout_create(model, 4, &layout, &err), MP_OK) << err.message;
  const mp_model_config *c = mp_param_layout_config(layout);
  ASSERT_EQ(c->padded_vocab_size, 64);
  std::vector<float> params(mp_param_layout_num_params(layout), -1.0f);
  for (int i = 0; i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    const LlmcPlace place = llmc_place(t->name);
    ASSERT_GE(place.index, 0) << "no llm.c tensor for " << t->name;
    const size_t n = t->rows * t->cols;
    for (size_t e = 0; e < n; ++e) {
      const size_t j = (place.layer >= 0 ? (size_t)place.layer * n : 0) + e;
      const bool padding = place.index == 0 && e >= (size_t)c->vocab_size * t->cols;
      params[t->offset + e] = padding ? 0.0f : (float)((place.index + 1) * 1000 + (int)j);
    }
  }
  const std::string path = temp_path("mpengine_llmc.bin");
  ASSERT_EQ(mp_llmc_save(layout, params.data(), path.c_str(), &err), MP_OK)
      << err.message;
  auto read_all = [](const std::string &file_path) {
    std::vector<unsigned char> bytes;
    FILE *file = fopen(file_path.c_str(), "rb");
    if (file == nullptr) return bytes;
    for (int ch; (ch = fgetc(file)) != EOF;) bytes.push_back((unsigned char)ch);
    fclose(file);
    return bytes;
  };
  const std::string golden_path = "tests/engine/testdata/llmc_tiny_gpt2.bin";
  const std::vector<unsigned char> golden = read_all(golden_path);
  const std::vector<unsigned char> ours = read_all(path);
  ASSERT_EQ(golden.size(), 1024 + 4 * params.size()) << golden_path;
  ASSERT_EQ(ours.size(), golden.size());
  for (size_t b = 0; b < golden.size(); ++b) {
    ASSERT_EQ(ours[b], golden[b]) << "first different byte at " << b << " (float "
                                  << ((long)b - 1024) / 4 << " after the header)";
  }
  std::vector<float> loaded(params.size(), -1.0f);
  ASSERT_EQ(mp_llmc_load(layout, loaded.data(), golden_path.c_str(), &err), MP_OK)
      << err.message;
  for (int i = 0; i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    for (size_t e = 0; e < t->rows * t->cols; ++e) {
      ASSERT_EQ(loaded[t->offset + e], params[t->offset + e]) << t->name << "[" << e << "]";
    }
  }
  mp_param_layout_free(layout);
  mp_model_free(model);
}

TEST(GptModel, Bf16CheckpointLoads) {
  Fixture f;
  ASSERT_TRUE(f.make(model_json(50, 8, 16, 2, 1), 1, 8));
  const size_t n = mp_gpt_num_params(f.gpt);
  std::vector<int32_t> header(256, 0);
  header[0] = 20240326;
  header[1] = 5;
  header[2] = 8;
  header[3] = 50;
  header[4] = 1;
  header[5] = 2;
  header[6] = 16;
  header[7] = 64;
  const std::string path = temp_path("bf16.bin");
  FILE *file = fopen(path.c_str(), "wb");
  fwrite(header.data(), 4, 256, file);
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits = 0x3fc0;  // bf16 1.5
    fwrite(&bits, 2, 1, file);
  }
  fclose(file);
  ASSERT_EQ(mp_gpt_load_llmc(f.gpt, path.c_str(), &f.err), MP_OK) << f.err.message;
  EXPECT_FLOAT_EQ(mp_gpt_params(f.gpt)[0], 1.5f);
  EXPECT_FLOAT_EQ(mp_gpt_params(f.gpt)[n - 1], 1.5f);
}

// llm.c's train_gpt2.py pads the vocabulary to a multiple of 128 (with zero rows), mpengine to
// 64: a file of 300 tokens padded to 384 loads into the layout padded to 320, exactly.
TEST(GptModel, LoadsAnLlmcFilePaddedOtherwise) {
  Fixture a, b;
  const std::string json = model_json(300, 8, 16, 2, 1);
  ASSERT_TRUE(a.make(json, 1, 8)) << a.err.message;
  ASSERT_TRUE(b.make(json, 1, 8)) << b.err.message;
  ASSERT_EQ(mp_gpt_get_config(a.gpt)->padded_vocab_size, 320);
  mp_gpt_init_params(a.gpt, 21);
  const size_t C = 16, n = mp_gpt_num_params(a.gpt);
  float *params = mp_gpt_params(a.gpt);
  for (size_t i = 300 * C; i < 320 * C; ++i) params[i] = 0.0f;  // the layout's padding
  const std::string ours = temp_path("padded64.bin"), llmc = temp_path("padded128.bin");
  ASSERT_EQ(mp_gpt_save_llmc(a.gpt, ours.c_str(), &a.err), MP_OK) << a.err.message;
  // The same model as llm.c writes it: header padded_vocab_size 384, wte with 384 rows.
  std::vector<char> file(1024 + n * 4);
  FILE *in = fopen(ours.c_str(), "rb");
  ASSERT_NE(in, nullptr);
  ASSERT_EQ(fread(file.data(), 1, file.size(), in), file.size());
  fclose(in);
  std::vector<char> padded(file.begin(), file.begin() + 1024);
  int32_t header[256];
  std::memcpy(header, padded.data(), sizeof header);
  header[7] = 384;
  std::memcpy(padded.data(), header, sizeof header);
  const char *wte = file.data() + 1024;
  padded.insert(padded.end(), wte, wte + 300 * C * 4);
  std::vector<float> zeros(84 * C, 0.0f);
  const char *zeros_bytes = reinterpret_cast<const char *>(zeros.data());
  padded.insert(padded.end(), zeros_bytes, zeros_bytes + zeros.size() * 4);
  padded.insert(padded.end(), wte + 320 * C * 4, wte - 1024 + file.size());
  FILE *out = fopen(llmc.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(fwrite(padded.data(), 1, padded.size(), out), padded.size());
  fclose(out);
  float *loaded = mp_gpt_params(b.gpt);
  for (size_t i = 0; i < n; ++i) loaded[i] = -1.0f;
  ASSERT_EQ(mp_gpt_load_llmc(b.gpt, llmc.c_str(), &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(std::memcmp(loaded, params, n * sizeof(float)), 0);
  // A padded size below the vocabulary cannot hold it.
  header[7] = 256;
  std::memcpy(padded.data(), header, sizeof header);
  out = fopen(llmc.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(fwrite(padded.data(), 1, padded.size(), out), padded.size());
  fclose(out);
  EXPECT_EQ(mp_gpt_load_llmc(b.gpt, llmc.c_str(), &b.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(b.err.message).find("padded_vocab_size 256 is below the vocabulary 300"),
            std::string::npos)
      << b.err.message;
}

TEST(GptModel, MismatchedCheckpointNamesTheDifference) {
  Fixture small, big;
  ASSERT_TRUE(small.make(model_json(50, 8, 16, 2, 2), 1, 8));
  ASSERT_TRUE(big.make(model_json(50, 8, 16, 2, 3), 1, 8));
  mp_gpt_init_params(small.gpt, 1);
  const std::string path = temp_path("small.bin");
  ASSERT_EQ(mp_gpt_save_llmc(small.gpt, path.c_str(), &small.err), MP_OK);
  ASSERT_EQ(mp_gpt_load_llmc(big.gpt, path.c_str(), &big.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(big.err.message),
            path + ": num_layers is 2 in the checkpoint but 3 in the model description (m.json); "
                   "give the description that matches the checkpoint");
  // A truncated file.
  FILE *file = fopen(path.c_str(), "r+b");
  ASSERT_EQ(ftruncate(fileno(file), 1024 + 100), 0);
  fclose(file);
  ASSERT_EQ(mp_gpt_load_llmc(small.gpt, path.c_str(), &small.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(small.err.message).find("holds 100 bytes of parameters"),
            std::string::npos)
      << small.err.message;
  // Not a checkpoint at all.
  file = fopen(path.c_str(), "wb");
  std::vector<int32_t> zeros(256, 7);
  fwrite(zeros.data(), 4, 256, file);
  fclose(file);
  ASSERT_EQ(mp_gpt_load_llmc(small.gpt, path.c_str(), &small.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(small.err.message),
            path + ": bad magic 7 (expected 20240326); not an llm.c GPT-2 checkpoint");
}

std::string without(std::string text, const std::string &part) {
  const size_t at = text.find(part);
  if (at != std::string::npos) text.erase(at, part.size());
  return text;
}

TEST(GptModel, RefusesModelsTheRuntimeCannotRun) {
  Fixture f;
  EXPECT_FALSE(f.make(model_json(50, 8, 16, 2, 2, ", \"dropout\": 0.1"), 1, 8));
  EXPECT_EQ(std::string(f.err.message),
            "m.json: $.layers[1] (block.0): dropout > 0 (the runtime trains without dropout); the "
            "runtime trains GPT-2 and Llama-family models (an embedding, transformer blocks of "
            "one shape, a final norm, an LM head); this model can be planned but not run");
  const std::pair<std::string, const char *> refused[] = {
      {model_json(50, 8, 16, 2, 2, ", \"rope_theta\": 10000"),
       "$.layers[0] (embedding): rotary embeddings with a learned position table too"},
      {without(llama_json(50, 8, 16, 4, 2, ""), "\"rope_theta\": 10000, "),
       "$.layers[0] (embedding): a model without rotary embeddings needs a learned position"},
  };
  for (const auto &[json, what] : refused) {
    Fixture r;
    EXPECT_FALSE(r.make(json, 1, 8)) << what;
    EXPECT_EQ(std::string(r.err.message).substr(0, 8 + std::strlen(what)),
              std::string("m.json: ") + what);
  }
  Fixture g;
  EXPECT_FALSE(g.make(model_json(50, 8, 16, 2, 2), 1, 16));
  EXPECT_EQ(std::string(g.err.message),
            "m.json: sequence length 16 exceeds the position table ($.layers[0].max_positions = "
            "8); shorten seq_len or raise max_positions");
  // llm.c's files are GPT-2's.
  Fixture l;
  ASSERT_TRUE(l.make(llama_json(64, 8, 16, 4, 1, ", \"kv_heads\": 2"), 1, 8)) << l.err.message;
  EXPECT_EQ(mp_gpt_save_llmc(l.gpt, temp_path("llama.bin").c_str(), &l.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(l.err.message).find("llm.c's checkpoint files hold GPT-2 models"),
            std::string::npos)
      << l.err.message;
}

}  // namespace
