// tests/expert_parallel/ep_comm_nccl_test.cc — engine/comm/ep_comm_nccl.h (the expert-parallel
// table over NCCL, on device buffers) under emulated NCCL and mpirun (ep_comm_nccl_test.sh: 2 and
// 3 ranks on the one emulated GPU): its two all-to-alls against closed forms and bit for bit
// against the MPI table's (engine/comm/ep_comm_mpi.h) on the same inputs, with uneven counts and
// empty runs (no p2p operation is posted for those, on either side).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "engine/comm/ep_comm_mpi.h"
#include "engine/comm/ep_comm_nccl.h"
#include "engine/device/device.h"
#include "expert_parallel/ep_comm.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;  // every rank

int rank() { return mp_comm_world_rank(g_world); }
int size() { return mp_comm_world_size(g_world); }

struct Nccl {
  mp_nccl_world *world = nullptr;
  mp_nccl_comm *comm = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  bool ok = false;
  Nccl() {
    ok = mp_nccl_world_create(g_world, 0, &world, &err) == MP_OK &&
         mp_nccl_comm_create(world, g_all, &comm, &err) == MP_OK;
  }
  ~Nccl() {
    mp_nccl_comm_free(comm);
    mp_nccl_world_free(world);
  }
};

// A device copy of host values (freed with the object).
template <typename T>
struct Device {
  T *data = nullptr;
  size_t n;
  explicit Device(const std::vector<T> &host) : n(host.size()) {
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_device_alloc((void **)&data, (n + 1) * sizeof(T), &err), MP_OK) << err.message;
    EXPECT_EQ(mp_device_copy_to_device(data, host.data(), n * sizeof(T), &err), MP_OK);
  }
  ~Device() { mp_device_free(data); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_device_copy_to_host(out.data(), data, n * sizeof(T), &err), MP_OK);
    return out;
  }
};

// Rows rank s sends rank r: (s + 2 r) % 3, so some runs are empty (rank 0 to itself, rank 1 to
// rank 1, ...) and the others differ in length.
size_t rows(int s, int r) { return (size_t)((s + 2 * r) % 3); }
float value(int s, int r, size_t i) { return 1000.0f * s + 100.0f * r + (float)i + 0.25f; }

TEST(EpCommNccl, AllToAllI32EqualsClosedFormAndMpi) {
  Nccl nccl;
  ASSERT_TRUE(nccl.ok) << nccl.err.message;
  const mp_ep_comm over_nccl = mp_ep_comm_over_nccl(nccl.comm);
  const mp_ep_comm over_mpi = mp_ep_comm_over_group(g_all);
  ASSERT_EQ(over_nccl.rank, rank());
  ASSERT_EQ(over_nccl.size, size());
  const size_t count = 3;
  std::vector<int32_t> input(size() * count), want(size() * count), from_mpi(size() * count);
  for (int r = 0; r < size(); ++r) {
    for (size_t i = 0; i < count; ++i) {
      input[r * count + i] = 100 * rank() + 10 * r + (int32_t)i;
      want[r * count + i] = 100 * r + 10 * rank() + (int32_t)i;
    }
  }
  Device<int32_t> in(input), out(std::vector<int32_t>(size() * count, -1));
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_ep_all_to_all_i32(&over_nccl, in.data, out.data, count, &err), MP_OK)
      << err.message;
  EXPECT_EQ(out.host(), want);
  ASSERT_EQ(mp_ep_all_to_all_i32(&over_mpi, input.data(), from_mpi.data(), count, &err), MP_OK);
  EXPECT_EQ(out.host(), from_mpi);
}

TEST(EpCommNccl, AllToAllVMovesUnevenAndEmptyRunsAsMpiDoes) {
  Nccl nccl;
  ASSERT_TRUE(nccl.ok) << nccl.err.message;
  const mp_ep_comm over_nccl = mp_ep_comm_over_nccl(nccl.comm);
  const mp_ep_comm over_mpi = mp_ep_comm_over_group(g_all);
  const int me = rank(), n = size();
  const size_t width = 5; /* floats a row */
  std::vector<size_t> send(n), recv(n);
  std::vector<float> input, want;
  for (int r = 0; r < n; ++r) {
    send[r] = rows(me, r) * width;
    recv[r] = rows(r, me) * width;
    for (size_t i = 0; i < send[r]; ++i) input.push_back(value(me, r, i));
    for (size_t i = 0; i < recv[r]; ++i) want.push_back(value(r, me, i));
  }
  Device<float> in(input), out(std::vector<float>(want.size(), -1.0f));
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_ep_all_to_all_v_f32(&over_nccl, in.data, send.data(), out.data, recv.data(), &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(out.host(), want);
  std::vector<float> from_mpi(want.size(), -2.0f);
  ASSERT_EQ(mp_ep_all_to_all_v_f32(&over_mpi, input.data(), send.data(), from_mpi.data(),
                                   recv.data(), &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(out.host(), from_mpi);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "ep_comm_nccl_test", &g_world, &g_all, nullptr);
}
