/*
 * layers/adamw.h — the optimizer step: global gradient-norm clipping, then AdamW.
 *
 * Clipping comes in three parts so parallel code can put a sum across ranks in the middle: each
 * rank takes the squared norm of the gradients it owns (mp_grad_norm_squared_cpu), the squares
 * are summed over the ranks, mp_clip_scale turns the global norm into one factor, and each rank
 * scales its gradients by it (mp_grad_scale_cpu). A one-rank run does the same with no sum.
 *
 * AdamW is Loshchilov and Hutter's, as in PyTorch and llm.c: Adam moments with bias correction,
 * and weight decay applied to the parameter directly (decoupled), not added to the gradient.
 * Which tensors are decayed is the caller's choice: it calls the update once per group with its
 * own weight_decay. These calls cannot fail. A later CUDA twin (_cuda) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_ADAMW_H
#define MPENGINE_LAYERS_ADAMW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step, t = 1 for the first step. For each of the n elements, with g = grads[i]:
 *   m = beta1 m + (1 - beta1) g;          v = beta2 v + (1 - beta2) g^2
 *   m_hat = m / (1 - beta1^t);            v_hat = v / (1 - beta2^t)
 *   param -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay param)
 *   params (n) updated in place
 *   grads  (n)
 *   m      (n) first moment, updated (zero before step 1)
 *   v      (n) second moment, updated (zero before step 1) */
void mp_adamw_update_cpu(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t);

/* Sum of grads[i]^2 over n elements, accumulated in double in index order, so the result is the
 * same on every run. The global gradient norm is the square root of its sum over all tensors
 * (and ranks).
 *   grads (n) */
double mp_grad_norm_squared_cpu(const float *grads, size_t n);

/* The factor to multiply every gradient by so the global norm is at most max_norm:
 * max_norm / norm when norm > max_norm, else 1. max_norm <= 0 turns clipping off (returns 1).
 * A norm that is NaN also returns 1: callers check the norm is finite before stepping. */
float mp_clip_scale(double norm, double max_norm);

/* grads *= scale, elementwise.
 *   grads (n) updated in place */
void mp_grad_scale_cpu(float *grads, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_ADAMW_H */
