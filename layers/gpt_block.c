/* layers/gpt_block.c — one transformer block composed from the layer kernels; see gpt_block.h. */
#include "layers/gpt_block.h"

#include <string.h>

#include "layers/attention.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "layers/residual.h"

mp_status mp_gpt_block_shape_check(const mp_gpt_block_shape *shape, mp_error *err) {
  if (shape->B <= 0 || shape->T <= 0 || shape->C <= 0 || shape->NH <= 0 || shape->F <= 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "transformer block sizes must be positive, got B=%d T=%d C=%d NH=%d F=%d",
                   shape->B, shape->T, shape->C, shape->NH, shape->F);
  }
  if (shape->C % shape->NH != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "transformer block: hidden size %d is not a multiple of the %d heads; choose "
                   "heads that divide hidden",
                   shape->C, shape->NH);
  }
  return MP_OK;
}

/* Hands out consecutive pieces of one allocation; with memory NULL it only counts. */
typedef struct {
  float *memory;
  size_t used;
} carver;

static float *carve(carver *c, size_t n) {
  float *piece = c->memory != NULL ? c->memory + c->used : NULL;
  c->used += n;
  return piece;
}

size_t mp_gpt_block_params_count(int C, int F) {
  const size_t c = (size_t)C, f = (size_t)F;
  return 9 * c + 4 * c * c + 2 * c * f + f;
}

size_t mp_gpt_block_params_point(mp_gpt_block_params *params, float *memory, int C, int F) {
  const size_t c = (size_t)C, f = (size_t)F;
  carver k = {memory, 0};
  params->ln1w = carve(&k, c);
  params->ln1b = carve(&k, c);
  params->qkvw = carve(&k, 3 * c * c);
  params->qkvb = carve(&k, 3 * c);
  params->attprojw = carve(&k, c * c);
  params->attprojb = carve(&k, c);
  params->ln2w = carve(&k, c);
  params->ln2b = carve(&k, c);
  params->fcw = carve(&k, f * c);
  params->fcb = carve(&k, f);
  params->fcprojw = carve(&k, c * f);
  params->fcprojb = carve(&k, c);
  return k.used;
}

size_t mp_gpt_block_acts_count(const mp_gpt_block_shape *shape) {
  mp_gpt_block_acts acts;
  return mp_gpt_block_acts_point(&acts, NULL, shape);
}

size_t mp_gpt_block_acts_point(mp_gpt_block_acts *acts, float *memory,
                               const mp_gpt_block_shape *shape) {
  const size_t bt = (size_t)shape->B * shape->T;
  const size_t c = (size_t)shape->C, f = (size_t)shape->F;
  const size_t tt = (size_t)shape->B * shape->NH * shape->T * shape->T;
  carver k = {memory, 0};
  acts->ln1 = carve(&k, bt * c);
  acts->ln1_mean = carve(&k, bt);
  acts->ln1_rstd = carve(&k, bt);
  acts->qkv = carve(&k, bt * 3 * c);
  acts->atty = carve(&k, bt * c);
  acts->preatt = carve(&k, tt);
  acts->att = carve(&k, tt);
  acts->attproj = carve(&k, bt * c);
  acts->residual2 = carve(&k, bt * c);
  acts->ln2 = carve(&k, bt * c);
  acts->ln2_mean = carve(&k, bt);
  acts->ln2_rstd = carve(&k, bt);
  acts->fch = carve(&k, bt * f);
  acts->fch_gelu = carve(&k, bt * f);
  acts->fcproj = carve(&k, bt * c);
  acts->out = carve(&k, bt * c);
  return k.used;
}

size_t mp_gpt_block_scratch_count(const mp_gpt_block_shape *shape) {
  mp_gpt_block_scratch scratch;
  return mp_gpt_block_scratch_point(&scratch, NULL, shape);
}

size_t mp_gpt_block_scratch_point(mp_gpt_block_scratch *scratch, float *memory,
                                  const mp_gpt_block_shape *shape) {
  const size_t bt = (size_t)shape->B * shape->T;
  const size_t c = (size_t)shape->C, f = (size_t)shape->F;
  const size_t tt = (size_t)shape->B * shape->NH * shape->T * shape->T;
  carver k = {memory, 0};
  scratch->dln1 = carve(&k, bt * c);
  scratch->dqkv = carve(&k, bt * 3 * c);
  scratch->datty = carve(&k, bt * c);
  scratch->dpreatt = carve(&k, tt);
  scratch->datt = carve(&k, tt);
  scratch->dresidual2 = carve(&k, bt * c);
  scratch->dln2 = carve(&k, bt * c);
  scratch->dfch = carve(&k, bt * f);
  scratch->dfch_gelu = carve(&k, bt * f);
  return k.used;
}

void mp_gpt_block_forward_cpu(const mp_gpt_block_shape *shape, const mp_gpt_block_params *params,
                              mp_gpt_block_acts *acts, const float *inp) {
  const int B = shape->B, T = shape->T, C = shape->C, NH = shape->NH, F = shape->F;
  const int BT = B * T;
  const size_t n = (size_t)BT * C;

  mp_layernorm_forward_cpu(acts->ln1, acts->ln1_mean, acts->ln1_rstd, inp, params->ln1w,
                           params->ln1b, B, T, C);
  mp_matmul_forward_cpu(acts->qkv, acts->ln1, params->qkvw, params->qkvb, BT, C, 3 * C);
  mp_attention_forward_cpu(acts->atty, acts->preatt, acts->att, acts->qkv, B, T, NH, NH,
                           C / NH);
  mp_matmul_forward_cpu(acts->attproj, acts->atty, params->attprojw, params->attprojb, BT, C, C);
  mp_residual_forward_cpu(acts->residual2, inp, acts->attproj, n);

  mp_layernorm_forward_cpu(acts->ln2, acts->ln2_mean, acts->ln2_rstd, acts->residual2, params->ln2w,
                           params->ln2b, B, T, C);
  mp_matmul_forward_cpu(acts->fch, acts->ln2, params->fcw, params->fcb, BT, C, F);
  mp_gelu_forward_cpu(acts->fch_gelu, acts->fch, (size_t)BT * F);
  mp_matmul_forward_cpu(acts->fcproj, acts->fch_gelu, params->fcprojw, params->fcprojb, BT, F, C);
  mp_residual_forward_cpu(acts->out, acts->residual2, acts->fcproj, n);
}

void mp_gpt_block_backward_cpu(const mp_gpt_block_shape *shape, float *dinp,
                               mp_gpt_block_params *grads, mp_gpt_block_scratch *scratch,
                               const float *dout, const float *inp,
                               const mp_gpt_block_params *params, const mp_gpt_block_acts *acts) {
  const int B = shape->B, T = shape->T, C = shape->C, NH = shape->NH, F = shape->F;
  const int BT = B * T;
  const size_t n = (size_t)BT * C;
  const size_t nf = (size_t)BT * F;

  /* The kernels add into their gradients; start every accumulated buffer from zero
   * (attention overwrites dpreatt and datt itself, dresidual2 starts as a copy of dout). */
  memset(scratch->dln1, 0, n * sizeof(float));
  memset(scratch->dqkv, 0, 3 * n * sizeof(float));
  memset(scratch->datty, 0, n * sizeof(float));
  memset(scratch->dln2, 0, n * sizeof(float));
  memset(scratch->dfch, 0, nf * sizeof(float));
  memset(scratch->dfch_gelu, 0, nf * sizeof(float));

  /* out = residual2 + fcproj: dout reaches both; d(fcproj) is dout itself. */
  memcpy(scratch->dresidual2, dout, n * sizeof(float));
  mp_matmul_backward_cpu(scratch->dfch_gelu, grads->fcprojw, grads->fcprojb, dout, acts->fch_gelu,
                         params->fcprojw, BT, F, C);
  mp_gelu_backward_cpu(scratch->dfch, acts->fch, scratch->dfch_gelu, nf);
  mp_matmul_backward_cpu(scratch->dln2, grads->fcw, grads->fcb, scratch->dfch, acts->ln2,
                         params->fcw, BT, C, F);
  mp_layernorm_backward_cpu(scratch->dresidual2, grads->ln2w, grads->ln2b, scratch->dln2,
                            acts->residual2, params->ln2w, acts->ln2_mean, acts->ln2_rstd, B, T, C);

  /* residual2 = inp + attproj: d(attproj) is dresidual2, and dinp gets it too. */
  mp_residual_forward_cpu(dinp, dinp, scratch->dresidual2, n); /* dinp += dresidual2 */
  mp_matmul_backward_cpu(scratch->datty, grads->attprojw, grads->attprojb, scratch->dresidual2,
                         acts->atty, params->attprojw, BT, C, C);
  mp_attention_backward_cpu(scratch->dqkv, scratch->dpreatt, scratch->datt, scratch->datty,
                            acts->qkv, acts->att, B, T, NH, NH, C / NH);
  mp_matmul_backward_cpu(scratch->dln1, grads->qkvw, grads->qkvb, scratch->dqkv, acts->ln1,
                         params->qkvw, BT, C, 3 * C);
  mp_layernorm_backward_cpu(dinp, grads->ln1w, grads->ln1b, scratch->dln1, inp, params->ln1w,
                            acts->ln1_mean, acts->ln1_rstd, B, T, C);
}
