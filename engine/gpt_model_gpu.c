/*
 * engine/gpt_model_gpu.c — the one-rank GPT on a GPU; see gpt_model_gpu.h.
 *
 * The whole model is one pipeline stage on a one-rank tensor-parallel group: the GPU stage
 * (engine/gpt_stage_gpu.h) with one activation slot, whose tp = 1 path makes exactly the kernel
 * calls of a one-GPU model, over a host stage (engine/gpt_model_tp.h) without slots, whose shard
 * layout at tp = 1 is the one-rank layout itself. One model code path on the GPU, whatever the
 * layout.
 */
#include "engine/gpt_model_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "engine/gpt_model_tp.h"
#include "engine/gpt_stage_gpu.h"
#include "layers/adamw.h"

struct mp_gpt_gpu {
  mp_tp_comm single;       /* the one-rank group, which the host stage keeps a copy of */
  mp_gpt_tp *host;         /* the parameters' and gradients' host arrays, no activations */
  mp_gpt_stage_gpu *stage; /* the model on the GPU */
};

mp_status mp_gpt_gpu_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt_gpu **out,
                            mp_error *err) {
  *out = NULL;
  if (mp_device_count() == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)");
  }
  mp_gpt_gpu *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  gpt->single = mp_tp_comm_single();
  mp_gpt_layout *layout = NULL;
  mp_status status = mp_gpt_layout_create(model, seq_len, &layout, err);
  if (status == MP_OK) {
    const mp_gpt_stage whole = mp_gpt_stage_whole(mp_gpt_layout_config(layout)->num_layers);
    status = mp_gpt_tp_create_stage(model, micro_batch, seq_len, &gpt->single, false, &whole, 0,
                                    false, MP_RECOMPUTE_NONE, NULL, &gpt->host, err);
  }
  mp_gpt_layout_free(layout);
  if (status == MP_OK) {
    status = mp_gpt_stage_gpu_create(gpt->host, NULL, micro_batch, seq_len, 1, false,
                                     MP_RECOMPUTE_NONE, false, &gpt->stage, err);
  }
  if (status != MP_OK) {
    mp_gpt_gpu_free(gpt);
    return status;
  }
  *out = gpt;
  return MP_OK;
}

void mp_gpt_gpu_free(mp_gpt_gpu *gpt) {
  if (gpt == NULL) return;
  mp_gpt_stage_gpu_free(gpt->stage);
  mp_gpt_tp_free(gpt->host);
  free(gpt);
}

const mp_gpt_layout *mp_gpt_gpu_layout(const mp_gpt_gpu *gpt) {
  return mp_gpt_tp_layout(gpt->host);
}

size_t mp_gpt_gpu_device_bytes(const mp_gpt_gpu *gpt) {
  return mp_gpt_stage_gpu_device_bytes(gpt->stage);
}

static size_t num_params(const mp_gpt_gpu *gpt) {
  return mp_gpt_layout_num_params(mp_gpt_tp_layout(gpt->host));
}

/* The one-rank stage's moments: all of its elements. */
static mp_status moments(mp_gpt_gpu *gpt, float **adam_m, float **adam_v, mp_error *err) {
  return mp_gpt_stage_gpu_moments_at(gpt->stage, 0, num_params(gpt), adam_m, adam_v, err);
}

mp_status mp_gpt_gpu_set_params(mp_gpt_gpu *gpt, const float *host_params, mp_error *err) {
  /* At tp = 1 the whole stage's shard layout is the one-rank layout. */
  MP_TRY(mp_gpt_tp_write_params(gpt->host, 0, num_params(gpt), host_params, err));
  float *adam_m = NULL, *adam_v = NULL;
  MP_TRY(moments(gpt, &adam_m, &adam_v, err));
  MP_TRY(mp_device_memset(adam_m, 0, num_params(gpt) * sizeof(float), err));
  MP_TRY(mp_device_memset(adam_v, 0, num_params(gpt) * sizeof(float), err));
  return mp_device_synchronize(err);
}

mp_status mp_gpt_gpu_get_params(mp_gpt_gpu *gpt, float *host_params, mp_error *err) {
  return mp_gpt_tp_read_params(gpt->host, 0, num_params(gpt), host_params, err);
}

mp_status mp_gpt_gpu_get_grads(mp_gpt_gpu *gpt, float *host_grads, mp_error *err) {
  MP_TRY(mp_gpt_stage_gpu_download_grads(gpt->stage, err));
  memcpy(host_grads, mp_gpt_tp_grads(gpt->host), num_params(gpt) * sizeof(float));
  return MP_OK;
}

mp_status mp_gpt_gpu_get_state(mp_gpt_gpu *gpt, float *host_params, float *adam_m, float *adam_v,
                               mp_error *err) {
  float *device_m = NULL, *device_v = NULL;
  MP_TRY(moments(gpt, &device_m, &device_v, err));
  const size_t bytes = num_params(gpt) * sizeof(float);
  MP_TRY(mp_device_copy_to_host(adam_m, device_m, bytes, err));
  MP_TRY(mp_device_copy_to_host(adam_v, device_v, bytes, err));
  return mp_gpt_gpu_get_params(gpt, host_params, err);
}

mp_status mp_gpt_gpu_set_state(mp_gpt_gpu *gpt, const float *host_params, const float *adam_m,
                               const float *adam_v, mp_error *err) {
  float *device_m = NULL, *device_v = NULL;
  MP_TRY(moments(gpt, &device_m, &device_v, err));
  const size_t bytes = num_params(gpt) * sizeof(float);
  MP_TRY(mp_device_copy_to_device(device_m, adam_m, bytes, err));
  MP_TRY(mp_device_copy_to_device(device_v, adam_v, bytes, err));
  MP_TRY(mp_gpt_tp_write_params(gpt->host, 0, num_params(gpt), host_params, err));
  return mp_device_synchronize(err);
}

float *mp_gpt_gpu_device_grads(mp_gpt_gpu *gpt) { return mp_gpt_stage_gpu_device_grads(gpt->stage); }

mp_status mp_gpt_gpu_scale_grads(mp_gpt_gpu *gpt, float scale, mp_error *err) {
  mp_gpt_stage_gpu_scale_grads(gpt->stage, scale);
  return mp_device_synchronize(err);
}

mp_status mp_gpt_gpu_zero_grads(mp_gpt_gpu *gpt, mp_error *err) {
  return mp_gpt_stage_gpu_zero_grads(gpt->stage, err);
}

mp_status mp_gpt_gpu_forward(mp_gpt_gpu *gpt, const int32_t *inputs, const int32_t *targets,
                             float dloss, double *loss, mp_error *err) {
  /* A forward whose backward did not run (evaluation) gives its slot up. */
  mp_gpt_stage_gpu_discard(gpt->stage, 0);
  return mp_gpt_stage_gpu_forward(gpt->stage, 0, inputs, targets, NULL, NULL, dloss, loss, err);
}

mp_status mp_gpt_gpu_backward(mp_gpt_gpu *gpt, mp_error *err) {
  return mp_gpt_stage_gpu_backward(gpt->stage, 0, NULL, NULL, false, err);
}

mp_status mp_gpt_gpu_optimizer_step(mp_gpt_gpu *gpt, const mp_gpu_adamw *adamw,
                                    double *grad_norm, mp_error *err) {
  double norm_squared = 0.0;
  MP_TRY(mp_gpt_stage_gpu_grad_norm_squared(gpt->stage, &norm_squared, err));
  *grad_norm = sqrt(norm_squared);
  const float scale = mp_clip_scale(*grad_norm, adamw->grad_clip);
  if (scale != 1.0f) mp_gpt_stage_gpu_scale_grads(gpt->stage, scale);
  return mp_gpt_stage_gpu_adamw(gpt->stage, adamw, err);
}
