/*
 * tests/tools/trace_fixture.c — writes a trace like `mpengine run --trace` records, with times
 * chosen so every number `mpengine timeline` prints is known in advance: each rank's recorder
 * (engine/trace/trace.h) gets the actions of the generated schedule at the times the simulator gives
 * them under unit costs scaled to milliseconds (F = 1 ms, B = 2 ms per rank's layers; zero-bubble
 * B = W = 1 ms), the receive before each action waiting from the previous action's end, each send
 * taking 0.01 ms, a dp all-reduce of 0.2 ms after the last action (dp > 1) and a step slice ending
 * 0.5 ms after the pipeline. Step 0 runs 1.5 times slower (warm-up); the later steps follow one
 * another 1 ms apart. All ranks are merged in this process (mp_trace_write_merged): no MPI job.
 *
 *   trace_fixture OUT.json --kind K --pp P --micro-batches M [--virtual V] [--dp D] [--tp T]
 *                 [--steps N] [--plan PLAN.json]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trace/trace.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

static int usage(void) {
  fprintf(stderr, "usage: trace_fixture OUT.json --kind K --pp P --micro-batches M [--virtual V] "
                  "[--dp D] [--tp T] [--steps N] [--plan PLAN.json]\n");
  return 2;
}

static int world_rank_of(const mp_trace_layout *layout, int dp, int pp, int tp) {
  return pp * layout->dp * layout->tp + dp * layout->tp + tp;
}

int main(int argc, char **argv) {
  mp_trace_layout layout;
  memset(&layout, 0, sizeof layout);
  layout.dp = layout.pp = layout.tp = layout.virtual_stages = 1;
  int steps = 1;
  static const struct option options[] = {
      {"kind", required_argument, NULL, 'k'},  {"pp", required_argument, NULL, 'p'},
      {"micro-batches", required_argument, NULL, 'm'},
      {"virtual", required_argument, NULL, 'v'}, {"dp", required_argument, NULL, 'd'},
      {"tp", required_argument, NULL, 't'},    {"steps", required_argument, NULL, 's'},
      {"plan", required_argument, NULL, 'l'},  {NULL, 0, NULL, 0},
  };
  int option;
  while ((option = getopt_long(argc, argv, "", options, NULL)) != -1) {
    switch (option) {
      case 'k': snprintf(layout.schedule, sizeof layout.schedule, "%s", optarg); break;
      case 'p': layout.pp = atoi(optarg); break;
      case 'm': layout.num_micro_batches = atoi(optarg); break;
      case 'v': layout.virtual_stages = atoi(optarg); break;
      case 'd': layout.dp = atoi(optarg); break;
      case 't': layout.tp = atoi(optarg); break;
      case 's': steps = atoi(optarg); break;
      case 'l': snprintf(layout.plan, sizeof layout.plan, "%s", optarg); break;
      default: return usage();
    }
  }
  if (optind + 1 != argc || layout.schedule[0] == '\0' || steps < 1) return usage();
  const char *out_path = argv[optind];

  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule_kind kind;
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_sim_costs costs;
  mp_simulation simulation;
  memset(&costs, 0, sizeof costs);
  memset(&simulation, 0, sizeof simulation);
  mp_status status = mp_schedule_kind_parse(layout.schedule, &kind, &err);
  if (status == MP_OK) {
    status = mp_schedule_generate(kind, layout.pp, layout.num_micro_batches,
                                  layout.virtual_stages, &schedule, &err);
  }
  if (status == MP_OK) {
    status = mp_sim_costs_init_unit(&costs, layout.pp, layout.virtual_stages, &err);
  }
  if (status == MP_OK) status = mp_schedule_simulate(&schedule, &costs, &simulation, &err);
  const int world_size = layout.dp * layout.pp * layout.tp;
  mp_trace **traces = calloc((size_t)world_size, sizeof *traces);
  for (int d = 0; d < layout.dp && status == MP_OK; ++d) {
    for (int p = 0; p < layout.pp && status == MP_OK; ++p) {
      for (int t = 0; t < layout.tp && status == MP_OK; ++t) {
        const int rank = world_rank_of(&layout, d, p, t);
        status = mp_trace_create(&layout, rank, d, p, t, &traces[rank], &err);
        mp_trace *trace = traces[rank];
        double offset = 0.0;
        for (int step = 0; step < steps && status == MP_OK; ++step) {
          const double ms = (step == 0 ? 1.5 : 1.0) * 1e-3; /* seconds per time unit */
          const mp_rank_actions *list = &schedule.ranks[p];
          double previous_end = 0.0;
          for (int a = 0; a < list->num_actions; ++a) {
            const mp_action *action = &list->actions[a];
            const double start = offset + ms * simulation.start[p][a];
            const double end = offset + ms * simulation.end[p][a];
            mp_message message;
            if (mp_action_received_message(&schedule, p, action, &message)) {
              mp_trace_comm(trace, step, "recv", "pp",
                            world_rank_of(&layout, d, action->recv_from, t), 4096, &message,
                            offset + previous_end, start);
            }
            mp_trace_action(trace, step, action->kind, action->micro_batch, action->chunk,
                            mp_stage_index(layout.pp, p, action->chunk), start, end);
            if (mp_action_sent_message(&schedule, p, action, &message)) {
              mp_trace_comm(trace, step, "send", "pp",
                            world_rank_of(&layout, d, action->send_to, t), 4096, &message, end,
                            end + 1e-5);
            }
            previous_end = end - offset;
          }
          const double pipeline_end = offset + ms * simulation.step_time;
          if (layout.dp > 1) {
            mp_trace_comm(trace, step, "all-reduce", "dp", -1, 1 << 20, NULL, pipeline_end,
                          pipeline_end + 2e-4);
          }
          mp_trace_step(trace, step, offset, pipeline_end + 5e-4);
          offset = pipeline_end + 5e-4 + 1e-3;
        }
      }
    }
  }
  if (status == MP_OK) {
    status = mp_trace_write_merged((const mp_trace *const *)traces, world_size, out_path, &err);
  }
  for (int r = 0; r < world_size; ++r) mp_trace_free(traces[r]);
  free(traces);
  mp_simulation_free(&simulation);
  mp_sim_costs_free(&costs);
  mp_schedule_free(&schedule);
  if (status != MP_OK) {
    fprintf(stderr, "trace_fixture: %s\n", err.message);
    return status == MP_ERR_INPUT ? 2 : 1;
  }
  return 0;
}
