// tests/engine/token_shard_test.cc — llm.c token shards of uint16 and uint32 ids: a written shard
// reads back bit for bit in llm.c's byte layout, the writer picks the width from the vocabulary
// and never exposes a half-written shard, ranges read only what they name, and each way a file can
// be wrong gets its exact message naming the file (and for an id, its index and byte offset).
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data/token_shard.h"

namespace {

std::string temp_dir() {
  const char *dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A fresh directory per test, so the "no temporary file left behind" check sees only its own.
std::string fresh_dir(const std::string &name) {
  std::string dir = temp_dir() + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

void put_int32(std::vector<unsigned char> *bytes, size_t at, int32_t value) {
  for (int i = 0; i < 4; ++i) (*bytes)[at + i] = (unsigned char)((uint32_t)value >> (8 * i));
}

// A shard's bytes: the header (magic, version, count) then the tokens, little-endian, each
// `width` bytes.
std::vector<unsigned char> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                       const std::vector<uint32_t> &tokens, int width = 2) {
  std::vector<unsigned char> bytes(1024 + width * tokens.size(), 0);
  put_int32(&bytes, 0, magic);
  put_int32(&bytes, 4, version);
  put_int32(&bytes, 8, count);
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int b = 0; b < width; ++b) {
      bytes[1024 + width * i + b] = (unsigned char)(tokens[i] >> (8 * b));
    }
  }
  return bytes;
}

std::vector<unsigned char> u32_shard_bytes(const std::vector<uint32_t> &tokens) {
  return shard_bytes(20240801, 7, (int32_t)tokens.size(), tokens, 4);
}

std::string write_file(const std::string &name, const std::vector<unsigned char> &bytes) {
  std::string path = fresh_dir("raw") + "/" + name;
  FILE *file = std::fopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr) << path;
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), file);
  std::fclose(file);
  return path;
}

std::vector<unsigned char> read_file(const std::string &path) {
  std::vector<unsigned char> bytes;
  FILE *file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return bytes;
  int c;
  while ((c = std::fgetc(file)) != EOF) bytes.push_back((unsigned char)c);
  std::fclose(file);
  return bytes;
}

std::vector<std::string> list_dir(const std::string &dir) {
  std::vector<std::string> names;
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent *entry = readdir(d)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

// An open shard, closed at the end of the scope.
struct Shard {
  mp_token_shard *shard = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Shard() { mp_token_shard_close(shard); }
  mp_status open(const std::string &path, int64_t vocab) {
    return mp_token_shard_open(path.c_str(), vocab, &shard, &err);
  }
  // Every id, or an empty vector (and err) when a read fails.
  std::vector<uint32_t> all() {
    std::vector<uint32_t> ids(mp_token_shard_count(shard));
    if (mp_token_shard_read(shard, 0, (int64_t)ids.size(), ids.data(), &err) != MP_OK) return {};
    return ids;
  }
};

std::vector<uint32_t> widen(const std::vector<uint16_t> &tokens) {
  return std::vector<uint32_t>(tokens.begin(), tokens.end());
}

TEST(TokenShard, WriteThenReadRoundTripsInLlmcLayout) {
  std::string dir = fresh_dir("round_trip");
  std::string path = dir + "/train_000.bin";
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 100000; ++i) tokens.push_back((uint16_t)((i * 7919) % 50257));
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), tokens.data(), (int64_t)tokens.size(), &err),
            MP_OK)
      << err.message;
  // Byte for byte what llm.c's dev/data scripts write.
  EXPECT_EQ(read_file(path), shard_bytes(20240520, 1, 100000, widen(tokens)));
  Shard r;
  ASSERT_EQ(r.open(path, 50257), MP_OK) << r.err.message;
  EXPECT_EQ(mp_token_shard_count(r.shard), 100000);
  EXPECT_EQ(mp_token_shard_id_bytes(r.shard), 2);
  EXPECT_EQ(mp_token_shard_magic(r.shard), 20240520);
  EXPECT_EQ(mp_token_shard_version(r.shard), 1);
  EXPECT_EQ(std::string(mp_token_shard_path(r.shard)), path);
  EXPECT_EQ(r.all(), widen(tokens));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"train_000.bin"});  // no temporary left
}

// The writer's width follows the vocabulary: uint16 up to 65,536 ids, uint32 (llm.c's "llama-3"
// format, magic 20240801 version 7) above; both read back through the same calls.
TEST(TokenShard, WriterChoosesTheWidthFromTheVocabulary) {
  EXPECT_EQ(mp_token_shard_id_bytes_for_vocab(50257), 2);
  EXPECT_EQ(mp_token_shard_id_bytes_for_vocab(65536), 2);
  EXPECT_EQ(mp_token_shard_id_bytes_for_vocab(65537), 4);
  EXPECT_EQ(mp_token_shard_id_bytes_for_vocab(MP_TOKEN_SHARD_U32_MAX_VOCAB), 4);
  std::string dir = fresh_dir("widths");
  struct Case {
    int64_t vocab;
    int width;
    int32_t magic, version;
  } cases[] = {{65536, 2, 20240520, 1}, {128256, 4, 20240801, 7},
               {MP_TOKEN_SHARD_U32_MAX_VOCAB, 4, 20240801, 7}};
  for (const Case &c : cases) {
    std::vector<uint32_t> ids;
    for (int64_t i = 0; i < 40000; ++i) ids.push_back((uint32_t)((i * 1000003) % c.vocab));
    ids.push_back((uint32_t)(c.vocab - 1));  // the largest id fits
    std::string path = dir + "/v" + std::to_string(c.vocab) + ".bin";
    mp_token_shard_writer *w = nullptr;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), c.vocab, &w, &err), MP_OK) << err.message;
    // In uneven appends, as a tokenizer hands over documents.
    size_t at = 0;
    for (size_t n : {1, 0, 999, 20000, 19001}) {
      ASSERT_EQ(mp_token_shard_writer_append(w, ids.data() + at, (int64_t)n, &err), MP_OK)
          << err.message;
      at += n;
      EXPECT_EQ(mp_token_shard_writer_count(w), (int64_t)at);
    }
    ASSERT_EQ(at, ids.size());
    ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
    EXPECT_EQ(read_file(path), shard_bytes(c.magic, c.version, (int32_t)ids.size(), ids, c.width))
        << c.vocab;
    Shard r;
    ASSERT_EQ(r.open(path, c.vocab), MP_OK) << r.err.message;
    EXPECT_EQ(mp_token_shard_id_bytes(r.shard), c.width);
    EXPECT_EQ(mp_token_shard_magic(r.shard), c.magic);
    EXPECT_EQ(mp_token_shard_version(r.shard), c.version);
    EXPECT_EQ(r.all(), ids) << c.vocab;
  }
  EXPECT_EQ(list_dir(dir).size(), 3u);  // no temporaries
}

// A uint32 shard written by llm.c's data_common.py (by hand here) reads exactly.
TEST(TokenShard, ReadsLlmcUint32Shards) {
  std::vector<uint32_t> ids = {128000, 0, 65535, 65536, 128255, 7};
  std::string path = write_file("llama3.bin", u32_shard_bytes(ids));
  Shard r;
  ASSERT_EQ(r.open(path, 128256), MP_OK) << r.err.message;
  EXPECT_EQ(r.all(), ids);
  // Any range, alone.
  std::vector<uint32_t> middle(3, 99);
  ASSERT_EQ(mp_token_shard_read(r.shard, 2, 3, middle.data(), &r.err), MP_OK) << r.err.message;
  EXPECT_EQ(middle, (std::vector<uint32_t>{65535, 65536, 128255}));
  ASSERT_EQ(mp_token_shard_read(r.shard, 6, 0, middle.data(), &r.err), MP_OK);
  EXPECT_EQ(mp_token_shard_read(r.shard, 4, 3, middle.data(), &r.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(r.err.message),
            path + ": tokens 4 .. 6 are not inside the shard's 6 tokens");
  EXPECT_EQ(mp_token_shard_read(r.shard, -1, 1, middle.data(), &r.err), MP_ERR_INPUT);
}

TEST(TokenShard, OverwritesAndKeepsEmptyShards) {
  std::string path = fresh_dir("overwrite") + "/s.bin";
  std::vector<uint16_t> first(5000, 3), second = {65535, 0, 1};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), first.data(), 5000, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), second.data(), 3, &err), MP_OK) << err.message;
  Shard r;
  ASSERT_EQ(r.open(path, MP_TOKEN_SHARD_MAX_VOCAB), MP_OK) << r.err.message;
  EXPECT_EQ(r.all(), widen(second));

  ASSERT_EQ(mp_token_shard_write(path.c_str(), nullptr, 0, &err), MP_OK) << err.message;
  Shard empty;
  ASSERT_EQ(empty.open(path, 10), MP_OK) << empty.err.message;
  EXPECT_EQ(mp_token_shard_count(empty.shard), 0);
  EXPECT_EQ(empty.all(), std::vector<uint32_t>{});
  // An empty uint32 shard too.
  mp_token_shard_writer *w = nullptr;
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 100000, &w, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
  EXPECT_EQ(read_file(path), u32_shard_bytes({}));
}

// The target keeps its old contents until close renames the new shard over it; an abort, or a
// writer that never closes, leaves it as it was and no temporary behind.
TEST(TokenShardWriter, TheTargetChangesOnlyAtClose) {
  std::string dir = fresh_dir("atomic");
  std::string path = dir + "/train.bin";
  std::vector<uint16_t> old_tokens = {1, 2, 3};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), old_tokens.data(), 3, &err), MP_OK);
  const std::vector<unsigned char> old_bytes = read_file(path);

  std::vector<uint32_t> ids(5000, 70000);
  mp_token_shard_writer *w = nullptr;
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 128256, &w, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_append(w, ids.data(), 5000, &err), MP_OK) << err.message;
  EXPECT_EQ(read_file(path), old_bytes);
  std::vector<std::string> names = list_dir(dir);
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], "train.bin");
  EXPECT_EQ(names[1], "train.bin.tmp-" + std::to_string(getpid()));
  mp_token_shard_writer_abort(w);
  EXPECT_EQ(read_file(path), old_bytes);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"train.bin"});

  // Abort with no earlier file leaves no file at all.
  std::string fresh = dir + "/fresh.bin";
  ASSERT_EQ(mp_token_shard_writer_open(fresh.c_str(), 50257, &w, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_append(w, ids.data(), 10, &err), MP_ERR_INPUT);
  mp_token_shard_writer_abort(w);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"train.bin"});
  mp_token_shard_writer_abort(nullptr);

  // Close replaces it whole.
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 128256, &w, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_append(w, ids.data(), 5000, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
  EXPECT_EQ(read_file(path), u32_shard_bytes(ids));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"train.bin"});
}

TEST(TokenShardWriter, RefusesIdsOutsideTheVocabularyAndTooManyTokens) {
  std::string dir = fresh_dir("writer_refusals");
  std::string path = dir + "/s.bin";
  mp_token_shard_writer *w = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 128256, &w, &err), MP_OK) << err.message;
  std::vector<uint32_t> good = {5, 128255}, bad = {1, 2, 128256, 3};
  ASSERT_EQ(mp_token_shard_writer_append(w, good.data(), 2, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_token_shard_writer_append(w, bad.data(), 4, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": token id 128256 (index 2 of this append, token 4 of the shard) is outside "
                   "the vocabulary of 128256 ids (0 .. 128255)");
  EXPECT_EQ(mp_token_shard_writer_count(w), 2);  // nothing of the refused append
  // More than an int32 count can say is refused before any id is read.
  EXPECT_EQ(mp_token_shard_writer_append(w, good.data(), (int64_t)1 << 31, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": appending 2147483648 tokens to the 2 written would pass the 2147483647 a "
                   "shard holds (its header stores the count as an int32); start another shard");
  EXPECT_EQ(mp_token_shard_writer_append(w, good.data(), -1, &err), MP_ERR_INPUT);
  // The shard so far is still whole.
  ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
  EXPECT_EQ(read_file(path), u32_shard_bytes(good));
  // A uint16 writer refuses 65536 and above.
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 65536, &w, &err), MP_OK) << err.message;
  std::vector<uint32_t> wide = {65536};
  EXPECT_EQ(mp_token_shard_writer_append(w, wide.data(), 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": token id 65536 (index 0 of this append, token 0 of the shard) is outside "
                   "the vocabulary of 65536 ids (0 .. 65535)");
  mp_token_shard_writer_abort(w);
}

TEST(TokenShardWriter, RefusesBadVocabulariesDirectoriesAndMissingDirectories) {
  mp_token_shard_writer *w = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_token_shard_writer_open("x.bin", 0, &w, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "x.bin: vocabulary size 0 is outside 1 .. 4294967296, the ids a token shard can hold "
            "(uint32)");
  EXPECT_EQ(mp_token_shard_writer_open("x.bin", MP_TOKEN_SHARD_U32_MAX_VOCAB + 1, &w, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(w, nullptr);
  std::string dir = fresh_dir("writer_is_dir");
  EXPECT_EQ(mp_token_shard_writer_open(dir.c_str(), 100, &w, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            dir + ": is a directory; name a file to write the shard to");
  std::string missing = temp_dir() + "/no_such_dir/out.bin";
  EXPECT_EQ(mp_token_shard_writer_open(missing.c_str(), 100, &w, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), missing + ": cannot create: No such file or directory");
  EXPECT_EQ(w, nullptr);
}

void expect_open_error(const std::string &path, int64_t vocab, const std::string &message) {
  Shard r;
  EXPECT_EQ(r.open(path, vocab), MP_ERR_INPUT);
  EXPECT_EQ(r.err.status, MP_ERR_INPUT);
  EXPECT_EQ(std::string(r.err.message), message);
  EXPECT_EQ(r.shard, nullptr);
}

TEST(TokenShardBadFile, CannotOpen) {
  std::string path = temp_dir() + "/no_such_shard.bin";
  expect_open_error(path, 100, path + ": cannot open: No such file or directory");
}

TEST(TokenShardBadFile, ShorterThanHeader) {
  std::string path = write_file("short.bin", std::vector<unsigned char>(100, 0));
  expect_open_error(
      path, 100, path + ": 100 bytes, shorter than the 1024-byte header of an llm.c token shard");
  path = write_file("empty.bin", {});
  expect_open_error(path, 100,
                    path + ": 0 bytes, shorter than the 1024-byte header of an llm.c token shard");
}

TEST(TokenShardBadFile, BadMagic) {
  std::string path = write_file("magic.bin", shard_bytes(12345, 1, 2, {1, 2}));
  expect_open_error(path, 100,
                    path + ": bad magic number 12345 in the header (expected 20240520 for uint16 "
                           "ids or 20240801 for uint32 ids): not an llm.c token shard");
  path = write_file("model.bin", shard_bytes(20240326, 3, 2, {1, 2}));
  expect_open_error(path, 100,
                    path + ": bad magic number 20240326 in the header (expected 20240520 for "
                           "uint16 ids or 20240801 for uint32 ids): not an llm.c token shard; "
                           "20240326 marks an llm.c GPT-2 checkpoint (use it with --init-from)");
}

TEST(TokenShardBadFile, WrongVersion) {
  std::string path = write_file("version.bin", shard_bytes(20240520, 2, 2, {1, 2}));
  expect_open_error(path, 100,
                    path + ": token shard version 2, expected 1 with magic 20240520 (llm.c's "
                           "shards of uint16 tokens); write the shard again with llm.c's dev/data "
                           "scripts or `mpengine data tokenize`");
  // Each magic has its own version: 7 is the uint32 format's, not the uint16 one's.
  path = write_file("version7.bin", shard_bytes(20240520, 7, 2, {1, 2}));
  expect_open_error(path, 100,
                    path + ": token shard version 7, expected 1 with magic 20240520 (llm.c's "
                           "shards of uint16 tokens); write the shard again with llm.c's dev/data "
                           "scripts or `mpengine data tokenize`");
  path = write_file("version1_u32.bin", shard_bytes(20240801, 1, 2, {1, 2}, 4));
  expect_open_error(path, 100,
                    path + ": token shard version 1, expected 7 with magic 20240801 (llm.c's "
                           "shards of uint32 tokens); write the shard again with llm.c's dev/data "
                           "scripts or `mpengine data tokenize`");
}

TEST(TokenShardBadFile, CountDisagreesWithSize) {
  std::string path = write_file("truncated.bin", shard_bytes(20240520, 1, 10, {1, 2, 3, 4}));
  expect_open_error(path, 100,
                    path + ": the header says 10 tokens, which take 1024 + 2 x 10 = 1044 bytes, "
                           "but the file is 1032 bytes (12 short); the shard is truncated: copy "
                           "or write it again");
  path = write_file("truncated_u32.bin", shard_bytes(20240801, 7, 1000, {1, 2, 3}, 4));
  expect_open_error(path, 100,
                    path + ": the header says 1000 tokens, which take 1024 + 4 x 1000 = 5024 "
                           "bytes, but the file is 1036 bytes (3988 short); the shard is "
                           "truncated: copy or write it again");
  std::vector<unsigned char> odd = shard_bytes(20240520, 1, 2, {1, 2});
  odd.push_back(7);  // half a token too many
  path = write_file("odd.bin", odd);
  expect_open_error(path, 100,
                    path + ": the header says 2 tokens, which take 1024 + 2 x 2 = 1028 bytes, "
                           "but the file is 1029 bytes (1 too many); the shard is corrupt");
  // A uint16 shard's bytes under the uint32 magic: twice too short for its count.
  path = write_file("u16_as_u32.bin", shard_bytes(20240801, 7, 4, {1, 2, 3, 4}, 2));
  expect_open_error(path, 100,
                    path + ": the header says 4 tokens, which take 1024 + 4 x 4 = 1040 bytes, "
                           "but the file is 1032 bytes (8 short); the shard is truncated: copy or "
                           "write it again");
  path = write_file("negative.bin", shard_bytes(20240520, 1, -5, {}));
  expect_open_error(path, 100,
                    path + ": the header's token count -5 is negative; the shard is corrupt");
}

// An id is checked when its range is read: the shard opens, ranges without it read, and the
// range with it names the file, the token's index and byte offset, the id and the vocabulary.
TEST(TokenShardBadFile, TokenOutsideVocabulary) {
  std::vector<uint32_t> tokens(300000, 5);
  tokens[299999] = 50257;  // past the reader's first 2^18-id piece: the index is the shard's
  std::string path = write_file("vocab.bin", shard_bytes(20240520, 1, 300000, tokens));
  Shard r;
  ASSERT_EQ(r.open(path, 50257), MP_OK) << r.err.message;
  std::vector<uint32_t> ids(300000);
  EXPECT_EQ(mp_token_shard_read(r.shard, 0, 299999, ids.data(), &r.err), MP_OK);
  EXPECT_EQ(mp_token_shard_read(r.shard, 0, 300000, ids.data(), &r.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(r.err.message),
            path + ": token id 50257 at token 299999 (byte offset 601022) is outside the "
                   "vocabulary of 50257 ids (0 .. 50256); the shard was made with another "
                   "tokenizer, or the model's vocab_size is too small");
  Shard ok;
  ASSERT_EQ(ok.open(path, 50258), MP_OK) << ok.err.message;
  EXPECT_EQ(ok.all().size(), 300000u);

  std::vector<uint32_t> wide = {1, 128256, 2};
  path = write_file("vocab_u32.bin", u32_shard_bytes(wide));
  Shard u32;
  ASSERT_EQ(u32.open(path, 128256), MP_OK) << u32.err.message;
  EXPECT_EQ(mp_token_shard_read(u32.shard, 1, 2, ids.data(), &u32.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(u32.err.message),
            path + ": token id 128256 at token 1 (byte offset 1028) is outside the vocabulary "
                   "of 128256 ids (0 .. 128255); the shard was made with another tokenizer, or "
                   "the model's vocab_size is too small");
}

TEST(TokenShardBadFile, DirectoryAndVocabularyOutOfRange) {
  std::string dir = fresh_dir("a_directory");
  expect_open_error(dir, 100, dir + ": is a directory, not a token shard");
  std::string path = write_file("fine.bin", shard_bytes(20240520, 1, 1, {1}));
  expect_open_error(path, 0,
                    path + ": vocabulary size 0 is outside 1 .. 4294967296, the ids a token "
                           "shard can hold (uint32)");
  Shard large;
  EXPECT_EQ(large.open(path, 70000), MP_OK) << large.err.message;  // a uint16 shard, a big model
}

// Resident memory: reading a whole shard range by range leaves the process no larger than its
// buffers, because read pages are released (they stay in the page cache).
long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

TEST(TokenShard, ReadingAShardDoesNotKeepItResident) {
  std::string path = fresh_dir("resident") + "/big.bin";
  const int64_t count = (int64_t)16 << 20;  // 64 MiB of uint32 ids
  mp_token_shard_writer *w = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_writer_open(path.c_str(), 1 << 20, &w, &err), MP_OK) << err.message;
  std::vector<uint32_t> piece(1 << 20);
  for (int64_t at = 0; at < count; at += (int64_t)piece.size()) {
    for (size_t i = 0; i < piece.size(); ++i) piece[i] = (uint32_t)((at + i) % (1 << 20));
    ASSERT_EQ(mp_token_shard_writer_append(w, piece.data(), (int64_t)piece.size(), &err), MP_OK);
  }
  ASSERT_EQ(mp_token_shard_writer_close(w, &err), MP_OK) << err.message;
  Shard r;
  ASSERT_EQ(r.open(path, 1 << 20), MP_OK) << r.err.message;
  const long before = resident_kib();
  for (int64_t at = 0; at < count; at += (int64_t)piece.size()) {
    ASSERT_EQ(mp_token_shard_read(r.shard, at, (int64_t)piece.size(), piece.data(), &r.err),
              MP_OK);
    ASSERT_EQ(piece[5], (uint32_t)((at + 5) % (1 << 20)));
  }
  const long after = resident_kib();
  ASSERT_GT(before, 0);
  EXPECT_LT(after - before, 8 * 1024) << "KiB resident after reading 64 MiB";
}

TEST(TokenShardWrite, RefusesMissingDirectoryDirectoryTargetAndHugeCounts) {
  std::string path = temp_dir() + "/no_such_dir/out.bin";
  uint16_t token = 1;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_token_shard_write(path.c_str(), &token, 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), path + ": cannot create: No such file or directory");
  std::string dir = fresh_dir("target_is_dir");
  EXPECT_EQ(mp_token_shard_write(dir.c_str(), &token, 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            dir + ": is a directory; name a file to write the shard to");
  EXPECT_EQ(mp_token_shard_write("x.bin", &token, (int64_t)1 << 31, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "x.bin: cannot write 2147483648 tokens; a token shard holds 0 .. 2147483647 (its "
            "header stores the count as an int32)");
}

}  // namespace
