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
  mp_moe_shape shape = {};
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

// ---- The capacity factor, against a double-precision reference written here ----------------

// The layer in float64 from its definition (moe.h): softmax router, top-k (ties to the lowest
// index), weights (renormalised or not), each expert keeping its first `capacity` (token, slot)
// pairs in token order, out = sum of the kept pairs' weight x SwiGLU expert. Returns
// sum(out * dout); kept (N, K) says which pairs stayed.
struct Reference {
  int N, C, E, K, F, capacity;
  bool normalize;
  double loss(const std::vector<double> &x, const std::vector<double> &router,
              const std::vector<double> &fc1, const std::vector<double> &fc2,
              const std::vector<float> &dout, std::vector<int> *kept) const {
    std::vector<int> taken(E, 0);
    if (kept != nullptr) kept->assign((size_t)N * K, 0);
    double total = 0.0;
    for (int t = 0; t < N; ++t) {
      std::vector<double> p(E);
      double max = -1e300, sum = 0.0;
      for (int e = 0; e < E; ++e) {
        double l = 0.0;
        for (int c = 0; c < C; ++c) l += x[(size_t)t * C + c] * router[(size_t)e * C + c];
        p[e] = l;
        max = std::fmax(max, l);
      }
      for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - max));
      for (int e = 0; e < E; ++e) p[e] /= sum;
      std::vector<int> chosen;
      for (int s = 0; s < K; ++s) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
          bool used = false;
          for (int j : chosen) used = used || j == e;
          if (!used && (best < 0 || p[e] > p[best])) best = e;
        }
        chosen.push_back(best);
      }
      double chosen_sum = 0.0;
      for (int e : chosen) chosen_sum += p[e];
      for (int s = 0; s < K; ++s) {
        const int e = chosen[s];
        if (taken[e]++ >= capacity) continue;  // dropped: nothing, no gradient
        if (kept != nullptr) (*kept)[(size_t)t * K + s] = 1;
        const double w = normalize ? p[e] / chosen_sum : p[e];
        std::vector<double> act(F);
        for (int f = 0; f < F; ++f) {
          double gate = 0.0, up = 0.0;
          for (int c = 0; c < C; ++c) {
            gate += fc1[((size_t)e * 2 * F + f) * C + c] * x[(size_t)t * C + c];
            up += fc1[((size_t)e * 2 * F + F + f) * C + c] * x[(size_t)t * C + c];
          }
          act[f] = gate / (1.0 + std::exp(-gate)) * up;
        }
        for (int c = 0; c < C; ++c) {
          double y = 0.0;
          for (int f = 0; f < F; ++f) y += fc2[((size_t)e * C + c) * F + f] * act[f];
          total += w * y * dout[(size_t)t * C + c];
        }
      }
    }
    return total;
  }
};

std::vector<double> widen(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

// Central differences of the float64 reference (the keep mask is locally constant).
std::vector<double> numeric_gradient(const Reference &ref, std::vector<double> *which,
                                     std::vector<double> &x, std::vector<double> &router,
                                     std::vector<double> &fc1, std::vector<double> &fc2,
                                     const std::vector<float> &dout) {
  std::vector<double> grad(which->size());
  const double h = 1e-6;
  for (size_t i = 0; i < which->size(); ++i) {
    const double saved = (*which)[i];
    (*which)[i] = saved + h;
    const double up = ref.loss(x, router, fc1, fc2, dout, nullptr);
    (*which)[i] = saved - h;
    const double down = ref.loss(x, router, fc1, fc2, dout, nullptr);
    (*which)[i] = saved;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

double max_error(const std::vector<float> &got, const std::vector<double> &want) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::fmax(worst, std::fabs(got[i] - want[i]));
  return worst;
}

// Mixtral's golden weights and tokens (N 10, C 8, E 4, K 2, F 6) at capacity factor 0.5: each
// expert keeps ceil(0.5 x 10 x 2 / 4) = 3 pairs, so at most 12 of the 20 stay. out, dx and the
// router's and experts' gradients equal the float64 reference's (aux and z-loss off: their
// statistics are the dropless routing's, checked below).
TEST(MoeCapacity, DropsBeyondCapacityInTokenOrderAsTheReference) {
  for (bool normalize : {true, false}) {
    Golden g;
    load("mixtral", &g);
    mp_moe_shape shape = {10, 8, 4, 2, 6, 0, false, normalize, 0.5};
    ASSERT_EQ(mp_moe_capacity(&shape), 3);
    const int N = 10, C = 8, E = 4, K = 2;
    mp_moe_params params = {g.at("router").data(), g.at("expert_fc1").data(),
                            g.at("expert_fc2").data(), nullptr, nullptr, nullptr};
    std::vector<float> d_router(g.at("router").size()), d_fc1(g.at("expert_fc1").size()),
        d_fc2(g.at("expert_fc2").size()), out(N * C), dx(N * C);
    mp_moe_params grads = {d_router.data(), d_fc1.data(), d_fc2.data(), nullptr, nullptr,
                           nullptr};
    mp_moe_cache cache;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_moe_forward_cpu(out.data(), g.at("x").data(), &params, &shape, &cache, &err),
              MP_OK)
        << err.message;
    double routed[4], prob_sum[4];
    mp_moe_stats stats = {4, 0.0, routed, prob_sum, 0.0};
    mp_moe_stats_clear(&stats);
    mp_moe_stats_add(&stats, &cache);
    double counted = 0.0;  // the statistics count every pair, dropped or not
    for (int e = 0; e < E; ++e) counted += routed[e];
    EXPECT_EQ(counted, (double)N * K);
    ASSERT_EQ(mp_moe_backward_cpu(dx.data(), &grads, g.at("dout").data(), g.at("x").data(),
                                  &params, &cache, &stats, 0.0, 0.0, &err),
              MP_OK)
        << err.message;

    const Reference ref = {N, C, E, K, 6, 3, normalize};
    std::vector<double> x = widen(g.at("x")), router = widen(g.at("router")),
                        fc1 = widen(g.at("expert_fc1")), fc2 = widen(g.at("expert_fc2"));
    std::vector<int> kept;
    ref.loss(x, router, fc1, fc2, g.at("dout"), &kept);
    int kept_pairs = 0;
    for (int k : kept) kept_pairs += k;
    EXPECT_LT(kept_pairs, N * K) << "the case must drop some pairs";
    EXPECT_EQ(cache.expert_offset[E], kept_pairs);
    for (int e = 0; e < E; ++e) {  // each expert's rows are its first kept tokens, in order
      int row = cache.expert_offset[e];
      for (int i = 0; i < N * K; ++i) {
        if (kept[i] && cache.selected[i] == e) {
          ASSERT_LT(row, cache.expert_offset[e + 1]);
          EXPECT_EQ(cache.routed_slot[row++], i) << "expert " << e;
        }
      }
      EXPECT_EQ(row, cache.expert_offset[e + 1]);
    }
    // out: each token's kept pairs only (the reference's loss is linear in dout: probe per unit).
    std::vector<double> out_ref(N * C);
    for (int i = 0; i < N * C; ++i) {
      std::vector<float> unit(N * C, 0.0f);
      unit[i] = 1.0f;
      out_ref[i] = ref.loss(x, router, fc1, fc2, unit, nullptr);
    }
    EXPECT_LT(max_error(out, out_ref), 1e-5) << "out normalize " << normalize;
    const std::vector<float> &dout = g.at("dout");
    EXPECT_LT(max_error(dx, numeric_gradient(ref, &x, x, router, fc1, fc2, dout)), 1e-5)
        << "dx normalize " << normalize;
    EXPECT_LT(max_error(d_router, numeric_gradient(ref, &router, x, router, fc1, fc2, dout)),
              1e-5)
        << "drouter normalize " << normalize;
    EXPECT_LT(max_error(d_fc1, numeric_gradient(ref, &fc1, x, router, fc1, fc2, dout)), 1e-5)
        << "dexpert_fc1 normalize " << normalize;
    EXPECT_LT(max_error(d_fc2, numeric_gradient(ref, &fc2, x, router, fc1, fc2, dout)), 1e-5)
        << "dexpert_fc2 normalize " << normalize;
    mp_moe_cache_free(&cache);
  }
}

// A capacity no expert can reach (factor E / K: capacity N, and a token sends an expert at most
// one pair) drops nothing: the dropless layer bit for bit, aux and z-loss included.
TEST(MoeCapacity, LargeEnoughCapacityIsDroplessBitForBit) {
  Golden g;
  load("qwen2_moe", &g);
  mp_moe_shape shape = {};
  shape.tokens = g.config_int("tokens");
  shape.channels = g.config_int("hidden");
  shape.experts = g.config_int("experts");
  shape.top_k = g.config_int("top_k");
  shape.expert_ffn = g.config_int("expert_ffn_hidden");
  shape.shared_ffn = g.config_int("shared_ffn_hidden");
  shape.shared_gate = shape.shared_ffn > 0;
  shape.normalize_top_k = g.config_bool("normalize_top_k");
  const int N = shape.tokens, C = shape.channels, E = shape.experts;
  mp_moe_params params = {g.at("router").data(),     g.at("expert_fc1").data(),
                          g.at("expert_fc2").data(), g.at("shared_fc1").data(),
                          g.at("shared_fc2").data(), g.at("shared_gate").data()};
  std::vector<float> results[2][6];
  for (int run = 0; run < 2; ++run) {
    shape.capacity_factor = run == 0 ? 0.0 : (double)E / shape.top_k;
    std::vector<float> *r = results[run];
    r[0].assign((size_t)N * C, 0.0f);  // out
    r[1].assign((size_t)N * C, 0.0f);  // dx
    r[2].assign(g.at("router").size(), 0.0f);
    r[3].assign(g.at("expert_fc1").size(), 0.0f);
    r[4].assign(g.at("expert_fc2").size(), 0.0f);
    r[5].assign(g.at("shared_fc1").size(), 0.0f);
    std::vector<float> d_sfc2(g.at("shared_fc2").size()), d_sgate(g.at("shared_gate").size());
    mp_moe_params grads = {r[2].data(), r[3].data(), r[4].data(),
                           r[5].data(), d_sfc2.data(), d_sgate.data()};
    mp_moe_cache cache;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_moe_forward_cpu(r[0].data(), g.at("x").data(), &params, &shape, &cache, &err),
              MP_OK);
    EXPECT_EQ(cache.expert_offset[E], N * shape.top_k);
    std::vector<double> routed(E), prob_sum(E);
    mp_moe_stats stats = {E, 0.0, routed.data(), prob_sum.data(), 0.0};
    mp_moe_stats_clear(&stats);
    mp_moe_stats_add(&stats, &cache);
    ASSERT_EQ(mp_moe_backward_cpu(r[1].data(), &grads, g.at("dout").data(), g.at("x").data(),
                                  &params, &cache, &stats, 0.02, 0.001, &err),
              MP_OK);
    mp_moe_cache_free(&cache);
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "tensor " << i;
}

TEST(MoeCapacity, CapacityIsTheCeilingOfFactorTimesPairsOverExperts) {
  mp_moe_shape shape = {10, 8, 4, 2, 6, 0, false, true, 1.0};
  EXPECT_EQ(mp_moe_capacity(&shape), 5);  // 10 x 2 / 4
  shape.capacity_factor = 1.1;
  EXPECT_EQ(mp_moe_capacity(&shape), 6);  // ceil(5.5)
  shape.capacity_factor = 100.0;
  EXPECT_EQ(mp_moe_capacity(&shape), 20);  // never above N K
  shape.capacity_factor = 0.0;
  EXPECT_EQ(mp_moe_capacity(&shape), 20);  // dropless
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
