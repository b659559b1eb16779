/* engine/gpt_model_gpu_none.c — gpt_model_gpu.h in a build without CUDA: create says so. */
#include "engine/gpt_model_gpu.h"

static mp_status no_cuda(mp_error *err) {
  return mp_fail(err, MP_ERR_INPUT,
                 "--backend cuda: this mpengine was built without CUDA (no /usr/local/cuda when "
                 "it was built); use --backend cpu, or rebuild on a machine with CUDA");
}

mp_status mp_gpt_gpu_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt_gpu **out,
                            mp_error *err) {
  (void)model, (void)micro_batch, (void)seq_len;
  *out = NULL;
  return no_cuda(err);
}
void mp_gpt_gpu_free(mp_gpt_gpu *gpt) { (void)gpt; }
const mp_gpt_layout *mp_gpt_gpu_layout(const mp_gpt_gpu *gpt) { (void)gpt; return NULL; }
size_t mp_gpt_gpu_device_bytes(const mp_gpt_gpu *gpt) { (void)gpt; return 0; }
mp_status mp_gpt_gpu_set_params(mp_gpt_gpu *gpt, const float *p, mp_error *err) {
  (void)gpt, (void)p;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_get_params(mp_gpt_gpu *gpt, float *p, mp_error *err) {
  (void)gpt, (void)p;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_get_state(mp_gpt_gpu *gpt, float *p, float *m, float *v, mp_error *err) {
  (void)gpt, (void)p, (void)m, (void)v;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_set_state(mp_gpt_gpu *gpt, const float *p, const float *m, const float *v,
                               mp_error *err) {
  (void)gpt, (void)p, (void)m, (void)v;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_get_grads(mp_gpt_gpu *gpt, float *g, mp_error *err) {
  (void)gpt, (void)g;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_zero_grads(mp_gpt_gpu *gpt, mp_error *err) { (void)gpt; return no_cuda(err); }
mp_status mp_gpt_gpu_forward(mp_gpt_gpu *gpt, const int32_t *inputs, const int32_t *targets,
                             float dloss, double *loss, mp_error *err) {
  (void)gpt, (void)inputs, (void)targets, (void)dloss;
  *loss = 0;
  return no_cuda(err);
}
mp_status mp_gpt_gpu_backward(mp_gpt_gpu *gpt, mp_error *err) { (void)gpt; return no_cuda(err); }
mp_status mp_gpt_gpu_optimizer_step(mp_gpt_gpu *gpt, const mp_gpu_adamw *adamw,
                                    double *grad_norm, mp_error *err) {
  (void)gpt, (void)adamw;
  *grad_norm = 0;
  return no_cuda(err);
}
float *mp_gpt_gpu_device_grads(mp_gpt_gpu *gpt) {
  (void)gpt;
  return NULL;
}
mp_status mp_gpt_gpu_scale_grads(mp_gpt_gpu *gpt, float scale, mp_error *err) {
  (void)gpt, (void)scale;
  return no_cuda(err);
}
