/* tests/support/one_rank_model.c — the one-rank model over the whole-model CPU stage; see the
 * header. */
#include "tests/support/one_rank_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/stage_cpu.h"
#include "engine/weights/llmc_file.h"

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

const mp_param_layout *mp_gpt_get_layout(const mp_gpt *gpt) {
  return mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage));
}
const mp_model_config *mp_gpt_get_config(const mp_gpt *gpt) {
  return mp_param_layout_config(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)));
}
size_t mp_gpt_num_params(const mp_gpt *gpt) {
  return mp_stage_layout_num_params(mp_stage_cpu_layout(gpt->stage));
}
float *mp_gpt_params(mp_gpt *gpt) { return mp_stage_cpu_params(gpt->stage); }
float *mp_gpt_grads(mp_gpt *gpt) { return mp_stage_cpu_grads(gpt->stage); }
int mp_gpt_num_tensors(const mp_gpt *gpt) {
  return mp_param_layout_num_tensors(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)));
}

const mp_param_tensor *mp_gpt_tensor_at(const mp_gpt *gpt, int index) {
  return mp_param_layout_tensor(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)), index);
}

const mp_param_tensor *mp_gpt_find_tensor(const mp_gpt *gpt, const char *name) {
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_param_tensor *t = mp_gpt_tensor_at(gpt, i);
    if (strcmp(t->name, name) == 0) return t;
  }
  return NULL;
}

void mp_gpt_init_params(mp_gpt *gpt, uint64_t seed) {
  mp_param_layout_init_params(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)), mp_stage_cpu_params(gpt->stage), seed);
}

void mp_gpt_zero_grads(mp_gpt *gpt) { mp_stage_cpu_zero_grads(gpt->stage); }

double mp_gpt_grad_norm(mp_gpt *gpt) {
  mp_error err = MP_ERROR_INITIALIZER;
  double squares = 0.0;
  return mp_stage_cpu_grad_norm_squared(gpt->stage, &squares, &err) == MP_OK ? sqrt(squares)
                                                                                : NAN;
}

mp_status mp_gpt_adamw(mp_gpt *gpt, const mp_stage_adamw *settings, mp_error *err) {
  return mp_stage_cpu_adamw(gpt->stage, settings, err);
}

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
  return mp_llmc_load(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)), mp_stage_cpu_params(gpt->stage),
                                   path, err);
}

mp_status mp_gpt_save_llmc(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_llmc_save(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)), mp_stage_cpu_params(gpt->stage),
                                   path, err);
}

mp_status mp_gpt_save_llmc_gradients(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_llmc_save(mp_stage_layout_model(mp_stage_cpu_layout(gpt->stage)), mp_stage_cpu_grads(gpt->stage),
                                   path, err);
}
