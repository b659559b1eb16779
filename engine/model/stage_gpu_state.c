/* engine/model/stage_gpu_state.c — the GPU stage's state table (engine/model/stage_state.h): thin
 * adapters from the table's untyped stage to stage_gpu.h's calls, and device memory
 * (engine/device/device.h). Only public calls of those two headers: the table adds nothing a
 * build that loads the CUDA backend at run time would have to forward but this one getter. */
#include "engine/device/device.h"
#include "engine/model/stage_gpu.h"

static void gpu_free(void *stage) { mp_stage_gpu_free(stage); }
static const mp_stage_layout *gpu_layout(const void *stage) { return mp_stage_gpu_layout(stage); }
static mp_stage_chain *gpu_chain(void *stage) { return mp_stage_gpu_chain(stage); }
static size_t gpu_device_bytes(const void *stage) { return mp_stage_gpu_device_bytes(stage); }
static mp_status gpu_init_params(void *stage, uint64_t seed, mp_error *err) {
  return mp_stage_gpu_init_params(stage, seed, err);
}
static mp_status gpu_fill_params(void *stage, mp_stage_fill_fn fill, void *context,
                                 mp_error *err) {
  return mp_stage_gpu_fill_params(stage, fill, context, err);
}
static mp_status gpu_read_params(void *stage, size_t first, size_t count, float *dest,
                                 mp_error *err) {
  return mp_stage_gpu_read_params(stage, first, count, dest, err);
}
static mp_status gpu_write_params(void *stage, size_t first, size_t count, const float *src,
                                  mp_error *err) {
  return mp_stage_gpu_write_params(stage, first, count, src, err);
}
static float *gpu_params(void *stage) { return mp_stage_gpu_device_params(stage); }
static float *gpu_params_at(void *stage, size_t first, size_t count) {
  return mp_stage_gpu_params_at(stage, first, count);
}
static void *gpu_weights_at(void *stage, size_t first, size_t count) {
  return mp_stage_gpu_weights_at(stage, first, count);
}
static void gpu_refresh_weights(void *stage) { mp_stage_gpu_refresh_weights(stage); }
static float *gpu_grads(void *stage) { return mp_stage_gpu_device_grads(stage); }
static size_t gpu_grads_floats(const void *stage) { return mp_stage_gpu_grads_floats(stage); }
static float *gpu_tensor_grad(void *stage, int index) {
  return mp_stage_gpu_tensor_grad(stage, index);
}
static mp_status gpu_zero_grads(void *stage, mp_error *err) {
  return mp_stage_gpu_zero_grads(stage, err);
}
static void gpu_scale_grads(void *stage, float scale) { mp_stage_gpu_scale_grads(stage, scale); }
static mp_status gpu_grad_norm_squared(void *stage, double *out, mp_error *err) {
  return mp_stage_gpu_grad_norm_squared(stage, out, err);
}
static mp_status gpu_keep_moments(void *stage, size_t first, size_t count, mp_error *err) {
  return mp_stage_gpu_keep_moments(stage, first, count, err);
}
static mp_status gpu_add_to_part(void *stage, const float *sums, size_t first, size_t count,
                                 mp_cuda_stream stream, mp_error *err) {
  return mp_stage_gpu_add_to_part(stage, sums, first, count, stream, err);
}
static mp_status gpu_part_squares(void *stage, double *squares, mp_error *err) {
  return mp_stage_gpu_part_squares(stage, squares, err);
}
static float *gpu_grad_part(void *stage) { return mp_stage_gpu_grad_part(stage); }
static mp_status gpu_moments_at(void *stage, size_t first, size_t count, float **adam_m,
                                float **adam_v, mp_error *err) {
  return mp_stage_gpu_moments_at(stage, first, count, adam_m, adam_v, err);
}
/* The device's AdamW takes the gradients as they are: the clip factor is a scaling pass first. */
static mp_status gpu_adamw(void *stage, const mp_stage_adamw *adamw, mp_error *err) {
  if (adamw->grad_scale != 1.0f) mp_stage_gpu_scale_grads(stage, adamw->grad_scale);
  const mp_gpu_adamw step = {adamw->learning_rate, adamw->beta1, adamw->beta2, adamw->eps,
                             adamw->weight_decay,  adamw->step,  0.0};
  return mp_stage_gpu_adamw(stage, &step, err);
}

static mp_status device_alloc(void **out, size_t bytes, mp_error *err) {
  return mp_device_alloc(out, bytes, err);
}
static mp_status device_copy(void *dest, const void *src, size_t bytes, mp_error *err) {
  return mp_device_copy_on_device(dest, src, bytes, err);
}
static mp_status device_clear(void *dest, size_t bytes, mp_error *err) {
  return mp_device_memset(dest, 0, bytes, err);
}
static mp_status device_from_host(void *dest, const void *host_src, size_t bytes, mp_error *err) {
  return mp_device_copy_to_device(dest, host_src, bytes, err);
}

static const mp_stage_state_ops gpu_ops = {
    .backend = "cuda",
    .free = gpu_free,
    .layout = gpu_layout,
    .chain = gpu_chain,
    .device_bytes = gpu_device_bytes,
    .init_params = gpu_init_params,
    .fill_params = gpu_fill_params,
    .read_params = gpu_read_params,
    .write_params = gpu_write_params,
    .params = gpu_params,
    .params_at = gpu_params_at,
    .weights_at = gpu_weights_at,
    .weight_bytes = sizeof(uint16_t), /* bf16 */
    .refresh_weights = gpu_refresh_weights,
    .grads = gpu_grads,
    .grads_floats = gpu_grads_floats,
    .tensor_grad = gpu_tensor_grad,
    .zero_grads = gpu_zero_grads,
    .scale_grads = gpu_scale_grads,
    .grad_norm_squared = gpu_grad_norm_squared,
    .keep_moments = gpu_keep_moments,
    .add_to_part = gpu_add_to_part,
    .grad_part = gpu_grad_part,
    .part_squares = gpu_part_squares,
    .moments_at = gpu_moments_at,
    .adamw = gpu_adamw,
    .alloc = device_alloc,
    .release = mp_device_free,
    .copy = device_copy,
    .clear = device_clear,
    .to_host = mp_device_copy_to_host,
    .from_host = device_from_host,
    .synchronize = mp_device_synchronize,
    .on_device = true,
};

const mp_stage_state_ops *mp_stage_gpu_state_ops(void) { return &gpu_ops; }
