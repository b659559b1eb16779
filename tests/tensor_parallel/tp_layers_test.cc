// tests/tensor_parallel/tp_layers_test.cc — tensor-parallel layers against the one-rank layers,
// run under mpirun with 1, 2 and 4 ranks (tp_layers_test.sh).
//
// DESIGN.md's principle 2 (parallel equals serial), layer by layer: every rank builds the whole
// (tp = 1) computation on the CPU from the same seeded inputs with layers/, runs its shard with
// tensor_parallel/ over a group of all ranks, and compares what it holds (its output columns or
// token rows, its gradient shards) with the matching slice of the reference. Covered, each with
// and without sequence parallelism: the communication pairs, column- and row-parallel linear,
// vocab-parallel embedding with the tied LM head and cross-entropy; plus shard slicing, round
// trips and shard-by-shard initialisation. The whole stage built from these pieces (the stage
// chain, engine/model/stage_chain.h) is checked against the one-rank model, its zero-bubble split
// and recomputation bit for bit, in tests/engine/stage_cpu_test.cc.
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
// Its own main: MPI through engine/comm/comm.h, only world rank 0 writes the XML report, and the
// run fails if any rank failed.
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

#include "engine/comm/comm.h"
#include "engine/model/param_layout.h"
#include "engine/model/stage_cpu.h"
#include "engine/model/param_init.h"
#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/gpt_block.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/row_parallel_linear.h"
#include "tensor_parallel/shard.h"
#include "tensor_parallel/tp_comm.h"
#include "tensor_parallel/vocab_parallel_cross_entropy.h"
#include "tensor_parallel/vocab_parallel_embedding.h"
#include "engine/comm/tp_comm_mpi.h"
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
                                                 wpe.data(), nullptr, sp ? work.data() : nullptr,
                                                 kB, kT, C, Vp, &err))
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
  ASSERT_EQ(MP_OK, mp_tp_vocab_embedding_backward(&tp, sp, dwte_s.data(), dwpe_l.data(), nullptr,
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


}  // namespace

static void set_tp(mp_comm *all) { g_tp = mp_tp_comm_over_group(all); }

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "tp_layers_test", &g_world, &g_all, set_tp);
}
