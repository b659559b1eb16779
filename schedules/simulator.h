/*
 * schedules/simulator.h — how long a schedule takes and where it idles, before it runs.
 *
 * Given a duration per (action kind, stage) and a point-to-point latency, the simulator replays
 * the schedule under the same point-to-point model the checker proves and the runtime uses
 * (p2p.h), every rank starting at time 0 and running each action as soon as its inputs are there.
 * It gives each action's start and end, the step time, the bubble fraction and the peak activation
 * memory of each rank.
 *
 * Definitions (stated exactly, so the closed forms can be tested to round-off):
 *   step time        the end of the last action on any rank (all ranks start at 0);
 *   busy time        the sum of a rank's action durations;
 *   bubble fraction  of a rank: (step time - busy time) / step time; of the schedule: the mean of
 *                    the ranks' bubble fractions. With unit costs, 1F1B and GPipe give
 *                    (p - 1) / (m + p - 1), interleaved 1F1B (p - 1) / (v m + p - 1);
 *   activation memory of a rank at a moment: the sum, over the (micro-batch, chunk) sets alive
 *                    then (from the start of the F to the end of the last backward action), of
 *                    the stage's activation memory per micro-batch.
 *
 * Unit costs (mp_sim_costs_init_unit) stand in until the cost model (topology/) supplies seconds:
 * per chunk F = 1 / v, B = 2 / v, and for zero-bubble B = 1 / v and W = 1 / v (B + W = the whole
 * backward), so a rank's work is 3 m whatever v is; activation memory 1 / v per chunk, so memory
 * reads in "micro-batches of one rank's layers"; latency 0.
 */
#ifndef MPENGINE_SCHEDULES_SIMULATOR_H
#define MPENGINE_SCHEDULES_SIMULATOR_H

#include "common/error.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_TIME_UNITS = 0,   /* abstract units: the unit costs */
  MP_TIME_SECONDS = 1, /* durations from the cost model; timelines draw milliseconds */
} mp_time_unit;

typedef enum {
  MP_MEMORY_MICRO_BATCHES = 0, /* one micro-batch's activations of one rank's layers (v = 1) */
  MP_MEMORY_BYTES = 1,
} mp_memory_unit;

typedef struct {
  int num_stages;                         /* pp * virtual_stages: the length of the arrays */
  double *duration[MP_NUM_ACTION_KINDS];  /* (num_stages) per action kind, in time_unit */
  double *activation_memory;              /* (num_stages) per alive micro-batch, in memory_unit */
  double p2p_latency;                     /* added to every message, in time_unit */
  mp_time_unit time_unit;
  mp_memory_unit memory_unit;
  mp_p2p_model p2p_model;                 /* MP_P2P_EAGER unless asked otherwise */
} mp_sim_costs;

/* Unit costs for pp ranks with virtual_stages chunks each (see above). MP_ERR_RUNTIME when out of
 * memory. Free with mp_sim_costs_free. */
mp_status mp_sim_costs_init_unit(mp_sim_costs *costs, int pp, int virtual_stages, mp_error *err);
void mp_sim_costs_free(mp_sim_costs *costs);

typedef struct {
  int pp;
  double **start;                  /* (pp)(num_actions of the rank), in time_unit */
  double **end;                    /* (pp)(num_actions of the rank) */
  double step_time;
  double *busy_time;               /* (pp) */
  double *rank_bubble_fraction;    /* (pp) */
  double bubble_fraction;          /* mean of rank_bubble_fraction */
  double *peak_activation_memory;  /* (pp), in memory_unit */
  double max_peak_activation_memory;
  int *peak_live;                  /* (pp) mp_schedule_peak_live of each rank */
  mp_time_unit time_unit;
  mp_memory_unit memory_unit;
  mp_p2p_model p2p_model;
  double p2p_latency;
} mp_simulation;

/* Checks the schedule (mp_schedule_check under costs->p2p_model; its failure is returned as is),
 * then times it. Fails with MP_ERR_INPUT when the costs do not fit the schedule (num_stages other
 * than pp * virtual_stages, a negative or non-finite duration or latency). Free *out with
 * mp_simulation_free, also after a failure. */
mp_status mp_schedule_simulate(const mp_schedule *schedule, const mp_sim_costs *costs,
                               mp_simulation *out, mp_error *err);
void mp_simulation_free(mp_simulation *simulation);

/* A schedule checked and its messages matched once, so that it can be timed under many sets of
 * costs without repeating that work: the planner simulates one (kind, pp, micro-batches, virtual
 * stages) schedule for every layout that shares it, and checking and matching cost more than the
 * timing itself. It points at the schedule, which must outlive it and stay unchanged. */
typedef struct {
  const mp_schedule *schedule;
  mp_p2p_model p2p_model;   /* the model it was checked under; the costs must name the same */
  mp_p2p_matching matching; /* mp_p2p_match of the schedule */
  int *peak_live;           /* (pp) mp_schedule_peak_live of each rank */
} mp_sim_prepared;

/* Checks the schedule under `model` (mp_schedule_check; its failure is returned as is) and matches
 * its messages. MP_ERR_RUNTIME when out of memory. Free *out with mp_sim_prepared_free, also after
 * a failure. */
mp_status mp_sim_prepare(const mp_schedule *schedule, mp_p2p_model model, mp_sim_prepared *out,
                         mp_error *err);
void mp_sim_prepared_free(mp_sim_prepared *prepared);

/* mp_schedule_simulate of prepared->schedule, without checking it again: the same *out, to the
 * bit. Fails with MP_ERR_INPUT as mp_schedule_simulate does on costs that do not fit the schedule,
 * and when costs->p2p_model is not the model the schedule was prepared under. Free *out with
 * mp_simulation_free, also after a failure. */
mp_status mp_schedule_simulate_prepared(const mp_sim_prepared *prepared, const mp_sim_costs *costs,
                                        mp_simulation *out, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_SIMULATOR_H */
