// tests/topology/cost_model_test.cc — the cost and memory model against numbers computed by hand
// on a small model and a made-up cluster with round figures (efficiency 1: no curve).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "topology/cost_model.h"
#include "topology/layer_cost.h"
#include "topology/model.h"

namespace {

const char *kModel =
    "{\"name\": \"hand\", \"vocab_size\": 128, \"seq_len\": 8, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 64, \"max_positions\": 8},"
    "{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"ffn_hidden\": 256, \"repeat\": 2,"
    " \"attention\": \"unfused\"},"
    "{\"type\": \"layernorm\", \"hidden\": 64},"
    "{\"type\": \"lm_head\", \"hidden\": 64, \"tie_embedding\": true}]}";

const double kGiB = 1024.0 * 1024.0 * 1024.0;

mp_cluster hand_cluster() {
  mp_cluster c;
  std::memset(&c, 0, sizeof c);
  std::snprintf(c.name, sizeof c.name, "hand");
  c.devices_per_node = 8;
  c.device_memory_bytes = (int64_t)kGiB;
  c.memory_bandwidth_bytes_per_s = 1e11;
  c.peak_flops_per_s[MP_DTYPE_BF16] = 1e12;
  c.intra_node_bandwidth_bytes_per_s = 1e9;
  c.inter_node_bandwidth_bytes_per_s = 1e8;
  return c;
}

struct Model {
  mp_model *model = nullptr;
  Model() {
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_model_parse_text(kModel, "hand.json", &model, &err), MP_OK) << err.message;
  }
  ~Model() { mp_model_free(model); }
};

struct Loaded {
  mp_model *model = nullptr;
  ~Loaded() { mp_model_free(model); }
};

mp_layout layout(int dp, int pp, int tp, int64_t mb, int64_t m) {
  mp_layout l;
  std::memset(&l, 0, sizeof l);
  l.dp = dp;
  l.pp = pp;
  l.tp = tp;
  l.virtual_stages = 1;
  l.micro_batch = mb;
  l.num_micro_batches = m;
  l.seq_len = 8;
  l.schedule = MP_SCHEDULE_1F1B;
  l.recompute = MP_RECOMPUTE_NONE;
  return l;
}

TEST(CostModel, RingAllReduce) {
  EXPECT_DOUBLE_EQ(mp_cost_allreduce_seconds(1e6, 4, 1e9, 1e-6), 1.5e-3 + 6e-6);
  EXPECT_EQ(mp_cost_allreduce_seconds(1e6, 1, 1e9, 1e-6), 0.0);
}

TEST(CostModel, StateBytesFollowMixedPrecision) {
  mp_cluster c = hand_cluster();
  mp_state_bytes b = mp_cost_state_bytes(&c);
  EXPECT_EQ(b.weights + b.grads + b.optimizer, 18.0);
  c.peak_flops_per_s[MP_DTYPE_BF16] = 0;
  c.peak_flops_per_s[MP_DTYPE_FP32] = 1e12;
  b = mp_cost_state_bytes(&c);
  EXPECT_EQ(b.weights + b.grads + b.optimizer, 16.0);
}

// One GEMM on the hand cluster: the roofline of FLOPs at 1e12 FLOP/s (efficiency 1) and bytes
// (both operands and the result, bf16) at 1e11 B/s.
double roofline(double m, double n, double k, double batch = 1) {
  return std::fmax(2 * m * n * k * batch / 1e12, batch * (m * k + k * n + m * n) * 2 / 1e11);
}

TEST(CostModel, TransformerLayerByHand) {
  Model m;
  mp_cluster c = hand_cluster();
  const mp_layer_spec *block = mp_model_layer(m.model, 1);
  mp_layout l = layout(1, 1, 2, 2, 1);
  mp_layer_time t;
  mp_cost_layer(&c, block, &l, &t);
  // Megatron's forward FLOPs: 24 B T h^2 + 4 B T^2 h = 24*2*8*64^2 + 4*2*64*64 = 1605632.
  const mp_cost_shape shape = {2, 8, 2, false, 1, 1};
  mp_layer_cost cost;
  mp_layer_cost_compute(block, &shape, &cost);
  ASSERT_DOUBLE_EQ(cost.forward_flops, 1605632.0);
  // On one of 2 tp ranks, 16 tokens: qkv (16 x 96 x 64), Q K^T and P V over 2 x 4 / 2 heads of
  // size 16 (8 x 8 x 16 and 8 x 16 x 8), the projection (16 x 64 x 32), fc1 (16 x 128 x 64),
  // fc2 (16 x 64 x 128).
  const double attention = roofline(8, 8, 16, 4) + roofline(8, 16, 8, 4);
  const double gemms = roofline(16, 96, 64) + attention + roofline(16, 64, 32) +
                       roofline(16, 128, 64) + roofline(16, 64, 128);
  // Memory-bound kernels per token (layer_cost.h), bf16: two layernorms (read and write 64, two
  // fp32 statistics) and two residual adds (read 2 x 64, write 64) on every rank; the softmax
  // (read and write 4 heads x 8) and GELU (read and write 256) split over the 2 ranks.
  const double replicated = 16 * 2 * ((2 * 64 * 2 + 8) + 3 * 64 * 2);
  const double split = 16 * (2 * 4 * 8 * 2 + 2 * 256 * 2);
  EXPECT_DOUBLE_EQ(t.forward_compute_s, gemms + (replicated + split / 2) / 1e11);
  // Backward: each product twice; norms read x and dy and write dx, residual gradients read 2
  // and write 1, the softmax reads y and dy and writes dx, GELU reads x and dy and writes dx.
  const double replicated_b = 16 * 2 * ((3 * 64 * 2 + 8) + 3 * 64 * 2);
  const double split_b = 16 * (3 * 4 * 8 * 2 + 3 * 256 * 2);
  EXPECT_DOUBLE_EQ(t.backward_compute_s, 2 * gemms + (replicated_b + split_b / 2) / 1e11);
  EXPECT_EQ(t.recompute_s, 0.0);
  // Two all-reduces of B*T*C bf16 = 2048 bytes over 2 ranks: 2 * (2*(1/2)*2048/1e9).
  EXPECT_DOUBLE_EQ(t.forward_tp_s, 4.096e-6);
  EXPECT_DOUBLE_EQ(t.backward_tp_s, 4.096e-6);
  const double act_none = cost.activation_bytes[MP_RECOMPUTE_NONE];
  // Without sequence parallelism the 4 norm tensors (4 * 2048 bytes) stay whole on each rank.
  EXPECT_DOUBLE_EQ(t.activation_bytes, (act_none - 8192.0) / 2 + 8192.0);

  l.recompute = MP_RECOMPUTE_SELECTIVE;
  mp_cost_layer(&c, block, &l, &t);
  // The attention products again, and the softmax's forward over this rank's 2 heads.
  EXPECT_DOUBLE_EQ(t.recompute_s, attention + 16 * 2 * 8 * 2 * 2 / 1e11);
  l.sequence_parallel = true;
  mp_cost_layer(&c, block, &l, &t);
  // Sequence parallelism splits the (B, T, C) kernels too, and backward all-gathers both
  // column-parallel inputs again: one all-reduce's worth more.
  EXPECT_DOUBLE_EQ(t.forward_compute_s, gemms + (replicated + split) / 2 / 1e11);
  EXPECT_DOUBLE_EQ(t.backward_tp_s, 3 * 2.048e-6);
  l.recompute = MP_RECOMPUTE_NONE;
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_DOUBLE_EQ(t.activation_bytes, act_none / 2);
  l.recompute = MP_RECOMPUTE_FULL;
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_DOUBLE_EQ(t.recompute_s, t.forward_compute_s);
  EXPECT_DOUBLE_EQ(t.backward_tp_s, 8.192e-6);  // the forward's all-reduces again
  EXPECT_DOUBLE_EQ(t.activation_bytes, 2048.0 / 2);  // only the input, split by SP
}

// Context parallelism (cost_model.h), by hand: cp 2 x tp 2 ranks share each of the 2 sequences
// of 8 tokens, 4 tokens of each on a rank (chunks 0 and 3, or 1 and 2, of 2 tokens). Everything
// token-wise runs on the rank's 8 tokens; attention takes its 4 queries per sequence against all
// 8 keys; K and V are all-gathered forward and their gradients reduce-scattered backward over the
// cp group (inside the hand cluster's node of 8: tp x cp = 4 consecutive ranks).
TEST(CostModel, ContextParallelLayerByHand) {
  Model m;
  mp_cluster c = hand_cluster();
  const mp_layer_spec *block = mp_model_layer(m.model, 1);
  mp_layout l = layout(1, 1, 2, 2, 1);
  l.cp = 2;
  mp_layer_time t;
  mp_cost_layer(&c, block, &l, &t);
  // On one of 2 tp ranks, 8 local tokens: qkv (8 x 96 x 64); Q K^T and P V over 2 x 4 / 2 heads,
  // 4 queries against 8 keys of size 16 (4 x 8 x 16 and 4 x 16 x 8); the projection (8 x 64 x
  // 32), fc1 (8 x 128 x 64), fc2 (8 x 64 x 128).
  const double attention = roofline(4, 8, 16, 4) + roofline(4, 16, 8, 4);
  const double gemms = roofline(8, 96, 64) + attention + roofline(8, 64, 32) +
                       roofline(8, 128, 64) + roofline(8, 64, 128);
  // The memory-bound kernels of TransformerLayerByHand for 8 tokens instead of 16: a local
  // token's softmax still reads and writes 4 heads x 8 keys.
  const double replicated = 8 * 2 * ((2 * 64 * 2 + 8) + 3 * 64 * 2);
  const double split = 8 * (2 * 4 * 8 * 2 + 2 * 256 * 2);
  EXPECT_DOUBLE_EQ(t.forward_compute_s, gemms + (replicated + split / 2) / 1e11);
  // The attention FLOPs of the rank: 4 B (T / cp) T h / tp = 4 * 2 * 4 * 8 * 64 / 2, half the
  // whole sequence's of this tp rank; the rest of the layer's FLOPs halve with the tokens.
  const mp_cost_shape whole = {2, 8, 2, false, 1, 1}, shared = {2, 8, 2, false, 2, 1};
  mp_layer_cost one, two;
  mp_layer_cost_compute(block, &whole, &one);
  mp_layer_cost_compute(block, &shared, &two);
  EXPECT_DOUBLE_EQ(two.forward_flops, one.forward_flops / 2);  // 802816
  EXPECT_DOUBLE_EQ(two.forward_flops, 24.0 * 2 * 4 * 64 * 64 + 4.0 * 2 * 4 * 8 * 64);
  // Tensor parallelism all-reduces the rank's (B, T / cp, C) = 1024 bytes: 2 x (1/2) x 1024 / 1e9.
  EXPECT_DOUBLE_EQ(t.forward_tp_s, 2 * 1.024e-6);
  // K and V of the whole sequence, this tp rank's 2 heads of 16: 2 x 2 x 8 x 32 bf16 = 2048
  // bytes gathered, a ring over 2 ranks: (2 - 1) / 2 x 2048 / 1e9; backward gathers them again
  // (a micro-batch keeps its own tokens only) and reduce-scatters the same bytes.
  EXPECT_DOUBLE_EQ(two.kv_gather_bytes, 2.0 * 2 * 8 * 64 * 2);
  EXPECT_DOUBLE_EQ(t.cp_gather_bytes, 2048.0);
  EXPECT_DOUBLE_EQ(t.forward_cp_s, 0.5 * 2048 / 1e9);
  EXPECT_DOUBLE_EQ(t.backward_cp_s, 2 * 0.5 * 2048 / 1e9);
  EXPECT_DOUBLE_EQ(t.cp_buffer_bytes, 2 * 2048.0);  // the block's K and V and their gradient
  // Kept: the local tokens' activations, half of cp 1's (per token the same; the gathered K and
  // V are not kept), split by tp; the 4 norm tensors of the 8 tokens whole on each tp rank.
  EXPECT_DOUBLE_EQ(two.activation_bytes[MP_RECOMPUTE_NONE],
                   one.activation_bytes[MP_RECOMPUTE_NONE] / 2);
  const double norms = 8 * 4 * 64 * 2;
  EXPECT_DOUBLE_EQ(t.activation_bytes,
                   (two.activation_bytes[MP_RECOMPUTE_NONE] - norms) / 2 + norms);
  // Across nodes the ring runs on the inter-node link (1e8 B/s) with its latencies.
  c.devices_per_node = 2;
  c.inter_node_latency_s = 1e-6;
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_DOUBLE_EQ(t.forward_cp_s, 0.5 * 2048 / 1e8 + 1e-6);
  // Full recomputation keeps only the input: the recomputed forward gathers K and V once more.
  c = hand_cluster();
  l.recompute = MP_RECOMPUTE_FULL;
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_DOUBLE_EQ(t.backward_cp_s, 3 * 0.5 * 2048 / 1e9);
  EXPECT_DOUBLE_EQ(t.cp_buffer_bytes, 2 * 2048.0);
  EXPECT_DOUBLE_EQ(t.activation_bytes, 8 * 64 * 2);
}

// A step at cp 2 (dp 1, pp 1, tp 1, 4 micro-batches of 2 sequences), by hand: the weights'
// replicas are the 2 cp ranks, so ZeRO-1 halves the optimizer state and the gradient reduction is
// ZeRO-1's over 2 ranks; the step computes the same tokens as a one-rank run, and its model FLOPs
// are the whole model's (each rank does half of every sequence's).
TEST(CostModel, ContextParallelStepByHand) {
  Model m;
  mp_cluster c = hand_cluster();
  const double P = 108800;
  mp_layout l = layout(1, 1, 1, 2, 4);
  l.cp = 2;
  l.zero_stage = 1;
  EXPECT_EQ(mp_layout_replicas(&l), 2);
  EXPECT_EQ(mp_layout_zero_shard(&l), 2);
  auto e = std::make_unique<mp_estimate>();
  auto one = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  const mp_rank_estimate &r = e->ranks[0];
  EXPECT_DOUBLE_EQ(r.weights_bytes, 2 * P);
  EXPECT_DOUBLE_EQ(r.optimizer_bytes, 12 * P / 2);
  EXPECT_NEAR(r.dp_comm_s, 0.5 * 4 * P / 1e9 + 0.5 * 2 * P / 1e9, 1e-15);
  // Two blocks, each an all-gather forward, and an all-gather and a reduce-scatter backward, of
  // 2 x 2 x 8 x 64 bf16 bytes over 2 ranks, in each of the 4 micro-batches.
  EXPECT_NEAR(r.cp_comm_s, 4 * 2 * 3 * (0.5 * 4096 / 1e9), 1e-18);
  EXPECT_DOUBLE_EQ(e->cp_layer_forward_s, 0.5 * 4096 / 1e9);
  EXPECT_FALSE(e->cp_inter_node);
  // One block's K and V and their gradient: the stage's two working buffers; and the unfused
  // attention's backward scratch, two score matrices of its 2 x 4 local queries x 4 heads x 8
  // keys in bf16.
  EXPECT_DOUBLE_EQ(r.workspace_bytes, 0.05 * kGiB + 2 * 4096 + 2 * (2 * 4 * 4 * 8) * 2);
  double act = 0;
  for (int i = 0; i < mp_model_num_layers(m.model); ++i) {
    mp_layer_time t;
    mp_cost_layer(&c, mp_model_layer(m.model, i), &l, &t);
    act += t.activation_bytes;
  }
  EXPECT_DOUBLE_EQ(r.activation_bytes, act);
  const double F = e->stage_forward_s[0], B = e->stage_backward_s[0];
  EXPECT_NEAR(e->pipeline_s, 4 * (F + B), 1e-15);
  EXPECT_NEAR(r.compute_s + r.tp_comm_s + r.cp_comm_s + r.idle_s + r.dp_exposed_s +
                  r.optimizer_s + r.end_wait_s,
              e->step_s, 1e-15);
  EXPECT_DOUBLE_EQ(e->tokens_per_s, 8 * 8 / e->step_s);  // dp x 2 x 4 sequences of 8 tokens
  mp_layout serial = layout(1, 1, 1, 2, 4);
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &serial, nullptr, one.get(), &err), MP_OK)
      << err.message;
  EXPECT_NEAR(e->model_flops_per_step, one->model_flops_per_step,
              1e-12 * one->model_flops_per_step);
  // A sequence that does not cut into 2 cp chunks is refused, naming both numbers.
  l.cp = 3;
  EXPECT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "cp 3 needs the sequence length to be a multiple of 2 x cp = 6 (each cp rank holds "
               "2 of 2 cp equal chunks of a sequence), but it is 8");
}

// Llama 3 8B at 32K tokens on H100s (tp 8, one micro-batch of one sequence): each doubling of cp
// halves the activations of a rank's tokens (the gathered K and V of a block, 2 x 32768 x 1 kv
// head of 128 bf16 = 16 MiB, are working memory of one block, not kept): memory per rank falls
// with cp.
TEST(CostModel, MemoryPerRankFallsWithContextParallelism) {
  Loaded llama;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_load("examples/models/llama3-8b.json", &llama.model, &err), MP_OK)
      << err.message;
  mp_cluster h100;
  ASSERT_EQ(mp_cluster_preset("h100-sxm", &h100, &err), MP_OK) << err.message;
  auto e = std::make_unique<mp_estimate>();
  double previous_memory = 0, previous_act = 0;
  for (int cp = 1; cp <= 8; cp *= 2) {
    mp_layout l = layout(1, 1, 8, 1, 1);
    l.seq_len = 32768;
    l.cp = cp;
    l.sequence_parallel = true;
    ASSERT_EQ(mp_cost_estimate(&h100, llama.model, &l, nullptr, e.get(), &err), MP_OK)
        << err.message;
    const double act = e->ranks[0].activation_bytes, memory = e->memory_bytes;
    if (cp > 1) {
      EXPECT_NEAR(act, previous_act / 2, 1e-9 * previous_act) << "cp " << cp;
      EXPECT_LT(memory, previous_memory) << "cp " << cp;
    }
    previous_memory = memory;
    previous_act = act;
  }
}

// The fraction of a link's or of memory's bandwidth the cluster says is reached scales the
// collectives and the memory-bound kernels, not the compute-bound GEMMs.
TEST(CostModel, EfficienciesScaleTheirOwnTerms) {
  Model m;
  mp_cluster c = hand_cluster();
  c.memory_bandwidth_bytes_per_s = 1e13;  // every GEMM compute-bound
  c.vector_flops_per_s = 1e18;            // every elementwise kernel memory-bound
  const mp_layer_spec *block = mp_model_layer(m.model, 1);
  mp_layout l = layout(1, 1, 2, 2, 1);
  mp_layer_time full, reduced;
  mp_cost_layer(&c, block, &l, &full);
  c.intra_node_efficiency = 0.5;
  c.memory_efficiency = 0.25;
  mp_cost_layer(&c, block, &l, &reduced);
  EXPECT_DOUBLE_EQ(reduced.forward_tp_s, 2 * full.forward_tp_s);
  const double gemms = 1605632.0 / 2 / 1e12;
  EXPECT_NEAR(reduced.forward_compute_s - gemms, 4 * (full.forward_compute_s - gemms), 1e-18);
}

// A CPU core computes a softmax's exps or GELU's tanh slower than it streams their bytes: each
// elementwise kernel takes the longer of its bytes at the memory bandwidth and its vector FLOPs
// (layer_cost.h's counts) at vector_tflops.
TEST(CostModel, ElementwiseKernelsAreRooflinesOfBytesAndVectorFlops) {
  Model m;
  mp_cluster c = hand_cluster();
  c.memory_bandwidth_bytes_per_s = 1e18;  // nothing memory-bound: GEMMs at 1e12, kernels' FLOPs
  c.vector_flops_per_s = 1e9;
  mp_layout l = layout(1, 1, 1, 2, 1);
  mp_layer_time t;
  mp_cost_layer(&c, mp_model_layer(m.model, 1), &l, &t);
  // Per token, 16 tokens: two layernorms (8 per element of 64) and residual adds (1), the causal
  // softmax (12.5 per score, 4 heads x 8), GELU (28 per element of 256).
  const double vector = 16 * (2 * (8 * 64 + 64) + 12.5 * 4 * 8 + 28 * 256) / 1e9;
  EXPECT_NEAR(t.forward_compute_s, 1605632.0 / 1e12 + vector, 1e-15);
  // Backward: layernorm 12, residual 1, softmax 3, GELU 34, and the GEMMs twice.
  const double vector_b = 16 * (2 * (12 * 64 + 64) + 3 * 4 * 8 + 34 * 256) / 1e9;
  EXPECT_NEAR(t.backward_compute_s, 2 * 1605632.0 / 1e12 + vector_b, 1e-15);
  // The CPU backend's attention softmax is a scalar loop: at scalar_tflops when the cluster says.
  c.scalar_flops_per_s = 0.25e9;
  mp_cost_layer(&c, mp_model_layer(m.model, 1), &l, &t);
  EXPECT_NEAR(t.forward_compute_s, 1605632.0 / 1e12 + vector + 16 * 12.5 * 4 * 8 * (4 - 1) / 1e9,
              1e-15);
}

// Flash attention (the CUDA backend's, so the default on a bf16 device): Q K^T and P V become one
// kernel at flash_attention_efficiency of peak, 2.5 x its FLOPs in backward; no (B, NH, T, T)
// tensor is moved or kept; selective recomputation has nothing to redo.
TEST(CostModel, FlashAttentionIsOneKernelWithoutTheProbabilities) {
  Model unfused_model;
  Loaded flash_model;  // the hand model without "attention": the backend's own
  std::string text = kModel;
  const std::string key = ", \"attention\": \"unfused\"";
  text.erase(text.find(key), key.size());
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_parse_text(text.c_str(), "hand.json", &flash_model.model, &err), MP_OK)
      << err.message;
  mp_cluster c = hand_cluster();
  c.flash_attention_efficiency = 0.5;
  mp_layout l = layout(1, 1, 2, 2, 1);
  mp_layer_time unfused, flash;
  mp_cost_layer(&c, mp_model_layer(unfused_model.model, 1), &l, &unfused);
  mp_cost_layer(&c, mp_model_layer(flash_model.model, 1), &l, &flash);
  // This rank's half of 4 B T^2 h = 4*2*64*64 FLOPs at half of 1e12 FLOP/s.
  const double kernel = 4.0 * 2 * 64 * 64 / 2 / 0.5e12;
  const double attention = roofline(8, 8, 16, 4) + roofline(8, 16, 8, 4);
  const double softmax = 16 * 2 * 4 * 8 * 2 / 2 / 1e11;          // read and write this rank's half
  const double softmax_backward = 16 * 3 * 4 * 8 * 2 / 2 / 1e11;  // read y and dy, write dx
  EXPECT_DOUBLE_EQ(flash.forward_compute_s, unfused.forward_compute_s - attention - softmax + kernel);
  EXPECT_DOUBLE_EQ(flash.backward_compute_s,
                   unfused.backward_compute_s - 2 * attention - softmax_backward + 2.5 * kernel);
  // Kept: not the 4 x 8 bf16 probabilities per token but 4 fp32 log-sum-exps; split by tp.
  EXPECT_DOUBLE_EQ(unfused.activation_bytes - flash.activation_bytes, 16 * (4 * 8 * 2 - 4 * 4) / 2.0);
  l.recompute = MP_RECOMPUTE_SELECTIVE;
  mp_cost_layer(&c, mp_model_layer(flash_model.model, 1), &l, &flash);
  EXPECT_EQ(flash.recompute_s, 0.0);
  // On an fp32 device (the CPU backend) the same model runs unfused.
  mp_cluster cpu = hand_cluster();
  cpu.peak_flops_per_s[MP_DTYPE_BF16] = 0;
  cpu.peak_flops_per_s[MP_DTYPE_FP32] = 1e12;
  mp_layer_time cpu_default, cpu_unfused;
  mp_cost_layer(&cpu, mp_model_layer(flash_model.model, 1), &l, &cpu_default);
  mp_cost_layer(&cpu, mp_model_layer(unfused_model.model, 1), &l, &cpu_unfused);
  EXPECT_EQ(cpu_default.backward_compute_s, cpu_unfused.backward_compute_s);
  EXPECT_GT(cpu_default.recompute_s, 0.0);
}

TEST(CostModel, OneStageStepAndMemoryByHand) {
  Model m;
  mp_cluster c = hand_cluster();
  const double P = 108800;  // 128*64 + 8*64 + 2 * (12*64^2 + 13*64) + 2*64
  ASSERT_EQ(mp_model_params(m.model), (int64_t)P);
  mp_layout l = layout(2, 1, 1, 2, 4);
  l.zero_stage = 1;
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  const mp_rank_estimate &r = e->ranks[0];
  EXPECT_DOUBLE_EQ(r.weights_bytes, 2 * P);
  EXPECT_DOUBLE_EQ(r.grads_bytes, 4 * P);
  EXPECT_DOUBLE_EQ(r.optimizer_bytes, 12 * P / 2);
  // The unfused attention's backward scratch: two score matrices of a block, 2 sequences x 4
  // heads x 8 x 8 in bf16.
  EXPECT_DOUBLE_EQ(r.workspace_bytes, 0.05 * kGiB + 2 * (2 * 4 * 8 * 8) * 2);
  EXPECT_EQ(r.peak_live, 1);
  double act = 0;
  for (int i = 0; i < mp_model_num_layers(m.model); ++i) {
    mp_layer_time t;
    mp_cost_layer(&c, mp_model_layer(m.model, i), &l, &t);
    act += t.activation_bytes;
  }
  EXPECT_DOUBLE_EQ(r.activation_bytes, act);
  const double F = e->stage_forward_s[0], B = e->stage_backward_s[0];
  EXPECT_NEAR(e->pipeline_s, 4 * (F + B), 1e-15);
  // ZeRO-1 over dp 2 inside a node: reduce-scatter 4P and all-gather 2P bytes, half each.
  EXPECT_NEAR(r.dp_comm_s, 0.5 * 4 * P / 1e9 + 0.5 * 2 * P / 1e9, 1e-15);
  EXPECT_NEAR(r.dp_exposed_s, std::fmax(0.0, r.dp_comm_s - B), 1e-15);
  EXPECT_NEAR(r.optimizer_s, P * (30 - 12) / 1e11, 1e-15);
  EXPECT_NEAR(e->step_s, e->pipeline_s + r.dp_exposed_s + r.optimizer_s, 1e-15);
  EXPECT_DOUBLE_EQ(e->tokens_per_s, 16 * 8 / e->step_s);
  EXPECT_TRUE(e->fits);
}

// ZeRO's stages over dp 4 (Rajbhandari et al. 2020, Figure 1: the model states of each stage,
// here with mixed precision's 2 + 4 + 12 bytes per parameter), as the runtime runs them
// (engine/train/trainer.h): 1 divides the optimizer state; 2 the blocks' gradients too, which pass
// through a one-block window, while the rest (embedding, final norm; the head is tied) stays
// whole until the step's end, and one reduce-scatter's output (here a dp part) is a buffer of
// its own; 3 the blocks' weights too, each gathered into a one-block window, the rest whole.
// Their dp traffic per step: ZeRO-2 reduce-scatters the blocks' gradients in each of the m
// micro-batches, the rest once, and gathers the weights once; ZeRO-3 reduce-scatters as 2 and
// gathers each block's weights for its forward and again for its backward in every
// micro-batch, the rest once after the update; both hide under the step's compute.
TEST(CostModel, ZeroStagesDivideTheModelStatesAndCostTheirCollectives) {
  Model m;
  mp_cluster c = hand_cluster();
  const double P = 108800, d = 4, frac = 3.0 / 4.0, mb = 4;
  const double largest = 12 * 64 * 64 + 13 * 64;  // a block, the largest layer
  const double blocks = 2 * largest, outside = P - blocks;
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  double expected_memory[4] = {0, 0, 0, 0};
  for (int zero = 0; zero <= 3; ++zero) {
    mp_layout l = layout(4, 1, 1, 1, (int64_t)mb);
    l.zero_stage = zero;
    ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
    const mp_rank_estimate &r = e->ranks[0];
    // ZeRO-3: its part of the blocks' weights, the rest whole, a block's in each of the GPU's
    // two windows (one computes while the next is gathered).
    const double weights = zero == 3 ? 2 * (blocks / d + outside) + 2 * 2 * largest : 2 * P;
    const double grads = zero >= 2 ? 4 * P / d + 4 * outside : 4 * P;
    const double optimizer = zero >= 1 ? 12 * P / d : 12 * P;
    EXPECT_DOUBLE_EQ(r.weights_bytes, weights) << "zero " << zero;
    EXPECT_DOUBLE_EQ(r.grads_bytes, grads) << "zero " << zero;
    EXPECT_DOUBLE_EQ(r.optimizer_bytes, optimizer) << "zero " << zero;
    // Two one-block gradient windows with 2 and 3 on a GPU (a block's reduce-scatter overlaps
    // the next one's backward) and a reduce-scatter's output; none beyond the workspace
    // otherwise, but the unfused attention's backward scratch (a micro-batch of one sequence:
    // two score matrices of 4 heads x 8 x 8 in bf16).
    EXPECT_DOUBLE_EQ(r.workspace_bytes, 0.05 * kGiB + (zero >= 2 ? 2 * 4 * largest : 0.0) +
                                            (zero >= 2 ? 4 * P / d : 0.0) + 2 * (4 * 8 * 8) * 2)
        << "zero " << zero;
    expected_memory[zero] = r.memory_bytes;
    // ZeRO-3 gathers each block's weights for its forward and its backward in every
    // micro-batch, and the rest once after the update.
    const double zero3_gathers = frac * (mb * 2 * 2 * blocks + 2 * outside);
    const double gathers = zero == 3 ? zero3_gathers : zero >= 1 ? frac * 2 * P : 0.0;
    const double zero2_scatters = frac * (mb * 4 * blocks + 4 * outside);
    const double scatters = zero >= 2 ? zero2_scatters : zero == 1 ? frac * 4 * P : 0.0;
    EXPECT_DOUBLE_EQ(r.zero_gather_bytes, gathers) << "zero " << zero;
    EXPECT_DOUBLE_EQ(r.zero_reduce_scatter_bytes, scatters) << "zero " << zero;
    const double F = e->stage_forward_s[0], B = e->stage_backward_s[0];
    if (zero == 2) {
      const double reduce = zero2_scatters / 1e9, gather = frac * 2 * P / 1e9;
      EXPECT_NEAR(r.dp_comm_s, reduce + gather, 1e-15);
      // Hidden under the step's compute (every micro-batch's backward reduces).
      EXPECT_NEAR(r.dp_exposed_s, std::fmax(0.0, reduce + gather - mb * (F + B)), 1e-15);
      EXPECT_NEAR(r.optimizer_s, P * 30 / d / 1e11, 1e-15);
    }
    if (zero == 3) {
      EXPECT_NEAR(r.dp_comm_s, (zero3_gathers + zero2_scatters) / 1e9, 1e-15);
      EXPECT_NEAR(r.dp_exposed_s, std::fmax(0.0, r.dp_comm_s - mb * (F + B)), 1e-15);
    }
  }
  EXPECT_GT(expected_memory[0], expected_memory[1]);
  // With two blocks on a GPU, ZeRO-2's two gradient windows (a block each, 46% of the model) and
  // its scatter buffer outweigh what sharding the gradients saves, and ZeRO-3's two weight
  // windows what sharding the weights saves (both pay on models of many layers:
  // tools/bench/memory.sh).
  EXPECT_GT(expected_memory[2], expected_memory[1]);
  EXPECT_GT(expected_memory[3], expected_memory[2]);
}

// Hybrid sharding (HSDP): ZeRO-1 over dp 4 in groups of 2 divides the optimizer state by 2, not
// 4; the reduce-scatter and gather run over the group of 2 (half of each moves), and each rank's
// half of the gradients is then all-reduced over the 2 replicas.
TEST(CostModel, HybridShardingDividesByTheGroupAndAllReducesAcrossReplicas) {
  Model m;
  mp_cluster c = hand_cluster();
  const double P = 108800;
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  mp_layout l = layout(4, 1, 1, 1, 4);
  l.zero_stage = 1;
  l.zero_shard_size = 2;
  EXPECT_EQ(mp_layout_zero_shard(&l), 2);
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  const mp_rank_estimate &r = e->ranks[0];
  EXPECT_DOUBLE_EQ(r.optimizer_bytes, 12 * P / 2);
  EXPECT_DOUBLE_EQ(r.grads_bytes, 4 * P);
  const double group = 0.5 * (4 * P + 2 * P) / 1e9;
  const double replicas = 2.0 * (1.0 / 2.0) * (4 * P / 2) / 1e9;
  EXPECT_NEAR(r.dp_comm_s, group + replicas, 1e-15);
  // A group as large as dp is no hybrid.
  l.zero_shard_size = 4;
  EXPECT_EQ(mp_layout_zero_shard(&l), 4);
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  EXPECT_DOUBLE_EQ(e->ranks[0].optimizer_bytes, 12 * P / 4);
}

TEST(CostModel, PipelineMemoryAndTheTiedHead) {
  Model m;
  mp_cluster c = hand_cluster();
  mp_layout l = layout(1, 2, 1, 1, 4);
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  const int split[2] = {2, 3};  // embedding + block.0 | block.1 + norm + head
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, split, e.get(), &err), MP_OK) << err.message;
  EXPECT_EQ(e->ranks[0].peak_live, 2);  // 1F1B: pp - rank micro-batches alive
  EXPECT_EQ(e->ranks[1].peak_live, 1);
  const double first = 128 * 64 + 8 * 64 + (12 * 64 * 64 + 13 * 64);
  const double last = (12 * 64 * 64 + 13 * 64) + 128 + 128 * 64;  // + its copy of the table
  EXPECT_DOUBLE_EQ(e->ranks[0].weights_bytes, 2 * first);
  EXPECT_DOUBLE_EQ(e->ranks[1].weights_bytes, 2 * last);
  // The tied table's gradient (128 x 64 fp32) summed between the two ranks once the backwards
  // are done: a 2-rank ring on the node's link (1 GB/s), exposed on both.
  const double tied_sum = 2.0 * 0.5 * (128 * 64 * 4) / 1e9;
  for (int p = 0; p < 2; ++p) {
    EXPECT_NEAR(e->ranks[p].dp_comm_s, tied_sum, 1e-15) << p;
    EXPECT_NEAR(e->ranks[p].dp_exposed_s, tied_sum, 1e-15) << p;
  }
  // Every rank's time adds up to the step time.
  for (int p = 0; p < 2; ++p) {
    const mp_rank_estimate &r = e->ranks[p];
    EXPECT_NEAR(r.compute_s + r.tp_comm_s + r.idle_s + r.dp_exposed_s + r.optimizer_s +
                    r.end_wait_s,
                e->step_s, 1e-12);
  }
  const int wrong[2] = {2, 2};
  EXPECT_EQ(mp_cost_estimate(&c, m.model, &l, wrong, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "layers_per_stage sums to 4, but model hand has 5 layers (embedding, blocks, "
               "final norm and LM head each count one)");
}

// A wide GEMM (an LM head over a vocabulary 64 times the hidden size) runs at the cluster's
// wide_gemm_efficiency of the curve's rate: the head's forward GEMM (32 tokens x 64 x 4096, at
// the hand cluster's peak: compute-bound) takes twice as long at 0.5, and its backward's two as
// well; a block's GEMMs (no wider than 4 x their input) do not change.
TEST(CostModel, WideGemmsRunAtTheirOwnEfficiency) {
  std::string text = kModel;
  text.replace(text.find("\"vocab_size\": 128"), 17, "\"vocab_size\": 4096");
  Loaded wide;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_parse_text(text.c_str(), "hand.json", &wide.model, &err), MP_OK)
      << err.message;
  mp_cluster c = hand_cluster(), slow = hand_cluster();
  slow.wide_gemm_efficiency = 0.5;
  const mp_layout l = layout(1, 1, 1, 4, 1);
  const int last = mp_model_num_layers(wide.model) - 1;
  mp_layer_time head, slow_head, block, slow_block;
  mp_cost_layer(&c, mp_model_layer(wide.model, last), &l, &head);
  mp_cost_layer(&slow, mp_model_layer(wide.model, last), &l, &slow_head);
  const double gemm = 2.0 * 32 * 64 * 4096 / 1e12;
  EXPECT_NEAR(slow_head.forward_compute_s - head.forward_compute_s, gemm, 1e-15);
  EXPECT_NEAR(slow_head.backward_compute_s - head.backward_compute_s, 2 * gemm, 1e-15);
  mp_cost_layer(&c, mp_model_layer(wide.model, 1), &l, &block);
  mp_cost_layer(&slow, mp_model_layer(wide.model, 1), &l, &slow_block);
  EXPECT_DOUBLE_EQ(slow_block.forward_compute_s, block.forward_compute_s);
}

// An untied head (the Llama family's) is the last stage's own (V, C) matrix with its gradient and
// optimizer state, split over tp; the first stage keeps only the embedding's table.
TEST(CostModel, AnUntiedHeadLivesOnTheLastStage) {
  std::string text = kModel;
  const std::string tied = "\"tie_embedding\": true";
  text.replace(text.find(tied), tied.size(), "\"tie_embedding\": false");
  Loaded untied;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_parse_text(text.c_str(), "hand.json", &untied.model, &err), MP_OK)
      << err.message;
  mp_cluster c = hand_cluster();
  mp_layout l = layout(1, 2, 2, 1, 4);
  auto e = std::make_unique<mp_estimate>();
  const int split[2] = {2, 3};
  ASSERT_EQ(mp_cost_estimate(&c, untied.model, &l, split, e.get(), &err), MP_OK) << err.message;
  const double block = 12 * 64 * 64 + 13 * 64;
  const double first = (128 * 64 + 8 * 64 + block) / 2;
  const double last = (block + 128 + 128 * 64) / 2;
  EXPECT_DOUBLE_EQ(e->ranks[0].weights_bytes, 2 * first);
  EXPECT_DOUBLE_EQ(e->ranks[1].weights_bytes, 2 * last);
  EXPECT_DOUBLE_EQ(e->ranks[1].grads_bytes, 4 * last);
  EXPECT_DOUBLE_EQ(e->ranks[1].optimizer_bytes, 12 * last);
}

// With the schedule generated and checked once (what the planner does for every layout sharing
// it), the estimate is the one mp_cost_estimate makes, to the bit; another schedule is refused.
TEST(CostModel, APreparedScheduleEstimatesTheSame) {
  Model m;
  mp_cluster c = hand_cluster();
  mp_layout l = layout(1, 2, 1, 1, 4);
  l.schedule = MP_SCHEDULE_INTERLEAVED_1F1B;
  l.virtual_stages = 2;
  l.num_micro_batches = 6;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(l.schedule, 2, 6, 2, &schedule, &err), MP_OK) << err.message;
  mp_sim_prepared prepared;
  ASSERT_EQ(mp_sim_prepare(&schedule, MP_P2P_EAGER, &prepared, &err), MP_OK) << err.message;
  auto plain = std::make_unique<mp_estimate>();
  auto timed = std::make_unique<mp_estimate>();
  for (int dp : {1, 2}) {
    l.dp = dp;
    l.zero_stage = dp - 1;
    ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, plain.get(), &err), MP_OK)
        << err.message;
    ASSERT_EQ(mp_cost_estimate_prepared(&c, m.model, &l, nullptr, &prepared, timed.get(), &err),
              MP_OK)
        << err.message;
    EXPECT_EQ(timed->step_s, plain->step_s);
    EXPECT_EQ(timed->pipeline_s, plain->pipeline_s);
    EXPECT_EQ(timed->bubble_fraction, plain->bubble_fraction);
    EXPECT_EQ(timed->memory_bytes, plain->memory_bytes);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(timed->ranks[r].dp_exposed_s, plain->ranks[r].dp_exposed_s);
      EXPECT_EQ(timed->ranks[r].activation_bytes, plain->ranks[r].activation_bytes);
      EXPECT_EQ(timed->ranks[r].peak_live, plain->ranks[r].peak_live);
    }
  }
  l.num_micro_batches = 4;
  EXPECT_EQ(mp_cost_estimate_prepared(&c, m.model, &l, nullptr, &prepared, timed.get(), &err),
            MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "the prepared schedule is not the layout's: it must be the eager-checked "
               "training schedule interleaved-1f1b for pp 2, 4 micro-batches, 2 virtual stages");
  mp_sim_prepared_free(&prepared);
  mp_schedule_free(&schedule);
}

// ---- ranks sharing a node's cores (cost_model.h, "Shared cores") -----------------------------

// hand_cluster as CPU ranks: fp32 only, and the cores of a node that its ranks share.
mp_cluster cpu_cluster(int cores) {
  mp_cluster c = hand_cluster();
  c.peak_flops_per_s[MP_DTYPE_BF16] = 0;
  c.peak_flops_per_s[MP_DTYPE_FP32] = 1e11;
  c.cores_per_node = cores;
  return c;
}

void ExpectTimesScaled(const mp_layer_time &shared, const mp_layer_time &alone, double factor) {
  EXPECT_DOUBLE_EQ(shared.forward_compute_s, factor * alone.forward_compute_s);
  EXPECT_DOUBLE_EQ(shared.backward_compute_s, factor * alone.backward_compute_s);
  EXPECT_DOUBLE_EQ(shared.recompute_s, factor * alone.recompute_s);
  EXPECT_DOUBLE_EQ(shared.forward_tp_s, factor * alone.forward_tp_s);
  EXPECT_DOUBLE_EQ(shared.backward_tp_s, factor * alone.backward_tp_s);
  EXPECT_DOUBLE_EQ(shared.params, alone.params);  // memory does not stretch
  EXPECT_DOUBLE_EQ(shared.activation_bytes, alone.activation_bytes);
}

// 8 ranks of one BLAS thread on 2 cores take turns: every time of every layer is 4x a rank's
// alone, and so are the stage durations, the point-to-point transfer, the dp reduction, the
// optimizer, the simulated pipeline and the step.
TEST(CostModelSharedCores, EightRanksOnTwoCoresTakeFourTimesAsLong) {
  Model m;
  const mp_cluster shared = cpu_cluster(2), alone = cpu_cluster(0);
  mp_layout l = layout(2, 2, 2, 1, 4);
  l.recompute = MP_RECOMPUTE_SELECTIVE;  // a nonzero recompute_s
  EXPECT_EQ(mp_cost_compute_slowdown(&shared, &l), 4.0);
  EXPECT_EQ(mp_cost_compute_slowdown(&alone, &l), 1.0);
  for (int i = 0; i < mp_model_num_layers(m.model); ++i) {
    SCOPED_TRACE(i);
    mp_layer_time on_node, by_itself;
    mp_cost_layer_on_node(&shared, mp_model_layer(m.model, i), &l, &on_node);
    mp_cost_layer(&shared, mp_model_layer(m.model, i), &l, &by_itself);
    ExpectTimesScaled(on_node, by_itself, 4.0);
  }
  auto a = std::make_unique<mp_estimate>();
  auto s = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cost_estimate(&alone, m.model, &l, nullptr, a.get(), &err), MP_OK) << err.message;
  ASSERT_EQ(mp_cost_estimate(&shared, m.model, &l, nullptr, s.get(), &err), MP_OK) << err.message;
  ASSERT_GT(a->ranks[0].dp_comm_s, 0.0);
  ASSERT_GT(a->p2p_s, 0.0);
  for (int st = 0; st < 2; ++st) {
    EXPECT_EQ(s->layers_per_stage[st], a->layers_per_stage[st]);
    EXPECT_DOUBLE_EQ(s->stage_forward_s[st], 4.0 * a->stage_forward_s[st]);
    EXPECT_DOUBLE_EQ(s->stage_backward_s[st], 4.0 * a->stage_backward_s[st]);
    EXPECT_DOUBLE_EQ(s->ranks[st].dp_comm_s, 4.0 * a->ranks[st].dp_comm_s);
    EXPECT_DOUBLE_EQ(s->ranks[st].optimizer_s, 4.0 * a->ranks[st].optimizer_s);
    EXPECT_DOUBLE_EQ(s->ranks[st].memory_bytes - s->ranks[st].workspace_bytes,
                     a->ranks[st].memory_bytes - a->ranks[st].workspace_bytes);
  }
  EXPECT_DOUBLE_EQ(s->p2p_s, 4.0 * a->p2p_s);
  EXPECT_NEAR(s->pipeline_s, 4.0 * a->pipeline_s, 1e-12 * a->pipeline_s);
  // And CPU ranks hide none of the dp reduction: it runs on the cores that compute.
  double tail = 0.0;
  for (int st = 0; st < 2; ++st) {
    EXPECT_EQ(s->ranks[st].dp_exposed_s, s->ranks[st].dp_comm_s);
    tail = std::fmax(tail, 4.0 * (a->ranks[st].dp_comm_s + a->ranks[st].optimizer_s));
  }
  EXPECT_NEAR(s->step_s, 4.0 * a->pipeline_s + tail, 1e-12 * a->step_s);
  // The same 8 ranks on 8 cores, or 16, run as if each had its own processor.
  const mp_cluster eight = cpu_cluster(8), sixteen = cpu_cluster(16);
  EXPECT_EQ(mp_cost_compute_slowdown(&eight, &l), 1.0);
  EXPECT_EQ(mp_cost_compute_slowdown(&sixteen, &l), 1.0);
}

// One rank on 2 cores: `run` gives it 2 BLAS threads, so its GEMMs run at twice the one-thread
// peak and the rest (elementwise memory traffic) as before; nothing is stretched.
TEST(CostModelSharedCores, FewerRanksThanCoresGetTheirBlasThreads) {
  Model m;
  const mp_cluster shared = cpu_cluster(2);
  mp_cluster doubled = cpu_cluster(0);
  doubled.peak_flops_per_s[MP_DTYPE_FP32] *= 2;
  const mp_layout l = layout(1, 1, 1, 2, 1);
  const mp_layer_spec *block = mp_model_layer(m.model, 1);
  mp_layer_time on_node, expected, one_thread;
  mp_cost_layer_on_node(&shared, block, &l, &on_node);
  mp_cost_layer(&doubled, block, &l, &expected);
  mp_cost_layer(&shared, block, &l, &one_thread);
  ExpectTimesScaled(on_node, expected, 1.0);
  EXPECT_LT(on_node.forward_compute_s, one_thread.forward_compute_s);
  EXPECT_GT(on_node.forward_compute_s, 0.5 * one_thread.forward_compute_s);  // elementwise stays
  // Measured thread scaling (calibrate's blas_thread_efficiency): two threads at 0.8 of twice
  // one thread's rate, the GEMMs of a peak 1.6 x one thread's.
  mp_cluster measured = cpu_cluster(2);
  measured.blas_thread_efficiency = 0.8;
  mp_cluster scaled = cpu_cluster(0);
  scaled.peak_flops_per_s[MP_DTYPE_FP32] *= 1.6;
  mp_cost_layer_on_node(&measured, block, &l, &on_node);
  mp_cost_layer(&scaled, block, &l, &expected);
  ExpectTimesScaled(on_node, expected, 1.0);
}

// A GPU preset gives no cores_per_node: each device its own processor, whatever the layout.
TEST(CostModelSharedCores, GpuPresetIsUnaffected) {
  Model m;
  mp_cluster h100;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_preset("h100-sxm", &h100, &err), MP_OK) << err.message;
  ASSERT_EQ(h100.cores_per_node, 0);
  const mp_layout l = layout(8, 2, 8, 1, 4);
  EXPECT_EQ(mp_cost_compute_slowdown(&h100, &l), 1.0);
  for (int i = 0; i < mp_model_num_layers(m.model); ++i) {
    mp_layer_time on_node, alone;
    mp_cost_layer_on_node(&h100, mp_model_layer(m.model, i), &l, &on_node);
    mp_cost_layer(&h100, mp_model_layer(m.model, i), &l, &alone);
    EXPECT_EQ(std::memcmp(&on_node, &alone, sizeof alone), 0) << i;
  }
}

// Workspace: the cluster's workspace_gib when given, else 5% of device memory; CPU ranks with
// dp > 1 add a copy of their gradients (Open MPI's in-flight all-reduce temporaries); every rank
// the unfused attention's backward scratch (two fp32 score matrices of a micro-batch of one
// sequence: 4 heads x 8 x 8).
TEST(CostModelSharedCores, WorkspaceIsTheClustersAndCpuRanksAddTheDpTemporaries) {
  Model m;
  mp_cluster c = cpu_cluster(2);
  EXPECT_DOUBLE_EQ(mp_cost_workspace_bytes(&c), 0.05 * kGiB);
  c.workspace_bytes = 170 << 20;
  EXPECT_DOUBLE_EQ(mp_cost_workspace_bytes(&c), 170.0 * 1048576);
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  mp_layout one = layout(1, 1, 1, 1, 2);
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &one, nullptr, e.get(), &err), MP_OK) << err.message;
  const double scratch = 2 * (4 * 8 * 8) * 4.0;
  EXPECT_DOUBLE_EQ(e->ranks[0].workspace_bytes, 170.0 * 1048576 + scratch);
  mp_layout two = layout(2, 1, 1, 1, 2);
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &two, nullptr, e.get(), &err), MP_OK) << err.message;
  EXPECT_DOUBLE_EQ(e->ranks[0].workspace_bytes,
                   170.0 * 1048576 + e->ranks[0].grads_bytes + scratch);
  EXPECT_DOUBLE_EQ(e->ranks[0].memory_bytes,
                   e->ranks[0].weights_bytes + e->ranks[0].grads_bytes +
                       e->ranks[0].optimizer_bytes + e->ranks[0].activation_bytes +
                       e->ranks[0].workspace_bytes);
  // A GPU cluster's NCCL reduces in place.
  mp_cluster gpu = hand_cluster();
  EXPECT_EQ(mp_cost_dp_transient_bytes(&gpu, 1e9), 0.0);
  EXPECT_EQ(mp_cost_dp_transient_bytes(&c, 1e9), 1e9);
}

// ---- expert parallelism (issue 33; cost_model.h, "Expert parallelism") ------------------------

// Two MoE blocks of 8 experts (F 32, top 2) between an embedding and an untied head, h 64.
const char *kMoeModel =
    "{\"name\": \"hand-moe\", \"vocab_size\": 128, \"seq_len\": 8, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 64, \"max_positions\": 0},"
    "{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"kv_heads\": 2, \"norm\": "
    "\"rmsnorm\", \"activation\": \"swiglu\", \"bias\": false, \"repeat\": 2,"
    " \"moe\": {\"experts\": 8, \"top_k\": 2, \"expert_ffn_hidden\": 32}},"
    "{\"type\": \"layernorm\", \"hidden\": 64, \"norm\": \"rmsnorm\"},"
    "{\"type\": \"lm_head\", \"hidden\": 64, \"tie_embedding\": false}]}";

// One block's experts: 8 x (gate, up, down) of 64 x 32.
const double kBlockExperts = 8.0 * 3.0 * 64.0 * 32.0;  // 49152

struct MoeModel {
  mp_model *model = nullptr;
  MoeModel() {
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_model_parse_text(kMoeModel, "hand-moe.json", &model, &err), MP_OK)
        << err.message;
  }
  ~MoeModel() { mp_model_free(model); }
};

// At ep 1, 2, 4, 8 a rank holds 1/ep of each block's experts, and so 1/ep of their bf16 weights
// (2 B), fp32 gradients (4 B) and optimizer state (12 B); everything else whole. With ZeRO-1 the
// experts' optimizer state is sharded over the dp / ep ranks of their expert-data-parallel group,
// so a rank holds 1/dp of it whatever ep: the same bytes at every ep.
TEST(CostModelExperts, ARankHoldsOneEpthOfTheExperts) {
  MoeModel m;
  mp_cluster c = hand_cluster();
  const double total = (double)mp_model_params(m.model);
  const double others = total - 2.0 * kBlockExperts;
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  for (int ep : {1, 2, 4, 8}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    mp_layout l = layout(8, 1, 1, 1, 1);
    l.ep = ep;
    mp_layer_time block;
    mp_cost_layer(&c, mp_model_layer(m.model, 1), &l, &block);
    EXPECT_DOUBLE_EQ(block.expert_params, kBlockExperts / ep);
    EXPECT_DOUBLE_EQ(block.params,
                     (double)mp_layer_params(mp_model_layer(m.model, 1)) - kBlockExperts +
                         kBlockExperts / ep);
    ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
    const double held = others + 2.0 * kBlockExperts / ep;
    EXPECT_DOUBLE_EQ(e->ranks[0].weights_bytes, 2.0 * held);
    EXPECT_DOUBLE_EQ(e->ranks[0].grads_bytes, 4.0 * held);
    EXPECT_DOUBLE_EQ(e->ranks[0].optimizer_bytes, 12.0 * held);
    l.zero_stage = 1;
    ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
    EXPECT_DOUBLE_EQ(e->ranks[0].weights_bytes, 2.0 * held);
    EXPECT_DOUBLE_EQ(e->ranks[0].optimizer_bytes,
                     12.0 * (others / 8.0 + 2.0 * kBlockExperts / 8.0));
    EXPECT_EQ(mp_layout_expert_shard(&l), 8 / ep);
  }
}

// The dispatch and combine all-to-alls: none at ep 1; at ep > 1, per block and micro-batch 2
// forward and 2 backward (4 backward with full recomputation), each of the rank's tokens' k
// copies, B x T x k x C x 2 B = 2 x 8 x 2 x 64 x 2 = 4096 B, (ep-1)/ep of which cross the link:
// NVLink-like inside the node of 8 (tp x ep <= 8), the network beyond it.
TEST(CostModelExperts, AllToAllsOnlyWithExpertParallelism) {
  MoeModel m;
  mp_cluster c = hand_cluster();
  c.intra_node_collective_latency_s = 2e-6;
  c.inter_node_collective_latency_s = 5e-6;
  const mp_layer_spec *block = mp_model_layer(m.model, 1);
  mp_layer_time t;
  mp_layout l = layout(8, 1, 1, 2, 1);
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_EQ(t.forward_ep_s, 0.0);
  EXPECT_EQ(t.backward_ep_s, 0.0);
  const double bytes = 2 * 8 * 2 * 64 * 2.0;
  for (int ep : {2, 4, 8}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    l.ep = ep;
    mp_cost_layer(&c, block, &l, &t);
    const double a2a = (ep - 1.0) / ep * bytes / 1e9 + (ep - 1) * 2e-6;
    EXPECT_DOUBLE_EQ(t.ep_dispatch_bytes, bytes);
    EXPECT_DOUBLE_EQ(t.forward_ep_s, 2.0 * a2a);
    EXPECT_DOUBLE_EQ(t.backward_ep_s, 2.0 * a2a);
    EXPECT_DOUBLE_EQ(mp_layer_time_seconds(&t),
                     t.forward_compute_s + t.backward_compute_s + 4.0 * a2a);
    l.recompute = MP_RECOMPUTE_FULL;
    mp_cost_layer(&c, block, &l, &t);
    EXPECT_DOUBLE_EQ(t.backward_ep_s, 4.0 * a2a);
    l.recompute = MP_RECOMPUTE_NONE;
  }
  // tp 2 x ep 8 = 16 ranks span two nodes of 8: the inter-node link.
  l = layout(8, 1, 2, 2, 1);
  l.ep = 8;
  mp_cost_layer(&c, block, &l, &t);
  EXPECT_DOUBLE_EQ(t.forward_ep_s, 2.0 * (7.0 / 8.0 * bytes / 1e8 + 7 * 5e-6));
  // Layers without experts never pay one.
  mp_cost_layer(&c, mp_model_layer(m.model, 0), &l, &t);
  EXPECT_EQ(t.forward_ep_s + t.backward_ep_s, 0.0);
  // The estimate: every stage's F and B carry them, 2 blocks x 4 a2a x 3 micro-batches a step.
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  l = layout(8, 1, 1, 2, 3);
  l.ep = 4;
  ASSERT_EQ(mp_cost_estimate(&c, m.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  const double a2a = 3.0 / 4.0 * bytes / 1e9 + 3 * 2e-6;
  EXPECT_DOUBLE_EQ(e->ranks[0].ep_comm_s, 3 * 2 * 4.0 * a2a);
  EXPECT_DOUBLE_EQ(e->ep_layer_forward_s, 2.0 * a2a);
  EXPECT_FALSE(e->ep_inter_node);
}

// The experts' products at their real size: ep x tokens x k / E rows for each of the E / ep local
// experts, a grouped GEMM, each expert costed as its own launch. On h100-sxm's efficiency curve a
// small expert runs below peak: the same FLOPs in 8 experts of 64 rows (ep 1) take longer than in
// 1 expert of 512 (ep 8).
TEST(CostModelExperts, SmallExpertGemmsRunBelowPeak) {
  Loaded mixtral;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_load("examples/models/mixtral-8x7b.json", &mixtral.model, &err), MP_OK)
      << err.message;
  const mp_layer_spec *block = mp_model_layer(mixtral.model, 1);
  for (int ep : {1, 8}) {
    const mp_cost_shape shape = {1, 256, 2, true, 1, ep};
    mp_layer_cost cost;
    mp_layer_cost_compute(block, &shape, &cost);
    int grouped = 0;
    for (int i = 0; i < cost.num_gemms; ++i) {
      if (!cost.gemms[i].grouped) continue;
      ++grouped;
      EXPECT_DOUBLE_EQ(cost.gemms[i].m, ep * 256.0 * 2 / 8);
      EXPECT_DOUBLE_EQ(cost.gemms[i].batch, 8.0 / ep);
    }
    EXPECT_EQ(grouped, 2);  // gate+up, down
    EXPECT_DOUBLE_EQ(cost.expert_params, 8.0 * 3 * 4096 * 14336);
  }
  mp_cluster h100;
  ASSERT_EQ(mp_cluster_preset("h100-sxm", &h100, &err), MP_OK) << err.message;
  mp_layout l = layout(8, 1, 1, 1, 1);
  l.seq_len = 256;
  mp_layer_time one, eight;
  l.ep = 1;
  mp_cost_layer(&h100, block, &l, &one);
  l.ep = 8;
  mp_cost_layer(&h100, block, &l, &eight);
  EXPECT_DOUBLE_EQ(one.model_flops, eight.model_flops);
  EXPECT_GT(one.forward_compute_s, 1.5 * eight.forward_compute_s);
}

// What ep must be, each refusal naming the numbers: a divisor of dp x cp, a divisor of every MoE
// block's experts, and 1 on a model without experts; a plan's refusal names its file and
// $.parallel.ep.
TEST(CostModelExperts, RefusesAnEpTheLayoutOrTheModelCannotTake) {
  MoeModel moe;
  Model dense;
  mp_cluster c = hand_cluster();
  auto e = std::make_unique<mp_estimate>();
  mp_error err = MP_ERROR_INITIALIZER;
  mp_layout l = layout(2, 1, 1, 1, 1);
  l.ep = 4;
  EXPECT_EQ(mp_cost_estimate(&c, moe.model, &l, nullptr, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "ep 4 does not divide dp x cp = 2 x 1 = 2 (the expert-parallel groups are cut out "
               "of the dp x cp ranks)");
  l = layout(6, 1, 1, 1, 1);
  l.ep = 3;
  EXPECT_EQ(mp_cost_estimate(&c, moe.model, &l, nullptr, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "ep 3 does not divide the 8 experts of block.0 (hand-moe.json: "
               "$.layers[1].moe.experts); each expert-parallel rank holds experts / ep whole "
               "experts");
  l = layout(2, 1, 1, 1, 1);
  l.ep = 2;
  EXPECT_EQ(mp_cost_estimate(&c, dense.model, &l, nullptr, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "ep 2 splits the experts of mixture-of-experts blocks over ranks, but model hand "
               "(hand.json) has no such block; use ep 1");
  l.ep = 1;
  EXPECT_EQ(mp_cost_estimate(&c, dense.model, &l, nullptr, e.get(), &err), MP_OK) << err.message;
  // Through a plan: its file and the JSON path first.
  mp_plan plan;
  const char *text =
      "{\"model\": \"hand.json\", \"cluster\": \"h100-sxm\", \"parallel\": {\"dp\": 2, \"pp\": 1, "
      "\"tp\": 1, \"ep\": 2}, \"batch\": {\"global_batch\": 2, \"micro_batch\": 1, "
      "\"num_micro_batches\": 1, \"seq_len\": 8}}";
  ASSERT_EQ(mp_plan_parse_text(text, "p.json", ".", &plan, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_cost_estimate_plan(&plan, dense.model, e.get(), &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "p.json: $.parallel.ep: ep 2 splits the experts of mixture-of-experts blocks over "
               "ranks, but model hand (hand.json) has no such block; use ep 1");
  ASSERT_EQ(mp_cost_estimate_plan(&plan, moe.model, e.get(), &err), MP_OK) << err.message;
  EXPECT_EQ(e->layout.ep, 2);
  EXPECT_GT(e->ranks[0].ep_comm_s, 0.0);
}

}  // namespace
