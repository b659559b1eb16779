// tests/topology/hf_config_test.cc — topology/hf_config.h as `run --init-from` will call it:
// the description built from a config transformers wrote (tests/tools/testdata/hf, see
// tools/bench/hf_import_golden.py), the options and the info, a refusal leaving nothing behind,
// and the text writer's numbers, strings and layout. The refusals one by one, with their
// messages, are tests/tools/import_cli_test.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <cjson/cJSON.h>

#include "topology/hf_config.h"
#include "topology/layer_cost.h"
#include "topology/model.h"

namespace {

const char kFixtures[] = "tests/tools/testdata/hf";

std::string fixture(const char *part, const char *name) {
  return std::string(kFixtures) + "/" + part + "/" + name;
}

std::string read_file(const char *path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The description as text, or "" with the message in err.
std::string text_of(const cJSON *description, mp_error *err) {
  char *text = nullptr;
  if (mp_hf_model_json_text(description, &text, err) != MP_OK) return "";
  std::string result(text);
  free(text);
  return result;
}

struct Imported {
  cJSON *description = nullptr;
  mp_hf_import_info info{};
  mp_error err = MP_ERROR_INITIALIZER;
  ~Imported() { cJSON_Delete(description); }
  mp_status run(const std::string &path, const mp_hf_import_options *options) {
    return mp_hf_config_to_model_json(path.c_str(), options, &description, &info, &err);
  }
};

TEST(HfConfigTest, Llama31WithDefaultsTakesTheCheckpointsLengthAndDirectoryName) {
  Imported imported;
  ASSERT_EQ(imported.run(fixture("import", "llama3-8b"), nullptr), MP_OK) << imported.err.message;
  EXPECT_STREQ(imported.info.architecture, "LlamaForCausalLM");
  EXPECT_EQ(std::string(imported.info.config_path),
            fixture("import", "llama3-8b") + "/config.json");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(imported.description, "name");
  const cJSON *seq_len = cJSON_GetObjectItemCaseSensitive(imported.description, "seq_len");
  ASSERT_TRUE(cJSON_IsString(name) && cJSON_IsNumber(seq_len));
  EXPECT_STREQ(name->valuestring, "llama3-8b");
  EXPECT_EQ(seq_len->valuedouble, 131072.0); // max_position_embeddings

  mp_model *model = nullptr;
  const std::string text = text_of(imported.description, &imported.err);
  ASSERT_EQ(mp_model_parse_text(text.c_str(), "import", &model, &imported.err), MP_OK)
      << imported.err.message;
  EXPECT_EQ(mp_model_params(model), 8030261248LL); // transformers' num_parameters()
  EXPECT_EQ(mp_model_num_transformer_layers(model), 32);
  mp_model_free(model);
}

TEST(HfConfigTest, OptionsSetSeqLenAndNameAndTheTextIsTheExample) {
  mp_hf_import_options options = MP_HF_IMPORT_OPTIONS_INITIALIZER;
  options.seq_len = 4096;
  Imported imported;
  ASSERT_EQ(imported.run(fixture("import", "qwen2.5-0.5b"), &options), MP_OK)
      << imported.err.message;
  EXPECT_STREQ(imported.info.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(text_of(imported.description, &imported.err),
            read_file("examples/models/qwen2.5-0.5b.json"));

  options.name = "renamed";
  options.seq_len = 0;
  Imported renamed;
  ASSERT_EQ(renamed.run(fixture("import", "tiny-qwen2") + "/config.json", &options), MP_OK)
      << renamed.err.message;
  EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(renamed.description, "name")->valuestring,
               "renamed");
  // Without options.name, _name_or_path's last component.
  Imported hub_name;
  ASSERT_EQ(hub_name.run(fixture("import", "tiny-qwen2"), nullptr), MP_OK);
  EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(hub_name.description, "name")->valuestring,
               "Qwen2.5-tiny-test");
}

TEST(HfConfigTest, ARefusalIsAnInputErrorAndReturnsNothing) {
  Imported imported;
  EXPECT_EQ(imported.run(fixture("refuse", "mistral-7b-v0.1"), nullptr), MP_ERR_INPUT);
  EXPECT_EQ(imported.description, nullptr);
  EXPECT_NE(std::string(imported.err.message).find("$.sliding_window: 4096"), std::string::npos)
      << imported.err.message;
  Imported missing;
  EXPECT_EQ(missing.run(std::string(kFixtures) + "/no-such-checkpoint", nullptr), MP_ERR_INPUT);
  EXPECT_EQ(missing.description, nullptr);
}

TEST(HfConfigTest, TextWriterNumbersReadBackExactlyInTheirShortestForm) {
  cJSON *root = cJSON_Parse(
      R"({"name": "a \"q\"\n",
          "n": [8, 1e-05, 0.1, 2.5e-07, 500000, 1e+300, -3, 0.3333333333333333],
          "empty": [], "flag": false, "nothing": null, "nested": {"k": [1, {"x": true}]}})");
  ASSERT_NE(root, nullptr);
  mp_error err = MP_ERROR_INITIALIZER;
  // The top-level keys one per line; an array's items one per line; deeper on one line.
  EXPECT_EQ(text_of(root, &err),
            "{\n"
            "  \"name\": \"a \\\"q\\\"\\u000a\",\n"
            "  \"n\": [\n"
            "    8,\n"
            "    1e-05,\n"
            "    0.1,\n"
            "    2.5e-07,\n"
            "    500000,\n"
            "    1e+300,\n"
            "    -3,\n"
            "    0.3333333333333333\n"
            "  ],\n"
            "  \"empty\": [],\n"
            "  \"flag\": false,\n"
            "  \"nothing\": null,\n"
            "  \"nested\": {\"k\": [1, {\"x\": true}]}\n"
            "}\n")
      << err.message;
  cJSON *array = cJSON_CreateArray();
  char *text = nullptr;
  EXPECT_EQ(mp_hf_model_json_text(array, &text, &err), MP_ERR_INPUT); // not a description
  EXPECT_EQ(text, nullptr);
  cJSON_Delete(array);
  cJSON_Delete(root);
}

}  // namespace
