/*
 * layers/cross_entropy.h — the training loss: softmax over the vocabulary fused with
 * cross-entropy against the next token, averaged over all B * T tokens.
 *
 * Logits come from the LM head with Vp >= V columns: llm.c pads the vocabulary (50257 to 50304)
 * so GEMMs tile well. Only the first V columns are real; the padded ones take no part in the
 * softmax, get probability 0 and gradient 0, whatever their logits hold.
 *
 * The loss is the mean over tokens, and the backward starts from the gradient of that mean
 * (dloss, 1 for a plain step, 1 / micro-batches when several accumulate into one step). The sum
 * runs in double in a fixed order. These calls cannot fail: targets must lie in [0, V), which
 * mp_embedding_check_tokens checks where data enters. A later CUDA twin (_cuda) keeps the same
 * shapes.
 */
#ifndef MPENGINE_LAYERS_CROSS_ENTROPY_H
#define MPENGINE_LAYERS_CROSS_ENTROPY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Softmax of each token's first V logits and the loss -log p[target]; returns the mean loss
 * over the B * T tokens.
 *   losses  (B, T)      written: each token's loss, or NULL when only the mean is wanted
 *   probs   (B, T, Vp)  written: softmax over columns [0, V), 0 in columns [V, Vp)
 *   logits  (B, T, Vp)
 *   targets (B, T)      each in [0, V) */
double mp_cross_entropy_forward_cpu(float *losses, float *probs, const float *logits,
                                    const int32_t *targets, int B, int T, int V, int Vp);

/* Backward of the mean loss: dlogits += (probs - onehot(target)) * dloss / (B * T) in columns
 * [0, V); columns [V, Vp) are left as they are (their gradient is 0).
 *   dlogits (B, T, Vp)  +=
 *   probs   (B, T, Vp)  as the forward wrote it
 *   targets (B, T)
 *   dloss               gradient of whatever follows with respect to the mean loss */
void mp_cross_entropy_backward_cpu(float *dlogits, const float *probs, const int32_t *targets,
                                   float dloss, int B, int T, int V, int Vp);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_CROSS_ENTROPY_H */
