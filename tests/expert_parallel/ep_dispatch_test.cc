// tests/expert_parallel/ep_dispatch_test.cc — expert_parallel/ep_dispatch.h under mpirun
// (ep_dispatch_test.sh runs it on 2 and on 4 ranks) against the one-device layer (layers/moe.h,
// itself held to transformers' goldens by tests/layers/moe_test.cc): parallel equals serial.
//
// Every rank of an ep group has different tokens (and a different count of them), as dp ranks do.
// Each rank computes the reference itself: mp_moe_forward_cpu / mp_moe_backward_cpu with all E
// experts over every group rank's tokens (it can draw them: the seeds are known). Then, on each
// rank:
//   - out and dx equal the one-device layer's on its own tokens (within 1e-6 relative; bit for
//     bit is reported: only the experts' GEMMs see more rows);
//   - the router's and the shared MLP's gradients equal those of its own tokens, and so do the
//     aux-loss statistics (they stay per rank);
//   - its local experts' weight gradients equal the SUM over the group's ranks of the one-device
//     gradients of those experts (what expert-data-parallel reduction gives at ep = world).
// Cases: ep 2 and 4 (ep 2 as two groups on 4 ranks), E 4 and 8, top_k 1 and 2, with and without
// a gated shared expert; an expert that no rank's token chooses; router rows crafted so that
// K + 1 experts tie exactly (the lowest K win, the next gets no token); a rank with no token at
// all; ep 1 through the one-rank table is the one-device layer bit for bit. And the two
// all-to-alls engine/comm/comm.h gained for it, against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/ep_comm_mpi.h"
#include "expert_parallel/ep_comm.h"
#include "expert_parallel/ep_dispatch.h"
#include "layers/moe.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;  // every rank

constexpr double kRelative = 1e-6;
constexpr int kChannels = 8, kExpertFfn = 6, kSharedFfn = 5;

int world_rank() { return mp_comm_world_rank(g_world); }
int world_size() { return mp_comm_world_size(g_world); }

struct CommDeleter {
  void operator()(mp_comm *comm) const { mp_comm_free(comm); }
};
using Comm = std::unique_ptr<mp_comm, CommDeleter>;

// Collective over the world: this rank's ep group of `ep` consecutive world ranks.
Comm make_ep_group(int ep) {
  const int first = world_rank() / ep * ep;
  std::vector<int> members(ep);
  for (int i = 0; i < ep; ++i) members[i] = first + i;
  mp_comm *comm = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_comm_group_create(g_world, members.data(), ep, "ep", &comm, &err), MP_OK)
      << err.message;
  return Comm(comm);
}

// The ep sizes this world can run: those of 2 and 4 that divide it.
std::vector<int> ep_sizes() {
  std::vector<int> out;
  for (int ep : {2, 4}) {
    if (ep <= world_size() && world_size() % ep == 0) out.push_back(ep);
  }
  return out;
}

enum class Craft { kNone, kEmptyExpert, kTie };

struct Case {
  int experts, top_k;
  bool shared;
  Craft craft;
  bool empty_rank;  // group rank 1 has no token
  double capacity_factor = 0.0;  // 0: dropless
  std::string name() const {
    char text[128];
    std::snprintf(text, sizeof text, "E%d k%d cf%g %s%s%s", experts, top_k, capacity_factor,
                  shared ? "shared" : "no-shared",
                  craft == Craft::kEmptyExpert ? " empty-expert"
                  : craft == Craft::kTie       ? " tie"
                                               : "",
                  empty_rank ? " empty-rank" : "");
    return text;
  }
};

mp_moe_shape shape_of(const Case &c, int tokens) {
  mp_moe_shape s = {};
  s.tokens = tokens;
  s.channels = kChannels;
  s.experts = c.experts;
  s.top_k = c.top_k;
  s.expert_ffn = kExpertFfn;
  s.shared_ffn = c.shared ? kSharedFfn : 0;
  s.shared_gate = c.shared;      // Qwen2-MoE's gated shared expert
  s.normalize_top_k = !c.shared; // Mixtral renormalises, Qwen2-MoE does not
  s.capacity_factor = c.capacity_factor;
  return s;
}

void fill(std::vector<float> *v, size_t n, std::mt19937 *rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  v->resize(n);
  for (float &x : *v) x = d(*rng);
}

// The whole layer's weights (all E experts), the same on every rank.
struct Weights {
  std::vector<float> router, fc1, fc2, sfc1, sfc2, sgate;
  Weights(const Case &c, unsigned seed) {
    std::mt19937 rng(seed);
    const int E = c.experts, C = kChannels, F = kExpertFfn, Fs = kSharedFfn;
    fill(&router, (size_t)E * C, &rng, -0.5f, 0.5f);
    fill(&fc1, (size_t)E * 2 * F * C, &rng, -0.4f, 0.4f);
    fill(&fc2, (size_t)E * C * F, &rng, -0.4f, 0.4f);
    if (c.shared) {
      fill(&sfc1, (size_t)2 * Fs * C, &rng, -0.4f, 0.4f);
      fill(&sfc2, (size_t)C * Fs, &rng, -0.4f, 0.4f);
      fill(&sgate, (size_t)C, &rng, -0.5f, 0.5f);
    }
    // The crafts assume positive inputs (tokens_of draws them so).
    if (c.craft == Craft::kEmptyExpert) {  // the last expert's logit is below every other's
      for (int i = 0; i < C; ++i) router[(size_t)(E - 1) * C + i] = -2.0f;
    }
    if (c.craft == Craft::kTie) {  // experts 0 .. K: one row, above every other expert's
      for (int i = 0; i < C; ++i) router[i] += 1.5f;
      for (int e = 1; e <= c.top_k; ++e) {
        std::memcpy(&router[(size_t)e * C], &router[0], sizeof(float) * C);
      }
    }
  }
  // The params of experts [first, first + count).
  mp_moe_params params(int first, int count) {
    (void)count;
    mp_moe_params p = {router.data(), fc1.data() + (size_t)first * 2 * kExpertFfn * kChannels,
                       fc2.data() + (size_t)first * kChannels * kExpertFfn,
                       sfc1.empty() ? nullptr : sfc1.data(),
                       sfc2.empty() ? nullptr : sfc2.data(),
                       sgate.empty() ? nullptr : sgate.data()};
    return p;
  }
};

// Gradient storage for a layer with `experts` experts.
struct Grads {
  std::vector<float> router, fc1, fc2, sfc1, sfc2, sgate;
  Grads(const Case &c, int experts) {
    router.assign((size_t)c.experts * kChannels, 0.0f);
    fc1.assign((size_t)experts * 2 * kExpertFfn * kChannels, 0.0f);
    fc2.assign((size_t)experts * kChannels * kExpertFfn, 0.0f);
    if (c.shared) {
      sfc1.assign((size_t)2 * kSharedFfn * kChannels, 0.0f);
      sfc2.assign((size_t)kChannels * kSharedFfn, 0.0f);
      sgate.assign((size_t)kChannels, 0.0f);
    }
  }
  mp_moe_params params() {
    mp_moe_params p = {router.data(), fc1.data(), fc2.data(),
                       sfc1.empty() ? nullptr : sfc1.data(),
                       sfc2.empty() ? nullptr : sfc2.data(),
                       sgate.empty() ? nullptr : sgate.data()};
    return p;
  }
};

// Group rank s's tokens x and output gradient dout, different on every rank.
struct Tokens {
  int count;
  std::vector<float> x, dout;
};
Tokens tokens_of(const Case &c, unsigned seed, int group_rank) {
  Tokens t;
  t.count = c.empty_rank && group_rank == 1 ? 0 : 5 + 3 * group_rank;
  std::mt19937 rng(seed * 131u + 7u * (unsigned)group_rank + 1u);
  const bool positive = c.craft != Craft::kNone;
  fill(&t.x, (size_t)t.count * kChannels, &rng, positive ? 0.1f : -1.0f, 1.0f);
  fill(&t.dout, (size_t)t.count * kChannels, &rng, -1.0f, 1.0f);
  return t;
}

// One device, one rank's tokens: the reference.
struct Serial {
  std::vector<float> out, dx;
  std::vector<double> routed, prob_sum;
  mp_moe_stats stats;
  std::vector<int> expert_rows;  // (E)
  std::vector<int> selected;     // (N, K)
  std::vector<float> probs;      // (N, E)
  std::unique_ptr<Grads> grads;
};

constexpr double kAux = 0.02, kZ = 0.001;

void run_serial(const Case &c, Weights *w, const Tokens &t, Serial *s) {
  const mp_moe_shape shape = shape_of(c, t.count);
  const mp_moe_params params = w->params(0, c.experts);
  s->out.assign((size_t)t.count * kChannels, 0.0f);
  s->dx.assign((size_t)t.count * kChannels, 0.0f);
  s->grads.reset(new Grads(c, c.experts));
  mp_moe_params grads = s->grads->params();
  mp_moe_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_forward_cpu(s->out.data(), t.x.data(), &params, &shape, &cache, &err), MP_OK)
      << err.message;
  s->routed.assign(c.experts, 0.0);
  s->prob_sum.assign(c.experts, 0.0);
  s->stats = {c.experts, 0.0, s->routed.data(), s->prob_sum.data(), 0.0};
  mp_moe_stats_clear(&s->stats);
  mp_moe_stats_add(&s->stats, &cache);
  for (int e = 0; e < c.experts; ++e) {
    s->expert_rows.push_back(cache.expert_offset[e + 1] - cache.expert_offset[e]);
  }
  s->selected.assign(cache.selected, cache.selected + (size_t)t.count * c.top_k);
  s->probs.assign(cache.probs, cache.probs + (size_t)t.count * c.experts);
  ASSERT_EQ(mp_moe_backward_cpu(s->dx.data(), &grads, t.dout.data(), t.x.data(), &params, &cache,
                                &s->stats, kAux, kZ, &err),
            MP_OK)
      << err.message;
  mp_moe_cache_free(&cache);
}

// max |got - want| / max |want| (the absolute error when want is all zero), and whether equal.
double relative_error(const float *got, const float *want, size_t n, bool *bitwise) {
  double worst = 0.0, scale = 0.0;
  *bitwise = true;
  for (size_t i = 0; i < n; ++i) {
    worst = std::fmax(worst, std::fabs((double)got[i] - (double)want[i]));
    scale = std::fmax(scale, std::fabs((double)want[i]));
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) *bitwise = false;
  }
  return scale > 0.0 ? worst / scale : worst;
}

#define EXPECT_CLOSE(got, want, n, what)                                                \
  do {                                                                                  \
    bool bitwise_ = false;                                                              \
    const double error_ = relative_error((got), (want), (n), &bitwise_);                \
    EXPECT_LE(error_, kRelative) << label << " " << (what);                             \
    if (world_rank() == 0) {                                                            \
      std::printf("  %-36s %-14s rel error %.2g%s\n", label.c_str(), (what), error_,    \
                  bitwise_ ? " (bit for bit)" : "");                                    \
    }                                                                                   \
  } while (0)

// The whole check of one case at one ep size (collective over the world).
void check_case(const Case &c, int ep_size) {
  Comm group = make_ep_group(ep_size);
  ASSERT_TRUE(group);
  const mp_ep_comm ep = mp_ep_comm_over_group(group.get());
  const int me = ep.rank, El = c.experts / ep_size, first = me * El;
  const unsigned seed = 1000u * (unsigned)c.experts + 100u * (unsigned)c.top_k +
                        10u * (unsigned)c.shared + (unsigned)c.craft + 7u * c.empty_rank +
                        13u * (unsigned)(world_rank() / ep_size);
  const std::string label = "ep" + std::to_string(ep_size) + " " + c.name() + " rank " +
                            std::to_string(me);
  Weights weights(c, 17u * (unsigned)c.experts + (unsigned)c.top_k + (c.shared ? 50u : 0u) +
                         100u * (unsigned)c.craft);

  // The reference: one device, every group rank's tokens.
  std::vector<Tokens> tokens;
  std::vector<Serial> serial(ep_size);
  for (int s = 0; s < ep_size; ++s) {
    tokens.push_back(tokens_of(c, seed, s));
    run_serial(c, &weights, tokens[s], &serial[s]);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The crafted routings are what they claim to be, on every rank's tokens.
  for (int s = 0; s < ep_size; ++s) {
    if (c.craft == Craft::kEmptyExpert) {
      EXPECT_EQ(serial[s].expert_rows[c.experts - 1], 0) << label << " from rank " << s;
    }
    if (c.craft == Craft::kTie) {
      const int K = c.top_k, E = c.experts;
      for (int t = 0; t < tokens[s].count; ++t) {
        for (int e = 1; e <= K; ++e) {  // K + 1 equal probabilities, bit for bit
          EXPECT_EQ(serial[s].probs[(size_t)t * E + e], serial[s].probs[(size_t)t * E]) << label;
        }
        for (int k = 0; k < K; ++k) {  // the lowest K of them win
          EXPECT_EQ(serial[s].selected[(size_t)t * K + k], k) << label << " token " << t;
        }
      }
      EXPECT_EQ(serial[s].expert_rows[K], 0) << label;
    }
  }

  // With a capacity, each rank's own tokens overflow it (the case is sized so): pairs dropped.
  if (c.capacity_factor > 0.0) {
    for (int s = 0; s < ep_size; ++s) {
      if (tokens[s].count == 0) continue;
      const mp_moe_shape shape_s = shape_of(c, tokens[s].count);
      int kept = 0;
      for (int e = 0; e < c.experts; ++e) {
        EXPECT_LE(serial[s].expert_rows[e], mp_moe_capacity(&shape_s)) << label;
        kept += serial[s].expert_rows[e];
      }
      EXPECT_LT(kept, tokens[s].count * c.top_k) << label << " from rank " << s;
    }
  }

  // Expert parallelism: this rank's tokens, this rank's experts.
  const Tokens &mine = tokens[me];
  const mp_moe_shape shape = shape_of(c, mine.count);
  const mp_moe_params params = weights.params(first, El);
  std::vector<float> out((size_t)mine.count * kChannels, -1.0f), dx(out.size(), 0.0f);
  mp_moe_ep_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_ep_forward_cpu(out.data(), mine.x.data(), &params, &shape, &ep, &cache, &err),
            MP_OK)
      << err.message;
  EXPECT_CLOSE(out.data(), serial[me].out.data(), out.size(), "out");

  // Rows: what this rank receives for each local expert is what every rank's tokens chose.
  int sent = 0, received = 0;
  for (int r = 0; r < ep_size; ++r) {
    sent += (int)(cache.send_floats[r] / kChannels);
    received += (int)(cache.recv_floats[r] / kChannels);
    for (int e = 0; e < El; ++e) {
      EXPECT_EQ(cache.plan.recv_rows[r * El + e], serial[r].expert_rows[first + e])
          << label << " from rank " << r << " expert " << first + e;
    }
  }
  int kept_mine = 0;  // dropless: every (token, slot) pair; else what the capacity kept
  for (int e = 0; e < c.experts; ++e) kept_mine += serial[me].expert_rows[e];
  EXPECT_EQ(sent, kept_mine) << label;
  if (c.capacity_factor <= 0.0) {
    EXPECT_EQ(sent, mine.count * c.top_k) << label;  // dropless
  }
  // The local experts' rows in their fixed order: by expert, then source rank, then the source's
  // (token, slot) order; with a capacity, only the source's first `capacity` pairs of the expert.
  std::vector<float> want_in;
  for (int e = 0; e < El; ++e) {
    for (int s = 0; s < ep_size; ++s) {
      const mp_moe_shape shape_s = shape_of(c, tokens[s].count);
      int taken = 0;
      for (size_t i = 0; i < serial[s].selected.size(); ++i) {
        if (serial[s].selected[i] != first + e) continue;
        if (taken++ >= mp_moe_capacity(&shape_s)) continue;
        const float *row = tokens[s].x.data() + i / c.top_k * kChannels;
        want_in.insert(want_in.end(), row, row + kChannels);
      }
    }
  }
  EXPECT_EQ(std::vector<float>(cache.rows.in, cache.rows.in + received * kChannels), want_in)
      << label;
  if (std::getenv("MP_EP_TEST_VERBOSE") != nullptr) {
    std::printf("  %s sends %d rows, receives %d\n", label.c_str(), sent, received);
  }

  // Statistics stay per rank: those of its own tokens.
  std::vector<double> routed(c.experts), prob_sum(c.experts);
  mp_moe_stats stats = {c.experts, 0.0, routed.data(), prob_sum.data(), 0.0};
  mp_moe_stats_clear(&stats);
  mp_moe_stats_add(&stats, &cache.tokens);
  EXPECT_EQ(stats.tokens, serial[me].stats.tokens) << label;
  EXPECT_EQ(routed, serial[me].routed) << label;
  EXPECT_EQ(prob_sum, serial[me].prob_sum) << label;
  EXPECT_EQ(stats.logsumexp_sq, serial[me].stats.logsumexp_sq) << label;

  Grads grads(c, El);
  mp_moe_params g = grads.params();
  ASSERT_EQ(mp_moe_ep_backward_cpu(dx.data(), &g, mine.dout.data(), mine.x.data(), &params, &ep,
                                   &cache, &stats, kAux, kZ, &err),
            MP_OK)
      << err.message;
  EXPECT_CLOSE(dx.data(), serial[me].dx.data(), dx.size(), "dx");
  EXPECT_CLOSE(grads.router.data(), serial[me].grads->router.data(), grads.router.size(),
               "drouter");
  if (c.shared) {
    EXPECT_CLOSE(grads.sfc1.data(), serial[me].grads->sfc1.data(), grads.sfc1.size(),
                 "dshared_fc1");
    EXPECT_CLOSE(grads.sfc2.data(), serial[me].grads->sfc2.data(), grads.sfc2.size(),
                 "dshared_fc2");
    EXPECT_CLOSE(grads.sgate.data(), serial[me].grads->sgate.data(), grads.sgate.size(),
                 "dshared_gate");
  }
  // Local experts: the sum over the group's ranks of the one-device gradients.
  const size_t fc1_each = (size_t)2 * kExpertFfn * kChannels;
  const size_t fc2_each = (size_t)kChannels * kExpertFfn;
  std::vector<float> want_fc1(El * fc1_each), want_fc2(El * fc2_each);
  for (size_t i = 0; i < want_fc1.size(); ++i) {
    double sum = 0.0;
    for (int s = 0; s < ep_size; ++s) sum += serial[s].grads->fc1[first * fc1_each + i];
    want_fc1[i] = (float)sum;
  }
  for (size_t i = 0; i < want_fc2.size(); ++i) {
    double sum = 0.0;
    for (int s = 0; s < ep_size; ++s) sum += serial[s].grads->fc2[first * fc2_each + i];
    want_fc2[i] = (float)sum;
  }
  EXPECT_CLOSE(grads.fc1.data(), want_fc1.data(), want_fc1.size(), "dexpert_fc1 (summed)");
  EXPECT_CLOSE(grads.fc2.data(), want_fc2.data(), want_fc2.size(), "dexpert_fc2 (summed)");
  mp_moe_ep_cache_free(&cache);
}

void check_all_ep_sizes(const Case &c) {
  for (int ep : ep_sizes()) {
    check_case(c, ep);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(EpDispatch, RunsUnderMpirun) {
  ASSERT_GE(world_size(), 2) << "run under mpirun with 2 or 4 ranks (ep_dispatch_test.sh)";
  ASSERT_FALSE(ep_sizes().empty());
}

TEST(EpDispatch, MixtralShapedEqualsOneDevice) {
  for (int E : {4, 8}) {
    for (int K : {1, 2}) check_all_ep_sizes({E, K, false, Craft::kNone, false});
  }
}

TEST(EpDispatch, Qwen2MoeShapedWithSharedExpertEqualsOneDevice) {
  for (int E : {4, 8}) {
    for (int K : {1, 2}) check_all_ep_sizes({E, K, true, Craft::kNone, false});
  }
}

TEST(EpDispatch, ExpertWithNoTokenOnAnyRank) {
  check_all_ep_sizes({8, 2, true, Craft::kEmptyExpert, false});
  check_all_ep_sizes({4, 1, false, Craft::kEmptyExpert, false});
}

TEST(EpDispatch, RouterTiesGoToTheLowestExpert) {
  check_all_ep_sizes({4, 1, false, Craft::kTie, false});
  check_all_ep_sizes({8, 2, true, Craft::kTie, false});
}

TEST(EpDispatch, RankWithNoTokenStillTakesPart) {
  check_all_ep_sizes({4, 2, true, Craft::kNone, true});
}

// A capacity factor: each rank drops among its own tokens before the dispatch, so every rank's
// out, dx and gradients are the one-device layer's over its own micro-batch at the same capacity.
TEST(EpDispatch, CapacityFactorDropsPerSourceRankEqualsOneDevice) {
  check_all_ep_sizes({8, 2, false, Craft::kNone, false, 0.5});
  check_all_ep_sizes({8, 2, true, Craft::kNone, false, 0.5});
  check_all_ep_sizes({4, 1, false, Craft::kNone, true, 0.5});
}

// ep = 1 through the one-rank table is the one-device layer, bit for bit (the same steps over
// the same rows).
TEST(EpDispatch, OneRankTableIsTheOneDeviceLayerBitForBit) {
  const Case c = {8, 2, true, Craft::kNone, false};
  Weights weights(c, 5u);
  const Tokens t = tokens_of(c, 9u, world_rank());
  Serial serial;
  run_serial(c, &weights, t, &serial);
  if (::testing::Test::HasFatalFailure()) return;
  const mp_ep_comm one = mp_ep_comm_single();
  const mp_moe_shape shape = shape_of(c, t.count);
  const mp_moe_params params = weights.params(0, c.experts);
  std::vector<float> out((size_t)t.count * kChannels), dx(out.size(), 0.0f);
  mp_moe_ep_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_moe_ep_forward_cpu(out.data(), t.x.data(), &params, &shape, &one, &cache, &err),
            MP_OK)
      << err.message;
  Grads grads(c, c.experts);
  mp_moe_params g = grads.params();
  ASSERT_EQ(mp_moe_ep_backward_cpu(dx.data(), &g, t.dout.data(), t.x.data(), &params, &one,
                                   &cache, &serial.stats, kAux, kZ, &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(out, serial.out);
  EXPECT_EQ(dx, serial.dx);
  EXPECT_EQ(grads.router, serial.grads->router);
  EXPECT_EQ(grads.fc1, serial.grads->fc1);
  EXPECT_EQ(grads.fc2, serial.grads->fc2);
  EXPECT_EQ(grads.sfc1, serial.grads->sfc1);
  EXPECT_EQ(grads.sgate, serial.grads->sgate);
  mp_moe_ep_cache_free(&cache);
}

TEST(EpDispatch, RefusesExpertsNotAMultipleOfEp) {
  const Case c = {4, 1, false, Craft::kNone, false};
  Weights weights(c, 3u);
  mp_ep_comm three = mp_ep_comm_single();
  three.size = 3;  // checked before any exchange
  const mp_moe_shape shape = shape_of(c, 2);
  const mp_moe_params params = weights.params(0, 1);
  std::vector<float> x(2 * kChannels, 0.5f), out(x.size());
  mp_moe_ep_cache cache;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_moe_ep_forward_cpu(out.data(), x.data(), &params, &shape, &three, &cache, &err),
            MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "moe: 4 experts cannot be split over an expert-parallel group of 3 ranks (rank "
               "0): the experts must be a multiple of ep");
}

// engine/comm/comm.h's all-to-alls over every rank, against closed forms: rank r sends rank q
// (r + 1) * (q + 1) mod 3 floats (some runs are empty) of value 1000 r + 10 q + i.
TEST(EpComm, AllToAllsOverTheWorld) {
  const int n = world_size(), r = world_rank();
  std::vector<int32_t> counts_out(n * 2), counts_in(n * 2);
  for (int q = 0; q < n; ++q) {
    counts_out[q * 2] = 100 * r + q;
    counts_out[q * 2 + 1] = -r;
  }
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_comm_all_to_all_i32(g_all, counts_out.data(), counts_in.data(), 2, &err), MP_OK)
      << err.message;
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(counts_in[q * 2], 100 * q + r);
    EXPECT_EQ(counts_in[q * 2 + 1], -q);
  }
  auto count = [](int from, int to) { return (size_t)(((from + 1) * (to + 1)) % 3); };
  std::vector<size_t> send(n), recv(n);
  std::vector<float> input, want;
  for (int q = 0; q < n; ++q) {
    send[q] = count(r, q);
    recv[q] = count(q, r);
    for (size_t i = 0; i < send[q]; ++i) input.push_back(1000.0f * r + 10.0f * q + i);
    for (size_t i = 0; i < recv[q]; ++i) want.push_back(1000.0f * q + 10.0f * r + i);
  }
  std::vector<float> output(want.size(), -1.0f);
  ASSERT_EQ(mp_comm_all_to_all_v_f32(g_all, input.data(), send.data(), output.data(),
                                     recv.data(), &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(output, want);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "ep_dispatch_test", &g_world, &g_all, nullptr);
}
