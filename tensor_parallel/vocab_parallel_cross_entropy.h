/*
 * tensor_parallel/vocab_parallel_cross_entropy.h — softmax cross-entropy over logits split by
 * vocabulary across the tensor-parallel group, without gathering them (Megatron's
 * vocab_parallel_cross_entropy).
 *
 * Rank r holds the logits of vocabulary entries [r*Vl, (r+1)*Vl), Vl = Vp/tp (the tied LM head's
 * output, vocab_parallel_embedding.h); of those, entries >= V are padding and take no part (as in
 * layers/cross_entropy.h). Per token, three small collectives replace the (BT, Vp) gather:
 *   1. the max over the real logits: each rank's max, combined by an all-gather of the BT maxima
 *      (the table has no max operation; mp_tp_all_reduce_max);
 *   2. the sum of exp(logit - max): each rank's partial sum, all-reduced;
 *   3. the target's logit: its owner contributes logit - max, the others 0, all-reduced (2 and 3
 *      travel in one all-reduce of 2 BT floats).
 * loss = log(sum) - (logit[target] - max), as in layers/cross_entropy.c, identical on every rank;
 * each row's pieces are layers/cross_entropy.h's (sixteen lanes, the polynomial exponential), so
 * at tp = 1 the loss and probabilities are that one-rank kernel's bits.
 * The backward needs no communication: dlogits = (softmax - onehot(target)) * dloss / BT on the
 * local columns, the onehot only on the target's owner.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_CROSS_ENTROPY_H
#define MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_CROSS_ENTROPY_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of scratch the forward needs: (tp + 3) * BT. */
size_t mp_tp_vocab_cross_entropy_work_floats(const mp_tp_comm *tp, int BT);

/* Forward over BT tokens.
 *   mean_loss  written: the mean loss over the BT tokens (summed in double in token order; the
 *              same on every rank)
 *   losses     (BT) written: each token's loss, or NULL
 *   probs      (BT, Vl) written: softmax probabilities of the local columns, 0 for padding; may
 *              be the logits' own buffer (then the logits are overwritten)
 *   logits     (BT, Vl) this rank's columns
 *   targets    (BT) each in [0, V)
 *   work       mp_tp_vocab_cross_entropy_work_floats floats of scratch
 * V real entries of a padded vocabulary of Vp (a multiple of tp). Returns MP_OK, MP_ERR_INPUT
 * when Vp does not divide over the group, or a collective's error. */
mp_status mp_tp_vocab_cross_entropy_forward(const mp_tp_comm *tp, double *mean_loss, float *losses,
                                            float *probs, const float *logits,
                                            const int32_t *targets, float *work, int BT, int V,
                                            int Vp, mp_error *err);

/* Backward of the mean loss: dlogits += (probs - onehot(target)) * dloss / BT on the local real
 * columns; padded columns are left as they are. No communication.
 *   dlogits (BT, Vl) +=
 *   probs   (BT, Vl) as the forward wrote it
 *   targets (BT) */
void mp_tp_vocab_cross_entropy_backward(const mp_tp_comm *tp, float *dlogits, const float *probs,
                                        const int32_t *targets, float dloss, int BT, int V, int Vp);

/* The same written over the forward's probabilities in place (probs_dlogits (BT, Vl): the
 * probabilities in, dlogits out, padded columns 0), as layers/cross_entropy.h's in-place backward
 * does on one rank: at tp = 1 both give the same bits. No communication. */
void mp_tp_vocab_cross_entropy_backward_in_place(const mp_tp_comm *tp, float *probs_dlogits,
                                                 const int32_t *targets, float dloss, int BT,
                                                 int V, int Vp);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_CROSS_ENTROPY_H */
