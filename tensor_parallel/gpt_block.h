/*
 * tensor_parallel/gpt_block.h — one GPT-2 transformer block split across a tensor-parallel
 * group, Megatron-style; the same math as layers/gpt_block.h, which it is tested against.
 *
 *   attention: qkv column-parallel (rank r computes q, k and v of heads [r*NH/tp, (r+1)*NH/tp)),
 *              attention over those NH/tp heads (layers/attention.h), the output projection
 *              row-parallel (its input channels are exactly those heads' channels)
 *   MLP:       fc column-parallel (F/tp channels), GELU on them, fc_proj row-parallel
 *   layernorms, residual adds and the row-parallel biases: replicated parameters
 *
 * Two collectives per sublayer in each direction: without sequence parallelism an all-reduce
 * after each row-parallel GEMM (forward) and of each column-parallel input gradient (backward).
 * With sequence parallelism (Megatron's, Korthikanti et al. 2022) the layernorms and residual adds
 * run on this rank's slice of the tokens (BT/tp rows, see mappings.h), the inputs of the
 * column-parallel GEMMs are all-gathered and the row-parallel outputs reduce-scattered: the same
 * traffic, and the activations outside the GEMMs take 1/tp of the memory.
 *
 * Replicated parameters and their gradients:
 *   - without sequence parallelism, every rank runs the layernorms on the same tokens with the
 *     same inputs (the block input is replicated, and every all-reduce returns bitwise the same
 *     sums on every rank, tp_comm.h), so the layernorm and row-parallel bias gradients come out
 *     identical on every rank by construction: no communication, and the ranks' optimizer steps
 *     keep the copies equal;
 *   - with sequence parallelism, a rank's layernorm gradients cover only its tokens: they are
 *     partial sums. The backward adds them into grads as they are, and the caller sums them over
 *     the group once per step, after the last micro-batch, with
 *     mp_tp_block_reduce_sequence_parallel_grads (Megatron's finalize step does the same; the
 *     model's final layernorm needs the same mp_tp_all_reduce_sum of its two gradients). The
 *     row-parallel biases' gradients are formed from the all-gathered output gradient and are
 *     whole on every rank.
 *
 * Parameters of a rank's shard use mp_gpt_block_params with the shard's shapes (below), cut from
 * one allocation in the full block's order, so a rank's parameters are one flat array too.
 * Shards are cut from, and put back into, the full tensors by tensor_parallel/shard.h.
 *
 * The backward runs whole (mp_tp_block_backward) or split for zero-bubble schedules into an
 * input pass B and a weight pass W (mp_tp_block_backward_input / _weight, see there); both come
 * from one body, so they cannot drift apart.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_GPT_BLOCK_H
#define MPENGINE_TENSOR_PARALLEL_GPT_BLOCK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/gpt_block.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A block's run on one rank: the whole block's sizes, the group size and the option. */
typedef struct {
  mp_gpt_block_shape full; /* B, T, C, NH, F of the whole block */
  int tp;                  /* tensor-parallel size */
  bool sequence_parallel;
} mp_tp_block_shape;

/* MP_OK, or MP_ERR_INPUT naming the size when the full shape is bad (mp_gpt_block_shape_check),
 * tp < 1, the heads or F are not multiples of tp, or, with sequence parallelism, B*T is not. */
mp_status mp_tp_block_shape_check(const mp_tp_block_shape *shape, mp_error *err);

/* A rank's shard of the parameters, in mp_gpt_block_params's fields (Cl = C/tp, Fl = F/tp):
 *   ln1w, ln1b (C)           replicated
 *   qkvw (3Cl, C)            rows: this rank's q rows, then its k rows, then its v rows
 *   qkvb (3Cl)               the same rows of the bias
 *   attprojw (C, Cl)         columns [r*Cl, (r+1)*Cl)
 *   attprojb (C)             replicated
 *   ln2w, ln2b (C)           replicated
 *   fcw (Fl, C), fcb (Fl)    rows [r*Fl, (r+1)*Fl)
 *   fcprojw (C, Fl)          columns [r*Fl, (r+1)*Fl)
 *   fcprojb (C)              replicated
 * Count: 6C + 4 Cl C + 3 Cl + 2 Fl C + Fl floats. */
size_t mp_tp_block_params_count(const mp_tp_block_shape *shape);
size_t mp_tp_block_params_point(mp_gpt_block_params *params, float *memory,
                                const mp_tp_block_shape *shape);

/* shard = rank's part of the full block's parameters full (layers/gpt_block.h shapes), or the
 * reverse (insert: rank's part of full is overwritten from shard), by tensor_parallel/shard.h's
 * splits. MP_ERR_INPUT when the shape does not divide over tp or rank is outside [0, tp). */
mp_status mp_tp_block_params_extract(const mp_tp_block_shape *shape, int rank,
                                     const mp_gpt_block_params *full, mp_gpt_block_params *shard,
                                     mp_error *err);
mp_status mp_tp_block_params_insert(const mp_tp_block_shape *shape, int rank,
                                    const mp_gpt_block_params *shard, mp_gpt_block_params *full,
                                    mp_error *err);

/* What the forward keeps for the backward. BTl = BT/tp with sequence parallelism, else BT;
 * NHl = NH/tp. Fields marked SP are NULL without sequence parallelism. */
typedef struct {
  float *ln1;       /* (BTl, C) */
  float *ln1_mean;  /* (BTl) */
  float *ln1_rstd;  /* (BTl) */
  float *ln1_total; /* (BT, C)   SP: ln1 all-gathered, the qkv GEMM's input */
  float *qkv;       /* (BT, 3Cl) this rank's q, k, v */
  float *atty;      /* (BT, Cl)  this rank's heads' output */
  float *preatt;    /* (B, NHl, T, T) */
  float *att;       /* (B, NHl, T, T) */
  float *attproj;   /* (BTl, C) */
  float *residual2; /* (BTl, C) */
  float *ln2;       /* (BTl, C) */
  float *ln2_mean;  /* (BTl) */
  float *ln2_rstd;  /* (BTl) */
  float *ln2_total; /* (BT, C)   SP: ln2 all-gathered, the fc GEMM's input */
  float *fch;       /* (BT, Fl) */
  float *fch_gelu;  /* (BT, Fl) */
  float *fcproj;    /* (BTl, C) */
  float *out;       /* (BTl, C)  the block's output (this rank's token slice with SP) */
  float *work;      /* (BT, C)   SP: the row-parallel GEMMs' partial products (not kept) */
} mp_tp_block_acts;

size_t mp_tp_block_acts_count(const mp_tp_block_shape *shape);
size_t mp_tp_block_acts_point(mp_tp_block_acts *acts, float *memory,
                              const mp_tp_block_shape *shape);

/* Selective recomputation (Korthikanti et al. 2022): the same without preatt and att, the
 * (B, NHl, T, T) attention matrices that dominate activation memory at long sequences. The caller
 * points them at buffers shared by every micro-batch and layer, and refills them with
 * mp_tp_block_recompute_attention right before the layer's backward. */
size_t mp_tp_block_acts_count_without_attention(const mp_tp_block_shape *shape);
size_t mp_tp_block_acts_point_without_attention(mp_tp_block_acts *acts, float *memory,
                                                const mp_tp_block_shape *shape);

/* Recomputes acts->preatt and acts->att (and acts->atty, to the same values) from acts->qkv, as
 * the forward computed them. No communication. */
void mp_tp_block_recompute_attention(const mp_tp_block_shape *shape, mp_tp_block_acts *acts);

/* Working memory of the backward, overwritten. */
typedef struct {
  float *dln1;       /* (BTl, C) */
  float *dqkv;       /* (BT, 3Cl) */
  float *datty;      /* (BT, Cl) */
  float *dpreatt;    /* (B, NHl, T, T) */
  float *datt;       /* (B, NHl, T, T) */
  float *dresidual2; /* (BTl, C) */
  float *dln2;       /* (BTl, C) */
  float *dfch;       /* (BT, Fl) */
  float *dfch_gelu;  /* (BT, Fl) */
  float *dout_total; /* (BT, C)   SP: the all-gathered gradient of a row-parallel output */
  float *work;       /* mp_tp_column_linear_work_floats(BT, C): column-parallel dinp partials */
} mp_tp_block_scratch;

size_t mp_tp_block_scratch_count(const mp_tp_block_shape *shape);
size_t mp_tp_block_scratch_point(mp_tp_block_scratch *scratch, float *memory,
                                 const mp_tp_block_shape *shape);

/* Runs the block on inp: (BT, C) replicated, or with sequence parallelism (BTl, C), this rank's
 * token slice. Writes acts, the output in acts->out (same rows as inp). tp->size must equal
 * shape->tp. Returns MP_OK or a collective's error. */
mp_status mp_tp_block_forward(const mp_tp_comm *tp, const mp_tp_block_shape *shape,
                              const mp_gpt_block_params *params, mp_tp_block_acts *acts,
                              const float *inp, mp_error *err);

/* Backward of mp_tp_block_forward, from dout = d(loss)/d(acts->out) (same rows as inp).
 *   dinp   (BTl, C) += gradient of the block's input (this rank's rows)
 *   grads            += gradient of this rank's parameters (shard layout); with sequence
 *                       parallelism the layernorm entries are partial, see the file comment
 *   scratch          overwritten
 * The same as mp_tp_block_backward_input then mp_tp_block_backward_weight (below), bit for bit.
 * Returns MP_OK or a collective's error. */
mp_status mp_tp_block_backward(const mp_tp_comm *tp, const mp_tp_block_shape *shape, float *dinp,
                               mp_gpt_block_params *grads, mp_tp_block_scratch *scratch,
                               const float *dout, const float *inp,
                               const mp_gpt_block_params *params, const mp_tp_block_acts *acts,
                               mp_error *err);

/* ---------------------------------------------------------------------------------------------
 * The zero-bubble split of the backward (schedule kind zb-h1; Qi et al. 2023, "Zero Bubble
 * Pipeline Parallelism"). B, mp_tp_block_backward_input, runs on the critical path: it computes
 * the gradient of the block's input, which the previous stage is waiting for, and every gradient
 * that costs no GEMM. W, mp_tp_block_backward_weight, runs later, in what would be the bubble: it
 * adds the four GEMM weight gradients from the output gradients B kept.
 *
 *   B adds: dinp; ln1w, ln1b, ln2w, ln2b (partial with sequence parallelism, as in the full
 *           backward); qkvb, attprojb, fcb, fcprojb (the biases: column sums of the kept output
 *           gradients, cheap, and on the way anyway)
 *   W adds: qkvw, attprojw, fcw, fcprojw
 *
 * B then W add exactly what mp_tp_block_backward adds, bit for bit: the same kernels run on the
 * same data into the same gradients. Each gradient is added by one of B or W only, so when several
 * micro-batches accumulate, B's and W's gradients each receive their micro-batches in the order
 * their passes run (the same order as a full backward's when B and W each run in micro-batch
 * order, as in zb-h1).
 *
 * What W needs that the forward's acts do not hold: the output gradients of the four GEMMs. B
 * writes them into an mp_tp_block_deferred, one per (micro-batch, layer) whose W is still to run;
 * the scratch is free again as soon as B returns. The acts must stay alive until W too (W reads
 * ln1 or ln1_total, atty, ln2 or ln2_total and fch_gelu). */
typedef struct {
  float *fcproj_dout;  /* (BT, C)   fc_proj's output gradient: dout, all-gathered with SP */
  float *dfch;         /* (BT, Fl)  fc's output gradient (through the GELU) */
  float *attproj_dout; /* (BT, C)   attn_proj's output gradient, all-gathered with SP */
  float *dqkv;         /* (BT, 3Cl) qkv's output gradient (through attention) */
} mp_tp_block_deferred;

/* Floats of one mp_tp_block_deferred: 2 BT C + BT Fl + 3 BT Cl (BT = B*T, whole micro-batch, with
 * or without sequence parallelism). _point carves the fields from memory in the order above and
 * returns the same count; with memory NULL it only counts. */
size_t mp_tp_block_deferred_count(const mp_tp_block_shape *shape);
size_t mp_tp_block_deferred_point(mp_tp_block_deferred *deferred, float *memory,
                                  const mp_tp_block_shape *shape);

/* B: mp_tp_block_backward without the four GEMM weight gradients (see above for the split).
 * Arguments as mp_tp_block_backward's, plus
 *   deferred  written: what mp_tp_block_backward_weight needs (scratch's dqkv, dfch and
 *             dout_total are not used: deferred takes their place)
 * grads->qkvw, attprojw, fcw and fcprojw are not touched (nor read). Runs the same collectives, in
 * the same order, as mp_tp_block_backward: every rank of the group must call the same one.
 * Returns MP_OK or a collective's error. */
mp_status mp_tp_block_backward_input(const mp_tp_comm *tp, const mp_tp_block_shape *shape,
                                     float *dinp, mp_gpt_block_params *grads,
                                     mp_tp_block_scratch *scratch,
                                     mp_tp_block_deferred *deferred, const float *dout,
                                     const float *inp, const mp_gpt_block_params *params,
                                     const mp_tp_block_acts *acts, mp_error *err);

/* W: adds (+=) the four GEMM weight gradients qkvw, attprojw, fcw and fcprojw into grads, from
 * deferred (written by this micro-batch's mp_tp_block_backward_input) and acts (its forward's).
 * No other gradient is touched; no communication, no scratch, and it cannot fail (shapes are the
 * caller's contract, as in layers/matmul.h). */
void mp_tp_block_backward_weight(const mp_tp_block_shape *shape, mp_gpt_block_params *grads,
                                 const mp_tp_block_deferred *deferred,
                                 const mp_tp_block_acts *acts);

/* With sequence parallelism: sums the layernorm weight and bias gradients (ln1w, ln1b, ln2w,
 * ln2b) over the group, in place. Call once per step, after the last micro-batch's backward and
 * before gradient clipping. Without sequence parallelism it does nothing. */
mp_status mp_tp_block_reduce_sequence_parallel_grads(const mp_tp_comm *tp,
                                                     const mp_tp_block_shape *shape,
                                                     mp_gpt_block_params *grads, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_GPT_BLOCK_H */
