// tests/engine/stage_layout_test.cc — engine/model/stage_layout.h without MPI, memory or a
// communicator: the tensor-parallel shards of every rank put together are the one-rank tensors
// (their floats add up to the full tensor's, replicated tensors whole on each rank), ZeRO-3's
// held block elements of the dp ranks partition the blocks exactly, the held rectangles cover
// each held element once, a zero-bubble window takes the GEMM weights only, and a tp that does
// not divide the heads is refused naming the model file and what to change; with expert
// parallelism each ep rank holds its experts' rows, initialised as the one-rank run.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/model/stage_layout.h"
#include "topology/model.h"

namespace {

// The Llama family (GQA 8/4, SwiGLU, untied head) so that every split kind appears.
const char *kModel =
    "{\"name\": \"layout-test\", \"vocab_size\": 45, \"seq_len\": 8, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 32, \"max_positions\": 0},"
    "{\"type\": \"transformer\", \"hidden\": 32, \"heads\": 8, \"kv_heads\": 4, "
    "\"ffn_hidden\": 48, \"norm\": \"rmsnorm\", \"activation\": \"swiglu\", \"rope_theta\": 10000, "
    "\"repeat\": 3},"
    "{\"type\": \"layernorm\", \"hidden\": 32, \"norm\": \"rmsnorm\"},"
    "{\"type\": \"lm_head\", \"hidden\": 32, \"tie_embedding\": false}]}";

struct Model {
  mp_model *model = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  Model() { EXPECT_EQ(mp_model_parse_text(kModel, "layout-test.json", &model, &err), MP_OK); }
  ~Model() { mp_model_free(model); }
};

mp_stage_layout *Layout(const Model &m, int tp_rank, int tp_size, const mp_stage_span &span,
                        const mp_stage_zero *zero = nullptr) {
  const mp_stage_layout_config config = {2, 8, tp_rank, tp_size, false, span, zero, 0, 1, 0, 1};
  mp_stage_layout *layout = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_stage_layout_create(m.model, &config, &layout, &err), MP_OK) << err.message;
  return layout;
}

TEST(StageLayout, TensorParallelShardsMakeTheOneRankTensors) {
  Model m;
  const mp_stage_span whole = mp_stage_span_whole(3);
  for (int tp : {1, 2, 4}) {
    std::vector<size_t> floats;       // per one-rank tensor, summed over the tp ranks
    std::vector<size_t> full_floats;  // per one-rank tensor, its rows x cols
    std::vector<std::string> names;
    for (int rank = 0; rank < tp; ++rank) {
      mp_stage_layout *layout = Layout(m, rank, tp, whole);
      ASSERT_NE(layout, nullptr);
      const mp_param_layout *model = mp_stage_layout_model(layout);
      if (floats.empty()) {
        floats.assign(mp_param_layout_num_tensors(model), 0);
        for (int i = 0; i < mp_param_layout_num_tensors(model); ++i) {
          const mp_param_tensor *t = mp_param_layout_tensor(model, i);
          full_floats.push_back(t->rows * t->cols);
          names.push_back(t->name);
        }
      }
      size_t offset = 0;
      for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
        const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
        EXPECT_EQ(t->offset, offset) << t->full->name;  // contiguous, in the layout's order
        offset += t->count;
        const int full = (int)(t->full - mp_param_layout_tensor(model, 0));
        EXPECT_EQ(mp_stage_layout_index_of(layout, full), i);
        floats[full] += t->split == MP_TP_REPLICATED ? t->count / tp : t->count;
        if (t->split == MP_TP_REPLICATED) EXPECT_EQ(t->count, t->full->rows * t->full->cols);
      }
      EXPECT_EQ(offset, mp_stage_layout_num_params(layout));
      mp_stage_layout_free(layout);
    }
    for (size_t i = 0; i < floats.size(); ++i) {
      // A replicated tensor counted 1/tp per rank: the sum is the tensor once (sizes divide).
      EXPECT_EQ(floats[i], full_floats[i]) << names[i] << " at tp = " << tp;
    }
  }
}

TEST(StageLayout, ZeroThreeHeldBlocksPartitionTheBlocksAndRectanglesCoverThemOnce) {
  Model m;
  mp_stage_span span;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_stage_span_of_chain(3, 0, 3, &span, &err), MP_OK);  // embedding and two blocks
  const int dp = 3;
  std::vector<int> held;  // how many dp ranks hold each flat element
  for (int d = 0; d < dp; ++d) {
    const mp_stage_zero zero = {dp, d, true, true};
    mp_stage_layout *layout = Layout(m, 1, 2, span, &zero);
    ASSERT_NE(layout, nullptr);
    size_t first = 0, end = 0, largest = 0;
    mp_stage_layout_blocks_range(layout, &first, &end, &largest);
    ASSERT_LT(first, end);
    EXPECT_TRUE(mp_stage_layout_sharded_params(layout));
    if (held.empty()) held.assign(mp_stage_layout_num_params(layout), 0);
    // The stored array: the outside tensors and this rank's held block elements.
    size_t held_first = 0, held_end = 0;
    mp_stage_layout_held_blocks(layout, &held_first, &held_end);
    EXPECT_EQ(mp_stage_layout_params_floats(layout),
              mp_stage_layout_num_params(layout) - (end - first) + (held_end - held_first));
    struct Visit {
      std::vector<int> *held;
      std::vector<int> seen;
    } visit{&held, std::vector<int>(held.size(), 0)};
    auto count = [](void *context, const mp_stage_rect *rect, mp_error *) {
      auto *v = static_cast<Visit *>(context);
      for (size_t k = 0; k < rect->rows * rect->cols; ++k) ++v->seen[rect->flat_first + k];
      return MP_OK;
    };
    ASSERT_EQ(mp_stage_layout_for_each_held_rect(layout, 5, count, &visit, &err), MP_OK);
    for (size_t at = 0; at < held.size(); ++at) {
      const bool block = at >= first && at < end;
      size_t stretch_first = 0, stretch_end = 0, stored = 0;
      const bool holds =
          mp_stage_layout_params_stretch(layout, at, &stretch_first, &stretch_end, &stored);
      EXPECT_EQ(visit.seen[at], holds ? 1 : 0) << "element " << at << " of dp rank " << d;
      if (!block) EXPECT_TRUE(holds) << "outside element " << at;
      if (block && holds) ++held[at];
    }
    mp_stage_layout_free(layout);
  }
  for (size_t at = 0; at < held.size(); ++at) {
    if (held[at] != 0) EXPECT_EQ(held[at], 1) << "element " << at;
  }
}

TEST(StageLayout, ZeroBubbleWindowTakesTheGemmWeightsOnly) {
  Model m;
  mp_stage_layout *layout = Layout(m, 0, 2, mp_stage_span_whole(3));
  ASSERT_NE(layout, nullptr);
  size_t window_floats = 0;
  for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
    const bool in = mp_stage_layout_grad_in_window(layout, i, MP_GRAD_WINDOW_BLOCK_WEIGHTS);
    const std::string name = t->full->name;
    const bool gemm = name.find("block.") == 0 && name.find("weight") != std::string::npos &&
                      name.find("ln") == std::string::npos;
    EXPECT_EQ(in, gemm) << name;
    size_t offset = 0;
    EXPECT_EQ(mp_stage_layout_grad_offset(layout, i, MP_GRAD_WINDOW_BLOCK_WEIGHTS, &offset), !in);
    if (in) window_floats += t->count;
  }
  EXPECT_EQ(mp_stage_layout_grad_array_floats(layout, MP_GRAD_WINDOW_BLOCK_WEIGHTS),
            mp_stage_layout_num_params(layout) - window_floats);
  mp_stage_layout_free(layout);
}

TEST(StageLayout, RefusesATpThatDoesNotDivideTheHeads) {
  Model m;
  const mp_stage_layout_config config = {2, 8, 0, 3, false, mp_stage_span_whole(3),
                                         nullptr, 0, 1, 0, 1};
  mp_stage_layout *layout = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_stage_layout_create(m.model, &config, &layout, &err), MP_ERR_INPUT);
  EXPECT_EQ(layout, nullptr);
  EXPECT_NE(std::strstr(err.message, "layout-test.json with tp = 3"), nullptr) << err.message;
  EXPECT_NE(std::strstr(err.message, "choose a tp that divides the heads"), nullptr)
      << err.message;
}


// Expert parallelism: at ep 2 each rank holds half of every block's expert_fc1 and expert_fc2
// (rows [r R/2, (r+1) R/2): its 2 of the 4 experts), the other tensors as at ep 1; initialising
// each rank's shard rectangle by rectangle gives exactly the one-rank run's numbers at those rows,
// and an ep that does not divide the experts is refused naming the model file.
const char *kMoeModel =
    "{\"name\": \"moe-layout-test\", \"vocab_size\": 45, \"seq_len\": 8, \"layers\": ["
    "{\"type\": \"embedding\", \"hidden\": 32, \"max_positions\": 0},"
    "{\"type\": \"transformer\", \"hidden\": 32, \"heads\": 4, \"kv_heads\": 2, "
    "\"norm\": \"rmsnorm\", \"activation\": \"swiglu\", \"bias\": false, "
    "\"rope_theta\": 10000, \"repeat\": 2, "
    "\"moe\": {\"experts\": 4, \"top_k\": 2, \"expert_ffn_hidden\": 12}},"
    "{\"type\": \"layernorm\", \"hidden\": 32, \"norm\": \"rmsnorm\"},"
    "{\"type\": \"lm_head\", \"hidden\": 32, \"tie_embedding\": false}]}";

struct InitInto {
  const mp_param_layout *model;
  std::vector<float> *shard;
};

mp_status VisitInit(void *context, const mp_stage_rect *rect, mp_error *err) {
  InitInto *into = static_cast<InitInto *>(context);
  mp_stage_init_context init = {into->model, 7};
  return mp_stage_init_fill(&init, rect->tensor, rect->row, rect->rows, rect->col, rect->cols,
                            into->shard->data() + rect->flat_first, err);
}

TEST(StageLayout, ExpertParallelRanksHoldTheirExpertsRows) {
  mp_model *model = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_model_parse_text(kMoeModel, "moe-layout-test.json", &model, &err), MP_OK)
      << err.message;
  const mp_stage_span whole = mp_stage_span_whole(2);
  const mp_stage_layout_config one = {2, 8, 0, 1, false, whole, nullptr, 0, 1, 0, 1};
  mp_stage_layout *serial = nullptr;
  ASSERT_EQ(mp_stage_layout_create(model, &one, &serial, &err), MP_OK) << err.message;
  const mp_param_layout *full = mp_stage_layout_model(serial);
  std::vector<float> all(mp_param_layout_num_params(full));
  mp_param_layout_init_params(full, all.data(), 7);
  int experts_seen = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const mp_stage_layout_config config = {2, 8, 0, 1, false, whole, nullptr, 0, 1, rank, 2};
    mp_stage_layout *layout = nullptr;
    ASSERT_EQ(mp_stage_layout_create(model, &config, &layout, &err), MP_OK) << err.message;
    std::vector<float> shard(mp_stage_layout_num_params(layout));
    InitInto into = {mp_stage_layout_model(layout), &shard};
    ASSERT_EQ(mp_stage_layout_for_each_held_rect(layout, 37, VisitInit, &into, &err), MP_OK)
        << err.message;
    for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
      const size_t whole_count = t->full->rows * t->full->cols;
      const bool expert = std::strstr(t->full->name, "expert_fc") != nullptr;
      EXPECT_EQ(t->ep_size, expert ? 2 : 1) << t->full->name;
      EXPECT_EQ(t->count, expert ? whole_count / 2 : whole_count) << t->full->name;
      const size_t from = t->full->offset + (expert ? (size_t)rank * t->count : 0);
      for (size_t k = 0; k < t->count; ++k) {
        ASSERT_EQ(shard[t->offset + k], all[from + k]) << t->full->name << " element " << k;
      }
      experts_seen += expert;
    }
    mp_stage_layout_free(layout);
  }
  EXPECT_EQ(experts_seen, 2 * 2 * 2);  // 2 ranks x 2 blocks x (fc1, fc2)
  const mp_stage_layout_config three = {2, 8, 0, 1, false, whole, nullptr, 0, 1, 0, 3};
  mp_stage_layout *refused = nullptr;
  EXPECT_EQ(mp_stage_layout_create(model, &three, &refused, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "moe-layout-test.json with ep = 3: its 4 experts do not divide over ep; use an ep "
               "that divides them");
  mp_stage_layout_free(serial);
  mp_model_free(model);
}

}  // namespace
