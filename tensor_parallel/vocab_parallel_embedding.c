/* tensor_parallel/vocab_parallel_embedding.c — vocabulary-split embedding and tied LM head; see
 * the header. */
#include "tensor_parallel/vocab_parallel_embedding.h"

#include <string.h>

#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/mappings.h"

mp_status mp_tp_vocab_check(int Vp, int tp, mp_error *err) {
  if (tp < 1 || Vp <= 0 || Vp % tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "vocab-parallel embedding: the padded vocabulary of %d rows does not divide "
                   "over tp = %d ranks; pad the vocabulary to a multiple of 64 * tp or choose a "
                   "tp that divides %d",
                   Vp, tp, Vp);
  }
  return MP_OK;
}

int mp_tp_vocab_start(int Vp, int tp, int rank) { return rank * (Vp / tp); }

/* out (rows, C) = wte rows of tokens[first + i] that this rank owns, 0 for the others. */
static void lookup(float *out, const int32_t *tokens, size_t first, size_t rows,
                   const float *wte_shard, int C, int start, int Vl) {
  for (size_t i = 0; i < rows; i++) {
    float *row = out + i * C;
    const int local = tokens[first + i] - start;
    if (local >= 0 && local < Vl) {
      memcpy(row, wte_shard + (size_t)local * C, (size_t)C * sizeof(float));
    } else {
      memset(row, 0, (size_t)C * sizeof(float));
    }
  }
}

/* The wpe row of flattened token i: its position in its sequence (positions[i % T], or i % T). */
static size_t position_of(const int32_t *positions, size_t i, int T) {
  const size_t t = i % (size_t)T;
  return positions != NULL ? (size_t)positions[t] : t;
}

/* out (rows, C) += wpe[position of token first + i] for each row i; nothing without a table
 * (rope). */
static void add_positions(float *out, const float *wpe, const int32_t *positions, size_t first,
                          size_t rows, int T, int C) {
  if (wpe == NULL) return;
  for (size_t i = 0; i < rows; i++) {
    float *row = out + i * C;
    const float *pos = wpe + position_of(positions, first + i, T) * C;
    for (int c = 0; c < C; c++) row[c] += pos[c];
  }
}

mp_status mp_tp_vocab_embedding_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                        const int32_t *tokens, const float *wte_shard,
                                        const float *wpe, const int32_t *positions, float *work,
                                        int B, int T, int C, int Vp, mp_error *err) {
  MP_TRY(mp_tp_vocab_check(Vp, tp->size, err));
  const size_t bt = (size_t)B * T;
  const int Vl = Vp / tp->size, start = mp_tp_vocab_start(Vp, tp->size, tp->rank);
  if (sequence_parallel) {
    const size_t rows_local = bt / (size_t)tp->size;
    lookup(work, tokens, 0, bt, wte_shard, C, start, Vl);
    MP_TRY(mp_tp_reduce_scatter_to_sequence_forward(tp, work, out, rows_local * C, err));
    add_positions(out, wpe, positions, (size_t)tp->rank * rows_local, rows_local, T, C);
    return MP_OK;
  }
  lookup(out, tokens, 0, bt, wte_shard, C, start, Vl);
  MP_TRY(mp_tp_reduce_from_region_forward(tp, out, bt * C, err));
  add_positions(out, wpe, positions, 0, bt, T, C);
  return MP_OK;
}

mp_status mp_tp_vocab_embedding_backward(const mp_tp_comm *tp, bool sequence_parallel,
                                         float *dwte_shard, float *dwpe, const int32_t *positions,
                                         const float *dout, float *dout_total,
                                         const int32_t *tokens, int B, int T, int C, int Vp,
                                         mp_error *err) {
  MP_TRY(mp_tp_vocab_check(Vp, tp->size, err));
  const size_t bt = (size_t)B * T;
  const int Vl = Vp / tp->size, start = mp_tp_vocab_start(Vp, tp->size, tp->rank);
  const float *g = dout;
  if (sequence_parallel) {
    MP_TRY(mp_tp_reduce_scatter_to_sequence_backward(tp, dout, dout_total,
                                                     bt / (size_t)tp->size * C, err));
    g = dout_total;
  }
  /* Same order as mp_embedding_backward_cpu: token by token, wte then wpe. */
  for (size_t i = 0; i < bt; i++) {
    const float *d = g + i * C;
    const int local = tokens[i] - start;
    if (local >= 0 && local < Vl) {
      float *drow = dwte_shard + (size_t)local * C;
      for (int c = 0; c < C; c++) drow[c] += d[c];
    }
    if (dwpe == NULL) continue;
    float *dpos = dwpe + position_of(positions, i, T) * C;
    for (int c = 0; c < C; c++) dpos[c] += d[c];
  }
  return MP_OK;
}

mp_status mp_tp_lm_head_forward(const mp_tp_comm *tp, bool sequence_parallel, float *logits,
                                float *inp_total, const float *inp, const float *wte_shard, int BT,
                                int C, int Vp, mp_error *err) {
  MP_TRY(mp_tp_vocab_check(Vp, tp->size, err));
  return mp_tp_column_linear_forward(tp, sequence_parallel, logits, inp_total, inp, wte_shard, NULL,
                                     BT, C, Vp / tp->size, err);
}

mp_status mp_tp_lm_head_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                 float *dwte_shard, const float *dlogits, const float *inp_total,
                                 const float *wte_shard, float *work, int BT, int C, int Vp,
                                 mp_error *err) {
  MP_TRY(mp_tp_vocab_check(Vp, tp->size, err));
  return mp_tp_column_linear_backward(tp, sequence_parallel, dinp, dwte_shard, NULL, dlogits,
                                      inp_total, wte_shard, work, BT, C, Vp / tp->size, err);
}
