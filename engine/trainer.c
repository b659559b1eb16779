/* engine/trainer.c — the optimizer step on one rank or one tensor-parallel group; see trainer.h. */
#include "engine/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gpt_model_gpu.h"
#include "layers/adamw.h"
#include "topology/layer_cost.h"

struct mp_trainer {
  const mp_plan *plan;
  mp_data_loader *data;
  mp_backend backend;
  mp_gpt *gpt;            /* CPU backend */
  mp_gpt_gpu *gpu;        /* CUDA backend */
  mp_gpt_tp *tp;          /* CPU backend with tp > 1: this rank's shard */
  const mp_gpt_layout *layout;
  double flops_per_step;  /* forward + backward over the global batch */
  float *adam_m, *adam_v; /* (num_params,) first and second moments, CPU backend (of the shard
                             with tp > 1) */
  int32_t *inputs;        /* (num_micro_batches * micro_batch, T) this step's rows */
  int32_t *targets;       /* same shape */
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *mp_backend_name(mp_backend backend) {
  return backend == MP_BACKEND_CUDA ? "cuda" : "cpu";
}

/* Megatron's FLOP count of one step: forward and backward of every layer, every micro-batch. */
static double step_flops(const mp_plan *plan, const mp_model *model) {
  const mp_cost_shape shape = {plan->micro_batch, plan->seq_len, 2};
  double flops = 0.0;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    mp_layer_cost cost;
    mp_layer_cost_compute(mp_model_layer(model, i), &shape, &cost);
    flops += cost.forward_flops + cost.backward_flops;
  }
  return flops * (double)plan->num_micro_batches * (double)plan->dp;
}

mp_status mp_trainer_check_layout(const mp_plan *plan, mp_error *err) {
  if (plan->dp != 1 || plan->pp != 1 || plan->tp < 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: dp x pp x tp = %d x %d x %d; this mpengine trains with tensor parallelism "
                   "only (dp = pp = 1, any tp). Data- and pipeline-parallel runs arrive with "
                   "issue 10",
                   plan->source, plan->dp, plan->pp, plan->tp);
  }
  return MP_OK;
}

mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err) {
  return mp_trainer_create_parallel(plan, model, data, backend, NULL, out, err);
}

mp_status mp_trainer_create_parallel(const mp_plan *plan, const mp_model *model,
                                     mp_data_loader *data, mp_backend backend,
                                     const mp_trainer_options *options, mp_trainer **out,
                                     mp_error *err) {
  *out = NULL;
  const mp_tp_comm *tp = options != NULL ? options->tp : NULL;
  MP_TRY(mp_trainer_check_layout(plan, err));
  if (plan->tp > 1 && backend != MP_BACKEND_CPU) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tp = %d: tensor parallelism runs on the CPU backend only for now; use "
                   "--backend cpu",
                   plan->source, plan->tp);
  }
  const int group = tp != NULL ? tp->size : 1;
  if (group != plan->tp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the plan has tp = %d but this process's tensor-parallel group has %d "
                   "rank%s; start it with `mpengine run`, which launches %d ranks under mpirun",
                   plan->source, plan->tp, group, group == 1 ? "" : "s", plan->tp);
  }
  MP_TRY(mp_data_loader_check(data, plan->seq_len, err));
  mp_trainer *trainer = calloc(1, sizeof *trainer);
  if (trainer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the trainer");
  trainer->plan = plan;
  trainer->data = data;
  trainer->backend = backend;
  trainer->flops_per_step = step_flops(plan, model);
  const size_t rows = (size_t)(plan->num_micro_batches * plan->micro_batch);
  trainer->inputs = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  trainer->targets = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  if (trainer->inputs == NULL || trainer->targets == NULL) {
    mp_trainer_free(trainer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the batch");
  }
  mp_status status;
  if (backend == MP_BACKEND_CUDA) {
    status = mp_gpt_gpu_create(model, (int)plan->micro_batch, (int)plan->seq_len, &trainer->gpu,
                               err);
    if (status != MP_OK) {
      mp_trainer_free(trainer);
      return status;
    }
    trainer->layout = mp_gpt_gpu_layout(trainer->gpu);
    const size_t n = mp_gpt_layout_num_params(trainer->layout);
    float *host = malloc(n * sizeof(float));
    if (host == NULL) {
      mp_trainer_free(trainer);
      return mp_fail(err, MP_ERR_RUNTIME, "out of host memory for %zu parameters", n);
    }
    mp_gpt_layout_init_params(trainer->layout, host, plan->training.seed);
    status = mp_gpt_gpu_set_params(trainer->gpu, host, err);
    free(host);
    if (status != MP_OK) {
      mp_trainer_free(trainer);
      return status;
    }
    *out = trainer;
    return MP_OK;
  }
  size_t n = 0;
  if (plan->tp > 1) {
    status = mp_gpt_tp_create(model, (int)plan->micro_batch, (int)plan->seq_len, tp,
                              plan->sequence_parallel, &trainer->tp, err);
    if (status == MP_OK) status = mp_gpt_tp_init_params(trainer->tp, plan->training.seed, err);
    if (status != MP_OK) {
      mp_trainer_free(trainer);
      return status;
    }
    trainer->layout = mp_gpt_tp_layout(trainer->tp);
    n = mp_gpt_tp_num_params(trainer->tp);
  } else {
    status =
        mp_gpt_create(model, (int)plan->micro_batch, (int)plan->seq_len, &trainer->gpt, err);
    if (status != MP_OK) {
      mp_trainer_free(trainer);
      return status;
    }
    trainer->layout = mp_gpt_get_layout(trainer->gpt);
    mp_gpt_init_params(trainer->gpt, plan->training.seed);
    n = mp_gpt_num_params(trainer->gpt);
  }
  trainer->adam_m = calloc(n, sizeof(float));
  trainer->adam_v = calloc(n, sizeof(float));
  if (trainer->adam_m == NULL || trainer->adam_v == NULL) {
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
  mp_gpt_gpu_free(trainer->gpu);
  mp_gpt_free(trainer->gpt);
  mp_gpt_tp_free(trainer->tp);
  free(trainer);
}

mp_gpt *mp_trainer_model(mp_trainer *trainer) { return trainer->gpt; }

mp_gpt_tp *mp_trainer_model_tp(mp_trainer *trainer) { return trainer->tp; }

int mp_trainer_tp(const mp_trainer *trainer) {
  return trainer->tp != NULL ? mp_gpt_tp_comm(trainer->tp)->size : 1;
}

const mp_gpt_layout *mp_trainer_layout(const mp_trainer *trainer) { return trainer->layout; }

mp_status mp_trainer_load_llmc(mp_trainer *trainer, const char *path, mp_error *err) {
  if (trainer->gpt != NULL) return mp_gpt_load_llmc(trainer->gpt, path, err);
  const size_t n = mp_gpt_layout_num_params(trainer->layout);
  float *host = malloc(n * sizeof(float));
  if (host == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  mp_status status = mp_gpt_layout_load_llmc(trainer->layout, host, path, err);
  if (status == MP_OK && trainer->tp != NULL) {
    status = mp_gpt_tp_set_full_params(trainer->tp, host, err);
  } else if (status == MP_OK) {
    status = mp_gpt_gpu_set_params(trainer->gpu, host, err);
  }
  free(host);
  return status;
}

mp_status mp_trainer_get_params(mp_trainer *trainer, float *host_params, mp_error *err) {
  if (trainer->gpt != NULL) {
    memcpy(host_params, mp_gpt_params(trainer->gpt),
           mp_gpt_num_params(trainer->gpt) * sizeof(float));
    return MP_OK;
  }
  if (trainer->tp != NULL) return mp_gpt_tp_gather_params(trainer->tp, host_params, err);
  return mp_gpt_gpu_get_params(trainer->gpu, host_params, err);
}

mp_status mp_trainer_cpu_state(mp_trainer *trainer, float **params, float **adam_m,
                               float **adam_v, size_t *count, mp_error *err) {
  if (trainer->gpt == NULL && trainer->tp == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "checkpoints of the CUDA backend are not implemented yet (its AdamW state "
                   "lives on the GPU); use --backend cpu");
  }
  *params = trainer->gpt != NULL ? mp_gpt_params(trainer->gpt) : mp_gpt_tp_params(trainer->tp);
  *count = trainer->gpt != NULL ? mp_gpt_num_params(trainer->gpt)
                                : mp_gpt_tp_num_params(trainer->tp);
  *adam_m = trainer->adam_m;
  *adam_v = trainer->adam_v;
  return MP_OK;
}

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
    const int32_t *inputs = trainer->inputs + (size_t)m * micro_tokens;
    const int32_t *targets = trainer->targets + (size_t)m * micro_tokens;
    if (trainer->gpu != NULL) {
      double loss = 0.0;
      MP_TRY(mp_gpt_gpu_forward(trainer->gpu, inputs, targets, dloss, &loss, err));
      if (train) MP_TRY(mp_gpt_gpu_backward(trainer->gpu, err));
      loss_sum += loss;
      continue;
    }
    if (trainer->tp != NULL) {
      double loss = 0.0;
      MP_TRY(mp_gpt_tp_forward(trainer->tp, inputs, targets, &loss, err));
      if (train) MP_TRY(mp_gpt_tp_backward(trainer->tp, dloss, err));
      loss_sum += loss;
      continue;
    }
    loss_sum += mp_gpt_forward(trainer->gpt, inputs, targets);
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
  const double lr = mp_training_learning_rate(t, step);
  double loss = 0.0, grad_norm = 0.0;
  if (trainer->gpu != NULL) {
    MP_TRY(mp_gpt_gpu_zero_grads(trainer->gpu, err));
  } else if (trainer->tp != NULL) {
    mp_gpt_tp_zero_grads(trainer->tp);
  } else {
    mp_gpt_zero_grads(trainer->gpt);
  }
  MP_TRY(run_micro_batches(trainer, trainer->data, step, true, &loss, err));
  if (!isfinite(loss)) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "step %lld: the loss is %g; lower the learning rate (%g) or check the data",
                   (long long)step, loss, t->learning_rate);
  }
  if (trainer->tp != NULL) {
    /* Sequence-parallel layernorm gradients are partial until summed, once per step. */
    mp_gpt_tp *gpt = trainer->tp;
    MP_TRY(mp_gpt_tp_finish_grads(gpt, err));
    double squares = 0.0;
    MP_TRY(mp_gpt_tp_grad_norm_squared(gpt, &squares, err));
    grad_norm = sqrt(squares);
    float *params = mp_gpt_tp_params(gpt);
    float *grads = mp_gpt_tp_grads(gpt);
    const float scale = mp_clip_scale(grad_norm, t->grad_clip);
    if (scale != 1.0f) mp_grad_scale_cpu(grads, mp_gpt_tp_num_params(gpt), scale);
    for (int i = 0; i < mp_gpt_tp_num_tensors(gpt); ++i) {
      const mp_gpt_tp_tensor *tensor = mp_gpt_tp_tensor_at(gpt, i);
      const size_t offset = tensor->offset;
      mp_adamw_update_cpu(params + offset, grads + offset, trainer->adam_m + offset,
                          trainer->adam_v + offset, tensor->count, (float)lr, (float)t->beta1,
                          (float)t->beta2, (float)t->eps,
                          tensor->full->weight_decay ? (float)t->weight_decay : 0.0f,
                          (int)(step + 1));
    }
  } else if (trainer->gpu != NULL) {
    const mp_gpu_adamw adamw = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->eps,
                                (float)t->weight_decay, (int)(step + 1), t->grad_clip};
    MP_TRY(mp_gpt_gpu_optimizer_step(trainer->gpu, &adamw, &grad_norm, err));
  } else {
    mp_gpt *gpt = trainer->gpt;
    float *params = mp_gpt_params(gpt);
    float *grads = mp_gpt_grads(gpt);
    const size_t n = mp_gpt_num_params(gpt);
    grad_norm = sqrt(mp_grad_norm_squared_cpu(grads, n));
    const float scale = mp_clip_scale(grad_norm, t->grad_clip);
    if (scale != 1.0f) mp_grad_scale_cpu(grads, n, scale);
    for (int i = 0; i < mp_gpt_num_tensors(gpt); ++i) {
      const mp_gpt_tensor *tensor = mp_gpt_tensor_at(gpt, i);
      const size_t offset = tensor->offset;
      mp_adamw_update_cpu(params + offset, grads + offset, trainer->adam_m + offset,
                          trainer->adam_v + offset, tensor->rows * tensor->cols, (float)lr,
                          (float)t->beta1, (float)t->beta2, (float)t->eps,
                          tensor->weight_decay ? (float)t->weight_decay : 0.0f, (int)(step + 1));
    }
  }
  const double seconds = now_seconds() - start;
  metrics->step = step;
  metrics->loss = loss;
  metrics->learning_rate = lr;
  metrics->grad_norm = grad_norm;
  metrics->seconds = seconds;
  metrics->tokens_per_s = (double)(plan->global_batch * plan->seq_len) / seconds;
  metrics->flops = trainer->flops_per_step;
  return MP_OK;
}
