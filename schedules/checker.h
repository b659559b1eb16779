/*
 * schedules/checker.h — proves a schedule runs before anything runs.
 *
 * Megatron-LM, DeepSpeed and PyTorch users meet a pipeline deadlock at run time, on many GPUs, as
 * a hang. Here a schedule is data (schedule.h), so the checker can refuse it on a laptop instead,
 * naming the first violation as the rank, the action and the action it waits for:
 *
 *   complete  every micro-batch goes forward and backward through every chunk exactly once (a
 *             split backward: one input-gradient B and one W);
 *   ordered   each action's inputs exist when it runs: a forward after its producer upstream, a
 *             backward after its consumer downstream and after its own forward, W after its B;
 *             across ranks that is carried by the messages, which must name the right peers
 *             and be sent and received in the same order (p2p.h);
 *   live      no deadlock when every rank runs its list under the point-to-point model the
 *             runtime uses (p2p.h): the lists are replayed, not just inspected.
 *
 * It also counts each rank's peak number of micro-batches whose activations are alive.
 */
#ifndef MPENGINE_SCHEDULES_CHECKER_H
#define MPENGINE_SCHEDULES_CHECKER_H

#include "common/error.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MP_OK when the schedule is complete, ordered and free of deadlock under `model`; otherwise
 * MP_ERR_INPUT with the first violation: the checks run in the order above, ranks in order and
 * each rank's actions in order. Examples:
 *   "rank 1, action 1 (B micro-batch 0) runs before F micro-batch 0 (action 2), which it waits for"
 *   "deadlock under eager point-to-point: rank 0, action 1 (B micro-batch 0), waits for the
 *    gradient of micro-batch 0 that rank 1 sends after its action 2 (B micro-batch 0); ..." */
mp_status mp_schedule_check(const mp_schedule *schedule, mp_p2p_model model, mp_error *err);

/* mp_schedule_check that also hands back the message matching it proved (mp_p2p_match), for a
 * caller that times the schedule next (the simulator) and would otherwise match it again. On
 * failure *matching is left empty; free it with mp_p2p_matching_free. */
mp_status mp_schedule_check_matched(const mp_schedule *schedule, mp_p2p_model model,
                                    mp_p2p_matching *matching, mp_error *err);

/* The largest number of (micro-batch, chunk) activation sets alive at once on pp_rank: one is
 * alive from the start of its F to the end of its last backward action (B, or W when the backward
 * is split, since W still reads the inputs). Counted along the rank's list. */
int mp_schedule_peak_live(const mp_schedule *schedule, int pp_rank);

/* The largest mp_schedule_peak_live over all ranks. */
int mp_schedule_max_peak_live(const mp_schedule *schedule);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_CHECKER_H */
