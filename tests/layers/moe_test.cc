// tests/layers/moe_test.cc — layers/moe.h against transformers 4.46.3: MixtralSparseMoeBlock and
// Qwen2MoeSparseMoeBlock, run in float64 by tools/bench/moe_golden.py on seeded weights and
// inputs. Forward output, router logits, the load-balancing and z-losses, and the gradient of
// sum(out * dout) + aux_coeff * aux + z_coeff * z with respect to the input, the router and every
// expert (and shared expert) weight, all within 1e-5. Cases: Mixtral (renormalised top 2, aux and
// z-loss), Qwen2-MoE (not renormalised, shared expert with its gate), an expert that receives no
// token, and router logits that tie at the top-k boundary; and a device with no token at all.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "layers/moe.h"

namespace {

constexpr double kTolerance = 1e-5;

struct Golden {
  cJSON *root = nullptr;
  std::map<std::string, std::vector<float>> tensors;
  ~Golden() { cJSON_Delete(root); }
  int config_int(const char *key) const {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), key)->valueint;
  }
  double config_number(const char *key) const {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), key)->valuedouble;
  }
  bool config_bool(const char *key) const {
    return cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "config"), key));
  }
  std::vector<float> &at(const std::string &name) {
    EXPECT_TRUE(tensors.count(name)) << name;
    return tensors[name];
  }
};

void load(const std::string &name, Golden *g) {
  std::ifstream in("tests/layers/testdata/moe/" + name + ".json");
  ASSERT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  g->root = cJSON_Parse(text.str().c_str());
  ASSERT_NE(g->root, nullptr);
  const cJSON *tensors = cJSON_GetObjectItem(g->root, "tensors");
  for (const cJSON *t = tensors->child; t != nullptr; t = t->next) {
    std::vector<float> &v = g->tensors[t->string];
    for (const cJSON *x = t->child; x != nullptr; x = x->next) v.push_back((float)x->valuedouble);
  }
}

double max_error(const float *got, const std::vector<float> &want) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::fmax(worst, std::fabs((double)got[i] - (double)want[i]));
  }
  return worst;
}

void check_case(const std::string &name) {
  Golden g;
  load(name, &g);
  if (::testing::Test::HasFatalFailure()) return;
  mp_moe_shape shape;
  shape.tokens = g.config_int("tokens");
  shape.channels = g.config_int("hidden");
  shape.experts = g.config_int("experts");
  shape.top_k = g.config_int("top_k");
  shape.expert_ffn = g.config_int("expert_ffn_hidden");
  shape.shared_ffn = g.config_int("shared_ffn_hidden");
  shape.shared_gate = shape.shared_ffn > 0;  // Qwen2-MoE's block always gates its shared expert
  shape.normalize_top_k = g.config_bool("normalize_top_k");
  const double aux_coeff = g.config_number("aux_loss_coeff");
  const double z_coeff = g.config_number("z_loss_coeff");
  const int N = shape.tokens, C = shape.channels, E = shape.experts;

  mp_moe_params params = {g.at("router").data(), g.at("expert_fc1").data(),
                          g.at("expert_fc2").data(), nullptr, nullptr, nullptr};
  std::vector<float> d_router(g.at("router").size()), d_fc1(g.at("expert_fc1").size()),
      d_fc2(g.at("expert_fc2").size()), d_sfc1, d_sfc2, d_sgate;
  mp_moe_params grads = {d_router.data(), d_fc1.data(), d_fc2.data(), nullptr, nullptr, nullptr};
  if (shape.shared_ffn > 0) {
    params.shared_fc1 = g.at("shared_fc1").data();
    params.shared_fc2 = g.at("shared_fc2").data();
    params.shared_gate = g.at("shared_gate").data();
    d_sfc1.resize(g.at("shared_fc1").size());
    d_sfc2.resize(g.at("shared_fc2").size());
    d_sgate.resize(g.at("shared_gate").size());
    grads.shared_fc1 = d_sfc1.data();
    grads.shared_fc2 = d_sfc2.data();
    grads.shared_gate = d_sgate.data();
  }

  std::vector<float> out((size_t)N * C), dx((size_t)N * C);
  mp_moe_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_forward_cpu(out.data(), g.at("x").data(), &params, &shape, &cache, &err),
            MP_OK)
      << err.message;
  EXPECT_LT(max_error(cache.logits, g.at("router_logits")), kTolerance) << name;
  EXPECT_LT(max_error(out.data(), g.at("out")), kTolerance) << name;
  // Tokens per expert, as transformers routed them (the tie case: to the lowest index).
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(cache.expert_offset[e + 1] - cache.expert_offset[e], (int)g.at("expert_tokens")[e])
        << name << " expert " << e;
  }

  std::vector<double> routed(E), prob_sum(E);
  mp_moe_stats stats = {E, 0.0, routed.data(), prob_sum.data(), 0.0};
  mp_moe_stats_clear(&stats);
  mp_moe_stats_add(&stats, &cache);
  EXPECT_NEAR(mp_moe_aux_loss(&stats), g.at("aux_loss")[0], kTolerance) << name;
  EXPECT_NEAR(mp_moe_z_loss(&stats), g.at("z_loss")[0], 1e-4 * g.at("z_loss")[0]) << name;

  ASSERT_EQ(mp_moe_backward_cpu(dx.data(), &grads, g.at("dout").data(), g.at("x").data(),
                                &params, &cache, &stats, aux_coeff, z_coeff, &err),
            MP_OK)
      << err.message;
  const std::pair<const char *, const float *> checks[] = {
      {"dx", dx.data()}, {"drouter", d_router.data()}, {"dexpert_fc1", d_fc1.data()},
      {"dexpert_fc2", d_fc2.data()}};
  for (const auto &c : checks) {
    const double worst = max_error(c.second, g.at(c.first));
    EXPECT_LT(worst, kTolerance) << name << " " << c.first;
    std::printf("%s %s max error %.3g\n", name.c_str(), c.first, worst);
  }
  if (shape.shared_ffn > 0) {
    EXPECT_LT(max_error(d_sfc1.data(), g.at("dshared_fc1")), kTolerance) << name;
    EXPECT_LT(max_error(d_sfc2.data(), g.at("dshared_fc2")), kTolerance) << name;
    EXPECT_LT(max_error(d_sgate.data(), g.at("dshared_gate")), kTolerance) << name;
  }
  std::printf("%s out max error %.3g\n", name.c_str(), max_error(out.data(), g.at("out")));
  mp_moe_cache_free(&cache);
}

TEST(Moe, MixtralBlockMatchesTransformers) { check_case("mixtral"); }
TEST(Moe, Qwen2MoeBlockWithSharedExpertMatchesTransformers) { check_case("qwen2_moe"); }
TEST(Moe, ExpertWithNoTokenMatchesTransformers) { check_case("empty_expert"); }
TEST(Moe, TiedRouterLogitsGoToTheLowestExpert) { check_case("tied"); }

// The load-balancing loss over two layers is transformers' over their concatenated logits: the
// statistics add, and the loss of the sum is not the sum of the losses.
TEST(Moe, AuxLossOverLayersIsTheLossOfTheirConcatenation) {
  Golden g;
  load("mixtral", &g);
  double routed[4], prob_sum[4];
  mp_moe_stats stats = {4, 0.0, routed, prob_sum, 0.0};
  mp_moe_stats_clear(&stats);
  // Two layers that routed identically: each statistic doubles, n doubles, the loss is unchanged.
  mp_moe_shape shape = {10, 8, 4, 2, 6, 0, false, true};
  mp_moe_params params = {g.at("router").data(), g.at("expert_fc1").data(),
                          g.at("expert_fc2").data(), nullptr, nullptr, nullptr};
  std::vector<float> out(80);
  mp_moe_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_forward_cpu(out.data(), g.at("x").data(), &params, &shape, &cache, &err), MP_OK);
  mp_moe_stats_add(&stats, &cache);
  mp_moe_stats_add(&stats, &cache);
  EXPECT_NEAR(mp_moe_aux_loss(&stats), g.at("aux_loss")[0], kTolerance);
  EXPECT_EQ(stats.tokens, 20.0);
  mp_moe_cache_free(&cache);
}

// A device with no token (an expert-parallel rank whose micro-batch part is empty still runs the
// layer): nothing to compute, no gradient but the weights' untouched zeros, and no statistic.
TEST(Moe, NoTokenIsNoWork) {
  Golden g;
  load("mixtral", &g);
  mp_moe_shape shape = {0, 8, 4, 2, 6, 0, false, true};
  mp_moe_params params = {g.at("router").data(), g.at("expert_fc1").data(),
                          g.at("expert_fc2").data(), nullptr, nullptr, nullptr};
  std::vector<float> d_router(g.at("router").size()), d_fc1(g.at("expert_fc1").size()),
      d_fc2(g.at("expert_fc2").size());
  mp_moe_params grads = {d_router.data(), d_fc1.data(), d_fc2.data(), nullptr, nullptr, nullptr};
  mp_moe_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_forward_cpu(nullptr, nullptr, &params, &shape, &cache, &err), MP_OK)
      << err.message;
  for (int e = 0; e <= 4; ++e) EXPECT_EQ(cache.expert_offset[e], 0);
  double routed[4], prob_sum[4];
  mp_moe_stats stats = {4, 0.0, routed, prob_sum, 0.0};
  mp_moe_stats_clear(&stats);
  mp_moe_stats_add(&stats, &cache);
  EXPECT_EQ(stats.tokens, 0.0);
  EXPECT_EQ(mp_moe_aux_loss(&stats), 0.0);
  ASSERT_EQ(mp_moe_backward_cpu(nullptr, &grads, nullptr, nullptr, &params, &cache, &stats, 0.02,
                                0.001, &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(d_router, std::vector<float>(d_router.size(), 0.0f));
  EXPECT_EQ(d_fc1, std::vector<float>(d_fc1.size(), 0.0f));
  mp_moe_cache_free(&cache);
}

TEST(Moe, RefusesTopKAboveExperts) {
  mp_moe_shape shape = {4, 8, 2, 3, 4, 0, false, true};
  mp_moe_params params = {};
  mp_moe_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  std::vector<float> x(32), out(32);
  EXPECT_EQ(mp_moe_forward_cpu(out.data(), x.data(), &params, &shape, &cache, &err),
            MP_ERR_INPUT);
}

}  // namespace
