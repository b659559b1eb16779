/* engine/train/trainer.c — the trainer's lifecycle and its step: creating it for a plan and
 * this rank's groups, one optimizer step (the batch, the stage worker's actions, the loss, the
 * gradient reductions and the update), evaluation, and what callers may ask of it. */
#include "engine/train/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "context_parallel/sequence_split.h"
#include "engine/comm/tp_comm_mpi.h"
#include "engine/model/stage_cpu.h"
#include "engine/model/stage_gpu.h"
#include "topology/cost_model.h"
#include "topology/layer_cost.h"

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
  const mp_cost_shape shape = {plan->micro_batch, plan->seq_len, 2, false, 1, 1}; /* FLOPs only */
  double flops = 0.0;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    mp_layer_cost cost;
    mp_layer_cost_compute(mp_model_layer(model, i), &shape, &cost);
    flops += cost.forward_flops + cost.backward_flops;
  }
  return flops * (double)plan->num_micro_batches * (double)plan->dp;
}

mp_status mp_trainer_check_layout(const mp_plan *plan, mp_backend backend, mp_error *err) {
  /* The GPU stage (engine/model/stage_gpu.h) runs every layout the CPU runs. */
  (void)backend;
  if (plan->recompute == MP_RECOMPUTE_FULL && strcmp(plan->schedule, "zb-h1") == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: recompute \"full\" cannot run schedule zb-h1: its weight pass needs the "
                   "activations that recomputing the next micro-batch overwrites; use recompute "
                   "\"selective\" or \"none\", or another schedule",
                   plan->source);
  }
  if (plan->zero_stage == 3 && strcmp(plan->schedule, "zb-h1") == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: parallel.zero_stage 3 gathers each block's parameters around its whole "
                   "backward, but schedule zb-h1 splits the backward and defers the weight "
                   "gradients; use 1f1b or interleaved-1f1b, or zero_stage 2",
                   plan->source);
  }
  if (mp_plan_ep(plan) > 1 && mp_plan_zero_shard(plan) < plan->dp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_shard_size: %d: hybrid sharding with expert parallelism "
                   "(ep %d) is not run yet: with ep, ZeRO shards over the expert-data-parallel "
                   "group; drop zero_shard_size, or use ep 1",
                   plan->source, plan->zero_shard_size, plan->ep);
  }
  if (backend == MP_BACKEND_CUDA && mp_plan_zero_shard(plan) < plan->dp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: parallel.zero_shard_size %d (hybrid sharding) runs on the CPU backend "
                   "only for now; drop it, or use --backend cpu",
                   plan->source, plan->zero_shard_size);
  }
  return MP_OK;
}

mp_status mp_trainer_create(const mp_plan *plan, const mp_model *model, mp_data_loader *data,
                            mp_backend backend, mp_trainer **out, mp_error *err) {
  return mp_trainer_create_parallel(plan, model, data, backend, NULL, out, err);
}

double mp_train_trace_now(const mp_trainer *trainer) {
  return trainer->options.trace != NULL ? mp_trace_now(trainer->options.trace) : 0.0;
}

static mp_status check_group(const mp_plan *plan, const char *name, mp_comm *comm, int wanted,
                             mp_error *err) {
  const int size = comm != NULL ? mp_comm_size(comm) : 1;
  if (size == wanted) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the plan has %s = %d but this process's %s group has %d rank%s; start it "
                 "with `mpengine run`, which launches dp x cp x pp x tp = %d ranks under mpirun",
                 plan->source, name, wanted, name, size, size == 1 ? "" : "s",
                 mp_plan_world_size(plan));
}

static double dp_observer_now(void *context) { return mp_train_trace_now(context); }

static void dp_observer_completed(void *context, size_t bytes, double posted_s, double end_s) {
  const mp_trainer *trainer = context;
  mp_trace_comm(trainer->options.trace, trainer->step, "all-reduce", "dp", -1, bytes, NULL,
                posted_s, end_s);
}

/* The backend's stage table, and the dp communicators on its buffers: over NCCL where the run
 * gave the dp group one (a GPU run), else over MPI, which stages GPU memory through the host
 * with a few all-reduces in flight at most. */
static mp_status create_dp_comms(mp_trainer *trainer, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_trainer_options *o = &trainer->options;
  const bool on_gpu = trainer->backend == MP_BACKEND_CUDA;
  trainer->state_ops = on_gpu ? mp_stage_gpu_state_ops() : mp_stage_cpu_state_ops();
  mp_nccl_comm *nccl = on_gpu ? o->nccl_dp : NULL;
  const mp_dp_comm_observer observer = {trainer, dp_observer_now, dp_observer_completed};
  const mp_dp_comm_observer *traced = o->trace != NULL ? &observer : NULL;
  const int in_flight = on_gpu ? MP_TRAINER_STAGED_IN_FLIGHT : 0;
  if (nccl != NULL) {
    MP_TRY(mp_dp_comm_over_nccl(nccl, traced, &trainer->dp_sync, err));
  } else if (o->dp != NULL && mp_plan_replicas(plan) > 1) {
    MP_TRY(mp_dp_comm_over_mpi(o->dp, on_gpu, in_flight, traced, &trainer->dp_sync, err));
  }
  if (o->ep != NULL && plan->zero_stage >= 2) {
    MP_TRY(mp_dp_comm_over_mpi(o->ep, on_gpu, 0, NULL, &trainer->zero_ep, err));
  }
  if (trainer->zero_comm == NULL) return MP_OK;
  /* HSDP's shard group runs on the CPU only (mp_trainer_check_layout): zero_comm is dp's there.
   * With expert parallelism ZeRO cuts over the expert-dp group, which has no NCCL communicator:
   * MPI, through the host. */
  return nccl != NULL && trainer->zero_comm == o->dp
             ? mp_dp_comm_over_nccl(nccl, NULL, &trainer->zero_dp, err)
                      : mp_dp_comm_over_mpi(trainer->zero_comm, on_gpu, 0, NULL,
                                            &trainer->zero_dp, err);
}

static mp_status create_parallel(mp_trainer *trainer, const mp_model *model, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  mp_trainer_options *o = &trainer->options;
  trainer->tp_table = o->tp != NULL ? *o->tp : mp_tp_comm_single();
  trainer->cp_table = o->cp != NULL ? mp_tp_comm_over_group(o->cp) : mp_tp_comm_single();
  trainer->ep_table = o->ep != NULL ? mp_ep_comm_over_group(o->ep) : mp_ep_comm_single();
  trainer->replica_rank = o->dp != NULL ? mp_comm_rank(o->dp) : 0;
  const int replicas = mp_plan_replicas(plan);
  const bool hybrid = mp_plan_zero_shard(plan) < plan->dp;
  trainer->zero_comm = hybrid ? o->zero_shard : replicas > 1 ? o->dp : NULL;
  /* Expert parallelism: ZeRO cuts the state over the expert-data-parallel group, whose members
   * hold the same experts and so the same flat arrays (engine/train/zero.c sums the other
   * tensors' gradient parts over the ep group too). */
  if (mp_plan_ep(plan) > 1) trainer->zero_comm = replicas > mp_plan_ep(plan) ? o->expert_dp : NULL;
  trainer->zero_size = trainer->zero_comm != NULL ? mp_comm_size(trainer->zero_comm) : 1;
  trainer->zero_rank = trainer->zero_comm != NULL ? mp_comm_rank(trainer->zero_comm) : 0;
  if (!hybrid) o->zero_replica = NULL;
  mp_schedule_kind kind;
  MP_TRY(mp_schedule_kind_parse(plan->schedule, &kind, err));
  mp_status status = mp_schedule_generate(kind, plan->pp, (int)plan->num_micro_batches,
                                          plan->virtual_stages, &trainer->schedule, err);
  if (status != MP_OK) {
    mp_error inner = *err;
    return mp_fail(err, status, "%s: schedule %s: %s", plan->source, plan->schedule,
                   inner.message);
  }
  MP_TRY(create_dp_comms(trainer, err));
  /* The layout (config, tensor table) every chunk is cut from. */
  MP_TRY(mp_train_create_chunks(trainer, model, err));
  trainer->layout = mp_stage_layout_model(trainer->layouts[0]);
  mp_stage_ops ops;
  mp_stage_p2p p2p;
  mp_stage_observer observer;
  mp_train_worker_callbacks(trainer, &ops, &p2p, &observer);
  const size_t boundary = mp_stage_layout_boundary_floats(trainer->layouts[0]);
  status = mp_stage_worker_create(&trainer->schedule, o->pp_rank, boundary, &ops, &p2p,
                                  o->trace != NULL ? &observer : NULL, &trainer->worker, err);
  if (status == MP_OK && o->dp != NULL && replicas > 1 && plan->zero_stage < 2) {
    mp_stage_worker_on_chunk_done(trainer->worker, mp_train_post_chunk_all_reduce);
  }
  /* Evaluation runs the same stages through the same worker code, forwards only (untraced: the
   * trace holds training steps). */
  if (status == MP_OK) {
    status = mp_schedule_generate_forward_only(kind, plan->pp, (int)plan->num_micro_batches,
                                               plan->virtual_stages, &trainer->eval_schedule,
                                               err);
  }
  if (status == MP_OK) {
    status = mp_stage_worker_create(&trainer->eval_schedule, o->pp_rank, boundary, &ops, &p2p,
                                    NULL, &trainer->eval_worker, err);
  }
  return status;
}

mp_status mp_trainer_create_parallel(const mp_plan *plan, const mp_model *model,
                                     mp_data_loader *data, mp_backend backend,
                                     const mp_trainer_options *options, mp_trainer **out,
                                     mp_error *err) {
  *out = NULL;
  mp_trainer_options o = MP_TRAINER_OPTIONS_INITIALIZER;
  if (options != NULL) o = *options;
  MP_TRY(mp_trainer_check_layout(plan, backend, err));
  const int tp_size = o.tp != NULL ? o.tp->size : 1;
  if (tp_size != plan->tp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the plan has tp = %d but this process's tensor-parallel group has %d "
                   "rank%s; start it with `mpengine run`, which launches dp x cp x pp x tp = %d "
                   "ranks under mpirun",
                   plan->source, plan->tp, tp_size, tp_size == 1 ? "" : "s",
                   mp_plan_world_size(plan));
  }
  MP_TRY(check_group(plan, "pp", o.pp, plan->pp, err));
  MP_TRY(check_group(plan, plan->cp > 1 ? "dp x cp" : "dp", o.dp, mp_plan_replicas(plan), err));
  MP_TRY(check_group(plan, "cp", o.cp, plan->cp > 1 ? plan->cp : 1, err));
  if (mp_plan_ep(plan) > 1) {
    MP_TRY(check_group(plan, "ep", o.ep, mp_plan_ep(plan), err));
    MP_TRY(check_group(plan, "expert-dp", o.expert_dp,
                       mp_plan_replicas(plan) / mp_plan_ep(plan), err));
  }
  MP_TRY(mp_cp_check(plan->seq_len, plan->cp > 1 ? plan->cp : 1, err));
  if (mp_plan_zero_shard(plan) < plan->dp) {
    const int shard = mp_plan_zero_shard(plan);
    MP_TRY(check_group(plan, "zero-shard", o.zero_shard, shard, err));
    MP_TRY(check_group(plan, "zero-replica", o.zero_replica, plan->dp / shard, err));
  }
  MP_TRY(mp_data_loader_check(data, plan->seq_len, err));
  mp_trainer *trainer = calloc(1, sizeof *trainer);
  if (trainer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the trainer");
  trainer->plan = plan;
  trainer->data = data;
  trainer->backend = backend;
  trainer->options = o;
  trainer->flops_per_step = step_flops(plan, model);
  const size_t rows = (size_t)(plan->num_micro_batches * plan->micro_batch);
  const int cp = plan->cp > 1 ? plan->cp : 1;
  trainer->local_seq_len = plan->seq_len / cp;
  trainer->inputs = calloc(rows * (size_t)trainer->local_seq_len, sizeof(int32_t));
  trainer->targets = calloc(rows * (size_t)trainer->local_seq_len, sizeof(int32_t));
  if (cp > 1) {
    trainer->whole_inputs = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
    trainer->whole_targets = calloc(rows * (size_t)plan->seq_len, sizeof(int32_t));
  }
  if (trainer->inputs == NULL || trainer->targets == NULL ||
      (cp > 1 && (trainer->whole_inputs == NULL || trainer->whole_targets == NULL))) {
    mp_trainer_free(trainer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the batch");
  }
  mp_status status;
  /* The one-rank model is the stage at dp = pp = tp = 1: every run, on either backend, takes
   * the same path (stage worker, schedule, chunk arrays). */
  status = create_parallel(trainer, model, err);
  if (status != MP_OK) {
    mp_trainer_free(trainer);
    return status;
  }
  *out = trainer;
  return MP_OK;
}

void mp_trainer_free(mp_trainer *trainer) {
  if (trainer == NULL) return;
  mp_error ignored = MP_ERROR_INITIALIZER;
  mp_train_wait_dp_all_reduces(trainer, &ignored);
  mp_dp_comm_free(trainer->dp_sync);
  mp_dp_comm_free(trainer->zero_dp);
  mp_dp_comm_free(trainer->zero_ep);
  mp_stage_worker_free(trainer->worker);
  mp_stage_worker_free(trainer->eval_worker);
  mp_schedule_free(&trainer->eval_schedule);
  for (int c = 0; trainer->stages != NULL && c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    if (chunk->stage != NULL) chunk->ops->free(chunk->stage);
  }
  free(trainer->stages);
  free(trainer->nccl_sends);
  free(trainer->layouts);
  free(trainer->chains);
  free(trainer->zero2_hooks);
  if (trainer->state_ops != NULL) {
    trainer->state_ops->release(trainer->scatter_out);
    trainer->state_ops->release(trainer->zero_gather);
  }
  free(trainer->scatter_counts);
  free(trainer->zero_first);
  free(trainer->zero_count);
  mp_schedule_free(&trainer->schedule);
  free(trainer->targets);
  free(trainer->inputs);
  free(trainer->whole_targets);
  free(trainer->whole_inputs);
  free(trainer);
}

mp_stage_cpu *mp_trainer_model_tp(mp_trainer *trainer) {
  const bool whole = trainer->plan->pp == 1 && trainer->plan->virtual_stages <= 1;
  return whole ? mp_trainer_chunk(trainer, 0) : NULL;
}

int mp_trainer_num_chunks(const mp_trainer *trainer) { return trainer->num_chunks; }

size_t mp_trainer_device_bytes(const mp_trainer *trainer) {
  size_t bytes = trainer->device_buffer_bytes;
  for (int c = 0; trainer->stages != NULL && c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    if (chunk->stage != NULL) bytes += chunk->ops->device_bytes(chunk->stage);
  }
  return bytes;
}

/* The CPU stage itself, for tests that compare it with a one-rank model: NULL on the GPU. */
mp_stage_cpu *mp_trainer_chunk(mp_trainer *trainer, int chunk) {
  if (chunk < 0 || chunk >= trainer->num_chunks) return NULL;
  const mp_stage_state *state = &trainer->stages[chunk];
  return state->ops == mp_stage_cpu_state_ops() ? state->stage : NULL;
}

const mp_stage_layout *mp_trainer_chunk_layout(const mp_trainer *trainer, int chunk) {
  return chunk >= 0 && chunk < trainer->num_chunks ? trainer->layouts[chunk] : NULL;
}

int mp_trainer_tp(const mp_trainer *trainer) { return trainer->plan->tp; }

void mp_trainer_effective_of(const mp_trainer *trainer, mp_trainer_effective *out) {
  memset(out, 0, sizeof *out);
  out->recompute = MP_RECOMPUTE_NONE;
  for (int c = 0; c < trainer->num_chunks; ++c) {
    const mp_stage_chain *chain = trainer->chains[c];
    int stage = 0;
    if (mp_stage_chain_gathers_weights(chain)) {
      stage = 3;
    } else if (mp_stage_chain_grad_window(chain) != MP_GRAD_WINDOW_NONE) {
      stage = 2;
    } else if (trainer->zero_count[c] < mp_stage_layout_num_params(trainer->layouts[c])) {
      stage = 1;
    }
    if (stage > out->zero_stage) out->zero_stage = stage;
    const mp_recompute recompute = mp_stage_chain_recompute(chain);
    if (recompute > out->recompute) out->recompute = recompute;
  }
  out->zero_ranks = out->zero_stage > 0 ? trainer->zero_size : 1;
  out->zero_replicas =
      out->zero_stage > 0 && trainer->options.zero_replica != NULL
          ? mp_comm_size(trainer->options.zero_replica)
          : 1;
}

const mp_param_layout *mp_trainer_layout(const mp_trainer *trainer) { return trainer->layout; }

/* This dp rank's rows of the global batch of `step` from data, for the stage worker's
 * micro-batches. */
static mp_status load_batch(mp_trainer *trainer, mp_data_loader *data, int64_t step,
                            mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const int64_t rows = plan->num_micro_batches * plan->micro_batch;
  const int64_t first_row = (int64_t)trainer->options.dp_rank * rows;
  const int cp = plan->cp > 1 ? plan->cp : 1;
  int32_t *inputs = cp > 1 ? trainer->whole_inputs : trainer->inputs;
  int32_t *targets = cp > 1 ? trainer->whole_targets : trainer->targets;
  MP_TRY(mp_data_loader_batch(data, plan->training.seed, plan->seq_len, plan->global_batch, step,
                              first_row, rows, inputs, targets, err));
  if (cp > 1) {
    /* This cp rank's two chunks of every row (context_parallel/sequence_split.h). */
    const int cp_rank = trainer->cp_table.rank;
    mp_cp_take_local(trainer->inputs, inputs, rows, plan->seq_len, cp, cp_rank);
    mp_cp_take_local(trainer->targets, targets, rows, plan->seq_len, cp, cp_rank);
  }
  return MP_OK;
}

/* The step's loss on every rank: the last stage's mean over its micro-batches, broadcast over
 * pp, averaged over the dp x cp replicas (each cp rank's mean is over as many tokens). */
static mp_status parallel_step_loss(mp_trainer *trainer, double *loss, mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_trainer_options *o = &trainer->options;
  double value = trainer->loss_sum / (double)plan->num_micro_batches;
  if (o->pp != NULL) {
    MP_TRY(mp_comm_broadcast(o->pp, &value, sizeof value, mp_comm_size(o->pp) - 1, err));
  }
  const int replicas = mp_plan_replicas(plan);
  if (o->dp != NULL && replicas > 1) {
    MP_TRY(mp_train_sum_double_over(o->dp, &value, err));
    value /= (double)replicas;
  }
  *loss = value;
  return MP_OK;
}

mp_status mp_trainer_evaluate(mp_trainer *trainer, mp_data_loader *data, int64_t batch,
                              double *loss, mp_error *err) {
  if (data == NULL) data = trainer->data;
  MP_TRY(mp_data_loader_check(data, trainer->plan->seq_len, err));
  MP_TRY(load_batch(trainer, data, batch, err));
  trainer->loss_sum = 0.0;
  trainer->evaluating = true;
  const mp_status status = mp_stage_worker_run(trainer->eval_worker, err);
  trainer->evaluating = false;
  MP_TRY(status);
  return parallel_step_loss(trainer, loss, err);
}


mp_status mp_trainer_step(mp_trainer *trainer, int64_t step, mp_step_metrics *metrics,
                          mp_error *err) {
  const mp_plan *plan = trainer->plan;
  const mp_training_config *t = &plan->training;
  const double start = now_seconds();
  const double lr = mp_training_learning_rate(t, step);
  double loss = 0.0, grad_norm = 0.0;
  trainer->step = step;
  trainer->zero3_prefetch.window = NULL; /* the weights changed: no gather of the last step's */
  for (int c = 0; c < trainer->num_chunks; ++c) {
    const mp_stage_state *chunk = &trainer->stages[c];
    MP_TRY(chunk->ops->zero_grads(chunk->stage, err));
  }
  MP_TRY(load_batch(trainer, trainer->data, step, err));
  trainer->loss_sum = 0.0;
  MP_TRY(mp_stage_worker_run(trainer->worker, err));
  MP_TRY(parallel_step_loss(trainer, &loss, err));
  if (trainer->dp_sync != NULL && mp_plan_replicas(plan) == 1) {
    MP_TRY(mp_train_sum_grads_alone(trainer, err));
  }
  if (!isfinite(loss)) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "step %lld: the loss is %g; lower the learning rate (%g) or check the data",
                   (long long)step, loss, t->learning_rate);
  }
  MP_TRY(mp_train_reduce_step_grads(trainer, &grad_norm, err));
  MP_TRY(mp_train_optimizer_step(trainer, grad_norm, err));
  const double seconds = now_seconds() - start;
  if (trainer->options.trace != NULL) {
    const double end_s = mp_trace_now(trainer->options.trace);
    mp_trace_step(trainer->options.trace, step, end_s - seconds, end_s);
  }
  metrics->step = step;
  metrics->loss = loss;
  metrics->learning_rate = lr;
  metrics->grad_norm = grad_norm;
  metrics->seconds = seconds;
  metrics->tokens_per_s = (double)(plan->global_batch * plan->seq_len) / seconds;
  metrics->flops = trainer->flops_per_step;
  return MP_OK;
}
