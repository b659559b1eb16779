// tests/schedules/simulator_test.cc — with unit costs (F = 1, B = 2; zero-bubble B = W = 1;
// interleaved chunks 1 / v of that) the simulated schedules meet their closed forms exactly.
#include "schedules/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "schedules/checker.h"
#include "tests/schedules/schedule_builder.h"

namespace {

using mpengine_test::Build;
using mpengine_test::OwnedSchedule;

constexpr double kTolerance = 1e-9;

// A generated schedule and its simulation under unit costs; both freed at the end.
struct Simulated {
  OwnedSchedule schedule;
  mp_sim_costs costs = {};
  mp_simulation sim = {};
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status = MP_OK;

  Simulated(mp_schedule_kind kind, int pp, int m, int v, double latency = 0.0,
            mp_p2p_model model = MP_P2P_EAGER) {
    status = mp_schedule_generate(kind, pp, m, v, &schedule.s, &err);
    if (status == MP_OK) status = mp_sim_costs_init_unit(&costs, pp, v, &err);
    if (status != MP_OK) return;
    costs.p2p_latency = latency;
    costs.p2p_model = model;
    status = mp_schedule_simulate(&schedule.s, &costs, &sim, &err);
  }
  ~Simulated() {
    mp_simulation_free(&sim);
    mp_sim_costs_free(&costs);
  }
  // Idle time of one rank: what the bubble fraction is a share of.
  double Idle(int rank) const { return sim.step_time - sim.busy_time[rank]; }
};

std::string Name(const char *kind, int pp, int m, int v) {
  return std::string(kind) + " p=" + std::to_string(pp) + " m=" + std::to_string(m) +
         " v=" + std::to_string(v);
}

TEST(ClosedForms, GPipeAndOneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (mp_schedule_kind kind : {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 8, 16}) {  // includes m = 1 and m < p
        SCOPED_TRACE(Name(mp_schedule_kind_name(kind), p, m, 1));
        Simulated s(kind, p, m, 1);
        ASSERT_EQ(s.status, MP_OK) << s.err.message;
        EXPECT_NEAR(s.sim.bubble_fraction, double(p - 1) / (m + p - 1), kTolerance);
        EXPECT_NEAR(s.sim.step_time, 3.0 * (m + p - 1), kTolerance);
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(s.sim.busy_time[r], 3.0 * m, kTolerance);
          EXPECT_NEAR(s.sim.rank_bubble_fraction[r], double(p - 1) / (m + p - 1), kTolerance);
        }
      }
    }
  }
}

TEST(ClosedForms, OneFOneBKeepsPAliveOnTheFirstRankWhereGPipeKeepsM) {
  for (int p : {2, 4, 8}) {
    for (int m : {1, 4, 8, 16}) {
      SCOPED_TRACE(Name("1f1b vs gpipe", p, m, 1));
      Simulated one_f_one_b(MP_SCHEDULE_1F1B, p, m, 1), gpipe(MP_SCHEDULE_GPIPE, p, m, 1);
      ASSERT_EQ(one_f_one_b.status, MP_OK) << one_f_one_b.err.message;
      ASSERT_EQ(gpipe.status, MP_OK) << gpipe.err.message;
      EXPECT_EQ(one_f_one_b.sim.peak_live[0], std::min(p, m));
      EXPECT_EQ(gpipe.sim.peak_live[0], m);
      EXPECT_NEAR(one_f_one_b.sim.peak_activation_memory[0], std::min(p, m), kTolerance);
      EXPECT_NEAR(gpipe.sim.max_peak_activation_memory, m, kTolerance);
    }
  }
}

TEST(ClosedForms, InterleavingDividesTheBubbleByV) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE(Name("interleaved-1f1b", p, m, v));
        Simulated interleaved(MP_SCHEDULE_INTERLEAVED_1F1B, p, m, v);
        Simulated plain(MP_SCHEDULE_1F1B, p, m, 1);
        ASSERT_EQ(interleaved.status, MP_OK) << interleaved.err.message;
        ASSERT_EQ(plain.status, MP_OK) << plain.err.message;
        EXPECT_NEAR(interleaved.sim.bubble_fraction, double(p - 1) / (v * m + p - 1), kTolerance);
        EXPECT_NEAR(interleaved.sim.step_time, 3.0 * m + 3.0 * (p - 1) / v, kTolerance);
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(interleaved.sim.busy_time[r], 3.0 * m, kTolerance);  // same work per rank
          EXPECT_NEAR(interleaved.Idle(r) * v, plain.Idle(r), kTolerance);
        }
      }
    }
  }
}

TEST(ClosedForms, ZeroBubbleH1BubbleIsAThirdOfOneFOneBsAtTheSamePeakMemory) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 16}) {
      SCOPED_TRACE(Name("zb-h1", p, m, 1));
      Simulated zb(MP_SCHEDULE_ZB_H1, p, m, 1), one_f_one_b(MP_SCHEDULE_1F1B, p, m, 1);
      ASSERT_EQ(zb.status, MP_OK) << zb.err.message;
      ASSERT_EQ(one_f_one_b.status, MP_OK) << one_f_one_b.err.message;
      // (p - 1)(T_F + T_B - T_W) of idle per rank with T_F = T_B = T_W = 1, against 1F1B's
      // (p - 1)(T_F + T_B + T_W).
      EXPECT_NEAR(zb.sim.step_time, 3.0 * m + (p - 1), kTolerance);
      EXPECT_NEAR(zb.sim.bubble_fraction, double(p - 1) / (3 * m + p - 1), kTolerance);
      EXPECT_NEAR(zb.Idle(0) * 3, one_f_one_b.Idle(0), kTolerance);
      EXPECT_LT(zb.sim.bubble_fraction, one_f_one_b.sim.bubble_fraction);
      EXPECT_NEAR(zb.sim.max_peak_activation_memory,
                  one_f_one_b.sim.max_peak_activation_memory, kTolerance);
      EXPECT_EQ(zb.sim.peak_live[0], one_f_one_b.sim.peak_live[0]);
    }
  }
}

TEST(ClosedForms, ZeroBubbleH1BeatsOneFOneBAlsoWithFewMicroBatches) {
  for (int p : {2, 4, 8}) {
    for (int m = 1; m < p; ++m) {
      SCOPED_TRACE(Name("zb-h1", p, m, 1));
      Simulated zb(MP_SCHEDULE_ZB_H1, p, m, 1), one_f_one_b(MP_SCHEDULE_1F1B, p, m, 1);
      ASSERT_EQ(zb.status, MP_OK) << zb.err.message;
      EXPECT_LT(zb.sim.bubble_fraction, one_f_one_b.sim.bubble_fraction);
      EXPECT_NEAR(zb.sim.max_peak_activation_memory, m, kTolerance);
    }
  }
}

TEST(ClosedForms, OnePipelineRankHasNoBubble) {
  for (mp_schedule_kind kind : {MP_SCHEDULE_GPIPE, MP_SCHEDULE_1F1B, MP_SCHEDULE_ZB_H1}) {
    Simulated s(kind, 1, 5, 1);
    ASSERT_EQ(s.status, MP_OK) << s.err.message;
    EXPECT_NEAR(s.sim.bubble_fraction, 0.0, kTolerance);
    EXPECT_NEAR(s.sim.step_time, 15.0, kTolerance);
  }
}

TEST(Simulator, GivesEachActionsStartAndEnd) {
  Simulated s(MP_SCHEDULE_1F1B, 2, 2, 1);
  ASSERT_EQ(s.status, MP_OK) << s.err.message;
  // Rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1.
  const double rank0_start[] = {0, 1, 4, 7}, rank0_end[] = {1, 2, 6, 9};
  const double rank1_start[] = {1, 2, 4, 5}, rank1_end[] = {2, 4, 5, 7};
  for (int a = 0; a < 4; ++a) {
    EXPECT_DOUBLE_EQ(s.sim.start[0][a], rank0_start[a]) << "rank 0 action " << a;
    EXPECT_DOUBLE_EQ(s.sim.end[0][a], rank0_end[a]) << "rank 0 action " << a;
    EXPECT_DOUBLE_EQ(s.sim.start[1][a], rank1_start[a]) << "rank 1 action " << a;
    EXPECT_DOUBLE_EQ(s.sim.end[1][a], rank1_end[a]) << "rank 1 action " << a;
  }
  EXPECT_DOUBLE_EQ(s.sim.step_time, 9.0);
}

TEST(Simulator, AddsTheLatencyToEveryHop) {
  // p = 2, m = 1: F on rank 0, one hop, F and B on rank 1, one hop, B on rank 0.
  Simulated s(MP_SCHEDULE_1F1B, 2, 1, 1, /*latency=*/0.5);
  ASSERT_EQ(s.status, MP_OK) << s.err.message;
  EXPECT_DOUBLE_EQ(s.sim.start[1][0], 1.5);
  EXPECT_DOUBLE_EQ(s.sim.step_time, 7.0);
  // Four ranks, four micro-batches of GPipe: the critical path crosses 2 (p - 1) = 6 hops.
  Simulated gpipe(MP_SCHEDULE_GPIPE, 4, 4, 1, /*latency=*/0.25);
  ASSERT_EQ(gpipe.status, MP_OK) << gpipe.err.message;
  EXPECT_DOUBLE_EQ(gpipe.sim.step_time, 3.0 * (4 + 4 - 1) + 6 * 0.25);
}

TEST(Simulator, BlockingBatchedP2pDelaysZeroBubblesW) {
  // Under rendezvous a W between a send and the next receive holds up the neighbour: zb-h1 runs,
  // but loses the bubble it was built to remove. The runtime's eager sends keep it.
  Simulated eager(MP_SCHEDULE_ZB_H1, 4, 16, 1, 0.0, MP_P2P_EAGER);
  Simulated rendezvous(MP_SCHEDULE_ZB_H1, 4, 16, 1, 0.0, MP_P2P_RENDEZVOUS);
  ASSERT_EQ(eager.status, MP_OK) << eager.err.message;
  ASSERT_EQ(rendezvous.status, MP_OK) << rendezvous.err.message;
  EXPECT_GT(rendezvous.sim.step_time, eager.sim.step_time);
  // 1F1B's exchanges pair up exactly, so both models time it the same.
  Simulated plain_eager(MP_SCHEDULE_1F1B, 4, 8, 1, 0.0, MP_P2P_EAGER);
  Simulated plain_rendezvous(MP_SCHEDULE_1F1B, 4, 8, 1, 0.0, MP_P2P_RENDEZVOUS);
  ASSERT_EQ(plain_rendezvous.status, MP_OK) << plain_rendezvous.err.message;
  EXPECT_DOUBLE_EQ(plain_rendezvous.sim.step_time, plain_eager.sim.step_time);
}

TEST(Simulator, RefusesAScheduleTheCheckerRefuses) {
  OwnedSchedule s;
  ASSERT_TRUE(Build(2, 2, 1, {"F0 B0 F1 B1", "F0 F1 B0 B1"}, &s));
  mp_sim_costs costs;
  mp_simulation sim;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 2, 1, &err), MP_OK);
  EXPECT_EQ(mp_schedule_simulate(&s.s, &costs, &sim, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message).rfind("deadlock under eager point-to-point: rank 0", 0), 0u)
      << err.message;
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);
}

TEST(Simulator, RefusesCostsThatDoNotFit) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 4, 4, 1, &g.s, &err), MP_OK);
  mp_sim_costs costs;
  mp_simulation sim;
  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 2, 1, &err), MP_OK);
  EXPECT_EQ(mp_schedule_simulate(&g.s, &costs, &sim, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "the costs describe 2 stages but the schedule has pp x virtual stages = 4 x 1 = 4");
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);

  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 4, 1, &err), MP_OK);
  costs.duration[MP_ACTION_BACKWARD][3] = -1;
  EXPECT_EQ(mp_schedule_simulate(&g.s, &costs, &sim, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "the backward duration of stage 3 is -1; durations must be finite and >= 0");
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);
}

// A prepared schedule (checked and matched once) timed under many costs gives what
// mp_schedule_simulate gives each time, to the bit: the planner relies on it.
TEST(Simulator, APreparedScheduleTimesAsTheSimulatorDoes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> duration(0.0, 3.0);
  struct Case {
    mp_schedule_kind kind;
    int pp, m, v;
  } cases[] = {{MP_SCHEDULE_GPIPE, 3, 5, 1},       {MP_SCHEDULE_1F1B, 4, 9, 1},
               {MP_SCHEDULE_1F1B, 4, 2, 1},        {MP_SCHEDULE_INTERLEAVED_1F1B, 2, 4, 3},
               {MP_SCHEDULE_INTERLEAVED_1F1B, 4, 8, 2}, {MP_SCHEDULE_ZB_H1, 4, 7, 1}};
  for (const Case &c : cases) {
    for (mp_p2p_model model : {MP_P2P_EAGER, MP_P2P_RENDEZVOUS}) {
      SCOPED_TRACE(Name(mp_schedule_kind_name(c.kind), c.pp, c.m, c.v) + " " +
                   mp_p2p_model_name(model));
      OwnedSchedule g;
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(mp_schedule_generate(c.kind, c.pp, c.m, c.v, &g.s, &err), MP_OK);
      mp_sim_prepared prepared;
      const mp_status prepared_status = mp_sim_prepare(&g.s, model, &prepared, &err);
      const std::string prepare_message = err.message;
      for (int trial = 0; trial < 3; ++trial) {
        mp_sim_costs costs;
        ASSERT_EQ(mp_sim_costs_init_unit(&costs, c.pp, c.v, &err), MP_OK);
        costs.p2p_model = model;
        costs.p2p_latency = trial * 0.25;
        for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
          for (int st = 0; st < c.pp * c.v; ++st) costs.duration[k][st] = duration(rng);
        }
        for (int st = 0; st < c.pp * c.v; ++st) costs.activation_memory[st] = duration(rng);
        mp_simulation plain, timed;
        const mp_status plain_status = mp_schedule_simulate(&g.s, &costs, &plain, &err);
        if (prepared_status != MP_OK) {
          // interleaved-1f1b deadlocks under rendezvous: both refuse it with the checker's words.
          EXPECT_EQ(plain_status, prepared_status);
          EXPECT_EQ(std::string(err.message), prepare_message);
        } else {
          ASSERT_EQ(plain_status, MP_OK) << err.message;
          ASSERT_EQ(mp_schedule_simulate_prepared(&prepared, &costs, &timed, &err), MP_OK)
              << err.message;
          EXPECT_EQ(timed.step_time, plain.step_time);
          EXPECT_EQ(timed.bubble_fraction, plain.bubble_fraction);
          EXPECT_EQ(timed.max_peak_activation_memory, plain.max_peak_activation_memory);
          for (int r = 0; r < c.pp; ++r) {
            EXPECT_EQ(timed.busy_time[r], plain.busy_time[r]);
            EXPECT_EQ(timed.peak_activation_memory[r], plain.peak_activation_memory[r]);
            EXPECT_EQ(timed.peak_live[r], plain.peak_live[r]);
            for (int a = 0; a < g.s.ranks[r].num_actions; ++a) {
              EXPECT_EQ(timed.start[r][a], plain.start[r][a]);
              EXPECT_EQ(timed.end[r][a], plain.end[r][a]);
            }
          }
        }
        mp_simulation_free(&timed);
        mp_simulation_free(&plain);
        mp_sim_costs_free(&costs);
      }
      mp_sim_prepared_free(&prepared);
    }
  }
}

TEST(Simulator, APreparedScheduleRefusesAnotherPointToPointModel) {
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 2, 4, 1, &g.s, &err), MP_OK);
  mp_sim_prepared prepared;
  ASSERT_EQ(mp_sim_prepare(&g.s, MP_P2P_EAGER, &prepared, &err), MP_OK) << err.message;
  mp_sim_costs costs;
  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 2, 1, &err), MP_OK);
  costs.p2p_model = MP_P2P_RENDEZVOUS;
  mp_simulation sim;
  EXPECT_EQ(mp_schedule_simulate_prepared(&prepared, &costs, &sim, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "the costs ask for rendezvous point-to-point, but the schedule was checked under "
            "eager");
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);
  mp_sim_prepared_free(&prepared);
}

TEST(Simulator, UsesPerStageDurations) {
  // A slow last stage (F = 2, B = 4) sets the pace of 1F1B's steady state.
  OwnedSchedule g;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 2, 4, 1, &g.s, &err), MP_OK);
  mp_sim_costs costs;
  mp_simulation sim;
  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 2, 1, &err), MP_OK);
  costs.duration[MP_ACTION_FORWARD][1] = 2;
  costs.duration[MP_ACTION_BACKWARD][1] = 4;
  ASSERT_EQ(mp_schedule_simulate(&g.s, &costs, &sim, &err), MP_OK) << err.message;
  // Rank 1 starts at 1 and then never waits: 1 + 4 * (2 + 4); rank 0's last B follows it.
  EXPECT_DOUBLE_EQ(sim.busy_time[1], 24.0);
  EXPECT_DOUBLE_EQ(sim.step_time, 1 + 24 + 2);
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);
}

}  // namespace
