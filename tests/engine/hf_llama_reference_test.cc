// tests/engine/hf_llama_reference_test.cc — the Llama family against Hugging Face transformers
// itself: tiny LlamaForCausalLM and Qwen2ForCausalLM checkpoints written by transformers 4.46.3
// (tools/bench/hf_llama_golden.py, committed under testdata/) are imported (config.json ->
// model description, topology/hf_config.h), loaded (engine/weights/weight_source.h) and run through
// the one-rank chain; the loss and every parameter's gradient must be transformers' (golden.json):
// the loss within 1e-5, each gradient's L2 norm within 1e-4 and its first values within 1e-4 of
// the tensor's scale. This covers RMSNorm, SwiGLU, rotary embeddings with Llama 3.1's scaling,
// grouped- and multi-query attention, q-k-v biases, tied and untied heads and vocabulary padding,
// and the mapping of Hugging Face's tensor names onto ours.
//
// Mixtures of experts (issue 33) the same way: tiny MixtralForCausalLM and Qwen2MoeForCausalLM
// checkpoints (tools/bench/moe_model_golden.py, output_router_logits with router_aux_loss_coef
// set) load, and one micro-batch's loss is transformers' cross-entropy plus its load-balancing
// loss over all layers; every expert's, router's and shared expert's gradient is compared
// piece by piece (our stacked expert tensors hold many of theirs).
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

// A run of rows of one of our tensors that is one Hugging Face tensor.
struct Piece {
  std::string hf;
  size_t row0, rows;
};

// Hugging Face's tensors of each of ours: a dense tensor is one; a mixture of experts' stacked
// tensors are each expert's (Mixtral: block_sparse_moe.experts.e.w1 gate, w3 up, w2 down;
// Qwen2-MoE: mlp.experts.e.{gate,up,down}_proj and the shared expert's).
std::vector<Piece> HfPieces(const std::string &ours, const mp_model_config *c, bool mixtral,
                            size_t rows) {
  int layer = -1, used = 0;
  if (c->moe_experts == 0 || std::sscanf(ours.c_str(), "block.%d.%n", &layer, &used) != 1) {
    return {{HfName(ours), 0, rows}};
  }
  const std::string role = ours.substr((size_t)used);
  const std::string base = "model.layers." + std::to_string(layer) +
                           (mixtral ? ".block_sparse_moe." : ".mlp.");
  const size_t E = (size_t)c->moe_experts, F = (size_t)c->ffn_channels;
  const size_t C = (size_t)c->channels, Fs = (size_t)c->moe_shared_ffn;
  const std::string gate = mixtral ? "w1" : "gate_proj", up = mixtral ? "w3" : "up_proj",
                    down = mixtral ? "w2" : "down_proj";
  std::vector<Piece> pieces;
  if (role == "router.weight") return {{base + "gate.weight", 0, E}};
  if (role == "expert_fc1.weight") {
    for (size_t e = 0; e < E; ++e) {
      const std::string expert = base + "experts." + std::to_string(e) + ".";
      pieces.push_back({expert + gate + ".weight", e * 2 * F, F});
      pieces.push_back({expert + up + ".weight", e * 2 * F + F, F});
    }
    return pieces;
  }
  if (role == "expert_fc2.weight") {
    for (size_t e = 0; e < E; ++e) {
      pieces.push_back({base + "experts." + std::to_string(e) + "." + down + ".weight", e * C, C});
    }
    return pieces;
  }
  if (role == "shared_fc1.weight") {
    return {{base + "shared_expert.gate_proj.weight", 0, Fs},
            {base + "shared_expert.up_proj.weight", Fs, Fs}};
  }
  if (role == "shared_fc2.weight") return {{base + "shared_expert.down_proj.weight", 0, C}};
  if (role == "shared_gate.weight") return {{base + "shared_expert_gate.weight", 0, 1}};
  return {{HfName(ours), 0, rows}};
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
  EXPECT_NEAR(loss, expected, 1e-5 * expected)
      << name << ": the mean cross-entropy (+ the router's auxiliary loss for an MoE)";
  const mp_model_config *config = mp_param_layout_config(mp_gpt_get_layout(gpt));
  const bool mixtral =
      std::string(cJSON_GetObjectItem(golden, "architecture")->valuestring) == "MixtralForCausalLM";

  const cJSON *grads = cJSON_GetObjectItem(golden, "grads");
  int compared = 0;
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    for (const Piece &piece : HfPieces(t->name, config, mixtral, t->rows)) {
      const std::string &hf = piece.hf;
      const cJSON *g = cJSON_GetObjectItem(grads, hf.c_str());
      ASSERT_NE(g, nullptr) << name << ": no gradient of " << hf << " (ours " << t->name << ")";
      const float *ours = mp_gpt_grads(gpt) + t->offset + piece.row0 * t->cols;
      double squares = 0;
      for (size_t k = 0; k < piece.rows * t->cols; ++k) squares += (double)ours[k] * ours[k];
      const double norm = cJSON_GetObjectItem(g, "norm")->valuedouble;
      EXPECT_NEAR(std::sqrt(squares), norm, 1e-4 * norm) << name << ": |gradient| of " << hf;
      size_t k = 0;
      cJSON_ArrayForEach(x, cJSON_GetObjectItem(g, "first")) {
        EXPECT_NEAR(ours[k], x->valuedouble, 1e-4 * norm) << name << ": " << hf << "[" << k << "]";
        ++k;
      }
      ++compared;
    }
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

TEST(HfMoeReference, MixtralLossWithAuxAndGradientsAreTransformers) {
  CheckAgainstTransformers("hf_tiny_mixtral");
}

TEST(HfMoeReference, Qwen2MoeLossWithAuxAndGradientsAreTransformers) {
  CheckAgainstTransformers("hf_tiny_qwen2_moe");
}

}  // namespace
