// tests/layers/cuda_gemm_test.cc — the CUDA matmul and attention (//layers:cuda_gemm) against
// their CPU twins on the same bf16-rounded inputs, their += and NULL semantics, the causal mask,
// grouped-query attention (against the CPU twin, and against multi-head attention on the kv heads
// repeated), bitwise determinism, and the throughput of a GPT-2 1.5B sized GEMM.
//
// Every test skips itself, by name, when no GPU is visible (CI builds CUDA without a GPU).
//
// Error measure: ||gpu - cpu||_inf / ||cpu||_inf over a whole output; a NaN or infinity on the GPU
// fails (outputs are poisoned with NaN first, so an element that is never written fails too).
// Tolerances:
//   bf16 outputs 2e-2. One rounding to bf16 is up to 2^-9 ~ 2e-3 of the element; attention adds a
//     few more (scores, probabilities, datt, dpreatt are bf16, and a logit's error enters exp()),
//     so ~5e-3 is expected and 2e-2 leaves room without hiding a wrong index or a missing term
//     (those give errors of order 1).
//   fp32 outputs (dweight, dbias) 1e-3. Products of bf16 values are exact in fp32; what differs
//     from the CPU is only the fp32 summation order, ~1e-6 at these sizes.
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
constexpr double kFp32Tolerance = 1e-3;
constexpr int kPoisonByte = 0xFF;  // bf16 0xFFFF and fp32 0xFFFFFFFF are NaN

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h

// ---------------------------------------------------------------------------------------------
// matmul

struct MatmulShape {
  int BT, C, OC;
};

std::string Describe(const MatmulShape &s) {
  return "BT=" + std::to_string(s.BT) + " C=" + std::to_string(s.C) +
         " OC=" + std::to_string(s.OC);
}

// Inputs rounded to bf16, and the CPU twin's outputs on them.
struct MatmulCase {
  explicit MatmulCase(const MatmulShape &s) : BT(s.BT), C(s.C), OC(s.OC) {
    Rng rng(1000 + s.BT + s.C + s.OC);
    inp = RoundToBf16(rng.uniform_vector((size_t)BT * C, -1.0f, 1.0f));
    weight = RoundToBf16(rng.uniform_vector((size_t)OC * C, -1.0f, 1.0f));
    bias = RoundToBf16(rng.uniform_vector(OC, -1.0f, 1.0f));
    dout = RoundToBf16(rng.uniform_vector((size_t)BT * OC, -1.0f, 1.0f));
  }
  std::vector<float> Forward(bool with_bias) const {
    std::vector<float> out((size_t)BT * OC);
    mp_matmul_forward_cpu(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                          BT, C, OC);
    return out;
  }
  // Gradients from zero.
  void Backward(std::vector<float> *dinp, std::vector<float> *dweight,
                std::vector<float> *dbias) const {
    dinp->assign((size_t)BT * C, 0.0f);
    dweight->assign((size_t)OC * C, 0.0f);
    dbias->assign(OC, 0.0f);
    mp_matmul_backward_cpu(dinp->data(), dweight->data(), dbias->data(), dout.data(), inp.data(),
                           weight.data(), BT, C, OC);
  }

  int BT, C, OC;
  std::vector<float> inp, weight, bias, dout;  // (BT, C), (OC, C), (OC), (BT, OC)
};

// The case's inputs on the device, and gradient buffers.
struct MatmulOnGpu {
  MatmulOnGpu(Gpu *gpu, const MatmulCase &m)
      : inp(gpu->Upload(ToBf16(m.inp))),
        weight(gpu->Upload(ToBf16(m.weight))),
        bias(gpu->Upload(ToBf16(m.bias))),
        dout(gpu->Upload(ToBf16(m.dout))),
        out(gpu->Alloc<mp_bf16>((size_t)m.BT * m.OC, kPoisonByte)),
        dinp(gpu->Alloc<mp_bf16>((size_t)m.BT * m.C)),
        dweight(gpu->Alloc<float>((size_t)m.OC * m.C)),
        dbias(gpu->Alloc<float>(m.OC)),
        scratch(gpu->Alloc<float>(mp_matmul_backward_cuda_scratch_floats(m.BT, m.OC),
                                  kPoisonByte)) {}
  mp_bf16 *inp, *weight, *bias, *dout, *out, *dinp;
  float *dweight, *dbias, *scratch;
};

class CudaMatmul : public ::testing::TestWithParam<MatmulShape> {};

TEST_P(CudaMatmul, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const MatmulCase m(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  MatmulOnGpu d(&gpu, m);
  for (bool with_bias : {true, false}) {
    gpu.Fill(d.out, (size_t)m.BT * m.OC, kPoisonByte);
    gpu.Sync();
    mp_matmul_forward_cuda(gpu.cublas, d.out, d.inp, d.weight, with_bias ? d.bias : nullptr, m.BT,
                           m.C, m.OC, gpu.stream);
    gpu.Sync();
    const std::vector<float> got = gpu.DownloadBf16(d.out, (size_t)m.BT * m.OC);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    EXPECT_TRUE(WithinTolerance("matmul_forward " + Describe(GetParam()) +
                                    (with_bias ? " bias" : " no bias"),
                                got, m.Forward(with_bias), kBf16Tolerance));
  }
}

TEST_P(CudaMatmul, BackwardMatchesCpuAndAddsIntoGradients) {
  SKIP_WITHOUT_GPU();
  const MatmulCase m(GetParam());
  const std::string tag = Describe(GetParam());
  std::vector<float> dinp, dweight, dbias;
  m.Backward(&dinp, &dweight, &dbias);
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  MatmulOnGpu d(&gpu, m);

  // From zero: the gradients themselves.
  gpu.Sync();
  mp_matmul_backward_cuda(gpu.cublas, d.dinp, d.dweight, d.dbias, d.dout, d.inp, d.weight,
                          d.scratch, m.BT, m.C, m.OC, gpu.stream);
  gpu.Sync();
  std::vector<float> got_dinp = gpu.DownloadBf16(d.dinp, dinp.size());
  std::vector<float> got_dweight = gpu.Download(d.dweight, dweight.size());
  std::vector<float> got_dbias = gpu.Download(d.dbias, dbias.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("matmul_backward dinp " + tag, got_dinp, dinp, kBf16Tolerance));
  EXPECT_TRUE(
      WithinTolerance("matmul_backward dweight " + tag, got_dweight, dweight, kFp32Tolerance));
  EXPECT_TRUE(WithinTolerance("matmul_backward dbias " + tag, got_dbias, dbias, kFp32Tolerance));

  // Onto gradients that already hold something (a second micro-batch): +=.
  Rng rng(77);
  const std::vector<float> dinp0 = RoundToBf16(rng.uniform_vector(dinp.size(), -1.0f, 1.0f));
  const std::vector<float> dweight0 = rng.uniform_vector(dweight.size(), -1.0f, 1.0f);
  const std::vector<float> dbias0 = rng.uniform_vector(dbias.size(), -1.0f, 1.0f);
  gpu.CopyIn(d.dinp, ToBf16(dinp0));
  gpu.CopyIn(d.dweight, dweight0);
  gpu.CopyIn(d.dbias, dbias0);
  gpu.Fill(d.scratch, mp_matmul_backward_cuda_scratch_floats(m.BT, m.OC), kPoisonByte);
  gpu.Sync();
  mp_matmul_backward_cuda(gpu.cublas, d.dinp, d.dweight, d.dbias, d.dout, d.inp, d.weight,
                          d.scratch, m.BT, m.C, m.OC, gpu.stream);
  gpu.Sync();
  got_dinp = gpu.DownloadBf16(d.dinp, dinp.size());
  got_dweight = gpu.Download(d.dweight, dweight.size());
  got_dbias = gpu.Download(d.dbias, dbias.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(WithinTolerance("matmul_backward dinp += " + tag, got_dinp, Plus(dinp0, dinp),
                              kBf16Tolerance));
  EXPECT_TRUE(WithinTolerance("matmul_backward dweight += " + tag, got_dweight,
                              Plus(dweight0, dweight), kFp32Tolerance));
  EXPECT_TRUE(WithinTolerance("matmul_backward dbias += " + tag, got_dbias, Plus(dbias0, dbias),
                              kFp32Tolerance));
}

TEST_P(CudaMatmul, DeterministicAndNullGradientsAreSkipped) {
  SKIP_WITHOUT_GPU();
  const MatmulCase m(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  MatmulOnGpu d(&gpu, m);
  const size_t n_out = (size_t)m.BT * m.OC, n_inp = (size_t)m.BT * m.C, n_w = (size_t)m.OC * m.C;
  auto zero_gradients = [&] {
    gpu.Fill(d.dinp, n_inp, 0);
    gpu.Fill(d.dweight, n_w, 0);
    gpu.Fill(d.dbias, m.OC, 0);
    gpu.Sync();
  };

  // The forward twice into a poisoned buffer: the same bits.
  std::vector<mp_bf16> out[2];
  for (auto &o : out) {
    gpu.Fill(d.out, n_out, kPoisonByte);
    gpu.Sync();
    mp_matmul_forward_cuda(gpu.cublas, d.out, d.inp, d.weight, d.bias, m.BT, m.C, m.OC,
                           gpu.stream);
    gpu.Sync();
    o = gpu.Download(d.out, n_out);
  }
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(out[0], out[1])) << "two forwards differ";

  // The full backward twice, then dinp alone followed by dweight and dbias alone.
  std::vector<mp_bf16> dinp[3];
  std::vector<float> dweight[3], dbias[3];
  for (int run = 0; run < 3; run++) {
    zero_gradients();
    if (run < 2) {
      mp_matmul_backward_cuda(gpu.cublas, d.dinp, d.dweight, d.dbias, d.dout, d.inp, d.weight,
                              d.scratch, m.BT, m.C, m.OC, gpu.stream);
    } else {
      mp_matmul_backward_cuda(gpu.cublas, d.dinp, nullptr, nullptr, d.dout, nullptr, d.weight,
                              nullptr, m.BT, m.C, m.OC, gpu.stream);
      mp_matmul_backward_cuda(gpu.cublas, nullptr, d.dweight, d.dbias, d.dout, d.inp, nullptr,
                              d.scratch, m.BT, m.C, m.OC, gpu.stream);
    }
    gpu.Sync();
    dinp[run] = gpu.Download(d.dinp, n_inp);
    dweight[run] = gpu.Download(d.dweight, n_w);
    dbias[run] = gpu.Download(d.dbias, m.OC);
  }
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (int run = 1; run < 3; run++) {
    const char *what = run == 1 ? "a second backward" : "the split backward";
    EXPECT_TRUE(BitwiseEqual(dinp[0], dinp[run])) << what << ": dinp differs";
    EXPECT_TRUE(BitwiseEqual(dweight[0], dweight[run])) << what << ": dweight differs";
    EXPECT_TRUE(BitwiseEqual(dbias[0], dbias[run])) << what << ": dbias differs";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatmul,
                         ::testing::Values(MatmulShape{256, 768, 2304},
                                           MatmulShape{256, 768, 50304},
                                           MatmulShape{33, 40, 24}),
                         [](const ::testing::TestParamInfo<MatmulShape> &info) {
                           return "BT" + std::to_string(info.param.BT) + "_C" +
                                  std::to_string(info.param.C) + "_OC" +
                                  std::to_string(info.param.OC);
                         });

// ---------------------------------------------------------------------------------------------
// attention

// NH query heads and KVH kv heads (KVH = NH: multi-head; 1: multi-query).
struct AttentionShape {
  int B, T, NH, KVH, HS;
};

// "B=.. T=.. NH=.. HS=..", with KVH=.. after NH where it differs from NH.
std::string Describe(const AttentionShape &s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " NH=" + std::to_string(s.NH) +
         (s.KVH != s.NH ? " KVH=" + std::to_string(s.KVH) : "") + " HS=" + std::to_string(s.HS);
}


// Inputs rounded to bf16, and the CPU twin's forward on them.
struct AttentionCase {
  explicit AttentionCase(const AttentionShape &s)
      : B(s.B), T(s.T), NH(s.NH), KVH(s.KVH), HS(s.HS), C(s.NH * s.HS),
        W((s.NH + 2 * s.KVH) * s.HS) {
    Rng rng(2000 + B + T + NH + HS);
    qkv = RoundToBf16(rng.uniform_vector((size_t)B * T * W, -1.5f, 1.5f));
    dout = RoundToBf16(rng.uniform_vector((size_t)B * T * C, -1.0f, 1.0f));
    out.resize((size_t)B * T * C);
    att.resize((size_t)B * NH * T * T);
    mp_attention_forward_cpu(out.data(), nullptr, att.data(), qkv.data(), B, T, NH, KVH, HS);
  }
  // Gradient of qkv from zero.
  std::vector<float> Backward() const {
    std::vector<float> dqkv(qkv.size(), 0.0f), dpreatt(att.size()), datt(att.size());
    mp_attention_backward_cpu(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(),
                              att.data(), B, T, NH, KVH, HS);
    return dqkv;
  }

  int B, T, NH, KVH, HS, C, W;
  std::vector<float> qkv, dout;  // (B, T, W), (B, T, C)
  std::vector<float> out, att;   // (B, T, C), (B, NH, T, T)
};

struct AttentionOnGpu {
  AttentionOnGpu(Gpu *gpu, const AttentionCase &a)
      : qkv(gpu->Upload(ToBf16(a.qkv))),
        dout(gpu->Upload(ToBf16(a.dout))),
        out(gpu->Alloc<mp_bf16>(a.out.size(), kPoisonByte)),
        att(gpu->Alloc<mp_bf16>(a.att.size(), kPoisonByte)),
        dqkv(gpu->Alloc<mp_bf16>(a.qkv.size())),
        scratch(gpu->Alloc<char>(mp_attention_cuda_scratch_bytes(a.B, a.T, a.NH, a.HS),
                                 kPoisonByte)) {}
  mp_bf16 *qkv, *dout, *out, *att, *dqkv;
  char *scratch;
};

class CudaAttention : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(CudaAttention, ForwardMatchesCpuAndIsCausal) {
  SKIP_WITHOUT_GPU();
  const AttentionCase a(GetParam());
  const std::string tag = Describe(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  AttentionOnGpu d(&gpu, a);
  gpu.Sync();
  mp_attention_forward_cuda(gpu.cublas, d.out, d.att, d.qkv, d.scratch, a.B, a.T, a.NH, a.KVH,
                            a.HS, gpu.stream);
  gpu.Sync();
  const std::vector<float> out = gpu.DownloadBf16(d.out, a.out.size());
  const std::vector<mp_bf16> att_bits = gpu.Download(d.att, a.att.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const std::vector<float> att = ToFloat(att_bits);
  EXPECT_TRUE(WithinTolerance("attention_forward out " + tag, out, a.out, kBf16Tolerance));
  EXPECT_TRUE(WithinTolerance("attention_forward att " + tag, att, a.att, kBf16Tolerance));

  // Future keys get exactly +0 (all 16 bits zero); each row sums to 1 up to bf16 rounding.
  size_t nonzero_masked = 0, bad_rows = 0;
  for (size_t row = 0; row < (size_t)a.B * a.NH * a.T; row++) {
    const int t = (int)(row % a.T);
    double sum = 0.0;
    for (int t2 = 0; t2 < a.T; t2++) {
      if (t2 > t && att_bits[row * a.T + t2] != 0) nonzero_masked++;
      sum += att[row * a.T + t2];
    }
    if (!(std::fabs(sum - 1.0) <= 1e-2)) bad_rows++;
  }
  std::printf("kernel attention_forward mask %s: %zu masked probabilities not exactly 0, %zu rows "
              "not summing to 1\n",
              tag.c_str(), nonzero_masked, bad_rows);
  EXPECT_EQ(nonzero_masked, 0u);
  EXPECT_EQ(bad_rows, 0u);
}

TEST_P(CudaAttention, BackwardMatchesCpuAndAddsIntoDqkv) {
  SKIP_WITHOUT_GPU();
  const AttentionCase a(GetParam());
  const std::string tag = Describe(GetParam());
  const std::vector<float> dqkv = a.Backward();
  const int BT = a.B * a.T;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  AttentionOnGpu d(&gpu, a);
  gpu.Sync();
  mp_attention_forward_cuda(gpu.cublas, d.out, d.att, d.qkv, d.scratch, a.B, a.T, a.NH, a.KVH,
                            a.HS, gpu.stream);
  gpu.Sync();
  gpu.Fill(d.scratch, mp_attention_cuda_scratch_bytes(a.B, a.T, a.NH, a.HS), kPoisonByte);
  gpu.Sync();

  // From zero: the gradient itself, q, k and v parts held to the tolerance separately.
  mp_attention_backward_cuda(gpu.cublas, d.dqkv, d.dout, d.qkv, d.att, d.scratch, a.B, a.T, a.NH,
                             a.KVH, a.HS, gpu.stream);
  gpu.Sync();
  std::vector<float> got = gpu.DownloadBf16(d.dqkv, dqkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(std::string("attention_backward ") + names[part] + " " + tag,
                                QkvPart(got, part, BT, a.NH, a.KVH, a.HS),
                                QkvPart(dqkv, part, BT, a.NH, a.KVH, a.HS), kBf16Tolerance));
  }

  // Onto a dqkv that already holds something: +=.
  Rng rng(88);
  const std::vector<float> dqkv0 = RoundToBf16(rng.uniform_vector(dqkv.size(), -0.1f, 0.1f));
  gpu.CopyIn(d.dqkv, ToBf16(dqkv0));
  gpu.Sync();
  mp_attention_backward_cuda(gpu.cublas, d.dqkv, d.dout, d.qkv, d.att, d.scratch, a.B, a.T, a.NH,
                             a.KVH, a.HS, gpu.stream);
  gpu.Sync();
  got = gpu.DownloadBf16(d.dqkv, dqkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(
      WithinTolerance("attention_backward dqkv += " + tag, got, Plus(dqkv0, dqkv), kBf16Tolerance));
}

TEST_P(CudaAttention, Deterministic) {
  SKIP_WITHOUT_GPU();
  const AttentionCase a(GetParam());
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  AttentionOnGpu d(&gpu, a);
  std::vector<mp_bf16> out[2], att[2], dqkv[2];
  for (int run = 0; run < 2; run++) {
    gpu.Fill(d.out, a.out.size(), kPoisonByte);
    gpu.Fill(d.att, a.att.size(), kPoisonByte);
    gpu.Fill(d.dqkv, a.qkv.size(), 0);
    gpu.Sync();
    mp_attention_forward_cuda(gpu.cublas, d.out, d.att, d.qkv, d.scratch, a.B, a.T, a.NH, a.KVH,
                              a.HS, gpu.stream);
    mp_attention_backward_cuda(gpu.cublas, d.dqkv, d.dout, d.qkv, d.att, d.scratch, a.B, a.T,
                               a.NH, a.KVH, a.HS, gpu.stream);
    gpu.Sync();
    out[run] = gpu.Download(d.out, a.out.size());
    att[run] = gpu.Download(d.att, a.att.size());
    dqkv[run] = gpu.Download(d.dqkv, a.qkv.size());
  }
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(out[0], out[1])) << "two forwards differ in out";
  EXPECT_TRUE(BitwiseEqual(att[0], att[1])) << "two forwards differ in att";
  EXPECT_TRUE(BitwiseEqual(dqkv[0], dqkv[1])) << "two backwards differ in dqkv";
}

// Grouped-query attention on the GPU is multi-head attention on the kv heads repeated: the same
// forward bits (the permute copies each kv head to its query heads and the GEMMs are the same),
// the same dq bits, and a kv head's dk and dv the sum over its group of the repeated heads'
// (here summed in fp32 after each was rounded to bf16, on the GPU summed in fp32 first: held to
// the tolerance).
TEST_P(CudaAttention, GroupedEqualsMultiHeadOnRepeatedKv) {
  SKIP_WITHOUT_GPU();
  const AttentionShape shape = GetParam();
  if (shape.KVH == shape.NH) GTEST_SKIP() << "multi-head: nothing is repeated";
  const AttentionCase a(shape);
  const std::string tag = Describe(shape);
  const int BT = a.B * a.T;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  AttentionOnGpu d(&gpu, a);
  mp_bf16 *qkv_mha = gpu.Upload(RepeatKv(ToBf16(a.qkv), BT, a.NH, a.KVH, a.HS));
  mp_bf16 *out_mha = gpu.Alloc<mp_bf16>(a.out.size(), kPoisonByte);
  mp_bf16 *att_mha = gpu.Alloc<mp_bf16>(a.att.size(), kPoisonByte);
  mp_bf16 *dqkv_mha = gpu.Alloc<mp_bf16>((size_t)BT * 3 * a.C);
  gpu.Sync();
  mp_attention_forward_cuda(gpu.cublas, d.out, d.att, d.qkv, d.scratch, a.B, a.T, a.NH, a.KVH,
                            a.HS, gpu.stream);
  mp_attention_backward_cuda(gpu.cublas, d.dqkv, d.dout, d.qkv, d.att, d.scratch, a.B, a.T, a.NH,
                             a.KVH, a.HS, gpu.stream);
  mp_attention_forward_cuda(gpu.cublas, out_mha, att_mha, qkv_mha, d.scratch, a.B, a.T, a.NH,
                            a.NH, a.HS, gpu.stream);
  mp_attention_backward_cuda(gpu.cublas, dqkv_mha, d.dout, qkv_mha, att_mha, d.scratch, a.B, a.T,
                             a.NH, a.NH, a.HS, gpu.stream);
  gpu.Sync();
  const std::vector<mp_bf16> out = gpu.Download(d.out, a.out.size());
  const std::vector<mp_bf16> att = gpu.Download(d.att, a.att.size());
  const std::vector<float> dqkv = gpu.DownloadBf16(d.dqkv, a.qkv.size());
  const std::vector<mp_bf16> out_ref = gpu.Download(out_mha, a.out.size());
  const std::vector<mp_bf16> att_ref = gpu.Download(att_mha, a.att.size());
  const std::vector<float> dqkv_ref = gpu.DownloadBf16(dqkv_mha, (size_t)BT * 3 * a.C);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(out, out_ref)) << "out differs from multi-head on repeated kv " << tag;
  EXPECT_TRUE(BitwiseEqual(att, att_ref)) << "att differs from multi-head on repeated kv " << tag;
  const std::vector<float> dq = QkvPart(dqkv, 0, BT, a.NH, a.KVH, a.HS);
  EXPECT_TRUE(BitwiseEqual(dq, QkvPart(dqkv_ref, 0, BT, a.NH, a.NH, a.HS)))
      << "dq differs from multi-head on repeated kv " << tag;
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 1; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(
        std::string("attention_backward ") + names[part] + " vs multi-head on repeated kv " + tag,
        QkvPart(dqkv, part, BT, a.NH, a.KVH, a.HS),
        SumGroups(QkvPart(dqkv_ref, part, BT, a.NH, a.NH, a.HS), BT, a.NH, a.KVH, a.HS),
        kBf16Tolerance));
  }
}

// Multi-head shapes, then grouped-query (NH / KVH = 4, 3, 4) and multi-query (KVH = 1) ones.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttentionShape{2, 64, 4, 4, 16},
                                           AttentionShape{1, 1024, 12, 12, 64},
                                           AttentionShape{2, 37, 3, 3, 24},
                                           AttentionShape{2, 64, 8, 2, 16},
                                           AttentionShape{1, 300, 12, 4, 64},
                                           AttentionShape{1, 256, 32, 8, 64},
                                           AttentionShape{2, 37, 4, 1, 24}),
                         [](const ::testing::TestParamInfo<AttentionShape> &info) {
                           const AttentionShape &s = info.param;
                           return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) +
                                  "_NH" + std::to_string(s.NH) +
                                  (s.KVH != s.NH ? "_KVH" + std::to_string(s.KVH) : "") +
                                  "_HS" + std::to_string(s.HS);
                         });

// ---------------------------------------------------------------------------------------------
// failures reported through mp_cublas_check

TEST(CudaGemm, BadShapesAreReportedOnceByCheck) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_matmul_forward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, -1, 8, 8, gpu.stream);
  mp_attention_forward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, 1, -4, 2, 2, 8,
                            gpu.stream);
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cublas_check(gpu.cublas, &err), MP_ERR_INPUT);
  EXPECT_NE(std::strstr(err.message, "mp_matmul_forward_cuda"), nullptr)
      << "the first failure is kept: " << err.message;
  mp_error_clear(&err);
  EXPECT_EQ(mp_cublas_check(gpu.cublas, &err), MP_OK) << err.message;
  // kv heads that do not divide the query heads (or none at all), before anything is launched.
  mp_attention_backward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 3,
                             8, gpu.stream);
  EXPECT_EQ(mp_cublas_check(gpu.cublas, &err), MP_ERR_INPUT);
  EXPECT_NE(std::strstr(err.message, "KVH=3"), nullptr) << err.message;
  mp_error_clear(&err);
  mp_attention_forward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, 1, 4, 4, 0, 8,
                            gpu.stream);
  EXPECT_EQ(mp_cublas_check(gpu.cublas, &err), MP_ERR_INPUT);
  mp_error_clear(&err);
  // Empty shapes are no-ops, not failures.
  mp_matmul_forward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, 0, 8, 8, gpu.stream);
  mp_attention_forward_cuda(gpu.cublas, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 2, 8,
                            gpu.stream);
  EXPECT_EQ(mp_cublas_check(gpu.cublas, &err), MP_OK) << err.message;
}

// ---------------------------------------------------------------------------------------------
// throughput (printed for the device log; checked only for correctness on sampled entries)

TEST(CudaGemm, ThroughputOfGpt2XlSizedGemmAndAttention) {
  SKIP_WITHOUT_GPU();
  const int BT = 8192, C = 1600, OC = 6400;  // GPT-2 1.5B's MLP up-projection, B*T = 8 * 1024
  Rng rng(5);
  const std::vector<float> inp = RoundToBf16(rng.uniform_vector((size_t)BT * C, -1.0f, 1.0f));
  const std::vector<float> weight = RoundToBf16(rng.uniform_vector((size_t)OC * C, -1.0f, 1.0f));
  const std::vector<float> bias = RoundToBf16(rng.uniform_vector(OC, -1.0f, 1.0f));
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *d_inp = gpu.Upload(ToBf16(inp));
  mp_bf16 *d_weight = gpu.Upload(ToBf16(weight));
  mp_bf16 *d_bias = gpu.Upload(ToBf16(bias));
  mp_bf16 *d_out = gpu.Alloc<mp_bf16>((size_t)BT * OC, kPoisonByte);
  mp_bf16 *d_dinp = gpu.Alloc<mp_bf16>((size_t)BT * C);
  float *d_dweight = gpu.Alloc<float>((size_t)OC * C);
  float *d_dbias = gpu.Alloc<float>(OC);
  float *d_scratch = gpu.Alloc<float>(mp_matmul_backward_cuda_scratch_floats(BT, OC));
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_device_timer *timer = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_device_timer_create(&timer, &err), MP_OK) << err.message;
  const std::unique_ptr<mp_device_timer, void (*)(mp_device_timer *)> timer_owner(
      timer, mp_device_timer_free);
  auto time_it = [&](int iterations, const std::function<void()> &launch) {
    for (int i = 0; i < 3; i++) launch();  // warm-up: heuristics, clocks
    double seconds = 0.0;
    if (mp_device_timer_start(timer, gpu.stream, &err) != MP_OK) return -1.0;
    for (int i = 0; i < iterations; i++) launch();
    if (mp_device_timer_stop(timer, gpu.stream, &seconds, &err) != MP_OK) return -1.0;
    return seconds / iterations;
  };

  const double flops = 2.0 * BT * C * OC;
  const double forward_s = time_it(20, [&] {
    mp_matmul_forward_cuda(gpu.cublas, d_out, d_inp, d_weight, d_bias, BT, C, OC, gpu.stream);
  });
  // The output (the dout below) is the forward's own: only the timing matters there.
  const double backward_s = time_it(10, [&] {
    mp_matmul_backward_cuda(gpu.cublas, d_dinp, d_dweight, d_dbias, d_out, d_inp, d_weight,
                            d_scratch, BT, C, OC, gpu.stream);
  });
  ASSERT_GT(forward_s, 0.0) << err.message;
  ASSERT_GT(backward_s, 0.0) << err.message;
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  std::printf("kernel matmul_forward BT=%d C=%d OC=%d bf16 (bias): %.3f ms, %.1f TFLOP/s\n", BT, C,
              OC, forward_s * 1e3, flops / forward_s * 1e-12);
  std::printf("kernel matmul_backward BT=%d C=%d OC=%d bf16 (dinp, fp32 dweight, dbias): %.3f ms, "
              "%.1f TFLOP/s\n",
              BT, C, OC, backward_s * 1e3, 2.0 * flops / backward_s * 1e-12);

  // 512 sampled entries of the forward against a double-precision dot product.
  mp_matmul_forward_cuda(gpu.cublas, d_out, d_inp, d_weight, d_bias, BT, C, OC, gpu.stream);
  gpu.Sync();
  const std::vector<float> out = gpu.DownloadBf16(d_out, (size_t)BT * OC);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  std::vector<float> got, want;
  for (int s = 0; s < 512; s++) {
    const int r = rng.below(BT), o = rng.below(OC);
    double dot = bias[o];
    for (int c = 0; c < C; c++) dot += (double)inp[(size_t)r * C + c] * weight[(size_t)o * C + c];
    got.push_back(out[(size_t)r * OC + o]);
    want.push_back((float)dot);
  }
  EXPECT_TRUE(WithinTolerance("matmul_forward sampled BT=8192 C=1600 OC=6400", got, want,
                              kBf16Tolerance));

  // Attention at GPT-2 1.5B's head shape; FLOPs of its GEMMs over the full T x T.
  const int B = 4, T = 1024, NH = 25, HS = 64;
  const std::vector<mp_bf16> qkv =
      ToBf16(rng.uniform_vector((size_t)B * T * 3 * NH * HS, -1.5f, 1.5f));
  mp_bf16 *d_qkv = gpu.Upload(qkv);
  mp_bf16 *d_dqkv = gpu.Alloc<mp_bf16>(qkv.size());
  mp_bf16 *d_y = gpu.Alloc<mp_bf16>((size_t)B * T * NH * HS);
  mp_bf16 *d_att = gpu.Alloc<mp_bf16>((size_t)B * NH * T * T);
  char *d_att_scratch = gpu.Alloc<char>(mp_attention_cuda_scratch_bytes(B, T, NH, HS));
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const double attention_flops = 4.0 * B * NH * (double)T * T * HS;
  const double attention_forward_s = time_it(10, [&] {
    mp_attention_forward_cuda(gpu.cublas, d_y, d_att, d_qkv, d_att_scratch, B, T, NH, NH, HS,
                              gpu.stream);
  });
  const double attention_backward_s = time_it(10, [&] {
    mp_attention_backward_cuda(gpu.cublas, d_dqkv, d_y, d_qkv, d_att, d_att_scratch, B, T, NH, NH,
                               HS, gpu.stream);
  });
  ASSERT_GT(attention_forward_s, 0.0) << err.message;
  ASSERT_GT(attention_backward_s, 0.0) << err.message;
  gpu.Sync();
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  std::printf("kernel attention_forward B=%d T=%d NH=%d HS=%d: %.3f ms, %.1f TFLOP/s (GEMMs over "
              "full T x T)\n",
              B, T, NH, HS, attention_forward_s * 1e3,
              attention_flops / attention_forward_s * 1e-12);
  std::printf("kernel attention_backward B=%d T=%d NH=%d HS=%d: %.3f ms, %.1f TFLOP/s (GEMMs over "
              "full T x T)\n",
              B, T, NH, HS, attention_backward_s * 1e3,
              2.0 * attention_flops / attention_backward_s * 1e-12);
  std::fflush(stdout);
}

}  // namespace
