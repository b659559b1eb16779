// tests/layers/flash_attention_test.cc — the fused (flash) attention of //layers:cuda_gemm against
// the CPU twin on the same bf16-rounded inputs (out, lse, and dq, dk, dv through dqkv, from zero
// and added onto pre-filled values), against the cuBLAS twin, for multi-head, grouped-query and
// multi-query shapes (and grouped-query against multi-head on the kv heads repeated), bitwise
// determinism, the launchers' no-ops, and the speed of both GPU paths at GPT-2 1.5B's and
// Llama 3 8B's attention shapes.
//
// Every test skips itself, by name, when no GPU is visible (CI builds CUDA without a GPU).
//
// Error measure: ||gpu - ref||_inf / ||ref||_inf over a whole output; a NaN or infinity on the GPU
// fails (outputs are poisoned with NaN first, so an element that is never written fails too).
// Tolerances:
//   bf16 outputs 2e-2, as cuda_gemm_test. One rounding to bf16 is up to 2^-9 ~ 2e-3 of the
//     element; the fused kernels also round the probabilities and dS to bf16 as tensor-core
//     inputs, so ~5e-3 is expected (the throwaway CPU emulation of the kernels measured 2e-3 to
//     4e-3), and 2e-2 still fails a wrong index, a missing term or a wrong mask (errors of order 1).
//   lse (fp32) 1e-3: scores are exact products of bf16 values summed in fp32; only the
//     summation order and exp2/log rounding differ from the CPU, ~1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/device/device.h"
#include "layers/attention.h"
#include "layers/cuda_types.h"
#include "layers/matmul.h"
#include "tests/layers/cuda_testing.h"
#include "tests/layers/finite_difference.h"

namespace {

using mp_test::Rng;

constexpr double kBf16Tolerance = 2e-2;
constexpr double kLseTolerance = 1e-3;
constexpr int kPoisonByte = 0xFF;  // bf16 0xFFFF and fp32 0xFFFFFFFF are NaN

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h


// ---------------------------------------------------------------------------------------------
// cases

// NH query heads and KVH kv heads (KVH = NH: multi-head; 1: multi-query).
struct Shape {
  int B, T, NH, KVH, HS;
};

// "B=.. T=.. NH=.. HS=..", with KVH=.. after NH where it differs from NH.
std::string Describe(const Shape &s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " NH=" + std::to_string(s.NH) +
         (s.KVH != s.NH ? " KVH=" + std::to_string(s.KVH) : "") + " HS=" + std::to_string(s.HS);
}


// Inputs rounded to bf16, and the CPU twin's outputs on them: out, lse (in double from the CPU's
// scaled scores) and the gradient of qkv from zero.
struct FlashCase {
  explicit FlashCase(const Shape &s)
      : B(s.B), T(s.T), NH(s.NH), KVH(s.KVH), HS(s.HS), C(s.NH * s.HS),
        W((s.NH + 2 * s.KVH) * s.HS) {
    Rng rng(3000 + B + T + NH + HS);
    qkv = RoundToBf16(rng.uniform_vector((size_t)B * T * W, -1.5f, 1.5f));
    dout = RoundToBf16(rng.uniform_vector((size_t)B * T * C, -1.0f, 1.0f));
    out.resize((size_t)B * T * C);
    std::vector<float> preatt((size_t)B * NH * T * T), att(preatt.size());
    mp_attention_forward_cpu(out.data(), preatt.data(), att.data(), qkv.data(), B, T, NH, KVH,
                             HS);
    lse.resize((size_t)B * NH * T);
    for (size_t row = 0; row < lse.size(); row++) {
      const int t = (int)(row % T);
      const float *scores = &preatt[row * T];
      double max = -INFINITY, sum = 0.0;
      for (int t2 = 0; t2 <= t; t2++) max = std::fmax(max, scores[t2]);
      for (int t2 = 0; t2 <= t; t2++) sum += std::exp((double)scores[t2] - max);
      lse[row] = (float)(max + std::log(sum));
    }
    dqkv.assign(qkv.size(), 0.0f);
    std::vector<float> dpreatt(att.size()), datt(att.size());
    mp_attention_backward_cpu(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(),
                              att.data(), B, T, NH, KVH, HS);
  }

  int B, T, NH, KVH, HS, C, W;
  std::vector<float> qkv, dout;  // (B, T, W), (B, T, C)
  std::vector<float> out, lse;   // (B, T, C), (B, NH, T)
  std::vector<float> dqkv;       // (B, T, W)
};

struct FlashOnGpu {
  FlashOnGpu(Gpu *gpu, const FlashCase &f)
      : qkv(gpu->Upload(ToBf16(f.qkv))),
        dout(gpu->Upload(ToBf16(f.dout))),
        out(gpu->Alloc<mp_bf16>(f.out.size(), kPoisonByte)),
        lse(gpu->Alloc<float>(f.lse.size(), kPoisonByte)),
        dqkv(gpu->Alloc<mp_bf16>(f.qkv.size())),
        scratch(gpu->Alloc<char>(mp_flash_attention_scratch_bytes(f.B, f.T, f.NH, f.HS),
                                 kPoisonByte)) {}
  mp_bf16 *qkv, *dout, *out;
  float *lse;
  mp_bf16 *dqkv;
  char *scratch;
};

class FlashAttention : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (!mp_flash_attention_supported(GetParam().HS)) {
      GTEST_SKIP() << "HS=" << GetParam().HS << " is not a fused head size";
    }
  }
};

TEST_P(FlashAttention, ForwardMatchesCpuAndCublas) {
  SKIP_WITHOUT_GPU();
  const FlashCase f(GetParam());
  const std::string tag = Describe(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  FlashOnGpu d(&gpu, f);
  gpu.Sync();
  mp_flash_attention_forward_cuda(d.out, d.lse, d.qkv, f.B, f.T, f.NH, f.KVH, f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> out = gpu.DownloadBf16(d.out, f.out.size());
  const std::vector<float> lse = gpu.Download(d.lse, f.lse.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("flash_attention_forward out " + tag, out, f.out, kBf16Tolerance));
  EXPECT_TRUE(WithinTolerance("flash_attention_forward lse " + tag, lse, f.lse, kLseTolerance));

  // The cuBLAS twin on the same device inputs.
  mp_bf16 *cublas_out = gpu.Alloc<mp_bf16>(f.out.size(), kPoisonByte);
  mp_bf16 *att = gpu.Alloc<mp_bf16>((size_t)f.B * f.NH * f.T * f.T);
  char *scratch = gpu.Alloc<char>(mp_attention_cuda_scratch_bytes(f.B, f.T, f.NH, f.HS));
  gpu.Sync();
  mp_attention_forward_cuda(gpu.cublas, cublas_out, att, d.qkv, scratch, f.B, f.T, f.NH, f.KVH,
                            f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> reference = gpu.DownloadBf16(cublas_out, f.out.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("flash_attention_forward out vs cuBLAS " + tag, out, reference,
                              kBf16Tolerance));
}

TEST_P(FlashAttention, BackwardMatchesCpuAndCublasAndAddsIntoDqkv) {
  SKIP_WITHOUT_GPU();
  const FlashCase f(GetParam());
  const std::string tag = Describe(GetParam());
  const int BT = f.B * f.T;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  FlashOnGpu d(&gpu, f);
  gpu.Sync();
  mp_flash_attention_forward_cuda(d.out, d.lse, d.qkv, f.B, f.T, f.NH, f.KVH, f.HS, gpu.stream);
  gpu.Sync();

  // From zero: the gradient itself, q, k and v parts held to the tolerance separately.
  mp_flash_attention_backward_cuda(d.dqkv, d.dout, d.qkv, d.out, d.lse, d.scratch, f.B, f.T, f.NH,
                                   f.KVH, f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> got = gpu.DownloadBf16(d.dqkv, f.dqkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(std::string("flash_attention_backward ") + names[part] + " " + tag,
                                QkvPart(got, part, BT, f.NH, f.KVH, f.HS),
                                QkvPart(f.dqkv, part, BT, f.NH, f.KVH, f.HS), kBf16Tolerance));
  }

  // Onto a dqkv that already holds something (a second micro-batch): +=.
  Rng rng(99);
  const std::vector<float> dqkv0 = RoundToBf16(rng.uniform_vector(f.dqkv.size(), -0.1f, 0.1f));
  gpu.CopyIn(d.dqkv, ToBf16(dqkv0));
  gpu.Fill(d.scratch, mp_flash_attention_scratch_bytes(f.B, f.T, f.NH, f.HS), kPoisonByte);
  gpu.Sync();
  mp_flash_attention_backward_cuda(d.dqkv, d.dout, d.qkv, d.out, d.lse, d.scratch, f.B, f.T, f.NH,
                                   f.KVH, f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> added = gpu.DownloadBf16(d.dqkv, f.dqkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("flash_attention_backward dqkv += " + tag, added,
                              Plus(dqkv0, f.dqkv), kBf16Tolerance));

  // The cuBLAS twin's gradient from zero, on the same device inputs.
  mp_bf16 *cublas_out = gpu.Alloc<mp_bf16>(f.out.size());
  mp_bf16 *att = gpu.Alloc<mp_bf16>((size_t)f.B * f.NH * f.T * f.T);
  mp_bf16 *cublas_dqkv = gpu.Alloc<mp_bf16>(f.dqkv.size());
  char *scratch = gpu.Alloc<char>(mp_attention_cuda_scratch_bytes(f.B, f.T, f.NH, f.HS));
  gpu.Sync();
  mp_attention_forward_cuda(gpu.cublas, cublas_out, att, d.qkv, scratch, f.B, f.T, f.NH, f.KVH,
                            f.HS, gpu.stream);
  mp_attention_backward_cuda(gpu.cublas, cublas_dqkv, d.dout, d.qkv, att, scratch, f.B, f.T, f.NH,
                             f.KVH, f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> reference = gpu.DownloadBf16(cublas_dqkv, f.dqkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (int part = 0; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(std::string("flash_attention_backward ") + names[part] +
                                    " vs cuBLAS " + tag,
                                QkvPart(got, part, BT, f.NH, f.KVH, f.HS),
                                QkvPart(reference, part, BT, f.NH, f.KVH, f.HS), kBf16Tolerance));
  }
}

TEST_P(FlashAttention, Deterministic) {
  SKIP_WITHOUT_GPU();
  const FlashCase f(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  FlashOnGpu d(&gpu, f);
  std::vector<mp_bf16> out[2], dqkv[2];
  std::vector<float> lse[2];
  for (int run = 0; run < 2; run++) {
    gpu.Fill(d.out, f.out.size(), kPoisonByte);
    gpu.Fill(d.lse, f.lse.size(), kPoisonByte);
    gpu.Fill(d.dqkv, f.qkv.size(), 0);
    gpu.Fill(d.scratch, mp_flash_attention_scratch_bytes(f.B, f.T, f.NH, f.HS), kPoisonByte);
    gpu.Sync();
    mp_flash_attention_forward_cuda(d.out, d.lse, d.qkv, f.B, f.T, f.NH, f.KVH, f.HS,
                                    gpu.stream);
    mp_flash_attention_backward_cuda(d.dqkv, d.dout, d.qkv, d.out, d.lse, d.scratch, f.B, f.T,
                                     f.NH, f.KVH, f.HS, gpu.stream);
    gpu.Sync();
    out[run] = gpu.Download(d.out, f.out.size());
    lse[run] = gpu.Download(d.lse, f.lse.size());
    dqkv[run] = gpu.Download(d.dqkv, f.qkv.size());
  }
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const bool same = BitwiseEqual(out[0], out[1]) && BitwiseEqual(lse[0], lse[1]) &&
                    BitwiseEqual(dqkv[0], dqkv[1]);
  std::printf("kernel flash_attention_determinism %s: two runs %s\n", Describe(GetParam()).c_str(),
              same ? "bitwise equal" : "DIFFER");
  EXPECT_TRUE(BitwiseEqual(out[0], out[1])) << "two forwards differ in out";
  EXPECT_TRUE(BitwiseEqual(lse[0], lse[1])) << "two forwards differ in lse";
  EXPECT_TRUE(BitwiseEqual(dqkv[0], dqkv[1])) << "two backwards differ in dqkv";
}

// Grouped-query attention in the fused kernels is multi-head attention on the kv heads repeated:
// forward and dq blocks read the same k and v tiles (the same out, lse and dq bits), and a kv
// head's dk and dv are the sum over its group of the repeated heads' (here summed in fp32 after
// each was rounded to bf16, in the kernel summed in fp32 first: held to the tolerance).
TEST_P(FlashAttention, GroupedEqualsMultiHeadOnRepeatedKv) {
  SKIP_WITHOUT_GPU();
  const Shape shape = GetParam();
  if (shape.KVH == shape.NH) GTEST_SKIP() << "multi-head: nothing is repeated";
  const FlashCase f(shape);
  const std::string tag = Describe(shape);
  const int BT = f.B * f.T;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  FlashOnGpu d(&gpu, f);
  mp_bf16 *qkv_mha = gpu.Upload(RepeatKv(ToBf16(f.qkv), BT, f.NH, f.KVH, f.HS));
  mp_bf16 *out_mha = gpu.Alloc<mp_bf16>(f.out.size(), kPoisonByte);
  float *lse_mha = gpu.Alloc<float>(f.lse.size(), kPoisonByte);
  mp_bf16 *dqkv_mha = gpu.Alloc<mp_bf16>((size_t)BT * 3 * f.C);
  gpu.Sync();
  mp_flash_attention_forward_cuda(d.out, d.lse, d.qkv, f.B, f.T, f.NH, f.KVH, f.HS, gpu.stream);
  mp_flash_attention_backward_cuda(d.dqkv, d.dout, d.qkv, d.out, d.lse, d.scratch, f.B, f.T, f.NH,
                                   f.KVH, f.HS, gpu.stream);
  mp_flash_attention_forward_cuda(out_mha, lse_mha, qkv_mha, f.B, f.T, f.NH, f.NH, f.HS,
                                  gpu.stream);
  mp_flash_attention_backward_cuda(dqkv_mha, d.dout, qkv_mha, out_mha, lse_mha, d.scratch, f.B,
                                   f.T, f.NH, f.NH, f.HS, gpu.stream);
  gpu.Sync();
  const std::vector<mp_bf16> out = gpu.Download(d.out, f.out.size());
  const std::vector<float> lse = gpu.Download(d.lse, f.lse.size());
  const std::vector<float> dqkv = gpu.DownloadBf16(d.dqkv, f.qkv.size());
  const std::vector<mp_bf16> out_ref = gpu.Download(out_mha, f.out.size());
  const std::vector<float> lse_ref = gpu.Download(lse_mha, f.lse.size());
  const std::vector<float> dqkv_ref = gpu.DownloadBf16(dqkv_mha, (size_t)BT * 3 * f.C);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(out, out_ref)) << "out differs from multi-head on repeated kv " << tag;
  EXPECT_TRUE(BitwiseEqual(lse, lse_ref)) << "lse differs from multi-head on repeated kv " << tag;
  EXPECT_TRUE(BitwiseEqual(QkvPart(dqkv, 0, BT, f.NH, f.KVH, f.HS),
                           QkvPart(dqkv_ref, 0, BT, f.NH, f.NH, f.HS)))
      << "dq differs from multi-head on repeated kv " << tag;
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 1; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(
        std::string("flash_attention_backward ") + names[part] + " vs multi-head on repeated kv " +
            tag,
        QkvPart(dqkv, part, BT, f.NH, f.KVH, f.HS),
        SumGroups(QkvPart(dqkv_ref, part, BT, f.NH, f.NH, f.HS), BT, f.NH, f.KVH, f.HS),
        kBf16Tolerance));
  }
}

// Multi-head shapes, then grouped-query (NH / KVH = 4, 3, 2, 4) and multi-query (KVH = 1) ones:
// every fused head size, T a multiple of the tiles and not, one token, and Llama 3 8B's heads.
INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttention,
                         ::testing::Values(Shape{2, 64, 4, 4, 64}, Shape{1, 1024, 12, 12, 64},
                                           Shape{2, 100, 3, 3, 64}, Shape{2, 100, 3, 3, 32},
                                           Shape{2, 100, 3, 3, 128}, Shape{1, 300, 2, 2, 128},
                                           Shape{1, 1, 2, 2, 64}, Shape{2, 100, 8, 2, 64},
                                           Shape{2, 130, 6, 2, 32}, Shape{1, 300, 4, 2, 128},
                                           Shape{1, 512, 32, 8, 128}, Shape{2, 100, 4, 1, 64},
                                           Shape{1, 200, 4, 1, 128}, Shape{1, 1, 4, 1, 64}),
                         [](const ::testing::TestParamInfo<Shape> &info) {
                           const Shape &s = info.param;
                           return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) +
                                  "_NH" + std::to_string(s.NH) +
                                  (s.KVH != s.NH ? "_KVH" + std::to_string(s.KVH) : "") +
                                  "_HS" + std::to_string(s.HS);
                         });

// ---------------------------------------------------------------------------------------------
// what is supported, and the no-ops

TEST(FlashAttentionLaunch, UnsupportedHeadSizesAndEmptyShapesAreNoOps) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(mp_flash_attention_supported(64));
  EXPECT_FALSE(mp_flash_attention_supported(48));
  EXPECT_FALSE(mp_flash_attention_supported(0));
  EXPECT_EQ(mp_flash_attention_scratch_bytes(0, 64, 4, 64), 0u);
  EXPECT_GE(mp_flash_attention_scratch_bytes(2, 100, 3, 64), 2u * 3 * 100 * sizeof(float));
  EXPECT_EQ(mp_flash_attention_scratch_bytes(2, 100, 3, 64) % 256, 0u);

  // HS = 48: nothing is launched and nothing is written (out stays poisoned, dqkv zero).
  const int B = 1, T = 16, NH = 2, HS = 48, C = NH * HS;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *qkv = gpu.Alloc<mp_bf16>((size_t)B * T * 3 * C);
  mp_bf16 *out = gpu.Alloc<mp_bf16>((size_t)B * T * C, kPoisonByte);
  mp_bf16 *dqkv = gpu.Alloc<mp_bf16>((size_t)B * T * 3 * C);
  float *lse = gpu.Alloc<float>((size_t)B * NH * T, kPoisonByte);
  gpu.Sync();
  mp_flash_attention_forward_cuda(out, lse, qkv, B, T, NH, NH, HS, gpu.stream);
  mp_flash_attention_backward_cuda(dqkv, out, qkv, out, lse, nullptr, B, T, NH, NH, HS, gpu.stream);
  mp_flash_attention_forward_cuda(nullptr, nullptr, nullptr, 0, T, NH, NH, 64, gpu.stream);
  mp_flash_attention_backward_cuda(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, T, NH,
                                   NH, 64, gpu.stream);
  // No kv heads, or kv heads that do not divide the query heads, at a fused head size (shapes
  // that fit the buffers above): no-ops too.
  mp_flash_attention_forward_cuda(out, lse, qkv, B, T, NH, 0, 32, gpu.stream);
  mp_flash_attention_backward_cuda(dqkv, out, qkv, out, lse, nullptr, B, T, NH, 0, 32, gpu.stream);
  mp_flash_attention_forward_cuda(out, lse, qkv, B, T, 3, 2, 32, gpu.stream);
  mp_flash_attention_backward_cuda(dqkv, out, qkv, out, lse, nullptr, B, T, 3, 2, 32, gpu.stream);
  gpu.Sync();
  const std::vector<mp_bf16> out_bits = gpu.Download(out, (size_t)B * T * C);
  const std::vector<mp_bf16> dqkv_bits = gpu.Download(dqkv, (size_t)B * T * 3 * C);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(out_bits, std::vector<mp_bf16>(out_bits.size(), 0xFFFF)));
  EXPECT_TRUE(BitwiseEqual(dqkv_bits, std::vector<mp_bf16>(dqkv_bits.size(), 0)));
}

// ---------------------------------------------------------------------------------------------
// speed (printed for the device log), with the fused result checked against the cuBLAS twin's

// Times both GPU paths, forward and backward, at one shape and prints the lines of the device log;
// then checks one clean forward and backward of the fused path against the cuBLAS twin's.
void SpeedAgainstCublas(const Shape &shape) {
  const int B = shape.B, T = shape.T, NH = shape.NH, KVH = shape.KVH, HS = shape.HS;
  const int C = NH * HS, W = (NH + 2 * KVH) * HS;
  const std::string tag = Describe(shape);
  Rng rng(7 + B);
  const std::vector<mp_bf16> qkv = ToBf16(rng.uniform_vector((size_t)B * T * W, -1.5f, 1.5f));
  const std::vector<mp_bf16> dout = ToBf16(rng.uniform_vector((size_t)B * T * C, -1.0f, 1.0f));
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *d_qkv = gpu.Upload(qkv);
  mp_bf16 *d_dout = gpu.Upload(dout);
  mp_bf16 *flash_out = gpu.Alloc<mp_bf16>((size_t)B * T * C, kPoisonByte);
  float *lse = gpu.Alloc<float>((size_t)B * NH * T, kPoisonByte);
  mp_bf16 *flash_dqkv = gpu.Alloc<mp_bf16>(qkv.size());
  char *flash_scratch = gpu.Alloc<char>(mp_flash_attention_scratch_bytes(B, T, NH, HS));
  mp_bf16 *cublas_out = gpu.Alloc<mp_bf16>((size_t)B * T * C, kPoisonByte);
  mp_bf16 *att = gpu.Alloc<mp_bf16>((size_t)B * NH * T * T);
  mp_bf16 *cublas_dqkv = gpu.Alloc<mp_bf16>(qkv.size());
  char *cublas_scratch = gpu.Alloc<char>(mp_attention_cuda_scratch_bytes(B, T, NH, HS));
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();

  mp_device_timer *timer = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_device_timer_create(&timer, &err), MP_OK) << err.message;
  const std::unique_ptr<mp_device_timer, void (*)(mp_device_timer *)> timer_owner(
      timer, mp_device_timer_free);
  auto time_it = [&](int iterations, const std::function<void()> &launch) {
    for (int i = 0; i < 3; i++) launch();  // warm-up: clocks, cuBLAS heuristics
    double seconds = 0.0;
    if (mp_device_timer_start(timer, gpu.stream, &err) != MP_OK) return -1.0;
    for (int i = 0; i < iterations; i++) launch();
    if (mp_device_timer_stop(timer, gpu.stream, &seconds, &err) != MP_OK) return -1.0;
    return seconds / iterations;
  };

  // The backward adds into dqkv on every call; only its time matters here (checked below).
  const double flash_forward_s = time_it(20, [&] {
    mp_flash_attention_forward_cuda(flash_out, lse, d_qkv, B, T, NH, KVH, HS, gpu.stream);
  });
  const double flash_backward_s = time_it(20, [&] {
    mp_flash_attention_backward_cuda(flash_dqkv, d_dout, d_qkv, flash_out, lse, flash_scratch,
                                     B, T, NH, KVH, HS, gpu.stream);
  });
  const double cublas_forward_s = time_it(10, [&] {
    mp_attention_forward_cuda(gpu.cublas, cublas_out, att, d_qkv, cublas_scratch, B, T, NH, KVH,
                              HS, gpu.stream);
  });
  const double cublas_backward_s = time_it(10, [&] {
    mp_attention_backward_cuda(gpu.cublas, cublas_dqkv, d_dout, d_qkv, att, cublas_scratch, B,
                               T, NH, KVH, HS, gpu.stream);
  });
  ASSERT_GT(flash_forward_s, 0.0) << err.message;
  ASSERT_GT(flash_backward_s, 0.0) << err.message;
  ASSERT_GT(cublas_forward_s, 0.0) << err.message;
  ASSERT_GT(cublas_backward_s, 0.0) << err.message;
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();

  // Useful FLOPs of causal attention: the two forward products over the lower triangle
  // (2 B NH T^2 HS), and 2.5 times that for the backward's five (FlashAttention-2's count).
  const double forward_flops = 2.0 * B * NH * (double)T * T * HS;
  const double backward_flops = 2.5 * forward_flops;
  std::printf("kernel flash_attention_forward %s: %.3f ms, %.1f TFLOP/s causal (cuBLAS twin "
              "%.3f ms: %.2fx)\n",
              tag.c_str(), flash_forward_s * 1e3, forward_flops / flash_forward_s * 1e-12,
              cublas_forward_s * 1e3, cublas_forward_s / flash_forward_s);
  std::printf("kernel flash_attention_backward %s: %.3f ms, %.1f TFLOP/s causal (cuBLAS twin "
              "%.3f ms: %.2fx)\n",
              tag.c_str(), flash_backward_s * 1e3, backward_flops / flash_backward_s * 1e-12,
              cublas_backward_s * 1e3, cublas_backward_s / flash_backward_s);
  std::printf("kernel attention_forward (cuBLAS) %s: %.3f ms\n", tag.c_str(),
              cublas_forward_s * 1e3);
  std::printf("kernel attention_backward (cuBLAS) %s: %.3f ms\n", tag.c_str(),
              cublas_backward_s * 1e3);
  std::fflush(stdout);

  // One clean backward of each from zero, compared: the fused path at this shape (many query
  // tiles; GPT-2's NH = 25) against the cuBLAS twin.
  gpu.Fill(flash_dqkv, qkv.size(), 0);
  gpu.Fill(cublas_dqkv, qkv.size(), 0);
  gpu.Sync();
  mp_flash_attention_forward_cuda(flash_out, lse, d_qkv, B, T, NH, KVH, HS, gpu.stream);
  mp_flash_attention_backward_cuda(flash_dqkv, d_dout, d_qkv, flash_out, lse, flash_scratch, B,
                                   T, NH, KVH, HS, gpu.stream);
  mp_attention_forward_cuda(gpu.cublas, cublas_out, att, d_qkv, cublas_scratch, B, T, NH, KVH, HS,
                            gpu.stream);
  mp_attention_backward_cuda(gpu.cublas, cublas_dqkv, d_dout, d_qkv, att, cublas_scratch, B, T,
                             NH, KVH, HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> f_out = gpu.DownloadBf16(flash_out, (size_t)B * T * C);
  const std::vector<float> c_out = gpu.DownloadBf16(cublas_out, (size_t)B * T * C);
  const std::vector<float> f_dqkv = gpu.DownloadBf16(flash_dqkv, qkv.size());
  const std::vector<float> c_dqkv = gpu.DownloadBf16(cublas_dqkv, qkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("flash_attention_forward out vs cuBLAS " + tag, f_out, c_out,
                              kBf16Tolerance));
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(std::string("flash_attention_backward ") + names[part] +
                                    " vs cuBLAS " + tag,
                                QkvPart(f_dqkv, part, B * T, NH, KVH, HS),
                                QkvPart(c_dqkv, part, B * T, NH, KVH, HS), kBf16Tolerance));
  }
}

TEST(FlashAttentionSpeed, Gpt2XlShapeAgainstCublas) {
  SKIP_WITHOUT_GPU();
  for (int B : {4, 8}) SpeedAgainstCublas(Shape{B, 1024, 25, 25, 64});  // GPT-2 1.5B's attention
}

// Grouped-query: each fused dkv block walks its group's 4 query heads, so the backward has a
// quarter of the blocks, each with 4 times the work.
TEST(FlashAttentionSpeed, Llama3ShapeAgainstCublas) {
  SKIP_WITHOUT_GPU();
  SpeedAgainstCublas(Shape{2, 2048, 32, 8, 128});  // Llama 3 8B's attention
}

}  // namespace
