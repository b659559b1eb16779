/*
 * schedules/timeline_internal.h — what the three timeline writers (timeline.c for ascii and the
 * dispatch, timeline_svg.c, timeline_chrome.c) share. Not part of the public API.
 */
#ifndef MPENGINE_SCHEDULES_TIMELINE_INTERNAL_H
#define MPENGINE_SCHEDULES_TIMELINE_INTERNAL_H

#include <stddef.h>

#include "schedules/timeline.h"

/* "F3", "B3", "W3"; with chunks a chunk letter follows: "F3a" is chunk 0, "F3b" chunk 1. */
const char *timeline_label(const mp_schedule *schedule, const mp_action *action, char *out,
                           size_t out_bytes);

/* The letter of a chunk in labels: 'a' + chunk (then digits past 'z'). */
char timeline_chunk_letter(int chunk);

/* "1f1b, pp = 4, m = 8" (", v = 2" with chunks), or options->title. */
const char *timeline_title(const mp_schedule *schedule, const mp_timeline_options *options,
                           char *out, size_t out_bytes);

/* Time as shown: abstract units as they are, seconds as milliseconds. */
double timeline_display_time(const mp_simulation *simulation, double time);

/* "time units" or "ms". */
const char *timeline_time_unit(const mp_simulation *simulation);

/* "micro-batches of one rank's layers" or "bytes". */
const char *timeline_memory_unit(const mp_simulation *simulation);

/* A rank's phases in time: warm-up [first start, first backward start), steady [that, last
 * forward end), cool-down [that, last end]. An empty phase has start == end. */
typedef struct {
  double start[3];
  double end[3];
} timeline_phases;

/* "warm-up", "steady", "cool-down" for phase 0, 1, 2. */
const char *timeline_phase_name(int phase);

void timeline_rank_phases(const mp_schedule *schedule, const mp_simulation *simulation, int rank,
                          timeline_phases *out);

mp_status timeline_write_svg(const mp_schedule *schedule, const mp_simulation *simulation,
                             const mp_timeline_options *options, mp_text *out);
mp_status timeline_write_chrome(const mp_schedule *schedule, const mp_simulation *simulation,
                                const mp_timeline_options *options, mp_text *out);

#endif /* MPENGINE_SCHEDULES_TIMELINE_INTERNAL_H */
