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
  char zero[16] = "", cp[24] = "";
  if (l->zero_stage > 0) snprintf(zero, sizeof zero, " zero-%d", l->zero_stage);
  char ep[24] = "";
  if (mp_layout_cp(l) > 1) snprintf(cp, sizeof cp, " cp %d", l->cp);
  if (mp_layout_ep(l) > 1) snprintf(ep, sizeof ep, " ep %d", l->ep);
  snprintf(out, (size_t)out_bytes,
           "dp %d%s%s pp %d tp %d micro-batch %lld %s v%d recompute %s%s%s", l->dp, cp, ep, l->pp,
           l->tp, (long long)l->micro_batch, mp_schedule_kind_name(l->schedule),
           l->virtual_stages, mp_recompute_name(l->recompute),
           l->sequence_parallel ? " sequence-parallel" : "", zero);
  return out;
}

/* Bounds are compared with the estimate's own sums, which add the same numbers in another order:
 * a bound prunes only when it is above the limit by more than this relative round-off, so a
 * layout whose bound ties with the limit is simulated rather than lost. */
#define BOUND_SLACK 1e-9

static bool exceeds(double bound, double limit) {
  return !(bound <= limit * (1.0 + BOUND_SLACK));
}

/* Per-layer costs of one (tp, cp, ep, micro-batch, recompute, sp) from mp_cost_layer, as prefix
 * sums, and the stage splits its candidates use. */
typedef struct {
  int tp, cp, ep;
  int64_t micro_batch;
  int recompute, sp;
  double *fwd, *bwd, *params, *act; /* prefix sums, (n + 1): the simulator's F and B (compute and
                                       tp and cp collectives), parameters and kept activation
                                       bytes */
  double *eparams;                  /* prefix sums, (n + 1): of params, the experts' */
  double *cost;                     /* (n) forward + backward: what the partitioner balances */
  double *transient;                /* (n) what a layer holds only while it computes (the cp
                                       buffers, the unfused attention's backward scratch) */
  double max_cost;                  /* the largest entry of cost */
  bool may_fit;                     /* some candidate's quick memory bound is within capacity;
                                       without one the table is never split (see quick_bounds) */
  int max_stages;                   /* the most stages (pp x v) of a candidate using the table */
  uint64_t wanted[MP_COST_MAX_STAGES / 64 + 1]; /* bit k: a candidate cuts k stages */
  int *split_at;                    /* NULL until needed, then (max_stages + 1): where the split
                                       of k stages starts in splits, -1 for k not wanted */
  int *splits;                      /* the wanted splits, one after another */
  double *bottleneck;               /* (max_stages + 1) with the splits: the largest stage cost
                                       of the split of k stages, which no split of k beats */
  bool shares_splits;               /* split_at and splits belong to the twin (the other sp),
                                       whose per-layer costs are the same to the bit */
} layer_table;

/* Fills t (whose tp, cp, micro_batch, recompute and sp are set) for layout from mp_cost_layer.
 * false when out of memory; t's arrays are freed by free_table either way. */
static bool fill_table(const mp_cluster *cluster, const mp_model *model, const mp_layout *layout,
                       layer_table *t) {
  const int n = mp_model_num_layers(model);
  const size_t n1 = (size_t)n + 1;
  t->fwd = calloc(n1, sizeof(double));
  t->bwd = calloc(n1, sizeof(double));
  t->params = calloc(n1, sizeof(double));
  t->act = calloc(n1, sizeof(double));
  t->cost = calloc(n1, sizeof(double));
  t->transient = calloc(n1, sizeof(double));
  t->eparams = calloc(n1, sizeof(double));
  if (!t->fwd || !t->bwd || !t->params || !t->act || !t->cost || !t->transient || !t->eparams) {
    return false;
  }
  t->max_cost = 0.0;
  for (int i = 0; i < n; ++i) {
    mp_layer_time time;
    /* On the node: every candidate has dp x cp x pp x tp = --gpus, so the table may ignore dp,
     * pp. */
    mp_cost_layer_on_node(cluster, mp_model_layer(model, i), layout, &time);
    const double f =
        time.forward_compute_s + time.forward_tp_s + time.forward_cp_s + time.forward_ep_s;
    const double b =
        time.backward_compute_s + time.backward_tp_s + time.backward_cp_s + time.backward_ep_s;
    /* The partition cost exactly as mp_cost_estimate sums it, so the splits are its splits. */
    t->cost[i] = mp_layer_time_seconds(&time);
    if (t->cost[i] > t->max_cost) t->max_cost = t->cost[i];
    t->fwd[i + 1] = t->fwd[i] + f;
    t->bwd[i + 1] = t->bwd[i] + b;
    t->params[i + 1] = t->params[i] + time.params;
    t->eparams[i + 1] = t->eparams[i] + time.expert_params;
    t->act[i + 1] = t->act[i] + time.activation_bytes;
    t->transient[i] = time.cp_buffer_bytes + time.attention_scratch_bytes;
  }
  return true;
}

static void free_table(layer_table *t) {
  free(t->fwd);
  free(t->bwd);
  free(t->params);
  free(t->act);
  free(t->cost);
  free(t->transient);
  free(t->eparams);
  if (!t->shares_splits) {
    free(t->split_at);
    free(t->splits);
    free(t->bottleneck);
  }
  memset(t, 0, sizeof *t);
}

/* Lower bounds of the step time and memory of layout whatever its stage split, which cost no
 * partition: the busiest pipeline rank does at least the average rank's work and the work of the
 * costliest layer; the fullest rank holds at least the average parameters' state, and the slowest
 * optimizer step is at least the average one. Each is at most split_bounds' (which takes the
 * largest over ranks of terms at least these). */
static void quick_bounds(const mp_cluster *cluster, const layer_table *t, int n,
                         const mp_layout *l, double tied_params, double *time, double *memory) {
  const double pp = l->pp, m = (double)l->num_micro_batches;
  double params = t->params[n];
  if (l->pp > 1) params += tied_params / l->tp;
  const double experts = t->eparams[n];
  const double work = t->fwd[n] + t->bwd[n];
  const double busiest = m * (work / pp > t->max_cost ? work / pp : t->max_cost);
  *time = busiest + mp_cost_rank_optimizer_seconds(cluster, l, params / pp, experts / pp);
  const mp_state_bytes held = mp_cost_rank_state_bytes(cluster, l, params / pp, experts / pp);
  *memory = held.weights + held.grads + held.optimizer + mp_cost_workspace_bytes(cluster);
}

/* The fewest (micro-batch, chunk) activation sets alive at once on pp rank r of the schedule: the
 * forwards it runs before its first backward, plus the one after them (all of them for GPipe). */
static int fewest_live(const mp_layout *l, int r) {
  const int pp = l->pp, v = l->virtual_stages, m = (int)l->num_micro_batches;
  int live;
  if (l->schedule == MP_SCHEDULE_GPIPE) {
    live = m;
  } else if (l->schedule == MP_SCHEDULE_INTERLEAVED_1F1B) {
    live = (pp - r - 1) * 2 + (v - 1) * pp + 1;
    if (live > m * v) live = m * v;
  } else {
    live = pp - r < m ? pp - r : m;
  }
  return live;
}

/* Lower bounds of the step time and memory of layout cut by counts (pp x v stage sizes); see
 * planner.h for why each term is one. */
static void split_bounds(const mp_cluster *cluster, const layer_table *t, const int *counts,
                         const mp_layout *l, double tied_params, double *time, double *memory) {
  const int pp = l->pp, v = l->virtual_stages, k = pp * v;
  int start[MP_COST_MAX_STAGES + 1];
  start[0] = 0;
  for (int i = 0; i < k; ++i) start[i + 1] = start[i] + counts[i];
  const double m = (double)l->num_micro_batches;
  /* zb-h1 runs weight gradients after a rank's last input gradient; the others end each rank
   * with the backward of the last micro-batch through its first chunk. */
  const bool backward_tail = l->schedule != MP_SCHEDULE_ZB_H1;
  double pipeline = 0.0, fullest = 0.0, slowest_optimizer = 0.0;
  for (int r = 0; r < pp; ++r) {
    double busy = 0.0, params = 0.0, least_activations = INFINITY, transient = 0.0;
    double experts = 0.0;
    for (int ch = 0; ch < v; ++ch) {
      const int st = ch * pp + r;
      const double f = t->fwd[start[st + 1]] - t->fwd[start[st]];
      const double b = t->bwd[start[st + 1]] - t->bwd[start[st]];
      busy += m * (f + b);
      params += t->params[start[st + 1]] - t->params[start[st]];
      experts += t->eparams[start[st + 1]] - t->eparams[start[st]];
      const double act = t->act[start[st + 1]] - t->act[start[st]];
      if (act < least_activations) least_activations = act;
      for (int i = start[st]; i < start[st + 1]; ++i) {
        if (t->transient[i] > transient) transient = t->transient[i];
      }
    }
    if (r == pp - 1 && pp > 1) params += tied_params / l->tp;
    /* Rank r starts after micro-batch 0's forward through stages 0 .. r - 1 (chunk 0, layers
     * [0, start[r])), runs its actions one at a time, and after its last one the gradient still
     * goes back through those stages. */
    const double chain = t->fwd[start[r]] + (backward_tail ? t->bwd[start[r]] : 0.0);
    if (chain + busy > pipeline) pipeline = chain + busy;
    const mp_state_bytes held = mp_cost_rank_state_bytes(cluster, l, params, experts);
    const double rank_memory = held.weights + held.grads + held.optimizer +
                               fewest_live(l, r) * least_activations +
                               mp_cost_workspace_bytes(cluster) + transient;
    if (rank_memory > fullest) fullest = rank_memory;
    const double optimizer = mp_cost_rank_optimizer_seconds(cluster, l, params, experts);
    if (optimizer > slowest_optimizer) slowest_optimizer = optimizer;
  }
  *time = pipeline + slowest_optimizer;
  *memory = fullest;
}

typedef struct {
  mp_layout layout;
  int table;
  long id;             /* enumeration order: among equal step times the lower id ranks first, so
                          the ranking does not depend on the order layouts are simulated in */
  double time_bound;   /* split_bounds under the table's split */
  double memory_bound;
  bool by_memory;      /* cut by memory (memory_counts) */
  bool refined;        /* by_memory: its bounds are its memory split's (refine_bounds), not yet
                          the quick ones that need no split */
} candidate;

/* A generated schedule, checked and matched once, timed for every layout that shares it. */
typedef struct {
  mp_schedule_kind kind;
  int pp, num_micro_batches, virtual_stages;
  mp_schedule schedule;
  mp_sim_prepared prepared; /* points at schedule: entries stay where they are allocated */
  long actions;
  long last_used;
} cached_schedule;

/* Cached schedules hold at most this many actions in all (about 30 bytes each with their
 * matching): the largest are evicted least recently used first, and one larger than this alone is
 * generated per layout instead. */
enum { kScheduleCacheActions = 1 << 21 };

typedef struct {
  const mp_cluster *cluster;
  const mp_model *model;
  int n;
  double tied_params;
  layer_table *tables;
  int num_tables, cap_tables;
  int *table_slots; /* open addressing over (tp, cp, ep, micro-batch, recompute, sp): table index
                       or -1 */
  int num_slots;    /* a power of two, at least twice num_tables */
  candidate *candidates;
  long num_candidates, cap_candidates;
  int *all_splits; /* scratch for mp_partition_chain_all, (MP_COST_MAX_STAGES + 1) x
                      MP_COST_MAX_STAGES / 2 entries at most, as the largest table needs */
  long all_splits_entries;
  cached_schedule **schedules;
  int num_schedules, cap_schedules;
  long cached_actions, clock;
  bool memory_split;   /* MP_SPLIT_MEMORY: candidates of one chunk per rank cut by memory */
  bool unfit_by_memory; /* the second search, when no time split fits: a layout whose time split
                           cannot fit by its memory bound is cut by memory instead */
  double *layer_params, *layer_acts; /* (n) scratch of memory_counts */
  /* Memory splits made, by what they depend on (memory_key): layouts that differ only in what
   * the split does not see (the schedule among those keeping as many micro-batches alive, the
   * number of micro-batches beyond pp) share one. counts in split_pool. */
  struct memory_split_entry {
    int table, pp, live_kind;
    int64_t live_cap;
    double state;
    long at; /* in split_pool; -1: an empty entry */
  } *memory_splits;
  long num_memory_splits, cap_memory_splits; /* cap a power of two */
  int *split_pool;
  long pool_used, pool_cap;
} search;

static void free_search(search *s) {
  free(s->layer_params);
  free(s->layer_acts);
  free(s->memory_splits);
  free(s->split_pool);
  for (int i = 0; i < s->num_tables; ++i) free_table(&s->tables[i]);
  free(s->tables);
  free(s->table_slots);
  free(s->candidates);
  free(s->all_splits);
  for (int i = 0; i < s->num_schedules; ++i) {
    mp_sim_prepared_free(&s->schedules[i]->prepared);
    mp_schedule_free(&s->schedules[i]->schedule);
    free(s->schedules[i]);
  }
  free(s->schedules);
}

static unsigned table_hash(int tp, int cp, int ep, int64_t micro_batch, int recompute, int sp) {
  uint64_t h = ((uint64_t)micro_batch ^ (uint64_t)ep << 40) * 0x9E3779B97F4A7C15ull;
  h ^= ((uint64_t)cp << 32 | (uint64_t)tp << 8 | (uint64_t)recompute << 1 | (uint64_t)sp) *
       0xC2B2AE3D27D4EB4Full;
  return (unsigned)(h ^ (h >> 29));
}

/* The slot of the key: its table's or the empty one where it would go. */
static int find_slot(const search *s, int tp, int cp, int ep, int64_t micro_batch, int recompute,
                     int sp) {
  const unsigned mask = (unsigned)s->num_slots - 1;
  for (unsigned i = table_hash(tp, cp, ep, micro_batch, recompute, sp) & mask;;
       i = (i + 1) & mask) {
    const int index = s->table_slots[i];
    if (index < 0) return (int)i;
    const layer_table *t = &s->tables[index];
    if (t->tp == tp && t->cp == cp && t->ep == ep && t->micro_batch == micro_batch &&
        t->recompute == recompute && t->sp == sp) {
      return (int)i;
    }
  }
}

static bool grow_slots(search *s) {
  const int slots = s->num_slots ? 2 * s->num_slots : 256;
  int *grown = malloc(sizeof(int) * (size_t)slots);
  if (grown == NULL) return false;
  for (int i = 0; i < slots; ++i) grown[i] = -1;
  free(s->table_slots);
  s->table_slots = grown;
  s->num_slots = slots;
  for (int index = 0; index < s->num_tables; ++index) {
    const layer_table *t = &s->tables[index];
    s->table_slots[find_slot(s, t->tp, t->cp, t->ep, t->micro_batch, t->recompute, t->sp)] =
        index;
  }
  return true;
}

/* The table of the layout's (tp, cp, ep, micro-batch, recompute, sp), made on first use; -1 when
 * out of memory. */
static int get_table(search *s, const mp_layout *layout) {
  const int rc = (int)layout->recompute, sp = layout->sequence_parallel ? 1 : 0;
  const int cp = mp_layout_cp(layout), ep = mp_layout_ep(layout);
  if (2 * (s->num_tables + 1) > s->num_slots && !grow_slots(s)) return -1;
  const int slot = find_slot(s, layout->tp, cp, ep, layout->micro_batch, rc, sp);
  if (s->table_slots[slot] >= 0) return s->table_slots[slot];
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
  t->cp = cp;
  t->ep = ep;
  t->micro_batch = layout->micro_batch;
  t->recompute = rc;
  t->sp = sp;
  ++s->num_tables;
  if (!fill_table(s->cluster, s->model, layout, t)) return -1;
  s->table_slots[slot] = s->num_tables - 1;
  return s->num_tables - 1;
}

static bool wants(const layer_table *t, int k) { return (t->wanted[k / 64] >> (k % 64)) & 1u; }

/* The partitioner's split of table t into k stages (a wanted k), or NULL when out of memory. All
 * the table's splits come from one dynamic programme the first time one is needed, and only the
 * wanted ones are kept. Sequence parallelism usually leaves durations alone, so the twin's splits
 * are reused when its per-layer costs are the same to the bit and it keeps every split this table
 * wants. */
static const int *get_counts(search *s, layer_table *t, int k) {
  if (t->splits == NULL) {
    const int twin_slot =
        find_slot(s, t->tp, t->cp, t->ep, t->micro_batch, t->recompute, 1 - t->sp);
    if (s->table_slots[twin_slot] >= 0) {
      const layer_table *twin = &s->tables[s->table_slots[twin_slot]];
      bool covered = twin->splits != NULL;
      for (size_t w = 0; covered && w < sizeof t->wanted / sizeof t->wanted[0]; ++w) {
        covered = (t->wanted[w] & ~twin->wanted[w]) == 0;
      }
      if (covered && memcmp(twin->cost, t->cost, sizeof(double) * (size_t)s->n) == 0) {
        t->split_at = twin->split_at;
        t->splits = twin->splits;
        t->bottleneck = twin->bottleneck;
        t->shares_splits = true;
      }
    }
  }
  if (t->splits == NULL) {
    const int most = t->max_stages;
    const long entries = (long)most * (most + 1) / 2;
    if (entries > s->all_splits_entries) {
      int *grown = realloc(s->all_splits, sizeof(int) * (size_t)entries);
      if (grown == NULL) return NULL;
      s->all_splits = grown;
      s->all_splits_entries = entries;
    }
    t->bottleneck = malloc(sizeof(double) * (size_t)(most + 1));
    mp_error ignored = MP_ERROR_INITIALIZER;
    if (t->bottleneck == NULL ||
        mp_partition_chain_all(t->cost, s->n, most, s->all_splits, t->bottleneck, &ignored) !=
            MP_OK) {
      free(t->bottleneck);
      t->bottleneck = NULL;
      return NULL;
    }
    long kept = 0;
    for (int j = 1; j <= most; ++j) kept += wants(t, j) ? j : 0;
    t->split_at = malloc(sizeof(int) * (size_t)(most + 1));
    t->splits = malloc(sizeof(int) * (size_t)(kept > 0 ? kept : 1));
    if (t->split_at == NULL || t->splits == NULL) {
      free(t->split_at);
      free(t->splits);
      free(t->bottleneck);
      t->split_at = t->splits = NULL;
      t->bottleneck = NULL;
      return NULL;
    }
    int at = 0;
    for (int j = 0; j <= most; ++j) {
      t->split_at[j] = -1;
      if (j == 0 || !wants(t, j)) continue;
      t->split_at[j] = at;
      memcpy(t->splits + at, s->all_splits + (size_t)j * (size_t)(j - 1) / 2,
             sizeof(int) * (size_t)j);
      at += j;
    }
  }
  if (k < 1 || k > t->max_stages || t->split_at[k] < 0) return NULL;
  return t->splits + t->split_at[k];
}

/* The checked schedule of the layout from the cache, generating it on first use; NULL when it is
 * too large to keep or cannot be made (the caller then estimates without the cache, which reports
 * any error). */
static const mp_sim_prepared *get_schedule(search *s, const mp_layout *l) {
  ++s->clock;
  for (int i = 0; i < s->num_schedules; ++i) {
    cached_schedule *c = s->schedules[i];
    if (c->kind == l->schedule && c->pp == l->pp && c->num_micro_batches == l->num_micro_batches &&
        c->virtual_stages == l->virtual_stages) {
      c->last_used = s->clock;
      return &c->prepared;
    }
  }
  const long work = (long)l->pp * (long)l->num_micro_batches * l->virtual_stages;
  const long actions = work * (l->schedule == MP_SCHEDULE_ZB_H1 ? 3 : 2);
  if (actions > kScheduleCacheActions) return NULL;
  while (s->cached_actions + actions > kScheduleCacheActions && s->num_schedules > 0) {
    int oldest = 0;
    for (int i = 1; i < s->num_schedules; ++i) {
      if (s->schedules[i]->last_used < s->schedules[oldest]->last_used) oldest = i;
    }
    cached_schedule *evicted = s->schedules[oldest];
    s->cached_actions -= evicted->actions;
    mp_sim_prepared_free(&evicted->prepared);
    mp_schedule_free(&evicted->schedule);
    free(evicted);
    s->schedules[oldest] = s->schedules[--s->num_schedules];
  }
  if (s->num_schedules == s->cap_schedules) {
    const int cap = s->cap_schedules ? 2 * s->cap_schedules : 64;
    cached_schedule **grown = realloc(s->schedules, sizeof *grown * (size_t)cap);
    if (grown == NULL) return NULL;
    s->schedules = grown;
    s->cap_schedules = cap;
  }
  cached_schedule *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  mp_error ignored = MP_ERROR_INITIALIZER;
  if (mp_schedule_generate(l->schedule, l->pp, (int)l->num_micro_batches, l->virtual_stages,
                           &c->schedule, &ignored) != MP_OK ||
      mp_sim_prepare(&c->schedule, MP_P2P_EAGER, &c->prepared, &ignored) != MP_OK) {
    mp_sim_prepared_free(&c->prepared);
    mp_schedule_free(&c->schedule);
    free(c);
    return NULL;
  }
  c->kind = l->schedule;
  c->pp = l->pp;
  c->num_micro_batches = (int)l->num_micro_batches;
  c->virtual_stages = l->virtual_stages;
  c->actions = mp_schedule_total_actions(&c->schedule);
  c->last_used = s->clock;
  s->cached_actions += c->actions;
  s->schedules[s->num_schedules++] = c;
  return &c->prepared;
}

/* Whether a layout can be cut by memory (see mp_planner_split): one chunk per rank, pp > 1. */
static bool can_split_by_memory(const mp_layout *l) {
  return l->pp > 1 && l->virtual_stages == 1;
}

/* What a memory split of layout l on table t depends on besides the table: pp, the micro-batches
 * each rank keeps alive (fewest_live: all m with GPipe, else min(pp - r, m)) and the state bytes
 * of a parameter. */
static struct memory_split_entry memory_key(search *s, int table, const mp_layout *l) {
  const mp_state_bytes sharded = mp_cost_sharded_state_bytes(s->cluster, l);
  struct memory_split_entry key;
  memset(&key, 0, sizeof key);
  key.table = table;
  key.pp = l->pp;
  key.live_kind = l->schedule == MP_SCHEDULE_GPIPE ? 1 : 0;
  key.live_cap = key.live_kind ? l->num_micro_batches
                               : (l->num_micro_batches < l->pp ? l->num_micro_batches : l->pp);
  key.state = sharded.weights + sharded.grads + sharded.optimizer;
  key.at = -1;
  return key;
}

static unsigned long memory_hash(const struct memory_split_entry *k) {
  uint64_t bits = 0;
  memcpy(&bits, &k->state, sizeof bits);
  uint64_t h = (uint64_t)k->table * 0x9E3779B97F4A7C15ull;
  h ^= (uint64_t)k->pp * 0xC2B2AE3D27D4EB4Full + (uint64_t)k->live_cap * 0x165667B19E3779F9ull;
  h ^= bits + (uint64_t)k->live_kind + (h << 6) + (h >> 2);
  return (unsigned long)(h ^ (h >> 29));
}

static bool same_key(const struct memory_split_entry *a, const struct memory_split_entry *b) {
  return a->table == b->table && a->pp == b->pp && a->live_kind == b->live_kind &&
         a->live_cap == b->live_cap && a->state == b->state;
}

/* The slot of key in the table (its entry, or the empty one where it goes). */
static long memory_slot(const search *s, const struct memory_split_entry *key) {
  const long mask = s->cap_memory_splits - 1;
  long i = (long)(memory_hash(key) & (unsigned long)mask);
  while (s->memory_splits[i].at >= 0 && !same_key(&s->memory_splits[i], key)) i = (i + 1) & mask;
  return i;
}

static bool grow_memory_splits(search *s) {
  const long cap = s->cap_memory_splits ? 2 * s->cap_memory_splits : 1024;
  struct memory_split_entry *old = s->memory_splits;
  const long old_cap = s->cap_memory_splits;
  s->memory_splits = malloc(sizeof *old * (size_t)cap);
  if (s->memory_splits == NULL) {
    s->memory_splits = old;
    return false;
  }
  s->cap_memory_splits = cap;
  for (long i = 0; i < cap; ++i) s->memory_splits[i].at = -1;
  for (long i = 0; i < old_cap; ++i) {
    if (old[i].at >= 0) s->memory_splits[memory_slot(s, &old[i])] = old[i];
  }
  free(old);
  return true;
}

/* The memory split of candidate c (pp stages): each stage's parameters times the state bytes of
 * one, its activations times the fewest micro-batches the schedule keeps alive on its rank
 * (split_bounds' terms, so the split minimises that bound), and the tied head's copy on the
 * last; made once per memory_key. NULL when out of memory. */
static const int *memory_counts(search *s, const candidate *c) {
  const layer_table *t = &s->tables[c->table];
  const mp_layout *l = &c->layout;
  const int n = s->n, pp = l->pp;
  if (2 * (s->num_memory_splits + 1) > s->cap_memory_splits && !grow_memory_splits(s)) {
    return NULL;
  }
  struct memory_split_entry key = memory_key(s, c->table, l);
  const long slot = memory_slot(s, &key);
  if (s->memory_splits[slot].at >= 0) return s->split_pool + s->memory_splits[slot].at;
  if (s->layer_params == NULL) {
    s->layer_params = malloc(sizeof(double) * (size_t)n);
    s->layer_acts = malloc(sizeof(double) * (size_t)n);
    if (s->layer_params == NULL || s->layer_acts == NULL) return NULL;
  }
  if (s->pool_used + pp > s->pool_cap) {
    const long cap = s->pool_cap ? 2 * s->pool_cap + pp : 4096 + pp;
    int *grown = realloc(s->split_pool, sizeof(int) * (size_t)cap);
    if (grown == NULL) return NULL;
    s->split_pool = grown;
    s->pool_cap = cap;
  }
  for (int i = 0; i < n; ++i) {
    s->layer_params[i] = t->params[i + 1] - t->params[i];
    s->layer_acts[i] = t->act[i + 1] - t->act[i];
  }
  double state_weight[MP_COST_MAX_STAGES], live[MP_COST_MAX_STAGES], fixed[MP_COST_MAX_STAGES];
  for (int r = 0; r < pp; ++r) {
    state_weight[r] = key.state;
    live[r] = fewest_live(l, r);
    fixed[r] = r == pp - 1 ? s->tied_params / l->tp * key.state : 0.0;
  }
  double bottleneck = 0.0;
  mp_error ignored = MP_ERROR_INITIALIZER;
  int *counts = s->split_pool + s->pool_used;
  if (mp_partition_chain_staged(s->layer_params, s->layer_acts, n, pp, state_weight, live, fixed,
                                counts, &bottleneck, &ignored) != MP_OK) {
    return NULL;
  }
  key.at = s->pool_used;
  s->pool_used += pp;
  s->memory_splits[slot] = key;
  ++s->num_memory_splits;
  return counts;
}

/* mp_cost_estimate of the candidate with its split (its table's, or by memory), through the
 * schedule cache. */
static mp_status estimate(search *s, const candidate *c, mp_estimate *out) {
  layer_table *t = &s->tables[c->table];
  const int *counts = c->by_memory ? memory_counts(s, c)
                                   : get_counts(s, t, c->layout.pp * c->layout.virtual_stages);
  if (counts == NULL) return MP_ERR_RUNTIME;
  mp_error ignored = MP_ERROR_INITIALIZER;
  const mp_sim_prepared *prepared = get_schedule(s, &c->layout);
  if (prepared != NULL) {
    return mp_cost_estimate_prepared(s->cluster, s->model, &c->layout, counts, prepared, out,
                                     &ignored);
  }
  return mp_cost_estimate(s->cluster, s->model, &c->layout, counts, out, &ignored);
}

/* Bounds of the candidate under its split; infinite when the split cannot be made. When no
 * candidate of its table can fit by the quick memory bound and `quick` is set, the quick bounds
 * instead: such a table is never split unless one of them is estimated. A candidate is cut by
 * memory (by_memory) with --split memory, or when its time split cannot fit by its own memory
 * bound while a memory split might: the planner's answer to a model whose time-balanced stages
 * do not fit. Either way its bounds are its memory split's; the rule depends on bounds only,
 * so the pruned and the exhaustive search cut every layout alike. */
static void candidate_bounds(search *s, candidate *c, bool quick) {
  layer_table *t = &s->tables[c->table];
  c->by_memory = false;
  if (quick && !t->may_fit) {
    quick_bounds(s->cluster, t, s->n, &c->layout, s->tied_params, &c->time_bound,
                 &c->memory_bound);
    return;
  }
  const bool splittable = can_split_by_memory(&c->layout);
  if (!(s->memory_split && splittable)) {
    const int *counts = get_counts(s, t, c->layout.pp * c->layout.virtual_stages);
    if (counts == NULL) {
      c->time_bound = c->memory_bound = INFINITY;
      return;
    }
    split_bounds(s->cluster, t, counts, &c->layout, s->tied_params, &c->time_bound,
                 &c->memory_bound);
    if (!s->unfit_by_memory || !splittable ||
        !exceeds(c->memory_bound, (double)s->cluster->device_memory_bytes)) {
      return;
    }
  }
  /* The quick bounds until the search reaches it (refine_bounds): a split by memory costs a
   * dynamic programme per layout, which most layouts never need. */
  c->by_memory = true;
  c->refined = false;
  quick_bounds(s->cluster, t, s->n, &c->layout, s->tied_params, &c->time_bound,
               &c->memory_bound);
  /* Any split of pp stages has a stage at least as costly as the time split's bottleneck, which
   * its rank runs for every micro-batch (so the quick bound rises to it). */
  const int pp = c->layout.pp;
  if (get_counts(s, t, pp) != NULL) {
    const mp_layout *l = &c->layout;
    double params = t->params[s->n] + (pp > 1 ? s->tied_params / l->tp : 0.0);
    const double busiest = (double)l->num_micro_batches * t->bottleneck[pp];
    const double bound = busiest + mp_cost_rank_optimizer_seconds(s->cluster, l, params / pp,
                                                                  t->eparams[s->n] / pp);
    if (bound > c->time_bound) c->time_bound = bound;
  }
}

/* A by_memory candidate's bounds under its memory split (tighter than the quick ones it was
 * sorted by, so the search may still prune it when it comes to it). */
static void refine_bounds(search *s, candidate *c) {
  if (!c->by_memory || c->refined) return;
  c->refined = true;
  /* No split fits when the average rank does not: then the quick bounds stay. */
  if (exceeds(c->memory_bound, (double)s->cluster->device_memory_bytes)) return;
  const int *counts = memory_counts(s, c);
  if (counts == NULL) {
    c->time_bound = c->memory_bound = INFINITY;
    return;
  }
  split_bounds(s->cluster, &s->tables[c->table], counts, &c->layout, s->tied_params,
               &c->time_bound, &c->memory_bound);
}

static int add_candidate(search *s, const mp_layout *layout) {
  if (s->num_candidates == s->cap_candidates) {
    const long cap = s->cap_candidates ? 2 * s->cap_candidates : 4096;
    candidate *grown = realloc(s->candidates, sizeof(candidate) * (size_t)cap);
    if (grown == NULL) return -1;
    s->candidates = grown;
    s->cap_candidates = cap;
  }
  candidate *c = &s->candidates[s->num_candidates];
  c->layout = *layout;
  c->id = s->num_candidates;
  c->table = get_table(s, layout);
  if (c->table < 0) return -1;
  layer_table *t = &s->tables[c->table];
  const int stages = layout->pp * layout->virtual_stages;
  if (stages > t->max_stages) t->max_stages = stages;
  t->wanted[stages / 64] |= (uint64_t)1 << (stages % 64);
  double quick_time, quick_memory;
  quick_bounds(s->cluster, t, s->n, layout, s->tied_params, &quick_time, &quick_memory);
  if (!exceeds(quick_memory, (double)s->cluster->device_memory_bytes)) t->may_fit = true;
  ++s->num_candidates;
  return 0;
}

/* What the candidates are sorted by: small, so that sorting 20 000 of them moves little. */
typedef struct {
  double time_bound;
  long id; /* the candidate's index */
} bound_order;

static int by_time_bound(const void *a, const void *b) {
  const bound_order *x = a, *y = b;
  if (x->time_bound != y->time_bound) return x->time_bound < y->time_bound ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id ? 1 : 0;
}

/* Whether (step, id) ranks before (other_step, other_id). */
static bool ranks_before(double step, long id, double other_step, long other_id) {
  return step < other_step || (step == other_step && id < other_id);
}

/* Why tp = value cannot be used (written into why, naming the number it fails), or NULL. Whole
 * key/value heads go to each tp rank, as Megatron-Core requires (num_query_groups % tp == 0). */
static const char *tp_refusal(const mp_cluster *cluster, const mp_model *model, int tp, char *why,
                              size_t why_bytes) {
  if (tp > cluster->devices_per_node) {
    snprintf(why, why_bytes, "is more than the %d devices in one node", cluster->devices_per_node);
    return why;
  }
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *l = mp_model_layer(model, i);
    if (l->kind != MP_LAYER_TRANSFORMER) continue;
    if (l->heads % tp != 0) {
      snprintf(why, why_bytes, "does not divide the %lld attention heads", (long long)l->heads);
      return why;
    }
    if (l->kv_heads % tp != 0) {
      snprintf(why, why_bytes, "does not divide the %lld kv heads", (long long)l->kv_heads);
      return why;
    }
    if (l->ffn_hidden % tp != 0) {
      snprintf(why, why_bytes, "does not divide the MLP width %lld", (long long)l->ffn_hidden);
      return why;
    }
  }
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *l = mp_model_layer(model, i);
    if ((l->kind == MP_LAYER_EMBEDDING || l->kind == MP_LAYER_LM_HEAD) &&
        mp_padded_vocab(l->vocab) % tp != 0) {
      snprintf(why, why_bytes, "does not divide the padded vocabulary %lld",
               (long long)mp_padded_vocab(l->vocab));
      return why;
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

/* Whether the free search tries cp on sequences of seq_len tokens: a power of two, seq_len a
 * multiple of 2 cp, chunks of at least MP_PLANNER_MIN_CP_CHUNK (planner.h). */
static bool cp_searched(int cp, int64_t seq_len) {
  return cp >= 1 && (cp & (cp - 1)) == 0 && seq_len % (2 * (int64_t)cp) == 0 &&
         (cp == 1 || seq_len / (2 * (int64_t)cp) >= MP_PLANNER_MIN_CP_CHUNK);
}

static mp_status check_fixed(const mp_planner_options *o, int64_t global_batch, int64_t seq_len,
                             mp_error *err) {
  const int n = o->gpus;
  if (o->cp > 1 && seq_len % (2 * (int64_t)o->cp) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--cp %d needs the sequence length to be a multiple of 2 x cp = %d (each cp "
                   "rank holds 2 of 2 cp equal chunks of every sequence), but it is %lld; choose "
                   "a --cp whose 2 cp divides %lld, or another --seq-len",
                   o->cp, 2 * o->cp, (long long)seq_len, (long long)seq_len);
  }
  if (o->cp > 1 && o->zero_shard_size > 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero-shard-size %d (hybrid sharding) is not planned with context "
                   "parallelism, but --cp is %d: drop one of them",
                   o->zero_shard_size, o->cp);
  }
  if (o->ep > 1 && o->zero_shard_size > 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero-shard-size %d (hybrid sharding) is not planned with expert "
                   "parallelism, but --ep is %d: drop one of them",
                   o->zero_shard_size, o->ep);
  }
  if (o->ep > 1 && o->dp && o->cp && ((int64_t)o->dp * o->cp) % o->ep != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--ep %d does not divide dp x cp = %d x %d = %d (the expert-parallel groups "
                   "are cut out of the dp x cp ranks); choose an --ep that divides it",
                   o->ep, o->dp, o->cp ? o->cp : 1, o->dp * (o->cp ? o->cp : 1));
  }
  if (o->ep > 1 && n % o->ep != 0) {
    return mp_fail(err, MP_ERR_INPUT, "--ep %d does not divide --gpus %d", o->ep, n);
  }
  const int64_t sizes = (int64_t)o->dp * o->pp * o->tp;
  if (o->dp && o->pp && o->tp && o->cp && sizes * o->cp != n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--dp %d x --cp %d x --pp %d x --tp %d = %lld, but --gpus is %d; fix one of "
                   "them so that dp x cp x pp x tp = %d",
                   o->dp, o->cp, o->pp, o->tp, (long long)(sizes * o->cp), n, n);
  }
  if (o->dp && o->pp && o->tp && !o->cp && sizes != n &&
      (sizes > n || n % sizes != 0 || !cp_searched((int)(n / sizes), seq_len) ||
       o->zero_shard_size > 0)) {
    /* What dp x pp x tp leaves for cp (n / (dp pp tp)) is no cp the search tries. */
    char hint[160] = "";
    if (sizes < n && n % sizes == 0) {
      snprintf(hint, sizeof hint, ", or fix --cp %lld if sequences of %lld tokens take it",
               (long long)(n / sizes), (long long)seq_len);
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "--dp %d x --pp %d x --tp %d = %lld, but --gpus is %d; fix one of them so "
                   "that dp x pp x tp = %d%s",
                   o->dp, o->pp, o->tp, (long long)sizes, n, n, hint);
  }
  const int fixed =
      (o->dp ? o->dp : 1) * (o->pp ? o->pp : 1) * (o->tp ? o->tp : 1) * (o->cp ? o->cp : 1);
  if (n % fixed != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the fixed sizes (dp x %spp x tp = %d) do not divide --gpus %d",
                   o->cp ? "cp x " : "", fixed, n);
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
  if (o->zero_stage >= 1 && o->dp == 1 && o->cp <= 1) {
    /* (With --cp fixed above 1 the state is sharded over the cp ranks, which hold the same
     * weights.) */
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero %d shards %s across data-parallel ranks, but --dp is 1",
                   o->zero_stage,
                   o->zero_stage == 1   ? "optimizer state"
                   : o->zero_stage == 2 ? "optimizer state and gradients"
                                        : "optimizer state, gradients and parameters");
  }
  if (o->zero_shard_size > 0 &&
      (o->dp == 0 || (o->zero_stage != 1 && o->zero_stage != 2) || o->dp % o->zero_shard_size != 0)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero-shard-size %d shards ZeRO's state within groups of dp ranks: it needs "
                   "--dp fixed to a multiple of it and --zero 1 or 2 (got --dp %d, --zero %d)",
                   o->zero_shard_size, o->dp, o->zero_stage);
  }
  if (o->zero_stage >= 3 && o->schedule == MP_SCHEDULE_ZB_H1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--zero %d gathers each layer's parameters around its whole backward, but "
                   "--schedule zb-h1 splits the backward and defers the weight gradients; "
                   "choose one",
                   o->zero_stage);
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

/* Whether the free search tries ep on s's model: 1 always; above 1, when it divides every MoE
 * block's experts (mp_cost_check_ep), so never on a dense model. */
static bool ep_searched(const search *s, int ep) {
  if (ep == 1) return true;
  mp_error ignored = MP_ERROR_INITIALIZER;
  return mp_cost_check_ep(s->model, ep, &ignored) == MP_OK;
}

static void enumerate(search *s, const mp_planner_options *o, int64_t global_batch,
                      int64_t seq_len, long *layouts, bool *oom) {
  const int n = o->gpus, layers = s->n;
  for (int tp = 1; tp <= n; ++tp) {
    char why[128];
    if (n % tp != 0 || (o->tp && tp != o->tp) ||
        tp_refusal(s->cluster, s->model, tp, why, sizeof why)) {
      continue;
    }
    for (int cp = 1; cp <= n / tp; ++cp) {
      if ((n / tp) % cp != 0) continue;
      if (o->cp ? cp != o->cp : !cp_searched(cp, seq_len) || (cp > 1 && o->zero_shard_size > 0)) {
        continue;
      }
      for (int pp = 1; pp <= n / tp / cp; ++pp) {
        if ((n / tp / cp) % pp != 0 || (o->pp && pp != o->pp) || pp > layers) continue;
        const int dp = n / tp / cp / pp;
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
              if (pp * v > layers || pp * v > MP_COST_MAX_STAGES ||
                  (int64_t)pp * m * v > MP_SCHEDULE_MAX_WORK) {
                continue;
              }
              for (int rc = 0; rc < MP_RECOMPUTE_COUNT; ++rc) {
                if (o->recompute >= 0 && rc != o->recompute) continue;
                for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                  if (o->sequence_parallel >= 0 && sp != o->sequence_parallel) continue;
                  /* The stages the runtime trains as the cost model has them: on GPUs 0, 1 and 2
                   * (ZeRO-2's reduce-scatters overlap the next block's backward), and 3 only when
                   * asked for (--zero): its gathers are prefetched one block ahead, but the first
                   * block of every pass waits for its own, which the model's full overlap does
                   * not see, and it is not yet measured on a GPU; on CPU ranks (nothing overlaps
                   * there, as the model has it) all four. */
                  const int runnable = s->cluster->cores_per_node > 0 ? 3 : 2;
                  const int last_zero = dp * cp == 1               ? 0
                                        : o->zero_stage > runnable ? o->zero_stage
                                                                   : runnable;
                  for (int zero = 0; zero <= last_zero; ++zero) {
                    if (o->zero_stage >= 0 && zero != o->zero_stage) continue;
                    if (zero >= 3 && kind == MP_SCHEDULE_ZB_H1) continue; /* see the refusal */
                    /* Expert parallelism: a divisor of dp x cp that splits every MoE block's
                     * experts (1 alone for a dense model), or the fixed --ep. */
                    for (int ep = 1; ep <= dp * cp; ++ep) {
                      if ((dp * cp) % ep != 0 || (o->ep ? ep != o->ep : !ep_searched(s, ep)) ||
                          (ep > 1 && o->zero_shard_size > 0)) {
                        continue;
                      }
                      mp_layout layout = {dp, pp, tp, v, mb, m, seq_len, (mp_schedule_kind)kind,
                                          (mp_recompute)rc, sp == 1, zero, o->zero_shard_size,
                                          cp, ep};
                      if (add_candidate(s, &layout) != 0) *oom = true;
                    }
                  }
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
    char buffer[128];
    const char *why = tp_refusal(cluster, model, tp, buffer, sizeof buffer);
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

/* The top K so far. Estimates (about 150 KB each) stay in a pool of top + 1 slots and only slot
 * numbers move as the list changes: one slot is always free for the next estimate. */
typedef struct {
  mp_estimate *pool;            /* (top + 1) */
  int slot[MP_PLANNER_MAX_TOP]; /* (count) pool slots, fastest first */
  long id[MP_PLANNER_MAX_TOP];  /* (count) their candidates' ids, for ties */
  int count, top, next_unused;
} ranking;

/* Ranks the estimate in pool slot `scratch` (of candidate id) into the list; returns the slot
 * free for the next estimate (scratch itself when it did not make the list). */
static int rank_estimate(ranking *r, int scratch, long id) {
  const double step = r->pool[scratch].step_s;
  int at = r->count;
  while (at > 0 && ranks_before(step, id, r->pool[r->slot[at - 1]].step_s, r->id[at - 1])) --at;
  if (at >= r->top) return scratch;
  int free_slot;
  if (r->count < r->top) {
    free_slot = r->next_unused++;
    ++r->count;
  } else {
    free_slot = r->slot[r->top - 1];
  }
  for (int i = r->count - 1; i > at; --i) {
    r->slot[i] = r->slot[i - 1];
    r->id[i] = r->id[i - 1];
  }
  r->slot[at] = scratch;
  r->id[at] = id;
  return free_slot;
}

/* The step time of the last of the top K, once there are K. */
static double kth_step(const ranking *r) { return r->pool[r->slot[r->top - 1]].step_s; }

/* One search; unfit_by_memory: see search. */
static mp_status search_layouts(const mp_cluster *cluster, const mp_model *model,
                                const mp_planner_options *options, bool unfit_by_memory,
                                mp_planner_result *out, mp_error *err) {
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
  MP_TRY(check_fixed(options, global_batch, seq_len, err));
  if (options->tp) {
    char buffer[128];
    const char *why = tp_refusal(cluster, model, options->tp, buffer, sizeof buffer);
    if (why != NULL) {
      return mp_fail(err, MP_ERR_INPUT, "--tp %d %s of model %s", options->tp, why,
                     mp_model_name(model));
    }
  }
  search s;
  memset(&s, 0, sizeof s);
  s.cluster = cluster;
  s.model = model;
  s.n = mp_model_num_layers(model);
  s.tied_params = tied_table(model);
  s.memory_split = options->split == MP_SPLIT_MEMORY;
  s.unfit_by_memory = unfit_by_memory;
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
  bound_order *order = malloc(sizeof(bound_order) * (size_t)s.num_candidates);
  if (order == NULL) {
    free_search(&s);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  for (long i = 0; i < s.num_candidates; ++i) {
    candidate_bounds(&s, &s.candidates[i], true);
    order[i] = (bound_order){s.candidates[i].time_bound, i};
  }
  qsort(order, (size_t)s.num_candidates, sizeof *order, by_time_bound);
  ranking rank;
  memset(&rank, 0, sizeof rank);
  rank.top = top;
  rank.next_unused = 1;
  rank.pool = calloc((size_t)top + 1, sizeof(mp_estimate));
  out->results = calloc((size_t)top, sizeof(mp_estimate));
  out->overflow = calloc(1, sizeof(mp_estimate));
  if (rank.pool == NULL || out->results == NULL || out->overflow == NULL) {
    free(rank.pool);
    free(order);
    free_search(&s);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  const bool prune = !options->exhaustive;
  const double capacity = (double)cluster->device_memory_bytes;
  int scratch = 0;
  long overflow_id = -1;
  /* The layout with the smallest time bound that its memory bound ruled out (for --explain): the
   * first one met, in the order of the bounds. */
  long ruled_out = -1;
  for (long i = 0; i < s.num_candidates; ++i) {
    candidate *c = &s.candidates[order[i].id];
    if (prune && rank.count == top && exceeds(c->time_bound, kth_step(&rank))) {
      /* In the order of the bounds: every layout left is slower than the K-th best. */
      out->pruned += s.num_candidates - i;
      break;
    }
    if (prune && c->by_memory && !c->refined) {
      /* Its split's bounds now; the K-th best only falls, so a layout they rule out stays out. */
      refine_bounds(&s, c);
      if (rank.count == top && exceeds(c->time_bound, kth_step(&rank))) {
        ++out->pruned;
        continue;
      }
    }
    if (prune && exceeds(c->memory_bound, capacity)) {
      ++out->pruned;
      ++out->pruned_by_memory;
      if (ruled_out < 0) ruled_out = c->id;
      continue;
    }
    mp_estimate *e = &rank.pool[scratch];
    if (estimate(&s, c, e) != MP_OK) continue;
    ++out->simulated;
    if (!e->fits) {
      if (!out->have_overflow || ranks_before(e->step_s, c->id, out->overflow->step_s,
                                              overflow_id)) {
        memcpy(out->overflow, e, sizeof *e);
        out->have_overflow = true;
        overflow_id = c->id;
      }
      continue;
    }
    scratch = rank_estimate(&rank, scratch, c->id);
  }
  out->num_results = rank.count;
  for (int i = 0; i < rank.count; ++i) {
    memcpy(&out->results[i], &rank.pool[rank.slot[i]], sizeof(mp_estimate));
  }
  mp_estimate *spare = &rank.pool[scratch];
  if (out->num_results > 0 && ruled_out >= 0 &&
      s.candidates[ruled_out].time_bound < out->results[0].step_s) {
    /* A layout ruled out by its memory bound might have been faster: measure it for --explain. */
    const candidate *c = &s.candidates[ruled_out];
    if (estimate(&s, c, spare) == MP_OK && !spare->fits &&
        (!out->have_overflow ||
         ranks_before(spare->step_s, c->id, out->overflow->step_s, overflow_id))) {
      memcpy(out->overflow, spare, sizeof *spare);
      out->have_overflow = true;
    }
  }
  if (out->num_results > 0 && out->have_overflow &&
      out->overflow->step_s >= out->results[0].step_s) {
    out->have_overflow = false;
  }
  mp_status status = MP_OK;
  if (out->num_results == 0) {
    /* Nothing fits: measure the candidate with the least memory bound exactly and report it. */
    for (long i = 0; i < s.num_candidates; ++i) {
      if (!s.tables[s.candidates[i].table].may_fit) candidate_bounds(&s, &s.candidates[i], false);
    }
    long least = 0;
    for (long i = 1; i < s.num_candidates; ++i) {
      const candidate *c = &s.candidates[i], *l = &s.candidates[least];
      if (c->memory_bound < l->memory_bound ||
          (c->memory_bound == l->memory_bound && c->id < l->id)) {
        least = i;
      }
    }
    const candidate *c = &s.candidates[least];
    char text[200];
    mp_layout_describe(&c->layout, text, sizeof text);
    double need = c->memory_bound;
    if (estimate(&s, c, out->overflow) == MP_OK) {
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
  free(rank.pool);
  free(order);
  free_search(&s);
  return status;
}

mp_status mp_plan_search(const mp_cluster *cluster, const mp_model *model,
                         const mp_planner_options *options, mp_planner_result *out,
                         mp_error *err) {
  memset(out, 0, sizeof *out);
  if (options->ep < 0) return mp_fail(err, MP_ERR_INPUT, "--ep must be at least 1");
  if (mp_cost_check_ep(model, options->ep, err) != MP_OK) return mp_error_prefix(err, "--ep");
  const mp_status status = search_layouts(cluster, model, options, false, out, err);
  /* Nothing fits cut by time: cut by memory the layouts whose time split cannot fit, and search
   * again (a search that found a layout does not pay for the memory splits: --split memory
   * compares them). */
  if (status != MP_ERR_INPUT || out->num_results > 0 || out->candidates == 0 ||
      options->split == MP_SPLIT_MEMORY) {
    return status;
  }
  mp_planner_result_free(out);
  return search_layouts(cluster, model, options, true, out, err);
}

mp_status mp_planner_layout_bounds(const mp_cluster *cluster, const mp_model *model,
                                   const mp_layout *layout, const int *layers_per_stage,
                                   mp_planner_bounds *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  const int n = mp_model_num_layers(model), stages = layout->pp * layout->virtual_stages;
  if (layout->pp < 1 || layout->virtual_stages < 1 || layout->tp < 1 || layout->dp < 1 ||
      layout->num_micro_batches < 1 || stages > n || stages > MP_COST_MAX_STAGES) {
    return mp_fail(err, MP_ERR_INPUT,
                   "bounds need dp, pp, tp, virtual stages and micro-batches of at least 1 and "
                   "pp x virtual stages (%d) at most the %d layers", stages, n);
  }
  layer_table t;
  memset(&t, 0, sizeof t);
  int *counts = malloc(sizeof(int) * (size_t)stages);
  mp_status status = MP_OK;
  if (counts == NULL || !fill_table(cluster, model, layout, &t)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory bounding a layout");
  }
  if (status == MP_OK && layers_per_stage != NULL) {
    int sum = 0;
    for (int i = 0; i < stages; ++i) {
      counts[i] = layers_per_stage[i];
      if (counts[i] < 1) {
        status = mp_fail(err, MP_ERR_INPUT, "layers_per_stage[%d] is %d; every stage needs a "
                         "layer", i, counts[i]);
        break;
      }
      sum += counts[i];
    }
    if (status == MP_OK && sum != n) {
      status = mp_fail(err, MP_ERR_INPUT, "layers_per_stage sums to %d, not the %d layers", sum,
                       n);
    }
  } else if (status == MP_OK) {
    double bottleneck;
    status = mp_partition_chain(t.cost, n, stages, counts, &bottleneck, err);
  }
  if (status == MP_OK) {
    const double tied = tied_table(model);
    split_bounds(cluster, &t, counts, layout, tied, &out->step_s, &out->memory_bytes);
    quick_bounds(cluster, &t, n, layout, tied, &out->quick_step_s, &out->quick_memory_bytes);
  }
  free(counts);
  free_table(&t);
  return status;
}

void mp_planner_result_free(mp_planner_result *result) {
  free(result->results);
  free(result->overflow);
  memset(result, 0, sizeof *result);
}
