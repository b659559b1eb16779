/*
 * schedules/p2p.h — the point-to-point semantics a schedule runs under, stated once, so that the
 * checker proves, the simulator times and the stage worker (pipeline/) executes the same thing.
 *
 * Messages. An action with recv_from receives one message before it starts; an action with
 * send_to sends one when it ends (schedule.h). A message is named by what it carries: the
 * activation or the gradient of one micro-batch crossing from one stage to its neighbour. Between
 * one ordered pair of ranks, messages are matched in the order they are posted (MPI's
 * non-overtaking rule; NCCL has no tags at all): the k-th send of rank a to rank b is the k-th
 * receive of rank b from rank a. When the two lists disagree on what the k-th message is, the
 * receiver would silently compute on the wrong tensor, so mp_p2p_match refuses that.
 *
 * Two models of when a rank blocks:
 *
 *   MP_P2P_EAGER — what the runtime does, the default. A send is posted when its action ends and
 *     never blocks the sender (MPI_Isend, or an NCCL send on a stream per peer that the compute
 *     stream does not wait on); the sender keeps the tensor until it is received and waits for its
 *     sends at the end of the step. A receive is posted right before its action and blocks that
 *     action until the message has arrived: `latency` after the send was posted. Sends to one peer
 *     complete in order, which costs nothing because that peer receives them in order. Only a cycle
 *     of waits can deadlock: rank a waits for a message that rank b sends after a point where b
 *     waits for rank a.
 *
 *   MP_P2P_RENDEZVOUS — Megatron's batched blocking p2p (batch_isend_irecv, or
 *     ncclGroupStart/ncclGroupEnd, then wait), the stricter model. Between two consecutive actions
 *     a rank posts one group: the send of the action that ended and the receive of the action about
 *     to start (before the first action the group is that receive alone, after the last the send
 *     alone). Nothing is buffered: an op completes when the peer has posted the matching op,
 *     `latency` after the later of the two posts, and the rank blocks until its whole group has
 *     completed. Batching a send with the next receive is what lets two neighbours exchange
 *     without waiting on each other; two ranks that each post a lone send to the other deadlock.
 *     A schedule that passes under this model also passes under the eager one, not conversely:
 *     zb-h1 runs here but slower (a W between a send and the next receive holds the neighbour),
 *     and interleaved-1f1b deadlocks, because Megatron batches both sends and both receives of a
 *     steady-state F/B pair into one group, which one group per boundary cannot express. That is
 *     the hang a runtime with blocking batched p2p would meet, and why the runtime is eager.
 */
#ifndef MPENGINE_SCHEDULES_P2P_H
#define MPENGINE_SCHEDULES_P2P_H

#include <stdbool.h>

#include "common/error.h"
#include "schedules/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_P2P_EAGER = 0,
  MP_P2P_RENDEZVOUS = 1,
} mp_p2p_model;

/* "eager", "rendezvous". */
const char *mp_p2p_model_name(mp_p2p_model model);

/* Fails with MP_ERR_INPUT listing the models on an unknown name. */
mp_status mp_p2p_model_parse(const char *name, mp_p2p_model *out, mp_error *err);

typedef enum {
  MP_MESSAGE_ACTIVATION = 0, /* output of F on stage s, input of F on stage s + 1 */
  MP_MESSAGE_GRADIENT = 1,   /* input gradient of B on stage s, output gradient of B on s - 1 */
} mp_message_kind;

typedef struct {
  mp_message_kind kind;
  int micro_batch;
  int from_stage; /* the stage that sends it */
  int to_stage;   /* the neighbouring stage that receives it */
} mp_message;

/* The message an action of pp_rank sends (when it has send_to) or receives (recv_from). Return
 * false, leaving *out alone, when it has none. Stages follow from the action's kind and chunk
 * alone, so a wrong peer does not change the message. */
bool mp_action_sent_message(const mp_schedule *schedule, int pp_rank, const mp_action *action,
                            mp_message *out);
bool mp_action_received_message(const mp_schedule *schedule, int pp_rank,
                                const mp_action *action, mp_message *out);

/* "the activation of micro-batch 2" (" from stage 4 to stage 5" added when the schedule has
 * chunks). */
const char *mp_message_describe(const mp_schedule *schedule, const mp_message *message,
                                char *out, size_t out_bytes);

/* Which action on the peer each send and receive pairs with, by the in-order matching rule. */
typedef struct {
  int pp;
  int **recv_partner; /* (pp)(num_actions): for an action with recv_from, the index on recv_from
                         of the action whose message it receives; -1 otherwise */
  int **send_partner; /* (pp)(num_actions): for an action with send_to, the index on send_to of
                         the action that receives its message; -1 otherwise */
} mp_p2p_matching;

/* Pairs every send with a receive. Fails with MP_ERR_INPUT naming the rank, the action and the
 * action it waits for when the k-th message a rank sends to a peer is not the one the peer's k-th
 * receive expects, when a rank sends more or fewer messages to a peer than the peer receives, or
 * when a peer is not another rank of the schedule. Free *out with mp_p2p_matching_free (it is
 * left empty on failure). */
mp_status mp_p2p_match(const mp_schedule *schedule, mp_p2p_matching *out, mp_error *err);
void mp_p2p_matching_free(mp_p2p_matching *matching);

/* Times for mp_p2p_replay: inputs durations and latency, outputs start and end. */
typedef struct {
  const double *const *durations; /* (pp)(num_actions) how long each action computes, >= 0;
                                     NULL: all 0 */
  double latency;                 /* >= 0, added to every message, in the units of durations */
  double **start;                 /* (pp)(num_actions), filled when not NULL */
  double **end;                   /* (pp)(num_actions), filled when not NULL */
} mp_p2p_timing;

/* Runs every rank's list under `model`, all ranks starting at time 0, each running as soon as the
 * model lets it. Fails with MP_ERR_INPUT when the ranks deadlock, with a message that follows the
 * waits from the lowest blocked rank: each rank, the action it is stuck at and the action of the
 * peer it waits for, until the cycle closes. timing may be NULL (a pure deadlock check). */
mp_status mp_p2p_replay(const mp_schedule *schedule, const mp_p2p_matching *matching,
                        mp_p2p_model model, mp_p2p_timing *timing, mp_error *err);

/* "1st", "2nd", "3rd", "11th", ... into out; returns out. */
const char *mp_ordinal(int n, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_P2P_H */
