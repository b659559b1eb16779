// tests/engine/comm_test.cc — engine/comm/comm.h under mpirun (tests/engine/comm_test.sh runs it on 2
// and on 4 ranks): groups built from every grid shape of the world, send/recv round trips, every
// collective against closed forms, the same bits on every member, refused group lists, and the
// timeout of a receive whose peer never sends, with its exact message.
//
// Its own main: MPI starts before GoogleTest, only world rank 0 prints the usual report and writes
// the XML report, other ranks print only their failures (prefixed "[rank N]"), and at the end a
// failure on any rank makes every rank exit non-zero.
//
// With --collective-timeout-demo (and no tests) it shows a collective that times out: rank 0
// never joins an all-reduce; the others report the timeout, find the group unusable and exit 1
// without MPI_Finalize, which ends the job. comm_test.sh checks the messages and that the run ends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "tests/support/mpi_gtest_main.h"
#include "topology/grid.h"

namespace {

mp_comm_world *g_world = nullptr;
const double kTimeoutS = 10.0;

int world_rank() { return mp_comm_world_rank(g_world); }
int world_size() { return mp_comm_world_size(g_world); }

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct CommDeleter {
  void operator()(mp_comm *comm) const { mp_comm_free(comm); }
};
using Comm = std::unique_ptr<mp_comm, CommDeleter>;

// Collective over the world: this rank's group of `kind` in `shape`.
Comm make_group(const mp_grid_shape &shape, mp_grid_kind kind) {
  std::vector<int> members(mp_grid_group_capacity(&shape, kind));
  int count = mp_grid_group_of(&shape, kind, world_rank(), members.data());
  mp_comm *comm = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_comm_group_create(g_world, members.data(), count, mp_grid_kind_name(kind), &comm,
                                 &err),
            MP_OK)
      << err.message;
  return Comm(comm);
}

Comm make_world_group(const char *name = "world") {
  std::vector<int> members(world_size());
  for (int i = 0; i < world_size(); ++i) members[i] = i;
  mp_comm *comm = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_comm_group_create(g_world, members.data(), world_size(), name, &comm, &err), MP_OK)
      << err.message;
  return Comm(comm);
}

std::vector<mp_grid_shape> shapes_of_world() {
  std::vector<mp_grid_shape> shapes;
  int n = world_size();
  for (int dp = 1; dp <= n; ++dp) {
    for (int pp = 1; pp <= n; ++pp) {
      for (int cp = 1; cp <= n; ++cp) {
        if (n % (dp * pp * cp) == 0) {
          shapes.push_back(mp_grid_shape{dp, pp, n / (dp * pp * cp), cp});
        }
      }
    }
  }
  return shapes;
}

std::string shape_text(const mp_grid_shape &shape, mp_grid_kind kind) {
  return "dp " + std::to_string(shape.dp) + " cp " + std::to_string(shape.cp) + " pp " +
         std::to_string(shape.pp) + " tp " + std::to_string(shape.tp) + ", group " +
         mp_grid_kind_name(kind);
}

TEST(Comm, WorldAndGroupRanks) {
  ASSERT_GE(world_size(), 2) << "run under mpirun with at least 2 ranks (comm_test.sh)";
  mp_grid_shape shape = {1, 2, world_size() / 2, 1};
  if (world_size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  Comm tp = make_group(shape, MP_GRID_TP);
  Comm pp = make_group(shape, MP_GRID_PP);
  ASSERT_TRUE(tp && pp);
  mp_grid_coord coord = mp_grid_coord_of(&shape, world_rank());
  EXPECT_EQ(mp_comm_size(tp.get()), shape.tp);
  EXPECT_EQ(mp_comm_rank(tp.get()), coord.tp_rank);
  EXPECT_EQ(mp_comm_size(pp.get()), 2);
  EXPECT_EQ(mp_comm_rank(pp.get()), coord.pp_rank);
  EXPECT_EQ(mp_comm_member(pp.get(), coord.pp_rank), world_rank());
  EXPECT_STREQ(mp_comm_name(tp.get()), "tp");
}

// Pairs (0,1), (2,3), ...: the even rank sends, the odd one adds its rank and sends back; sizes
// from empty to past Open MPI's eager limit.
TEST(Comm, SendRecvRoundTrip) {
  Comm world = make_world_group();
  ASSERT_TRUE(world);
  int rank = world_rank();
  int partner = rank % 2 == 0 ? rank + 1 : rank - 1;
  if (partner >= world_size()) GTEST_SKIP() << "odd world: the last rank has no partner";
  mp_error err = MP_ERROR_INITIALIZER;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{300000}}) {
    std::vector<int32_t> message(count), back(count);
    if (rank % 2 == 0) {
      for (size_t i = 0; i < count; ++i) message[i] = (int32_t)(i * 7 + rank);
      ASSERT_EQ(mp_comm_send(world.get(), message.data(), count * 4, partner, &err), MP_OK)
          << err.message;
      ASSERT_EQ(mp_comm_recv(world.get(), back.data(), count * 4, partner, &err), MP_OK)
          << err.message;
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += back[i] != message[i] + partner;
      EXPECT_EQ(wrong, 0u) << count << " ints";
    } else {
      ASSERT_EQ(mp_comm_recv(world.get(), message.data(), count * 4, partner, &err), MP_OK)
          << err.message;
      for (size_t i = 0; i < count; ++i) back[i] = message[i] + rank;
      ASSERT_EQ(mp_comm_send(world.get(), back.data(), count * 4, partner, &err), MP_OK)
          << err.message;
    }
  }
}

// Along every pipeline group of dp 1 x pp N/2 x tp 2 (or pp N): stage s sends to stage s + 1,
// which checks the values, like activations moving forward.
TEST(Comm, PipelineChainAlongPpGroups) {
  int n = world_size();
  mp_grid_shape shape = n % 2 == 0 ? mp_grid_shape{1, n / 2, 2, 1} : mp_grid_shape{1, n, 1, 1};
  Comm pp = make_group(shape, MP_GRID_PP);
  ASSERT_TRUE(pp);
  int stage = mp_comm_rank(pp.get()), stages = mp_comm_size(pp.get());
  mp_error err = MP_ERROR_INITIALIZER;
  std::vector<float> activation(4096);
  if (stage > 0) {
    ASSERT_EQ(mp_comm_recv(pp.get(), activation.data(), activation.size() * 4, stage - 1, &err),
              MP_OK)
        << err.message;
    int from = mp_comm_member(pp.get(), stage - 1);
    size_t wrong = 0;
    for (size_t i = 0; i < activation.size(); ++i) wrong += activation[i] != from + 0.5f * i;
    EXPECT_EQ(wrong, 0u);
  }
  if (stage + 1 < stages) {
    for (size_t i = 0; i < activation.size(); ++i) activation[i] = world_rank() + 0.5f * i;
    ASSERT_EQ(mp_comm_send(pp.get(), activation.data(), activation.size() * 4, stage + 1, &err),
              MP_OK)
        << err.message;
  }
}

// Every shape dp x cp x pp x tp of the world, every kind of group: each collective against its closed
// form, for counts that take Open MPI's small- and large-message algorithms.
TEST(Comm, CollectivesOnEveryGridShape) {
  mp_error err = MP_ERROR_INITIALIZER;
  for (const mp_grid_shape &shape : shapes_of_world()) {
    for (int k = 0; k < MP_GRID_NUM_KINDS; ++k) {
      mp_grid_kind kind = (mp_grid_kind)k;
      SCOPED_TRACE(shape_text(shape, kind));
      Comm comm = make_group(shape, kind);
      ASSERT_TRUE(comm);
      int n = mp_comm_size(comm.get()), r = mp_comm_rank(comm.get());
      std::vector<int> members(n);
      double member_sum = 0;  // S = sum of (world rank + 1) over members
      for (int j = 0; j < n; ++j) {
        members[j] = mp_comm_member(comm.get(), j);
        member_sum += members[j] + 1;
      }
      ASSERT_EQ(members[r], world_rank());
      float self = (float)(world_rank() + 1);

      for (size_t count : {size_t{1}, size_t{7}, size_t{40000}}) {
        SCOPED_TRACE("count " + std::to_string(count));
        // all-reduce: (rank + 1) * f(i) summed = S * f(i), exact in float.
        std::vector<float> buffer(count);
        for (size_t i = 0; i < count; ++i) buffer[i] = self * (float)(i % 13 + 1);
        ASSERT_EQ(mp_comm_all_reduce_sum_f32(comm.get(), buffer.data(), count, &err), MP_OK)
            << err.message;
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) wrong += buffer[i] != (float)(member_sum * (i % 13 + 1));
        EXPECT_EQ(wrong, 0u) << "all-reduce";

        // reduce-scatter: block r of the sum.
        std::vector<float> input(count * n), output(count, -1.0f);
        for (size_t i = 0; i < input.size(); ++i) input[i] = self * (float)(i % 13 + 1);
        ASSERT_EQ(mp_comm_reduce_scatter_sum_f32(comm.get(), input.data(), output.data(), count,
                                                 &err),
                  MP_OK)
            << err.message;
        wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          wrong += output[i] != (float)(member_sum * ((r * count + i) % 13 + 1));
        }
        EXPECT_EQ(wrong, 0u) << "reduce-scatter";

        // reduce-scatter with uneven counts (ZeRO-2's windows over the dp parts): member j
        // gets count + j - 1 floats (member 0 one fewer than count, perhaps none), each its run
        // of the sum, in member order.
        std::vector<size_t> counts(n);
        size_t total = 0, before = 0;
        for (int j = 0; j < n; ++j) {
          counts[j] = count + (size_t)j - 1;
          if (j < r) before += counts[j];
          total += counts[j];
        }
        std::vector<float> uneven(total), mine_sum(counts[r] + 1, -1.0f);
        for (size_t i = 0; i < total; ++i) uneven[i] = self * (float)(i % 13 + 1);
        ASSERT_EQ(mp_comm_reduce_scatter_v_sum_f32(comm.get(), uneven.data(), mine_sum.data(),
                                                   counts.data(), &err),
                  MP_OK)
            << err.message;
        wrong = 0;
        for (size_t i = 0; i < counts[r]; ++i) {
          wrong += mine_sum[i] != (float)(member_sum * ((before + i) % 13 + 1));
        }
        wrong += mine_sum[counts[r]] != -1.0f;  // nothing written past its run
        EXPECT_EQ(wrong, 0u) << "reduce-scatter with uneven counts";

        // all-gather with uneven counts (ZeRO-3's block weights from the dp parts), the counts
        // above: fp32 from an input, then bf16 bits in place (this member's run already in
        // output), every run in member order and nothing written past the end.
        std::vector<float> own(counts[r]), gathered_v(total + 1, -1.0f);
        for (size_t i = 0; i < counts[r]; ++i) own[i] = (float)(world_rank() * 1000 + i % 1000);
        ASSERT_EQ(mp_comm_all_gather_v_f32(comm.get(), own.data(), gathered_v.data(),
                                           counts.data(), &err),
                  MP_OK)
            << err.message;
        std::vector<uint16_t> bits(total + 1, 0xFFFF);
        auto pattern_bits = [](int member, size_t i) {
          return (uint16_t)(0x3f80 + member * 0x0800 + (int)(i % 0x07ff));
        };
        for (size_t i = 0; i < counts[r]; ++i) bits[before + i] = pattern_bits(members[r], i);
        ASSERT_EQ(mp_comm_all_gather_v_bf16(comm.get(), nullptr, bits.data(), counts.data(), &err),
                  MP_OK)
            << err.message;
        wrong = 0;
        size_t at = 0;
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < counts[j]; ++i, ++at) {
            wrong += gathered_v[at] != (float)(members[j] * 1000 + i % 1000);
            wrong += bits[at] != pattern_bits(members[j], i);
          }
        }
        wrong += gathered_v[total] != -1.0f;
        wrong += bits[total] != 0xFFFF;
        EXPECT_EQ(wrong, 0u) << "all-gather with uneven counts";

        // all-gather: member j's block is its world rank * 1000 + i.
        std::vector<float> mine(count), gathered(count * n, -1.0f);
        for (size_t i = 0; i < count; ++i) mine[i] = (float)(world_rank() * 1000 + i % 1000);
        ASSERT_EQ(mp_comm_all_gather_f32(comm.get(), mine.data(), gathered.data(), count, &err),
                  MP_OK)
            << err.message;
        wrong = 0;
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < count; ++i) {
            wrong += gathered[j * count + i] != (float)(members[j] * 1000 + i % 1000);
          }
        }
        EXPECT_EQ(wrong, 0u) << "all-gather";

        // broadcast from every root, bytes.
        for (int root = 0; root < n; ++root) {
          std::vector<unsigned char> bytes(count * 4 + 3, 0);
          auto pattern = [&](size_t i) { return (unsigned char)((members[root] * 7 + i * 13) & 0xff); };
          if (r == root) {
            for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(i);
          }
          ASSERT_EQ(mp_comm_broadcast(comm.get(), bytes.data(), bytes.size(), root, &err), MP_OK)
              << err.message;
          wrong = 0;
          for (size_t i = 0; i < bytes.size(); ++i) wrong += bytes[i] != pattern(i);
          EXPECT_EQ(wrong, 0u) << "broadcast from group rank " << root;
        }
      }
      ASSERT_EQ(mp_comm_barrier(comm.get(), &err), MP_OK) << err.message;
    }
  }
}

// Random floats of mixed magnitude: every member gets the same bits (replicated parameters stay
// identical), and the sum is the serial sum within float round-off.
TEST(Comm, AllReduceGivesTheSameBitsOnEveryMember) {
  mp_error err = MP_ERROR_INITIALIZER;
  Comm world = make_world_group();
  ASSERT_TRUE(world);
  int n = world_size();
  auto value = [](int rank, size_t i) {
    uint64_t x = (uint64_t)(rank + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    double unit = (double)(x >> 11) / 9007199254740992.0;  // [0, 1)
    return (float)((unit - 0.5) * std::pow(10.0, (double)(i % 7) - 3.0));
  };
  for (size_t count : {size_t{1000}, size_t{200000}}) {
    std::vector<float> buffer(count);
    for (size_t i = 0; i < count; ++i) buffer[i] = value(world_rank(), i);
    ASSERT_EQ(mp_comm_all_reduce_sum_f32(world.get(), buffer.data(), count, &err), MP_OK)
        << err.message;
    std::vector<float> from_zero(buffer);
    ASSERT_EQ(mp_comm_broadcast(world.get(), from_zero.data(), count * 4, 0, &err), MP_OK)
        << err.message;
    EXPECT_EQ(std::memcmp(from_zero.data(), buffer.data(), count * 4), 0)
        << "rank " << world_rank() << " holds other bits than rank 0 after the all-reduce";
    size_t off = 0;
    for (size_t i = 0; i < count; ++i) {
      double serial = 0, magnitude = 0;
      for (int j = 0; j < n; ++j) {
        serial += value(j, i);
        magnitude += std::fabs(value(j, i));
      }
      off += std::fabs(buffer[i] - serial) > 4 * n * 1.2e-7 * magnitude;
    }
    EXPECT_EQ(off, 0u) << "elements off the serial sum by more than round-off";
  }
}

// mp_comm_agree: every member gets the lowest failing rank's status and message, whichever ranks
// fail, and MP_OK only when none does.
TEST(Comm, AgreeGivesEveryMemberTheFirstFailure) {
  Comm world = make_world_group();
  const int n = world_size(), me = world_rank();
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_OK, mp_comm_agree(world.get(), MP_OK, &err)) << err.message;
  // Each subset of failing ranks given by a bit mask (all of them for n <= 4).
  for (int mask = 1; mask < (1 << n) && mask < 64; ++mask) {
    const bool fails = (mask >> me) & 1;
    mp_error mine = MP_ERROR_INITIALIZER;
    mp_status status = MP_OK;
    if (fails) {
      status = mp_fail(&mine, me % 2 == 0 ? MP_ERR_INPUT : MP_ERR_RUNTIME, "rank %d failed", me);
    }
    int first = 0;
    while (!((mask >> first) & 1)) ++first;
    const mp_status agreed = mp_comm_agree(world.get(), status, &mine);
    EXPECT_EQ(first % 2 == 0 ? MP_ERR_INPUT : MP_ERR_RUNTIME, agreed) << "mask " << mask;
    EXPECT_EQ("rank " + std::to_string(first) + " failed", std::string(mine.message))
        << "mask " << mask;
  }
  EXPECT_EQ(MP_ERR_RUNTIME, mp_comm_agree(nullptr, MP_ERR_RUNTIME, &err));
}

TEST(Comm, GroupCreateRefusesBadListsOnEveryRank) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_comm *comm = nullptr;
  int n = world_size();
  std::vector<int> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;

  // Rank 0 leaves itself out; every rank fails, and the others say which rank was wrong.
  std::vector<int> bad = world_rank() == 0 ? std::vector<int>(all.begin() + 1, all.end()) : all;
  EXPECT_EQ(mp_comm_group_create(g_world, bad.data(), (int)bad.size(), "dp", &comm, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(comm, nullptr);
  if (world_rank() == 0) {
    EXPECT_STREQ(err.message, "rank 0: group dp: the members do not include this rank");
  } else {
    EXPECT_EQ(std::string(err.message),
              "rank " + std::to_string(world_rank()) +
                  ": group dp not created: rank 0 passed an invalid member list (see its "
                  "message)");
  }

  // Lists that do not partition the world: rank 0 names {0, 1}, rank 1 names {1} alone.
  std::vector<int> overlapping;
  if (world_rank() == 0) {
    overlapping = {0, 1};
  } else {
    overlapping = {world_rank()};
  }
  EXPECT_EQ(mp_comm_group_create(g_world, overlapping.data(), (int)overlapping.size(), "tp",
                                 &comm, &err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("ranks disagree on its members (rank 0 first)"),
            std::string::npos)
      << err.message;

  // The world is still fine: a good group works afterwards.
  Comm world = make_world_group();
  ASSERT_TRUE(world);
  EXPECT_EQ(mp_comm_barrier(world.get(), &err), MP_OK) << err.message;
}

TEST(Comm, RefusesBadPeersAndRoots) {
  mp_error err = MP_ERROR_INITIALIZER;
  Comm world = make_world_group();
  ASSERT_TRUE(world);
  char byte = 0;
  int me = mp_comm_rank(world.get());
  EXPECT_EQ(mp_comm_send(world.get(), &byte, 1, me, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("peer " + std::to_string(me) + " is not another"),
            std::string::npos)
      << err.message;
  EXPECT_EQ(mp_comm_recv(world.get(), &byte, 1, world_size(), &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_comm_broadcast(world.get(), &byte, 1, -1, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("root -1 is not a group rank"), std::string::npos)
      << err.message;
}

// The peer that never answers: in every tp group of dp N/2 x pp 1 x tp 2, group rank 1 waits for
// a message group rank 0 never sends. After the 1 s timeout it reports rank, peer, group,
// operation and size; the receive is cancelled, so the same group still works afterwards.
TEST(Comm, RecvFromAPeerThatNeverSendsTimesOut) {
  if (world_size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  mp_grid_shape shape = {world_size() / 2, 1, 2, 1};
  Comm tp = make_group(shape, MP_GRID_TP);
  Comm world = make_world_group();
  ASSERT_TRUE(tp && world);
  mp_error err = MP_ERROR_INITIALIZER;
  std::vector<char> buffer(1024);
  mp_comm_world_set_timeout(g_world, 1.0);
  EXPECT_EQ(mp_comm_world_timeout(g_world), 1.0);
  if (mp_comm_rank(tp.get()) == 1) {
    double start = now_s();
    mp_status status = mp_comm_recv(tp.get(), buffer.data(), buffer.size(), 0, &err);
    double waited = now_s() - start;
    EXPECT_EQ(status, MP_ERR_RUNTIME);
    std::string expected = "rank " + std::to_string(world_rank()) + ": recv from rank " +
                           std::to_string(world_rank() - 1) +
                           " in group tp timed out after 1.0 s (1024 bytes); the peer may have "
                           "died or hung";
    EXPECT_EQ(std::string(err.message), expected);
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 3.0);
  }
  mp_comm_world_set_timeout(g_world, kTimeoutS);
  ASSERT_EQ(mp_comm_barrier(world.get(), &err), MP_OK) << err.message;

  // The cancelled receive left nothing behind: a real message now goes through the same group.
  int value = 0;
  if (mp_comm_rank(tp.get()) == 0) {
    value = 4242 + world_rank();
    ASSERT_EQ(mp_comm_send(tp.get(), &value, sizeof value, 1, &err), MP_OK) << err.message;
  } else {
    ASSERT_EQ(mp_comm_recv(tp.get(), &value, sizeof value, 0, &err), MP_OK) << err.message;
    EXPECT_EQ(value, 4242 + world_rank() - 1);
  }
  ASSERT_EQ(mp_comm_barrier(tp.get(), &err), MP_OK) << err.message;
}

// Non-zero ranks: no report of their own, but every failure, prefixed with the rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult &result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const testing::TestInfo &info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

// Rank 0 never joins; the others' all-reduce times out; exit 1 with no MPI_Finalize.
int collective_timeout_demo() {
  mp_comm_world_set_timeout(g_world, 1.0);
  Comm world = make_world_group();
  if (!world) return 1;
  mp_error err = MP_ERROR_INITIALIZER;
  float values[4] = {1, 2, 3, 4};
  if (world_rank() == 0) {
    struct timespec pause = {3, 0};
    nanosleep(&pause, nullptr);  // hung: never calls the all-reduce
    std::fprintf(stderr, "rank 0: woke up\n");
  } else {
    if (mp_comm_all_reduce_sum_f32(world.get(), values, 4, &err) == MP_OK) return 0;
    std::fprintf(stderr, "%s\n", err.message);
    if (mp_comm_barrier(world.get(), &err) != MP_OK) std::fprintf(stderr, "%s\n", err.message);
  }
  world.reset();  // mp_comm_free leaves a broken group's communicator to MPI and frees the rest
  mp_comm_world_finalize(g_world);
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_comm_world_init(&argc, &argv, kTimeoutS, &g_world, &err) != MP_OK) {
    std::fprintf(stderr, "comm_test: %s\n", err.message);
    return 1;
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--collective-timeout-demo") == 0) return collective_timeout_demo();
  }
  int rank = world_rank();
  mp_test_xml_on_rank_zero_only(rank);
  testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    testing::TestEventListeners &listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  // A failure on any rank fails the run on every rank.
  float any_failed = (float)failed;
  {
    Comm world = make_world_group();
    if (world && !mp_test_report_every_rank(world.get(), rank, world_size(), "comm_test")) {
      any_failed += 1;
    }
    if (!world || mp_comm_all_reduce_sum_f32(world.get(), &any_failed, 1, &err) != MP_OK) {
      std::fprintf(stderr, "[rank %d] could not agree on the result: %s\n", rank, err.message);
      any_failed = 1;
    }
  }
  if (rank == 0 && any_failed > 0 && !failed) {
    std::fprintf(stderr, "comm_test: tests failed on other ranks (their [rank N] lines above)\n");
  }
  mp_comm_world_finalize(g_world);
  return any_failed > 0 ? 1 : 0;
}
