/* schedules/timeline.c — the ascii timeline, the helpers the writers share, and the dispatch;
 * see timeline.h. The svg and chrome writers are timeline_svg.c and timeline_chrome.c. */
#include "schedules/timeline.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedules/timeline_internal.h"

const char *mp_timeline_format_name(mp_timeline_format format) {
  switch (format) {
    case MP_TIMELINE_ASCII: return "ascii";
    case MP_TIMELINE_SVG: return "svg";
    case MP_TIMELINE_CHROME: return "chrome";
  }
  return "unknown";
}

mp_status mp_timeline_format_parse(const char *name, mp_timeline_format *out, mp_error *err) {
  static const mp_timeline_format formats[] = {MP_TIMELINE_ASCII, MP_TIMELINE_SVG,
                                               MP_TIMELINE_CHROME};
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; ++i) {
    if (strcmp(name, mp_timeline_format_name(formats[i])) == 0) {
      *out = formats[i];
      return MP_OK;
    }
  }
  return mp_fail(err, MP_ERR_INPUT, "unknown timeline format '%s' (formats: ascii, svg, chrome)",
                 name);
}

char timeline_chunk_letter(int chunk) {
  if (chunk >= 0 && chunk < 26) return (char)('a' + chunk);
  return '+';
}

const char *timeline_label(const mp_schedule *schedule, const mp_action *action, char *out,
                           size_t out_bytes) {
  if (schedule->virtual_stages > 1) {
    snprintf(out, out_bytes, "%c%d%c", mp_action_kind_letter(action->kind), action->micro_batch,
             timeline_chunk_letter(action->chunk));
  } else {
    snprintf(out, out_bytes, "%c%d", mp_action_kind_letter(action->kind), action->micro_batch);
  }
  return out;
}

const char *timeline_title(const mp_schedule *schedule, const mp_timeline_options *options,
                           char *out, size_t out_bytes) {
  if (options != NULL && options->title != NULL) {
    snprintf(out, out_bytes, "%s", options->title);
  } else {
    const char *only = schedule->forward_only ? " forward only (evaluation)" : "";
    if (schedule->virtual_stages > 1) {
      snprintf(out, out_bytes, "%s%s, pp = %d, m = %d, v = %d",
               mp_schedule_kind_name(schedule->kind), only, schedule->pp,
               schedule->num_micro_batches, schedule->virtual_stages);
    } else {
      snprintf(out, out_bytes, "%s%s, pp = %d, m = %d", mp_schedule_kind_name(schedule->kind),
               only, schedule->pp, schedule->num_micro_batches);
    }
  }
  return out;
}

double timeline_display_time(const mp_simulation *simulation, double time) {
  return simulation->time_unit == MP_TIME_SECONDS ? time * 1e3 : time;
}

const char *timeline_time_unit(const mp_simulation *simulation) {
  return simulation->time_unit == MP_TIME_SECONDS ? "ms" : "time units";
}

const char *timeline_memory_unit(const mp_simulation *simulation) {
  return simulation->memory_unit == MP_MEMORY_BYTES ? "bytes" : "micro-batches of one rank's layers";
}

const char *timeline_phase_name(int phase) {
  static const char *const names[3] = {"warm-up", "steady", "cool-down"};
  return phase >= 0 && phase < 3 ? names[phase] : "";
}

void timeline_rank_phases(const mp_schedule *schedule, const mp_simulation *simulation, int rank,
                          timeline_phases *out) {
  const mp_rank_actions *list = &schedule->ranks[rank];
  double first_start = 0, first_backward = -1, last_forward_end = 0, last_end = 0;
  for (int a = 0; a < list->num_actions; ++a) {
    double start = simulation->start[rank][a], end = simulation->end[rank][a];
    if (a == 0) first_start = start;
    if (list->actions[a].kind == MP_ACTION_FORWARD) {
      if (end > last_forward_end) last_forward_end = end;
    } else if (first_backward < 0) {
      first_backward = start;
    }
    if (end > last_end) last_end = end;
  }
  if (first_backward < 0) first_backward = last_end;
  double steady_end = last_forward_end > first_backward ? last_forward_end : first_backward;
  out->start[0] = first_start;
  out->end[0] = first_backward;
  out->start[1] = first_backward;
  out->end[1] = steady_end;
  out->start[2] = steady_end;
  out->end[2] = last_end;
}

/* ---- ascii ----------------------------------------------------------------------------------- */

static int decimal_digits(int n) {
  int digits = 1;
  while (n >= 10) {
    n /= 10;
    ++digits;
  }
  return digits;
}

/* 1, 2 or 5 times a power of ten: the largest at most value (up: the smallest at least value). */
static double round_number(double value, bool up) {
  const double power = pow(10.0, floor(log10(value)));
  static const double steps[] = {1.0, 2.0, 5.0, 10.0};
  if (up) {
    for (int i = 0; i < 4; ++i) {
      if (steps[i] * power >= value * (1 - 1e-12)) return steps[i] * power;
    }
    return 10.0 * power;
  }
  for (int i = 3; i >= 0; --i) {
    if (steps[i] * power <= value * (1 + 1e-12)) return steps[i] * power;
  }
  return power;
}

/* The time one cell stands for: the shortest action (so every action gets whole cells under
 * unit costs), coarser when a row would have more than max_columns cells. Seconds (cost model or
 * measured durations) are rounded to a round number of milliseconds, so the axis reads
 * 0, 5, 10 ms rather than 0, 5.41283. */
static double ascii_cell_time(const mp_schedule *schedule, const mp_simulation *simulation,
                              int max_columns, int *columns) {
  double cell = 0;
  for (int r = 0; r < schedule->pp; ++r) {
    for (int a = 0; a < schedule->ranks[r].num_actions; ++a) {
      double d = simulation->end[r][a] - simulation->start[r][a];
      if (d > 1e-12 && (cell == 0 || d < cell)) cell = d;
    }
  }
  if (cell == 0) cell = 1;
  const bool seconds = simulation->time_unit == MP_TIME_SECONDS;
  if (seconds) cell = round_number(cell * 1e3, false) / 1e3;
  double needed = ceil(simulation->step_time / cell - 1e-9);
  if (needed > max_columns) {
    cell = simulation->step_time / max_columns;
    if (seconds) cell = round_number(cell * 1e3, true) / 1e3;
    needed = ceil(simulation->step_time / cell - 1e-9);
    if (needed > max_columns) needed = max_columns;
  }
  *columns = needed < 1 ? 1 : (int)needed;
  return cell;
}

static int cell_index(double time, double cell) { return (int)floor(time / cell + 0.5); }

static mp_status write_ascii(const mp_schedule *schedule, const mp_simulation *simulation,
                             const mp_timeline_options *options, mp_text *out) {
  int pp = schedule->pp;
  int label_width = 1 + decimal_digits(schedule->num_micro_batches - 1) +
                    (schedule->virtual_stages > 1 ? 1 : 0);
  int cell_width = label_width + 1;
  int max_width = options != NULL && options->max_width > 0 ? options->max_width : 320;
  int max_columns = max_width / cell_width > 1 ? max_width / cell_width : 1;
  int columns;
  double cell = ascii_cell_time(schedule, simulation, max_columns, &columns);
  int rank_width = 5 + decimal_digits(pp - 1); /* "rank 12" */
  char title[256];
  mp_text_printf(out, "%s\n\n", timeline_title(schedule, options, title, sizeof title));

  /* Time axis: a label every few cells, at least 8 characters apart. */
  int tick_cells = 1;
  static const int steps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; ++i) {
    tick_cells = steps[i];
    if (tick_cells * cell_width >= 8) break;
  }
  int row_chars = columns * cell_width;
  char *row = malloc((size_t)row_chars + 16);
  if (row == NULL) return MP_ERR_RUNTIME;
  memset(row, ' ', (size_t)row_chars + 15);
  row[row_chars + 15] = '\0';
  for (int c = 0; c <= columns; c += tick_cells) {
    char tick[32];
    int n = snprintf(tick, sizeof tick, "%g", timeline_display_time(simulation, c * cell));
    if (c * cell_width + n <= row_chars + 15) memcpy(row + c * cell_width, tick, (size_t)n);
  }
  int trimmed = row_chars + 15;
  while (trimmed > 0 && row[trimmed - 1] == ' ') --trimmed;
  row[trimmed] = '\0';
  mp_text_printf(out, "%*s   %s\n", rank_width, "", row);

  for (int r = 0; r < pp; ++r) {
    for (int c = 0; c < columns; ++c) {
      memset(row + c * cell_width, '.', (size_t)cell_width - 1);
      row[c * cell_width + cell_width - 1] = ' ';
    }
    row[row_chars] = '\0';
    const mp_rank_actions *list = &schedule->ranks[r];
    for (int a = 0; a < list->num_actions; ++a) {
      int first = cell_index(simulation->start[r][a], cell);
      int last = cell_index(simulation->end[r][a], cell);
      if (last <= first) last = first + 1;
      if (first >= columns) continue;
      if (last > columns) last = columns;
      char label[32];
      timeline_label(schedule, &list->actions[a], label, sizeof label);
      int span = (last - first) * cell_width;
      char *region = row + first * cell_width;
      int label_length = (int)strlen(label);
      for (int i = 0; i < span - 1; ++i) region[i] = i < label_length ? label[i] : '-';
      region[span - 1] = ' ';
    }
    int end = row_chars;
    while (end > 0 && row[end - 1] == ' ') --end;
    row[end] = '\0';
    mp_text_printf(out, "rank %-*d | %s  | idle %.1f%%\n", rank_width - 5, r, row,
                   100.0 * simulation->rank_bubble_fraction[r]);
  }
  free(row);

  bool split = false;
  for (int r = 0; r < pp && !split; ++r) {
    for (int a = 0; a < schedule->ranks[r].num_actions && !split; ++a) {
      split = schedule->ranks[r].actions[a].kind == MP_ACTION_BACKWARD_WEIGHT;
    }
  }
  double shown_cell = timeline_display_time(simulation, cell);
  mp_text_printf(out, "\n%s, the number is the micro-batch%s, '.' idle; one cell = %g %s\n",
                 split ? "F forward, B input-gradient backward, W weight-gradient backward"
                       : "F forward, B backward",
                 schedule->virtual_stages > 1 ? ", the letter after it the model chunk (a = 0)"
                                              : "",
                 shown_cell,
                 simulation->time_unit == MP_TIME_SECONDS ? "ms"
                 : shown_cell == 1.0                      ? "time unit"
                                                          : "time units");
  mp_text_printf(out, "%s: %g %s\n",
                 options != NULL && options->measured ? "pipeline time (first action to last)"
                                                      : "step time",
                 timeline_display_time(simulation, simulation->step_time),
                 timeline_time_unit(simulation));
  mp_text_printf(out, "bubble fraction: %.4f (idle share of the step, mean over ranks)\n",
                 simulation->bubble_fraction);
  mp_text_printf(out, "peak micro-batches alive:");
  for (int r = 0; r < pp && r < 16; ++r) {
    mp_text_printf(out, "%s rank %d: %d", r > 0 ? "," : "", r, simulation->peak_live[r]);
  }
  mp_text_printf(out, "%s\n", pp > 16 ? ", ..." : "");
  mp_text_printf(out, "peak activation memory: %g %s\n", simulation->max_peak_activation_memory,
                 timeline_memory_unit(simulation));
  if (options != NULL && options->measured) {
    mp_text_printf(out, "measured: times recorded by the run; its actions checked complete, "
                        "ordered, no deadlock under %s point-to-point\n",
                   mp_p2p_model_name(simulation->p2p_model));
  } else {
    mp_text_printf(out, "checked: complete, ordered, no deadlock under %s point-to-point%s\n",
                   mp_p2p_model_name(simulation->p2p_model),
                   simulation->p2p_latency > 0 ? " (with latency)" : "");
  }
  return MP_OK;
}

/* ---- dispatch -------------------------------------------------------------------------------- */

mp_status mp_timeline_write(const mp_schedule *schedule, const mp_simulation *simulation,
                            mp_timeline_format format, const mp_timeline_options *options,
                            mp_text *out, mp_error *err) {
  if (simulation->pp != schedule->pp || simulation->start == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the simulation (%d ranks) is not of this schedule (%d ranks); simulate it first",
                   simulation->pp, schedule->pp);
  }
  mp_status status = MP_ERR_INPUT;
  switch (format) {
    case MP_TIMELINE_ASCII: status = write_ascii(schedule, simulation, options, out); break;
    case MP_TIMELINE_SVG: status = timeline_write_svg(schedule, simulation, options, out); break;
    case MP_TIMELINE_CHROME:
      status = timeline_write_chrome(schedule, simulation, options, out);
      break;
  }
  if (status == MP_ERR_INPUT) {
    return mp_fail(err, MP_ERR_INPUT, "unknown timeline format %d", (int)format);
  }
  if (status != MP_OK || out->out_of_memory) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory drawing the %s timeline of %ld actions",
                   mp_timeline_format_name(format), mp_schedule_total_actions(schedule));
  }
  return MP_OK;
}

mp_status mp_timeline_write_file(const mp_schedule *schedule, const mp_simulation *simulation,
                                 mp_timeline_format format, const mp_timeline_options *options,
                                 FILE *file, const char *file_name, mp_error *err) {
  mp_text text = MP_TEXT_INITIALIZER;
  mp_status status = mp_timeline_write(schedule, simulation, format, options, &text, err);
  if (status == MP_OK && text.length > 0 && fwrite(text.data, 1, text.length, file) != text.length) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot write the %zu-byte timeline", file_name,
                     text.length);
  }
  mp_text_free(&text);
  return status;
}
