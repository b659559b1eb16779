// tests/layers/cuda_tensor_parallel_test.cc — the tensor-parallel CUDA kernels
// (//layers:cuda_tensor_parallel) against plain CPU references written here, and the
// vocabulary-parallel cross-entropy, split over 2 and 3 ranks, against the one-rank fused kernel
// mp_cross_entropy_fused_cuda on the unsplit logits.
//
// Shapes are small and odd (BT = 37, C = 40 and 37, Vl = 50 and 48, ranks = 3, V leaving padding
// in the last rank, and one layout where a whole rank is padding), so both the 128-bit and the
// one-value paths run, and so do the ragged ends. "Ranks" are simulated in one process: each
// rank's shard is its own device buffer, and the collectives are done by hand (phase 1 writes
// straight into its slot of the gathered maxima; the stats are summed on the host in rank order,
// as the all-reduce would).
//
// Inputs are drawn with a fixed seed and rounded to bf16 on the host, so the references see
// exactly the values the GPU reads. Written outputs are filled with NaN bits first, so an element
// a kernel skips fails; padding logits hold NaN bits or +100, so a kernel that reads them fails.
// Each comparison prints "kernel <name>: max rel err <x> (tolerance <y>)", with
// max rel err = ||gpu - cpu||_inf / ||cpu||_inf (a NaN or infinity on the GPU fails).
//
// Tolerances:
//   0 (and bitwise) for widening, copies, max and single fp32 additions (with or without one
//     rounding to bf16): each is one correctly rounded operation on both sides.
//   1e-2 for bf16 outputs computed through exp (the gradient over the logits): one rounding to
//     bf16 is up to 2^-9 of the element, on fp32 math that differs only in order.
//   1e-5 for fp32 sums of exponentials and the losses: at most 50 terms in another order, and
//     expf within 2 ulp.
//   5e-5 for the split losses against the fused kernel's (fp32 sums over the whole row in two
//     different trees).
//
// Every test first looks for a GPU and, without one, reports itself skipped by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/device/device.h"
#include "layers/cross_entropy.h"
#include "layers/cuda_types.h"
#include "layers/tensor_parallel_cuda.h"
#include "tests/layers/cuda_testing.h"
#include "tests/layers/finite_difference.h"

namespace {

using namespace mp_test;  // NOLINT: the shared GPU test helpers of cuda_testing.h

constexpr double kExact = 0.0;
constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp32ReorderedTolerance = 1e-5;
constexpr double kSplitLossTolerance = 5e-5;
constexpr int kPoisonByte = 0xFF;  // bf16 0xFFFF and fp32 0xFFFFFFFF are NaN
constexpr mp_bf16 kBf16NanBits = 0xFFFF;

// ---------------------------------------------------------------------------------------------
// host helpers

std::vector<float> Bf16Values(Rng &rng, size_t n, float lo, float hi) {
  return RoundToBf16(rng.uniform_vector(n, lo, hi));
}

// Expects gpu within tolerance of cpu, and bit for bit equal to it when tolerance is 0.
void ExpectClose(const std::string &name, const std::vector<float> &gpu,
                 const std::vector<float> &cpu, double tolerance) {
  EXPECT_TRUE(WithinTolerance(name, gpu, cpu, tolerance));
  if (tolerance == kExact) {
    EXPECT_TRUE(BitwiseEqual(gpu, cpu)) << name << ": not bit for bit";
  }
}

// ---------------------------------------------------------------------------------------------
// conversions around an all-reduce

TEST(CudaTensorParallel, FloatFromBf16IsExact) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (const size_t n : {size_t{1003}, size_t{4096}}) {
    Rng rng(101 + n);
    const std::vector<float> want = Bf16Values(rng, n, -3.0f, 3.0f);
    const mp_bf16 *in = gpu.Upload(ToBf16(want));
    float *out = gpu.Alloc<float>(n, kPoisonByte);
    gpu.Sync();
    mp_float_from_bf16_cuda(out, in, n, gpu.stream);
    gpu.Sync();
    const std::vector<float> got = gpu.Download(out, n);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    ExpectClose("float_from_bf16 n=" + std::to_string(n), got, want, kExact);
  }
}

TEST(CudaTensorParallel, Bf16FromFloatBiasMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const int rows = 37;
  for (const int cols : {40, 37}) {
    const size_t n = (size_t)rows * cols;
    Rng rng(201 + cols);
    const std::vector<float> sum = rng.uniform_vector(n, -4.0f, 4.0f);  // fp32, not rounded
    const std::vector<float> bias = Bf16Values(rng, cols, -1.0f, 1.0f);
    const float *d_sum = gpu.Upload(sum);
    const mp_bf16 *d_bias = gpu.Upload(ToBf16(bias));
    mp_bf16 *d_out = gpu.Alloc<mp_bf16>(n, kPoisonByte);
    for (const bool with_bias : {true, false}) {
      std::vector<float> want(n);  // fp32 sum, one rounding: the same operations as the kernel
      for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
          const size_t i = (size_t)r * cols + c;
          want[i] = with_bias ? sum[i] + bias[c] : sum[i];
        }
      }
      gpu.Fill(d_out, n, kPoisonByte);
      gpu.Sync();
      mp_bf16_from_float_bias_cuda(d_out, d_sum, with_bias ? d_bias : nullptr, rows, cols,
                                   gpu.stream);
      gpu.Sync();
      const std::vector<float> got = gpu.DownloadBf16(d_out, n);
      ASSERT_TRUE(gpu.ok()) << gpu.error();
      const std::string name =
          "bf16_from_float_bias cols=" + std::to_string(cols) + (with_bias ? " bias" : " no bias");
      EXPECT_TRUE(WithinTolerance(name, got, want, kBf16Tolerance));
      ExpectClose(name + " (rounded on the host)", got, RoundToBf16(want), kExact);
    }
  }
}

TEST(CudaTensorParallel, AddF32MatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (const size_t n : {size_t{1003}, size_t{4096}}) {
    Rng rng(301 + n);
    std::vector<float> out = rng.uniform_vector(n, -2.0f, 2.0f);
    const std::vector<float> in = rng.uniform_vector(n, -2.0f, 2.0f);
    float *d_out = gpu.Upload(out);
    const float *d_in = gpu.Upload(in);
    gpu.Sync();
    mp_add_f32_cuda(d_out, d_in, n, gpu.stream);
    gpu.Sync();
    const std::vector<float> got = gpu.Download(d_out, n);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    for (size_t i = 0; i < n; i++) out[i] += in[i];
    ExpectClose("add_f32 n=" + std::to_string(n), got, out, kExact);
  }
}

// ---------------------------------------------------------------------------------------------
// vocabulary-parallel embedding

TEST(CudaTensorParallel, VocabEmbeddingLookupMatchesCpuAndSumsToTheFullLookup) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const int BT = 37, ranks = 3, Vl = 50, Vp = ranks * Vl, V = 143;
  for (const int C : {40, 37}) {
    Rng rng(401 + C);
    const std::vector<float> wte = Bf16Values(rng, (size_t)Vp * C, -1.0f, 1.0f);  // (Vp, C)
    std::vector<int32_t> tokens(BT);
    for (int32_t &t : tokens) t = rng.below(V);
    // Both ends of every shard.
    tokens[0] = 0;
    tokens[1] = Vl - 1;
    tokens[2] = Vl;
    tokens[3] = 2 * Vl - 1;
    tokens[4] = 2 * Vl;
    tokens[5] = V - 1;
    const mp_bf16 *d_wte = gpu.Upload(ToBf16(wte));  // shard r starts at row r * Vl
    const int32_t *d_tokens = gpu.Upload(tokens);
    float *d_out = gpu.Alloc<float>((size_t)BT * C, kPoisonByte);
    std::vector<float> summed((size_t)BT * C, 0.0f);
    for (int r = 0; r < ranks; r++) {
      const int vocab_start = r * Vl;
      gpu.Fill(d_out, (size_t)BT * C, kPoisonByte);
      gpu.Sync();
      mp_vocab_embedding_lookup_cuda(d_out, d_tokens, d_wte + (size_t)vocab_start * C, vocab_start,
                                     Vl, BT, C, gpu.stream);
      gpu.Sync();
      const std::vector<float> got = gpu.Download(d_out, (size_t)BT * C);
      ASSERT_TRUE(gpu.ok()) << gpu.error();
      std::vector<float> want((size_t)BT * C, 0.0f);
      for (int i = 0; i < BT; i++) {
        const int row = tokens[i] - vocab_start;
        if (row < 0 || row >= Vl) continue;
        for (int c = 0; c < C; c++)
          want[(size_t)i * C + c] = wte[((size_t)row + vocab_start) * C + c];
      }
      ExpectClose("vocab_embedding_lookup C=" + std::to_string(C) + " rank " + std::to_string(r),
                  got, want, kExact);
      for (size_t i = 0; i < summed.size(); i++) summed[i] += got[i];
    }
    // The all-reduce of the parts is the unsplit lookup: one non-zero part per token.
    std::vector<float> full((size_t)BT * C);
    for (int i = 0; i < BT; i++) {
      for (int c = 0; c < C; c++) full[(size_t)i * C + c] = wte[(size_t)tokens[i] * C + c];
    }
    ExpectClose("vocab_embedding_lookup summed over ranks C=" + std::to_string(C), summed, full,
                kExact);
  }
}

TEST(CudaTensorParallel, AddPositionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const int B = 3, T = 13, maxT = 16;
  for (const int C : {40, 37}) {
    const size_t n = (size_t)B * T * C;
    Rng rng(501 + C);
    const std::vector<float> sum = rng.uniform_vector(n, -2.0f, 2.0f);
    const std::vector<float> wpe = Bf16Values(rng, (size_t)maxT * C, -1.0f, 1.0f);
    const float *d_sum = gpu.Upload(sum);
    const mp_bf16 *d_wpe = gpu.Upload(ToBf16(wpe));
    mp_bf16 *d_out = gpu.Alloc<mp_bf16>(n, kPoisonByte);
    gpu.Sync();
    mp_add_position_cuda(d_out, d_sum, d_wpe, B, T, C, gpu.stream);
    gpu.Sync();
    const std::vector<float> got = gpu.DownloadBf16(d_out, n);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    std::vector<float> want(n);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        for (int c = 0; c < C; c++) {
          const size_t i = ((size_t)b * T + t) * C + c;
          want[i] = sum[i] + wpe[(size_t)t * C + c];
        }
      }
    }
    const std::string name = "add_position C=" + std::to_string(C);
    EXPECT_TRUE(WithinTolerance(name, got, want, kBf16Tolerance));
    ExpectClose(name + " (rounded on the host)", got, RoundToBf16(want), kExact);
  }
}

// Sequence parallelism: each rank's token slice of the B*T rows (here 3 ranks of 13 rows, so a
// slice starts mid-sequence and runs across a sequence boundary) gets the positions of its global
// rows; the slices laid side by side are the whole lookup's mp_add_position_cuda, bit for bit.
TEST(CudaTensorParallel, AddPositionRowsOfASliceMatchTheWhole) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const int B = 3, T = 13, maxT = 16, ranks = 3, rows = B * T / ranks;
  for (const int C : {40, 37}) {
    const size_t n = (size_t)B * T * C, n_local = (size_t)rows * C;
    Rng rng(601 + C);
    const std::vector<float> sum = rng.uniform_vector(n, -2.0f, 2.0f);
    const std::vector<float> wpe = Bf16Values(rng, (size_t)maxT * C, -1.0f, 1.0f);
    const float *d_sum = gpu.Upload(sum);
    const mp_bf16 *d_wpe = gpu.Upload(ToBf16(wpe));
    mp_bf16 *d_whole = gpu.Alloc<mp_bf16>(n, kPoisonByte);
    gpu.Sync();
    mp_add_position_cuda(d_whole, d_sum, d_wpe, B, T, C, gpu.stream);
    gpu.Sync();
    const std::vector<float> whole = gpu.DownloadBf16(d_whole, n);
    std::vector<float> slices(n), want(n);
    for (int r = 0; r < ranks; r++) {
      const int first = r * rows;
      const std::vector<float> part(sum.begin() + (ptrdiff_t)((size_t)first * C),
                                    sum.begin() + (ptrdiff_t)((size_t)(first + rows) * C));
      const float *d_part = gpu.Upload(part);
      mp_bf16 *d_out = gpu.Alloc<mp_bf16>(n_local, kPoisonByte);
      gpu.Sync();
      mp_add_position_rows_cuda(d_out, d_part, d_wpe, first, rows, T, C, gpu.stream);
      gpu.Sync();
      const std::vector<float> got = gpu.DownloadBf16(d_out, n_local);
      std::copy(got.begin(), got.end(), slices.begin() + (ptrdiff_t)((size_t)first * C));
      for (int i = 0; i < rows; i++) {
        const int t = (first + i) % T;
        for (int c = 0; c < C; c++) {
          const size_t k = (size_t)(first + i) * C + c;
          want[k] = sum[k] + wpe[(size_t)t * C + c];
        }
      }
    }
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    const std::string name = "add_position_rows of " + std::to_string(ranks) +
                             " slices C=" + std::to_string(C);
    ExpectClose(name + " (rounded on the host)", slices, RoundToBf16(want), kExact);
    ExpectClose(name + " vs the whole", slices, whole, kExact);
  }
}

// ---------------------------------------------------------------------------------------------
// vocabulary-parallel cross-entropy: a split vocabulary and its CPU references

// The logits of a vocabulary of V real entries padded to ranks * Vl columns, split by column.
struct CeCase {
  CeCase(int BT_, int Vl_, int ranks_, int V_) : BT(BT_), Vl(Vl_), ranks(ranks_), V(V_) {
    const int Vp = ranks * Vl;
    Rng rng(601 + BT * 7 + Vl * 11 + ranks * 13 + V);
    targets.resize(BT);
    for (int32_t &t : targets) t = rng.below(V);
    targets[0] = V - 1;  // the last real column
    targets[1] = 0;
    if (BT > 2 && Vl < V) targets[2] = Vl;  // the first column of rank 1
    logits = rng.uniform_vector((size_t)BT * Vp, -4.0f, 4.0f);
    for (int i = 0; i < BT; i++) {
      // A confident column per row (the target in every third row), so large probabilities and
      // the onehot term are both exercised, on every rank that holds real columns.
      const int peak = i % 3 == 0 ? targets[i] : rng.below(V);
      logits[(size_t)i * Vp + peak] += 8.0f;
    }
    logits = RoundToBf16(logits);
    for (int i = 0; i < BT; i++) {
      for (int j = V; j < Vp; j++) logits[(size_t)i * Vp + j] = NAN;  // padding: never read
    }
  }
  int Vp() const { return ranks * Vl; }
  int Start(int rank) const { return rank * Vl; }
  int Valid(int rank) const { return std::max(0, std::min(Vl, V - Start(rank))); }
  std::string Name() const {
    return "BT=" + std::to_string(BT) + " Vl=" + std::to_string(Vl) +
           " ranks=" + std::to_string(ranks) + " V=" + std::to_string(V);
  }

  // Rank r's (BT, Vl) logits as the device holds them; padding holds `padding` bits.
  std::vector<mp_bf16> Shard(int rank, mp_bf16 padding) const {
    std::vector<mp_bf16> bits((size_t)BT * Vl);
    for (int i = 0; i < BT; i++) {
      for (int j = 0; j < Vl; j++) {
        bits[(size_t)i * Vl + j] =
            j < Valid(rank) ? mp_bf16_from_float(logits[(size_t)i * Vp() + Start(rank) + j])
                            : padding;
      }
    }
    return bits;
  }
  // Padding of +100 in even rows (a max that reads padding is wrong) and NaN in odd rows (a sum
  // or a gradient that reads it is NaN).
  std::vector<mp_bf16> ShardWithMixedPadding(int rank) const {
    std::vector<mp_bf16> bits = Shard(rank, kBf16NanBits);
    const mp_bf16 hundred = mp_bf16_from_float(100.0f);
    for (int i = 0; i < BT; i += 2) {
      for (int j = Valid(rank); j < Vl; j++) bits[(size_t)i * Vl + j] = hundred;
    }
    return bits;
  }
  float Logit(int row, int rank, int j) const {
    return logits[(size_t)row * Vp() + Start(rank) + j];
  }

  // Phase 1 on rank r: the max over its valid columns, -inf when it has none.
  std::vector<float> RankMax(int rank) const {
    std::vector<float> row_max(BT, -INFINITY);
    for (int i = 0; i < BT; i++) {
      for (int j = 0; j < Valid(rank); j++) row_max[i] = std::fmax(row_max[i], Logit(i, rank, j));
    }
    return row_max;
  }
  std::vector<float> GlobalMax() const {
    std::vector<float> row_max(BT, -INFINITY);
    for (int r = 0; r < ranks; r++) {
      const std::vector<float> part = RankMax(r);
      for (int i = 0; i < BT; i++) row_max[i] = std::fmax(row_max[i], part[i]);
    }
    return row_max;
  }
  // Phase 2 on rank r, in double: (2, BT) stats.
  std::vector<float> RankStats(int rank, const std::vector<float> &row_max) const {
    std::vector<float> stats(2 * (size_t)BT, 0.0f);
    for (int i = 0; i < BT; i++) {
      double sum = 0.0;
      for (int j = 0; j < Valid(rank); j++) {
        sum += std::exp((double)Logit(i, rank, j) - (double)row_max[i]);
      }
      stats[i] = (float)sum;
      const int target = targets[i] - Start(rank);
      if (target >= 0 && target < Valid(rank)) stats[BT + i] = Logit(i, rank, target);
    }
    return stats;
  }
  // The stats summed over the group, in double.
  std::vector<float> SummedStats(const std::vector<float> &row_max) const {
    std::vector<double> sums(2 * (size_t)BT, 0.0);
    for (int r = 0; r < ranks; r++) {
      const std::vector<float> part = RankStats(r, row_max);
      for (size_t k = 0; k < sums.size(); k++) sums[k] += part[k];
    }
    return std::vector<float>(sums.begin(), sums.end());
  }
  // Phase 3 on rank r, in double: losses (BT) and dlogits (BT, Vl).
  void RankFinish(int rank, const std::vector<float> &row_max, const std::vector<float> &stats,
                  float dloss, std::vector<float> *losses, std::vector<float> *dlogits) const {
    losses->assign(BT, 0.0f);
    dlogits->assign((size_t)BT * Vl, 0.0f);
    for (int i = 0; i < BT; i++) {
      const double m = row_max[i], sum = stats[i];
      (*losses)[i] = (float)(std::log(sum) - ((double)stats[BT + i] - m));
      for (int j = 0; j < Valid(rank); j++) {
        const double prob = std::exp((double)Logit(i, rank, j) - m) / sum;
        const double onehot = Start(rank) + j == targets[i] ? 1.0 : 0.0;
        (*dlogits)[(size_t)i * Vl + j] = (float)((prob - onehot) * dloss / BT);
      }
    }
  }

  int BT, Vl, ranks, V;
  std::vector<int32_t> targets;  // (BT)
  std::vector<float> logits;     // (BT, ranks * Vl), bf16 values; NaN in the padding
};

// Vl = 50 (one-value path) with 7 padding columns on the last rank; Vl = 48 (128-bit path) with
// the last rank all padding.
const CeCase &CeCaseFor(int index) {
  static const CeCase cases[] = {CeCase(37, 50, 3, 143), CeCase(37, 48, 3, 95)};
  return cases[index];
}

TEST(CudaTensorParallel, VocabCeMaxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (int index = 0; index < 2; index++) {
    const CeCase &ce = CeCaseFor(index);
    float *d_max = gpu.Alloc<float>(ce.BT, kPoisonByte);
    for (int r = 0; r < ce.ranks; r++) {
      const mp_bf16 *d_logits = gpu.Upload(ce.ShardWithMixedPadding(r));
      gpu.Fill(d_max, ce.BT, kPoisonByte);
      gpu.Sync();
      mp_vocab_ce_max_cuda(d_max, d_logits, ce.BT, ce.Vl, ce.Start(r), ce.V, gpu.stream);
      gpu.Sync();
      const std::vector<float> got = gpu.Download(d_max, ce.BT);
      ASSERT_TRUE(gpu.ok()) << gpu.error();
      const std::vector<float> want = ce.RankMax(r);
      const std::string name = "vocab_ce_max " + ce.Name() + " rank " + std::to_string(r);
      if (ce.Valid(r) == 0) {
        for (int i = 0; i < ce.BT; i++) {
          EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0)
              << name << ": row " << i << " holds " << got[i] << ", want -inf (all padding)";
        }
      } else {
        ExpectClose(name, got, want, kExact);
      }
    }
  }
}

TEST(CudaTensorParallel, MaxOverRanksMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const int ranks = 3, BT = 37;
  Rng rng(701);
  std::vector<float> gathered = rng.uniform_vector((size_t)ranks * BT, -5.0f, 5.0f);
  for (int i = 0; i < BT; i += 4) gathered[(size_t)2 * BT + i] = -INFINITY;  // rank 2 all padding
  for (int i = 0; i < BT; i += 5) gathered[i] = -INFINITY;
  std::vector<float> want(BT);
  for (int i = 0; i < BT; i++) {
    want[i] =
        std::fmax(std::fmax(gathered[i], gathered[(size_t)BT + i]), gathered[(size_t)2 * BT + i]);
  }
  float *d_gathered = gpu.Upload(gathered);
  float *d_max = gpu.Alloc<float>(BT, kPoisonByte);
  gpu.Sync();
  mp_max_over_ranks_cuda(d_max, d_gathered, ranks, BT, gpu.stream);
  gpu.Sync();
  ExpectClose("max_over_ranks", gpu.Download(d_max, BT), want, kExact);
  // In place over rank 0's part.
  mp_max_over_ranks_cuda(d_gathered, d_gathered, ranks, BT, gpu.stream);
  gpu.Sync();
  ExpectClose("max_over_ranks in place", gpu.Download(d_gathered, BT), want, kExact);
  ASSERT_TRUE(gpu.ok()) << gpu.error();
}

TEST(CudaTensorParallel, VocabCePartialsMatchCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  for (int index = 0; index < 2; index++) {
    const CeCase &ce = CeCaseFor(index);
    const std::vector<float> row_max = ce.GlobalMax();
    const float *d_max = gpu.Upload(row_max);
    const int32_t *d_targets = gpu.Upload(ce.targets);
    float *d_stats = gpu.Alloc<float>(2 * (size_t)ce.BT, kPoisonByte);
    for (int r = 0; r < ce.ranks; r++) {
      const mp_bf16 *d_logits = gpu.Upload(ce.ShardWithMixedPadding(r));
      gpu.Fill(d_stats, 2 * (size_t)ce.BT, kPoisonByte);
      gpu.Sync();
      mp_vocab_ce_partials_cuda(d_stats, d_logits, d_targets, d_max, ce.BT, ce.Vl, ce.Start(r),
                                ce.V, gpu.stream);
      gpu.Sync();
      const std::vector<float> got = gpu.Download(d_stats, 2 * (size_t)ce.BT);
      ASSERT_TRUE(gpu.ok()) << gpu.error();
      const std::vector<float> want = ce.RankStats(r, row_max);
      const std::string name = "vocab_ce_partials " + ce.Name() + " rank " + std::to_string(r);
      ExpectClose(name + " sums", std::vector<float>(got.begin(), got.begin() + ce.BT),
                  std::vector<float>(want.begin(), want.begin() + ce.BT), kFp32ReorderedTolerance);
      ExpectClose(name + " target logits", std::vector<float>(got.begin() + ce.BT, got.end()),
                  std::vector<float>(want.begin() + ce.BT, want.end()), kExact);
    }
  }
}

TEST(CudaTensorParallel, VocabCeFinishMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  ASSERT_TRUE(gpu.ok()) << gpu.error();
  const float dloss = 0.5f;  // as with two accumulated micro-batches
  for (int index = 0; index < 2; index++) {
    const CeCase &ce = CeCaseFor(index);
    const std::vector<float> row_max = ce.GlobalMax();
    const std::vector<float> stats = ce.SummedStats(row_max);
    const float *d_max = gpu.Upload(row_max);
    const float *d_stats = gpu.Upload(stats);
    const int32_t *d_targets = gpu.Upload(ce.targets);
    float *d_losses = gpu.Alloc<float>(ce.BT, kPoisonByte);
    for (int r = 0; r < ce.ranks; r++) {
      mp_bf16 *d_logits = gpu.Upload(ce.ShardWithMixedPadding(r));
      gpu.Fill(d_losses, ce.BT, kPoisonByte);
      gpu.Sync();
      mp_vocab_ce_finish_cuda(d_losses, d_logits, d_targets, d_max, d_stats, dloss, ce.BT, ce.Vl,
                              ce.Start(r), ce.V, gpu.stream);
      gpu.Sync();
      const std::vector<float> losses = gpu.Download(d_losses, ce.BT);
      const std::vector<float> dlogits = gpu.DownloadBf16(d_logits, (size_t)ce.BT * ce.Vl);
      ASSERT_TRUE(gpu.ok()) << gpu.error();
      std::vector<float> want_losses, want_dlogits;
      ce.RankFinish(r, row_max, stats, dloss, &want_losses, &want_dlogits);
      const std::string name = "vocab_ce_finish " + ce.Name() + " rank " + std::to_string(r);
      ExpectClose(name + " losses", losses, want_losses, kFp32ReorderedTolerance);
      if (ce.Valid(r) == 0) {
        ExpectClose(name + " dlogits (all padding)", dlogits, want_dlogits, kExact);
      } else {
        ExpectClose(name + " dlogits", dlogits, want_dlogits, kBf16Tolerance);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// the three phases over a split vocabulary against the one-rank fused kernel

// The phases on every rank's shard with the collectives done by hand; losses (ranks, BT) and
// the dlogits of all shards side by side as (BT, ranks * Vl).
void RunSplit(Gpu *gpu, const CeCase &ce, float dloss, std::vector<float> *losses,
              std::vector<mp_bf16> *dlogits) {
  const int BT = ce.BT;
  const int32_t *d_targets = gpu->Upload(ce.targets);
  std::vector<mp_bf16 *> d_logits(ce.ranks);
  std::vector<float *> d_stats(ce.ranks), d_losses(ce.ranks);
  for (int r = 0; r < ce.ranks; r++) {
    d_logits[r] = gpu->Upload(ce.Shard(r, kBf16NanBits));
    d_stats[r] = gpu->Alloc<float>(2 * (size_t)BT, kPoisonByte);
    d_losses[r] = gpu->Alloc<float>(BT, kPoisonByte);
  }
  float *d_gathered = gpu->Alloc<float>((size_t)ce.ranks * BT, kPoisonByte);
  float *d_max = gpu->Alloc<float>(BT, kPoisonByte);
  float *d_summed = gpu->Alloc<float>(2 * (size_t)BT, kPoisonByte);
  gpu->Sync();

  // Phase 1 writes each rank's maxima into its slot of the all-gather's output.
  for (int r = 0; r < ce.ranks; r++) {
    mp_vocab_ce_max_cuda(d_gathered + (size_t)r * BT, d_logits[r], BT, ce.Vl, ce.Start(r), ce.V,
                         gpu->stream);
  }
  mp_max_over_ranks_cuda(d_max, d_gathered, ce.ranks, BT, gpu->stream);
  for (int r = 0; r < ce.ranks; r++) {
    mp_vocab_ce_partials_cuda(d_stats[r], d_logits[r], d_targets, d_max, BT, ce.Vl, ce.Start(r),
                              ce.V, gpu->stream);
  }
  gpu->Sync();
  // The all-reduce: fp32 sums in rank order.
  std::vector<float> summed(2 * (size_t)BT, 0.0f);
  for (int r = 0; r < ce.ranks; r++) {
    const std::vector<float> part = gpu->Download(d_stats[r], 2 * (size_t)BT);
    for (size_t k = 0; k < summed.size(); k++) summed[k] += part[k];
  }
  gpu->CopyIn(d_summed, summed);
  gpu->Sync();
  for (int r = 0; r < ce.ranks; r++) {
    mp_vocab_ce_finish_cuda(d_losses[r], d_logits[r], d_targets, d_max, d_summed, dloss, BT, ce.Vl,
                            ce.Start(r), ce.V, gpu->stream);
  }
  gpu->Sync();

  losses->clear();
  dlogits->assign((size_t)BT * ce.Vp(), 0);
  for (int r = 0; r < ce.ranks; r++) {
    const std::vector<float> rank_losses = gpu->Download(d_losses[r], BT);
    losses->insert(losses->end(), rank_losses.begin(), rank_losses.end());
    const std::vector<mp_bf16> shard = gpu->Download(d_logits[r], (size_t)BT * ce.Vl);
    for (int i = 0; i < BT; i++) {
      for (int j = 0; j < ce.Vl; j++) {
        (*dlogits)[(size_t)i * ce.Vp() + ce.Start(r) + j] = shard[(size_t)i * ce.Vl + j];
      }
    }
  }
}

TEST(CudaTensorParallel, SplitCrossEntropyMatchesFusedAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const float dloss = 0.5f;
  // 2 ranks through both load paths, each with padding at the end of rank 1; 3 ranks with the
  // last one all padding.
  for (const CeCase &ce : {CeCase(37, 50, 2, 93), CeCase(37, 48, 2, 90), CeCase(37, 40, 3, 75)}) {
    Gpu gpu;
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    const int BT = ce.BT, Vp = ce.Vp();
    const std::string name = ce.Name();

    // One rank: the fused kernel on the unsplit (BT, Vp) logits, NaN in the padding.
    std::vector<mp_bf16> full = ToBf16(ce.logits);
    for (int i = 0; i < BT; i++) {
      for (int j = ce.V; j < Vp; j++) full[(size_t)i * Vp + j] = kBf16NanBits;
    }
    mp_bf16 *d_full = gpu.Upload(full);
    const int32_t *d_targets = gpu.Upload(ce.targets);
    float *d_fused_losses = gpu.Alloc<float>(BT, kPoisonByte);
    gpu.Sync();
    mp_cross_entropy_fused_cuda(d_fused_losses, d_full, d_targets, dloss, 1, BT, ce.V, Vp,
                                gpu.stream);
    gpu.Sync();
    const std::vector<float> fused_losses = gpu.Download(d_fused_losses, BT);
    const std::vector<float> fused_dlogits = gpu.DownloadBf16(d_full, (size_t)BT * Vp);
    ASSERT_TRUE(gpu.ok()) << gpu.error();

    std::vector<float> losses[2];
    std::vector<mp_bf16> dlogits[2];
    for (int run = 0; run < 2; run++) RunSplit(&gpu, ce, dloss, &losses[run], &dlogits[run]);
    ASSERT_TRUE(gpu.ok()) << gpu.error();

    for (int r = 0; r < ce.ranks; r++) {
      const std::vector<float> rank_losses(losses[0].begin() + (size_t)r * BT,
                                           losses[0].begin() + (size_t)(r + 1) * BT);
      EXPECT_TRUE(WithinTolerance(
          "split cross-entropy losses " + name + " rank " + std::to_string(r) + " vs fused",
          rank_losses, fused_losses, kSplitLossTolerance));
      const std::vector<float> rank0_losses(losses[0].begin(), losses[0].begin() + BT);
      EXPECT_TRUE(BitwiseEqual(rank_losses, rank0_losses))
          << name << ": rank " << r << "'s losses differ from rank 0's";
    }
    EXPECT_TRUE(WithinTolerance("split cross-entropy dlogits " + name + " vs fused",
                                ToFloat(dlogits[0]), fused_dlogits, kBf16Tolerance));
    EXPECT_TRUE(BitwiseEqual(losses[0], losses[1])) << name << ": two runs gave different losses";
    EXPECT_TRUE(BitwiseEqual(dlogits[0], dlogits[1]))
        << name << ": two runs gave different dlogits";
  }
}

}  // namespace
