/*
 * tools/cmd_timeline.c — `mpengine timeline`: what a run really did. Reads the trace that
 * `mpengine run --trace TRACE.json` recorded (engine/trace/trace_reader.h), draws one step of it with
 * the writers of `mpengine schedule` (ascii, svg or chrome), prints the measured bubble fraction
 * of each pipeline rank and the step time, and with --against PLAN.json sets the cost model's
 * prediction for the plan (topology/cost_model.h) beside the measurement, per stage and action
 * kind, with the error of the prediction.
 *
 *   mpengine timeline TRACE.json [--step N] [--format ascii|svg|chrome] [--out FILE]
 *                     [--against PLAN.json]
 *
 * Every input is read and checked before anything is printed, so a refusal (exit 2) leaves no
 * half output. The drawing goes to --out (written through a temporary name renamed into place) or
 * to stdout; the measurement and the comparison go to stdout, or to stderr when an svg or chrome
 * drawing fills stdout. Needs no MPI job.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "engine/trace/trace_reader.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "schedules/timeline.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "topology/cluster.h"
#include "topology/cost_model.h"
#include "topology/model.h"
#include "topology/plan.h"

/* The kinds the comparison shows: F, B (whole, or zero-bubble's input gradient) and W. */
enum { SHOWN_F = 0, SHOWN_B = 1, SHOWN_W = 2, NUM_SHOWN = 3 };
static const char kShownLetter[NUM_SHOWN] = {'F', 'B', 'W'};

/* What --against adds: the plan's prediction. */
typedef struct {
  const char *path;
  mp_plan plan;
  mp_estimate *estimate; /* calloc'd: it is large */
  bool zero_bubble;
} prediction;

/* Refuses a plan whose layout is not the trace's, naming every difference. */
static mp_status check_same_layout(const char *plan_path, const mp_plan *plan,
                                   const char *trace_path, const mp_trace_layout *layout,
                                   mp_error *err) {
  char differences[1024] = "";
  size_t used = 0;
  const struct {
    const char *name;
    long long in_plan, in_trace;
  } sizes[] = {
      {"pp", plan->pp, layout->pp},
      {"virtual stages", plan->virtual_stages, layout->virtual_stages},
      {"micro-batches", (long long)plan->num_micro_batches, layout->num_micro_batches},
      /* A trace's dp counts the weights' replicas: dp x cp with context parallelism. */
      {plan->cp > 1 ? "dp x cp" : "dp", mp_plan_replicas(plan), layout->dp},
      {"tp", plan->tp, layout->tp},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    if (sizes[i].in_plan == sizes[i].in_trace || used >= sizeof differences) continue;
    used += (size_t)snprintf(differences + used, sizeof differences - used,
                             "%s%s %lld in the plan, %lld in the trace", used > 0 ? "; " : "",
                             sizes[i].name, sizes[i].in_plan, sizes[i].in_trace);
  }
  if (strcmp(plan->schedule, layout->schedule) != 0 && used < sizeof differences) {
    used += (size_t)snprintf(differences + used, sizeof differences - used,
                             "%sschedule %s in the plan, %s in the trace", used > 0 ? "; " : "",
                             plan->schedule, layout->schedule);
  }
  if (used == 0) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "--against %s: the plan's layout differs from the one %s recorded (%s); give "
                 "the plan the run used%s%s",
                 plan_path, trace_path, differences, layout->plan[0] != '\0' ? ": " : "",
                 layout->plan);
}

/* Reads the plan, checks it is the trace's layout, and predicts it with the cost model. */
static mp_status predict(const char *plan_path, const char *trace_path,
                         const mp_trace_layout *layout, prediction *out, mp_error *err) {
  out->path = plan_path;
  MP_TRY(mp_plan_load(plan_path, &out->plan, err));
  MP_TRY(check_same_layout(plan_path, &out->plan, trace_path, layout, err));
  out->zero_bubble = strcmp(out->plan.schedule, "zb-h1") == 0;
  out->estimate = calloc(1, sizeof *out->estimate);
  if (out->estimate == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  return mp_cost_estimate_plan(&out->plan, NULL, out->estimate, err);
}

/* The measured mean of a shown kind on a stage, merging the backward kinds the schedule uses. */
static double measured_mean(const mp_trace_step_measurement *m, int shown, int stage,
                            int *count) {
  static const mp_action_kind kF[] = {MP_ACTION_FORWARD};
  static const mp_action_kind kB[] = {MP_ACTION_BACKWARD, MP_ACTION_BACKWARD_INPUT};
  static const mp_action_kind kW[] = {MP_ACTION_BACKWARD_WEIGHT};
  const mp_action_kind *kinds = shown == SHOWN_F ? kF : shown == SHOWN_B ? kB : kW;
  const int num_kinds = shown == SHOWN_B ? 2 : 1;
  double sum = 0.0;
  *count = 0;
  for (int i = 0; i < num_kinds; ++i) {
    sum += m->mean_s[kinds[i]][stage] * m->count[kinds[i]][stage];
    *count += m->count[kinds[i]][stage];
  }
  return *count > 0 ? sum / *count : 0.0;
}

static double predicted_seconds(const prediction *p, int shown, int stage) {
  const mp_estimate *e = p->estimate;
  switch (shown) {
    case SHOWN_F: return e->stage_forward_s[stage];
    case SHOWN_B:
      return p->zero_bubble ? e->stage_backward_s[stage] - e->stage_weight_gradient_s[stage]
                            : e->stage_backward_s[stage];
    default: return e->stage_weight_gradient_s[stage];
  }
}

/* "+12.3%", or "-" when there is nothing to divide by. */
static const char *error_text(double predicted, double measured, char *out, size_t out_bytes) {
  if (!(measured > 0.0)) {
    snprintf(out, out_bytes, "-");
  } else {
    snprintf(out, out_bytes, "%+.1f%%", 100.0 * (predicted - measured) / measured);
  }
  return out;
}

static void print_measurement(FILE *stream, const char *trace_path, const mp_trace_summary *summary,
                              const mp_simulation *simulation,
                              const mp_trace_step_measurement *measurement) {
  fprintf(stream, "\nmeasured step %lld of %s (steps %lld to %lld recorded; each pipeline rank "
                  "shown by its rank at dp 0, tp 0)\n",
          (long long)measurement->step, trace_path, (long long)summary->first_step,
          (long long)summary->last_step);
  if (!summary->complete) {
    fprintf(stream, "note: the trace is incomplete: %lld events were dropped while recording\n",
            (long long)summary->dropped_events);
  }
  fprintf(stream, "%8s %12s %12s %8s\n", "pp rank", "busy ms", "idle ms", "bubble");
  for (int p = 0; p < simulation->pp; ++p) {
    const double busy = simulation->busy_time[p];
    fprintf(stream, "%8d %12.3f %12.3f %8.4f\n", p, 1e3 * busy,
            1e3 * (simulation->step_time - busy), simulation->rank_bubble_fraction[p]);
  }
  fprintf(stream, "pipeline time: %.3f ms (first action to last); bubble fraction %.4f (mean "
                  "over pipeline ranks)\n",
          1e3 * simulation->step_time, simulation->bubble_fraction);
  fprintf(stream, "step time: %.3f ms (%s)\n", 1e3 * measurement->step_s,
          measurement->step_from_step_slices
              ? "the run's step slices: data, actions, gradient reduction and optimizer"
              : "first to last recorded event of the step on any rank");
}

static void print_comparison(FILE *stream, const prediction *p, const mp_simulation *simulation,
                             const mp_trace_step_measurement *measurement) {
  const mp_estimate *e = p->estimate;
  char error[32];
  fprintf(stream, "\nprediction of %s (cost model on cluster %s) against step %lld measured\n",
          p->path, p->plan.cluster, (long long)measurement->step);
  fprintf(stream, "%5s %5s %13s %12s %9s %8s\n", "stage", "kind", "predicted ms", "measured ms",
          "error", "actions");
  for (int s = 0; s < measurement->num_stages && s < e->num_stages; ++s) {
    for (int shown = 0; shown < NUM_SHOWN; ++shown) {
      if (shown == SHOWN_W && !p->zero_bubble) continue;
      int count = 0;
      const double measured = measured_mean(measurement, shown, s, &count);
      const double predicted = predicted_seconds(p, shown, s);
      if (count == 0) {
        fprintf(stream, "%5d %5c %13.3f %12s %9s %8d\n", s, kShownLetter[shown], 1e3 * predicted,
                "-", "-", 0);
      } else {
        fprintf(stream, "%5d %5c %13.3f %12.3f %9s %8d\n", s, kShownLetter[shown],
                1e3 * predicted, 1e3 * measured,
                error_text(predicted, measured, error, sizeof error), count);
      }
    }
  }
  fprintf(stream, "%-11s %13.3f %12.3f %9s\n", "pipeline ms", 1e3 * e->pipeline_s,
          1e3 * simulation->step_time,
          error_text(e->pipeline_s, simulation->step_time, error, sizeof error));
  fprintf(stream, "%-11s %13.3f %12.3f %9s\n", "step ms", 1e3 * e->step_s,
          1e3 * measurement->step_s, error_text(e->step_s, measurement->step_s, error,
                                                sizeof error));
  fprintf(stream, "%-11s %13.4f %12.4f %+9.4f (predicted - measured)\n", "bubble",
          e->bubble_fraction, simulation->bubble_fraction,
          e->bubble_fraction - simulation->bubble_fraction);
  fprintf(stream, "error = (predicted - measured) / measured: negative where the run was slower "
                  "than predicted; measured = the mean over the step's micro-batches and every "
                  "dp and tp replica of the stage\n");
}

int cmd_timeline(int argc, char **argv) {
  cli_option options[] = {
      {"step", "N", "the step to show (default: the last recorded; the first includes warm-up)",
       NULL},
      {"format", "F", "ascii (default), svg or chrome (trace event JSON for Perfetto)", NULL},
      {"out", "FILE", "write the drawing to FILE instead of stdout", NULL},
      {"against", "PLAN.json",
       "compare with the plan's predicted time per stage and action kind (the run's plan)", NULL},
      {0},
  };
  cli_command command = {
      .command = "timeline",
      .usage = "mpengine timeline TRACE.json [--step N] [--format ascii|svg|chrome] [--out FILE] "
               "[--against PLAN.json]",
      .summary =
          "Show what a run really did: one step of the trace `mpengine run --trace` recorded, "
          "drawn like `mpengine schedule` draws a plan (one row per pipeline rank, the actions "
          "it ran at their measured times), with the measured bubble fraction of each pipeline "
          "rank and the step time. --against PLAN.json sets the cost model's prediction for the "
          "plan beside the measurement: per stage and action kind, the pipeline and step time "
          "and the bubble, with the error of the prediction.",
      .min_positionals = 1,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  const char *trace_path = command.positionals[0];
  mp_timeline_format format = MP_TIMELINE_ASCII;
  const char *format_name = cli_value(&command, "format");
  if (format_name != NULL && mp_timeline_format_parse(format_name, &format, &err) != MP_OK) {
    mp_error_prefix(&err, "--format");
    return cli_report(&command, &err);
  }
  int64_t step_option = -1;
  if (cli_int(&command, "step", 0, -1, &step_option, &err) != MP_OK) {
    return cli_report(&command, &err);
  }

  mp_trace_file *trace = NULL;
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_simulation simulation;
  mp_trace_step_measurement measurement;
  prediction predicted;
  mp_text text = MP_TEXT_INITIALIZER;
  memset(&simulation, 0, sizeof simulation);
  memset(&measurement, 0, sizeof measurement);
  memset(&predicted, 0, sizeof predicted);
  mp_status status = mp_trace_read(trace_path, &trace, &err);
  const mp_trace_summary *summary = status == MP_OK ? mp_trace_file_summary(trace) : NULL;
  const int64_t step = step_option >= 0 || summary == NULL ? step_option : summary->last_step;
  if (status == MP_OK) status = mp_trace_step_timeline(trace, step, &schedule, &simulation, &err);
  if (status == MP_OK) status = mp_trace_measure_step(trace, step, &measurement, &err);
  const char *against = cli_value(&command, "against");
  if (status == MP_OK && against != NULL) {
    status = predict(against, trace_path, &summary->layout, &predicted, &err);
  }
  char title[1200];
  if (status == MP_OK) {
    const mp_trace_layout *layout = &summary->layout;
    int used = snprintf(title, sizeof title, "%s, step %lld (measured): %s, pp = %d, m = %d",
                        trace_path, (long long)step, mp_schedule_kind_name(schedule.kind),
                        layout->pp, layout->num_micro_batches);
    if (layout->virtual_stages > 1 && used > 0 && (size_t)used < sizeof title) {
      snprintf(title + used, sizeof title - (size_t)used, ", v = %d", layout->virtual_stages);
    }
    mp_timeline_options draw_options = MP_TIMELINE_OPTIONS_INITIALIZER;
    draw_options.title = title;
    draw_options.measured = true;
    status = mp_timeline_write(&schedule, &simulation, format, &draw_options, &text, &err);
  }
  const char *out_path = cli_value(&command, "out");
  if (status == MP_OK && out_path != NULL) {
    status = mp_write_file_atomically(out_path, text.data, text.length, &err);
    if (status == MP_OK) {
      fprintf(stderr, "mpengine timeline: wrote the %s timeline of step %lld to %s\n",
              mp_timeline_format_name(format), (long long)step, out_path);
    }
  } else if (status == MP_OK) {
    fwrite(mp_text_string(&text), 1, text.length, stdout);
    fflush(stdout);
  }
  if (status == MP_OK) {
    FILE *stream = out_path == NULL && format != MP_TIMELINE_ASCII ? stderr : stdout;
    print_measurement(stream, trace_path, summary, &simulation, &measurement);
    if (against != NULL) print_comparison(stream, &predicted, &simulation, &measurement);
  }
  mp_text_free(&text);
  free(predicted.estimate);
  mp_trace_step_measurement_free(&measurement);
  mp_simulation_free(&simulation);
  mp_schedule_free(&schedule);
  mp_trace_file_free(trace);
  return status == MP_OK ? CLI_EXIT_OK : cli_report(&command, &err);
}
