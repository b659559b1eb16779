// engine/data/tokenizer against Hugging Face `tokenizers` 0.20.3 (tools/bench/tokenizer_golden.py,
// tests/engine/testdata/tokenizers/README.md): for six tokenizer.json files shaped like GPT-2,
// Llama 3, Qwen2, Llama 2, Mistral and a 72k-id Llama 3, every golden test document of the Debian
// fortunes (id count and FNV-1a hash of the ids), every tricky sample's ids with and without the
// template, and its decodes (with and without special tokens, and of a prefix that cuts a
// character). Then the refusals: what mpengine does not implement is an input error naming the
// file and the JSON path.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/data/tokenizer/tokenizer.h"

namespace {

const char kTestdata[] = "tests/engine/testdata/tokenizers";
const char kFortunes[] = "/usr/share/games/fortunes";
const char *const kNames[] = {"gpt2_style",   "llama3_style",  "qwen2_style",
                              "llama2_style", "mistral_style", "big_vocab"};

#if defined(__SANITIZE_ADDRESS__)
// Sanitized builds are about ten times slower: a deterministic quarter of the documents.
const int kDocumentStride = 4;
#else
const int kDocumentStride = 1;
#endif

std::string ReadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t Fnv1a64(const std::vector<uint32_t> &ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t id : ids) {
    for (int b = 0; b < 4; b++) {
      h ^= (id >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

std::string FromHex(const std::string &hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string ToHex(const std::string &bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

struct Tokenizer {
  mp_tokenizer *tokenizer = nullptr;
  mp_token_encoder *encoder = nullptr;
  ~Tokenizer() {
    mp_token_encoder_free(encoder);
    mp_tokenizer_free(tokenizer);
  }
  void Load(const std::string &path) {
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_tokenizer_load(path.c_str(), &tokenizer, &err), MP_OK) << err.message;
    ASSERT_EQ(mp_token_encoder_create(tokenizer, &encoder, &err), MP_OK) << err.message;
  }
  std::vector<uint32_t> Encode(const std::string &text, bool add_special) {
    mp_token_ids ids = {};
    mp_error err = MP_ERROR_INITIALIZER;
    mp_status status =
        mp_token_encoder_encode(encoder, text.data(), text.size(), add_special, &ids, &err);
    EXPECT_EQ(status, MP_OK) << err.message;
    std::vector<uint32_t> out(ids.ids, ids.ids + ids.count);
    mp_token_ids_free(&ids);
    return out;
  }
  std::string Decode(const std::vector<uint32_t> &ids, bool skip_special) {
    char *text = nullptr;
    size_t bytes = 0;
    mp_error err = MP_ERROR_INITIALIZER;
    mp_status status =
        mp_tokenizer_decode(tokenizer, ids.data(), ids.size(), skip_special, &text, &bytes, &err);
    EXPECT_EQ(status, MP_OK) << err.message;
    std::string out = text == nullptr ? "" : std::string(text, bytes);
    free(text);
    return out;
  }
};

std::vector<uint32_t> IdsOf(const cJSON *array) {
  std::vector<uint32_t> ids;
  for (const cJSON *v = array == nullptr ? nullptr : array->child; v != nullptr; v = v->next) {
    ids.push_back(static_cast<uint32_t>(v->valuedouble));
  }
  return ids;
}

std::string Str(const std::vector<uint32_t> &ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); i++) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

class TokenizerGolden : public ::testing::TestWithParam<const char *> {};

TEST_P(TokenizerGolden, EveryTestDocumentOfTheFortunes) {
  std::string dir = std::string(kTestdata) + "/" + GetParam();
  Tokenizer t;
  ASSERT_NO_FATAL_FAILURE(t.Load(dir + "/tokenizer.json"));
  std::ifstream golden(dir + "/golden.txt");
  ASSERT_TRUE(golden.good()) << dir << "/golden.txt";
  std::map<std::string, std::string> files;
  std::string line;
  long documents = 0, tokens = 0, mismatches = 0, index = 0;
  while (std::getline(golden, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (index++ % kDocumentStride != 0) continue;
    std::istringstream fields(line);
    std::string path, hash;
    size_t offset, length, count;
    fields >> path >> offset >> length >> count >> hash;
    auto it = files.find(path);
    if (it == files.end()) {
      std::string bytes = ReadFile(std::string(kFortunes) + "/" + path);
      ASSERT_FALSE(bytes.empty()) << kFortunes << "/" << path
                                  << " is missing: tools/setup.sh installs the fortunes packages";
      it = files.emplace(path, bytes).first;
    }
    ASSERT_LE(offset + length, it->second.size()) << path << ": changed since the goldens";
    std::vector<uint32_t> ids = t.Encode(it->second.substr(offset, length), true);
    char got[17];
    snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(Fnv1a64(ids)));
    if (ids.size() != count || hash != got) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << GetParam() << ": " << path << " at byte " << offset << " (" << length
                      << " bytes): " << ids.size() << " ids (hash " << got << "), Hugging Face "
                      << count << " (hash " << hash << ")";
      }
    }
    documents++;
    tokens += static_cast<long>(count);
  }
  EXPECT_EQ(mismatches, 0) << GetParam() << ": documents that differ";
  EXPECT_GT(documents, 25791 / kDocumentStride - 1);
  printf("%s: %ld documents, %ld tokens compared, %ld differ\n", GetParam(), documents, tokens,
         mismatches);
}

TEST_P(TokenizerGolden, EverySampleEncodesAndDecodes) {
  std::string dir = std::string(kTestdata) + "/" + GetParam();
  Tokenizer t;
  ASSERT_NO_FATAL_FAILURE(t.Load(dir + "/tokenizer.json"));
  std::ifstream samples(dir + "/samples.jsonl");
  ASSERT_TRUE(samples.good());
  std::string line;
  int count = 0;
  while (std::getline(samples, line)) {
    cJSON *sample = cJSON_Parse(line.c_str());
    ASSERT_NE(sample, nullptr) << line;
    std::string text = FromHex(cJSON_GetObjectItem(sample, "text_hex")->valuestring);
    std::string shown = cJSON_GetObjectItem(sample, "text")->valuestring;
    std::vector<uint32_t> ids = IdsOf(cJSON_GetObjectItem(sample, "ids"));
    std::vector<uint32_t> plain = IdsOf(cJSON_GetObjectItem(sample, "ids_no_special"));
    EXPECT_EQ(Str(t.Encode(text, true)), Str(ids)) << GetParam() << ": \"" << shown << "\"";
    EXPECT_EQ(Str(t.Encode(text, false)), Str(plain)) << GetParam() << ": \"" << shown << "\"";
    EXPECT_EQ(ToHex(t.Decode(ids, false)), cJSON_GetObjectItem(sample, "decoded_hex")->valuestring)
        << GetParam() << ": decode of \"" << shown << "\"";
    EXPECT_EQ(ToHex(t.Decode(ids, true)),
              cJSON_GetObjectItem(sample, "decoded_skip_special_hex")->valuestring)
        << GetParam() << ": decode (skip special) of \"" << shown << "\"";
    std::vector<uint32_t> prefix(plain.begin(), plain.begin() + plain.size() / 2);
    EXPECT_EQ(ToHex(t.Decode(prefix, false)),
              cJSON_GetObjectItem(sample, "decoded_prefix_hex")->valuestring)
        << GetParam() << ": decode of the first half of \"" << shown << "\"";
    cJSON_Delete(sample);
    count++;
  }
  EXPECT_EQ(count, 83);
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerGolden, ::testing::ValuesIn(kNames),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                           return std::string(info.param);
                         });

TEST(Tokenizer, Accessors) {
  Tokenizer t;
  ASSERT_NO_FATAL_FAILURE(t.Load(std::string(kTestdata) + "/llama3_style"));  // a directory
  EXPECT_EQ(mp_tokenizer_vocab_size(t.tokenizer), 8012);
  EXPECT_EQ(mp_tokenizer_token_to_id(t.tokenizer, "<|begin_of_text|>"), 8000);
  EXPECT_STREQ(mp_tokenizer_id_to_token(t.tokenizer, 8000), "<|begin_of_text|>");
  EXPECT_EQ(mp_tokenizer_id_to_token(t.tokenizer, 8012), nullptr);
  EXPECT_TRUE(mp_tokenizer_is_special(t.tokenizer, 8009));
  EXPECT_FALSE(mp_tokenizer_is_special(t.tokenizer, 100));
  int64_t prefix[4];
  int n = 0;
  mp_tokenizer_template_prefix(t.tokenizer, prefix, 4, &n);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(prefix[0], 8000);
  uint32_t bad[] = {5, 9000};
  char *text = nullptr;
  size_t bytes = 0;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_tokenizer_decode(t.tokenizer, bad, 2, 0, &text, &bytes, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("id 9000 (at position 1)"), std::string::npos)
      << err.message;
}

// Writes a small tokenizer.json (model vocab a b ab, one merge, no other parts) with `part`
// spliced in, and returns the load error.
std::string LoadError(const std::string &name, const std::string &part,
                      const std::string &model = "") {
  const char *tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp == nullptr ? "/tmp" : tmp) + "/" + name + ".json";
  std::string model_json =
      model.empty() ? R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})"
                    : model;
  std::ofstream(path) << "{\"version\": \"1.0\", \"added_tokens\": [], \"model\": " << model_json
                      << (part.empty() ? "" : ", ") << part << "}";
  mp_tokenizer *tokenizer = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status = mp_tokenizer_load(path.c_str(), &tokenizer, &err);
  mp_tokenizer_free(tokenizer);
  if (status == MP_OK) return "ok";
  EXPECT_EQ(status, MP_ERR_INPUT) << err.message;
  std::string message = err.message;
  return message.substr(message.find(".json: ") + 7);  // without the temporary directory
}

TEST(Tokenizer, SmallFileLoads) { EXPECT_EQ(LoadError("ok", ""), "ok"); }

TEST(Tokenizer, RefusesWhatItDoesNotImplement) {
  EXPECT_EQ(LoadError("wordpiece", "", R"({"type": "WordPiece", "vocab": {}})"),
            "$.model.type: \"WordPiece\" is not implemented (mpengine implements BPE)");
  EXPECT_EQ(LoadError("unigram", "", R"({"type": "Unigram", "vocab": []})"),
            "$.model.type: \"Unigram\" is not implemented (mpengine implements BPE)");
  EXPECT_EQ(LoadError("dropout", "",
                      R"({"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []})"),
            "$.model.dropout: 0.1 is not implemented (BPE dropout makes the ids random); set it "
            "to null");
  EXPECT_EQ(LoadError("bert", R"("normalizer": {"type": "BertNormalizer"})"),
            "$.normalizer.type: \"BertNormalizer\" is not implemented (mpengine implements NFC, "
            "NFD, NFKC, NFKD, Prepend, Replace, Lowercase, Strip, ByteLevel and Sequence)");
  EXPECT_EQ(LoadError("whitespace", R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": )"
                                    R"([{"type": "Digits"}, {"type": "Whitespace"}]})"),
            "$.pre_tokenizer.pretokenizers[1].type: \"Whitespace\" is not implemented (mpengine "
            "implements Split, ByteLevel, Metaspace, Digits, WhitespaceSplit, CharDelimiterSplit "
            "and Sequence)");
  EXPECT_EQ(LoadError("wordpiece_decoder", R"("decoder": {"type": "WordPiece"})"),
            "$.decoder.type: \"WordPiece\" is not implemented (mpengine implements ByteLevel, "
            "Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence)");
  EXPECT_EQ(LoadError("post", R"("post_processor": {"type": "Mystery"})"),
            "$.post_processor.type: \"Mystery\" is not implemented (mpengine implements "
            "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing and Sequence)");
  EXPECT_EQ(LoadError("truncation", R"("truncation": {"max_length": 512})"),
            "$.truncation: truncation is not implemented (mpengine tokenizes whole documents); "
            "set it to null");
  EXPECT_EQ(LoadError("boundary", R"("pre_tokenizer": {"type": "Split", "pattern": )"
                                  R"({"Regex": "\\bx"}, "behavior": "Isolated"})"),
            "$.pre_tokenizer.pattern.Regex: the pattern \"\\bx\" is not supported: \\b (at byte "
            "0): Oniguruma's word boundary differs from PCRE2's");
  EXPECT_EQ(LoadError("merge", "", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})"),
            "$.model.merges[0]: the token \"b\" is not in $.model.vocab");
}

}  // namespace
