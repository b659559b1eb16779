/* schedules/checker.c — completeness, ordering, message and deadlock checks; see checker.h. */
#include "schedules/checker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where each (micro-batch, chunk) of one rank runs each kind of action: the first and second
 * index of it in the rank's list (-1 when none), and how many times. */
typedef struct {
  int first[MP_NUM_ACTION_KINDS];
  int second[MP_NUM_ACTION_KINDS];
  int count[MP_NUM_ACTION_KINDS];
} unit_actions;

static const char *chunk_suffix(const mp_schedule *s, int chunk, char *out, size_t out_bytes) {
  if (s->virtual_stages > 1) {
    snprintf(out, out_bytes, ", chunk %d", chunk);
  } else {
    out[0] = '\0';
  }
  return out;
}

static mp_status check_shape(const mp_schedule *s, mp_error *err) {
  if (s->ranks == NULL || s->pp < 1 || s->num_micro_batches < 1 || s->virtual_stages < 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the schedule is empty: it needs pp, micro-batches and virtual stages of at "
                   "least 1 (got %d, %d, %d)",
                   s->pp, s->num_micro_batches, s->virtual_stages);
  }
  char text[96];
  for (int r = 0; r < s->pp; ++r) {
    const mp_rank_actions *list = &s->ranks[r];
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      if ((int)action->kind < 0 || (int)action->kind >= MP_NUM_ACTION_KINDS) {
        return mp_fail(err, MP_ERR_INPUT, "rank %d, action %d: unknown action kind %d", r, a,
                       (int)action->kind);
      }
      if (action->micro_batch < 0 || action->micro_batch >= s->num_micro_batches) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d, action %d (%s): micro-batch %d is out of range; the schedule "
                       "has %d (0 to %d)",
                       r, a, mp_action_describe(s, action, text, sizeof text), action->micro_batch,
                       s->num_micro_batches, s->num_micro_batches - 1);
      }
      if (action->chunk < 0 || action->chunk >= s->virtual_stages) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d, action %d (%s): chunk %d is out of range; each rank has %d "
                       "(0 to %d)",
                       r, a, mp_action_describe(s, action, text, sizeof text), action->chunk,
                       s->virtual_stages, s->virtual_stages - 1);
      }
    }
  }
  return MP_OK;
}

/* Fills units[chunk * m + micro_batch] for rank r. */
static void index_rank(const mp_schedule *s, int r, unit_actions *units) {
  int num_units = s->num_micro_batches * s->virtual_stages;
  for (int u = 0; u < num_units; ++u) {
    for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
      units[u].first[k] = units[u].second[k] = -1;
      units[u].count[k] = 0;
    }
  }
  const mp_rank_actions *list = &s->ranks[r];
  for (int a = 0; a < list->num_actions; ++a) {
    const mp_action *action = &list->actions[a];
    unit_actions *unit = &units[action->chunk * s->num_micro_batches + action->micro_batch];
    int k = (int)action->kind;
    if (unit->count[k] == 0) unit->first[k] = a;
    if (unit->count[k] == 1) unit->second[k] = a;
    ++unit->count[k];
  }
}

static mp_status check_complete(const mp_schedule *s, int r, const unit_actions *units,
                                mp_error *err) {
  const char *once = "every micro-batch goes forward and backward through every chunk once";
  char chunk_text[32];
  for (int c = 0; c < s->virtual_stages; ++c) {
    for (int mb = 0; mb < s->num_micro_batches; ++mb) {
      const unit_actions *u = &units[c * s->num_micro_batches + mb];
      const char *suffix = chunk_suffix(s, c, chunk_text, sizeof chunk_text);
      if (u->count[MP_ACTION_FORWARD] == 0) {
        return mp_fail(err, MP_ERR_INPUT, "rank %d: F of micro-batch %d%s is missing; %s", r, mb,
                       suffix, once);
      }
      if (u->count[MP_ACTION_FORWARD] > 1) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: micro-batch %d%s goes forward twice (actions %d and %d); %s", r,
                       mb, suffix, u->first[MP_ACTION_FORWARD], u->second[MP_ACTION_FORWARD], once);
      }
      int whole = u->count[MP_ACTION_BACKWARD], input = u->count[MP_ACTION_BACKWARD_INPUT];
      int weight = u->count[MP_ACTION_BACKWARD_WEIGHT];
      if (s->forward_only) {
        if (whole + input + weight == 0) continue;
        const int a = whole > 0 ? u->first[MP_ACTION_BACKWARD]
                      : input > 0 ? u->first[MP_ACTION_BACKWARD_INPUT]
                                  : u->first[MP_ACTION_BACKWARD_WEIGHT];
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: micro-batch %d%s has a backward (action %d) in a forward-only "
                       "schedule; evaluation runs every micro-batch forward through every chunk "
                       "once, and nothing backward",
                       r, mb, suffix, a);
      }
      if (whole + input == 0) {
        return mp_fail(err, MP_ERR_INPUT, "rank %d: B of micro-batch %d%s is missing; %s", r, mb,
                       suffix, once);
      }
      if (whole + input > 1) {
        int first = whole > 0 ? u->first[MP_ACTION_BACKWARD] : u->first[MP_ACTION_BACKWARD_INPUT];
        int second = whole > 1   ? u->second[MP_ACTION_BACKWARD]
                     : input > 1 ? u->second[MP_ACTION_BACKWARD_INPUT]
                                 : u->first[MP_ACTION_BACKWARD_INPUT];
        if (second < first) {
          int t = first;
          first = second;
          second = t;
        }
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: micro-batch %d%s goes backward twice (actions %d and %d); %s", r,
                       mb, suffix, first, second, once);
      }
      if (input == 1 && weight == 0) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: micro-batch %d%s has an input-gradient B (action %d) but no W; a "
                       "split backward needs its weight-gradient W",
                       r, mb, suffix, u->first[MP_ACTION_BACKWARD_INPUT]);
      }
      if (weight > 0 && input == 0) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: W of micro-batch %d%s (action %d) follows a whole backward B; a W "
                       "belongs only after an input-gradient B",
                       r, mb, suffix, u->first[MP_ACTION_BACKWARD_WEIGHT]);
      }
      if (weight > 1) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d: micro-batch %d%s runs W twice (actions %d and %d); %s", r, mb,
                       suffix, u->first[MP_ACTION_BACKWARD_WEIGHT],
                       u->second[MP_ACTION_BACKWARD_WEIGHT], once);
      }
    }
  }
  return MP_OK;
}

/* The index of the backward with the input gradient (B or input-gradient B) of a unit. */
static int backward_index(const unit_actions *u) {
  return u->count[MP_ACTION_BACKWARD] > 0 ? u->first[MP_ACTION_BACKWARD]
                                          : u->first[MP_ACTION_BACKWARD_INPUT];
}

/* Dependencies within one rank must come earlier in its list; those across ranks are messages. */
static mp_status check_local_order(const mp_schedule *s, int r, const unit_actions *units,
                                   mp_error *err) {
  int pp = s->pp, m = s->num_micro_batches, num_stages = pp * s->virtual_stages;
  const mp_rank_actions *list = &s->ranks[r];
  char mine[96], theirs[96];
  for (int a = 0; a < list->num_actions; ++a) {
    const mp_action *action = &list->actions[a];
    const unit_actions *u = &units[action->chunk * m + action->micro_batch];
    int stage = mp_stage_index(pp, r, action->chunk);
    int awaited = -1;
    switch (action->kind) {
      case MP_ACTION_FORWARD:
        if (stage > 0 && mp_stage_rank(pp, stage - 1) == r) {
          awaited = units[mp_stage_chunk(pp, stage - 1) * m + action->micro_batch]
                        .first[MP_ACTION_FORWARD];
        }
        break;
      case MP_ACTION_BACKWARD:
      case MP_ACTION_BACKWARD_INPUT:
        awaited = u->first[MP_ACTION_FORWARD];
        if (awaited < a && stage + 1 < num_stages && mp_stage_rank(pp, stage + 1) == r) {
          awaited = backward_index(&units[mp_stage_chunk(pp, stage + 1) * m + action->micro_batch]);
        }
        break;
      case MP_ACTION_BACKWARD_WEIGHT:
        awaited = u->first[MP_ACTION_BACKWARD_INPUT];
        break;
    }
    if (awaited > a) {
      return mp_fail(err, MP_ERR_INPUT, "rank %d, action %d (%s) runs before %s (action %d), "
                     "which it waits for",
                     r, a, mp_action_describe(s, action, mine, sizeof mine),
                     mp_action_describe(s, &list->actions[awaited], theirs, sizeof theirs),
                     awaited);
    }
  }
  return MP_OK;
}

static const char *peer_text(int peer, char *out, size_t out_bytes) {
  if (peer == MP_NO_PEER) {
    snprintf(out, out_bytes, "none");
  } else {
    snprintf(out, out_bytes, "rank %d", peer);
  }
  return out;
}

static mp_status check_peers(const mp_schedule *s, int r, mp_error *err) {
  const mp_rank_actions *list = &s->ranks[r];
  char text[96], given[32], wanted[32];
  for (int a = 0; a < list->num_actions; ++a) {
    const mp_action *action = &list->actions[a];
    int recv_from, send_to;
    mp_action_expected_peers(s, r, action->kind, action->chunk, &recv_from, &send_to);
    if (action->recv_from != recv_from) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d, action %d (%s) receives from %s; its input comes from %s",
                     r, a, mp_action_describe(s, action, text, sizeof text),
                     peer_text(action->recv_from, given, sizeof given),
                     peer_text(recv_from, wanted, sizeof wanted));
    }
    if (action->send_to != send_to) {
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d, action %d (%s) sends to %s; its output goes to %s", r, a,
                     mp_action_describe(s, action, text, sizeof text),
                     peer_text(action->send_to, given, sizeof given),
                     peer_text(send_to, wanted, sizeof wanted));
    }
  }
  return MP_OK;
}

mp_status mp_schedule_check_matched(const mp_schedule *schedule, mp_p2p_model model,
                                    mp_p2p_matching *matching, mp_error *err) {
  memset(matching, 0, sizeof *matching);
  MP_TRY(check_shape(schedule, err));
  size_t num_units = (size_t)schedule->num_micro_batches * (size_t)schedule->virtual_stages;
  unit_actions *units = malloc(num_units * sizeof *units);
  if (units == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory checking %zu micro-batch chunks",
                   num_units);
  }
  mp_status status = MP_OK;
  for (int r = 0; r < schedule->pp && status == MP_OK; ++r) {
    index_rank(schedule, r, units);
    status = check_complete(schedule, r, units, err);
    if (status == MP_OK) status = check_local_order(schedule, r, units, err);
  }
  free(units);
  for (int r = 0; r < schedule->pp && status == MP_OK; ++r) {
    status = check_peers(schedule, r, err);
  }
  if (status != MP_OK) return status;
  MP_TRY(mp_p2p_match(schedule, matching, err));
  status = mp_p2p_replay(schedule, matching, model, NULL, err);
  if (status != MP_OK) mp_p2p_matching_free(matching);
  return status;
}

mp_status mp_schedule_check(const mp_schedule *schedule, mp_p2p_model model, mp_error *err) {
  mp_p2p_matching matching;
  const mp_status status = mp_schedule_check_matched(schedule, model, &matching, err);
  mp_p2p_matching_free(&matching);
  return status;
}

int mp_schedule_peak_live(const mp_schedule *schedule, int pp_rank) {
  if (pp_rank < 0 || pp_rank >= schedule->pp) return 0;
  const mp_rank_actions *list = &schedule->ranks[pp_rank];
  /* An F of a forward-only list drops its activations as it ends. */
  if (schedule->forward_only) return list->num_actions > 0 ? 1 : 0;
  int live = 0, peak = 0;
  for (int a = 0; a < list->num_actions; ++a) {
    switch (list->actions[a].kind) {
      case MP_ACTION_FORWARD:
        ++live;
        if (live > peak) peak = live;
        break;
      case MP_ACTION_BACKWARD:
      case MP_ACTION_BACKWARD_WEIGHT:
        --live;
        break;
      case MP_ACTION_BACKWARD_INPUT:
        break;
    }
  }
  return peak;
}

int mp_schedule_max_peak_live(const mp_schedule *schedule) {
  int peak = 0;
  for (int r = 0; r < schedule->pp; ++r) {
    int rank_peak = mp_schedule_peak_live(schedule, r);
    if (rank_peak > peak) peak = rank_peak;
  }
  return peak;
}
