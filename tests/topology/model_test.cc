// tests/topology/model_test.cc — model descriptions: parameter counts users check against the
// papers and llm.c, per-layer costs against closed forms, and the exact message for each mistake.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "topology/layer_cost.h"
#include "topology/model.h"

namespace {

struct Loaded {
  mp_model *model = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Loaded() { mp_model_free(model); }
};

// 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) = 12 l h^2 + 13 l h + (V + s) h: the count from
// Narayanan et al. (2021). It leaves out the final layernorm (2h), which llm.c's count includes.
int64_t closed_form_params(int64_t l, int64_t h, int64_t vocab, int64_t seq) {
  return 12 * l * h * h + 13 * l * h + (vocab + seq) * h;
}

void expect_example(const char *file, int64_t l, int64_t h, int64_t vocab, int64_t seq) {
  Loaded m;
  ASSERT_EQ(mp_model_load(file, &m.model, &m.err), MP_OK) << m.err.message;
  EXPECT_EQ(mp_model_num_transformer_layers(m.model), l) << file;
  EXPECT_EQ(mp_model_params(m.model), closed_form_params(l, h, vocab, seq) + 2 * h) << file;
}

TEST(ModelExamples, Gpt2SmallMatchesLlmC) {
  Loaded m;
  ASSERT_EQ(mp_model_load("examples/models/gpt2-124m.json", &m.model, &m.err), MP_OK)
      << m.err.message;
  EXPECT_EQ(mp_model_params(m.model), 124439808);
  EXPECT_EQ(mp_model_num_layers(m.model), 15);
  EXPECT_STREQ(mp_model_layer(m.model, 1)->name, "block.0");
  EXPECT_STREQ(mp_model_layer(m.model, 13)->name, "final_norm");
  EXPECT_STREQ(mp_model_layer(m.model, 14)->name, "lm_head");
}

TEST(ModelExamples, Gpt2FamilyMatchesClosedForm) {
  expect_example("examples/models/gpt2-124m.json", 12, 768, 50257, 1024);
  expect_example("examples/models/gpt2-350m.json", 24, 1024, 50257, 1024);
  expect_example("examples/models/gpt2-774m.json", 36, 1280, 50257, 1024);
  expect_example("examples/models/gpt2-1.5b.json", 48, 1600, 50257, 1024);
}

TEST(ModelExamples, Gpt3And1TMatchClosedForm) {
  expect_example("examples/models/gpt3-175b.json", 96, 12288, 50257, 2048);
  expect_example("examples/models/gpt-1t.json", 128, 25600, 51200, 2048);
  Loaded m;
  ASSERT_EQ(mp_model_load("examples/models/gpt3-175b.json", &m.model, &m.err), MP_OK);
  EXPECT_NEAR(mp_model_params(m.model) / 1e9, 174.6, 0.1);  // the paper's "175B"
}

TEST(ModelExamples, TinyGptLoads) {
  Loaded m;
  ASSERT_EQ(mp_model_load("examples/models/tiny-gpt.json", &m.model, &m.err), MP_OK)
      << m.err.message;
  EXPECT_EQ(mp_model_params(m.model), closed_form_params(4, 64, 128, 64) + 2 * 64);
}

mp_model *parse(const std::string &layers, Loaded *m, const std::string &top = "") {
  std::string text = "{\"name\": \"t\", \"vocab_size\": 100, \"seq_len\": 16, " + top +
                     "\"layers\": [" + layers + "]}";
  mp_model_parse_text(text.c_str(), "m.json", &m->model, &m->err);
  return m->model;
}

TEST(LayerCost, TransformerFlopsMatchMegatron) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4}", &m), nullptr)
      << m.err.message;
  mp_cost_shape shape = {3, 16, 2, false, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(mp_model_layer(m.model, 0), &shape, &cost);
  const double b = 3, s = 16, h = 64, a = 4;
  EXPECT_DOUBLE_EQ(cost.forward_flops, 24 * b * s * h * h + 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(cost.backward_flops, 2 * cost.forward_flops);
  EXPECT_DOUBLE_EQ(cost.recompute_flops[MP_RECOMPUTE_SELECTIVE], 4 * b * s * s * h);
  EXPECT_DOUBLE_EQ(cost.recompute_flops[MP_RECOMPUTE_FULL], cost.forward_flops);
  EXPECT_EQ(cost.params, 12 * 64 * 64 + 13 * 64);
  // Kept per token: 16h bf16 elements, a*s attention probabilities, 4 fp32 layernorm statistics.
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_NONE], b * s * (16 * h * 2 + a * s * 2 + 16));
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_SELECTIVE], b * s * (16 * h * 2 + a * 4 + 16));
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_FULL], b * s * h * 2);
  EXPECT_DOUBLE_EQ(cost.output_bytes, b * s * h * 2);
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// section 4.1: with dropout a layer keeps 34sbh + 5as^2b bytes in 16-bit activations (s sequence,
// b micro-batch, h hidden, a heads): 11sbh + 5as^2b for attention, 19sbh for the MLP, 4sbh for
// the two layernorms. Table 2: selective recomputation keeps 34sbh, and with tensor parallelism
// sbh(10 + 24/t) of it stays whole on each rank (the layernorms, the two linears' inputs they
// feed, the two dropout masks). Our count adds the fp32 norm and softmax statistics.
TEST(LayerCost, ActivationsWithDropoutAreKorthikantisFormula) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"dropout\": 0.1}",
                  &m),
            nullptr)
      << m.err.message;
  mp_cost_shape shape = {3, 16, 2, false, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(mp_model_layer(m.model, 0), &shape, &cost);
  const double b = 3, s = 16, h = 64, a = 4;
  const double stats = b * s * 4 * 4;  // mean and rstd of both layernorms
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_NONE],
                   34 * s * b * h + 5 * a * s * s * b + stats);
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_SELECTIVE],
                   34 * s * b * h + stats + b * s * a * 4);
  EXPECT_DOUBLE_EQ(cost.activation_replicated_bytes[MP_RECOMPUTE_SELECTIVE], 10 * s * b * h);
  // Dropout costs memory traffic: a 1-byte mask written by each residual add and by the
  // attention dropout, which also reads the probabilities and writes its output.
  Loaded plain;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4}", &plain), nullptr);
  mp_layer_cost without;
  mp_layer_cost_compute(mp_model_layer(plain.model, 0), &shape, &without);
  EXPECT_DOUBLE_EQ(cost.forward_memory_bytes[MP_TRAFFIC_REPLICATED] -
                       without.forward_memory_bytes[MP_TRAFFIC_REPLICATED],
                   b * s * 2 * h);
  EXPECT_DOUBLE_EQ(cost.forward_memory_bytes[MP_TRAFFIC_SPLIT] -
                       without.forward_memory_bytes[MP_TRAFFIC_SPLIT],
                   b * s * a * s * 5);
  EXPECT_DOUBLE_EQ(cost.forward_flops, without.forward_flops);
}

// Megatron-Core's num_floating_point_operations (megatron/training/training.py) for a
// Llama-family model, without MoE or MTP: per layer and token, forward + backward,
//   12 h^2 (1 + kv_heads / heads + s / h)            attention (query groups, full square)
//   + 12 h^2 (f / h) x 3/2                           SwiGLU's gated MLP
// and 6 h V for the untied LM head; llama3-8b's shape.
TEST(LayerCost, LlamaFlopsAreMegatronCoresFormula) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8, "
                  "\"ffn_hidden\": 14336, \"activation\": \"swiglu\", \"norm\": \"rmsnorm\", "
                  "\"bias\": false},"
                  "{\"type\": \"lm_head\", \"hidden\": 4096, \"vocab\": 128256, "
                  "\"tie_embedding\": false}",
                  &m),
            nullptr)
      << m.err.message;
  const double b = 2, s = 8192, h = 4096, heads = 32, groups = 8, f = 14336, v = 128256;
  mp_cost_shape shape = {2, 8192, 2, false, 1, 1};
  mp_layer_cost block, head;
  mp_layer_cost_compute(mp_model_layer(m.model, 0), &shape, &block);
  mp_layer_cost_compute(mp_model_layer(m.model, 1), &shape, &head);
  const double megatron_core_block =
      12 * b * s * h * h * ((1 + groups / heads + s / h) + (f / h) * 1.5);
  EXPECT_NEAR(block.forward_flops + block.backward_flops, megatron_core_block,
              1e-12 * megatron_core_block);
  EXPECT_NEAR(head.forward_flops + head.backward_flops, 6 * b * s * h * v, 1.0);
  EXPECT_EQ(head.params, 128256 * 4096);  // untied: the last stage owns and updates it
  // RMSNorm keeps and writes one fp32 statistic per token where layernorm has two.
  Loaded ln;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8, "
                  "\"ffn_hidden\": 14336, \"activation\": \"swiglu\", \"bias\": false}",
                  &ln),
            nullptr);
  mp_layer_cost with_layernorm;
  mp_layer_cost_compute(mp_model_layer(ln.model, 0), &shape, &with_layernorm);
  EXPECT_DOUBLE_EQ(with_layernorm.forward_memory_bytes[MP_TRAFFIC_REPLICATED] -
                       block.forward_memory_bytes[MP_TRAFFIC_REPLICATED],
                   b * s * 2 * 4);
  EXPECT_DOUBLE_EQ(with_layernorm.activation_bytes[MP_RECOMPUTE_NONE] -
                       block.activation_bytes[MP_RECOMPUTE_NONE],
                   b * s * 2 * 4);
}

// The published parameter counts of the Llama-family examples (Meta's model cards, Hugging Face's
// num_parameters()): embedding and untied head of 128256 x C, RMSNorm (one vector per norm), no
// biases; Qwen2.5-0.5B ties its head and has q, k and v biases.
TEST(Model, LlamaFamilyExamplesHaveTheirPublishedParameterCounts) {
  const std::pair<const char *, int64_t> examples[] = {
      {"examples/models/llama3-8b.json", 8030261248},
      {"examples/models/llama3-70b.json", 70553706496},
      {"examples/models/llama3-405b.json", 405853388800},
      {"examples/models/qwen2.5-0.5b.json", 494032768},
  };
  for (const auto &[path, params] : examples) {
    Loaded m;
    ASSERT_EQ(mp_model_load(path, &m.model, &m.err), MP_OK) << m.err.message;
    EXPECT_EQ(mp_model_params(m.model), params) << path;
  }
  Loaded llama;
  ASSERT_EQ(mp_model_load("examples/models/llama3-8b.json", &llama.model, &llama.err), MP_OK);
  const mp_layer_spec *block = mp_model_layer(llama.model, 1);
  EXPECT_EQ(block->rope_theta, 500000.0);
  EXPECT_TRUE(block->rope_scaling.llama3);
  EXPECT_EQ(block->rope_scaling.factor, 8.0);
  EXPECT_EQ(block->rope_scaling.original_max_positions, 8192);
  EXPECT_EQ(block->bias, MP_BIAS_NONE);
  EXPECT_EQ(mp_model_layer(llama.model, 33)->norm, MP_NORM_RMSNORM);
  EXPECT_EQ(mp_model_layer(llama.model, 0)->max_positions, 0);
}

TEST(LayerCost, SwigluGroupedQueryRmsnormWithoutBias) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 8, \"kv_heads\": 2, "
                  "\"ffn_hidden\": 96, \"activation\": \"swiglu\", \"norm\": \"rmsnorm\", "
                  "\"bias\": false}",
                  &m),
            nullptr)
      << m.err.message;
  const mp_layer_spec *layer = mp_model_layer(m.model, 0);
  const int64_t h = 64, kv = 2 * 8, f = 96;  // kv width = kv_heads * head size (64 / 8)
  EXPECT_EQ(mp_layer_params(layer), h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h);
  mp_cost_shape shape = {1, 16, 4, false, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(layer, &shape, &cost);
  EXPECT_DOUBLE_EQ(cost.forward_flops,
                   2.0 * 16 * h * (h + 2 * kv) + 4.0 * 16 * 16 * h + 2.0 * 16 * h * h +
                       3 * 2.0 * 16 * h * f);
}

TEST(LayerCost, HeadEmbeddingAndCustom) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"embedding\", \"hidden\": 8},"
                  "{\"type\": \"custom\", \"name\": \"router\", \"params\": 7, "
                  "\"forward_flops_per_token\": 10, \"activation_bytes_per_token\": 3, "
                  "\"output_bytes_per_token\": 16, \"repeat\": 2},"
                  "{\"type\": \"lm_head\", \"hidden\": 8, \"tie_embedding\": false}",
                  &m),
            nullptr)
      << m.err.message;
  ASSERT_EQ(mp_model_num_layers(m.model), 4);
  EXPECT_STREQ(mp_model_layer(m.model, 1)->name, "router");
  EXPECT_STREQ(mp_model_layer(m.model, 2)->name, "router.1");
  mp_cost_shape shape = {2, 16, 2, false, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(mp_model_layer(m.model, 0), &shape, &cost);
  EXPECT_EQ(cost.params, 100 * 8 + 16 * 8);
  EXPECT_DOUBLE_EQ(cost.forward_flops, 0.0);
  mp_layer_cost_compute(mp_model_layer(m.model, 1), &shape, &cost);
  EXPECT_EQ(cost.params, 7);
  EXPECT_DOUBLE_EQ(cost.forward_flops, 32 * 10.0);
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_FULL], 32 * 3.0);
  EXPECT_DOUBLE_EQ(cost.output_bytes, 32 * 16.0);
  mp_layer_cost_compute(mp_model_layer(m.model, 3), &shape, &cost);
  EXPECT_EQ(cost.params, 100 * 8);  // untied: owns its own (V, C) table
  EXPECT_DOUBLE_EQ(cost.forward_flops, 2.0 * 32 * 8 * 100);
  EXPECT_EQ(mp_model_params(m.model), 100 * 8 + 16 * 8 + 14 + 800);
}

// Each mistake a user makes gets exactly one message naming the file and the JSON path.
struct BadInput {
  const char *layers;
  const char *top;
  const char *message;
};

class ModelBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(ModelBadInput, ExactMessage) {
  Loaded m;
  EXPECT_EQ(parse(GetParam().layers, &m, GetParam().top), nullptr);
  EXPECT_EQ(m.err.status, MP_ERR_INPUT);
  EXPECT_EQ(std::string(m.err.message), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Messages, ModelBadInput,
    ::testing::Values(
        BadInput{"{\"type\": \"transformer\", \"hiden\": 64, \"heads\": 4}", "",
                 "m.json: $.layers[0]: unknown key \"hiden\"; did you mean \"hidden\"? (known "
                 "keys: type, hidden, heads, kv_heads, ffn_hidden, norm, activation, bias, "
                 "dropout, attention, norm_eps, rope_theta, rope_scaling, repeat, moe)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"bias\": \"kv\"}", "",
                 "m.json: $.layers[0].bias: \"kv\" is not one of \"none\", \"qkv\", \"all\"; "
                 "did you mean \"qkv\"?"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"bias\": 1}", "",
                 "m.json: $.layers[0].bias: must be true, false or one of \"none\", \"qkv\", "
                 "\"all\""},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"rope_theta\": 1e4, "
                 "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
                 "",
                 "m.json: $.layers[0].rope_scaling.rope_type: \"yarn\" is not one of "
                 "\"llama3\""},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, "
                 "\"rope_scaling\": {\"rope_type\": \"llama3\"}}",
                 "",
                 "m.json: $.layers[0]: rope_scaling needs rope_theta (the rotary base it "
                 "scales)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"rope_theta\": 1e4, "
                 "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                 "\"low_freq_factor\": 4, \"high_freq_factor\": 1, "
                 "\"original_max_position_embeddings\": 8192}}",
                 "",
                 "m.json: $.layers[0].rope_scaling: high_freq_factor 1 must be above "
                 "low_freq_factor 4"},
        BadInput{"{\"type\": \"layernorm\", \"hidden\": 64, \"norm_eps\": 0}", "",
                 "m.json: $.layers[0].norm_eps: must be a positive number, got 0"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"dropout\": 1}", "",
                 "m.json: $.layers[0].dropout: 1 is not a probability in [0, 1)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"dropout\": -0.1}",
                 "", "m.json: $.layers[0].dropout: -0.1 is not a probability in [0, 1)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": \"64\", \"heads\": 4}", "",
                 "m.json: $.layers[0].hidden: must be a positive integer, got a string "
                 "(\"64\"); drop the quotes"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": -64, \"heads\": 4}", "",
                 "m.json: $.layers[0].hidden: must be a positive integer, got -64"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 0, \"heads\": 4}", "",
                 "m.json: $.layers[0].hidden: must be a positive integer, got 0"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 5}", "",
                 "m.json: $.layers[0]: hidden 64 is not divisible by heads 5; the head size "
                 "hidden / heads must be a whole number"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"kv_heads\": 3}",
                 "",
                 "m.json: $.layers[0]: heads 4 is not a multiple of kv_heads 3; each key/value "
                 "head serves a whole group of query heads"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"repeat\": 0}", "",
                 "m.json: $.layers[0].repeat: must be a positive integer, got 0"},
        BadInput{"", "", "m.json: $.layers: is empty; it needs at least 1 item"},
        BadInput{"{\"hidden\": 64}", "",
                 "m.json: $.layers[0]: missing required key \"type\" (one of \"embedding\", "
                 "\"transformer\", \"layernorm\", \"lm_head\", \"custom\")"},
        BadInput{"{\"type\": \"transfomer\", \"hidden\": 64}", "",
                 "m.json: $.layers[0].type: \"transfomer\" is not one of \"embedding\", "
                 "\"transformer\", \"layernorm\", \"lm_head\", \"custom\"; did you mean "
                 "\"transformer\"?"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"norm\": 1}", "",
                 "m.json: $.layers[0].norm: must be one of \"layernorm\", \"rmsnorm\", got a "
                 "number"},
        BadInput{"7", "", "m.json: $.layers[0]: expected a layer node (a JSON object), got a number"},
        BadInput{"{\"type\": \"lm_head\", \"hidden\": 64}", "",
                 "m.json: $.layers[0].tie_embedding: true, but no embedding layer precedes it; "
                 "add an embedding or set tie_embedding to false"},
        BadInput{"{\"type\": \"embedding\", \"hidden\": 64},"
                 "{\"type\": \"transformer\", \"hidden\": 32, \"heads\": 4}",
                 "",
                 "m.json: $.layers[1].hidden: 32 does not match the hidden size 64 of "
                 "$.layers[0] before it"},
        BadInput{"{\"type\": \"embedding\", \"hidden\": 64, \"max_positions\": 8}", "",
                 "m.json: $.seq_len: 16 exceeds $.layers[0].max_positions 8; shorten seq_len or "
                 "raise max_positions"},
        BadInput{"{\"type\": \"embedding\", \"hidden\": 64, \"vocab\": 50}", "",
                 "m.json: $.layers[0].vocab: 50 is smaller than $.vocab_size 100; token ids up "
                 "to vocab_size - 1 need a row each"},
        BadInput{"{\"type\": \"embedding\", \"hidden\": 64}", "\"vocab\": 5, ",
                 "m.json: $: unknown key \"vocab\" (known keys: name, vocab_size, seq_len, "
                 "layers)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 4194304, \"heads\": 4}", "",
                 "m.json: $.layers[0].hidden: 4194304 is larger than the supported 1048576"},
        BadInput{"{\"type\": \"custom\", \"name\": \"x\", \"params\": 1}", "",
                 "m.json: $.layers[0]: missing required key \"forward_flops_per_token\" (a "
                 "non-negative number)"},
        // 2^53 params repeated overflowed mp_model_params (tests/fuzz/corpus/model_json/).
        BadInput{"{\"type\": \"custom\", \"name\": \"x\", \"params\": 9007199254740992, "
                 "\"forward_flops_per_token\": 1, \"activation_bytes_per_token\": 1, "
                 "\"output_bytes_per_token\": 1, \"repeat\": 65536}",
                 "",
                 "m.json: $.layers[0].params: 9007199254740992 is larger than the supported "
                 "1099511627776"}));

TEST(ModelBadInput, MissingTopLevelKeys) {
  Loaded m;
  EXPECT_EQ(mp_model_parse_text("{\"name\": \"t\", \"seq_len\": 4, \"layers\": []}", "m.json",
                                &m.model, &m.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(m.err.message),
            "m.json: $: missing required key \"vocab_size\" (a positive integer)");
  EXPECT_EQ(mp_model_parse_text("[1, 2]", "m.json", &m.model, &m.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(m.err.message),
            "m.json: $: expected a model description (a JSON object), got an array");
}

TEST(ModelBadInput, SyntaxErrorAndMissingFile) {
  Loaded m;
  EXPECT_EQ(mp_model_parse_text("{\"name\": \"t\",\n \"vocab_size\": 4,,\n}", "m.json", &m.model,
                                &m.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(m.err.message), "m.json:2:18: JSON syntax error: expected a key in double quotes, found ','");
  EXPECT_EQ(mp_model_load("examples/models/no-such-model.json", &m.model, &m.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(m.err.message),
            "examples/models/no-such-model.json: cannot open: No such file or directory");
}

}  // namespace

// ---- mixture of experts (issue 33's first slice) ---------------------------------------------

// The published totals: Mixtral-8x7B "46.7B total, 12.9B active" (Mistral AI, 2023-12) and
// Qwen1.5-MoE-A2.7B "14.3B total, 2.7B activated" (Qwen, 2024-03), from the examples written
// from their config.json files. The exact counts are the checkpoints' tensor sizes summed:
// Mixtral's model.safetensors.index.json total_size 93,405,585,408 bytes / 2 = 46,702,792,704.
TEST(ModelExamples, MixtureOfExpertsHaveTheirPublishedTotalAndActiveCounts) {
  Loaded mixtral;
  ASSERT_EQ(mp_model_load("examples/models/mixtral-8x7b.json", &mixtral.model, &mixtral.err),
            MP_OK)
      << mixtral.err.message;
  EXPECT_EQ(mp_model_params(mixtral.model), 46702792704);
  EXPECT_NEAR(mp_model_params(mixtral.model) / 1e9, 46.7, 0.05);
  EXPECT_NEAR(mp_model_active_params(mixtral.model) / 1e9, 12.9, 0.05);
  const mp_layer_spec *block = mp_model_layer(mixtral.model, 1);
  ASSERT_TRUE(mp_layer_is_moe(block));
  EXPECT_EQ(block->moe.experts, 8);
  EXPECT_EQ(block->moe.top_k, 2);
  EXPECT_EQ(block->ffn_hidden, 14336);  // each expert's width
  EXPECT_TRUE(block->moe.normalize_top_k);
  // Imported from the published config.json, whose output_router_logits is false: transformers
  // adds no load-balancing loss then, and neither does the description.
  EXPECT_DOUBLE_EQ(block->moe.aux_loss_coeff, 0.0);
  EXPECT_EQ(block->moe.capacity_factor, 0.0);  // null: dropless

  Loaded qwen;
  ASSERT_EQ(mp_model_load("examples/models/qwen1.5-moe-a2.7b.json", &qwen.model, &qwen.err),
            MP_OK)
      << qwen.err.message;
  EXPECT_NEAR(mp_model_params(qwen.model) / 1e9, 14.3, 0.05);
  EXPECT_NEAR(mp_model_active_params(qwen.model) / 1e9, 2.7, 0.05);
  EXPECT_TRUE(mp_model_layer(qwen.model, 1)->moe.shared_gate);
  EXPECT_FALSE(mp_model_layer(qwen.model, 1)->moe.normalize_top_k);

  // A dense model's active parameters are all of them.
  Loaded llama;
  ASSERT_EQ(mp_model_load("examples/models/llama3-8b.json", &llama.model, &llama.err), MP_OK);
  EXPECT_EQ(mp_model_active_params(llama.model), mp_model_params(llama.model));
  EXPECT_EQ(mp_model_first_moe_layer(llama.model), nullptr);
}

// One block by hand: h 16, 4 heads (kv 2), E 4 experts of F 8, top 2, a shared MLP of 12 with
// its gate; (B, T) = (2, 8).
TEST(LayerCost, MixtureOfExpertsParamsAndFlopsByHand) {
  Loaded m;
  ASSERT_NE(parse("{\"type\": \"transformer\", \"hidden\": 16, \"heads\": 4, \"kv_heads\": 2, "
                  "\"norm\": \"rmsnorm\", \"activation\": \"swiglu\", \"bias\": false, "
                  "\"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn_hidden\": 8, "
                  "\"shared_ffn_hidden\": 12, \"shared_gate\": true}}",
                  &m),
            nullptr)
      << m.err.message;
  const mp_layer_spec *layer = mp_model_layer(m.model, 0);
  const int64_t h = 16, kv = 8, E = 4, k = 2, F = 8, Fs = 12;
  const int64_t attention = h * (h + 2 * kv) + h * h, norms = 2 * h;
  const int64_t router = E * h, expert = 3 * h * F, shared = 3 * h * Fs + h;
  EXPECT_EQ(mp_layer_params(layer), attention + norms + router + E * expert + shared);
  EXPECT_EQ(mp_layer_active_params(layer), attention + norms + router + k * expert + shared);

  mp_cost_shape shape = {2, 8, 2, true, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(layer, &shape, &cost);
  const double tokens = 16, t = 8;
  const double per_token_mlp = 2.0 * (E * h)            // router
                               + k * 2.0 * (3.0 * h * F)  // top-k experts: gate, up, down
                               + 2.0 * (3.0 * h * Fs + h);  // shared MLP and its gate
  const double per_token_attention = 2.0 * (h * (h + 2 * kv) + h * h);
  EXPECT_DOUBLE_EQ(cost.forward_flops,
                   tokens * (per_token_attention + per_token_mlp) + 4.0 * tokens * t * h);
  EXPECT_DOUBLE_EQ(cost.backward_flops, 2.0 * cost.forward_flops);
  // qkv, projection (flash: no attention GEMMs), router, gate+up, down, the shared pair, its gate
  EXPECT_EQ(cost.num_gemms, 8);
  // Kept for backward, bf16, flash: the dense tensors, the router's fp32 probabilities, per
  // routed copy input, gate+up, activation and output, the shared MLP's three and its gate.
  const double elem = 2.0;
  const double mlp = k * (2.0 * h + 3.0 * F) + 3.0 * Fs + 1.0 + E * 4.0 / elem;
  const double stats = 2.0 * 4.0, softmax_stats = 4.0 * 4.0;
  EXPECT_DOUBLE_EQ(cost.activation_bytes[MP_RECOMPUTE_NONE],
                   tokens * ((6.0 * h + 2.0 * kv + mlp) * elem + stats + softmax_stats));
}

INSTANTIATE_TEST_SUITE_P(
    MixtureOfExperts, ModelBadInput,
    ::testing::Values(
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4, \"top_k\": 5, "
                 "\"expert_ffn_hidden\": 32}}",
                 "",
                 "m.json: $.layers[0].moe.top_k: 5 is more than experts 4; each token goes to "
                 "top_k distinct experts"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 0, \"top_k\": 1, "
                 "\"expert_ffn_hidden\": 32}}",
                 "", "m.json: $.layers[0].moe.experts: must be a positive integer, got 0"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4, \"topk\": 2, "
                 "\"expert_ffn_hidden\": 32}}",
                 "",
                 "m.json: $.layers[0].moe: unknown key \"topk\"; did you mean \"top_k\"? (known "
                 "keys: experts, top_k, expert_ffn_hidden, shared_ffn_hidden, shared_gate, router, "
                 "normalize_top_k, aux_loss_coeff, z_loss_coeff, capacity_factor)"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn_hidden\": 32, \"router\": \"sigmoid\"}}",
                 "", "m.json: $.layers[0].moe.router: \"sigmoid\" is not one of \"softmax\""},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn_hidden\": 32, \"shared_gate\": true}}",
                 "",
                 "m.json: $.layers[0].moe.shared_gate: true, but there is no shared MLP to gate; "
                 "set shared_ffn_hidden or remove shared_gate"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn_hidden\": 32, \"capacity_factor\": 0}}",
                 "",
                 "m.json: $.layers[0].moe.capacity_factor: must be a positive number, got 0"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"ffn_hidden\": 128, \"moe\": {\"experts\": 4, "
                 "\"top_k\": 2, \"expert_ffn_hidden\": 32}}",
                 "",
                 "m.json: $.layers[0].ffn_hidden: a block with \"moe\" has no dense MLP; give each "
                 "expert's width as moe.expert_ffn_hidden and remove ffn_hidden"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"moe\": "
                 "{\"experts\": 4, \"top_k\": 2, \"expert_ffn_hidden\": 32}}",
                 "",
                 "m.json: $.layers[0].activation: the experts are SwiGLU MLPs (Mixtral, "
                 "Qwen2-MoE); set \"activation\": \"swiglu\""},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"moe\": {\"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn_hidden\": 32}}",
                 "",
                 "m.json: $.layers[0].bias: the experts carry no biases; set \"bias\" to false or "
                 "\"qkv\""},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"activation\": "
                 "\"swiglu\", \"bias\": false, \"moe\": {\"experts\": 4096, \"top_k\": 2, "
                 "\"expert_ffn_hidden\": 4096}}",
                 "",
                 "m.json: $.layers[0].moe: experts x expert_ffn_hidden + shared_ffn_hidden = "
                 "16777216 is larger than the supported 8388608"},
        BadInput{"{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"moe\": 8}", "",
                 "m.json: $.layers[0].moe: expected a mixture-of-experts object (a JSON object), got a "
                 "number"}));

// The first mixture-of-experts block is found (what the runtime names in its refusals).
TEST(Model, FirstMixtureOfExpertsBlockIsFound) {
  Loaded m;
  ASSERT_EQ(mp_model_load("examples/models/mixtral-8x7b.json", &m.model, &m.err), MP_OK);
  EXPECT_EQ(mp_model_first_moe_layer(m.model), mp_model_layer(m.model, 1));
}
