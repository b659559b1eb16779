/* schedules/simulator.c — timing a checked schedule under its point-to-point model; see
 * simulator.h. */
#include "schedules/simulator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedules/checker.h"

void mp_sim_costs_free(mp_sim_costs *costs) {
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) free(costs->duration[k]);
  free(costs->activation_memory);
  memset(costs, 0, sizeof *costs);
}

mp_status mp_sim_costs_init_unit(mp_sim_costs *costs, int pp, int virtual_stages, mp_error *err) {
  memset(costs, 0, sizeof *costs);
  if (pp < 1 || virtual_stages < 1 || pp > MP_SCHEDULE_MAX_PP ||
      virtual_stages > MP_SCHEDULE_MAX_VIRTUAL_STAGES) {
    return mp_fail(err, MP_ERR_INPUT, "unit costs need pp and virtual stages of at least 1 and "
                   "at most %d and %d, got %d and %d",
                   MP_SCHEDULE_MAX_PP, MP_SCHEDULE_MAX_VIRTUAL_STAGES, pp, virtual_stages);
  }
  int num_stages = pp * virtual_stages;
  costs->num_stages = num_stages;
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    costs->duration[k] = malloc((size_t)num_stages * sizeof(double));
  }
  costs->activation_memory = malloc((size_t)num_stages * sizeof(double));
  bool allocated = costs->activation_memory != NULL;
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) allocated = allocated && costs->duration[k] != NULL;
  if (!allocated) {
    mp_sim_costs_free(costs);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the costs of %d stages", num_stages);
  }
  double per_chunk = 1.0 / virtual_stages;
  for (int s = 0; s < num_stages; ++s) {
    costs->duration[MP_ACTION_FORWARD][s] = 1.0 * per_chunk;
    costs->duration[MP_ACTION_BACKWARD][s] = 2.0 * per_chunk;
    costs->duration[MP_ACTION_BACKWARD_INPUT][s] = 1.0 * per_chunk;
    costs->duration[MP_ACTION_BACKWARD_WEIGHT][s] = 1.0 * per_chunk;
    costs->activation_memory[s] = per_chunk;
  }
  costs->p2p_latency = 0.0;
  costs->time_unit = MP_TIME_UNITS;
  costs->memory_unit = MP_MEMORY_MICRO_BATCHES;
  costs->p2p_model = MP_P2P_EAGER;
  return MP_OK;
}

void mp_simulation_free(mp_simulation *simulation) {
  for (int r = 0; r < simulation->pp; ++r) {
    if (simulation->start != NULL) free(simulation->start[r]);
    if (simulation->end != NULL) free(simulation->end[r]);
  }
  free(simulation->start);
  free(simulation->end);
  free(simulation->busy_time);
  free(simulation->rank_bubble_fraction);
  free(simulation->peak_activation_memory);
  free(simulation->peak_live);
  memset(simulation, 0, sizeof *simulation);
}

static mp_status check_costs(const mp_schedule *schedule, const mp_sim_costs *costs,
                             mp_error *err) {
  int num_stages = schedule->pp * schedule->virtual_stages;
  if (costs->num_stages != num_stages) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the costs describe %d stages but the schedule has pp x virtual stages = "
                   "%d x %d = %d",
                   costs->num_stages, schedule->pp, schedule->virtual_stages, num_stages);
  }
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    if (costs->duration[k] == NULL) {
      return mp_fail(err, MP_ERR_INPUT, "the costs have no durations for %s",
                     mp_action_kind_name((mp_action_kind)k));
    }
    for (int s = 0; s < num_stages; ++s) {
      double d = costs->duration[k][s];
      if (!isfinite(d) || d < 0) {
        return mp_fail(err, MP_ERR_INPUT,
                       "the %s duration of stage %d is %g; durations must be finite and >= 0",
                       mp_action_kind_name((mp_action_kind)k), s, d);
      }
    }
  }
  if (!isfinite(costs->p2p_latency) || costs->p2p_latency < 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the point-to-point latency is %g; it must be finite and >= 0",
                   costs->p2p_latency);
  }
  return MP_OK;
}

/* Allocates a (pp)(num_actions) table of doubles into *rows; false when out of memory. */
static bool alloc_table(const mp_schedule *schedule, double ***rows) {
  *rows = calloc((size_t)schedule->pp, sizeof **rows);
  if (*rows == NULL) return false;
  for (int r = 0; r < schedule->pp; ++r) {
    int n = schedule->ranks[r].num_actions;
    (*rows)[r] = calloc((size_t)(n > 0 ? n : 1), sizeof ***rows);
    if ((*rows)[r] == NULL) return false;
  }
  return true;
}

void mp_sim_prepared_free(mp_sim_prepared *prepared) {
  mp_p2p_matching_free(&prepared->matching);
  free(prepared->peak_live);
  memset(prepared, 0, sizeof *prepared);
}

mp_status mp_sim_prepare(const mp_schedule *schedule, mp_p2p_model model, mp_sim_prepared *out,
                         mp_error *err) {
  memset(out, 0, sizeof *out);
  MP_TRY(mp_schedule_check_matched(schedule, model, &out->matching, err));
  out->schedule = schedule;
  out->p2p_model = model;
  out->peak_live = calloc((size_t)schedule->pp, sizeof *out->peak_live);
  if (out->peak_live == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory preparing a schedule of %d ranks",
                   schedule->pp);
  }
  for (int r = 0; r < schedule->pp; ++r) out->peak_live[r] = mp_schedule_peak_live(schedule, r);
  return MP_OK;
}

mp_status mp_schedule_simulate(const mp_schedule *schedule, const mp_sim_costs *costs,
                               mp_simulation *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  mp_sim_prepared prepared;
  mp_status status = mp_sim_prepare(schedule, costs->p2p_model, &prepared, err);
  if (status == MP_OK) status = mp_schedule_simulate_prepared(&prepared, costs, out, err);
  mp_sim_prepared_free(&prepared);
  return status;
}

mp_status mp_schedule_simulate_prepared(const mp_sim_prepared *prepared, const mp_sim_costs *costs,
                                        mp_simulation *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  const mp_schedule *schedule = prepared->schedule;
  if (costs->p2p_model != prepared->p2p_model) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the costs ask for %s point-to-point, but the schedule was checked under %s",
                   mp_p2p_model_name(costs->p2p_model), mp_p2p_model_name(prepared->p2p_model));
  }
  MP_TRY(check_costs(schedule, costs, err));
  int pp = schedule->pp;
  out->pp = pp;
  out->time_unit = costs->time_unit;
  out->memory_unit = costs->memory_unit;
  out->p2p_model = costs->p2p_model;
  out->p2p_latency = costs->p2p_latency;
  double **durations = NULL;
  bool allocated = alloc_table(schedule, &out->start) && alloc_table(schedule, &out->end) &&
                   alloc_table(schedule, &durations);
  out->busy_time = calloc((size_t)pp, sizeof *out->busy_time);
  out->rank_bubble_fraction = calloc((size_t)pp, sizeof *out->rank_bubble_fraction);
  out->peak_activation_memory = calloc((size_t)pp, sizeof *out->peak_activation_memory);
  out->peak_live = calloc((size_t)pp, sizeof *out->peak_live);
  mp_status status = MP_OK;
  if (!allocated || out->busy_time == NULL || out->rank_bubble_fraction == NULL ||
      out->peak_activation_memory == NULL || out->peak_live == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory simulating %ld actions",
                     mp_schedule_total_actions(schedule));
  }
  if (status == MP_OK) {
    for (int r = 0; r < pp; ++r) {
      const mp_rank_actions *list = &schedule->ranks[r];
      for (int a = 0; a < list->num_actions; ++a) {
        const mp_action *action = &list->actions[a];
        int stage = mp_stage_index(pp, r, action->chunk);
        durations[r][a] = costs->duration[action->kind][stage];
      }
    }
    mp_p2p_timing timing = {(const double *const *)durations, costs->p2p_latency, out->start,
                            out->end};
    status = mp_p2p_replay(schedule, &prepared->matching, costs->p2p_model, &timing, err);
  }
  if (durations != NULL) {
    for (int r = 0; r < pp; ++r) free(durations[r]);
    free(durations);
  }
  if (status != MP_OK) return status;

  for (int r = 0; r < pp; ++r) {
    const mp_rank_actions *list = &schedule->ranks[r];
    double memory = 0, peak = 0;
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      int stage = mp_stage_index(pp, r, action->chunk);
      out->busy_time[r] += out->end[r][a] - out->start[r][a];
      if (out->end[r][a] > out->step_time) out->step_time = out->end[r][a];
      if (action->kind == MP_ACTION_FORWARD) {
        memory += costs->activation_memory[stage];
        if (memory > peak) peak = memory;
        /* A forward-only list drops an F's activations as it ends. */
        if (schedule->forward_only) memory -= costs->activation_memory[stage];
      } else if (action->kind != MP_ACTION_BACKWARD_INPUT) {
        memory -= costs->activation_memory[stage];
      }
    }
    out->peak_activation_memory[r] = peak;
    if (peak > out->max_peak_activation_memory) out->max_peak_activation_memory = peak;
    out->peak_live[r] = prepared->peak_live[r];
  }
  double sum = 0;
  for (int r = 0; r < pp; ++r) {
    out->rank_bubble_fraction[r] =
        out->step_time > 0 ? (out->step_time - out->busy_time[r]) / out->step_time : 0.0;
    sum += out->rank_bubble_fraction[r];
  }
  out->bubble_fraction = sum / pp;
  return MP_OK;
}
