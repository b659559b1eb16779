/*
 * pipeline/stage_worker.h — the stage worker: one pipeline rank executes its own list of actions
 * from schedules/ (the very list `mpengine schedule` draws) for one optimizer step. There is no
 * other loop over micro-batches (DESIGN.md, principle 1).
 *
 * For each action, in the list's order:
 *   F  receive the input activation (unless the chunk is the first stage), run the chunk's
 *      forward into a free activation slot, post the output to the next stage (unless last);
 *   B  receive the gradient of the output (unless last stage), run the backward from the
 *      micro-batch's slot, post the input gradient to the previous stage (unless first); a
 *      whole B frees the slot;
 *   W  (zero-bubble) the weight gradients the B of that micro-batch deferred; frees the slot.
 * A forward-only list (evaluation, mp_schedule_generate_forward_only) has F's alone: each frees
 * its slot when it ends (ops->release), so one slot per chunk serves every micro-batch.
 * Sends are eager (schedules/p2p.h, MP_P2P_EAGER): posted when the action ends, never waited on
 * until the end of the step, so neighbours never wait on each other; a receive blocks only its
 * own action. A message whose neighbouring stage is on this same rank is handed over locally.
 *
 * The worker knows neither the model nor the communicator: the engine gives it the chunk's
 * compute (mp_stage_ops) and the pipeline group's point-to-point operations (mp_stage_p2p), as
 * tensor_parallel/tp_comm.h does for collectives, so dependencies point downward (DESIGN.md).
 * Messages carry `boundary_floats` floats each, the same size on every stage boundary.
 */
#ifndef MPENGINE_PIPELINE_STAGE_WORKER_H
#define MPENGINE_PIPELINE_STAGE_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model's chunks on this rank. slot is the activation slot in [0, mp_stage_worker_slots) of
 * that chunk that holds the micro-batch from its F until its B (or W). */
typedef struct {
  void *context;
  /* input: the previous stage's activation, NULL on the first stage; output: written, NULL on
   * the last stage. */
  mp_status (*forward)(void *context, int chunk, int micro_batch, int slot, const float *input,
                       float *output, mp_error *err);
  /* doutput: NULL on the last stage; dinput: written, NULL on the first stage. defer_weights:
   * the input-gradient B of zero-bubble schedules. */
  mp_status (*backward)(void *context, int chunk, int micro_batch, int slot,
                        const float *doutput, float *dinput, bool defer_weights, mp_error *err);
  mp_status (*backward_weights)(void *context, int chunk, int micro_batch, int slot,
                                mp_error *err);
  /* A forward-only schedule (evaluation): called after each F, whose slot no backward will read;
   * the slot is free for the next F. May be NULL. */
  void (*release)(void *context, int chunk, int micro_batch, int slot);
} mp_stage_ops;

/* Point-to-point on the pipeline group; peers are pipeline ranks. message says what travels
 * (for the trace). A posted send's buffer stays untouched until wait_send.
 *
 * The worker never reads or writes a boundary buffer itself: it hands them between p2p and ops.
 * So they may live anywhere the two agree on — host memory from malloc when alloc_buffer is NULL,
 * or, say, GPU memory from alloc_buffer / free_buffer (count floats each). */
typedef struct {
  void *context;
  mp_status (*post_send)(void *context, const float *buffer, size_t count, int peer,
                         const mp_message *message, void **request, mp_error *err);
  mp_status (*wait_send)(void *context, void *request, mp_error *err);
  mp_status (*recv)(void *context, float *buffer, size_t count, int peer,
                    const mp_message *message, mp_error *err);
  float *(*alloc_buffer)(void *context, size_t count); /* NULL when out of memory */
  void (*free_buffer)(void *context, float *buffer);
} mp_stage_p2p;

/* Called after each action with its start and end in the observer's clock (the trace). start is
 * taken after the action's receive returned: waiting for a neighbour is not the action's time
 * (the p2p table records the receive itself). */
typedef struct {
  void *context;
  double (*now)(void *context);
  void (*action_done)(void *context, const mp_action *action, int stage, double start,
                      double end);
} mp_stage_observer;

/* Called when chunk `chunk`'s gradients are complete for the step: after its last B (or, with
 * zero-bubble, its last W). The data-parallel all-reduce of that chunk can start there, while
 * the other chunks' backwards still run. May be NULL. A failure stops the step. */
typedef mp_status (*mp_stage_chunk_done)(void *context, int chunk, mp_error *err);

/* The activation slots chunk `chunk` of pp_rank needs: the most micro-batches alive on it at once
 * (F done, B or W not yet) when its list runs. */
int mp_stage_worker_slots(const mp_schedule *schedule, int pp_rank, int chunk);

typedef struct mp_stage_worker mp_stage_worker;

/* A worker for pipeline rank pp_rank of schedule (borrowed; must outlive the worker). ops and
 * p2p are copied; observer may be NULL. MP_ERR_INPUT on a bad rank or boundary size. */
mp_status mp_stage_worker_create(const mp_schedule *schedule, int pp_rank, size_t boundary_floats,
                                 const mp_stage_ops *ops, const mp_stage_p2p *p2p,
                                 const mp_stage_observer *observer, mp_stage_worker **out,
                                 mp_error *err);

/* Sets the hook called as each chunk's gradients complete (context is ops->context). */
void mp_stage_worker_on_chunk_done(mp_stage_worker *worker, mp_stage_chunk_done hook);

/* True while the action being run (an ops->backward or ops->backward_weights call) is chunk's
 * last gradient action of the step, the one the chunk-done hook follows: its gradients complete
 * inside it, so a caller may start their communication part by part (on GPUs, block by block). */
bool mp_stage_worker_completes_chunk(const mp_stage_worker *worker, int chunk);
void mp_stage_worker_free(mp_stage_worker *worker);

/* Runs the rank's whole list once (one optimizer step's forwards and backwards), then waits for
 * its sends. Every rank of the pipeline calls it for the same step. On failure the remaining
 * actions are skipped and the error (naming the action) returned; the run should stop. */
mp_status mp_stage_worker_run(mp_stage_worker *worker, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_PIPELINE_STAGE_WORKER_H */
