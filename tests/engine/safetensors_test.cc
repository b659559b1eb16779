// tests/engine/safetensors_test.cc — safetensors files against the reference implementation.
//
// The goldens in tests/engine/testdata/safetensors/ come from Hugging Face's safetensors 0.4.5
// with torch (tools/bench/safetensors_golden.py, which says what each holds): the reader must
// give back their numbers under their names, and the writer, given the same tensors as fp32, must
// write those very bytes (header order, escaping, padding, bf16 and fp16 rounding). Every way a
// hostile file or index is refused is checked with its whole message.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/weights/safetensors.h"

namespace {

const std::string kTestdata = "tests/engine/testdata/safetensors/";

std::string temp_dir() {
  const char *dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string fresh_dir(const std::string &name) {
  std::string dir = temp_dir() + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::vector<unsigned char> read_bytes(const std::string &path) {
  std::vector<unsigned char> bytes;
  FILE *file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return bytes;
  for (int c; (c = std::fgetc(file)) != EOF;) bytes.push_back((unsigned char)c);
  std::fclose(file);
  return bytes;
}

void write_bytes(const std::string &path, const std::vector<unsigned char> &bytes) {
  FILE *file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), file);
  std::fclose(file);
}

void write_text(const std::string &path, const std::string &text) {
  write_bytes(path, std::vector<unsigned char>(text.begin(), text.end()));
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

// The golden script's value(): element j of its k-th tensor, exact in fp32, bf16 and fp16.
float golden_value(int k, int64_t j) { return (float)(((k * 37 + j * 11) % 509) - 254) / 8.0f; }

// safetensors_golden.py's MIXED, in its order (k is the position).
struct GoldenTensor {
  const char *name;
  mp_safetensors_dtype dtype;
  std::vector<int64_t> shape;
};
const std::vector<GoldenTensor> kMixed = {
    {"model.embed_tokens.weight", MP_SAFETENSORS_F32, {8, 6}},
    {"model.layers.0.mlp.down_proj.weight", MP_SAFETENSORS_BF16, {6, 10}},
    {"model.layers.0.self_attn.q_proj.bias", MP_SAFETENSORS_F16, {10}},
    {"model.norm.weight", MP_SAFETENSORS_F32, {6}},
    {"lm_head.weight", MP_SAFETENSORS_BF16, {8, 6}},
    {"scale", MP_SAFETENSORS_F32, {}},
    {"empty", MP_SAFETENSORS_F32, {0, 6}},
};
// safetensors_golden.py's SHARDED (bf16, values golden_value(100 + k, j)), and the first index
// that goes to the second shard.
const std::vector<GoldenTensor> kSharded = {
    {"model.embed_tokens.weight", MP_SAFETENSORS_BF16, {8, 4}},
    {"model.layers.0.input_layernorm.weight", MP_SAFETENSORS_BF16, {4}},
    {"model.layers.0.mlp.down_proj.weight", MP_SAFETENSORS_BF16, {4, 6}},
    {"model.layers.0.mlp.gate_proj.weight", MP_SAFETENSORS_BF16, {6, 4}},
    {"model.layers.0.self_attn.q_proj.weight", MP_SAFETENSORS_BF16, {4, 4}},
    {"model.layers.1.input_layernorm.weight", MP_SAFETENSORS_BF16, {4}},
    {"model.layers.1.mlp.down_proj.weight", MP_SAFETENSORS_BF16, {4, 6}},
    {"model.layers.1.mlp.gate_proj.weight", MP_SAFETENSORS_BF16, {6, 4}},
    {"model.layers.1.self_attn.q_proj.weight", MP_SAFETENSORS_BF16, {4, 4}},
    {"model.norm.weight", MP_SAFETENSORS_BF16, {4}},
    {"lm_head.weight", MP_SAFETENSORS_BF16, {8, 4}},
};
const int kFirstOfShard2 = 5;

int64_t count_of(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// An open checkpoint that closes itself.
struct Open {
  mp_safetensors *st = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Open() { mp_safetensors_close(st); }
  mp_status file(const std::string &path) {
    return mp_safetensors_open_file(path.c_str(), &st, &err);
  }
  mp_status index(const std::string &path) {
    return mp_safetensors_open_index(path.c_str(), &st, &err);
  }
  mp_status dir(const std::string &path) {
    return mp_safetensors_open_dir(path.c_str(), &st, &err);
  }
};

std::vector<float> read_all(const mp_safetensors *st, const char *name) {
  const mp_safetensors_tensor *t = mp_safetensors_find(st, name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> values((size_t)t->num_elements, -999.0f);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_safetensors_read_elements(st, name, 0, t->num_elements, values.data(), &err), MP_OK)
      << err.message;
  return values;
}

// ------------------------------------------------------------------------------------------
// Reading the reference's files
// ------------------------------------------------------------------------------------------

TEST(SafetensorsRead, MixedGoldenGivesItsTensorsAndMetadata) {
  Open o;
  const std::string path = kTestdata + "mixed.safetensors";
  ASSERT_EQ(o.file(path), MP_OK) << o.err.message;
  EXPECT_STREQ(mp_safetensors_source(o.st), path.c_str());
  ASSERT_EQ(mp_safetensors_num_tensors(o.st), (int)kMixed.size());
  // Sorted by name.
  for (int i = 1; i < mp_safetensors_num_tensors(o.st); ++i) {
    EXPECT_LT(std::strcmp(mp_safetensors_tensor_at(o.st, i - 1)->name,
                          mp_safetensors_tensor_at(o.st, i)->name),
              0);
  }
  ASSERT_EQ(mp_safetensors_num_files(o.st), 1);
  EXPECT_STREQ(mp_safetensors_file_path(o.st, 0), path.c_str());
  ASSERT_EQ(mp_safetensors_num_metadata(o.st, 0), 1);
  const char *key = nullptr, *value = nullptr;
  mp_safetensors_metadata_at(o.st, 0, 0, &key, &value);
  EXPECT_STREQ(key, "format");
  EXPECT_STREQ(value, "pt");
  EXPECT_STREQ(mp_safetensors_metadata_get(o.st, 0, "format"), "pt");
  EXPECT_EQ(mp_safetensors_metadata_get(o.st, 0, "other"), nullptr);
  for (size_t k = 0; k < kMixed.size(); ++k) {
    const mp_safetensors_tensor *t = mp_safetensors_find(o.st, kMixed[k].name);
    ASSERT_NE(t, nullptr) << kMixed[k].name;
    EXPECT_EQ(t->dtype, kMixed[k].dtype) << t->name;
    EXPECT_EQ(std::vector<int64_t>(t->shape, t->shape + t->rank), kMixed[k].shape) << t->name;
    EXPECT_EQ(t->num_elements, count_of(kMixed[k].shape));
    EXPECT_EQ(t->num_bytes, t->num_elements * mp_safetensors_dtype_bytes(t->dtype));
    EXPECT_STREQ(t->file, path.c_str());
    EXPECT_EQ(t->file_index, 0);
    const std::vector<float> values = read_all(o.st, kMixed[k].name);
    for (int64_t j = 0; j < t->num_elements; ++j) {
      ASSERT_EQ(values[(size_t)j], golden_value((int)k, j)) << t->name << "[" << j << "]";
    }
  }
  EXPECT_EQ(mp_safetensors_find(o.st, "model.norm"), nullptr);
  EXPECT_EQ(mp_safetensors_tensor_at(o.st, 7), nullptr);
}

// Rows, row-major blocks and transposed blocks of an F32 and a BF16 matrix, and element ranges
// of any tensor, are the golden numbers at those positions.
TEST(SafetensorsRead, RowsBlocksAndRangesAreTheirSlices) {
  Open o;
  ASSERT_EQ(o.file(kTestdata + "mixed.safetensors"), MP_OK) << o.err.message;
  mp_error err = MP_ERROR_INITIALIZER;
  for (int k : {0, 1, 4}) {
    const GoldenTensor &g = kMixed[(size_t)k];
    const int64_t rows = g.shape[0], cols = g.shape[1];
    std::vector<float> out((size_t)(rows * cols), -999.0f);
    ASSERT_EQ(mp_safetensors_read_rows(o.st, g.name, 2, 5, out.data(), &err), MP_OK) << err.message;
    for (int64_t r = 2; r < 5; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(out[(size_t)((r - 2) * cols + c)], golden_value(k, r * cols + c)) << g.name;
      }
    }
    const int64_t r0 = 1, r1 = 5, c0 = 2, c1 = cols - 1;
    ASSERT_EQ(mp_safetensors_read_block(o.st, g.name, r0, r1, c0, c1, MP_SAFETENSORS_ROW_MAJOR,
                                        out.data(), &err),
              MP_OK)
        << err.message;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        ASSERT_EQ(out[(size_t)((r - r0) * (c1 - c0) + c - c0)], golden_value(k, r * cols + c))
            << g.name << " (" << r << ", " << c << ")";
      }
    }
    ASSERT_EQ(mp_safetensors_read_block(o.st, g.name, r0, r1, c0, c1, MP_SAFETENSORS_TRANSPOSED,
                                        out.data(), &err),
              MP_OK)
        << err.message;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        ASSERT_EQ(out[(size_t)((c - c0) * (r1 - r0) + r - r0)], golden_value(k, r * cols + c))
            << g.name << " transposed (" << r << ", " << c << ")";
      }
    }
  }
  std::vector<float> out(10, -999.0f);
  ASSERT_EQ(mp_safetensors_read_elements(o.st, "model.layers.0.self_attn.q_proj.bias", 3, 9,
                                         out.data(), &err),
            MP_OK)
      << err.message;
  for (int j = 3; j < 9; ++j) EXPECT_EQ(out[(size_t)(j - 3)], golden_value(2, j));
  // A rank-1 tensor is a column; an empty block or range reads nothing.
  ASSERT_EQ(mp_safetensors_read_block(o.st, "model.norm.weight", 1, 4, 0, 1,
                                      MP_SAFETENSORS_ROW_MAJOR, out.data(), &err),
            MP_OK);
  for (int j = 1; j < 4; ++j) EXPECT_EQ(out[(size_t)(j - 1)], golden_value(3, j));
  ASSERT_EQ(mp_safetensors_read_rows(o.st, "empty", 0, 0, out.data(), &err), MP_OK);
  ASSERT_EQ(mp_safetensors_read_elements(o.st, "scale", 0, 1, out.data(), &err), MP_OK);
  EXPECT_EQ(out[0], golden_value(5, 0));
}

// The reader's bf16 and fp16 decoding, against an independent decode of the raw bits (the 1024
// values of rounding.safetensors: zeros, infinities, subnormals, random bits over the range).
TEST(SafetensorsRead, Bf16AndFp16DecodeExactly) {
  Open o;
  const std::string path = kTestdata + "rounding.safetensors";
  ASSERT_EQ(o.file(path), MP_OK) << o.err.message;
  EXPECT_EQ(mp_safetensors_num_metadata(o.st, 0), 0);
  const std::vector<unsigned char> bytes = read_bytes(path);
  for (const char *name : {"source_bf16", "source_f16"}) {
    const mp_safetensors_tensor *t = mp_safetensors_find(o.st, name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->num_elements, 1024);
    const std::vector<float> values = read_all(o.st, name);
    for (int64_t j = 0; j < t->num_elements; ++j) {
      const size_t at = (size_t)(t->file_offset + 2 * j);
      const uint32_t h = bytes[at] | bytes[at + 1] << 8;
      float expected;
      if (t->dtype == MP_SAFETENSORS_BF16) {
        const uint32_t bits = h << 16;
        std::memcpy(&expected, &bits, 4);
      } else {
        const int exponent = (int)((h >> 10) & 31), mantissa = (int)(h & 1023);
        const double sign = (h & 0x8000) ? -1.0 : 1.0;
        expected = exponent == 0    ? (float)(sign * std::ldexp(mantissa, -24))
                   : exponent == 31 ? (float)(sign * INFINITY)
                                    : (float)(sign * std::ldexp(1024 + mantissa, exponent - 25));
      }
      ASSERT_EQ(std::memcmp(&values[(size_t)j], &expected, 4), 0)
          << name << "[" << j << "] = " << values[(size_t)j] << ", expected " << expected;
    }
  }
}

// Blocks whose rows are far apart (read row by row) and rows wider than the staging buffer
// (read in pieces), in a file the writer made, are still exactly their slice.
TEST(SafetensorsRead, WideRowsAreReadPartByPart) {
  const std::string path = fresh_dir("wide") + "/wide.safetensors";
  const int64_t narrow_rows = 64, narrow_cols = 3000;  // 12 KB rows: a gap of more than a page
  const int64_t wide_rows = 3, wide_cols = 300000;     // 1.2 MB rows: wider than the staging
  const int64_t narrow_shape[2] = {narrow_rows, narrow_cols},
                wide_shape[2] = {wide_rows, wide_cols};
  const mp_safetensors_tensor_spec specs[2] = {{"narrow", MP_SAFETENSORS_F32, 2, narrow_shape},
                                               {"wide", MP_SAFETENSORS_BF16, 2, wide_shape}};
  auto value = [](int64_t j) { return (float)((j * 7) % 251) - 125.0f; };  // exact in bf16
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), specs, 2, nullptr, 0, &writer, &err), MP_OK)
      << err.message;
  for (const auto &[name, n] : std::vector<std::pair<const char *, int64_t>>{
           {"narrow", narrow_rows * narrow_cols}, {"wide", wide_rows * wide_cols}}) {
    std::vector<float> values((size_t)n);
    for (int64_t j = 0; j < n; ++j) values[(size_t)j] = value(j);
    ASSERT_EQ(mp_safetensors_writer_append(writer, name, values.data(), n, &err), MP_OK)
        << err.message;
  }
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK) << err.message;
  Open o;
  ASSERT_EQ(o.file(path), MP_OK) << o.err.message;
  struct Case {
    const char *name;
    int64_t cols, r0, r1, c0, c1;
  };
  for (const Case &c :
       {Case{"narrow", narrow_cols, 3, 60, 10, 26}, Case{"narrow", narrow_cols, 0, 64, 0, 3000},
        Case{"wide", wide_cols, 0, 3, 1000, 290000}, Case{"wide", wide_cols, 1, 3, 0, 300000}}) {
    for (mp_safetensors_block_layout layout :
         {MP_SAFETENSORS_ROW_MAJOR, MP_SAFETENSORS_TRANSPOSED}) {
      const int64_t rows = c.r1 - c.r0, width = c.c1 - c.c0;
      std::vector<float> out((size_t)(rows * width), -999.0f);
      ASSERT_EQ(
          mp_safetensors_read_block(o.st, c.name, c.r0, c.r1, c.c0, c.c1, layout, out.data(), &err),
          MP_OK)
          << err.message;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t col = 0; col < width; ++col) {
          const size_t at =
              (size_t)(layout == MP_SAFETENSORS_ROW_MAJOR ? r * width + col : col * rows + r);
          ASSERT_EQ(out[at], value((c.r0 + r) * c.cols + c.c0 + col))
              << c.name << " block (" << r << ", " << col << ") layout " << layout;
        }
      }
    }
  }
  std::vector<float> row((size_t)(2 * wide_cols));
  ASSERT_EQ(mp_safetensors_read_rows(o.st, "wide", 1, 3, row.data(), &err), MP_OK) << err.message;
  for (int64_t j = 0; j < 2 * wide_cols; ++j) ASSERT_EQ(row[(size_t)j], value(wide_cols + j));
}

TEST(SafetensorsRead, ShardedGoldenThroughIndexAndDirectory) {
  const std::string dir = kTestdata + "sharded";
  for (bool through_dir : {false, true}) {
    Open o;
    ASSERT_EQ(through_dir ? o.dir(dir) : o.index(dir + "/model.safetensors.index.json"), MP_OK)
        << o.err.message;
    EXPECT_EQ(std::string(mp_safetensors_source(o.st)), dir + "/model.safetensors.index.json");
    ASSERT_EQ(mp_safetensors_num_files(o.st), 2);
    const std::string shard1 = dir + "/model-00001-of-00002.safetensors";
    const std::string shard2 = dir + "/model-00002-of-00002.safetensors";
    EXPECT_EQ(mp_safetensors_file_path(o.st, 0), shard1);
    EXPECT_EQ(mp_safetensors_file_path(o.st, 1), shard2);
    EXPECT_STREQ(mp_safetensors_metadata_get(o.st, 1, "format"), "pt");
    ASSERT_EQ(mp_safetensors_num_tensors(o.st), (int)kSharded.size());
    for (size_t k = 0; k < kSharded.size(); ++k) {
      const mp_safetensors_tensor *t = nullptr;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(
          mp_safetensors_expect(o.st, kSharded[k].name, MP_SAFETENSORS_FLOAT_DTYPES,
                                (int)kSharded[k].shape.size(), kSharded[k].shape.data(), &t, &err),
          MP_OK)
          << err.message;
      EXPECT_EQ(t->file, (int)k < kFirstOfShard2 ? shard1 : shard2) << t->name;
      EXPECT_EQ(t->file_index, (int)k < kFirstOfShard2 ? 0 : 1);
      const std::vector<float> values = read_all(o.st, t->name);
      for (int64_t j = 0; j < t->num_elements; ++j) {
        ASSERT_EQ(values[(size_t)j], golden_value(100 + (int)k, j)) << t->name;
      }
    }
  }
}

TEST(SafetensorsRead, DirectoryPrefersModelSafetensorsAsTransformersDoes) {
  const std::string dir = fresh_dir("both");
  write_bytes(dir + "/model.safetensors", read_bytes(kTestdata + "mixed.safetensors"));
  write_text(dir + "/model.safetensors.index.json", "not even JSON");
  Open o;
  ASSERT_EQ(o.dir(dir), MP_OK) << o.err.message;
  EXPECT_EQ(std::string(mp_safetensors_source(o.st)), dir + "/model.safetensors");
  EXPECT_EQ(mp_safetensors_num_tensors(o.st), 7);

  const std::string empty = fresh_dir("empty_checkpoint");
  Open none;
  EXPECT_EQ(none.dir(empty), MP_ERR_INPUT);
  EXPECT_EQ(std::string(none.err.message),
            empty +
                ": neither model.safetensors nor model.safetensors.index.json is there; save "
                "the checkpoint with transformers' save_pretrained (safe_serialization=True, "
                "the default)");
  Open file;
  EXPECT_EQ(file.dir(dir + "/model.safetensors"), MP_ERR_INPUT);
  EXPECT_EQ(std::string(file.err.message),
            dir +
                "/model.safetensors: not a directory; expected a Hugging Face checkpoint "
                "directory");
  EXPECT_EQ(none.st, nullptr);
}

TEST(SafetensorsExpect, NamesFileTensorExpectedAndFound) {
  Open o;
  const std::string path = kTestdata + "mixed.safetensors";
  ASSERT_EQ(o.file(path), MP_OK) << o.err.message;
  mp_error err = MP_ERROR_INITIALIZER;
  const int64_t embed[2] = {8, 6}, wrong[2] = {8, 7}, norm[1] = {6};
  const mp_safetensors_tensor *t = nullptr;
  EXPECT_EQ(mp_safetensors_expect(o.st, "model.embed_tokens.weight", MP_SAFETENSORS_FLOAT_DTYPES, 2,
                                  embed, &t, &err),
            MP_OK);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name, "model.embed_tokens.weight");

  EXPECT_EQ(mp_safetensors_expect(o.st, "model.embed_tokens.weight", MP_SAFETENSORS_FLOAT_DTYPES, 2,
                                  wrong, &t, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(std::string(err.message),
            path +
                ": tensor \"model.embed_tokens.weight\": expected F16, BF16 or F32 of shape "
                "[8, 7], found F32 of shape [8, 6]");
  EXPECT_EQ(
      mp_safetensors_expect(o.st, "model.norm.weight",
                            MP_SAFETENSORS_DTYPE_BIT(MP_SAFETENSORS_BF16), 1, norm, nullptr, &err),
      MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path +
                ": tensor \"model.norm.weight\": expected BF16 of shape [6], found F32 of shape "
                "[6]");
  EXPECT_EQ(mp_safetensors_expect(o.st, "model.norm.weight", MP_SAFETENSORS_FLOAT_DTYPES, 2, embed,
                                  nullptr, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path +
                ": tensor \"model.norm.weight\": expected F16, BF16 or F32 of shape [8, 6], "
                "found F32 of shape [6]");
  EXPECT_EQ(
      mp_safetensors_expect(o.st, "scale", MP_SAFETENSORS_FLOAT_DTYPES, 0, nullptr, nullptr, &err),
      MP_OK);
  EXPECT_EQ(mp_safetensors_expect(o.st, "model.norm.weights", MP_SAFETENSORS_FLOAT_DTYPES, 1, norm,
                                  nullptr, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": no tensor \"model.norm.weights\"; did you mean \"model.norm.weight\"?");
  EXPECT_EQ(mp_safetensors_expect(o.st, "transformer.wte.weight", MP_SAFETENSORS_FLOAT_DTYPES, 1,
                                  norm, nullptr, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": no tensor \"transformer.wte.weight\" (it has 7 tensors)");
}

// ------------------------------------------------------------------------------------------
// Writing what the reference writes
// ------------------------------------------------------------------------------------------

void expect_same_bytes(const std::string &ours, const std::string &golden) {
  const std::vector<unsigned char> a = read_bytes(ours), b = read_bytes(golden);
  ASSERT_FALSE(b.empty()) << golden;
  ASSERT_EQ(a.size(), b.size()) << ours << " against " << golden;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], b[i]) << "first different byte at " << i << " of " << ours << " against "
                          << golden;
  }
}

// Appends values to tensor name in pieces of 1, 2, 3, ... elements.
void append_in_pieces(mp_safetensors_writer *writer, const char *name,
                      const std::vector<float> &values) {
  mp_error err = MP_ERROR_INITIALIZER;
  size_t done = 0;
  for (size_t piece = 1; done < values.size(); ++piece) {
    const size_t n = std::min(piece, values.size() - done);
    ASSERT_EQ(mp_safetensors_writer_append(writer, name, values.data() + done, (int64_t)n, &err),
              MP_OK)
        << err.message;
    done += n;
  }
}

// The writer, given the tensors of mixed.safetensors in another order (it sorts them as the
// reference does), their values as fp32 in small pieces and tensor by tensor out of file order,
// writes the reference's file byte for byte.
TEST(SafetensorsWrite, MixedIsByteIdenticalToTheReference) {
  const std::string dir = fresh_dir("write_mixed");
  const std::string path = dir + "/mixed.safetensors";
  std::vector<mp_safetensors_tensor_spec> specs;
  for (size_t k = kMixed.size(); k-- > 0;) {
    specs.push_back(
        {kMixed[k].name, kMixed[k].dtype, (int)kMixed[k].shape.size(), kMixed[k].shape.data()});
  }
  const char *metadata[2] = {"format", "pt"};
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), specs.data(), (int)specs.size(), metadata, 1,
                                         &writer, &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(mp_safetensors_writer_file_bytes(writer), 1032);
  for (size_t k = 0; k < kMixed.size(); ++k) {
    std::vector<float> values((size_t)count_of(kMixed[k].shape));
    for (size_t j = 0; j < values.size(); ++j) values[j] = golden_value((int)k, (int64_t)j);
    append_in_pieces(writer, kMixed[k].name, values);
  }
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK) << err.message;
  expect_same_bytes(path, kTestdata + "mixed.safetensors");
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"mixed.safetensors"});  // no temporary left
}

// fp32 -> bf16 and fp16, round to nearest even, bit for bit torch's .to(): 1024 values, the edge
// cases (ties, overflow to inf, subnormals, signed zeros) first. No metadata: no "__metadata__".
TEST(SafetensorsWrite, RoundingIsByteIdenticalToTorch) {
  Open golden;
  ASSERT_EQ(golden.file(kTestdata + "rounding.safetensors"), MP_OK) << golden.err.message;
  const std::vector<float> source = read_all(golden.st, "source");
  ASSERT_EQ(source.size(), 1024u);
  const std::string path = fresh_dir("write_rounding") + "/rounding.safetensors";
  const int64_t shape[1] = {1024};
  const mp_safetensors_tensor_spec specs[3] = {{"source_f16", MP_SAFETENSORS_F16, 1, shape},
                                               {"source", MP_SAFETENSORS_F32, 1, shape},
                                               {"source_bf16", MP_SAFETENSORS_BF16, 1, shape}};
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), specs, 3, nullptr, 0, &writer, &err), MP_OK)
      << err.message;
  for (const auto &spec : specs) {
    ASSERT_EQ(mp_safetensors_writer_append(writer, spec.name, source.data(), 1024, &err), MP_OK)
        << err.message;
  }
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK) << err.message;
  expect_same_bytes(path, kTestdata + "rounding.safetensors");
}

// Names and metadata that need escaping come out as serde_json (the reference) writes them.
TEST(SafetensorsWrite, EscapingIsByteIdenticalToTheReference) {
  const std::vector<std::string> names = {"plain", "quote\"backslash\\slash/",
                                          "controls\b\f\n\r\t\x01\x1f\x7f",
                                          "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
  const std::string path = fresh_dir("write_escaping") + "/escaping.safetensors";
  std::vector<std::vector<int64_t>> shapes;
  std::vector<mp_safetensors_tensor_spec> specs;
  for (size_t k = 0; k < names.size(); ++k) shapes.push_back({2, (int64_t)k + 1});
  for (size_t k = 0; k < names.size(); ++k) {
    specs.push_back({names[k].c_str(), MP_SAFETENSORS_F32, 2, shapes[k].data()});
  }
  const char *metadata[2] = {"note \"1\"\n", "caf\xc3\xa9\t\\"};
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), specs.data(), (int)specs.size(), metadata, 1,
                                         &writer, &err),
            MP_OK)
      << err.message;
  for (size_t k = 0; k < names.size(); ++k) {
    std::vector<float> zeros((size_t)(2 * (k + 1)), 0.0f);
    ASSERT_EQ(mp_safetensors_writer_append(writer, names[k].c_str(), zeros.data(),
                                           (int64_t)zeros.size(), &err),
              MP_OK);
  }
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK) << err.message;
  expect_same_bytes(path, kTestdata + "escaping.safetensors");
  // And the reader gives the names back unescaped.
  Open o;
  ASSERT_EQ(o.file(path), MP_OK) << o.err.message;
  for (const std::string &name : names)
    EXPECT_NE(mp_safetensors_find(o.st, name.c_str()), nullptr) << name;
  EXPECT_STREQ(mp_safetensors_metadata_get(o.st, 0, "note \"1\"\n"), "caf\xc3\xa9\t\\");

  // The index escapes as Python's json.dumps (ensure_ascii): \uXXXX, surrogate pairs.
  const std::string index = temp_dir() + "/write_escaping/escaping.index.json";
  std::vector<std::string> files;
  std::vector<const char *> tensor_names, file_names;
  for (size_t k = 0; k < names.size(); ++k)
    files.push_back("shard " + std::to_string(k) + " \xc3\xa9.safetensors");
  for (size_t k = 0; k < names.size(); ++k) {
    tensor_names.push_back(names[k].c_str());
    file_names.push_back(files[k].c_str());
  }
  ASSERT_EQ(mp_safetensors_write_index(index.c_str(), tensor_names.data(), file_names.data(),
                                       (int)names.size(), 96, &err),
            MP_OK)
      << err.message;
  expect_same_bytes(index, kTestdata + "escaping.index.json");
}

// Two shards and their index, as transformers' save_pretrained writes them.
TEST(SafetensorsWrite, ShardedSetIsByteIdenticalToTransformers) {
  const std::string dir = fresh_dir("write_sharded");
  const char *metadata[2] = {"format", "pt"};
  std::vector<const char *> tensor_names, file_names;
  int64_t total_size = 0;
  for (int shard = 0; shard < 2; ++shard) {
    const std::string name = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    const int first = shard == 0 ? 0 : kFirstOfShard2;
    const int last = shard == 0 ? kFirstOfShard2 : (int)kSharded.size();
    std::vector<mp_safetensors_tensor_spec> specs;
    for (int k = first; k < last; ++k) {
      specs.push_back({kSharded[(size_t)k].name, MP_SAFETENSORS_BF16,
                       (int)kSharded[(size_t)k].shape.size(), kSharded[(size_t)k].shape.data()});
      tensor_names.push_back(kSharded[(size_t)k].name);
      file_names.push_back(shard == 0 ? "model-00001-of-00002.safetensors"
                                      : "model-00002-of-00002.safetensors");
      total_size += 2 * count_of(kSharded[(size_t)k].shape);
    }
    mp_error err = MP_ERROR_INITIALIZER;
    mp_safetensors_writer *writer = nullptr;
    ASSERT_EQ(mp_safetensors_writer_create((dir + "/" + name).c_str(), specs.data(),
                                           (int)specs.size(), metadata, 1, &writer, &err),
              MP_OK)
        << err.message;
    for (int k = first; k < last; ++k) {
      std::vector<float> values((size_t)count_of(kSharded[(size_t)k].shape));
      for (size_t j = 0; j < values.size(); ++j) values[j] = golden_value(100 + k, (int64_t)j);
      append_in_pieces(writer, kSharded[(size_t)k].name, values);
    }
    ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK) << err.message;
    expect_same_bytes(dir + "/" + name, kTestdata + "sharded/" + name);
  }
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_safetensors_write_index((dir + "/model.safetensors.index.json").c_str(),
                                       tensor_names.data(), file_names.data(),
                                       (int)tensor_names.size(), total_size, &err),
            MP_OK)
      << err.message;
  expect_same_bytes(dir + "/model.safetensors.index.json",
                    kTestdata + "sharded/model.safetensors.index.json");
}

// What the reference writes for no tensors (and no metadata), and for metadata only.
TEST(SafetensorsWrite, EmptyFilesAreTheReferences) {
  const std::string dir = fresh_dir("write_empty");
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  ASSERT_EQ(
      mp_safetensors_writer_create((dir + "/none").c_str(), nullptr, 0, nullptr, 0, &writer, &err),
      MP_OK);
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK);
  const std::string none("\x08\0\0\0\0\0\0\0{}      ", 16);
  EXPECT_EQ(read_bytes(dir + "/none"), std::vector<unsigned char>(none.begin(), none.end()));
  const char *metadata[2] = {"format", "pt"};
  ASSERT_EQ(
      mp_safetensors_writer_create((dir + "/meta").c_str(), nullptr, 0, metadata, 1, &writer, &err),
      MP_OK);
  ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK);
  const std::string meta =
      std::string("\x20\0\0\0\0\0\0\0", 8) + "{\"__metadata__\":{\"format\":\"pt\"}}";
  EXPECT_EQ(read_bytes(dir + "/meta"), std::vector<unsigned char>(meta.begin(), meta.end()));
  ASSERT_EQ(mp_safetensors_write_index((dir + "/index.json").c_str(), nullptr, nullptr, 0, 0, &err),
            MP_OK);
  const std::string index =
      "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}\n";
  EXPECT_EQ(read_bytes(dir + "/index.json"),
            std::vector<unsigned char>(index.begin(), index.end()));
}

TEST(SafetensorsWrite, RefusesBadSpecsAndAppends) {
  const std::string dir = fresh_dir("write_bad");
  const std::string path = dir + "/bad.safetensors";
  const int64_t shape[2] = {2, 3}, negative[2] = {2, -3}, huge[3] = {1 << 20, 1 << 20, 1 << 20};
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = nullptr;
  auto refused = [&](std::vector<mp_safetensors_tensor_spec> specs, const char *const *metadata,
                     int num_metadata) {
    EXPECT_EQ(mp_safetensors_writer_create(path.c_str(), specs.data(), (int)specs.size(), metadata,
                                           num_metadata, &writer, &err),
              MP_ERR_INPUT);
    EXPECT_EQ(writer, nullptr);
    return std::string(err.message);
  };
  EXPECT_EQ(refused({{"a", MP_SAFETENSORS_F32, 2, shape}, {"a", MP_SAFETENSORS_BF16, 2, shape}},
                    nullptr, 0),
            path + ": tensor \"a\" given twice");
  EXPECT_EQ(
      refused({{"a", MP_SAFETENSORS_F32, 2, shape}, {"__metadata__", MP_SAFETENSORS_F32, 2, shape}},
              nullptr, 0),
      path + ": tensor 1: \"__metadata__\" is the header's metadata key, not a tensor name");
  EXPECT_EQ(refused({{"a", MP_SAFETENSORS_I64, 2, shape}}, nullptr, 0),
            path + ": tensor \"a\": dtype I64; the writer converts fp32 to F32, BF16 or F16 only");
  EXPECT_EQ(refused({{"a", MP_SAFETENSORS_F32, 2, negative}}, nullptr, 0),
            path + ": tensor \"a\": shape[1] is -3, negative");
  EXPECT_EQ(refused({{"a", MP_SAFETENSORS_F32, 3, huge}}, nullptr, 0),
            path + ": tensor \"a\": 2^53 bytes or more");
  EXPECT_EQ(refused({{"\xff", MP_SAFETENSORS_F32, 2, shape}}, nullptr, 0),
            path + ": tensor 0: the name is not UTF-8");
  const char *twice[4] = {"format", "pt", "format", "np"};
  EXPECT_EQ(refused({{"a", MP_SAFETENSORS_F32, 2, shape}}, twice, 2),
            path + ": metadata key \"format\" given twice");
  const char *bad_value[2] = {"format", "\xc3"};
  EXPECT_EQ(refused({}, bad_value, 1), path + ": metadata value 0 is not UTF-8");
  const std::string missing = dir + "/no/such/dir/x.safetensors";
  const mp_safetensors_tensor_spec one = {"a", MP_SAFETENSORS_F32, 2, shape};
  EXPECT_EQ(mp_safetensors_writer_create(missing.c_str(), &one, 1, nullptr, 0, &writer, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), missing + ": cannot create: No such file or directory");

  // Appends a caller gets wrong; finishing short of values writes nothing.
  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), &one, 1, nullptr, 0, &writer, &err), MP_OK);
  const float values[6] = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(mp_safetensors_writer_append(writer, "b", values, 1, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message), path + ": no tensor \"b\" was declared to the writer");
  ASSERT_EQ(mp_safetensors_writer_append(writer, "a", values, 4, &err), MP_OK);
  EXPECT_EQ(mp_safetensors_writer_append(writer, "a", values, 5, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message),
            path + ": tensor \"a\": 5 more values after 4 of its 6 elements");
  EXPECT_EQ(mp_safetensors_writer_finish(writer, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message),
            path + ": tensor \"a\" got 4 of its 6 values; the file is not written");
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{});  // neither the file nor a temporary

  ASSERT_EQ(mp_safetensors_writer_create(path.c_str(), &one, 1, nullptr, 0, &writer, &err), MP_OK);
  mp_safetensors_writer_abort(writer);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{});
  mp_safetensors_writer_abort(nullptr);

  const char *names[2] = {"a", "a"}, *files[2] = {"f", "g"};
  EXPECT_EQ(mp_safetensors_write_index((dir + "/i.json").c_str(), names, files, 2, 0, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), dir + "/i.json: tensor \"a\" given twice");
}

// ------------------------------------------------------------------------------------------
// Hostile files: each refused with its whole message
// ------------------------------------------------------------------------------------------

std::string hostile_dir() { return fresh_dir("hostile"); }

// A file of the 8-byte length, header (padded with spaces to a multiple of 8 when pad), and
// data_bytes zero bytes.
std::string hostile_file(const std::string &name, const std::string &header, size_t data_bytes,
                         bool pad = true) {
  std::string text = header;
  while (pad && text.size() % 8 != 0) text += ' ';
  std::vector<unsigned char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[(size_t)i] = (unsigned char)((uint64_t)text.size() >> (8 * i));
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.insert(bytes.end(), data_bytes, 0);
  const std::string path = hostile_dir() + "/" + name;
  write_bytes(path, bytes);
  return path;
}

// {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]} as text.
std::string entry(const std::string &dtype, const std::string &shape, int64_t begin, int64_t end) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// The message opening path fails with (MP_ERR_INPUT, no handle).
std::string refusal(const std::string &path) {
  Open o;
  EXPECT_EQ(o.file(path), MP_ERR_INPUT) << path;
  EXPECT_EQ(o.st, nullptr);
  EXPECT_EQ(o.err.status, MP_ERR_INPUT);
  return o.err.message;
}

TEST(SafetensorsHostile, LengthAndHeaderBytes) {
  std::string p = hostile_dir() + "/short";
  write_bytes(p, {1, 0, 0, 0, 0});
  EXPECT_EQ(refusal(p),
            p + ": 5 bytes, shorter than the 8-byte header length every safetensors file starts "
                "with");
  p = hostile_dir() + "/too_large";
  write_bytes(p, {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0, '{', '}'});  // 100,000,001
  EXPECT_EQ(refusal(p),
            p + ": header length 100000001 bytes is over the limit of 100000000 (the reference "
                "safetensors library's); not a safetensors file, or a corrupt one");
  p = hostile_dir() + "/beyond";
  write_bytes(p, {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '});
  EXPECT_EQ(refusal(p),
            p + ": header length 1000 bytes runs past the end of the file (16 bytes, so at most "
                "8); the file is truncated or not a safetensors file");
  p = hostile_dir() + "/huge_length";
  write_bytes(p, {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'});
  EXPECT_EQ(refusal(p),
            p + ": header length 9223372036854775808 bytes is over the limit of 100000000 (the "
                "reference safetensors library's); not a safetensors file, or a corrupt one");
  p = hostile_file("empty_header", "", 0);
  EXPECT_EQ(refusal(p), p + ": header: empty, expected a JSON object");
  p = hostile_file("not_json", "{\"a\": [1, 2", 0);
  EXPECT_EQ(refusal(p),
            p + ": header:1:17: JSON syntax error: expected ',' or ']', found the end of the file");
  p = hostile_file("not_object", "[1, 2, 3]", 0);
  EXPECT_EQ(refusal(p),
            p + ": header: expected a JSON object of tensor name -> {dtype, shape, data_offsets}, "
                "got an array");
  p = hostile_file("not_utf8", "{\"\xff\": 1}", 0);
  EXPECT_EQ(refusal(p), p + ": the header is not UTF-8: byte 2 of 8 (0xff) starts no character");
  p = hostile_file("overlong_utf8", "{\"\xc0\xaf\": 1}", 0);
  EXPECT_EQ(refusal(p), p + ": the header is not UTF-8: byte 2 of 16 (0xc0) starts no character");
  p = hostile_file("nul", std::string("{}\0\0\0\0\0\0", 8), 0, false);
  EXPECT_EQ(refusal(p),
            p + ": the header has a NUL byte at byte 2 of 8; it is not JSON text (the reference "
                "pads the header with spaces)");
  p = hostile_file("control", "{\"a\x01\": " + entry("F32", "[1]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p),
            p + ": the header has control character 0x01 unescaped inside a string at byte 3; it "
                "is not JSON");
}

TEST(SafetensorsHostile, TensorEntries) {
  std::string p = hostile_file("dtype", "{\"x\": " + entry("F33", "[1]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": unknown dtype \"F33\" (known: BOOL, U8, I8, F8_E5M2, F8_E4M3, "
                "I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)");
  p = hostile_file("dtype_number",
                   "{\"x\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
  EXPECT_EQ(refusal(p), p + ": tensor \"x\": dtype: expected a string, got a number");
  p = hostile_file("entry_number", "{\"x\": 5}", 0);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, got "
                "a number");
  p = hostile_file("no_offsets", "{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": no \"data_offsets\" (each tensor needs dtype, shape and "
                "data_offsets)");
  p = hostile_file("dtype_twice",
                   "{\"x\": {\"dtype\": \"F32\", \"dtype\": \"F16\", \"shape\": [1], "
                   "\"data_offsets\": [0, 4]}}",
                   4);
  EXPECT_EQ(refusal(p), p + ": tensor \"x\": \"dtype\" given twice");
  p = hostile_file("shape_negative", "{\"x\": " + entry("F32", "[-1]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape[0]: expected a whole number from 0 to 2^53 - 1, got -1");
  p = hostile_file("shape_fraction", "{\"x\": " + entry("F32", "[2, 1.5]", 0, 12) + "}", 12);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape[1]: expected a whole number from 0 to 2^53 - 1, got 1.5");
  p = hostile_file("shape_string", "{\"x\": " + entry("F32", "[\"4\"]", 0, 16) + "}", 16);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape[0]: expected a whole number from 0 to 2^53 - 1, got a "
                "string");
  p = hostile_file("shape_2_53", "{\"x\": " + entry("U8", "[9007199254740992]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape[0]: expected a whole number from 0 to 2^53 - 1, got "
                "9007199254740992");
  p = hostile_file("shape_object",
                   "{\"x\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 4]}}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape: expected an array of whole numbers, got an object");
  p = hostile_file("too_many_elements",
                   "{\"x\": " + entry("F32", "[1073741824, 1073741824, 1073741824]", 0, 4) + "}",
                   4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape [1073741824, 1073741824, 1073741824] has 2^53 elements or "
                "more");
  p = hostile_file("offsets_one",
                   "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4]}}", 4);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": data_offsets: expected [begin, end], two whole numbers from 0 to "
                "2^53 - 1");
  p = hostile_file("offsets_backwards", "{\"x\": " + entry("F32", "[0]", 8, 0) + "}", 8);
  EXPECT_EQ(refusal(p), p + ": tensor \"x\": data_offsets [8, 0) run backwards (end before begin)");
  p = hostile_file("shape_disagrees", "{\"x\": " + entry("F32", "[3]", 0, 8) + "}", 8);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": shape [3] of F32 takes 12 bytes, but data_offsets [0, 8) hold 8");
  p = hostile_file(
      "duplicate",
      "{\"x\": " + entry("F32", "[1]", 0, 4) + ", \"x\": " + entry("F32", "[1]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p), p + ": tensor \"x\" appears twice in the header");
  p = hostile_file("metadata_number", "{\"__metadata__\": {\"format\": 1}}", 0);
  EXPECT_EQ(refusal(p),
            p + ": header: $.__metadata__[\"format\"]: expected a string, got a number (metadata "
                "maps strings to strings)");
  p = hostile_file("metadata_array", "{\"__metadata__\": [\"pt\"]}", 0);
  EXPECT_EQ(refusal(p),
            p + ": header: $.__metadata__: expected an object of strings, got an array");
  p = hostile_file("metadata_twice", "{\"__metadata__\": {}, \"__metadata__\": {}}", 0);
  EXPECT_EQ(refusal(p), p + ": header: \"__metadata__\" given twice");
  p = hostile_file("metadata_key_twice", "{\"__metadata__\": {\"a\": \"1\", \"a\": \"2\"}}", 0);
  EXPECT_EQ(refusal(p), p + ": header: $.__metadata__: key \"a\" given twice");
}

TEST(SafetensorsHostile, OffsetsMustTileTheDataSection) {
  const std::string x4 = "\"x\": " + entry("F32", "[1]", 0, 4);
  std::string p = hostile_file("gap_first", "{\"x\": " + entry("F32", "[1]", 4, 8) + "}", 8);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"x\": data_offsets [4, 8) leave bytes [0, 4) of the data section to no "
                "tensor (the data section starts at byte 0); the tensors must cover it with no "
                "gaps");
  p = hostile_file("gap", "{" + x4 + ", \"y\": " + entry("F32", "[1]", 8, 12) + "}", 12);
  EXPECT_EQ(refusal(p),
            p + ": tensor \"y\": data_offsets [8, 12) leave bytes [4, 8) of the data section to no "
                "tensor (the tensor before it, \"x\", ends at 4); the tensors must cover it with "
                "no gaps");
  p = hostile_file(
      "overlap",
      "{\"x\": " + entry("F32", "[2]", 0, 8) + ", \"y\": " + entry("F32", "[1]", 4, 8) + "}", 8);
  EXPECT_EQ(refusal(p), p + ": tensor \"y\": data_offsets [4, 8) overlap tensor \"x\" at [0, 8)");
  p = hostile_file(
      "same_bytes",
      "{\"b\": " + entry("F32", "[1]", 0, 4) + ", \"a\": " + entry("I32", "[1]", 0, 4) + "}", 4);
  EXPECT_EQ(refusal(p), p + ": tensor \"b\": data_offsets [0, 4) overlap tensor \"a\" at [0, 4)");
  p = hostile_file("truncated", "{\"x\": " + entry("F32", "[2]", 0, 8) + "}", 4);
  EXPECT_EQ(refusal(p),
            p + ": truncated: tensor \"x\" ends at byte 8 of the data section, but the file (68 "
                "bytes) holds only 4 bytes of data after its header");
  p = hostile_file("trailing", "{" + x4 + "}", 8);
  EXPECT_EQ(refusal(p),
            p + ": the last 4 bytes of the file belong to no tensor (the tensors end at byte 4 of "
                "the 8-byte data section); the reference safetensors library refuses such files");
  p = hostile_file("no_tensors_trailing", "{}", 3);
  EXPECT_EQ(refusal(p),
            p + ": the last 3 bytes of the file belong to no tensor (the tensors end at byte 0 of "
                "the 3-byte data section); the reference safetensors library refuses such files");
  // The golden, cut short by 3 bytes.
  p = hostile_dir() + "/mixed_truncated";
  std::vector<unsigned char> mixed = read_bytes(kTestdata + "mixed.safetensors");
  mixed.resize(mixed.size() - 3);
  write_bytes(p, mixed);
  EXPECT_EQ(refusal(p),
            p + ": truncated: tensor \"model.layers.0.self_attn.q_proj.bias\" ends at byte 456 of "
                "the data section, but the file (1029 bytes) holds only 453 bytes of data after "
                "its header");
  p = hostile_dir() + "/no_such_file";
  EXPECT_EQ(refusal(p), p + ": cannot open: No such file or directory");
  EXPECT_EQ(refusal(hostile_dir()),
            hostile_dir() + ": not a regular file; expected a .safetensors file");
}

// What the reference accepts, this reader accepts too: a header that starts with spaces or is
// not padded, unknown keys in an entry, null metadata, tensors listed out of offset order,
// zero-size tensors and scalars, a file of no tensors.
TEST(SafetensorsHostile, AcceptsWhatTheReferenceAccepts) {
  const std::string p =
      hostile_file("lenient",
                   "  {\"__metadata__\": null, \"y\": " + entry("BF16", "[2]", 4, 8) +
                       ", \"z\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [8, 12], "
                       "\"extra\": [1.5]}"
                       ", \"e\": " +
                       entry("F16", "[0, 3]", 4, 4) + ", \"x\": " + entry("F32", "[1]", 0, 4) + "}",
                   12, false);
  Open o;
  ASSERT_EQ(o.file(p), MP_OK) << o.err.message;
  EXPECT_EQ(mp_safetensors_num_tensors(o.st), 4);
  EXPECT_EQ(mp_safetensors_num_metadata(o.st, 0), 0);
  EXPECT_EQ(mp_safetensors_find(o.st, "z")->rank, 0);
  EXPECT_EQ(mp_safetensors_find(o.st, "z")->num_elements, 1);
  EXPECT_EQ(mp_safetensors_find(o.st, "e")->num_elements, 0);
  Open none;
  ASSERT_EQ(none.file(hostile_file("none", "{}", 0)), MP_OK) << none.err.message;
  EXPECT_EQ(mp_safetensors_num_tensors(none.st), 0);
}

TEST(SafetensorsHostile, ReadsOfTheWrongKindOrPlace) {
  const std::string p = hostile_file("ids",
                                     "{\"ids\": " + entry("I64", "[2]", 0, 16) +
                                         ", \"w\": " + entry("F32", "[2, 2]", 16, 32) + "}",
                                     32);
  Open o;
  ASSERT_EQ(o.file(p), MP_OK) << o.err.message;
  mp_error err = MP_ERROR_INITIALIZER;
  float out[8];
  EXPECT_EQ(mp_safetensors_read_elements(o.st, "ids", 0, 2, out, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            p + ": tensor \"ids\" is I64; only BF16, F16 and F32 tensors convert to fp32");
  EXPECT_EQ(mp_safetensors_read_rows(o.st, "wx", 0, 1, out, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), p + ": no tensor \"wx\"; did you mean \"w\"?");
  EXPECT_EQ(mp_safetensors_read_elements(o.st, "w", 2, 5, out, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message),
            p + ": tensor \"w\": elements [2, 5) are not inside its 4 elements");
  EXPECT_EQ(mp_safetensors_read_rows(o.st, "w", 1, 3, out, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message), p + ": tensor \"w\": rows [1, 3) are not inside its 2 rows");
  EXPECT_EQ(mp_safetensors_read_block(o.st, "w", 0, 2, 1, 3, MP_SAFETENSORS_ROW_MAJOR, out, &err),
            MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message),
            p + ": tensor \"w\": the block rows [0, 2) x columns [1, 3) is not inside its 2 x 2");
  Open mixed;
  ASSERT_EQ(mixed.file(kTestdata + "mixed.safetensors"), MP_OK);
  EXPECT_EQ(mp_safetensors_read_rows(mixed.st, "scale", 0, 1, out, &err), MP_ERR_RUNTIME);
  EXPECT_EQ(std::string(err.message),
            kTestdata +
                "mixed.safetensors: tensor \"scale\" is a scalar; it has no rows (read it "
                "with mp_safetensors_read_elements)");

  // A file cut short after it was opened (inside w's second row): the read says so.
  const int64_t w_at = mp_safetensors_find(o.st, "w")->file_offset;
  ASSERT_EQ(truncate(p.c_str(), (off_t)(w_at + 10)), 0);
  EXPECT_EQ(mp_safetensors_read_rows(o.st, "w", 0, 1, out, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_safetensors_read_elements(o.st, "w", 0, 4, out, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), p + ": cannot read tensor \"w\": the file ends before byte " +
                                          std::to_string(w_at + 10) +
                                          "; it was truncated after it was opened");
}

// ------------------------------------------------------------------------------------------
// Hostile indexes
// ------------------------------------------------------------------------------------------

// A directory holding the two golden shards and the index text given.
std::string index_with(const std::string &name, const std::string &index_text) {
  const std::string dir = fresh_dir("index_" + name);
  for (const char *shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    write_bytes(dir + "/" + shard, read_bytes(kTestdata + "sharded/" + shard));
  }
  write_text(dir + "/model.safetensors.index.json", index_text);
  return dir;
}

std::string golden_index() {
  const std::vector<unsigned char> bytes =
      read_bytes(kTestdata + "sharded/model.safetensors.index.json");
  return std::string(bytes.begin(), bytes.end());
}

// golden_index() with the line mentioning `tensor` replaced by `line` ("" removes it).
std::string index_edited(const std::string &tensor, const std::string &line) {
  std::string text = golden_index();
  const size_t at = text.find("\"" + tensor + "\"");
  EXPECT_NE(at, std::string::npos) << tensor;
  const size_t start = text.rfind('\n', at) + 1, end = text.find('\n', at);
  std::string old = text.substr(start, end - start);
  const bool had_comma = old.back() == ',';
  std::string replacement = line.empty() ? "" : "    " + line + (had_comma ? "," : "");
  text.replace(start, end - start + (line.empty() ? 1 : 0), replacement);
  if (line.empty() && !had_comma) {
    const size_t comma = text.rfind(',', start);  // the line before is now the last one
    text.erase(comma, 1);
  }
  return text;
}

std::string index_refusal(const std::string &dir) {
  Open o;
  EXPECT_EQ(o.index(dir + "/model.safetensors.index.json"), MP_ERR_INPUT);
  EXPECT_EQ(o.st, nullptr);
  return o.err.message;
}

TEST(SafetensorsHostileIndex, JsonAndWeightMap) {
  std::string d = index_with("not_json", "{\"weight_map\": {");
  std::string i = d + "/model.safetensors.index.json";
  EXPECT_EQ(
      index_refusal(d),
      i + ":1:17: JSON syntax error: expected a key in double quotes, found the end of the file");
  d = index_with("array", "[]");
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d),
            i + ": $: expected a safetensors index (a JSON object), got an array");
  d = index_with("no_map", "{\"metadata\": {\"total_size\": 408}}");
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d), i + ": $: no \"weight_map\" (tensor name -> file name); not a "
                                  "model.safetensors.index.json");
  d = index_with("map_array", "{\"weight_map\": [1, 2]}");
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d),
            i + ": $.weight_map: expected the map of tensor name -> file name (a JSON object), got "
                "an array");
  d = index_with("value_number", index_edited("lm_head.weight", "\"lm_head.weight\": 2"));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(
      index_refusal(d),
      i + ": $.weight_map[\"lm_head.weight\"]: expected a file name (a string), got a number");
  d = index_with("traversal",
                 index_edited("lm_head.weight",
                              "\"lm_head.weight\": \"../model-00002-of-00002.safetensors\""));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d),
            i + ": $.weight_map[\"lm_head.weight\"]: \"../model-00002-of-00002.safetensors\" is "
                "not a file name in the index's directory (no '/', not empty, not . or ..)");
  d = index_with("listed_twice",
                 index_edited("lm_head.weight",
                              "\"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
                              "    \"lm_head.weight\": \"model-00002-of-00002.safetensors\""));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d), i + ": $.weight_map: tensor \"lm_head.weight\" listed twice");
}

TEST(SafetensorsHostileIndex, MapAndFilesMustAgree) {
  std::string d = index_with(
      "missing_file", index_edited("model.norm.weight",
                                   "\"model.norm.weight\": \"model-00003-of-00002.safetensors\""));
  std::string i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d),
            i + ": $.weight_map puts tensor \"model.norm.weight\" in " + d +
                "/model-00003-of-00002.safetensors, which is missing: No such file or directory");
  d = index_with("wrong_file",
                 index_edited("model.norm.weight",
                              "\"model.norm.weight\": \"model-00001-of-00002.safetensors\""));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d), i + ": $.weight_map puts tensor \"model.norm.weight\" in " + d +
                                  "/model-00001-of-00002.safetensors, which has no such tensor (" +
                                  d + "/model-00002-of-00002.safetensors has it)");
  d = index_with("extra",
                 index_edited("lm_head.weight",
                              "\"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
                              "    \"model.extra.weight\": \"model-00001-of-00002.safetensors\""));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d), i + ": $.weight_map puts tensor \"model.extra.weight\" in " + d +
                                  "/model-00001-of-00002.safetensors, which has no such tensor");
  d = index_with("unlisted", index_edited("lm_head.weight", ""));
  i = d + "/model.safetensors.index.json";
  EXPECT_EQ(index_refusal(d),
            i + ": " + d +
                "/model-00002-of-00002.safetensors holds tensor \"lm_head.weight\", which "
                "$.weight_map does not list");
  // A shard that is itself broken is refused with its own message.
  d = index_with("broken_shard", golden_index());
  std::vector<unsigned char> shard = read_bytes(d + "/model-00002-of-00002.safetensors");
  shard.resize(shard.size() - 2);
  write_bytes(d + "/model-00002-of-00002.safetensors", shard);
  EXPECT_EQ(index_refusal(d),
            d + "/model-00002-of-00002.safetensors: truncated: tensor \"model.norm.weight\" ends "
                "at byte 208 of the data section, but the file (766 bytes) holds only 206 bytes "
                "of data after its header");
}

// A tensor in two files: the map names one, the other file holds it too.
TEST(SafetensorsHostileIndex, TensorInTwoFiles) {
  const std::string d = fresh_dir("index_two_files");
  const int64_t shape[1] = {2};
  const float values[2] = {1, 2};
  mp_error err = MP_ERROR_INITIALIZER;
  for (const auto &[file, names] : std::vector<std::pair<std::string, std::vector<const char *>>>{
           {"a.safetensors", {"x", "y"}}, {"b.safetensors", {"y", "z"}}}) {
    std::vector<mp_safetensors_tensor_spec> specs;
    for (const char *name : names) specs.push_back({name, MP_SAFETENSORS_F32, 1, shape});
    mp_safetensors_writer *writer = nullptr;
    ASSERT_EQ(mp_safetensors_writer_create((d + "/" + file).c_str(), specs.data(), 2, nullptr, 0,
                                           &writer, &err),
              MP_OK);
    for (const char *name : names)
      ASSERT_EQ(mp_safetensors_writer_append(writer, name, values, 2, &err), MP_OK);
    ASSERT_EQ(mp_safetensors_writer_finish(writer, &err), MP_OK);
  }
  const char *tensors[3] = {"x", "y", "z"},
             *files[3] = {"a.safetensors", "b.safetensors", "b.safetensors"};
  ASSERT_EQ(mp_safetensors_write_index((d + "/model.safetensors.index.json").c_str(), tensors,
                                       files, 3, 24, &err),
            MP_OK);
  EXPECT_EQ(index_refusal(d), d + "/model.safetensors.index.json: " + d +
                                  "/a.safetensors holds tensor \"y\", which $.weight_map puts in " +
                                  d + "/b.safetensors");
}

}  // namespace
