/* schedules/schedule.c — the schedule data structure, its names and its stage layout; see
 * schedule.h. The generators are in generate.c. */
#include "schedules/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_reader.h"

static const char *const kKindNames[MP_NUM_SCHEDULE_KINDS] = {
    "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "custom",
};

/* The kinds a user may ask for by name (all but "custom"), NULL-terminated. */
static const char *const kGeneratedKindNames[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
                                                  NULL};

const char *mp_schedule_kind_name(mp_schedule_kind kind) {
  if ((int)kind < 0 || (int)kind >= MP_NUM_SCHEDULE_KINDS) return "unknown";
  return kKindNames[kind];
}

mp_status mp_schedule_kind_parse(const char *name, mp_schedule_kind *out, mp_error *err) {
  for (int i = 0; kGeneratedKindNames[i] != NULL; ++i) {
    if (strcmp(name, kGeneratedKindNames[i]) == 0) {
      *out = (mp_schedule_kind)i;
      return MP_OK;
    }
  }
  const char *closest = mp_closest_word(name, kGeneratedKindNames);
  if (closest != NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "unknown schedule kind '%s'; did you mean '%s'? (kinds: gpipe, 1f1b, "
                   "interleaved-1f1b, zb-h1)",
                   name, closest);
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "unknown schedule kind '%s' (kinds: gpipe, 1f1b, interleaved-1f1b, zb-h1)", name);
}

char mp_action_kind_letter(mp_action_kind kind) {
  switch (kind) {
    case MP_ACTION_FORWARD: return 'F';
    case MP_ACTION_BACKWARD: return 'B';
    case MP_ACTION_BACKWARD_INPUT: return 'B';
    case MP_ACTION_BACKWARD_WEIGHT: return 'W';
  }
  return '?';
}

const char *mp_action_kind_name(mp_action_kind kind) {
  switch (kind) {
    case MP_ACTION_FORWARD: return "forward";
    case MP_ACTION_BACKWARD: return "backward";
    case MP_ACTION_BACKWARD_INPUT: return "input-gradient backward";
    case MP_ACTION_BACKWARD_WEIGHT: return "weight-gradient backward";
  }
  return "unknown action";
}

int mp_stage_index(int pp, int pp_rank, int chunk) { return chunk * pp + pp_rank; }
int mp_stage_rank(int pp, int stage) { return stage % pp; }
int mp_stage_chunk(int pp, int stage) { return stage / pp; }

void mp_action_expected_peers(const mp_schedule *schedule, int pp_rank, mp_action_kind kind,
                              int chunk, int *recv_from, int *send_to) {
  int pp = schedule->pp;
  int num_stages = pp * schedule->virtual_stages;
  int stage = mp_stage_index(pp, pp_rank, chunk);
  /* The rank of the stage before and after, MP_NO_PEER at the ends or when on this rank. */
  int previous = stage > 0 ? mp_stage_rank(pp, stage - 1) : MP_NO_PEER;
  int next = stage + 1 < num_stages ? mp_stage_rank(pp, stage + 1) : MP_NO_PEER;
  if (previous == pp_rank) previous = MP_NO_PEER;
  if (next == pp_rank) next = MP_NO_PEER;
  switch (kind) {
    case MP_ACTION_FORWARD:
      *recv_from = previous;
      *send_to = next;
      return;
    case MP_ACTION_BACKWARD:
    case MP_ACTION_BACKWARD_INPUT:
      *recv_from = next;
      *send_to = previous;
      return;
    case MP_ACTION_BACKWARD_WEIGHT:
      break;
  }
  *recv_from = MP_NO_PEER;
  *send_to = MP_NO_PEER;
}

const char *mp_action_describe(const mp_schedule *schedule, const mp_action *action, char *out,
                               size_t out_bytes) {
  if (schedule->virtual_stages > 1) {
    snprintf(out, out_bytes, "%c micro-batch %d, chunk %d", mp_action_kind_letter(action->kind),
             action->micro_batch, action->chunk);
  } else {
    snprintf(out, out_bytes, "%c micro-batch %d", mp_action_kind_letter(action->kind),
             action->micro_batch);
  }
  return out;
}

mp_status mp_schedule_init(mp_schedule *schedule, mp_schedule_kind kind, int pp,
                           int num_micro_batches, int virtual_stages, mp_error *err) {
  *schedule = (mp_schedule)MP_SCHEDULE_INITIALIZER;
  if (pp < 1 || pp > MP_SCHEDULE_MAX_PP) {
    return mp_fail(err, MP_ERR_INPUT, "pp must be between 1 and %d pipeline ranks, got %d",
                   MP_SCHEDULE_MAX_PP, pp);
  }
  if (num_micro_batches < 1 || num_micro_batches > MP_SCHEDULE_MAX_MICRO_BATCHES) {
    return mp_fail(err, MP_ERR_INPUT, "the number of micro-batches must be between 1 and %d, got %d",
                   MP_SCHEDULE_MAX_MICRO_BATCHES, num_micro_batches);
  }
  if (virtual_stages < 1 || virtual_stages > MP_SCHEDULE_MAX_VIRTUAL_STAGES) {
    return mp_fail(err, MP_ERR_INPUT,
                   "virtual stages (model chunks per rank) must be between 1 and %d, got %d",
                   MP_SCHEDULE_MAX_VIRTUAL_STAGES, virtual_stages);
  }
  long work = (long)pp * num_micro_batches * virtual_stages;
  if (work > MP_SCHEDULE_MAX_WORK) {
    return mp_fail(err, MP_ERR_INPUT,
                   "pp x micro-batches x virtual stages = %d x %d x %d = %ld is more than the %d "
                   "micro-batch chunks a schedule may hold; use fewer micro-batches",
                   pp, num_micro_batches, virtual_stages, work, MP_SCHEDULE_MAX_WORK);
  }
  schedule->ranks = calloc((size_t)pp, sizeof *schedule->ranks);
  if (schedule->ranks == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory allocating a schedule of %d ranks", pp);
  }
  schedule->kind = kind;
  schedule->pp = pp;
  schedule->num_micro_batches = num_micro_batches;
  schedule->virtual_stages = virtual_stages;
  return MP_OK;
}

mp_status mp_schedule_append(mp_schedule *schedule, int pp_rank, mp_action_kind kind,
                             int micro_batch, int chunk, mp_error *err) {
  if (pp_rank < 0 || pp_rank >= schedule->pp) {
    return mp_fail(err, MP_ERR_INPUT, "pipeline rank %d is out of range; the schedule has %d",
                   pp_rank, schedule->pp);
  }
  mp_rank_actions *list = &schedule->ranks[pp_rank];
  if (list->num_actions == list->capacity) {
    int capacity = list->capacity > 0 ? list->capacity * 2 : 16;
    mp_action *grown = realloc(list->actions, (size_t)capacity * sizeof *grown);
    if (grown == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory growing rank %d's actions to %d",
                     pp_rank, capacity);
    }
    list->actions = grown;
    list->capacity = capacity;
  }
  mp_action *action = &list->actions[list->num_actions++];
  action->kind = kind;
  action->micro_batch = micro_batch;
  action->chunk = chunk;
  mp_action_expected_peers(schedule, pp_rank, kind, chunk, &action->recv_from, &action->send_to);
  return MP_OK;
}

long mp_schedule_total_actions(const mp_schedule *schedule) {
  long total = 0;
  for (int r = 0; r < schedule->pp; ++r) total += schedule->ranks[r].num_actions;
  return total;
}

void mp_schedule_free(mp_schedule *schedule) {
  if (schedule->ranks != NULL) {
    for (int r = 0; r < schedule->pp; ++r) free(schedule->ranks[r].actions);
    free(schedule->ranks);
  }
  *schedule = (mp_schedule)MP_SCHEDULE_INITIALIZER;
}
