// tests/engine/checkpoint_test.cc — engine/checkpoint.h on one rank: a save and a load into a
// fresh trainer restore parameters and AdamW moments bit for bit and the next steps' losses
// exactly; the exported global parameters (through llm.c's file) equal the trainer's; a flipped
// byte, a missing shard, another model and a foreign manifest are refused naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data_loader.h"
#include "engine/gpt_model.h"
#include "engine/markov_source.h"
#include "engine/trainer.h"
#include "topology/model.h"
#include "topology/plan.h"

namespace {

std::string temp_dir() {
  const char *base = getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/ckptXXXXXX";
  std::vector<char> name(dir.begin(), dir.end());
  name.push_back('\0');
  EXPECT_NE(mkdtemp(name.data()), nullptr);
  return name.data();
}

struct Job {
  mp_plan plan;
  mp_model *model = nullptr;
  std::vector<uint16_t> tokens;
  mp_data_loader *data = nullptr;
  mp_trainer *trainer = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Job() {
    mp_trainer_free(trainer);
    mp_data_loader_free(data);
    mp_model_free(model);
  }
  bool make(const char *model_path) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": \"%s\", \"parallel\": {\"dp\": 1, \"pp\": 1, \"tp\": 1}, \"batch\": "
             "{\"global_batch\": 4, \"micro_batch\": 2, \"num_micro_batches\": 2, \"seq_len\": "
             "32}, \"training\": {\"steps\": 8, \"learning_rate\": 3e-3}}",
             model_path);
    mp_markov_source *source = nullptr;
    if (mp_plan_parse_text(text, "plan.json", ".", &plan, &err) != MP_OK ||
        mp_model_load(plan.model_path, &model, &err) != MP_OK ||
        mp_markov_source_build(mp_model_vocab_size(model), 4, 7, &source, &err) != MP_OK) {
      return false;
    }
    tokens.resize(1 << 14);
    mp_markov_source_sample(source, 1, (int64_t)tokens.size(), tokens.data());
    mp_markov_source_free(source);
    return mp_data_loader_from_tokens(tokens.data(), (int64_t)tokens.size(),
                                      mp_model_vocab_size(model), "train", &data,
                                      &err) == MP_OK &&
           mp_trainer_create(&plan, model, data, MP_BACKEND_CPU, &trainer, &err) == MP_OK;
  }
  mp_checkpoint_context context() { return {&plan, model, trainer, nullptr, 0, 1}; }
  std::vector<float> state() {
    float *p, *m, *v;
    size_t n = 0;
    EXPECT_EQ(mp_trainer_cpu_state(trainer, &p, &m, &v, &n, &err), MP_OK);
    std::vector<float> all(p, p + n);
    all.insert(all.end(), m, m + n);
    all.insert(all.end(), v, v + n);
    return all;
  }
};

const char kTiny[] = "examples/models/tiny-gpt.json";

TEST(Checkpoint, SaveLoadResumesExactly) {
  const std::string dir = temp_dir();
  Job a, b;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny)) << b.err.message;
  mp_step_metrics ma, mb;
  for (int64_t s = 0; s < 3; ++s) ASSERT_EQ(mp_trainer_step(a.trainer, s, &ma, &a.err), MP_OK);
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 3, 0, &ctx, &a.err), MP_OK) << a.err.message;
  char path[4096];
  int64_t step = -1;
  ASSERT_EQ(mp_checkpoint_find_latest(dir.c_str(), path, sizeof path, &step, &b.err), MP_OK);
  EXPECT_EQ(step, 3);
  EXPECT_EQ(std::string(path), dir + "/step-3");
  mp_checkpoint_context ctx_b = b.context();
  ASSERT_EQ(mp_checkpoint_load(path, &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(step, 3);
  EXPECT_EQ(a.state(), b.state());
  for (int64_t s = 3; s < 6; ++s) {
    ASSERT_EQ(mp_trainer_step(a.trainer, s, &ma, &a.err), MP_OK);
    ASSERT_EQ(mp_trainer_step(b.trainer, s, &mb, &b.err), MP_OK);
    EXPECT_EQ(ma.loss, mb.loss) << "step " << s;
  }
  // Export: the global parameters through llm.c's file equal the trainer's at step 3.
  mp_gpt_layout *layout = nullptr;
  float *params = nullptr;
  ASSERT_EQ(mp_checkpoint_read_params(path, &layout, &params, &step, &a.err), MP_OK)
      << a.err.message;
  const std::string bin = dir + "/model.bin";
  ASSERT_EQ(mp_gpt_layout_save_llmc(layout, params, bin.c_str(), &a.err), MP_OK);
  const size_t n = mp_gpt_layout_num_params(layout);
  std::vector<float> loaded(n);
  ASSERT_EQ(mp_gpt_layout_load_llmc(layout, loaded.data(), bin.c_str(), &a.err), MP_OK);
  Job c;
  ASSERT_TRUE(c.make(kTiny)) << c.err.message;
  mp_checkpoint_context ctx_c = c.context();
  ASSERT_EQ(mp_checkpoint_load(path, &ctx_c, &step, &c.err), MP_OK);
  std::vector<float> saved = c.state();
  saved.resize(n);
  EXPECT_EQ(loaded, saved);
  free(params);
  mp_gpt_layout_free(layout);
}

TEST(Checkpoint, RefusalsNameTheFile) {
  const std::string dir = temp_dir();
  Job a;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 0, &ctx, &a.err), MP_OK) << a.err.message;
  const std::string ck = dir + "/step-1", shard = ck + "/rank-00000.bin";
  int64_t step = 0;
  // Another model.
  const std::string other = dir + "/small.json";
  FILE *f = fopen(other.c_str(), "w");
  fputs("{\"name\": \"small\", \"vocab_size\": 128, \"seq_len\": 64, \"layers\": ["
        "{\"type\": \"embedding\", \"hidden\": 64, \"max_positions\": 64},"
        "{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"ffn_hidden\": 128},"
        "{\"type\": \"layernorm\", \"hidden\": 64},"
        "{\"type\": \"lm_head\", \"hidden\": 64, \"tie_embedding\": true}]}",
        f);
  fclose(f);
  Job b;
  ASSERT_TRUE(b.make(other.c_str())) << b.err.message;
  mp_checkpoint_context ctx_b = b.context();
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(b.err.message).find("is a checkpoint of another model: num_layers 4"),
            std::string::npos)
      << b.err.message;
  // A flipped byte.
  f = fopen(shard.c_str(), "r+b");
  fseek(f, 100, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx, &step, &a.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(a.err.message).find(shard + ": checksum mismatch"), std::string::npos)
      << a.err.message;
  // A missing shard.
  unlink(shard.c_str());
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx, &step, &a.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(a.err.message).find(shard + ": missing shard file of tp rank 0"),
            std::string::npos)
      << a.err.message;
  // Not a checkpoint manifest; and then nothing to resume.
  f = fopen((ck + "/manifest.json").c_str(), "w");
  fputs("[1, 2]", f);
  fclose(f);
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx, &step, &a.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(a.err.message).find("not a checkpoint manifest"), std::string::npos);
  char path[4096];
  EXPECT_EQ(mp_checkpoint_find_latest(dir.c_str(), path, sizeof path, &step, &a.err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(a.err.message).find("--resume: no checkpoint in " + dir),
            std::string::npos);
}

}  // namespace
