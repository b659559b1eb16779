// tests/topology/planner_test.cc — the layout search: its winner against every layout searched one
// (dp, pp, tp) at a time, the options that fix a choice, and the message of every refusal.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "topology/cluster.h"
#include "topology/cost_model.h"
#include "topology/model.h"
#include "topology/planner.h"

namespace {

struct Fixture {
  mp_model *model = nullptr;
  mp_cluster cluster;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_planner_result result;
  Fixture(const char *model_path, const char *cluster_name) {
    std::memset(&result, 0, sizeof result);
    EXPECT_EQ(mp_model_load(model_path, &model, &err), MP_OK) << err.message;
    EXPECT_EQ(mp_cluster_preset(cluster_name, &cluster, &err), MP_OK) << err.message;
  }
  ~Fixture() {
    mp_planner_result_free(&result);
    mp_model_free(model);
  }
  mp_status search(const mp_planner_options &o) {
    mp_planner_result_free(&result);
    return mp_plan_search(&cluster, model, &o, &result, &err);
  }
};

TEST(Planner, TinyGptOnEightRanksIsRankedAndFits) {
  Fixture f("examples/models/tiny-gpt.json", "cpu-local");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  o.global_batch = 16;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  ASSERT_EQ(f.result.num_results, 5);
  EXPECT_GT(f.result.candidates, 100);
  for (int i = 0; i < f.result.num_results; ++i) {
    const mp_estimate &e = f.result.results[i];
    EXPECT_TRUE(e.fits);
    EXPECT_EQ(e.layout.dp * e.layout.pp * e.layout.tp, 8);
    EXPECT_EQ(e.layout.dp * e.layout.micro_batch * e.layout.num_micro_batches, 16);
    if (i > 0) {
      EXPECT_LE(f.result.results[i - 1].step_s, e.step_s);
    }
  }
}

TEST(Planner, PruningKeepsTheTrueWinner) {
  // Searching each (dp, pp, tp) alone visits more layouts fully; none beats the full search.
  Fixture f("examples/models/gpt2-124m.json", "a100-80g");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 16;
  o.global_batch = 64;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  const double best = f.result.results[0].step_s;
  for (int tp = 1; tp <= 8; tp *= 2) {
    for (int pp = 1; tp * pp <= 16; pp *= 2) {
      o.tp = tp;
      o.pp = pp;
      if (f.search(o) != MP_OK) continue;
      EXPECT_GE(f.result.results[0].step_s, best * (1 - 1e-12)) << "tp " << tp << " pp " << pp;
    }
  }
}

TEST(Planner, FixedOptionsAreHonoured) {
  Fixture f("examples/models/tiny-gpt.json", "cpu-local");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  o.global_batch = 16;
  o.pp = 2;
  o.tp = 2;
  o.schedule = MP_SCHEDULE_INTERLEAVED_1F1B;
  o.recompute = MP_RECOMPUTE_FULL;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  for (int i = 0; i < f.result.num_results; ++i) {
    const mp_layout &l = f.result.results[i].layout;
    EXPECT_EQ(l.pp, 2);
    EXPECT_EQ(l.tp, 2);
    EXPECT_EQ(l.dp, 2);
    EXPECT_EQ(l.schedule, MP_SCHEDULE_INTERLEAVED_1F1B);
    EXPECT_GE(l.virtual_stages, 2);
    EXPECT_EQ(l.recompute, MP_RECOMPUTE_FULL);
  }
}

TEST(Planner, RefusesAGpuCountNoLayoutCanUse) {
  Fixture f("examples/models/tiny-gpt.json", "cpu-local");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 11;
  o.global_batch = 8;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message,
               "no layout of model tiny-gpt uses 11 GPUs: dp x pp x tp must equal 11 with tp "
               "within a node (4096 devices) dividing the heads, MLP width and padded "
               "vocabulary, pp at most the 7 layers, and dp dividing the global batch 8 (tp 11 "
               "does not divide the 4 attention heads); try a GPU count with more small factors "
               "(a multiple of 4096) or another --global-batch");
}

// Each tp rank holds whole key/value heads (Megatron-Core's num_query_groups % tp == 0): 8 kv
// heads refuse tp 16 even where 64 query heads would split.
TEST(Planner, RefusesATpThatSplitsKeyValueHeads) {
  Fixture f("examples/models/llama3-70b.json", "cpu-local");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 16;
  o.tp = 16;
  o.global_batch = 16;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message, "--tp 16 does not divide the 8 kv heads of model llama3-70b");
}

TEST(Planner, RefusesAModelThatFitsNowhere) {
  Fixture f("examples/models/gpt3-175b.json", "a100-80g");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_NE(std::string(f.err.message)
                .find("model gpt3-175b fits on no layout of 8 GPUs of a100-80g: the smallest "
                      "need is "),
            std::string::npos)
      << f.err.message;
  EXPECT_NE(std::string(f.err.message).find("GiB over the 80.00 GiB a device holds; use more "
                                            "GPUs"),
            std::string::npos)
      << f.err.message;
}

// Context parallelism (--cp): a fixed cp needs the sequence cut into 2 cp chunks, and the fixed
// sizes must multiply to the GPUs with it.
TEST(Planner, RefusesAContextParallelSizeTheSequenceOrTheGpusCannotTake) {
  Fixture f("examples/models/tiny-gpt.json", "cpu-local");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 6;
  o.global_batch = 6;
  o.cp = 3;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message,
               "--cp 3 needs the sequence length to be a multiple of 2 x cp = 6 (each cp rank "
               "holds 2 of 2 cp equal chunks of every sequence), but it is 64; choose a --cp "
               "whose 2 cp divides 64, or another --seq-len");
  o.seq_len = 96;  // 6 chunks of 16 tokens: a fixed cp may go below the searched chunks
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_EQ(f.result.results[0].layout.cp, 3);
  EXPECT_EQ(f.result.results[0].layout.dp * f.result.results[0].layout.pp *
                f.result.results[0].layout.tp,
            2);
  o.gpus = 8;
  o.global_batch = 8;
  o.seq_len = 0;
  o.cp = 2;
  o.dp = 2;
  o.pp = 2;
  o.tp = 4;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message,
               "--dp 2 x --cp 2 x --pp 2 x --tp 4 = 32, but --gpus is 8; fix one of them so that "
               "dp x cp x pp x tp = 8");
  o.cp = 0;  // cp is what dp x pp x tp leave, 2: tiny-gpt's 64 tokens are too few to search it
  o.tp = 1;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message,
               "--dp 2 x --pp 2 x --tp 1 = 4, but --gpus is 8; fix one of them so that dp x pp x "
               "tp = 8, or fix --cp 2 if sequences of 64 tokens take it");
  o.cp = 2;  // fixed, it is planned
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_EQ(f.result.results[0].layout.cp, 2);
}

// Llama 3 8B at long sequences on 64 H100s: context parallelism is what makes a one-stage layout
// fit at 131072 tokens with selective recomputation (without it, even tp 8 with sequence
// parallelism holds more than 80 GiB of activations), and it wins the free search at 65536; at
// 2048 tokens, where cp 2 is searched too, the planner keeps cp 1: cp 2 with twice the
// micro-batch computes the same tokens per rank, plus the gathers.
TEST(Planner, PicksContextParallelismForLongSequencesOnly) {
  Fixture f("examples/models/llama3-8b.json", "h100-sxm");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 64;
  o.global_batch = 64;
  o.seq_len = 131072;
  o.pp = 1;
  o.recompute = MP_RECOMPUTE_SELECTIVE;
  o.cp = 1;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_NE(std::string(f.err.message).find("model llama3-8b fits on no layout of 64 GPUs"),
            std::string::npos)
      << f.err.message;
  o.cp = 0;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  for (int i = 0; i < f.result.num_results; ++i) {
    const mp_layout &l = f.result.results[i].layout;
    EXPECT_GT(l.cp, 1) << i;
    EXPECT_EQ(l.dp * l.cp * l.pp * l.tp, 64);
    EXPECT_TRUE(f.result.results[i].fits);
  }
  o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 64;
  o.global_batch = 64;
  o.seq_len = 65536;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_GT(f.result.results[0].layout.cp, 1);
  const double with_cp = f.result.results[0].step_s;
  o.cp = 1;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_LT(with_cp, f.result.results[0].step_s);
  o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 64;
  o.global_batch = 512;
  o.seq_len = 2048;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_EQ(mp_layout_cp(&f.result.results[0].layout), 1);
  o.cp = 2;  // searched at 2048 (2 chunks of 512 each), and slower
  const double without_cp = f.result.results[0].step_s;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_GT(f.result.results[0].step_s, without_cp);
}

// On GPUs a free search tries ZeRO 0, 1 and 2 (the runtime overlaps ZeRO-2's reduce-scatters
// with the backward, as the model assumes) and plans 3 only when fixed (each pass's first block
// waits for its gather, which the model does not see): --zero 2 holds less state per rank than
// --zero 1, and --zero 3 gathers.
TEST(Planner, PlansZeroThreeOnGpusOnlyWhenAsked) {
  Fixture f("examples/models/gpt2-350m.json", "a100-80g");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  o.global_batch = 64;
  o.dp = 8;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  bool searched_two = false;
  for (int i = 0; i < f.result.num_results; ++i) {
    EXPECT_LE(f.result.results[i].layout.zero_stage, 2) << "result " << i;
    searched_two |= f.result.results[i].layout.zero_stage == 2;
  }
  EXPECT_TRUE(searched_two) << "no ZeRO-2 layout among the free search's best";
  o.zero_stage = 1;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  ASSERT_GT(f.result.num_results, 0);
  const double one_state = f.result.results[0].ranks[0].optimizer_bytes +
                           f.result.results[0].ranks[0].grads_bytes;
  o.zero_stage = 2;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  ASSERT_GT(f.result.num_results, 0);
  EXPECT_EQ(f.result.results[0].layout.zero_stage, 2);
  EXPECT_LT(f.result.results[0].ranks[0].optimizer_bytes + f.result.results[0].ranks[0].grads_bytes,
            one_state);
  o.zero_stage = 3;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  ASSERT_GT(f.result.num_results, 0);
  EXPECT_EQ(f.result.results[0].layout.zero_stage, 3);
  EXPECT_GT(f.result.results[0].ranks[0].zero_gather_bytes, 0.0);
}

// llama3-8b over 8 pipeline stages, one layout: dp 1, tp 1, one sequence of 4096 tokens per
// micro-batch, 16 of them, 1F1B, no recomputation, no ZeRO.
mp_planner_options LlamaOverEightStages() {
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  o.global_batch = 16;
  o.seq_len = 4096;
  o.dp = 1, o.pp = 8, o.tp = 1, o.micro_batch = 1, o.virtual_stages = 1, o.zero_stage = 0;
  o.schedule = MP_SCHEDULE_1F1B;
  o.recompute = MP_RECOMPUTE_NONE;
  return o;
}

// --split memory (llama3-8b over 8 pipeline stages, its 128256-word embedding on the first and
// its untied head on the last): the fullest rank holds less than with the time split, for a
// slower step, and the first and last stages get fewer blocks.
TEST(Planner, MemorySplitHoldsLessOnTheFullestRank) {
  Fixture f("examples/models/llama3-8b.json", "a100-80g");
  mp_planner_options o = LlamaOverEightStages();
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  const mp_estimate by_time = f.result.results[0];
  o.split = MP_SPLIT_MEMORY;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  const mp_estimate &by_memory = f.result.results[0];
  EXPECT_LT(by_memory.memory_bytes, 0.8 * by_time.memory_bytes);
  EXPECT_GT(by_memory.step_s, by_time.step_s);
  EXPECT_LT(by_memory.layers_per_stage[0], by_time.layers_per_stage[0]);
  EXPECT_GT(by_memory.layers_per_stage[6], by_memory.layers_per_stage[0]);
}

// When nothing fits cut by time, the search runs again with the memory split for the layouts
// whose time split cannot fit: on 40 GiB devices the layout above needs 44 GiB on its first
// rank cut by time and fits cut by memory, so the search (by time) still finds it, with the
// memory split's stages, pruned or exhaustive.
TEST(Planner, ATimeSplitThatCannotFitFallsBackToTheMemorySplit) {
  Fixture f("examples/models/llama3-8b.json", "a100-80g");
  f.cluster.device_memory_bytes = 40LL << 30;
  mp_planner_options o = LlamaOverEightStages();
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  ASSERT_EQ(f.result.num_results, 1);
  const mp_estimate fallback = f.result.results[0];
  EXPECT_TRUE(fallback.fits);
  EXPECT_LE(fallback.memory_bytes, 40.0 * (1 << 30));
  o.split = MP_SPLIT_MEMORY;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  for (int st = 0; st < 8; ++st) {
    EXPECT_EQ(fallback.layers_per_stage[st], f.result.results[0].layers_per_stage[st]) << st;
  }
  // The exhaustive search cuts it the same way.
  o.split = MP_SPLIT_TIME;
  o.exhaustive = true;
  ASSERT_EQ(f.search(o), MP_OK) << f.err.message;
  EXPECT_EQ(f.result.results[0].memory_bytes, fallback.memory_bytes);
}

TEST(Planner, RefusesContradictoryFixedOptions) {
  Fixture f("examples/models/tiny-gpt.json", "cpu-local");
  struct Case {
    int dp, pp, tp, v, schedule, sp, zero;
    int64_t mb;
    const char *message;
  } cases[] = {
      {2, 2, 4, 0, -1, -1, -1, 0,
       "--dp 2 x --pp 2 x --tp 4 = 16, but --gpus is 8; fix one of them so that dp x pp x tp "
       "= 8"},
      {0, 0, 3, 0, -1, -1, -1, 0, "the fixed sizes (dp x pp x tp = 3) do not divide --gpus 8"},
      {0, 0, 0, 2, MP_SCHEDULE_1F1B, -1, -1, 0,
       "--virtual-stages 2 needs --schedule interleaved-1f1b, not 1f1b"},
      {0, 0, 0, 1, MP_SCHEDULE_INTERLEAVED_1F1B, -1, -1, 0,
       "--schedule interleaved-1f1b needs --virtual-stages 2 or more, not 1"},
      {0, 0, 1, 0, -1, 1, -1, 0, "--sequence-parallel needs tensor parallelism, but --tp is 1"},
      {1, 0, 0, 0, -1, -1, 1, 0,
       "--zero 1 shards optimizer state across data-parallel ranks, but --dp is 1"},
      {1, 0, 0, 0, -1, -1, 3, 0,
       "--zero 3 shards optimizer state, gradients and parameters across data-parallel ranks, "
       "but --dp is 1"},
      {2, 0, 0, 0, MP_SCHEDULE_ZB_H1, -1, 3, 0,
       "--zero 3 gathers each layer's parameters around its whole backward, but --schedule "
       "zb-h1 splits the backward and defers the weight gradients; choose one"},
      {4, 0, 0, 0, -1, -1, -1, 3,
       "--micro-batch 3 does not divide global batch / dp = 16 / 4 = 4"},
  };
  for (const Case &c : cases) {
    mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
    o.gpus = 8;
    o.global_batch = 16;
    o.dp = c.dp;
    o.pp = c.pp;
    o.tp = c.tp;
    o.virtual_stages = c.v;
    o.schedule = c.schedule;
    o.sequence_parallel = c.sp;
    o.zero_stage = c.zero;
    o.micro_batch = c.mb;
    EXPECT_EQ(f.search(o), MP_ERR_INPUT) << c.message;
    EXPECT_STREQ(f.err.message, c.message);
  }
  // 4 pipeline ranks x 2 chunks need 8 stages; tiny-gpt has 7 layers.
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 8;
  o.global_batch = 16;
  o.pp = 4;
  o.virtual_stages = 2;
  EXPECT_EQ(f.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(f.err.message,
               "the fixed options leave no layout of model tiny-gpt on 8 GPUs (global batch 16): "
               "check --micro-batch, --schedule and --virtual-stages (interleaving needs pp >= 2 "
               "and micro-batches a multiple of pp; pp x virtual stages must be at most the 7 "
               "layers)");
}

bool SameLayout(const mp_layout &a, const mp_layout &b) {
  return a.dp == b.dp && a.cp == b.cp && a.pp == b.pp && a.tp == b.tp &&
         a.virtual_stages == b.virtual_stages &&
         a.micro_batch == b.micro_batch && a.num_micro_batches == b.num_micro_batches &&
         a.seq_len == b.seq_len && a.schedule == b.schedule && a.recompute == b.recompute &&
         a.sequence_parallel == b.sequence_parallel && a.zero_stage == b.zero_stage &&
         mp_layout_ep(&a) == mp_layout_ep(&b);
}

// The pruned search's top K against the exhaustive one's (options.exhaustive: every layout
// simulated, no bound consulted): the same layouts, splits and step times, to the bit, in the
// same order. Bounds that were not lower bounds would drop a layout that belongs in the list, and
// a wrong tie-break would reorder equal step times; either fails here.
void ExpectSameRanking(const char *model, const char *cluster, const mp_planner_options &base,
                       long *pruned, long *pruned_by_memory) {
  std::string what = std::string(model) + " on " + std::to_string(base.gpus) + " " + cluster +
                     ", global batch " + std::to_string(base.global_batch) + ", top " +
                     std::to_string(base.top_k ? base.top_k : 5);
  SCOPED_TRACE(what);
  Fixture pruned_search((std::string("examples/models/") + model + ".json").c_str(), cluster);
  Fixture full_search((std::string("examples/models/") + model + ".json").c_str(), cluster);
  mp_planner_options o = base;
  o.exhaustive = false;
  const mp_status pruned_status = pruned_search.search(o);
  o.exhaustive = true;
  const mp_status full_status = full_search.search(o);
  // Two searches that both failed would agree on nothing worth checking: every case here must
  // have layouts to rank.
  ASSERT_EQ(full_status, MP_OK) << "the exhaustive search failed: " << full_search.err.message;
  ASSERT_EQ(pruned_status, MP_OK) << "the pruned search failed: " << pruned_search.err.message;
  const mp_planner_result &a = pruned_search.result, &b = full_search.result;
  EXPECT_EQ(a.candidates, b.candidates);
  EXPECT_EQ(b.simulated, b.candidates);
  EXPECT_EQ(b.pruned, 0);
  EXPECT_EQ(a.simulated + a.pruned, a.candidates);
  ASSERT_EQ(a.num_results, b.num_results);
  for (int i = 0; i < a.num_results; ++i) {
    const mp_estimate &x = a.results[i], &y = b.results[i];
    char text[200];
    SCOPED_TRACE("rank " + std::to_string(i + 1) + ": " +
                 mp_layout_describe(&y.layout, text, sizeof text));
    EXPECT_TRUE(SameLayout(x.layout, y.layout)) << mp_layout_describe(&x.layout, text,
                                                                       sizeof text);
    EXPECT_EQ(x.step_s, y.step_s);
    EXPECT_EQ(x.memory_bytes, y.memory_bytes);
    ASSERT_EQ(x.num_stages, y.num_stages);
    for (int s = 0; s < x.num_stages; ++s) {
      EXPECT_EQ(x.layers_per_stage[s], y.layers_per_stage[s]) << "stage " << s;
    }
  }
  *pruned += a.pruned;
  *pruned_by_memory += a.pruned_by_memory;
}

TEST(Planner, PrunedSearchRanksAsTheExhaustiveOne) {
  long pruned = 0, pruned_by_memory = 0;
  struct Case {
    const char *model;
    int gpus;
    int64_t global_batch;
  } cases[] = {
      {"tiny-gpt", 8, 16},    {"tiny-gpt", 16, 64},    {"gpt2-124m", 8, 32},
      {"gpt2-124m", 16, 64},  {"gpt2-124m", 32, 96},   {"gpt2-350m", 8, 64},
      {"gpt2-350m", 16, 16},  {"gpt2-350m", 32, 128},  {"gpt2-350m", 64, 256},
  };
  // cpu-local's 2 GiB make memory rule out many layouts of the GPT-2 models; the GPUs' 80 and
  // 141 GiB leave time alone to prune.
  for (const char *cluster : {"cpu-local", "a100-80g", "h100-sxm", "h200-sxm"}) {
    for (const Case &c : cases) {
      mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
      o.gpus = c.gpus;
      o.global_batch = c.global_batch;
      o.top_k = c.gpus == 16 ? 10 : 5;
      ExpectSameRanking(c.model, cluster, o, &pruned, &pruned_by_memory);
    }
  }
  // The bounds do prune, by time and by memory: the comparison is not between two full searches.
  EXPECT_GT(pruned, 0);
  EXPECT_GT(pruned_by_memory, 0);
}

TEST(Planner, PrunedSearchRanksAsTheExhaustiveOneWithFixedOptions) {
  long pruned = 0, pruned_by_memory = 0;
  for (const char *cluster : {"cpu-local", "a100-80g"}) {
    for (const char *model : {"gpt2-124m", "gpt2-350m"}) {
      for (int fixed = 0; fixed < 13; ++fixed) {
        mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
        o.gpus = 16;
        o.global_batch = 64;
        switch (fixed) {
          case 0: o.pp = 4; break;
          case 1: o.pp = 2; o.schedule = MP_SCHEDULE_INTERLEAVED_1F1B; break;
          case 2: o.schedule = MP_SCHEDULE_ZB_H1; break;
          case 3: o.schedule = MP_SCHEDULE_GPIPE; break;
          case 4: o.recompute = MP_RECOMPUTE_FULL; break;
          case 5: o.sequence_parallel = 1; o.tp = 4; break;
          case 6: o.zero_stage = 0; o.micro_batch = 2; break;
          case 7: o.tp = 2; o.top_k = 1; break;
          case 8: o.seq_len = 2048; o.top_k = 20; break;
          case 9: o.dp = 2; o.virtual_stages = 2; break;
          case 10: o.split = MP_SPLIT_MEMORY; o.pp = 4; break;
          case 11: o.seq_len = 4096; o.top_k = 20; break;  // cp 2 and 4 searched too
          case 12: o.seq_len = 4096; o.cp = 2; break;
        }
        ExpectSameRanking(model, cluster, o, &pruned, &pruned_by_memory);
      }
    }
  }
  EXPECT_GT(pruned, 0);
  EXPECT_GT(pruned_by_memory, 0);
}

// Mixture-of-experts models, ep searched (every divisor of dp x cp that divides the experts) or
// fixed: Qwen1.5-MoE's 60 experts (ep 1, 2, 4) and Mixtral's 8, on GPUs roomy and tight (Mixtral
// on 16 H100s fits in 73 of their 80 GiB at best), so both bounds prune.
TEST(Planner, PrunedSearchRanksAsTheExhaustiveOneForMixturesOfExperts) {
  long pruned = 0, pruned_by_memory = 0;
  struct Case {
    const char *model, *cluster;
    int gpus;
    int64_t global_batch, seq_len;
    int ep;
  } cases[] = {
      {"qwen1.5-moe-a2.7b", "h100-sxm", 16, 64, 2048, 0},
      {"mixtral-8x7b", "h200-sxm", 32, 64, 2048, 0},
      {"mixtral-8x7b", "h100-sxm", 16, 32, 1024, 0},
      {"mixtral-8x7b", "a100-80g", 16, 32, 2048, 4},
  };
  for (const Case &c : cases) {
    mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
    o.gpus = c.gpus;
    o.global_batch = c.global_batch;
    o.seq_len = c.seq_len;
    o.ep = c.ep;
    ExpectSameRanking(c.model, c.cluster, o, &pruned, &pruned_by_memory);
  }
  EXPECT_GT(pruned, 0);
  EXPECT_GT(pruned_by_memory, 0);
}

// Expert parallelism in the search: a dense model is planned at ep 1 only and refuses --ep 2;
// --ep fixes it on an MoE model (Mixtral 8x7B on 64 H100s, Megatron-Core's layout), whose free
// search tries ep above 1 and ranks such a layout first; an --ep that cannot split the experts or
// the fixed dp x cp is refused with its numbers.
TEST(Planner, PlansExpertParallelismForMixturesOfExpertsOnly) {
  Fixture dense("examples/models/llama3-8b.json", "h100-sxm");
  mp_planner_options o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 16;
  o.global_batch = 32;
  o.seq_len = 2048;
  ASSERT_EQ(dense.search(o), MP_OK) << dense.err.message;
  for (int i = 0; i < dense.result.num_results; ++i) {
    EXPECT_EQ(mp_layout_ep(&dense.result.results[i].layout), 1);
  }
  o.ep = 2;
  EXPECT_EQ(dense.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(dense.err.message,
               "--ep: ep 2 splits the experts of mixture-of-experts blocks over ranks, but model "
               "llama3-8b (examples/models/llama3-8b.json) has no such block; use ep 1");

  Fixture mixtral("examples/models/mixtral-8x7b.json", "h100-sxm");
  o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 64;
  o.global_batch = 256;
  o.seq_len = 4096;
  ASSERT_EQ(mixtral.search(o), MP_OK) << mixtral.err.message;
  const mp_layout &best = mixtral.result.results[0].layout;
  EXPECT_GT(mp_layout_ep(&best), 1);
  EXPECT_EQ(8 % mp_layout_ep(&best), 0);
  EXPECT_EQ(mp_layout_replicas(&best) % mp_layout_ep(&best), 0);
  o.ep = 8;
  o.tp = 1;
  o.pp = 4;
  o.virtual_stages = 8;
  o.micro_batch = 1;
  ASSERT_EQ(mixtral.search(o), MP_OK) << mixtral.err.message;
  for (int i = 0; i < mixtral.result.num_results; ++i) {
    const mp_estimate &e = mixtral.result.results[i];
    EXPECT_EQ(e.layout.ep, 8);
    EXPECT_EQ(e.layout.pp, 4);
    EXPECT_GT(e.ep_layer_forward_s, 0.0);
    EXPECT_FALSE(e.ep_inter_node);  // tp 1 x ep 8: one node of 8
    char text[200];
    EXPECT_NE(std::strstr(mp_layout_describe(&e.layout, text, sizeof text), " ep 8 pp 4 "),
              nullptr)
        << text;
  }
  o = MP_PLANNER_OPTIONS_INITIALIZER;
  o.gpus = 64;
  o.global_batch = 256;
  o.ep = 3;
  EXPECT_EQ(mixtral.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(mixtral.err.message,
               "--ep: ep 3 does not divide the 8 experts of block.0 "
               "(examples/models/mixtral-8x7b.json: $.layers[1].moe.experts); each "
               "expert-parallel rank holds experts / ep whole experts");
  o.ep = 4;
  o.dp = 2;
  o.cp = 1;
  EXPECT_EQ(mixtral.search(o), MP_ERR_INPUT);
  EXPECT_STREQ(mixtral.err.message,
               "--ep 4 does not divide dp x cp = 2 x 1 = 2 (the expert-parallel groups are cut "
               "out of the dp x cp ranks); choose an --ep that divides it");
}

// The bounds the search prunes with, against mp_cost_estimate on every layout of small searches:
// never above it (the rounding slack the search allows is far wider than the 1e-12 here), and
// equal to it where the estimate has nothing the bound leaves out (one stage, one data-parallel
// rank, no pipeline to fill, no gradient to reduce), so a bound weakened to nothing fails too.
TEST(Planner, BoundsNeverExceedTheEstimate) {
  long layouts = 0, exact = 0;
  struct Case {
    const char *model, *cluster;
    int gpus;
    int64_t global_batch;
    int max_ep;  // expert parallelism tried: 1, 2, 4 ... up to this (MoE models)
  } cases[] = {
      {"tiny-gpt", "cpu-local", 8, 16, 1},   {"gpt2-124m", "a100-80g", 16, 64, 1},
      {"gpt2-350m", "cpu-local", 8, 32, 1},  {"gpt2-350m", "h100-sxm", 32, 64, 1},
      {"qwen1.5-moe-a2.7b", "h100-sxm", 8, 16, 4},
  };
  auto estimate = std::make_unique<mp_estimate>();
  for (const Case &c : cases) {
    Fixture f((std::string("examples/models/") + c.model + ".json").c_str(), c.cluster);
    const int n = mp_model_num_layers(f.model);
    for (int tp = 1; tp <= 8 && tp <= c.gpus; tp *= 2) {
      for (int pp = 1; pp * tp <= c.gpus; pp *= 2) {
       for (int cp = 1; cp <= 2 && cp * pp * tp <= c.gpus; cp *= 2) {
        const int dp = c.gpus / tp / pp / cp;
        if (c.global_batch % dp != 0 || pp > n) continue;
        const int64_t per_dp = c.global_batch / dp;
        for (int64_t mb = 1; mb <= per_dp; mb *= 2) {
          if (per_dp % mb != 0) continue;
          for (int kind = 0; kind < MP_SCHEDULE_CUSTOM; ++kind) {
            for (int v = 1; v <= (kind == MP_SCHEDULE_INTERLEAVED_1F1B ? 4 : 1); ++v) {
              for (int rc = 0; rc < MP_RECOMPUTE_COUNT; ++rc) {
                for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                  for (int zero = 0; zero <= (dp * cp > 1 ? 1 : 0); ++zero) {
                   for (int ep = 1; ep <= c.max_ep && ep <= dp * cp; ep *= 2) {
                    if ((dp * cp) % ep != 0) continue;
                    mp_layout l = {dp, pp, tp, v, mb, per_dp / mb, mp_model_seq_len(f.model),
                                   (mp_schedule_kind)kind, (mp_recompute)rc, sp == 1, zero, 0,
                                   cp, ep};
                    if (mp_cost_estimate(&f.cluster, f.model, &l, nullptr, estimate.get(),
                                         &f.err) != MP_OK) {
                      continue;  // a schedule that cannot run these numbers
                    }
                    mp_planner_bounds bounds;
                    ASSERT_EQ(mp_planner_layout_bounds(&f.cluster, f.model, &l, nullptr, &bounds,
                                                       &f.err),
                              MP_OK)
                        << f.err.message;
                    char text[200];
                    SCOPED_TRACE(std::string(c.model) + " on " + c.cluster + ": " +
                                 mp_layout_describe(&l, text, sizeof text));
                    const double step = estimate->step_s, memory = estimate->memory_bytes;
                    EXPECT_LE(bounds.quick_step_s, bounds.step_s * (1 + 1e-12));
                    EXPECT_LE(bounds.step_s, step * (1 + 1e-12));
                    EXPECT_LE(bounds.quick_memory_bytes, bounds.memory_bytes * (1 + 1e-12));
                    EXPECT_LE(bounds.memory_bytes, memory * (1 + 1e-12));
                    EXPECT_GT(bounds.quick_step_s, 0.0);
                    EXPECT_GT(bounds.quick_memory_bytes, 0.0);
                    if (pp == 1 && dp * cp == 1) {
                      EXPECT_NEAR(bounds.step_s, step, 1e-12 * step);
                      EXPECT_NEAR(bounds.memory_bytes, memory, 1e-12 * memory);
                      ++exact;
                    }
                    ++layouts;
                   }
                  }
                }
              }
            }
          }
        }
       }
      }
    }
  }
  EXPECT_GT(layouts, 1000);
  EXPECT_GT(exact, 10);
}

}  // namespace

#include <cstdio>
#include <fstream>
#include <sstream>

#include "topology/plan.h"

namespace {

TEST(PlanWriter, WritesWhatThePlanReaderReadsBack) {
  mp_plan plan;
  std::memset(&plan, 0, sizeof plan);
  std::snprintf(plan.model_path, sizeof plan.model_path, "/models/m.json");
  std::snprintf(plan.cluster, sizeof plan.cluster, "a100-80g");
  plan.dp = 2;
  plan.pp = 2;
  plan.tp = 2;
  plan.virtual_stages = 2;
  plan.sequence_parallel = true;
  plan.zero_stage = 1;
  plan.global_batch = 16;
  plan.micro_batch = 2;
  plan.num_micro_batches = 4;
  plan.seq_len = 64;
  std::snprintf(plan.schedule, sizeof plan.schedule, "interleaved-1f1b");
  plan.recompute = MP_RECOMPUTE_SELECTIVE;
  plan.num_stage_counts = 4;
  const int counts[4] = {2, 1, 1, 3};
  for (int i = 0; i < 4; ++i) plan.layers_per_stage[i] = counts[i];
  plan.training = mp_training_config_default();
  auto predicted = std::make_unique<mp_plan_prediction>();
  predicted->step_s = 1.5;
  predicted->num_ranks = 2;
  predicted->memory_bytes_per_rank[0] = 1e9;
  predicted->memory_bytes_per_rank[1] = 2e9;
  const char *dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/written-plan.json";
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_plan_write(&plan, predicted.get(), path.c_str(), &err), MP_OK) << err.message;
  mp_plan back;
  ASSERT_EQ(mp_plan_load(path.c_str(), &back, &err), MP_OK) << err.message;
  EXPECT_STREQ(back.model_path, "/models/m.json");
  EXPECT_STREQ(back.cluster, "a100-80g");
  EXPECT_EQ(back.dp, 2);
  EXPECT_EQ(back.virtual_stages, 2);
  EXPECT_TRUE(back.sequence_parallel);
  EXPECT_EQ(back.zero_stage, 1);
  EXPECT_EQ(back.num_micro_batches, 4);
  EXPECT_STREQ(back.schedule, "interleaved-1f1b");
  EXPECT_EQ(back.recompute, MP_RECOMPUTE_SELECTIVE);
  ASSERT_EQ(back.num_stage_counts, 4);
  EXPECT_EQ(back.layers_per_stage[3], 3);
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("\"step_time_s\":\t1.5"), std::string::npos) << text.str();
  // A directory that does not exist is the user's path to fix: an input error (exit 2).
  EXPECT_EQ(mp_plan_write(&plan, nullptr, "/nonexistent-dir/p.json", &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "/nonexistent-dir/p.json: cannot create: No such file or directory");
}

}  // namespace
