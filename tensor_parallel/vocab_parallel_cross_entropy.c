/* tensor_parallel/vocab_parallel_cross_entropy.c — cross-entropy over vocabulary-split logits;
 * see the header. */
#include "tensor_parallel/vocab_parallel_cross_entropy.h"

#include <math.h>

#include "layers/cross_entropy.h"

#include "tensor_parallel/vocab_parallel_embedding.h"

size_t mp_tp_vocab_cross_entropy_work_floats(const mp_tp_comm *tp, int BT) {
  return ((size_t)tp->size + 3) * (size_t)BT;
}

/* Local columns [0, real) are real vocabulary entries, [real, Vl) padding. */
static int local_real_columns(int V, int start, int Vl) {
  int real = V - start;
  if (real < 0) real = 0;
  if (real > Vl) real = Vl;
  return real;
}

mp_status mp_tp_vocab_cross_entropy_forward(const mp_tp_comm *tp, double *mean_loss, float *losses,
                                            float *probs, const float *logits,
                                            const int32_t *targets, float *work, int BT, int V,
                                            int Vp, mp_error *err) {
  MP_TRY(mp_tp_vocab_check(Vp, tp->size, err));
  const int Vl = Vp / tp->size, start = mp_tp_vocab_start(Vp, tp->size, tp->rank);
  const int real = local_real_columns(V, start, Vl);
  const size_t rows = (size_t)BT;
  float *maxes = work;               /* (BT) */
  float *sums = work + rows;         /* (BT, 2): sum of exp, target logit - max */
  float *gathered = work + 3 * rows; /* (tp, BT) */

  for (size_t r = 0; r < rows; r++) maxes[r] = mp_softmax_row_max_cpu(logits + r * Vl, real);
  MP_TRY(mp_tp_all_reduce_max(tp, maxes, gathered, rows, err));

  for (size_t r = 0; r < rows; r++) {
    const float *row = logits + r * Vl;
    float *prow = probs + r * Vl;
    const int local = targets[r] - start;
    /* Read before probs is written: probs may be the logits' own buffer. */
    sums[2 * r + 1] = local >= 0 && local < real ? row[local] - maxes[r] : 0.0f;
    sums[2 * r] = mp_softmax_row_exp_cpu(prow, row, real, maxes[r]);
    for (int i = real; i < Vl; i++) prow[i] = 0.0f;
  }
  MP_TRY(mp_tp_all_reduce_sum(tp, sums, 2 * rows, err));

  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; r++) {
    mp_softmax_row_scale_cpu(probs + r * Vl, real, 1.0f / sums[2 * r]);
    const float loss = logf(sums[2 * r]) - sums[2 * r + 1];
    if (losses != NULL) losses[r] = loss;
    loss_sum += loss;
  }
  *mean_loss = loss_sum / (double)rows;
  return MP_OK;
}

void mp_tp_vocab_cross_entropy_backward(const mp_tp_comm *tp, float *dlogits, const float *probs,
                                        const int32_t *targets, float dloss, int BT, int V,
                                        int Vp) {
  const int Vl = Vp / tp->size, start = mp_tp_vocab_start(Vp, tp->size, tp->rank);
  const int real = local_real_columns(V, start, Vl);
  const float dloss_token = dloss / (float)BT;
  for (size_t r = 0; r < (size_t)BT; r++) {
    const float *prow = probs + r * Vl;
    float *drow = dlogits + r * Vl;
    const int local = targets[r] - start;
    for (int i = 0; i < real; i++) {
      const float indicator = i == local ? 1.0f : 0.0f;
      drow[i] += (prow[i] - indicator) * dloss_token;
    }
  }
}

void mp_tp_vocab_cross_entropy_backward_in_place(const mp_tp_comm *tp, float *probs_dlogits,
                                                 const int32_t *targets, float dloss, int BT,
                                                 int V, int Vp) {
  const int Vl = Vp / tp->size, start = mp_tp_vocab_start(Vp, tp->size, tp->rank);
  const int real = local_real_columns(V, start, Vl);
  const float dloss_token = dloss / (float)BT;
  for (size_t r = 0; r < (size_t)BT; r++) {
    const int local = targets[r] - start;
    mp_cross_entropy_row_backward_in_place_cpu(probs_dlogits + r * Vl, real, Vl,
                                               local >= 0 && local < real ? local : -1,
                                               dloss_token);
  }
}
