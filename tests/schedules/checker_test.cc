// tests/schedules/checker_test.cc — the checker accepts every generated schedule and names the
// first violation of a planted one: rank, action and the action it waits for.
#include "schedules/checker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "schedules/p2p.h"
#include "tests/schedules/schedule_builder.h"

namespace {

using mpengine_test::Build;
using mpengine_test::OwnedSchedule;

std::string Check(const mp_schedule &s, mp_p2p_model model = MP_P2P_EAGER) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status = mp_schedule_check(&s, model, &err);
  if (status == MP_OK) return "ok";
  EXPECT_EQ(status, MP_ERR_INPUT);
  return err.message;
}

TEST(Checker, AcceptsEveryGeneratedScheduleUnderTheRuntimesModel) {
  const mp_schedule_kind kinds[] = {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B,
                                    MP_SCHEDULE_INTERLEAVED_1F1B, MP_SCHEDULE_ZB_H1};
  int checked = 0;
  for (mp_schedule_kind kind : kinds) {
    for (int pp : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 8, 16}) {
        for (int v : {1, 2, 3}) {
          OwnedSchedule g;
          mp_error err = MP_ERROR_INITIALIZER;
          if (mp_schedule_generate(kind, pp, m, v, &g.s, &err) != MP_OK) continue;
          SCOPED_TRACE(std::string(mp_schedule_kind_name(kind)) + " pp=" + std::to_string(pp) +
                       " m=" + std::to_string(m) + " v=" + std::to_string(v));
          EXPECT_EQ(Check(g.s), "ok");
          ++checked;
        }
      }
    }
  }
  // gpipe, 1f1b and zb-h1 at v = 1 (3 x 5 x 6), interleaved at v = 2 and 3 where pp >= 2 and
  // m % pp == 0: pp = 2 (m = 2, 4, 8, 16), 3 (3), 4 (4, 8, 16), 8 (8, 16).
  EXPECT_EQ(checked, 3 * 5 * 6 + 2 * (4 + 1 + 3 + 2));
}

TEST(Checker, NonInterleavedSchedulesAlsoPassBatchedBlockingP2p) {
  for (mp_schedule_kind kind : {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B, MP_SCHEDULE_ZB_H1}) {
    for (int pp : {1, 2, 4}) {
      OwnedSchedule g;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(mp_schedule_generate(kind, pp, 8, 1, &g.s, &err), MP_OK) << err.message;
      EXPECT_EQ(Check(g.s, MP_P2P_RENDEZVOUS), "ok") << mp_schedule_kind_name(kind);
    }
  }
}

// Rank 0 runs B0 before F1 while rank 1 runs F1 before B0: each receives first from the other.
TEST(Checker, NamesAPlantedDeadlockAsACycleOfWaits) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(2, 2, 1, {"F0 B0 F1 B1", "F0 F1 B0 B1"}, &s));
  const std::string expected =
      "deadlock under eager point-to-point: rank 0, action 1 (B micro-batch 0), waits for the "
      "gradient of micro-batch 0 that rank 1 sends after its action 2 (B micro-batch 0); rank 1, "
      "action 1 (F micro-batch 1), waits for the activation of micro-batch 1 that rank 0 sends "
      "after its action 2 (F micro-batch 1); a cycle: none of them can go on";
  EXPECT_EQ(Check(s.s), expected);
  EXPECT_EQ(Check(s.s, MP_P2P_RENDEZVOUS).substr(0, 36), "deadlock under rendezvous point-to-p");
}

// The classic blocking-send deadlock: rank 0 sends F2's activation while rank 1 sends B0's
// gradient, and each posts the matching receive only later. Buffered (eager) sends run it.
TEST(Checker, NamesTheDeadlockOfTwoLoneBlockingSends) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(2, 4, 1, {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 B0 B1 F2 F3 B2 B3"}, &s));
  EXPECT_EQ(Check(s.s, MP_P2P_EAGER), "ok");
  EXPECT_EQ(Check(s.s, MP_P2P_RENDEZVOUS),
            "deadlock under rendezvous point-to-point: rank 0, after action 2 (F micro-batch 2), "
            "waits for rank 1 to receive the activation of micro-batch 2, a receive rank 1 posts "
            "only before its action 4 (F micro-batch 2); rank 1, after action 2 (B micro-batch "
            "0), waits for rank 0 to receive the gradient of micro-batch 0, a receive rank 0 "
            "posts only before its action 4 (B micro-batch 0); a cycle: none of them can go on");
}

// Megatron batches a steady-state F/B pair's two sends and two receives in one group; one group
// per boundary cannot, and the interleaved schedule hangs: what a naive blocking runtime meets.
TEST(Checker, InterleavedDeadlocksUnderOneBlockingGroupPerBoundary) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 4, 2, &g.s, &err), MP_OK);
  EXPECT_EQ(Check(g.s, MP_P2P_RENDEZVOUS),
            "deadlock under rendezvous point-to-point: rank 0, after action 5 (B micro-batch 0, "
            "chunk 1), waits for rank 1 to receive the gradient of micro-batch 0 from stage 2 to "
            "stage 1, a receive rank 1 posts only before its action 7 (B micro-batch 0, chunk 0); "
            "rank 1, after action 5 (B micro-batch 1, chunk 1), waits for rank 0 to receive the "
            "gradient of micro-batch 1 from stage 3 to stage 2, a receive rank 0 posts only "
            "before its action 7 (B micro-batch 1, chunk 1); a cycle: none of them can go on");
}

TEST(Checker, NamesABackwardPlantedBeforeItsForward) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(2, 1, 1, {"F0 B0", "B0 F0"}, &s));
  EXPECT_EQ(Check(s.s),
            "rank 1, action 0 (B micro-batch 0) runs before F micro-batch 0 (action 1), which it "
            "waits for");
}

TEST(Checker, NamesAWeightGradientPlantedBeforeItsBackward) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(1, 2, 1, {"F0 W0 I0 F1 I1 W1"}, &s));
  EXPECT_EQ(Check(s.s),
            "rank 0, action 1 (W micro-batch 0) runs before B micro-batch 0 (action 2), which it "
            "waits for");
}

TEST(Checker, NamesAForwardPlantedBeforeItsProducerOnTheSameRank) {
  // pp = 1 with two chunks: stage 1 (chunk b) consumes stage 0 (chunk a) on the same rank.
  OwnedSchedule s;
  ASSERT_TRUE(Build(1, 1, 2, {"F0b F0a B0b B0a"}, &s));
  EXPECT_EQ(Check(s.s),
            "rank 0, action 0 (F micro-batch 0, chunk 1) runs before F micro-batch 0, chunk 0 "
            "(action 1), which it waits for");
}

TEST(Checker, NamesMessagesReceivedInAnotherOrderThanSent) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(2, 2, 1, {"F0 F1 B0 B1", "F1 B1 F0 B0"}, &s));
  EXPECT_EQ(Check(s.s),
            "rank 1, action 0 (F micro-batch 1) waits for the activation of micro-batch 1, which "
            "rank 0 sends at action 1 (F micro-batch 1), but messages between two ranks are "
            "matched in the order they are sent and the 1st message rank 0 sends to rank 1 is "
            "the activation of micro-batch 0 (action 0, F micro-batch 0)");
}

TEST(Checker, NamesMissingAndRepeatedWork) {
  OwnedSchedule missing_backward;
  ASSERT_TRUE(Build(2, 2, 1, {"F0 F1 B0 B1", "F0 B0 F1"}, &missing_backward));
  EXPECT_EQ(Check(missing_backward.s),
            "rank 1: B of micro-batch 1 is missing; every micro-batch goes forward and backward "
            "through every chunk once");
  OwnedSchedule twice;
  ASSERT_TRUE(Build(1, 2, 1, {"F0 F0 B0 F1 B1"}, &twice));
  EXPECT_EQ(Check(twice.s),
            "rank 0: micro-batch 0 goes forward twice (actions 0 and 1); every micro-batch goes "
            "forward and backward through every chunk once");
  OwnedSchedule missing_chunk;
  ASSERT_TRUE(Build(2, 2, 2, {"F0a F1a F0b F1b B0b B1b B0a B1a", "F0a F1a F0b B0b B0a F1b"},
                    &missing_chunk));
  EXPECT_EQ(Check(missing_chunk.s),
            "rank 1: B of micro-batch 1, chunk 0 is missing; every micro-batch goes forward and "
            "backward through every chunk once");
  OwnedSchedule no_weight;
  ASSERT_TRUE(Build(1, 1, 1, {"F0 I0"}, &no_weight));
  EXPECT_EQ(Check(no_weight.s),
            "rank 0: micro-batch 0 has an input-gradient B (action 1) but no W; a split backward "
            "needs its weight-gradient W");
  OwnedSchedule stray_weight;
  ASSERT_TRUE(Build(1, 1, 1, {"F0 B0 W0"}, &stray_weight));
  EXPECT_EQ(Check(stray_weight.s),
            "rank 0: W of micro-batch 0 (action 2) follows a whole backward B; a W belongs only "
            "after an input-gradient B");
}

TEST(Checker, NamesOutOfRangeMicroBatches) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(1, 2, 1, {"F0 B0 F5 B5"}, &s));
  EXPECT_EQ(Check(s.s),
            "rank 0, action 2 (F micro-batch 5): micro-batch 5 is out of range; the schedule has "
            "2 (0 to 1)");
}

TEST(Checker, NamesAWrongPeer) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 3, 3, 1, &g.s, &err), MP_OK);
  g.s.ranks[1].actions[0].recv_from = 2;
  EXPECT_EQ(Check(g.s), "rank 1, action 0 (F micro-batch 0) receives from rank 2; its input "
                        "comes from rank 0");
  g.s.ranks[1].actions[0].recv_from = 0;
  g.s.ranks[2].actions[1].send_to = MP_NO_PEER;  // the last stage's B0 keeps its gradient
  EXPECT_EQ(Check(g.s), "rank 2, action 1 (B micro-batch 0) sends to none; its output goes to "
                        "rank 1");
}

TEST(P2pMatch, RefusesPeersThatAreNotOtherRanks) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 3, 2, 1, &g.s, &err), MP_OK);
  g.s.ranks[1].actions[0].recv_from = 7;
  mp_p2p_matching matching;
  ASSERT_EQ(mp_p2p_match(&g.s, &matching, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "rank 1, action 0 (F micro-batch 0) names rank 7 to receive from; a peer is another "
            "rank, 0 to 2");
  EXPECT_EQ(matching.recv_partner, nullptr);
}

TEST(P2pMatch, PairsEachSendWithItsReceive) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 2, 2, 1, &g.s, &err), MP_OK);
  mp_p2p_matching matching;
  ASSERT_EQ(mp_p2p_match(&g.s, &matching, &err), MP_OK) << err.message;
  // Rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1.
  EXPECT_EQ(matching.send_partner[0][1], 2);  // rank 0's F1 feeds rank 1's F1
  EXPECT_EQ(matching.recv_partner[1][2], 1);
  EXPECT_EQ(matching.send_partner[1][1], 2);  // rank 1's B0 feeds rank 0's B0
  EXPECT_EQ(matching.recv_partner[0][3], 3);  // rank 0's B1 receives rank 1's B1
  EXPECT_EQ(matching.send_partner[0][2], -1);  // the first stage's backward sends nothing
  mp_p2p_matching_free(&matching);
}

TEST(PeakLive, OneFOneBKeepsAtMostPpAliveWhereGPipeKeepsM) {
  for (int pp : {2, 4, 8}) {
    for (int m : {1, 3, 8, 16}) {
      OwnedSchedule one_f_one_b, gpipe;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, pp, m, 1, &one_f_one_b.s, &err), MP_OK);
      ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_GPIPE, pp, m, 1, &gpipe.s, &err), MP_OK);
      EXPECT_EQ(mp_schedule_peak_live(&one_f_one_b.s, 0), std::min(pp, m));
      EXPECT_EQ(mp_schedule_peak_live(&one_f_one_b.s, pp - 1), 1);
      EXPECT_EQ(mp_schedule_max_peak_live(&one_f_one_b.s), std::min(pp, m));
      EXPECT_EQ(mp_schedule_peak_live(&gpipe.s, 0), m);
      EXPECT_EQ(mp_schedule_peak_live(&gpipe.s, pp - 1), m);
    }
  }
}

TEST(PeakLive, ZeroBubbleH1KeepsOneFOneBsPeakOnEveryRank) {
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 3 * pp + 1}) {
      OwnedSchedule zb;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_ZB_H1, pp, m, 1, &zb.s, &err), MP_OK);
      for (int r = 0; r < pp; ++r) EXPECT_EQ(mp_schedule_peak_live(&zb.s, r), pp);
    }
  }
}

TEST(PeakLive, InterleavedKeepsItsWarmUpPlusOneChunksAlive) {
  for (int pp : {2, 4}) {
    for (int v : {2, 3}) {
      OwnedSchedule g;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_INTERLEAVED_1F1B, pp, 4 * pp, v, &g.s, &err),
                MP_OK);
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(mp_schedule_peak_live(&g.s, r), (pp - r - 1) * 2 + (v - 1) * pp + 1);
      }
    }
  }
}

TEST(Ordinal, SaysFirstSecondThirdEleventh) {
  char text[16];
  EXPECT_STREQ(mp_ordinal(1, text, sizeof text), "1st");
  EXPECT_STREQ(mp_ordinal(2, text, sizeof text), "2nd");
  EXPECT_STREQ(mp_ordinal(3, text, sizeof text), "3rd");
  EXPECT_STREQ(mp_ordinal(11, text, sizeof text), "11th");
  EXPECT_STREQ(mp_ordinal(22, text, sizeof text), "22nd");
}

}  // namespace
