// tests/engine/token_shard_test.cc — llm.c token shards: a written shard reads back bit for bit
// in llm.c's byte layout, and each way a file can be wrong gets its exact message naming the file.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// A shard's bytes: the header (magic, version, count) then the tokens, little-endian.
std::vector<unsigned char> shard_bytes(int32_t magic, int32_t version, int32_t count,
                                       const std::vector<uint16_t> &tokens) {
  std::vector<unsigned char> bytes(1024 + 2 * tokens.size(), 0);
  put_int32(&bytes, 0, magic);
  put_int32(&bytes, 4, version);
  put_int32(&bytes, 8, count);
  for (size_t i = 0; i < tokens.size(); ++i) {
    bytes[1024 + 2 * i] = (unsigned char)(tokens[i] & 0xff);
    bytes[1024 + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
  }
  return bytes;
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

struct Read {
  uint16_t *tokens = nullptr;
  int64_t count = -1;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Read() { std::free(tokens); }
  mp_status from(const std::string &path, int64_t vocab) {
    return mp_token_shard_read(path.c_str(), vocab, &tokens, &count, &err);
  }
};

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
  EXPECT_EQ(read_file(path), shard_bytes(20240520, 1, 100000, tokens));
  Read r;
  ASSERT_EQ(r.from(path, 50257), MP_OK) << r.err.message;
  ASSERT_EQ(r.count, 100000);
  EXPECT_EQ(std::vector<uint16_t>(r.tokens, r.tokens + r.count), tokens);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"train_000.bin"});  // no temporary left
}

TEST(TokenShard, OverwritesAndKeepsEmptyShards) {
  std::string path = fresh_dir("overwrite") + "/s.bin";
  std::vector<uint16_t> first(5000, 3), second = {65535, 0, 1};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), first.data(), 5000, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_token_shard_write(path.c_str(), second.data(), 3, &err), MP_OK) << err.message;
  Read r;
  ASSERT_EQ(r.from(path, MP_TOKEN_SHARD_MAX_VOCAB), MP_OK) << r.err.message;
  EXPECT_EQ(std::vector<uint16_t>(r.tokens, r.tokens + r.count), second);

  ASSERT_EQ(mp_token_shard_write(path.c_str(), nullptr, 0, &err), MP_OK) << err.message;
  Read empty;
  ASSERT_EQ(empty.from(path, 10), MP_OK) << empty.err.message;
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.tokens, nullptr);
}

void expect_read_error(const std::string &path, int64_t vocab, const std::string &message) {
  Read r;
  EXPECT_EQ(r.from(path, vocab), MP_ERR_INPUT);
  EXPECT_EQ(r.err.status, MP_ERR_INPUT);
  EXPECT_EQ(std::string(r.err.message), message);
  EXPECT_EQ(r.tokens, nullptr);
  EXPECT_EQ(r.count, 0);
}

TEST(TokenShardBadFile, CannotOpen) {
  std::string path = temp_dir() + "/no_such_shard.bin";
  expect_read_error(path, 100, path + ": cannot open: No such file or directory");
}

TEST(TokenShardBadFile, ShorterThanHeader) {
  std::string path = write_file("short.bin", std::vector<unsigned char>(100, 0));
  expect_read_error(
      path, 100, path + ": 100 bytes, shorter than the 1024-byte header of an llm.c token shard");
  path = write_file("empty.bin", {});
  expect_read_error(path, 100,
                    path + ": 0 bytes, shorter than the 1024-byte header of an llm.c token shard");
}

TEST(TokenShardBadFile, BadMagic) {
  std::string path = write_file("magic.bin", shard_bytes(12345, 1, 2, {1, 2}));
  expect_read_error(path, 100,
                    path + ": bad magic number 12345 in the header (expected 20240520): not an "
                           "llm.c token shard");
  path = write_file("model.bin", shard_bytes(20240326, 3, 2, {1, 2}));
  expect_read_error(path, 100,
                    path + ": bad magic number 20240326 in the header (expected 20240520): not an "
                           "llm.c token shard; 20240326 marks an llm.c GPT-2 checkpoint (use it "
                           "with --init-from)");
}

TEST(TokenShardBadFile, WrongVersion) {
  std::string path = write_file("version.bin", shard_bytes(20240520, 2, 2, {1, 2}));
  expect_read_error(path, 100,
                    path + ": token shard version 2, expected 1 (llm.c's shards of uint16 "
                           "tokens); write the shard again with llm.c's dev/data scripts or "
                           "`mpengine data synth`");
}

TEST(TokenShardBadFile, CountDisagreesWithSize) {
  std::string path = write_file("truncated.bin", shard_bytes(20240520, 1, 10, {1, 2, 3, 4}));
  expect_read_error(path, 100,
                    path + ": the header says 10 tokens, which take 1024 + 2 x 10 = 1044 bytes, "
                           "but the file is 1032 bytes; the shard is truncated or corrupt");
  std::vector<unsigned char> odd = shard_bytes(20240520, 1, 2, {1, 2});
  odd.push_back(7);  // half a token too many
  path = write_file("odd.bin", odd);
  expect_read_error(path, 100,
                    path + ": the header says 2 tokens, which take 1024 + 2 x 2 = 1028 bytes, "
                           "but the file is 1029 bytes; the shard is truncated or corrupt");
  path = write_file("negative.bin", shard_bytes(20240520, 1, -5, {}));
  expect_read_error(path, 100,
                    path + ": the header's token count -5 is negative; the shard is corrupt");
}

TEST(TokenShardBadFile, TokenOutsideVocabulary) {
  std::vector<uint16_t> tokens(70000, 5);
  tokens[69999] = 50257;  // in the second read chunk: the position is the global one
  std::string path = write_file("vocab.bin", shard_bytes(20240520, 1, 70000, tokens));
  expect_read_error(path, 50257,
                    path + ": token id 50257 at position 69999 is outside the vocabulary of 50257 "
                           "ids (0 .. 50256); the shard was made with another tokenizer, or the "
                           "model's vocab_size is too small");
  Read ok;
  EXPECT_EQ(ok.from(path, 50258), MP_OK) << ok.err.message;
}

TEST(TokenShardBadFile, DirectoryAndVocabularyOutOfRange) {
  std::string dir = fresh_dir("a_directory");
  expect_read_error(dir, 100, dir + ": is a directory, not a token shard");
  std::string path = write_file("fine.bin", shard_bytes(20240520, 1, 1, {1}));
  expect_read_error(path, 70000,
                    path + ": vocabulary size 70000 is outside 1 .. 65536, the ids a uint16 token "
                           "shard can hold");
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
