// tests/schedules/schedule_test.cc — the generators' action lists against golden lists, the peers
// they name, the kind names, and the refusals with the numbers that would work.
#include "schedules/schedule.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/schedules/schedule_builder.h"

namespace {

using mpengine_test::Actions;
using mpengine_test::OwnedSchedule;

struct Generated {
  OwnedSchedule owned;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status;
  Generated(mp_schedule_kind kind, int pp, int m, int v)
      : status(mp_schedule_generate(kind, pp, m, v, &owned.s, &err)) {}
  const mp_schedule &s() const { return owned.s; }
};

TEST(Generate, GPipeRunsAllForwardsThenAllBackwards) {
  Generated g(MP_SCHEDULE_GPIPE, 2, 3, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  EXPECT_EQ(Actions(g.s(), 0), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(Actions(g.s(), 1), "F0 F1 F2 B0 B1 B2");
}

TEST(Generate, OneFOneBWarmsUpPpMinusRankMinusOneForwards) {
  Generated g(MP_SCHEDULE_1F1B, 3, 4, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  EXPECT_EQ(Actions(g.s(), 0), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(Actions(g.s(), 1), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(Actions(g.s(), 2), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(Generate, OneFOneBWithFewerMicroBatchesThanRanksWarmsUpAll) {
  Generated g(MP_SCHEDULE_1F1B, 4, 2, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  EXPECT_EQ(Actions(g.s(), 0), "F0 F1 B0 B1");  // warm-up min(3, 2) = 2
  EXPECT_EQ(Actions(g.s(), 2), "F0 F1 B0 B1");  // warm-up 1, one F/B pair, cool-down 1
  EXPECT_EQ(Actions(g.s(), 3), "F0 B0 F1 B1");
}

TEST(Generate, InterleavedFollowsMegatronsGroupsOfPp) {
  Generated g(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 4, 2);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  // Rank 0 warms up (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, rank 1 warms up 2.
  EXPECT_EQ(Actions(g.s(), 0), "F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a B2b B3b B2a B3a");
  EXPECT_EQ(Actions(g.s(), 1), "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a");
}

TEST(Generate, InterleavedWithMEqualToPpRunsEveryForwardFirst) {
  Generated g(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 2, 2);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  EXPECT_EQ(Actions(g.s(), 1), "F0a F1a F0b F1b B0b B1b B0a B1a");
}

TEST(Generate, ZeroBubbleH1SplitsTheBackwardAndDefersW) {
  Generated g(MP_SCHEDULE_ZB_H1, 3, 4, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  EXPECT_EQ(Actions(g.s(), 0), "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3");
  EXPECT_EQ(Actions(g.s(), 1), "F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3");
  EXPECT_EQ(Actions(g.s(), 2), "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3");
}

TEST(Generate, SinglePipelineRankAndSingleMicroBatch) {
  Generated one_rank(MP_SCHEDULE_1F1B, 1, 3, 1);
  ASSERT_EQ(one_rank.status, MP_OK) << one_rank.err.message;
  EXPECT_EQ(Actions(one_rank.s(), 0), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(one_rank.s().ranks[0].actions[0].recv_from, MP_NO_PEER);
  EXPECT_EQ(one_rank.s().ranks[0].actions[0].send_to, MP_NO_PEER);
  Generated one_micro_batch(MP_SCHEDULE_ZB_H1, 3, 1, 1);
  ASSERT_EQ(one_micro_batch.status, MP_OK) << one_micro_batch.err.message;
  EXPECT_EQ(Actions(one_micro_batch.s(), 0), "F0 I0 W0");
  EXPECT_EQ(Actions(one_micro_batch.s(), 2), "F0 I0 W0");
}

TEST(Generate, ActionsNameTheirNeighboursAsPeers) {
  Generated g(MP_SCHEDULE_1F1B, 3, 2, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  const mp_action &first_forward = g.s().ranks[0].actions[0];
  EXPECT_EQ(first_forward.recv_from, MP_NO_PEER);  // stage 0 reads data
  EXPECT_EQ(first_forward.send_to, 1);
  const mp_action &middle_forward = g.s().ranks[1].actions[0];  // F0
  EXPECT_EQ(middle_forward.recv_from, 0);
  EXPECT_EQ(middle_forward.send_to, 2);
  const mp_action &middle_backward = g.s().ranks[1].actions[2];  // B0
  ASSERT_EQ(middle_backward.kind, MP_ACTION_BACKWARD);
  EXPECT_EQ(middle_backward.recv_from, 2);
  EXPECT_EQ(middle_backward.send_to, 0);
  const mp_action &last_backward = g.s().ranks[2].actions[1];  // B0 on the last stage
  EXPECT_EQ(last_backward.recv_from, MP_NO_PEER);  // the loss is local
  EXPECT_EQ(last_backward.send_to, 1);
}

TEST(Generate, InterleavedChunksWrapFromTheLastRankToTheFirst) {
  Generated g(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 2, 2);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  const mp_action &rank1_chunk0 = g.s().ranks[1].actions[0];  // F0a: stage 1
  EXPECT_EQ(rank1_chunk0.recv_from, 0);
  EXPECT_EQ(rank1_chunk0.send_to, 0);  // stage 2 is chunk 1 of rank 0
  const mp_action &rank0_chunk1 = g.s().ranks[0].actions[2];  // F0b: stage 2
  EXPECT_EQ(rank0_chunk1.chunk, 1);
  EXPECT_EQ(rank0_chunk1.recv_from, 1);
  EXPECT_EQ(rank0_chunk1.send_to, 1);
  const mp_action &rank1_chunk1 = g.s().ranks[1].actions[2];  // F0b: stage 3, the last
  EXPECT_EQ(rank1_chunk1.send_to, MP_NO_PEER);
}

TEST(Generate, ZeroBubbleWeightGradientsHaveNoMessages) {
  Generated g(MP_SCHEDULE_ZB_H1, 2, 2, 1);
  ASSERT_EQ(g.status, MP_OK) << g.err.message;
  for (int r = 0; r < 2; ++r) {
    for (int a = 0; a < g.s().ranks[r].num_actions; ++a) {
      const mp_action &action = g.s().ranks[r].actions[a];
      if (action.kind != MP_ACTION_BACKWARD_WEIGHT) continue;
      EXPECT_EQ(action.recv_from, MP_NO_PEER);
      EXPECT_EQ(action.send_to, MP_NO_PEER);
    }
  }
}

struct Refusal {
  mp_schedule_kind kind;
  int pp, m, v;
  const char *message;
};

TEST(Generate, RefusesWhatAKindCannotRunAndSaysWhatWould) {
  const Refusal refusals[] = {
      {MP_SCHEDULE_GPIPE, 4, 8, 2,
       "gpipe runs one model chunk per rank, so virtual stages must be 1 (got 2); for 2 chunks "
       "per rank use interleaved-1f1b"},
      {MP_SCHEDULE_ZB_H1, 4, 8, 3,
       "zb-h1 runs one model chunk per rank, so virtual stages must be 1 (got 3); for 3 chunks "
       "per rank use interleaved-1f1b"},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 4, 8, 1,
       "interleaved-1f1b needs at least 2 model chunks per rank (virtual stages); got 1: use "
       "virtual stages 2 or more, or 1f1b for one chunk per rank"},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 1, 8, 2,
       "interleaved-1f1b needs pp of at least 2 (with one pipeline rank there is no bubble to "
       "shrink); got pp = 1: use 1f1b"},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 4, 6, 2,
       "interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 4; got 6: use "
       "4 or 8"},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 4, 2, 2,  // m < p
       "interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 4; got 2: use "
       "4"},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 2, 1, 2,  // m = 1
       "interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 2; got 1: use "
       "2"},
      {MP_SCHEDULE_1F1B, 0, 8, 1, "pp must be between 1 and 1024 pipeline ranks, got 0"},
      {MP_SCHEDULE_1F1B, 4, 0, 1,
       "the number of micro-batches must be between 1 and 1048576, got 0"},
      {MP_SCHEDULE_1F1B, 1024, 2048, 1,
       "pp x micro-batches x virtual stages = 1024 x 2048 x 1 = 2097152 is more than the 1048576 "
       "micro-batch chunks a schedule may hold; use fewer micro-batches"},
      {MP_SCHEDULE_CUSTOM, 2, 2, 1,
       "a custom schedule is built action by action, not generated; generate gpipe, 1f1b, "
       "interleaved-1f1b or zb-h1"},
  };
  for (const Refusal &refusal : refusals) {
    SCOPED_TRACE(refusal.message);
    Generated g(refusal.kind, refusal.pp, refusal.m, refusal.v);
    EXPECT_EQ(g.status, MP_ERR_INPUT);
    EXPECT_EQ(std::string(g.err.message), refusal.message);
    EXPECT_EQ(g.s().ranks, nullptr);  // nothing is left allocated
  }
}

TEST(Generate, AcceptsFewerMicroBatchesThanRanksWhereTheKindCan) {
  for (mp_schedule_kind kind : {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B, MP_SCHEDULE_ZB_H1}) {
    Generated g(kind, 8, 3, 1);
    EXPECT_EQ(g.status, MP_OK) << mp_schedule_kind_name(kind) << ": " << g.err.message;
  }
}

TEST(KindNames, RoundTripAndSuggestTheClosest) {
  for (mp_schedule_kind kind : {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B,
                                MP_SCHEDULE_INTERLEAVED_1F1B, MP_SCHEDULE_ZB_H1}) {
    mp_schedule_kind parsed;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_schedule_kind_parse(mp_schedule_kind_name(kind), &parsed, &err), MP_OK);
    EXPECT_EQ(parsed, kind);
  }
  mp_schedule_kind parsed;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_kind_parse("zb-h2", &parsed, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown schedule kind 'zb-h2'; did you mean 'zb-h1'? (kinds: gpipe, 1f1b, "
            "interleaved-1f1b, zb-h1)");
  ASSERT_EQ(mp_schedule_kind_parse("custom", &parsed, &err), MP_ERR_INPUT);
  ASSERT_EQ(mp_schedule_kind_parse("pipedream-2bw", &parsed, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown schedule kind 'pipedream-2bw' (kinds: gpipe, 1f1b, interleaved-1f1b, zb-h1)");
}

TEST(StageLayout, ChunkCOfRankRHoldsStageCTimesPpPlusR) {
  EXPECT_EQ(mp_stage_index(4, 1, 2), 9);
  EXPECT_EQ(mp_stage_rank(4, 9), 1);
  EXPECT_EQ(mp_stage_chunk(4, 9), 2);
}

}  // namespace
