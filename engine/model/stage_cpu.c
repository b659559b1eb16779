/* engine/model/stage_cpu.c — one rank's shard of a pipeline stage on the CPU; see the header.
 * The forward and backward chain the same calls as tests/tensor_parallel's whole-model check. */
#include "engine/model/stage_cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_chain.h"
#include "layers/adamw.h"

struct mp_stage_cpu {
  mp_stage_layout *layout; /* where each number of the shard goes */
  mp_tp_comm tp;
  mp_tp_comm cp;          /* the context-parallel group (the one-rank table without) */
  float *params;         /* (mp_stage_layout_params_floats,) the stored array: the flat shard,
                            or under ZeRO-3 the tensors outside the blocks and the held block
                            elements */
  void *weight_window;   /* ZeRO-3: (the largest block's floats) the chain's weights window */
  float *grads;          /* (grads_floats,): num_params, or windowed the tensors outside the
                            blocks, packed */
  size_t grads_floats;
  mp_grad_window window; /* ZeRO-2: which gradients pass through block_window */
  float *block_window;   /* (the largest block's floats) */
  /* The forward and backward: the stage chain over the CPU's kernels. */
  mp_stage_kernels *kernels;
  mp_stage_chain *chain;
  /* AdamW's moments of flat elements [moments_first, + moments_count): the whole stage, or with
   * ZeRO this dp rank's part (mp_stage_cpu_keep_moments); NULL until first needed. */
  float *adam_m, *adam_v;
  size_t moments_first, moments_count;
  float *grad_part;      /* windowed (ZeRO-2): (moments_count,) the part's summed gradients */
};

void mp_stage_cpu_free(mp_stage_cpu *gpt) {
  if (gpt == NULL) return;
  mp_stage_chain_free(gpt->chain);
  mp_stage_kernels_cpu_free(gpt->kernels);
  free(gpt->grads);
  free(gpt->adam_m);
  free(gpt->adam_v);
  free(gpt->grad_part);
  free(gpt->block_window);
  free(gpt->weight_window);
  free(gpt->params);
  mp_stage_layout_free(gpt->layout);
  free(gpt);
}

mp_status mp_stage_cpu_create(const mp_model *model, int micro_batch, int seq_len,
                              const mp_tp_comm *tp, bool sequence_parallel, mp_stage_cpu **out,
                              mp_error *err) {
  *out = NULL;
  mp_param_layout *layout = NULL;
  MP_TRY(mp_param_layout_create(model, seq_len, &layout, err));
  const mp_stage_cpu_config config = {
      .micro_batch = micro_batch,
      .seq_len = seq_len,
      .tp = tp,
      .sequence_parallel = sequence_parallel,
      .span = mp_stage_span_whole(mp_param_layout_config(layout)->num_layers),
      .num_slots = 1,
      .recompute = MP_RECOMPUTE_NONE};
  mp_param_layout_free(layout);
  return mp_stage_cpu_create_stage(model, &config, out, err);
}

mp_status mp_stage_cpu_create_stage(const mp_model *model, const mp_stage_cpu_config *config,
                                    mp_stage_cpu **out, mp_error *err) {
  *out = NULL;
  const mp_stage_zero *zero = config->zero;
  const int num_slots = config->num_slots;
  const bool windowed_block_grads = zero != NULL && zero->window_block_grads;
  const bool shard_params = zero != NULL && zero->shard_block_params;
  if (shard_params && (!windowed_block_grads || config->deferred_weights)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "sharded block parameters (ZeRO-3) need windowed block gradients and whole "
                   "backwards (not a zero-bubble schedule's deferred weight gradients)");
  }
  if (mp_stage_chain_check(num_slots, config->deferred_weights, config->recompute, err) != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, MP_ERR_INPUT, "%s: %s", mp_model_source(model), inner.message);
  }
  const mp_tp_comm *tp = config->tp;
  if (tp->size < 1 || tp->rank < 0 || tp->rank >= tp->size) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d of %d: not a rank of the group",
                   tp->rank, tp->size);
  }
  mp_stage_cpu *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  const mp_stage_layout_config layout_config = {config->micro_batch,
                                                config->seq_len,
                                                tp->rank,
                                                tp->size,
                                                config->sequence_parallel,
                                                config->span,
                                                zero,
                                                config->cp != NULL ? config->cp->rank : 0,
                                                config->cp != NULL ? config->cp->size : 1,
                                                config->ep != NULL ? config->ep->rank : 0,
                                                config->ep != NULL ? config->ep->size : 1};
  mp_status status = mp_stage_layout_create(model, &layout_config, &gpt->layout, err);
  if (status != MP_OK) {
    mp_stage_cpu_free(gpt);
    return status;
  }
  gpt->tp = *tp;
  gpt->cp = config->cp != NULL ? *config->cp : mp_tp_comm_single();
  size_t blocks_first = 0, blocks_end = 0, largest_block = 0;
  mp_stage_layout_blocks_range(gpt->layout, &blocks_first, &blocks_end, &largest_block);
  if (shard_params) {
    gpt->weight_window = calloc(largest_block > 0 ? largest_block : 1, sizeof(float));
  }
  const size_t param_floats = mp_stage_layout_params_floats(gpt->layout);
  gpt->params = calloc(param_floats > 0 ? param_floats : 1, sizeof(float));
  gpt->window = mp_grad_window_for(windowed_block_grads, config->deferred_weights);
  gpt->grads_floats = mp_stage_layout_grad_array_floats(gpt->layout, gpt->window);
  const bool windowed = gpt->window != MP_GRAD_WINDOW_NONE;
  gpt->grads = calloc(gpt->grads_floats > 0 ? gpt->grads_floats : 1, sizeof(float));
  if (windowed) gpt->block_window = calloc(largest_block > 0 ? largest_block : 1, sizeof(float));
  if (gpt->params == NULL || gpt->grads == NULL || (windowed && gpt->block_window == NULL) ||
      (shard_params && gpt->weight_window == NULL)) {
    const size_t n = mp_stage_layout_num_params(gpt->layout);
    mp_stage_cpu_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a shard of %zu parameters", n);
  }
  {
    mp_stage_dims dims = mp_stage_chain_dims(gpt->layout, &gpt->tp, &gpt->cp);
    if (config->ep != NULL) dims.ep = *config->ep;
    /* One gradient window: a CPU rank's reduce-scatter runs on the cores that compute. */
    const mp_stage_chain_config chain_config = {.layout = gpt->layout,
                                                .tp = &gpt->tp,
                                                .cp = &gpt->cp,
                                                .weights = gpt->params,
                                                .grads = gpt->grads,
                                                .num_slots = num_slots,
                                                .deferred_weights = config->deferred_weights,
                                                .recompute = config->recompute,
                                                .block_grads_window = gpt->block_window,
                                                .block_weights_window = gpt->weight_window};
    if ((status = mp_stage_kernels_cpu_create(&dims, &gpt->kernels, err)) != MP_OK ||
        (status = mp_stage_chain_create(&chain_config, gpt->kernels, &gpt->chain, err)) !=
            MP_OK) {
      mp_stage_cpu_free(gpt);
      return status;
    }
  }
  *out = gpt;
  return MP_OK;
}

const mp_stage_layout *mp_stage_cpu_layout(const mp_stage_cpu *gpt) { return gpt->layout; }
const mp_tp_comm *mp_stage_cpu_comm(const mp_stage_cpu *gpt) { return &gpt->tp; }
float *mp_stage_cpu_params(mp_stage_cpu *gpt) { return gpt->params; }
float *mp_stage_cpu_grads(mp_stage_cpu *gpt) { return gpt->grads; }

float *mp_stage_cpu_params_at(mp_stage_cpu *gpt, size_t first, size_t count) {
  size_t at = 0;
  if (gpt->params == NULL || !mp_stage_layout_params_index(gpt->layout, first, count, &at)) {
    return NULL;
  }
  return gpt->params + at;
}

static mp_status host_read(void *context, size_t at, size_t count, float *dest, mp_error *err) {
  (void)err;
  memcpy(dest, (const float *)context + at, count * sizeof(float));
  return MP_OK;
}

static mp_status host_write(void *context, size_t at, size_t count, const float *src,
                            mp_error *err) {
  (void)err;
  memcpy((float *)context + at, src, count * sizeof(float));
  return MP_OK;
}

mp_status mp_stage_cpu_read_params(mp_stage_cpu *gpt, size_t first, size_t count, float *dest,
                                   mp_error *err) {
  const mp_stage_param_io io = {gpt->params, host_read, host_write};
  return mp_stage_layout_read_params(gpt->layout, &io, first, count, dest, err);
}

mp_status mp_stage_cpu_write_params(mp_stage_cpu *gpt, size_t first, size_t count,
                                    const float *src, mp_error *err) {
  const mp_stage_param_io io = {gpt->params, host_read, host_write};
  return mp_stage_layout_write_params(gpt->layout, &io, first, count, src, err);
}

mp_grad_window mp_stage_cpu_grad_window(const mp_stage_cpu *gpt) { return gpt->window; }

size_t mp_stage_cpu_grads_floats(const mp_stage_cpu *gpt) {
  return gpt->grads != NULL ? gpt->grads_floats : 0;
}

float *mp_stage_cpu_tensor_grad(mp_stage_cpu *gpt, int index) {
  size_t offset = 0;
  if (gpt->grads == NULL ||
      !mp_stage_layout_grad_offset(gpt->layout, index, gpt->window, &offset)) {
    return NULL;
  }
  return gpt->grads + offset;
}


typedef struct {
  mp_stage_cpu *stage;
  mp_stage_fill_fn fill;
  void *context;
} fill_call;

/* In place: the host array holds every rectangle the stage holds as one stretch. */
static mp_status fill_rect(void *context, const mp_stage_rect *rect, mp_error *err) {
  const fill_call *call = context;
  float *dest = mp_stage_cpu_params_at(call->stage, rect->flat_first, rect->rows * rect->cols);
  return call->fill(call->context, rect->tensor, rect->row, rect->rows, rect->col, rect->cols,
                    dest, err);
}

mp_status mp_stage_cpu_fill_params(mp_stage_cpu *gpt, mp_stage_fill_fn fill, void *context,
                                   mp_error *err) {
  fill_call call = {gpt, fill, context};
  return mp_stage_layout_for_each_held_rect(gpt->layout, SIZE_MAX, fill_rect, &call, err);
}

mp_status mp_stage_cpu_init_params(mp_stage_cpu *gpt, uint64_t seed, mp_error *err) {
  mp_stage_init_context init = {mp_stage_layout_model(gpt->layout), seed};
  return mp_stage_cpu_fill_params(gpt, mp_stage_init_fill, &init, err);
}

/* full (one-rank layout) = every rank's shard of `shard` put back, on every rank. */
static mp_status gather_all(mp_stage_cpu *gpt, const float *shard, float *full, mp_error *err) {
  const size_t P = (size_t)gpt->tp.size;
  const int num_tensors = mp_stage_layout_num_tensors(gpt->layout);
  size_t largest = 0;
  for (int i = 0; i < num_tensors; ++i) {
    const size_t count = mp_stage_layout_tensor(gpt->layout, i)->count;
    if (count > largest) largest = count;
  }
  float *gathered = malloc((largest * P > 0 ? largest * P : 1) * sizeof(float));
  if (gathered == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory gathering parameters");
  mp_status status = MP_OK;
  for (int i = 0; i < num_tensors && status == MP_OK; ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpt->layout, i);
    if (t->tied_copy) continue;
    if (t->ep_size > 1) { /* the other experts are on the ep group's other ranks */
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: this rank holds ep rank %d's experts only (ep %d): gather the whole "
                       "model through a checkpoint (engine/checkpoint/checkpoint.h)",
                       t->full->name, t->ep_rank, t->ep_size);
      break;
    }
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
  if (mp_stage_layout_sharded_params(gpt->layout)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gathering the parameters: the stage's block parameters are sharded over dp "
                   "(ZeRO-3)");
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
  return gather_all(gpt, gpt->grads, full, err);
}

void mp_stage_cpu_zero_grads(mp_stage_cpu *gpt) {
  if (gpt->grads != NULL) memset(gpt->grads, 0, gpt->grads_floats * sizeof(float));
  if (gpt->grad_part != NULL) memset(gpt->grad_part, 0, gpt->moments_count * sizeof(float));
}


mp_stage_chain *mp_stage_cpu_chain(mp_stage_cpu *gpt) { return gpt->chain; }

mp_status mp_stage_cpu_forward_stage(mp_stage_cpu *gpt, int slot, const int32_t *inputs,
                                  const int32_t *targets, const float *input, float *output,
                                  float dloss, double *loss, mp_error *err) {
  return mp_stage_chain_forward(gpt->chain, slot, inputs, targets, input, output, dloss, loss,
                                err);
}

mp_status mp_stage_cpu_backward_stage(mp_stage_cpu *gpt, int slot, const float *doutput,
                                      float *dinput, bool defer_weights, mp_error *err) {
  return mp_stage_chain_backward(gpt->chain, slot, doutput, dinput, defer_weights, err);
}

mp_status mp_stage_cpu_forward(mp_stage_cpu *gpt, const int32_t *inputs, const int32_t *targets,
                            float dloss, double *loss, mp_error *err) {
  mp_stage_chain_discard(gpt->chain, 0); /* an evaluation's forward starts over */
  return mp_stage_cpu_forward_stage(gpt, 0, inputs, targets, NULL, NULL, dloss, loss, err);
}

mp_status mp_stage_cpu_backward(mp_stage_cpu *gpt, mp_error *err) {
  return mp_stage_cpu_backward_stage(gpt, 0, NULL, NULL, false, err);
}

mp_status mp_stage_cpu_finish_grads(mp_stage_cpu *gpt, mp_error *err) {
  return mp_stage_chain_finish_grads(gpt->chain, err);
}


mp_status mp_stage_cpu_grad_norm_squared(mp_stage_cpu *gpt, double *out, mp_error *err) {
  MP_TRY(refuse_windowed(gpt, "the gradient norm", err));
  const int num_tensors = mp_stage_layout_num_tensors(gpt->layout);
  double *squares = malloc((size_t)(num_tensors > 0 ? num_tensors : 1) * sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (int i = 0; i < num_tensors; ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpt->layout, i);
    squares[i] = mp_grad_norm_squared_cpu(gpt->grads + t->offset, t->count);
  }
  const mp_status status = mp_stage_norm_from_squares(gpt->layout, &gpt->tp, squares, out, err);
  free(squares);
  return status;
}

/* ---- The optimizer's state: AdamW's moments, ZeRO-2's gradient part, AdamW ---- */

static bool windowed(const mp_stage_cpu *gpt) { return gpt->window != MP_GRAD_WINDOW_NONE; }

mp_status mp_stage_cpu_keep_moments(mp_stage_cpu *gpt, size_t first, size_t count,
                                    mp_error *err) {
  const size_t n = mp_stage_layout_num_params(gpt->layout);
  if (first > n || count > n - first) {
    return mp_fail(err, MP_ERR_INPUT, "moments of elements [%zu, %zu): the stage has %zu", first,
                   first + count, n);
  }
  free(gpt->adam_m);
  free(gpt->adam_v);
  free(gpt->grad_part);
  gpt->grad_part = NULL;
  gpt->moments_first = first;
  gpt->moments_count = count;
  gpt->adam_m = calloc(count > 0 ? count : 1, sizeof(float));
  gpt->adam_v = calloc(count > 0 ? count : 1, sizeof(float));
  /* ZeRO-2: the part's gradients cover the moments' elements. */
  if (windowed(gpt)) gpt->grad_part = calloc(count > 0 ? count : 1, sizeof(float));
  if (gpt->adam_m == NULL || gpt->adam_v == NULL || (windowed(gpt) && gpt->grad_part == NULL)) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for optimizer state (%zu floats)", count);
  }
  return MP_OK;
}

/* The whole stage's moments unless a part was kept; a windowed stage keeps a part, always. */
static mp_status whole_moments(mp_stage_cpu *gpt, mp_error *err) {
  if (gpt->adam_m != NULL) return MP_OK;
  if (windowed(gpt)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the CPU stage's gradients are windowed (ZeRO-2) but it keeps no part: call "
                   "mp_stage_cpu_keep_moments first");
  }
  return mp_stage_cpu_keep_moments(gpt, 0, mp_stage_layout_num_params(gpt->layout), err);
}

mp_status mp_stage_cpu_moments_at(mp_stage_cpu *gpt, size_t first, size_t count, float **adam_m,
                                  float **adam_v, mp_error *err) {
  MP_TRY(whole_moments(gpt, err));
  if (first < gpt->moments_first || first - gpt->moments_first > gpt->moments_count ||
      count > gpt->moments_count - (first - gpt->moments_first)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moments of elements [%zu, %zu): the CPU stage keeps those of [%zu, %zu)",
                   first, first + count, gpt->moments_first,
                   gpt->moments_first + gpt->moments_count);
  }
  *adam_m = gpt->adam_m + (first - gpt->moments_first);
  *adam_v = gpt->adam_v + (first - gpt->moments_first);
  return MP_OK;
}

mp_status mp_stage_cpu_add_to_part(mp_stage_cpu *gpt, const float *sums, size_t first,
                                   size_t count, mp_error *err) {
  if (gpt->grad_part == NULL || first < gpt->moments_first ||
      first + count > gpt->moments_first + gpt->moments_count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gradient sums of elements [%zu, %zu) are not in the stage's ZeRO-2 part "
                   "[%zu, %zu)",
                   first, first + count, gpt->moments_first,
                   gpt->moments_first + (gpt->grad_part != NULL ? gpt->moments_count : 0));
  }
  float *to = gpt->grad_part + (first - gpt->moments_first);
  for (size_t i = 0; i < count; ++i) to[i] += sums[i];
  return MP_OK;
}

mp_status mp_stage_cpu_part_squares(mp_stage_cpu *gpt, double *squares, mp_error *err) {
  if (gpt->grad_part == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "the CPU stage keeps no ZeRO-2 part");
  }
  const size_t first = gpt->moments_first, end = first + gpt->moments_count;
  for (int i = 0; i < mp_stage_layout_num_tensors(gpt->layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpt->layout, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    squares[i] = lo < hi ? mp_grad_norm_squared_cpu(gpt->grad_part + (lo - first), hi - lo) : 0.0;
  }
  return MP_OK;
}

float *mp_stage_cpu_grad_part(mp_stage_cpu *gpt) { return gpt->grad_part; }

void mp_stage_cpu_scale_grads(mp_stage_cpu *gpt, float scale) {
  if (gpt->grad_part != NULL) {
    mp_grad_scale_cpu(gpt->grad_part, gpt->moments_count, scale);
  } else {
    mp_grad_scale_cpu(gpt->grads, mp_stage_layout_num_params(gpt->layout), scale);
  }
}

mp_status mp_stage_cpu_adamw(mp_stage_cpu *gpt, const mp_stage_adamw *adamw, mp_error *err) {
  MP_TRY(whole_moments(gpt, err));
  /* Tensor by tensor (weight decay is a property of the tensor), over the elements whose moments
   * this rank keeps, the clip factor applied inside the update (no pass of its own). */
  const size_t first = gpt->moments_first, end = first + gpt->moments_count;
  const float *grads = gpt->grad_part != NULL ? gpt->grad_part : gpt->grads + first;
  for (int i = 0; i < mp_stage_layout_num_tensors(gpt->layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpt->layout, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    if (lo >= hi) continue;
    /* Where the stage keeps them (with ZeRO-3 not at their offsets: the part's own). */
    float *params = mp_stage_cpu_params_at(gpt, lo, hi - lo);
    if (params == NULL) {
      return mp_fail(err, MP_ERR_INPUT,
                     "AdamW on elements [%zu, %zu): the stage does not hold them (ZeRO-3 part)",
                     lo, hi);
    }
    mp_adamw_update_scaled_cpu(params, grads + (lo - first), gpt->adam_m + (lo - first),
                               gpt->adam_v + (lo - first), hi - lo, adamw->learning_rate,
                               adamw->beta1, adamw->beta2, adamw->eps,
                               t->full->weight_decay ? adamw->weight_decay : 0.0f, adamw->step,
                               adamw->grad_scale);
  }
  return MP_OK;
}
