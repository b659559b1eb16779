// tests/engine/data_loader_test.cc — batches as a pure function of (seed, step, global batch):
// the window layout, every sample once per epoch in a new order each epoch, call order never
// mattering, a data-parallel slice equal to its rows of the whole batch, shards read as one
// stream, and the exact message for each mistake.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "engine/data/data_loader.h"
#include "engine/data/markov_source.h"
#include "engine/data/token_shard.h"

namespace {

std::string temp_dir() {
  const char *dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

struct Loader {
  mp_data_loader *loader = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Loader() { mp_data_loader_free(loader); }
};

// Tokens 0, 1, 2, ...: a window's first token says which sample it is.
std::vector<uint16_t> counting(int64_t n) {
  std::vector<uint16_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = (uint16_t)i;
  return tokens;
}

void open_counting(Loader *l, int64_t n) {
  std::vector<uint16_t> tokens = counting(n);
  ASSERT_EQ(mp_data_loader_from_tokens(tokens.data(), n, 65536, "counting", &l->loader, &l->err),
            MP_OK)
      << l->err.message;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch batch(Loader *l, uint64_t seed, int64_t T, int64_t G, int64_t step, int64_t first,
            int64_t rows) {
  Batch b{std::vector<int32_t>(rows * T, -1), std::vector<int32_t>(rows * T, -1)};
  EXPECT_EQ(mp_data_loader_batch(l->loader, seed, T, G, step, first, rows, b.inputs.data(),
                                 b.targets.data(), &l->err),
            MP_OK)
      << l->err.message;
  return b;
}

TEST(DataLoader, WindowsOfTPlusOneTokensAtStrideT) {
  Loader l;
  open_counting(&l, 1005);
  EXPECT_EQ(mp_data_loader_num_tokens(l.loader), 1005);
  EXPECT_EQ(mp_data_loader_num_samples(l.loader, 10), 100);  // the last 4 tokens are unused
  EXPECT_EQ(mp_data_loader_num_samples(l.loader, 1004), 1);
  EXPECT_EQ(mp_data_loader_num_samples(l.loader, 1005), 0);
  Batch b = batch(&l, 1, 10, 4, 0, 0, 4);
  for (int row = 0; row < 4; ++row) {
    const int32_t start = b.inputs[row * 10];
    EXPECT_EQ(start % 10, 0);
    for (int t = 0; t < 10; ++t) {
      EXPECT_EQ(b.inputs[row * 10 + t], start + t);
      EXPECT_EQ(b.targets[row * 10 + t], start + t + 1);  // the next token
    }
  }
  Loader exact;
  open_counting(&exact, 1001);  // 100 windows of 11 tokens fit exactly, sharing their ends
  EXPECT_EQ(mp_data_loader_num_samples(exact.loader, 10), 100);
  Batch all = batch(&exact, 1, 10, 100, 0, 0, 100);
  EXPECT_EQ(*std::max_element(all.targets.begin(), all.targets.end()), 1000);
}

// The samples (window starts / T) of steps [first_step, first_step + steps).
std::vector<int> samples_of(Loader *l, uint64_t seed, int64_t T, int64_t G, int64_t first_step,
                            int64_t steps) {
  std::vector<int> samples;
  for (int64_t s = first_step; s < first_step + steps; ++s) {
    Batch b = batch(l, seed, T, G, s, 0, G);
    for (int64_t row = 0; row < G; ++row) samples.push_back(b.inputs[row * T] / (int)T);
  }
  return samples;
}

TEST(DataLoader, EverySampleOncePerEpochInANewOrderEachEpoch) {
  Loader l;
  open_counting(&l, 1001);  // 100 samples of T = 10
  std::vector<int> epoch0 = samples_of(&l, 7, 10, 10, 0, 10);
  std::vector<int> epoch1 = samples_of(&l, 7, 10, 10, 10, 10);
  std::vector<int> all(100);
  for (int i = 0; i < 100; ++i) all[i] = i;
  std::vector<int> sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted0, all);
  EXPECT_EQ(sorted1, all);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, all);  // shuffled, not in file order
  EXPECT_EQ(mp_data_loader_epoch(l.loader, 10, 10, 9, 9), 0);
  EXPECT_EQ(mp_data_loader_epoch(l.loader, 10, 10, 10, 0), 1);
  // Another seed, another order.
  EXPECT_NE(samples_of(&l, 8, 10, 10, 0, 10), epoch0);
}

TEST(DataLoader, BatchesStraddlingEpochsStayWhole) {
  Loader l;
  open_counting(&l, 1001);  // 100 samples; a batch of 30 does not divide them
  std::vector<int> positions = samples_of(&l, 3, 10, 30, 0, 10);  // 300 positions: 3 epochs
  for (int e = 0; e < 3; ++e) {
    std::set<int> seen(positions.begin() + 100 * e, positions.begin() + 100 * (e + 1));
    EXPECT_EQ(seen.size(), 100u) << "epoch " << e;
  }
  // A global batch larger than an epoch still works: positions simply run on.
  std::vector<int> big = samples_of(&l, 3, 10, 250, 0, 1);
  EXPECT_EQ(std::vector<int>(big.begin(), big.begin() + 250),
            std::vector<int>(positions.begin(), positions.begin() + 250));
}

TEST(DataLoader, SameSeedAndStepSameTokensWhateverTheCallOrder) {
  Loader a, b;
  open_counting(&a, 5001);
  open_counting(&b, 5001);
  // a walks forward; b jumps around (as a resumed run, or ranks at different steps, would).
  std::vector<Batch> forward;
  for (int step = 0; step < 40; ++step) forward.push_back(batch(&a, 11, 16, 8, step, 0, 8));
  for (int step : {39, 0, 17, 3, 38, 1, 25}) {
    Batch again = batch(&b, 11, 16, 8, step, 0, 8);
    EXPECT_EQ(again.inputs, forward[step].inputs) << "step " << step;
    EXPECT_EQ(again.targets, forward[step].targets) << "step " << step;
  }
  // A different sequence length is a different sample set, and then back again.
  batch(&b, 11, 7, 8, 5, 0, 8);
  EXPECT_EQ(batch(&b, 11, 16, 8, 5, 0, 8).inputs, forward[5].inputs);
}

TEST(DataLoader, DataParallelSlicesAndMicroBatchesAreRowsOfTheGlobalBatch) {
  Loader l;
  open_counting(&l, 3001);
  const int64_t T = 12, G = 16, dp = 4, micro = 2;
  for (int64_t step : {0, 5, 23}) {
    Batch whole = batch(&l, 99, T, G, step, 0, G);
    for (int64_t rank = 0; rank < dp; ++rank) {
      const int64_t per_rank = G / dp;
      for (int64_t m = 0; m < per_rank / micro; ++m) {
        const int64_t first = rank * per_rank + m * micro;
        Batch part = batch(&l, 99, T, G, step, first, micro);
        EXPECT_EQ(part.inputs, std::vector<int32_t>(whole.inputs.begin() + first * T,
                                                    whole.inputs.begin() + (first + micro) * T));
        EXPECT_EQ(part.targets, std::vector<int32_t>(whole.targets.begin() + first * T,
                                                     whole.targets.begin() + (first + micro) * T));
      }
    }
  }
}

// Writes tokens as shards of the given sizes; names sort in stream order only by byte value.
std::string write_shards(const std::string &dir_name, const std::vector<uint16_t> &tokens,
                         const std::vector<int64_t> &sizes) {
  std::string dir = temp_dir() + "/" + dir_name;
  mkdir(dir.c_str(), 0755);
  const char *names[] = {"train_A.bin", "train_B.bin", "train_a.bin", "train_b.bin"};
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    mp_error err = MP_ERROR_INITIALIZER;
    std::string path = dir + "/" + names[i];
    EXPECT_EQ(mp_token_shard_write(path.c_str(), tokens.data() + at, sizes[i], &err), MP_OK)
        << err.message;
    at += sizes[i];
  }
  return dir;
}

TEST(DataLoader, ShardsFromAGlobAreOneStreamInNameOrder) {
  mp_markov_source *source = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_markov_source_build(256, 4, 5, &source, &err), MP_OK) << err.message;
  std::vector<uint16_t> tokens(20000);
  mp_markov_source_sample(source, 5, 20000, tokens.data());
  mp_markov_source_free(source);
  std::string dir = write_shards("shards", tokens, {7000, 3, 12000, 997});

  Loader from_files, in_memory;
  std::string pattern = dir + "/train_*.bin";
  ASSERT_EQ(mp_data_loader_open_glob(pattern.c_str(), 256, &from_files.loader, &from_files.err),
            MP_OK)
      << from_files.err.message;
  ASSERT_EQ(mp_data_loader_from_tokens(tokens.data(), 20000, 256, "memory", &in_memory.loader,
                                       &in_memory.err),
            MP_OK);
  EXPECT_EQ(mp_data_loader_num_files(from_files.loader), 4);
  EXPECT_EQ(std::string(mp_data_loader_file(from_files.loader, 0)), dir + "/train_A.bin");
  EXPECT_EQ(std::string(mp_data_loader_file(from_files.loader, 3)), dir + "/train_b.bin");
  EXPECT_EQ(mp_data_loader_file(from_files.loader, 4), nullptr);
  EXPECT_EQ(std::string(mp_data_loader_name(from_files.loader)), pattern);
  EXPECT_EQ(mp_data_loader_num_tokens(from_files.loader), 20000);
  for (int step : {0, 1, 50, 400}) {
    Batch a = batch(&from_files, 1337, 64, 8, step, 0, 8);
    Batch b = batch(&in_memory, 1337, 64, 8, step, 0, 8);
    EXPECT_EQ(a.inputs, b.inputs) << "step " << step;
    EXPECT_EQ(a.targets, b.targets) << "step " << step;
  }
}

TEST(DataLoaderBadInput, NoFileMatches) {
  Loader l;
  std::string pattern = temp_dir() + "/nothing_here_*.bin";
  EXPECT_EQ(mp_data_loader_open_glob(pattern.c_str(), 256, &l.loader, &l.err), MP_ERR_INPUT);
  EXPECT_EQ(l.loader, nullptr);
  EXPECT_EQ(std::string(l.err.message),
            pattern + ": no file matches this pattern; check the path, and quote the pattern so "
                      "that mpengine expands it, not the shell");
}

TEST(DataLoaderBadInput, ABadShardIsNamed) {
  std::vector<uint16_t> tokens(300, 1);
  tokens[250] = 300;
  std::string dir = write_shards("bad_shards", tokens, {200, 100});
  Loader l;
  std::string pattern = dir + "/*.bin";
  EXPECT_EQ(mp_data_loader_open_glob(pattern.c_str(), 256, &l.loader, &l.err), MP_ERR_INPUT);
  EXPECT_EQ(l.loader, nullptr);
  EXPECT_EQ(std::string(l.err.message),
            dir + "/train_B.bin: token id 300 at position 50 is outside the vocabulary of 256 ids "
                  "(0 .. 255); the shard was made with another tokenizer, or the model's "
                  "vocab_size is too small");
}

TEST(DataLoaderBadInput, TooFewTokensForOneSample) {
  Loader l;
  open_counting(&l, 64);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_data_loader_check(l.loader, 63, &err), MP_OK);
  EXPECT_EQ(mp_data_loader_check(l.loader, 64, &err), MP_ERR_INPUT);
  const std::string message =
      "counting: 64 tokens, too few for one sample of sequence length + 1 = 65 tokens; use a "
      "shorter sequence length or more data";
  EXPECT_EQ(std::string(err.message), message);
  std::vector<int32_t> inputs(64), targets(64);
  EXPECT_EQ(mp_data_loader_batch(l.loader, 1, 64, 1, 0, 0, 1, inputs.data(), targets.data(), &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), message);
  EXPECT_EQ(mp_data_loader_check(l.loader, 0, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), "sequence length 0: must be at least 1");
}

TEST(DataLoaderBadInput, RowsOutsideTheGlobalBatch) {
  Loader l;
  open_counting(&l, 1000);
  std::vector<int32_t> inputs(100), targets(100);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_data_loader_batch(l.loader, 1, 10, 8, 0, 6, 3, inputs.data(), targets.data(), &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "counting: rows 6 .. 8 are not inside the global batch of 8 rows (0 .. 7)");
  EXPECT_EQ(mp_data_loader_batch(l.loader, 1, 10, 8, -1, 0, 1, inputs.data(), targets.data(), &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "counting: batch of step -1 with global batch size 8: the step must be >= 0 and the "
            "batch size >= 1");
}

TEST(DataLoaderBadInput, InMemoryTokenOutsideVocabulary) {
  std::vector<uint16_t> tokens = {1, 2, 3, 9, 4};
  Loader l;
  EXPECT_EQ(mp_data_loader_from_tokens(tokens.data(), 5, 8, "synthetic", &l.loader, &l.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(l.err.message),
            "synthetic: token id 9 at position 3 is outside the vocabulary of 8 ids (0 .. 7)");
}

}  // namespace
