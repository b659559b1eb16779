/* engine/model/stage_gpu_none.c — stage_gpu.h in a build without CUDA: create says so. */
#include "engine/model/stage_gpu.h"

mp_status mp_stage_gpu_create(const mp_model *model, const mp_stage_gpu_config *config,
                              mp_stage_gpu **out, mp_error *err) {
  (void)model, (void)config;
  *out = NULL;
  return mp_fail(err, MP_ERR_INPUT,
                 "--backend cuda: this mpengine was built without CUDA (no /usr/local/cuda when "
                 "it was built); use --backend cpu, or rebuild on a machine with CUDA");
}

/* Nothing below is reachable without a stage, which create never returns here. */
void mp_stage_gpu_free(mp_stage_gpu *gpu) { (void)gpu; }
size_t mp_stage_gpu_device_bytes(const mp_stage_gpu *gpu) { (void)gpu; return 0; }
mp_stage_chain *mp_stage_gpu_chain(mp_stage_gpu *gpu) { (void)gpu; return NULL; }
static mp_status unreachable(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "built without CUDA: no GPU stage exists");
}
mp_status mp_stage_gpu_moments_at(mp_stage_gpu *gpu, size_t first, size_t count,
                                      float **adam_m, float **adam_v, mp_error *err) {
  (void)gpu, (void)first, (void)count, (void)adam_m, (void)adam_v;
  return unreachable(err);
}
mp_status mp_stage_gpu_download_grads(mp_stage_gpu *gpu, float *dest, mp_error *err) {
  (void)gpu, (void)dest;
  return unreachable(err);
}
const mp_stage_layout *mp_stage_gpu_layout(const mp_stage_gpu *gpu) { (void)gpu; return NULL; }
mp_status mp_stage_gpu_read_params(mp_stage_gpu *gpu, size_t first, size_t count, float *dest,
                                   mp_error *err) {
  (void)gpu, (void)first, (void)count, (void)dest;
  return unreachable(err);
}
mp_status mp_stage_gpu_write_params(mp_stage_gpu *gpu, size_t first, size_t count,
                                    const float *src, mp_error *err) {
  (void)gpu, (void)first, (void)count, (void)src;
  return unreachable(err);
}
mp_status mp_stage_gpu_fill_params(mp_stage_gpu *gpu, mp_stage_fill_fn fill, void *context,
                                   mp_error *err) {
  (void)gpu, (void)fill, (void)context;
  return unreachable(err);
}
mp_status mp_stage_gpu_init_params(mp_stage_gpu *gpu, uint64_t seed, mp_error *err) {
  (void)gpu, (void)seed;
  return unreachable(err);
}
float *mp_stage_gpu_device_grads(mp_stage_gpu *gpu) { (void)gpu; return NULL; }
float *mp_stage_gpu_tensor_grad(mp_stage_gpu *gpu, int index) {
  (void)gpu, (void)index;
  return NULL;
}
size_t mp_stage_gpu_grads_floats(const mp_stage_gpu *gpu) { (void)gpu; return 0; }
mp_status mp_stage_gpu_add_to_part(mp_stage_gpu *gpu, const float *sums, size_t first,
                                       size_t count, mp_cuda_stream stream, mp_error *err) {
  (void)gpu, (void)sums, (void)first, (void)count, (void)stream;
  return unreachable(err);
}
float *mp_stage_gpu_params_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  (void)gpu, (void)first, (void)count;
  return NULL;
}
void *mp_stage_gpu_weights_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  (void)gpu, (void)first, (void)count;
  return NULL;
}
mp_status mp_stage_gpu_part_squares(mp_stage_gpu *gpu, double *squares, mp_error *err) {
  (void)gpu, (void)squares;
  return unreachable(err);
}
float *mp_stage_gpu_grad_part(mp_stage_gpu *gpu) {
  (void)gpu;
  return NULL;
}
mp_status mp_stage_gpu_zero_grads(mp_stage_gpu *gpu, mp_error *err) {
  (void)gpu;
  return unreachable(err);
}
void mp_stage_gpu_scale_grads(mp_stage_gpu *gpu, float scale) { (void)gpu, (void)scale; }
mp_status mp_stage_gpu_finish_grads(mp_stage_gpu *gpu, mp_error *err) {
  (void)gpu;
  return unreachable(err);
}
mp_status mp_stage_gpu_forward(mp_stage_gpu *gpu, int slot, const int32_t *inputs,
                                   const int32_t *targets, const float *input, float *output,
                                   float dloss, double *loss, mp_error *err) {
  (void)gpu, (void)slot, (void)inputs, (void)targets, (void)input, (void)output, (void)dloss;
  (void)loss;
  return unreachable(err);
}
mp_status mp_stage_gpu_keep_moments(mp_stage_gpu *gpu, size_t first, size_t count,
                                        mp_error *err) {
  (void)gpu, (void)first, (void)count;
  return unreachable(err);
}
float *mp_stage_gpu_device_params(mp_stage_gpu *gpu) { (void)gpu; return NULL; }
void mp_stage_gpu_refresh_weights(mp_stage_gpu *gpu) { (void)gpu; }
void mp_stage_gpu_discard(mp_stage_gpu *gpu, int slot) { (void)gpu, (void)slot; }
mp_status mp_stage_gpu_backward(mp_stage_gpu *gpu, int slot, const float *doutput,
                                    float *dinput, bool defer_weights, mp_error *err) {
  (void)gpu, (void)slot, (void)doutput, (void)dinput, (void)defer_weights;
  return unreachable(err);
}
mp_status mp_stage_gpu_backward_weights(mp_stage_gpu *gpu, int slot, mp_error *err) {
  (void)gpu, (void)slot;
  return unreachable(err);
}
mp_status mp_stage_gpu_grad_norm_squared(mp_stage_gpu *gpu, double *out, mp_error *err) {
  (void)gpu, (void)out;
  return unreachable(err);
}
mp_status mp_stage_gpu_adamw(mp_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err) {
  (void)gpu, (void)adamw;
  return unreachable(err);
}
