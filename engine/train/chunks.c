/* engine/train/chunks.c — building this rank's chunks: the plan's stage split, each chunk's CPU
 * or GPU stage (the one place that tells them apart: after creation the trainer drives either
 * through its state table, engine/model/stage_state.h) with its ZeRO cut, hooks and AdamW
 * moments, ZeRO's bounded buffers; weights loaded into them, and their state read and written in
 * pieces for checkpoints. */
#include "engine/train/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_chain.h"
#include "engine/model/stage_cpu.h"
#include "engine/model/stage_gpu.h"
#include "engine/weights/weight_source.h"
#include "topology/cost_model.h"

/* ---------------------------------------------------------------------------------------------
 * A parallel run: the rank's chunks, the worker's callbacks, the step's reductions
 * ------------------------------------------------------------------------------------------- */

/* The plan's stage split over the chain (embedding, blocks, final norm, head): layers_per_stage,
 * or the cost model's, which is what `mpengine plan` writes. counts has pp x v entries. */
static mp_status stage_split(const mp_plan *plan, const mp_model *model, int *counts,
                             mp_error *err) {
  const int stages = plan->pp * plan->virtual_stages;
  if (plan->num_stage_counts > 0) {
    memcpy(counts, plan->layers_per_stage, (size_t)stages * sizeof(int));
    return MP_OK;
  }
  if (stages == 1) {
    counts[0] = mp_model_num_layers(model);
    return MP_OK;
  }
  mp_estimate *estimate = malloc(sizeof *estimate);
  if (estimate == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const mp_status status = mp_cost_estimate_plan(plan, model, estimate, err);
  if (status == MP_OK) memcpy(counts, estimate->layers_per_stage, (size_t)stages * sizeof(int));
  free(estimate);
  if (status != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, status, "%s: splitting the model into %d stages: %s", plan->source,
                   stages, inner.message);
  }
  return MP_OK;
}

/* One chunk's stage on the trainer's backend, span `range` of model with `slots` activation
 * slots, ZeRO's cut `zero` (NULL: none). */
static mp_status create_stage(mp_trainer *trainer, const mp_model *model, int stage,
                              const mp_stage_span *range, int slots, bool zero_bubble,
                              const mp_stage_zero *zero, void **out, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  if (trainer->state_ops->on_device) {
    /* The GPU stage owns its state on the device: the host holds no copy of it. */
    const mp_stage_gpu_config config = {
        .micro_batch = (int)plan->micro_batch,
        .seq_len = (int)trainer->local_seq_len,
        .tp = &trainer->tp_table,
        .device_tp = trainer->options.tp_device,
        .cp = trainer->options.cp_device != NULL ? trainer->options.cp_device : &trainer->cp_table,
        .sequence_parallel = plan->sequence_parallel,
        .span = *range,
        .num_slots = slots,
        .deferred_weights = zero_bubble,
        .recompute = plan->recompute,
        .zero = zero,
        .ep = &trainer->ep_table,
        .ep_device = trainer->options.ep_device};
    const mp_status status = mp_stage_gpu_create(model, &config, (mp_stage_gpu **)out, err);
    if (status != MP_OK) {
      mp_error inner = *err;
      return mp_fail(err, status, "%s: stage %d on the GPU: %s", plan->source, stage,
                     inner.message);
    }
    return MP_OK;
  }
  const mp_stage_cpu_config config = {
      .micro_batch = (int)plan->micro_batch,
      .seq_len = (int)trainer->local_seq_len,
      .tp = &trainer->tp_table,
      .cp = &trainer->cp_table,
      .ep = &trainer->ep_table,
      .sequence_parallel = plan->sequence_parallel,
      .span = *range,
      .num_slots = slots,
      .deferred_weights = zero_bubble,
      .recompute = plan->recompute,
      .zero = zero};
  return mp_stage_cpu_create_stage(model, &config, (mp_stage_cpu **)out, err);
}

/* A buffer of the trainer's beside the stages, in their memory, counted when on the GPU. */
static mp_status buffer_alloc(mp_trainer *trainer, void **out, size_t bytes, mp_error *err) {
  MP_TRY(trainer->state_ops->alloc(out, bytes, err));
  if (trainer->state_ops->on_device) trainer->device_buffer_bytes += bytes;
  return MP_OK;
}

mp_status mp_train_create_chunks(mp_trainer *trainer, const mp_model *model, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const int pp = plan->pp, v = plan->virtual_stages, stages = pp * v;
  const int pp_rank = trainer->options.pp_rank;
  int *counts = malloc((size_t)stages * sizeof(int));
  if (counts == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = stage_split(plan, model, counts, err);
  mp_param_layout *layout = NULL;
  if (status == MP_OK) status = mp_param_layout_create(model, (int)plan->seq_len, &layout, err);
  const int num_layers = layout != NULL ? mp_param_layout_config(layout)->num_layers : 0;
  mp_param_layout_free(layout);
  if (status == MP_OK) {
    int sum = 0;
    for (int st = 0; st < stages; ++st) sum += counts[st];
    if (sum != num_layers + 3) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: layers_per_stage sums to %d, but model %s has %d layers (embedding, "
                       "%d blocks, final norm and LM head each count one)",
                       plan->source, sum, mp_model_name(model), num_layers + 3, num_layers);
    }
  }
  const mp_stage_state_ops *ops = trainer->state_ops;
  trainer->num_chunks = v;
  trainer->stages = calloc((size_t)v, sizeof *trainer->stages);
  trainer->layouts = calloc((size_t)v, sizeof *trainer->layouts);
  trainer->chains = calloc((size_t)v, sizeof *trainer->chains);
  trainer->zero_first = calloc((size_t)v, sizeof *trainer->zero_first);
  trainer->zero_count = calloc((size_t)v, sizeof *trainer->zero_count);
  const bool zero2 = plan->zero_stage >= 2;
  trainer->zero2 = zero2;
  trainer->zero3 = plan->zero_stage == 3;
  if (zero2) {
    trainer->zero2_hooks = calloc((size_t)v, sizeof *trainer->zero2_hooks);
    trainer->scatter_counts = calloc((size_t)trainer->zero_size, sizeof *trainer->scatter_counts);
    if (status == MP_OK && (trainer->zero2_hooks == NULL || trainer->scatter_counts == NULL)) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  if (status == MP_OK && (trainer->stages == NULL || trainer->layouts == NULL ||
                          trainer->chains == NULL || trainer->zero_first == NULL ||
                          trainer->zero_count == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  const bool zero_bubble = trainer->schedule.kind == MP_SCHEDULE_ZB_H1;
  /* ZeRO's parts: over the dp ranks of this rank's shard group (all of dp without HSDP). */
  const int dp = trainer->zero_size, dp_rank = trainer->zero_rank;
  size_t largest = 0, largest_block = 0;
  for (int c = 0; c < v && status == MP_OK; ++c) {
    const int stage = mp_stage_index(pp, pp_rank, c);
    int first = 0;
    for (int s = 0; s < stage; ++s) first += counts[s];
    mp_stage_span range;
    status = mp_stage_span_of_chain(num_layers, first, first + counts[stage], &range, err);
    if (status != MP_OK) {
      mp_error inner = *err;
      status = mp_fail(err, status, "%s: layers_per_stage[%d]: %s", plan->source, stage,
                       inner.message);
      break;
    }
    const int slots = mp_stage_worker_slots(&trainer->schedule, pp_rank, c);
    /* ZeRO's cut of the stage: its gradients (ZeRO 2 and 3) and parameters (ZeRO-3). */
    const mp_stage_zero zero = {dp, dp_rank, zero2, trainer->zero3};
    trainer->stages[c].ops = ops;
    status = create_stage(trainer, model, stage, &range, slots, zero_bubble, zero2 ? &zero : NULL,
                          &trainer->stages[c].stage, err);
    if (status != MP_OK) break;
    mp_stage_state *chunk = &trainer->stages[c];
    trainer->layouts[c] = ops->layout(chunk->stage);
    trainer->chains[c] = ops->chain(chunk->stage);
    const size_t n = mp_stage_layout_num_params(trainer->layouts[c]);
    size_t first_param = 0, count = n;
    if (plan->zero_stage >= 1) {
      mp_zero_part(n, dp, dp_rank, &first_param, &count);
      const size_t part = (n + (size_t)dp - 1) / (size_t)dp;
      if (part * (size_t)dp > largest) largest = part * (size_t)dp;
      /* The AdamW moments of this rank's part only (with ZeRO-2 the part's gradients too);
       * without ZeRO the stage makes the whole stage's when first needed. */
      status = ops->keep_moments(chunk->stage, first_param, count, err);
    }
    /* The parameters, initialised where the stage keeps them (on the GPU through a bounded
     * host buffer: the host holds no copy of the state). */
    if (status == MP_OK) status = ops->init_params(chunk->stage, plan->training.seed, err);
    if (status != MP_OK) {
      mp_error inner = *err;
      status = mp_fail(err, status, "%s: stage %d (%s): %s", plan->source, stage, ops->backend,
                       inner.message);
      break;
    }
    trainer->zero_first[c] = first_param;
    trainer->zero_count[c] = count;
    if (zero2) {
      size_t blocks_first = 0, blocks_end = 0, block = 0;
      mp_stage_layout_blocks_range(trainer->layouts[c], &blocks_first,
                                   &blocks_end, &block);
      if (block > largest_block) largest_block = block;
      trainer->zero2_hooks[c].trainer = trainer;
      trainer->zero2_hooks[c].chunk = c;
      mp_stage_chain_set_grads_hook(trainer->chains[c], mp_train_zero2_block_grads,
                                    &trainer->zero2_hooks[c]);
      if (trainer->zero3) {
        mp_stage_chain_set_weights_hook(trainer->chains[c], mp_train_zero3_block_weights,
                                        &trainer->zero2_hooks[c]);
      }
    }
  }
  if (status == MP_OK && zero2) {
    /* A reduce-scatter's output: at most one window, or one bucket of the tensors outside the
     * blocks. */
    trainer->scatter_floats =
        largest_block > MP_TRAINER_BUCKET_FLOATS ? largest_block : MP_TRAINER_BUCKET_FLOATS;
    if (trainer->scatter_floats > largest / (size_t)dp + 1) {
      trainer->scatter_floats = largest / (size_t)dp + 1;
    }
    status = buffer_alloc(trainer, (void **)&trainer->scatter_out,
                          trainer->scatter_floats * sizeof(float), err);
  }
  if (status == MP_OK && largest > 0) {
    /* The parameter all-gather goes in pieces: dp pieces of at most zero_piece floats (its
     * output), then one (its input), where the stages keep their parameters: a bounded buffer,
     * not a chunk. */
    const size_t largest_part = largest / (size_t)dp;
    trainer->zero_piece = mp_train_zero_piece_floats(largest_part, dp);
    const size_t floats = trainer->zero_piece * ((size_t)dp + 1);
    status = buffer_alloc(trainer, (void **)&trainer->zero_gather, floats * sizeof(float), err);
    if (trainer->zero_gather != NULL) {
      trainer->zero_part = trainer->zero_gather + trainer->zero_piece * (size_t)dp;
    }
  }
  free(counts);
  return status;
}

mp_status mp_trainer_load_weights(mp_trainer *trainer, const char *path, mp_error *err) {
  /* Shard-first: each chunk reads the byte ranges of its own shard. */
  mp_weight_source *reader = NULL;
  MP_TRY(mp_weight_source_open(trainer->layout, path, &reader, err));
  mp_status status = MP_OK;
  for (int c = 0; c < trainer->num_chunks && status == MP_OK; ++c) {
    /* Straight into where the stage keeps its weights (on the GPU through a bounded host
     * buffer). */
    const mp_stage_state *chunk = &trainer->stages[c];
    status = chunk->ops->fill_params(chunk->stage, mp_weight_source_fill, reader, err);
  }
  mp_weight_source_close(reader);
  return status;
}

mp_status mp_trainer_chunk_state_of(const mp_trainer *trainer, int chunk,
                                    mp_trainer_chunk_state *out, mp_error *err) {
  if (chunk < 0 || chunk >= trainer->num_chunks) {
    return mp_fail(err, MP_ERR_INPUT, "chunk %d: the run has %d model chunks on this rank", chunk,
                   trainer->num_chunks);
  }
  out->params_count = mp_stage_layout_num_params(trainer->layouts[chunk]);
  out->moments_first = trainer->zero_first[chunk];
  out->moments_count = trainer->zero_count[chunk];
  return MP_OK;
}

/* Moves elements [first, first + count) of chunk's array between host memory (dest or src) and
 * where the backend keeps it. */
static mp_status move_state(mp_trainer *trainer, int chunk, mp_trainer_array array, size_t first,
                            size_t count, float *dest, const float *src, mp_error *err) {
  mp_trainer_chunk_state state;
  MP_TRY(mp_trainer_chunk_state_of(trainer, chunk, &state, err));
  if (array == MP_TRAINER_PARAMS) {
    return dest != NULL ? mp_train_read_params(trainer, chunk, first, count, dest, err)
                        : mp_train_write_params(trainer, chunk, first, count, src, err);
  }
  if (array != MP_TRAINER_ADAM_M && array != MP_TRAINER_ADAM_V) {
    return mp_fail(err, MP_ERR_INPUT, "state array %d: not parameters or a moment", (int)array);
  }
  const size_t lo = state.moments_first;
  if (first < lo || first - lo > state.moments_count ||
      count > state.moments_count - (first - lo)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moments of elements [%zu, %zu) of chunk %d: this rank keeps those of [%zu, "
                   "%zu)",
                   first, first + count, chunk, lo, lo + state.moments_count);
  }
  const size_t bytes = count * sizeof(float);
  const mp_stage_state *stage = &trainer->stages[chunk];
  float *adam_m = NULL, *adam_v = NULL;
  MP_TRY(stage->ops->moments_at(stage->stage, first, count, &adam_m, &adam_v, err));
  float *moment = array == MP_TRAINER_ADAM_M ? adam_m : adam_v;
  return dest != NULL ? stage->ops->to_host(dest, moment, bytes, err)
                      : stage->ops->from_host(moment, src, bytes, err);
}

mp_status mp_trainer_read_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                size_t first, size_t count, float *dest, mp_error *err) {
  return move_state(trainer, chunk, array, first, count, dest, NULL, err);
}

mp_status mp_trainer_write_state(mp_trainer *trainer, int chunk, mp_trainer_array array,
                                 size_t first, size_t count, const float *src, mp_error *err) {
  return move_state(trainer, chunk, array, first, count, NULL, src, err);
}

mp_status mp_train_read_params(mp_trainer *trainer, int c, size_t first, size_t count,
                               float *dest, mp_error *err) {
  const mp_stage_state *chunk = &trainer->stages[c];
  return chunk->ops->read_params(chunk->stage, first, count, dest, err);
}

mp_status mp_train_write_params(mp_trainer *trainer, int c, size_t first, size_t count,
                                const float *src, mp_error *err) {
  const mp_stage_state *chunk = &trainer->stages[c];
  return chunk->ops->write_params(chunk->stage, first, count, src, err);
}
