// tests/engine/weight_source_test.cc — engine/weights/weight_source.h: the Hugging Face GPT-2
// source reads the golden of tools/bench/hf_gpt2_golden.py into mpengine's tensor table (a block of
// a transposed Conv1D weight is the transpose of the file's block, wte's padding rows are zero),
// and the llm.c sink and source carry those numbers through a file unchanged, block for block; a
// block outside a tensor is refused; the HF sink and source round-trip a model whose vocabulary is
// padded (the padding rows read as zero). The loss against transformers' is
// tests/tools/hf_checkpoint_test.sh.
#include "engine/weights/weight_source.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/weights/safetensors.h"
#include "topology/model.h"

namespace {

const char kGolden[] = "tests/engine/testdata/hf_gpt2_tiny";

// tiny-gpt's shape, the golden's: vocab 128, 64 channels, 4 heads, 4 layers, 64 positions.
const char kModel[] =
    "{\"name\": \"tiny-gpt\", \"vocab_size\": 128, \"seq_len\": 64, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 64, \"max_positions\": 64},"
    "{\"type\": \"transformer\", \"hidden\": 64, \"heads\": 4, \"ffn_hidden\": 256, \"repeat\": 4},"
    "{\"type\": \"layernorm\", \"hidden\": 64},"
    "{\"type\": \"lm_head\", \"hidden\": 64, \"tie_embedding\": true}]}";

class WeightSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mp_model_parse_text(kModel, "tiny-gpt.json", &model_, &err_), MP_OK) << err_.message;
    ASSERT_EQ(mp_param_layout_create(model_, 16, &layout_, &err_), MP_OK) << err_.message;
  }
  void TearDown() override {
    mp_param_layout_free(layout_);
    mp_model_free(model_);
  }
  // Tensor i whole through source.
  std::vector<float> Whole(mp_weight_source *source, int i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout_, i);
    std::vector<float> out(t->rows * t->cols);
    EXPECT_EQ(mp_weight_source_read(source, i, 0, t->rows, 0, t->cols, out.data(), &err_), MP_OK)
        << err_.message;
    return out;
  }
  mp_model *model_ = nullptr;
  mp_param_layout *layout_ = nullptr;
  mp_error err_ = MP_ERROR_INITIALIZER;
};

int Index(const mp_param_layout *layout, const char *name) {
  for (int i = 0; i < mp_param_layout_num_tensors(layout); ++i) {
    if (std::string(mp_param_layout_tensor(layout, i)->name) == name) return i;
  }
  return -1;
}

TEST_F(WeightSourceTest, HfGoldenMapsOntoTheTensorTable) {
  mp_weight_source *source = nullptr;
  ASSERT_EQ(mp_weight_source_open(layout_, kGolden, &source, &err_), MP_OK) << err_.message;
  EXPECT_STREQ(mp_weight_source_kind(source), "Hugging Face checkpoint");
  mp_safetensors *st = nullptr;
  ASSERT_EQ(mp_safetensors_open_dir(kGolden, &st, &err_), MP_OK) << err_.message;

  // fc.weight (4C, C) of block 2 is c_fc.weight (C, 4C) transposed; a block of it too.
  const int fc = Index(layout_, "block.2.fc.weight");
  ASSERT_GE(fc, 0);
  std::vector<float> file(64 * 256);
  ASSERT_EQ(mp_safetensors_read_elements(st, "transformer.h.2.mlp.c_fc.weight", 0, 64 * 256,
                                         file.data(), &err_),
            MP_OK);
  const std::vector<float> ours = Whole(source, fc);
  for (size_t r = 0; r < 256; ++r) {
    for (size_t c = 0; c < 64; ++c) ASSERT_EQ(ours[r * 64 + c], file[c * 256 + r]) << r << "," << c;
  }
  std::vector<float> block(5 * 7);
  ASSERT_EQ(mp_weight_source_read(source, fc, 100, 5, 30, 7, block.data(), &err_), MP_OK);
  for (size_t r = 0; r < 5; ++r) {
    for (size_t c = 0; c < 7; ++c) EXPECT_EQ(block[r * 7 + c], ours[(100 + r) * 64 + 30 + c]);
  }

  // A bias is the file's vector.
  const int bias = Index(layout_, "block.0.qkv.bias");
  std::vector<float> file_bias(192);
  ASSERT_EQ(mp_safetensors_read_elements(st, "transformer.h.0.attn.c_attn.bias", 0, 192,
                                         file_bias.data(), &err_),
            MP_OK);
  EXPECT_EQ(Whole(source, bias), file_bias);

  // Outside a tensor: a caller's bug.
  EXPECT_EQ(mp_weight_source_read(source, bias, 190, 3, 0, 1, block.data(), &err_),
            MP_ERR_RUNTIME);
  EXPECT_NE(std::string(err_.message).find("outside it"), std::string::npos) << err_.message;
  mp_safetensors_close(st);
  mp_weight_source_close(source);
}

TEST_F(WeightSourceTest, LlmcSinkAndSourceCarryTheHfWeightsUnchanged) {
  mp_weight_source *hf = nullptr;
  ASSERT_EQ(mp_weight_source_open_hf(layout_, kGolden, &hf, &err_), MP_OK) << err_.message;
  const std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/weight_source_test.bin";
  mp_weight_sink *sink = nullptr;
  ASSERT_EQ(mp_weight_sink_open(layout_, MP_WEIGHT_FORMAT_LLMC, path.c_str(), nullptr, &sink,
                                &err_),
            MP_OK)
      << err_.message;
  const int n = mp_param_layout_num_tensors(layout_);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(mp_weight_sink_write(sink, i, Whole(hf, i).data(), &err_), MP_OK) << err_.message;
  }
  ASSERT_EQ(mp_weight_sink_commit(sink, &err_), MP_OK) << err_.message;
  mp_weight_source *llmc = nullptr;
  ASSERT_EQ(mp_weight_source_open(layout_, path.c_str(), &llmc, &err_), MP_OK) << err_.message;
  EXPECT_STREQ(mp_weight_source_kind(llmc), "llm.c checkpoint");
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(Whole(llmc, i), Whole(hf, i)) << mp_param_layout_tensor(layout_, i)->name;
    const mp_param_tensor *t = mp_param_layout_tensor(layout_, i);
    if (t->cols > 2 && t->rows > 2) {  // an inner block, row by row in the file
      std::vector<float> a(2 * (t->cols - 2)), b(a.size());
      ASSERT_EQ(mp_weight_source_read(llmc, i, 1, 2, 1, t->cols - 2, a.data(), &err_), MP_OK);
      ASSERT_EQ(mp_weight_source_read(hf, i, 1, 2, 1, t->cols - 2, b.data(), &err_), MP_OK);
      EXPECT_EQ(a, b) << t->name;
    }
  }
  mp_weight_source_close(llmc);
  mp_weight_source_close(hf);
}

// vocab 100 pads to 128: the HF sink writes wte's 100 rows, the source reads the padding as zero
// and everything else back unchanged, through the directory the sink wrote (its config.json
// included).
TEST(WeightSinkTest, HfRoundTripWithPaddedVocabulary) {
  mp_error err = MP_ERROR_INITIALIZER;
  std::string text = kModel;
  text.replace(text.find("128"), 3, "100");
  mp_model *model = nullptr;
  mp_param_layout *layout = nullptr;
  ASSERT_EQ(mp_model_parse_text(text.c_str(), "v100.json", &model, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_param_layout_create(model, 16, &layout, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_param_layout_config(layout)->padded_vocab_size, 128);
  std::vector<float> params(mp_param_layout_num_params(layout));
  mp_param_layout_init_params(layout, params.data(), 5);
  const mp_param_tensor *wte = mp_param_layout_tensor(layout, 0);
  for (size_t i = 100 * wte->cols; i < wte->rows * wte->cols; ++i) params[i] = 0.0f;
  const std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                          "/weight_sink_hf";
  mp_weight_sink *sink = nullptr;
  ASSERT_EQ(mp_weight_sink_open(layout, MP_WEIGHT_FORMAT_HF, dir.c_str(), nullptr, &sink, &err),
            MP_OK)
      << err.message;
  const int n = mp_param_layout_num_tensors(layout);
  for (int i = n - 1; i >= 0; --i) {  // any order
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    ASSERT_EQ(mp_weight_sink_write(sink, i, params.data() + t->offset, &err), MP_OK)
        << err.message;
  }
  ASSERT_EQ(mp_weight_sink_commit(sink, &err), MP_OK) << err.message;
  mp_safetensors *st = nullptr;
  ASSERT_EQ(mp_safetensors_open_dir(dir.c_str(), &st, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_safetensors_find(st, "transformer.wte.weight")->shape[0], 100);
  EXPECT_EQ(mp_safetensors_find(st, "lm_head.weight"), nullptr);
  EXPECT_STREQ(mp_safetensors_metadata_get(st, 0, "format"), "pt");
  mp_safetensors_close(st);
  mp_weight_source *source = nullptr;
  ASSERT_EQ(mp_weight_source_open(layout, dir.c_str(), &source, &err), MP_OK) << err.message;
  std::vector<float> back(params.size(), -1.0f);
  for (int i = 0; i < n; ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    ASSERT_EQ(mp_weight_source_read(source, i, 0, t->rows, 0, t->cols, back.data() + t->offset,
                                    &err),
              MP_OK)
        << err.message;
  }
  EXPECT_EQ(back, params);
  mp_weight_source_close(source);
  mp_param_layout_free(layout);
  mp_model_free(model);
}

}  // namespace
