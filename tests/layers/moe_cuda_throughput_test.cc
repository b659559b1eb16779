// tests/layers/moe_cuda_throughput_test.cc — the speed of the GPU mixture of experts
// (//layers:cuda_moe) at real layer sizes, for the device log: a Mixtral-8x7B layer (E 8, top 2,
// C 4096, F 14336) and a fine-grained one (E 64, top 6, C 2048, F 1408: small per-expert batches,
// what the planner needs measured), 4096 tokens each, forward and backward, the experts' GEMMs
// grouped and as a loop. Prints "kernel moe_forward ...: ms, TFLOP/s" lines.
//
// It checks the numbers it times: the grouped path's out, dx and expert weight gradients against
// the loop's within 2e-2 (the loop is held to the CPU layer by moe_cuda_test at small sizes;
// both round the same bf16 tensors once, so they differ by ~2^-9 of an element, and a wrong
// offset or leading dimension would differ by order 1), and nothing NaN or infinite.
//
// GPU only: it skips itself, by name, where no GPU is visible, and is not in the emulated set
// (tools/test.sh): on the CPU its ~10 TFLOP would take hours. tools/device_check.sh runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/device/device.h"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/moe.h"
#include "layers/moe_cuda.h"
#include "tests/layers/cuda_testing.h"
#include "tests/layers/finite_difference.h"

namespace {

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h

constexpr double kBf16Tolerance = 2e-2;
constexpr size_t kPatternValues = (size_t)1 << 20;  // weights tile a random pattern of 1M values

struct LayerSize {
  const char *name;
  int tokens, channels, experts, top_k, expert_ffn;
};

// count bf16 values at device filled with the pattern, repeated.
bool FillTiled(mp_bf16 *device, size_t count, const std::vector<mp_bf16> &pattern,
               mp_error *err) {
  for (size_t at = 0; at < count; at += pattern.size()) {
    const size_t n = count - at < pattern.size() ? count - at : pattern.size();
    if (mp_device_copy_to_device(device + at, pattern.data(), n * sizeof(mp_bf16), err) !=
        MP_OK) {
      return false;
    }
  }
  return true;
}

class CudaMoeThroughput : public ::testing::TestWithParam<LayerSize> {};

TEST_P(CudaMoeThroughput, ForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  const LayerSize &size = GetParam();
  mp_moe_shape shape{};
  shape.tokens = size.tokens;
  shape.channels = size.channels;
  shape.experts = size.experts;
  shape.top_k = size.top_k;
  shape.expert_ffn = size.expert_ffn;
  shape.normalize_top_k = true;
  const size_t N = shape.tokens, C = shape.channels, E = shape.experts, F = shape.expert_ffn;

  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  Rng rng(31);
  const float scale = 1.0f / std::sqrt((float)C);
  const float fc2_scale = 1.0f / std::sqrt((float)F);
  const std::vector<mp_bf16> fc1_pattern =
      ToBf16(rng.uniform_vector(kPatternValues, -scale, scale));
  const std::vector<mp_bf16> fc2_pattern =
      ToBf16(rng.uniform_vector(kPatternValues, -fc2_scale, fc2_scale));
  mp_moe_weights_cuda weights{};
  weights.router = gpu.Upload(ToBf16(rng.uniform_vector(E * C, -0.02f, 0.02f)));
  mp_bf16 *fc1 = gpu.Alloc<mp_bf16>(E * 2 * F * C);
  mp_bf16 *fc2 = gpu.Alloc<mp_bf16>(E * C * F);
  weights.expert_fc1 = fc1;
  weights.expert_fc2 = fc2;
  mp_moe_grads_cuda grads{};
  grads.router = gpu.Alloc<float>(E * C);
  grads.expert_fc1 = gpu.Alloc<float>(E * 2 * F * C);
  grads.expert_fc2 = gpu.Alloc<float>(E * C * F);
  const mp_bf16 *x = gpu.Upload(ToBf16(rng.uniform_vector(N * C, -1.0f, 1.0f)));
  const mp_bf16 *dout = gpu.Upload(ToBf16(rng.uniform_vector(N * C, -1.0f, 1.0f)));
  mp_bf16 *out = gpu.Alloc<mp_bf16>(N * C, 0xFF);
  mp_bf16 *dx = gpu.Alloc<mp_bf16>(N * C);
  uint8_t *cache_arena = gpu.Alloc<uint8_t>(mp_moe_cache_cuda_bytes(&shape));
  uint8_t *workspace_arena = gpu.Alloc<uint8_t>(mp_moe_workspace_cuda_bytes(&shape));
  double *stats_scratch = gpu.Alloc<double>(E + 1);
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  ASSERT_TRUE(FillTiled(fc1, E * 2 * F * C, fc1_pattern, &err)) << err.message;
  ASSERT_TRUE(FillTiled(fc2, E * C * F, fc2_pattern, &err)) << err.message;
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();

  std::vector<int> offsets(E + 1);
  mp_moe_cache_cuda cache;
  mp_moe_cache_cuda_carve(&cache, &shape, cache_arena, offsets.data());
  void **const grouped_pointers = cache.gemm_pointers;
  mp_moe_workspace_cuda workspace;
  mp_moe_workspace_cuda_carve(&workspace, &shape, workspace_arena);
  std::vector<double> routed(E, 0.0), prob_sum(E, 0.0);
  mp_moe_stats stats = {shape.experts, 0.0, routed.data(), prob_sum.data(), 0.0};

  mp_device_timer *timer = nullptr;
  ASSERT_EQ(mp_device_timer_create(&timer, &err), MP_OK) << err.message;
  const std::unique_ptr<mp_device_timer, void (*)(mp_device_timer *)> timer_owner(
      timer, mp_device_timer_free);
  mp_status status = MP_OK;
  auto forward = [&] {
    if (status == MP_OK) {
      status = mp_moe_forward_cuda(gpu.cublas, out, x, &weights, &cache, gpu.stream, &err);
    }
  };
  auto backward = [&] {
    if (status == MP_OK) {
      status = mp_moe_backward_cuda(gpu.cublas, dx, &grads, dout, x, &weights, &cache, &stats,
                                    0.01, 0.001, &workspace, gpu.stream, &err);
    }
  };
  auto time_it = [&](int iterations, const std::function<void()> &launch) {
    launch();  // warm-up: heuristics, clocks
    double seconds = 0.0;
    if (mp_device_timer_start(timer, gpu.stream, &err) != MP_OK) return -1.0;
    for (int i = 0; i < iterations; i++) launch();
    if (mp_device_timer_stop(timer, gpu.stream, &seconds, &err) != MP_OK) return -1.0;
    return status == MP_OK ? seconds / iterations : -1.0;
  };

  // The expert GEMMs' FLOPs (fc1, fc2; the backward twice that) and the router's.
  const double forward_flops = 6.0 * N * shape.top_k * C * F + 2.0 * N * C * E;
  std::vector<float> grouped_out, grouped_dx, grouped_dfc1, grouped_dfc2;
  for (bool grouped : {true, false}) {
    cache.gemm_pointers = grouped ? grouped_pointers : nullptr;
    const double forward_s = time_it(10, forward);
    ASSERT_GT(forward_s, 0.0) << err.message;
    forward();  // the cache of the last forward for the backward
    mp_moe_stats_clear(&stats);
    ASSERT_EQ(mp_moe_stats_add_cuda(&stats, &cache, stats_scratch, gpu.stream, &err), MP_OK)
        << err.message;
    const double backward_s = time_it(10, backward);
    ASSERT_GT(backward_s, 0.0) << err.message;
    int fewest = shape.tokens * shape.top_k, most = 0;
    for (size_t e = 0; e < E; ++e) {
      const int rows = offsets[e + 1] - offsets[e];
      fewest = rows < fewest ? rows : fewest;
      most = rows > most ? rows : most;
    }
    const std::string what = std::string(size.name) + " N=" + std::to_string(N) +
                             " C=" + std::to_string(C) + " E=" + std::to_string(E) +
                             " K=" + std::to_string(shape.top_k) + " F=" + std::to_string(F) +
                             (grouped ? " grouped GEMM" : " GEMM loop");
    std::printf("kernel moe_forward %s: %.3f ms, %.1f TFLOP/s (rows per expert %d..%d)\n",
                what.c_str(), forward_s * 1e3, forward_flops / forward_s * 1e-12, fewest, most);
    std::printf("kernel moe_backward %s: %.3f ms, %.1f TFLOP/s\n", what.c_str(),
                backward_s * 1e3, 2.0 * forward_flops / backward_s * 1e-12);

    // One forward and backward from zeroed gradients, kept for the comparison.
    gpu.Sync();
    gpu.Fill(dx, N * C, 0);
    gpu.Fill(grads.expert_fc1, E * 2 * F * C, 0);
    gpu.Fill(grads.expert_fc2, E * C * F, 0);
    gpu.Sync();
    forward();
    backward();
    ASSERT_EQ(status, MP_OK) << err.message;
    ASSERT_EQ(mp_cuda_take_launch_failure(&err), MP_OK) << err.message;
    gpu.Sync();
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    std::vector<float> got_out = gpu.DownloadBf16(out, N * C);
    std::vector<float> got_dx = gpu.DownloadBf16(dx, N * C);
    std::vector<float> got_dfc1 = gpu.Download(grads.expert_fc1, E * 2 * F * C);
    std::vector<float> got_dfc2 = gpu.Download(grads.expert_fc2, E * C * F);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    if (grouped) {
      grouped_out.swap(got_out);
      grouped_dx.swap(got_dx);
      grouped_dfc1.swap(got_dfc1);
      grouped_dfc2.swap(got_dfc2);
      continue;
    }
    const std::string name = std::string(size.name) + " grouped against loop";
    EXPECT_TRUE(WithinTolerance("moe out " + name, grouped_out, got_out, kBf16Tolerance));
    EXPECT_TRUE(WithinTolerance("moe dx " + name, grouped_dx, got_dx, kBf16Tolerance));
    EXPECT_TRUE(
        WithinTolerance("moe dexpert_fc1 " + name, grouped_dfc1, got_dfc1, kBf16Tolerance));
    EXPECT_TRUE(
        WithinTolerance("moe dexpert_fc2 " + name, grouped_dfc2, got_dfc2, kBf16Tolerance));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, CudaMoeThroughput,
    ::testing::Values(LayerSize{"mixtral_8x7b", 4096, 4096, 8, 2, 14336},
                      LayerSize{"fine_grained_64", 4096, 2048, 64, 6, 1408}),
    [](const ::testing::TestParamInfo<LayerSize> &info) { return std::string(info.param.name); });

}  // namespace
