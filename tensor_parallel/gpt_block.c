/* tensor_parallel/gpt_block.c — a GPT-2 block across a tensor-parallel group; see gpt_block.h. */
#include "tensor_parallel/gpt_block.h"

#include <string.h>

#include "layers/attention.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "layers/residual.h"
#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/row_parallel_linear.h"
#include "tensor_parallel/shard.h"

mp_status mp_tp_block_shape_check(const mp_tp_block_shape *shape, mp_error *err) {
  MP_TRY(mp_gpt_block_shape_check(&shape->full, err));
  const mp_gpt_block_shape *s = &shape->full;
  if (shape->tp < 1) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel size must be at least 1, got %d", shape->tp);
  }
  if (s->NH % shape->tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "tensor parallelism splits heads: %d heads do not divide over tp = %d; choose "
                   "a tp that divides the heads",
                   s->NH, shape->tp);
  }
  if (s->F % shape->tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "tensor parallelism splits the MLP: ffn_hidden %d is not a multiple of tp = %d",
                   s->F, shape->tp);
  }
  if (shape->sequence_parallel && ((size_t)s->B * s->T) % (size_t)shape->tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "sequence parallelism splits the B*T = %d tokens of a micro-batch over tp = "
                   "%d ranks; choose a micro-batch size or sequence length that makes B*T a "
                   "multiple of tp",
                   s->B * s->T, shape->tp);
  }
  return MP_OK;
}

/* Hands out consecutive pieces of one allocation; with memory NULL it only counts. A piece of
 * size 0 is NULL. */
typedef struct {
  float *memory;
  size_t used;
} carver;

static float *carve(carver *c, size_t n) {
  float *piece = c->memory != NULL && n > 0 ? c->memory + c->used : NULL;
  c->used += n;
  return piece;
}

typedef struct {
  int B, T, C, NHl, HS, Cl, Fl, BT, BTl;
  bool sp;
} sizes;

static sizes sizes_of(const mp_tp_block_shape *shape) {
  const mp_gpt_block_shape *s = &shape->full;
  sizes z;
  z.B = s->B;
  z.T = s->T;
  z.C = s->C;
  z.HS = s->C / s->NH;
  z.NHl = s->NH / shape->tp;
  z.Cl = z.NHl * z.HS;
  z.Fl = s->F / shape->tp;
  z.BT = s->B * s->T;
  z.sp = shape->sequence_parallel;
  z.BTl = z.sp ? z.BT / shape->tp : z.BT;
  return z;
}

size_t mp_tp_block_params_count(const mp_tp_block_shape *shape) {
  mp_gpt_block_params params;
  return mp_tp_block_params_point(&params, NULL, shape);
}

size_t mp_tp_block_params_point(mp_gpt_block_params *params, float *memory,
                                const mp_tp_block_shape *shape) {
  const sizes z = sizes_of(shape);
  const size_t c = (size_t)z.C, cl = (size_t)z.Cl, fl = (size_t)z.Fl;
  carver k = {memory, 0};
  params->ln1w = carve(&k, c);
  params->ln1b = carve(&k, c);
  params->qkvw = carve(&k, 3 * cl * c);
  params->qkvb = carve(&k, 3 * cl);
  params->attprojw = carve(&k, c * cl);
  params->attprojb = carve(&k, c);
  params->ln2w = carve(&k, c);
  params->ln2b = carve(&k, c);
  params->fcw = carve(&k, fl * c);
  params->fcb = carve(&k, fl);
  params->fcprojw = carve(&k, c * fl);
  params->fcprojb = carve(&k, c);
  return k.used;
}

/* Copies rank's part of every block tensor between full and shard (to_shard chooses). */
static mp_status block_copy(const mp_tp_block_shape *shape, int rank, mp_gpt_block_params *full,
                            mp_gpt_block_params *shard, bool to_shard, mp_error *err) {
  MP_TRY(mp_tp_block_shape_check(shape, err));
  const size_t C = (size_t)shape->full.C, F = (size_t)shape->full.F;
  const struct {
    float *full, *shard;
    size_t rows, cols;
    mp_tp_split split;
  } tensors[] = {
      {full->ln1w, shard->ln1w, C, 1, MP_TP_REPLICATED},
      {full->ln1b, shard->ln1b, C, 1, MP_TP_REPLICATED},
      {full->qkvw, shard->qkvw, 3 * C, C, MP_TP_SPLIT_QKV},
      {full->qkvb, shard->qkvb, 3 * C, 1, MP_TP_SPLIT_QKV},
      {full->attprojw, shard->attprojw, C, C, MP_TP_SPLIT_COLS},
      {full->attprojb, shard->attprojb, C, 1, MP_TP_REPLICATED},
      {full->ln2w, shard->ln2w, C, 1, MP_TP_REPLICATED},
      {full->ln2b, shard->ln2b, C, 1, MP_TP_REPLICATED},
      {full->fcw, shard->fcw, F, C, MP_TP_SPLIT_ROWS},
      {full->fcb, shard->fcb, F, 1, MP_TP_SPLIT_ROWS},
      {full->fcprojw, shard->fcprojw, C, F, MP_TP_SPLIT_COLS},
      {full->fcprojb, shard->fcprojb, C, 1, MP_TP_REPLICATED},
  };
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
    if (to_shard) {
      MP_TRY(mp_tp_shard_extract(tensors[i].shard, tensors[i].full, tensors[i].split,
                                 tensors[i].rows, tensors[i].cols, rank, shape->tp, err));
    } else {
      MP_TRY(mp_tp_shard_insert(tensors[i].full, tensors[i].shard, tensors[i].split,
                                tensors[i].rows, tensors[i].cols, rank, shape->tp, err));
    }
  }
  return MP_OK;
}

mp_status mp_tp_block_params_extract(const mp_tp_block_shape *shape, int rank,
                                     const mp_gpt_block_params *full, mp_gpt_block_params *shard,
                                     mp_error *err) {
  /* block_copy only reads full in this direction. */
  return block_copy(shape, rank, (mp_gpt_block_params *)full, shard, true, err);
}

mp_status mp_tp_block_params_insert(const mp_tp_block_shape *shape, int rank,
                                    const mp_gpt_block_params *shard, mp_gpt_block_params *full,
                                    mp_error *err) {
  /* block_copy only reads shard in this direction. */
  return block_copy(shape, rank, full, (mp_gpt_block_params *)shard, false, err);
}

size_t mp_tp_block_acts_count(const mp_tp_block_shape *shape) {
  mp_tp_block_acts acts;
  return mp_tp_block_acts_point(&acts, NULL, shape);
}

static size_t point_acts(mp_tp_block_acts *acts, float *memory, const mp_tp_block_shape *shape,
                         bool with_attention) {
  const sizes z = sizes_of(shape);
  const size_t bt = (size_t)z.BT, btl = (size_t)z.BTl, c = (size_t)z.C;
  const size_t cl = (size_t)z.Cl, fl = (size_t)z.Fl;
  const size_t tt = with_attention ? (size_t)z.B * z.NHl * z.T * z.T : 0;
  const size_t sp_bt = z.sp ? bt : 0;
  carver k = {memory, 0};
  acts->ln1 = carve(&k, btl * c);
  acts->ln1_mean = carve(&k, btl);
  acts->ln1_rstd = carve(&k, btl);
  acts->ln1_total = carve(&k, sp_bt * c);
  acts->qkv = carve(&k, bt * 3 * cl);
  acts->atty = carve(&k, bt * cl);
  acts->preatt = carve(&k, tt);
  acts->att = carve(&k, tt);
  acts->attproj = carve(&k, btl * c);
  acts->residual2 = carve(&k, btl * c);
  acts->ln2 = carve(&k, btl * c);
  acts->ln2_mean = carve(&k, btl);
  acts->ln2_rstd = carve(&k, btl);
  acts->ln2_total = carve(&k, sp_bt * c);
  acts->fch = carve(&k, bt * fl);
  acts->fch_gelu = carve(&k, bt * fl);
  acts->fcproj = carve(&k, btl * c);
  acts->out = carve(&k, btl * c);
  acts->work = carve(&k, sp_bt * c);
  if (!with_attention) acts->preatt = acts->att = NULL;
  return k.used;
}

size_t mp_tp_block_acts_point(mp_tp_block_acts *acts, float *memory,
                              const mp_tp_block_shape *shape) {
  return point_acts(acts, memory, shape, true);
}

size_t mp_tp_block_acts_count_without_attention(const mp_tp_block_shape *shape) {
  mp_tp_block_acts acts;
  return point_acts(&acts, NULL, shape, false);
}

size_t mp_tp_block_acts_point_without_attention(mp_tp_block_acts *acts, float *memory,
                                                const mp_tp_block_shape *shape) {
  return point_acts(acts, memory, shape, false);
}

void mp_tp_block_recompute_attention(const mp_tp_block_shape *shape, mp_tp_block_acts *acts) {
  const sizes z = sizes_of(shape);
  mp_attention_forward_cpu(acts->atty, acts->preatt, acts->att, acts->qkv, z.B, z.T, z.NHl, z.HS);
}

size_t mp_tp_block_scratch_count(const mp_tp_block_shape *shape) {
  mp_tp_block_scratch scratch;
  return mp_tp_block_scratch_point(&scratch, NULL, shape);
}

size_t mp_tp_block_scratch_point(mp_tp_block_scratch *scratch, float *memory,
                                 const mp_tp_block_shape *shape) {
  const sizes z = sizes_of(shape);
  const size_t bt = (size_t)z.BT, btl = (size_t)z.BTl, c = (size_t)z.C;
  const size_t cl = (size_t)z.Cl, fl = (size_t)z.Fl;
  const size_t tt = (size_t)z.B * z.NHl * z.T * z.T;
  const size_t work = z.sp ? bt * c + btl * c : bt * c; /* mp_tp_column_linear_work_floats */
  carver k = {memory, 0};
  scratch->dln1 = carve(&k, btl * c);
  scratch->dqkv = carve(&k, bt * 3 * cl);
  scratch->datty = carve(&k, bt * cl);
  scratch->dpreatt = carve(&k, tt);
  scratch->datt = carve(&k, tt);
  scratch->dresidual2 = carve(&k, btl * c);
  scratch->dln2 = carve(&k, btl * c);
  scratch->dfch = carve(&k, bt * fl);
  scratch->dfch_gelu = carve(&k, bt * fl);
  scratch->dout_total = carve(&k, z.sp ? bt * c : 0);
  scratch->work = carve(&k, work);
  return k.used;
}

mp_status mp_tp_block_forward(const mp_tp_comm *tp, const mp_tp_block_shape *shape,
                              const mp_gpt_block_params *params, mp_tp_block_acts *acts,
                              const float *inp, mp_error *err) {
  const sizes z = sizes_of(shape);
  const size_t n = (size_t)z.BTl * z.C;

  mp_layernorm_forward_cpu(acts->ln1, acts->ln1_mean, acts->ln1_rstd, inp, params->ln1w,
                           params->ln1b, 1, z.BTl, z.C);
  MP_TRY(mp_tp_column_linear_forward(tp, z.sp, acts->qkv, acts->ln1_total, acts->ln1, params->qkvw,
                                     params->qkvb, z.BT, z.C, 3 * z.Cl, err));
  mp_attention_forward_cpu(acts->atty, acts->preatt, acts->att, acts->qkv, z.B, z.T, z.NHl, z.HS);
  MP_TRY(mp_tp_row_linear_forward(tp, z.sp, acts->attproj, acts->atty, params->attprojw,
                                  params->attprojb, acts->work, z.BT, z.Cl, z.C, err));
  mp_residual_forward_cpu(acts->residual2, inp, acts->attproj, n);

  mp_layernorm_forward_cpu(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->residual2, params->ln2w,
                           params->ln2b, 1, z.BTl, z.C);
  MP_TRY(mp_tp_column_linear_forward(tp, z.sp, acts->fch, acts->ln2_total, acts->ln2, params->fcw,
                                     params->fcb, z.BT, z.C, z.Fl, err));
  mp_gelu_forward_cpu(acts->fch_gelu, acts->fch, (size_t)z.BT * z.Fl);
  MP_TRY(mp_tp_row_linear_forward(tp, z.sp, acts->fcproj, acts->fch_gelu, params->fcprojw,
                                  params->fcprojb, acts->work, z.BT, z.Fl, z.C, err));
  mp_residual_forward_cpu(acts->out, acts->residual2, acts->fcproj, n);
  return MP_OK;
}

size_t mp_tp_block_deferred_count(const mp_tp_block_shape *shape) {
  mp_tp_block_deferred deferred;
  return mp_tp_block_deferred_point(&deferred, NULL, shape);
}

size_t mp_tp_block_deferred_point(mp_tp_block_deferred *deferred, float *memory,
                                  const mp_tp_block_shape *shape) {
  const sizes z = sizes_of(shape);
  const size_t bt = (size_t)z.BT, c = (size_t)z.C, cl = (size_t)z.Cl, fl = (size_t)z.Fl;
  carver k = {memory, 0};
  deferred->fcproj_dout = carve(&k, bt * c);
  deferred->dfch = carve(&k, bt * fl);
  deferred->attproj_dout = carve(&k, bt * c);
  deferred->dqkv = carve(&k, bt * 3 * cl);
  return k.used;
}

/* The one backward body. deferred NULL: the full backward, every gradient. deferred given: B of
 * the zero-bubble split; the four GEMM weight gradients are skipped (NULL to the linear layers)
 * and the output gradients they need land in deferred instead of scratch. Everything else, the
 * collectives included, runs identically in both modes. */
static mp_status block_backward(const mp_tp_comm *tp, const mp_tp_block_shape *shape, float *dinp,
                                mp_gpt_block_params *grads, mp_tp_block_scratch *scratch,
                                mp_tp_block_deferred *deferred, const float *dout,
                                const float *inp, const mp_gpt_block_params *params,
                                const mp_tp_block_acts *acts, mp_error *err) {
  const sizes z = sizes_of(shape);
  const size_t n = (size_t)z.BTl * z.C;
  const size_t nf = (size_t)z.BT * z.Fl;
  const bool split = deferred != NULL;
  /* The whole input of the column-parallel GEMMs: the gathered copy, or the replicated one. */
  const float *ln1_total = z.sp ? acts->ln1_total : acts->ln1;
  const float *ln2_total = z.sp ? acts->ln2_total : acts->ln2;
  /* The GEMMs' output gradients: kept for W in deferred, or working memory. With sequence
   * parallelism the row-parallel backwards write their all-gathered dout there; without it dout
   * is replicated and used in place, so B copies it. */
  float *dfch = split ? deferred->dfch : scratch->dfch;
  float *dqkv = split ? deferred->dqkv : scratch->dqkv;
  float *fcproj_dout_total = !z.sp ? NULL : split ? deferred->fcproj_dout : scratch->dout_total;
  float *attproj_dout_total = !z.sp ? NULL : split ? deferred->attproj_dout : scratch->dout_total;
  /* The weight gradients this pass adds: all four, or none (W adds them). */
  float *dfcprojw = split ? NULL : grads->fcprojw;
  float *dfcw = split ? NULL : grads->fcw;
  float *dattprojw = split ? NULL : grads->attprojw;
  float *dqkvw = split ? NULL : grads->qkvw;

  /* The kernels add into their gradients; start every accumulated buffer from zero
   * (attention overwrites dpreatt and datt, dresidual2 starts as a copy of dout). */
  memset(scratch->dln1, 0, n * sizeof(float));
  memset(dqkv, 0, (size_t)z.BT * 3 * z.Cl * sizeof(float));
  memset(scratch->datty, 0, (size_t)z.BT * z.Cl * sizeof(float));
  memset(scratch->dln2, 0, n * sizeof(float));
  memset(dfch, 0, nf * sizeof(float));
  memset(scratch->dfch_gelu, 0, nf * sizeof(float));

  /* out = residual2 + fcproj. */
  memcpy(scratch->dresidual2, dout, n * sizeof(float));
  if (split && !z.sp) memcpy(deferred->fcproj_dout, dout, n * sizeof(float));
  MP_TRY(mp_tp_row_linear_backward(tp, z.sp, scratch->dfch_gelu, dfcprojw, grads->fcprojb, dout,
                                   fcproj_dout_total, acts->fch_gelu, params->fcprojw, z.BT, z.Fl,
                                   z.C, err));
  mp_gelu_backward_cpu(dfch, acts->fch, scratch->dfch_gelu, nf);
  MP_TRY(mp_tp_column_linear_backward(tp, z.sp, scratch->dln2, dfcw, grads->fcb, dfch, ln2_total,
                                      params->fcw, scratch->work, z.BT, z.C, z.Fl, err));
  mp_layernorm_backward_cpu(scratch->dresidual2, grads->ln2w, grads->ln2b, scratch->dln2,
                            acts->residual2, params->ln2w, acts->ln2_mean, acts->ln2_rstd, 1, z.BTl,
                            z.C);

  /* residual2 = inp + attproj. */
  for (size_t i = 0; i < n; i++) dinp[i] += scratch->dresidual2[i];
  if (split && !z.sp) memcpy(deferred->attproj_dout, scratch->dresidual2, n * sizeof(float));
  MP_TRY(mp_tp_row_linear_backward(tp, z.sp, scratch->datty, dattprojw, grads->attprojb,
                                   scratch->dresidual2, attproj_dout_total, acts->atty,
                                   params->attprojw, z.BT, z.Cl, z.C, err));
  mp_attention_backward_cpu(dqkv, scratch->dpreatt, scratch->datt, scratch->datty, acts->qkv,
                            acts->att, z.B, z.T, z.NHl, z.HS);
  MP_TRY(mp_tp_column_linear_backward(tp, z.sp, scratch->dln1, dqkvw, grads->qkvb, dqkv, ln1_total,
                                      params->qkvw, scratch->work, z.BT, z.C, 3 * z.Cl, err));
  mp_layernorm_backward_cpu(dinp, grads->ln1w, grads->ln1b, scratch->dln1, inp, params->ln1w,
                            acts->ln1_mean, acts->ln1_rstd, 1, z.BTl, z.C);
  return MP_OK;
}

mp_status mp_tp_block_backward(const mp_tp_comm *tp, const mp_tp_block_shape *shape, float *dinp,
                               mp_gpt_block_params *grads, mp_tp_block_scratch *scratch,
                               const float *dout, const float *inp,
                               const mp_gpt_block_params *params, const mp_tp_block_acts *acts,
                               mp_error *err) {
  return block_backward(tp, shape, dinp, grads, scratch, NULL, dout, inp, params, acts, err);
}

mp_status mp_tp_block_backward_input(const mp_tp_comm *tp, const mp_tp_block_shape *shape,
                                     float *dinp, mp_gpt_block_params *grads,
                                     mp_tp_block_scratch *scratch,
                                     mp_tp_block_deferred *deferred, const float *dout,
                                     const float *inp, const mp_gpt_block_params *params,
                                     const mp_tp_block_acts *acts, mp_error *err) {
  if (deferred == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the backward-input pass needs an mp_tp_block_deferred to keep what the "
                   "weight pass reads; carve one with mp_tp_block_deferred_point");
  }
  return block_backward(tp, shape, dinp, grads, scratch, deferred, dout, inp, params, acts, err);
}

void mp_tp_block_backward_weight(const mp_tp_block_shape *shape, mp_gpt_block_params *grads,
                                 const mp_tp_block_deferred *deferred,
                                 const mp_tp_block_acts *acts) {
  const sizes z = sizes_of(shape);
  const float *ln1_total = z.sp ? acts->ln1_total : acts->ln1;
  const float *ln2_total = z.sp ? acts->ln2_total : acts->ln2;
  /* The weight halves of the linear layers' backwards (dweight += dout_total^T @ inp_total), the
   * same mp_matmul_backward_cpu calls on the same data as in the full backward. */
  mp_matmul_backward_cpu(NULL, grads->fcprojw, NULL, deferred->fcproj_dout, acts->fch_gelu, NULL,
                         z.BT, z.Fl, z.C);
  mp_matmul_backward_cpu(NULL, grads->fcw, NULL, deferred->dfch, ln2_total, NULL, z.BT, z.C, z.Fl);
  mp_matmul_backward_cpu(NULL, grads->attprojw, NULL, deferred->attproj_dout, acts->atty, NULL,
                         z.BT, z.Cl, z.C);
  mp_matmul_backward_cpu(NULL, grads->qkvw, NULL, deferred->dqkv, ln1_total, NULL, z.BT, z.C,
                         3 * z.Cl);
}

mp_status mp_tp_block_reduce_sequence_parallel_grads(const mp_tp_comm *tp,
                                                     const mp_tp_block_shape *shape,
                                                     mp_gpt_block_params *grads, mp_error *err) {
  if (!shape->sequence_parallel) return MP_OK;
  const size_t c = (size_t)shape->full.C;
  /* ln1w, ln1b and ln2w, ln2b sit next to each other in the flat layout when they were cut by
   * mp_tp_block_params_point, but the struct may point anywhere: reduce each. */
  MP_TRY(mp_tp_all_reduce_sum(tp, grads->ln1w, c, err));
  MP_TRY(mp_tp_all_reduce_sum(tp, grads->ln1b, c, err));
  MP_TRY(mp_tp_all_reduce_sum(tp, grads->ln2w, c, err));
  MP_TRY(mp_tp_all_reduce_sum(tp, grads->ln2b, c, err));
  return MP_OK;
}
