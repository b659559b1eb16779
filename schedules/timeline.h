/*
 * schedules/timeline.h — drawing a simulated schedule so a person sees its bubbles at a glance.
 *
 *   ascii   one row per rank, time left to right, each cell the action and its micro-batch ("F3";
 *           "F3b" for micro-batch 3 on chunk b = 1 when interleaved), idle cells as dots, each
 *           row's idle share at its end; then the step time, the bubble fraction and the peak
 *           memory. For terminals and logs.
 *   svg     one lane per rank, a colour per action kind and a shade per micro-batch, arrows for
 *           the sends, a band under each lane naming its warm-up, steady and cool-down phases, a
 *           time axis (milliseconds once durations are seconds). Opens in any browser.
 *   chrome  Chrome trace event JSON (Perfetto, chrome://tracing): one track per rank, one "X"
 *           slice per action, flow events ("s" on the sender's slice, "f" on the receiver's)
 *           linking each send to its receive. Abstract time units are written as milliseconds.
 *
 * Writers print into an mp_text (text.h), so the same code serves files, stdout and tests.
 */
#ifndef MPENGINE_SCHEDULES_TIMELINE_H
#define MPENGINE_SCHEDULES_TIMELINE_H

#include <stdbool.h>
#include <stdio.h>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "schedules/text.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_TIMELINE_ASCII = 0,
  MP_TIMELINE_SVG = 1,
  MP_TIMELINE_CHROME = 2,
} mp_timeline_format;

/* "ascii", "svg", "chrome". */
const char *mp_timeline_format_name(mp_timeline_format format);

/* Fails with MP_ERR_INPUT listing the formats on an unknown name. */
mp_status mp_timeline_format_parse(const char *name, mp_timeline_format *out, mp_error *err);

typedef struct {
  int max_width;     /* ascii: the most characters a row's time cells may take; past it a cell
                        stands for more time and short actions lose their labels; 0: 320 */
  const char *title; /* svg and chrome heading; NULL: "<kind>, pp = P, m = M[, v = V]" */
  bool measured;     /* the times were recorded by a run (engine/trace/trace_reader.h), not simulated:
                        the ascii footer and the chrome trace's "otherData" say so */
} mp_timeline_options;

#define MP_TIMELINE_OPTIONS_INITIALIZER {0, NULL, false}

/* Appends the timeline of `schedule` as simulated in `simulation` to out. options may be NULL.
 * Fails with MP_ERR_INPUT when the simulation is not of this schedule (a different number of
 * ranks), MP_ERR_RUNTIME when out of memory. */
mp_status mp_timeline_write(const mp_schedule *schedule, const mp_simulation *simulation,
                            mp_timeline_format format, const mp_timeline_options *options,
                            mp_text *out, mp_error *err);

/* The same, written to an open file; `file_name` names it in messages. */
mp_status mp_timeline_write_file(const mp_schedule *schedule, const mp_simulation *simulation,
                                 mp_timeline_format format, const mp_timeline_options *options,
                                 FILE *file, const char *file_name, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_TIMELINE_H */
