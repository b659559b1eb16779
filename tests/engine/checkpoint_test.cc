// tests/engine/checkpoint_test.cc — engine/checkpoint/checkpoint.h on one rank: a save and a load
// into a fresh trainer restore parameters and AdamW moments bit for bit and the next steps' losses
// exactly; the exported global parameters (through llm.c's file) equal the trainer's; the
// one-rank model and the chunked trainer (the stage worker's, here through --trace's path) read
// each other's checkpoints; a version-1 checkpoint (rank-<R>.bin, "MPCKSHD1") still loads; the
// manifest's plan is the plan file's object (topology/plan.c's writer and reader), and the flat
// plan of earlier manifests (the seed a string) still loads and is checked; a flipped byte, a
// missing shard, another model and a foreign manifest are refused naming the file.
// Layouts of several ranks are covered by tests/tools/checkpoint_test.sh.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/data/data_loader.h"
#include "engine/model/param_layout.h"
#include "engine/data/markov_source.h"
#include "engine/trace/trace.h"
#include "engine/train/trainer.h"
#include "engine/weights/llmc_file.h"
#include "tensor_parallel/shard.h"
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
  mp_trace *trace = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Job() {
    mp_trainer_free(trainer);
    mp_trace_free(trace);
    mp_data_loader_free(data);
    mp_model_free(model);
  }
  // chunked: the trainer of parallel runs (one chunk of the whole model at tp = 1), which a
  // one-rank CPU run with a trace uses.
  bool make(const char *model_path, bool chunked = false, double learning_rate = 3e-3,
            int steps = 8) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": \"%s\", \"parallel\": {\"dp\": 1, \"pp\": 1, \"tp\": 1}, \"batch\": "
             "{\"global_batch\": 4, \"micro_batch\": 2, \"num_micro_batches\": 2, \"seq_len\": "
             "32}, \"training\": {\"steps\": %d, \"learning_rate\": %g}}",
             model_path, steps, learning_rate);
    mp_markov_source *source = nullptr;
    if (mp_plan_parse_text(text, "plan.json", ".", &plan, &err) != MP_OK ||
        mp_model_load(plan.model_path, &model, &err) != MP_OK ||
        mp_markov_source_build(mp_model_vocab_size(model), 4, 7, &source, &err) != MP_OK) {
      return false;
    }
    tokens.resize(1 << 14);
    mp_markov_source_sample(source, 1, (int64_t)tokens.size(), tokens.data());
    mp_markov_source_free(source);
    if (mp_data_loader_from_tokens(tokens.data(), (int64_t)tokens.size(),
                                   mp_model_vocab_size(model), "train", &data, &err) != MP_OK) {
      return false;
    }
    mp_trainer_options options = MP_TRAINER_OPTIONS_INITIALIZER;
    if (chunked) {
      mp_trace_layout layout;
      memset(&layout, 0, sizeof layout);
      snprintf(layout.schedule, sizeof layout.schedule, "%s", plan.schedule);
      layout.dp = layout.pp = layout.tp = layout.virtual_stages = 1;
      layout.num_micro_batches = (int)plan.num_micro_batches;
      if (mp_trace_create(&layout, 0, 0, 0, 0, &trace, &err) != MP_OK) return false;
      options.trace = trace;
    }
    return mp_trainer_create_parallel(&plan, model, data, MP_BACKEND_CPU, &options, &trainer,
                                      &err) == MP_OK;
  }
  mp_checkpoint_context context() {
    return {&plan, model, trainer, nullptr, nullptr, 0, 0, 0, nullptr, false, nullptr};
  }
  // Parameters, first and second moments, concatenated (the one-rank layout's order).
  std::vector<float> state() {
    mp_trainer_chunk_state chunk;
    EXPECT_EQ(mp_trainer_chunk_state_of(trainer, 0, &chunk, &err), MP_OK);
    EXPECT_EQ(chunk.moments_count, chunk.params_count);
    const size_t n = chunk.params_count;
    std::vector<float> all(3 * n);
    const mp_trainer_array arrays[3] = {MP_TRAINER_PARAMS, MP_TRAINER_ADAM_M, MP_TRAINER_ADAM_V};
    for (int a = 0; a < 3; ++a) {
      EXPECT_EQ(mp_trainer_read_state(trainer, 0, arrays[a], 0, n, all.data() + a * n, &err),
                MP_OK)
          << err.message;
    }
    return all;
  }
};

const char kTiny[] = "examples/models/tiny-gpt.json";

void write_file(const std::string &path, const std::string &text) {
  FILE *f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
}

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
  const std::string bin = dir + "/model.bin";
  size_t n = 0;
  ASSERT_EQ(
      mp_checkpoint_export(path, MP_WEIGHT_FORMAT_LLMC, nullptr, bin.c_str(), &step, &n, &a.err),
      MP_OK)
      << a.err.message;
  const mp_param_layout *layout = mp_trainer_layout(a.trainer);
  ASSERT_EQ(n, mp_param_layout_num_params(layout));
  std::vector<float> loaded(n);
  ASSERT_EQ(mp_llmc_load(layout, loaded.data(), bin.c_str(), &a.err), MP_OK);
  Job c;
  ASSERT_TRUE(c.make(kTiny)) << c.err.message;
  mp_checkpoint_context ctx_c = c.context();
  ASSERT_EQ(mp_checkpoint_load(path, &ctx_c, &step, &c.err), MP_OK);
  std::vector<float> saved = c.state();
  saved.resize(n);
  EXPECT_EQ(loaded, saved);
}

TEST(Checkpoint, RefusalsNameTheFile) {
  const std::string dir = temp_dir();
  Job a;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 0, &ctx, &a.err), MP_OK) << a.err.message;
  const std::string ck = dir + "/step-1", shard = ck + "/pp-00000-tp-00000.bin";
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
  EXPECT_NE(std::string(a.err.message).find(shard + ": missing shard file of pp rank 0, tp rank 0"),
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

bool exists(const std::string &path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

// Saving a step that exists (a resumed run saving the step it resumed from) swaps the two
// directories: step-N afterwards is the new state, and no copy of the old one is left behind.
TEST(Checkpoint, ReplacingAStepLeavesTheNewStateAndNoCopies) {
  const std::string dir = temp_dir();
  Job a, b;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny)) << b.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 3, 0, &ctx, &a.err), MP_OK) << a.err.message;
  mp_step_metrics m;
  ASSERT_EQ(mp_trainer_step(a.trainer, 0, &m, &a.err), MP_OK);
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 3, 0, &ctx, &a.err), MP_OK) << a.err.message;
  int64_t step = 0;
  mp_checkpoint_context ctx_b = b.context();
  ASSERT_EQ(mp_checkpoint_load((dir + "/step-3").c_str(), &ctx_b, &step, &b.err), MP_OK)
      << b.err.message;
  EXPECT_EQ(a.state(), b.state()) << "step-3 still holds the first save";
  std::vector<std::string> names;
  DIR *handle = opendir(dir.c_str());
  ASSERT_NE(handle, nullptr);
  for (dirent *e; (e = readdir(handle)) != nullptr;) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  closedir(handle);
  EXPECT_EQ(names, std::vector<std::string>{"step-3"});
}

// A save killed half-way leaves step-<N>.tmp-<pid> (or a replaced step-<N>.old-<pid>): the next
// save removes them; complete checkpoints stay.
TEST(Checkpoint, TheNextSaveRemovesLeftOversOfKilledSaves) {
  const std::string dir = temp_dir();
  Job a;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 0, &ctx, &a.err), MP_OK) << a.err.message;
  for (const char *name : {"/step-5.tmp-4242", "/step-2.old-99"}) {
    ASSERT_EQ(mkdir((dir + name).c_str(), 0777), 0);
    write_file(dir + name + "/pp-00000-tp-00000.bin", "half a shard");
  }
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 2, 0, &ctx, &a.err), MP_OK) << a.err.message;
  EXPECT_FALSE(exists(dir + "/step-5.tmp-4242"));
  EXPECT_FALSE(exists(dir + "/step-2.old-99"));
  EXPECT_TRUE(exists(dir + "/step-1/manifest.json"));
  EXPECT_TRUE(exists(dir + "/step-2/manifest.json"));
}

// --keep counts and removes only the checkpoints of the run that saves; a fresh run is refused
// a directory that holds any run's checkpoints, naming them.
TEST(Checkpoint, KeepPrunesOnlyThisRunsAndAFreshRunIsRefusedAUsedDirectory) {
  const std::string dir = temp_dir();
  Job a;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  EXPECT_EQ(mp_checkpoint_check_dir(dir.c_str(), &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(mp_checkpoint_check_dir((dir + "/missing").c_str(), &a.err), MP_OK);
  mp_checkpoint_context first = a.context(), second = a.context();
  first.run_id = "1111111111111111";
  second.run_id = "2222222222222222";
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 1, &first, &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 2, 1, &first, &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 3, 1, &second, &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 4, 1, &second, &a.err), MP_OK) << a.err.message;
  EXPECT_FALSE(exists(dir + "/step-1"));
  EXPECT_TRUE(exists(dir + "/step-2")) << "--keep of run 2222 removed run 1111's checkpoint";
  EXPECT_FALSE(exists(dir + "/step-3"));
  EXPECT_TRUE(exists(dir + "/step-4"));
  char id[MP_CHECKPOINT_RUN_ID_BYTES];
  ASSERT_EQ(mp_checkpoint_run_id((dir + "/step-2").c_str(), id, sizeof id, &a.err), MP_OK);
  EXPECT_STREQ(id, "1111111111111111");
  EXPECT_EQ(mp_checkpoint_check_dir(dir.c_str(), &a.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(a.err.message),
            "--checkpoint-dir " + dir + " holds 2 checkpoints of another run (step-2, step-4, "
            "run 1111111111111111); a new run would replace some and leave the others. Continue "
            "that run with --resume, or choose another --checkpoint-dir");
  char fresh[MP_CHECKPOINT_RUN_ID_BYTES], other[MP_CHECKPOINT_RUN_ID_BYTES];
  mp_checkpoint_new_run_id(fresh, sizeof fresh);
  mp_checkpoint_new_run_id(other, sizeof other);
  EXPECT_EQ(strlen(fresh), 16u);
  EXPECT_STRNE(fresh, other);
}

// A resume under changed training settings (the learning-rate curve, the optimizer) is refused,
// naming every field with both values, unless the override is asked for.
TEST(Checkpoint, ResumeRefusesChangedTrainingSettingsUnlessOverridden) {
  const std::string dir = temp_dir();
  Job a, b;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny, false, 1e-3, 12)) << b.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 2, 0, &ctx, &a.err), MP_OK) << a.err.message;
  mp_checkpoint_context ctx_b = b.context();
  int64_t step = 0;
  const std::string ck = dir + "/step-2";
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message),
            ck + " was saved with other training settings than plan.json (with --steps): steps "
                 "8 (now 12), learning_rate 0.003 (now 0.001); resume with the same settings, or "
                 "give --override-training to continue with the new ones (the learning-rate "
                 "curve changes from here on)");
  ctx_b.override_training = true;
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(step, 2);
}

TEST(Checkpoint, ChunkedAndWholeModelTrainersReadEachOther) {
  const std::string dir = temp_dir();
  Job whole, chunked;
  ASSERT_TRUE(whole.make(kTiny)) << whole.err.message;
  ASSERT_TRUE(chunked.make(kTiny, true)) << chunked.err.message;
  ASSERT_EQ(mp_trainer_num_chunks(chunked.trainer), 1);
  mp_step_metrics metrics;
  for (int64_t s = 0; s < 2; ++s) {
    ASSERT_EQ(mp_trainer_step(whole.trainer, s, &metrics, &whole.err), MP_OK);
  }
  for (int64_t s = 0; s < 3; ++s) {
    ASSERT_EQ(mp_trainer_step(chunked.trainer, s, &metrics, &chunked.err), MP_OK)
        << chunked.err.message;
  }
  mp_checkpoint_context ctx_whole = whole.context(), ctx_chunked = chunked.context();
  ASSERT_EQ(mp_checkpoint_save((dir + "/whole").c_str(), 2, 0, &ctx_whole, &whole.err), MP_OK)
      << whole.err.message;
  ASSERT_EQ(mp_checkpoint_save((dir + "/chunked").c_str(), 3, 0, &ctx_chunked, &chunked.err),
            MP_OK)
      << chunked.err.message;
  const std::vector<float> saved_whole = whole.state(), saved_chunked = chunked.state();
  int64_t step = 0;
  ASSERT_EQ(mp_checkpoint_load((dir + "/whole/step-2").c_str(), &ctx_chunked, &step,
                               &chunked.err),
            MP_OK)
      << chunked.err.message;
  EXPECT_EQ(step, 2);
  EXPECT_EQ(chunked.state(), saved_whole);
  ASSERT_EQ(mp_checkpoint_load((dir + "/chunked/step-3").c_str(), &ctx_whole, &step, &whole.err),
            MP_OK)
      << whole.err.message;
  EXPECT_EQ(step, 3);
  EXPECT_EQ(whole.state(), saved_chunked);
}

// A version-1 checkpoint as the previous mpengine wrote it for one rank: rank-00000.bin (header
// "MPCKSHD1", tp rank, tp size, floats, step; then params, m, v) and its manifest.
TEST(Checkpoint, ReadsVersionOne) {
  const std::string dir = temp_dir();
  Job a, b;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny)) << b.err.message;
  mp_step_metrics ma, mb;
  for (int64_t s = 0; s < 3; ++s) ASSERT_EQ(mp_trainer_step(a.trainer, s, &ma, &a.err), MP_OK);
  const std::vector<float> saved = a.state();
  const size_t n = saved.size() / 3;
  const std::string ck = dir + "/step-3";
  ASSERT_EQ(mkdir(ck.c_str(), 0777), 0);
  std::string shard(32, '\0');
  memcpy(&shard[0], "MPCKSHD1", 8);
  const uint32_t rank = 0, size = 1;
  const uint64_t floats = n, step64 = 3;
  memcpy(&shard[8], &rank, 4);
  memcpy(&shard[12], &size, 4);
  memcpy(&shard[16], &floats, 8);
  memcpy(&shard[24], &step64, 8);
  shard.append(reinterpret_cast<const char *>(saved.data()), saved.size() * sizeof(float));
  write_file(ck + "/rank-00000.bin", shard);
  uint64_t checksum = 0, bytes = 0;
  ASSERT_EQ(mp_checkpoint_file_checksum((ck + "/rank-00000.bin").c_str(), &checksum, &bytes,
                                        &a.err),
            MP_OK);
  const mp_param_layout *layout = mp_trainer_layout(a.trainer);
  const mp_model_config *c = mp_param_layout_config(layout);
  char text[1024];
  snprintf(text, sizeof text,
           "{\"format\": \"mpengine-checkpoint\", \"version\": 1, \"step\": 3,\n"
           " \"plan\": {\"dp\": 1, \"pp\": 1, \"tp\": 1, \"batch\": {\"global_batch\": 4, "
           "\"seq_len\": 32}, \"training\": {\"seed\": \"%llu\"}},\n"
           " \"model\": {\"name\": \"tiny-gpt\", \"config\": {\"max_seq_len\": %d, "
           "\"vocab_size\": %d, \"padded_vocab_size\": %d, \"num_layers\": %d, \"num_heads\": %d, "
           "\"channels\": %d, \"ffn_channels\": %d}},\n \"tensors\": [",
           (unsigned long long)a.plan.training.seed, c->max_seq_len, c->vocab_size,
           c->padded_vocab_size, c->num_layers, c->num_heads, c->channels, c->ffn_channels);
  std::string manifest = text;
  for (int i = 0; i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    mp_tp_split split;
    ASSERT_EQ(mp_tp_split_of(t->name, &split, &a.err), MP_OK);
    snprintf(text, sizeof text,
             "%s\n  {\"name\": \"%s\", \"shape\": [%zu, %zu], \"split\": \"%s\", \"shards\": "
             "[{\"tp_rank\": 0, \"float_offset\": %zu, \"floats\": %zu, \"blocks\": []}]}",
             i > 0 ? "," : "", t->name, t->rows, t->cols, mp_tp_split_name(split), t->offset,
             t->rows * t->cols);
    manifest += text;
  }
  snprintf(text, sizeof text,
           "],\n \"shards\": [{\"file\": \"rank-00000.bin\", \"tp_rank\": 0, \"tp_size\": 1, "
           "\"floats_per_array\": %zu, \"bytes\": %llu, \"fnv1a64\": \"%016llx\"}]}\n",
           n, (unsigned long long)bytes, (unsigned long long)checksum);
  manifest += text;
  write_file(ck + "/manifest.json", manifest);
  ASSERT_EQ(mp_checkpoint_manifest_check_text(manifest.c_str(), "v1", &a.err), MP_OK)
      << a.err.message;
  char path[4096];
  int64_t step = 0;
  ASSERT_EQ(mp_checkpoint_find_latest(dir.c_str(), path, sizeof path, &step, &b.err), MP_OK);
  mp_checkpoint_context ctx_b = b.context();
  // As the previous mpengine wrote it, it drew data order 1 (no $.data.order): a resume is
  // refused, naming the order.
  EXPECT_EQ(mp_checkpoint_load(path, &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_NE(std::string(b.err.message).find("was written with data order 1 (Fisher-Yates)"),
            std::string::npos)
      << b.err.message;
  // Its tensors read exactly once it says it drew today's order (as if saved by a run of it).
  manifest.insert(manifest.size() - 2, ",\n \"data\": {\"order\": 2}");
  write_file(ck + "/manifest.json", manifest);
  ASSERT_EQ(mp_checkpoint_load(path, &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(step, 3);
  EXPECT_EQ(b.state(), saved);
  for (int64_t s = 3; s < 5; ++s) {
    ASSERT_EQ(mp_trainer_step(a.trainer, s, &ma, &a.err), MP_OK);
    ASSERT_EQ(mp_trainer_step(b.trainer, s, &mb, &b.err), MP_OK);
    EXPECT_EQ(ma.loss, mb.loss) << "step " << s;
  }
  // Export reads it too (the model description is missing from this hand-made manifest).
  size_t exported = 0;
  const std::string bin = dir + "/model.bin";
  EXPECT_EQ(mp_checkpoint_export(path, MP_WEIGHT_FORMAT_LLMC, nullptr, bin.c_str(), &step,
                                 &exported, &a.err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(a.err.message).find("$.model.description is missing"), std::string::npos)
      << a.err.message;
}

std::string read_text(const std::string &path) {
  std::string text;
  FILE *f = fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return text;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, got);
  fclose(f);
  return text;
}

// The manifest's "plan" is what `mpengine plan --out` writes for the same plan (one writer,
// mp_plan_to_json), and topology/plan.c's reader gives the plan back from it.
TEST(Checkpoint, ManifestHoldsThePlanAsThePlanFileDoes) {
  const std::string dir = temp_dir();
  Job a;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 0, &ctx, &a.err), MP_OK) << a.err.message;
  cJSON *root = cJSON_Parse(read_text(dir + "/step-1/manifest.json").c_str());
  ASSERT_NE(root, nullptr);
  const cJSON *saved = cJSON_GetObjectItemCaseSensitive(root, "plan");
  cJSON *written = mp_plan_to_json(&a.plan, nullptr);
  EXPECT_TRUE(cJSON_Compare(saved, written, true));
  cJSON_Delete(written);
  const cJSON *training = cJSON_GetObjectItemCaseSensitive(saved, "training");
  EXPECT_TRUE(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(training, "seed")));
  mp_plan back;
  ASSERT_EQ(mp_plan_parse_json(saved, "manifest $.plan", nullptr, &back, &a.err), MP_OK)
      << a.err.message;
  EXPECT_STREQ(back.model_path, a.plan.model_path);
  EXPECT_EQ(back.dp, 1);
  EXPECT_EQ(back.global_batch, a.plan.global_batch);
  EXPECT_EQ(back.seq_len, a.plan.seq_len);
  EXPECT_EQ(back.training.seed, a.plan.training.seed);
  EXPECT_EQ(back.training.steps, a.plan.training.steps);
  EXPECT_EQ(back.training.learning_rate, a.plan.training.learning_rate);
  const cJSON *run = cJSON_GetObjectItemCaseSensitive(root, "run");
  EXPECT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(run, "plan")), "plan.json");
  cJSON_Delete(root);
}

// The "plan" object as mpengine wrote it before the plan file's writer wrote it too (the code of
// engine/checkpoint/checkpoint.c then): flat, the seed a string.
cJSON *flat_plan(const mp_plan &plan) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "source", plan.source);
  cJSON_AddNumberToObject(p, "dp", plan.dp);
  cJSON_AddNumberToObject(p, "pp", plan.pp);
  cJSON_AddNumberToObject(p, "tp", plan.tp);
  cJSON_AddNumberToObject(p, "virtual_stages", plan.virtual_stages);
  cJSON_AddNumberToObject(p, "zero_stage", plan.zero_stage);
  cJSON_AddNumberToObject(p, "zero_shard_size", mp_plan_zero_shard(&plan));
  cJSON_AddBoolToObject(p, "sequence_parallel", plan.sequence_parallel);
  cJSON_AddStringToObject(p, "schedule", plan.schedule);
  cJSON *batch = cJSON_AddObjectToObject(p, "batch");
  cJSON_AddNumberToObject(batch, "global_batch", (double)plan.global_batch);
  cJSON_AddNumberToObject(batch, "micro_batch", (double)plan.micro_batch);
  cJSON_AddNumberToObject(batch, "num_micro_batches", (double)plan.num_micro_batches);
  cJSON_AddNumberToObject(batch, "seq_len", (double)plan.seq_len);
  const mp_training_config *t = &plan.training;
  cJSON *training = cJSON_AddObjectToObject(p, "training");
  cJSON_AddNumberToObject(training, "steps", (double)t->steps);
  cJSON_AddStringToObject(training, "seed", std::to_string(t->seed).c_str());
  cJSON_AddNumberToObject(training, "learning_rate", t->learning_rate);
  cJSON_AddNumberToObject(training, "warmup_steps", (double)t->warmup_steps);
  cJSON_AddNumberToObject(training, "min_lr_ratio", t->min_lr_ratio);
  cJSON_AddNumberToObject(training, "weight_decay", t->weight_decay);
  cJSON_AddNumberToObject(training, "beta1", t->beta1);
  cJSON_AddNumberToObject(training, "beta2", t->beta2);
  cJSON_AddNumberToObject(training, "eps", t->eps);
  cJSON_AddNumberToObject(training, "grad_clip", t->grad_clip);
  return p;
}

// Rewrites path's manifest with `plan` as its "plan" object; returns the text.
std::string replace_plan(const std::string &path, cJSON *plan) {
  const std::string file = path + "/manifest.json";
  cJSON *root = cJSON_Parse(read_text(file).c_str());
  EXPECT_NE(root, nullptr);
  cJSON_ReplaceItemInObjectCaseSensitive(root, "plan", plan);
  char *text = cJSON_Print(root);
  const std::string out = text;
  free(text);
  cJSON_Delete(root);
  write_file(file, out);
  return out;
}

// A checkpoint whose manifest has the flat plan of earlier mpengines loads exactly, and its
// batch, seed and training settings are checked as before; its seed may be a string or a number.
TEST(Checkpoint, ReadsTheFlatPlanOfEarlierManifests) {
  const std::string dir = temp_dir();
  Job a, b, c;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny)) << b.err.message;
  ASSERT_TRUE(c.make(kTiny, false, 1e-3, 12)) << c.err.message;
  mp_step_metrics metrics;
  for (int64_t s = 0; s < 3; ++s) {
    ASSERT_EQ(mp_trainer_step(a.trainer, s, &metrics, &a.err), MP_OK);
  }
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 3, 0, &ctx, &a.err), MP_OK) << a.err.message;
  const std::string ck = dir + "/step-3";
  const std::string manifest = replace_plan(ck, flat_plan(a.plan));
  ASSERT_NE(manifest.find("\"seed\":\t\"1337\""), std::string::npos);
  EXPECT_EQ(mp_checkpoint_manifest_check_text(manifest.c_str(), "old", &a.err), MP_OK)
      << a.err.message;
  mp_checkpoint_context ctx_b = b.context();
  int64_t step = 0;
  ASSERT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(step, 3);
  EXPECT_EQ(b.state(), a.state());
  // Its training settings are compared as the plan file's are.
  mp_checkpoint_context ctx_c = c.context();
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_c, &step, &c.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(c.err.message),
            ck + " was saved with other training settings than plan.json (with --steps): steps "
                 "8 (now 12), learning_rate 0.003 (now 0.001); resume with the same settings, or "
                 "give --override-training to continue with the new ones (the learning-rate "
                 "curve changes from here on)");
  // Its seed, as a string, and as a number (the plan file's form).
  cJSON *other_seed = flat_plan(a.plan);
  cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(other_seed, "training"),
                                         "seed", cJSON_CreateString("99"));
  replace_plan(ck, other_seed);
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message),
            ck + " was saved with seed 99, plan.json has seed 1337; resume with the same seed "
                 "(the data order depends on it)");
  cJSON *number_seed = flat_plan(a.plan);
  cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(number_seed, "training"),
                                         "seed", cJSON_CreateNumber(1337));
  replace_plan(ck, number_seed);
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  // The plan file's form with a changed seed is refused the same way.
  cJSON *plan_file = mp_plan_to_json(&a.plan, nullptr);
  cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(plan_file, "training"),
                                         "seed", cJSON_CreateNumber(99));
  replace_plan(ck, plan_file);
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message),
            ck + " was saved with seed 99, plan.json has seed 1337; resume with the same seed "
                 "(the data order depends on it)");
  // A plan-file-form plan that its reader refuses names the manifest and the path in it.
  cJSON *bad = mp_plan_to_json(&a.plan, nullptr);
  cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(bad, "parallel"), "tp",
                                         cJSON_CreateNumber(0));
  const std::string refused = replace_plan(ck, bad);
  EXPECT_EQ(mp_checkpoint_manifest_check_text(refused.c_str(), "ck/manifest.json", &a.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(a.err.message),
            "ck/manifest.json $.plan: $.parallel.tp: must be a positive integer, got 0");
}

// The manifest records the data order (data_loader.h); a checkpoint of another order, or of the
// Fisher-Yates order of mpengines before it was recorded, is refused at resume with what to do.
TEST(Checkpoint, ResumeRefusesAnotherDataOrder) {
  const std::string dir = temp_dir();
  Job a, b;
  ASSERT_TRUE(a.make(kTiny)) << a.err.message;
  ASSERT_TRUE(b.make(kTiny)) << b.err.message;
  mp_step_metrics metrics;
  ASSERT_EQ(mp_trainer_step(a.trainer, 0, &metrics, &a.err), MP_OK);
  mp_checkpoint_context ctx = a.context();
  ASSERT_EQ(mp_checkpoint_save(dir.c_str(), 1, 0, &ctx, &a.err), MP_OK) << a.err.message;
  const std::string ck = dir + "/step-1";
  const std::string file = ck + "/manifest.json";
  cJSON *root = cJSON_Parse(read_text(file).c_str());
  ASSERT_NE(root, nullptr);
  cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  EXPECT_EQ(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(data, "order")), 2);
  EXPECT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(data, "order_name")),
               "Feistel");
  auto with_order = [&](cJSON *order) {
    if (order == nullptr) {
      cJSON_DeleteItemFromObjectCaseSensitive(data, "order");
    } else if (cJSON_HasObjectItem(data, "order")) {
      cJSON_ReplaceItemInObjectCaseSensitive(data, "order", order);
    } else {
      cJSON_AddItemToObject(data, "order", order);
    }
    char *text = cJSON_Print(root);
    write_file(file, text);
    free(text);
  };
  mp_checkpoint_context ctx_b = b.context();
  int64_t step = 0;
  with_order(nullptr);  // as mpengines before data order 2 wrote it
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message),
            "checkpoint " + ck + " was written with data order 1 (Fisher-Yates); this mpengine "
            "reads data order 2 (Feistel), which draws other batches from the same seed, so the "
            "run cannot continue exactly. Finish that run with the mpengine that wrote it, or "
            "start a new run from its weights: `mpengine export --checkpoint " + ck +
            " --out model.bin` (or `--format hf --out HF_DIR`), then `mpengine run --init-from` "
            "that file or directory");
  with_order(cJSON_CreateNumber(3));
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message),
            "checkpoint " + ck + " was written with data order 3; this mpengine reads data order "
            "2 (Feistel) only: resume it with the newer mpengine that wrote it");
  with_order(cJSON_CreateString("2"));
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(b.err.message), file + ": $.data.order must be a whole number");
  with_order(cJSON_CreateNumber(2));
  EXPECT_EQ(mp_checkpoint_load(ck.c_str(), &ctx_b, &step, &b.err), MP_OK) << b.err.message;
  EXPECT_EQ(step, 1);
  cJSON_Delete(root);
}

}  // namespace
