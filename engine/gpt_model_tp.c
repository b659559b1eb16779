/* engine/gpt_model_tp.c — one rank's shard of the GPT on a tensor-parallel group; see the header.
 * The forward and backward chain the same calls as tests/tensor_parallel's whole-model check. */
#include "engine/gpt_model_tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers/adamw.h"
#include "layers/layernorm.h"
#include "tensor_parallel/column_parallel_linear.h"
#include "tensor_parallel/gpt_block.h"
#include "tensor_parallel/vocab_parallel_cross_entropy.h"
#include "tensor_parallel/vocab_parallel_embedding.h"

enum { kBlockTensors = 12 }; /* per block, in mp_gpt_block_params's order (gpt_model.c) */

/* What one micro-batch keeps between its forward and its backward. */
typedef struct {
  bool in_use;
  float *memory;                     /* the slot's one allocation */
  float *encoded;                    /* (BTl, C) an embedding stage's output */
  float *input;                      /* (BTl, C) a later stage's input, copied */
  mp_tp_block_acts *acts;            /* (num_layers,) */
  mp_tp_block_deferred *deferred;    /* (num_layers,) zero-bubble: what W needs, else NULL */
  bool weights_pending;              /* a deferred backward ran; W has not */
  float *lnf, *lnf_mean, *lnf_rstd;  /* (BTl, C), (BTl), (BTl) final norm */
  float *lnf_total;                  /* (BT, C) SP: the all-gathered LM-head input */
  float *logits;                     /* (BT, Vl), reused as dlogits in backward */
  int32_t *inputs, *targets;         /* (B, T) copies of the micro-batch's tokens */
} activation_slot;

struct mp_gpt_tp {
  mp_gpt_layout *layout; /* the one-rank layout */
  mp_gpt_stage stage;
  mp_tp_comm tp;
  bool sp;
  int B, T;
  int BTl;               /* B*T/tp with sequence parallelism, else B*T */
  int Vl;                /* Vp/tp */
  mp_tp_block_shape shape;
  int num_tensors;
  mp_gpt_tp_tensor *tensors; /* (num_tensors,) the stage's tensors in the layout's order */
  size_t num_params;     /* floats of this rank's shard of the stage */
  float *params, *grads; /* (num_params,) */
  /* views into params and grads; NULL when the stage does not hold the tensor */
  float *wte, *wpe, *lnfw, *lnfb;    /* (Vl, C), (maxT, C), (C), (C) */
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  mp_gpt_block_params *blocks, *dblocks; /* (num_layers,) shard layout */
  int num_slots;
  bool deferred_weights;
  mp_recompute recompute;
  activation_slot *slots;
  /* Recomputation: selective points every slot's attention matrices at one shared pair; full
   * keeps only each slot's input and tokens, and recomputes its forward into `shared`. */
  float *shared_preatt, *shared_att;  /* (B, NHl, T, T) each, selective */
  activation_slot shared;             /* full: the one set of activations */            /* (num_slots,) */
  /* working memory shared by every slot's backward (and the embedding's forward), one
   * allocation */
  float *work_memory;
  float *embed_work;                 /* (BT, C) SP: the partial lookup and its gradient */
  float *ce_work;                    /* mp_tp_vocab_cross_entropy_work_floats */
  float *head_work;                  /* mp_tp_column_linear_work_floats(BT, C) */
  float *dlnf, *dresidual, *dresidual_next; /* (BTl, C) each */
  mp_tp_block_scratch scratch;
};

mp_gpt_stage mp_gpt_stage_whole(int num_layers) {
  const mp_gpt_stage stage = {true, 0, num_layers, true, true};
  return stage;
}

mp_status mp_gpt_stage_of_chain(int num_layers, int first, int end, mp_gpt_stage *out,
                                mp_error *err) {
  const int chain = num_layers + 3;
  if (first < 0 || end <= first || end > chain) {
    return mp_fail(err, MP_ERR_INPUT,
                   "stage [%d, %d) is not a non-empty range of the model's %d chain positions "
                   "(embedding, %d blocks, final norm, LM head)",
                   first, end, chain, num_layers);
  }
  /* Chain positions: 0 embedding, 1 .. L blocks, L + 1 final norm, L + 2 head. */
  const int block_first = first < 1 ? 1 : first;
  const int block_end = end < num_layers + 1 ? end : num_layers + 1;
  out->embedding = first == 0;
  out->first_layer = block_first - 1;
  out->num_layers = block_end > block_first ? block_end - block_first : 0;
  out->final_norm = first <= num_layers + 1 && num_layers + 1 < end;
  out->head = end == chain;
  return MP_OK;
}

static void free_slot(activation_slot *slot) {
  free(slot->memory);
  free(slot->acts);
  free(slot->deferred);
  free(slot->inputs);
  free(slot->targets);
}

static void free_slots(mp_gpt_tp *gpt) {
  for (int s = 0; gpt->slots != NULL && s < gpt->num_slots; ++s) free_slot(&gpt->slots[s]);
  free(gpt->slots);
  free_slot(&gpt->shared);
  free(gpt->shared_preatt);
  free(gpt->shared_att);
}

void mp_gpt_tp_free(mp_gpt_tp *gpt) {
  if (gpt == NULL) return;
  free_slots(gpt);
  free(gpt->work_memory);
  free(gpt->dblocks);
  free(gpt->blocks);
  free(gpt->grads);
  free(gpt->params);
  free(gpt->tensors);
  mp_gpt_layout_free(gpt->layout);
  free(gpt);
}

/* The index in the shard's table of the layout's tensor `full_index`, or -1. */
static int shard_index(const mp_gpt_tp *gpt, int full_index) {
  for (int i = 0; i < gpt->num_tensors; ++i) {
    if (gpt->tensors[i].full == mp_gpt_layout_tensor(gpt->layout, full_index)) return i;
  }
  return -1;
}

static float *view(const mp_gpt_tp *gpt, float *base, int full_index) {
  const int i = shard_index(gpt, full_index);
  return i < 0 ? NULL : base + gpt->tensors[i].offset;
}

/* Block l's (global index) twelve tensors of base (params or grads), in mp_gpt_block_params's
 * field order. */
static mp_gpt_block_params block_view(const mp_gpt_tp *gpt, float *base, int l) {
  float *p[kBlockTensors];
  for (int k = 0; k < kBlockTensors; ++k) p[k] = view(gpt, base, 2 + l * kBlockTensors + k);
  mp_gpt_block_params b = {p[0], p[1], p[2], p[3], p[4],  p[5],
                           p[6], p[7], p[8], p[9], p[10], p[11]};
  return b;
}

typedef struct {
  float *memory; /* NULL: count only */
  size_t used;
} carver;

static float *carve(carver *k, size_t floats) {
  float *at = k->memory != NULL ? k->memory + k->used : NULL;
  k->used += floats;
  return at;
}

/* Carves one slot's activations out of memory (or, with memory NULL, counts them). */
static size_t point_slot(const mp_gpt_tp *gpt, activation_slot *slot, float *memory) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const mp_gpt_stage *st = &gpt->stage;
  const size_t C = (size_t)c->channels, BT = (size_t)gpt->B * (size_t)gpt->T;
  const size_t BTl = (size_t)gpt->BTl, Vl = (size_t)gpt->Vl;
  carver k = {memory, 0};
  slot->encoded = carve(&k, st->embedding ? BTl * C : 0);
  slot->input = carve(&k, st->embedding ? 0 : BTl * C);
  const bool selective = gpt->recompute == MP_RECOMPUTE_SELECTIVE;
  for (int l = 0; l < st->num_layers; ++l) {
    if (memory != NULL && selective) {
      k.used += mp_tp_block_acts_point_without_attention(&slot->acts[l], memory + k.used,
                                                         &gpt->shape);
      slot->acts[l].preatt = gpt->shared_preatt;
      slot->acts[l].att = gpt->shared_att;
    } else if (memory != NULL) {
      k.used += mp_tp_block_acts_point(&slot->acts[l], memory + k.used, &gpt->shape);
    } else if (selective) {
      k.used += mp_tp_block_acts_count_without_attention(&gpt->shape);
    } else {
      k.used += mp_tp_block_acts_count(&gpt->shape);
    }
    if (!gpt->deferred_weights) continue;
    if (memory != NULL) {
      k.used += mp_tp_block_deferred_point(&slot->deferred[l], memory + k.used, &gpt->shape);
    } else {
      k.used += mp_tp_block_deferred_count(&gpt->shape);
    }
  }
  const size_t norm = st->final_norm ? 1 : 0, head = st->head ? 1 : 0;
  slot->lnf = carve(&k, norm * BTl * C);
  slot->lnf_mean = carve(&k, norm * BTl);
  slot->lnf_rstd = carve(&k, norm * BTl);
  slot->lnf_total = carve(&k, gpt->sp ? head * BT * C : 0);
  /* The logits, then (the softmax writes over them) the probabilities, then dlogits. */
  slot->logits = carve(&k, head * BT * Vl);
  return k.used;
}

/* Carves the shared working memory (or counts it). */
static size_t point_work(mp_gpt_tp *gpt, float *memory) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const mp_gpt_stage *st = &gpt->stage;
  const size_t C = (size_t)c->channels, BT = (size_t)gpt->B * (size_t)gpt->T;
  const size_t BTl = (size_t)gpt->BTl;
  carver k = {memory, 0};
  gpt->embed_work = carve(&k, st->embedding && gpt->sp ? BT * C : 0);
  gpt->ce_work = carve(&k, st->head ? mp_tp_vocab_cross_entropy_work_floats(&gpt->tp, (int)BT) : 0);
  gpt->head_work =
      carve(&k, st->head ? mp_tp_column_linear_work_floats(&gpt->tp, gpt->sp, (int)BT, (int)C) : 0);
  gpt->dlnf = carve(&k, BTl * C);
  gpt->dresidual = carve(&k, BTl * C);
  gpt->dresidual_next = carve(&k, BTl * C);
  if (memory != NULL) {
    k.used += mp_tp_block_scratch_point(&gpt->scratch, memory + k.used, &gpt->shape);
  } else {
    k.used += mp_tp_block_scratch_count(&gpt->shape);
  }
  return k.used;
}

/* True when the stage holds the layout's tensor full_index (wte, wpe, blocks..., lnfw, lnfb). */
static bool stage_holds(const mp_gpt_stage *st, int full_index, int num_tensors) {
  if (full_index == 0) return st->embedding || st->head;
  if (full_index == 1) return st->embedding;
  if (full_index >= num_tensors - 2) return st->final_norm;
  const int layer = (full_index - 2) / kBlockTensors;
  return layer >= st->first_layer && layer < st->first_layer + st->num_layers;
}

/* Allocates one whole slot (activations, tokens). */
static mp_status create_slot(mp_gpt_tp *gpt, activation_slot *slot, mp_error *err) {
  const size_t BT = (size_t)gpt->B * (size_t)gpt->T;
  const int L = gpt->stage.num_layers;
  slot->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *slot->acts);
  slot->deferred = calloc((size_t)(L > 0 ? L : 1), sizeof *slot->deferred);
  slot->inputs = calloc(BT, sizeof(int32_t));
  slot->targets = calloc(BT, sizeof(int32_t));
  const size_t floats = point_slot(gpt, slot, NULL);
  slot->memory = calloc(floats > 0 ? floats : 1, sizeof(float));
  if (slot->acts == NULL || slot->deferred == NULL || slot->inputs == NULL ||
      slot->targets == NULL || slot->memory == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for an activation slot of %zu floats",
                   floats);
  }
  point_slot(gpt, slot, slot->memory);
  return MP_OK;
}

/* Full recomputation: a slot that keeps its tokens and input only; everything else points into
 * the shared slot. */
static mp_status create_light_slot(mp_gpt_tp *gpt, activation_slot *slot, mp_error *err) {
  const size_t BT = (size_t)gpt->B * (size_t)gpt->T;
  const int L = gpt->stage.num_layers;
  const size_t input_floats = gpt->stage.embedding ? 0 : mp_gpt_tp_boundary_floats(gpt);
  *slot = gpt->shared;
  slot->memory = NULL;
  slot->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *slot->acts);
  slot->deferred = NULL;
  slot->inputs = calloc(BT, sizeof(int32_t));
  slot->targets = calloc(BT, sizeof(int32_t));
  slot->memory = calloc(input_floats > 0 ? input_floats : 1, sizeof(float));
  if (slot->acts == NULL || slot->inputs == NULL || slot->targets == NULL ||
      slot->memory == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for an activation slot");
  }
  if (L > 0) memcpy(slot->acts, gpt->shared.acts, (size_t)L * sizeof *slot->acts);
  if (!gpt->stage.embedding) slot->input = slot->memory;
  return MP_OK;
}

static mp_status create_slots(mp_gpt_tp *gpt, int num_slots, mp_error *err) {
  gpt->num_slots = num_slots;
  gpt->slots = calloc((size_t)num_slots, sizeof *gpt->slots);
  if (gpt->slots == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  if (gpt->recompute == MP_RECOMPUTE_SELECTIVE) {
    const mp_tp_block_shape *z = &gpt->shape;
    const size_t tt = (size_t)z->full.B * (size_t)(z->full.NH / z->tp) * (size_t)z->full.T *
                      (size_t)z->full.T;
    gpt->shared_preatt = calloc(tt > 0 ? tt : 1, sizeof(float));
    gpt->shared_att = calloc(tt > 0 ? tt : 1, sizeof(float));
    if (gpt->shared_preatt == NULL || gpt->shared_att == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the attention matrices");
    }
  }
  if (gpt->recompute == MP_RECOMPUTE_FULL) {
    MP_TRY(create_slot(gpt, &gpt->shared, err));
    for (int s = 0; s < num_slots; ++s) MP_TRY(create_light_slot(gpt, &gpt->slots[s], err));
    return MP_OK;
  }
  for (int s = 0; s < num_slots; ++s) MP_TRY(create_slot(gpt, &gpt->slots[s], err));
  return MP_OK;
}

mp_status mp_gpt_tp_create(const mp_model *model, int micro_batch, int seq_len,
                           const mp_tp_comm *tp, bool sequence_parallel, mp_gpt_tp **out,
                           mp_error *err) {
  *out = NULL;
  mp_gpt_layout *layout = NULL;
  MP_TRY(mp_gpt_layout_create(model, seq_len, &layout, err));
  const mp_gpt_stage whole = mp_gpt_stage_whole(mp_gpt_layout_config(layout)->num_layers);
  mp_gpt_layout_free(layout);
  return mp_gpt_tp_create_stage(model, micro_batch, seq_len, tp, sequence_parallel, &whole, 1,
                                false, MP_RECOMPUTE_NONE, out, err);
}

mp_status mp_gpt_tp_create_stage(const mp_model *model, int micro_batch, int seq_len,
                                 const mp_tp_comm *tp, bool sequence_parallel,
                                 const mp_gpt_stage *stage, int num_slots, bool deferred_weights,
                                 mp_recompute recompute, mp_gpt_tp **out, mp_error *err) {
  *out = NULL;
  if (recompute == MP_RECOMPUTE_FULL && deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: full recomputation cannot run a zero-bubble schedule: its weight pass "
                   "needs activations that the recomputation of the next micro-batch overwrites; "
                   "use recompute \"selective\" or \"none\", or another schedule",
                   mp_model_source(model));
  }
  if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d of %d: not a rank of the group",
                   tp->rank, tp->size);
  }
  if (num_slots < 0) {
    return mp_fail(err, MP_ERR_INPUT, "a stage needs zero or more activation slots; got %d",
                   num_slots);
  }
  mp_gpt_tp *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  mp_status status = mp_gpt_layout_create(model, seq_len, &gpt->layout, err);
  if (status != MP_OK) {
    mp_gpt_tp_free(gpt);
    return status;
  }
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  if (stage->first_layer < 0 || stage->num_layers < 0 ||
      stage->first_layer + stage->num_layers > c->num_layers) {
    mp_gpt_tp_free(gpt);
    return mp_fail(err, MP_ERR_INPUT, "%s: blocks [%d, %d) are not blocks of the model (%d)",
                   mp_model_source(model), stage->first_layer,
                   stage->first_layer + stage->num_layers, c->num_layers);
  }
  gpt->stage = *stage;
  gpt->deferred_weights = deferred_weights;
  gpt->recompute = recompute;
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

  /* The shard's tensor table: the stage's tensors, in the layout's order. */
  const int all = mp_gpt_layout_num_tensors(gpt->layout);
  gpt->tensors = calloc((size_t)all, sizeof *gpt->tensors);
  if (gpt->tensors == NULL) {
    mp_gpt_tp_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  size_t offset = 0;
  for (int i = 0; i < all; ++i) {
    if (!stage_holds(stage, i, all)) continue;
    mp_gpt_tp_tensor *t = &gpt->tensors[gpt->num_tensors++];
    t->full = mp_gpt_layout_tensor(gpt->layout, i);
    t->tied_copy = i == 0 && !stage->embedding;
    t->split = t->full->split;
    t->offset = offset;
    t->count = mp_tp_shard_floats(t->split, t->full->rows, t->full->cols, tp->size);
    offset += t->count;
  }
  gpt->num_params = offset;
  const int L = stage->num_layers;
  gpt->params = calloc(gpt->num_params > 0 ? gpt->num_params : 1, sizeof(float));
  gpt->grads = calloc(gpt->num_params > 0 ? gpt->num_params : 1, sizeof(float));
  gpt->blocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpt->blocks);
  gpt->dblocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpt->dblocks);
  /* Without slots the stage only holds its arrays (a GPU stage's host copy): no working memory. */
  const size_t work_floats = num_slots > 0 ? point_work(gpt, NULL) : 0;
  gpt->work_memory = calloc(work_floats > 0 ? work_floats : 1, sizeof(float));
  if (gpt->params == NULL || gpt->grads == NULL || gpt->blocks == NULL || gpt->dblocks == NULL ||
      gpt->work_memory == NULL) {
    const size_t n = gpt->num_params;
    mp_gpt_tp_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a shard of %zu parameters", n);
  }
  if (num_slots > 0) point_work(gpt, gpt->work_memory);
  if (num_slots > 0 && (status = create_slots(gpt, num_slots, err)) != MP_OK) {
    mp_gpt_tp_free(gpt);
    return status;
  }
  gpt->wte = view(gpt, gpt->params, 0);
  gpt->wpe = view(gpt, gpt->params, 1);
  gpt->lnfw = view(gpt, gpt->params, all - 2);
  gpt->lnfb = view(gpt, gpt->params, all - 1);
  gpt->dwte = view(gpt, gpt->grads, 0);
  gpt->dwpe = view(gpt, gpt->grads, 1);
  gpt->dlnfw = view(gpt, gpt->grads, all - 2);
  gpt->dlnfb = view(gpt, gpt->grads, all - 1);
  for (int l = 0; l < L; ++l) {
    gpt->blocks[l] = block_view(gpt, gpt->params, stage->first_layer + l);
    gpt->dblocks[l] = block_view(gpt, gpt->grads, stage->first_layer + l);
  }
  *out = gpt;
  return MP_OK;
}

const mp_gpt_stage *mp_gpt_tp_stage(const mp_gpt_tp *gpt) { return &gpt->stage; }

size_t mp_gpt_tp_boundary_floats(const mp_gpt_tp *gpt) {
  return (size_t)gpt->BTl * (size_t)mp_gpt_layout_config(gpt->layout)->channels;
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

/* Calls visit for each block of each of this rank's shards, in tensor order: initialisation and
 * loading both fill a shard block by block, so no rank ever holds a full tensor, and a source
 * whose file is laid out otherwise (GPT-2's transposed weights) still reads each block's rows
 * whole. */
typedef mp_status (*shard_block_visit)(mp_gpt_tp *gpt, const mp_gpt_tp_tensor *t,
                                       const mp_tp_shard_block *block, void *context,
                                       mp_error *err);

static mp_status for_each_shard_block(mp_gpt_tp *gpt, shard_block_visit visit, void *context,
                                      mp_error *err) {
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
    int count = 0;
    MP_TRY(mp_tp_shard_blocks(t->split, t->full->rows, t->full->cols, gpt->tp.rank, gpt->tp.size,
                              blocks, &count, err));
    for (int k = 0; k < count; ++k) MP_TRY(visit(gpt, t, &blocks[k], context, err));
  }
  return MP_OK;
}

static mp_status init_block(mp_gpt_tp *gpt, const mp_gpt_tp_tensor *t,
                            const mp_tp_shard_block *b, void *context, mp_error *err) {
  (void)err;
  mp_gpt_tensor_init_block(gpt->layout, t->full, gpt->params + t->offset + b->shard_offset,
                           b->rows, b->cols, b->row_offset, b->col_offset,
                           *(const uint64_t *)context);
  return MP_OK;
}

mp_status mp_gpt_tp_init_params(mp_gpt_tp *gpt, uint64_t seed, mp_error *err) {
  return for_each_shard_block(gpt, init_block, &seed, err);
}

static mp_status load_block(mp_gpt_tp *gpt, const mp_gpt_tp_tensor *t,
                            const mp_tp_shard_block *b, void *context, mp_error *err) {
  const mp_gpt_tensor *first = mp_gpt_layout_tensor(gpt->layout, 0);
  return mp_weight_source_read(context, (int)(t->full - first), b->row_offset, b->rows,
                               b->col_offset, b->cols, gpt->params + t->offset + b->shard_offset,
                               err);
}

mp_status mp_gpt_tp_load(mp_gpt_tp *gpt, mp_weight_source *weights, mp_error *err) {
  return for_each_shard_block(gpt, load_block, weights, err);
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
    if (t->tied_copy) continue;
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

static mp_status check_slot(const mp_gpt_tp *gpt, int slot, bool want_in_use, mp_error *err) {
  if (slot < 0 || slot >= gpt->num_slots) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d: the stage has %d", slot,
                   gpt->num_slots);
  }
  if (gpt->slots[slot].in_use != want_in_use) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d is %s", slot,
                   want_in_use ? "empty: no forward ran into it" : "still holding a micro-batch");
  }
  return MP_OK;
}

/* The stage's forward into slot. With recomputing, the slot already holds its tokens and input
 * (full recomputation at backward time), output is NULL and the loss is not reported. */
static mp_status stage_forward(mp_gpt_tp *gpt, activation_slot *slot, const int32_t *inputs,
                               const int32_t *targets, const float *input, float *output,
                               double *loss, bool recomputing, mp_error *err) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const mp_gpt_stage *st = &gpt->stage;
  const int B = gpt->B, T = gpt->T, C = c->channels, BT = B * T, Vp = c->padded_vocab_size;
  const size_t local = (size_t)gpt->BTl * (size_t)C;
  const mp_tp_comm *tp = &gpt->tp;
  const bool sp = gpt->sp;
  const float *x = NULL;
  if (st->embedding) {
    if (!recomputing) memcpy(slot->inputs, inputs, (size_t)BT * sizeof(int32_t));
    MP_TRY(mp_tp_vocab_embedding_forward(tp, sp, slot->encoded, slot->inputs, gpt->wte,
                                         gpt->wpe, sp ? gpt->embed_work : NULL, B, T, C, Vp,
                                         err));
    x = slot->encoded;
  } else {
    if (!recomputing) memcpy(slot->input, input, local * sizeof(float));
    x = slot->input;
  }
  for (int l = 0; l < st->num_layers; ++l) {
    MP_TRY(mp_tp_block_forward(tp, &gpt->shape, &gpt->blocks[l], &slot->acts[l], x, err));
    x = slot->acts[l].out;
  }
  if (st->final_norm) {
    mp_layernorm_forward_cpu(slot->lnf, slot->lnf_mean, slot->lnf_rstd, x, gpt->lnfw, gpt->lnfb,
                             1, gpt->BTl, C);
    x = slot->lnf;
  }
  if (!st->head) {
    if (output != NULL) memcpy(output, x, local * sizeof(float));
    return MP_OK;
  }
  if (!recomputing) memcpy(slot->targets, targets, (size_t)BT * sizeof(int32_t));
  double ignored = 0.0;
  MP_TRY(mp_tp_lm_head_forward(tp, sp, slot->logits, sp ? slot->lnf_total : NULL, x, gpt->wte,
                               BT, C, Vp, err));
  return mp_tp_vocab_cross_entropy_forward(tp, recomputing ? &ignored : loss, NULL, slot->logits,
                                           slot->logits, slot->targets, gpt->ce_work, BT,
                                           c->vocab_size, Vp, err);
}

mp_status mp_gpt_tp_forward_stage(mp_gpt_tp *gpt, int slot_index, const int32_t *inputs,
                                  const int32_t *targets, const float *input, float *output,
                                  double *loss, mp_error *err) {
  MP_TRY(check_slot(gpt, slot_index, false, err));
  activation_slot *slot = &gpt->slots[slot_index];
  MP_TRY(stage_forward(gpt, slot, inputs, targets, input, output, loss, false, err));
  slot->in_use = true;
  return MP_OK;
}

/* The input of the stage's final norm or head (whatever came before it in the stage). */
static const float *before_tail(const mp_gpt_tp *gpt, const activation_slot *slot) {
  const int L = gpt->stage.num_layers;
  if (L > 0) return slot->acts[L - 1].out;
  return gpt->stage.embedding ? slot->encoded : slot->input;
}

mp_status mp_gpt_tp_backward_stage(mp_gpt_tp *gpt, int slot_index, float dloss,
                                   const float *doutput, float *dinput, bool defer_weights,
                                   mp_error *err) {
  MP_TRY(check_slot(gpt, slot_index, true, err));
  if (defer_weights && !gpt->deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "a deferred backward needs a stage created with deferred weights");
  }
  if (gpt->slots[slot_index].weights_pending) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d already ran its backward",
                   slot_index);
  }
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const mp_gpt_stage *st = &gpt->stage;
  const int B = gpt->B, T = gpt->T, C = c->channels, BT = B * T, L = st->num_layers;
  const int Vp = c->padded_vocab_size;
  const size_t local = (size_t)gpt->BTl * (size_t)C;
  const mp_tp_comm *tp = &gpt->tp;
  const bool sp = gpt->sp;
  activation_slot *slot = &gpt->slots[slot_index];
  if (gpt->recompute == MP_RECOMPUTE_FULL) {
    /* Same inputs, same weights, same kernels: the activations come back bit for bit. */
    MP_TRY(stage_forward(gpt, slot, NULL, NULL, NULL, NULL, NULL, true, err));
  }
  /* g: the gradient flowing backward through the stage, (BTl, C). */
  const float *tail_input = before_tail(gpt, slot);
  const float *g = doutput;
  if (st->head) {
    float *dlogits = slot->logits; /* the forward's probabilities, turned into dlogits */
    mp_tp_vocab_cross_entropy_backward_in_place(tp, dlogits, slot->targets, dloss, BT,
                                                c->vocab_size, Vp);
    const float *head_input = st->final_norm ? slot->lnf : tail_input;
    memset(gpt->dlnf, 0, local * sizeof(float));
    MP_TRY(mp_tp_lm_head_backward(tp, sp, gpt->dlnf, gpt->dwte, dlogits,
                                  sp ? slot->lnf_total : head_input, gpt->wte, gpt->head_work,
                                  BT, C, Vp, err));
    g = gpt->dlnf;
  }
  memset(gpt->dresidual, 0, local * sizeof(float));
  if (st->final_norm) {
    mp_layernorm_backward_cpu(gpt->dresidual, gpt->dlnfw, gpt->dlnfb, g, tail_input, gpt->lnfw,
                              slot->lnf_mean, slot->lnf_rstd, 1, gpt->BTl, C);
  } else {
    memcpy(gpt->dresidual, g, local * sizeof(float));
  }
  const float *stage_input = st->embedding ? slot->encoded : slot->input;
  for (int l = L - 1; l >= 0; --l) {
    memset(gpt->dresidual_next, 0, local * sizeof(float));
    const float *inp = l == 0 ? stage_input : slot->acts[l - 1].out;
    if (gpt->recompute == MP_RECOMPUTE_SELECTIVE) {
      mp_tp_block_recompute_attention(&gpt->shape, &slot->acts[l]);
    }
    if (defer_weights) {
      MP_TRY(mp_tp_block_backward_input(tp, &gpt->shape, gpt->dresidual_next, &gpt->dblocks[l],
                                        &gpt->scratch, &slot->deferred[l], gpt->dresidual, inp,
                                        &gpt->blocks[l], &slot->acts[l], err));
    } else {
      MP_TRY(mp_tp_block_backward(tp, &gpt->shape, gpt->dresidual_next, &gpt->dblocks[l],
                                  &gpt->scratch, gpt->dresidual, inp, &gpt->blocks[l],
                                  &slot->acts[l], err));
    }
    float *swap = gpt->dresidual;
    gpt->dresidual = gpt->dresidual_next;
    gpt->dresidual_next = swap;
  }
  /* Zero-bubble: the slot's activations feed W later. */
  slot->weights_pending = defer_weights;
  slot->in_use = defer_weights;
  if (!st->embedding) {
    memcpy(dinput, gpt->dresidual, local * sizeof(float));
    return MP_OK;
  }
  return mp_tp_vocab_embedding_backward(tp, sp, gpt->dwte, gpt->dwpe, gpt->dresidual,
                                        sp ? gpt->embed_work : NULL, slot->inputs, B, T, C, Vp,
                                        err);
}

mp_status mp_gpt_tp_backward_weights(mp_gpt_tp *gpt, int slot_index, mp_error *err) {
  MP_TRY(check_slot(gpt, slot_index, true, err));
  activation_slot *slot = &gpt->slots[slot_index];
  if (!slot->weights_pending) {
    return mp_fail(err, MP_ERR_INPUT,
                   "activation slot %d has no deferred weight gradients (its B was whole, or "
                   "has not run)",
                   slot_index);
  }
  for (int l = 0; l < gpt->stage.num_layers; ++l) {
    mp_tp_block_backward_weight(&gpt->shape, &gpt->dblocks[l], &slot->deferred[l],
                                &slot->acts[l]);
  }
  slot->weights_pending = false;
  slot->in_use = false;
  return MP_OK;
}

void mp_gpt_tp_discard(mp_gpt_tp *gpt, int slot) {
  if (slot < 0 || slot >= gpt->num_slots) return;
  gpt->slots[slot].in_use = false;
  gpt->slots[slot].weights_pending = false;
}

mp_status mp_gpt_tp_forward(mp_gpt_tp *gpt, const int32_t *inputs, const int32_t *targets,
                            double *loss, mp_error *err) {
  mp_gpt_tp_discard(gpt, 0); /* an evaluation's forward starts over */
  return mp_gpt_tp_forward_stage(gpt, 0, inputs, targets, NULL, NULL, loss, err);
}

mp_status mp_gpt_tp_backward(mp_gpt_tp *gpt, float dloss, mp_error *err) {
  return mp_gpt_tp_backward_stage(gpt, 0, dloss, NULL, NULL, false, err);
}

mp_status mp_gpt_tp_finish_grads(mp_gpt_tp *gpt, mp_error *err) {
  if (!gpt->sp) return MP_OK;
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  for (int l = 0; l < gpt->stage.num_layers; ++l) {
    MP_TRY(mp_tp_block_reduce_sequence_parallel_grads(&gpt->tp, &gpt->shape, &gpt->dblocks[l],
                                                      err));
  }
  if (!gpt->stage.final_norm) return MP_OK;
  MP_TRY(mp_tp_all_reduce_sum(&gpt->tp, gpt->dlnfw, (size_t)c->channels, err));
  return mp_tp_all_reduce_sum(&gpt->tp, gpt->dlnfb, (size_t)c->channels, err);
}

mp_status mp_gpt_tp_norm_from_squares(const mp_gpt_tp *gpt, const double *squares, double *out,
                                      mp_error *err) {
  double replicated = 0.0, sharded = 0.0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    if (t->tied_copy) continue;
    if (t->split == MP_TP_REPLICATED) {
      replicated += squares[i];
    } else {
      sharded += squares[i];
    }
  }
  MP_TRY(mp_tp_sum_double(&gpt->tp, &sharded, err));
  *out = replicated + sharded;
  return MP_OK;
}

mp_status mp_gpt_tp_grad_norm_squared(mp_gpt_tp *gpt, double *out, mp_error *err) {
  double *squares = malloc((size_t)(gpt->num_tensors > 0 ? gpt->num_tensors : 1) * sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_gpt_tp_tensor *t = &gpt->tensors[i];
    squares[i] = mp_grad_norm_squared_cpu(gpt->grads + t->offset, t->count);
  }
  const mp_status status = mp_gpt_tp_norm_from_squares(gpt, squares, out, err);
  free(squares);
  return status;
}

/* ---- the one-rank model: the whole-model stage at tp = 1 ---- */

struct mp_gpt {
  mp_tp_comm single; /* the stage keeps a copy; it has no context to outlive */
  mp_gpt_tp *stage;
};

mp_status mp_gpt_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt **out,
                        mp_error *err) {
  *out = NULL;
  mp_gpt *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  gpt->single = mp_tp_comm_single();
  const mp_status status =
      mp_gpt_tp_create(model, micro_batch, seq_len, &gpt->single, false, &gpt->stage, err);
  if (status != MP_OK) {
    free(gpt);
    return status;
  }
  *out = gpt;
  return MP_OK;
}

void mp_gpt_free(mp_gpt *gpt) {
  if (gpt == NULL) return;
  mp_gpt_tp_free(gpt->stage);
  free(gpt);
}

const mp_gpt_layout *mp_gpt_get_layout(const mp_gpt *gpt) { return gpt->stage->layout; }
const mp_gpt_config *mp_gpt_get_config(const mp_gpt *gpt) {
  return mp_gpt_layout_config(gpt->stage->layout);
}
size_t mp_gpt_num_params(const mp_gpt *gpt) { return gpt->stage->num_params; }
float *mp_gpt_params(mp_gpt *gpt) { return gpt->stage->params; }
float *mp_gpt_grads(mp_gpt *gpt) { return gpt->stage->grads; }
int mp_gpt_num_tensors(const mp_gpt *gpt) { return mp_gpt_layout_num_tensors(gpt->stage->layout); }

const mp_gpt_tensor *mp_gpt_tensor_at(const mp_gpt *gpt, int index) {
  return mp_gpt_layout_tensor(gpt->stage->layout, index);
}

const mp_gpt_tensor *mp_gpt_find_tensor(const mp_gpt *gpt, const char *name) {
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_gpt_tensor *t = mp_gpt_tensor_at(gpt, i);
    if (strcmp(t->name, name) == 0) return t;
  }
  return NULL;
}

void mp_gpt_init_params(mp_gpt *gpt, uint64_t seed) {
  mp_gpt_layout_init_params(gpt->stage->layout, gpt->stage->params, seed);
}

void mp_gpt_zero_grads(mp_gpt *gpt) { mp_gpt_tp_zero_grads(gpt->stage); }

double mp_gpt_forward(mp_gpt *gpt, const int32_t *inputs, const int32_t *targets) {
  mp_error err = MP_ERROR_INITIALIZER;
  double loss = 0.0;
  return mp_gpt_tp_forward(gpt->stage, inputs, targets, &loss, &err) == MP_OK ? loss : NAN;
}

void mp_gpt_backward(mp_gpt *gpt, float dloss) {
  mp_error err = MP_ERROR_INITIALIZER;
  (void)mp_gpt_tp_backward(gpt->stage, dloss, &err);
}

mp_status mp_gpt_load_llmc(mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_load_llmc(gpt->stage->layout, gpt->stage->params, path, err);
}

mp_status mp_gpt_save_llmc(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_save_llmc(gpt->stage->layout, gpt->stage->params, path, err);
}

mp_status mp_gpt_save_llmc_gradients(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_save_llmc(gpt->stage->layout, gpt->stage->grads, path, err);
}
