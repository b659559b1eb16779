/*
 * tensor_parallel/vocab_parallel_embedding.h — the token embedding split by vocabulary across the
 * tensor-parallel group, and the LM head tied to it (Megatron's VocabParallelEmbedding and its
 * parallel_lm_logits).
 *
 * The padded vocabulary Vp (a multiple of 64, engine/model/param_layout.h) is cut into tp contiguous
 * ranges of Vl = Vp/tp rows: rank r owns wte rows [r*Vl, (r+1)*Vl). A lookup of a token outside
 * a rank's range gives 0 there, and an all-reduce (reduce_from_region) leaves the token's row on
 * every rank; with sequence parallelism a reduce-scatter leaves each rank its token slice. Adding
 * zeros is exact, so the sum is bitwise the one-rank lookup. The position table wpe is
 * replicated and added once, after the reduction.
 *
 * The tied LM head, logits = x @ wte^T, is then a column-parallel linear without bias over the
 * same shard: each rank computes the logits of its vocabulary range (BT, Vl), and
 * vocab_parallel_cross_entropy.h takes the loss without ever gathering the full logits. Its
 * weight gradient goes into the same dwte shard as the embedding's.
 *
 * Returns MP_OK or a collective's error (tp_comm.h); no memory is allocated. Tokens must lie in
 * [0, V) (mp_embedding_check_tokens, where data enters).
 */
#ifndef MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_EMBEDDING_H
#define MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_EMBEDDING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MP_OK, or MP_ERR_INPUT when the padded vocabulary Vp does not divide over tp ranks (pad it to
 * a multiple of 64 * tp or choose a tp that divides it). */
mp_status mp_tp_vocab_check(int Vp, int tp, mp_error *err);

/* First row of rank `rank`'s vocabulary range: rank * Vp / tp. */
int mp_tp_vocab_start(int Vp, int tp, int rank);

/* out[b, t, :] = wte[tokens[b, t], :] + wpe[p(t), :], the rows of wte owned across the group;
 * p(t) = positions[t], or t when positions is NULL (a context-parallel rank's tokens sit at the
 * positions context_parallel/sequence_split.h gives).
 *   out       (BT, C) replicated, or with sequence parallelism (BT/tp, C), this rank's token
 *             slice (rows [rank*BT/tp, (rank+1)*BT/tp) of the flattened batch)
 *   tokens    (B, T)  every token of the micro-batch, each in [0, V)
 *   wte_shard (Vp/tp, C) this rank's rows of wte
 *   wpe       (maxT, C)  replicated, every p(t) < maxT; NULL: no position table (rotary
 *             embeddings)
 *   positions (T) or NULL
 *   work      (BT, C) with sequence parallelism: scratch for the partial lookup; NULL without */
mp_status mp_tp_vocab_embedding_forward(const mp_tp_comm *tp, bool sequence_parallel, float *out,
                                        const int32_t *tokens, const float *wte_shard,
                                        const float *wpe, const int32_t *positions, float *work,
                                        int B, int T, int C, int Vp, mp_error *err);

/* Backward: adds (+=) each token's output gradient into its wte row where this rank owns it, and
 * every token's into its position's wpe row (p(t) as in the forward), in token order (so the one-rank sums, bit for bit).
 * dwpe is whole on every rank (from all tokens): nothing to all-reduce.
 *   dwte_shard (Vp/tp, C) +=
 *   dwpe       (maxT, C)  += (rows p(t)); NULL without a position table
 *   positions  (T) or NULL
 *   dout       (BT, C) replicated, or with sequence parallelism (BT/tp, C), this rank's slice
 *   dout_total (BT, C) with sequence parallelism: written with the all-gathered dout; NULL
 *              without
 *   tokens     (B, T) */
mp_status mp_tp_vocab_embedding_backward(const mp_tp_comm *tp, bool sequence_parallel,
                                         float *dwte_shard, float *dwpe, const int32_t *positions,
                                         const float *dout, float *dout_total,
                                         const int32_t *tokens, int B, int T, int C, int Vp,
                                         mp_error *err);

/* The tied LM head: logits of this rank's vocabulary range.
 *   logits    (BT, Vp/tp) written: column j is vocabulary entry mp_tp_vocab_start + j
 *   inp_total (BT, C) with sequence parallelism: written with the all-gathered input; NULL
 *             without
 *   inp       (BT, C) replicated (the final layernorm's output), or (BT/tp, C) with sequence
 *             parallelism
 *   wte_shard (Vp/tp, C) */
mp_status mp_tp_lm_head_forward(const mp_tp_comm *tp, bool sequence_parallel, float *logits,
                                float *inp_total, const float *inp, const float *wte_shard, int BT,
                                int C, int Vp, mp_error *err);

/* Backward of the tied LM head (see mp_tp_column_linear_backward).
 *   dinp       (BT, C) or with sequence parallelism (BT/tp, C) += whole input gradient, or NULL
 *   dwte_shard (Vp/tp, C) += dlogits^T @ inp_total (the embedding's backward adds there too), or
 *              NULL
 *   dlogits    (BT, Vp/tp)
 *   inp_total  (BT, C) the forward's whole input (inp without sequence parallelism)
 *   work       mp_tp_column_linear_work_floats(tp, sequence_parallel, BT, C) floats, scratch */
mp_status mp_tp_lm_head_backward(const mp_tp_comm *tp, bool sequence_parallel, float *dinp,
                                 float *dwte_shard, const float *dlogits, const float *inp_total,
                                 const float *wte_shard, float *work, int BT, int C, int Vp,
                                 mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_VOCAB_PARALLEL_EMBEDDING_H */
