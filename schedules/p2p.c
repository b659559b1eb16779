/* schedules/p2p.c — message naming, in-order matching and the replay of a schedule under a
 * point-to-point model; see p2p.h for the semantics. */
#include "schedules/p2p.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mp_p2p_model_name(mp_p2p_model model) {
  switch (model) {
    case MP_P2P_EAGER: return "eager";
    case MP_P2P_RENDEZVOUS: return "rendezvous";
  }
  return "unknown";
}

mp_status mp_p2p_model_parse(const char *name, mp_p2p_model *out, mp_error *err) {
  if (strcmp(name, "eager") == 0) {
    *out = MP_P2P_EAGER;
    return MP_OK;
  }
  if (strcmp(name, "rendezvous") == 0) {
    *out = MP_P2P_RENDEZVOUS;
    return MP_OK;
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "unknown point-to-point model '%s' (models: eager, rendezvous)", name);
}

const char *mp_ordinal(int n, char *out, size_t out_bytes) {
  const char *suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  snprintf(out, out_bytes, "%d%s", n, suffix);
  return out;
}

static bool is_backward_with_input_gradient(mp_action_kind kind) {
  return kind == MP_ACTION_BACKWARD || kind == MP_ACTION_BACKWARD_INPUT;
}

bool mp_action_sent_message(const mp_schedule *schedule, int pp_rank, const mp_action *action,
                            mp_message *out) {
  if (action->send_to == MP_NO_PEER) return false;
  int stage = mp_stage_index(schedule->pp, pp_rank, action->chunk);
  if (action->kind == MP_ACTION_FORWARD) {
    *out = (mp_message){MP_MESSAGE_ACTIVATION, action->micro_batch, stage, stage + 1};
    return true;
  }
  if (is_backward_with_input_gradient(action->kind)) {
    *out = (mp_message){MP_MESSAGE_GRADIENT, action->micro_batch, stage, stage - 1};
    return true;
  }
  return false;
}

bool mp_action_received_message(const mp_schedule *schedule, int pp_rank,
                                const mp_action *action, mp_message *out) {
  if (action->recv_from == MP_NO_PEER) return false;
  int stage = mp_stage_index(schedule->pp, pp_rank, action->chunk);
  if (action->kind == MP_ACTION_FORWARD) {
    *out = (mp_message){MP_MESSAGE_ACTIVATION, action->micro_batch, stage - 1, stage};
    return true;
  }
  if (is_backward_with_input_gradient(action->kind)) {
    *out = (mp_message){MP_MESSAGE_GRADIENT, action->micro_batch, stage + 1, stage};
    return true;
  }
  return false;
}

const char *mp_message_describe(const mp_schedule *schedule, const mp_message *message,
                                char *out, size_t out_bytes) {
  const char *what = message->kind == MP_MESSAGE_ACTIVATION ? "activation" : "gradient";
  if (schedule->virtual_stages > 1) {
    snprintf(out, out_bytes, "the %s of micro-batch %d from stage %d to stage %d", what,
             message->micro_batch, message->from_stage, message->to_stage);
  } else {
    snprintf(out, out_bytes, "the %s of micro-batch %d", what, message->micro_batch);
  }
  return out;
}

static bool same_message(const mp_message *a, const mp_message *b) {
  return a->kind == b->kind && a->micro_batch == b->micro_batch &&
         a->from_stage == b->from_stage && a->to_stage == b->to_stage;
}

void mp_p2p_matching_free(mp_p2p_matching *matching) {
  for (int r = 0; r < matching->pp; ++r) {
    if (matching->recv_partner != NULL) free(matching->recv_partner[r]);
    if (matching->send_partner != NULL) free(matching->send_partner[r]);
  }
  free(matching->recv_partner);
  free(matching->send_partner);
  memset(matching, 0, sizeof *matching);
}

/* The action of `rank` that sends `message` (or -1), for messages naming the one awaited. */
static int find_sender(const mp_schedule *schedule, int rank, const mp_message *message) {
  const mp_rank_actions *list = &schedule->ranks[rank];
  for (int a = 0; a < list->num_actions; ++a) {
    mp_message sent;
    if (mp_action_sent_message(schedule, rank, &list->actions[a], &sent) &&
        same_message(&sent, message)) {
      return a;
    }
  }
  return -1;
}

/* Pairs the messages from rank `from` to rank `to`: walks both lists in order. */
static mp_status match_pair(const mp_schedule *schedule, int from, int to,
                            mp_p2p_matching *matching, mp_error *err) {
  const mp_rank_actions *senders = &schedule->ranks[from];
  const mp_rank_actions *receivers = &schedule->ranks[to];
  int s = 0, count = 0;
  char what[160], expected[160], mine[96], theirs[96], nth[16];
  for (int a = 0; a < receivers->num_actions; ++a) {
    const mp_action *receiver = &receivers->actions[a];
    if (receiver->recv_from != from) continue;
    mp_message wanted;
    if (!mp_action_received_message(schedule, to, receiver, &wanted)) {
      return mp_fail(err, MP_ERR_INPUT, "rank %d, action %d (%s) names rank %d to receive from, "
                     "but a W receives nothing",
                     to, a, mp_action_describe(schedule, receiver, mine, sizeof mine), from);
    }
    while (s < senders->num_actions && senders->actions[s].send_to != to) ++s;
    ++count;
    if (s == senders->num_actions) {
      int awaited = find_sender(schedule, from, &wanted);
      mp_message_describe(schedule, &wanted, expected, sizeof expected);
      if (awaited >= 0) {
        return mp_fail(err, MP_ERR_INPUT,
                       "rank %d, action %d (%s) waits for %s, which rank %d computes at action "
                       "%d (%s) but never sends to rank %d",
                       to, a, mp_action_describe(schedule, receiver, mine, sizeof mine), expected,
                       from, awaited,
                       mp_action_describe(schedule, &senders->actions[awaited], theirs,
                                          sizeof theirs),
                       to);
      }
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d, action %d (%s) waits for %s from rank %d, but rank %d sends only "
                     "%d messages to rank %d",
                     to, a, mp_action_describe(schedule, receiver, mine, sizeof mine), expected,
                     from, from, count - 1, to);
    }
    mp_message sent;
    if (!mp_action_sent_message(schedule, from, &senders->actions[s], &sent)) {
      return mp_fail(err, MP_ERR_INPUT, "rank %d, action %d (%s) names rank %d to send to, but a "
                     "W sends nothing",
                     from, s, mp_action_describe(schedule, &senders->actions[s], theirs,
                                                 sizeof theirs), to);
    }
    if (!same_message(&sent, &wanted)) {
      int awaited = find_sender(schedule, from, &wanted);
      mp_message_describe(schedule, &wanted, expected, sizeof expected);
      mp_message_describe(schedule, &sent, what, sizeof what);
      char awaited_text[160];
      if (awaited >= 0) {
        char awaited_action[96];
        snprintf(awaited_text, sizeof awaited_text, "which rank %d sends at action %d (%s)", from,
                 awaited,
                 mp_action_describe(schedule, &senders->actions[awaited], awaited_action,
                                    sizeof awaited_action));
      } else {
        snprintf(awaited_text, sizeof awaited_text, "which rank %d never sends", from);
      }
      return mp_fail(err, MP_ERR_INPUT,
                     "rank %d, action %d (%s) waits for %s, %s, but messages between two ranks "
                     "are matched in the order they are sent and the %s message rank %d sends "
                     "to rank %d is %s (action %d, %s)",
                     to, a, mp_action_describe(schedule, receiver, mine, sizeof mine), expected,
                     awaited_text, mp_ordinal(count, nth, sizeof nth), from, to, what, s,
                     mp_action_describe(schedule, &senders->actions[s], theirs, sizeof theirs));
    }
    matching->recv_partner[to][a] = s;
    matching->send_partner[from][s] = a;
    ++s;
  }
  while (s < senders->num_actions && senders->actions[s].send_to != to) ++s;
  if (s < senders->num_actions) {
    mp_message sent;
    if (!mp_action_sent_message(schedule, from, &senders->actions[s], &sent)) {
      return mp_fail(err, MP_ERR_INPUT, "rank %d, action %d (%s) names rank %d to send to, but a "
                     "W sends nothing",
                     from, s, mp_action_describe(schedule, &senders->actions[s], theirs,
                                                 sizeof theirs), to);
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "rank %d, action %d (%s) sends %s to rank %d, but rank %d receives only %d "
                   "messages from rank %d",
                   from, s, mp_action_describe(schedule, &senders->actions[s], theirs,
                                               sizeof theirs),
                   mp_message_describe(schedule, &sent, what, sizeof what), to, to, count, from);
  }
  return MP_OK;
}

static int compare_longs(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

mp_status mp_p2p_match(const mp_schedule *schedule, mp_p2p_matching *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  int pp = schedule->pp;
  out->pp = pp;
  out->recv_partner = calloc((size_t)pp, sizeof *out->recv_partner);
  out->send_partner = calloc((size_t)pp, sizeof *out->send_partner);
  if (out->recv_partner == NULL || out->send_partner == NULL) {
    mp_p2p_matching_free(out);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory matching the messages of %d ranks", pp);
  }
  for (int r = 0; r < pp; ++r) {
    int n = schedule->ranks[r].num_actions;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(int);
    out->recv_partner[r] = malloc(bytes);
    out->send_partner[r] = malloc(bytes);
    if (out->recv_partner[r] == NULL || out->send_partner[r] == NULL) {
      mp_p2p_matching_free(out);
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory matching rank %d's %d actions", r, n);
    }
    for (int a = 0; a < n; ++a) out->recv_partner[r][a] = out->send_partner[r][a] = -1;
  }
  /* Only neighbouring ranks talk in the stage layouts here, but a hand-built schedule may name
   * any rank: collect the ordered pairs that exchange anything (each action adds at most two),
   * then pair each one's messages, in (from, to) order so the first violation is always the same. */
  long total = mp_schedule_total_actions(schedule);
  long *pairs = malloc((size_t)(2 * total + 1) * sizeof *pairs);
  if (pairs == NULL) {
    mp_p2p_matching_free(out);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory matching %ld actions", total);
  }
  /* seen[side * pp + peer]: rank r already collected that pair; reset after each rank. */
  unsigned char *seen = calloc((size_t)2 * (size_t)pp, 1);
  if (seen == NULL) {
    free(pairs);
    mp_p2p_matching_free(out);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory matching %ld actions", total);
  }
  long num_pairs = 0;
  char text[96];
  for (int r = 0; r < pp; ++r) {
    const mp_rank_actions *list = &schedule->ranks[r];
    const long rank_first = num_pairs;
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      int peers[2] = {action->send_to, action->recv_from};
      for (int side = 0; side < 2; ++side) {
        int peer = peers[side];
        if (peer == MP_NO_PEER) continue;
        if (peer < 0 || peer >= pp || peer == r) {
          free(seen);
          free(pairs);
          mp_p2p_matching_free(out);
          return mp_fail(err, MP_ERR_INPUT,
                         "rank %d, action %d (%s) names rank %d to %s; a peer is another rank, "
                         "0 to %d",
                         r, a, mp_action_describe(schedule, action, text, sizeof text), peer,
                         side == 0 ? "send to" : "receive from", pp - 1);
        }
        /* A rank names the same few neighbours over and over: collect each pair once, so the
         * sort below sees a handful of entries rather than two per action. */
        if (seen[side * pp + peer]) continue;
        seen[side * pp + peer] = 1;
        pairs[num_pairs++] = side == 0 ? (long)r * pp + peer : (long)peer * pp + r;
      }
    }
    for (long i = rank_first; i < num_pairs; ++i) {
      const int from = (int)(pairs[i] / pp), to = (int)(pairs[i] % pp);
      if (from == r) seen[to] = 0;
      else seen[pp + from] = 0;
    }
  }
  free(seen);
  qsort(pairs, (size_t)num_pairs, sizeof *pairs, compare_longs);
  mp_status status = MP_OK;
  for (long i = 0; i < num_pairs && status == MP_OK; ++i) {
    if (i > 0 && pairs[i] == pairs[i - 1]) continue;
    status = match_pair(schedule, (int)(pairs[i] / pp), (int)(pairs[i] % pp), out, err);
  }
  free(pairs);
  if (status != MP_OK) mp_p2p_matching_free(out);
  return status;
}

/* ---- replay ---------------------------------------------------------------------------------- */

/* A rank's progress. Eager: `position` is the next action to run, done at num_actions.
 * Rendezvous: `position` is the group before action `position` (the group after the last action
 * at num_actions), done past it. */
typedef struct {
  int position;
  bool posted; /* rendezvous: the group at `position` has been posted */
  bool done;
  double clock; /* when the rank is free */
} rank_state;

typedef struct {
  const mp_schedule *schedule;
  const mp_p2p_matching *matching;
  mp_p2p_model model;
  mp_p2p_timing *timing;
  rank_state *ranks;
  double **send_posted; /* (pp)(num_actions): when the send of an action was posted, -1 not yet */
  double **recv_posted; /* (pp)(num_actions): rendezvous: when its receive was posted, -1 not yet */
} replay;

static double duration_of(const replay *rp, int rank, int action) {
  if (rp->timing == NULL || rp->timing->durations == NULL) return 0.0;
  return rp->timing->durations[rank][action];
}

static double latency_of(const replay *rp) { return rp->timing != NULL ? rp->timing->latency : 0; }

static double max_double(double a, double b) { return a > b ? a : b; }

static void run_action(replay *rp, int rank, int action, double start) {
  double end = start + duration_of(rp, rank, action);
  if (rp->timing != NULL && rp->timing->start != NULL) rp->timing->start[rank][action] = start;
  if (rp->timing != NULL && rp->timing->end != NULL) rp->timing->end[rank][action] = end;
  rp->ranks[rank].clock = end;
}

/* Eager: advances `rank` as far as it can; returns whether it moved. */
static bool advance_eager(replay *rp, int rank) {
  rank_state *state = &rp->ranks[rank];
  const mp_rank_actions *list = &rp->schedule->ranks[rank];
  bool moved = false;
  while (state->position < list->num_actions) {
    int a = state->position;
    const mp_action *action = &list->actions[a];
    double start = state->clock;
    if (action->recv_from != MP_NO_PEER) {
      int partner = rp->matching->recv_partner[rank][a];
      double posted = rp->send_posted[action->recv_from][partner];
      if (posted < 0) break;
      start = max_double(start, posted + latency_of(rp));
    }
    run_action(rp, rank, a, start);
    if (action->send_to != MP_NO_PEER) rp->send_posted[rank][a] = state->clock;
    ++state->position;
    moved = true;
  }
  if (state->position == list->num_actions) state->done = true;
  return moved;
}

/* Rendezvous: the group at `position` holds the send of action position - 1 and the receive of
 * action position, when they exist. */
static bool advance_rendezvous(replay *rp, int rank) {
  rank_state *state = &rp->ranks[rank];
  const mp_rank_actions *list = &rp->schedule->ranks[rank];
  bool moved = false;
  while (!state->done) {
    int g = state->position;
    const mp_action *sender = g > 0 ? &list->actions[g - 1] : NULL;
    const mp_action *receiver = g < list->num_actions ? &list->actions[g] : NULL;
    bool sends = sender != NULL && sender->send_to != MP_NO_PEER;
    bool receives = receiver != NULL && receiver->recv_from != MP_NO_PEER;
    if (!state->posted) {
      if (sends) rp->send_posted[rank][g - 1] = state->clock;
      if (receives) rp->recv_posted[rank][g] = state->clock;
      state->posted = true;
      moved = true;
    }
    double ready = state->clock;
    if (sends) {
      int partner = rp->matching->send_partner[rank][g - 1];
      double peer_posted = rp->recv_posted[sender->send_to][partner];
      if (peer_posted < 0) break;
      ready = max_double(ready, max_double(state->clock, peer_posted) + latency_of(rp));
    }
    if (receives) {
      int partner = rp->matching->recv_partner[rank][g];
      double peer_posted = rp->send_posted[receiver->recv_from][partner];
      if (peer_posted < 0) break;
      ready = max_double(ready, max_double(state->clock, peer_posted) + latency_of(rp));
    }
    state->posted = false;
    moved = true;
    if (receiver == NULL) {
      state->clock = ready;
      state->done = true;
      break;
    }
    run_action(rp, rank, g, ready);
    ++state->position;
  }
  return moved;
}

/* The peer a blocked rank waits for: rendezvous, the receiver of its send when that is not
 * posted yet, else the sender of its receive. */
static int blocked_peer(const replay *rp, int rank) {
  const mp_rank_actions *list = &rp->schedule->ranks[rank];
  int position = rp->ranks[rank].position;
  if (rp->model == MP_P2P_RENDEZVOUS && position > 0 &&
      list->actions[position - 1].send_to != MP_NO_PEER) {
    const mp_action *sender = &list->actions[position - 1];
    int partner = rp->matching->send_partner[rank][position - 1];
    if (rp->recv_posted[sender->send_to][partner] < 0) return sender->send_to;
  }
  return list->actions[position].recv_from;
}

/* One clause of a deadlock message: what `rank` is stuck at and whom it waits for. Sets
 * *awaited_rank to that peer. */
static void describe_wait(const replay *rp, int rank, char *out, size_t out_bytes,
                          int *awaited_rank) {
  const mp_schedule *s = rp->schedule;
  const mp_rank_actions *list = &s->ranks[rank];
  int position = rp->ranks[rank].position;
  char mine[96], theirs[96], message_text[160];
  mp_message message;
  if (rp->model == MP_P2P_RENDEZVOUS && position > 0 &&
      list->actions[position - 1].send_to != MP_NO_PEER) {
    const mp_action *sender = &list->actions[position - 1];
    int partner = rp->matching->send_partner[rank][position - 1];
    if (rp->recv_posted[sender->send_to][partner] < 0) {
      mp_action_sent_message(s, rank, sender, &message);
      *awaited_rank = sender->send_to;
      snprintf(out, out_bytes,
               "rank %d, after action %d (%s), waits for rank %d to receive %s, a receive rank "
               "%d posts only before its action %d (%s)",
               rank, position - 1, mp_action_describe(s, sender, mine, sizeof mine),
               sender->send_to, mp_message_describe(s, &message, message_text, sizeof message_text),
               sender->send_to, partner,
               mp_action_describe(s, &s->ranks[sender->send_to].actions[partner], theirs,
                                  sizeof theirs));
      return;
    }
  }
  const mp_action *receiver = &list->actions[position];
  int partner = rp->matching->recv_partner[rank][position];
  mp_action_received_message(s, rank, receiver, &message);
  *awaited_rank = receiver->recv_from;
  snprintf(out, out_bytes, "rank %d, action %d (%s), waits for %s that rank %d sends after its "
           "action %d (%s)",
           rank, position, mp_action_describe(s, receiver, mine, sizeof mine),
           mp_message_describe(s, &message, message_text, sizeof message_text),
           receiver->recv_from, partner,
           mp_action_describe(s, &s->ranks[receiver->recv_from].actions[partner], theirs,
                              sizeof theirs));
}

static mp_status report_deadlock(const replay *rp, mp_error *err) {
  int pp = rp->schedule->pp;
  int first = 0;
  while (first < pp && rp->ranks[first].done) ++first;
  char text[MP_ERROR_MESSAGE_BYTES];
  size_t used = (size_t)snprintf(text, sizeof text, "deadlock under %s point-to-point: ",
                                 mp_p2p_model_name(rp->model));
  bool *seen = calloc((size_t)pp, sizeof *seen);
  int rank = first, clauses = 0;
  while (rank >= 0 && rank < pp && (seen == NULL || !seen[rank]) && !rp->ranks[rank].done) {
    if (seen != NULL) seen[rank] = true;
    if (clauses == 4) {
      used += (size_t)snprintf(text + used, used < sizeof text ? sizeof text - used : 0, "; ...");
      break;
    }
    char clause[512];
    int awaited = -1;
    describe_wait(rp, rank, clause, sizeof clause, &awaited);
    used += (size_t)snprintf(text + used, used < sizeof text ? sizeof text - used : 0, "%s%s",
                             clauses > 0 ? "; " : "", clause);
    ++clauses;
    rank = awaited;
  }
  if (seen != NULL && rank >= 0 && rank < pp && seen[rank]) {
    snprintf(text + (used < sizeof text ? used : sizeof text - 1),
             used < sizeof text ? sizeof text - used : 1, "; a cycle: none of them can go on");
  }
  free(seen);
  return mp_fail(err, MP_ERR_INPUT, "%s", text);
}

static void free_rows(double **rows, int pp) {
  if (rows == NULL) return;
  for (int r = 0; r < pp; ++r) free(rows[r]);
  free(rows);
}

static double **alloc_rows(const mp_schedule *schedule) {
  double **rows = calloc((size_t)schedule->pp, sizeof *rows);
  if (rows == NULL) return NULL;
  for (int r = 0; r < schedule->pp; ++r) {
    int n = schedule->ranks[r].num_actions;
    rows[r] = malloc((size_t)(n > 0 ? n : 1) * sizeof **rows);
    if (rows[r] == NULL) {
      free_rows(rows, schedule->pp);
      return NULL;
    }
    for (int a = 0; a < n; ++a) rows[r][a] = -1.0;
  }
  return rows;
}

mp_status mp_p2p_replay(const mp_schedule *schedule, const mp_p2p_matching *matching,
                        mp_p2p_model model, mp_p2p_timing *timing, mp_error *err) {
  int pp = schedule->pp;
  replay rp = {schedule, matching, model, timing, NULL, NULL, NULL};
  rp.ranks = calloc((size_t)pp, sizeof *rp.ranks);
  rp.send_posted = alloc_rows(schedule);
  rp.recv_posted = alloc_rows(schedule);
  mp_status status = MP_OK;
  if (rp.ranks == NULL || rp.send_posted == NULL || rp.recv_posted == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory replaying a schedule of %ld actions",
                     mp_schedule_total_actions(schedule));
  }
  /* A work list of ranks to advance. A rank that blocks waits in the list of the peer it waits
   * for, and goes back on the work list when that peer moves; when the work list runs dry with a
   * rank not done, the ranks deadlock. Each action is run once, so this is linear in actions. */
  int *queue = malloc((size_t)pp * sizeof *queue);
  int *waiters_head = malloc((size_t)pp * sizeof *waiters_head);
  int *waiters_next = malloc((size_t)pp * sizeof *waiters_next);
  bool *in_list = calloc((size_t)pp, sizeof *in_list); /* queued or waiting: in exactly one list */
  if (status == MP_OK && (queue == NULL || waiters_head == NULL || waiters_next == NULL ||
                          in_list == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory replaying a schedule of %d ranks", pp);
  }
  if (status == MP_OK) {
    int queue_start = 0, queue_length = pp;
    for (int r = 0; r < pp; ++r) {
      queue[r] = r;
      in_list[r] = true;
      waiters_head[r] = -1;
    }
    while (queue_length > 0) {
      int r = queue[queue_start];
      queue_start = (queue_start + 1) % pp;
      --queue_length;
      in_list[r] = false;
      bool moved = model == MP_P2P_EAGER ? advance_eager(&rp, r) : advance_rendezvous(&rp, r);
      if (moved) {
        for (int w = waiters_head[r]; w >= 0; w = waiters_next[w]) {
          queue[(queue_start + queue_length++) % pp] = w;
        }
        waiters_head[r] = -1;
      }
      if (!rp.ranks[r].done && !in_list[r]) {
        int peer = blocked_peer(&rp, r);
        waiters_next[r] = waiters_head[peer];
        waiters_head[peer] = r;
        in_list[r] = true;
      }
    }
    for (int r = 0; r < pp && status == MP_OK; ++r) {
      if (!rp.ranks[r].done) status = report_deadlock(&rp, err);
    }
  }
  free(queue);
  free(waiters_head);
  free(waiters_next);
  free(in_list);
  free(rp.ranks);
  free_rows(rp.send_posted, pp);
  free_rows(rp.recv_posted, pp);
  return status;
}
