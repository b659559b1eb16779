// tests/expert_parallel/ep_plan_test.cc — expert_parallel/ep_plan.h, the exchange's bookkeeping the
// CPU and GPU dispatches share, on rank 0 of a two-rank group whose counts' all-to-all is a fake
// (it checks what this rank sends and answers fixed counts from both ranks), against the layout
// worked out by hand: rows per rank, the local experts' offsets, and the received rows in the
// experts' order (by local expert, then source rank, then the source's order), both ways.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "expert_parallel/ep_comm.h"
#include "expert_parallel/ep_plan.h"

namespace {

struct FakeCounts {
  std::vector<int32_t> expect_sent;  // (E) what rank 0 must send
  std::vector<int32_t> answer;       // (ep, El) what it receives
  int calls = 0;
};

mp_status fake_all_to_all_i32(void *context, const int32_t *input, int32_t *output, size_t count,
                              mp_error *err) {
  auto *fake = static_cast<FakeCounts *>(context);
  ++fake->calls;
  for (size_t i = 0; i < fake->expect_sent.size(); ++i) {
    if (input[i] != fake->expect_sent[i]) return mp_fail(err, MP_ERR_RUNTIME, "sent %zu wrong", i);
  }
  for (size_t i = 0; i < 2 * count; ++i) output[i] = fake->answer[i];
  return MP_OK;
}

mp_ep_comm fake_group(FakeCounts *fake) {
  mp_ep_comm ep = {};
  ep.context = fake;
  ep.rank = 0;
  ep.size = 2;
  ep.all_to_all_i32 = fake_all_to_all_i32;
  return ep;
}

// E 4 over 2 ranks (El 2). Rank 0 routed 3, 0, 2, 1 rows to experts 0-3 (offsets 0 3 3 5 6): 3
// rows to each rank. It receives for its local experts 0 and 1: from rank 0 1 and 2 rows, from
// rank 1 2 and 1. The received buffer (by source): s0e0 [0], s0e1 [1 2], s1e0 [3 4], s1e1 [5];
// the experts' order: e0 = 0 3 4, e1 = 1 2 5.
TEST(EpPlan, CountsOffsetsAndRowOrder) {
  FakeCounts fake;
  fake.expect_sent = {3, 0, 2, 1};
  fake.answer = {1, 2, 2, 1};
  const mp_ep_comm ep = fake_group(&fake);
  const int offset[] = {0, 3, 3, 5, 6};
  mp_ep_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_ep_plan_exchange(&plan, offset, 4, 8, 12, &ep, &err), MP_OK) << err.message;
  EXPECT_EQ(fake.calls, 1);
  EXPECT_EQ(plan.ep, 2);
  EXPECT_EQ(plan.local_experts, 2);
  EXPECT_EQ(plan.first_expert, 0);
  EXPECT_EQ(plan.received, 6);
  EXPECT_EQ(std::vector<size_t>(plan.send_rows, plan.send_rows + 2), (std::vector<size_t>{3, 3}));
  EXPECT_EQ(std::vector<size_t>(plan.recv_rows_from, plan.recv_rows_from + 2),
            (std::vector<size_t>{3, 3}));
  EXPECT_EQ(std::vector<int>(plan.local_offset, plan.local_offset + 3),
            (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(std::vector<int>(plan.source_row, plan.source_row + 6),
            (std::vector<int>{0, 3, 4, 1, 2, 5}));

  size_t counts[2];
  mp_ep_plan_counts(counts, plan.send_rows, 2, 8);
  EXPECT_EQ(counts[0], 24u);
  EXPECT_EQ(counts[1], 24u);

  // Rows of two ints (row r = {10 r, 10 r + 1}) to the experts' order and back.
  std::vector<int32_t> received(12), grouped(12), back(12);
  for (int r = 0; r < 6; ++r) received[2 * r] = 10 * r, received[2 * r + 1] = 10 * r + 1;
  mp_ep_plan_permute(&plan, grouped.data(), received.data(), 2 * sizeof(int32_t), 1);
  EXPECT_EQ(grouped, (std::vector<int32_t>{0, 1, 30, 31, 40, 41, 10, 11, 20, 21, 50, 51}));
  mp_ep_plan_permute(&plan, back.data(), grouped.data(), 2 * sizeof(int32_t), 0);
  EXPECT_EQ(back, received);
  mp_ep_plan_free(&plan);
}

// More rows than one exchange's int counts carry: refused, naming the rank and the rows.
TEST(EpPlan, RefusesRowsPastOneExchange) {
  FakeCounts fake;
  fake.expect_sent = {3, 0, 2, 1};
  fake.answer = {1, 2, 2, 1};
  const mp_ep_comm ep = fake_group(&fake);
  const int offset[] = {0, 3, 3, 5, 6};
  mp_ep_plan plan;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_ep_plan_exchange(&plan, offset, 4, 1 << 30, 12, &ep, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "moe: expert-parallel rank 0 receives 6 rows of 1073741824 floats, more than one "
            "exchange carries; use smaller micro-batches");
  EXPECT_EQ(plan.source_row, nullptr);  // freed on failure
}

}  // namespace
