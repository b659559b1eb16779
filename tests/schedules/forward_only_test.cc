// tests/schedules/forward_only_test.cc — the forward-only lists a held-out loss runs
// (mp_schedule_generate_forward_only): every rank runs F of each micro-batch through each of its
// chunks, micro-batch by micro-batch; the checker accepts them and refuses a backward in one; one
// micro-batch is alive at a time; the simulation pipelines them (a fill, no drain); and the stage
// worker runs one with a single slot per chunk, releasing it after each F.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "pipeline/stage_worker.h"
#include "schedules/checker.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

namespace {

TEST(ForwardOnly, EveryRankRunsEachMicroBatchThroughEachChunkInOrder) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule s;
  ASSERT_EQ(mp_schedule_generate_forward_only(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 3, 2, &s, &err),
            MP_OK)
      << err.message;
  EXPECT_TRUE(s.forward_only);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(s.ranks[r].num_actions, 6);
    for (int i = 0; i < 6; ++i) {
      const mp_action &a = s.ranks[r].actions[i];
      EXPECT_EQ(a.kind, MP_ACTION_FORWARD);
      EXPECT_EQ(a.micro_batch, i / 2) << "rank " << r << " action " << i;
      EXPECT_EQ(a.chunk, i % 2) << "rank " << r << " action " << i;
    }
    EXPECT_EQ(mp_schedule_peak_live(&s, r), 1);
    EXPECT_EQ(mp_stage_worker_slots(&s, r, 0), 1);
    EXPECT_EQ(mp_stage_worker_slots(&s, r, 1), 1);
  }
  // Rank 0's chunk 1 (stage 2) takes its input from rank 1's chunk 0 (stage 1).
  EXPECT_EQ(s.ranks[0].actions[1].recv_from, 1);
  EXPECT_EQ(s.ranks[1].actions[0].send_to, 0);
  EXPECT_EQ(mp_schedule_check(&s, MP_P2P_EAGER, &err), MP_OK) << err.message;
  mp_schedule_free(&s);
}

TEST(ForwardOnly, TheCheckerRefusesABackwardInAForwardOnlyList) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule s;
  ASSERT_EQ(mp_schedule_generate_forward_only(MP_SCHEDULE_1F1B, 2, 2, 1, &s, &err), MP_OK);
  ASSERT_EQ(mp_schedule_append(&s, 1, MP_ACTION_BACKWARD, 1, 0, &err), MP_OK);
  EXPECT_EQ(mp_schedule_check(&s, MP_P2P_EAGER, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "rank 1: micro-batch 1 has a backward (action 2) in a forward-only schedule; "
               "evaluation runs every micro-batch forward through every chunk once, and nothing "
               "backward");
  mp_schedule_free(&s);
}

// Unit costs (F = 1 per rank's layers): m forwards pipelined over pp ranks end at m + pp - 1.
TEST(ForwardOnly, TheRanksWorkOnNeighbouringMicroBatchesAtOnce) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule s;
  ASSERT_EQ(mp_schedule_generate_forward_only(MP_SCHEDULE_1F1B, 4, 8, 1, &s, &err), MP_OK);
  mp_sim_costs costs;
  ASSERT_EQ(mp_sim_costs_init_unit(&costs, 4, 1, &err), MP_OK);
  mp_simulation sim;
  ASSERT_EQ(mp_schedule_simulate(&s, &costs, &sim, &err), MP_OK) << err.message;
  EXPECT_DOUBLE_EQ(sim.step_time, 11.0);
  EXPECT_DOUBLE_EQ(sim.max_peak_activation_memory, 1.0);
  mp_simulation_free(&sim);
  mp_sim_costs_free(&costs);
  mp_schedule_free(&s);
}

// One pipeline rank with two chunks: the worker hands chunk 0's output to chunk 1 locally and
// frees the slot after each F.
struct Record {
  std::vector<std::pair<int, int>> forwards;  // (chunk, micro-batch)
  std::vector<int> released_slots;
  int inputs_seen = 0;
};

mp_status forward(void *context, int chunk, int micro_batch, int slot, const float *input,
                  float *output, mp_error *err) {
  auto *record = static_cast<Record *>(context);
  record->forwards.push_back({chunk, micro_batch});
  if (slot != 0) return mp_fail(err, MP_ERR_RUNTIME, "slot %d, want 0", slot);
  if (input != nullptr) {
    if (input[0] != 100.0f * micro_batch) return mp_fail(err, MP_ERR_RUNTIME, "wrong input");
    ++record->inputs_seen;
  }
  if (output != nullptr) output[0] = 100.0f * micro_batch;
  return MP_OK;
}

mp_status no_backward(void *, int, int, int, const float *, float *, bool, mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "a backward ran");
}

mp_status no_weights(void *, int, int, int, mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "a W ran");
}

void release(void *context, int chunk, int micro_batch, int slot) {
  static_cast<Record *>(context)->released_slots.push_back(slot);
}

mp_status no_send(void *, const float *, size_t, int, const mp_message *, void **, mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "a send on one rank");
}
mp_status no_wait(void *, void *, mp_error *) { return MP_OK; }
mp_status no_recv(void *, float *, size_t, int, const mp_message *, mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "a receive on one rank");
}

TEST(ForwardOnly, TheStageWorkerRunsItWithOneSlotPerChunk) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule s;
  ASSERT_EQ(mp_schedule_generate_forward_only(MP_SCHEDULE_INTERLEAVED_1F1B, 1, 3, 2, &s, &err),
            MP_OK);
  Record record;
  const mp_stage_ops ops = {&record, forward, no_backward, no_weights, release};
  const mp_stage_p2p p2p = {nullptr, no_send, no_wait, no_recv, nullptr, nullptr};
  mp_stage_worker *worker = nullptr;
  ASSERT_EQ(mp_stage_worker_create(&s, 0, 4, &ops, &p2p, nullptr, &worker, &err), MP_OK);
  for (int run = 0; run < 2; ++run) {  // a second evaluation finds every slot free again
    record = Record();
    ASSERT_EQ(mp_stage_worker_run(worker, &err), MP_OK) << err.message;
    const std::vector<std::pair<int, int>> order = {{0, 0}, {1, 0}, {0, 1},
                                                    {1, 1}, {0, 2}, {1, 2}};
    EXPECT_EQ(record.forwards, order);
    EXPECT_EQ(record.released_slots, std::vector<int>(6, 0));
    EXPECT_EQ(record.inputs_seen, 3);
  }
  mp_stage_worker_free(worker);
  mp_schedule_free(&s);
}

}  // namespace
