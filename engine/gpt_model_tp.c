/* engine/gpt_model_tp.c — one rank's shard of the GPT on a tensor-parallel group; see the header.
 * The forward and backward chain the same calls as tests/tensor_parallel's whole-model check. */
#include "engine/gpt_model_tp.h"

#include <stdlib.h>
#include <string.h>

#include "layers/adamw.h"
#include "layers/layernorm.h"
#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/gpt_block.h"
#include "tensor_parallel/vocab_parallel_cross_entropy.h"
#include "tensor_parallel/vocab_parallel_embedding.h"

enum { kBlockTensors = 12 }; /* per block, in mp_gpt_block_params's order (gpt_model.c) */

struct mp_gpt_tp {
  mp_gpt_layout *layout; /* the one-rank layout */
  mp_tp_comm tp;
  bool sp;
  int B, T;
  int BTl;               /* B*T/tp with sequence parallelism, else B*T */
  int Vl;                /* Vp/tp */
  mp_tp_block_shape shape;
  int num_tensors;
  mp_gpt_tp_tensor *tensors; /* (num_tensors,) in the layout's order */
  size_t num_params;     /* floats of this rank's shard */
  float *params, *grads; /* (num_params,) */
  /* views into params and grads */
  float *wte, *wpe, *lnfw, *lnfb;    /* (Vl, C), (maxT, C), (C), (C) */
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  mp_gpt_block_params *blocks, *dblocks; /* (L,) shard layout */
  /* activations of one micro-batch, one allocation */
  float *activation_memory;
  float *encoded;                    /* (BTl, C) the embedding's output */
  float *embed_work;                 /* (BT, C) SP: the partial lookup; also dout_total */
  mp_tp_block_acts *acts;            /* (L,) */
  float *lnf, *lnf_mean, *lnf_rstd;  /* (BTl, C), (BTl), (BTl) */
  float *lnf_total;                  /* (BT, C) SP: the all-gathered LM-head input */
  float *logits;                     /* (BT, Vl), reused as dlogits in backward */
  float *probs;                      /* (BT, Vl) */
  float *ce_work;                    /* mp_tp_vocab_cross_entropy_work_floats */
  float *head_work;                  /* mp_tp_column_linear_work_floats(BT, C) */
  float *dlnf, *dresidual, *dresidual_next; /* (BTl, C) each */
  mp_tp_block_scratch scratch;
  int32_t *inputs, *targets;         /* (B, T) copies of the last forward's tokens */
};

void mp_gpt_tp_free(mp_gpt_tp *gpt) {
  if (gpt == NULL) return;
  free(gpt->targets);
  free(gpt->inputs);
  free(gpt->activation_memory);
  free(gpt->acts);
  free(gpt->dblocks);
  free(gpt->blocks);
  free(gpt->grads);
  free(gpt->params);
  free(gpt->tensors);
  mp_gpt_layout_free(gpt->layout);
  free(gpt);
}

/* Block l's twelve tensors of base (params or grads), in mp_gpt_block_params's field order. */
static mp_gpt_block_params block_view(const mp_gpt_tp *gpt, float *base, int l) {
  float *p[kBlockTensors];
  for (int k = 0; k < kBlockTensors; ++k) p[k] = base + gpt->tensors[2 + l * kBlockTensors + k].offset;
  mp_gpt_block_params b = {p[0], p[1], p[2], p[3], p[4],  p[5],
                           p[6], p[7], p[8], p[9], p[10], p[11]};
  return b;
}

/* Carves the activation buffers out of one allocation (or, with memory NULL, counts them). */
static size_t point_activations(mp_gpt_tp *gpt, float *memory) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const size_t C = (size_t)c->channels, BT = (size_t)gpt->B * (size_t)gpt->T;
  const size_t BTl = (size_t)gpt->BTl, Vl = (size_t)gpt->Vl;
  size_t used = 0;
#define TAKE(field, floats)                               \
  do {                                                    \
    if (memory != NULL) gpt->field = memory + used;       \
    used += (floats);                                     \
  } while (0)
  TAKE(encoded, BTl * C);
  TAKE(embed_work, BT * C);
  for (int l = 0; l < c->num_layers; ++l) {
    if (memory != NULL) {
      used += mp_tp_block_acts_point(&gpt->acts[l], memory + used, &gpt->shape);
    } else {
      used += mp_tp_block_acts_count(&gpt->shape);
    }
  }
  TAKE(lnf, BTl * C);
  TAKE(lnf_mean, BTl);
  TAKE(lnf_rstd, BTl);
  TAKE(lnf_total, BT * C);
  TAKE(logits, BT * Vl);
  TAKE(probs, BT * Vl);
  TAKE(ce_work, mp_tp_vocab_cross_entropy_work_floats(&gpt->tp, (int)BT));
  TAKE(head_work, mp_tp_column_linear_work_floats(&gpt->tp, gpt->sp, (int)BT, (int)C));
  TAKE(dlnf, BTl * C);
  TAKE(dresidual, BTl * C);
  TAKE(dresidual_next, BTl * C);
#undef TAKE
  if (memory != NULL) {
    used += mp_tp_block_scratch_point(&gpt->scratch, memory + used, &gpt->shape);
  } else {
    used += mp_tp_block_scratch_count(&gpt->shape);
  }
  return used;
}

mp_status mp_gpt_tp_create(const mp_model *model, int micro_batch, int seq_len,
                           const mp_tp_comm *tp, bool sequence_parallel, mp_gpt_tp **out,
                           mp_error *err) {
  *out = NULL;
  if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d of %d: not a rank of the group",
                   tp->rank, tp->size);
  }
  mp_gpt_tp *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  mp_status status = mp_gpt_layout_create(model, seq_len, &gpt->layout, err);
  if (status != MP_OK) {
    mp_gpt_tp_free(gpt);
    return status;
  }
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  gpt->tp = *tp;
  gpt->sp = sequence_parallel;
  gpt->B = micro_batch;
  gpt->T = seq_len;
  const mp_tp_block_shape shape = {
      {micro_batch, seq_len, c->channels, c->num_heads, c->ffn_channels}, tp->size,
      sequence_parallel};
  gpt->shape = shape;
  if ((status = mp_tp_block_shape_check(&gpt->shape, err)) != MP_OK ||
      (status = mp_tp_vocab_check(c->padded_vocab_size, tp->size, err)) != MP_OK) {
    mp_error inner = *err;
    mp_fail(err, status, "%s with tp = %d%s: %s", mp_model_source(model), tp->size,
            sequence_parallel ? " and sequence parallelism" : "", inner.message);
    mp_gpt_tp_free(gpt);
    return status;
  }
  gpt->BTl = sequence_parallel ? micro_batch * seq_len / tp->size : micro_batch * seq_len;
  gpt->Vl = c->padded_vocab_size / tp->size;

  /* The shard's tensor table. */
  gpt->num_tensors = mp_gpt_layout_num_tensors(gpt->layout);
  gpt->tensors = calloc((size_t)gpt->num_tensors, sizeof *gpt->tensors);
  if (gpt->tensors == NULL) {
    mp_gpt_tp_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  size_t offset = 0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    mp_gpt_tp_tensor *t = &gpt->tensors[i];
    t->full = mp_gpt_layout_tensor(gpt->layout, i);
    if ((status = mp_tp_split_of(t->full->name, &t->split, err)) != MP_OK) {
      mp_gpt_tp_free(gpt);
      return status;
    }
    t->offset = offset;
    t->count = mp_tp_shard_floats(t->split, t->full->rows, t->full->cols, tp->size);
    offset += t->count;
  }
  gpt->num_params = offset;
  const int L = c->num_layers;
  gpt->params = calloc(gpt->num_params, sizeof(float));
  gpt->grads = calloc(gpt->num_params, sizeof(float));
  gpt->blocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpt->blocks);
  gpt->dblocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpt->dblocks);
  gpt->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *gpt->acts);
  const size_t BT = (size_t)micro_batch * (size_t)seq_len;
  gpt->inputs = calloc(BT, sizeof(int32_t));
  gpt->targets = calloc(BT, sizeof(int32_t));
  const size_t activation_floats = point_activations(gpt, NULL);
  gpt->activation_memory = calloc(activation_floats, sizeof(float));
  if (gpt->params == NULL || gpt->grads == NULL || gpt->blocks == NULL || gpt->dblocks == NULL ||
      gpt->acts == NULL || gpt->inputs == NULL || gpt->targets == NULL ||
      gpt->activation_memory == NULL) {
    const size_t n = gpt->num_params;
    mp_gpt_tp_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "out of memory for a shard of %zu parameters and %zu activation floats", n,
                   activation_floats);
  }
  point_activations(gpt, gpt->activation_memory);
  const int last = gpt->num_tensors;
  gpt->wte = gpt->params + gpt->tensors[0].offset;
  gpt->wpe = gpt->params + gpt->tensors[1].offset;
  gpt->lnfw = gpt->params + gpt->tensors[last - 2].offset;
  gpt->lnfb = gpt->params + gpt->tensors[last - 1].offset;
  gpt->dwte = gpt->grads + gpt->tensors[0].offset;
  gpt->dwpe = gpt->grads + gpt->tensors[1].offset;
  gpt->dlnfw = gpt->grads + gpt->tensors[last - 2].offset;
  gpt->dlnfb = gpt->grads + gpt->tensors[last - 1].offset;
  for (int l = 0; l < L; ++l) {
    gpt->blocks[l] = block_view(gpt, gpt->params, l);
    gpt->dblocks[l] = block_view(gpt, gpt->grads, l);
  }
  *out = gpt;
  return MP_OK;
}

const mp_gpt_layout *mp_gpt_tp_layout(const mp_gpt_tp *gpt) { return gpt->layout; }
const mp_tp_comm *mp_gpt_tp_comm(const mp_gpt_tp *gpt) { return &gpt->tp; }
bool mp_gpt_tp_sequence_parallel(const mp_gpt_tp *gpt) { return gpt->sp; }
size_t mp_gpt_tp_num_params(const mp_gpt_tp *gpt) { return gpt->num_params; }
float *mp_gpt_tp_params(mp_gpt_tp *gpt) { return gpt->params; }
float *mp_gpt_tp_grads(mp_gpt_tp *gpt) { return gpt->grads; }
int mp_gpt_tp_num_tensors(const mp_gpt_tp *gpt) { return gpt->num_tensors; }
const mp_gpt_tp_tensor *mp_gpt_tp_tensor_at(const mp_gpt_tp *gpt, int index) {
  return &gpt->tensors[index];
}

/* shard = this rank's part of every tensor of full. */
static mp_status extract_all(const mp_gpt_tp *gpt, float *shard, const float *full,
                             mp_error *err) {
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    MP_TRY(mp_tp_shard_extract(shard + t->offset, full + t->full->offset, t->split, t->full->rows,
                               t->full->cols, gpt->tp.rank, gpt->tp.size, err));
  }
  return MP_OK;
}

mp_status mp_gpt_tp_set_full_params(mp_gpt_tp *gpt, const float *full, mp_error *err) {
  return extract_all(gpt, gpt->params, full, err);
}

mp_status mp_gpt_tp_init_params(mp_gpt_tp *gpt, uint64_t seed, mp_error *err) {
  const size_t n = mp_gpt_layout_num_params(gpt->layout);
  float *full = malloc(n * sizeof(float));
  if (full == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory initialising %zu parameters", n);
  }
  mp_gpt_layout_init_params(gpt->layout, full, seed);
  const mp_status status = extract_all(gpt, gpt->params, full, err);
  free(full);
  return status;
}

/* full (one-rank layout) = every rank's shard of `shard` put back, on every rank. */
static mp_status gather_all(mp_gpt_tp *gpt, const float *shard, float *full, mp_error *err) {
  const size_t P = (size_t)gpt->tp.size;
  size_t largest = 0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    if (gpt->tensors[i].count > largest) largest = gpt->tensors[i].count;
  }
  float *gathered = malloc((largest * P > 0 ? largest * P : 1) * sizeof(float));
  if (gathered == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory gathering parameters");
  mp_status status = MP_OK;
  for (int i = 0; i < gpt->num_tensors && status == MP_OK; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    if (t->split == MP_TP_REPLICATED) {
      memcpy(full + t->full->offset, shard + t->offset, t->count * sizeof(float));
      continue;
    }
    status = mp_tp_all_gather(&gpt->tp, shard + t->offset, gathered, t->count, err);
    for (int r = 0; r < gpt->tp.size && status == MP_OK; ++r) {
      status = mp_tp_shard_insert(full + t->full->offset, gathered + (size_t)r * t->count,
                                  t->split, t->full->rows, t->full->cols, r, gpt->tp.size, err);
    }
  }
  free(gathered);
  return status;
}

mp_status mp_gpt_tp_gather_params(mp_gpt_tp *gpt, float *full, mp_error *err) {
  return gather_all(gpt, gpt->params, full, err);
}

mp_status mp_gpt_tp_gather_grads(mp_gpt_tp *gpt, float *full, mp_error *err) {
  return gather_all(gpt, gpt->grads, full, err);
}

void mp_gpt_tp_zero_grads(mp_gpt_tp *gpt) {
  memset(gpt->grads, 0, gpt->num_params * sizeof(float));
}

mp_status mp_gpt_tp_forward(mp_gpt_tp *gpt, const int32_t *inputs, const int32_t *targets,
                            double *loss, mp_error *err) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const int B = gpt->B, T = gpt->T, C = c->channels, BT = B * T, Vp = c->padded_vocab_size;
  const mp_tp_comm *tp = &gpt->tp;
  const bool sp = gpt->sp;
  memcpy(gpt->inputs, inputs, (size_t)BT * sizeof(int32_t));
  memcpy(gpt->targets, targets, (size_t)BT * sizeof(int32_t));
  MP_TRY(mp_tp_vocab_embedding_forward(tp, sp, gpt->encoded, inputs, gpt->wte, gpt->wpe,
                                       sp ? gpt->embed_work : NULL, B, T, C, Vp, err));
  const float *x = gpt->encoded;
  for (int l = 0; l < c->num_layers; ++l) {
    MP_TRY(mp_tp_block_forward(tp, &gpt->shape, &gpt->blocks[l], &gpt->acts[l], x, err));
    x = gpt->acts[l].out;
  }
  mp_layernorm_forward_cpu(gpt->lnf, gpt->lnf_mean, gpt->lnf_rstd, x, gpt->lnfw, gpt->lnfb, 1,
                           gpt->BTl, C);
  MP_TRY(mp_tp_lm_head_forward(tp, sp, gpt->logits, sp ? gpt->lnf_total : NULL, gpt->lnf,
                               gpt->wte, BT, C, Vp, err));
  return mp_tp_vocab_cross_entropy_forward(tp, loss, NULL, gpt->probs, gpt->logits, targets,
                                           gpt->ce_work, BT, c->vocab_size, Vp, err);
}

mp_status mp_gpt_tp_backward(mp_gpt_tp *gpt, float dloss, mp_error *err) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const int B = gpt->B, T = gpt->T, C = c->channels, BT = B * T, L = c->num_layers;
  const int Vp = c->padded_vocab_size;
  const size_t local = (size_t)gpt->BTl * (size_t)C;
  const mp_tp_comm *tp = &gpt->tp;
  const bool sp = gpt->sp;
  float *dlogits = gpt->logits; /* the logits are not needed once probs exist */
  memset(dlogits, 0, (size_t)BT * (size_t)gpt->Vl * sizeof(float));
  mp_tp_vocab_cross_entropy_backward(tp, dlogits, gpt->probs, gpt->targets, dloss, BT,
                                     c->vocab_size, Vp);
  memset(gpt->dlnf, 0, local * sizeof(float));
  MP_TRY(mp_tp_lm_head_backward(tp, sp, gpt->dlnf, gpt->dwte, dlogits,
                                sp ? gpt->lnf_total : gpt->lnf, gpt->wte, gpt->head_work, BT, C,
                                Vp, err));
  const float *last = L > 0 ? gpt->acts[L - 1].out : gpt->encoded;
  memset(gpt->dresidual, 0, local * sizeof(float));
  mp_layernorm_backward_cpu(gpt->dresidual, gpt->dlnfw, gpt->dlnfb, gpt->dlnf, last, gpt->lnfw,
                            gpt->lnf_mean, gpt->lnf_rstd, 1, gpt->BTl, C);
  for (int l = L - 1; l >= 0; --l) {
    memset(gpt->dresidual_next, 0, local * sizeof(float));
    const float *inp = l == 0 ? gpt->encoded : gpt->acts[l - 1].out;
    MP_TRY(mp_tp_block_backward(tp, &gpt->shape, gpt->dresidual_next, &gpt->dblocks[l],
                                &gpt->scratch, gpt->dresidual, inp, &gpt->blocks[l],
                                &gpt->acts[l], err));
    float *swap = gpt->dresidual;
    gpt->dresidual = gpt->dresidual_next;
    gpt->dresidual_next = swap;
  }
  return mp_tp_vocab_embedding_backward(tp, sp, gpt->dwte, gpt->dwpe, gpt->dresidual,
                                        sp ? gpt->embed_work : NULL, gpt->inputs, B, T, C, Vp,
                                        err);
}

mp_status mp_gpt_tp_finish_grads(mp_gpt_tp *gpt, mp_error *err) {
  if (!gpt->sp) return MP_OK;
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  for (int l = 0; l < c->num_layers; ++l) {
    MP_TRY(mp_tp_block_reduce_sequence_parallel_grads(&gpt->tp, &gpt->shape, &gpt->dblocks[l],
                                                      err));
  }
  MP_TRY(mp_tp_all_reduce_sum(&gpt->tp, gpt->dlnfw, (size_t)c->channels, err));
  return mp_tp_all_reduce_sum(&gpt->tp, gpt->dlnfb, (size_t)c->channels, err);
}

mp_status mp_gpt_tp_grad_norm_squared(mp_gpt_tp *gpt, double *out, mp_error *err) {
  double replicated = 0.0, sharded = 0.0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    const double squares = mp_grad_norm_squared_cpu(gpt->grads + t->offset, t->count);
    if (t->split == MP_TP_REPLICATED) {
      replicated += squares;
    } else {
      sharded += squares;
    }
  }
  /* The table sums floats only; a double's bits travel unchanged through an all-gather. */
  const size_t P = (size_t)gpt->tp.size;
  float packed[2];
  float *gathered = malloc(2 * P * sizeof(float));
  if (gathered == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  memcpy(packed, &sharded, sizeof sharded);
  const mp_status status = mp_tp_all_gather(&gpt->tp, packed, gathered, 2, err);
  double total = replicated;
  for (size_t r = 0; r < P && status == MP_OK; ++r) {
    double part;
    memcpy(&part, gathered + 2 * r, sizeof part);
    total += part;
  }
  free(gathered);
  if (status == MP_OK) *out = total;
  return status;
}
