/* topology/planner.c — the layout search; see planner.h for what is searched and how the bounds
 * keep it fast. */
#include "topology/planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology/partition.h"

enum { kMaxVirtual = 8, kDefaultTop = 5 };

int64_t mp_padded_vocab(int64_t vocab) { return (vocab + 63) / 64 * 64; }

const char *mp_layout_describe(const mp_layout *l, char *out, int out_bytes) {
  snprintf(out, (size_t)out_bytes, "dp %d pp %d tp %d micro-batch %lld %s v%d recompute %s%s%s",
           l->dp, l->pp, l->tp, (long long)l->micro_batch, mp_schedule_kind_name(l->schedule),
           l->virtual_stages, mp_recompute_name(l->recompute),
           l->sequence_parallel ? " sequence-parallel" : "", l->zero_stage ? " zero-1" : "");
  return out;
}

/* Per-layer costs of one (tp, micro-batch, recompute, sp), as prefix sums, and the stage splits
 * computed for it so far (by number of stages). */
typedef struct {
  int tp;
  int64_t micro_batch;
  int recompute, sp;
  double *fwd, *bwd, *params, *act, *opt; /* prefix sums, (n + 1) */
  double *cost;                            /* (n) per-layer partition cost */
  int **counts;                            /* (n + 1) lazily: counts[k] has k entries */
  bool shares_counts;                      /* counts belongs to the twin without sequence
                                              parallelism (same durations, same splits) */
} layer_table;

typedef struct {
  mp_layout layout;
  int table;
  double time_bound, memory_bound;
} candidate;

typedef struct {
  const mp_cluster *cluster;
  const mp_model *model;
  int n;
  layer_table *tables;
  int num_tables, cap_tables;
  candidate *candidates;
  long num_candidates, cap_candidates;
} search;

static void free_search(search *s) {
  for (int i = 0; i < s->num_tables; ++i) {
    layer_table *t = &s->tables[i];
    free(t->fwd);
    free(t->bwd);
    free(t->params);
    free(t->act);
    free(t->opt);
    free(t->cost);
    if (t->counts != NULL && !t->shares_counts) {
      for (int k = 0; k <= s->n; ++k) free(t->counts[k]);
      free(t->counts);
    }
  }
  free(s->tables);
  free(s->candidates);
}

static int get_table(search *s, const mp_layout *layout) {
  for (int i = 0; i < s->num_tables; ++i) {
    const layer_table *t = &s->tables[i];
    if (t->tp == layout->tp && t->micro_batch == layout->micro_batch &&
        t->recompute == (int)layout->recompute && t->sp == (int)layout->sequence_parallel) {
      return i;
    }
  }
  if (s->num_tables == s->cap_tables) {
    const int cap = s->cap_tables ? 2 * s->cap_tables : 64;
    layer_table *grown = realloc(s->tables, sizeof(layer_table) * (size_t)cap);
    if (grown == NULL) return -1;
    s->tables = grown;
    s->cap_tables = cap;
  }
  layer_table *t = &s->tables[s->num_tables];
  memset(t, 0, sizeof *t);
  t->tp = layout->tp;
  t->micro_batch = layout->micro_batch;
  t->recompute = (int)layout->recompute;
  t->sp = layout->sequence_parallel;
  const size_t n1 = (size_t)s->n + 1;
  t->fwd = calloc(n1, sizeof(double));
  t->bwd = calloc(n1, sizeof(double));
  t->params = calloc(n1, sizeof(double));
  t->act = calloc(n1, sizeof(double));
  t->opt = calloc(n1, sizeof(double));
  t->cost = calloc(n1, sizeof(double));
  /* Sequence parallelism changes memory, not durations: share the twin's stage splits. */
  for (int i = 0; i < s->num_tables && layout->sequence_parallel; ++i) {
    const layer_table *twin = &s->tables[i];
    if (twin->tp == t->tp && twin->micro_batch == t->micro_batch &&
        twin->recompute == t->recompute && !twin->sp && twin->counts != NULL) {
      t->counts = twin->counts;
      t->shares_counts = true;
      break;
    }
  }
  if (t->counts == NULL) t->counts = calloc(n1, sizeof(int *));
  ++s->num_tables;
  if (!t->fwd || !t->bwd || !t->params || !t->act || !t->opt || !t->cost || !t->counts) return -1;
  for (int i = 0; i < s->n; ++i) {
    mp_layer_time time;
    /* On the node: every candidate has dp x pp x tp = --gpus, so the table may ignore dp, pp. */
    mp_cost_layer_on_node(s->cluster, mp_model_layer(s->model, i), layout, &time);
    const double f = time.forward_compute_s + time.forward_tp_s;
    const double b = time.backward_compute_s + time.backward_tp_s;
    t->cost[i] = f + b;
    t->fwd[i + 1] = t->fwd[i] + f;
    t->bwd[i + 1] = t->bwd[i] + b;
    t->params[i + 1] = t->params[i] + time.params;
    t->act[i + 1] = t->act[i] + time.activation_bytes;
  }
  return s->num_tables - 1;
}

static const int *get_counts(search *s, layer_table *t, int k) {
  if (t->counts[k] == NULL) {
    int *counts = malloc(sizeof(int) * (size_t)k);
    double bottleneck;
    if (counts == NULL || mp_partition_chain(t->cost, s->n, k, counts, &bottleneck, NULL) != MP_OK) {
      free(counts);
      return NULL;
    }
    t->counts[k] = counts;
  }
  return t->counts[k];
}

/* Lower bounds of step time and memory of a candidate (see planner.h). */
static void bound(search *s, candidate *c, double tied_params) {
  layer_table *t = &s->tables[c->table];
  const mp_layout *l = &c->layout;
  const int pp = l->pp, v = l->virtual_stages, k = pp * v;
  const int *counts = get_counts(s, t, k);
  if (counts == NULL) {
    c->time_bound = c->memory_bound = INFINITY;
    return;
  }
  int start[MP_COST_MAX_STAGES + 1];
  start[0] = 0;
  for (int i = 0; i < k; ++i) start[i + 1] = start[i] + counts[i];
  const mp_state_bytes state = mp_cost_state_bytes(s->cluster);
  const double m = (double)l->num_micro_batches, d = l->dp;
  double head = 0.0, best_time = 0.0, best_memory = 0.0, opt_tail = 0.0;
  const double per_param_opt = state.optimizer / (l->zero_stage ? d : 1.0);
  for (int r = 0; r < pp; ++r) {
    double busy = 0.0, params = 0.0, min_act = INFINITY;
    for (int ch = 0; ch < v; ++ch) {
      const int st = ch * pp + r;
      const double f = t->fwd[start[st + 1]] - t->fwd[start[st]];
      const double b = t->bwd[start[st + 1]] - t->bwd[start[st]];
      busy += m * (f + b);
      params += t->params[start[st + 1]] - t->params[start[st]];
      const double act = t->act[start[st + 1]] - t->act[start[st]];
      if (act < min_act) min_act = act;
    }
    if (r == pp - 1 && pp > 1) params += tied_params / l->tp;
    if (head + busy > best_time) best_time = head + busy;
    head += t->fwd[start[r + 1]] - t->fwd[start[r]];
    int live;
    if (l->schedule == MP_SCHEDULE_GPIPE) {
      live = (int)m;
    } else if (l->schedule == MP_SCHEDULE_INTERLEAVED_1F1B) {
      live = (pp - r - 1) * 2 + (v - 1) * pp + 1;
      if (live > (int)m * v) live = (int)m * v;
    } else {
      live = pp - r < (int)m ? pp - r : (int)m;
    }
    const double memory = params * (state.weights + state.grads + per_param_opt) +
                          live * min_act + mp_cost_workspace_bytes(s->cluster);
    if (memory > best_memory) best_memory = memory;
    const double opt =
        params * (MP_COST_OPTIMIZER_BYTES_PER_PARAM -
                  (l->zero_stage ? state.optimizer * 2.0 * (1.0 - 1.0 / d) : 0.0)) /
        s->cluster->memory_bandwidth_bytes_per_s;
    if (opt > opt_tail) opt_tail = opt;
  }
  c->time_bound = best_time + opt_tail * mp_cost_compute_slowdown(s->cluster, l);
  c->memory_bound = best_memory;
}

static int add_candidate(search *s, const mp_layout *layout, double tied_params) {
  if (s->num_candidates == s->cap_candidates) {
    const long cap = s->cap_candidates ? 2 * s->cap_candidates : 4096;
    candidate *grown = realloc(s->candidates, sizeof(candidate) * (size_t)cap);
    if (grown == NULL) return -1;
    s->candidates = grown;
    s->cap_candidates = cap;
  }
  candidate *c = &s->candidates[s->num_candidates];
  c->layout = *layout;
  c->table = get_table(s, layout);
  if (c->table < 0) return -1;
  bound(s, c, tied_params);
  ++s->num_candidates;
  return 0;
}

static int by_time_bound(const void *a, const void *b) {
  const double x = ((const candidate *)a)->time_bound, y = ((const candidate *)b)->time_bound;
  return x < y ? -1 : x > y ? 1 : 0;
}

/* Why tp = value cannot be used, or NULL. */
static const char *tp_refusal(const mp_cluster *cluster, const mp_model *model, int tp) {
  if (tp > cluster->devices_per_node) return "is more than the devices in one node";
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *l = mp_model_layer(model, i);
    if (l->kind != MP_LAYER_TRANSFORMER) continue;
    if (l->heads % tp != 0) return "does not divide the attention heads";
    if (l->kv_heads % tp != 0 && tp % l->kv_heads != 0) return "does not divide the kv heads";
    if (l->ffn_hidden % tp != 0) return "does not divide the MLP width";
  }
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *l = mp_model_layer(model, i);
    if ((l->kind == MP_LAYER_EMBEDDING || l->kind == MP_LAYER_LM_HEAD) &&
        mp_padded_vocab(l->vocab) % tp != 0) {
      return "does not divide the padded vocabulary";
    }
  }
  return NULL;
}

static double tied_table(const mp_model *model) {
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *l = mp_model_layer(model, i);
    if (l->kind == MP_LAYER_LM_HEAD && l->tie_embedding) return (double)l->vocab * l->hidden;
  }
  return 0.0;
}

static mp_status check_fixed(const mp_planner_options *o, int64_t global_batch, mp_error *err) {
  const int n = o->gpus;
  if (o->dp && o->pp && o->tp && (int64_t)o->dp * o->pp * o->tp != n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--dp %d x --pp %d x --tp %d = %lld, but --gpus is %d; fix one of them so "
                   "that dp x pp x tp = %d",
                   o->dp, o->pp, o->tp, (long long)o->dp * o->pp * o->tp, n, n);
  }
  const int fixed = (o->dp ? o->dp : 1) * (o->pp ? o->pp : 1) * (o->tp ? o->tp : 1);
  if (n % fixed != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the fixed sizes (dp x pp x tp = %d) do not divide --gpus %d", fixed, n);
  }
  if (o->virtual_stages > 1 && o->schedule >= 0 && o->schedule != MP_SCHEDULE_INTERLEAVED_1F1B) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--virtual-stages %d needs --schedule interleaved-1f1b, not %s",
                   o->virtual_stages, mp_schedule_kind_name((mp_schedule_kind)o->schedule));
  }
  if (o->virtual_stages == 1 && o->schedule == MP_SCHEDULE_INTERLEAVED_1F1B) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--schedule interleaved-1f1b needs --virtual-stages 2 or more, not 1");
  }
  if (o->sequence_parallel == 1 && o->tp == 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--sequence-parallel needs tensor parallelism, but --tp is 1");
  }
  if (o->zero_stage == 1 && o->dp == 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero 1 shards optimizer state across data-parallel ranks, but --dp is 1");
  }
  if (o->dp && global_batch % o->dp != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--dp %d does not divide the global batch %lld", o->dp,
                   (long long)global_batch);
  }
  if (o->micro_batch && o->dp && (global_batch / o->dp) % o->micro_batch != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--micro-batch %lld does not divide global batch / dp = %lld / %d = %lld",
                   (long long)o->micro_batch, (long long)global_batch, o->dp,
                   (long long)(global_batch / o->dp));
  }
  return MP_OK;
}

static void enumerate(search *s, const mp_planner_options *o, int64_t global_batch,
                      int64_t seq_len, long *layouts, bool *oom) {
  const int n = o->gpus, layers = s->n;
  const double tied = tied_table(s->model);
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0 || (o->tp && tp != o->tp) || tp_refusal(s->cluster, s->model, tp)) continue;
    for (int pp = 1; pp <= n / tp; ++pp) {
      if ((n / tp) % pp != 0 || (o->pp && pp != o->pp) || pp > layers) continue;
      const int dp = n / tp / pp;
      if ((o->dp && dp != o->dp) || global_batch % dp != 0) continue;
      ++*layouts;
      const int64_t per_dp = global_batch / dp;
      for (int64_t mb = 1; mb <= per_dp; ++mb) {
        if (per_dp % mb != 0 || (o->micro_batch && mb != o->micro_batch)) continue;
        const int64_t m = per_dp / mb;
        if (m > MP_SCHEDULE_MAX_MICRO_BATCHES) continue;
        for (int kind = 0; kind < MP_SCHEDULE_CUSTOM; ++kind) {
          if (o->schedule >= 0 && kind != o->schedule) continue;
          /* With one stage every schedule is the same: keep 1f1b only. */
          if (pp == 1 && kind != MP_SCHEDULE_1F1B && o->schedule < 0) continue;
          const bool interleaved = kind == MP_SCHEDULE_INTERLEAVED_1F1B;
          if (interleaved && (pp < 2 || m % pp != 0)) continue;
          for (int v = interleaved ? 2 : 1; v <= (interleaved ? kMaxVirtual : 1); ++v) {
            if (o->virtual_stages && v != o->virtual_stages) continue;
            if (pp * v > layers || (int64_t)pp * m * v > MP_SCHEDULE_MAX_WORK) continue;
            for (int rc = 0; rc < MP_RECOMPUTE_COUNT; ++rc) {
              if (o->recompute >= 0 && rc != o->recompute) continue;
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                if (o->sequence_parallel >= 0 && sp != o->sequence_parallel) continue;
                for (int zero = 0; zero <= (dp > 1 ? 1 : 0); ++zero) {
                  if (o->zero_stage >= 0 && zero != o->zero_stage) continue;
                  mp_layout layout = {dp, pp, tp, v, mb, m, seq_len, (mp_schedule_kind)kind,
                                      (mp_recompute)rc, sp == 1, zero};
                  if (add_candidate(s, &layout, tied) != 0) *oom = true;
                }
              }
            }
          }
        }
      }
    }
  }
}

/* Explains why no (dp, pp, tp) uses the GPUs. */
static mp_status no_layout(const mp_cluster *cluster, const mp_model *model,
                           const mp_planner_options *o, int64_t global_batch, mp_error *err) {
  char reasons[1200] = "";
  size_t used = 0;
  for (int tp = 1; tp <= o->gpus && tp <= 64; ++tp) {
    if (o->gpus % tp != 0) continue;
    const char *why = tp_refusal(cluster, model, tp);
    if (why != NULL && used < sizeof reasons - 100) {
      used += (size_t)snprintf(reasons + used, sizeof reasons - used, "%stp %d %s", used ? "; " : "",
                               tp, why);
    }
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "no layout of model %s uses %d GPUs: dp x pp x tp must equal %d with tp within a "
                 "node (%d devices) dividing the heads, MLP width and padded vocabulary, pp at "
                 "most the %d layers, and dp dividing the global batch %lld%s%s%s; try a GPU count "
                 "with more small factors (a multiple of %d) or another --global-batch",
                 mp_model_name(model), o->gpus, o->gpus, cluster->devices_per_node,
                 mp_model_num_layers(model), (long long)global_batch, used ? " (" : "",
                 used ? reasons : "", used ? ")" : "", cluster->devices_per_node);
}

mp_status mp_plan_search(const mp_cluster *cluster, const mp_model *model,
                         const mp_planner_options *options, mp_planner_result *out,
                         mp_error *err) {
  memset(out, 0, sizeof *out);
  if (options->gpus < 1) return mp_fail(err, MP_ERR_INPUT, "--gpus must be at least 1");
  if (mp_cluster_total_devices(cluster, options->gpus) < 0) {
    return mp_fail(err, MP_ERR_INPUT, "cluster %s has %d nodes of %d devices, fewer than the %d "
                   "GPUs asked for", cluster->name, cluster->nodes, cluster->devices_per_node,
                   options->gpus);
  }
  const int top = options->top_k > 0 ? options->top_k : kDefaultTop;
  if (top > MP_PLANNER_MAX_TOP) {
    return mp_fail(err, MP_ERR_INPUT, "--top %d: at most %d", top, MP_PLANNER_MAX_TOP);
  }
  const int64_t global_batch = options->global_batch > 0 ? options->global_batch : options->gpus;
  const int64_t seq_len = options->seq_len > 0 ? options->seq_len : mp_model_seq_len(model);
  out->global_batch = global_batch;
  out->seq_len = seq_len;
  MP_TRY(check_fixed(options, global_batch, err));
  if (options->tp) {
    const char *why = tp_refusal(cluster, model, options->tp);
    if (why != NULL) {
      return mp_fail(err, MP_ERR_INPUT, "--tp %d %s of model %s", options->tp, why,
                     mp_model_name(model));
    }
  }
  search s = {cluster, model, mp_model_num_layers(model), NULL, 0, 0, NULL, 0, 0};
  long layouts = 0;
  bool oom = false;
  enumerate(&s, options, global_batch, seq_len, &layouts, &oom);
  if (oom) {
    free_search(&s);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory listing candidate layouts");
  }
  if (s.num_candidates == 0) {
    free_search(&s);
    if (layouts == 0) return no_layout(cluster, model, options, global_batch, err);
    return mp_fail(err, MP_ERR_INPUT,
                   "the fixed options leave no layout of model %s on %d GPUs (global batch %lld): "
                   "check --micro-batch, --schedule and --virtual-stages (interleaving needs pp "
                   ">= 2 and micro-batches a multiple of pp; pp x virtual stages must be at most "
                   "the %d layers)",
                   mp_model_name(model), options->gpus, (long long)global_batch,
                   mp_model_num_layers(model));
  }
  out->candidates = s.num_candidates;
  qsort(s.candidates, (size_t)s.num_candidates, sizeof(candidate), by_time_bound);
  out->results = calloc((size_t)top + 1, sizeof(mp_estimate));
  out->overflow = calloc(1, sizeof(mp_estimate));
  mp_estimate *scratch = calloc(1, sizeof(mp_estimate));
  if (out->results == NULL || out->overflow == NULL || scratch == NULL) {
    free(scratch);
    free_search(&s);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  const double capacity = (double)cluster->device_memory_bytes;
  long least_memory = -1, first_pruned = -1;
  mp_status status = MP_OK;
  for (long i = 0; i < s.num_candidates; ++i) {
    candidate *c = &s.candidates[i];
    if (least_memory < 0 || c->memory_bound < s.candidates[least_memory].memory_bound) {
      least_memory = i;
    }
    if (out->num_results == top && c->time_bound >= out->results[top - 1].step_s) break;
    if (c->memory_bound > capacity) {
      if (first_pruned < 0) first_pruned = i; /* the fastest bound ruled out by memory */
      continue;
    }
    layer_table *t = &s.tables[c->table];
    const int *counts = get_counts(&s, t, c->layout.pp * c->layout.virtual_stages);
    mp_error ignored = MP_ERROR_INITIALIZER;
    if (counts == NULL ||
        mp_cost_estimate(cluster, model, &c->layout, counts, scratch, &ignored) != MP_OK) {
      continue;
    }
    ++out->simulated;
    if (!scratch->fits) {
      if (!out->have_overflow || scratch->step_s < out->overflow->step_s) {
        memcpy(out->overflow, scratch, sizeof *scratch);
        out->have_overflow = true;
      }
      continue;
    }
    /* Insert into the sorted top list. */
    int at = out->num_results;
    while (at > 0 && out->results[at - 1].step_s > scratch->step_s) --at;
    if (at >= top) continue;
    const int keep = out->num_results < top ? out->num_results : top - 1;
    memmove(&out->results[at + 1], &out->results[at], sizeof(mp_estimate) * (size_t)(keep - at));
    memcpy(&out->results[at], scratch, sizeof *scratch);
    if (out->num_results < top) ++out->num_results;
  }
  if (out->num_results > 0 && first_pruned >= 0 &&
      s.candidates[first_pruned].time_bound < out->results[0].step_s) {
    /* A layout ruled out by its memory bound might have been faster: measure it for --explain. */
    candidate *c = &s.candidates[first_pruned];
    const int *counts =
        get_counts(&s, &s.tables[c->table], c->layout.pp * c->layout.virtual_stages);
    mp_error ignored = MP_ERROR_INITIALIZER;
    if (counts != NULL &&
        mp_cost_estimate(cluster, model, &c->layout, counts, scratch, &ignored) == MP_OK &&
        !scratch->fits && (!out->have_overflow || scratch->step_s < out->overflow->step_s)) {
      memcpy(out->overflow, scratch, sizeof *scratch);
      out->have_overflow = true;
    }
  }
  if (out->num_results > 0 && out->have_overflow &&
      out->overflow->step_s >= out->results[0].step_s) {
    out->have_overflow = false;
  }
  if (out->num_results == 0) {
    /* Nothing fits: measure the candidate with the least memory exactly and report it. */
    candidate *c = &s.candidates[least_memory];
    const int *counts =
        get_counts(&s, &s.tables[c->table], c->layout.pp * c->layout.virtual_stages);
    mp_error ignored = MP_ERROR_INITIALIZER;
    char text[200];
    mp_layout_describe(&c->layout, text, sizeof text);
    double need = c->memory_bound;
    if (counts != NULL &&
        mp_cost_estimate(cluster, model, &c->layout, counts, out->overflow, &ignored) == MP_OK) {
      need = out->overflow->memory_bytes;
      out->have_overflow = true;
    }
    const double gib = 1024.0 * 1024.0 * 1024.0;
    status = mp_fail(err, MP_ERR_INPUT,
                     "model %s fits on no layout of %d GPUs of %s: the smallest need is %.2f GiB "
                     "per GPU (%s), %.2f GiB over the %.2f GiB a device holds; use more GPUs, a "
                     "smaller --global-batch or --seq-len, or a cluster with more memory",
                     mp_model_name(model), options->gpus, cluster->name, need / gib, text,
                     (need - capacity) / gib, capacity / gib);
  }
  free(scratch);
  free_search(&s);
  return status;
}

void mp_planner_result_free(mp_planner_result *result) {
  free(result->results);
  free(result->overflow);
  memset(result, 0, sizeof *result);
}
