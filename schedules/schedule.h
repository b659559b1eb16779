/*
 * schedules/schedule.h — a pipeline schedule as data: for each pipeline rank, the ordered list of
 * actions it runs (forward F, backward B and, for zero-bubble, the backward split into the
 * input-gradient B and the weight-gradient W), each with its micro-batch, its model chunk and the
 * point-to-point messages it needs.
 *
 * The same list is checked (checker.h), simulated (simulator.h), drawn (timeline.h) and executed
 * by the stage worker (pipeline/): what a user inspects is what runs (DESIGN.md, Principle 1).
 * mp_schedule_generate is the one selector of the generators (gpipe, 1f1b, interleaved-1f1b,
 * zb-h1); it refuses, naming numbers that would work, cases a kind cannot run.
 *
 * Stage layout (Megatron-LM's interleaving): the model is cut into pp * virtual_stages consecutive
 * stages; model chunk c of pipeline rank r holds stage c * pp + r. A micro-batch's forward runs
 * stage 0, 1, ..., pp * virtual_stages - 1 and its backward runs them in reverse. Neighbouring
 * stages sit on neighbouring ranks (the last rank's chunk c feeds the first rank's chunk c + 1).
 *
 * Point-to-point messages are explicit in each action (recv_from, send_to, as pipeline ranks): an
 * F receives its input activation from the rank of the previous stage and sends its output
 * activation to the rank of the next stage; a B (whole or input-gradient) receives the gradient of
 * its output from the next stage and sends the gradient of its input to the previous one; W has no
 * messages. How and when the runtime posts them, and how they are matched, is p2p.h.
 */
#ifndef MPENGINE_SCHEDULES_SCHEDULE_H
#define MPENGINE_SCHEDULES_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_SCHEDULE_GPIPE = 0,            /* all forwards, then all backwards */
  MP_SCHEDULE_1F1B = 1,             /* PipeDream-flush / Megatron's default */
  MP_SCHEDULE_INTERLEAVED_1F1B = 2, /* Megatron's virtual pipeline, v >= 2 chunks per rank */
  MP_SCHEDULE_ZB_H1 = 3,            /* zero-bubble H1 (Qi et al. 2023) at 1F1B's memory */
  MP_SCHEDULE_CUSTOM = 4,           /* built action by action with mp_schedule_append */
} mp_schedule_kind;

enum { MP_NUM_SCHEDULE_KINDS = 5 };

typedef enum {
  MP_ACTION_FORWARD = 0,         /* F: forward of one micro-batch through one chunk */
  MP_ACTION_BACKWARD = 1,        /* B: the whole backward, input and weight gradients */
  MP_ACTION_BACKWARD_INPUT = 2,  /* B of zero-bubble: the gradient of the chunk's input only */
  MP_ACTION_BACKWARD_WEIGHT = 3, /* W of zero-bubble: the weight gradients, after its B */
} mp_action_kind;

enum { MP_NUM_ACTION_KINDS = 4 };

/* recv_from / send_to of an action that has no message on that side. */
enum { MP_NO_PEER = -1 };

/* Limits that keep a schedule's lists in memory (a few tens of MB at most). */
enum {
  MP_SCHEDULE_MAX_PP = 1024,
  MP_SCHEDULE_MAX_VIRTUAL_STAGES = 64,
  MP_SCHEDULE_MAX_MICRO_BATCHES = 1 << 20,
  MP_SCHEDULE_MAX_WORK = 1 << 20, /* pp * num_micro_batches * virtual_stages */
};

typedef struct {
  mp_action_kind kind;
  int micro_batch; /* 0 .. num_micro_batches - 1 */
  int chunk;       /* model chunk on this rank, 0 .. virtual_stages - 1 */
  int recv_from;   /* the pipeline rank whose message this action waits for before it starts
                      (F: input activation, B: output gradient); MP_NO_PEER when its input is
                      local (the first stage reads data, the last stage has the loss, or the
                      neighbouring stage is on this rank) */
  int send_to;     /* the pipeline rank its result goes to when it ends (F: output activation,
                      B: input gradient); MP_NO_PEER when none */
} mp_action;

/* One pipeline rank's actions in execution order. */
typedef struct {
  int num_actions;
  int capacity;
  mp_action *actions; /* (num_actions) */
} mp_rank_actions;

typedef struct {
  mp_schedule_kind kind;
  int pp;                /* pipeline ranks */
  int num_micro_batches; /* per optimizer step */
  int virtual_stages;    /* model chunks per rank (1 unless interleaved) */
  mp_rank_actions *ranks; /* (pp) */
  bool forward_only;     /* forwards only (evaluation): an F's activations are dropped when it
                            ends, no micro-batch goes backward (mp_schedule_generate_forward_only) */
} mp_schedule;

#define MP_SCHEDULE_INITIALIZER {MP_SCHEDULE_CUSTOM, 0, 0, 0, NULL, false}

/* "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "custom". */
const char *mp_schedule_kind_name(mp_schedule_kind kind);

/* The kind named `name` (one of the names above except "custom"). Fails with MP_ERR_INPUT naming
 * the closest kind and listing them all. */
mp_status mp_schedule_kind_parse(const char *name, mp_schedule_kind *out, mp_error *err);

/* 'F', 'B', 'B', 'W': the letter timelines draw (the input-gradient B of zero-bubble is a B). */
char mp_action_kind_letter(mp_action_kind kind);

/* "forward", "backward", "input-gradient backward", "weight-gradient backward". */
const char *mp_action_kind_name(mp_action_kind kind);

/* Stage layout: stage = chunk * pp + pp_rank. */
int mp_stage_index(int pp, int pp_rank, int chunk);
int mp_stage_rank(int pp, int stage);
int mp_stage_chunk(int pp, int stage);

/* The peers an action of this kind, micro-batch and chunk on pp_rank must name (see mp_action):
 * what mp_schedule_append fills in and what the checker demands. */
void mp_action_expected_peers(const mp_schedule *schedule, int pp_rank, mp_action_kind kind,
                              int chunk, int *recv_from, int *send_to);

/* "F micro-batch 3", or "F micro-batch 3, chunk 1" when the schedule has chunks; W is "W ...".
 * Returns out. */
const char *mp_action_describe(const mp_schedule *schedule, const mp_action *action, char *out,
                               size_t out_bytes);

/* An empty schedule with pp empty lists. Fails with MP_ERR_INPUT when pp, num_micro_batches or
 * virtual_stages is below 1 or above the limits, MP_ERR_RUNTIME when out of memory. Free with
 * mp_schedule_free. */
mp_status mp_schedule_init(mp_schedule *schedule, mp_schedule_kind kind, int pp,
                           int num_micro_batches, int virtual_stages, mp_error *err);

/* Appends an action to pp_rank's list with the peers mp_action_expected_peers gives (tests may
 * change them afterwards to plant errors). Fails with MP_ERR_INPUT on a rank out of range,
 * MP_ERR_RUNTIME when out of memory. Micro-batch and chunk are not checked here: the checker
 * reports them. */
mp_status mp_schedule_append(mp_schedule *schedule, int pp_rank, mp_action_kind kind,
                             int micro_batch, int chunk, mp_error *err);

/* Total actions over all ranks. */
long mp_schedule_total_actions(const mp_schedule *schedule);

void mp_schedule_free(mp_schedule *schedule);

/*
 * The generator selector: fills *out with the schedule of `kind` for pp pipeline ranks,
 * num_micro_batches micro-batches and virtual_stages model chunks per rank.
 *
 *   gpipe             F of micro-batches 0..m-1, then B of 0..m-1.
 *   1f1b              Megatron's order: pp - pp_rank - 1 warm-up forwards, then F/B pairs, then
 *                     the remaining backwards. Any m >= 1 (m < pp runs like gpipe).
 *   interleaved-1f1b  Megatron's virtual pipeline: micro-batches go through the chunks in groups
 *                     of pp; warm-up (pp - pp_rank - 1) * 2 + (v - 1) * pp forwards (all of them
 *                     when m == pp). Needs v >= 2, pp >= 2 and m a multiple of pp.
 *   zb-h1             Zero Bubble H1: 1F1B's warm-up, the backward split into B and W, and rank
 *                     r's step x runs F of x, B of x - (pp - 1 - r) and W of x - (pp - 1), so the
 *                     W's fill the cool-down bubble and at most pp micro-batches are alive.
 *
 * Fails with MP_ERR_INPUT, saying which numbers would work, when the kind cannot run these
 * numbers (virtual_stages other than 1 for a non-interleaved kind, m not a multiple of pp for
 * interleaving, ...). On failure *out is left empty (safe to free).
 */
mp_status mp_schedule_generate(mp_schedule_kind kind, int pp, int num_micro_batches,
                               int virtual_stages, mp_schedule *out, mp_error *err);

/*
 * The forward-only list of the same layout, for a held-out loss: every rank runs F of every
 * micro-batch through each of its chunks, micro-batch by micro-batch (chunk 0 .. v - 1 of
 * micro-batch 0, then of micro-batch 1, ...). Each F depends only on F's earlier in that order on
 * earlier stages, so with eager sends the ranks work on neighbouring micro-batches at once (a
 * pipeline fill, no drain of backwards) and one activation slot per chunk is enough. `kind` is
 * the training schedule it goes with (for names; the list is the same for every kind); the kind's
 * own conditions do not apply (evaluation has no interleaving constraint on m). forward_only is
 * set. On failure *out is left empty.
 */
mp_status mp_schedule_generate_forward_only(mp_schedule_kind kind, int pp, int num_micro_batches,
                                            int virtual_stages, mp_schedule *out, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_SCHEDULE_H */
