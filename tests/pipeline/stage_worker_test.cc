// tests/pipeline/stage_worker_test.cc — the stage worker runs every schedule kind's action lists
// on real threads, one per pipeline rank, over an in-memory point-to-point table with the
// eager semantics of schedules/p2p.h (sends never block, receives block): every forward gets the
// activation its previous stage produced for that micro-batch, every backward the gradient its
// next stage produced, no rank deadlocks, and the activation slots suffice. Also the slot
// counts and the error for an action list that is out of order.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern "C" {
#include "pipeline/stage_worker.h"
#include "schedules/schedule.h"
}

namespace {

constexpr size_t kFloats = 8;

// FIFO queues per ordered pair of ranks: a message between two ranks is matched in posting order.
struct Network {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> queues;
};

struct Rank {
  Network *network;
  int pp, pp_rank;
  int mismatches = 0;
  std::vector<std::string> log;  // "F3", "B3", "W3" with the stage, in execution order
  // Boundary buffers from alloc_buffer (as a GPU run's device memory would be): live ones, and
  // buffers the worker handed over that did not come from there (must stay 0).
  std::set<const float *> live;
  int allocated = 0, foreign = 0;
  // The log entries (indices into log) during which mp_stage_worker_completes_chunk said yes.
  mp_stage_worker *worker = nullptr;
  std::vector<size_t> completing;
};

// Records whether the action being logged completes its chunk's gradients for the step.
void note_completion(Rank *rank, int chunk) {
  if (rank->worker != nullptr && mp_stage_worker_completes_chunk(rank->worker, chunk)) {
    rank->completing.push_back(rank->log.size() - 1);
  }
}

float *alloc_buffer(void *context, size_t count) {
  Rank *rank = static_cast<Rank *>(context);
  float *buffer = new float[count];
  rank->live.insert(buffer);
  rank->allocated++;
  return buffer;
}

void free_buffer(void *context, float *buffer) {
  Rank *rank = static_cast<Rank *>(context);
  if (rank->live.erase(buffer) == 0) rank->foreign++;
  delete[] buffer;
}

// Counts a boundary buffer the worker passes that alloc_buffer did not make.
void owned(Rank *rank, const float *buffer) {
  if (buffer != nullptr && rank->live.count(buffer) == 0) rank->foreign++;
}

// The values a message carries: the micro-batch and the stage that produced it.
float activation(int micro_batch, int stage) { return (float)(micro_batch * 1000 + stage); }
float gradient(int micro_batch, int stage) { return -(float)(micro_batch * 1000 + stage); }

mp_status post_send(void *context, const float *buffer, size_t count, int peer,
                    const mp_message *, void **request, mp_error *) {
  Rank *rank = static_cast<Rank *>(context);
  {
    std::lock_guard<std::mutex> lock(rank->network->mutex);
    rank->network->queues[{rank->pp_rank, peer}].emplace_back(buffer, buffer + count);
  }
  rank->network->arrived.notify_all();
  *request = nullptr;
  return MP_OK;
}

mp_status wait_send(void *, void *, mp_error *) { return MP_OK; }

mp_status recv(void *context, float *buffer, size_t count, int peer, const mp_message *,
               mp_error *) {
  Rank *rank = static_cast<Rank *>(context);
  std::unique_lock<std::mutex> lock(rank->network->mutex);
  auto &queue = rank->network->queues[{peer, rank->pp_rank}];
  rank->network->arrived.wait(lock, [&] { return !queue.empty(); });
  std::copy(queue.front().begin(), queue.front().begin() + (long)count, buffer);
  queue.pop_front();
  return MP_OK;
}

void check(Rank *rank, const float *buffer, float want) {
  for (size_t i = 0; i < kFloats; ++i) {
    if (buffer[i] != want) {
      rank->mismatches++;
      return;
    }
  }
}

mp_status forward(void *context, int chunk, int micro_batch, int, const float *input,
                  float *output, mp_error *) {
  Rank *rank = static_cast<Rank *>(context);
  const int stage = chunk * rank->pp + rank->pp_rank;
  owned(rank, input);
  owned(rank, output);
  if (input != nullptr) check(rank, input, activation(micro_batch, stage - 1));
  if (output != nullptr) std::fill(output, output + kFloats, activation(micro_batch, stage));
  rank->log.push_back("F" + std::to_string(micro_batch) + "s" + std::to_string(stage));
  return MP_OK;
}

mp_status backward(void *context, int chunk, int micro_batch, int, const float *doutput,
                   float *dinput, bool defer, mp_error *) {
  Rank *rank = static_cast<Rank *>(context);
  const int stage = chunk * rank->pp + rank->pp_rank;
  owned(rank, doutput);
  owned(rank, dinput);
  if (doutput != nullptr) check(rank, doutput, gradient(micro_batch, stage + 1));
  if (dinput != nullptr) std::fill(dinput, dinput + kFloats, gradient(micro_batch, stage));
  rank->log.push_back(std::string(defer ? "b" : "B") + std::to_string(micro_batch) + "s" +
                      std::to_string(stage));
  note_completion(rank, chunk);
  return MP_OK;
}

mp_status weights(void *context, int chunk, int micro_batch, int, mp_error *) {
  Rank *rank = static_cast<Rank *>(context);
  const int stage = chunk * rank->pp + rank->pp_rank;
  rank->log.push_back("W" + std::to_string(micro_batch) + "s" + std::to_string(stage));
  note_completion(rank, chunk);
  return MP_OK;
}

// Runs one step of the schedule on pp threads; returns each rank's log.
std::vector<Rank> run_step(const mp_schedule &schedule, int steps = 1) {
  Network network;
  std::vector<Rank> ranks(schedule.pp);
  std::vector<std::string> errors(schedule.pp);
  std::vector<std::thread> threads;
  for (int r = 0; r < schedule.pp; ++r) {
    ranks[r].network = &network;
    ranks[r].pp = schedule.pp;
    ranks[r].pp_rank = r;
    threads.emplace_back([&, r] {
      mp_error err = MP_ERROR_INITIALIZER;
      const mp_stage_ops ops = {&ranks[r], forward, backward, weights, nullptr};
      const mp_stage_p2p p2p = {&ranks[r], post_send, wait_send, recv, alloc_buffer, free_buffer};
      mp_stage_worker *worker = nullptr;
      if (mp_stage_worker_create(&schedule, r, kFloats, &ops, &p2p, nullptr, &worker, &err) !=
          MP_OK) {
        errors[r] = err.message;
        return;
      }
      ranks[r].worker = worker;
      for (int s = 0; s < steps && errors[r].empty(); ++s) {
        if (mp_stage_worker_run(worker, &err) != MP_OK) errors[r] = err.message;
      }
      ranks[r].worker = nullptr;
      mp_stage_worker_free(worker);
    });
  }
  for (auto &t : threads) t.join();
  for (int r = 0; r < schedule.pp; ++r) EXPECT_EQ(errors[r], "") << "pipeline rank " << r;
  return ranks;
}

struct Case {
  mp_schedule_kind kind;
  int pp, m, v;
};

class EveryKind : public ::testing::TestWithParam<Case> {};

TEST_P(EveryKind, MessagesReachTheirStageInOrderAndEveryActionRunsOnce) {
  const Case c = GetParam();
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(c.kind, c.pp, c.m, c.v, &schedule, &err), MP_OK) << err.message;
  std::vector<Rank> ranks = run_step(schedule, 2);  // two steps: state resets between steps
  for (int r = 0; r < c.pp; ++r) {
    EXPECT_EQ(ranks[r].mismatches, 0) << "pipeline rank " << r;
    // Every boundary buffer came from the table's allocator and went back to it.
    EXPECT_EQ(ranks[r].foreign, 0) << "pipeline rank " << r;
    EXPECT_TRUE(ranks[r].live.empty()) << "pipeline rank " << r << ": buffers not freed";
    if (c.pp > 1) {
      EXPECT_GT(ranks[r].allocated, 0) << "pipeline rank " << r;
    }
    // mp_stage_worker_completes_chunk says yes exactly once per chunk and step, during the
    // chunk's last gradient action of the step (its last B, or its last W with zb-h1).
    const size_t n = ranks[r].log.size() / 2;
    std::vector<size_t> want;
    for (size_t step = 0; step < 2; ++step) {
      for (int chunk = 0; chunk < c.v; ++chunk) {
        const std::string stage = "s" + std::to_string(mp_stage_index(c.pp, r, chunk));
        size_t last = 0;
        bool found = false;
        for (size_t i = step * n; i < (step + 1) * n; ++i) {
          const std::string &entry = ranks[r].log[i];
          const bool gradient = entry[0] == 'B' || entry[0] == 'W';
          if (gradient && entry.size() >= stage.size() &&
              entry.compare(entry.size() - stage.size(), stage.size(), stage) == 0) {
            last = i;
            found = true;
          }
        }
        if (found) want.push_back(last);
      }
    }
    std::sort(want.begin(), want.end());
    EXPECT_EQ(ranks[r].completing, want) << "pipeline rank " << r;
    // The log of each step is the rank's list, in order.
    const mp_rank_actions &list = schedule.ranks[r];
    ASSERT_EQ(ranks[r].log.size(), 2u * (size_t)list.num_actions);
    for (int i = 0; i < list.num_actions; ++i) {
      const mp_action &a = list.actions[i];
      const char letter = a.kind == MP_ACTION_FORWARD             ? 'F'
                          : a.kind == MP_ACTION_BACKWARD          ? 'B'
                          : a.kind == MP_ACTION_BACKWARD_INPUT    ? 'b'
                                                                  : 'W';
      const std::string want = std::string(1, letter) + std::to_string(a.micro_batch) + "s" +
                               std::to_string(mp_stage_index(c.pp, r, a.chunk));
      EXPECT_EQ(ranks[r].log[(size_t)i], want) << "rank " << r << " action " << i;
      EXPECT_EQ(ranks[r].log[(size_t)(i + list.num_actions)], want);
    }
  }
  mp_schedule_free(&schedule);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, EveryKind,
    ::testing::Values(Case{MP_SCHEDULE_GPIPE, 4, 8, 1}, Case{MP_SCHEDULE_1F1B, 4, 8, 1},
                      Case{MP_SCHEDULE_1F1B, 3, 2, 1}, Case{MP_SCHEDULE_1F1B, 1, 4, 1},
                      Case{MP_SCHEDULE_INTERLEAVED_1F1B, 2, 4, 2},
                      Case{MP_SCHEDULE_INTERLEAVED_1F1B, 4, 8, 3}, Case{MP_SCHEDULE_ZB_H1, 4, 8, 1},
                      Case{MP_SCHEDULE_ZB_H1, 2, 1, 1}));

TEST(StageWorker, SlotsAreThePeakOfLiveMicroBatches) {
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, 4, 8, 1, &schedule, &err), MP_OK);
  EXPECT_EQ(mp_stage_worker_slots(&schedule, 0, 0), 4);  // 1F1B: pp - pp_rank
  EXPECT_EQ(mp_stage_worker_slots(&schedule, 3, 0), 1);
  mp_schedule_free(&schedule);
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_GPIPE, 4, 8, 1, &schedule, &err), MP_OK);
  EXPECT_EQ(mp_stage_worker_slots(&schedule, 3, 0), 8);  // GPipe: every micro-batch
  mp_schedule_free(&schedule);
  mp_schedule_free(&schedule);
}

// zb-h1 (schedules/schedule.h): rank r's step x runs F of x, B of x - (pp - 1 - r) and W of
// x - (pp - 1), and a micro-batch keeps its slot from its F until its W, not its B. By hand for
// pp = 4, m = 8: from step 3 on every rank has done F of 0..x and W of 0..x-4 when F of x runs,
// so x - (x - 4) = 4 are alive on every rank (1F1B's 4, 3, 2, 1 would free the slot at B and
// overwrite activations that W still reads). With m < pp the m forwards all come before the
// first W: m slots.
TEST(StageWorker, ZeroBubbleH1KeepsPpSlotsOnEveryRankUntilTheW) {
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_ZB_H1, 4, 8, 1, &schedule, &err), MP_OK);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(mp_stage_worker_slots(&schedule, r, 0), 4) << "rank " << r;
  mp_schedule_free(&schedule);
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_ZB_H1, 4, 2, 1, &schedule, &err), MP_OK);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(mp_stage_worker_slots(&schedule, r, 0), 2) << "rank " << r;
  mp_schedule_free(&schedule);
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_ZB_H1, 2, 1, 1, &schedule, &err), MP_OK);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(mp_stage_worker_slots(&schedule, r, 0), 1) << "rank " << r;
  mp_schedule_free(&schedule);
}

TEST(StageWorker, ABackwardBeforeItsForwardNamesTheAction) {
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_init(&schedule, MP_SCHEDULE_CUSTOM, 1, 1, 1, &err), MP_OK);
  ASSERT_EQ(mp_schedule_append(&schedule, 0, MP_ACTION_BACKWARD, 0, 0, &err), MP_OK);
  ASSERT_EQ(mp_schedule_append(&schedule, 0, MP_ACTION_FORWARD, 0, 0, &err), MP_OK);
  Network network;
  Rank rank;
  rank.network = &network;
  rank.pp = 1;
  rank.pp_rank = 0;
  const mp_stage_ops ops = {&rank, forward, backward, weights, nullptr};
  const mp_stage_p2p p2p = {&rank, post_send, wait_send, recv, nullptr, nullptr};
  mp_stage_worker *worker = nullptr;
  ASSERT_EQ(mp_stage_worker_create(&schedule, 0, kFloats, &ops, &p2p, nullptr, &worker, &err),
            MP_OK);
  EXPECT_EQ(mp_stage_worker_run(worker, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message, "pipeline rank 0, B micro-batch 0: its forward has not run");
  mp_stage_worker_free(worker);
  mp_schedule_free(&schedule);
}

}  // namespace
