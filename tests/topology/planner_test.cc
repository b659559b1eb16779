// tests/topology/planner_test.cc — the layout search: its winner against every layout searched one
// (dp, pp, tp) at a time, the options that fix a choice, and the message of every refusal.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "topology/cluster.h"
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
               "does not divide the attention heads); try a GPU count with more small factors "
               "(a multiple of 4096) or another --global-batch");
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
