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
                                  << " is missing: install the fortunes packages (tools/setup.sh; "
                                     "eo-iso3/ is Debian's fortunes-eo-iso3)";
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

// ---- features the fortune goldens do not reach -------------------------------------------------
//
// Small tokenizer.json files (one 92-token vocabulary, each config one feature: split behaviors and
// invert, Oniguruma's \s and \w, (?i:...), Digits, WhitespaceSplit, CharDelimiterSplit, NFKC +
// Lowercase + Strip + regex Replace, ByteLevel with add_prefix_space, Metaspace always/never with
// split, unk with and without fuse_unk next to byte fallback, end_of_word_suffix,
// continuing_subword_prefix, added tokens with single_word / lstrip / rstrip / normalized,
// RobertaProcessing, a template with a suffix, Replace/Fuse/Strip decoders, no decoder), with the
// ids and decodes of Hugging Face tokenizers 0.20.3 (Tokenizer.from_str of the same JSON; encode
// with and without special tokens; decode with and without skip_special_tokens).

// The vocabulary every feature case shares (HF ids in order).
const char kFeatureVocab[] = R"j({"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12,"n":13,"o":14,"p":15,"q":16,"r":17,"s":18,"t":19,"u":20,"v":21,"w":22,"x":23,"y":24,"z":25,"A":26,"B":27,"C":28,"D":29,"E":30,"F":31,"G":32,"H":33,"I":34,"J":35,"K":36,"L":37,"M":38,"N":39,"O":40,"P":41,"Q":42,"R":43,"S":44,"T":45,"U":46,"V":47,"W":48,"X":49,"Y":50,"Z":51,"0":52,"1":53,"2":54,"3":55,"4":56,"5":57,"6":58,"7":59,"8":60,"9":61,".":62,",":63,"!":64,"?":65,"'":66,"-":67,"Ġ":68,"Ċ":69,"▁":70,"<unk>":71,"<s>":72,"</s>":73,"<0xC3>":74,"<0xA9>":75,"##h":76,"##e":77,"e</w>":78,"d</w>":79,"th":80,"the":81,"he":82,"Ġt":83,"Ġthe":84,"an":85,"and":86,"▁t":87,"▁the":88,"in":89,"ing":90,"12":91})j";

struct FeatureConfig {
  const char *name;
  const char *parts;        // the tokenizer.json keys other than "model"
  const char *model;        // $.model without its vocab
  const char *extra_vocab;  // entries added to kFeatureVocab
};

const FeatureConfig kFeatureConfigs[] = {
    {"split_removed",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":" "},"behavior":"Removed","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_merged_with_previous",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithPrevious","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_merged_with_next",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s"},"behavior":"MergedWithNext","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_contiguous",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\d"},"behavior":"Contiguous","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_invert",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\p{L}+"},"behavior":"Removed","invert":true},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_s_is_onig_space",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Removed","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_w_is_onig_word",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":true},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"split_case_insensitive",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re)|\\p{L}+"},"behavior":"Isolated","invert":false},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"digits",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Digits","individual_digits":false}]},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"digits_individual",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Digits","individual_digits":true},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"char_delimiter",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"CharDelimiterSplit","delimiter":"-"},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"normalizers",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Lowercase"},{"type":"Strip","strip_left":true,"strip_right":true},{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}]},"pre_tokenizer":null,"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"byte_level_prefix",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"metaspace_always_split",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":3,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},"post_processor":null,"decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":true,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"metaspace_never",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false},"post_processor":null,"decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false}})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"unk_not_fused",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"unk_fused_byte_fallback",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]}})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"end_of_word_suffix",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":"</w>","fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2","th e</w>"]})j",
     R"j({"the</w>":92})j"},
    {"continuing_subword_prefix",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":"##","end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t ##h","th ##e"]})j",
     R"j({})j"},
    {"added_tokens",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":200,"content":"ING","single_word":true,"lstrip":false,"rstrip":false,"normalized":true,"special":false},{"id":201,"content":"<s>","single_word":false,"lstrip":false,"rstrip":true,"normalized":false,"special":true},{"id":202,"content":"</s>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true},{"id":203,"content":"Zq","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],"normalizer":{"type":"Lowercase"},"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"roberta",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":0,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},{"id":1,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":{"type":"RobertaProcessing","sep":["</s>",2],"cls":["<s>",1],"trim_offsets":true,"add_prefix_space":false},"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"template_and_decoders",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},"pre_tokenizer":null,"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],"pair":[{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[2],"tokens":["</s>"]}}},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":1}]}})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
    {"no_decoder",
     R"j({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null})j",
     R"j({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"merges":["t h","th e","h e","Ġ t","Ġt he","a n","an d","▁ t","▁t he","i n","in g","1 2"]})j",
     R"j({})j"},
};

struct FeatureCase {
  const char *config;
  const char *text;
  std::vector<uint32_t> ids, ids_no_special;
  const char *decoded, *decoded_skip_special;
};

const FeatureCase kFeatureCases[] = {
    {"split_removed", "the and  the", {81, 86, 81}, {81, 86, 81}, "the and the", "the and the"},
    {"split_removed", " the ", {81}, {81}, "the", "the"},
    {"split_merged_with_previous", "the and  the ", {81, 71, 86, 71, 71, 81, 71}, {81, 71, 86, 71, 71, 81, 71}, "the <unk> and <unk> <unk> the <unk>", "the <unk> and <unk> <unk> the <unk>"},
    {"split_merged_with_previous", "  a", {71, 71, 0}, {71, 71, 0}, "<unk> <unk> a", "<unk> <unk> a"},
    {"split_merged_with_next", "the and  the ", {81, 71, 86, 71, 71, 81, 71}, {81, 71, 86, 71, 71, 81, 71}, "the <unk> and <unk> <unk> the <unk>", "the <unk> and <unk> <unk> the <unk>"},
    {"split_merged_with_next", " a", {71, 0}, {71, 0}, "<unk> a", "<unk> a"},
    {"split_contiguous", "ab123cd4e", {0, 1, 91, 55, 2, 3, 56, 4}, {0, 1, 91, 55, 2, 3, 56, 4}, "a b 12 3 c d 4 e", "a b 12 3 c d 4 e"},
    {"split_contiguous", "12", {91}, {91}, "12", "12"},
    {"split_invert", "the, and! 12 in", {81, 86, 89}, {81, 86, 89}, "the and in", "the and in"},
    {"split_s_is_onig_space", "a\xe1\xa0\x8e" "b c", {0, 71, 1, 2}, {0, 71, 1, 2}, "a <unk> b c", "a <unk> b c"},
    {"split_s_is_onig_space", "a\xc2\xa0" "b\xe2\x80\xa8" "c", {0, 1, 2}, {0, 1, 2}, "a b c", "a b c"},
    {"split_w_is_onig_word", "ab\xcc\x81" "c d_e", {0, 1, 71, 2, 71, 3, 71, 4}, {0, 1, 71, 2, 71, 3, 71, 4}, "a b <unk> c <unk> d <unk> e", "a b <unk> c <unk> d <unk> e"},
    {"split_case_insensitive", "IT'S DON'T we'RE it\xc5\xbfs'\xc5\xbf", {34, 45, 66, 44, 71, 29, 40, 39, 66, 45, 71, 22, 4, 66, 43, 30, 71, 8, 19, 71, 18, 66, 71}, {34, 45, 66, 44, 71, 29, 40, 39, 66, 45, 71, 22, 4, 66, 43, 30, 71, 8, 19, 71, 18, 66, 71}, "I T ' S <unk> D O N ' T <unk> w e ' R E <unk> i t <unk> s ' <unk>", "I T ' S <unk> D O N ' T <unk> w e ' R E <unk> i t <unk> s ' <unk>"},
    {"digits", "a123 b45c", {0, 91, 55, 1, 56, 57, 2}, {0, 91, 55, 1, 56, 57, 2}, "a 12 3 b 4 5 c", "a 12 3 b 4 5 c"},
    {"digits", "1 2", {53, 54}, {53, 54}, "1 2", "1 2"},
    {"digits_individual", "a123 b45c", {0, 53, 54, 55, 71, 1, 56, 57, 2}, {0, 53, 54, 55, 71, 1, 56, 57, 2}, "a 1 2 3 <unk> b 4 5 c", "a 1 2 3 <unk> b 4 5 c"},
    {"char_delimiter", "the-and--in-", {81, 86, 89}, {81, 86, 89}, "the and in", "the and in"},
    {"normalizers", "  THE \xef\xac\x81ne\xc2\xa0\xc2\xa0" "AND  ", {81, 71, 5, 89, 4, 71, 86}, {81, 71, 5, 89, 4, 71, 86}, "the <unk> f in e <unk> and", "the <unk> f in e <unk> and"},
    {"normalizers", "\xc4\xb0\xce\xa3", {8, 71}, {8, 71}, "i <unk>", "i <unk>"},
    {"normalizers", "X\xe2\x80\x83", {23}, {23}, "x", "x"},
    {"byte_level_prefix", "the and\x0athe", {68, 81, 68, 86, 69, 81}, {68, 81, 68, 86, 69, 81}, " the and\x0athe", " the and\x0athe"},
    {"byte_level_prefix", " the", {68, 81}, {68, 81}, " the", " the"},
    {"metaspace_always_split", "the  and the", {70, 81, 70, 70, 86, 70, 81}, {70, 81, 70, 70, 86, 70, 81}, "the  and the", "the  and the"},
    {"metaspace_always_split", "<unk>the and", {71, 70, 81, 70, 86}, {71, 70, 81, 70, 86}, "<unk> the and", "the and"},
    {"metaspace_never", "the and the", {81, 70, 86, 70, 81}, {81, 70, 86, 70, 81}, "the and the", "the and the"},
    {"metaspace_never", " the", {70, 81}, {70, 81}, " the", " the"},
    {"unk_not_fused", "th\xc3\xbc\xc3\xbc" "e", {80, 71, 71, 4}, {80, 71, 71, 4}, "th <unk> <unk> e", "th <unk> <unk> e"},
    {"unk_not_fused", "\xc3\xa9\xc3\xa9", {71, 71}, {71, 71}, "<unk> <unk>", "<unk> <unk>"},
    {"unk_fused_byte_fallback", "th\xc3\xbc\xc3\xbc" "e\xc3\xa9", {80, 71, 4, 74, 75}, {80, 71, 4, 74, 75}, "th<unk>e\xc3\xa9", "th<unk>e\xc3\xa9"},
    {"unk_fused_byte_fallback", "\xc3\xa9\xc3\xbc\xc3\xa9", {74, 75, 74, 75, 71}, {74, 75, 74, 75, 71}, "\xc3\xa9\xc3\xa9<unk>", "\xc3\xa9\xc3\xa9<unk>"},
    {"end_of_word_suffix", "the and thed", {92, 85, 79, 81, 79}, {92, 85, 79, 81, 79}, "the</w> an d</w> the d</w>", "the</w> an d</w> the d</w>"},
    {"continuing_subword_prefix", "the th", {81, 80}, {81, 80}, "the th", "the th"},
    {"added_tokens", "ing sing ING <s>  the  </s>  and", {92, 18, 90, 92, 72, 81, 73, 86}, {92, 18, 90, 92, 72, 81, 73, 86}, "ING s ing ING <s> the </s> and", "ING s ing ING the and"},
    {"added_tokens", "xZqZQzq<s></s>", {23, 93, 25, 16, 25, 16, 72, 73}, {23, 93, 25, 16, 25, 16, 72, 73}, "x Zq z q z q <s> </s>", "x Zq z q z q"},
    {"added_tokens", "ing-ing", {92, 67, 92}, {92, 67, 92}, "ING - ING", "ING - ING"},
    {"roberta", "the and", {1, 81, 86, 2}, {81, 86}, "b the and c", "b the and c"},
    {"roberta", "", {1, 2}, {}, "b c", "b c"},
    {"template_and_decoders", "the and ", {1, 70, 81, 70, 86, 70, 2}, {70, 81, 70, 86, 70}, "b the and c", "b the and c"},
    {"template_and_decoders", " in", {1, 70, 70, 89, 2}, {70, 70, 89}, "b  inc", "b  inc"},
    {"no_decoder", "the and in", {81, 86, 89}, {81, 86, 89}, "the and in", "the and in"},
};

std::string FeatureJson(const FeatureConfig &config) {
  std::string parts = config.parts, model = config.model, extra = config.extra_vocab;
  std::string vocab = kFeatureVocab;
  if (extra != "{}") vocab = vocab.substr(0, vocab.size() - 1) + "," + extra.substr(1);
  return parts.substr(0, parts.size() - 1) + ",\"model\":" + model.substr(0, model.size() - 1) +
         ",\"vocab\":" + vocab + "}}";
}

TEST(Tokenizer, FeaturesMatchHuggingFace) {
  const char *tmp = std::getenv("TEST_TMPDIR");
  int cases = 0;
  for (const FeatureConfig &config : kFeatureConfigs) {
    std::string path = std::string(tmp == nullptr ? "/tmp" : tmp) + "/" + config.name + ".json";
    std::ofstream(path) << FeatureJson(config);
    Tokenizer t;
    ASSERT_NO_FATAL_FAILURE(t.Load(path));
    for (const FeatureCase &c : kFeatureCases) {
      if (std::string(c.config) != config.name) continue;
      EXPECT_EQ(Str(t.Encode(c.text, true)), Str(c.ids)) << config.name << ": \"" << c.text << "\"";
      EXPECT_EQ(Str(t.Encode(c.text, false)), Str(c.ids_no_special))
          << config.name << ": \"" << c.text << "\"";
      EXPECT_EQ(t.Decode(c.ids, false), c.decoded) << config.name << ": \"" << c.text << "\"";
      EXPECT_EQ(t.Decode(c.ids, true), c.decoded_skip_special)
          << config.name << ": \"" << c.text << "\"";
      cases++;
    }
  }
  EXPECT_EQ(cases, static_cast<int>(sizeof kFeatureCases / sizeof kFeatureCases[0]));
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
