/*
 * layers/tensor_parallel_cuda.h — the few GPU kernels that tensor parallelism adds around the
 * collectives: conversions between the bf16 activations and the fp32 buffers that are all-reduced,
 * the vocabulary-parallel embedding lookup (Megatron's VocabParallelEmbedding), and the
 * vocabulary-parallel softmax cross-entropy split into the phases between its two collectives
 * (Megatron's vocab_parallel_cross_entropy; the CPU twin is
 * tensor_parallel/vocab_parallel_cross_entropy.h).
 *
 * The collectives themselves are not here: these calls take and produce device buffers, and the
 * caller moves them between ranks (engine/comm/comm.h). Partial sums cross ranks in fp32 and are
 * rounded to bf16 once, after the all-reduce, so the result does not depend on how many ranks
 * contributed a part.
 *
 * Built where nvcc exists (sm_80, sm_90; Bazel target //layers:cuda_tensor_parallel). All pointers
 * are device pointers; activations and weights are bf16 (mp_bf16), statistics and the buffers
 * that are reduced over ranks fp32. Each call enqueues its kernels on `stream` and returns without
 * waiting; launch errors are not checked here: the caller's next mp_device_synchronize
 * (engine/device/device.h) reports them. Every reduction runs in a fixed order without atomics, so two
 * runs on the same inputs give the same bits. Without CUDA the calls do nothing (no device
 * pointer can exist in such a build).
 */
#ifndef MPENGINE_LAYERS_TENSOR_PARALLEL_CUDA_H
#define MPENGINE_LAYERS_TENSOR_PARALLEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Conversions around an all-reduce */

/* out = in widened to fp32, elementwise (exact).
 *   out (n) written; must not overlap in
 *   in  (n) */
void mp_float_from_bf16_cuda(float *out, const mp_bf16 *in, size_t n, mp_cuda_stream stream);

/* out = round_to_bf16(sum + bias), the bias widened to fp32 and added before the one rounding
 * (to nearest even). Used after the all-reduce of a row-parallel GEMM's partial outputs, whose
 * bias is added once, not once per rank.
 *   out  (rows, cols) written; must not overlap sum (no narrowing in place)
 *   sum  (rows, cols) fp32
 *   bias (cols), or NULL for no bias */
void mp_bf16_from_float_bias_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *bias, int rows,
                                  int cols, mp_cuda_stream stream);

/* out += in, elementwise in fp32 (one rounding per element).
 *   out (n) +=
 *   in  (n) may be out itself (then out doubles) */
void mp_add_f32_cuda(float *out, const float *in, size_t n, mp_cuda_stream stream);

/* ---------------------------------------------------------------------------------------------
 * Vocabulary-parallel embedding
 *
 * Each rank holds the rows [vocab_start, vocab_start + Vl) of wte. The lookup writes this rank's
 * part in fp32 (zeros for tokens another rank owns); the caller all-reduces the parts, which
 * sums exactly one non-zero row per token, then adds the positions with mp_add_position_cuda. */

/* out[i, :] = wte_shard[tokens[i] - vocab_start, :] widened when
 * vocab_start <= tokens[i] < vocab_start + Vl, else zeros.
 *   out       (BT, C) fp32 written
 *   tokens    (BT) int32, each in [0, V) (any rank's)
 *   wte_shard (Vl, C) bf16 */
void mp_vocab_embedding_lookup_cuda(float *out, const int32_t *tokens, const mp_bf16 *wte_shard,
                                    int vocab_start, int Vl, int BT, int C, mp_cuda_stream stream);

/* out[b, t, :] = round_to_bf16(sum[b, t, :] + wpe[t, :] widened), one rounding.
 *   out (B, T, C) bf16 written; must not overlap sum
 *   sum (B, T, C) fp32 (the all-reduced lookups)
 *   wpe (>= T, C) bf16; rows [0, T) are read */
void mp_add_position_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int B, int T, int C,
                          mp_cuda_stream stream);

/* The same on a slice of the flattened (B*T) tokens, for sequence parallelism (the lookup was
 * reduce-scattered to this rank's rows): row i is global row first_row + i, at position
 * t = (first_row + i) % T.
 *   out (rows, C) bf16 written: round_to_bf16(sum[i, :] + wpe[(first_row + i) % T, :] widened);
 *       must not overlap sum
 *   sum (rows, C) fp32
 *   wpe (>= T, C) bf16 */
void mp_add_position_rows_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int first_row,
                               int rows, int T, int C, mp_cuda_stream stream);

/* ---------------------------------------------------------------------------------------------
 * Vocabulary-parallel softmax cross-entropy, in three phases around two collectives:
 *
 *   mp_vocab_ce_max_cuda        local row maxima
 *     all-gather the BT maxima over the group, then mp_max_over_ranks_cuda
 *   mp_vocab_ce_partials_cuda   local sums of exponentials and the target's logit
 *     all-reduce (sum) the 2 BT stats over the group
 *   mp_vocab_ce_finish_cuda     losses, and the gradient over the logits in place
 *
 * logits (BT, Vl) bf16 are this rank's columns: column j is global vocabulary entry
 * vocab_start + j. Entries >= V are padding: they take no part in any max or sum and their
 * gradient is 0, whatever they hold (NaN included). A rank may hold only padding: its row maxima
 * are then -INFINITY and its sums 0. targets (BT) int32, each in [0, V). All statistics are fp32
 * and every phase uses one block per row with a reduction in a fixed order. The result matches
 * mp_cross_entropy_fused_cuda (cross_entropy.h) on unsplit logits but for the fp32 sum order. */

/* Phase 1: row_max[i] = max of logits[i, j] over this rank's valid columns (-INFINITY if none).
 *   row_max (BT) fp32 written
 *   logits  (BT, Vl) bf16 */
void mp_vocab_ce_max_cuda(float *row_max, const mp_bf16 *logits, int BT, int Vl, int vocab_start,
                          int V, mp_cuda_stream stream);

/* row_max[i] = max over r of gathered[r * BT + i], r = 0 .. ranks - 1.
 *   row_max  (BT) fp32 written; may be `gathered` itself (rank 0's part is overwritten)
 *   gathered (ranks, BT) fp32: every rank's phase-1 row_max, rank r's at gathered + r * BT */
void mp_max_over_ranks_cuda(float *row_max, const float *gathered, int ranks, int BT,
                            mp_cuda_stream stream);

/* Phase 2, with the maxima over the whole group:
 *   stats   (2, BT) fp32 written:
 *             stats[i]      = sum over valid columns j of exp(logits[i, j] - row_max[i])
 *             stats[BT + i] = logits[i, targets[i] - vocab_start] widened when that target is
 *                             one of this rank's valid columns, else 0
 *           summed over the group (all-reduce) afterwards: the whole softmax denominator, and
 *           the target's logit from its one owner
 *   logits  (BT, Vl) bf16
 *   targets (BT)
 *   row_max (BT) fp32, the max over ranks (finite: some rank holds each row's real columns) */
void mp_vocab_ce_partials_cuda(float *stats, const mp_bf16 *logits, const int32_t *targets,
                               const float *row_max, int BT, int Vl, int vocab_start, int V,
                               mp_cuda_stream stream);

/* Phase 3, after stats were summed over the group. The loss is identical on every rank; the
 * gradient is this rank's columns of the gradient of dloss x the mean loss over the BT rows.
 *   losses  (BT) fp32 written: log(stats[i]) + row_max[i] - stats[BT + i], evaluated as the
 *           fused kernel does, log(stats[i]) - (stats[BT + i] - row_max[i])
 *   logits  (BT, Vl) bf16 in: logits; out: dlogits =
 *             (exp(logit - row_max[i]) / stats[i] - [vocab_start + j == targets[i]]) * dloss / BT
 *           on valid columns, 0 on padding columns (written, not added: the convention of
 *           mp_cross_entropy_fused_cuda)
 *   targets (BT)
 *   row_max (BT) fp32, as given to phase 2
 *   stats   (2, BT) fp32, summed over the group
 *   dloss   gradient with respect to the mean loss */
void mp_vocab_ce_finish_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                             const float *row_max, const float *stats, float dloss, int BT, int Vl,
                             int vocab_start, int V, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_TENSOR_PARALLEL_CUDA_H */
