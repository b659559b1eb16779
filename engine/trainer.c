/* engine/trainer.c — the one-rank optimizer step; see trainer.h. */
#include "engine/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers/adamw.h"

struct mp_trainer {
  const mp_plan *plan;
  mp_data_loader *data;
  mp_gpt *gpt;
  float *adam_m, *adam_v; /* (num_params,) first and second moments */
  int32_t *inputs;        /* (num_micro_batches * micro_batch, T) this step's rows */
  int32_t *targets;       /* same shape */
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_trainer **out, mp_error *err) {
  *out = NULL;
  if (plan->dp != 1 || plan->pp != 1 || plan->tp != 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: dp x pp x tp = %d x %d x %d; this mpengine trains on one rank only "
                   "(dp = pp = tp = 1). 3D-parallel runs arrive with issue 10",
                   plan->source, plan->dp, plan->pp, plan->tp);
  }
  MP_TRY(mp_data_loader_check(data, plan->seq_len, err));
  mp_trainer *trainer = calloc(1, sizeof *trainer);
  if (trainer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the trainer");
  trainer->plan = plan;
  trainer->data = data;
  mp_status status = mp_gpt_create(model, (int)plan->micro_batch, (int)plan->seq_len,
                                   &trainer->gpt, err);
  if (status != MP_OK) {
    mp_trainer_free(trainer);
    return status;
  }
  mp_gpt_init_params(trainer->gpt, plan->training.seed);
  const size_t n = mp_gpt_num_params(trainer->gpt);
  const size_t rows = (size_t)(plan->num_micro_batches * plan->micro_batch);
  trainer->adam_m = calloc(n, sizeof(float));
  trainer->adam_v = calloc(n, sizeof(float));
  trainer->inputs = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  trainer->targets = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  if (trainer->adam_m == NULL || trainer->adam_v == NULL || trainer->inputs == NULL ||
      trainer->targets == NULL) {
    mp_trainer_free(trainer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for optimizer state (%zu parameters)", n);
  }
  *out = trainer;
  return MP_OK;
}

void mp_trainer_free(mp_trainer *trainer) {
  if (trainer == NULL) return;
  free(trainer->targets);
  free(trainer->inputs);
  free(trainer->adam_v);
  free(trainer->adam_m);
  mp_gpt_free(trainer->gpt);
  free(trainer);
}

mp_gpt *mp_trainer_model(mp_trainer *trainer) { return trainer->gpt; }

/* Forward (and backward when `train`) over every micro-batch of the step; returns the mean loss. */
static mp_status run_micro_batches(mp_trainer *trainer, mp_data_loader *data, int64_t step,
                                   bool train, double *loss, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const int64_t rows = plan->num_micro_batches * plan->micro_batch;
  MP_TRY(mp_data_loader_batch(data, plan->training.seed, plan->seq_len,
                              plan->global_batch, step, 0, rows, trainer->inputs,
                              trainer->targets, err));
  const size_t micro_tokens = (size_t)(plan->micro_batch * plan->seq_len);
  const float dloss = 1.0f / (float)plan->num_micro_batches;
  double loss_sum = 0.0;
  for (int64_t m = 0; m < plan->num_micro_batches; ++m) {
    loss_sum += mp_gpt_forward(trainer->gpt, trainer->inputs + (size_t)m * micro_tokens,
                               trainer->targets + (size_t)m * micro_tokens);
    if (train) mp_gpt_backward(trainer->gpt, dloss);
  }
  *loss = loss_sum / (double)plan->num_micro_batches;
  return MP_OK;
}

mp_status mp_trainer_evaluate(mp_trainer *trainer, mp_data_loader *data, int64_t step,
                              double *loss, mp_error *err) {
  if (data == NULL) data = trainer->data;
  MP_TRY(mp_data_loader_check(data, trainer->plan->seq_len, err));
  return run_micro_batches(trainer, data, step, false, loss, err);
}

mp_status mp_trainer_step(mp_trainer *trainer, int64_t step, mp_step_metrics *metrics,
                          mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_training_config *t = &plan->training;
  const double start = now_seconds();
  mp_gpt *gpt = trainer->gpt;
  mp_gpt_zero_grads(gpt);
  double loss = 0.0;
  MP_TRY(run_micro_batches(trainer, trainer->data, step, true, &loss, err));
  if (!isfinite(loss)) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "step %lld: the loss is %g; lower the learning rate (%g) or check the data",
                   (long long)step, loss, t->learning_rate);
  }
  float *params = mp_gpt_params(gpt);
  float *grads = mp_gpt_grads(gpt);
  const size_t n = mp_gpt_num_params(gpt);
  const double grad_norm = sqrt(mp_grad_norm_squared_cpu(grads, n));
  const float scale = mp_clip_scale(grad_norm, t->grad_clip);
  if (scale != 1.0f) mp_grad_scale_cpu(grads, n, scale);
  const double lr = mp_training_learning_rate(t, step);
  for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
    const mp_gpt_tensor *tensor = mp_gpt_tensor_at(gpt, i);
    const size_t offset = tensor->offset;
    mp_adamw_update_cpu(params + offset, grads + offset, trainer->adam_m + offset,
                        trainer->adam_v + offset, tensor->rows * tensor->cols, (float)lr,
                        (float)t->beta1, (float)t->beta2, (float)t->eps,
                        tensor->weight_decay ? (float)t->weight_decay : 0.0f, (int)(step + 1));
  }
  const double seconds = now_seconds() - start;
  metrics->step = step;
  metrics->loss = loss;
  metrics->learning_rate = lr;
  metrics->grad_norm = grad_norm;
  metrics->seconds = seconds;
  metrics->tokens_per_s = (double)(plan->global_batch * plan->seq_len) / seconds;
  return MP_OK;
}
