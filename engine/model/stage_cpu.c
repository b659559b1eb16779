/* engine/model/stage_cpu.c — one rank's shard of the GPT on a tensor-parallel group; see the
 * header. The forward and backward chain the same calls as tests/tensor_parallel's whole-model
 * check. */
#include "engine/model/stage_cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_chain.h"
#include "layers/adamw.h"
#include "layers/gpt_block.h"
#include "tensor_parallel/vocab_parallel_embedding.h"

struct mp_stage_cpu {
  mp_param_layout *layout; /* the one-rank layout */
  mp_stage_span stage;
  mp_tp_comm tp;
  bool sp;
  int B, T;
  int BTl;               /* B*T/tp with sequence parallelism, else B*T */
  int num_tensors;
  mp_stage_tensor *tensors; /* (num_tensors,) the stage's tensors in the layout's order */
  size_t num_params;     /* floats of this rank's shard of the stage */
  float *params;         /* (num_params,), or ZeRO-3 (sharded): the tensors outside the blocks
                            packed (outside_floats), then the held block elements
                            [held_first, held_end) of the flat layout; NULL for a stage without
                            slots, whose parameters are in its store */
  mp_stage_param_store store; /* a stage without slots: where its parameters are (read NULL:
                                  nowhere yet) */
  bool sharded;
  size_t blocks_first, blocks_end, outside_floats, held_first, held_end;
  void *weight_window;   /* ZeRO-3: (the largest block's floats) the chain's weights window */
  float *grads;          /* (grads_floats,): num_params, or windowed the tensors outside the
                            blocks, packed */
  size_t grads_floats;
  mp_grad_window window; /* ZeRO-2: which gradients pass through block_window */
  float *block_window;   /* (the largest block's floats) */
  /* The forward and backward: the stage chain over the CPU's kernels (NULL for a stage without
   * slots). */
  mp_stage_kernels *kernels;
  mp_stage_chain *chain;
};

mp_stage_span mp_stage_span_whole(int num_layers) {
  const mp_stage_span stage = {true, 0, num_layers, true, true};
  return stage;
}

mp_status mp_stage_span_of_chain(int num_layers, int first, int end, mp_stage_span *out,
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

void mp_stage_cpu_free(mp_stage_cpu *gpt) {
  if (gpt == NULL) return;
  mp_stage_chain_free(gpt->chain);
  mp_stage_kernels_cpu_free(gpt->kernels);
  free(gpt->grads);
  free(gpt->block_window);
  free(gpt->weight_window);
  free(gpt->params);
  free(gpt->tensors);
  mp_param_layout_free(gpt->layout);
  free(gpt);
}

/* True when the stage holds the layout's tensor full_index (wte, wpe, blocks..., lnfw, lnfb). */
/* The block's shapes over tp ranks: heads, MLP channels and, with sequence parallelism, the
 * micro-batch's tokens must divide. */
static mp_status check_split(const mp_gpt_block_shape *s, int kv_heads, int tp,
                             bool sequence_parallel, mp_error *err) {
  MP_TRY(mp_gpt_block_shape_check(s, err));
  if (s->NH % tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "tensor parallelism splits heads: %d heads do not divide over tp = %d; choose "
                   "a tp that divides the heads",
                   s->NH, tp);
  }
  if (kv_heads % tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "tensor parallelism splits the key/value heads (as Megatron-Core does): "
                   "kv_heads %d do not divide over tp = %d; choose a tp that divides kv_heads",
                   kv_heads, tp);
  }
  if (s->F % tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "tensor parallelism splits the MLP: ffn_hidden %d is not a multiple of tp = %d",
                   s->F, tp);
  }
  if (sequence_parallel && ((size_t)s->B * s->T) % (size_t)tp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "sequence parallelism splits the B*T = %d tokens of a micro-batch over tp = "
                   "%d ranks; choose a micro-batch size or sequence length that makes B*T a "
                   "multiple of tp",
                   s->B * s->T, tp);
  }
  return MP_OK;
}

static bool stage_holds(const mp_param_layout *layout, const mp_stage_span *st, int full_index) {
  if (full_index == mp_param_layout_global_index(layout, MP_GLOBAL_WTE)) {
    return st->embedding || (st->head && mp_param_layout_config(layout)->tied_head);
  }
  if (full_index == mp_param_layout_global_index(layout, MP_GLOBAL_LM_HEAD)) return st->head;
  if (full_index == mp_param_layout_global_index(layout, MP_GLOBAL_WPE)) return st->embedding;
  const int layer = mp_param_layout_layer_of(layout, full_index);
  if (layer < 0) return st->final_norm;
  return layer >= st->first_layer && layer < st->first_layer + st->num_layers;
}

mp_status mp_stage_cpu_create(const mp_model *model, int micro_batch, int seq_len,
                           const mp_tp_comm *tp, bool sequence_parallel, mp_stage_cpu **out,
                           mp_error *err) {
  *out = NULL;
  mp_param_layout *layout = NULL;
  MP_TRY(mp_param_layout_create(model, seq_len, &layout, err));
  const mp_stage_span whole = mp_stage_span_whole(mp_param_layout_config(layout)->num_layers);
  mp_param_layout_free(layout);
  return mp_stage_cpu_create_stage(model, micro_batch, seq_len, tp, sequence_parallel, &whole, 1,
                                false, MP_RECOMPUTE_NONE, NULL, out, err);
}

void mp_zero_part(size_t n, int size, int rank, size_t *first, size_t *count) {
  const size_t part = size > 0 ? (n + (size_t)size - 1) / (size_t)size : n;
  *first = part * (size_t)rank < n ? part * (size_t)rank : n;
  *count = *first + part < n ? part : n - *first;
}

mp_status mp_stage_cpu_create_stage(const mp_model *model, int micro_batch, int seq_len,
                                 const mp_tp_comm *tp, bool sequence_parallel,
                                 const mp_stage_span *stage, int num_slots, bool deferred_weights,
                                 mp_recompute recompute, const mp_stage_zero *zero,
                                 mp_stage_cpu **out, mp_error *err) {
  *out = NULL;
  const bool windowed_block_grads = zero != NULL && zero->window_block_grads;
  const bool shard_params = zero != NULL && zero->shard_block_params;
  if (windowed_block_grads && num_slots == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "windowed block gradients (ZeRO-2) need a stage with activation slots, not a "
                   "stage without slots");
  }
  /* A stage without slots (a GPU stage's host side) runs no chain. */
  if (shard_params && num_slots > 0 && (!windowed_block_grads || deferred_weights)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "sharded block parameters (ZeRO-3) need windowed block gradients and whole "
                   "backwards (not a zero-bubble schedule's deferred weight gradients)");
  }
  /* A stage without slots runs no chain; one with slots must be one it can run. */
  if (num_slots > 0 && mp_stage_chain_check(num_slots, deferred_weights, recompute, err) != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, MP_ERR_INPUT, "%s: %s", mp_model_source(model), inner.message);
  }
  if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d of %d: not a rank of the group",
                   tp->rank, tp->size);
  }
  if (num_slots < 0) {
    return mp_fail(err, MP_ERR_INPUT, "a stage needs zero or more activation slots; got %d",
                   num_slots);
  }
  mp_stage_cpu *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  mp_status status = mp_param_layout_create(model, seq_len, &gpt->layout, err);
  if (status != MP_OK) {
    mp_stage_cpu_free(gpt);
    return status;
  }
  const mp_model_config *c = mp_param_layout_config(gpt->layout);
  if (stage->first_layer < 0 || stage->num_layers < 0 ||
      stage->first_layer + stage->num_layers > c->num_layers) {
    mp_stage_cpu_free(gpt);
    return mp_fail(err, MP_ERR_INPUT, "%s: blocks [%d, %d) are not blocks of the model (%d)",
                   mp_model_source(model), stage->first_layer,
                   stage->first_layer + stage->num_layers, c->num_layers);
  }
  gpt->stage = *stage;
  gpt->tp = *tp;
  gpt->sp = sequence_parallel;
  gpt->B = micro_batch;
  gpt->T = seq_len;
  const mp_gpt_block_shape shape = {micro_batch, seq_len, c->channels, c->num_heads,
                                    c->ffn_channels};
  if ((status = check_split(&shape, c->num_kv_heads, tp->size, sequence_parallel, err)) != MP_OK ||
      (status = mp_tp_vocab_check(c->padded_vocab_size, tp->size, err)) != MP_OK) {
    mp_error inner = *err;
    mp_fail(err, status, "%s with tp = %d%s: %s", mp_model_source(model), tp->size,
            sequence_parallel ? " and sequence parallelism" : "", inner.message);
    mp_stage_cpu_free(gpt);
    return status;
  }
  gpt->BTl = sequence_parallel ? micro_batch * seq_len / tp->size : micro_batch * seq_len;

  /* The shard's tensor table: the stage's tensors, in the layout's order. */
  const int all = mp_param_layout_num_tensors(gpt->layout);
  gpt->tensors = calloc((size_t)all, sizeof *gpt->tensors);
  if (gpt->tensors == NULL) {
    mp_stage_cpu_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  size_t offset = 0;
  for (int i = 0; i < all; ++i) {
    if (!stage_holds(gpt->layout, stage, i)) continue;
    mp_stage_tensor *t = &gpt->tensors[gpt->num_tensors++];
    t->full = mp_param_layout_tensor(gpt->layout, i);
    t->tied_copy =
        i == mp_param_layout_global_index(gpt->layout, MP_GLOBAL_WTE) && !stage->embedding;
    t->split = t->full->split;
    t->offset = offset;
    t->count = mp_tp_shard_floats(t->split, t->full->rows, t->full->cols, tp->size);
    offset += t->count;
  }
  gpt->num_params = offset;
  size_t blocks_first = 0, blocks_end = 0, largest_block = 0;
  mp_stage_cpu_blocks_range(gpt, &blocks_first, &blocks_end, &largest_block);
  gpt->blocks_first = blocks_first;
  gpt->blocks_end = blocks_end;
  gpt->outside_floats = gpt->num_params - (blocks_end - blocks_first);
  gpt->sharded = shard_params;
  size_t param_floats = gpt->num_params;
  if (shard_params) {
    size_t part_first = 0, part_count = 0;
    mp_zero_part(gpt->num_params, zero->dp_size, zero->dp_rank, &part_first, &part_count);
    gpt->held_first = part_first > blocks_first ? part_first : blocks_first;
    gpt->held_end = part_first + part_count < blocks_end ? part_first + part_count : blocks_end;
    if (gpt->held_end < gpt->held_first) gpt->held_end = gpt->held_first;
    param_floats = gpt->outside_floats + (gpt->held_end - gpt->held_first);
    if (num_slots > 0) {
      gpt->weight_window = calloc(largest_block > 0 ? largest_block : 1, sizeof(float));
    }
  }
  /* A stage without slots keeps no host copy: its parameters live in its store (a GPU twin). */
  if (num_slots > 0) gpt->params = calloc(param_floats > 0 ? param_floats : 1, sizeof(float));
  gpt->window = mp_grad_window_for(windowed_block_grads, deferred_weights);
  gpt->grads_floats = mp_stage_cpu_grad_array_floats(gpt, gpt->window);
  const bool windowed = gpt->window != MP_GRAD_WINDOW_NONE;
  /* Without slots the stage only holds arrays, and its gradients live elsewhere (the GPU). */
  if (num_slots > 0)
    gpt->grads = calloc(gpt->grads_floats > 0 ? gpt->grads_floats : 1, sizeof(float));
  if (windowed) gpt->block_window = calloc(largest_block > 0 ? largest_block : 1, sizeof(float));
  if ((num_slots > 0 && (gpt->params == NULL || gpt->grads == NULL)) ||
      (windowed && gpt->block_window == NULL) ||
      (shard_params && num_slots > 0 && gpt->weight_window == NULL)) {
    const size_t n = gpt->num_params;
    mp_stage_cpu_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a shard of %zu parameters", n);
  }
  /* Without slots the stage holds no chain (a GPU stage's host side). */
  if (num_slots > 0) {
    const mp_stage_dims dims = mp_stage_chain_dims(gpt, &gpt->tp);
    /* One gradient window: a CPU rank's reduce-scatter runs on the cores that compute. */
    const mp_stage_chain_config config = {.host = gpt,
                                          .tp = &gpt->tp,
                                          .weights = gpt->params,
                                          .grads = gpt->grads,
                                          .num_slots = num_slots,
                                          .deferred_weights = deferred_weights,
                                          .recompute = recompute,
                                          .block_grads_window = gpt->block_window,
                                          .block_weights_window = gpt->weight_window};
    if ((status = mp_stage_kernels_cpu_create(&dims, &gpt->kernels, err)) != MP_OK ||
        (status = mp_stage_chain_create(&config, gpt->kernels, &gpt->chain, err)) != MP_OK) {
      mp_stage_cpu_free(gpt);
      return status;
    }
  }
  *out = gpt;
  return MP_OK;
}

const mp_stage_span *mp_stage_cpu_span(const mp_stage_cpu *gpt) { return &gpt->stage; }

void mp_stage_cpu_micro_batch(const mp_stage_cpu *gpt, int *micro_batch, int *seq_len) {
  *micro_batch = gpt->B;
  *seq_len = gpt->T;
}

size_t mp_stage_cpu_boundary_floats(const mp_stage_cpu *gpt) {
  return (size_t)gpt->BTl * (size_t)mp_param_layout_config(gpt->layout)->channels;
}

const mp_param_layout *mp_stage_cpu_layout(const mp_stage_cpu *gpt) { return gpt->layout; }
const mp_tp_comm *mp_stage_cpu_comm(const mp_stage_cpu *gpt) { return &gpt->tp; }
bool mp_stage_cpu_sequence_parallel(const mp_stage_cpu *gpt) { return gpt->sp; }
size_t mp_stage_cpu_num_params(const mp_stage_cpu *gpt) { return gpt->num_params; }
float *mp_stage_cpu_params(mp_stage_cpu *gpt) { return gpt->params; }
size_t mp_stage_cpu_params_floats(const mp_stage_cpu *gpt) {
  return gpt->sharded ? gpt->outside_floats + (gpt->held_end - gpt->held_first) : gpt->num_params;
}
float *mp_stage_cpu_grads(mp_stage_cpu *gpt) { return gpt->grads; }
bool mp_stage_cpu_sharded_params(const mp_stage_cpu *gpt) { return gpt->sharded; }

/* The stretch of the stored parameters holding flat element `flat`: its first flat element, its
 * end, and where the first is stored (an index of the stored array, the host's or the store's);
 * false when the stage does not hold the element. */
static bool param_stretch(const mp_stage_cpu *gpt, size_t flat, size_t *first, size_t *end,
                          size_t *stored) {
  if (!gpt->sharded) {
    if (flat >= gpt->num_params) return false;
    *first = 0, *end = gpt->num_params, *stored = 0;
    return true;
  }
  if (flat < gpt->blocks_first) {
    *first = 0, *end = gpt->blocks_first, *stored = 0;
  } else if (flat >= gpt->blocks_end) {
    *first = gpt->blocks_end, *end = gpt->num_params, *stored = gpt->blocks_first;
  } else if (flat >= gpt->held_first && flat < gpt->held_end) {
    *first = gpt->held_first, *end = gpt->held_end, *stored = gpt->outside_floats;
  } else {
    return false;
  }
  return flat < gpt->num_params;
}

bool mp_stage_cpu_params_index(const mp_stage_cpu *gpt, size_t first, size_t count, size_t *at) {
  size_t lo = 0, hi = 0, stored = 0;
  if (!param_stretch(gpt, first, &lo, &hi, &stored) || first + count > hi) return false;
  *at = stored + (first - lo);
  return true;
}

float *mp_stage_cpu_params_at(mp_stage_cpu *gpt, size_t first, size_t count) {
  size_t at = 0;
  if (gpt->params == NULL || !mp_stage_cpu_params_index(gpt, first, count, &at)) return NULL;
  return gpt->params + at;
}

void mp_stage_cpu_held_params(const mp_stage_cpu *gpt, int index, size_t *first, size_t *count) {
  const mp_stage_tensor *t = &gpt->tensors[index];
  size_t lo = t->offset, hi = t->offset + t->count;
  const bool block = t->offset >= gpt->blocks_first && t->offset < gpt->blocks_end;
  if (gpt->sharded && block) {
    lo = lo > gpt->held_first ? lo : gpt->held_first;
    hi = hi < gpt->held_end ? hi : gpt->held_end;
  }
  *first = 0, *count = 0;
  if (lo >= hi) return;
  *first = lo - t->offset;
  *count = hi - lo;
}

mp_status mp_stage_cpu_set_param_store(mp_stage_cpu *gpt, const mp_stage_param_store *store,
                                    mp_error *err) {
  if (gpt->chain != NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "a stage with activation slots keeps its parameters in host memory, where its "
                   "chain reads them: it takes no parameter store");
  }
  memset(&gpt->store, 0, sizeof gpt->store);
  if (store != NULL) gpt->store = *store;
  return MP_OK;
}

static mp_status need_storage(const mp_stage_cpu *gpt, mp_error *err) {
  if (gpt->params != NULL || gpt->store.read != NULL) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "the stage keeps no parameters: a stage without activation slots holds them in "
                 "its GPU twin (mp_stage_gpu_create), and none was made");
}

/* Moves flat elements [first, first + count) between host memory (dest or src) and where the
 * stage keeps them, stretch by stretch. */
static mp_status move_params(mp_stage_cpu *gpt, size_t first, size_t count, float *dest,
                             const float *src, mp_error *err) {
  MP_TRY(need_storage(gpt, err));
  size_t at = first;
  while (at < first + count) {
    size_t lo = 0, hi = 0, stored = 0;
    if (!param_stretch(gpt, at, &lo, &hi, &stored)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "parameter %zu of the stage is another dp rank's (ZeRO-3 holds elements "
                     "[%zu, %zu) of the blocks here)",
                     at, gpt->held_first, gpt->held_end);
    }
    const size_t n = hi < first + count ? hi - at : first + count - at;
    const size_t where = stored + (at - lo);
    if (gpt->params != NULL) {
      if (dest != NULL) memcpy(dest + (at - first), gpt->params + where, n * sizeof(float));
      if (src != NULL) memcpy(gpt->params + where, src + (at - first), n * sizeof(float));
    } else if (dest != NULL) {
      MP_TRY(gpt->store.read(gpt->store.context, where, n, dest + (at - first), err));
    } else {
      MP_TRY(gpt->store.write(gpt->store.context, where, n, src + (at - first), err));
    }
    at += n;
  }
  return MP_OK;
}

mp_status mp_stage_cpu_read_params(mp_stage_cpu *gpt, size_t first, size_t count, float *dest,
                                mp_error *err) {
  return move_params(gpt, first, count, dest, NULL, err);
}

mp_status mp_stage_cpu_write_params(mp_stage_cpu *gpt, size_t first, size_t count, const float *src,
                                 mp_error *err) {
  return move_params(gpt, first, count, NULL, src, err);
}
mp_grad_window mp_stage_cpu_grad_window(const mp_stage_cpu *gpt) { return gpt->window; }

mp_grad_window mp_grad_window_for(bool windowed_block_grads, bool deferred_weights) {
  if (!windowed_block_grads) return MP_GRAD_WINDOW_NONE;
  return deferred_weights ? MP_GRAD_WINDOW_BLOCK_WEIGHTS : MP_GRAD_WINDOW_BLOCKS;
}

bool mp_stage_cpu_grad_in_window(const mp_stage_cpu *gpt, int index, mp_grad_window window) {
  const int L = gpt->stage.num_layers;
  if (window == MP_GRAD_WINDOW_NONE || L == 0) return false;
  const int per_block = mp_param_layout_tensors_per_block(gpt->layout);
  const int lo =
      mp_param_layout_block_index(gpt->layout, gpt->stage.first_layer, MP_BLOCK_LN1_WEIGHT);
  const int full = (int)(gpt->tensors[index].full - mp_param_layout_tensor(gpt->layout, 0));
  if (full < lo || full >= lo + L * per_block) return false;
  if (window == MP_GRAD_WINDOW_BLOCKS) return true;
  /* The GEMM weights W forms (stage_chain.c's block_backward_weights). */
  static const mp_block_tensor kWeights[] = {
      MP_BLOCK_QKV_WEIGHT, MP_BLOCK_K_WEIGHT,  MP_BLOCK_V_WEIGHT,      MP_BLOCK_ATTN_PROJ_WEIGHT,
      MP_BLOCK_FC_WEIGHT,  MP_BLOCK_UP_WEIGHT, MP_BLOCK_FC_PROJ_WEIGHT};
  const int layer = gpt->stage.first_layer + (full - lo) / per_block;
  for (size_t r = 0; r < sizeof kWeights / sizeof kWeights[0]; ++r) {
    if (mp_param_layout_block_index(gpt->layout, layer, kWeights[r]) == full) return true;
  }
  return false;
}

size_t mp_stage_cpu_grad_array_floats(const mp_stage_cpu *gpt, mp_grad_window window) {
  size_t floats = 0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    if (!mp_stage_cpu_grad_in_window(gpt, i, window)) floats += gpt->tensors[i].count;
  }
  return floats;
}
size_t mp_stage_cpu_grads_floats(const mp_stage_cpu *gpt) {
  return gpt->grads != NULL ? gpt->grads_floats : 0;
}

void mp_stage_cpu_blocks_range(const mp_stage_cpu *gpt, size_t *first, size_t *end,
                               size_t *largest) {
  *first = *end = *largest = 0;
  const int L = gpt->stage.num_layers;
  if (L == 0) return;
  const int per_block = mp_param_layout_tensors_per_block(gpt->layout);
  const int lo =
      mp_param_layout_block_index(gpt->layout, gpt->stage.first_layer, MP_BLOCK_LN1_WEIGHT);
  const mp_param_tensor *base = mp_param_layout_tensor(gpt->layout, 0);
  bool found = false;
  size_t block_floats = 0;
  int block = -1;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_stage_tensor *t = &gpt->tensors[i];
    const int full = (int)(t->full - base);
    if (full < lo || full >= lo + L * per_block) continue;
    if (!found) *first = t->offset;
    found = true;
    *end = t->offset + t->count;
    if ((full - lo) / per_block != block) {
      block = (full - lo) / per_block;
      block_floats = 0;
    }
    block_floats += t->count;
    if (block_floats > *largest) *largest = block_floats;
  }
}

bool mp_stage_cpu_grad_offset(const mp_stage_cpu *gpt, int index, mp_grad_window window,
                           size_t *offset) {
  if (index < 0 || index >= gpt->num_tensors || mp_stage_cpu_grad_in_window(gpt, index, window)) {
    return false;
  }
  size_t packed = 0;
  for (int i = 0; i < index; ++i) {
    if (!mp_stage_cpu_grad_in_window(gpt, i, window)) packed += gpt->tensors[i].count;
  }
  *offset = packed;
  return true;
}

float *mp_stage_cpu_tensor_grad(mp_stage_cpu *gpt, int index) {
  size_t offset = 0;
  if (gpt->grads == NULL || !mp_stage_cpu_grad_offset(gpt, index, gpt->window, &offset)) {
    return NULL;
  }
  return gpt->grads + offset;
}

mp_status mp_stage_cpu_alloc_grads(mp_stage_cpu *gpt, mp_error *err) {
  if (gpt->grads != NULL) return MP_OK;
  gpt->grads = calloc(gpt->num_params > 0 ? gpt->num_params : 1, sizeof(float));
  if (gpt->grads == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the host gradients of %zu parameters",
                   gpt->num_params);
  }
  return MP_OK;
}
int mp_stage_cpu_num_tensors(const mp_stage_cpu *gpt) { return gpt->num_tensors; }
const mp_stage_tensor *mp_stage_cpu_tensor_at(const mp_stage_cpu *gpt, int index) {
  return &gpt->tensors[index];
}

/* A rectangle of a full tensor that fills dest (rows x cols, row-major). */
typedef struct {
  size_t row_offset, rows, col_offset, cols;
  float *dest;
} held_rect;

/* A stage whose parameters live in its store fills them through a host buffer of this many
 * floats (1 MiB), rectangle piece by piece. */
enum { STORE_PIECE_FLOATS = 1 << 18 };

/* Calls visit for the rectangles of each of this rank's shards that it holds, in tensor order:
 * initialisation and loading both fill a shard block by block, so no rank ever holds a full
 * tensor, and a source whose file is laid out otherwise (GPT-2's transposed weights) still reads
 * whole rows. With ZeRO-3 a block tensor's held elements are a range of the shard: each shard
 * block's part of it is a partial row, whole rows and a partial row. With a store (no host
 * array) each rectangle is at most STORE_PIECE_FLOATS, filled in a buffer and then written to
 * the store, so that no host array of the shard exists. */
typedef mp_status (*held_rect_visit)(mp_stage_cpu *gpt, const mp_stage_tensor *t,
                                     const held_rect *rect, void *context, mp_error *err);

static mp_status visit_held_rects(mp_stage_cpu *gpt, held_rect_visit visit, void *context,
                                  float *piece, mp_error *err) {
  const size_t cap = piece != NULL ? STORE_PIECE_FLOATS : SIZE_MAX;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_stage_tensor *t = &gpt->tensors[i];
    size_t held_first = 0, held_count = 0;
    mp_stage_cpu_held_params(gpt, i, &held_first, &held_count);
    if (held_count == 0) continue;
    mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
    int count = 0;
    MP_TRY(mp_tp_shard_blocks(t->split, t->full->rows, t->full->cols, gpt->tp.rank, gpt->tp.size,
                              blocks, &count, err));
    for (int k = 0; k < count; ++k) {
      const mp_tp_shard_block *b = &blocks[k];
      const size_t lo = b->shard_offset > held_first ? b->shard_offset : held_first;
      const size_t block_end = b->shard_offset + b->rows * b->cols;
      const size_t hi = block_end < held_first + held_count ? block_end : held_first + held_count;
      if (lo >= hi || b->cols == 0) continue;
      /* [a, e): the held elements of the block, row-major in it */
      size_t a = lo - b->shard_offset;
      const size_t e = hi - b->shard_offset;
      while (a < e) {
        const size_t row = a / b->cols, col = a % b->cols;
        size_t rows = 1, cols = b->cols - col;
        if (e - a < cols) {
          cols = e - a;
        } else if (col == 0) {
          rows = (e - a) / b->cols;
        }
        if (cols > cap) {
          cols = cap, rows = 1;
        } else if (rows * cols > cap) {
          rows = cap / cols;
        }
        const size_t flat = t->offset + b->shard_offset + a;
        held_rect rect = {b->row_offset + row, rows, b->col_offset + col, cols, piece};
        if (piece == NULL) rect.dest = mp_stage_cpu_params_at(gpt, flat, rows * cols);
        MP_TRY(visit(gpt, t, &rect, context, err));
        if (piece != NULL) MP_TRY(mp_stage_cpu_write_params(gpt, flat, rows * cols, piece, err));
        a += rows * cols;
      }
    }
  }
  return MP_OK;
}

static mp_status for_each_held_rect(mp_stage_cpu *gpt, held_rect_visit visit, void *context,
                                    mp_error *err) {
  if (gpt->params != NULL) return visit_held_rects(gpt, visit, context, NULL, err);
  MP_TRY(need_storage(gpt, err));
  float *piece = malloc(STORE_PIECE_FLOATS * sizeof(float));
  if (piece == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a parameter piece");
  const mp_status status = visit_held_rects(gpt, visit, context, piece, err);
  free(piece);
  return status;
}

static mp_status init_block(mp_stage_cpu *gpt, const mp_stage_tensor *t, const held_rect *r,
                            void *context, mp_error *err) {
  (void)err;
  mp_param_tensor_init_block(gpt->layout, t->full, r->dest, r->rows, r->cols, r->row_offset,
                           r->col_offset, *(const uint64_t *)context);
  return MP_OK;
}

mp_status mp_stage_cpu_init_params(mp_stage_cpu *gpt, uint64_t seed, mp_error *err) {
  return for_each_held_rect(gpt, init_block, &seed, err);
}

typedef struct {
  mp_stage_fill_fn fill;
  void *context;
} fill_call;

static mp_status fill_block(mp_stage_cpu *gpt, const mp_stage_tensor *t, const held_rect *r,
                            void *context, mp_error *err) {
  const fill_call *call = context;
  const mp_param_tensor *first = mp_param_layout_tensor(gpt->layout, 0);
  return call->fill(call->context, (int)(t->full - first), r->row_offset, r->rows, r->col_offset,
                    r->cols, r->dest, err);
}

mp_status mp_stage_cpu_fill_params(mp_stage_cpu *gpt, mp_stage_fill_fn fill, void *context,
                                mp_error *err) {
  fill_call call = {fill, context};
  return for_each_held_rect(gpt, fill_block, &call, err);
}

/* full (one-rank layout) = every rank's shard of `shard` put back, on every rank. */
static mp_status gather_all(mp_stage_cpu *gpt, const float *shard, float *full, mp_error *err) {
  const size_t P = (size_t)gpt->tp.size;
  size_t largest = 0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    if (gpt->tensors[i].count > largest) largest = gpt->tensors[i].count;
  }
  float *gathered = malloc((largest * P > 0 ? largest * P : 1) * sizeof(float));
  if (gathered == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory gathering parameters");
  mp_status status = MP_OK;
  for (int i = 0; i < gpt->num_tensors && status == MP_OK; ++i) {
    const mp_stage_tensor *t = &gpt->tensors[i];
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

mp_status mp_stage_cpu_gather_params(mp_stage_cpu *gpt, float *full, mp_error *err) {
  if (gpt->sharded) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gathering the parameters: the stage's block parameters are sharded over dp "
                   "(ZeRO-3)");
  }
  if (gpt->params == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gathering the parameters: the stage keeps them in its store, not in host "
                   "memory");
  }
  return gather_all(gpt, gpt->params, full, err);
}

static mp_status refuse_windowed(const mp_stage_cpu *gpt, const char *what, mp_error *err) {
  if (gpt->window == MP_GRAD_WINDOW_NONE) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the stage's block gradients are windowed (ZeRO-2): each dp rank keeps its "
                 "part, the trainer's",
                 what);
}

mp_status mp_stage_cpu_gather_grads(mp_stage_cpu *gpt, float *full, mp_error *err) {
  MP_TRY(refuse_windowed(gpt, "gathering the gradients", err));
  MP_TRY(mp_stage_cpu_alloc_grads(gpt, err));
  return gather_all(gpt, gpt->grads, full, err);
}

void mp_stage_cpu_zero_grads(mp_stage_cpu *gpt) {
  if (gpt->grads != NULL) memset(gpt->grads, 0, gpt->grads_floats * sizeof(float));
}

static mp_status need_chain(const mp_stage_cpu *gpt, mp_error *err) {
  if (gpt->chain != NULL) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT, "a stage without activation slots runs no forward "
                                    "or backward");
}

mp_stage_chain *mp_stage_cpu_chain(mp_stage_cpu *gpt) { return gpt->chain; }

mp_status mp_stage_cpu_forward_stage(mp_stage_cpu *gpt, int slot, const int32_t *inputs,
                                  const int32_t *targets, const float *input, float *output,
                                  float dloss, double *loss, mp_error *err) {
  MP_TRY(need_chain(gpt, err));
  return mp_stage_chain_forward(gpt->chain, slot, inputs, targets, input, output, dloss, loss,
                                err);
}

mp_status mp_stage_cpu_backward_stage(mp_stage_cpu *gpt, int slot, const float *doutput,
                                      float *dinput, bool defer_weights, mp_error *err) {
  MP_TRY(need_chain(gpt, err));
  return mp_stage_chain_backward(gpt->chain, slot, doutput, dinput, defer_weights, err);
}

mp_status mp_stage_cpu_forward(mp_stage_cpu *gpt, const int32_t *inputs, const int32_t *targets,
                            float dloss, double *loss, mp_error *err) {
  MP_TRY(need_chain(gpt, err));
  mp_stage_chain_discard(gpt->chain, 0); /* an evaluation's forward starts over */
  return mp_stage_cpu_forward_stage(gpt, 0, inputs, targets, NULL, NULL, dloss, loss, err);
}

mp_status mp_stage_cpu_backward(mp_stage_cpu *gpt, mp_error *err) {
  return mp_stage_cpu_backward_stage(gpt, 0, NULL, NULL, false, err);
}

mp_status mp_stage_cpu_finish_grads(mp_stage_cpu *gpt, mp_error *err) {
  MP_TRY(need_chain(gpt, err));
  return mp_stage_chain_finish_grads(gpt->chain, err);
}

mp_status mp_stage_cpu_norm_from_squares(const mp_stage_cpu *gpt, const double *squares,
                                         double *out, mp_error *err) {
  double replicated = 0.0, sharded = 0.0;
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_stage_tensor *t = &gpt->tensors[i];
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

mp_status mp_stage_cpu_grad_norm_squared(mp_stage_cpu *gpt, double *out, mp_error *err) {
  MP_TRY(refuse_windowed(gpt, "the gradient norm", err));
  MP_TRY(mp_stage_cpu_alloc_grads(gpt, err));
  double *squares = malloc((size_t)(gpt->num_tensors > 0 ? gpt->num_tensors : 1) * sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (int i = 0; i < gpt->num_tensors; ++i) {
    const mp_stage_tensor *t = &gpt->tensors[i];
    squares[i] = mp_grad_norm_squared_cpu(gpt->grads + t->offset, t->count);
  }
  const mp_status status = mp_stage_cpu_norm_from_squares(gpt, squares, out, err);
  free(squares);
  return status;
}

/* ---- the one-rank model: the whole-model stage at tp = 1 ---- */

struct mp_gpt {
  mp_tp_comm single; /* the stage keeps a copy; it has no context to outlive */
  mp_stage_cpu *stage;
};

mp_status mp_gpt_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt **out,
                        mp_error *err) {
  *out = NULL;
  mp_gpt *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  gpt->single = mp_tp_comm_single();
  const mp_status status =
      mp_stage_cpu_create(model, micro_batch, seq_len, &gpt->single, false, &gpt->stage, err);
  if (status != MP_OK) {
    free(gpt);
    return status;
  }
  *out = gpt;
  return MP_OK;
}

void mp_gpt_free(mp_gpt *gpt) {
  if (gpt == NULL) return;
  mp_stage_cpu_free(gpt->stage);
  free(gpt);
}

const mp_param_layout *mp_gpt_get_layout(const mp_gpt *gpt) { return gpt->stage->layout; }
const mp_model_config *mp_gpt_get_config(const mp_gpt *gpt) {
  return mp_param_layout_config(gpt->stage->layout);
}
size_t mp_gpt_num_params(const mp_gpt *gpt) { return gpt->stage->num_params; }
float *mp_gpt_params(mp_gpt *gpt) { return gpt->stage->params; }
float *mp_gpt_grads(mp_gpt *gpt) { return gpt->stage->grads; }
int mp_gpt_num_tensors(const mp_gpt *gpt) {
  return mp_param_layout_num_tensors(gpt->stage->layout);
}

const mp_param_tensor *mp_gpt_tensor_at(const mp_gpt *gpt, int index) {
  return mp_param_layout_tensor(gpt->stage->layout, index);
}

const mp_param_tensor *mp_gpt_find_tensor(const mp_gpt *gpt, const char *name) {
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    if (strcmp(t->name, name) == 0) return t;
  }
  return NULL;
}

void mp_gpt_init_params(mp_gpt *gpt, uint64_t seed) {
  mp_param_layout_init_params(gpt->stage->layout, gpt->stage->params, seed);
}

void mp_gpt_zero_grads(mp_gpt *gpt) { mp_stage_cpu_zero_grads(gpt->stage); }

double mp_gpt_forward(mp_gpt *gpt, const int32_t *inputs, const int32_t *targets, float dloss) {
  mp_error err = MP_ERROR_INITIALIZER;
  double loss = 0.0;
  return mp_stage_cpu_forward(gpt->stage, inputs, targets, dloss, &loss, &err) == MP_OK ? loss
                                                                                        : NAN;
}

void mp_gpt_backward(mp_gpt *gpt) {
  mp_error err = MP_ERROR_INITIALIZER;
  (void)mp_stage_cpu_backward(gpt->stage, &err);
}

mp_status mp_gpt_load_llmc(mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_param_layout_load_llmc(gpt->stage->layout, gpt->stage->params, path, err);
}

mp_status mp_gpt_save_llmc(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_param_layout_save_llmc(gpt->stage->layout, gpt->stage->params, path, err);
}

mp_status mp_gpt_save_llmc_gradients(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_param_layout_save_llmc(gpt->stage->layout, gpt->stage->grads, path, err);
}
