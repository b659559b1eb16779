/* pipeline/stage_worker.c — executes one pipeline rank's action list; see the header. */
#include "pipeline/stage_worker.h"

#include <stdlib.h>
#include <string.h>

/* A message handed over on this rank (neighbouring stages on one rank). */
typedef struct {
  mp_message message;
  float *buffer;
} local_message;

typedef struct {
  void *request;
  float *buffer;
} pending_send;

struct mp_stage_worker {
  const mp_schedule *schedule;
  int pp_rank;
  size_t boundary_floats;
  mp_stage_ops ops;
  mp_stage_p2p p2p;
  mp_stage_observer observer;
  bool has_observer;
  int num_stages;
  int *slots_per_chunk;  /* (v) */
  int *last_gradient_action; /* (v) index in the list of the chunk's last B or W, or -1 */
  mp_stage_chunk_done chunk_done;
  int current;           /* the list index of the action being run, or -1 between steps */
  int *slot_of;          /* (v, m) the slot holding micro-batch mb on chunk c, or -1 */
  bool *slot_used;       /* (v, max_slots) */
  int max_slots;
  float **free_buffers;  /* a stack of boundary buffers, reused across steps */
  int num_free, free_capacity;
  pending_send *sends;   /* this step's posted sends */
  int num_sends, sends_capacity;
  local_message *local;  /* this step's local hand-overs, in posting order */
  int num_local, local_capacity;
};

int mp_stage_worker_slots(const mp_schedule *schedule, int pp_rank, int chunk) {
  const mp_rank_actions *list = &schedule->ranks[pp_rank];
  const bool zero_bubble = schedule->kind == MP_SCHEDULE_ZB_H1;
  if (schedule->forward_only) return 1; /* each F's slot is free again when it ends */
  int alive = 0, most = 0;
  for (int i = 0; i < list->num_actions; ++i) {
    const mp_action *a = &list->actions[i];
    if (a->chunk != chunk) continue;
    if (a->kind == MP_ACTION_FORWARD) {
      if (++alive > most) most = alive;
    } else if (a->kind == MP_ACTION_BACKWARD || a->kind == MP_ACTION_BACKWARD_WEIGHT ||
               (a->kind == MP_ACTION_BACKWARD_INPUT && !zero_bubble)) {
      --alive;
    }
  }
  return most > 0 ? most : 1;
}

/* Frees a boundary buffer the way it was allocated. */
static void release_buffer(mp_stage_worker *worker, float *buffer) {
  if (buffer == NULL) return;
  if (worker->p2p.free_buffer != NULL) {
    worker->p2p.free_buffer(worker->p2p.context, buffer);
  } else {
    free(buffer);
  }
}

void mp_stage_worker_free(mp_stage_worker *worker) {
  if (worker == NULL) return;
  for (int i = 0; i < worker->num_free; ++i) release_buffer(worker, worker->free_buffers[i]);
  for (int i = 0; i < worker->num_sends; ++i) release_buffer(worker, worker->sends[i].buffer);
  for (int i = 0; i < worker->num_local; ++i) release_buffer(worker, worker->local[i].buffer);
  free(worker->free_buffers);
  free(worker->sends);
  free(worker->local);
  free(worker->slot_used);
  free(worker->slot_of);
  free(worker->slots_per_chunk);
  free(worker->last_gradient_action);
  free(worker);
}

mp_status mp_stage_worker_create(const mp_schedule *schedule, int pp_rank, size_t boundary_floats,
                                 const mp_stage_ops *ops, const mp_stage_p2p *p2p,
                                 const mp_stage_observer *observer, mp_stage_worker **out,
                                 mp_error *err) {
  *out = NULL;
  if (pp_rank < 0 || pp_rank >= schedule->pp) {
    return mp_fail(err, MP_ERR_INPUT, "pipeline rank %d: the schedule has ranks 0 .. %d",
                   pp_rank, schedule->pp - 1);
  }
  if (boundary_floats == 0) {
    return mp_fail(err, MP_ERR_INPUT, "pipeline rank %d: stage boundary of 0 floats", pp_rank);
  }
  mp_stage_worker *worker = calloc(1, sizeof *worker);
  if (worker == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  worker->schedule = schedule;
  worker->pp_rank = pp_rank;
  worker->current = -1;
  worker->boundary_floats = boundary_floats;
  worker->ops = *ops;
  worker->p2p = *p2p;
  if (observer != NULL) {
    worker->observer = *observer;
    worker->has_observer = true;
  }
  const int v = schedule->virtual_stages, m = schedule->num_micro_batches;
  worker->num_stages = schedule->pp * v;
  worker->slots_per_chunk = calloc((size_t)v, sizeof(int));
  worker->slot_of = malloc((size_t)v * (size_t)m * sizeof(int));
  worker->last_gradient_action = malloc((size_t)v * sizeof(int));
  if (worker->slots_per_chunk == NULL || worker->slot_of == NULL ||
      worker->last_gradient_action == NULL) {
    mp_stage_worker_free(worker);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  const mp_rank_actions *list = &schedule->ranks[pp_rank];
  const bool zero_bubble = schedule->kind == MP_SCHEDULE_ZB_H1;
  for (int c = 0; c < v; ++c) worker->last_gradient_action[c] = -1;
  for (int i = 0; i < list->num_actions; ++i) {
    const mp_action *a = &list->actions[i];
    const bool completes = a->kind == MP_ACTION_BACKWARD || a->kind == MP_ACTION_BACKWARD_WEIGHT ||
                           (a->kind == MP_ACTION_BACKWARD_INPUT && !zero_bubble);
    if (completes && a->chunk >= 0 && a->chunk < v) worker->last_gradient_action[a->chunk] = i;
  }
  for (int c = 0; c < v; ++c) {
    worker->slots_per_chunk[c] = mp_stage_worker_slots(schedule, pp_rank, c);
    if (worker->slots_per_chunk[c] > worker->max_slots) {
      worker->max_slots = worker->slots_per_chunk[c];
    }
  }
  worker->slot_used = calloc((size_t)v * (size_t)worker->max_slots, sizeof(bool));
  if (worker->slot_used == NULL) {
    mp_stage_worker_free(worker);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  *out = worker;
  return MP_OK;
}

void mp_stage_worker_on_chunk_done(mp_stage_worker *worker, mp_stage_chunk_done hook) {
  worker->chunk_done = hook;
}

bool mp_stage_worker_completes_chunk(const mp_stage_worker *worker, int chunk) {
  const int v = worker->schedule->virtual_stages;
  return worker->current >= 0 && chunk >= 0 && chunk < v &&
         worker->last_gradient_action[chunk] == worker->current;
}

/* ---- boundary buffers ---- */

static float *take_buffer(mp_stage_worker *worker) {
  if (worker->num_free > 0) return worker->free_buffers[--worker->num_free];
  if (worker->p2p.alloc_buffer != NULL) {
    return worker->p2p.alloc_buffer(worker->p2p.context, worker->boundary_floats);
  }
  return malloc(worker->boundary_floats * sizeof(float));
}

static void give_buffer(mp_stage_worker *worker, float *buffer) {
  if (buffer == NULL) return;
  if (worker->num_free == worker->free_capacity) {
    const int capacity = worker->free_capacity > 0 ? 2 * worker->free_capacity : 8;
    float **grown = realloc(worker->free_buffers, (size_t)capacity * sizeof *grown);
    if (grown == NULL) {
      release_buffer(worker, buffer);
      return;
    }
    worker->free_buffers = grown;
    worker->free_capacity = capacity;
  }
  worker->free_buffers[worker->num_free++] = buffer;
}

/* Grows a array of `size` bytes per element to hold one more; false when out of memory. */
static bool reserve(void **items, int count, int *capacity, size_t size) {
  if (count < *capacity) return true;
  const int grown_capacity = *capacity > 0 ? 2 * *capacity : 16;
  void *grown = realloc(*items, (size_t)grown_capacity * size);
  if (grown == NULL) return false;
  *items = grown;
  *capacity = grown_capacity;
  return true;
}

/* ---- messages ---- */

static bool same_message(const mp_message *a, const mp_message *b) {
  return a->kind == b->kind && a->micro_batch == b->micro_batch &&
         a->from_stage == b->from_stage && a->to_stage == b->to_stage;
}

/* Sends buffer (ownership passes to the worker) as the message of action a. */
static mp_status send_result(mp_stage_worker *worker, const mp_action *a,
                             const mp_message *message, float *buffer, mp_error *err) {
  if (a->send_to == MP_NO_PEER) {
    /* The neighbouring stage is on this rank: hand it over. */
    if (!reserve((void **)&worker->local, worker->num_local, &worker->local_capacity,
                 sizeof *worker->local)) {
      give_buffer(worker, buffer);
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
    local_message *slot = &worker->local[worker->num_local++];
    slot->message = *message;
    slot->buffer = buffer;
    return MP_OK;
  }
  if (!reserve((void **)&worker->sends, worker->num_sends, &worker->sends_capacity,
               sizeof *worker->sends)) {
    give_buffer(worker, buffer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  void *request = NULL;
  const mp_status status = worker->p2p.post_send(worker->p2p.context, buffer,
                                                 worker->boundary_floats, a->send_to, message,
                                                 &request, err);
  if (status != MP_OK) {
    give_buffer(worker, buffer);
    return status;
  }
  worker->sends[worker->num_sends].request = request;
  worker->sends[worker->num_sends].buffer = buffer;
  worker->num_sends++;
  return MP_OK;
}

/* The message action a waits for, in a buffer the caller gives back. */
static mp_status receive_input(mp_stage_worker *worker, const mp_action *a,
                               const mp_message *message, float **out, mp_error *err) {
  *out = NULL;
  if (a->recv_from == MP_NO_PEER) {
    for (int i = 0; i < worker->num_local; ++i) {
      if (!same_message(&worker->local[i].message, message)) continue;
      *out = worker->local[i].buffer;
      worker->local[i] = worker->local[--worker->num_local];
      return MP_OK;
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "its input from stage %d on this rank was never produced (the action list "
                   "is out of order)",
                   message->from_stage);
  }
  float *buffer = take_buffer(worker);
  if (buffer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const mp_status status = worker->p2p.recv(worker->p2p.context, buffer, worker->boundary_floats,
                                            a->recv_from, message, err);
  if (status != MP_OK) {
    give_buffer(worker, buffer);
    return status;
  }
  *out = buffer;
  return MP_OK;
}

/* ---- slots ---- */

static mp_status take_slot(mp_stage_worker *worker, int chunk, int micro_batch, int *out,
                           mp_error *err) {
  const int m = worker->schedule->num_micro_batches;
  bool *used = worker->slot_used + (size_t)chunk * (size_t)worker->max_slots;
  for (int s = 0; s < worker->slots_per_chunk[chunk]; ++s) {
    if (used[s]) continue;
    used[s] = true;
    worker->slot_of[chunk * m + micro_batch] = s;
    *out = s;
    return MP_OK;
  }
  return mp_fail(err, MP_ERR_INPUT, "no free activation slot (all %d hold micro-batches)",
                 worker->slots_per_chunk[chunk]);
}

static mp_status find_slot(const mp_stage_worker *worker, int chunk, int micro_batch, int *out,
                           mp_error *err) {
  const int s = worker->slot_of[chunk * worker->schedule->num_micro_batches + micro_batch];
  if (s < 0) return mp_fail(err, MP_ERR_INPUT, "its forward has not run");
  *out = s;
  return MP_OK;
}

static void release_slot(mp_stage_worker *worker, int chunk, int micro_batch) {
  const int m = worker->schedule->num_micro_batches;
  const int s = worker->slot_of[chunk * m + micro_batch];
  if (s < 0) return;
  worker->slot_used[(size_t)chunk * (size_t)worker->max_slots + (size_t)s] = false;
  worker->slot_of[chunk * m + micro_batch] = -1;
}

/* ---- actions ---- */

/* The observer's clock, 0 without one. */
static double now(const mp_stage_worker *worker) {
  return worker->has_observer ? worker->observer.now(worker->observer.context) : 0.0;
}

/* *start: when the action's compute began, after its receive (which the p2p table times). */
static mp_status run_forward(mp_stage_worker *worker, const mp_action *a, int stage,
                             double *start, mp_error *err) {
  const mp_schedule *schedule = worker->schedule;
  mp_message in_message, out_message;
  const bool has_input = stage > 0;
  const bool has_output = stage < worker->num_stages - 1;
  float *input = NULL, *output = NULL;
  int slot = -1;
  if (has_input) {
    mp_action_received_message(schedule, worker->pp_rank, a, &in_message);
    MP_TRY(receive_input(worker, a, &in_message, &input, err));
  }
  *start = now(worker);
  mp_status status = take_slot(worker, a->chunk, a->micro_batch, &slot, err);
  if (status == MP_OK && has_output && (output = take_buffer(worker)) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK) {
    status = worker->ops.forward(worker->ops.context, a->chunk, a->micro_batch, slot, input,
                                 output, err);
  }
  give_buffer(worker, input);
  if (status != MP_OK) {
    give_buffer(worker, output);
    return status;
  }
  if (schedule->forward_only) {
    /* No backward will read the activations: the slot is free for the next micro-batch. */
    if (worker->ops.release != NULL) {
      worker->ops.release(worker->ops.context, a->chunk, a->micro_batch, slot);
    }
    release_slot(worker, a->chunk, a->micro_batch);
  }
  if (!has_output) return MP_OK;
  mp_action_sent_message(schedule, worker->pp_rank, a, &out_message);
  return send_result(worker, a, &out_message, output, err);
}

static mp_status run_backward(mp_stage_worker *worker, const mp_action *a, int stage,
                              double *start, mp_error *err) {
  const mp_schedule *schedule = worker->schedule;
  mp_message in_message, out_message;
  const bool has_doutput = stage < worker->num_stages - 1;
  const bool has_dinput = stage > 0;
  const bool defer = a->kind == MP_ACTION_BACKWARD_INPUT;
  float *doutput = NULL, *dinput = NULL;
  int slot = -1;
  MP_TRY(find_slot(worker, a->chunk, a->micro_batch, &slot, err));
  if (has_doutput) {
    mp_action_received_message(schedule, worker->pp_rank, a, &in_message);
    MP_TRY(receive_input(worker, a, &in_message, &doutput, err));
  }
  *start = now(worker);
  mp_status status = MP_OK;
  if (has_dinput && (dinput = take_buffer(worker)) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK) {
    status = worker->ops.backward(worker->ops.context, a->chunk, a->micro_batch, slot, doutput,
                                  dinput, defer, err);
  }
  give_buffer(worker, doutput);
  if (status != MP_OK) {
    give_buffer(worker, dinput);
    return status;
  }
  if (!defer) release_slot(worker, a->chunk, a->micro_batch);
  if (!has_dinput) return MP_OK;
  mp_action_sent_message(schedule, worker->pp_rank, a, &out_message);
  return send_result(worker, a, &out_message, dinput, err);
}

static mp_status run_weights(mp_stage_worker *worker, const mp_action *a, mp_error *err) {
  int slot = -1;
  MP_TRY(find_slot(worker, a->chunk, a->micro_batch, &slot, err));
  MP_TRY(worker->ops.backward_weights(worker->ops.context, a->chunk, a->micro_batch, slot, err));
  release_slot(worker, a->chunk, a->micro_batch);
  return MP_OK;
}

static mp_status wait_sends(mp_stage_worker *worker, mp_error *err) {
  mp_status status = MP_OK;
  for (int i = 0; i < worker->num_sends; ++i) {
    mp_error ignored = MP_ERROR_INITIALIZER;
    const mp_status one = worker->p2p.wait_send(worker->p2p.context, worker->sends[i].request,
                                                status == MP_OK ? err : &ignored);
    if (status == MP_OK) status = one;
    /* A send that did not complete may still read its buffer inside the backend: keep it. */
    if (one == MP_OK) give_buffer(worker, worker->sends[i].buffer);
  }
  worker->num_sends = 0;
  return status;
}

mp_status mp_stage_worker_run(mp_stage_worker *worker, mp_error *err) {
  const mp_schedule *schedule = worker->schedule;
  const mp_rank_actions *list = &schedule->ranks[worker->pp_rank];
  const size_t slots = (size_t)schedule->virtual_stages * (size_t)schedule->num_micro_batches;
  for (size_t i = 0; i < slots; ++i) worker->slot_of[i] = -1;
  memset(worker->slot_used, 0,
         (size_t)schedule->virtual_stages * (size_t)worker->max_slots * sizeof(bool));
  mp_status status = MP_OK;
  for (int i = 0; i < list->num_actions && status == MP_OK; ++i) {
    const mp_action *a = &list->actions[i];
    const int stage = mp_stage_index(schedule->pp, worker->pp_rank, a->chunk);
    worker->current = i;
    double start = now(worker);
    switch (a->kind) {
      case MP_ACTION_FORWARD:
        status = run_forward(worker, a, stage, &start, err);
        break;
      case MP_ACTION_BACKWARD:
      case MP_ACTION_BACKWARD_INPUT:
        status = run_backward(worker, a, stage, &start, err);
        break;
      case MP_ACTION_BACKWARD_WEIGHT:
        status = run_weights(worker, a, err);
        break;
    }
    if (status != MP_OK) {
      char what[96];
      mp_error inner = *err;
      mp_fail(err, status, "pipeline rank %d, %s: %s", worker->pp_rank,
              mp_action_describe(schedule, a, what, sizeof what), inner.message);
      break;
    }
    if (worker->has_observer) {
      worker->observer.action_done(worker->observer.context, a, stage, start, now(worker));
    }
    if (worker->chunk_done != NULL && worker->last_gradient_action[a->chunk] == i) {
      status = worker->chunk_done(worker->ops.context, a->chunk, err);
    }
  }
  worker->current = -1;
  mp_error send_err = MP_ERROR_INITIALIZER;
  const mp_status sends = wait_sends(worker, status == MP_OK ? err : &send_err);
  if (status == MP_OK) status = sends;
  for (int i = 0; i < worker->num_local; ++i) give_buffer(worker, worker->local[i].buffer);
  if (status == MP_OK && worker->num_local > 0) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "pipeline rank %d: %d local message(s) were never received (the action "
                     "list is incomplete)",
                     worker->pp_rank, worker->num_local);
  }
  worker->num_local = 0;
  return status;
}
