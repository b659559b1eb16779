/* engine/model/stage_layout.c — one rank's shard of one pipeline stage laid out, without memory;
 * see stage_layout.h. */
#include "engine/model/stage_layout.h"

#include "engine/model/router_stats.h"

#include <stdint.h>
#include <stdlib.h>

#include "layers/gpt_block.h"
#include "tensor_parallel/vocab_parallel_embedding.h"

struct mp_stage_layout {
  mp_param_layout *model;  /* the one-rank layout */
  mp_stage_span span;
  int tp_rank, tp_size;
  int cp_rank, cp_size;
  int ep_rank, ep_size;
  bool sp;
  int B, T;
  int BTl;                 /* B*T/tp with sequence parallelism, else B*T */
  int num_tensors;
  mp_stage_tensor *tensors; /* (num_tensors,) the stage's tensors in the layout's order */
  int *index_of;           /* (the layout's tensors) the stage's index of each, or -1 */
  size_t num_params;       /* floats of this rank's shard of the stage */
  size_t blocks_first, blocks_end, largest_block;
  bool sharded;            /* ZeRO-3: the stored array holds the tensors outside the blocks
                              (outside_floats, packed), then the held block elements
                              [held_first, held_end) of the flat layout */
  size_t outside_floats, held_first, held_end;
};

/* Whether tensor index of the one-rank layout is a block's stacked experts (split over ep). */
static bool is_expert_tensor(const mp_param_layout *model, int index) {
  const int layer = mp_param_layout_layer_of(model, index);
  return layer >= 0 &&
         (index == mp_param_layout_block_index(model, layer, MP_BLOCK_EXPERT_FC1_WEIGHT) ||
          index == mp_param_layout_block_index(model, layer, MP_BLOCK_EXPERT_FC2_WEIGHT));
}

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

void mp_zero_part(size_t n, int size, int rank, size_t *first, size_t *count) {
  const size_t part = size > 0 ? (n + (size_t)size - 1) / (size_t)size : n;
  *first = part * (size_t)rank < n ? part * (size_t)rank : n;
  *count = *first + part < n ? part : n - *first;
}

mp_grad_window mp_grad_window_for(bool windowed_block_grads, bool deferred_weights) {
  if (!windowed_block_grads) return MP_GRAD_WINDOW_NONE;
  return deferred_weights ? MP_GRAD_WINDOW_BLOCK_WEIGHTS : MP_GRAD_WINDOW_BLOCKS;
}

/* The block's shapes over tp ranks: heads, MLP channels and, with sequence parallelism, the
 * micro-batch's tokens must divide. */
/* split_mlp: the MLP is split over tp (dense); a mixture of experts' is whole on every rank. */
static mp_status check_split(const mp_gpt_block_shape *s, int kv_heads, int tp,
                             bool sequence_parallel, bool split_mlp, mp_error *err) {
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
  if (split_mlp && s->F % tp != 0) {
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

void mp_stage_layout_free(mp_stage_layout *layout) {
  if (layout == NULL) return;
  free(layout->tensors);
  free(layout->index_of);
  mp_param_layout_free(layout->model);
  free(layout);
}

/* The stage's blocks in its table: first and end of the flat elements, the largest block. */
static void find_blocks(mp_stage_layout *layout) {
  const int L = layout->span.num_layers;
  if (L == 0) return;
  const int per_block = mp_param_layout_tensors_per_block(layout->model);
  const int lo =
      mp_param_layout_block_index(layout->model, layout->span.first_layer, MP_BLOCK_LN1_WEIGHT);
  const mp_param_tensor *base = mp_param_layout_tensor(layout->model, 0);
  bool found = false;
  size_t block_floats = 0;
  int block = -1;
  for (int i = 0; i < layout->num_tensors; ++i) {
    const mp_stage_tensor *t = &layout->tensors[i];
    const int full = (int)(t->full - base);
    if (full < lo || full >= lo + L * per_block) continue;
    if (!found) layout->blocks_first = t->offset;
    found = true;
    layout->blocks_end = t->offset + t->count;
    if ((full - lo) / per_block != block) {
      block = (full - lo) / per_block;
      block_floats = 0;
    }
    block_floats += t->count;
    if (block_floats > layout->largest_block) layout->largest_block = block_floats;
  }
}

mp_status mp_stage_layout_create(const mp_model *model, const mp_stage_layout_config *config,
                                 mp_stage_layout **out, mp_error *err) {
  *out = NULL;
  const mp_stage_span *span = &config->span;
  const int tp = config->tp_size;
  if (tp < 1 || config->tp_rank < 0 || config->tp_rank >= tp) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d of %d: not a rank of the group",
                   config->tp_rank, tp);
  }
  const int cp = config->cp_size > 1 ? config->cp_size : 1;
  if (config->cp_rank < 0 || config->cp_rank >= cp) {
    return mp_fail(err, MP_ERR_INPUT, "context-parallel rank %d of %d: not a rank of the group",
                   config->cp_rank, cp);
  }
  mp_stage_layout *layout = calloc(1, sizeof *layout);
  if (layout == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  layout->cp_rank = config->cp_rank;
  layout->cp_size = cp;
  const int ep = config->ep_size > 1 ? config->ep_size : 1;
  if (config->ep_rank < 0 || config->ep_rank >= ep) {
    free(layout);
    return mp_fail(err, MP_ERR_INPUT, "expert-parallel rank %d of %d: not a rank of the group",
                   config->ep_rank, ep);
  }
  layout->ep_rank = config->ep_rank;
  layout->ep_size = ep;
  /* The positions reach the whole sequence's: the table must hold cp x T. */
  mp_status status = mp_param_layout_create(model, config->seq_len * cp, &layout->model, err);
  if (status != MP_OK) {
    mp_stage_layout_free(layout);
    return status;
  }
  const mp_model_config *c = mp_param_layout_config(layout->model);
  if (span->first_layer < 0 || span->num_layers < 0 ||
      span->first_layer + span->num_layers > c->num_layers) {
    mp_fail(err, MP_ERR_INPUT, "%s: blocks [%d, %d) are not blocks of the model (%d)",
            mp_model_source(model), span->first_layer, span->first_layer + span->num_layers,
            c->num_layers);
    mp_stage_layout_free(layout); /* after the message: c lives in the layout */
    return MP_ERR_INPUT;
  }
  layout->span = *span;
  layout->tp_rank = config->tp_rank;
  layout->tp_size = tp;
  layout->sp = config->sequence_parallel;
  layout->B = config->micro_batch;
  layout->T = config->seq_len;
  const mp_gpt_block_shape shape = {config->micro_batch, config->seq_len, c->channels,
                                    c->num_heads, c->ffn_channels};
  if ((status = check_split(&shape, c->num_kv_heads, tp, layout->sp, c->moe_experts == 0, err)) !=
          MP_OK ||
      (status = mp_tp_vocab_check(c->padded_vocab_size, tp, err)) != MP_OK) {
    mp_error inner = *err;
    mp_fail(err, status, "%s with tp = %d%s: %s", mp_model_source(model), tp,
            layout->sp ? " and sequence parallelism" : "", inner.message);
    mp_stage_layout_free(layout);
    return status;
  }
  layout->BTl = layout->sp ? layout->B * layout->T / tp : layout->B * layout->T;
  if (ep > 1 && (c->moe_experts == 0 || c->moe_experts % ep != 0)) {
    /* The message first: c lives in the layout. */
    if (c->moe_experts == 0) {
      mp_fail(err, MP_ERR_INPUT,
              "%s with ep = %d: the model has no mixture-of-experts blocks to split over ep; use "
              "ep 1",
              mp_model_source(model), ep);
    } else {
      mp_fail(err, MP_ERR_INPUT,
              "%s with ep = %d: its %d experts do not divide over ep; use an ep that divides them",
              mp_model_source(model), ep, c->moe_experts);
    }
    mp_stage_layout_free(layout);
    return MP_ERR_INPUT;
  }

  if (cp > 1 && c->moe_capacity_factor > 0.0) {
    /* A cp rank routes only part of each sequence: its capacity would differ from one rank's. */
    int json_index = 0;
    for (int i = 0; i < mp_model_num_layers(model); ++i) {
      const mp_layer_spec *block = mp_model_layer(model, i);
      if (mp_layer_is_moe(block)) {
        json_index = block->json_index;
        break;
      }
    }
    mp_stage_layout_free(layout);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: $.layers[%d].moe.capacity_factor with cp = %d: a context-parallel rank "
                   "routes only part of each sequence, so the experts' capacity would depend on "
                   "cp; remove capacity_factor or use cp 1",
                   mp_model_source(model), json_index, cp);
  }

  /* The shard's tensor table: the stage's tensors, in the layout's order. */
  const int all = mp_param_layout_num_tensors(layout->model);
  layout->tensors = calloc((size_t)all, sizeof *layout->tensors);
  layout->index_of = calloc((size_t)all, sizeof *layout->index_of);
  if (layout->tensors == NULL || layout->index_of == NULL) {
    mp_stage_layout_free(layout);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  size_t offset = 0;
  for (int i = 0; i < all; ++i) {
    layout->index_of[i] = -1;
    if (!stage_holds(layout->model, span, i)) continue;
    layout->index_of[i] = layout->num_tensors;
    mp_stage_tensor *t = &layout->tensors[layout->num_tensors++];
    t->full = mp_param_layout_tensor(layout->model, i);
    t->tied_copy =
        i == mp_param_layout_global_index(layout->model, MP_GLOBAL_WTE) && !span->embedding;
    t->split = t->full->split;
    t->offset = offset;
    t->count = mp_tp_shard_floats(t->split, t->full->rows, t->full->cols, tp);
    t->ep_rank = 0;
    t->ep_size = 1;
    if (ep > 1 && is_expert_tensor(layout->model, i)) {
      t->ep_rank = layout->ep_rank;
      t->ep_size = ep;
      t->count = mp_tp_shard_floats(MP_TP_SPLIT_ROWS, t->full->rows, t->full->cols, ep);
    }
    offset += t->count;
  }
  layout->num_params = offset;
  find_blocks(layout);
  layout->outside_floats = layout->num_params - (layout->blocks_end - layout->blocks_first);
  const mp_stage_zero *zero = config->zero;
  layout->sharded = zero != NULL && zero->shard_block_params;
  if (layout->sharded) {
    size_t part_first = 0, part_count = 0;
    mp_zero_part(layout->num_params, zero->dp_size, zero->dp_rank, &part_first, &part_count);
    const size_t part_end = part_first + part_count;
    layout->held_first = part_first > layout->blocks_first ? part_first : layout->blocks_first;
    layout->held_end = part_end < layout->blocks_end ? part_end : layout->blocks_end;
    if (layout->held_end < layout->held_first) layout->held_end = layout->held_first;
  }
  *out = layout;
  return MP_OK;
}

const mp_param_layout *mp_stage_layout_model(const mp_stage_layout *layout) {
  return layout->model;
}
const mp_stage_span *mp_stage_layout_span(const mp_stage_layout *layout) { return &layout->span; }

void mp_stage_layout_micro_batch(const mp_stage_layout *layout, int *micro_batch, int *seq_len) {
  *micro_batch = layout->B;
  *seq_len = layout->T;
}

void mp_stage_layout_tp(const mp_stage_layout *layout, int *tp_rank, int *tp_size) {
  *tp_rank = layout->tp_rank;
  *tp_size = layout->tp_size;
}

bool mp_stage_layout_sequence_parallel(const mp_stage_layout *layout) { return layout->sp; }

void mp_stage_layout_cp(const mp_stage_layout *layout, int *cp_rank, int *cp_size) {
  *cp_rank = layout->cp_rank;
  *cp_size = layout->cp_size;
}

void mp_stage_layout_ep(const mp_stage_layout *layout, int *ep_rank, int *ep_size) {
  *ep_rank = layout->ep_rank;
  *ep_size = layout->ep_size;
}

size_t mp_stage_layout_boundary_floats(const mp_stage_layout *layout) {
  const mp_model_config *c = mp_param_layout_config(layout->model);
  /* A mixture of experts carries the micro-batch's router statistics after the activations. */
  return (size_t)layout->BTl * (size_t)c->channels +
         mp_router_stats_boundary_floats(c->moe_experts);
}

size_t mp_stage_layout_num_params(const mp_stage_layout *layout) { return layout->num_params; }
int mp_stage_layout_num_tensors(const mp_stage_layout *layout) { return layout->num_tensors; }
const mp_stage_tensor *mp_stage_layout_tensor(const mp_stage_layout *layout, int index) {
  return &layout->tensors[index];
}

int mp_stage_layout_index_of(const mp_stage_layout *layout, int full_index) {
  if (full_index < 0 || full_index >= mp_param_layout_num_tensors(layout->model)) return -1;
  return layout->index_of[full_index];
}

void mp_stage_layout_blocks_range(const mp_stage_layout *layout, size_t *first, size_t *end,
                                  size_t *largest) {
  *first = layout->blocks_first;
  *end = layout->blocks_end;
  *largest = layout->largest_block;
}

bool mp_stage_layout_sharded_params(const mp_stage_layout *layout) { return layout->sharded; }

size_t mp_stage_layout_params_floats(const mp_stage_layout *layout) {
  return layout->sharded ? layout->outside_floats + (layout->held_end - layout->held_first)
                         : layout->num_params;
}

bool mp_stage_layout_params_stretch(const mp_stage_layout *layout, size_t flat, size_t *first,
                                    size_t *end, size_t *stored) {
  if (!layout->sharded) {
    if (flat >= layout->num_params) return false;
    *first = 0, *end = layout->num_params, *stored = 0;
    return true;
  }
  if (flat < layout->blocks_first) {
    *first = 0, *end = layout->blocks_first, *stored = 0;
  } else if (flat >= layout->blocks_end) {
    *first = layout->blocks_end, *end = layout->num_params, *stored = layout->blocks_first;
  } else if (flat >= layout->held_first && flat < layout->held_end) {
    *first = layout->held_first, *end = layout->held_end, *stored = layout->outside_floats;
  } else {
    return false;
  }
  return flat < layout->num_params;
}

bool mp_stage_layout_params_index(const mp_stage_layout *layout, size_t first, size_t count,
                                  size_t *at) {
  size_t lo = 0, hi = 0, stored = 0;
  if (!mp_stage_layout_params_stretch(layout, first, &lo, &hi, &stored) || first + count > hi) {
    return false;
  }
  *at = stored + (first - lo);
  return true;
}

void mp_stage_layout_held_params(const mp_stage_layout *layout, int index, size_t *first,
                                 size_t *count) {
  const mp_stage_tensor *t = &layout->tensors[index];
  size_t lo = t->offset, hi = t->offset + t->count;
  const bool block = t->offset >= layout->blocks_first && t->offset < layout->blocks_end;
  if (layout->sharded && block) {
    lo = lo > layout->held_first ? lo : layout->held_first;
    hi = hi < layout->held_end ? hi : layout->held_end;
  }
  *first = 0, *count = 0;
  if (lo >= hi) return;
  *first = lo - t->offset;
  *count = hi - lo;
}

void mp_stage_layout_held_blocks(const mp_stage_layout *layout, size_t *first, size_t *end) {
  *first = layout->sharded ? layout->held_first : layout->blocks_first;
  *end = layout->sharded ? layout->held_end : layout->blocks_end;
}

bool mp_stage_layout_grad_in_window(const mp_stage_layout *layout, int index,
                                    mp_grad_window window) {
  const int L = layout->span.num_layers;
  if (window == MP_GRAD_WINDOW_NONE || L == 0) return false;
  const int per_block = mp_param_layout_tensors_per_block(layout->model);
  const int lo =
      mp_param_layout_block_index(layout->model, layout->span.first_layer, MP_BLOCK_LN1_WEIGHT);
  const int full = (int)(layout->tensors[index].full - mp_param_layout_tensor(layout->model, 0));
  if (full < lo || full >= lo + L * per_block) return false;
  if (window == MP_GRAD_WINDOW_BLOCKS) return true;
  /* The GEMM weights W forms (stage_chain.c's block_backward_weights). */
  static const mp_block_tensor kWeights[] = {
      MP_BLOCK_QKV_WEIGHT, MP_BLOCK_K_WEIGHT,  MP_BLOCK_V_WEIGHT,      MP_BLOCK_ATTN_PROJ_WEIGHT,
      MP_BLOCK_FC_WEIGHT,  MP_BLOCK_UP_WEIGHT, MP_BLOCK_FC_PROJ_WEIGHT};
  const int layer = layout->span.first_layer + (full - lo) / per_block;
  for (size_t r = 0; r < sizeof kWeights / sizeof kWeights[0]; ++r) {
    if (mp_param_layout_block_index(layout->model, layer, kWeights[r]) == full) return true;
  }
  return false;
}

size_t mp_stage_layout_grad_array_floats(const mp_stage_layout *layout, mp_grad_window window) {
  size_t floats = 0;
  for (int i = 0; i < layout->num_tensors; ++i) {
    if (!mp_stage_layout_grad_in_window(layout, i, window)) floats += layout->tensors[i].count;
  }
  return floats;
}

bool mp_stage_layout_grad_offset(const mp_stage_layout *layout, int index, mp_grad_window window,
                                 size_t *offset) {
  if (index < 0 || index >= layout->num_tensors ||
      mp_stage_layout_grad_in_window(layout, index, window)) {
    return false;
  }
  size_t packed = 0;
  for (int i = 0; i < index; ++i) {
    if (!mp_stage_layout_grad_in_window(layout, i, window)) packed += layout->tensors[i].count;
  }
  *offset = packed;
  return true;
}

mp_status mp_stage_layout_for_each_held_rect(const mp_stage_layout *layout, size_t max_floats,
                                             mp_stage_rect_visit visit, void *context,
                                             mp_error *err) {
  const size_t cap = max_floats > 0 ? max_floats : 1;
  const mp_param_tensor *base = mp_param_layout_tensor(layout->model, 0);
  for (int i = 0; i < layout->num_tensors; ++i) {
    const mp_stage_tensor *t = &layout->tensors[i];
    size_t held_first = 0, held_count = 0;
    mp_stage_layout_held_params(layout, i, &held_first, &held_count);
    if (held_count == 0) continue;
    mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
    int count = 0;
    if (t->ep_size > 1) { /* this ep rank's experts: a run of rows */
      MP_TRY(mp_tp_shard_blocks(MP_TP_SPLIT_ROWS, t->full->rows, t->full->cols, t->ep_rank,
                                t->ep_size, blocks, &count, err));
    } else {
      MP_TRY(mp_tp_shard_blocks(t->split, t->full->rows, t->full->cols, layout->tp_rank,
                                layout->tp_size, blocks, &count, err));
    }
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
        const mp_stage_rect rect = {(int)(t->full - base), b->row_offset + row, rows,
                                    b->col_offset + col, cols, t->offset + b->shard_offset + a};
        MP_TRY(visit(context, &rect, err));
        a += rows * cols;
      }
    }
  }
  return MP_OK;
}

/* Moves flat elements [first, first + count) between host memory and io's stored array. */
static mp_status move_params(const mp_stage_layout *layout, const mp_stage_param_io *io,
                             size_t first, size_t count, float *dest, const float *src,
                             mp_error *err) {
  size_t at = first;
  while (at < first + count) {
    size_t lo = 0, hi = 0, stored = 0;
    if (!mp_stage_layout_params_stretch(layout, at, &lo, &hi, &stored)) {
      size_t held_first = 0, held_end = 0;
      mp_stage_layout_held_blocks(layout, &held_first, &held_end);
      return mp_fail(err, MP_ERR_INPUT,
                     "parameter %zu of the stage is another dp rank's (ZeRO-3 holds elements "
                     "[%zu, %zu) of the blocks here)",
                     at, held_first, held_end);
    }
    const size_t n = hi < first + count ? hi - at : first + count - at;
    const size_t where = stored + (at - lo);
    if (dest != NULL) {
      MP_TRY(io->read(io->context, where, n, dest + (at - first), err));
    } else {
      MP_TRY(io->write(io->context, where, n, src + (at - first), err));
    }
    at += n;
  }
  return MP_OK;
}

mp_status mp_stage_layout_read_params(const mp_stage_layout *layout, const mp_stage_param_io *io,
                                      size_t first, size_t count, float *dest, mp_error *err) {
  return move_params(layout, io, first, count, dest, NULL, err);
}

mp_status mp_stage_layout_write_params(const mp_stage_layout *layout,
                                       const mp_stage_param_io *io, size_t first, size_t count,
                                       const float *src, mp_error *err) {
  return move_params(layout, io, first, count, NULL, src, err);
}

typedef struct {
  const mp_stage_layout *layout;
  mp_stage_fill_fn fill;
  void *context;
  float *piece;
  const mp_stage_param_io *io;
} fill_call;

static mp_status fill_rect(void *context, const mp_stage_rect *rect, mp_error *err) {
  const fill_call *call = context;
  MP_TRY(call->fill(call->context, rect->tensor, rect->row, rect->rows, rect->col, rect->cols,
                    call->piece, err));
  return mp_stage_layout_write_params(call->layout, call->io, rect->flat_first,
                                      rect->rows * rect->cols, call->piece, err);
}

mp_status mp_stage_layout_fill_params(const mp_stage_layout *layout, mp_stage_fill_fn fill,
                                      void *fill_context, float *piece, size_t piece_floats,
                                      const mp_stage_param_io *io, mp_error *err) {
  const fill_call call = {layout, fill, fill_context, piece, io};
  return mp_stage_layout_for_each_held_rect(layout, piece_floats, fill_rect, (void *)&call, err);
}

mp_status mp_stage_init_fill(void *context, int tensor, size_t row, size_t rows, size_t col,
                             size_t cols, float *dest, mp_error *err) {
  (void)err;
  const mp_stage_init_context *init = context;
  mp_param_tensor_init_block(init->model, mp_param_layout_tensor(init->model, tensor), dest, rows,
                             cols, row, col, init->seed);
  return MP_OK;
}
