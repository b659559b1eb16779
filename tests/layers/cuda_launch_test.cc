// tests/layers/cuda_launch_test.cc — layers/cuda_launch.h: the first failed launch of a thread is
// reported with its kernel, file and line, once; the device synchronisation the engine calls at
// every step reports it before waiting (so the error names the kernel, not the wait).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "engine/device/device.h"
#include "layers/cuda_launch.h"

TEST(CudaLaunch, TheFirstFailedLaunchIsNamedOnce) {
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cuda_take_launch_failure(&err), MP_OK);
  mp_cuda_record_launch_failure("gelu_forward_kernel", "layers/gelu_cuda.cu", 73,
                                "invalid configuration argument");
  mp_cuda_record_launch_failure("residual_forward_kernel", "layers/residual_cuda.cu", 58,
                                "too many resources requested for launch");
  ASSERT_EQ(mp_cuda_take_launch_failure(&err), MP_ERR_RUNTIME);
  EXPECT_STREQ(err.message,
               "kernel gelu_forward_kernel launched at layers/gelu_cuda.cu:73 failed: invalid "
               "configuration argument");
  EXPECT_EQ(mp_cuda_take_launch_failure(&err), MP_OK) << "reported twice";
}

TEST(CudaLaunch, EachThreadHasItsOwn) {
  mp_cuda_record_launch_failure("adamw_update_kernel", "layers/adamw_cuda.cu", 131, "boom");
  mp_status other = MP_ERR_RUNTIME;
  std::thread([&other] {
    mp_error err = MP_ERROR_INITIALIZER;
    other = mp_cuda_take_launch_failure(&err);
  }).join();
  EXPECT_EQ(other, MP_OK);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cuda_take_launch_failure(&err), MP_ERR_RUNTIME);
}

TEST(CudaLaunch, DeviceSynchronizeReportsTheLaunchFirst) {
  mp_cuda_record_launch_failure("vocab_ce_max_kernel", "layers/tensor_parallel_cuda.cu", 338,
                                "invalid argument");
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_device_synchronize(&err), MP_ERR_RUNTIME);
  EXPECT_NE(std::string(err.message).find("kernel vocab_ce_max_kernel launched at "
                                          "layers/tensor_parallel_cuda.cu:338 failed"),
            std::string::npos)
      << err.message;
}
