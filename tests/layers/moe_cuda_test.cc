// tests/layers/moe_cuda_test.cc — the GPU twin of the mixture of experts (//layers:cuda_moe)
// against the CPU layer (mp_moe_forward_cpu / mp_moe_backward_cpu) on the same bf16-rounded
// inputs: the routing (which experts, their weights, the grouping), the router statistics, the
// output, the input gradient and every parameter gradient, with the auxiliary load-balancing and z
// losses on; the experts' GEMMs grouped (cuBLAS's grouped GEMM) and as a loop, and the steps run
// one by one with the experts in two halves (as expert parallelism runs them). E 4 and 8, top-k 1
// and 2, with and without the shared MLP and its gate, top-k renormalised (Mixtral) or not
// (Qwen2-MoE's default), experts that no token reaches (one; a whole half, so one call of the
// experts' steps has no row at all); E 72 for two grouped GEMM calls of 64 experts. Two runs give
// the same bits.
//
// Every test skips itself, by name, when no GPU is visible (CI builds CUDA without a GPU); it
// also runs under emulated CUDA (tools/test.sh), where the kernels are moe.c's steps and the
// GEMMs the matmul twin's emulation: there it checks the compositions, shapes and roundings.
//
// Error measure: ||gpu - cpu||_inf / ||cpu||_inf over a whole tensor (cuda_testing.h).
// Tolerances:
//   the routing exactly: the chosen experts and the offsets are integers, and the logits differ
//     from the CPU's only by the fp32 summation order (~1e-7 relative), far below the gaps
//     between these random inputs' probabilities;
//   probabilities and combine weights (fp32) 1e-5: one softmax of logits that differ by ~1e-7;
//   router statistics 1e-5 (the same, summed);
//   out, dx and the gradients 2e-2. The expert and shared GEMMs run on bf16 activations: fc1,
//     act, the expert outputs and out (and d(act), d(fc1), the routed rows' gradients, dx) are
//     each rounded once to bf16, up to 2^-9 ~ 2e-3 of the element, and a few such roundings
//     compose to ~5e-3 of a tensor's largest element; 2e-2 leaves room without hiding a row sent
//     to the wrong expert, a missing weight or term, or a wrong slot (errors of order 1). The
//     weight gradients are fp32 sums over those bf16 operands, so they carry the same ~5e-3.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/moe.h"
#include "layers/moe_cuda.h"
#include "tests/layers/cuda_testing.h"
#include "tests/layers/finite_difference.h"

namespace {

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h

constexpr double kBf16Tolerance = 2e-2;
constexpr double kFp32Tolerance = 1e-5;
constexpr double kAuxCoeff = 0.02;  // both losses on, so their gradients are checked too
constexpr double kZCoeff = 0.001;

struct MoeCase {
  int experts, top_k;
  bool shared, gate, normalize;
  int idle_experts;  // the last ones, which no token reaches
};

std::string Describe(const MoeCase &c) {
  return "E" + std::to_string(c.experts) + "_K" + std::to_string(c.top_k) +
         (c.shared ? (c.gate ? "_gated_shared" : "_shared") : "") +
         (c.normalize ? "_normalized" : "") +
         (c.idle_experts > 0 ? "_idle" + std::to_string(c.idle_experts) : "");
}

// The CPU layer's inputs (bf16-rounded) and its forward and backward on them.
struct CpuMoe {
  explicit CpuMoe(const MoeCase &c) {
    shape.tokens = 40;
    shape.channels = 64;
    shape.experts = c.experts;
    shape.top_k = c.top_k;
    shape.expert_ffn = 32;
    shape.shared_ffn = c.shared ? 48 : 0;
    shape.shared_gate = c.gate;
    shape.normalize_top_k = c.normalize;
    const size_t N = shape.tokens, C = shape.channels, E = shape.experts, F = shape.expert_ffn;
    const size_t Fs = shape.shared_ffn;
    Rng rng(7000 + 100 * c.experts + 10 * c.top_k + (c.shared ? 4 : 0) + (c.gate ? 2 : 0) +
            (c.normalize ? 1 : 0));
    x = rng.uniform_vector(N * C, -1.0f, 1.0f);
    router = rng.uniform_vector(E * C, -0.3f, 0.3f);
    if (c.idle_experts > 0) {
      // Channel 0 is 1 for every token and the idle experts' router weight on it -16: their
      // logits are ~15 below every other's, so no token chooses them.
      for (size_t t = 0; t < N; ++t) x[t * C] = 1.0f;
      for (size_t e = 0; e < E; ++e) router[e * C] = e + c.idle_experts >= E ? -16.0f : 0.0f;
    }
    x = RoundToBf16(x);
    router = RoundToBf16(router);
    expert_fc1 = RoundToBf16(rng.uniform_vector(E * 2 * F * C, -0.2f, 0.2f));
    expert_fc2 = RoundToBf16(rng.uniform_vector(E * C * F, -0.3f, 0.3f));
    if (Fs > 0) {
      shared_fc1 = RoundToBf16(rng.uniform_vector(2 * Fs * C, -0.2f, 0.2f));
      shared_fc2 = RoundToBf16(rng.uniform_vector(C * Fs, -0.3f, 0.3f));
    }
    if (c.gate) shared_gate = RoundToBf16(rng.uniform_vector(C, -0.2f, 0.2f));
    dout = RoundToBf16(rng.uniform_vector(N * C, -1.0f, 1.0f));

    params = {router.data(), expert_fc1.data(), expert_fc2.data(), Ptr(shared_fc1),
              Ptr(shared_fc2), Ptr(shared_gate)};
    grad_router.assign(router.size(), 0.0f);
    grad_fc1.assign(expert_fc1.size(), 0.0f);
    grad_fc2.assign(expert_fc2.size(), 0.0f);
    grad_shared_fc1.assign(shared_fc1.size(), 0.0f);
    grad_shared_fc2.assign(shared_fc2.size(), 0.0f);
    grad_shared_gate.assign(shared_gate.size(), 0.0f);
    grads = {grad_router.data(), grad_fc1.data(),        grad_fc2.data(),
             Ptr(grad_shared_fc1), Ptr(grad_shared_fc2), Ptr(grad_shared_gate)};
    routed.assign(E, 0.0);
    prob_sum.assign(E, 0.0);
    stats = {shape.experts, 0.0, routed.data(), prob_sum.data(), 0.0};
  }
  ~CpuMoe() { mp_moe_cache_free(&cache); }

  static float *Ptr(std::vector<float> &v) { return v.empty() ? nullptr : v.data(); }

  ::testing::AssertionResult Run() {
    mp_error err = MP_ERROR_INITIALIZER;
    out.assign(x.size(), 0.0f);
    dx.assign(x.size(), 0.0f);
    if (mp_moe_forward_cpu(out.data(), x.data(), &params, &shape, &cache, &err) != MP_OK) {
      return ::testing::AssertionFailure() << err.message;
    }
    mp_moe_stats_clear(&stats);
    mp_moe_stats_add(&stats, &cache);
    if (mp_moe_backward_cpu(dx.data(), &grads, dout.data(), x.data(), &params, &cache, &stats,
                            kAuxCoeff, kZCoeff, &err) != MP_OK) {
      return ::testing::AssertionFailure() << err.message;
    }
    return ::testing::AssertionSuccess();
  }

  mp_moe_shape shape{};
  std::vector<float> x, router, expert_fc1, expert_fc2, shared_fc1, shared_fc2, shared_gate, dout;
  std::vector<float> out, dx, grad_router, grad_fc1, grad_fc2, grad_shared_fc1, grad_shared_fc2,
      grad_shared_gate;
  std::vector<double> routed, prob_sum;
  mp_moe_params params{}, grads{};
  mp_moe_cache cache{};
  mp_moe_stats stats{};
};

// One forward and backward of the GPU twin, and what they produced, on the host.
struct GpuResult {
  std::vector<int> selected, offsets, offsets_host, routed_slot;
  std::vector<float> probs, weights, out, dx;
  std::vector<float> grad_router, grad_fc1, grad_fc2, grad_shared_fc1, grad_shared_fc2,
      grad_shared_gate;
  std::vector<double> routed, prob_sum;
  mp_moe_stats stats{};
};

// The case's inputs on the device, a fresh cache, workspace and zeroed gradients; the forward,
// the statistics and the backward. The bf16 outputs are poisoned with NaN first, so an element
// never written fails.
// How the GPU twin runs: its one-device composition with the experts' GEMMs grouped (the
// default) or as the matmul twin's loop, or its steps one by one with the experts in two halves
// called apart, as expert parallelism calls them for each rank's local experts.
enum class Path { kGrouped, kLoop, kStepsInHalves };

std::string Describe(Path path) {
  return path == Path::kGrouped ? "_grouped_gemm"
                                : (path == Path::kLoop ? "_gemm_loop" : "_steps_in_halves");
}

// Expert half h (of two) of the cache's rows and of the weights and gradients: offsets rebased
// to the half's first row (into *offsets, El + 1), stacks from its first expert.
mp_moe_expert_rows_cuda HalfRows(const mp_moe_cache_cuda &cache, int h, std::vector<int> *offsets,
                                 size_t *first_row) {
  const mp_moe_shape &shape = cache.shape;
  const int El = shape.experts / 2;
  const size_t C = shape.channels, F = shape.expert_ffn;
  const int base = cache.expert_offset_host[h * El];
  offsets->resize(El + 1);
  for (int j = 0; j <= El; ++j) (*offsets)[j] = cache.expert_offset_host[h * El + j] - base;
  *first_row = base;
  return {El,
          offsets->data(),
          cache.routed_in + base * C,
          cache.routed_fc1 + base * 2 * F,
          cache.routed_act + base * F,
          cache.routed_out + base * C,
          cache.gemm_pointers};
}

// The one-device composition spelled out in its steps, the experts in two halves.
mp_status RunStepsInHalves(Gpu *gpu, mp_bf16 *out, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                           const mp_bf16 *x, const mp_bf16 *dout,
                           const mp_moe_weights_cuda &weights, mp_moe_cache_cuda *cache,
                           mp_moe_workspace_cuda *workspace, mp_moe_stats *stats,
                           double *stats_scratch, mp_error *err) {
  const mp_moe_shape &shape = cache->shape;
  const size_t C = shape.channels, F = shape.expert_ffn, NK = (size_t)shape.tokens * shape.top_k;
  const size_t El = shape.experts / 2;
  MP_TRY(mp_moe_route_cuda(gpu->cublas, x, &weights, cache, gpu->stream, err));
  MP_TRY(mp_moe_stats_add_cuda(stats, cache, stats_scratch, gpu->stream, err));
  std::vector<int> offsets[2];
  size_t first[2];
  mp_moe_weights_cuda half_weights[2];
  mp_moe_grads_cuda half_grads[2];
  for (int h = 0; h < 2; ++h) {
    half_weights[h] = weights;
    half_weights[h].expert_fc1 += h * El * 2 * F * C;
    half_weights[h].expert_fc2 += h * El * C * F;
    half_grads[h] = *grads;
    half_grads[h].expert_fc1 += h * El * 2 * F * C;
    half_grads[h].expert_fc2 += h * El * C * F;
    const mp_moe_expert_rows_cuda rows = HalfRows(*cache, h, &offsets[h], &first[h]);
    mp_moe_experts_forward_cuda(gpu->cublas, &half_weights[h], &shape, &rows, gpu->stream);
  }
  mp_moe_combine_cuda(gpu->cublas, out, x, &weights, cache, gpu->stream);
  mp_moe_combine_backward_cuda(workspace->drouted, workspace->dweights, dout, cache, gpu->stream);
  gpu->Sync();  // the memset runs on the default stream
  gpu->Fill(workspace->drouted_in, NK * C, 0);
  gpu->Sync();
  for (int h = 0; h < 2; ++h) {
    const mp_moe_expert_rows_cuda rows = HalfRows(*cache, h, &offsets[h], &first[h]);
    mp_moe_experts_backward_cuda(gpu->cublas, workspace->drouted_in + first[h] * C,
                                 &half_grads[h], workspace->drouted + first[h] * C,
                                 &half_weights[h], &shape, &rows, workspace->dact + first[h] * F,
                                 workspace->dfc1 + first[h] * 2 * F, gpu->stream);
  }
  MP_TRY(mp_moe_route_backward_cuda(gpu->cublas, dx, grads->router, workspace->drouted_in,
                                    workspace->dweights, x, weights.router, cache, stats,
                                    kAuxCoeff, kZCoeff, workspace, gpu->stream, err));
  mp_moe_shared_backward_cuda(gpu->cublas, dx, grads, dout, x, &weights, cache, workspace,
                              gpu->stream);
  return MP_OK;
}

::testing::AssertionResult RunGpu(const CpuMoe &m, Path path, GpuResult *r) {
  Gpu gpu;
  if (!gpu.ok()) return ::testing::AssertionFailure() << gpu.error();
  const mp_moe_shape &shape = m.shape;
  const size_t N = shape.tokens, C = shape.channels, E = shape.experts;
  const size_t NK = N * shape.top_k;
  auto upload = [&](const std::vector<float> &v) -> mp_bf16 * {
    return v.empty() ? nullptr : gpu.Upload(ToBf16(v));
  };
  auto grad = [&](size_t n) -> float * { return n == 0 ? nullptr : gpu.Alloc<float>(n); };
  const mp_moe_weights_cuda weights = {upload(m.router),     upload(m.expert_fc1),
                                       upload(m.expert_fc2), upload(m.shared_fc1),
                                       upload(m.shared_fc2), upload(m.shared_gate)};
  mp_moe_grads_cuda grads = {grad(m.router.size()),     grad(m.expert_fc1.size()),
                             grad(m.expert_fc2.size()), grad(m.shared_fc1.size()),
                             grad(m.shared_fc2.size()), grad(m.shared_gate.size())};
  const mp_bf16 *x = upload(m.x), *dout = upload(m.dout);
  mp_bf16 *out = gpu.Alloc<mp_bf16>(N * C, 0xFF);
  mp_bf16 *dx = gpu.Alloc<mp_bf16>(N * C);
  uint8_t *cache_arena = gpu.Alloc<uint8_t>(mp_moe_cache_cuda_bytes(&shape), 0xFF);
  uint8_t *workspace_arena = gpu.Alloc<uint8_t>(mp_moe_workspace_cuda_bytes(&shape), 0xFF);
  double *stats_scratch = gpu.Alloc<double>(E + 1);
  gpu.Sync();  // the uploads and fills (default stream) before the launches (gpu.stream)
  if (!gpu.ok()) return ::testing::AssertionFailure() << gpu.error();

  r->offsets_host.assign(E + 1, -1);
  mp_moe_cache_cuda cache;
  cache.shape = shape;
  mp_moe_cache_cuda_carve(&cache, &shape, cache_arena, r->offsets_host.data());
  if (path == Path::kLoop) cache.gemm_pointers = nullptr;
  mp_moe_workspace_cuda workspace;
  mp_moe_workspace_cuda_carve(&workspace, &shape, workspace_arena);
  r->routed.assign(E, 0.0);
  r->prob_sum.assign(E, 0.0);
  r->stats = {shape.experts, 0.0, r->routed.data(), r->prob_sum.data(), 0.0};

  mp_error err = MP_ERROR_INITIALIZER;
  if (path == Path::kStepsInHalves) {
    if (RunStepsInHalves(&gpu, out, dx, &grads, x, dout, weights, &cache, &workspace, &r->stats,
                         stats_scratch, &err) != MP_OK ||
        mp_cuda_take_launch_failure(&err) != MP_OK) {
      return ::testing::AssertionFailure() << err.message;
    }
  } else if (mp_moe_forward_cuda(gpu.cublas, out, x, &weights, &cache, gpu.stream, &err) != MP_OK ||
      mp_moe_stats_add_cuda(&r->stats, &cache, stats_scratch, gpu.stream, &err) != MP_OK ||
      mp_moe_backward_cuda(gpu.cublas, dx, &grads, dout, x, &weights, &cache, &r->stats,
                           kAuxCoeff, kZCoeff, &workspace, gpu.stream, &err) != MP_OK ||
      mp_cuda_take_launch_failure(&err) != MP_OK) {
    return ::testing::AssertionFailure() << err.message;
  }
  gpu.Sync();
  r->selected = gpu.Download(cache.selected, NK);
  r->offsets = gpu.Download(cache.expert_offset, E + 1);
  r->routed_slot = gpu.Download(cache.routed_slot, NK);
  r->probs = gpu.Download(cache.probs, N * E);
  r->weights = gpu.Download(cache.weights, NK);
  r->out = gpu.DownloadBf16(out, N * C);
  r->dx = gpu.DownloadBf16(dx, N * C);
  r->grad_router = gpu.Download(grads.router, m.router.size());
  r->grad_fc1 = gpu.Download(grads.expert_fc1, m.expert_fc1.size());
  r->grad_fc2 = gpu.Download(grads.expert_fc2, m.expert_fc2.size());
  if (grads.shared_fc1 != nullptr) {
    r->grad_shared_fc1 = gpu.Download(grads.shared_fc1, m.shared_fc1.size());
    r->grad_shared_fc2 = gpu.Download(grads.shared_fc2, m.shared_fc2.size());
  }
  if (grads.shared_gate != nullptr) {
    r->grad_shared_gate = gpu.Download(grads.shared_gate, m.shared_gate.size());
  }
  if (!gpu.ok()) return ::testing::AssertionFailure() << gpu.error();
  return ::testing::AssertionSuccess();
}

// BitwiseEqual that also takes two empty tensors (a case without the shared MLP).
template <typename T>
bool SameBits(const std::vector<T> &a, const std::vector<T> &b) {
  return (a.empty() && b.empty()) || BitwiseEqual(a, b);
}

class CudaMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoe, MatchesCpuLayer) {
  SKIP_WITHOUT_GPU();
  const MoeCase &c = GetParam();
  CpuMoe m(c);
  ASSERT_TRUE(m.Run());
  const int E = m.shape.experts;
  if (c.idle_experts > 0) {  // the case is what it says: the last experts receive no token
    ASSERT_EQ(m.cache.expert_offset[E], m.cache.expert_offset[E - c.idle_experts]) << Describe(c);
  }
  for (Path path : {Path::kGrouped, Path::kLoop, Path::kStepsInHalves}) {
    const std::string name = Describe(c) + Describe(path);
    GpuResult g;
    ASSERT_TRUE(RunGpu(m, path, &g));

    // The routing, exactly.
    const size_t NK = (size_t)m.shape.tokens * m.shape.top_k;
    EXPECT_EQ(g.selected, std::vector<int>(m.cache.selected, m.cache.selected + NK)) << name;
    EXPECT_EQ(g.offsets, std::vector<int>(m.cache.expert_offset, m.cache.expert_offset + E + 1))
        << name;
    EXPECT_EQ(g.offsets_host, g.offsets) << name << ": the host copy of the offsets";
    EXPECT_EQ(g.routed_slot, std::vector<int>(m.cache.routed_slot, m.cache.routed_slot + NK))
        << name;
    EXPECT_TRUE(WithinTolerance(
        "moe probs " + name, g.probs,
        std::vector<float>(m.cache.probs, m.cache.probs + (size_t)m.shape.tokens * E),
        kFp32Tolerance));
    EXPECT_TRUE(WithinTolerance("moe weights " + name, g.weights,
                                std::vector<float>(m.cache.weights, m.cache.weights + NK),
                                kFp32Tolerance));
    // The statistics of the auxiliary losses.
    EXPECT_EQ(g.stats.tokens, m.stats.tokens) << name;
    EXPECT_EQ(g.routed, m.routed) << name;
    EXPECT_NEAR(mp_moe_aux_loss(&g.stats), mp_moe_aux_loss(&m.stats),
                kFp32Tolerance * mp_moe_aux_loss(&m.stats))
        << name;
    EXPECT_NEAR(mp_moe_z_loss(&g.stats), mp_moe_z_loss(&m.stats),
                kFp32Tolerance * mp_moe_z_loss(&m.stats))
        << name;

    // Forward and backward.
    EXPECT_TRUE(WithinTolerance("moe out " + name, g.out, m.out, kBf16Tolerance));
    EXPECT_TRUE(WithinTolerance("moe dx " + name, g.dx, m.dx, kBf16Tolerance));
    EXPECT_TRUE(WithinTolerance("moe drouter " + name, g.grad_router, m.grad_router,
                                kBf16Tolerance));
    EXPECT_TRUE(
        WithinTolerance("moe dexpert_fc1 " + name, g.grad_fc1, m.grad_fc1, kBf16Tolerance));
    EXPECT_TRUE(
        WithinTolerance("moe dexpert_fc2 " + name, g.grad_fc2, m.grad_fc2, kBf16Tolerance));
    if (c.shared) {
      EXPECT_TRUE(WithinTolerance("moe dshared_fc1 " + name, g.grad_shared_fc1, m.grad_shared_fc1,
                                  kBf16Tolerance));
      EXPECT_TRUE(WithinTolerance("moe dshared_fc2 " + name, g.grad_shared_fc2, m.grad_shared_fc2,
                                  kBf16Tolerance));
    }
    if (c.gate) {
      EXPECT_TRUE(WithinTolerance("moe dshared_gate " + name, g.grad_shared_gate,
                                  m.grad_shared_gate, kBf16Tolerance));
    }
    if (c.idle_experts > 0) {  // no row, no work: their gradients stay exactly zero
      const size_t F = m.shape.expert_ffn, C = m.shape.channels;
      for (size_t i = (size_t)(E - c.idle_experts) * 2 * F * C; i < g.grad_fc1.size(); ++i) {
        ASSERT_EQ(g.grad_fc1[i], 0.0f) << name << " dexpert_fc1[" << i << "]";
      }
    }
  }
}

TEST_P(CudaMoe, TwoRunsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const std::string name = Describe(GetParam());
  CpuMoe m(GetParam());
  GpuResult first, second;
  ASSERT_TRUE(RunGpu(m, Path::kGrouped, &first));
  ASSERT_TRUE(RunGpu(m, Path::kGrouped, &second));
  EXPECT_TRUE(SameBits(first.out, second.out)) << name << ": out";
  EXPECT_TRUE(SameBits(first.dx, second.dx)) << name << ": dx";
  EXPECT_TRUE(SameBits(first.grad_router, second.grad_router)) << name << ": drouter";
  EXPECT_TRUE(SameBits(first.grad_fc1, second.grad_fc1)) << name << ": dexpert_fc1";
  EXPECT_TRUE(SameBits(first.grad_fc2, second.grad_fc2)) << name << ": dexpert_fc2";
  EXPECT_TRUE(SameBits(first.grad_shared_fc1, second.grad_shared_fc1)) << name;
  EXPECT_TRUE(SameBits(first.grad_shared_fc2, second.grad_shared_fc2)) << name;
  EXPECT_TRUE(SameBits(first.grad_shared_gate, second.grad_shared_gate)) << name;
  EXPECT_TRUE(SameBits(first.prob_sum, second.prob_sum)) << name << ": statistics";
}

// E, K, shared MLP, its gate, renormalised top-k, experts with no token.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMoe,
    ::testing::Values(MoeCase{4, 1, false, false, false, 0},
                      MoeCase{4, 2, false, false, true, 0},
                      MoeCase{4, 2, true, true, false, 1},
                      MoeCase{4, 1, true, true, true, 2},  // the second half has no row at all
                      MoeCase{8, 1, true, false, true, 0},
                      MoeCase{8, 2, false, false, true, 1},  // Mixtral-like
                      MoeCase{8, 2, true, true, false, 0},   // Qwen2-MoE-like
                      MoeCase{8, 2, true, false, false, 1},
                      MoeCase{72, 2, false, false, true, 0}),  // two grouped GEMM calls
    [](const ::testing::TestParamInfo<MoeCase> &info) { return Describe(info.param); });

TEST(CudaMoeShape, RouteRefusesTopKAboveExperts) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_moe_shape shape{};
  shape.tokens = 4;
  shape.channels = 8;
  shape.experts = 2;
  shape.top_k = 3;
  shape.expert_ffn = 4;
  mp_moe_cache_cuda cache{};
  cache.shape = shape;
  const mp_moe_weights_cuda weights{};
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_moe_route_cuda(gpu.cublas, nullptr, &weights, &cache, gpu.stream, &err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("top_k 3"), std::string::npos) << err.message;
}

// The GPU twin is dropless only: a capacity factor is refused, not silently ignored.
TEST(CudaMoeShape, RouteRefusesACapacityFactor) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_moe_shape shape{};
  shape.tokens = 4;
  shape.channels = 8;
  shape.experts = 2;
  shape.top_k = 1;
  shape.expert_ffn = 4;
  shape.capacity_factor = 1.25;
  mp_moe_cache_cuda cache{};
  cache.shape = shape;
  const mp_moe_weights_cuda weights{};
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_moe_route_cuda(gpu.cublas, nullptr, &weights, &cache, gpu.stream, &err),
            MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("capacity_factor 1.25"), std::string::npos)
      << err.message;
}

}  // namespace
