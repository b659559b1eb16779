// tests/common/json_reader_test.cc — the messages users see for malformed JSON files.
#include "common/json_reader.h"

#include <gtest/gtest.h>

#include <string>

namespace {

struct Parsed {
  cJSON *root = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ~Parsed() { cJSON_Delete(root); }
};

TEST(JsonReader, SyntaxErrorNamesLineAndColumn) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\n  \"a\": 1,\n  \"b\": ]\n}", "m.json", &p.root, &p.err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message), "m.json:3:8: JSON syntax error: expected a value, found ']'");
}

TEST(JsonReader, TruncatedInputSaysEndOfInput) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"a\": [1, 2", "m.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json:1:12: JSON syntax error: expected ',' or ']', found the end of the file");
}

TEST(JsonReader, SyntaxErrorsInsideStringsAndAfterTheValue) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"a\": \"x\\q\"}", "m.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json:1:10: JSON syntax error: expected an escape (\\\", \\\\, \\/, \\b, \\f, \\n, "
            "\\r, \\t or \\u), found 'q\"}'");
  ASSERT_EQ(mp_json_parse_text("{\"a\": 1} {", "m.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json:1:10: JSON syntax error: expected the end of the text after the top-level "
            "value, found '{'");
  ASSERT_EQ(mp_json_parse_text("{\"a\" 1}", "m.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json:1:6: JSON syntax error: expected ':' after the key, found '1}'");
}

TEST(JsonReader, EmptyTextIsRefused) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text(" \n", "m.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message), "m.json: empty, expected a JSON object");
}

TEST(JsonReader, MissingFileNamesIt) {
  Parsed p;
  ASSERT_EQ(mp_json_load_file("/nonexistent/model.json", &p.root, &p.err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "/nonexistent/model.json: cannot open: No such file or directory");
}

TEST(JsonReader, UnknownKeySuggestsClosest) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"hiden\": 4}", "m.json", &p.root, &p.err), MP_OK);
  mp_json_reader reader = {"m.json", &p.err};
  const char *known[] = {"hidden", "heads", "repeat", nullptr};
  ASSERT_EQ(mp_json_check_keys(&reader, p.root, "$.layers[1]", known), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json: $.layers[1]: unknown key \"hiden\"; did you mean \"hidden\"? "
            "(known keys: hidden, heads, repeat)");
}

TEST(JsonReader, DuplicateKeyIsRefused) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"heads\": 4, \"heads\": 8}", "m.json", &p.root, &p.err), MP_OK);
  mp_json_reader reader = {"m.json", &p.err};
  const char *known[] = {"heads", nullptr};
  ASSERT_EQ(mp_json_check_keys(&reader, p.root, "$", known), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message), "m.json: $: key \"heads\" is given twice; keep one");
}

TEST(JsonReader, IntegerChecks) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"a\": -4, \"b\": 7.5, \"c\": \"12\", \"d\": 12}", "m.json",
                               &p.root, &p.err),
            MP_OK);
  mp_json_reader reader = {"m.json", &p.err};
  int64_t value = 0;
  EXPECT_EQ(mp_json_require_int(&reader, p.root, "$", "a", MP_JSON_POSITIVE, &value), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message), "m.json: $.a: must be a positive integer, got -4");
  EXPECT_EQ(mp_json_require_int(&reader, p.root, "$", "b", MP_JSON_ANY, &value), MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message), "m.json: $.b: must be an integer, got 7.5");
  EXPECT_EQ(mp_json_require_int(&reader, p.root, "$", "c", MP_JSON_POSITIVE, &value),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json: $.c: must be a positive integer, got a string (\"12\"); drop the quotes");
  EXPECT_EQ(mp_json_require_int(&reader, p.root, "$", "e", MP_JSON_POSITIVE, &value),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json: $: missing required key \"e\" (a positive integer)");
  ASSERT_EQ(mp_json_require_int(&reader, p.root, "$", "d", MP_JSON_POSITIVE, &value), MP_OK);
  EXPECT_EQ(value, 12);
  ASSERT_EQ(mp_json_optional_int(&reader, p.root, "$", "z", MP_JSON_POSITIVE, 3, &value), MP_OK);
  EXPECT_EQ(value, 3);
}

TEST(JsonReader, ChoiceSuggestsClosest) {
  Parsed p;
  ASSERT_EQ(mp_json_parse_text("{\"norm\": \"rmsnrom\"}", "m.json", &p.root, &p.err), MP_OK);
  mp_json_reader reader = {"m.json", &p.err};
  const char *choices[] = {"layernorm", "rmsnorm", nullptr};
  int index = -1;
  ASSERT_EQ(mp_json_optional_choice(&reader, p.root, "$", "norm", choices, 0, &index),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(p.err.message),
            "m.json: $.norm: \"rmsnrom\" is not one of \"layernorm\", \"rmsnorm\"; did you mean "
            "\"rmsnorm\"?");
}

TEST(JsonReader, EditDistance) {
  EXPECT_EQ(mp_edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(mp_edit_distance("", "abc"), 3);
  EXPECT_EQ(mp_edit_distance("same", "same"), 0);
}

}  // namespace
