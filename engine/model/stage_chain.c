/* engine/model/stage_chain.c — a stage's forward and backward over a backend's kernels; see the
 * header. */
#include "engine/model/stage_chain.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model/router_stats.h"

/* One block's tensors by role: the backend's weights and the fp32 gradients. */
typedef struct {
  const void *w[MP_BLOCK_TENSORS]; /* with weights windows, in the one in use */
  const void *w_in[2][MP_BLOCK_TENSORS]; /* w in each weights window */
  float *g[MP_BLOCK_TENSORS];     /* with gradient windows, in the one in use */
  float *g_in[2][MP_BLOCK_TENSORS]; /* g in each gradient window */
  size_t grad_first, grad_count; /* the block's floats of the gradient array */
} block_tensors;

/* What one block's forward keeps for its backward (backend elements unless float). */
typedef struct {
  void *ln1;                  /* (BT, C) the qkv GEMM's input; (BTl, C) with SP and regather */
  float *ln1_mean, *ln1_rstd; /* (BTl) */
  void *qkv;                  /* (BT, QKVl), q and k rotated with rope */
  void *atty;                 /* (BT, Cl) */
  void *attention;            /* attention_saved_bytes */
  void *residual2;            /* (BTl, C) */
  void *ln2;                  /* (BT, C) the fc GEMM's input; (BTl, C) with SP and regather */
  float *ln2_mean, *ln2_rstd; /* (BTl) */
  void *fch;                  /* (BT, FCl) the fc GEMM's output */
  void *fch_gelu;             /* (BT, Fl) the activation's */
  void *moe_saved;            /* a mixture-of-experts MLP's: what its backward needs (the
                                 backend's, moe_release); NULL when none is held */
  void *out;                  /* (BTl, C) */
} block_acts;

/* Zero-bubble: the four GEMMs' output gradients a B keeps for its W. */
typedef struct {
  void *dfcproj;  /* (BT, C) fc_proj's output gradient (all-gathered with SP) */
  void *dfch;     /* (BT, FCl) */
  void *dattproj; /* (BT, C) */
  void *dqkv;     /* (BT, QKVl) */
} block_deferred;

/* One micro-batch between its forward and its backward (its W with deferred weights). A light
 * slot (full recomputation) owns its tokens and input only; the rest is chain->shared's. */
typedef struct {
  bool in_use, weights_pending, light;
  float dloss;
  int32_t *inputs, *targets; /* (BT) backend memory */
  int32_t *inputs_host;      /* (BT) */
  void *input;               /* (BTl, C) the embedding's output or the received boundary */
  block_acts *acts;          /* (num_layers) */
  block_deferred *deferred;  /* (num_layers) with deferred weights */
  void *lnf;                 /* (BTl, C) */
  float *lnf_mean, *lnf_rstd; /* (BTl) */
  void *head_input;          /* (BT, C) SP without regather: the LM head's input all-gathered */
  void *logits;              /* (BT, Vl), the loss gradient after the forward */
  /* Mixture of experts: the micro-batch's router statistics (engine/model/router_stats.h), of
   * the stages up to this one after its forward, the final sums from the backward's start. */
  mp_moe_stats stats;
  double *stats_storage;     /* (2E) host: stats.routed then stats.prob_sum */
} slot_acts;

struct mp_stage_chain {
  const mp_stage_kernels *k;
  const mp_stage_layout *layout; /* the shard: span, tensor table, micro-batch */
  mp_stage_span stage;
  mp_stage_dims d;
  size_t eb; /* element bytes */
  bool deferred_weights;
  mp_recompute recompute;
  /* Sequence parallelism as Megatron runs it: a slot keeps its layernorm outputs' token slices
   * only and the backward all-gathers them again (into projection) for the column-parallel
   * GEMMs' weight gradients. Not with deferred weights: W runs no collective, so B keeps the
   * gathered inputs. */
  bool regather;
  float *grads;        /* the gradient array (the hook's) */
  float *window;       /* ZeRO-2: every block's gradients (or with deferred weights its GEMM
                          weights'), one block at a time, in the window in use; else NULL */
  float *windows[2];   /* the gradient windows: the first, and NULL or a second one */
  int next_window;     /* with two, the one the next block's gradients go to */
  mp_grad_window window_kind;
  void *weights_window; /* ZeRO-3: every block's weights, gathered before its forward and its
                           backward, in the window in use; else NULL */
  void *weights_windows[2]; /* the first, and NULL or a second one */
  int next_weights_window;  /* with two, the one the next pass over a block uses */
  mp_stage_weights_hook weights_hook;
  void *weights_hook_context;
  const void *wte, *wpe, *lnfw, *lnfb;
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  const void *head_w; /* wte when tied, else lm_head */
  float *dhead;
  float *logits_capture; /* (BT, Vl) fp32 in the backend's memory, or NULL: sampling's copy */
  block_tensors *blocks;
  mp_stage_grads_hook hook;
  void *hook_context;
  int num_slots;
  slot_acts *slots;
  slot_acts shared;    /* full recomputation: the one set of activations */
  void *shared_attention; /* selective: every layer's and slot's saved attention */
  /* working memory of every slot */
  void *projection;    /* (BT, C) a row-parallel GEMM's output; the embedding's work */
  void *dout_total;    /* (BT, C) SP: a row-parallel GEMM's all-gathered output gradient */
  void *dresidual, *dnorm; /* (BT, C) */
  void *datty;         /* (BT, Cl) */
  void *dqkv;          /* (BT, QKVl) */
  void *dfch;          /* (BT, FCl) */
  void *dfch_gelu;     /* (BT, Fl) */
  /* Context parallelism: the whole sequence's keys and values (the kernels' cp_kv_full_bytes),
   * gathered for each block's attention (again in its backward: a slot keeps its own tokens'
   * only), and their gradient from this rank's queries. NULL without. */
  void *kv_full, *dkv_full;
  /* Mixture of experts: the MoE MLP's output (BT, C), every token (the experts are whole on
   * every tp rank); NULL for a dense model. */
  void *moe_out;
  /* With context parallelism: this stage's layers' router statistics of a micro-batch, summed
   * over the cp group before they join the received ones. */
  mp_moe_stats cp_stats;
  double *cp_stats_storage; /* (2E) host */
  void **owned;        /* every allocation, for free */
  int num_owned, owned_capacity;
  size_t bytes;
};

static void *at(const mp_stage_chain *ch, const void *base, size_t elements) {
  return (char *)base + elements * ch->eb;
}

static mp_status chain_alloc(mp_stage_chain *ch, void *out, size_t bytes, mp_error *err) {
  void **slot = out;
  *slot = NULL;
  if (ch->num_owned == ch->owned_capacity) {
    const int capacity = ch->owned_capacity > 0 ? 2 * ch->owned_capacity : 64;
    void **grown = realloc(ch->owned, (size_t)capacity * sizeof *grown);
    if (grown == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    ch->owned = grown;
    ch->owned_capacity = capacity;
  }
  MP_TRY(ch->k->alloc(ch->k->context, bytes > 0 ? bytes : 1, slot, err));
  ch->owned[ch->num_owned++] = *slot;
  ch->bytes += bytes;
  return MP_OK;
}

#define ALLOC(field, elements, size) \
  MP_TRY(chain_alloc(ch, &(field), (size_t)(elements) * (size), err))

mp_stage_dims mp_stage_chain_dims(const mp_stage_layout *layout, const mp_tp_comm *tp,
                                  const mp_tp_comm *cp) {
  const mp_model_config *c = mp_param_layout_config(mp_stage_layout_model(layout));
  mp_stage_dims d;
  memset(&d, 0, sizeof d);
  mp_stage_layout_micro_batch(layout, &d.B, &d.T);
  d.C = c->channels;
  d.HS = c->channels / c->num_heads;
  d.NHl = c->num_heads / tp->size;
  d.Cl = d.NHl * d.HS;
  d.Fl = c->ffn_channels / tp->size;
  d.KVHl = c->num_kv_heads / tp->size;
  d.QKVl = (d.NHl + 2 * d.KVHl) * d.HS;
  d.FCl = c->swiglu ? 2 * d.Fl : d.Fl;
  d.rmsnorm = c->rmsnorm;
  d.norm_eps = (float)c->norm_eps;
  d.swiglu = c->swiglu;
  d.rope = c->rope;
  d.rope_spec = c->rope_spec;
  d.V = c->vocab_size;
  d.Vp = c->padded_vocab_size;
  d.Vl = c->padded_vocab_size / tp->size;
  d.vocab_start = tp->rank * d.Vl;
  d.BT = d.B * d.T;
  d.sp = mp_stage_layout_sequence_parallel(layout) && tp->size > 1;
  d.BTl = d.sp ? d.BT / tp->size : d.BT;
  d.row0 = d.sp ? tp->rank * d.BTl : 0;
  const mp_stage_span *stage = mp_stage_layout_span(layout);
  d.num_layers = stage->num_layers;
  d.embedding = stage->embedding;
  d.head = stage->head;
  d.tp = *tp;
  mp_stage_layout_cp(layout, &d.cp_rank, &d.cp);
  d.Tseq = d.T * d.cp;
  d.cp_comm = cp != NULL ? *cp : mp_tp_comm_single();
  d.ep = mp_ep_comm_single(); /* a backend with an ep group sets it (stage_cpu.c) */
  if (c->moe_experts > 0) {
    d.moe.tokens = d.BT;
    d.moe.channels = d.C;
    d.moe.experts = c->moe_experts;
    d.moe.top_k = c->moe_top_k;
    d.moe.expert_ffn = c->ffn_channels;
    d.moe.shared_ffn = c->moe_shared_ffn;
    d.moe.shared_gate = c->moe_shared_gate;
    d.moe.normalize_top_k = c->moe_normalize_top_k;
    d.moe.capacity_factor = c->moe_capacity_factor;
    d.moe_aux_loss_coeff = c->moe_aux_loss_coeff;
    d.moe_z_loss_coeff = c->moe_z_loss_coeff;
  }
  return d;
}


/* A tensor's weights: at its offset in weights, or with a weights window a block tensor's at its
 * offset in its block (block_first) and the others packed (mp_stage_layout_grad_offset's packing
 * for whole blocks). */
static const void *weight_of(const mp_stage_chain *ch, void *weights, int full_index,
                             size_t block_first) {
  const int i = full_index < 0 ? -1 : mp_stage_layout_index_of(ch->layout, full_index);
  if (i < 0) return NULL;
  const size_t offset = mp_stage_layout_tensor(ch->layout, i)->offset;
  if (ch->weights_window == NULL) return at(ch, weights, offset);
  size_t packed = 0;
  if (mp_stage_layout_grad_offset(ch->layout, i, MP_GRAD_WINDOW_BLOCKS, &packed)) {
    return at(ch, weights, packed);
  }
  return at(ch, ch->weights_window, offset - block_first);
}

/* ZeRO-3: block l's weights into the next weights window before a pass over it (with two
 * windows they alternate, so the hook may prefetch block `next`, the pass after this one, -1 for
 * none, into the other while this one runs). */
static mp_status gather_block_weights(mp_stage_chain *ch, int l, int next, mp_error *err) {
  if (ch->weights_window == NULL) return MP_OK;
  if (ch->weights_hook == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the stage's block weights are sharded (ZeRO-3), but no weights hook is set "
                   "to gather them");
  }
  const bool two = ch->weights_windows[1] != NULL;
  const int w = two ? ch->next_weights_window : 0;
  ch->next_weights_window = 1 - w;
  block_tensors *b = &ch->blocks[l];
  ch->weights_window = ch->weights_windows[w];
  memcpy(b->w, b->w_in[w], sizeof b->w);
  mp_stage_weights_next after = {NULL, 0, 0};
  if (two && next >= 0) {
    after.window = ch->weights_windows[1 - w];
    after.first = ch->blocks[next].grad_first;
    after.count = ch->blocks[next].grad_count;
  }
  return ch->weights_hook(ch->weights_hook_context, ch->weights_window, b->grad_first,
                          b->grad_count, after.window != NULL ? &after : NULL, err);
}

/* A tensor's gradient: in grads, packed for the window kind (mp_stage_layout_grad_offset), or for a
 * tensor of the window at its offset in its block (block_first). */
static float *grad_of(const mp_stage_chain *ch, float *grads, int full_index, size_t block_first) {
  const int i = full_index < 0 ? -1 : mp_stage_layout_index_of(ch->layout, full_index);
  if (i < 0) return NULL;
  size_t packed = 0;
  if (mp_stage_layout_grad_offset(ch->layout, i, ch->window_kind, &packed)) return grads + packed;
  return ch->window + (mp_stage_layout_tensor(ch->layout, i)->offset - block_first);
}

/* The slot's router statistics (host doubles), for a mixture of experts. */
static mp_status alloc_stats(const mp_stage_chain *ch, slot_acts *s, mp_error *err) {
  const int E = ch->d.moe.experts;
  memset(&s->stats, 0, sizeof s->stats);
  s->stats_storage = NULL;
  if (E == 0) return MP_OK;
  s->stats_storage = calloc(2 * (size_t)E, sizeof(double));
  if (s->stats_storage == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  s->stats.experts = E;
  s->stats.routed = s->stats_storage;
  s->stats.prob_sum = s->stats_storage + E;
  return MP_OK;
}

static mp_status alloc_slot(mp_stage_chain *ch, slot_acts *s, mp_error *err) {
  const mp_stage_dims *d = &ch->d;
  const size_t BT = (size_t)d->BT, BTl = (size_t)d->BTl, C = (size_t)d->C;
  const size_t QKVl = (size_t)d->QKVl, Cl = (size_t)d->Cl, Fl = (size_t)d->Fl;
  const size_t FCl = (size_t)d->FCl, eb = ch->eb;
  const int L = ch->stage.num_layers;
  s->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *s->acts);
  s->inputs_host = calloc(BT, sizeof(int32_t));
  if (s->acts == NULL || s->inputs_host == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  MP_TRY(alloc_stats(ch, s, err));
  ALLOC(s->inputs, BT, sizeof(int32_t));
  ALLOC(s->targets, BT, sizeof(int32_t));
  ALLOC(s->input, BTl * C, eb);
  const bool share_attention = ch->shared_attention != NULL;
  for (int l = 0; l < L; ++l) {
    block_acts *a = &s->acts[l];
    const size_t ln_rows = ch->regather ? BTl : BT;
    ALLOC(a->ln1, ln_rows * C, eb);
    ALLOC(a->ln1_mean, BTl, sizeof(float));
    ALLOC(a->ln1_rstd, BTl, sizeof(float));
    ALLOC(a->qkv, BT * QKVl, eb);
    ALLOC(a->atty, BT * Cl, eb);
    if (share_attention) {
      a->attention = ch->shared_attention;
    } else {
      ALLOC(a->attention, ch->k->attention_saved_bytes, 1);
    }
    ALLOC(a->residual2, BTl * C, eb);
    ALLOC(a->ln2, ln_rows * C, eb);
    ALLOC(a->ln2_mean, BTl, sizeof(float));
    ALLOC(a->ln2_rstd, BTl, sizeof(float));
    ALLOC(a->fch, BT * FCl, eb);
    ALLOC(a->fch_gelu, BT * Fl, eb);
    ALLOC(a->out, BTl * C, eb);
  }
  if (ch->stage.final_norm) {
    ALLOC(s->lnf, BTl * C, eb);
    ALLOC(s->lnf_mean, BTl, sizeof(float));
    ALLOC(s->lnf_rstd, BTl, sizeof(float));
  }
  if (ch->stage.head) ALLOC(s->logits, BT * (size_t)d->Vl, eb);
  if (ch->stage.head && d->sp && !ch->regather) ALLOC(s->head_input, BT * C, eb);
  if (ch->deferred_weights) {
    s->deferred = calloc((size_t)(L > 0 ? L : 1), sizeof *s->deferred);
    if (s->deferred == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    for (int l = 0; l < L; ++l) {
      block_deferred *q = &s->deferred[l];
      ALLOC(q->dfcproj, BT * C, eb);
      ALLOC(q->dfch, BT * FCl, eb);
      ALLOC(q->dattproj, BT * C, eb);
      ALLOC(q->dqkv, BT * QKVl, eb);
    }
  }
  return MP_OK;
}

/* Full recomputation: a slot owning its tokens and input; the rest points at chain->shared. */
static mp_status alloc_light_slot(mp_stage_chain *ch, slot_acts *s, mp_error *err) {
  const size_t BT = (size_t)ch->d.BT;
  const int L = ch->stage.num_layers;
  *s = ch->shared;
  s->light = true;
  s->deferred = NULL;
  s->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *s->acts);
  s->inputs_host = calloc(BT, sizeof(int32_t));
  if (s->acts == NULL || s->inputs_host == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  if (L > 0) memcpy(s->acts, ch->shared.acts, (size_t)L * sizeof *s->acts);
  MP_TRY(alloc_stats(ch, s, err));
  ALLOC(s->inputs, BT, sizeof(int32_t));
  ALLOC(s->targets, BT, sizeof(int32_t));
  ALLOC(s->input, (size_t)ch->d.BTl * (size_t)ch->d.C, ch->eb);
  return MP_OK;
}

/* Releases what the slot's mixture-of-experts layers keep for their backward. */
static void release_moe(const mp_stage_chain *ch, slot_acts *s) {
  if (ch->k->moe_release == NULL || s->acts == NULL) return;
  for (int l = 0; l < ch->stage.num_layers; ++l) {
    ch->k->moe_release(ch->k->context, s->acts[l].moe_saved);
    s->acts[l].moe_saved = NULL;
  }
}

static void free_slot_arrays(const mp_stage_chain *ch, slot_acts *s) {
  release_moe(ch, s);
  free(s->acts);
  free(s->deferred);
  free(s->inputs_host);
  free(s->stats_storage);
}

void mp_stage_chain_free(mp_stage_chain *ch) {
  if (ch == NULL) return;
  for (int s = 0; ch->slots != NULL && s < ch->num_slots; ++s) {
    free_slot_arrays(ch, &ch->slots[s]);
  }
  free_slot_arrays(ch, &ch->shared);
  for (int i = 0; i < ch->num_owned; ++i) ch->k->release(ch->k->context, ch->owned[i]);
  free(ch->owned);
  free(ch->cp_stats_storage);
  free(ch->slots);
  free(ch->blocks);
  free(ch);
}

static mp_status chain_setup(mp_stage_chain *ch, const mp_stage_chain_config *config,
                             mp_error *err) {
  const mp_param_layout *layout = mp_stage_layout_model(ch->layout);
  const int L = ch->stage.num_layers;
  ch->wte = weight_of(ch, config->weights, mp_param_layout_global_index(layout, MP_GLOBAL_WTE), 0);
  ch->wpe = weight_of(ch, config->weights, mp_param_layout_global_index(layout, MP_GLOBAL_WPE), 0);
  ch->lnfw =
      weight_of(ch, config->weights, mp_param_layout_global_index(layout, MP_GLOBAL_LNF_WEIGHT), 0);
  ch->lnfb =
      weight_of(ch, config->weights, mp_param_layout_global_index(layout, MP_GLOBAL_LNF_BIAS), 0);
  ch->dwte = grad_of(ch, config->grads, mp_param_layout_global_index(layout, MP_GLOBAL_WTE), 0);
  ch->dwpe = grad_of(ch, config->grads, mp_param_layout_global_index(layout, MP_GLOBAL_WPE), 0);
  ch->dlnfw =
      grad_of(ch, config->grads, mp_param_layout_global_index(layout, MP_GLOBAL_LNF_WEIGHT), 0);
  ch->dlnfb =
      grad_of(ch, config->grads, mp_param_layout_global_index(layout, MP_GLOBAL_LNF_BIAS), 0);
  const mp_global_tensor head =
      mp_param_layout_config(layout)->tied_head ? MP_GLOBAL_WTE : MP_GLOBAL_LM_HEAD;
  ch->head_w = weight_of(ch, config->weights, mp_param_layout_global_index(layout, head), 0);
  ch->dhead = grad_of(ch, config->grads, mp_param_layout_global_index(layout, head), 0);
  ch->blocks = calloc((size_t)(L > 0 ? L : 1), sizeof *ch->blocks);
  ch->slots = calloc((size_t)ch->num_slots, sizeof *ch->slots);
  if (ch->blocks == NULL || ch->slots == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  for (int l = 0; l < L; ++l) {
    block_tensors *b = &ch->blocks[l];
    const int layer = ch->stage.first_layer + l;
    const int first_index = mp_param_layout_block_index(layout, layer, MP_BLOCK_LN1_WEIGHT);
    const int last_index = first_index + mp_param_layout_tensors_per_block(layout) - 1;
    const mp_stage_tensor *first =
        mp_stage_layout_tensor(ch->layout, mp_stage_layout_index_of(ch->layout, first_index));
    const mp_stage_tensor *last =
        mp_stage_layout_tensor(ch->layout, mp_stage_layout_index_of(ch->layout, last_index));
    b->grad_first = first->offset;
    b->grad_count = last->offset + last->count - first->offset;
    for (int r = 0; r < MP_BLOCK_TENSORS; ++r) {
      const int index = mp_param_layout_block_index(layout, layer, (mp_block_tensor)r);
      for (int w = 0; w < 2; ++w) {
        ch->window = ch->windows[w] != NULL ? ch->windows[w] : ch->windows[0];
        ch->weights_window =
            ch->weights_windows[w] != NULL ? ch->weights_windows[w] : ch->weights_windows[0];
        b->g_in[w][r] = grad_of(ch, config->grads, index, b->grad_first);
        b->w_in[w][r] = weight_of(ch, config->weights, index, b->grad_first);
      }
      b->g[r] = b->g_in[0][r];
      b->w[r] = b->w_in[0][r];
    }
  }
  ch->window = ch->windows[0];
  ch->weights_window = ch->weights_windows[0];
  const mp_stage_dims *d = &ch->d;
  const size_t BT = (size_t)d->BT, C = (size_t)d->C, eb = ch->eb;
  if (ch->recompute == MP_RECOMPUTE_SELECTIVE && ch->k->attention_recomputable) {
    ALLOC(ch->shared_attention, ch->k->attention_saved_bytes, 1);
  }
  if (ch->recompute == MP_RECOMPUTE_FULL) {
    MP_TRY(alloc_slot(ch, &ch->shared, err));
    for (int s = 0; s < ch->num_slots; ++s) MP_TRY(alloc_light_slot(ch, &ch->slots[s], err));
  } else {
    for (int s = 0; s < ch->num_slots; ++s) MP_TRY(alloc_slot(ch, &ch->slots[s], err));
  }
  ALLOC(ch->projection, BT * C, eb);
  if (d->sp) ALLOC(ch->dout_total, BT * C, eb);
  ALLOC(ch->dresidual, BT * C, eb);
  ALLOC(ch->dnorm, BT * C, eb);
  ALLOC(ch->datty, BT * (size_t)d->Cl, eb);
  ALLOC(ch->dqkv, BT * (size_t)d->QKVl, eb);
  ALLOC(ch->dfch, BT * (size_t)d->FCl, eb);
  ALLOC(ch->dfch_gelu, BT * (size_t)d->Fl, eb);
  if (d->cp > 1 && ch->stage.num_layers > 0) {
    ALLOC(ch->kv_full, ch->k->cp_kv_full_bytes, 1);
    ALLOC(ch->dkv_full, ch->k->cp_kv_full_bytes, 1);
  }
  if (d->moe.experts > 0 && ch->stage.num_layers > 0) ALLOC(ch->moe_out, BT * C, eb);
  if (d->moe.experts > 0 && d->cp > 1) {
    slot_acts scratch;
    MP_TRY(alloc_stats(ch, &scratch, err));
    ch->cp_stats = scratch.stats;
    ch->cp_stats_storage = scratch.stats_storage;
  }
  return MP_OK;
}

mp_status mp_stage_chain_check(int num_slots, bool deferred_weights, mp_recompute recompute,
                               mp_error *err) {
  if (recompute == MP_RECOMPUTE_FULL && deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "full recomputation cannot run a zero-bubble schedule: its weight pass needs "
                   "activations that the recomputation of the next micro-batch overwrites; use "
                   "recompute \"selective\" or \"none\", or another schedule");
  }
  if (num_slots < 1) {
    return mp_fail(err, MP_ERR_INPUT, "a stage needs at least one activation slot; got %d",
                   num_slots);
  }
  return MP_OK;
}

/* The Llama family's kernels are a backend's to supply; a model that needs a missing one is
 * refused before anything is allocated. */
static mp_status check_kernels(const mp_stage_chain *ch, mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  const mp_stage_dims *d = &ch->d;
  const char *missing = NULL;
  if (d->rmsnorm && (k->rmsnorm_forward == NULL || k->rmsnorm_backward == NULL)) {
    missing = "RMSNorm";
  } else if (d->swiglu && (k->swiglu_forward == NULL || k->swiglu_backward == NULL)) {
    missing = "SwiGLU";
  } else if (d->rope && (k->rope_forward == NULL || k->rope_backward == NULL)) {
    missing = "rotary embeddings";
  } else if (d->num_layers > 0 && d->KVHl != d->NHl && !k->grouped_attention) {
    missing = "grouped-query attention (kv_heads < heads)";
  } else if (d->cp > 1 && (k->cp_gather_kv == NULL || k->cp_attention_forward == NULL ||
                           k->cp_attention_backward == NULL || k->cp_reduce_scatter_kv == NULL)) {
    missing = "context-parallel attention (cp > 1)";
  } else if (d->moe.experts > 0 &&
             (k->moe_forward == NULL || k->moe_backward == NULL || k->moe_release == NULL)) {
    missing = "mixture-of-experts";
  }
  if (missing == NULL) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the %s backend has no %s kernel yet; train this model on the CPU "
                 "backend",
                 mp_param_layout_model_source(mp_stage_layout_model(ch->layout)), k->name, missing);
}

mp_status mp_stage_chain_create(const mp_stage_chain_config *config,
                                const mp_stage_kernels *kernels, mp_stage_chain **out,
                                mp_error *err) {
  *out = NULL;
  MP_TRY(mp_stage_chain_check(config->num_slots, config->deferred_weights, config->recompute,
                              err));
  mp_stage_chain *ch = calloc(1, sizeof *ch);
  if (ch == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  ch->k = kernels;
  ch->layout = config->layout;
  ch->stage = *mp_stage_layout_span(config->layout);
  ch->d = mp_stage_chain_dims(config->layout, config->tp, config->cp);
  ch->eb = kernels->element_bytes;
  ch->deferred_weights = config->deferred_weights;
  ch->recompute = config->recompute;
  ch->num_slots = config->num_slots;
  ch->grads = config->grads;
  ch->window = config->block_grads_window;
  ch->windows[0] = config->block_grads_window;
  ch->windows[1] = config->block_grads_window != NULL ? config->block_grads_window_2 : NULL;
  ch->weights_window = config->block_weights_window;
  ch->weights_windows[0] = config->block_weights_window;
  ch->weights_windows[1] =
      config->block_weights_window != NULL ? config->block_weights_window_2 : NULL;
  ch->window_kind = mp_grad_window_for(ch->window != NULL, config->deferred_weights);
  ch->regather = ch->d.sp && !config->deferred_weights;
  mp_status status = check_kernels(ch, err);
  if (status == MP_OK) status = chain_setup(ch, config, err);
  if (status != MP_OK) {
    mp_stage_chain_free(ch);
    return status;
  }
  *out = ch;
  return MP_OK;
}

size_t mp_stage_chain_bytes(const mp_stage_chain *ch) { return ch->bytes; }

mp_recompute mp_stage_chain_recompute(const mp_stage_chain *ch) {
  if (ch->num_slots > 0 && ch->slots[0].light) return MP_RECOMPUTE_FULL;
  if (ch->shared_attention != NULL) return MP_RECOMPUTE_SELECTIVE;
  return MP_RECOMPUTE_NONE;
}

mp_grad_window mp_stage_chain_grad_window(const mp_stage_chain *ch) {
  return ch->window != NULL ? ch->window_kind : MP_GRAD_WINDOW_NONE;
}

bool mp_stage_chain_gathers_weights(const mp_stage_chain *ch) {
  return ch->weights_window != NULL;
}

void mp_stage_chain_set_grads_hook(mp_stage_chain *ch, mp_stage_grads_hook hook, void *context) {
  ch->hook = hook;
  ch->hook_context = context;
}

void mp_stage_chain_set_weights_hook(mp_stage_chain *ch, mp_stage_weights_hook hook,
                                     void *context) {
  ch->weights_hook = hook;
  ch->weights_hook_context = context;
}

void mp_stage_chain_blocks_range(const mp_stage_chain *ch, size_t *first, size_t *end) {
  const int L = ch->stage.num_layers;
  *first = L > 0 ? ch->blocks[0].grad_first : 0;
  *end = L > 0 ? ch->blocks[L - 1].grad_first + ch->blocks[L - 1].grad_count : 0;
}

static mp_status check_slot(const mp_stage_chain *ch, int slot, bool want_in_use, mp_error *err) {
  if (slot < 0 || slot >= ch->num_slots) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d: the stage has %d", slot,
                   ch->num_slots);
  }
  if (ch->slots[slot].in_use != want_in_use) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d is %s", slot,
                   want_in_use ? "empty: no forward ran into it" : "still holding a micro-batch");
  }
  return MP_OK;
}

static mp_status kernels_check(const mp_stage_chain *ch, mp_error *err) {
  return ch->k->check != NULL ? ch->k->check(ch->k->context, err) : MP_OK;
}

/* The model's norm over rows of C: layernorm (mean, rstd, bias) or RMSNorm (rstd only). */
static void norm_forward(const mp_stage_chain *ch, void *out, float *mean, float *rstd,
                         const void *inp, const void *weight, const void *bias, int rows) {
  const mp_stage_kernels *k = ch->k;
  if (ch->d.rmsnorm) {
    k->rmsnorm_forward(k->context, out, rstd, inp, weight, rows, ch->d.C);
  } else {
    k->layernorm_forward(k->context, out, mean, rstd, inp, weight, bias, rows, ch->d.C);
  }
}

static void norm_backward(const mp_stage_chain *ch, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight,
                          const float *mean, const float *rstd, int rows) {
  const mp_stage_kernels *k = ch->k;
  if (ch->d.rmsnorm) {
    k->rmsnorm_backward(k->context, dinp, dweight, dout, inp, weight, rstd, rows, ch->d.C);
  } else {
    k->layernorm_backward(k->context, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows,
                          ch->d.C);
  }
}

/* The attention of a block's kept qkv into atty and its saved attention: over this rank's
 * tokens, or with context parallelism against the cp group's gathered keys and values (left in
 * kv_full for the backward that follows a recomputation). */
static mp_status attention_forward(mp_stage_chain *ch, block_acts *a, mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  if (ch->d.cp <= 1) {
    k->attention_forward(k->context, a->atty, a->attention, a->qkv);
    return MP_OK;
  }
  MP_TRY(k->cp_gather_kv(k->context, ch->kv_full, a->qkv, err));
  return k->cp_attention_forward(k->context, a->atty, a->attention, a->qkv, ch->kv_full, err);
}

/* The attention's backward into dqkv (zeroed): with context parallelism the keys' and values'
 * gradient comes back from every cp rank's queries. kv_full must hold this block's keys and
 * values (gathered at the start of the block's backward). */
static mp_status attention_backward(mp_stage_chain *ch, block_acts *a, void *dqkv,
                                    mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  if (ch->d.cp <= 1) {
    k->attention_backward(cx, dqkv, ch->datty, a->qkv, a->atty, a->attention);
    return MP_OK;
  }
  MP_TRY(k->zero(cx, ch->dkv_full, k->cp_kv_full_bytes, err));
  MP_TRY(k->cp_attention_backward(cx, dqkv, ch->dkv_full, ch->datty, a->qkv, ch->kv_full,
                                  a->atty, a->attention, err));
  return k->cp_reduce_scatter_kv(cx, dqkv, ch->dkv_full, err);
}

/* A mixture-of-experts block's tensors (weights, or gradients: NULL where absent) as
 * layers/moe.h takes them; the CPU's fp32 (the kernels' moe entries say so). */
static mp_moe_params moe_tensors(const void *const *t) {
  mp_moe_params p;
  p.router = (float *)t[MP_BLOCK_ROUTER_WEIGHT];
  p.expert_fc1 = (float *)t[MP_BLOCK_EXPERT_FC1_WEIGHT];
  p.expert_fc2 = (float *)t[MP_BLOCK_EXPERT_FC2_WEIGHT];
  p.shared_fc1 = (float *)t[MP_BLOCK_SHARED_FC1_WEIGHT];
  p.shared_fc2 = (float *)t[MP_BLOCK_SHARED_FC2_WEIGHT];
  p.shared_gate = (float *)t[MP_BLOCK_SHARED_GATE_WEIGHT];
  return p;
}

/* stats: the micro-batch's router statistics this block's MoE MLP adds to (NULL: a
 * recomputation, already counted). */
static mp_status block_forward(mp_stage_chain *ch, int l, block_acts *a, const void *x,
                               mp_moe_stats *stats, mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const mp_stage_dims *d = &ch->d;
  const int BT = d->BT, BTl = d->BTl, C = d->C, Cl = d->Cl, Fl = d->Fl;
  const size_t mine = (size_t)d->row0 * (size_t)C; /* this rank's rows of a (BT, C) input */
  const void *const *w = ch->blocks[l].w;
  /* A layernorm writes this rank's rows of the column-parallel GEMM's input: into the kept
   * slice (regathered), or into its rows of the kept (BT, C) input, gathered in place. */
  void *ln1 = ch->regather ? a->ln1 : at(ch, a->ln1, mine);
  void *ln1_total = ch->regather ? ch->projection : a->ln1;
  norm_forward(ch, ln1, a->ln1_mean, a->ln1_rstd, x, w[MP_BLOCK_LN1_WEIGHT],
               w[MP_BLOCK_LN1_BIAS], BTl);
  if (d->sp) MP_TRY(k->gather_sequence(cx, ln1_total, ln1, err));
  k->matmul_forward(cx, a->qkv, ln1_total, w[MP_BLOCK_QKV_WEIGHT], w[MP_BLOCK_QKV_BIAS], BT, C,
                    d->QKVl);
  if (d->rope) k->rope_forward(cx, a->qkv);
  MP_TRY(attention_forward(ch, a, err));
  MP_TRY(k->row_parallel_linear_forward(cx, ch->projection, a->atty, w[MP_BLOCK_ATTN_PROJ_WEIGHT],
                                        w[MP_BLOCK_ATTN_PROJ_BIAS], Cl, C, err));
  k->residual_forward(cx, a->residual2, x, ch->projection, (size_t)BTl * C);
  void *ln2 = ch->regather ? a->ln2 : at(ch, a->ln2, mine);
  void *ln2_total = ch->regather ? ch->projection : a->ln2;
  norm_forward(ch, ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w[MP_BLOCK_LN2_WEIGHT],
               w[MP_BLOCK_LN2_BIAS], BTl);
  if (d->sp) MP_TRY(k->gather_sequence(cx, ln2_total, ln2, err));
  if (d->moe.experts > 0) {
    /* The experts over every token of the micro-batch (whole on every tp rank: each rank
     * computes the same output), then this rank's rows into the residual. */
    const mp_moe_params params = moe_tensors(w);
    MP_TRY(k->moe_forward(cx, ch->moe_out, &a->moe_saved, ln2_total, &params, stats, err));
    k->residual_forward(cx, a->out, a->residual2, at(ch, ch->moe_out, mine), (size_t)BTl * C);
    return MP_OK;
  }
  k->matmul_forward(cx, a->fch, ln2_total, w[MP_BLOCK_FC_WEIGHT], w[MP_BLOCK_FC_BIAS], BT, C,
                    d->FCl);
  if (d->swiglu) {
    k->swiglu_forward(cx, a->fch_gelu, a->fch, BT, Fl);
  } else {
    k->gelu_forward(cx, a->fch_gelu, a->fch, (size_t)BT * Fl);
  }
  MP_TRY(k->row_parallel_linear_forward(cx, ch->projection, a->fch_gelu,
                                        w[MP_BLOCK_FC_PROJ_WEIGHT], w[MP_BLOCK_FC_PROJ_BIAS], Fl,
                                        C, err));
  k->residual_forward(cx, a->out, a->residual2, ch->projection, (size_t)BTl * C);
  return MP_OK;
}

/* The gradient of a row-parallel GEMM's output (BT, C) into *out: dresidual itself, or with
 * sequence parallelism every rank's slice of it all-gathered (into keep, or dout_total). keep
 * (zero-bubble's B) receives it for the block's W: gathered there, or copied. */
static mp_status row_parallel_output_grad(mp_stage_chain *ch, void *keep, const void **out,
                                          mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  if (ch->d.sp) {
    void *total = keep != NULL ? keep : ch->dout_total;
    MP_TRY(k->gather_sequence(k->context, total, ch->dresidual, err));
    *out = total;
    return MP_OK;
  }
  if (keep != NULL) {
    MP_TRY(k->copy(k->context, keep, ch->dresidual, (size_t)ch->d.BT * ch->d.C * ch->eb, err));
    *out = keep;
    return MP_OK;
  }
  *out = ch->dresidual;
  return MP_OK;
}

/* The (BT, C) input a column-parallel GEMM saw in the forward: the kept one, or its kept slice
 * all-gathered again (regather; into projection, which the backward does not otherwise use). */
static mp_status column_input(mp_stage_chain *ch, const void *kept, const void **out,
                              mp_error *err) {
  *out = kept;
  if (!ch->regather) return MP_OK;
  MP_TRY(ch->k->gather_sequence(ch->k->context, ch->projection, kept, err));
  *out = ch->projection;
  return MP_OK;
}

/* The backward of a block's mixture-of-experts MLP into dnorm (this rank's rows first, as the
 * dense MLP leaves them): every tp rank runs it over all the micro-batch's tokens, so the
 * experts' and router's gradients are already whole and equal on every rank (nothing to sum over
 * tp, with or without sequence parallelism), and so is the input gradient, of which a rank keeps
 * its rows. The auxiliary losses' gradients are weighted by the slot's dloss as the
 * cross-entropy's is; with context parallelism by cp too, since the trainer averages the
 * gradients over the cp ranks while each holds only its tokens' part of the auxiliary losses'
 * (one loss of the whole micro-batch). A deferred backward (zero-bubble's B) runs it whole: W
 * has nothing left of it. The backend's saved state is released after it. */
static mp_status moe_backward(mp_stage_chain *ch, int l, block_acts *a, const slot_acts *s,
                              mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const mp_stage_dims *d = &ch->d;
  const size_t rows = (size_t)d->BTl * (size_t)d->C, mine = (size_t)d->row0 * (size_t)d->C;
  const void *dout = NULL, *ln2_total = NULL;
  MP_TRY(row_parallel_output_grad(ch, NULL, &dout, err));
  MP_TRY(column_input(ch, a->ln2, &ln2_total, err));
  MP_TRY(k->zero(cx, ch->dnorm, (size_t)d->BT * d->C * ch->eb, err));
  const mp_moe_params params = moe_tensors(ch->blocks[l].w);
  mp_moe_params grads = moe_tensors((const void *const *)ch->blocks[l].g);
  const double weight = (double)s->dloss * (d->cp > 1 ? d->cp : 1);
  MP_TRY(k->moe_backward(cx, ch->dnorm, &grads, dout, ln2_total, &params, a->moe_saved,
                         &s->stats, d->moe_aux_loss_coeff * weight, d->moe_z_loss_coeff * weight,
                         err));
  k->moe_release(cx, a->moe_saved);
  a->moe_saved = NULL;
  if (d->sp && mine > 0) {
    MP_TRY(k->copy(cx, ch->dnorm, at(ch, ch->dnorm, mine), rows * ch->eb, err));
  }
  return MP_OK;
}

/* Adds the block's parameter gradients and turns dresidual (the gradient of the block's output)
 * into the gradient of its input inp. With q (zero-bubble's B) the four GEMMs' weight gradients
 * are left out and their output gradients kept in q; everything else runs as in the whole
 * backward, on the same numbers. */
static mp_status block_backward(mp_stage_chain *ch, int l, block_acts *a, const void *inp,
                                block_deferred *q, const slot_acts *s, mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const mp_stage_dims *d = &ch->d;
  const int BT = d->BT, BTl = d->BTl, C = d->C, Cl = d->Cl, Fl = d->Fl;
  const size_t eb = ch->eb;
  const void *const *w = ch->blocks[l].w;
  float *const *g = ch->blocks[l].g;
  const bool defer = q != NULL;
  void *dfch = defer ? q->dfch : ch->dfch;
  void *dqkv = defer ? q->dqkv : ch->dqkv;
  if (ch->shared_attention != NULL) {
    /* Selective recomputation: this layer's attention matrices again (and atty, to the same
     * values) from its kept qkv (gathering the keys and values with context parallelism). */
    MP_TRY(attention_forward(ch, a, err));
  } else if (d->cp > 1) {
    /* The block's keys and values again: the slot keeps this rank's tokens' only. */
    MP_TRY(k->cp_gather_kv(cx, ch->kv_full, a->qkv, err));
  }
  const void *dout = NULL;
  if (d->moe.experts > 0) {
    MP_TRY(moe_backward(ch, l, a, s, err));
  } else {
    /* The MLP branch: fc_proj is row-parallel, fc column-parallel. */
    MP_TRY(row_parallel_output_grad(ch, defer ? q->dfcproj : NULL, &dout, err));
    MP_TRY(k->zero(cx, ch->dfch_gelu, (size_t)BT * Fl * eb, err));
    k->matmul_backward(cx, ch->dfch_gelu, defer ? NULL : g[MP_BLOCK_FC_PROJ_WEIGHT],
                       g[MP_BLOCK_FC_PROJ_BIAS], dout, a->fch_gelu, w[MP_BLOCK_FC_PROJ_WEIGHT], BT,
                       Fl, C);
    MP_TRY(k->zero(cx, dfch, (size_t)BT * d->FCl * eb, err));
    if (d->swiglu) {
      k->swiglu_backward(cx, dfch, a->fch, ch->dfch_gelu, BT, Fl);
    } else {
      k->gelu_backward(cx, dfch, a->fch, ch->dfch_gelu, (size_t)BT * Fl);
    }
    const void *ln2_total = NULL;
    MP_TRY(column_input(ch, a->ln2, &ln2_total, err));
    MP_TRY(k->zero(cx, ch->dnorm, (size_t)BT * C * eb, err));
    k->matmul_backward(cx, ch->dnorm, defer ? NULL : g[MP_BLOCK_FC_WEIGHT], g[MP_BLOCK_FC_BIAS],
                       dfch, ln2_total, w[MP_BLOCK_FC_WEIGHT], BT, C, d->FCl);
    MP_TRY(k->column_parallel_input_grad(cx, ch->dnorm, err));
  }
  norm_backward(ch, ch->dresidual, g[MP_BLOCK_LN2_WEIGHT], g[MP_BLOCK_LN2_BIAS], ch->dnorm,
                a->residual2, w[MP_BLOCK_LN2_WEIGHT], a->ln2_mean, a->ln2_rstd, BTl);
  /* The attention branch. */
  MP_TRY(row_parallel_output_grad(ch, defer ? q->dattproj : NULL, &dout, err));
  MP_TRY(k->zero(cx, ch->datty, (size_t)BT * Cl * eb, err));
  k->matmul_backward(cx, ch->datty, defer ? NULL : g[MP_BLOCK_ATTN_PROJ_WEIGHT],
                     g[MP_BLOCK_ATTN_PROJ_BIAS], dout, a->atty, w[MP_BLOCK_ATTN_PROJ_WEIGHT], BT,
                     Cl, C);
  MP_TRY(k->zero(cx, dqkv, (size_t)BT * d->QKVl * eb, err));
  MP_TRY(attention_backward(ch, a, dqkv, err));
  if (d->rope) k->rope_backward(cx, dqkv);
  const void *ln1_total = NULL;
  MP_TRY(column_input(ch, a->ln1, &ln1_total, err));
  MP_TRY(k->zero(cx, ch->dnorm, (size_t)BT * C * eb, err));
  k->matmul_backward(cx, ch->dnorm, defer ? NULL : g[MP_BLOCK_QKV_WEIGHT], g[MP_BLOCK_QKV_BIAS],
                     dqkv, ln1_total, w[MP_BLOCK_QKV_WEIGHT], BT, C, d->QKVl);
  MP_TRY(k->column_parallel_input_grad(cx, ch->dnorm, err));
  norm_backward(ch, ch->dresidual, g[MP_BLOCK_LN1_WEIGHT], g[MP_BLOCK_LN1_BIAS], ch->dnorm, inp,
                w[MP_BLOCK_LN1_WEIGHT], a->ln1_mean, a->ln1_rstd, BTl);
  return MP_OK;
}

/* Zero-bubble's W of one block: the four GEMM weight gradients, from what its B kept and the
 * forward's activations; no collective (a weight gradient's shard is this rank's own). */
static void block_backward_weights(mp_stage_chain *ch, int l, const block_acts *a,
                                   const block_deferred *q) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const int BT = ch->d.BT, C = ch->d.C, Cl = ch->d.Cl, Fl = ch->d.Fl;
  float *const *g = ch->blocks[l].g;
  if (ch->d.moe.experts == 0) { /* a mixture of experts' ran whole in B */
    k->matmul_backward(cx, NULL, g[MP_BLOCK_FC_PROJ_WEIGHT], NULL, q->dfcproj, a->fch_gelu, NULL,
                       BT, Fl, C);
    k->matmul_backward(cx, NULL, g[MP_BLOCK_FC_WEIGHT], NULL, q->dfch, a->ln2, NULL, BT, C,
                       ch->d.FCl);
  }
  k->matmul_backward(cx, NULL, g[MP_BLOCK_ATTN_PROJ_WEIGHT], NULL, q->dattproj, a->atty, NULL,
                     BT, Cl, C);
  k->matmul_backward(cx, NULL, g[MP_BLOCK_QKV_WEIGHT], NULL, q->dqkv, a->ln1, NULL, BT, C,
                     ch->d.QKVl);
}

/* The last activation of the stage before its final norm or head. */
static const void *before_tail(const mp_stage_chain *ch, const slot_acts *s) {
  const int L = ch->stage.num_layers;
  return L > 0 ? s->acts[L - 1].out : s->input;
}

/* The stage's forward of s. Recomputing (full recomputation, at the backward): the slot already
 * holds its tokens, targets, input and dloss; the embedding is not run again, and neither output
 * nor loss is written. The same kernels and collectives on the same numbers: the activations
 * come back bit for bit, on every rank of the group together. */
static mp_status stage_forward(mp_stage_chain *ch, slot_acts *s, const int32_t *inputs,
                               const int32_t *targets, const float *input, float *output,
                               double *loss, bool recomputing, mp_error *err) {
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const mp_stage_span *st = &ch->stage;
  const mp_stage_dims *d = &ch->d;
  const size_t BT = (size_t)d->BT, local = (size_t)d->BTl * (size_t)d->C;
  if (recomputing) {
    /* s->input holds the embedding's output or the received boundary */
  } else if (st->embedding) {
    memcpy(s->inputs_host, inputs, BT * sizeof(int32_t));
    MP_TRY(k->tokens_in(cx, s->inputs, inputs, BT, err));
    MP_TRY(k->embedding_forward(cx, s->input, s->inputs, s->inputs_host, ch->wte, ch->wpe,
                                ch->projection, err));
  } else {
    k->from_boundary(cx, s->input, input, local);
  }
  /* A mixture of experts: the micro-batch's router statistics start at zero on the first stage,
   * else from the previous stage's (after its activations); this stage's layers add theirs. */
  const bool moe = d->moe.experts > 0;
  if (moe && !recomputing) {
    if (st->embedding) {
      mp_moe_stats_clear(&s->stats);
    } else {
      mp_router_stats_unpack(&s->stats, input + local);
    }
  }
  /* With context parallelism each cp rank routes its own tokens of the sequences: the stage's
   * layers count into cp_stats, summed over the group after them. */
  const bool cp_sum = moe && !recomputing && d->cp > 1;
  mp_moe_stats *layer_stats = recomputing ? NULL : cp_sum ? &ch->cp_stats : &s->stats;
  if (cp_sum) mp_moe_stats_clear(&ch->cp_stats);
  const void *x = s->input;
  for (int l = 0; l < st->num_layers; ++l) {
    MP_TRY(gather_block_weights(ch, l, l + 1 < st->num_layers ? l + 1 : -1, err));
    MP_TRY(block_forward(ch, l, &s->acts[l], x, layer_stats, err));
    x = s->acts[l].out;
  }
  if (cp_sum) {
    MP_TRY(mp_router_stats_sum(&ch->cp_stats, &d->cp_comm, err));
    mp_router_stats_add(&s->stats, &ch->cp_stats);
  }
  if (st->final_norm) {
    norm_forward(ch, s->lnf, s->lnf_mean, s->lnf_rstd, x, ch->lnfw, ch->lnfb, d->BTl);
    x = s->lnf;
  }
  if (!st->head) {
    if (output != NULL) k->to_boundary(cx, output, x, local);
    if (output != NULL && moe) mp_router_stats_pack(&s->stats, output + local);
    return kernels_check(ch, err);
  }
  if (!recomputing) MP_TRY(k->tokens_in(cx, s->targets, targets, BT, err));
  /* The LM head (this rank's vocabulary rows of wte when tied, of lm_head if not): the logits of
   * its vocabulary range for every token (with sequence parallelism its input all-gathered
   * first). */
  if (d->sp) {
    void *total = ch->regather ? ch->projection : s->head_input;
    MP_TRY(k->gather_sequence(cx, total, x, err));
    x = total;
  }
  k->matmul_forward(cx, s->logits, x, ch->head_w, NULL, d->BT, d->C, d->Vl);
  if (ch->logits_capture != NULL && !recomputing) {
    k->to_boundary(cx, ch->logits_capture, s->logits, (size_t)d->BT * (size_t)d->Vl);
  }
  MP_TRY(k->loss(cx, s->logits, s->targets, s->dloss, recomputing ? NULL : loss, err));
  /* The micro-batch's statistics are final here: its auxiliary losses join the loss (their
   * gradients are the MoE backwards'). */
  if (moe && !recomputing && loss != NULL) {
    *loss += mp_router_stats_loss(&s->stats, d->moe_aux_loss_coeff, d->moe_z_loss_coeff);
  }
  return kernels_check(ch, err);
}

mp_status mp_stage_chain_forward(mp_stage_chain *ch, int slot, const int32_t *inputs,
                                 const int32_t *targets, const float *input, float *output,
                                 float dloss, double *loss, mp_error *err) {
  MP_TRY(check_slot(ch, slot, false, err));
  slot_acts *s = &ch->slots[slot];
  s->dloss = dloss;
  MP_TRY(stage_forward(ch, s, inputs, targets, input, output, loss, false, err));
  /* Full recomputation: the MoE layers' saved state comes back with the rerun forward. */
  if (s->light) release_moe(ch, s);
  s->in_use = true;
  return MP_OK;
}

void mp_stage_chain_capture_logits(mp_stage_chain *ch, float *dest) { ch->logits_capture = dest; }

void mp_stage_chain_discard(mp_stage_chain *ch, int slot) {
  if (slot < 0 || slot >= ch->num_slots) return;
  release_moe(ch, &ch->slots[slot]);
  ch->slots[slot].in_use = false;
  ch->slots[slot].weights_pending = false;
}

static mp_status sum_block_norm_grads(mp_stage_chain *ch, int l, mp_error *err);

static bool st_has_blocks(const mp_stage_chain *ch) { return ch->stage.num_layers > 0; }

/* Block b's gradients into the next gradient window (with two, they alternate from block to
 * block, across passes too, so the hook's reader of one overlaps the next block's writes to the
 * other), zeroed. */
static mp_status open_grad_window(mp_stage_chain *ch, block_tensors *b, mp_error *err) {
  const int w = ch->windows[1] != NULL ? ch->next_window : 0;
  ch->next_window = 1 - w;
  ch->window = ch->windows[w];
  memcpy(b->g, b->g_in[w], sizeof b->g);
  return ch->k->zero(ch->k->context, ch->window, b->grad_count * sizeof(float), err);
}

mp_status mp_stage_chain_backward(mp_stage_chain *ch, int slot, const float *doutput,
                                  float *dinput, bool defer_weights, mp_error *err) {
  MP_TRY(check_slot(ch, slot, true, err));
  if (defer_weights && !ch->deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "a deferred backward needs a stage created with deferred weights");
  }
  if (ch->window != NULL && ch->hook == NULL && st_has_blocks(ch)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the stage's block gradients pass through a window (ZeRO-2), but no grads "
                   "hook is set to take them: they would be lost");
  }
  slot_acts *s = &ch->slots[slot];
  if (s->weights_pending) {
    return mp_fail(err, MP_ERR_INPUT,
                   "activation slot %d already ran its backward; its weight gradients (W) are "
                   "pending",
                   slot);
  }
  const mp_stage_kernels *k = ch->k;
  void *cx = k->context;
  const mp_stage_span *st = &ch->stage;
  const mp_stage_dims *d = &ch->d;
  const int BT = d->BT, C = d->C, L = st->num_layers;
  const size_t act_bytes = (size_t)BT * C * ch->eb, local = (size_t)d->BTl * C;
  if (s->light) {
    /* Full recomputation: the forward again into the shared activations (every rank does). */
    MP_TRY(stage_forward(ch, s, NULL, NULL, NULL, NULL, NULL, true, err));
  }
  /* A mixture of experts: every layer's backward needs the micro-batch's final router
   * statistics: the head stage's own, else the next stage's (after its gradient), passed on. */
  const bool moe = d->moe.experts > 0;
  if (moe && !st->head) mp_router_stats_unpack(&s->stats, doutput + local);
  const void *tail_input = before_tail(ch, s);
  /* g: the gradient of the stage's last activation (the final norm's output, or the blocks'). */
  void *g = st->final_norm ? ch->dnorm : ch->dresidual;
  if (st->head) {
    const void *head_input = st->final_norm ? s->lnf : tail_input;
    if (d->sp && ch->regather) MP_TRY(column_input(ch, head_input, &head_input, err));
    if (d->sp && !ch->regather) head_input = s->head_input;
    MP_TRY(k->zero(cx, g, act_bytes, err));
    k->matmul_backward(cx, g, ch->dhead, NULL, s->logits, head_input, ch->head_w, BT, C, d->Vl);
    MP_TRY(k->column_parallel_input_grad(cx, g, err));
  } else {
    k->from_boundary(cx, g, doutput, local);
  }
  if (st->final_norm) {
    MP_TRY(k->zero(cx, ch->dresidual, act_bytes, err));
    norm_backward(ch, ch->dresidual, ch->dlnfw, ch->dlnfb, ch->dnorm, tail_input, ch->lnfw,
                  s->lnf_mean, s->lnf_rstd, d->BTl);
  }
  for (int l = L - 1; l >= 0; --l) {
    const void *inp = l == 0 ? s->input : s->acts[l - 1].out;
    block_tensors *b = &ch->blocks[l];
    /* A deferred backward leaves the window (the GEMM weights') to W. */
    if (ch->window != NULL && !defer_weights) MP_TRY(open_grad_window(ch, b, err));
    MP_TRY(gather_block_weights(ch, l, l - 1, err));
    MP_TRY(block_backward(ch, l, &s->acts[l], inp, defer_weights ? &s->deferred[l] : NULL, s,
                          err));
    if (ch->window_kind == MP_GRAD_WINDOW_BLOCKS && d->sp) {
      MP_TRY(sum_block_norm_grads(ch, l, err));
    }
    if (ch->hook != NULL && !defer_weights) {
      float *grads = ch->window != NULL ? ch->window : ch->grads + b->grad_first;
      MP_TRY(ch->hook(ch->hook_context, grads, b->grad_first, b->grad_count, err));
    }
  }
  /* Zero-bubble: the slot's activations and kept gradients feed its W. */
  s->weights_pending = defer_weights;
  s->in_use = defer_weights;
  if (st->embedding) {
    MP_TRY(k->embedding_backward(cx, ch->dwte, ch->dwpe, ch->dresidual, s->inputs, s->inputs_host,
                                 ch->dnorm, err));
  } else {
    k->to_boundary(cx, dinput, ch->dresidual, local);
    if (moe) mp_router_stats_pack(&s->stats, dinput + local);
  }
  return kernels_check(ch, err);
}

mp_status mp_stage_chain_backward_weights(mp_stage_chain *ch, int slot, mp_error *err) {
  MP_TRY(check_slot(ch, slot, true, err));
  slot_acts *s = &ch->slots[slot];
  if (!s->weights_pending) {
    return mp_fail(err, MP_ERR_INPUT,
                   "activation slot %d has no deferred weight gradients (its backward was whole, "
                   "or has not run)",
                   slot);
  }
  if (ch->window != NULL && ch->hook == NULL && st_has_blocks(ch)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the stage's block weight gradients pass through a window (ZeRO-2), but no "
                   "grads hook is set to take them: they would be lost");
  }
  for (int l = ch->stage.num_layers - 1; l >= 0; --l) {
    block_tensors *b = &ch->blocks[l];
    if (ch->window != NULL) MP_TRY(open_grad_window(ch, b, err));
    block_backward_weights(ch, l, &s->acts[l], &s->deferred[l]);
    if (ch->hook != NULL) {
      float *grads = ch->window != NULL ? ch->window : ch->grads + b->grad_first;
      MP_TRY(ch->hook(ch->hook_context, grads, b->grad_first, b->grad_count, err));
    }
  }
  s->weights_pending = false;
  s->in_use = false;
  return kernels_check(ch, err);
}

/* w (C) and b (C, or NULL: RMSNorm) summed over the group: one collective when b follows w (the
 * layout keeps a layernorm's weight and bias next to each other). */
static mp_status sum_norm_grads(mp_stage_chain *ch, float *w, float *b, mp_error *err) {
  const size_t C = (size_t)ch->d.C;
  if (b == NULL) return mp_tp_all_reduce_sum(&ch->d.tp, w, C, err);
  if (b == w + C) return mp_tp_all_reduce_sum(&ch->d.tp, w, 2 * C, err);
  MP_TRY(mp_tp_all_reduce_sum(&ch->d.tp, w, C, err));
  return mp_tp_all_reduce_sum(&ch->d.tp, b, C, err);
}

static mp_status sum_block_norm_grads(mp_stage_chain *ch, int l, mp_error *err) {
  float *const *g = ch->blocks[l].g;
  MP_TRY(sum_norm_grads(ch, g[MP_BLOCK_LN1_WEIGHT], g[MP_BLOCK_LN1_BIAS], err));
  return sum_norm_grads(ch, g[MP_BLOCK_LN2_WEIGHT], g[MP_BLOCK_LN2_BIAS], err);
}

mp_status mp_stage_chain_finish_grads(mp_stage_chain *ch, mp_error *err) {
  if (!ch->d.sp) return MP_OK;
  /* With a window of whole blocks each block's were summed before its hook took them. */
  for (int l = 0; l < ch->stage.num_layers && ch->window_kind != MP_GRAD_WINDOW_BLOCKS; ++l) {
    MP_TRY(sum_block_norm_grads(ch, l, err));
  }
  if (ch->stage.final_norm) MP_TRY(sum_norm_grads(ch, ch->dlnfw, ch->dlnfb, err));
  return MP_OK;
}

mp_status mp_stage_norm_from_squares(const mp_stage_layout *layout, const mp_tp_comm *tp,
                                     const double *squares, double *out, mp_error *err) {
  double replicated = 0.0, sharded = 0.0;
  for (int i = 0; i < mp_stage_layout_num_tensors(layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(layout, i);
    if (t->tied_copy || t->ep_size > 1) continue; /* experts: the trainer sums them over ep */
    if (t->split == MP_TP_REPLICATED) {
      replicated += squares[i];
    } else {
      sharded += squares[i];
    }
  }
  MP_TRY(mp_tp_sum_double(tp, &sharded, err));
  *out = replicated + sharded;
  return MP_OK;
}
