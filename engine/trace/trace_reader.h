/*
 * engine/trace/trace_reader.h — a trace written by `mpengine run --trace` (engine/trace/trace.h)
 * read back, for `mpengine timeline`: one step of it as what schedules/timeline.h draws, and the
 * measured durations per stage and action kind that `timeline --against` sets beside the cost
 * model's.
 *
 * The drawing. schedules/timeline.h draws an mp_schedule and an mp_simulation. The schedule here
 * is the one the ranks really ran in that step: pipeline rank p's list is the actions world rank
 * (dp 0, pp p, tp 0) recorded in the step, in the order they started (its dp and tp replicas run
 * the same list). It must be a complete schedule (mp_schedule_check under the eager model, which
 * the runtime executes), or the step is refused naming what is missing: a trace that dropped
 * events, or one cut short, says so instead of drawing a wrong picture. The simulation holds the
 * measured times, in seconds, with 0 at the earliest start of those ranks' actions in the step;
 * its definitions are the simulator's (schedules/simulator.h): step_time is the last end (the
 * pipeline time of the step), a rank's bubble fraction is (step_time - its busy time) /
 * step_time, bubble_fraction their mean. Activation memory counts micro-batches of one rank's
 * layers (1 / v per chunk alive), as with unit costs.
 *
 * The measurement (mp_trace_measure_step). Per stage and action kind, the mean duration of the
 * step's actions over its micro-batches and over every dp and tp replica of the stage. The step
 * time is the span of the step's "step" slices over all ranks (mp_trace_step: data, actions,
 * gradient reduction and optimizer) when the run recorded them, else the span of all the step's
 * events (actions and communication) over all ranks.
 *
 * Errors are MP_ERR_INPUT naming the file and the JSON path ("trace.json: $.traceEvents[12].args:
 * missing required key \"stage\" ..."), or the file and the step. Needs no MPI job, nor MPI's
 * library: the reader shares only engine/trace/trace_format.h with the recorder.
 */
#ifndef MPENGINE_ENGINE_TRACE_READER_H
#define MPENGINE_ENGINE_TRACE_READER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/trace/trace_format.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_trace_file mp_trace_file;

/* What the "mpengine" object and the events say about the run as a whole. */
typedef struct {
  mp_trace_layout layout;
  int world_size;        /* dp x pp x tp */
  bool complete;         /* false when a rank dropped events (out of memory while recording) */
  int64_t dropped_events;
  int num_steps;         /* distinct steps with actions, from the events */
  int64_t first_step;    /* the smallest and largest of them; -1 when there are none */
  int64_t last_step;
} mp_trace_summary;

/* Reads and validates a trace file (any size that fits in memory). MP_ERR_INPUT naming the file
 * (and the line and column, or the JSON path) when it cannot be read, is not JSON, is not an
 * mpengine trace (no "mpengine" object, another format or version), misses a key, or has an
 * event outside the layout (a rank, micro-batch, chunk or stage out of range); MP_ERR_RUNTIME
 * when out of memory. Free with mp_trace_file_free. */
mp_status mp_trace_read(const char *path, mp_trace_file **out, mp_error *err);
void mp_trace_file_free(mp_trace_file *file);

const mp_trace_summary *mp_trace_file_summary(const mp_trace_file *file);

/* Whether some rank recorded an action in `step`. */
bool mp_trace_file_has_step(const mp_trace_file *file, int64_t step);

/* Step `step` as a drawing (see the top of this file): *schedule (its kind the trace's schedule)
 * and *simulation (time_unit seconds). MP_ERR_INPUT naming the file when the step is not in the
 * trace (with the steps that are), the schedule kind is unknown, or the recorded actions are not a
 * complete schedule. Free both with mp_schedule_free and mp_simulation_free, also after a
 * failure. */
mp_status mp_trace_step_timeline(const mp_trace_file *file, int64_t step, mp_schedule *schedule,
                                 mp_simulation *simulation, mp_error *err);

/* What one step measured, per stage (pp x virtual_stages) and action kind. */
typedef struct {
  int64_t step;
  int num_stages;
  double *mean_s[MP_NUM_ACTION_KINDS]; /* (num_stages) mean duration in seconds; 0 where count
                                          is 0 */
  int *count[MP_NUM_ACTION_KINDS];     /* (num_stages) actions averaged */
  double step_s;                       /* the step time (see the top of this file) */
  bool step_from_step_slices;          /* true: from the "step" slices; false: from all events */
} mp_trace_step_measurement;

/* Fills *out for `step`. MP_ERR_INPUT when the step is not in the trace, MP_ERR_RUNTIME when out
 * of memory. Free with mp_trace_step_measurement_free, also after a failure. */
mp_status mp_trace_measure_step(const mp_trace_file *file, int64_t step,
                                mp_trace_step_measurement *out, mp_error *err);
void mp_trace_step_measurement_free(mp_trace_step_measurement *measurement);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TRACE_READER_H */
