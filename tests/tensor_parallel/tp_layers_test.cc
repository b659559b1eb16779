// tests/tensor_parallel/tp_layers_test.cc — tensor-parallel layers against the one-rank layers,
// run under mpirun with 1, 2 and 4 ranks (tp_layers_test.sh).
//
// DESIGN.md's principle 2 (parallel equals serial), layer by layer: every rank builds the whole
// (tp = 1) computation on the CPU from the same seeded inputs with layers/, runs its shard with
// tensor_parallel/ over a group of all ranks, and compares what it holds (its output columns or
// token rows, its gradient shards) with the matching slice of the reference. Covered, each with
// and without sequence parallelism: the communication pairs, column- and row-parallel linear,
// the GPT block (also as two tp = 2 groups inside 4 ranks) and its zero-bubble split backward
// (input pass then weight pass equals the full backward, bit for bit), vocab-parallel embedding
// with the tied LM head and cross-entropy, and a whole two-block GPT against engine/gpt_model.h's
// loss and every gradient; plus shard slicing, round trips and shard-by-shard initialisation.
//
// Tolerance: max |actual - expected| <= 1e-5 x max |expected| over each tensor (kRel). The
// parallel code sums the same terms in another order (partial GEMMs over C/tp or F/tp channels
// then an all-reduce, partial softmax sums, layernorm gradients over token slices), which moves
// results by a few float32 ulps of the tensor's scale: the worst seen with tp = 4 is 5e-7 of the
// scale (every check passes at 1e-6), so 1e-5 leaves a 20x margin and still fails a softmax sum
// off by 1e-5 relative, a bias added tp times, or a missing all-reduce (all three tried). Where
// the parallel code does the same float operations in the same order (embedding lookups, the
// row-parallel bias gradient, replicated tensors across ranks) the check is exact.
//
// Its own main: MPI through engine/comm.h, only world rank 0 writes the XML report, and the run
// fails if any rank failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "engine/gpt_model.h"
#include "engine/gpt_model_tp.h"
#include "engine/param_init.h"
#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/gpt_block.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/gpt_block.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/row_parallel_linear.h"
#include "tensor_parallel/shard.h"
#include "tensor_parallel/tp_comm.h"
#include "tensor_parallel/vocab_parallel_cross_entropy.h"
#include "tensor_parallel/vocab_parallel_embedding.h"
#include "engine/tp_comm_mpi.h"
#include "topology/model.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;  // the group of every world rank: the tensor-parallel group
mp_tp_comm g_tp;

constexpr double kRel = 1e-5;

// The sizes of the issue: small enough that each mpirun takes seconds.
constexpr int kB = 2, kT = 8, kBT = kB * kT, kC = 32, kNH = 4, kF = 128;

using fvec = std::vector<float>;

// splitmix64: the same inputs on every rank and machine.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(next() >> 11) / 9007199254740992.0);
  }

 private:
  uint64_t state_;
};

fvec Random(uint64_t seed, size_t n, float lo, float hi) {
  Rng rng(seed);
  fvec v(n);
  for (auto &x : v) x = rng.uniform(lo, hi);
  return v;
}

std::vector<int32_t> RandomTokens(uint64_t seed, size_t n, int below) {
  Rng rng(seed);
  std::vector<int32_t> v(n);
  for (auto &x : v) x = (int32_t)(rng.next() % (uint64_t)below);
  return v;
}

std::string Where(const mp_tp_comm &tp) {
  return " (tp rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size) + ")";
}

// Passes when max |actual - expected| <= rel * max |expected| (rel = 0: bitwise equal values).
::testing::AssertionResult Close(const std::string &name, const float *actual,
                                 const float *expected, size_t n, double rel = kRel) {
  double scale = 0.0, worst = -1.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    scale = std::max(scale, (double)std::fabs(expected[i]));
    const double d = std::fabs((double)actual[i] - (double)expected[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      at = i;
    }
  }
  if (n == 0 || worst <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": max |diff| " << worst << " at element " << at << " (" << actual[at]
         << " vs reference " << expected[at] << ") exceeds " << rel << " x max |reference| "
         << scale << " over " << n << " elements";
}

::testing::AssertionResult Close(const std::string &name, const fvec &actual, const fvec &expected,
                                 double rel = kRel) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << name << ": " << actual.size() << " elements, reference " << expected.size();
  }
  return Close(name, actual.data(), expected.data(), actual.size(), rel);
}

// Rows [row0, row0 + rows) of a row-major (_, cols) tensor.
fvec Rows(const fvec &full, size_t cols, size_t row0, size_t rows) {
  return fvec(full.begin() + row0 * cols, full.begin() + (row0 + rows) * cols);
}

// A rank's shard of a (rows, cols) tensor.
fvec Shard(const fvec &full, mp_tp_split split, size_t rows, size_t cols, int rank, int size) {
  fvec shard(mp_tp_shard_floats(split, rows, cols, size));
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_OK,
            mp_tp_shard_extract(shard.data(), full.data(), split, rows, cols, rank, size, &err))
      << err.message;
  return shard;
}

// Passes when every rank of the group holds the same n floats, bit for bit.
::testing::AssertionResult SameOnEveryRank(const mp_tp_comm &tp, const std::string &name,
                                           const float *x, size_t n) {
  fvec all((size_t)tp.size * n);
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_tp_all_gather(&tp, x, all.data(), n, &err) != MP_OK) {
    return ::testing::AssertionFailure() << name << ": " << err.message;
  }
  for (int r = 0; r < tp.size; r++) {
    if (std::memcmp(all.data() + (size_t)r * n, x, n * sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << name << " differs between tp rank " << tp.rank << " and tp rank " << r;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Mappings: the collectives of each forward/backward pair, on small integers (exact sums).

TEST(Mappings, PairsMoveTheRightNumbers) {
  const mp_tp_comm &tp = g_tp;
  const int P = tp.size, r = tp.rank;
  const size_t n = 3;
  mp_error err = MP_ERROR_INITIALIZER;

  // copy_to_region: identity forward, all-reduce backward; reduce_from_region the reverse.
  fvec x = {1.0f, 2.0f, 3.0f};
  ASSERT_EQ(MP_OK, mp_tp_copy_to_region_forward(&tp, x.data(), n, &err)) << err.message;
  EXPECT_EQ((fvec{1.0f, 2.0f, 3.0f}), x);
  fvec dx = {(float)r, 10.0f, 100.0f * r};
  ASSERT_EQ(MP_OK, mp_tp_copy_to_region_backward(&tp, dx.data(), n, &err)) << err.message;
  const float tri = (float)(P * (P - 1) / 2);
  EXPECT_EQ((fvec{tri, 10.0f * P, 100.0f * tri}), dx);
  fvec y = {(float)r, 1.0f, 2.0f};
  ASSERT_EQ(MP_OK, mp_tp_reduce_from_region_forward(&tp, y.data(), n, &err)) << err.message;
  EXPECT_EQ((fvec{tri, (float)P, 2.0f * P}), y);
  fvec dy = {5.0f, 6.0f, 7.0f};
  ASSERT_EQ(MP_OK, mp_tp_reduce_from_region_backward(&tp, dy.data(), n, &err)) << err.message;
  EXPECT_EQ((fvec{5.0f, 6.0f, 7.0f}), dy);

  // gather_from_sequence: all-gather forward, reduce-scatter backward.
  fvec slice = {10.0f * r, 10.0f * r + 1, 10.0f * r + 2}, full((size_t)P * n);
  ASSERT_EQ(MP_OK, mp_tp_gather_from_sequence_forward(&tp, slice.data(), full.data(), n, &err))
      << err.message;
  for (int q = 0; q < P; q++) {
    for (size_t i = 0; i < n; i++) EXPECT_EQ(10.0f * q + i, full[q * n + i]);
  }
  fvec dfull((size_t)P * n), dslice(n);
  for (size_t j = 0; j < dfull.size(); j++) dfull[j] = (float)(r + j);
  ASSERT_EQ(MP_OK, mp_tp_gather_from_sequence_backward(&tp, dfull.data(), dslice.data(), n, &err))
      << err.message;
  for (size_t i = 0; i < n; i++) EXPECT_EQ(tri + P * (float)(r * n + i), dslice[i]);

  // reduce_scatter_to_sequence: reduce-scatter forward, all-gather backward.
  fvec mine(n);
  ASSERT_EQ(MP_OK,
            mp_tp_reduce_scatter_to_sequence_forward(&tp, dfull.data(), mine.data(), n, &err))
      << err.message;
  EXPECT_EQ(dslice, mine);
  fvec back((size_t)P * n);
  ASSERT_EQ(MP_OK,
            mp_tp_reduce_scatter_to_sequence_backward(&tp, slice.data(), back.data(), n, &err))
      << err.message;
  EXPECT_EQ(full, back);

  // The max the table lacks, through an all-gather.
  fvec m(4), gathered(4 * (size_t)P);
  for (size_t i = 0; i < m.size(); i++) m[i] = (int)(i % P) == r ? 100.0f + i : -(float)i - r;
  ASSERT_EQ(MP_OK, mp_tp_all_reduce_max(&tp, m.data(), gathered.data(), m.size(), &err))
      << err.message;
  for (size_t i = 0; i < m.size(); i++) {
    EXPECT_EQ(100.0f + i, m[i]) << i;  // element i's owner, rank i % P, has the largest
  }
}

TEST(Mappings, SingleRankTableNeedsNoCommunicator) {
  const mp_tp_comm one = mp_tp_comm_single();
  EXPECT_EQ(0, one.rank);
  EXPECT_EQ(1, one.size);
  mp_error err = MP_ERROR_INITIALIZER;
  fvec x = {1.0f, 2.0f}, y(2);
  EXPECT_EQ(MP_OK, mp_tp_all_reduce_sum(&one, x.data(), 2, &err));
  EXPECT_EQ(MP_OK, mp_tp_all_gather(&one, x.data(), y.data(), 2, &err));
  EXPECT_EQ(x, y);
  EXPECT_EQ(MP_OK, mp_tp_reduce_scatter_sum(&one, x.data(), y.data(), 2, &err));
  EXPECT_EQ(x, y);
}

// ---------------------------------------------------------------------------------------------
// Column- and row-parallel linear layers against layers/matmul.h on the whole weight.

void CheckColumnLinear(const mp_tp_comm &tp, bool sp) {
  const int P = tp.size, r = tp.rank, C = kC, OC = kF, OCl = OC / P;
  const int BTl = sp ? kBT / P : kBT, row0 = sp ? r * BTl : 0;
  const fvec inp = Random(1, (size_t)kBT * C, -1, 1), W = Random(2, (size_t)OC * C, -0.2f, 0.2f);
  const fvec b = Random(3, OC, -0.1f, 0.1f), dout = Random(4, (size_t)kBT * OC, -1, 1);

  fvec out((size_t)kBT * OC), dinp((size_t)kBT * C, 0), dW((size_t)OC * C, 0), db(OC, 0);
  mp_matmul_forward_cpu(out.data(), inp.data(), W.data(), b.data(), kBT, C, OC);
  mp_matmul_backward_cpu(dinp.data(), dW.data(), db.data(), dout.data(), inp.data(), W.data(), kBT,
                         C, OC);

  const fvec Ws = Shard(W, MP_TP_SPLIT_ROWS, OC, C, r, P),
             bs = Shard(b, MP_TP_SPLIT_ROWS, OC, 1, r, P);
  const fvec inp_l = Rows(inp, C, row0, BTl);
  fvec inp_total(sp ? (size_t)kBT * C : 0), out_l((size_t)kBT * OCl);
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK,
            mp_tp_column_linear_forward(&tp, sp, out_l.data(), sp ? inp_total.data() : nullptr,
                                        inp_l.data(), Ws.data(), bs.data(), kBT, C, OCl, &err))
      << err.message;
  EXPECT_TRUE(Close("out" + Where(tp), out_l, Shard(out, MP_TP_SPLIT_COLS, kBT, OC, r, P)));
  if (sp) {
    EXPECT_TRUE(Close("gathered input", inp_total, inp, 0.0));
  }

  const fvec dout_l = Shard(dout, MP_TP_SPLIT_COLS, kBT, OC, r, P);
  fvec dinp_l((size_t)BTl * C, 0), dWs((size_t)OCl * C, 0), dbs(OCl, 0);
  fvec work(mp_tp_column_linear_work_floats(&tp, sp, kBT, C));
  ASSERT_EQ(MP_OK, mp_tp_column_linear_backward(&tp, sp, dinp_l.data(), dWs.data(), dbs.data(),
                                                dout_l.data(), sp ? inp_total.data() : inp.data(),
                                                Ws.data(), work.data(), kBT, C, OCl, &err))
      << err.message;
  EXPECT_TRUE(Close("dinp" + Where(tp), dinp_l, Rows(dinp, C, row0, BTl)));
  EXPECT_TRUE(Close("dweight" + Where(tp), dWs, Shard(dW, MP_TP_SPLIT_ROWS, OC, C, r, P)));
  EXPECT_TRUE(Close("dbias" + Where(tp), dbs, Shard(db, MP_TP_SPLIT_ROWS, OC, 1, r, P)));
  if (!sp) {
    EXPECT_TRUE(SameOnEveryRank(tp, "dinp", dinp_l.data(), dinp_l.size()));
  }
}

void CheckRowLinear(const mp_tp_comm &tp, bool sp) {
  const int P = tp.size, r = tp.rank, C = kF, Cl = C / P, OC = kC;
  const int BTl = sp ? kBT / P : kBT, row0 = sp ? r * BTl : 0;
  const fvec inp = Random(5, (size_t)kBT * C, -1, 1), W = Random(6, (size_t)OC * C, -0.2f, 0.2f);
  const fvec b = Random(7, OC, -0.1f, 0.1f), dout = Random(8, (size_t)kBT * OC, -1, 1);

  fvec out((size_t)kBT * OC), dinp((size_t)kBT * C, 0), dW((size_t)OC * C, 0), db(OC, 0);
  mp_matmul_forward_cpu(out.data(), inp.data(), W.data(), b.data(), kBT, C, OC);
  mp_matmul_backward_cpu(dinp.data(), dW.data(), db.data(), dout.data(), inp.data(), W.data(), kBT,
                         C, OC);

  const fvec Ws = Shard(W, MP_TP_SPLIT_COLS, OC, C, r, P);
  const fvec inp_l = Shard(inp, MP_TP_SPLIT_COLS, kBT, C, r, P);
  fvec out_l((size_t)BTl * OC), work(sp ? (size_t)kBT * OC : 0);
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK,
            mp_tp_row_linear_forward(&tp, sp, out_l.data(), inp_l.data(), Ws.data(), b.data(),
                                     sp ? work.data() : nullptr, kBT, Cl, OC, &err))
      << err.message;
  EXPECT_TRUE(Close("out" + Where(tp), out_l, Rows(out, OC, row0, BTl)));
  if (!sp) {
    EXPECT_TRUE(SameOnEveryRank(tp, "out", out_l.data(), out_l.size()));
  }

  const fvec dout_l = Rows(dout, OC, row0, BTl);
  fvec dinp_l((size_t)kBT * Cl, 0), dWs((size_t)OC * Cl, 0), dbs(OC, 0);
  fvec dout_total(sp ? (size_t)kBT * OC : 0);
  ASSERT_EQ(MP_OK, mp_tp_row_linear_backward(&tp, sp, dinp_l.data(), dWs.data(), dbs.data(),
                                             dout_l.data(), sp ? dout_total.data() : nullptr,
                                             inp_l.data(), Ws.data(), kBT, Cl, OC, &err))
      << err.message;
  EXPECT_TRUE(Close("dinp" + Where(tp), dinp_l, Shard(dinp, MP_TP_SPLIT_COLS, kBT, C, r, P)));
  EXPECT_TRUE(Close("dweight" + Where(tp), dWs, Shard(dW, MP_TP_SPLIT_COLS, OC, C, r, P)));
  // The bias gradient is summed over all tokens in one order on every rank: the one-rank bits.
  EXPECT_TRUE(Close("dbias" + Where(tp), dbs, db, 0.0));
}

TEST(ColumnParallelLinear, MatchesOneRank) { CheckColumnLinear(g_tp, false); }
TEST(ColumnParallelLinear, MatchesOneRankWithSequenceParallelism) { CheckColumnLinear(g_tp, true); }
TEST(RowParallelLinear, MatchesOneRank) { CheckRowLinear(g_tp, false); }
TEST(RowParallelLinear, MatchesOneRankWithSequenceParallelism) { CheckRowLinear(g_tp, true); }

// ---------------------------------------------------------------------------------------------
// The GPT block against layers/gpt_block.h.

struct NamedTensor {
  const char *name;
  float *actual;
  float *expected;
  size_t n;
  bool replicated;
};

void CheckBlock(const mp_tp_comm &tp, bool sp) {
  const int P = tp.size, r = tp.rank, C = kC;
  const mp_gpt_block_shape full = {kB, kT, kC, kNH, kF};
  const mp_tp_block_shape shape = {full, P, sp};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK, mp_tp_block_shape_check(&shape, &err)) << err.message;
  const int BTl = sp ? kBT / P : kBT, row0 = sp ? r * BTl : 0;

  // Whole-block parameters: everything random (biases too, so a bias added tp times shows), and
  // layernorm weights around 1.
  const size_t np = mp_gpt_block_params_count(C, kF);
  fvec params = Random(10, np, -0.1f, 0.1f);
  mp_gpt_block_params Pf;
  mp_gpt_block_params_point(&Pf, params.data(), C, kF);
  for (int i = 0; i < C; i++) Pf.ln1w[i] += 1.0f, Pf.ln2w[i] += 1.0f;
  const fvec inp = Random(11, (size_t)kBT * C, -1, 1), dout = Random(12, (size_t)kBT * C, -1, 1);

  fvec acts(mp_gpt_block_acts_count(&full)), grads(np, 0.0f),
      scratch(mp_gpt_block_scratch_count(&full));
  fvec dinp((size_t)kBT * C, 0.0f);
  mp_gpt_block_acts A;
  mp_gpt_block_params G;
  mp_gpt_block_scratch S;
  mp_gpt_block_acts_point(&A, acts.data(), &full);
  mp_gpt_block_params_point(&G, grads.data(), C, kF);
  mp_gpt_block_scratch_point(&S, scratch.data(), &full);
  mp_gpt_block_forward_cpu(&full, &Pf, &A, inp.data());
  mp_gpt_block_backward_cpu(&full, dinp.data(), &G, &S, dout.data(), inp.data(), &Pf, &A);

  // This rank's shard, cut from the whole block's parameters.
  const size_t nps = mp_tp_block_params_count(&shape);
  fvec sparams(nps), sgrads(nps, 0.0f), expected_grads(nps);
  mp_gpt_block_params Ps, Gs, Ge;
  ASSERT_EQ(nps, mp_tp_block_params_point(&Ps, sparams.data(), &shape));
  mp_tp_block_params_point(&Gs, sgrads.data(), &shape);
  mp_tp_block_params_point(&Ge, expected_grads.data(), &shape);
  ASSERT_EQ(MP_OK, mp_tp_block_params_extract(&shape, r, &Pf, &Ps, &err)) << err.message;
  ASSERT_EQ(MP_OK, mp_tp_block_params_extract(&shape, r, &G, &Ge, &err)) << err.message;

  fvec tacts(mp_tp_block_acts_count(&shape)), tscratch(mp_tp_block_scratch_count(&shape));
  mp_tp_block_acts TA;
  mp_tp_block_scratch TS;
  ASSERT_EQ(tacts.size(), mp_tp_block_acts_point(&TA, tacts.data(), &shape));
  ASSERT_EQ(tscratch.size(), mp_tp_block_scratch_point(&TS, tscratch.data(), &shape));
  const fvec inp_l = Rows(inp, C, row0, BTl), dout_l = Rows(dout, C, row0, BTl);
  ASSERT_EQ(MP_OK, mp_tp_block_forward(&tp, &shape, &Ps, &TA, inp_l.data(), &err)) << err.message;

  const std::string where = Where(tp) + (sp ? " with sequence parallelism" : "");
  const fvec out(A.out, A.out + (size_t)kBT * C), out_l(TA.out, TA.out + (size_t)BTl * C);
  EXPECT_TRUE(Close("out" + where, out_l, Rows(out, C, row0, BTl)));
  const fvec atty(A.atty, A.atty + (size_t)kBT * C), atty_l(TA.atty, TA.atty + (size_t)kBT * C / P);
  EXPECT_TRUE(Close("attention output (this rank's heads)" + where, atty_l,
                    Shard(atty, MP_TP_SPLIT_COLS, kBT, C, r, P)));
  if (!sp) {
    EXPECT_TRUE(SameOnEveryRank(tp, "out", out_l.data(), out_l.size()));
  }

  fvec dinp_l((size_t)BTl * C, 0.0f);
  ASSERT_EQ(MP_OK, mp_tp_block_backward(&tp, &shape, dinp_l.data(), &Gs, &TS, dout_l.data(),
                                        inp_l.data(), &Ps, &TA, &err))
      << err.message;
  ASSERT_EQ(MP_OK, mp_tp_block_reduce_sequence_parallel_grads(&tp, &shape, &Gs, &err))
      << err.message;
  EXPECT_TRUE(Close("dinp" + where, dinp_l, Rows(dinp, C, row0, BTl)));

  const size_t c = C, cl = C / P, fl = kF / P;
  const NamedTensor tensors[] = {
      {"ln1.weight grad", Gs.ln1w, Ge.ln1w, c, true},
      {"ln1.bias grad", Gs.ln1b, Ge.ln1b, c, true},
      {"qkv.weight grad", Gs.qkvw, Ge.qkvw, 3 * cl * c, false},
      {"qkv.bias grad", Gs.qkvb, Ge.qkvb, 3 * cl, false},
      {"attn_proj.weight grad", Gs.attprojw, Ge.attprojw, c * cl, false},
      {"attn_proj.bias grad", Gs.attprojb, Ge.attprojb, c, true},
      {"ln2.weight grad", Gs.ln2w, Ge.ln2w, c, true},
      {"ln2.bias grad", Gs.ln2b, Ge.ln2b, c, true},
      {"fc.weight grad", Gs.fcw, Ge.fcw, fl * c, false},
      {"fc.bias grad", Gs.fcb, Ge.fcb, fl, false},
      {"fc_proj.weight grad", Gs.fcprojw, Ge.fcprojw, c * fl, false},
      {"fc_proj.bias grad", Gs.fcprojb, Ge.fcprojb, c, true},
  };
  for (const NamedTensor &t : tensors) {
    EXPECT_TRUE(Close(t.name + where, t.actual, t.expected, t.n));
  }
  // Replicated parameters must get the same gradient on every rank, or their copies drift apart.
  for (const NamedTensor &t : tensors) {
    if (t.replicated) {
      EXPECT_TRUE(SameOnEveryRank(tp, t.name, t.actual, t.n));
    }
  }
  if (!sp) {
    EXPECT_TRUE(SameOnEveryRank(tp, "dinp", dinp_l.data(), dinp_l.size()));
  }
}

TEST(GptBlock, MatchesOneRank) { CheckBlock(g_tp, false); }
TEST(GptBlock, MatchesOneRankWithSequenceParallelism) { CheckBlock(g_tp, true); }

// ---------------------------------------------------------------------------------------------
// The zero-bubble split of the block's backward: B (mp_tp_block_backward_input) then W
// (mp_tp_block_backward_weight) against the full backward on the same shard, bit for bit. Two
// micro-batches run in zb-h1's order (F1 F2 B1 B2 W1 W2, one scratch shared by both Bs, one
// deferred per micro-batch) against F1 F2 full1 full2; gradients start from zero and accumulate
// over both. CheckBlock already holds the full backward to the one-rank block.

// Passes when a and b hold the same n floats, bit for bit.
::testing::AssertionResult Bitwise(const std::string &name, const float *a, const float *b,
                                   size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << name << ": element " << i << " of " << n << " is "
                                           << a[i] << ", the full backward's " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The shard's twelve gradients: which the weight pass W adds (the four GEMM weights).
struct GradField {
  const char *name;
  float *mp_gpt_block_params::*field;
  bool weight_pass;
};
const GradField kGradFields[] = {
    {"ln1.weight grad", &mp_gpt_block_params::ln1w, false},
    {"ln1.bias grad", &mp_gpt_block_params::ln1b, false},
    {"qkv.weight grad", &mp_gpt_block_params::qkvw, true},
    {"qkv.bias grad", &mp_gpt_block_params::qkvb, false},
    {"attn_proj.weight grad", &mp_gpt_block_params::attprojw, true},
    {"attn_proj.bias grad", &mp_gpt_block_params::attprojb, false},
    {"ln2.weight grad", &mp_gpt_block_params::ln2w, false},
    {"ln2.bias grad", &mp_gpt_block_params::ln2b, false},
    {"fc.weight grad", &mp_gpt_block_params::fcw, true},
    {"fc.bias grad", &mp_gpt_block_params::fcb, false},
    {"fc_proj.weight grad", &mp_gpt_block_params::fcprojw, true},
    {"fc_proj.bias grad", &mp_gpt_block_params::fcprojb, false},
};

// Floats of each of kGradFields in a shard (the order of mp_tp_block_params_point).
std::vector<size_t> GradSizes(const mp_tp_block_shape &shape) {
  const size_t c = shape.full.C, cl = c / shape.tp, fl = (size_t)shape.full.F / shape.tp;
  return {c, c, 3 * cl * c, 3 * cl, c * cl, c, c, c, fl * c, fl, c * fl, c};
}

void CheckSplitBackward(const mp_tp_comm &tp, bool sp) {
  constexpr int kMicro = 2;
  const int P = tp.size, r = tp.rank, C = kC;
  const mp_gpt_block_shape full = {kB, kT, kC, kNH, kF};
  const mp_tp_block_shape shape = {full, P, sp};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK, mp_tp_block_shape_check(&shape, &err)) << err.message;
  const int BTl = sp ? kBT / P : kBT, row0 = sp ? r * BTl : 0;
  const size_t nl = (size_t)BTl * C;
  const std::string where = Where(tp) + (sp ? " with sequence parallelism" : "");

  // This rank's shard of a random block.
  fvec params = Random(20, mp_gpt_block_params_count(C, kF), -0.1f, 0.1f);
  mp_gpt_block_params Pf;
  mp_gpt_block_params_point(&Pf, params.data(), C, kF);
  for (int i = 0; i < C; i++) Pf.ln1w[i] += 1.0f, Pf.ln2w[i] += 1.0f;
  const size_t nps = mp_tp_block_params_count(&shape);
  fvec sparams(nps);
  mp_gpt_block_params Ps;
  mp_tp_block_params_point(&Ps, sparams.data(), &shape);
  ASSERT_EQ(MP_OK, mp_tp_block_params_extract(&shape, r, &Pf, &Ps, &err)) << err.message;

  // Both micro-batches' forwards; their activations stay alive until their W.
  std::vector<fvec> inp(kMicro), dout(kMicro), acts(kMicro);
  std::vector<mp_tp_block_acts> A(kMicro);
  for (int m = 0; m < kMicro; m++) {
    inp[m] = Rows(Random(21 + 2 * m, (size_t)kBT * C, -1, 1), C, row0, BTl);
    dout[m] = Rows(Random(22 + 2 * m, (size_t)kBT * C, -1, 1), C, row0, BTl);
    acts[m].resize(mp_tp_block_acts_count(&shape));
    mp_tp_block_acts_point(&A[m], acts[m].data(), &shape);
    ASSERT_EQ(MP_OK, mp_tp_block_forward(&tp, &shape, &Ps, &A[m], inp[m].data(), &err))
        << err.message;
  }
  // Scratch starts as NaN: neither backward may read what it did not write.
  fvec scratch(mp_tp_block_scratch_count(&shape), NAN);
  mp_tp_block_scratch S;
  mp_tp_block_scratch_point(&S, scratch.data(), &shape);
  // dinp accumulates (+=) into what is there: start from the same nonzero values.
  const fvec dinp0 = Random(30, nl, -1, 1);

  // Reference: the full backward, micro-batch after micro-batch.
  fvec full_grads(nps, 0.0f);
  mp_gpt_block_params Gf;
  mp_tp_block_params_point(&Gf, full_grads.data(), &shape);
  std::vector<fvec> full_dinp(kMicro, dinp0);
  for (int m = 0; m < kMicro; m++) {
    ASSERT_EQ(MP_OK, mp_tp_block_backward(&tp, &shape, full_dinp[m].data(), &Gf, &S,
                                          dout[m].data(), inp[m].data(), &Ps, &A[m], &err))
        << err.message;
  }

  // B1 B2, each into its own deferred (NaN first: B must write all of what W reads).
  std::fill(scratch.begin(), scratch.end(), NAN);
  fvec split_grads(nps, 0.0f);
  mp_gpt_block_params Gs;
  mp_tp_block_params_point(&Gs, split_grads.data(), &shape);
  std::vector<fvec> split_dinp(kMicro, dinp0), deferred(kMicro);
  std::vector<mp_tp_block_deferred> D(kMicro);
  for (int m = 0; m < kMicro; m++) {
    deferred[m].assign(mp_tp_block_deferred_count(&shape), NAN);
    ASSERT_EQ(deferred[m].size(), mp_tp_block_deferred_point(&D[m], deferred[m].data(), &shape));
    ASSERT_EQ(MP_OK, mp_tp_block_backward_input(&tp, &shape, split_dinp[m].data(), &Gs, &S, &D[m],
                                                dout[m].data(), inp[m].data(), &Ps, &A[m], &err))
        << err.message;
  }

  // After B alone: dinp is complete, every gradient but the four GEMM weights is added, and those
  // are untouched.
  const std::vector<size_t> sizes = GradSizes(shape);
  for (int m = 0; m < kMicro; m++) {
    EXPECT_TRUE(Bitwise("dinp of micro-batch " + std::to_string(m) + " after B" + where,
                        split_dinp[m].data(), full_dinp[m].data(), nl));
  }
  const fvec zeros(nps, 0.0f);
  for (size_t i = 0; i < sizes.size(); i++) {
    const GradField &g = kGradFields[i];
    const float *expected = g.weight_pass ? zeros.data() : Gf.*g.field;
    EXPECT_TRUE(Bitwise(std::string(g.name) + " after B" + where, Gs.*g.field, expected, sizes[i]));
  }

  // W1 W2, with the scratch reused by something else in between.
  std::fill(scratch.begin(), scratch.end(), NAN);
  for (int m = 0; m < kMicro; m++) mp_tp_block_backward_weight(&shape, &Gs, &D[m], &A[m]);
  for (size_t i = 0; i < sizes.size(); i++) {
    const GradField &g = kGradFields[i];
    EXPECT_TRUE(
        Bitwise(std::string(g.name) + " after B and W" + where, Gs.*g.field, Gf.*g.field, sizes[i]));
  }
  EXPECT_TRUE(Bitwise("all gradients after B and W" + where, split_grads.data(),
                      full_grads.data(), nps));
}

TEST(GptBlockSplitBackward, InputThenWeightEqualsFullBackward) { CheckSplitBackward(g_tp, false); }
TEST(GptBlockSplitBackward, InputThenWeightEqualsFullBackwardWithSequenceParallelism) {
  CheckSplitBackward(g_tp, true);
}
// tp = 1 whatever the world size, through the table that needs no communicator.
TEST(GptBlockSplitBackward, OneRankGroup) {
  const mp_tp_comm one = mp_tp_comm_single();
  CheckSplitBackward(one, false);
  CheckSplitBackward(one, true);
}

TEST(GptBlockSplitBackward, DeferredHoldsTheFourGemmOutputGradients) {
  for (int tp : {1, 2, 4}) {
    for (bool sp : {false, true}) {
      const mp_tp_block_shape shape = {{kB, kT, kC, kNH, kF}, tp, sp};
      const size_t bt = kBT, c = kC, cl = kC / tp, fl = kF / tp;
      const size_t count = mp_tp_block_deferred_count(&shape);
      EXPECT_EQ(2 * bt * c + bt * fl + 3 * bt * cl, count) << "tp " << tp << " sp " << sp;
      fvec memory(count);
      mp_tp_block_deferred d;
      EXPECT_EQ(count, mp_tp_block_deferred_point(&d, memory.data(), &shape));
      EXPECT_EQ(memory.data(), d.fcproj_dout);
      EXPECT_EQ(d.fcproj_dout + bt * c, d.dfch);
      EXPECT_EQ(d.dfch + bt * fl, d.attproj_dout);
      EXPECT_EQ(d.attproj_dout + bt * c, d.dqkv);
      EXPECT_EQ(memory.data() + count, d.dqkv + 3 * bt * cl);
    }
  }
}

TEST(GptBlockSplitBackward, InputPassWithoutDeferredIsAnInputError) {
  const mp_tp_comm one = mp_tp_comm_single();
  const mp_tp_block_shape shape = {{kB, kT, kC, kNH, kF}, 1, false};
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_block_backward_input(&one, &shape, nullptr, nullptr, nullptr,
                                                     nullptr, nullptr, nullptr, nullptr, nullptr,
                                                     &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "mp_tp_block_deferred")) << err.message;
}

// Groups smaller than the world: with 4 ranks, two tensor-parallel groups of 2 run side by side.
TEST(GptBlock, TwoGroupsOfTwoInsideFourRanks) {
  const int world_size = mp_comm_world_size(g_world), world_rank = mp_comm_world_rank(g_world);
  if (world_size != 4) GTEST_SKIP() << "needs 4 ranks, has " << world_size;
  const int members[2] = {world_rank / 2 * 2, world_rank / 2 * 2 + 1};
  mp_comm *group = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK, mp_comm_group_create(g_world, members, 2, "tp", &group, &err)) << err.message;
  const mp_tp_comm tp = mp_tp_comm_over_group(group);
  EXPECT_EQ(world_rank % 2, tp.rank);
  CheckBlock(tp, false);
  CheckBlock(tp, true);
  CheckSplitBackward(tp, false);
  CheckSplitBackward(tp, true);
  mp_comm_free(group);
}

TEST(GptBlock, ShapeCheckNamesWhatDoesNotDivide) {
  mp_error err = MP_ERROR_INITIALIZER;
  const mp_tp_block_shape heads = {{kB, kT, kC, kNH, kF}, 8, false};
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_block_shape_check(&heads, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "4 heads")) << err.message;
  const mp_tp_block_shape tokens = {{1, 3, kC, kNH, kF}, 2, true};
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_block_shape_check(&tokens, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "B*T = 3")) << err.message;
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding, tied LM head and cross-entropy against layers/ on the whole
// vocabulary: embedding -> logits = x @ wte^T -> mean loss, and back to dwte (both uses) and dwpe.
// V = 45 real entries of Vp = 64: with tp = 4, rank 2 holds 13 real entries and 3 of padding and
// rank 3 padding only, so the padding paths are exercised.

void CheckVocab(const mp_tp_comm &tp, bool sp) {
  const int P = tp.size, r = tp.rank, C = kC, V = 45, Vp = 64, maxT = 12, Vl = Vp / P;
  const int BTl = sp ? kBT / P : kBT, row0 = sp ? r * BTl : 0;
  const fvec wte = Random(20, (size_t)Vp * C, -1, 1), wpe = Random(21, (size_t)maxT * C, -1, 1);
  const std::vector<int32_t> tokens = RandomTokens(22, kBT, V), targets = RandomTokens(23, kBT, V);

  fvec emb((size_t)kBT * C), logits((size_t)kBT * Vp), probs((size_t)kBT * Vp), losses(kBT);
  mp_embedding_forward_cpu(emb.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, C);
  mp_matmul_forward_cpu(logits.data(), emb.data(), wte.data(), nullptr, kBT, C, Vp);
  const double loss = mp_cross_entropy_forward_cpu(losses.data(), probs.data(), logits.data(),
                                                   targets.data(), kB, kT, V, Vp);
  fvec dlogits((size_t)kBT * Vp, 0), demb((size_t)kBT * C, 0), dwte((size_t)Vp * C, 0);
  fvec dwpe((size_t)maxT * C, 0);
  mp_cross_entropy_backward_cpu(dlogits.data(), probs.data(), targets.data(), 1.0f, kB, kT, V, Vp);
  mp_matmul_backward_cpu(demb.data(), dwte.data(), nullptr, dlogits.data(), emb.data(), wte.data(),
                         kBT, C, Vp);
  mp_embedding_backward_cpu(dwte.data(), dwpe.data(), demb.data(), tokens.data(), kB, kT, C);

  const std::string where = Where(tp) + (sp ? " with sequence parallelism" : "");
  mp_error err = MP_ERROR_INITIALIZER;
  const fvec wte_s = Shard(wte, MP_TP_SPLIT_ROWS, Vp, C, r, P);
  EXPECT_EQ(r * Vl, mp_tp_vocab_start(Vp, P, r));

  // Embedding: zeros from the ranks that do not own a token add exactly, so the one-rank bits.
  fvec emb_l((size_t)BTl * C), work(sp ? (size_t)kBT * C : 0);
  ASSERT_EQ(MP_OK, mp_tp_vocab_embedding_forward(&tp, sp, emb_l.data(), tokens.data(), wte_s.data(),
                                                 wpe.data(), sp ? work.data() : nullptr, kB, kT, C,
                                                 Vp, &err))
      << err.message;
  EXPECT_TRUE(Close("embedding" + where, emb_l, Rows(emb, C, row0, BTl), 0.0));

  // Tied LM head: this rank's vocabulary columns of the logits.
  fvec logits_l((size_t)kBT * Vl), inp_total(sp ? (size_t)kBT * C : 0);
  ASSERT_EQ(MP_OK, mp_tp_lm_head_forward(&tp, sp, logits_l.data(), sp ? inp_total.data() : nullptr,
                                         emb_l.data(), wte_s.data(), kBT, C, Vp, &err))
      << err.message;
  EXPECT_TRUE(Close("logits" + where, logits_l, Shard(logits, MP_TP_SPLIT_COLS, kBT, Vp, r, P)));

  // Cross-entropy without gathering the logits.
  double loss_l = 0.0;
  fvec losses_l(kBT), probs_l((size_t)kBT * Vl),
      ce_work(mp_tp_vocab_cross_entropy_work_floats(&tp, kBT));
  ASSERT_EQ(MP_OK, mp_tp_vocab_cross_entropy_forward(&tp, &loss_l, losses_l.data(), probs_l.data(),
                                                     logits_l.data(), targets.data(),
                                                     ce_work.data(), kBT, V, Vp, &err))
      << err.message;
  EXPECT_LE(std::fabs(loss_l - loss), kRel * std::fabs(loss)) << loss_l << " vs " << loss << where;
  EXPECT_TRUE(Close("losses" + where, losses_l, losses));
  EXPECT_TRUE(Close("probs" + where, probs_l, Shard(probs, MP_TP_SPLIT_COLS, kBT, Vp, r, P)));
  const float loss_f = (float)loss_l;
  EXPECT_TRUE(SameOnEveryRank(tp, "loss", &loss_f, 1));

  fvec dlogits_l((size_t)kBT * Vl, 0);
  mp_tp_vocab_cross_entropy_backward(&tp, dlogits_l.data(), probs_l.data(), targets.data(), 1.0f,
                                     kBT, V, Vp);
  EXPECT_TRUE(Close("dlogits" + where, dlogits_l, Shard(dlogits, MP_TP_SPLIT_COLS, kBT, Vp, r, P)));

  fvec demb_l((size_t)BTl * C, 0), dwte_s((size_t)Vl * C, 0), dwpe_l((size_t)maxT * C, 0);
  fvec head_work(mp_tp_column_linear_work_floats(&tp, sp, kBT, C)),
      dout_total(sp ? (size_t)kBT * C : 0);
  ASSERT_EQ(MP_OK, mp_tp_lm_head_backward(&tp, sp, demb_l.data(), dwte_s.data(), dlogits_l.data(),
                                          sp ? inp_total.data() : emb_l.data(), wte_s.data(),
                                          head_work.data(), kBT, C, Vp, &err))
      << err.message;
  EXPECT_TRUE(Close("d(embedding output)" + where, demb_l, Rows(demb, C, row0, BTl)));
  ASSERT_EQ(MP_OK, mp_tp_vocab_embedding_backward(&tp, sp, dwte_s.data(), dwpe_l.data(),
                                                  demb_l.data(), sp ? dout_total.data() : nullptr,
                                                  tokens.data(), kB, kT, C, Vp, &err))
      << err.message;
  EXPECT_TRUE(Close("dwte (LM head + embedding)" + where, dwte_s,
                    Shard(dwte, MP_TP_SPLIT_ROWS, Vp, C, r, P)));
  EXPECT_TRUE(Close("dwpe" + where, dwpe_l, dwpe));
  EXPECT_TRUE(SameOnEveryRank(tp, "dwpe", dwpe_l.data(), dwpe_l.size()));
}

TEST(VocabParallel, EmbeddingHeadAndLossMatchOneRank) { CheckVocab(g_tp, false); }
TEST(VocabParallel, EmbeddingHeadAndLossMatchOneRankWithSequenceParallelism) {
  CheckVocab(g_tp, true);
}

TEST(VocabParallel, VocabularyMustDivide) {
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_OK, mp_tp_vocab_check(64, 4, &err));
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_vocab_check(64, 3, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "tp = 3")) << err.message;
}

// ---------------------------------------------------------------------------------------------
// A whole GPT (embedding, two blocks, final layernorm, tied LM head, loss) assembled from the
// tensor-parallel pieces, against engine/gpt_model.h's one-rank model on the same tokens. The
// shards are cut by tensor name from the one-rank model's initialised flat array, so this is
// also "tp = 2 starts from the numbers of tp = 1", and the gradients are compared tensor by
// tensor through the same cuts.

void CheckWholeModel(const mp_tp_comm &tp, bool sp) {
  const int P = tp.size, r = tp.rank, V = 45, L = 2;
  const std::string json =
      "{\"name\": \"tp-test\", \"vocab_size\": 45, \"seq_len\": 8, \"layers\": ["
      "{\"type\": \"embedding\", \"hidden\": 32},"
      "{\"type\": \"transformer\", \"hidden\": 32, \"heads\": 4, \"repeat\": 2},"
      "{\"type\": \"layernorm\", \"hidden\": 32},"
      "{\"type\": \"lm_head\", \"hidden\": 32}]}";
  mp_error err = MP_ERROR_INITIALIZER;
  mp_model *model = nullptr;
  mp_gpt *gpt = nullptr;
  ASSERT_EQ(MP_OK, mp_model_parse_text(json.c_str(), "tp-test.json", &model, &err)) << err.message;
  ASSERT_EQ(MP_OK, mp_gpt_create(model, kB, kT, &gpt, &err)) << err.message;
  const mp_gpt_config *cfg = mp_gpt_get_config(gpt);
  const int C = cfg->channels, F = cfg->ffn_channels, Vp = cfg->padded_vocab_size;
  ASSERT_EQ(kC, C);
  ASSERT_EQ(kF, F);

  const std::vector<int32_t> inputs = RandomTokens(50, kBT, V), targets = RandomTokens(51, kBT, V);
  mp_gpt_init_params(gpt, 1337);
  const double loss = mp_gpt_forward(gpt, inputs.data(), targets.data(), 1.0f);
  mp_gpt_zero_grads(gpt);
  mp_gpt_backward(gpt);

  // This rank's shard of every tensor, and zeroed gradients of the same shapes.
  std::map<std::string, fvec> param, grad, expected;
  for (int i = 0; i < mp_gpt_num_tensors(gpt); i++) {
    const mp_gpt_tensor *t = mp_gpt_tensor_at(gpt, i);
    mp_tp_split split;
    ASSERT_EQ(MP_OK, mp_tp_split_of(t->name, &split, &err)) << err.message;
    const fvec full_p(mp_gpt_params(gpt) + t->offset,
                      mp_gpt_params(gpt) + t->offset + t->rows * t->cols);
    const fvec full_g(mp_gpt_grads(gpt) + t->offset,
                      mp_gpt_grads(gpt) + t->offset + t->rows * t->cols);
    param[t->name] = Shard(full_p, split, t->rows, t->cols, r, P);
    expected[t->name] = Shard(full_g, split, t->rows, t->cols, r, P);
    grad[t->name] = fvec(param[t->name].size(), 0.0f);
  }
  auto block_view = [](std::map<std::string, fvec> &m, int l) {
    auto p = [&](const char *suffix) {
      return m["block." + std::to_string(l) + "." + suffix].data();
    };
    mp_gpt_block_params b = {p("ln1.weight"), p("ln1.bias"),         p("qkv.weight"),
                             p("qkv.bias"),   p("attn_proj.weight"), p("attn_proj.bias"),
                             p("ln2.weight"), p("ln2.bias"),         p("fc.weight"),
                             p("fc.bias"),    p("fc_proj.weight"),   p("fc_proj.bias")};
    return b;
  };

  const mp_tp_block_shape shape = {{kB, kT, C, cfg->num_heads, F}, P, sp};
  ASSERT_EQ(MP_OK, mp_tp_block_shape_check(&shape, &err)) << err.message;
  const int BTl = sp ? kBT / P : kBT, Vl = Vp / P;
  const size_t n = (size_t)BTl * C;

  // Forward.
  fvec x0(n), work((size_t)kBT * C);
  ASSERT_EQ(MP_OK, mp_tp_vocab_embedding_forward(
                       &tp, sp, x0.data(), inputs.data(), param["embedding.wte"].data(),
                       param["embedding.wpe"].data(), work.data(), kB, kT, C, Vp, &err))
      << err.message;
  std::vector<fvec> acts_mem(L, fvec(mp_tp_block_acts_count(&shape)));
  std::vector<mp_tp_block_acts> acts(L);
  std::vector<mp_gpt_block_params> bp(L), bg(L);
  const float *x = x0.data();
  for (int l = 0; l < L; l++) {
    mp_tp_block_acts_point(&acts[l], acts_mem[l].data(), &shape);
    bp[l] = block_view(param, l);
    bg[l] = block_view(grad, l);
    ASSERT_EQ(MP_OK, mp_tp_block_forward(&tp, &shape, &bp[l], &acts[l], x, &err)) << err.message;
    x = acts[l].out;
  }
  fvec lnf(n), lnf_mean(BTl), lnf_rstd(BTl), lnf_total(sp ? (size_t)kBT * C : 0);
  mp_layernorm_forward_cpu(lnf.data(), lnf_mean.data(), lnf_rstd.data(), x,
                           param["final_norm.weight"].data(), param["final_norm.bias"].data(), 1,
                           BTl, C);
  fvec logits((size_t)kBT * Vl), probs((size_t)kBT * Vl);
  ASSERT_EQ(MP_OK,
            mp_tp_lm_head_forward(&tp, sp, logits.data(), sp ? lnf_total.data() : nullptr,
                                  lnf.data(), param["embedding.wte"].data(), kBT, C, Vp, &err))
      << err.message;
  double loss_tp = 0.0;
  fvec ce_work(mp_tp_vocab_cross_entropy_work_floats(&tp, kBT));
  ASSERT_EQ(MP_OK,
            mp_tp_vocab_cross_entropy_forward(&tp, &loss_tp, nullptr, probs.data(), logits.data(),
                                              targets.data(), ce_work.data(), kBT, V, Vp, &err))
      << err.message;
  const std::string where = Where(tp) + (sp ? " with sequence parallelism" : "");
  EXPECT_LE(std::fabs(loss_tp - loss), kRel * std::fabs(loss))
      << "loss " << loss_tp << " vs one-rank " << loss << where;

  // Backward.
  fvec dlogits((size_t)kBT * Vl, 0.0f), dlnf(n, 0.0f), dx(n, 0.0f), dnext(n, 0.0f);
  fvec head_work(mp_tp_column_linear_work_floats(&tp, sp, kBT, C));
  mp_tp_vocab_cross_entropy_backward(&tp, dlogits.data(), probs.data(), targets.data(), 1.0f, kBT,
                                     V, Vp);
  ASSERT_EQ(MP_OK, mp_tp_lm_head_backward(&tp, sp, dlnf.data(), grad["embedding.wte"].data(),
                                          dlogits.data(), sp ? lnf_total.data() : lnf.data(),
                                          param["embedding.wte"].data(), head_work.data(), kBT, C,
                                          Vp, &err))
      << err.message;
  mp_layernorm_backward_cpu(
      dx.data(), grad["final_norm.weight"].data(), grad["final_norm.bias"].data(), dlnf.data(), x,
      param["final_norm.weight"].data(), lnf_mean.data(), lnf_rstd.data(), 1, BTl, C);
  fvec scratch(mp_tp_block_scratch_count(&shape));
  mp_tp_block_scratch S;
  mp_tp_block_scratch_point(&S, scratch.data(), &shape);
  for (int l = L - 1; l >= 0; l--) {
    std::fill(dnext.begin(), dnext.end(), 0.0f);
    const float *inp = l == 0 ? x0.data() : acts[l - 1].out;
    ASSERT_EQ(MP_OK, mp_tp_block_backward(&tp, &shape, dnext.data(), &bg[l], &S, dx.data(), inp,
                                          &bp[l], &acts[l], &err))
        << err.message;
    dx.swap(dnext);
  }
  fvec dout_total(sp ? (size_t)kBT * C : 0);
  ASSERT_EQ(MP_OK, mp_tp_vocab_embedding_backward(&tp, sp, grad["embedding.wte"].data(),
                                                  grad["embedding.wpe"].data(), dx.data(),
                                                  sp ? dout_total.data() : nullptr, inputs.data(),
                                                  kB, kT, C, Vp, &err))
      << err.message;
  // Once per step: layernorm gradients of token slices are partial with sequence parallelism.
  for (int l = 0; l < L; l++) {
    ASSERT_EQ(MP_OK, mp_tp_block_reduce_sequence_parallel_grads(&tp, &shape, &bg[l], &err))
        << err.message;
  }
  if (sp) {
    ASSERT_EQ(MP_OK, mp_tp_all_reduce_sum(&tp, grad["final_norm.weight"].data(), C, &err));
    ASSERT_EQ(MP_OK, mp_tp_all_reduce_sum(&tp, grad["final_norm.bias"].data(), C, &err));
  }

  for (const auto &kv : expected) {
    EXPECT_TRUE(Close("gradient of " + kv.first + where, grad[kv.first], kv.second));
  }
  mp_gpt_free(gpt);
  mp_model_free(model);
}

TEST(WholeModel, LossAndEveryGradientMatchTheOneRankModel) { CheckWholeModel(g_tp, false); }
TEST(WholeModel, LossAndEveryGradientMatchTheOneRankModelWithSequenceParallelism) {
  CheckWholeModel(g_tp, true);
}

// ---------------------------------------------------------------------------------------------
// Shards: which tensor splits how, round trips, and initialisation of a shard on its own.

TEST(Shard, GptTensorNamesSplitTheMegatronWay) {
  const struct {
    const char *name;
    mp_tp_split split;
  } cases[] = {
      {"embedding.wte", MP_TP_SPLIT_ROWS},
      {"embedding.wpe", MP_TP_REPLICATED},
      {"block.0.ln1.weight", MP_TP_REPLICATED},
      {"block.0.ln1.bias", MP_TP_REPLICATED},
      {"block.3.qkv.weight", MP_TP_SPLIT_QKV},
      {"block.3.qkv.bias", MP_TP_SPLIT_QKV},
      {"block.1.attn_proj.weight", MP_TP_SPLIT_COLS},
      {"block.1.attn_proj.bias", MP_TP_REPLICATED},
      {"block.2.ln2.weight", MP_TP_REPLICATED},
      {"block.2.ln2.bias", MP_TP_REPLICATED},
      {"block.11.fc.weight", MP_TP_SPLIT_ROWS},
      {"block.11.fc.bias", MP_TP_SPLIT_ROWS},
      {"block.11.fc_proj.weight", MP_TP_SPLIT_COLS},
      {"block.11.fc_proj.bias", MP_TP_REPLICATED},
      {"final_norm.weight", MP_TP_REPLICATED},
      {"final_norm.bias", MP_TP_REPLICATED},
  };
  mp_error err = MP_ERROR_INITIALIZER;
  for (const auto &c : cases) {
    mp_tp_split split = MP_TP_REPLICATED;
    ASSERT_EQ(MP_OK, mp_tp_split_of(c.name, &split, &err)) << c.name << ": " << err.message;
    EXPECT_EQ(c.split, split) << c.name;
  }
  mp_tp_split split;
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_split_of("block.0.mystery", &split, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "block.0.mystery")) << err.message;
}

TEST(Shard, EveryRanksShardPutBackRebuildsTheTensor) {
  const size_t rows = 96, cols = 32;  // rows a multiple of 3 * 4 for qkv
  const fvec full = Random(30, rows * cols, -1, 1);
  for (mp_tp_split split :
       {MP_TP_REPLICATED, MP_TP_SPLIT_ROWS, MP_TP_SPLIT_COLS, MP_TP_SPLIT_QKV}) {
    for (int size : {1, 2, 4}) {
      fvec rebuilt(full.size(), 0.0f);
      size_t total = 0;
      for (int rank = 0; rank < size; rank++) {
        const fvec shard = Shard(full, split, rows, cols, rank, size);
        total += shard.size();
        mp_error err = MP_ERROR_INITIALIZER;
        ASSERT_EQ(MP_OK, mp_tp_shard_insert(rebuilt.data(), shard.data(), split, rows, cols, rank,
                                            size, &err))
            << err.message;
      }
      EXPECT_EQ(full, rebuilt) << mp_tp_split_name(split) << " over " << size;
      EXPECT_EQ(split == MP_TP_REPLICATED ? full.size() * size : full.size(), total);
    }
  }
}

TEST(Shard, QkvShardHoldsTheRanksHeadsOfEachOfQKV) {
  const size_t C = 8, rows = 3 * C, cols = 2;
  fvec full(rows * cols);
  for (size_t i = 0; i < full.size(); i++) full[i] = (float)(i / cols);  // each row holds its index
  const fvec shard = Shard(full, MP_TP_SPLIT_QKV, rows, cols, 1, 2);     // rank 1 of 2: rows 4..7
  const fvec expected = {4,  4,  5,  5,  6,  6,  7,  7,  12, 12, 13, 13,
                         14, 14, 15, 15, 20, 20, 21, 21, 22, 22, 23, 23};
  EXPECT_EQ(expected, shard);
}

TEST(Shard, SplitThatDoesNotDivideIsAnInputError) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
  int count = 0;
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_shard_blocks(MP_TP_SPLIT_ROWS, 30, 4, 0, 4, blocks, &count, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "tp = 4")) << err.message;
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_shard_blocks(MP_TP_SPLIT_QKV, 12, 4, 0, 8, blocks, &count, &err));
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_shard_blocks(MP_TP_SPLIT_COLS, 4, 4, 4, 4, blocks, &count, &err));
}

// A shard drawn on its own from (seed, name, global index) equals the shard cut from the full
// initialisation: tp = 2 starts from the numbers of tp = 1 without building the full model.
TEST(Shard, InitialisingAShardEqualsCuttingItFromTheFullInit) {
  const struct {
    const char *name;
    size_t rows, cols;
  } tensors[] = {
      {"embedding.wte", 64, kC},
      {"block.0.qkv.weight", 3 * kC, kC},
      {"block.0.attn_proj.weight", kC, kC},
      {"block.1.fc.weight", kF, kC},
      {"block.1.fc_proj.weight", kC, kF},
      {"embedding.wpe", 8, kC},
  };
  const uint64_t seed = 1337;
  mp_error err = MP_ERROR_INITIALIZER;
  for (const auto &t : tensors) {
    mp_tp_split split;
    ASSERT_EQ(MP_OK, mp_tp_split_of(t.name, &split, &err)) << err.message;
    fvec full(t.rows * t.cols);
    mp_init_fill_normal(full.data(), full.size(), seed, t.name, 0, 0.02f);
    for (int size : {1, 2, 4}) {
      for (int rank = 0; rank < size; rank++) {
        mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
        int count = 0;
        ASSERT_EQ(MP_OK,
                  mp_tp_shard_blocks(split, t.rows, t.cols, rank, size, blocks, &count, &err))
            << err.message;
        fvec drawn(mp_tp_shard_floats(split, t.rows, t.cols, size));
        for (int k = 0; k < count; k++) {
          const mp_tp_shard_block &b = blocks[k];
          mp_init_fill_normal_block(drawn.data() + b.shard_offset, b.rows, b.cols, b.row_offset,
                                    b.col_offset, t.cols, seed, t.name, 0.02f);
        }
        EXPECT_EQ(Shard(full, split, t.rows, t.cols, rank, size), drawn)
            << t.name << " rank " << rank << " of " << size;
      }
    }
  }
}

TEST(Shard, BlockParametersRoundTrip) {
  const mp_gpt_block_shape full = {kB, kT, kC, kNH, kF};
  const size_t np = mp_gpt_block_params_count(kC, kF);
  fvec params = Random(40, np, -1, 1), rebuilt(np, 0.0f);
  mp_gpt_block_params Pf, Pr;
  mp_gpt_block_params_point(&Pf, params.data(), kC, kF);
  mp_gpt_block_params_point(&Pr, rebuilt.data(), kC, kF);
  for (int size : {1, 2, 4}) {
    const mp_tp_block_shape shape = {full, size, false};
    size_t total = 0;
    for (int rank = 0; rank < size; rank++) {
      fvec shard(mp_tp_block_params_count(&shape));
      total += shard.size();
      mp_gpt_block_params Ps;
      mp_tp_block_params_point(&Ps, shard.data(), &shape);
      mp_error err = MP_ERROR_INITIALIZER;
      ASSERT_EQ(MP_OK, mp_tp_block_params_extract(&shape, rank, &Pf, &Ps, &err)) << err.message;
      ASSERT_EQ(MP_OK, mp_tp_block_params_insert(&shape, rank, &Ps, &Pr, &err)) << err.message;
    }
    EXPECT_EQ(params, rebuilt) << "tp " << size;
    // Only the six replicated vectors (ln1, ln2, the two row-parallel biases) are held tp times.
    EXPECT_EQ(np + (size_t)(size - 1) * 6 * kC, total) << "tp " << size;
  }
}

}  // namespace

static void set_tp(mp_comm *all) { g_tp = mp_tp_comm_over_group(all); }

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "tp_layers_test", &g_world, &g_all, set_tp);
}
