// tests/engine/comm_nccl_watchdog_test.cc — the NCCL watchdog on one GPU: an all-reduce that cannot
// complete (its communicator waits for a stream held still from the host) becomes, after the
// timeout, an error with the exact message, every communicator of the process is aborted, and
// every later call says so at once. An abort is final for the process, hence a binary of its own.
// Skipped, by name, where no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "engine/comm/comm_nccl.h"
#include "engine/device/device.h"
#include "tests/engine/comm_nccl_testing.h"

namespace {

TEST(CommNcclWatchdog, AStalledAllReduceTimesOutAndAbortsEveryCommunicator) {
  if (!mp_nccl_available() || mp_device_count() == 0) {
    GTEST_SKIP() << "no GPU visible: CommNcclWatchdog."
                    "AStalledAllReduceTimesOutAndAbortsEveryCommunicator needs CUDA and NCCL";
  }
  mp_error err = MP_ERROR_INITIALIZER;
  mp_nccl_world *world = nullptr;
  mp_nccl_comm *stalled = nullptr, *other = nullptr;
  ASSERT_EQ(mp_nccl_world_create(nullptr, 0, &world, &err), MP_OK) << err.message;
  mp_nccl_world_set_timeout(world, 0.5);
  EXPECT_EQ(mp_nccl_world_timeout(world), 0.5);
  ASSERT_EQ(mp_nccl_comm_create(world, nullptr, &stalled, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_comm_create(world, nullptr, &other, &err), MP_OK) << err.message;
  void *buffer = nullptr;
  ASSERT_EQ(mp_device_alloc(&buffer, 4096, &err), MP_OK) << err.message;
  mp_cuda_stream compute = nullptr;
  ASSERT_EQ(mp_device_stream_create(&compute, &err), MP_OK) << err.message;

  // The compute stream is held (at most 3 s); the all-reduce is ordered after it.
  volatile int release = 0;
  ASSERT_EQ(mp_test_stall_stream(compute, &release, 3.0, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_nccl_comm_wait_stream(stalled, compute, &err), MP_OK) << err.message;
  const auto start = std::chrono::steady_clock::now();
  mp_status posted = mp_nccl_all_reduce_sum(stalled, buffer, 1024, MP_NCCL_FLOAT32, &err);
  mp_status waited = posted == MP_OK ? mp_nccl_comm_synchronize(stalled, &err) : posted;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release = 1;

  EXPECT_EQ(waited, MP_ERR_RUNTIME);
  EXPECT_STREQ(err.message,
               "rank 0: all-reduce in group self (ranks 0) timed out after 0.5 s (4096 bytes) on "
               "NCCL; communicators aborted");
  EXPECT_LT(seconds, 8.0) << "the watchdog took too long to give up";
  EXPECT_TRUE(mp_nccl_world_aborted(world));

  // The other communicator was aborted too, and says why; no new one can be made.
  mp_error later = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_nccl_all_reduce_sum(other, buffer, 1024, MP_NCCL_FLOAT32, &later), MP_ERR_RUNTIME);
  const std::string message = later.message;
  EXPECT_NE(message.find("rank 0: group self (ranks 0) can no longer be used: the NCCL "
                         "communicators of this process were aborted after: rank 0: all-reduce "
                         "in group self (ranks 0) timed out after 0.5 s"),
            std::string::npos)
      << message;
  mp_nccl_comm *fresh = nullptr;
  EXPECT_EQ(mp_nccl_comm_create(world, nullptr, &fresh, &later), MP_ERR_RUNTIME);
  EXPECT_NE(std::string(later.message).find("no NCCL communicator can be created"),
            std::string::npos)
      << later.message;

  mp_nccl_comm_free(other);
  mp_nccl_comm_free(stalled);
  mp_nccl_world_free(world);
  mp_device_stream_destroy(compute);
  mp_device_free(buffer);
}

}  // namespace
