// tests/engine/comm_nccl_test.cc — engine/comm/comm_nccl.h and engine/comm/comm_staging.h in one process.
//
// Everywhere: classifying host pointers never starts CUDA, the build says whether it has NCCL, a
// machine without a GPU (or a build without CUDA) gets an input error that says which, and calls
// without a communicator are input errors. On a GPU (skipped by name where none is visible): device
// memory is recognised and copied, a one-rank communicator's collectives and batched send/recv
// give their closed forms in fp32 and bf16, bad arguments are refused by name without breaking the
// communicator, and operations are ordered after a compute stream and before another. The
// watchdog's abort, which is final for the process, has its own binary (comm_nccl_watchdog_test).
#include <gtest/gtest.h>
#include <link.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/comm_nccl.h"
#include "engine/comm/comm_staging.h"
#include "engine/device/device.h"
#include "tests/engine/comm_nccl_testing.h"

namespace {

#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    if (!mp_nccl_available() || mp_device_count() == 0) {                               \
      const ::testing::TestInfo *info_ =                                                \
          ::testing::UnitTest::GetInstance()->current_test_info();                      \
      GTEST_SKIP() << "no GPU visible: " << info_->test_suite_name() << "." << info_->name() \
                   << " needs CUDA and NCCL";                                           \
    }                                                                                   \
  } while (0)

bool libcuda_loaded() {
  auto visit = [](dl_phdr_info *info, size_t, void *) -> int {
    const char *name = info->dlpi_name != nullptr ? info->dlpi_name : "";
    const char *base = std::strrchr(name, '/');
    base = base != nullptr ? base + 1 : name;
    return std::strncmp(base, "libcuda.so", 10) == 0 ? 1 : 0;
  };
  return dl_iterate_phdr(visit, nullptr) != 0;
}

// A one-member communicator on GPU 0 and device buffers, all freed at the end of the scope.
struct OneRank {
  mp_nccl_world *world = nullptr;
  mp_nccl_comm *comm = nullptr;
  std::vector<void *> buffers;
  mp_error err = MP_ERROR_INITIALIZER;
  bool ok = false;

  OneRank() {
    ok = mp_nccl_world_create(nullptr, 0, &world, &err) == MP_OK &&
         mp_nccl_comm_create(world, nullptr, &comm, &err) == MP_OK;
  }
  ~OneRank() {
    mp_nccl_comm_free(comm);
    mp_nccl_world_free(world);
    for (void *buffer : buffers) mp_device_free(buffer);
  }
  template <typename T>
  T *Upload(const std::vector<T> &host) {
    void *device = nullptr;
    if (mp_device_alloc(&device, host.size() * sizeof(T), &err) != MP_OK) return nullptr;
    buffers.push_back(device);
    if (mp_device_copy_to_device(device, host.data(), host.size() * sizeof(T), &err) != MP_OK) {
      return nullptr;
    }
    return static_cast<T *>(device);
  }
  template <typename T>
  std::vector<T> Download(const T *device, size_t n) {
    std::vector<T> host(n);
    if (mp_device_copy_to_host(host.data(), device, n * sizeof(T), &err) != MP_OK) host.clear();
    return host;
  }
};

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = scale * (float)(i % 97 + 1);
  return values;
}

// --- everywhere ---------------------------------------------------------------------------------

// First in the file, so that no earlier test has started CUDA in this process.
TEST(CommStaging, HostPointersAreHostWithoutStartingCuda) {
  const bool loaded_before = libcuda_loaded();
  std::vector<float> heap(16);
  float stack[4] = {0};
  static float global[4];
  EXPECT_FALSE(mp_staging_is_device(heap.data()));
  EXPECT_FALSE(mp_staging_is_device(stack));
  EXPECT_FALSE(mp_staging_is_device(global));
  EXPECT_FALSE(mp_staging_is_device(nullptr));
  if (!loaded_before) {
    EXPECT_FALSE(libcuda_loaded()) << "classifying host pointers loaded the CUDA driver";
  }
  const std::string backend = mp_staging_backend();
  EXPECT_EQ(backend, mp_nccl_available() ? "cuda" : "host");
}

TEST(CommNccl, TheBuildSaysWhetherItHasNccl) {
  EXPECT_EQ(mp_nccl_available(), mp_nccl_version() > 0) << "version " << mp_nccl_version();
}

TEST(CommNccl, WithoutAGpuCreationIsAnInputErrorThatSaysWhy) {
  if (mp_nccl_available() && mp_device_count() > 0) {
    GTEST_SKIP() << "a GPU is visible: CommNccl.WithoutAGpuCreationIsAnInputErrorThatSaysWhy is "
                    "for machines without one";
  }
  mp_nccl_world *world = reinterpret_cast<mp_nccl_world *>(&world);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_nccl_world_create(nullptr, -1, &world, &err), MP_ERR_INPUT);
  EXPECT_EQ(world, nullptr);
  const std::string message = err.message;
  if (mp_nccl_available()) {
    EXPECT_NE(message.find("rank 0: no GPU visible ("), std::string::npos) << message;
    EXPECT_NE(message.find("use the MPI communicators"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("built without CUDA/NCCL"), std::string::npos) << message;
  }
}

TEST(CommNccl, CallsWithoutACommunicatorAreInputErrors) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_nccl_comm *comm = reinterpret_cast<mp_nccl_comm *>(&err);
  EXPECT_EQ(mp_nccl_comm_create(nullptr, nullptr, &comm, &err), MP_ERR_INPUT);
  EXPECT_EQ(comm, nullptr);
  float x = 0;
  mp_nccl_p2p_op op = {MP_NCCL_SEND, 0, &x, sizeof x};
  EXPECT_EQ(mp_nccl_p2p(nullptr, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_all_reduce_sum(nullptr, &x, 1, MP_NCCL_FLOAT32, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_reduce_scatter_sum(nullptr, &x, &x, 1, MP_NCCL_FLOAT32, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_all_gather(nullptr, &x, &x, 1, MP_NCCL_FLOAT32, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_broadcast(nullptr, &x, sizeof x, 0, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_comm_synchronize(nullptr, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_comm_wait_stream(nullptr, nullptr, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_stream_wait_comm(nullptr, nullptr, &err), MP_ERR_INPUT);
  mp_nccl_comm_free(nullptr);
  mp_nccl_world_free(nullptr);
}

// --- on a GPU -----------------------------------------------------------------------------------

TEST(CommNcclGpu, StagingRecognisesAndCopiesDeviceMemory) {
  REQUIRE_GPU();
  mp_error err = MP_ERROR_INITIALIZER;
  void *device = nullptr, *pinned = nullptr;
  ASSERT_EQ(mp_device_alloc(&device, 4096, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_staging_host_alloc(&pinned, 4096, &err), MP_OK) << err.message;
  EXPECT_TRUE(mp_staging_is_device(device));
  EXPECT_TRUE(mp_staging_is_device(static_cast<char *>(device) + 1000));  // inside it too
  EXPECT_FALSE(mp_staging_is_device(pinned));
  std::vector<float> host = Ramp(1024, 0.5f), back(1024, -1.0f);
  EXPECT_EQ(mp_staging_copy(device, host.data(), 4096, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_staging_copy(pinned, device, 4096, &err), MP_OK) << err.message;
  std::memcpy(back.data(), pinned, 4096);
  EXPECT_EQ(back, host);
  mp_staging_host_free(pinned);
  mp_device_free(device);
}

TEST(CommNcclGpu, OneRankCollectivesAndSendRecvGiveTheirClosedForms) {
  REQUIRE_GPU();
  OneRank r;
  ASSERT_TRUE(r.ok) << r.err.message;
  EXPECT_EQ(mp_nccl_comm_rank(r.comm), 0);
  EXPECT_EQ(mp_nccl_comm_size(r.comm), 1);
  EXPECT_STREQ(mp_nccl_comm_name(r.comm), "self");
  EXPECT_NE(mp_nccl_comm_stream(r.comm), nullptr);

  const size_t n = 1000;
  const std::vector<float> a = Ramp(n, 1.0f), poison(n, -1.0f);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = (uint16_t)(0x3f80 + i % 64);  // bf16 1.0, 1.0078, ...
  float *sum = r.Upload(a), *scattered = r.Upload(poison), *gathered = r.Upload(poison);
  float *broadcast = r.Upload(a), *received = r.Upload(poison);
  uint16_t *half = r.Upload(bits);
  ASSERT_NE(half, nullptr) << r.err.message;
  // The uploads ran on the legacy default stream; the communicator's stream waits for them.
  ASSERT_EQ(mp_nccl_comm_wait_stream(r.comm, nullptr, &r.err), MP_OK) << r.err.message;

  mp_error &err = r.err;
  ASSERT_EQ(mp_nccl_all_reduce_sum(r.comm, sum, n, MP_NCCL_FLOAT32, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_reduce_scatter_sum(r.comm, sum, scattered, n, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_nccl_all_gather(r.comm, sum, gathered, n, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_nccl_broadcast(r.comm, broadcast, n * sizeof(float), 0, &err), MP_OK)
      << err.message;
  const mp_nccl_p2p_op ops[2] = {{MP_NCCL_SEND, 0, sum, n * sizeof(float)},
                                 {MP_NCCL_RECV, 0, received, n * sizeof(float)}};
  ASSERT_EQ(mp_nccl_p2p(r.comm, ops, 2, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_all_reduce_sum(r.comm, half, n, MP_NCCL_BFLOAT16, &err), MP_OK)
      << err.message;
  // The uneven collectives (ZeRO 2 and 3) over one member: a copy, or in place nothing.
  const size_t counts[1] = {n};
  float *scattered_v = r.Upload(poison), *gathered_v = r.Upload(poison);
  uint16_t *half_v = r.Upload(bits);
  ASSERT_NE(half_v, nullptr) << r.err.message;
  ASSERT_EQ(mp_nccl_comm_wait_stream(r.comm, nullptr, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_reduce_scatter_v_sum_f32(r.comm, sum, scattered_v, counts, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_nccl_all_gather_v(r.comm, sum, gathered_v, counts, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_nccl_all_gather_v(r.comm, nullptr, half_v, counts, MP_NCCL_BFLOAT16, &err), MP_OK)
      << err.message;
  // A mark after the gathers: the default stream waits for them through it.
  ASSERT_EQ(mp_nccl_comm_mark(r.comm, 1, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_stream_wait_mark(nullptr, r.comm, 1, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_comm_synchronize(r.comm, &err), MP_OK) << err.message;

  // One member: every sum is its own input, every gather and scatter a copy.
  EXPECT_EQ(r.Download(sum, n), a);
  EXPECT_EQ(r.Download(scattered, n), a);
  EXPECT_EQ(r.Download(gathered, n), a);
  EXPECT_EQ(r.Download(broadcast, n), a);
  EXPECT_EQ(r.Download(received, n), a);
  EXPECT_EQ(r.Download(half, n), bits);
  EXPECT_EQ(r.Download(scattered_v, n), a);
  EXPECT_EQ(r.Download(gathered_v, n), a);
  EXPECT_EQ(r.Download(half_v, n), bits);
  EXPECT_FALSE(mp_nccl_world_aborted(r.world));
}

TEST(CommNcclGpu, BadArgumentsAreRefusedByNameAndLeaveTheCommunicatorUsable) {
  REQUIRE_GPU();
  OneRank r;
  ASSERT_TRUE(r.ok) << r.err.message;
  std::vector<float> host = Ramp(64, 1.0f);
  float *device = r.Upload(host);
  ASSERT_NE(device, nullptr) << r.err.message;
  mp_error err = MP_ERROR_INITIALIZER;

  EXPECT_EQ(mp_nccl_all_reduce_sum(r.comm, host.data(), 64, MP_NCCL_FLOAT32, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("all-reduce in group self: the buffer (256 bytes) is "
                                          "host memory; NCCL needs GPU memory"),
            std::string::npos)
      << err.message;
  EXPECT_EQ(mp_nccl_all_reduce_sum(r.comm, device, 64, (mp_nccl_dtype)7, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("unknown element type 7"), std::string::npos)
      << err.message;
  EXPECT_EQ(mp_nccl_broadcast(r.comm, device, 256, 1, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("root 1 is not a group rank (0 .. 0)"),
            std::string::npos)
      << err.message;
  mp_nccl_p2p_op op = {MP_NCCL_SEND, 1, device, 256};
  EXPECT_EQ(mp_nccl_p2p(r.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("send in group self (ranks 0): peer 1 is not a group "
                                          "rank (0 .. 0)"),
            std::string::npos)
      << err.message;
  op = {(mp_nccl_p2p_kind)5, 0, device, 256};
  EXPECT_EQ(mp_nccl_p2p(r.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(mp_nccl_p2p(r.comm, &op, -1, &err), MP_ERR_INPUT);
  op = {MP_NCCL_RECV, 0, nullptr, 256};
  EXPECT_EQ(mp_nccl_p2p(r.comm, &op, 1, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("NULL receive buffer of 256 bytes"), std::string::npos)
      << err.message;
  EXPECT_EQ(mp_nccl_all_gather(r.comm, device, device, 0, MP_NCCL_FLOAT32, &err), MP_OK);

  // Nothing was posted, nothing aborted: the communicator still works.
  EXPECT_EQ(mp_nccl_all_reduce_sum(r.comm, device, 64, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  EXPECT_EQ(mp_nccl_comm_synchronize(r.comm, &err), MP_OK) << err.message;
  EXPECT_FALSE(mp_nccl_world_aborted(r.world));
}

TEST(CommNcclGpu, OperationsWaitForTheComputeStreamAndComputeWaitsForThem) {
  REQUIRE_GPU();
  OneRank r;
  ASSERT_TRUE(r.ok) << r.err.message;
  mp_cuda_stream before = nullptr, after = nullptr;
  ASSERT_EQ(mp_device_stream_create(&before, &r.err), MP_OK) << r.err.message;
  ASSERT_EQ(mp_device_stream_create(&after, &r.err), MP_OK) << r.err.message;
  float *buffer = r.Upload(Ramp(1 << 20, 1.0f));
  ASSERT_NE(buffer, nullptr) << r.err.message;
  ASSERT_EQ(mp_nccl_comm_wait_stream(r.comm, nullptr, &r.err), MP_OK) << r.err.message;

  // `before` is held for 0.3 s; the all-reduce waits for it, and `after` for the all-reduce.
  volatile int release = 0;
  ASSERT_EQ(mp_test_stall_stream(before, &release, 10.0, &r.err), MP_OK) << r.err.message;
  const auto start = std::chrono::steady_clock::now();
  std::thread releaser([&release] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    release = 1;
  });
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_nccl_comm_wait_stream(r.comm, before, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_nccl_all_reduce_sum(r.comm, buffer, 1 << 20, MP_NCCL_FLOAT32, &err), MP_OK)
      << err.message;
  EXPECT_EQ(mp_nccl_stream_wait_comm(after, r.comm, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_test_stream_synchronize(after, &err), MP_OK) << err.message;
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  releaser.join();
  EXPECT_GE(waited, 0.25) << "the stream after the all-reduce did not wait for the stream before";
  EXPECT_EQ(mp_nccl_comm_synchronize(r.comm, &err), MP_OK) << err.message;
  mp_device_stream_destroy(before);
  mp_device_stream_destroy(after);
}

}  // namespace
