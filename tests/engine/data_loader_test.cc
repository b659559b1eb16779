// tests/engine/data_loader_test.cc — batches as a pure function of (seed, step, global batch):
// the window layout, the Feistel order (a bijection for every S, new each epoch and seed, pinned
// by a golden), every sample once per epoch, call order never mattering, a data-parallel slice
// equal to its rows of the whole batch, shards of either width read as one stream, the held-out
// split a range that training never reads, and the exact message for each mistake.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "engine/data/data_loader.h"
#include "engine/data/markov_source.h"
#include "engine/data/sample_order.h"
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

// ---- the order ----

std::vector<int64_t> order_of(uint64_t seed, int64_t epoch, int64_t samples) {
  mp_sample_order order;
  mp_sample_order_init(&order, seed, epoch, samples);
  std::vector<int64_t> out(samples);
  for (int64_t p = 0; p < samples; ++p) out[p] = mp_sample_order_at(&order, p);
  return out;
}

TEST(SampleOrder, IsABijectionForManySizes) {
  for (int64_t samples : {1, 2, 3, 4, 5, 7, 15, 16, 17, 64, 65, 1000, 4095, 4097, 65537,
                          (1 << 20) + 1}) {
    for (uint64_t seed : {0ull, 1337ull}) {
      std::vector<int64_t> order = order_of(seed, 3, samples);
      std::vector<bool> seen(samples, false);
      for (int64_t sample : order) {
        ASSERT_GE(sample, 0) << samples;
        ASSERT_LT(sample, samples) << samples;
        ASSERT_FALSE(seen[sample]) << "sample " << sample << " twice, S = " << samples;
        seen[sample] = true;
      }
    }
  }
}

TEST(SampleOrder, DiffersBetweenEpochsAndSeedsAndIsNotTheIdentity) {
  const std::vector<int64_t> base = order_of(7, 0, 1000);
  std::vector<int64_t> identity(1000);
  for (int64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(base, identity);
  EXPECT_NE(order_of(7, 1, 1000), base);
  EXPECT_NE(order_of(8, 0, 1000), base);
  EXPECT_EQ(order_of(7, 0, 1000), base);  // a pure function
  // Each position lands anywhere: over 200 epochs position 0 meets many samples.
  std::set<int64_t> first;
  for (int64_t e = 0; e < 200; ++e) first.insert(order_of(7, e, 1000)[0]);
  EXPECT_GT(first.size(), 150u);
  // Huge S costs nothing up front: one position of a 2^62-sample epoch.
  mp_sample_order order;
  mp_sample_order_init(&order, 1, 0, (int64_t)1 << 62);
  EXPECT_LT(mp_sample_order_at(&order, 12345), (int64_t)1 << 62);
}

// The order is data order 2 of checkpoints: a change to it must be a new data order, so its
// values are pinned here.
TEST(SampleOrder, GoldenOrder) {
  EXPECT_EQ(order_of(1337, 0, 10), (std::vector<int64_t>{5, 0, 2, 1, 6, 9, 8, 4, 3, 7}));
  EXPECT_EQ(order_of(1337, 1, 10), (std::vector<int64_t>{9, 3, 1, 5, 8, 6, 0, 4, 7, 2}));
  EXPECT_EQ(MP_DATA_ORDER_VERSION, 2);
}

// ---- streams of shards ----

// Writes ids as one shard of the given vocabulary (its width follows it).
void write_ids(const std::string &path, const std::vector<uint32_t> &ids, int64_t vocab) {
  mp_token_shard_writer *w = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), vocab, &w, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_append(w, ids.data(), (int64_t)ids.size(), &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
}

// Windows cross the boundary of two files, even of two widths, as if they were one file.
TEST(DataLoader, TwoShardsGiveTheBatchesOfOne) {
  std::vector<uint32_t> ids(10007);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (uint32_t)((i * 2654435761u) % 128256);
  std::string dir = temp_dir() + "/two_shards";
  mkdir(dir.c_str(), 0755);
  std::vector<uint32_t> head(ids.begin(), ids.begin() + 4321), tail(ids.begin() + 4321, ids.end());
  write_ids(dir + "/split_0.bin", head, 128256);
  write_ids(dir + "/split_1.bin", tail, 128256);
  write_ids(dir + "/whole.bin", ids, 128256);
  Loader split, whole;
  ASSERT_EQ(mp_data_loader_open_glob((dir + "/split_*.bin").c_str(), 128256, &split.loader,
                                     &split.err),
            MP_OK)
      << split.err.message;
  ASSERT_EQ(mp_data_loader_open_glob((dir + "/whole.bin").c_str(), 128256, &whole.loader,
                                     &whole.err),
            MP_OK)
      << whole.err.message;
  EXPECT_EQ(mp_data_loader_num_tokens(split.loader), 10007);
  // T = 33 puts sample 130's window (tokens 4290 .. 4323) across the cut at 4321.
  bool crossed = false;
  for (int step = 0; step < 40; ++step) {
    Batch a = batch(&split, 5, 33, 16, step, 0, 16);
    Batch b = batch(&whole, 5, 33, 16, step, 0, 16);
    ASSERT_EQ(a.inputs, b.inputs) << "step " << step;
    ASSERT_EQ(a.targets, b.targets) << "step " << step;
    for (int row = 0; row < 16; ++row) {
      for (int t = 0; t < 33; ++t) {
        const int32_t id = a.inputs[row * 33 + t];
        if (id == (int32_t)ids[4320] && a.targets[row * 33 + t] == (int32_t)ids[4321]) {
          crossed = true;
        }
      }
    }
  }
  EXPECT_TRUE(crossed) << "no window crossed the boundary in 40 steps";
  // A uint16 shard followed by a uint32 one is one stream too.
  std::vector<uint32_t> small(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) small[i] = ids[i] % 50000;
  std::string mixed = temp_dir() + "/mixed_widths";
  mkdir(mixed.c_str(), 0755);
  write_ids(mixed + "/a.bin", std::vector<uint32_t>(small.begin(), small.begin() + 5000), 50000);
  write_ids(mixed + "/b.bin", std::vector<uint32_t>(small.begin() + 5000, small.end()), 128256);
  write_ids(mixed + "/whole.bin", small, 50000);
  Loader m, w;
  ASSERT_EQ(mp_data_loader_open_glob((mixed + "/[ab].bin").c_str(), 128256, &m.loader, &m.err),
            MP_OK)
      << m.err.message;
  ASSERT_EQ(mp_data_loader_open_glob((mixed + "/whole.bin").c_str(), 128256, &w.loader, &w.err),
            MP_OK);
  for (int step : {0, 3, 77}) {
    EXPECT_EQ(batch(&m, 9, 64, 8, step, 0, 8).inputs, batch(&w, 9, 64, 8, step, 0, 8).inputs);
  }
}

// The held-out split is the stream's last tokens, read in place: no training window ever reads
// one of them, whatever the epoch, and it gives the batches of a loader over those tokens alone.
TEST(DataLoader, HeldOutIsARangeThatTrainingNeverReads) {
  Loader train;
  open_counting(&train, 5001);
  mp_data_loader *held = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_data_loader_hold_out(train.loader, 1000, &held, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_data_loader_num_tokens(train.loader), 4001);
  EXPECT_EQ(mp_data_loader_num_tokens(held), 1000);
  EXPECT_EQ(std::string(mp_data_loader_name(held)), "counting, its last 1000 tokens (held out)");
  for (int step = 0; step < 50; ++step) {  // 50 x 32 rows of T = 16: 6 epochs of 250 samples
    Batch b = batch(&train, 3, 16, 32, step, 0, 32);
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      ASSERT_LT(b.inputs[i], 4001);
      ASSERT_LT(b.targets[i], 4001) << "a training window read a held-out token";
    }
  }
  Loader alone;
  std::vector<uint16_t> last = counting(5001);
  last.erase(last.begin(), last.begin() + 4001);
  ASSERT_EQ(mp_data_loader_from_tokens(last.data(), 1000, 65536, "last", &alone.loader,
                                       &alone.err),
            MP_OK);
  Loader held_loader;
  held_loader.loader = held;
  for (int step : {0, 1, 9}) {
    Batch h = batch(&held_loader, 3, 16, 8, step, 0, 8);
    for (int32_t id : h.inputs) ASSERT_GE(id, 4001);
    EXPECT_EQ(h.inputs, batch(&alone, 3, 16, 8, step, 0, 8).inputs);
  }
  // The two share the tokens: either may be freed first.
  mp_data_loader_free(train.loader);
  train.loader = nullptr;
  EXPECT_EQ(batch(&held_loader, 3, 16, 8, 2, 0, 8).inputs, batch(&alone, 3, 16, 8, 2, 0, 8).inputs);
}

TEST(DataLoader, HeldOutOfShardsSharesTheFiles) {
  std::vector<uint32_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (uint32_t)(i % 70000);
  std::string dir = temp_dir() + "/held_shards";
  mkdir(dir.c_str(), 0755);
  write_ids(dir + "/s0.bin", std::vector<uint32_t>(ids.begin(), ids.begin() + 12000), 70000);
  write_ids(dir + "/s1.bin", std::vector<uint32_t>(ids.begin() + 12000, ids.end()), 70000);
  Loader train;
  ASSERT_EQ(mp_data_loader_open_glob((dir + "/s*.bin").c_str(), 70000, &train.loader,
                                     &train.err),
            MP_OK);
  Loader held;
  ASSERT_EQ(mp_data_loader_hold_out(train.loader, 10000, &held.loader, &held.err), MP_OK);
  EXPECT_EQ(mp_data_loader_num_files(held.loader), 2);
  // Held-out windows start at token 10000, inside the first file, and run into the second.
  for (int step = 0; step < 20; ++step) {
    Batch h = batch(&held, 1, 100, 10, step, 0, 10);
    for (int32_t id : h.inputs) ASSERT_GE(id, 10000);
    Batch t = batch(&train, 1, 100, 10, step, 0, 10);
    for (int32_t id : t.targets) ASSERT_LT(id, 10000);
  }
}

TEST(DataLoaderBadInput, VocabularyOutOfRange) {
  Loader l;
  std::vector<uint16_t> tokens = {1, 2};
  EXPECT_EQ(mp_data_loader_from_tokens(tokens.data(), 2, (int64_t)1 << 32, "big", &l.loader,
                                       &l.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(l.err.message),
            "big: vocabulary size 4294967296 is outside 1 .. 2147483648 (batches hold ids as "
            "int32)");
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

// Ids are checked as windows are read: the loader opens, and the batch whose window holds the bad
// id fails naming the file, the token's index in it and its byte offset.
TEST(DataLoaderBadInput, ABadIdIsNamedWhenItsWindowIsRead) {
  std::vector<uint16_t> tokens(300, 1);
  tokens[250] = 300;
  std::string dir = write_shards("bad_shards", tokens, {200, 100});
  Loader l;
  std::string pattern = dir + "/*.bin";
  ASSERT_EQ(mp_data_loader_open_glob(pattern.c_str(), 256, &l.loader, &l.err), MP_OK)
      << l.err.message;
  std::vector<int32_t> inputs(29 * 10), targets(29 * 10);
  EXPECT_EQ(mp_data_loader_batch(l.loader, 1, 10, 29, 0, 0, 29, inputs.data(), targets.data(),
                                 &l.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(l.err.message),
            dir + "/train_B.bin: token id 300 at token 50 (byte offset 1124) is outside the "
                  "vocabulary of 256 ids (0 .. 255); the shard was made with another tokenizer, "
                  "or the model's vocab_size is too small");
}

TEST(DataLoaderBadInput, ABadShardHeaderIsNamedAtOpen) {
  std::string dir = temp_dir() + "/bad_header";
  mkdir(dir.c_str(), 0755);
  std::vector<uint16_t> tokens(100, 1);
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_write((dir + "/a.bin").c_str(), tokens.data(), 100, &err), MP_OK);
  ASSERT_EQ(truncate((dir + "/a.bin").c_str(), 1100), 0);
  Loader l;
  std::string pattern = dir + "/*.bin";
  EXPECT_EQ(mp_data_loader_open_glob(pattern.c_str(), 256, &l.loader, &l.err), MP_ERR_INPUT);
  EXPECT_EQ(l.loader, nullptr);
  EXPECT_EQ(std::string(l.err.message),
            dir + "/a.bin: the header says 100 tokens, which take 1024 + 2 x 100 = 1224 bytes, "
                  "but the file is 1100 bytes (124 short); the shard is truncated: copy or write "
                  "it again");
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
