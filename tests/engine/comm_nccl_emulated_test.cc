// tests/engine/comm_nccl_emulated_test.cc — engine/comm/comm_nccl.h emulated over MPI
// (engine/comm/comm_nccl_emulated.c, `--config=emulated`), under mpirun: comm_nccl_emulated_test.sh
// runs it on 2 and on 3 ranks, every rank on the one emulated GPU (which real NCCL would refuse).
//
// Every collective in fp32 and bf16 against closed forms (bf16 sums: the fp32 sum rounded once),
// broadcast from every root, batched send/recv that must not deadlock (a ring where every rank
// posts {send to next, recv from previous} in one call, in either order; two ranks posting one
// call each in opposite orders; both receiving first; messages larger than Open MPI's eager limit,
// so a send that waited for its receive would hang), sends that complete before their receives
// are posted (buffered, as NCCL's are), sends to this rank itself, argument refusals
// that abort nothing, and the world's timeout reaching MPI. The abort (final for a process) runs
// alone, as CommNcclEmulatedAbort (the script's second run): a receive whose peer never sends
// times out, aborts the communicators, and every later call fails at once saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "layers/cuda_types.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;  // every rank, named "tp"
const double kTimeoutS = 60.0;

int rank() { return mp_comm_world_rank(g_world); }
int size() { return mp_comm_world_size(g_world); }

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

// The emulated world and a communicator over every rank (collective: all ranks, same order).
struct All {
  mp_nccl_world *world = nullptr;
  mp_nccl_comm *comm = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  bool ok = false;

  All() {
    ok = mp_nccl_world_create(g_world, 0, &world, &err) == MP_OK &&
         mp_nccl_comm_create(world, g_all, &comm, &err) == MP_OK;
  }
  ~All() {
    mp_nccl_comm_free(comm);
    mp_nccl_world_free(world);
  }
};

// --- creation -----------------------------------------------------------------------------------

TEST(CommNcclEmulated, EveryRankSharesTheOneEmulatedGpu) {
  EXPECT_TRUE(mp_nccl_available());
  EXPECT_GT(mp_nccl_version(), 0);
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  EXPECT_EQ(mp_nccl_world_device(a.world), 0);
  EXPECT_EQ(mp_nccl_comm_rank(a.comm), rank());
  EXPECT_EQ(mp_nccl_comm_size(a.comm), size());
  EXPECT_STREQ(mp_nccl_comm_name(a.comm), "tp");
  EXPECT_EQ(mp_nccl_comm_stream(a.comm), nullptr);
  EXPECT_FALSE(mp_nccl_world_aborted(a.world));

  mp_nccl_comm *self = nullptr;
  ASSERT_EQ(mp_nccl_comm_create(a.world, nullptr, &self, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(mp_nccl_comm_rank(self), 0);
  EXPECT_EQ(mp_nccl_comm_size(self), 1);
  EXPECT_STREQ(mp_nccl_comm_name(self), "self");
  mp_nccl_comm_free(self);

  // device -1 keeps the current one, 0; any other device does not exist.
  mp_nccl_world *other = nullptr;
  EXPECT_EQ(mp_nccl_world_create(g_world, -1, &other, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(mp_nccl_world_device(other), 0);
  mp_nccl_world_free(other);
  EXPECT_EQ(mp_nccl_world_create(g_world, 1, &other, &a.err), MP_ERR_INPUT);
  EXPECT_EQ(other, nullptr);
  EXPECT_TRUE(contains(a.err.message, "CUDA device 1 does not exist")) << a.err.message;
}

TEST(CommNcclEmulated, TheTimeoutIsTheMpiWorlds) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  EXPECT_DOUBLE_EQ(mp_nccl_world_timeout(a.world), kTimeoutS);
  mp_nccl_world_set_timeout(a.world, 7.5);
  EXPECT_DOUBLE_EQ(mp_nccl_world_timeout(a.world), 7.5);
  EXPECT_DOUBLE_EQ(mp_comm_world_timeout(g_world), 7.5);
  mp_nccl_world_set_timeout(a.world, kTimeoutS);
  EXPECT_DOUBLE_EQ(mp_comm_world_timeout(g_world), kTimeoutS);

  mp_nccl_world *alone = nullptr;  // outside an MPI job: 300 s until set
  ASSERT_EQ(mp_nccl_world_create(nullptr, 0, &alone, &a.err), MP_OK) << a.err.message;
  EXPECT_DOUBLE_EQ(mp_nccl_world_timeout(alone), 300.0);
  mp_nccl_world_free(alone);
}

// --- collectives --------------------------------------------------------------------------------

TEST(CommNcclEmulated, AllReduceSumsFp32AndBf16) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank();
  const size_t count = 3000;  // odd multiples, nothing aligned
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = (float)(r + 1) * (float)(i % 7 + 1);
  ASSERT_EQ(mp_nccl_all_reduce_sum(a.comm, f.data(), count, MP_NCCL_FLOAT32, &a.err), MP_OK)
      << a.err.message;
  const float members = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(f[i], members * (float)(i % 7 + 1)) << i;

  // bf16: each rank's 1 + k/128 (exact in bf16), summed in fp32 and rounded once, so sums that
  // fall between two bf16 values (3 ranks: 3 + 3k/128) round to nearest even.
  std::vector<mp_bf16> h(count), expected(count);
  for (size_t i = 0; i < count; ++i) {
    float mine = 1.0f + (float)((i + r) % 5) / 128.0f;
    h[i] = mp_bf16_from_float(mine);
    ASSERT_EQ(mp_bf16_to_float(h[i]), mine);
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += 1.0f + (float)((i + q) % 5) / 128.0f;
    expected[i] = mp_bf16_from_float(sum);
  }
  ASSERT_EQ(mp_nccl_all_reduce_sum(a.comm, h.data(), count, MP_NCCL_BFLOAT16, &a.err), MP_OK)
      << a.err.message;
  EXPECT_EQ(h, expected);
  EXPECT_EQ(mp_nccl_comm_synchronize(a.comm, &a.err), MP_OK) << a.err.message;
}

TEST(CommNcclEmulated, ReduceScatterSumsEachMembersBlock) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank();
  const size_t count = 1001;
  std::vector<float> in((size_t)n * count), out(count, -1.0f);
  for (size_t j = 0; j < in.size(); ++j) in[j] = (float)(r + 1) * (float)(j % 11 + 1);
  ASSERT_EQ(mp_nccl_reduce_scatter_sum(a.comm, in.data(), out.data(), count, MP_NCCL_FLOAT32,
                                       &a.err),
            MP_OK)
      << a.err.message;
  const float members = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], members * (float)(((size_t)r * count + i) % 11 + 1)) << i;
  }

  std::vector<mp_bf16> hin((size_t)n * count), hout(count, 0xFFFF);
  for (size_t j = 0; j < hin.size(); ++j) {
    hin[j] = mp_bf16_from_float((float)(r + 1) * (float)(j % 11 + 1));
  }
  ASSERT_EQ(mp_nccl_reduce_scatter_sum(a.comm, hin.data(), hout.data(), count, MP_NCCL_BFLOAT16,
                                       &a.err),
            MP_OK)
      << a.err.message;
  for (size_t i = 0; i < count; ++i) {  // at most 6 * 11 = 66: exact in bf16
    ASSERT_EQ(mp_bf16_to_float(hout[i]), members * (float)(((size_t)r * count + i) % 11 + 1)) << i;
  }
}

TEST(CommNcclEmulated, AllGatherPutsEveryMemberInRankOrder) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank();
  const size_t count = 777;
  std::vector<float> in(count), out((size_t)n * count, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = (float)(r * 100000 + (int)i);
  ASSERT_EQ(mp_nccl_all_gather(a.comm, in.data(), out.data(), count, MP_NCCL_FLOAT32, &a.err),
            MP_OK)
      << a.err.message;
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[(size_t)q * count + i], (float)(q * 100000 + (int)i)) << q << " " << i;
    }
  }

  // bf16 bits go through unchanged (any non-NaN pattern).
  std::vector<mp_bf16> hin(count), hout((size_t)n * count, 0xFFFF);
  for (size_t i = 0; i < count; ++i) hin[i] = (mp_bf16)(0x3f80 + r * 0x0800 + (int)(i % 0x07ff));
  ASSERT_EQ(mp_nccl_all_gather(a.comm, hin.data(), hout.data(), count, MP_NCCL_BFLOAT16, &a.err),
            MP_OK)
      << a.err.message;
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(hout[(size_t)q * count + i], (mp_bf16)(0x3f80 + q * 0x0800 + (int)(i % 0x07ff)))
          << q << " " << i;
    }
  }
}

TEST(CommNcclEmulated, UnevenAllGatherPutsEveryRunInRankOrder) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank();
  // Member 1 holds none (a dp part past a block's end), the others different counts.
  std::vector<size_t> counts(n);
  size_t total = 0, before = 0;
  for (int q = 0; q < n; ++q) {
    counts[q] = q == 1 ? 0 : 300 + 37 * (size_t)q;
    if (q < r) before += counts[q];
    total += counts[q];
  }
  std::vector<float> in(counts[r]), out(total + 1, -1.0f);
  for (size_t i = 0; i < counts[r]; ++i) in[i] = (float)(r * 100000 + (int)i);
  ASSERT_EQ(mp_nccl_all_gather_v(a.comm, in.data(), out.data(), counts.data(), MP_NCCL_FLOAT32,
                                 &a.err),
            MP_OK)
      << a.err.message;
  // bf16 in place: this rank's run already at its place; the bits go through unchanged.
  std::vector<mp_bf16> bits(total + 1, 0xFFFF);
  for (size_t i = 0; i < counts[r]; ++i) bits[before + i] = (mp_bf16)(0x3f80 + r * 0x0800 + (int)i);
  ASSERT_EQ(mp_nccl_all_gather_v(a.comm, nullptr, bits.data(), counts.data(), MP_NCCL_BFLOAT16,
                                 &a.err),
            MP_OK)
      << a.err.message;
  size_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < counts[q]; ++i, ++at) {
      ASSERT_EQ(out[at], (float)(q * 100000 + (int)i)) << q << " " << i;
      ASSERT_EQ(bits[at], (mp_bf16)(0x3f80 + q * 0x0800 + (int)i)) << q << " " << i;
    }
  }
  EXPECT_EQ(out[total], -1.0f);
  EXPECT_EQ(bits[total], 0xFFFF);
}

TEST(CommNcclEmulated, BroadcastFromEveryRoot) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  for (int root = 0; root < size(); ++root) {
    std::vector<uint8_t> bytes(5000);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (uint8_t)(rank() * 31 + i);
    ASSERT_EQ(mp_nccl_broadcast(a.comm, bytes.data(), bytes.size(), root, &a.err), MP_OK)
        << a.err.message;
    for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], (uint8_t)(root * 31 + i)) << i;
  }
}

TEST(CommNcclEmulated, OneMemberCommunicatorsCopyWithoutMpi) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  mp_nccl_comm *self = nullptr;
  ASSERT_EQ(mp_nccl_comm_create(a.world, nullptr, &self, &a.err), MP_OK) << a.err.message;
  std::vector<float> x = {1, 2, 3, 4}, y(4, -1.0f), z(4, -1.0f), w(4, -1.0f);
  EXPECT_EQ(mp_nccl_all_reduce_sum(self, x.data(), 4, MP_NCCL_FLOAT32, &a.err), MP_OK);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(mp_nccl_reduce_scatter_sum(self, x.data(), y.data(), 4, MP_NCCL_FLOAT32, &a.err),
            MP_OK);
  EXPECT_EQ(y, x);
  EXPECT_EQ(mp_nccl_all_gather(self, x.data(), z.data(), 4, MP_NCCL_FLOAT32, &a.err), MP_OK);
  EXPECT_EQ(z, x);
  EXPECT_EQ(mp_nccl_broadcast(self, x.data(), 16, 0, &a.err), MP_OK);
  const mp_nccl_p2p_op ops[2] = {{MP_NCCL_RECV, 0, w.data(), 16}, {MP_NCCL_SEND, 0, x.data(), 16}};
  EXPECT_EQ(mp_nccl_p2p(self, ops, 2, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(w, x);
  mp_nccl_comm_free(self);
}

// --- point to point -----------------------------------------------------------------------------

// Over Open MPI's eager limit (a few KiB on shared memory): such a send completes only once its
// receive is posted, so an emulation that waited for a send before posting the receive would hang.
const size_t kBig = 1 << 20;

std::vector<float> Message(int from, int tag, size_t bytes) {
  std::vector<float> values(bytes / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = (float)(from * 1000 + tag * 100 + i % 97);
  return values;
}

TEST(CommNcclEmulated, ARingInOneCallNeverDeadlocksInEitherOrder) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank(), next = (r + 1) % n, previous = (r + n - 1) % n;
  // Round 0: every rank sends first; 1: every rank receives first; 2: even ranks receive first,
  // odd ranks send first.
  for (int round = 0; round < 3; ++round) {
    std::vector<float> out = Message(r, round, kBig), in(kBig / sizeof(float), -1.0f);
    mp_nccl_p2p_op send = {MP_NCCL_SEND, next, out.data(), kBig};
    mp_nccl_p2p_op recv = {MP_NCCL_RECV, previous, in.data(), kBig};
    const bool recv_first = round == 1 || (round == 2 && r % 2 == 0);
    const mp_nccl_p2p_op ops[2] = {recv_first ? recv : send, recv_first ? send : recv};
    ASSERT_EQ(mp_nccl_p2p(a.comm, ops, 2, &a.err), MP_OK) << a.err.message;
    EXPECT_EQ(in, Message(previous, round, kBig)) << "round " << round;
  }
}

TEST(CommNcclEmulated, TwoRanksPostingOppositeOrdersOrBothReceivingFirst) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int r = rank();
  if (r > 1) return;  // ranks 0 and 1 only; the others have no part in it
  const int peer = 1 - r;
  // One call each: rank 0 {send, recv}, rank 1 {recv, send}; then both {recv, send}.
  for (int round = 0; round < 2; ++round) {
    std::vector<float> out = Message(r, round, kBig), in(kBig / sizeof(float), -1.0f);
    mp_nccl_p2p_op send = {MP_NCCL_SEND, peer, out.data(), kBig};
    mp_nccl_p2p_op recv = {MP_NCCL_RECV, peer, in.data(), kBig};
    const bool recv_first = round == 1 || r == 1;
    const mp_nccl_p2p_op ops[2] = {recv_first ? recv : send, recv_first ? send : recv};
    ASSERT_EQ(mp_nccl_p2p(a.comm, ops, 2, &a.err), MP_OK) << a.err.message;
    EXPECT_EQ(in, Message(peer, round, kBig)) << "round " << round;
  }
  // Two calls each, in opposite orders: rank 0 sends then receives, rank 1 receives then sends.
  std::vector<float> out = Message(r, 5, kBig), in(kBig / sizeof(float), -1.0f);
  const mp_nccl_p2p_op send = {MP_NCCL_SEND, peer, out.data(), kBig};
  const mp_nccl_p2p_op recv = {MP_NCCL_RECV, peer, in.data(), kBig};
  ASSERT_EQ(mp_nccl_p2p(a.comm, r == 0 ? &send : &recv, 1, &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_nccl_p2p(a.comm, r == 0 ? &recv : &send, 1, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(in, Message(peer, 5, kBig));
}

TEST(CommNcclEmulated, MessagesToOnePeerArriveInOrderAndSendsToSelfAreCopies) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size(), r = rank(), next = (r + 1) % n, previous = (r + n - 1) % n;
  const size_t small = 256;  // one eager, one not: order holds across both protocols
  std::vector<float> first = Message(r, 1, small), second = Message(r, 2, kBig);
  std::vector<float> got_first(small / sizeof(float)), got_second(kBig / sizeof(float));
  std::vector<float> mine = Message(r, 3, 64), mine_back(16, -1.0f);
  const mp_nccl_p2p_op ops[6] = {
      {MP_NCCL_RECV, previous, got_first.data(), small},
      {MP_NCCL_RECV, r, mine_back.data(), 64},
      {MP_NCCL_SEND, next, first.data(), small},
      {MP_NCCL_RECV, previous, got_second.data(), kBig},
      {MP_NCCL_SEND, r, mine.data(), 64},
      {MP_NCCL_SEND, next, second.data(), kBig},
  };
  ASSERT_EQ(mp_nccl_p2p(a.comm, ops, 6, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(got_first, Message(previous, 1, small));
  EXPECT_EQ(got_second, Message(previous, 2, kBig));
  EXPECT_EQ(mine_back, mine);

  // And across calls: two calls of one send each arrive in order.
  std::vector<float> x = Message(r, 7, small), y = Message(r, 8, small);
  std::vector<float> gx(small / sizeof(float)), gy(small / sizeof(float));
  const mp_nccl_p2p_op sx = {MP_NCCL_SEND, next, x.data(), small};
  const mp_nccl_p2p_op sy = {MP_NCCL_SEND, next, y.data(), small};
  const mp_nccl_p2p_op rx[2] = {{MP_NCCL_RECV, previous, gx.data(), small},
                                {MP_NCCL_RECV, previous, gy.data(), small}};
  ASSERT_EQ(mp_nccl_p2p(a.comm, &sx, 1, &a.err), MP_OK) << a.err.message;  // eager: returns
  ASSERT_EQ(mp_nccl_p2p(a.comm, &sy, 1, &a.err), MP_OK) << a.err.message;
  ASSERT_EQ(mp_nccl_p2p(a.comm, rx, 2, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(gx, Message(previous, 7, small));
  EXPECT_EQ(gy, Message(previous, 8, small));
}

// NCCL's sends complete once their data is in the peer's connection buffers, before the peer
// receives; the trainer's pipeline relies on it. 64 KiB: past MPI's eager limit, within NCCL's
// buffers.
TEST(CommNcclEmulated, SendsCompleteBeforeTheirReceivesArePostedAsNcclsDo) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int r = rank();
  if (r > 1) return;  // ranks 0 and 1 only
  const int peer = 1 - r;
  const size_t bytes = 64 << 10;
  // Both ranks send alone first, then receive in a call of their own.
  std::vector<float> out = Message(r, 1, bytes), in(bytes / sizeof(float), -1.0f);
  const mp_nccl_p2p_op send = {MP_NCCL_SEND, peer, out.data(), bytes};
  ASSERT_EQ(mp_nccl_p2p(a.comm, &send, 1, &a.err), MP_OK) << a.err.message;
  std::fill(out.begin(), out.end(), -2.0f);  // the buffer is the caller's again at once
  const mp_nccl_p2p_op recv = {MP_NCCL_RECV, peer, in.data(), bytes};
  ASSERT_EQ(mp_nccl_p2p(a.comm, &recv, 1, &a.err), MP_OK) << a.err.message;
  EXPECT_EQ(in, Message(peer, 1, bytes));

  // The pipeline's uneven groups: rank 0 {send, send, recv}, rank 1 {send, recv} then {recv}.
  std::vector<float> first = Message(r, 2, bytes), second = Message(r, 3, bytes);
  std::vector<float> got(bytes / sizeof(float), -1.0f), got2(bytes / sizeof(float), -1.0f);
  if (r == 0) {
    const mp_nccl_p2p_op ops[3] = {{MP_NCCL_SEND, 1, first.data(), bytes},
                                   {MP_NCCL_SEND, 1, second.data(), bytes},
                                   {MP_NCCL_RECV, 1, got.data(), bytes}};
    ASSERT_EQ(mp_nccl_p2p(a.comm, ops, 3, &a.err), MP_OK) << a.err.message;
    ASSERT_EQ(mp_nccl_comm_synchronize(a.comm, &a.err), MP_OK) << a.err.message;
    EXPECT_EQ(got, Message(1, 2, bytes));
  } else {
    const mp_nccl_p2p_op ops[2] = {{MP_NCCL_SEND, 0, first.data(), bytes},
                                   {MP_NCCL_RECV, 0, got.data(), bytes}};
    ASSERT_EQ(mp_nccl_p2p(a.comm, ops, 2, &a.err), MP_OK) << a.err.message;
    ASSERT_EQ(mp_nccl_comm_synchronize(a.comm, &a.err), MP_OK) << a.err.message;
    const mp_nccl_p2p_op late = {MP_NCCL_RECV, 0, got2.data(), bytes};
    ASSERT_EQ(mp_nccl_p2p(a.comm, &late, 1, &a.err), MP_OK) << a.err.message;
    EXPECT_EQ(got, Message(0, 2, bytes));
    EXPECT_EQ(got2, Message(0, 3, bytes));
  }
}

// --- refusals -----------------------------------------------------------------------------------

TEST(CommNcclEmulated, BadArgumentsAreRefusedByNameAndAbortNothing) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  const int n = size();
  std::vector<float> x(64, 1.0f);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_nccl_all_reduce_sum(a.comm, x.data(), 64, (mp_nccl_dtype)7, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "all-reduce in group tp: unknown element type 7")) << err.message;
  EXPECT_EQ(mp_nccl_all_reduce_sum(a.comm, nullptr, 64, MP_NCCL_FLOAT32, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "all-reduce in group tp: NULL buffer of 256 bytes"))
      << err.message;
  EXPECT_EQ(mp_nccl_all_gather(a.comm, x.data(), nullptr, 16, MP_NCCL_FLOAT32, &err),
            MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "all-gather in group tp: NULL output of")) << err.message;
  EXPECT_EQ(mp_nccl_reduce_scatter_sum(a.comm, nullptr, x.data(), 16, MP_NCCL_BFLOAT16, &err),
            MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "reduce-scatter in group tp: NULL input of")) << err.message;
  EXPECT_EQ(mp_nccl_broadcast(a.comm, x.data(), 256, n, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "root " + std::to_string(n) + " is not a group rank (0 .. " +
                                        std::to_string(n - 1) + ")"))
      << err.message;
  // Marks (ZeRO-3's prefetch): the slots there are, and no other.
  EXPECT_EQ(mp_nccl_comm_mark(a.comm, 0, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_nccl_stream_wait_mark(nullptr, a.comm, MP_NCCL_MARKS - 1, &err), MP_OK)
      << err.message;
  EXPECT_EQ(mp_nccl_comm_mark(a.comm, MP_NCCL_MARKS, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "group tp: mark 2 is not one of 0 .. 1")) << err.message;
  EXPECT_EQ(mp_nccl_stream_wait_mark(nullptr, a.comm, -1, &err), MP_ERR_INPUT);
  mp_nccl_p2p_op op = {MP_NCCL_SEND, n, x.data(), 256};
  EXPECT_EQ(mp_nccl_p2p(a.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "send in group tp (ranks ")) << err.message;
  EXPECT_TRUE(contains(err.message, "peer " + std::to_string(n) + " is not a group rank"))
      << err.message;
  op = {(mp_nccl_p2p_kind)5, 0, x.data(), 256};
  EXPECT_EQ(mp_nccl_p2p(a.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "operation 0 has kind 5")) << err.message;
  EXPECT_EQ(mp_nccl_p2p(a.comm, &op, -1, &err), MP_ERR_INPUT);
  op = {MP_NCCL_RECV, 0, nullptr, 256};
  EXPECT_EQ(mp_nccl_p2p(a.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "NULL receive buffer of 256 bytes")) << err.message;
  // A send to itself without its receive (NCCL would hang) is refused before anything is posted.
  op = {MP_NCCL_SEND, rank(), x.data(), 256};
  EXPECT_EQ(mp_nccl_p2p(a.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "1 send to this rank itself but 0 receives from it"))
      << err.message;
  const mp_nccl_p2p_op uneven[2] = {{MP_NCCL_SEND, rank(), x.data(), 256},
                                    {MP_NCCL_RECV, rank(), x.data(), 128}};
  EXPECT_EQ(mp_nccl_p2p(a.comm, uneven, 2, &err), MP_ERR_INPUT);
  EXPECT_TRUE(contains(err.message, "has 256 bytes but its receive (operation 1) has 128"))
      << err.message;
  EXPECT_EQ(mp_nccl_all_gather(a.comm, x.data(), x.data(), 0, MP_NCCL_FLOAT32, &err), MP_OK);
  EXPECT_EQ(mp_nccl_comm_wait_stream(nullptr, nullptr, &err), MP_ERR_INPUT);
  mp_nccl_comm *none = nullptr;
  EXPECT_EQ(mp_nccl_comm_create(nullptr, g_all, &none, &err), MP_ERR_INPUT);

  // Nothing was posted, nothing aborted: the communicator still works.
  std::vector<float> ones(64, 1.0f);
  EXPECT_EQ(mp_nccl_all_reduce_sum(a.comm, ones.data(), 64, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  EXPECT_EQ(ones, std::vector<float>(64, (float)n));
  EXPECT_EQ(mp_nccl_comm_wait_stream(a.comm, nullptr, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_nccl_stream_wait_comm(nullptr, a.comm, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_nccl_comm_synchronize(a.comm, &err), MP_OK) << err.message;
  EXPECT_FALSE(mp_nccl_world_aborted(a.world));
}

// --- the abort (run alone: it is final for the process) -----------------------------------------

TEST(CommNcclEmulatedAbort, ATimeoutAbortsEveryCommunicatorAndLaterCallsSayWhy) {
  All a;
  ASSERT_TRUE(a.ok) << a.err.message;
  mp_nccl_comm *self = nullptr;
  ASSERT_EQ(mp_nccl_comm_create(a.world, nullptr, &self, &a.err), MP_OK) << a.err.message;
  if (rank() == 1) {  // waits for a message rank 0 never sends
    mp_nccl_world_set_timeout(a.world, 1.0);
    float in[16];
    const mp_nccl_p2p_op op = {MP_NCCL_RECV, 0, in, sizeof in};
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_nccl_p2p(a.comm, &op, 1, &err), MP_ERR_RUNTIME);
    mp_nccl_world_set_timeout(a.world, kTimeoutS);
    const std::string failure = err.message;
    EXPECT_TRUE(contains(failure, "rank 1: recv from rank 0 in group tp on emulated NCCL (over "
                                  "MPI): recv from rank 0 in group tp timed out after 1.0 s "
                                  "(64 bytes)"))
        << failure;
    EXPECT_TRUE(contains(failure, "; communicators aborted")) << failure;
    EXPECT_TRUE(mp_nccl_world_aborted(a.world));

    // Every later call, on any communicator, fails at once naming the first failure.
    float x = 1;
    EXPECT_EQ(mp_nccl_all_reduce_sum(self, &x, 1, MP_NCCL_FLOAT32, &err), MP_ERR_RUNTIME);
    EXPECT_TRUE(contains(err.message, "rank 1: group self (ranks 1) can no longer be used: the "
                                      "NCCL communicators of this process were aborted after: "
                                      "rank 1: recv from rank 0 in group tp"))
        << err.message;
    EXPECT_EQ(mp_nccl_comm_synchronize(a.comm, &err), MP_ERR_RUNTIME);
    EXPECT_TRUE(contains(err.message, "group tp (ranks ")) << err.message;
    EXPECT_EQ(mp_nccl_broadcast(a.comm, &x, sizeof x, 0, &err), MP_ERR_RUNTIME);
    EXPECT_EQ(mp_nccl_comm_wait_stream(a.comm, nullptr, &err), MP_ERR_RUNTIME);
    mp_nccl_comm *late = nullptr;
    EXPECT_EQ(mp_nccl_comm_create(a.world, nullptr, &late, &err), MP_ERR_RUNTIME);
    EXPECT_EQ(late, nullptr);
    EXPECT_TRUE(contains(err.message, "no NCCL communicator can be created")) << err.message;
  } else {
    EXPECT_FALSE(mp_nccl_world_aborted(a.world));  // an abort is this process's alone
  }
  mp_nccl_comm_free(self);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "comm_nccl_emulated_test", &g_world, &g_all, nullptr);
}
