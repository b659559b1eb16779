/*
 * engine/model/stage_gpu.c — a rank's shard of a pipeline stage on a GPU; see stage_gpu.h.
 *
 * The forward and backward are the stage chain's (engine/model/stage_chain.h), run over the CUDA
 * kernel table (stage_kernels_gpu.c). This file owns the device's parameter state: fp32 master
 * weights and gradients, their bf16 copy, the AdamW moments.
 */
#include "engine/model/stage_gpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device/device.h"
#include "engine/model/stage_chain.h"
#include "layers/adamw.h"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/tensor_parallel_cuda.h"

/* ---------------------------------------------------------------------------------------------
 * The stage: its device state and chain
 * ------------------------------------------------------------------------------------------- */

struct mp_stage_gpu {
  mp_stage_layout *layout;                 /* where each number of the shard goes */
  mp_tp_comm tp;                           /* the kernels' collectives (device buffers) */
  mp_tp_comm host_tp;                      /* the same group's host-side sums (MPI) */
  mp_tp_comm cp;                           /* the context-parallel group on device buffers
                                              (NCCL, or MPI through the host), or the one-rank
                                              table */
  size_t num_params, device_bytes;         /* num_params: floats of the shard's flat layout */
  size_t params_floats;                    /* mp_stage_layout_params_floats: num_params, or with
                                              ZeRO-3 the outside tensors and the held block
                                              elements, in the layout's stored order */
  float *master;                           /* (params_floats) */
  float *grads;                            /* (grads_floats): num_params, or windowed the
                                              tensors outside the blocks, packed */
  size_t grads_floats;
  float *adam_m, *adam_v;                  /* (moments_count): elements [moments_first, +count);
                                              NULL until first needed (whole_moments) */
  size_t moments_first, moments_count;     /* all of them, or this dp rank's part with ZeRO */
  bool windowed;                           /* ZeRO-2: block gradients pass through window */
  mp_grad_window window_kind;              /* which ones (mp_grad_window_for) */
  float *window, *window_2;                /* (the largest block's floats each): the blocks'
                                              gradients alternate between the two, so that a
                                              block's reduce-scatter overlaps the next one's
                                              backward (engine/model/stage_chain.h) */
  float *grad_part;                        /* (moments_count) ZeRO-2: the part's gradients,
                                              from mp_stage_gpu_keep_moments */
  size_t grad_part_count;
  mp_bf16 *weights;                        /* (params_floats) */
  mp_bf16 *weights_window, *weights_window_2; /* ZeRO-3: (the largest block's each) the chain's
                                              block weights, gathered before each pass: two,
                                              so that the next pass's gather (a prefetch)
                                              overlaps this one */
  float *norm_scratch;
  mp_stage_kernels *kernels;
  mp_stage_chain *chain;
};

static mp_status device_alloc(mp_stage_gpu *gpu, void **out, size_t bytes, mp_error *err) {
  MP_TRY(mp_device_alloc(out, bytes > 0 ? bytes : 1, err));
  gpu->device_bytes += bytes;
  return MP_OK;
}

#define ALLOC(field, count)                                                             \
  do {                                                                                  \
    if (device_alloc(gpu, (void **)&(field), (size_t)(count) * sizeof(*(field)), err) != \
        MP_OK) {                                                                        \
      goto fail;                                                                        \
    }                                                                                   \
  } while (0)

void mp_stage_gpu_free(mp_stage_gpu *gpu) {
  if (gpu == NULL) return;
  mp_stage_chain_free(gpu->chain);
  mp_stage_kernels_gpu_free(gpu->kernels);
  void *buffers[] = {gpu->master, gpu->grads,     gpu->adam_m,         gpu->adam_v,
                     gpu->weights, gpu->window,    gpu->window_2,       gpu->weights_window,
                     gpu->weights_window_2, gpu->grad_part, gpu->norm_scratch};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
  mp_stage_layout_free(gpu->layout);
  free(gpu);
}

/* The stored array seen from host memory (mp_stage_param_io): the master weights at a stored
 * index, their bf16 copy refreshed on a write. Both synchronise with the default stream
 * (cudaMemcpy). */
static mp_status check_stored(const mp_stage_gpu *gpu, size_t at, size_t count,
                               mp_error *err) {
  if (at <= gpu->params_floats && count <= gpu->params_floats - at) return MP_OK;
  return mp_fail(err, MP_ERR_RUNTIME, "stored parameters [%zu, +%zu) of %zu", at, count,
                 gpu->params_floats);
}

static mp_status store_read(void *context, size_t at, size_t count, float *dest, mp_error *err) {
  const mp_stage_gpu *gpu = context;
  MP_TRY(check_stored(gpu, at, count, err));
  return mp_device_copy_to_host(dest, gpu->master + at, count * sizeof(float), err);
}

static mp_status store_write(void *context, size_t at, size_t count, const float *src,
                             mp_error *err) {
  mp_stage_gpu *gpu = context;
  MP_TRY(check_stored(gpu, at, count, err));
  MP_TRY(mp_device_copy_to_device(gpu->master + at, src, count * sizeof(float), err));
  mp_bf16_from_float_cuda(gpu->weights + at, gpu->master + at, count, NULL);
  return MP_OK;
}

mp_status mp_stage_gpu_create(const mp_model *model, const mp_stage_gpu_config *config,
                              mp_stage_gpu **out, mp_error *err) {
  *out = NULL;
  const bool windowed_block_grads = config->zero != NULL && config->zero->window_block_grads;
  const bool sharded = config->zero != NULL && config->zero->shard_block_params;
  const bool deferred_weights = config->deferred_weights;
  /* What the chain cannot run is refused before the GPU is looked for. */
  MP_TRY(mp_stage_chain_check(config->num_slots, deferred_weights, config->recompute, err));
  if (sharded && (!windowed_block_grads || deferred_weights)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "sharded block parameters (ZeRO-3) need windowed block gradients and whole "
                   "backwards (not a zero-bubble schedule's deferred weight gradients)");
  }
  const mp_tp_comm *host_tp = config->tp;
  const mp_tp_comm *tp = config->device_tp != NULL ? config->device_tp : host_tp;
  if (tp->size != host_tp->size || tp->rank != host_tp->rank) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the device tensor-parallel group (rank %d of %d) is not the stage's group "
                   "(rank %d of %d)",
                   tp->rank, tp->size, host_tp->rank, host_tp->size);
  }
  const mp_stage_layout_config layout_config = {config->micro_batch,
                                                config->seq_len,
                                                host_tp->rank,
                                                host_tp->size,
                                                config->sequence_parallel,
                                                config->span,
                                                config->zero,
                                                config->cp != NULL ? config->cp->rank : 0,
                                                config->cp != NULL ? config->cp->size : 1,
                                                config->ep != NULL ? config->ep->rank : 0,
                                                config->ep != NULL ? config->ep->size : 1};
  mp_stage_layout *layout = NULL;
  MP_TRY(mp_stage_layout_create(model, &layout_config, &layout, err));
  if (mp_device_count() == 0) {
    mp_stage_layout_free(layout);
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)");
  }
  const int num_slots = config->num_slots;
  const mp_recompute recompute = config->recompute;
  mp_stage_gpu *gpu = calloc(1, sizeof *gpu);
  if (gpu == NULL) {
    mp_stage_layout_free(layout);
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  gpu->layout = layout;
  gpu->tp = *tp;
  gpu->host_tp = *host_tp;
  gpu->cp = config->cp != NULL ? *config->cp : mp_tp_comm_single();
  gpu->num_params = mp_stage_layout_num_params(gpu->layout);
  gpu->params_floats = mp_stage_layout_params_floats(gpu->layout);
  /* What the device holds of the parameters (with ZeRO-3 not the whole flat layout). */
  const size_t P = gpu->params_floats;
  size_t blocks_first = 0, blocks_end = 0, largest_block = 0;
  mp_stage_layout_blocks_range(gpu->layout, &blocks_first, &blocks_end,
                               &largest_block);
  gpu->windowed = windowed_block_grads;
  gpu->window_kind = mp_grad_window_for(windowed_block_grads, deferred_weights);
  gpu->grads_floats =
      mp_stage_layout_grad_array_floats(gpu->layout, gpu->window_kind);
  ALLOC(gpu->master, P);
  ALLOC(gpu->grads, gpu->grads_floats);
  ALLOC(gpu->weights, P);
  /* The AdamW moments, and ZeRO-2's part gradients, come with the part
   * (mp_stage_gpu_keep_moments) or, without ZeRO, when first needed (whole_moments): a
   * buffer of the whole stage here, even for a moment, could be the allocation that does not
   * fit. */
  if (gpu->windowed) {
    ALLOC(gpu->window, largest_block);
    ALLOC(gpu->window_2, largest_block);
  }
  if (sharded) {
    ALLOC(gpu->weights_window, largest_block);
    ALLOC(gpu->weights_window_2, largest_block);
  }
  {
    /* Parameters and gradients start at zero, as the header says (device memory holds garbage). */
    float *zeroed[] = {gpu->master, gpu->grads};
    const size_t floats[] = {P, gpu->grads_floats};
    for (size_t i = 0; i < sizeof zeroed / sizeof zeroed[0]; ++i) {
      if (mp_device_memset(zeroed[i], 0, floats[i] * sizeof(float), err) != MP_OK) goto fail;
    }
    if (mp_device_memset(gpu->weights, 0, P * sizeof(mp_bf16), err) != MP_OK) goto fail;
  }
  ALLOC(gpu->norm_scratch, mp_grad_norm_cuda_scratch_floats(P));
  mp_stage_dims dims = mp_stage_chain_dims(gpu->layout, &gpu->tp, &gpu->cp);
  if (config->ep != NULL) dims.ep = *config->ep;
  if (config->ep != NULL && config->ep_device != NULL) dims.ep_device = *config->ep_device;
  size_t kernel_bytes = 0;
  if (mp_stage_kernels_gpu_create(&dims, &gpu->kernels, &kernel_bytes, err) != MP_OK) goto fail;
  const mp_stage_chain_config chain_config = {.layout = gpu->layout,
                                        .tp = &gpu->tp,
                                        .cp = &gpu->cp,
                                        .weights = gpu->weights,
                                        .grads = gpu->grads,
                                        .num_slots = num_slots,
                                        .deferred_weights = deferred_weights,
                                        .recompute = recompute,
                                        .block_grads_window = gpu->window,
                                        .block_grads_window_2 = gpu->window_2,
                                        .block_weights_window = gpu->weights_window,
                                        .block_weights_window_2 = gpu->weights_window_2};
  if (mp_stage_chain_create(&chain_config, gpu->kernels, &gpu->chain, err) != MP_OK) goto fail;
  gpu->device_bytes += kernel_bytes + mp_stage_chain_bytes(gpu->chain);
  *out = gpu;
  return MP_OK;
fail:
  mp_stage_gpu_free(gpu);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

mp_stage_chain *mp_stage_gpu_chain(mp_stage_gpu *gpu) { return gpu->chain; }

size_t mp_stage_gpu_device_bytes(const mp_stage_gpu *gpu) { return gpu->device_bytes; }
float *mp_stage_gpu_device_grads(mp_stage_gpu *gpu) { return gpu->grads; }

/* The whole stage's AdamW moments (zeroed) unless a part was kept (mp_stage_gpu_keep_moments);
 * a windowed stage keeps a part, always. */
static mp_status whole_moments(mp_stage_gpu *gpu, mp_error *err) {
  if (gpu->adam_m != NULL) return MP_OK;
  if (gpu->windowed) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the GPU stage's gradients are windowed (ZeRO-2) but it keeps no part: call "
                   "mp_stage_gpu_keep_moments first");
  }
  return mp_stage_gpu_keep_moments(gpu, 0, gpu->num_params, err);
}

mp_status mp_stage_gpu_keep_moments(mp_stage_gpu *gpu, size_t first, size_t count,
                                        mp_error *err) {
  if (first > gpu->num_params || count > gpu->num_params - first) {
    return mp_fail(err, MP_ERR_INPUT, "moments of elements [%zu, %zu): the stage has %zu", first,
                   first + count, gpu->num_params);
  }
  mp_device_free(gpu->adam_m);
  mp_device_free(gpu->adam_v);
  gpu->adam_m = gpu->adam_v = NULL;
  gpu->device_bytes -= 2 * gpu->moments_count * sizeof(float);
  gpu->moments_first = first;
  gpu->moments_count = count;
  MP_TRY(device_alloc(gpu, (void **)&gpu->adam_m, count * sizeof(float), err));
  MP_TRY(device_alloc(gpu, (void **)&gpu->adam_v, count * sizeof(float), err));
  MP_TRY(mp_device_memset(gpu->adam_m, 0, count * sizeof(float), err));
  MP_TRY(mp_device_memset(gpu->adam_v, 0, count * sizeof(float), err));
  if (!gpu->windowed) return MP_OK;
  /* ZeRO-2: the part's gradients cover the moments' elements. */
  if (gpu->grad_part != NULL) {
    mp_device_free(gpu->grad_part);
    gpu->device_bytes -= gpu->grad_part_count * sizeof(float);
  }
  gpu->grad_part = NULL;
  gpu->grad_part_count = count;
  MP_TRY(device_alloc(gpu, (void **)&gpu->grad_part, count * sizeof(float), err));
  return mp_device_memset(gpu->grad_part, 0, count * sizeof(float), err);
}

float *mp_stage_gpu_device_params(mp_stage_gpu *gpu) { return gpu->master; }

/* Where flat elements [first, first + count) sit in the device's parameter arrays
 * (mp_stage_layout_params_index); false when they are not one stretch there. */
static bool held_offset(const mp_stage_gpu *gpu, size_t first, size_t count, size_t *at) {
  return mp_stage_layout_params_index(gpu->layout, first, count, at);
}

float *mp_stage_gpu_params_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  size_t at = 0;
  return held_offset(gpu, first, count, &at) ? gpu->master + at : NULL;
}

void *mp_stage_gpu_weights_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  size_t at = 0;
  return held_offset(gpu, first, count, &at) ? gpu->weights + at : NULL;
}

void mp_stage_gpu_refresh_weights(mp_stage_gpu *gpu) {
  mp_bf16_from_float_cuda(gpu->weights, gpu->master, gpu->params_floats, NULL);
}

const mp_stage_layout *mp_stage_gpu_layout(const mp_stage_gpu *gpu) { return gpu->layout; }

mp_status mp_stage_gpu_read_params(mp_stage_gpu *gpu, size_t first, size_t count, float *dest,
                                   mp_error *err) {
  const mp_stage_param_io io = {gpu, store_read, store_write};
  return mp_stage_layout_read_params(gpu->layout, &io, first, count, dest, err);
}

mp_status mp_stage_gpu_write_params(mp_stage_gpu *gpu, size_t first, size_t count,
                                    const float *src, mp_error *err) {
  const mp_stage_param_io io = {gpu, store_read, store_write};
  return mp_stage_layout_write_params(gpu->layout, &io, first, count, src, err);
}

/* The parameters are filled through a host buffer of this many floats (1 MiB), rectangle piece
 * by piece, so that no host array of the shard exists. */
enum { FILL_PIECE_FLOATS = 1 << 18 };

mp_status mp_stage_gpu_fill_params(mp_stage_gpu *gpu, mp_stage_fill_fn fill, void *context,
                                   mp_error *err) {
  float *piece = malloc(FILL_PIECE_FLOATS * sizeof(float));
  if (piece == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a parameter piece");
  const mp_stage_param_io io = {gpu, store_read, store_write};
  const mp_status status = mp_stage_layout_fill_params(gpu->layout, fill, context, piece,
                                                       FILL_PIECE_FLOATS, &io, err);
  free(piece);
  return status;
}

mp_status mp_stage_gpu_init_params(mp_stage_gpu *gpu, uint64_t seed, mp_error *err) {
  mp_stage_init_context init = {mp_stage_layout_model(gpu->layout), seed};
  return mp_stage_gpu_fill_params(gpu, mp_stage_init_fill, &init, err);
}

mp_status mp_stage_gpu_moments_at(mp_stage_gpu *gpu, size_t first, size_t count,
                                      float **adam_m, float **adam_v, mp_error *err) {
  MP_TRY(whole_moments(gpu, err));
  if (first < gpu->moments_first || first - gpu->moments_first > gpu->moments_count ||
      count > gpu->moments_count - (first - gpu->moments_first)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moments of elements [%zu, %zu): the GPU stage keeps those of [%zu, %zu)",
                   first, first + count, gpu->moments_first,
                   gpu->moments_first + gpu->moments_count);
  }
  *adam_m = gpu->adam_m + (first - gpu->moments_first);
  *adam_v = gpu->adam_v + (first - gpu->moments_first);
  return MP_OK;
}

static mp_status refuse_windowed(const mp_stage_gpu *gpu, const char *what, mp_error *err) {
  if (!gpu->windowed) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the GPU stage's block gradients are windowed (ZeRO-2): each dp rank keeps "
                 "its part (mp_stage_gpu_part_squares, mp_stage_gpu_add_to_part)",
                 what);
}

mp_status mp_stage_gpu_download_grads(mp_stage_gpu *gpu, float *dest, mp_error *err) {
  MP_TRY(refuse_windowed(gpu, "downloading the gradients", err));
  return mp_device_copy_to_host(dest, gpu->grads, gpu->num_params * sizeof(float), err);
}

static mp_status need_part(const mp_stage_gpu *gpu, mp_error *err) {
  if (gpu->grad_part != NULL) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "the GPU stage's gradients are windowed (ZeRO-2) but it keeps no part: call "
                 "mp_stage_gpu_keep_moments first");
}

mp_status mp_stage_gpu_zero_grads(mp_stage_gpu *gpu, mp_error *err) {
  MP_TRY(mp_device_memset(gpu->grads, 0, gpu->grads_floats * sizeof(float), err));
  if (!gpu->windowed) return MP_OK;
  MP_TRY(need_part(gpu, err));
  return mp_device_memset(gpu->grad_part, 0, gpu->moments_count * sizeof(float), err);
}

void mp_stage_gpu_scale_grads(mp_stage_gpu *gpu, float scale) {
  if (gpu->windowed && gpu->grad_part != NULL) {
    mp_grad_scale_cuda(gpu->grad_part, gpu->moments_count, scale, NULL);
  } else {
    mp_grad_scale_cuda(gpu->grads, gpu->num_params, scale, NULL);
  }
}

float *mp_stage_gpu_tensor_grad(mp_stage_gpu *gpu, int index) {
  size_t offset = 0;
  return mp_stage_layout_grad_offset(gpu->layout, index, gpu->window_kind,
                                     &offset)
             ? gpu->grads + offset
             : NULL;
}

size_t mp_stage_gpu_grads_floats(const mp_stage_gpu *gpu) { return gpu->grads_floats; }

float *mp_stage_gpu_grad_part(mp_stage_gpu *gpu) {
  return gpu->windowed ? gpu->grad_part : NULL;
}

mp_status mp_stage_gpu_add_to_part(mp_stage_gpu *gpu, const float *sums, size_t first,
                                       size_t count, mp_cuda_stream stream, mp_error *err) {
  MP_TRY(gpu->windowed ? need_part(gpu, err) : MP_OK);
  if (!gpu->windowed || first < gpu->moments_first ||
      first + count > gpu->moments_first + gpu->moments_count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gradient sums of elements [%zu, %zu) are not in the stage's ZeRO-2 part "
                   "[%zu, %zu)",
                   first, first + count, gpu->moments_first,
                   gpu->moments_first + (gpu->windowed ? gpu->moments_count : 0));
  }
  if (count > 0) {
    mp_add_f32_cuda(gpu->grad_part + (first - gpu->moments_first), sums, count, stream);
  }
  return MP_OK;
}

mp_status mp_stage_gpu_part_squares(mp_stage_gpu *gpu, double *squares, mp_error *err) {
  MP_TRY(gpu->windowed ? need_part(gpu, err)
                       : mp_fail(err, MP_ERR_INPUT, "the GPU stage keeps no ZeRO-2 part"));
  const size_t first = gpu->moments_first, end = first + gpu->moments_count;
  for (int i = 0; i < mp_stage_layout_num_tensors(gpu->layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpu->layout, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    squares[i] = 0.0;
    if (lo >= hi) continue;
    MP_TRY(mp_grad_norm_squared_cuda(gpu->grad_part + (lo - first), hi - lo, gpu->norm_scratch,
                                     &squares[i], NULL, err));
  }
  return MP_OK;
}

mp_status mp_stage_gpu_finish_grads(mp_stage_gpu *gpu, mp_error *err) {
  return mp_stage_chain_finish_grads(gpu->chain, err);
}

mp_status mp_stage_gpu_forward(mp_stage_gpu *gpu, int slot, const int32_t *inputs,
                                   const int32_t *targets, const float *input, float *output,
                                   float dloss, double *loss, mp_error *err) {
  return mp_stage_chain_forward(gpu->chain, slot, inputs, targets, input, output, dloss, loss,
                                err);
}

void mp_stage_gpu_discard(mp_stage_gpu *gpu, int slot) {
  mp_stage_chain_discard(gpu->chain, slot);
}

mp_status mp_stage_gpu_backward(mp_stage_gpu *gpu, int slot, const float *doutput,
                                    float *dinput, bool defer_weights, mp_error *err) {
  return mp_stage_chain_backward(gpu->chain, slot, doutput, dinput, defer_weights, err);
}

mp_status mp_stage_gpu_backward_weights(mp_stage_gpu *gpu, int slot, mp_error *err) {
  return mp_stage_chain_backward_weights(gpu->chain, slot, err);
}

mp_status mp_stage_gpu_grad_norm_squared(mp_stage_gpu *gpu, double *out, mp_error *err) {
  MP_TRY(refuse_windowed(gpu, "the gradient norm", err));
  /* Each reduction waits for the GPU, so neighbouring tensors that count alike (replicated, or
   * sharded; at tp = 1 all of them) are reduced as one run, its sum booked on the run's first
   * tensor: mp_stage_norm_from_squares only adds them up by kind. */
  const int n = mp_stage_layout_num_tensors(gpu->layout);
  double *squares = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  mp_status status = MP_OK;
  for (int i = 0; i < n && status == MP_OK;) {
    const mp_stage_tensor *first = mp_stage_layout_tensor(gpu->layout, i);
    if (first->tied_copy) {
      ++i;
      continue;
    }
    const bool replicated = first->split == MP_TP_REPLICATED || gpu->tp.size == 1;
    int end = i + 1;
    size_t count = first->count;
    for (; end < n; ++end) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(gpu->layout, end);
      const bool same = t->split == MP_TP_REPLICATED || gpu->tp.size == 1;
      if (t->tied_copy || same != replicated || t->ep_size != first->ep_size ||
          t->offset != first->offset + count) {
        break; /* the experts' (ep) are counted apart: mp_stage_norm_from_squares leaves them out */
      }
      count += t->count;
    }
    status = mp_grad_norm_squared_cuda(gpu->grads + first->offset, count, gpu->norm_scratch,
                                       &squares[i], NULL, err);
    i = end;
  }
  if (status == MP_OK) status = mp_stage_norm_from_squares(gpu->layout, &gpu->host_tp, squares, out, err);
  free(squares);
  return status;
}

mp_status mp_stage_gpu_adamw(mp_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err) {
  MP_TRY(whole_moments(gpu, err));
  if (gpu->windowed) MP_TRY(need_part(gpu, err));
  /* Tensor by tensor (weight decay is a property of the tensor), over the elements whose
   * moments this rank keeps: all, or its ZeRO part (with ZeRO-2 the part's gradients). */
  const size_t first = gpu->moments_first, end = first + gpu->moments_count;
  for (int i = 0; i < mp_stage_layout_num_tensors(gpu->layout); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(gpu->layout, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    if (lo >= hi) continue;
    const float *grads = gpu->windowed ? gpu->grad_part + (lo - first) : gpu->grads + lo;
    size_t at = 0; /* where the stage keeps them (with ZeRO-3 not at their offsets) */
    if (!held_offset(gpu, lo, hi - lo, &at)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "AdamW on elements [%zu, %zu): the stage does not hold them (ZeRO-3 part)",
                     lo, hi);
    }
    mp_adamw_update_cuda(gpu->master + at, gpu->weights + at, grads,
                         gpu->adam_m + (lo - first), gpu->adam_v + (lo - first), hi - lo,
                         adamw->learning_rate, adamw->beta1, adamw->beta2, adamw->eps,
                         t->full->weight_decay ? adamw->weight_decay : 0.0f, adamw->step, NULL);
  }
  return mp_device_synchronize(err);
}
