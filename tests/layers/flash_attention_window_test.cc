// tests/layers/flash_attention_window_test.cc — the fused attention's windows
// (layers/attention.h, mp_attention_window), what context parallelism runs on the GPU: every cp
// rank's two chunks of queries (context_parallel/sequence_split.h's load-balanced layout) against
// the gathered sequence, held to the reference attention on the WHOLE sequence (the CPU twin, on
// the same bf16-rounded inputs):
//   - each window's out and lse rows equal the whole sequence's rows at its positions;
//   - each rank's backward (its two windows, its tokens' output gradients only) gives its
//     queries' gradient, and the sum over the cp ranks of their key and value gradients is the
//     whole sequence's;
//   - the whole-sequence window is the plain call, bit for bit.
// At cp 2, 3 and 4, with multi-head, grouped-query and multi-query heads, chunks that are a
// multiple of the 64-row tiles and chunks that are not.
//
// It runs on a GPU (tools/device_check.sh) and under emulated CUDA (tools/test.sh), where the
// fused attention is its fp32 contract: there it checks the windows' bookkeeping, on a GPU the
// kernels. Tolerances as flash_attention_test.cc: 2e-2 for bf16 outputs, 1e-3 for lse; the key
// and value gradients are sums of 2 cp bf16 roundings, still far inside 2e-2.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "context_parallel/sequence_split.h"
#include "layers/attention.h"
#include "layers/cuda_types.h"
#include "tests/layers/cuda_testing.h"
#include "tests/layers/finite_difference.h"

namespace {

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h

constexpr double kBf16Tolerance = 2e-2;
constexpr double kLseTolerance = 1e-3;
constexpr int kPoisonByte = 0xFF;  // NaN in bf16 and fp32: a row never written fails

struct WindowShape {
  int B, T, NH, KVH, HS, cp;
};

std::string Describe(const WindowShape &s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " KVH=" + std::to_string(s.KVH) + " HS=" + std::to_string(s.HS) +
         " cp=" + std::to_string(s.cp);
}

// The whole sequence on the CPU: out, lse and the gradient of qkv.
struct Reference {
  explicit Reference(const WindowShape &s)
      : B(s.B), T(s.T), NH(s.NH), KVH(s.KVH), HS(s.HS), C(s.NH * s.HS),
        W((s.NH + 2 * s.KVH) * s.HS) {
    Rng rng(4100 + B + T + NH + KVH + HS + s.cp);
    qkv = RoundToBf16(rng.uniform_vector((size_t)B * T * W, -1.5f, 1.5f));
    dout = RoundToBf16(rng.uniform_vector((size_t)B * T * C, -1.0f, 1.0f));
    out.resize((size_t)B * T * C);
    std::vector<float> preatt((size_t)B * NH * T * T), att(preatt.size());
    mp_attention_forward_cpu(out.data(), preatt.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
    lse.resize((size_t)B * NH * T);
    for (size_t row = 0; row < lse.size(); row++) {
      const int t = (int)(row % T);
      double max = -INFINITY, sum = 0.0;
      for (int t2 = 0; t2 <= t; t2++) max = std::fmax(max, preatt[row * T + t2]);
      for (int t2 = 0; t2 <= t; t2++) sum += std::exp((double)preatt[row * T + t2] - max);
      lse[row] = (float)(max + std::log(sum));
    }
    dqkv.assign(qkv.size(), 0.0f);
    std::vector<float> dpreatt(att.size()), datt(att.size());
    mp_attention_backward_cpu(dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(),
                              att.data(), B, T, NH, KVH, HS);
  }
  int B, T, NH, KVH, HS, C, W;
  std::vector<float> qkv, dout, out, lse, dqkv;  // (B,T,W) (B,T,C) (B,T,C) (B,NH,T) (B,T,W)
};

// Rows of a (B, rows_per_seq, width) tensor at the given positions of each sequence.
std::vector<float> Rows(const std::vector<float> &all, int B, int rows_per_seq, size_t width,
                        const std::vector<int32_t> &positions) {
  std::vector<float> picked;
  for (int b = 0; b < B; b++) {
    for (int32_t p : positions) {
      const float *row = &all[((size_t)b * rows_per_seq + p) * width];
      picked.insert(picked.end(), row, row + width);
    }
  }
  return picked;
}

// lse (B, NH, T) entries at the positions, as (B, NH, positions).
std::vector<float> LseRows(const std::vector<float> &lse, int B, int NH, int T,
                           const std::vector<int32_t> &positions) {
  std::vector<float> picked;
  for (int bh = 0; bh < B * NH; bh++) {
    for (int32_t p : positions) picked.push_back(lse[(size_t)bh * T + p]);
  }
  return picked;
}

class FlashWindow : public ::testing::TestWithParam<WindowShape> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (!mp_flash_attention_supported(GetParam().HS)) GTEST_SKIP() << "not a fused head size";
  }
};

TEST_P(FlashWindow, EveryRanksChunksEqualTheWholeSequence) {
  const WindowShape s = GetParam();
  const Reference ref(s);
  const std::string tag = Describe(s);
  const int local = s.T / s.cp, chunk = local / 2;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *qkv = gpu.Upload(ToBf16(ref.qkv));  // the gathered sequence, as every rank holds it
  mp_bf16 *dkv_sum = gpu.Alloc<mp_bf16>(ref.qkv.size());  // every rank's += : the group's sum
  std::vector<float> dq_of_ranks(ref.qkv.size(), 0.0f);
  for (int rank = 0; rank < s.cp; rank++) {
    std::vector<int32_t> positions(local);
    mp_cp_positions(positions.data(), s.T, s.cp, rank);
    const std::string who = tag + " rank " + std::to_string(rank);
    mp_bf16 *out = gpu.Alloc<mp_bf16>((size_t)s.B * local * ref.C, kPoisonByte);
    float *lse = gpu.Alloc<float>((size_t)s.B * s.NH * local, kPoisonByte);
    mp_bf16 *dout = gpu.Upload(ToBf16(Rows(ref.dout, s.B, s.T, ref.C, positions)));
    mp_bf16 *dkv = gpu.Alloc<mp_bf16>(ref.qkv.size());
    char *scratch = gpu.Alloc<char>(mp_flash_attention_scratch_bytes(s.B, local, s.NH, s.HS),
                                    kPoisonByte);
    gpu.Sync();
    for (int j = 0; j < 2; j++) {
      const mp_attention_window w = {positions[(size_t)j * chunk], chunk, local, j * chunk};
      mp_flash_attention_forward_window_cuda(out, lse, qkv, s.B, s.T, s.NH, s.KVH, s.HS, w,
                                             gpu.stream);
    }
    for (int j = 0; j < 2; j++) {
      const mp_attention_window w = {positions[(size_t)j * chunk], chunk, local, j * chunk};
      mp_flash_attention_backward_window_cuda(dkv, dout, qkv, out, lse, scratch, s.B, s.T, s.NH,
                                              s.KVH, s.HS, w, gpu.stream);
      mp_flash_attention_backward_window_cuda(dkv_sum, dout, qkv, out, lse, scratch, s.B, s.T,
                                              s.NH, s.KVH, s.HS, w, gpu.stream);
    }
    gpu.Sync();
    const std::vector<float> got_out = gpu.DownloadBf16(out, (size_t)s.B * local * ref.C);
    const std::vector<float> got_lse = gpu.Download(lse, (size_t)s.B * s.NH * local);
    const std::vector<float> got_dkv = gpu.DownloadBf16(dkv, ref.qkv.size());
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    EXPECT_TRUE(WithinTolerance("flash_window out " + who, got_out,
                                Rows(ref.out, s.B, s.T, ref.C, positions), kBf16Tolerance));
    EXPECT_TRUE(WithinTolerance("flash_window lse " + who, got_lse,
                                LseRows(ref.lse, s.B, s.NH, s.T, positions), kLseTolerance));
    // Its queries' gradient is whole on this rank; other tokens' query rows stay untouched.
    const std::vector<float> dq = QkvPart(got_dkv, 0, s.B * s.T, s.NH, s.KVH, s.HS);
    EXPECT_TRUE(WithinTolerance("flash_window dq " + who, Rows(dq, s.B, s.T, ref.C, positions),
                                Rows(QkvPart(ref.dqkv, 0, s.B * s.T, s.NH, s.KVH, s.HS), s.B,
                                     s.T, ref.C, positions),
                                kBf16Tolerance));
    double others = 0.0;
    std::vector<bool> mine((size_t)s.T, false);
    for (int32_t p : positions) mine[(size_t)p] = true;
    for (int b = 0; b < s.B; b++) {
      for (int t = 0; t < s.T; t++) {
        if (mine[(size_t)t]) continue;
        for (int c = 0; c < ref.C; c++) others += std::fabs(dq[((size_t)b * s.T + t) * ref.C + c]);
      }
    }
    EXPECT_EQ(others, 0.0) << "a window wrote query gradients of another rank's tokens " << who;
  }
  const std::vector<float> sum = gpu.DownloadBf16(dkv_sum, ref.qkv.size());
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const char *names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; part++) {
    EXPECT_TRUE(WithinTolerance(std::string("flash_window sum over ranks ") + names[part] + " " +
                                    tag,
                                QkvPart(sum, part, s.B * s.T, s.NH, s.KVH, s.HS),
                                QkvPart(ref.dqkv, part, s.B * s.T, s.NH, s.KVH, s.HS),
                                kBf16Tolerance));
  }
}

TEST_P(FlashWindow, WholeSequenceWindowIsThePlainCall) {
  const WindowShape s = GetParam();
  const Reference ref(s);
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *qkv = gpu.Upload(ToBf16(ref.qkv));
  mp_bf16 *dout = gpu.Upload(ToBf16(ref.dout));
  mp_bf16 *out[2] = {gpu.Alloc<mp_bf16>(ref.out.size()), gpu.Alloc<mp_bf16>(ref.out.size())};
  float *lse[2] = {gpu.Alloc<float>(ref.lse.size()), gpu.Alloc<float>(ref.lse.size())};
  mp_bf16 *dqkv[2] = {gpu.Alloc<mp_bf16>(ref.qkv.size()), gpu.Alloc<mp_bf16>(ref.qkv.size())};
  char *scratch = gpu.Alloc<char>(mp_flash_attention_scratch_bytes(s.B, s.T, s.NH, s.HS));
  gpu.Sync();
  mp_flash_attention_forward_cuda(out[0], lse[0], qkv, s.B, s.T, s.NH, s.KVH, s.HS, gpu.stream);
  mp_flash_attention_backward_cuda(dqkv[0], dout, qkv, out[0], lse[0], scratch, s.B, s.T, s.NH,
                                   s.KVH, s.HS, gpu.stream);
  const mp_attention_window whole = mp_attention_whole_sequence(s.T);
  mp_flash_attention_forward_window_cuda(out[1], lse[1], qkv, s.B, s.T, s.NH, s.KVH, s.HS, whole,
                                         gpu.stream);
  mp_flash_attention_backward_window_cuda(dqkv[1], dout, qkv, out[0], lse[0], scratch, s.B, s.T,
                                          s.NH, s.KVH, s.HS, whole, gpu.stream);
  gpu.Sync();
  EXPECT_TRUE(BitwiseEqual(gpu.Download(out[0], ref.out.size()),
                           gpu.Download(out[1], ref.out.size())));
  EXPECT_TRUE(BitwiseEqual(gpu.Download(lse[0], ref.lse.size()),
                           gpu.Download(lse[1], ref.lse.size())));
  EXPECT_TRUE(BitwiseEqual(gpu.Download(dqkv[0], ref.qkv.size()),
                           gpu.Download(dqkv[1], ref.qkv.size())));
  ASSERT_TRUE(gpu.ok()) << gpu.error();
}

TEST(FlashWindowLaunch, WindowsOutsideTheBuffersAreNoOps) {
  SKIP_WITHOUT_GPU();
  const int B = 1, T = 16, NH = 2, HS = 32, C = NH * HS;
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  mp_bf16 *qkv = gpu.Alloc<mp_bf16>((size_t)B * T * 3 * C);
  mp_bf16 *out = gpu.Alloc<mp_bf16>((size_t)B * T * C, kPoisonByte);
  float *lse = gpu.Alloc<float>((size_t)B * NH * T, kPoisonByte);
  gpu.Sync();
  const mp_attention_window bad[] = {{-1, 4, T, 0}, {8, 9, T, 0}, {0, 4, 4, 1}, {0, 0, T, 0}};
  for (const mp_attention_window &w : bad) {
    mp_flash_attention_forward_window_cuda(out, lse, qkv, B, T, NH, NH, HS, w, gpu.stream);
  }
  gpu.Sync();
  const std::vector<mp_bf16> bits = gpu.Download(out, (size_t)B * T * C);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  EXPECT_TRUE(BitwiseEqual(bits, std::vector<mp_bf16>(bits.size(), 0xFFFF)));
}

// cp 2, 3, 4; multi-head, grouped (4 and 2 per kv head) and multi-query; chunks of 64 rows (the
// tiles) and of 50, 32, 25 and 16 (not whole tiles, windows starting inside a tile).
INSTANTIATE_TEST_SUITE_P(Windows, FlashWindow,
                         ::testing::Values(WindowShape{2, 256, 4, 4, 64, 2},
                                           WindowShape{2, 200, 4, 4, 32, 2},
                                           WindowShape{1, 192, 8, 2, 64, 3},
                                           WindowShape{1, 200, 4, 2, 128, 4},
                                           WindowShape{2, 128, 4, 1, 32, 4},
                                           WindowShape{1, 512, 8, 2, 64, 4}),
                         [](const ::testing::TestParamInfo<WindowShape> &info) {
                           const WindowShape &s = info.param;
                           return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) +
                                  "_NH" + std::to_string(s.NH) + "_KVH" + std::to_string(s.KVH) +
                                  "_HS" + std::to_string(s.HS) + "_cp" + std::to_string(s.cp);
                         });

}  // namespace
