/* engine/model/stage_cpu_state.c — the CPU stage's state table (engine/model/stage_state.h): thin
 * adapters from the table's untyped stage to stage_cpu.h's calls, and host memory. */
#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_cpu.h"

static void cpu_free(void *stage) { mp_stage_cpu_free(stage); }
static const mp_stage_layout *cpu_layout(const void *stage) { return mp_stage_cpu_layout(stage); }
static mp_stage_chain *cpu_chain(void *stage) { return mp_stage_cpu_chain(stage); }
static size_t cpu_device_bytes(const void *stage) {
  (void)stage;
  return 0;
}
static mp_status cpu_init_params(void *stage, uint64_t seed, mp_error *err) {
  return mp_stage_cpu_init_params(stage, seed, err);
}
static mp_status cpu_fill_params(void *stage, mp_stage_fill_fn fill, void *context,
                                 mp_error *err) {
  return mp_stage_cpu_fill_params(stage, fill, context, err);
}
static mp_status cpu_read_params(void *stage, size_t first, size_t count, float *dest,
                                 mp_error *err) {
  return mp_stage_cpu_read_params(stage, first, count, dest, err);
}
static mp_status cpu_write_params(void *stage, size_t first, size_t count, const float *src,
                                  mp_error *err) {
  return mp_stage_cpu_write_params(stage, first, count, src, err);
}
static float *cpu_params(void *stage) { return mp_stage_cpu_params(stage); }
static float *cpu_params_at(void *stage, size_t first, size_t count) {
  return mp_stage_cpu_params_at(stage, first, count);
}
/* The CPU's kernels read the fp32 parameters themselves. */
static void *cpu_weights_at(void *stage, size_t first, size_t count) {
  return mp_stage_cpu_params_at(stage, first, count);
}
static void cpu_refresh_weights(void *stage) { (void)stage; }
static float *cpu_grads(void *stage) { return mp_stage_cpu_grads(stage); }
static size_t cpu_grads_floats(const void *stage) { return mp_stage_cpu_grads_floats(stage); }
static float *cpu_tensor_grad(void *stage, int index) {
  return mp_stage_cpu_tensor_grad(stage, index);
}
static mp_status cpu_zero_grads(void *stage, mp_error *err) {
  (void)err;
  mp_stage_cpu_zero_grads(stage);
  return MP_OK;
}
static void cpu_scale_grads(void *stage, float scale) { mp_stage_cpu_scale_grads(stage, scale); }
static mp_status cpu_grad_norm_squared(void *stage, double *out, mp_error *err) {
  return mp_stage_cpu_grad_norm_squared(stage, out, err);
}
static mp_status cpu_keep_moments(void *stage, size_t first, size_t count, mp_error *err) {
  return mp_stage_cpu_keep_moments(stage, first, count, err);
}
static mp_status cpu_add_to_part(void *stage, const float *sums, size_t first, size_t count,
                                 mp_cuda_stream stream, mp_error *err) {
  (void)stream;
  return mp_stage_cpu_add_to_part(stage, sums, first, count, err);
}
static mp_status cpu_part_squares(void *stage, double *squares, mp_error *err) {
  return mp_stage_cpu_part_squares(stage, squares, err);
}
static float *cpu_grad_part(void *stage) { return mp_stage_cpu_grad_part(stage); }
static mp_status cpu_moments_at(void *stage, size_t first, size_t count, float **adam_m,
                                float **adam_v, mp_error *err) {
  return mp_stage_cpu_moments_at(stage, first, count, adam_m, adam_v, err);
}
static mp_status cpu_adamw(void *stage, const mp_stage_adamw *adamw, mp_error *err) {
  return mp_stage_cpu_adamw(stage, adamw, err);
}

static mp_status host_alloc(void **out, size_t bytes, mp_error *err) {
  *out = calloc(bytes > 0 ? bytes : 1, 1);
  return *out != NULL ? MP_OK : mp_fail(err, MP_ERR_RUNTIME, "out of memory (%zu bytes)", bytes);
}
static void host_release(void *pointer) { free(pointer); }
static mp_status host_copy(void *dest, const void *src, size_t bytes, mp_error *err) {
  (void)err;
  if (bytes > 0) memmove(dest, src, bytes);
  return MP_OK;
}
static mp_status host_clear(void *dest, size_t bytes, mp_error *err) {
  (void)err;
  if (bytes > 0) memset(dest, 0, bytes);
  return MP_OK;
}
static mp_status host_synchronize(mp_error *err) {
  (void)err;
  return MP_OK;
}

static const mp_stage_state_ops cpu_ops = {
    .backend = "cpu",
    .free = cpu_free,
    .layout = cpu_layout,
    .chain = cpu_chain,
    .device_bytes = cpu_device_bytes,
    .init_params = cpu_init_params,
    .fill_params = cpu_fill_params,
    .read_params = cpu_read_params,
    .write_params = cpu_write_params,
    .params = cpu_params,
    .params_at = cpu_params_at,
    .weights_at = cpu_weights_at,
    .weight_bytes = sizeof(float),
    .refresh_weights = cpu_refresh_weights,
    .grads = cpu_grads,
    .grads_floats = cpu_grads_floats,
    .tensor_grad = cpu_tensor_grad,
    .zero_grads = cpu_zero_grads,
    .scale_grads = cpu_scale_grads,
    .grad_norm_squared = cpu_grad_norm_squared,
    .keep_moments = cpu_keep_moments,
    .add_to_part = cpu_add_to_part,
    .grad_part = cpu_grad_part,
    .part_squares = cpu_part_squares,
    .moments_at = cpu_moments_at,
    .adamw = cpu_adamw,
    .alloc = host_alloc,
    .release = host_release,
    .copy = host_copy,
    .clear = host_clear,
    .to_host = host_copy,
    .from_host = host_copy,
    .synchronize = host_synchronize,
    .on_device = false,
};

const mp_stage_state_ops *mp_stage_cpu_state_ops(void) { return &cpu_ops; }
