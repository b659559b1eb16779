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
 * mp_embedding_check_tokens checks where data enters. The CUDA twin (_cuda, at the end of this
 * header) fuses forward and backward in place on bf16 logits, as llm.c does.
 */
#ifndef MPENGINE_LAYERS_CROSS_ENTROPY_H
#define MPENGINE_LAYERS_CROSS_ENTROPY_H

#include <stdint.h>

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Softmax of each token's first V logits and the loss -log p[target]; returns the mean loss
 * over the B * T tokens.
 *   losses  (B, T)      written: each token's loss, or NULL when only the mean is wanted
 *   probs   (B, T, Vp)  written: softmax over columns [0, V), 0 in columns [V, Vp); may be the
 *                       logits' own buffer (then the logits are overwritten)
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

/* The same gradient written over the probabilities, for a caller that keeps no other copy:
 * probs_dlogits = (probs - onehot(target)) * dloss / (B * T) in columns [0, V), 0 in [V, Vp).
 * Equal, bit for bit, to mp_cross_entropy_backward_cpu onto zeroed dlogits, without the zeroing
 * pass or a second (B, T, Vp) buffer.
 *   probs_dlogits (B, T, Vp)  in: probs as the forward wrote them; out: dlogits
 *   targets       (B, T)
 *   dloss                     gradient of whatever follows with respect to the mean loss */
void mp_cross_entropy_backward_in_place_cpu(float *probs_dlogits, const int32_t *targets,
                                            float dloss, int B, int T, int V, int Vp);

/* The pieces of one row's softmax and its in-place backward, for a softmax whose maximum and sum
 * span several ranks (tensor_parallel/vocab_parallel_cross_entropy.h combines them between the
 * pieces); over a whole row they are the forward and the in-place backward above, bit for bit.
 *   mp_softmax_row_max_cpu    the maximum of logits[0, n) (-inf for n = 0)
 *   mp_softmax_row_exp_cpu    probs[i] = e^(logits[i] - max) for i < n (probs may be logits);
 *                             returns their sum
 *   mp_softmax_row_scale_cpu  probs[i] *= scale for i < n
 *   mp_cross_entropy_row_backward_in_place_cpu
 *                             row[i] = (p[i] - [i == target]) * dloss_token for i < n, 0 for
 *                             n <= i < width; target -1 when it is not in this row's columns */
float mp_softmax_row_max_cpu(const float *logits, int n);
float mp_softmax_row_exp_cpu(float *probs, const float *logits, int n, float max);
void mp_softmax_row_scale_cpu(float *probs, int n, float scale);
void mp_cross_entropy_row_backward_in_place_cpu(float *row, int n, int width, int target,
                                                float dloss_token);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/cross_entropy_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them. */

/* Forward and backward fused, in place (llm.c's fused classifier): one block per token row takes
 * the max and the sum of exponentials of logits [0, V) in fp32, writes the token's loss, then
 * overwrites the row with the gradient of the mean loss. The caller sums `losses` on the host
 * (in double, in order) for the mean.
 *   losses  (B, T)      written: each token's loss,
 *                       log(sum exp(logit - max)) - (logit[target] - max)
 *   logits  (B, T, Vp)  in: logits (columns [V, Vp) are ignored, whatever they hold);
 *                       out: dlogits = (softmax - onehot(target)) * dloss / (B * T) in [0, V),
 *                       0 in [V, Vp)   (written, not added: the CPU backward's += onto zeros)
 *   targets (B, T)      each in [0, V)
 *   dloss               gradient with respect to the mean loss */
void mp_cross_entropy_fused_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                                 float dloss, int B, int T, int V, int Vp, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_CROSS_ENTROPY_H */
