/*
 * schedules/timeline_chrome.c — the timeline as Chrome trace event JSON (timeline.h), the format
 * Perfetto and chrome://tracing load and the one `mpengine run --trace` records, so a prediction
 * and a measurement open side by side.
 *
 * One process ("pid" 0), one thread per pipeline rank ("tid" = rank, named and sorted by metadata
 * events), one complete event ("ph": "X") per action. Each message is a flow: "s" at the middle of
 * the sending slice, "f" with "bp": "e" at the middle of the receiving slice, so each binds to its
 * enclosing slice. "ts" and "dur" are microseconds: seconds times 1e6, abstract units as
 * milliseconds (times 1e3). Written by hand, one event a line; names are plain ASCII.
 */
#include <stdbool.h>
#include <stdio.h>

#include "schedules/p2p.h"
#include "schedules/timeline_internal.h"

/* Microseconds for a simulated time. */
static double trace_time(const mp_simulation *simulation, double time) {
  return simulation->time_unit == MP_TIME_SECONDS ? time * 1e6 : time * 1e3;
}

static void append_json_string(mp_text *out, const char *text) {
  mp_text_append(out, "\"");
  for (const char *p = text; *p != '\0'; ++p) {
    if (*p == '"' || *p == '\\') {
      mp_text_printf(out, "\\%c", *p);
    } else if ((unsigned char)*p < 0x20) {
      mp_text_printf(out, "\\u%04x", (unsigned char)*p);
    } else {
      char one[2] = {*p, '\0'};
      mp_text_append(out, one);
    }
  }
  mp_text_append(out, "\"");
}

mp_status timeline_write_chrome(const mp_schedule *schedule, const mp_simulation *simulation,
                                const mp_timeline_options *options, mp_text *out) {
  int pp = schedule->pp;
  char title[256], label[32];
  const bool measured = options != NULL && options->measured;
  mp_text_printf(out,
                 "{\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"generator\": \"%s\", "
                 "\"measured\": %s, \"title\": ",
                 measured ? "mpengine timeline" : "mpengine schedule",
                 measured ? "true" : "false");
  append_json_string(out, timeline_title(schedule, options, title, sizeof title));
  mp_text_printf(out,
                 ", \"kind\": \"%s\", \"pp\": %d, \"num_micro_batches\": %d, "
                 "\"virtual_stages\": %d, \"time_unit\": \"%s\", \"step_time\": %.17g, "
                 "\"bubble_fraction\": %.17g, \"peak_activation_memory\": %.17g, "
                 "\"p2p_model\": \"%s\"},\n",
                 mp_schedule_kind_name(schedule->kind), pp, schedule->num_micro_batches,
                 schedule->virtual_stages,
                 simulation->time_unit == MP_TIME_SECONDS ? "seconds" : "units (shown as ms)",
                 simulation->step_time, simulation->bubble_fraction,
                 simulation->max_peak_activation_memory, mp_p2p_model_name(simulation->p2p_model));
  mp_text_append(out, "\"traceEvents\": [\n");
  mp_text_append(out, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, "
                      "\"args\": {\"name\": ");
  append_json_string(out, title);
  mp_text_append(out, "}}");
  for (int r = 0; r < pp; ++r) {
    mp_text_printf(out,
                   ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                   "\"args\": {\"name\": \"pp rank %d\"}}",
                   r, r);
    mp_text_printf(out,
                   ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                   "\"args\": {\"sort_index\": %d}}",
                   r, r);
  }
  for (int r = 0; r < pp; ++r) {
    const mp_rank_actions *list = &schedule->ranks[r];
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      double start = trace_time(simulation, simulation->start[r][a]);
      double duration = trace_time(simulation, simulation->end[r][a]) - start;
      mp_text_printf(out,
                     ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, "
                     "\"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"action\": %d, "
                     "\"micro_batch\": %d, \"chunk\": %d, \"stage\": %d}}",
                     timeline_label(schedule, action, label, sizeof label),
                     mp_action_kind_name(action->kind), r, start, duration, a,
                     action->micro_batch, action->chunk, mp_stage_index(pp, r, action->chunk));
    }
  }
  mp_p2p_matching matching;
  mp_error ignored = MP_ERROR_INITIALIZER;
  if (mp_p2p_match(schedule, &matching, &ignored) == MP_OK) {
    long flow_id = 0;
    for (int r = 0; r < pp; ++r) {
      const mp_rank_actions *list = &schedule->ranks[r];
      for (int a = 0; a < list->num_actions; ++a) {
        int peer = list->actions[a].send_to;
        if (peer == MP_NO_PEER) continue;
        int b = matching.send_partner[r][a];
        mp_message message;
        mp_action_sent_message(schedule, r, &list->actions[a], &message);
        const char *name = message.kind == MP_MESSAGE_ACTIVATION ? "activation" : "gradient";
        double sent = trace_time(simulation, (simulation->start[r][a] + simulation->end[r][a]) / 2);
        double received =
            trace_time(simulation, (simulation->start[peer][b] + simulation->end[peer][b]) / 2);
        mp_text_printf(out,
                       ",\n{\"name\": \"%s\", \"cat\": \"p2p\", \"ph\": \"s\", \"id\": %ld, "
                       "\"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"args\": {\"micro_batch\": %d, "
                       "\"from_stage\": %d, \"to_stage\": %d}}",
                       name, flow_id, r, sent, message.micro_batch, message.from_stage,
                       message.to_stage);
        mp_text_printf(out,
                       ",\n{\"name\": \"%s\", \"cat\": \"p2p\", \"ph\": \"f\", \"bp\": \"e\", "
                       "\"id\": %ld, \"pid\": 0, \"tid\": %d, \"ts\": %.3f}",
                       name, flow_id, peer, received);
        ++flow_id;
      }
    }
    mp_p2p_matching_free(&matching);
  }
  mp_text_append(out, "\n]}\n");
  return MP_OK;
}
