/* engine/train/pipeline_p2p.c — pipeline parallelism for the stage worker: the chunks' forward
 * and backward actions, and point-to-point messages between pipeline ranks over MPI or NCCL
 * (sends batched with the next receive), traced. */
#include "engine/train/trainer_internal.h"

#include <stdlib.h>

#include "engine/model/stage_chain.h"

static const int32_t *micro_batch_rows(const mp_trainer *trainer, const int32_t *rows,
                                       int micro_batch) {
  const size_t tokens = (size_t)trainer->plan->micro_batch * (size_t)trainer->local_seq_len;
  return rows + (size_t)micro_batch * tokens;
}

static mp_status chunk_forward(void *context, int chunk, int micro_batch, int slot,
                               const float *input, float *output, mp_error *err) {
  mp_trainer *trainer = context;
  double loss = 0.0;
  const int32_t *inputs = micro_batch_rows(trainer, trainer->inputs, micro_batch);
  const int32_t *targets = micro_batch_rows(trainer, trainer->targets, micro_batch);
  /* The loss gradient is formed at forward time. */
  const float dloss = 1.0f / (float)trainer->plan->num_micro_batches;
  MP_TRY(mp_stage_chain_forward(trainer->chains[chunk], slot, inputs, targets, input, output,
                                dloss, &loss, err));
  if (mp_stage_layout_span(trainer->layouts[chunk])->head)
    trainer->loss_sum += loss;
  return MP_OK;
}

/* A forward-only schedule's F is done with its slot: no backward will read it. */
static void chunk_release(void *context, int chunk, int micro_batch, int slot) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain_discard(trainer->chains[chunk], slot);
}

/* A chunk's gradients complete inside its last gradient action of the step (the worker knows
 * which: a whole backward, or with zb-h1 a W). With device gradients and dp > 1 the blocks'
 * all-reduces are posted there as they finish (mp_train_block_grads_ready;
 * mp_train_post_chunk_all_reduce posts the rest): the GPU computes while the host posts. A CPU
 * rank's all-reduce runs on the cores that compute, so it posts the chunk at once, and no more
 * than one copy of its gradients is in flight. With expert parallelism the chunk is posted at
 * once too (its experts go over expert-dp, not dp: mp_train_post_chunk_all_reduce). */
static bool overlap_dp(mp_trainer *trainer, int chunk) {
  return trainer->state_ops->on_device && trainer->options.dp != NULL &&
         mp_plan_replicas(trainer->plan) > 1 && trainer->ep_table.size <= 1 &&
         !trainer->zero2 && mp_stage_worker_completes_chunk(trainer->worker, chunk);
}

static mp_status chunk_backward(void *context, int chunk, int micro_batch, int slot,
                                const float *doutput, float *dinput, bool defer_weights,
                                mp_error *err) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain *chain = trainer->chains[chunk];
  const bool overlap = overlap_dp(trainer, chunk);
  if (overlap) mp_stage_chain_set_grads_hook(chain, mp_train_block_grads_ready, trainer);
  const mp_status status =
      mp_stage_chain_backward(chain, slot, doutput, dinput, defer_weights, err);
  if (overlap) mp_stage_chain_set_grads_hook(chain, NULL, NULL);
  return status;
}

static mp_status chunk_backward_weights(void *context, int chunk, int micro_batch, int slot,
                                        mp_error *err) {
  (void)micro_batch;
  mp_trainer *trainer = context;
  mp_stage_chain *chain = trainer->chains[chunk];
  const bool overlap = overlap_dp(trainer, chunk);
  if (overlap) mp_stage_chain_set_grads_hook(chain, mp_train_block_grads_ready, trainer);
  const mp_status status = mp_stage_chain_backward_weights(chain, slot, err);
  if (overlap) mp_stage_chain_set_grads_hook(chain, NULL, NULL);
  return status;
}

/* A posted send and when it was posted (for the trace). */
typedef struct {
  mp_comm_request *request;
  mp_message message;
  int peer;
  size_t bytes;
  double posted_s;
} posted_send;

/* NCCL pipeline: sends wait for this rank's next receive (or the step's end), and go with it in
 * one group: NCCL's send blocks until the peer receives, so a send enqueued alone could wait on a
 * peer that waits on our receive; in one group none waits for another (engine/comm/comm_nccl.h). No
 * deadlock: a rank blocks only in a flush, which holds every send it has pending, and messages
 * between two ranks are matched in order (as over MPI), so whatever a blocked rank waits for is
 * either posted or in the future of a rank that is not blocked. */
static mp_status nccl_pp_pend(mp_trainer *trainer, const mp_nccl_p2p_op *op, mp_error *err) {
  if (trainer->num_nccl_sends == trainer->nccl_send_capacity) {
    const int capacity = trainer->nccl_send_capacity > 0 ? 2 * trainer->nccl_send_capacity : 8;
    mp_nccl_p2p_op *grown =
        realloc(trainer->nccl_sends, (size_t)capacity * sizeof *trainer->nccl_sends);
    if (grown == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    trainer->nccl_sends = grown;
    trainer->nccl_send_capacity = capacity;
  }
  trainer->nccl_sends[trainer->num_nccl_sends++] = *op;
  return MP_OK;
}

/* Enqueues the pending operations in one group, after the compute that wrote the sends' buffers,
 * and waits for them (under NCCL's watchdog). */
static mp_status nccl_pp_flush(mp_trainer *trainer, mp_error *err) {
  mp_nccl_comm *comm = trainer->options.nccl_pp;
  const int count = trainer->num_nccl_sends;
  trainer->num_nccl_sends = 0;
  if (count == 0) return MP_OK;
  MP_TRY(mp_nccl_comm_wait_stream(comm, NULL, err));
  MP_TRY(mp_nccl_p2p(comm, trainer->nccl_sends, count, err));
  return mp_nccl_comm_synchronize(comm, err);
}

static mp_status pp_post_send(void *context, const float *buffer, size_t count, int peer,
                              const mp_message *message, void **request, mp_error *err) {
  mp_trainer *trainer = context;
  posted_send *send = malloc(sizeof *send);
  if (send == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  send->message = *message;
  send->peer = peer;
  send->bytes = count * sizeof(float);
  send->posted_s = mp_train_trace_now(trainer);
  send->request = NULL;
  mp_status status;
  if (trainer->options.nccl_pp != NULL) {
    /* The worker leaves the buffer untouched until wait_send, after the flush. */
    const mp_nccl_p2p_op op = {MP_NCCL_SEND, peer, (void *)buffer, send->bytes};
    status = nccl_pp_pend(trainer, &op, err);
  } else {
    status = mp_comm_isend(trainer->options.pp, buffer, send->bytes, peer, &send->request, err);
  }
  if (status != MP_OK) {
    free(send);
    return status;
  }
  *request = send;
  return MP_OK;
}

static mp_status pp_wait_send(void *context, void *request, mp_error *err) {
  mp_trainer *trainer = context;
  posted_send *send = request;
  const mp_status status = trainer->options.nccl_pp != NULL ? nccl_pp_flush(trainer, err)
                                                            : mp_comm_wait(send->request, err);
  if (trainer->options.trace != NULL && !trainer->evaluating) {
    mp_trace_comm(trainer->options.trace, trainer->step, "send", "pp",
                  mp_comm_member(trainer->options.pp, send->peer), send->bytes, &send->message,
                  send->posted_s, mp_train_trace_now(trainer));
  }
  free(send);
  return status;
}

static mp_status pp_recv(void *context, float *buffer, size_t count, int peer,
                         const mp_message *message, mp_error *err) {
  mp_trainer *trainer = context;
  const double start = mp_train_trace_now(trainer);
  if (trainer->options.nccl_pp != NULL) {
    const mp_nccl_p2p_op op = {MP_NCCL_RECV, peer, buffer, count * sizeof(float)};
    MP_TRY(nccl_pp_pend(trainer, &op, err));
    MP_TRY(nccl_pp_flush(trainer, err));
  } else {
    MP_TRY(mp_comm_recv(trainer->options.pp, buffer, count * sizeof(float), peer, err));
  }
  if (trainer->options.trace != NULL && !trainer->evaluating) {
    mp_trace_comm(trainer->options.trace, trainer->step, "recv", "pp",
                  mp_comm_member(trainer->options.pp, peer), count * sizeof(float), message,
                  start, mp_train_trace_now(trainer));
  }
  return MP_OK;
}

/* The stage worker's boundary buffers live where the stages compute (the GPU's memory on the
 * CUDA backend). */
static float *boundary_buffer_alloc(void *context, size_t count) {
  const mp_trainer *trainer = context;
  void *buffer = NULL;
  mp_error ignored = MP_ERROR_INITIALIZER;
  return trainer->state_ops->alloc(&buffer, count * sizeof(float), &ignored) == MP_OK ? buffer
                                                                                       : NULL;
}

static void boundary_buffer_free(void *context, float *buffer) {
  const mp_trainer *trainer = context;
  trainer->state_ops->release(buffer);
}

static double observer_now(void *context) { return mp_train_trace_now(context); }

static void observer_action_done(void *context, const mp_action *action, int stage,
                                 double start, double end) {
  mp_trainer *trainer = context;
  mp_trace_action(trainer->options.trace, trainer->step, action->kind, action->micro_batch,
                  action->chunk, stage, start, end);
}

void mp_train_worker_callbacks(mp_trainer *trainer, mp_stage_ops *ops, mp_stage_p2p *p2p,
                               mp_stage_observer *observer) {
  *ops = (mp_stage_ops){trainer, chunk_forward, chunk_backward, chunk_backward_weights,
                        chunk_release};
  *p2p = (mp_stage_p2p){trainer,        pp_post_send,          pp_wait_send, pp_recv,
                        boundary_buffer_alloc, boundary_buffer_free};
  *observer = (mp_stage_observer){trainer, observer_now, observer_action_done};
}
