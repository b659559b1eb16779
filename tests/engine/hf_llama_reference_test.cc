// tests/engine/hf_llama_reference_test.cc — the Llama family against Hugging Face transformers
// itself: tiny LlamaForCausalLM and Qwen2ForCausalLM checkpoints written by transformers 4.46.3
// (tools/bench/hf_llama_golden.py, committed under testdata/) are imported (config.json ->
// model description, topology/hf_config.h), loaded (engine/weights/weight_source.h) and run through
// the one-rank chain; the loss and every parameter's gradient must be transformers' (golden.json):
// the loss within 1e-5, each gradient's L2 norm within 1e-4 and its first values within 1e-4 of
// the tensor's scale. This covers RMSNorm, SwiGLU, rotary embeddings with Llama 3.1's scaling,
// grouped- and multi-query attention, q-k-v biases, tied and untied heads and vocabulary padding,
// and the mapping of Hugging Face's tensor names onto ours.
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
#include "engine/model/stage_cpu.h"
#include "tests/support/one_rank_model.h"
#include "engine/weights/weight_source.h"
#include "topology/hf_config.h"
#include "topology/model.h"

namespace {

std::string Read(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Hugging Face's name of each of our tensors (written out here, not taken from the loader).
std::string HfName(const std::string &ours) {
  static const std::map<std::string, std::string> kBlock = {
      {"ln1.weight", "input_layernorm.weight"},
      {"q.weight", "self_attn.q_proj.weight"},
      {"k.weight", "self_attn.k_proj.weight"},
      {"v.weight", "self_attn.v_proj.weight"},
      {"q.bias", "self_attn.q_proj.bias"},
      {"k.bias", "self_attn.k_proj.bias"},
      {"v.bias", "self_attn.v_proj.bias"},
      {"attn_proj.weight", "self_attn.o_proj.weight"},
      {"ln2.weight", "post_attention_layernorm.weight"},
      {"gate.weight", "mlp.gate_proj.weight"},
      {"up.weight", "mlp.up_proj.weight"},
      {"fc_proj.weight", "mlp.down_proj.weight"},
  };
  if (ours == "embedding.wte") return "model.embed_tokens.weight";
  if (ours == "final_norm.weight") return "model.norm.weight";
  if (ours == "lm_head.weight") return "lm_head.weight";
  int layer = -1, used = 0;
  if (std::sscanf(ours.c_str(), "block.%d.%n", &layer, &used) != 1) return "";
  const auto it = kBlock.find(ours.substr((size_t)used));
  return it == kBlock.end() ? "" : "model.layers." + std::to_string(layer) + "." + it->second;
}

void CheckAgainstTransformers(const std::string &name) {
  const std::string dir = "tests/engine/testdata/" + name;
  cJSON *golden = cJSON_Parse(Read(dir + "/golden.json").c_str());
  ASSERT_NE(golden, nullptr) << dir << "/golden.json";
  const int B = cJSON_GetObjectItem(golden, "B")->valueint;
  const int T = cJSON_GetObjectItem(golden, "T")->valueint;
  std::vector<int32_t> inputs, targets;
  const cJSON *x = nullptr;
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(golden, "inputs")) inputs.push_back(x->valueint);
  cJSON_ArrayForEach(x, cJSON_GetObjectItem(golden, "targets")) targets.push_back(x->valueint);
  ASSERT_EQ(inputs.size(), (size_t)B * T);

  mp_error err = MP_ERROR_INITIALIZER;
  mp_hf_import_options options = MP_HF_IMPORT_OPTIONS_INITIALIZER;
  options.seq_len = T;
  cJSON *description = nullptr;
  ASSERT_EQ(MP_OK, mp_hf_config_to_model_json(dir.c_str(), &options, &description, nullptr, &err))
      << err.message;
  char *text = cJSON_PrintUnformatted(description);
  cJSON_Delete(description);
  mp_model *model = nullptr;
  ASSERT_EQ(MP_OK, mp_model_parse_text(text, (name + ".json").c_str(), &model, &err))
      << err.message;
  free(text);
  mp_gpt *gpt = nullptr;
  ASSERT_EQ(MP_OK, mp_gpt_create(model, B, T, &gpt, &err)) << err.message;
  mp_weight_source *source = nullptr;
  ASSERT_EQ(MP_OK, mp_weight_source_open(mp_gpt_get_layout(gpt), dir.c_str(), &source, &err))
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
  EXPECT_NEAR(loss, expected, 1e-5 * expected) << name << ": the mean cross-entropy";

  const cJSON *grads = cJSON_GetObjectItem(golden, "grads");
  int compared = 0;
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    const std::string hf = HfName(t->name);
    const cJSON *g = cJSON_GetObjectItem(grads, hf.c_str());
    ASSERT_NE(g, nullptr) << name << ": no gradient of " << hf << " (ours " << t->name << ")";
    const float *ours = mp_gpt_grads(gpt) + t->offset;
    double squares = 0;
    for (size_t k = 0; k < t->rows * t->cols; ++k) squares += (double)ours[k] * ours[k];
    const double norm = cJSON_GetObjectItem(g, "norm")->valuedouble;
    EXPECT_NEAR(std::sqrt(squares), norm, 1e-4 * norm) << name << ": |gradient| of " << t->name;
    size_t k = 0;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(g, "first")) {
      EXPECT_NEAR(ours[k], x->valuedouble, 1e-4 * norm)
          << name << ": " << t->name << "[" << k << "]";
      ++k;
    }
    ++compared;
  }
  // Every tensor of the checkpoint is one of ours (the tied head is embed_tokens).
  EXPECT_EQ(compared, cJSON_GetArraySize(grads)) << name;
  std::printf("%s: loss %.7f (transformers %.7f), %d gradients compared\n", name.c_str(), loss,
              expected, compared);
  mp_gpt_free(gpt);
  mp_model_free(model);
  cJSON_Delete(golden);
}

TEST(HfLlamaReference, Llama3LossAndGradientsAreTransformers) {
  CheckAgainstTransformers("hf_tiny_llama3");
}

TEST(HfLlamaReference, Qwen2LossAndGradientsAreTransformers) {
  CheckAgainstTransformers("hf_tiny_qwen2");
}

}  // namespace
