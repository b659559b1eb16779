/*
 * tools/cmd_schedule.c — `mpengine schedule`: generate a pipeline schedule, check it, simulate it
 * and print its timeline (ascii, svg or chrome trace JSON), before anything runs.
 *
 *   mpengine schedule --config PLAN.json
 *   mpengine schedule --pp P --micro-batches M [--virtual V] --kind K
 *   ... --eval   the forward-only list of the same layout (a held-out loss, run --eval-every)
 *
 * With --config the durations are the cost model's for the plan (topology/cost_model.h: each
 * stage's forward, backward and zero-bubble weight-gradient seconds on the plan's cluster, with
 * its layers_per_stage, and the p2p time of one activation) — the same prediction `mpengine plan`
 * simulates and `mpengine timeline --against` compares with a run. --unit-costs, and every
 * schedule given by --pp/--kind, use unit costs instead (F = 1, B = 2 per rank's layers;
 * zero-bubble B = 1, W = 1). A plan is read whole by topology/plan.h (so a typo
 * is refused, never defaulted), and a schedule uses $.parallel.pp, $.parallel.virtual_stages,
 * $.batch.num_micro_batches and $.schedule. --out is written through a temporary name and renamed
 * into place, so an interrupted run never leaves half a file.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schedules/checker.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "schedules/timeline.h"
#include "common/atomic_file.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "topology/cost_model.h"
#include "topology/plan.h"

typedef struct {
  mp_schedule_kind kind;
  int pp;
  int num_micro_batches;
  int virtual_stages;
  bool has_plan;
  mp_plan plan; /* with --config */
} schedule_request;

static int clamp_int(int64_t value) { return value > INT_MAX ? INT_MAX : (int)value; }

/* The four numbers a schedule needs, from a plan read by the plan reader (topology/plan.h), which
 * refuses unknown keys and inconsistent batches with the file and JSON path named. */
static mp_status read_plan(const char *path, schedule_request *request, mp_error *err) {
  mp_plan *plan_read = &request->plan;
  MP_TRY(mp_plan_load(path, plan_read, err));
  request->has_plan = true;
  const mp_plan plan = *plan_read;
  if (mp_schedule_kind_parse(plan.schedule, &request->kind, err) != MP_OK) {
    return mp_error_prefix(err, "%s: $.schedule", path);
  }
  request->pp = plan.pp;
  request->virtual_stages = plan.virtual_stages;
  request->num_micro_batches = clamp_int(plan.num_micro_batches);
  return MP_OK;
}

static mp_status read_options(const cli_command *command, schedule_request *request,
                              mp_error *err) {
  const char *config = cli_value(command, "config");
  static const char *const plan_free[] = {"pp", "micro-batches", "virtual", "kind"};
  if (config != NULL) {
    for (int i = 0; i < 4; ++i) {
      if (cli_value(command, plan_free[i]) != NULL) {
        return mp_fail(err, MP_ERR_INPUT,
                       "give either --config PLAN.json or --pp, --micro-batches and --kind, not "
                       "both (--%s with --config)",
                       plan_free[i]);
      }
    }
    return read_plan(config, request, err);
  }
  const char *missing[3];
  int num_missing = 0;
  for (int i = 0; i < 4; ++i) {
    if (i != 2 && cli_value(command, plan_free[i]) == NULL) missing[num_missing++] = plan_free[i];
  }
  if (num_missing > 0) {
    char list[96] = "";
    size_t used = 0;
    for (int i = 0; i < num_missing; ++i) {
      used += (size_t)snprintf(list + used, sizeof list - used, "%s--%s",
                               i == 0 ? "" : i + 1 == num_missing ? " and " : ", ", missing[i]);
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "missing option %s: give --pp, --micro-batches and --kind, or --config "
                   "PLAN.json",
                   list);
  }
  int64_t pp, num_micro_batches, virtual_stages;
  MP_TRY(cli_int(command, "pp", 1, 1, &pp, err));
  MP_TRY(cli_int(command, "micro-batches", 1, 1, &num_micro_batches, err));
  MP_TRY(cli_int(command, "virtual", 1, 1, &virtual_stages, err));
  MP_TRY(mp_schedule_kind_parse(cli_value(command, "kind"), &request->kind, err));
  request->pp = clamp_int(pp);
  request->num_micro_batches = clamp_int(num_micro_batches);
  request->virtual_stages = clamp_int(virtual_stages);
  return MP_OK;
}

static mp_status parse_latency(const cli_command *command, double *out, mp_error *err) {
  const char *text = cli_value(command, "latency");
  *out = 0.0;
  if (text == NULL) return MP_OK;
  char *end = NULL;
  double value = strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0) || value > 1e12) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--latency: expected a non-negative number of time units, got '%s'", text);
  }
  *out = value;
  return MP_OK;
}

int cmd_schedule(int argc, char **argv) {
  cli_option options[] = {
      {"config", "PLAN.json", "read pp, virtual stages, micro-batches and the kind from a plan",
       NULL},
      {"pp", "P", "pipeline ranks (without --config)", NULL},
      {"micro-batches", "M", "micro-batches per step (without --config)", NULL},
      {"virtual", "V", "model chunks per rank, interleaved-1f1b only (default 1)", NULL},
      {"kind", "K", "gpipe, 1f1b, interleaved-1f1b or zb-h1 (without --config)", NULL},
      {"format", "F", "ascii (default), svg or chrome (trace event JSON for Perfetto)", NULL},
      {"out", "FILE", "write the timeline to FILE instead of stdout", NULL},
      {"latency", "T", "point-to-point latency per message, in time units (ms with a plan's costs; default 0, or the cost model's)", NULL},
      {"p2p", "MODEL", "eager (default, what the runtime does) or rendezvous (batched blocking)",
       NULL},
      {"unit-costs", NULL, "with --config: unit costs (F = 1, B = 2) instead of the cost model's",
       NULL},
      {"eval", NULL, "the forward-only list the same layout runs for a held-out loss (mpengine run --eval-every)", NULL},
      {0},
  };
  cli_command command = {
      .command = "schedule",
      .usage = "mpengine schedule --config PLAN.json | --pp P --micro-batches M [--virtual V] "
               "--kind gpipe|1f1b|interleaved-1f1b|zb-h1 [--format ascii|svg|chrome] "
               "[--out FILE] [--eval]",
      .summary =
          "Show the timeline a pipeline schedule will execute. The schedule is generated as "
          "data, checked (every micro-batch forward and backward through every chunk once, in "
          "order, no deadlock under the runtime's point-to-point semantics) and simulated: a "
          "plan (--config) with the cost model's durations of its stages on its cluster (what "
          "`mpengine plan` predicts), otherwise with unit costs (F = 1, B = 2; zero-bubble B = 1, "
          "W = 1); then drawn with its bubble fraction and peak activation memory.",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  static schedule_request request; /* holds a whole plan: off the stack */
  request.kind = MP_SCHEDULE_1F1B;
  request.virtual_stages = 1;
  mp_timeline_format format = MP_TIMELINE_ASCII;
  mp_p2p_model p2p_model = MP_P2P_EAGER;
  double latency = 0.0;
  if (read_options(&command, &request, &err) != MP_OK) return cli_report(&command, &err);
  const char *format_name = cli_value(&command, "format");
  if (format_name != NULL && mp_timeline_format_parse(format_name, &format, &err) != MP_OK) {
    mp_error_prefix(&err, "--format");
    return cli_report(&command, &err);
  }
  const char *p2p_name = cli_value(&command, "p2p");
  if (p2p_name != NULL && mp_p2p_model_parse(p2p_name, &p2p_model, &err) != MP_OK) {
    mp_error_prefix(&err, "--p2p");
    return cli_report(&command, &err);
  }
  if (parse_latency(&command, &latency, &err) != MP_OK) return cli_report(&command, &err);

  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_sim_costs costs;
  mp_simulation simulation;
  mp_text text = MP_TEXT_INITIALIZER;
  memset(&costs, 0, sizeof costs);
  memset(&simulation, 0, sizeof simulation);
  mp_status status =
      cli_flag(&command, "eval")
          ? mp_schedule_generate_forward_only(request.kind, request.pp,
                                              request.num_micro_batches, request.virtual_stages,
                                              &schedule, &err)
          : mp_schedule_generate(request.kind, request.pp, request.num_micro_batches,
                                 request.virtual_stages, &schedule, &err);
  const char *config = cli_value(&command, "config");
  if (status != MP_OK && config != NULL) mp_error_prefix(&err, "%s", config);
  const bool predicted = request.has_plan && !cli_flag(&command, "unit-costs");
  if (status == MP_OK && predicted) {
    mp_estimate *estimate = calloc(1, sizeof *estimate);
    status = estimate == NULL ? mp_fail(&err, MP_ERR_RUNTIME, "out of memory")
                              : mp_cost_estimate_plan(&request.plan, NULL, estimate, &err);
    if (status == MP_OK) status = mp_cost_sim_costs(estimate, &costs, &err);
    free(estimate);
    if (status == MP_OK && cli_value(&command, "latency") != NULL) {
      costs.p2p_latency = latency * 1e-3; /* the option's time unit is ms here */
    }
  } else if (status == MP_OK) {
    status = mp_sim_costs_init_unit(&costs, request.pp, request.virtual_stages, &err);
    if (status == MP_OK) costs.p2p_latency = latency;
  }
  if (status == MP_OK) {
    costs.p2p_model = p2p_model;
    status = mp_schedule_simulate(&schedule, &costs, &simulation, &err);
  }
  if (status == MP_OK) {
    status = mp_timeline_write(&schedule, &simulation, format, NULL, &text, &err);
  }
  const char *out_path = cli_value(&command, "out");
  if (status == MP_OK && out_path != NULL) {
    status = mp_write_file_atomically(out_path, text.data, text.length, &err);
    if (status == MP_OK) {
      fprintf(stderr, "mpengine schedule: wrote the %s timeline to %s (bubble fraction %.4f)\n",
              mp_timeline_format_name(format), out_path, simulation.bubble_fraction);
    }
  } else if (status == MP_OK) {
    fwrite(mp_text_string(&text), 1, text.length, stdout);
  }
  mp_text_free(&text);
  mp_simulation_free(&simulation);
  mp_sim_costs_free(&costs);
  mp_schedule_free(&schedule);
  return status == MP_OK ? CLI_EXIT_OK : cli_report(&command, &err);
}
