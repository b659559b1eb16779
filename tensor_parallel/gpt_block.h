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
 * Returns MP_OK or a collective's error. */
mp_status mp_tp_block_backward(const mp_tp_comm *tp, const mp_tp_block_shape *shape, float *dinp,
                               mp_gpt_block_params *grads, mp_tp_block_scratch *scratch,
                               const float *dout, const float *inp,
                               const mp_gpt_block_params *params, const mp_tp_block_acts *acts,
                               mp_error *err);

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
