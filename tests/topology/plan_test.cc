// tests/topology/plan_test.cc — parallelism configs: what run and schedule read, the learning-rate
// schedule they drive, the JSON object that the plan file and a checkpoint manifest both hold
// (written and read back), and the message for each mistake in a hand-written plan.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "topology/plan.h"

namespace {

std::string plan_text(const std::string &parallel, const std::string &batch,
                      const std::string &extra = "") {
  return "{\"format\": \"mpengine-plan\", \"version\": 1, \"model\": \"../models/m.json\", " +
         extra + "\"parallel\": " + parallel + ", \"batch\": " + batch + "}";
}

const char *kParallel = "{\"dp\": 2, \"pp\": 2, \"tp\": 1}";
const char *kBatch =
    "{\"global_batch\": 16, \"micro_batch\": 2, \"num_micro_batches\": 4, \"seq_len\": 64}";

TEST(Plan, ParsesAndResolvesPathsAgainstThePlanDirectory) {
  mp_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  std::string text = plan_text(kParallel, kBatch, "\"cluster\": \"../clusters/c.json\", ");
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "plans/p.json", "plans", &plan, &err), MP_OK)
      << err.message;
  EXPECT_STREQ(plan.model_path, "plans/../models/m.json");
  EXPECT_STREQ(plan.cluster, "plans/../clusters/c.json");
  EXPECT_EQ(plan.dp, 2);
  EXPECT_EQ(plan.pp, 2);
  EXPECT_EQ(plan.virtual_stages, 1);
  EXPECT_EQ(plan.num_micro_batches, 4);
  EXPECT_STREQ(plan.schedule, "1f1b");
  EXPECT_EQ(plan.recompute, MP_RECOMPUTE_NONE);
  EXPECT_EQ(plan.training.steps, 100);
  EXPECT_DOUBLE_EQ(plan.training.learning_rate, 6e-4);
}

TEST(Plan, PresetClusterNamesStayNames) {
  mp_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  std::string text = plan_text(kParallel, kBatch, "\"cluster\": \"h100-sxm\", ");
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "p.json", "plans", &plan, &err), MP_OK);
  EXPECT_STREQ(plan.cluster, "h100-sxm");
}

TEST(Plan, LearningRateWarmsUpThenDecaysByCosine) {
  mp_training_config t = mp_training_config_default();
  t.steps = 11;
  t.warmup_steps = 2;
  t.learning_rate = 1.0;
  t.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(mp_training_learning_rate(&t, 0), 0.5);
  EXPECT_DOUBLE_EQ(mp_training_learning_rate(&t, 1), 1.0);
  EXPECT_DOUBLE_EQ(mp_training_learning_rate(&t, 2), 1.0);  // decay starts at the peak
  EXPECT_NEAR(mp_training_learning_rate(&t, 6), 0.55, 1e-12);  // halfway: mean of peak and min
  EXPECT_NEAR(mp_training_learning_rate(&t, 10), 0.1, 1e-12);  // last step: the minimum
}

// mp_plan_to_json is the one writer (the plan file, a checkpoint's manifest) and
// mp_plan_parse_json reads it back: every field, the seed a number, zero_shard_size only when it
// is below dp, "predicted" only when given.
TEST(Plan, ItsJsonObjectReadsBackAsThePlan) {
  mp_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  std::string text = plan_text(
      "{\"dp\": 4, \"pp\": 2, \"tp\": 2, \"virtual_stages\": 2, \"sequence_parallel\": true, "
      "\"zero_stage\": 2, \"zero_shard_size\": 2}",
      "{\"global_batch\": 32, \"micro_batch\": 2, \"num_micro_batches\": 4, \"seq_len\": 64}",
      "\"cluster\": \"h100-sxm\", \"schedule\": \"interleaved-1f1b\", \"recompute\": "
      "\"selective\", \"layers_per_stage\": [1, 2, 3, 4], \"training\": {\"steps\": 7, "
      "\"seed\": 9007199254740992, \"learning_rate\": 1e-3, \"warmup_steps\": 2, "
      "\"min_lr_ratio\": 0.5, \"weight_decay\": 0.01, \"beta1\": 0.8, \"beta2\": 0.99, "
      "\"eps\": 1e-6, \"grad_clip\": 0}, ");
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "plans/p.json", "plans", &plan, &err), MP_OK)
      << err.message;
  cJSON *object = mp_plan_to_json(&plan, nullptr);
  ASSERT_NE(object, nullptr);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(object, "predicted"), nullptr);
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(object, "training"), "seed");
  ASSERT_TRUE(cJSON_IsNumber(seed));
  EXPECT_EQ(seed->valuedouble, 9007199254740992.0);
  mp_plan back;
  ASSERT_EQ(mp_plan_parse_json(object, "manifest.json $.plan", nullptr, &back, &err), MP_OK)
      << err.message;
  cJSON_Delete(object);
  EXPECT_STREQ(back.source, "manifest.json $.plan");
  memset(back.source, 0, sizeof back.source);
  memcpy(back.source, plan.source, strlen(plan.source));
  EXPECT_STREQ(back.model_path, "plans/../models/m.json");  // as written, not resolved again
  EXPECT_EQ(back.zero_shard_size, 2);
  EXPECT_EQ(back.training.seed, 9007199254740992ull);
  EXPECT_EQ(memcmp(&back, &plan, sizeof plan), 0);  // both zeroed first, so padding matches too

  // ZeRO over all of dp: no zero_shard_size written, dp read back.
  text = plan_text("{\"dp\": 2, \"pp\": 1, \"tp\": 1, \"zero_stage\": 1}", kBatch);
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "p.json", ".", &plan, &err), MP_OK) << err.message;
  mp_plan_prediction predicted = {};
  predicted.num_ranks = 1;
  object = mp_plan_to_json(&plan, &predicted);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(object, "parallel"),
                                             "zero_shard_size"),
            nullptr);
  EXPECT_NE(cJSON_GetObjectItemCaseSensitive(object, "predicted"), nullptr);
  ASSERT_EQ(mp_plan_parse_json(object, "p.json", nullptr, &back, &err), MP_OK) << err.message;
  cJSON_Delete(object);
  EXPECT_EQ(back.zero_shard_size, 2);
  EXPECT_EQ(mp_plan_zero_shard(&back), 2);
  EXPECT_EQ(back.cp, 1);

  // Context parallelism: "cp" written only above 1; ZeRO shards over dp x cp.
  text = plan_text("{\"dp\": 2, \"cp\": 4, \"pp\": 1, \"tp\": 1, \"zero_stage\": 1}", kBatch);
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "p.json", ".", &plan, &err), MP_OK) << err.message;
  EXPECT_EQ(plan.cp, 4);
  EXPECT_EQ(mp_plan_replicas(&plan), 8);
  EXPECT_EQ(mp_plan_zero_shard(&plan), 8);
  object = mp_plan_to_json(&plan, nullptr);
  const cJSON *cp = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(object, "parallel"), "cp");
  ASSERT_TRUE(cJSON_IsNumber(cp));
  EXPECT_EQ(cp->valueint, 4);
  ASSERT_EQ(mp_plan_parse_json(object, "p.json", nullptr, &back, &err), MP_OK) << err.message;
  cJSON_Delete(object);
  EXPECT_EQ(back.cp, 4);
  EXPECT_EQ(mp_plan_ep(&back), 1);

  // Expert parallelism: "ep" folded over dp x cp, written only above 1; absent, ep 1.
  EXPECT_EQ(plan.ep, 1);
  object = mp_plan_to_json(&plan, nullptr);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(object, "parallel"),
                                             "ep"),
            nullptr);
  cJSON_Delete(object);
  text = plan_text("{\"dp\": 2, \"cp\": 4, \"ep\": 8, \"pp\": 1, \"tp\": 1}", kBatch);
  ASSERT_EQ(mp_plan_parse_text(text.c_str(), "p.json", ".", &plan, &err), MP_OK) << err.message;
  EXPECT_EQ(plan.ep, 8);
  EXPECT_EQ(mp_plan_world_size(&plan), 8);  // ep takes no ranks of its own
  object = mp_plan_to_json(&plan, nullptr);
  const cJSON *ep = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(object, "parallel"), "ep");
  ASSERT_TRUE(cJSON_IsNumber(ep));
  EXPECT_EQ(ep->valueint, 8);
  ASSERT_EQ(mp_plan_parse_json(object, "p.json", nullptr, &back, &err), MP_OK) << err.message;
  cJSON_Delete(object);
  EXPECT_EQ(back.ep, 8);
}

struct BadPlan {
  std::string text;
  const char *message;
};

class PlanBadInput : public ::testing::TestWithParam<BadPlan> {};

TEST_P(PlanBadInput, ExactMessage) {
  mp_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_plan_parse_text(GetParam().text.c_str(), "p.json", ".", &plan, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Messages, PlanBadInput,
    ::testing::Values(
        BadPlan{plan_text(kParallel,
                          "{\"global_batch\": 15, \"micro_batch\": 2, \"num_micro_batches\": 4, "
                          "\"seq_len\": 64}"),
                "p.json: $.batch.global_batch: 15, but dp x micro_batch x num_micro_batches = 2 "
                "x 2 x 4 = 16; the global batch must be split whole across dp ranks and "
                "micro-batches"},
        BadPlan{plan_text("{\"dp\": 2, \"pp\": 2, \"tp\": 1, \"virtual_stage\": 2}", kBatch),
                "p.json: $.parallel: unknown key \"virtual_stage\"; did you mean "
                "\"virtual_stages\"? (known keys: dp, cp, pp, tp, virtual_stages, ep, "
                "sequence_parallel, zero_stage, zero_shard_size)"},
        BadPlan{plan_text("{\"dp\": 2, \"cp\": 4, \"pp\": 1, \"tp\": 1}",
                          "{\"global_batch\": 16, \"micro_batch\": 2, \"num_micro_batches\": 4, "
                          "\"seq_len\": 36}"),
                "p.json: $.batch.seq_len: 36 tokens do not divide into 2 x cp = 8 chunks "
                "(context parallelism gives each of the cp 4 ranks two chunks of every sequence, "
                "one from each end); use a multiple of 8"},
        BadPlan{plan_text("{\"dp\": 2, \"cp\": 0, \"pp\": 1, \"tp\": 1}", kBatch),
                "p.json: $.parallel.cp: must be a positive integer, got 0"},
        BadPlan{plan_text("{\"dp\": 4, \"cp\": 2, \"pp\": 1, \"tp\": 1, \"zero_stage\": 1, "
                          "\"zero_shard_size\": 2}",
                          "{\"global_batch\": 16, \"micro_batch\": 2, \"num_micro_batches\": 2, "
                          "\"seq_len\": 64}"),
                "p.json: $.parallel.zero_shard_size: hybrid sharding (2 of the 4 dp ranks) does "
                "not run with context parallelism (cp 2) yet; drop zero_shard_size to shard "
                "ZeRO's state over all dp x cp ranks"},
        BadPlan{plan_text("{\"dp\": 2, \"cp\": 2, \"ep\": 3, \"pp\": 1, \"tp\": 1}", kBatch),
                "p.json: $.parallel.ep: 3 does not divide dp x cp = 2 x 2 = 4 (the "
                "expert-parallel groups are cut out of the dp x cp ranks that share the other "
                "weights)"},
        BadPlan{plan_text("{\"dp\": 2, \"ep\": 0, \"pp\": 1, \"tp\": 1}", kBatch),
                "p.json: $.parallel.ep: must be a positive integer, got 0"},
        BadPlan{plan_text("{\"dp\": 4, \"ep\": 2, \"pp\": 1, \"tp\": 1, \"zero_stage\": 1, "
                          "\"zero_shard_size\": 2}",
                          "{\"global_batch\": 16, \"micro_batch\": 2, \"num_micro_batches\": 2, "
                          "\"seq_len\": 64}"),
                "p.json: $.parallel.zero_shard_size: hybrid sharding (2 of the 4 dp ranks) is not "
                "planned with expert parallelism (ep 2) yet; drop one of them"},
        BadPlan{plan_text("{\"dp\": 2, \"pp\": 0, \"tp\": 1}", kBatch),
                "p.json: $.parallel.pp: must be a positive integer, got 0"},
        BadPlan{plan_text("{\"dp\": 2, \"pp\": 2, \"tp\": 1, \"zero_stage\": 4}", kBatch),
                "p.json: $.parallel.zero_stage: 4 is not a ZeRO stage; use 0 (replicated), 1 "
                "(optimizer state sharded across dp), 2 (and gradients) or 3 (and parameters)"},
        BadPlan{plan_text("{\"dp\": 2, \"pp\": 2, \"tp\": 1, \"zero_stage\": 1, "
                          "\"zero_shard_size\": 3}",
                          kBatch),
                "p.json: $.parallel.zero_shard_size: 3 does not divide dp 2 (ZeRO's groups of dp "
                "ranks must tile it)"},
        BadPlan{plan_text("{\"dp\": 4, \"pp\": 1, \"tp\": 1, \"zero_shard_size\": 2}", kBatch),
                "p.json: $.parallel.zero_shard_size: 2 shards ZeRO's state within groups of 2 of "
                "the 4 dp ranks, but zero_stage is 0; hybrid sharding runs with zero_stage 1 or 2"},
        BadPlan{plan_text(kParallel, kBatch, "\"schedule\": \"1fb1\", "),
                "p.json: $.schedule: \"1fb1\" is not one of \"gpipe\", \"1f1b\", "
                "\"interleaved-1f1b\", \"zb-h1\"; did you mean \"1f1b\"?"},
        BadPlan{plan_text(kParallel, kBatch, "\"layers_per_stage\": [3, 4, 1], "),
                "p.json: $.layers_per_stage: has 3 entries; it needs pp x virtual_stages = 2"},
        BadPlan{plan_text(kParallel, kBatch, "\"training\": {\"lr\": 1}, "),
                "p.json: $.training: unknown key \"lr\" (known keys: steps, seed, learning_rate, "
                "warmup_steps, min_lr_ratio, weight_decay, beta1, beta2, eps, grad_clip)"},
        BadPlan{plan_text(kParallel, kBatch, "\"training\": {\"beta2\": 1.5}, "),
                "p.json: $.training: beta1 and beta2 must be below 1 (got 0.9 and 1.5)"},
        BadPlan{"{\"format\": \"mpengine-trace\", \"model\": \"m.json\"}",
                "p.json: $.format: \"mpengine-trace\" is not \"mpengine-plan\"; is this a plan "
                "file?"},
        BadPlan{"{\"model\": \"m.json\", \"batch\": {}}",
                "p.json: $: missing required key \"parallel\" (an object with dp, pp, tp)"},
        // Products of sizes that once overflowed (tests/fuzz/corpus/plan_json/regress_*).
        BadPlan{plan_text("{\"dp\": 67108864, \"pp\": 67108864, \"tp\": 67108864}", kBatch),
                "p.json: $.parallel: dp x cp x pp x tp = 67108864 x 1 x 67108864 x 67108864 "
                "ranks is more than the supported 1048576"},
        BadPlan{plan_text("{\"dp\": 1048576, \"pp\": 1, \"tp\": 1}",
                          "{\"global_batch\": 1, \"micro_batch\": 67108864, "
                          "\"num_micro_batches\": 67108864, \"seq_len\": 1}"),
                "p.json: $.batch.global_batch: 1, but dp x micro_batch x num_micro_batches = "
                "1048576 x 67108864 x 67108864 is far larger; the global batch must be split "
                "whole across dp ranks and micro-batches"},
        BadPlan{plan_text("{\"dp\": 1, \"pp\": 1048576, \"tp\": 1, \"virtual_stages\": 67108864}",
                          "{\"global_batch\": 1, \"micro_batch\": 1, \"num_micro_batches\": 1, "
                          "\"seq_len\": 1}",
                          "\"layers_per_stage\": [1], "),
                "p.json: $.layers_per_stage: has 1 entries; it needs pp x virtual_stages = "
                "70368744177664"}));

}  // namespace
