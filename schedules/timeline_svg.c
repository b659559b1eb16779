/*
 * schedules/timeline_svg.c — the SVG timeline (timeline.h): a picture a person reads at a glance.
 *
 * One lane per rank, a rectangle per action coloured by kind (F blue, B green, W purple) and
 * shaded by micro-batch (darker first), its label inside when it fits and a tooltip with the
 * exact times; an arrow from the end of each send to the start of its receiver; under each lane a
 * band naming the warm-up, steady and cool-down phases; a time axis below. Plain SVG 1.1, no
 * script, so it opens in any browser and diffs as text.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "schedules/checker.h"
#include "schedules/p2p.h"
#include "schedules/timeline_internal.h"

/* Layout in SVG pixels. */
#define SVG_LEFT 90.0       /* rank labels */
#define SVG_PLOT_WIDTH 1100.0
#define SVG_RIGHT 30.0
#define SVG_TOP 64.0        /* title and summary */
#define SVG_LANE_HEIGHT 30.0
#define SVG_BAND_HEIGHT 13.0 /* phase band under a lane */
#define SVG_LANE_GAP 12.0

static const int kKindHue[MP_NUM_ACTION_KINDS] = {212, 140, 140, 280};

static void append_escaped(mp_text *out, const char *text) {
  for (const char *p = text; *p != '\0'; ++p) {
    switch (*p) {
      case '<': mp_text_append(out, "&lt;"); break;
      case '>': mp_text_append(out, "&gt;"); break;
      case '&': mp_text_append(out, "&amp;"); break;
      case '"': mp_text_append(out, "&quot;"); break;
      default: {
        char one[2] = {*p, '\0'};
        mp_text_append(out, one);
      }
    }
  }
}

/* Lightness of micro-batch mb's shade: 30% (first) to 70% (last). */
static double shade_lightness(int micro_batch, int num_micro_batches) {
  if (num_micro_batches <= 1) return 42.0;
  return 30.0 + 40.0 * micro_batch / (num_micro_batches - 1);
}

/* A round tick spacing (1, 2 or 5 times a power of ten) giving about `count` ticks. */
static double nice_tick(double span, int count) {
  if (span <= 0) return 1;
  double raw = span / count;
  double power = pow(10.0, floor(log10(raw)));
  double steps[] = {1, 2, 5, 10};
  for (int i = 0; i < 4; ++i) {
    if (steps[i] * power >= raw) return steps[i] * power;
  }
  return 10 * power;
}

static double lane_top(int rank) {
  return SVG_TOP + rank * (SVG_LANE_HEIGHT + SVG_BAND_HEIGHT + SVG_LANE_GAP);
}

mp_status timeline_write_svg(const mp_schedule *schedule, const mp_simulation *simulation,
                             const mp_timeline_options *options, mp_text *out) {
  int pp = schedule->pp;
  double step = simulation->step_time > 0 ? simulation->step_time : 1.0;
  double x_scale = SVG_PLOT_WIDTH / step;
  double axis_y = lane_top(pp) + 2;
  double legend_y = axis_y + 46;
  double width = SVG_LEFT + SVG_PLOT_WIDTH + SVG_RIGHT;
  double height = legend_y + 56;
  char title[256], text[160];

  mp_text_printf(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
                 "font-size=\"11\">\n",
                 width, height, width, height);
  mp_text_append(out,
                 "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
                 "markerWidth=\"5\" markerHeight=\"5\" orient=\"auto\">"
                 "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#444\"/></marker></defs>\n");
  mp_text_printf(out, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", width, height);
  mp_text_printf(out, "<text x=\"%.0f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">",
                 SVG_LEFT);
  append_escaped(out, timeline_title(schedule, options, title, sizeof title));
  mp_text_append(out, "</text>\n");
  mp_text_printf(out,
                 "<text x=\"%.0f\" y=\"44\">step time %g %s, bubble fraction %.4f (%.1f%% idle), "
                 "peak %d %s alive, peak activation memory %g %s</text>\n",
                 SVG_LEFT, timeline_display_time(simulation, simulation->step_time),
                 timeline_time_unit(simulation), simulation->bubble_fraction,
                 100.0 * simulation->bubble_fraction, mp_schedule_max_peak_live(schedule),
                 schedule->virtual_stages > 1 ? "micro-batch chunks" : "micro-batches",
                 simulation->max_peak_activation_memory, timeline_memory_unit(simulation));

  /* Lanes, actions and phase bands. */
  for (int r = 0; r < pp; ++r) {
    double y = lane_top(r);
    mp_text_printf(out, "<g id=\"rank-%d\" class=\"lane\">\n", r);
    mp_text_printf(out,
                   "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\">rank %d</text>\n",
                   SVG_LEFT - 10, y + SVG_LANE_HEIGHT / 2 + 4, r);
    mp_text_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\">"
                   "<title>rank %d idle %.1f%%</title></rect>\n",
                   SVG_LEFT, y, SVG_PLOT_WIDTH, SVG_LANE_HEIGHT, r,
                   100.0 * simulation->rank_bubble_fraction[r]);
    const mp_rank_actions *list = &schedule->ranks[r];
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      double x0 = SVG_LEFT + simulation->start[r][a] * x_scale;
      double w = (simulation->end[r][a] - simulation->start[r][a]) * x_scale;
      double lightness = shade_lightness(action->micro_batch, schedule->num_micro_batches);
      char label[32];
      timeline_label(schedule, action, label, sizeof label);
      mp_text_printf(out,
                     "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                     "fill=\"hsl(%d,62%%,%.0f%%)\" stroke=\"white\" stroke-width=\"0.6\">"
                     "<title>rank %d, action %d: %s (%s, stage %d), %g to %g %s</title></rect>\n",
                     x0, y, w, SVG_LANE_HEIGHT, kKindHue[action->kind], lightness, r, a,
                     mp_action_describe(schedule, action, text, sizeof text),
                     mp_action_kind_name(action->kind),
                     mp_stage_index(pp, r, action->chunk),
                     timeline_display_time(simulation, simulation->start[r][a]),
                     timeline_display_time(simulation, simulation->end[r][a]),
                     timeline_time_unit(simulation));
      /* The label at 11 px where it fits, at 9 px in narrower boxes, else only in the tooltip. */
      double label_chars = (double)strlen(label);
      int font_size = w >= 6.6 * label_chars + 2 ? 11 : w >= 5.4 * label_chars + 1 ? 9 : 0;
      if (font_size > 0) {
        mp_text_printf(out,
                       "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"%d\" "
                       "fill=\"%s\">%s</text>\n",
                       x0 + w / 2, y + SVG_LANE_HEIGHT / 2 + 4, font_size,
                       lightness < 52 ? "white" : "#111", label);
      }
    }
    timeline_phases phases;
    timeline_rank_phases(schedule, simulation, r, &phases);
    static const char *const band_colours[3] = {"#d6e4f5", "#d8efd9", "#f5e0d0"};
    double band_y = y + SVG_LANE_HEIGHT + 1;
    for (int phase = 0; phase < 3; ++phase) {
      double x0 = SVG_LEFT + phases.start[phase] * x_scale;
      double w = (phases.end[phase] - phases.start[phase]) * x_scale;
      if (w <= 0) continue;
      mp_text_printf(out,
                     "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\">"
                     "<title>rank %d %s</title></rect>\n",
                     x0, band_y, w, SVG_BAND_HEIGHT - 2, band_colours[phase], r,
                     timeline_phase_name(phase));
      if (w >= 6.0 * (double)strlen(timeline_phase_name(phase)) + 4) {
        mp_text_printf(out,
                       "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"9\" "
                       "fill=\"#333\">%s</text>\n",
                       x0 + w / 2, band_y + SVG_BAND_HEIGHT - 4, timeline_phase_name(phase));
      }
    }
    mp_text_append(out, "</g>\n");
  }

  /* Arrows: from the end of each sending action to the start of the action that receives it,
   * between the facing edges of the two lanes. */
  mp_p2p_matching matching;
  mp_error ignored = MP_ERROR_INITIALIZER;
  if (mp_p2p_match(schedule, &matching, &ignored) == MP_OK) {
    mp_text_append(out, "<g id=\"sends\" stroke=\"#444\" stroke-opacity=\"0.55\" "
                        "stroke-width=\"0.9\">\n");
    for (int r = 0; r < pp; ++r) {
      const mp_rank_actions *list = &schedule->ranks[r];
      for (int a = 0; a < list->num_actions; ++a) {
        int peer = list->actions[a].send_to;
        if (peer == MP_NO_PEER) continue;
        int b = matching.send_partner[r][a];
        double x1 = SVG_LEFT + simulation->end[r][a] * x_scale;
        double x2 = SVG_LEFT + simulation->start[peer][b] * x_scale;
        bool down = peer > r;
        double y1 = down ? lane_top(r) + SVG_LANE_HEIGHT : lane_top(r);
        double y2 = down ? lane_top(peer) : lane_top(peer) + SVG_LANE_HEIGHT;
        mp_message message;
        mp_action_sent_message(schedule, r, &list->actions[a], &message);
        mp_text_printf(out,
                       "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                       "marker-end=\"url(#arrow)\"><title>rank %d to rank %d: %s</title></line>\n",
                       x1, y1, x2, y2, r, peer,
                       mp_message_describe(schedule, &message, text, sizeof text));
      }
    }
    mp_text_append(out, "</g>\n");
    mp_p2p_matching_free(&matching);
  }

  /* Time axis. */
  double shown_step = timeline_display_time(simulation, step);
  double tick = nice_tick(shown_step, 10);
  mp_text_printf(out,
                 "<g id=\"axis\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                 "stroke=\"#333\"/>\n",
                 SVG_LEFT, axis_y, SVG_LEFT + SVG_PLOT_WIDTH, axis_y);
  for (int i = 0; i * tick <= shown_step * (1 + 1e-9); ++i) {
    double x = SVG_LEFT + i * tick / shown_step * SVG_PLOT_WIDTH;
    mp_text_printf(out,
                   "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#333\"/>"
                   "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                   x, axis_y, x, axis_y + 4, x, axis_y + 16, i * tick);
  }
  mp_text_printf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (%s)</text></g>\n",
                 SVG_LEFT + SVG_PLOT_WIDTH / 2, axis_y + 32,
                 simulation->time_unit == MP_TIME_SECONDS ? "ms" : "units");

  /* Legend. */
  bool present[MP_NUM_ACTION_KINDS] = {false};
  for (int r = 0; r < pp; ++r) {
    for (int a = 0; a < schedule->ranks[r].num_actions; ++a) {
      present[schedule->ranks[r].actions[a].kind] = true;
    }
  }
  static const char *const legend_names[MP_NUM_ACTION_KINDS] = {
      "F forward", "B backward", "B input-gradient backward", "W weight-gradient backward"};
  double x = SVG_LEFT;
  mp_text_append(out, "<g id=\"legend\">\n");
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    if (!present[k]) continue;
    mp_text_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"hsl(%d,62%%,42%%)\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                   x, legend_y, kKindHue[k], x + 19, legend_y + 11, legend_names[k]);
    x += 30 + 6.0 * (double)strlen(legend_names[k]);
  }
  mp_text_printf(out,
                 "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
                 "marker-end=\"url(#arrow)\"/><text x=\"%.1f\" y=\"%.1f\">send (activation down, "
                 "gradient up)</text>\n",
                 x, legend_y + 7, x + 24, legend_y + 7, x + 30, legend_y + 11);
  mp_text_printf(out,
                 "<text x=\"%.1f\" y=\"%.1f\">shade: darker = earlier micro-batch; label = kind, "
                 "micro-batch%s; grey = idle; band under each lane: warm-up, steady, "
                 "cool-down</text>\n",
                 SVG_LEFT, legend_y + 34,
                 schedule->virtual_stages > 1 ? ", model chunk (a = 0, b = 1, ...)" : "");
  mp_text_append(out, "</g>\n</svg>\n");
  return MP_OK;
}
