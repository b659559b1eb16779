/*
 * layers/cross_entropy.c — fused softmax and cross-entropy on the CPU; see cross_entropy.h.
 *
 * The loss is computed as log(sum exp(logit - max)) - (logit[target] - max), not -log(prob), so a
 * probability that rounds to 0 still gives a finite loss.
 */
#include "layers/cross_entropy.h"

#include <math.h>
#include <stddef.h>

double mp_cross_entropy_forward_cpu(float *losses, float *probs, const float *logits,
                                    const int32_t *targets, int B, int T, int V, int Vp) {
  const size_t rows = (size_t)B * T;
  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; r++) {
    const float *logits_r = logits + r * Vp;
    float *probs_r = probs + r * Vp;

    float maxval = -INFINITY;
    for (int i = 0; i < V; i++) {
      if (logits_r[i] > maxval) maxval = logits_r[i];
    }
    float sum = 0.0f;
    for (int i = 0; i < V; i++) {
      probs_r[i] = expf(logits_r[i] - maxval);
      sum += probs_r[i];
    }
    const float sum_inv = 1.0f / sum;
    for (int i = 0; i < V; i++) probs_r[i] *= sum_inv;
    for (int i = V; i < Vp; i++) probs_r[i] = 0.0f;

    const float loss = logf(sum) - (logits_r[targets[r]] - maxval);
    if (losses != NULL) losses[r] = loss;
    loss_sum += loss;
  }
  return loss_sum / (double)rows;
}

void mp_cross_entropy_backward_cpu(float *dlogits, const float *probs, const int32_t *targets,
                                   float dloss, int B, int T, int V, int Vp) {
  const size_t rows = (size_t)B * T;
  const float dloss_token = dloss / (float)rows;
  for (size_t r = 0; r < rows; r++) {
    const float *probs_r = probs + r * Vp;
    float *dlogits_r = dlogits + r * Vp;
    const int target = targets[r];
    for (int i = 0; i < V; i++) {
      const float indicator = i == target ? 1.0f : 0.0f;
      dlogits_r[i] += (probs_r[i] - indicator) * dloss_token;
    }
  }
}
