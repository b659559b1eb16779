// tests/layers/cuda_elementwise_test.cc — every elementwise CUDA twin (//layers:cuda_elementwise)
// against its CPU twin on the same inputs.
//
// Inputs are drawn with a fixed seed and rounded to bf16 on the host, so the CPU twin (fp32)
// sees exactly the values the GPU reads. Each comparison prints
//   kernel <name>: max rel err <x> (tolerance <y>)
// with max rel err = ||gpu - cpu||_inf / ||cpu||_inf; a NaN or infinity on the GPU side fails.
// Outputs that are written (=) are filled with NaN bits first, so an element the kernel skips
// fails; the rotary embeddings rotate in place, and what lies outside their heads must keep its
// bits. Backward kernels run twice from the same state and must give identical bits.
//
// Tolerances:
//   1e-2 for bf16 outputs: the GPU rounds each output once to bf16 (relative error <= 2^-9 =
//        0.2%), on top of fp32 math that differs from the CPU's only in order and contraction
//        (and in the last bits of expf, sinf and cosf for SwiGLU and the rotary embeddings).
//   1e-5 for fp32 values computed in fp32 from the same inputs in a different order (layernorm
//        and RMSNorm statistics and weight gradients: sums of at most a few thousand terms); 5e-5
//        for the cross-entropy losses, log of a sum of 50257 exponentials whose sequential CPU
//        sum carries a relative error of order sqrt(V) * 2^-24 ~ 1e-5.
//   1e-6 for the embedding gradients and AdamW: the GPU performs the CPU's fp32 operations in the
//        CPU's order (no FMA contraction), so on x86-64 hosts the error is expected to be 0; the
//        margin is for host compilers that contract into FMAs.
//   1e-9 for the squared gradient norm: double accumulation in another order.
//   0 (bitwise) for gradient scaling and float -> bf16, single correctly rounded operations.
//
// Every test first looks for a GPU and, without one, reports itself skipped by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/device/device.h"
#include "layers/adamw.h"
#include "layers/cross_entropy.h"
#include "layers/cuda_types.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"
#include "tests/layers/finite_difference.h"

namespace {

using mp_test::Rng;

constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp32ReorderedTolerance = 1e-5;
constexpr double kLossTolerance = 5e-5;
constexpr double kFp32SameOrderTolerance = 1e-6;
constexpr double kDoubleTolerance = 1e-9;

// ---------------------------------------------------------------------------------------------
// host helpers

std::vector<mp_bf16> to_bf16(const std::vector<float> &values) {
  std::vector<mp_bf16> bits(values.size());
  mp_bf16_from_floats(bits.data(), values.data(), values.size());
  return bits;
}

std::vector<float> to_float(const std::vector<mp_bf16> &bits) {
  std::vector<float> values(bits.size());
  mp_bf16_to_floats(values.data(), bits.data(), bits.size());
  return values;
}

// Rounds values to bf16 in place (so a CPU twin sees what the GPU reads) and returns the bits.
std::vector<mp_bf16> round_to_bf16(std::vector<float> &values) {
  std::vector<mp_bf16> bits = to_bf16(values);
  values = to_float(bits);
  return bits;
}

// ||gpu - cpu||_inf / ||cpu||_inf (the plain difference when cpu is all zeros); +inf when a GPU
// value is NaN or infinite where the CPU's is finite.
double max_rel_err(const std::vector<float> &gpu, const std::vector<float> &cpu) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < cpu.size(); i++) {
    const double d = std::fabs((double)gpu[i] - (double)cpu[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    if (d > diff) diff = d;
    if (std::fabs((double)cpu[i]) > norm) norm = std::fabs((double)cpu[i]);
  }
  return norm > 0.0 ? diff / norm : diff;
}

void expect_close(const std::string &kernel, const std::vector<float> &gpu,
                  const std::vector<float> &cpu, double tolerance) {
  ASSERT_EQ(gpu.size(), cpu.size()) << kernel;
  const double err = max_rel_err(gpu, cpu);
  printf("kernel %s: max rel err %.3g (tolerance %.3g)\n", kernel.c_str(), err, tolerance);
  EXPECT_LE(err, tolerance) << kernel;  // false for NaN
}

template <typename T>
void expect_same_bits(const std::string &what, const std::vector<T> &a, const std::vector<T> &b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  if (a.empty()) return;  // memcmp takes no null pointers, even for 0 bytes
  EXPECT_EQ(0, memcmp(a.data(), b.data(), a.size() * sizeof(T)))
      << what << ": different bits where they must be the same";
}

std::string size_name(const char *kernel, size_t n) {
  return std::string(kernel) + " n=" + std::to_string(n);
}

// ---------------------------------------------------------------------------------------------
// device memory through engine/device/device.h

template <typename T>
class DeviceArray {
 public:
  // n elements; `offset` extra elements in front shift get() off 16-byte alignment when wanted.
  explicit DeviceArray(size_t n, size_t offset = 0) : n_(n), offset_(offset) {
    mp_error err = MP_ERROR_INITIALIZER;
    if (mp_device_alloc(&base_, (n + offset) * sizeof(T), &err) != MP_OK) {
      ADD_FAILURE() << err.message;
    }
  }
  ~DeviceArray() { mp_device_free(base_); }
  DeviceArray(const DeviceArray &) = delete;
  DeviceArray &operator=(const DeviceArray &) = delete;

  T *get() const { return base_ == nullptr ? nullptr : static_cast<T *>(base_) + offset_; }
  size_t size() const { return n_; }

  void upload(const std::vector<T> &host) {
    ASSERT_EQ(host.size(), n_);
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_device_copy_to_device(get(), host.data(), n_ * sizeof(T), &err), MP_OK)
        << err.message;
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_device_copy_to_host(host.data(), get(), n_ * sizeof(T), &err), MP_OK)
        << err.message;
    return host;
  }
  // All bits set: NaN as bf16 and as fp32.
  void poison() {
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_device_memset(get(), 0xff, n_ * sizeof(T), &err), MP_OK) << err.message;
  }

 private:
  void *base_ = nullptr;
  size_t n_, offset_;
};

class CudaElementwise : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mp_device_count() == 0) {
      const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
      GTEST_SKIP() << "no GPU visible: " << info->test_suite_name() << "." << info->name()
                   << " needs CUDA";
    }
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_device_select(0, &err), MP_OK) << err.message;
    ASSERT_EQ(mp_device_stream_create(&stream_, &err), MP_OK) << err.message;
  }
  void TearDown() override { mp_device_stream_destroy(stream_); }

  // Waits for the whole device: uploads (default stream) before launches on stream_, launches
  // before downloads. Reports asynchronous kernel errors.
  static bool Synced() {
    mp_error err = MP_ERROR_INITIALIZER;
    if (mp_device_synchronize(&err) != MP_OK) {
      ADD_FAILURE() << err.message;
      return false;
    }
    return true;
  }

  mp_cuda_stream stream_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// GELU

TEST_F(CudaElementwise, GeluForwardMatchesCpu) {
  struct Case {
    size_t n, offset;
  };
  // vectorised (n % 8 == 0, aligned), odd tail, and unaligned pointers with n % 8 == 0
  for (const Case c : {Case{1 << 20, 0}, Case{1000003, 0}, Case{4096, 1}}) {
    Rng rng(101 + c.n);
    std::vector<float> inp = rng.uniform_vector(c.n, -5.0f, 5.0f);
    std::vector<mp_bf16> inp_bits = round_to_bf16(inp);
    DeviceArray<mp_bf16> d_inp(c.n, c.offset), d_out(c.n, c.offset);
    d_inp.upload(inp_bits);
    d_out.poison();
    ASSERT_TRUE(Synced());
    mp_gelu_forward_cuda(d_out.get(), d_inp.get(), c.n, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> want(c.n);
    mp_gelu_forward_cpu(want.data(), inp.data(), c.n);
    expect_close(size_name(c.offset ? "gelu_forward (unaligned)" : "gelu_forward", c.n),
                 to_float(d_out.download()), want, kBf16Tolerance);

    // In place (out == inp) gives the same bits.
    mp_gelu_forward_cuda(d_inp.get(), d_inp.get(), c.n, stream_);
    ASSERT_TRUE(Synced());
    expect_same_bits("gelu_forward in place", d_inp.download(), d_out.download());
  }
}

TEST_F(CudaElementwise, GeluBackwardMatchesCpu) {
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(201 + n);
    std::vector<float> inp = rng.uniform_vector(n, -5.0f, 5.0f);
    std::vector<float> dout = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp = rng.uniform_vector(n, -0.25f, 0.25f);  // += onto these
    std::vector<mp_bf16> inp_bits = round_to_bf16(inp), dout_bits = round_to_bf16(dout);
    std::vector<mp_bf16> dinp_bits = round_to_bf16(dinp);
    DeviceArray<mp_bf16> d_inp(n), d_dout(n), d_dinp(n);
    d_inp.upload(inp_bits);
    d_dout.upload(dout_bits);
    std::vector<mp_bf16> runs[2];
    for (auto &run : runs) {
      d_dinp.upload(dinp_bits);
      ASSERT_TRUE(Synced());
      mp_gelu_backward_cuda(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream_);
      ASSERT_TRUE(Synced());
      run = d_dinp.download();
    }
    mp_gelu_backward_cpu(dinp.data(), inp.data(), dout.data(), n);
    expect_close(size_name("gelu_backward", n), to_float(runs[0]), dinp, kBf16Tolerance);
    expect_same_bits("gelu_backward", runs[0], runs[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// residual

TEST_F(CudaElementwise, ResidualForwardMatchesCpu) {
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(301 + n);
    std::vector<float> inp1 = rng.uniform_vector(n, -3.0f, 3.0f);
    std::vector<float> inp2 = rng.uniform_vector(n, -3.0f, 3.0f);
    std::vector<mp_bf16> inp1_bits = round_to_bf16(inp1), inp2_bits = round_to_bf16(inp2);
    DeviceArray<mp_bf16> d_inp1(n), d_inp2(n), d_out(n);
    d_inp1.upload(inp1_bits);
    d_inp2.upload(inp2_bits);
    d_out.poison();
    ASSERT_TRUE(Synced());
    mp_residual_forward_cuda(d_out.get(), d_inp1.get(), d_inp2.get(), n, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> want(n);
    mp_residual_forward_cpu(want.data(), inp1.data(), inp2.data(), n);
    expect_close(size_name("residual_forward", n), to_float(d_out.download()), want,
                 kBf16Tolerance);

    // In place into the residual stream (out == inp1) gives the same bits.
    mp_residual_forward_cuda(d_inp1.get(), d_inp1.get(), d_inp2.get(), n, stream_);
    ASSERT_TRUE(Synced());
    expect_same_bits("residual_forward in place", d_inp1.download(), d_out.download());
  }
}

TEST_F(CudaElementwise, ResidualBackwardMatchesCpu) {
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(401 + n);
    std::vector<float> dout = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp1 = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp2 = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<mp_bf16> dout_bits = round_to_bf16(dout);
    std::vector<mp_bf16> dinp1_bits = round_to_bf16(dinp1), dinp2_bits = round_to_bf16(dinp2);
    DeviceArray<mp_bf16> d_dout(n), d_dinp1(n), d_dinp2(n);
    d_dout.upload(dout_bits);
    std::vector<mp_bf16> runs1[2], runs2[2];
    for (int run = 0; run < 2; run++) {
      d_dinp1.upload(dinp1_bits);
      d_dinp2.upload(dinp2_bits);
      ASSERT_TRUE(Synced());
      mp_residual_backward_cuda(d_dinp1.get(), d_dinp2.get(), d_dout.get(), n, stream_);
      ASSERT_TRUE(Synced());
      runs1[run] = d_dinp1.download();
      runs2[run] = d_dinp2.download();
    }
    mp_residual_backward_cpu(dinp1.data(), dinp2.data(), dout.data(), n);
    expect_close(size_name("residual_backward dinp1", n), to_float(runs1[0]), dinp1,
                 kBf16Tolerance);
    expect_close(size_name("residual_backward dinp2", n), to_float(runs2[0]), dinp2,
                 kBf16Tolerance);
    expect_same_bits("residual_backward dinp1", runs1[0], runs1[1]);
    expect_same_bits("residual_backward dinp2", runs2[0], runs2[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// embedding

struct EmbeddingShape {
  int B, T, C, Vp, maxT;
};

// Token ids with many repeats (half from a few common ids), as real text has.
std::vector<int32_t> draw_tokens(Rng &rng, int n, int Vp) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; i++) tokens[i] = i % 2 == 0 ? rng.below(16) : rng.below(Vp);
  tokens[n - 1] = Vp - 1;  // the last row of the table
  return tokens;
}

TEST_F(CudaElementwise, EmbeddingForwardMatchesCpu) {
  for (const EmbeddingShape s :
       {EmbeddingShape{4, 64, 768, 4096, 128}, EmbeddingShape{3, 7, 35, 1000, 16}}) {
    const size_t BT = (size_t)s.B * s.T;
    Rng rng(501 + s.C);
    std::vector<int32_t> tokens = draw_tokens(rng, (int)BT, s.Vp);
    std::vector<float> wte = rng.uniform_vector((size_t)s.Vp * s.C, -1.0f, 1.0f);
    std::vector<float> wpe = rng.uniform_vector((size_t)s.maxT * s.C, -1.0f, 1.0f);
    std::vector<mp_bf16> wte_bits = round_to_bf16(wte), wpe_bits = round_to_bf16(wpe);
    DeviceArray<int32_t> d_tokens(BT);
    DeviceArray<mp_bf16> d_wte(wte.size()), d_wpe(wpe.size()), d_out(BT * s.C);
    d_tokens.upload(tokens);
    d_wte.upload(wte_bits);
    d_wpe.upload(wpe_bits);
    d_out.poison();
    ASSERT_TRUE(Synced());
    mp_embedding_forward_cuda(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), s.B, s.T, s.C,
                              stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> want(BT * s.C);
    mp_embedding_forward_cpu(want.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    expect_close("embedding_forward C=" + std::to_string(s.C), to_float(d_out.download()), want,
                 kBf16Tolerance);
  }
}

TEST_F(CudaElementwise, EmbeddingBackwardMatchesCpuAndIsDeterministic) {
  for (const EmbeddingShape s :
       {EmbeddingShape{4, 64, 768, 4096, 128}, EmbeddingShape{3, 7, 35, 1000, 16}}) {
    const size_t BT = (size_t)s.B * s.T;
    Rng rng(601 + s.C);
    std::vector<int32_t> tokens = draw_tokens(rng, (int)BT, s.Vp);
    std::vector<float> dout = rng.uniform_vector(BT * s.C, -1.0f, 1.0f);
    std::vector<mp_bf16> dout_bits = round_to_bf16(dout);
    // += onto nonzero gradients; rows no token uses must come back unchanged.
    std::vector<float> dwte = rng.uniform_vector((size_t)s.Vp * s.C, -0.5f, 0.5f);
    std::vector<float> dwpe = rng.uniform_vector((size_t)s.maxT * s.C, -0.5f, 0.5f);
    DeviceArray<int32_t> d_tokens(BT);
    DeviceArray<int32_t> d_workspace(mp_embedding_backward_cuda_workspace_ints(s.B, s.T));
    DeviceArray<mp_bf16> d_dout(BT * s.C);
    DeviceArray<float> d_dwte(dwte.size()), d_dwpe(dwpe.size());
    d_tokens.upload(tokens);
    d_dout.upload(dout_bits);
    std::vector<float> runs_wte[2], runs_wpe[2];
    for (int run = 0; run < 2; run++) {
      d_dwte.upload(dwte);
      d_dwpe.upload(dwpe);
      d_workspace.poison();
      ASSERT_TRUE(Synced());
      mp_embedding_backward_cuda(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(),
                                 tokens.data(), d_workspace.get(), s.B, s.T, s.C, stream_);
      ASSERT_TRUE(Synced());
      runs_wte[run] = d_dwte.download();
      runs_wpe[run] = d_dwpe.download();
    }
    mp_embedding_backward_cpu(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    const std::string shape = " C=" + std::to_string(s.C);
    expect_close("embedding_backward dwte" + shape, runs_wte[0], dwte, kFp32SameOrderTolerance);
    expect_close("embedding_backward dwpe" + shape, runs_wpe[0], dwpe, kFp32SameOrderTolerance);
    expect_same_bits("embedding_backward dwte", runs_wte[0], runs_wte[1]);
    expect_same_bits("embedding_backward dwpe", runs_wpe[0], runs_wpe[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// layernorm

struct LayernormShape {
  int B, T, C;
};

struct LayernormInputs {
  std::vector<float> inp, weight, bias;
  std::vector<mp_bf16> inp_bits, weight_bits, bias_bits;
};

LayernormInputs draw_layernorm(Rng &rng, const LayernormShape &s) {
  const size_t rows = (size_t)s.B * s.T;
  LayernormInputs in;
  in.inp = rng.uniform_vector(rows * s.C, -2.0f, 2.0f);
  for (size_t r = 0; r < rows; r++) {  // rows with their own offset, as activations have
    const float offset = rng.uniform(-1.0f, 1.0f);
    for (int c = 0; c < s.C; c++) in.inp[r * s.C + c] += offset;
  }
  in.weight = rng.uniform_vector(s.C, 0.5f, 1.5f);
  in.bias = rng.uniform_vector(s.C, -0.5f, 0.5f);
  in.inp_bits = round_to_bf16(in.inp);
  in.weight_bits = round_to_bf16(in.weight);
  in.bias_bits = round_to_bf16(in.bias);
  return in;
}

TEST_F(CudaElementwise, LayernormForwardMatchesCpu) {
  for (const LayernormShape s : {LayernormShape{4, 64, 768}, LayernormShape{3, 11, 37}}) {
    const size_t rows = (size_t)s.B * s.T, n = rows * s.C;
    Rng rng(701 + s.C);
    LayernormInputs in = draw_layernorm(rng, s);
    DeviceArray<mp_bf16> d_inp(n), d_weight(s.C), d_bias(s.C), d_out(n), d_out_no_stats(n);
    DeviceArray<float> d_mean(rows), d_rstd(rows);
    d_inp.upload(in.inp_bits);
    d_weight.upload(in.weight_bits);
    d_bias.upload(in.bias_bits);
    d_out.poison();
    d_out_no_stats.poison();
    d_mean.poison();
    d_rstd.poison();
    ASSERT_TRUE(Synced());
    mp_layernorm_forward_cuda(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(),
                              d_bias.get(), s.B, s.T, s.C, stream_);
    mp_layernorm_forward_cuda(d_out_no_stats.get(), NULL, NULL, d_inp.get(), d_weight.get(),
                              d_bias.get(), s.B, s.T, s.C, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> out(n), mean(rows), rstd(rows);
    mp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), in.inp.data(), in.weight.data(),
                             in.bias.data(), s.B, s.T, s.C);
    const std::string shape = " C=" + std::to_string(s.C);
    expect_close("layernorm_forward out" + shape, to_float(d_out.download()), out, kBf16Tolerance);
    expect_close("layernorm_forward mean" + shape, d_mean.download(), mean,
                 kFp32ReorderedTolerance);
    expect_close("layernorm_forward rstd" + shape, d_rstd.download(), rstd,
                 kFp32ReorderedTolerance);
    expect_same_bits("layernorm_forward without mean and rstd", d_out_no_stats.download(),
                     d_out.download());
  }
}

TEST_F(CudaElementwise, LayernormBackwardMatchesCpuAndIsDeterministic) {
  for (const LayernormShape s : {LayernormShape{4, 64, 768}, LayernormShape{3, 11, 37}}) {
    const size_t rows = (size_t)s.B * s.T, n = rows * s.C;
    Rng rng(801 + s.C);
    LayernormInputs in = draw_layernorm(rng, s);
    std::vector<float> out(n), mean(rows), rstd(rows);
    mp_layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), in.inp.data(), in.weight.data(),
                             in.bias.data(), s.B, s.T, s.C);
    std::vector<float> dout = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp = rng.uniform_vector(n, -0.1f, 0.1f);  // += onto these
    std::vector<float> dweight = rng.uniform_vector(s.C, -1.0f, 1.0f);
    std::vector<float> dbias = rng.uniform_vector(s.C, -1.0f, 1.0f);
    std::vector<mp_bf16> dout_bits = round_to_bf16(dout), dinp_bits = round_to_bf16(dinp);

    DeviceArray<mp_bf16> d_inp(n), d_weight(s.C), d_dout(n), d_dinp(n);
    DeviceArray<float> d_mean(rows), d_rstd(rows), d_dweight(s.C), d_dbias(s.C);
    DeviceArray<float> d_scratch(mp_layernorm_backward_cuda_scratch_floats(s.B, s.T, s.C));
    d_inp.upload(in.inp_bits);
    d_weight.upload(in.weight_bits);
    d_dout.upload(dout_bits);
    d_mean.upload(mean);  // the CPU forward's statistics, so only the backward is compared
    d_rstd.upload(rstd);
    std::vector<mp_bf16> runs_dinp[2];
    std::vector<float> runs_dweight[2], runs_dbias[2];
    for (int run = 0; run < 2; run++) {
      d_dinp.upload(dinp_bits);
      d_dweight.upload(dweight);
      d_dbias.upload(dbias);
      d_scratch.poison();  // must be written before it is read
      ASSERT_TRUE(Synced());
      mp_layernorm_backward_cuda(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(),
                                 d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(),
                                 d_scratch.get(), s.B, s.T, s.C, stream_);
      ASSERT_TRUE(Synced());
      runs_dinp[run] = d_dinp.download();
      runs_dweight[run] = d_dweight.download();
      runs_dbias[run] = d_dbias.download();
    }
    mp_layernorm_backward_cpu(dinp.data(), dweight.data(), dbias.data(), dout.data(), in.inp.data(),
                              in.weight.data(), mean.data(), rstd.data(), s.B, s.T, s.C);
    const std::string shape = " C=" + std::to_string(s.C);
    expect_close("layernorm_backward dinp" + shape, to_float(runs_dinp[0]), dinp, kBf16Tolerance);
    expect_close("layernorm_backward dweight" + shape, runs_dweight[0], dweight,
                 kFp32ReorderedTolerance);
    expect_close("layernorm_backward dbias" + shape, runs_dbias[0], dbias, kFp32ReorderedTolerance);
    expect_same_bits("layernorm_backward dinp", runs_dinp[0], runs_dinp[1]);
    expect_same_bits("layernorm_backward dweight", runs_dweight[0], runs_dweight[1]);
    expect_same_bits("layernorm_backward dbias", runs_dbias[0], runs_dbias[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

struct RmsnormShape {
  int rows, C;
  size_t offset;  // elements in front of every buffer: 1 takes the unaligned (scalar) path
  float eps;
};

// vectorised with 16 whole tiles; C neither a multiple of 8 nor of a warp, a partial last tile;
// one row wider than a warp's 256-channel stride; C a multiple of 8 but not of 256, a tile and
// one row; unaligned pointers with C % 8 == 0.
const RmsnormShape kRmsnormShapes[] = {
    {256, 768, 0, 1e-5f}, {33, 37, 0, 1e-6f}, {1, 4096, 0, 1e-5f},
    {17, 1000, 0, 1e-5f}, {5, 64, 1, 1e-5f},
};

std::string rmsnorm_name(const char *what, const RmsnormShape &s) {
  return std::string(what) + " rows=" + std::to_string(s.rows) + " C=" + std::to_string(s.C) +
         (s.offset ? " (unaligned)" : "");
}

struct RmsnormInputs {
  std::vector<float> inp, weight;
  std::vector<mp_bf16> inp_bits, weight_bits;
};

RmsnormInputs draw_rmsnorm(Rng &rng, const RmsnormShape &s) {
  RmsnormInputs in;
  in.inp = rng.uniform_vector((size_t)s.rows * s.C, -2.0f, 2.0f);
  for (int r = 0; r < s.rows; r++) {  // rows of their own magnitude, as activations have
    const float scale = rng.uniform(0.25f, 4.0f);
    for (int c = 0; c < s.C; c++) in.inp[(size_t)r * s.C + c] *= scale;
  }
  in.weight = rng.uniform_vector(s.C, 0.5f, 1.5f);
  in.inp_bits = round_to_bf16(in.inp);
  in.weight_bits = round_to_bf16(in.weight);
  return in;
}

TEST_F(CudaElementwise, RmsnormForwardMatchesCpu) {
  for (const RmsnormShape &s : kRmsnormShapes) {
    const size_t n = (size_t)s.rows * s.C;
    Rng rng(1401 + s.C);
    RmsnormInputs in = draw_rmsnorm(rng, s);
    DeviceArray<mp_bf16> d_inp(n, s.offset), d_weight(s.C, s.offset), d_out(n, s.offset);
    DeviceArray<mp_bf16> d_out_no_stats(n, s.offset);
    DeviceArray<float> d_rstd(s.rows);
    d_inp.upload(in.inp_bits);
    d_weight.upload(in.weight_bits);
    d_out.poison();
    d_out_no_stats.poison();
    d_rstd.poison();
    ASSERT_TRUE(Synced());
    mp_rmsnorm_forward_cuda(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), s.rows, s.C,
                            s.eps, stream_);
    mp_rmsnorm_forward_cuda(d_out_no_stats.get(), NULL, d_inp.get(), d_weight.get(), s.rows, s.C,
                            s.eps, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> out(n), rstd(s.rows);
    mp_rmsnorm_forward_cpu(out.data(), rstd.data(), in.inp.data(), in.weight.data(), s.rows, s.C,
                           s.eps);
    expect_close(rmsnorm_name("rmsnorm_forward out", s), to_float(d_out.download()), out,
                 kBf16Tolerance);
    expect_close(rmsnorm_name("rmsnorm_forward rstd", s), d_rstd.download(), rstd,
                 kFp32ReorderedTolerance);
    expect_same_bits("rmsnorm_forward without rstd", d_out_no_stats.download(), d_out.download());
  }
}

TEST_F(CudaElementwise, RmsnormBackwardMatchesCpuAndIsDeterministic) {
  for (const RmsnormShape &s : kRmsnormShapes) {
    const size_t n = (size_t)s.rows * s.C;
    Rng rng(1501 + s.C);
    RmsnormInputs in = draw_rmsnorm(rng, s);
    std::vector<float> out(n), rstd(s.rows);
    mp_rmsnorm_forward_cpu(out.data(), rstd.data(), in.inp.data(), in.weight.data(), s.rows, s.C,
                           s.eps);
    std::vector<float> dout = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp = rng.uniform_vector(n, -0.1f, 0.1f);  // += onto these
    std::vector<float> dweight = rng.uniform_vector(s.C, -1.0f, 1.0f);
    std::vector<mp_bf16> dout_bits = round_to_bf16(dout), dinp_bits = round_to_bf16(dinp);

    DeviceArray<mp_bf16> d_inp(n, s.offset), d_weight(s.C, s.offset), d_dout(n, s.offset);
    DeviceArray<mp_bf16> d_dinp(n, s.offset);
    DeviceArray<float> d_rstd(s.rows), d_dweight(s.C);
    const size_t scratch_floats = mp_rmsnorm_backward_cuda_scratch_floats(s.rows, s.C);
    ASSERT_EQ(scratch_floats, (size_t)(s.rows + 15) / 16 * s.C);
    DeviceArray<float> d_scratch(scratch_floats);
    d_inp.upload(in.inp_bits);
    d_weight.upload(in.weight_bits);
    d_dout.upload(dout_bits);
    d_rstd.upload(rstd);  // the CPU forward's statistics, so only the backward is compared
    std::vector<mp_bf16> runs_dinp[2];
    std::vector<float> runs_dweight[2];
    for (int run = 0; run < 2; run++) {
      d_dinp.upload(dinp_bits);
      d_dweight.upload(dweight);
      d_scratch.poison();  // must be written before it is read
      ASSERT_TRUE(Synced());
      mp_rmsnorm_backward_cuda(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(),
                               d_weight.get(), d_rstd.get(), d_scratch.get(), s.rows, s.C,
                               stream_);
      ASSERT_TRUE(Synced());
      runs_dinp[run] = d_dinp.download();
      runs_dweight[run] = d_dweight.download();
    }
    mp_rmsnorm_backward_cpu(dinp.data(), dweight.data(), dout.data(), in.inp.data(),
                            in.weight.data(), rstd.data(), s.rows, s.C);
    expect_close(rmsnorm_name("rmsnorm_backward dinp", s), to_float(runs_dinp[0]), dinp,
                 kBf16Tolerance);
    expect_close(rmsnorm_name("rmsnorm_backward dweight", s), runs_dweight[0], dweight,
                 kFp32ReorderedTolerance);
    expect_same_bits("rmsnorm_backward dinp", runs_dinp[0], runs_dinp[1]);
    expect_same_bits("rmsnorm_backward dweight", runs_dweight[0], runs_dweight[1]);
  }
  // An empty shape still asks for one float, and launches nothing.
  EXPECT_EQ(mp_rmsnorm_backward_cuda_scratch_floats(0, 768), size_t{1});
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

struct SwigluShape {
  int N, F;
  size_t offset;  // elements in front of every buffer: 1 takes the unaligned (scalar) path
};

// vectorised; odd F; one row of odd F; unaligned pointers with F % 8 == 0.
const SwigluShape kSwigluShapes[] = {{256, 1024, 0}, {7, 37, 0}, {1, 5, 0}, {64, 344, 1}};

std::string swiglu_name(const char *what, const SwigluShape &s) {
  return std::string(what) + " N=" + std::to_string(s.N) + " F=" + std::to_string(s.F) +
         (s.offset ? " (unaligned)" : "");
}

// [gate | up] rows: gates far enough out that the sigmoid saturates on both sides.
std::vector<float> draw_swiglu_input(Rng &rng, const SwigluShape &s) {
  std::vector<float> inp((size_t)s.N * 2 * s.F);
  for (int n = 0; n < s.N; n++) {
    for (int f = 0; f < 2 * s.F; f++) {
      inp[(size_t)n * 2 * s.F + f] = f < s.F ? rng.uniform(-8.0f, 8.0f) : rng.uniform(-2.0f, 2.0f);
    }
  }
  return inp;
}

TEST_F(CudaElementwise, SwigluForwardMatchesCpu) {
  for (const SwigluShape &s : kSwigluShapes) {
    const size_t n = (size_t)s.N * s.F;
    Rng rng(1601 + s.F);
    std::vector<float> inp = draw_swiglu_input(rng, s);
    std::vector<mp_bf16> inp_bits = round_to_bf16(inp);
    DeviceArray<mp_bf16> d_inp(2 * n, s.offset), d_out(n, s.offset);
    d_inp.upload(inp_bits);
    d_out.poison();
    ASSERT_TRUE(Synced());
    mp_swiglu_forward_cuda(d_out.get(), d_inp.get(), s.N, s.F, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> want(n);
    mp_swiglu_forward_cpu(want.data(), inp.data(), s.N, s.F);
    expect_close(swiglu_name("swiglu_forward", s), to_float(d_out.download()), want,
                 kBf16Tolerance);
  }
}

TEST_F(CudaElementwise, SwigluBackwardMatchesCpuAndIsDeterministic) {
  for (const SwigluShape &s : kSwigluShapes) {
    const size_t n = (size_t)s.N * s.F;
    Rng rng(1701 + s.F);
    std::vector<float> inp = draw_swiglu_input(rng, s);
    std::vector<float> dout = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> dinp = rng.uniform_vector(2 * n, -0.25f, 0.25f);  // += onto these
    std::vector<mp_bf16> inp_bits = round_to_bf16(inp), dout_bits = round_to_bf16(dout);
    std::vector<mp_bf16> dinp_bits = round_to_bf16(dinp);
    DeviceArray<mp_bf16> d_inp(2 * n, s.offset), d_dout(n, s.offset), d_dinp(2 * n, s.offset);
    d_inp.upload(inp_bits);
    d_dout.upload(dout_bits);
    std::vector<mp_bf16> runs[2];
    for (auto &run : runs) {
      d_dinp.upload(dinp_bits);
      ASSERT_TRUE(Synced());
      mp_swiglu_backward_cuda(d_dinp.get(), d_inp.get(), d_dout.get(), s.N, s.F, stream_);
      ASSERT_TRUE(Synced());
      run = d_dinp.download();
    }
    mp_swiglu_backward_cpu(dinp.data(), inp.data(), dout.data(), s.N, s.F);
    // The gate and up halves apart: each is held to its own largest value.
    std::vector<float> gpu = to_float(runs[0]);
    std::vector<float> gpu_gate, gpu_up, cpu_gate, cpu_up;
    for (size_t i = 0; i < 2 * n; i++) {
      const bool gate = (int)(i % (2 * (size_t)s.F)) < s.F;
      (gate ? gpu_gate : gpu_up).push_back(gpu[i]);
      (gate ? cpu_gate : cpu_up).push_back(dinp[i]);
    }
    expect_close(swiglu_name("swiglu_backward dgate", s), gpu_gate, cpu_gate, kBf16Tolerance);
    expect_close(swiglu_name("swiglu_backward dup", s), gpu_up, cpu_up, kBf16Tolerance);
    expect_same_bits("swiglu_backward", runs[0], runs[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// rotary embeddings

struct RopeShape {
  int B, T, heads, HS;
  size_t row_stride;
  size_t first;  // where the rotated heads start in each row (the k part of qkv: NH * HS)
  mp_rope_spec spec;
};

constexpr mp_rope_spec kLlama31Rope = {500000.0, true, 8.0, 1.0, 4.0, 8192.0};
constexpr mp_rope_spec kLlama2Rope = {10000.0, false, 0.0, 0.0, 0.0, 0.0};

// q, then k, of a grouped-query qkv row (8 query and 2 kv heads of 64: W = 768) under Llama
// 3.1's scaled frequencies; positions to 4095 with HS 128 and a row wider than the heads; HS / 2
// odd and an odd row stride (scalar path); one row (position 0 turns by 0: the heads keep their
// bits); heads starting one element into the row (unaligned: scalar path with HS / 2 % 8 == 0).
const RopeShape kRopeShapes[] = {
    {2, 64, 8, 64, 768, 0, kLlama31Rope},   {2, 64, 2, 64, 768, 512, kLlama31Rope},
    {1, 4096, 2, 128, 280, 0, kLlama31Rope}, {3, 7, 3, 6, 23, 0, kLlama2Rope},
    {1, 1, 4, 16, 64, 0, kLlama2Rope},       {2, 16, 4, 32, 136, 1, kLlama2Rope},
};

std::string rope_name(const char *what, const RopeShape &s) {
  return std::string(what) + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " heads=" + std::to_string(s.heads) + " HS=" + std::to_string(s.HS) +
         " row_stride=" + std::to_string(s.row_stride) + " first=" + std::to_string(s.first);
}

// Every element of x (B * T rows of row_stride) outside the rotated heads: they must keep their
// bits.
template <typename T>
std::vector<T> outside_heads(const std::vector<T> &x, const RopeShape &s) {
  std::vector<T> rest;
  for (size_t i = 0; i < x.size(); i++) {
    const size_t column = i % s.row_stride;
    if (column < s.first || column >= s.first + (size_t)s.heads * s.HS) rest.push_back(x[i]);
  }
  return rest;
}

// Runs the forward (backward false) or backward twin on a random (B, T, row_stride) tensor and
// compares it with the CPU twin; the backward runs twice from the same state.
void check_rope(const RopeShape &s, bool backward, mp_cuda_stream stream, bool (*synced)()) {
  const size_t n = (size_t)s.B * s.T * s.row_stride;
  const int half = s.HS / 2;
  Rng rng(1801 + s.HS + s.first + (backward ? 7 : 0));
  std::vector<float> inv_freq(half);
  mp_rope_inv_freq(inv_freq.data(), s.HS, &s.spec);
  std::vector<float> x = rng.uniform_vector(n, -2.0f, 2.0f);
  const std::vector<mp_bf16> x_bits = round_to_bf16(x);
  DeviceArray<float> d_inv_freq(half);
  DeviceArray<mp_bf16> d_x(n);
  d_inv_freq.upload(inv_freq);
  std::vector<mp_bf16> runs[2];
  for (int run = 0; run < (backward ? 2 : 1); run++) {
    d_x.upload(x_bits);
    ASSERT_TRUE(synced());
    if (backward) {
      mp_rope_backward_cuda(d_x.get() + s.first, d_inv_freq.get(), s.B, s.T, s.heads, s.HS,
                            s.row_stride, stream);
    } else {
      mp_rope_forward_cuda(d_x.get() + s.first, d_inv_freq.get(), s.B, s.T, s.heads, s.HS,
                           s.row_stride, stream);
    }
    ASSERT_TRUE(synced());
    runs[run] = d_x.download();
  }
  if (backward) {
    mp_rope_backward_cpu(x.data() + s.first, inv_freq.data(), s.B, s.T, s.heads, s.HS,
                         s.row_stride);
  } else {
    mp_rope_forward_cpu(x.data() + s.first, inv_freq.data(), s.B, s.T, s.heads, s.HS,
                        s.row_stride);
  }
  const char *what = backward ? "rope_backward" : "rope_forward";
  expect_close(rope_name(what, s), to_float(runs[0]), x, kBf16Tolerance);
  expect_same_bits(std::string(what) + ": the rest of each row", outside_heads(runs[0], s),
                   outside_heads(x_bits, s));
  if (s.B * s.T == 1) expect_same_bits(std::string(what) + " at position 0", runs[0], x_bits);
  if (backward) expect_same_bits(what, runs[0], runs[1]);
}

TEST_F(CudaElementwise, RopeForwardMatchesCpu) {
  for (const RopeShape &s : kRopeShapes) check_rope(s, false, stream_, &Synced);
}

TEST_F(CudaElementwise, RopeBackwardMatchesCpuAndIsDeterministic) {
  for (const RopeShape &s : kRopeShapes) check_rope(s, true, stream_, &Synced);
}

// ---------------------------------------------------------------------------------------------
// fused softmax + cross-entropy

struct CrossEntropyShape {
  int B, T, V, Vp;
};

TEST_F(CudaElementwise, CrossEntropyFusedMatchesCpuAndIsDeterministic) {
  for (const CrossEntropyShape s :
       {CrossEntropyShape{4, 64, 50257, 50304}, CrossEntropyShape{3, 5, 1000, 1003}}) {
    const size_t rows = (size_t)s.B * s.T, n = rows * s.Vp;
    const float dloss = 0.5f;  // as with two accumulated micro-batches
    Rng rng(901 + s.V);
    std::vector<int32_t> targets(rows);
    for (int32_t &t : targets) t = rng.below(s.V);
    targets[0] = s.V - 1;  // the last real column
    std::vector<float> logits = rng.uniform_vector(n, -4.0f, 4.0f);
    for (size_t r = 0; r < rows; r++) {
      // A confident column per row (the target in every third row), so large probabilities and
      // the onehot term are both exercised.
      const int peak = r % 3 == 0 ? targets[r] : rng.below(s.V);
      logits[r * s.Vp + peak] += 12.0f;
    }
    std::vector<mp_bf16> logits_bits = round_to_bf16(logits);
    for (size_t r = 0; r < rows; r++) {
      // Padding holds NaN bits on the device: it must take no part and come back as 0.
      for (int i = s.V; i < s.Vp; i++) logits_bits[r * s.Vp + i] = 0xffff;
    }

    DeviceArray<mp_bf16> d_logits(n);
    DeviceArray<int32_t> d_targets(rows);
    DeviceArray<float> d_losses(rows);
    d_targets.upload(targets);
    std::vector<mp_bf16> runs_dlogits[2];
    std::vector<float> runs_losses[2];
    for (int run = 0; run < 2; run++) {
      d_logits.upload(logits_bits);
      d_losses.poison();
      ASSERT_TRUE(Synced());
      mp_cross_entropy_fused_cuda(d_losses.get(), d_logits.get(), d_targets.get(), dloss, s.B, s.T,
                                  s.V, s.Vp, stream_);
      ASSERT_TRUE(Synced());
      runs_dlogits[run] = d_logits.download();
      runs_losses[run] = d_losses.download();
    }

    std::vector<float> losses(rows), probs(n), dlogits(n, 0.0f);
    mp_cross_entropy_forward_cpu(losses.data(), probs.data(), logits.data(), targets.data(), s.B,
                                 s.T, s.V, s.Vp);
    mp_cross_entropy_backward_cpu(dlogits.data(), probs.data(), targets.data(), dloss, s.B, s.T,
                                  s.V, s.Vp);
    const std::string shape = " V=" + std::to_string(s.V) + " Vp=" + std::to_string(s.Vp);
    expect_close("cross_entropy_fused losses" + shape, runs_losses[0], losses, kLossTolerance);
    expect_close("cross_entropy_fused dlogits" + shape, to_float(runs_dlogits[0]), dlogits,
                 kBf16Tolerance);
    expect_same_bits("cross_entropy_fused losses", runs_losses[0], runs_losses[1]);
    expect_same_bits("cross_entropy_fused dlogits", runs_dlogits[0], runs_dlogits[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// optimizer: AdamW, gradient norm, gradient scale, float -> bf16

TEST_F(CudaElementwise, AdamwUpdateMatchesCpu) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  const int t = 3;
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(1001 + n);
    std::vector<float> params = rng.uniform_vector(n, -1.0f, 1.0f);
    std::vector<float> grads = rng.uniform_vector(n, -0.01f, 0.01f);
    std::vector<float> m = rng.uniform_vector(n, -1e-3f, 1e-3f);
    std::vector<float> v = rng.uniform_vector(n, 0.0f, 1e-5f);
    const std::vector<float> params_before = params;
    DeviceArray<float> d_params(n), d_params_again(n), d_grads(n), d_m(n), d_v(n);
    DeviceArray<float> d_m_again(n), d_v_again(n);
    DeviceArray<mp_bf16> d_params_bf16(n);
    d_params.upload(params);
    d_params_again.upload(params);
    d_grads.upload(grads);
    d_m.upload(m);
    d_v.upload(v);
    d_m_again.upload(m);
    d_v_again.upload(v);
    d_params_bf16.poison();
    ASSERT_TRUE(Synced());
    mp_adamw_update_cuda(d_params.get(), d_params_bf16.get(), d_grads.get(), d_m.get(), d_v.get(),
                         n, lr, beta1, beta2, eps, weight_decay, t, stream_);
    // Without the bf16 copy: the same master weights.
    mp_adamw_update_cuda(d_params_again.get(), NULL, d_grads.get(), d_m_again.get(),
                         d_v_again.get(), n, lr, beta1, beta2, eps, weight_decay, t, stream_);
    ASSERT_TRUE(Synced());
    std::vector<float> gpu_params = d_params.download();

    mp_adamw_update_cpu(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps,
                        weight_decay, t);
    expect_close(size_name("adamw_update params", n), gpu_params, params, kFp32SameOrderTolerance);
    expect_close(size_name("adamw_update m", n), d_m.download(), m, kFp32SameOrderTolerance);
    expect_close(size_name("adamw_update v", n), d_v.download(), v, kFp32SameOrderTolerance);
    // The update itself (about lr in size, far below the weights) to 1e-3 of its largest value:
    // one fp32 ulp of a weight near 1 is 1.2e-4 of an update of 1e-3.
    std::vector<float> gpu_delta(n), cpu_delta(n);
    for (size_t i = 0; i < n; i++) {
      gpu_delta[i] = gpu_params[i] - params_before[i];
      cpu_delta[i] = params[i] - params_before[i];
    }
    expect_close(size_name("adamw_update delta", n), gpu_delta, cpu_delta, 1e-3);
    expect_close(size_name("adamw_update params_bf16", n), to_float(d_params_bf16.download()),
                 params, kBf16Tolerance);
    expect_same_bits("adamw_update with and without params_bf16", d_params_again.download(),
                     gpu_params);
  }
}

TEST_F(CudaElementwise, GradNormSquaredMatchesCpuAndIsDeterministic) {
  for (const size_t n : {size_t{1} << 20, size_t{1000003}, size_t{1}}) {
    Rng rng(1101 + n);
    std::vector<float> grads = rng.uniform_vector(n, -1.0f, 1.0f);
    DeviceArray<float> d_grads(n), d_scratch(mp_grad_norm_cuda_scratch_floats(n));
    d_grads.upload(grads);
    d_scratch.poison();
    ASSERT_TRUE(Synced());
    double runs[2];
    for (double &run : runs) {
      mp_error err = MP_ERROR_INITIALIZER;
      run = -1.0;
      ASSERT_EQ(mp_grad_norm_squared_cuda(d_grads.get(), n, d_scratch.get(), &run, stream_, &err),
                MP_OK)
          << err.message;
    }
    const double want = mp_grad_norm_squared_cpu(grads.data(), n);
    const double err = std::fabs(runs[0] - want) / want;
    printf("kernel %s: max rel err %.3g (tolerance %.3g)\n",
           size_name("grad_norm_squared", n).c_str(), err, kDoubleTolerance);
    EXPECT_LE(err, kDoubleTolerance);
    EXPECT_EQ(0, memcmp(&runs[0], &runs[1], sizeof(double)))
        << "grad_norm_squared: two runs gave " << runs[0] << " and " << runs[1];
  }
  // n == 0 is 0 and launches nothing.
  mp_error err = MP_ERROR_INITIALIZER;
  double zero = -1.0;
  ASSERT_EQ(mp_grad_norm_squared_cuda(NULL, 0, NULL, &zero, stream_, &err), MP_OK) << err.message;
  EXPECT_EQ(zero, 0.0);
}

TEST_F(CudaElementwise, GradScaleMatchesCpu) {
  const float scale = 0.37f;
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(1201 + n);
    std::vector<float> grads = rng.uniform_vector(n, -2.0f, 2.0f);
    DeviceArray<float> d_grads(n);
    d_grads.upload(grads);
    ASSERT_TRUE(Synced());
    mp_grad_scale_cuda(d_grads.get(), n, scale, stream_);
    ASSERT_TRUE(Synced());
    mp_grad_scale_cpu(grads.data(), n, scale);
    expect_close(size_name("grad_scale", n), d_grads.download(), grads, 0.0);
  }
}

TEST_F(CudaElementwise, Bf16FromFloatMatchesHost) {
  for (const size_t n : {size_t{1} << 20, size_t{1000003}}) {
    Rng rng(1301 + n);
    std::vector<float> values = rng.uniform_vector(n, -3.0f, 3.0f);
    for (size_t i = 0; i < n; i += 97) values[i] *= 1e30f;  // large magnitudes round too
    DeviceArray<float> d_values(n);
    DeviceArray<mp_bf16> d_out(n);
    d_values.upload(values);
    d_out.poison();
    ASSERT_TRUE(Synced());
    mp_bf16_from_float_cuda(d_out.get(), d_values.get(), n, stream_);
    ASSERT_TRUE(Synced());
    const std::vector<mp_bf16> want = to_bf16(values);
    const std::vector<mp_bf16> got = d_out.download();
    expect_close(size_name("bf16_from_float", n), to_float(got), to_float(want), 0.0);
    expect_same_bits("bf16_from_float against mp_bf16_from_floats", got, want);
  }
}

// NaNs (either sign, quiet or signalling, any payload), infinities, zeros, ties and overflow:
// the device's rounding gives the host's bits (common/float16.h: a NaN becomes sign | 0x7fc0).
TEST_F(CudaElementwise, Bf16FromFloatSpecialsMatchHost) {
  const uint32_t patterns[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu,
                               0xffffffffu, 0x7fa5a5a5u, 0x7f800000u, 0xff800000u, 0x00000000u,
                               0x80000000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu,
                               0x00000001u, 0x807fffffu};
  const size_t n = sizeof patterns / sizeof patterns[0];
  std::vector<float> values(n);
  for (size_t i = 0; i < n; i++) std::memcpy(&values[i], &patterns[i], sizeof(float));
  DeviceArray<float> d_values(n);
  DeviceArray<mp_bf16> d_out(n);
  d_values.upload(values);
  d_out.poison();
  ASSERT_TRUE(Synced());
  mp_bf16_from_float_cuda(d_out.get(), d_values.get(), n, stream_);
  ASSERT_TRUE(Synced());
  const std::vector<mp_bf16> got = d_out.download();
  expect_same_bits("bf16_from_float specials against mp_bf16_from_floats", got, to_bf16(values));
  EXPECT_EQ(got[0], 0x7fc0);
  EXPECT_EQ(got[1], 0xffc0);
}

}  // namespace
