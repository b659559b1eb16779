// tests/layers/cuda_testing.h — what the CUDA kernel tests share: skipping by name without a GPU,
// bf16 rounding, the max-relative-error measure with its printed line, and Gpu, a scope that
// owns a stream, an mp_cublas and device buffers.
//
// Error measure: ||gpu - ref||_inf / ||ref||_inf over a whole output; a NaN or infinity on the GPU
// fails (tests poison outputs with NaN first, so an element never written fails too).
#ifndef MPENGINE_TESTS_LAYERS_CUDA_TESTING_H
#define MPENGINE_TESTS_LAYERS_CUDA_TESTING_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/device/device.h"
#include "layers/cuda_types.h"
#include "layers/matmul.h"

namespace mp_test {

#define SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                   \
    if (mp_device_count() == 0) {                                                        \
      const ::testing::TestInfo *info_ =                                                 \
          ::testing::UnitTest::GetInstance()->current_test_info();                       \
      GTEST_SKIP() << "no GPU visible: " << info_->test_suite_name() << "." << info_->name() \
                   << " needs CUDA";                                                     \
    }                                                                                    \
  } while (0)


// Rounds every value to bf16 and back: the inputs that both implementations then see.
std::vector<float> RoundToBf16(std::vector<float> values);

std::vector<mp_bf16> ToBf16(const std::vector<float> &values);

std::vector<float> ToFloat(const std::vector<mp_bf16> &values);

std::vector<float> Plus(const std::vector<float> &a, const std::vector<float> &b);

// ||gpu - cpu||_inf / ||cpu||_inf; NaN when the GPU holds a NaN or an infinity.
double MaxRelErr(const std::vector<float> &gpu, const std::vector<float> &cpu);

// Prints "kernel <name>: max rel err <x> (tolerance <y>)" and passes when x <= y (NaN fails).
::testing::AssertionResult WithinTolerance(const std::string &name, const std::vector<float> &gpu,
                                           const std::vector<float> &cpu, double tolerance);

template <typename T>
bool BitwiseEqual(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Slice `part` (0 q, 1 k, 2 v) of a (B*T, 3C) tensor, as (B*T, C).
std::vector<float> Part(const std::vector<float> &qkv, int part, int BT, int C);

// Slice `part` (0 q, 1 k, 2 v) of a (BT, W) qkv tensor with kv-head groups, W = (NH + 2 KVH) HS:
// (BT, NH HS) for q, (BT, KVH HS) for k and v.
std::vector<float> QkvPart(const std::vector<float> &qkv, int part, int BT, int NH, int KVH,
                           int HS);

// The multi-head (B, T, 3 NH HS) input equivalent to a grouped (B, T, W) one: kv head g repeated
// for each query head of its group (Hugging Face's repeat_kv).
template <typename T>
std::vector<T> RepeatKv(const std::vector<T> &qkv, int BT, int NH, int KVH, int HS) {
  const size_t W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
  std::vector<T> out((size_t)BT * 3 * C);
  for (int r = 0; r < BT; r++) {
    const T *from = &qkv[r * W];
    T *to = &out[r * 3 * C];
    std::memcpy(to, from, C * sizeof(T));
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / KVH);
      std::memcpy(to + C + (size_t)h * HS, from + C + (size_t)g * HS, HS * sizeof(T));
      std::memcpy(to + 2 * C + (size_t)h * HS, from + C + (size_t)(KVH + g) * HS, HS * sizeof(T));
    }
  }
  return out;
}

// dk or dv of the NH repeated kv heads (BT, NH HS) summed over each group: (BT, KVH HS).
std::vector<float> SumGroups(const std::vector<float> &repeated, int BT, int NH, int KVH, int HS);


// A stream, an mp_cublas and device buffers for one test, all freed when it goes out of scope.
// A failing call sets ok() false and keeps its message; tests ASSERT on ok() between phases.
// Copies and memsets run on the legacy default stream and launches on `stream` (non-blocking),
// so tests Sync() between the two.
class Gpu {
 public:
  Gpu() {
    if (mp_device_stream_create(&stream, &err_) != MP_OK ||
        mp_cublas_create(&cublas, &err_) != MP_OK) {
      ok_ = false;
    }
  }
  ~Gpu() {
    mp_error ignored = MP_ERROR_INITIALIZER;
    mp_device_synchronize(&ignored);
    for (void *buffer : buffers_) mp_device_free(buffer);
    mp_cublas_free(cublas);
    mp_device_stream_destroy(stream);
  }
  Gpu(const Gpu &) = delete;
  Gpu &operator=(const Gpu &) = delete;

  bool ok() const { return ok_; }
  const char *error() const { return err_.message; }

  // n elements, every byte set to fill_byte.
  template <typename T>
  T *Alloc(size_t n, int fill_byte = 0) {
    void *buffer = nullptr;
    if (!ok_) return nullptr;
    if (mp_device_alloc(&buffer, n * sizeof(T), &err_) != MP_OK) {
      ok_ = false;
      return nullptr;
    }
    buffers_.push_back(buffer);
    Fill(static_cast<T *>(buffer), n, fill_byte);
    return static_cast<T *>(buffer);
  }
  template <typename T>
  void Fill(T *device, size_t n, int byte) {
    if (ok_ && mp_device_memset(device, byte, n * sizeof(T), &err_) != MP_OK) ok_ = false;
  }
  template <typename T>
  T *Upload(const std::vector<T> &host) {
    T *device = Alloc<T>(host.size());
    CopyIn(device, host);
    return device;
  }
  template <typename T>
  void CopyIn(T *device, const std::vector<T> &host) {
    if (ok_ && mp_device_copy_to_device(device, host.data(), host.size() * sizeof(T), &err_) !=
                   MP_OK) {
      ok_ = false;
    }
  }
  template <typename T>
  std::vector<T> Download(const T *device, size_t n) {
    std::vector<T> host(n);
    if (ok_ && mp_device_copy_to_host(host.data(), device, n * sizeof(T), &err_) != MP_OK) {
      ok_ = false;
    }
    return host;
  }
  std::vector<float> DownloadBf16(const mp_bf16 *device, size_t n) {
    return ToFloat(Download(device, n));
  }
  // Waits for all work, then collects the first failure a launcher recorded.
  void Sync() {
    if (!ok_) return;
    if (mp_device_synchronize(&err_) != MP_OK || mp_cublas_check(cublas, &err_) != MP_OK) {
      ok_ = false;
    }
  }

  mp_cublas *cublas = nullptr;
  mp_cuda_stream stream = nullptr;

 private:
  bool ok_ = true;
  mp_error err_ = MP_ERROR_INITIALIZER;
  std::vector<void *> buffers_;
};

}  // namespace mp_test

#endif  // MPENGINE_TESTS_LAYERS_CUDA_TESTING_H
