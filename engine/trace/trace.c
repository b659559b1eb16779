/*
 * engine/trace/trace.c — the trace recorder and the merged Chrome trace it writes; see trace.h for
 * the format.
 *
 * Each rank appends fixed-size records (trace_event) to one growing array. mp_trace_write sends
 * them to rank 0 as bytes (every rank of a job runs this same binary, so the layout of the record
 * is the same everywhere): a header (trace_header: who the rank is, how many events), then the
 * records. Rank 0 rebuilds one recorder per rank and writes them with mp_trace_write_merged, then
 * broadcasts its status and message so every rank returns the same outcome. The JSON is written
 * one event a line with cJSON through common/atomic_file.h, so a trace of a long run never has to
 * sit whole in memory as a JSON tree.
 */
#include "engine/trace/trace.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/atomic_file.h"

enum { TRACE_NAME_BYTES = 24 };

typedef enum {
  TRACE_EVENT_ACTION = 0,
  TRACE_EVENT_COMM = 1,
  TRACE_EVENT_STEP = 2,
} trace_event_type;

/* One recorded event. micro_batch is the action's, or the message's for a send or receive. */
typedef struct {
  int64_t step;
  double start_s, end_s;
  uint64_t bytes;                      /* communication */
  int32_t type;                        /* trace_event_type */
  int32_t kind;                        /* action: mp_action_kind */
  int32_t micro_batch, chunk, stage;   /* action (micro_batch also of a message) */
  int32_t peer;                        /* communication: world rank, -1 for a collective */
  int32_t has_message;                 /* communication: a pipeline message follows */
  int32_t message_kind, from_stage, to_stage;
  char operation[TRACE_NAME_BYTES];    /* communication */
  char group[TRACE_NAME_BYTES];
} trace_event;

struct mp_trace {
  mp_trace_layout layout;
  int world_rank, dp_rank, pp_rank, tp_rank;
  struct timespec zero;
  trace_event *events; /* (num_events) */
  size_t num_events, capacity;
  int64_t dropped;     /* events lost to out of memory */
};

/* What a rank sends rank 0 before its events. */
typedef struct {
  mp_trace_layout layout;
  int32_t world_rank, dp_rank, pp_rank, tp_rank;
  int64_t num_events;
  int64_t dropped;
} trace_header;

/* What rank 0 tells every rank after writing. */
typedef struct {
  int32_t status;
  char message[MP_ERROR_MESSAGE_BYTES];
} trace_result;

/* ---- recording ------------------------------------------------------------------------------- */

mp_status mp_trace_create(const mp_trace_layout *layout, int world_rank, int dp_rank, int pp_rank,
                          int tp_rank, mp_trace **out, mp_error *err) {
  *out = NULL;
  if (layout->dp < 1 || layout->pp < 1 || layout->tp < 1 || layout->virtual_stages < 1 ||
      layout->num_micro_batches < 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "trace: the layout needs dp, pp, tp, virtual stages and micro-batches >= 1; "
                   "got dp %d, pp %d, tp %d, virtual stages %d, %d micro-batches",
                   layout->dp, layout->pp, layout->tp, layout->virtual_stages,
                   layout->num_micro_batches);
  }
  const int world_size = layout->dp * layout->pp * layout->tp;
  if (world_rank < 0 || world_rank >= world_size || dp_rank < 0 || dp_rank >= layout->dp ||
      pp_rank < 0 || pp_rank >= layout->pp || tp_rank < 0 || tp_rank >= layout->tp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "trace: rank %d (dp %d, pp %d, tp %d) is outside the layout dp %d x pp %d x "
                   "tp %d",
                   world_rank, dp_rank, pp_rank, tp_rank, layout->dp, layout->pp, layout->tp);
  }
  mp_trace *trace = calloc(1, sizeof *trace);
  if (trace == NULL) return mp_fail(err, MP_ERR_RUNTIME, "trace: out of memory");
  trace->layout = *layout;
  trace->layout.plan[sizeof trace->layout.plan - 1] = '\0';
  trace->layout.schedule[sizeof trace->layout.schedule - 1] = '\0';
  trace->world_rank = world_rank;
  trace->dp_rank = dp_rank;
  trace->pp_rank = pp_rank;
  trace->tp_rank = tp_rank;
  clock_gettime(CLOCK_MONOTONIC, &trace->zero);
  *out = trace;
  return MP_OK;
}

void mp_trace_free(mp_trace *trace) {
  if (trace == NULL) return;
  free(trace->events);
  free(trace);
}

mp_status mp_trace_align_clocks(mp_trace *trace, mp_comm *world, mp_error *err) {
  if (world != NULL) MP_TRY(mp_comm_barrier(world, err));
  clock_gettime(CLOCK_MONOTONIC, &trace->zero);
  return MP_OK;
}

double mp_trace_now(const mp_trace *trace) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - trace->zero.tv_sec) +
         1e-9 * (double)(now.tv_nsec - trace->zero.tv_nsec);
}

/* A zeroed record at the end of the array, or NULL (counted as dropped) when out of memory. */
static trace_event *append_event(mp_trace *trace) {
  if (trace->num_events == trace->capacity) {
    size_t capacity = trace->capacity == 0 ? 1024 : 2 * trace->capacity;
    trace_event *grown = realloc(trace->events, capacity * sizeof *grown);
    if (grown == NULL) {
      ++trace->dropped;
      return NULL;
    }
    trace->events = grown;
    trace->capacity = capacity;
  }
  trace_event *event = &trace->events[trace->num_events++];
  memset(event, 0, sizeof *event);
  event->peer = -1;
  return event;
}

void mp_trace_action(mp_trace *trace, int64_t step, mp_action_kind kind, int micro_batch,
                     int chunk, int stage, double start_s, double end_s) {
  trace_event *event = append_event(trace);
  if (event == NULL) return;
  event->type = TRACE_EVENT_ACTION;
  event->step = step;
  event->kind = (int32_t)kind;
  event->micro_batch = micro_batch;
  event->chunk = chunk;
  event->stage = stage;
  event->start_s = start_s;
  event->end_s = end_s;
}

void mp_trace_comm(mp_trace *trace, int64_t step, const char *operation, const char *group,
                   int peer, size_t bytes, const mp_message *message, double start_s,
                   double end_s) {
  trace_event *event = append_event(trace);
  if (event == NULL) return;
  event->type = TRACE_EVENT_COMM;
  event->step = step;
  snprintf(event->operation, sizeof event->operation, "%s", operation != NULL ? operation : "");
  snprintf(event->group, sizeof event->group, "%s", group != NULL ? group : "");
  event->peer = peer;
  event->bytes = (uint64_t)bytes;
  if (message != NULL) {
    event->has_message = 1;
    event->message_kind = (int32_t)message->kind;
    event->micro_batch = message->micro_batch;
    event->from_stage = message->from_stage;
    event->to_stage = message->to_stage;
  }
  event->start_s = start_s;
  event->end_s = end_s;
}

void mp_trace_step(mp_trace *trace, int64_t step, double start_s, double end_s) {
  trace_event *event = append_event(trace);
  if (event == NULL) return;
  event->type = TRACE_EVENT_STEP;
  event->step = step;
  event->start_s = start_s;
  event->end_s = end_s;
}

/* ---- the merged file ------------------------------------------------------------------------- */

/* Microseconds, rounded to the nanosecond, as Chrome's "ts" and "dur". */
static double to_us(double seconds) { return round(seconds * 1e9) / 1e3; }

static const char *message_kind_name(int32_t kind) {
  return kind == MP_MESSAGE_ACTIVATION ? "activation" : "gradient";
}

/* A send or receive of a pipeline message, for pairing: the message and who sent it to whom. */
typedef struct {
  int64_t step;
  int32_t message_kind, micro_batch, from_stage, to_stage;
  int32_t sender, receiver; /* world ranks */
  int32_t is_send;
  int32_t rank;             /* where the event is */
  size_t index;             /* its index in that rank's events */
} p2p_entry;

static int compare_int64(int64_t a, int64_t b) { return a < b ? -1 : a > b ? 1 : 0; }

static int compare_p2p(const void *pa, const void *pb) {
  const p2p_entry *a = pa, *b = pb;
  int c;
  if ((c = compare_int64(a->step, b->step)) != 0) return c;
  if ((c = compare_int64(a->sender, b->sender)) != 0) return c;
  if ((c = compare_int64(a->receiver, b->receiver)) != 0) return c;
  if ((c = compare_int64(a->message_kind, b->message_kind)) != 0) return c;
  if ((c = compare_int64(a->micro_batch, b->micro_batch)) != 0) return c;
  if ((c = compare_int64(a->from_stage, b->from_stage)) != 0) return c;
  if ((c = compare_int64(a->to_stage, b->to_stage)) != 0) return c;
  /* Sends before receives, then in recording order, so repeats pair in order. */
  if ((c = compare_int64(b->is_send, a->is_send)) != 0) return c;
  return compare_int64((int64_t)a->index, (int64_t)b->index);
}

static bool same_message(const p2p_entry *a, const p2p_entry *b) {
  return a->step == b->step && a->sender == b->sender && a->receiver == b->receiver &&
         a->message_kind == b->message_kind && a->micro_batch == b->micro_batch &&
         a->from_stage == b->from_stage && a->to_stage == b->to_stage;
}

static int compare_steps(const void *pa, const void *pb) {
  return compare_int64(*(const int64_t *)pa, *(const int64_t *)pb);
}

/* Prints item unformatted into the file, followed by separator; frees item. false when out of
 * memory. */
static bool write_json(mp_atomic_file *file, cJSON *item, const char *separator) {
  if (item == NULL) return false;
  char *text = cJSON_PrintUnformatted(item);
  cJSON_Delete(item);
  if (text == NULL) return false;
  mp_atomic_file_write(file, separator, strlen(separator));
  mp_atomic_file_write(file, text, strlen(text));
  cJSON_free(text);
  return true;
}

static cJSON *metadata_event(const char *name, int pid, int tid, const char *arg_key,
                             cJSON *arg_value) {
  cJSON *event = cJSON_CreateObject();
  cJSON_AddStringToObject(event, "name", name);
  cJSON_AddStringToObject(event, "ph", "M");
  cJSON_AddNumberToObject(event, "pid", pid);
  cJSON_AddNumberToObject(event, "tid", tid);
  cJSON *args = cJSON_AddObjectToObject(event, "args");
  if (args != NULL && arg_value != NULL) {
    cJSON_AddItemToObject(args, arg_key, arg_value);
  } else {
    cJSON_Delete(arg_value);
  }
  return event;
}

static cJSON *slice_event(const char *name, const char *category, int pid, int tid,
                          const trace_event *event) {
  cJSON *item = cJSON_CreateObject();
  cJSON_AddStringToObject(item, "name", name);
  cJSON_AddStringToObject(item, "cat", category);
  cJSON_AddStringToObject(item, "ph", "X");
  cJSON_AddNumberToObject(item, "pid", pid);
  cJSON_AddNumberToObject(item, "tid", tid);
  const double start = to_us(event->start_s);
  const double end = to_us(event->end_s);
  cJSON_AddNumberToObject(item, "ts", start);
  cJSON_AddNumberToObject(item, "dur", end > start ? round((end - start) * 1e3) / 1e3 : 0.0);
  return item;
}

static cJSON *event_json(const mp_trace *trace, const trace_event *event) {
  const mp_trace_layout *layout = &trace->layout;
  char name[96];
  cJSON *item = NULL, *args = NULL;
  switch ((trace_event_type)event->type) {
    case TRACE_EVENT_ACTION: {
      const mp_action_kind kind = (mp_action_kind)event->kind;
      if (layout->virtual_stages > 1) {
        snprintf(name, sizeof name, "%c%d%c", mp_action_kind_letter(kind), event->micro_batch,
                 event->chunk >= 0 && event->chunk < 26 ? 'a' + event->chunk : '+');
      } else {
        snprintf(name, sizeof name, "%c%d", mp_action_kind_letter(kind), event->micro_batch);
      }
      item = slice_event(name, "compute", trace->world_rank, 0, event);
      args = cJSON_AddObjectToObject(item, "args");
      cJSON_AddNumberToObject(args, "step", (double)event->step);
      cJSON_AddStringToObject(args, "kind", mp_action_kind_name(kind));
      cJSON_AddNumberToObject(args, "micro_batch", event->micro_batch);
      cJSON_AddNumberToObject(args, "chunk", event->chunk);
      cJSON_AddNumberToObject(args, "stage", event->stage);
      break;
    }
    case TRACE_EVENT_COMM:
      if (event->has_message) {
        snprintf(name, sizeof name, "%s %s %d", event->operation,
                 message_kind_name(event->message_kind), event->micro_batch);
      } else {
        snprintf(name, sizeof name, "%s %s", event->operation, event->group);
      }
      item = slice_event(name, "communication", trace->world_rank, 1, event);
      args = cJSON_AddObjectToObject(item, "args");
      cJSON_AddNumberToObject(args, "step", (double)event->step);
      cJSON_AddStringToObject(args, "operation", event->operation);
      cJSON_AddStringToObject(args, "group", event->group);
      cJSON_AddNumberToObject(args, "peer", event->peer);
      cJSON_AddNumberToObject(args, "bytes", (double)event->bytes);
      if (event->has_message) {
        cJSON_AddStringToObject(args, "message", message_kind_name(event->message_kind));
        cJSON_AddNumberToObject(args, "micro_batch", event->micro_batch);
        cJSON_AddNumberToObject(args, "from_stage", event->from_stage);
        cJSON_AddNumberToObject(args, "to_stage", event->to_stage);
      }
      break;
    case TRACE_EVENT_STEP:
      snprintf(name, sizeof name, "step %lld", (long long)event->step);
      item = slice_event(name, "step", trace->world_rank, 0, event);
      args = cJSON_AddObjectToObject(item, "args");
      cJSON_AddNumberToObject(args, "step", (double)event->step);
      break;
  }
  return item;
}

static cJSON *flow_event(const char *phase, long id, const trace_event *event, int pid,
                         const char *name) {
  cJSON *item = cJSON_CreateObject();
  cJSON_AddStringToObject(item, "name", name);
  cJSON_AddStringToObject(item, "cat", "p2p");
  cJSON_AddStringToObject(item, "ph", phase);
  if (phase[0] == 'f') cJSON_AddStringToObject(item, "bp", "e");
  cJSON_AddNumberToObject(item, "id", (double)id);
  cJSON_AddNumberToObject(item, "pid", pid);
  cJSON_AddNumberToObject(item, "tid", 1);
  /* Inside the slice, so each binds to it: the send at its start, the receive at its end (when
   * the message had arrived), nanoseconds in. */
  const double start = to_us(event->start_s), end = to_us(event->end_s);
  double ts = round(0.5 * (start + end) * 1e3) / 1e3;
  if (end - start >= 0.002) ts = phase[0] == 's' ? start + 0.001 : end - 0.001;
  cJSON_AddNumberToObject(item, "ts", ts);
  return item;
}

static bool same_layout(const mp_trace_layout *a, const mp_trace_layout *b) {
  return a->dp == b->dp && a->pp == b->pp && a->tp == b->tp &&
         a->virtual_stages == b->virtual_stages && a->num_micro_batches == b->num_micro_batches &&
         strcmp(a->schedule, b->schedule) == 0 && strcmp(a->plan, b->plan) == 0;
}

/* The "mpengine" object. ranks is indexed by world rank. */
static cJSON *layout_json(const mp_trace *const *ranks, int world_size, int64_t num_steps,
                          int64_t first_step, int64_t last_step, int64_t dropped) {
  const mp_trace_layout *layout = &ranks[0]->layout;
  cJSON *object = cJSON_CreateObject();
  cJSON_AddStringToObject(object, "format", MP_TRACE_FORMAT);
  cJSON_AddNumberToObject(object, "version", MP_TRACE_VERSION);
  cJSON_AddStringToObject(object, "plan", layout->plan);
  cJSON_AddStringToObject(object, "schedule", layout->schedule);
  cJSON_AddNumberToObject(object, "dp", layout->dp);
  cJSON_AddNumberToObject(object, "pp", layout->pp);
  cJSON_AddNumberToObject(object, "tp", layout->tp);
  cJSON_AddNumberToObject(object, "virtual_stages", layout->virtual_stages);
  cJSON_AddNumberToObject(object, "num_micro_batches", layout->num_micro_batches);
  cJSON_AddNumberToObject(object, "world_size", world_size);
  cJSON_AddNumberToObject(object, "steps", (double)num_steps);
  cJSON_AddNumberToObject(object, "first_step", (double)first_step);
  cJSON_AddNumberToObject(object, "last_step", (double)last_step);
  cJSON_AddBoolToObject(object, "complete", dropped == 0);
  cJSON_AddNumberToObject(object, "dropped_events", (double)dropped);
  cJSON *list = cJSON_AddArrayToObject(object, "ranks");
  for (int r = 0; r < world_size && list != NULL; ++r) {
    cJSON *rank = cJSON_CreateObject();
    cJSON_AddNumberToObject(rank, "rank", ranks[r]->world_rank);
    cJSON_AddNumberToObject(rank, "dp", ranks[r]->dp_rank);
    cJSON_AddNumberToObject(rank, "pp", ranks[r]->pp_rank);
    cJSON_AddNumberToObject(rank, "tp", ranks[r]->tp_rank);
    cJSON_AddNumberToObject(rank, "events", (double)ranks[r]->num_events);
    cJSON_AddItemToArray(list, rank);
  }
  return object;
}

/* The distinct steps of every rank's events: their number, the first and the last (-1, -1 when
 * none). false when out of memory. */
static bool count_steps(const mp_trace *const *ranks, int world_size, int64_t *num_steps,
                        int64_t *first_step, int64_t *last_step) {
  size_t total = 0;
  for (int r = 0; r < world_size; ++r) total += ranks[r]->num_events;
  *num_steps = 0;
  *first_step = *last_step = -1;
  if (total == 0) return true;
  int64_t *steps = malloc(total * sizeof *steps);
  if (steps == NULL) return false;
  size_t n = 0;
  for (int r = 0; r < world_size; ++r) {
    for (size_t e = 0; e < ranks[r]->num_events; ++e) steps[n++] = ranks[r]->events[e].step;
  }
  qsort(steps, n, sizeof *steps, compare_steps);
  for (size_t i = 0; i < n; ++i) {
    if (i == 0 || steps[i] != steps[i - 1]) ++*num_steps;
  }
  *first_step = steps[0];
  *last_step = steps[n - 1];
  free(steps);
  return true;
}

/* Every send and receive that carries a pipeline message, sorted so that a send is followed by
 * the receive of the same message. *out is NULL when there are none. false when out of memory. */
static bool collect_p2p(const mp_trace *const *ranks, int world_size, p2p_entry **out,
                        size_t *count) {
  *out = NULL;
  *count = 0;
  size_t total = 0;
  for (int r = 0; r < world_size; ++r) {
    for (size_t e = 0; e < ranks[r]->num_events; ++e) {
      total += ranks[r]->events[e].type == TRACE_EVENT_COMM && ranks[r]->events[e].has_message;
    }
  }
  if (total == 0) return true;
  p2p_entry *entries = malloc(total * sizeof *entries);
  if (entries == NULL) return false;
  size_t n = 0;
  for (int r = 0; r < world_size; ++r) {
    for (size_t e = 0; e < ranks[r]->num_events; ++e) {
      const trace_event *event = &ranks[r]->events[e];
      if (event->type != TRACE_EVENT_COMM || !event->has_message) continue;
      const bool is_send = strcmp(event->operation, "send") == 0;
      if (!is_send && strcmp(event->operation, "recv") != 0) continue;
      p2p_entry *entry = &entries[n++];
      entry->step = event->step;
      entry->message_kind = event->message_kind;
      entry->micro_batch = event->micro_batch;
      entry->from_stage = event->from_stage;
      entry->to_stage = event->to_stage;
      entry->sender = is_send ? r : event->peer;
      entry->receiver = is_send ? event->peer : r;
      entry->is_send = is_send;
      entry->rank = r;
      entry->index = e;
    }
  }
  qsort(entries, n, sizeof *entries, compare_p2p);
  *out = entries;
  *count = n;
  return true;
}

mp_status mp_trace_write_merged(const mp_trace *const *traces, int num_traces, const char *path,
                                mp_error *err) {
  if (num_traces < 1 || traces == NULL || traces[0] == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: no ranks to write a trace of", path);
  }
  const mp_trace_layout *layout = &traces[0]->layout;
  const int world_size = layout->dp * layout->pp * layout->tp;
  if (num_traces != world_size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: %d ranks to merge, but the layout dp %d x pp %d x tp %d has %d", path,
                   num_traces, layout->dp, layout->pp, layout->tp, world_size);
  }
  const mp_trace **ranks = calloc((size_t)world_size, sizeof *ranks);
  if (ranks == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  mp_status status = MP_OK;
  for (int i = 0; i < num_traces && status == MP_OK; ++i) {
    const mp_trace *trace = traces[i];
    if (trace == NULL || !same_layout(&trace->layout, layout)) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: rank %d's recorder has another layout than rank %d's; every rank "
                       "must record the same run",
                       path, trace != NULL ? trace->world_rank : -1, traces[0]->world_rank);
    } else if (trace->world_rank < 0 || trace->world_rank >= world_size) {
      status = mp_fail(err, MP_ERR_INPUT, "%s: rank %d is outside the %d ranks of the layout",
                       path, trace->world_rank, world_size);
    } else if (ranks[trace->world_rank] != NULL) {
      status = mp_fail(err, MP_ERR_INPUT, "%s: rank %d is given twice", path, trace->world_rank);
    } else {
      ranks[trace->world_rank] = trace;
    }
  }
  if (status != MP_OK) {
    free(ranks);
    return status;
  }

  int64_t num_steps = 0, first_step = -1, last_step = -1, dropped = 0;
  for (int r = 0; r < world_size; ++r) dropped += ranks[r]->dropped;
  p2p_entry *p2p = NULL;
  size_t num_p2p = 0;
  if (!count_steps(ranks, world_size, &num_steps, &first_step, &last_step) ||
      !collect_p2p(ranks, world_size, &p2p, &num_p2p)) {
    free(ranks);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory merging the trace", path);
  }

  mp_atomic_file file;
  status = mp_atomic_file_open(&file, path, err);
  if (status != MP_OK) {
    free(p2p);
    free(ranks);
    return status;
  }
  bool ok = true;
  static const char kHead[] = "{\"displayTimeUnit\": \"ms\",\n\"mpengine\": ";
  mp_atomic_file_write(&file, kHead, strlen(kHead));
  ok = write_json(&file, layout_json(ranks, world_size, num_steps, first_step, last_step, dropped),
                  "");
  static const char kEvents[] = ",\n\"traceEvents\": [\n";
  mp_atomic_file_write(&file, kEvents, strlen(kEvents));
  const char *separator = "";
  for (int r = 0; r < world_size && ok; ++r) {
    const mp_trace *trace = ranks[r];
    char name[96];
    snprintf(name, sizeof name, "rank %d (dp %d, pp %d, tp %d)", r, trace->dp_rank,
             trace->pp_rank, trace->tp_rank);
    ok = write_json(&file, metadata_event("process_name", r, 0, "name", cJSON_CreateString(name)),
                    separator) &&
         write_json(&file,
                    metadata_event("process_sort_index", r, 0, "sort_index",
                                   cJSON_CreateNumber(r)),
                    ",\n") &&
         write_json(&file,
                    metadata_event("thread_name", r, 0, "name", cJSON_CreateString("compute")),
                    ",\n") &&
         write_json(&file,
                    metadata_event("thread_name", r, 1, "name",
                                   cJSON_CreateString("communication")),
                    ",\n");
    separator = ",\n";
  }
  for (int r = 0; r < world_size && ok; ++r) {
    for (size_t e = 0; e < ranks[r]->num_events && ok; ++e) {
      ok = write_json(&file, event_json(ranks[r], &ranks[r]->events[e]), separator);
    }
  }
  long flow_id = 0;
  for (size_t i = 0; i + 1 < num_p2p && ok; ++i) {
    const p2p_entry *send = &p2p[i], *recv = &p2p[i + 1];
    if (!send->is_send || recv->is_send || !same_message(send, recv)) continue;
    char name[64];
    snprintf(name, sizeof name, "%s %d", message_kind_name(send->message_kind),
             send->micro_batch);
    ok = write_json(&file,
                    flow_event("s", flow_id, &ranks[send->rank]->events[send->index], send->rank,
                               name),
                    separator) &&
         write_json(&file,
                    flow_event("f", flow_id, &ranks[recv->rank]->events[recv->index], recv->rank,
                               name),
                    separator);
    ++flow_id;
    ++i;
  }
  static const char kTail[] = "\n]}\n";
  mp_atomic_file_write(&file, kTail, strlen(kTail));
  free(p2p);
  free(ranks);
  if (!ok) {
    mp_atomic_file_abort(&file);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory writing the trace", path);
  }
  return mp_atomic_file_commit(&file, err);
}

/* ---- gathering on rank 0 --------------------------------------------------------------------- */

static trace_header header_of(const mp_trace *trace) {
  trace_header header;
  memset(&header, 0, sizeof header);
  header.layout = trace->layout;
  header.world_rank = trace->world_rank;
  header.dp_rank = trace->dp_rank;
  header.pp_rank = trace->pp_rank;
  header.tp_rank = trace->tp_rank;
  header.num_events = (int64_t)trace->num_events;
  header.dropped = trace->dropped;
  return header;
}

/* Rank 0: receives group rank `from`'s header and events into a new recorder *out. */
static mp_status receive_rank(mp_comm *world, int from, mp_trace **out, mp_error *err) {
  *out = NULL;
  trace_header header;
  MP_TRY(mp_comm_recv(world, &header, sizeof header, from, err));
  mp_trace *trace = calloc(1, sizeof *trace);
  if (trace == NULL) return mp_fail(err, MP_ERR_RUNTIME, "trace: out of memory");
  trace->layout = header.layout;
  trace->layout.plan[sizeof trace->layout.plan - 1] = '\0';
  trace->layout.schedule[sizeof trace->layout.schedule - 1] = '\0';
  trace->world_rank = header.world_rank;
  trace->dp_rank = header.dp_rank;
  trace->pp_rank = header.pp_rank;
  trace->tp_rank = header.tp_rank;
  trace->dropped = header.dropped;
  *out = trace;
  if (header.num_events <= 0) return MP_OK;
  trace->events = malloc((size_t)header.num_events * sizeof *trace->events);
  if (trace->events == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "trace: out of memory receiving %lld events of rank %d",
                   (long long)header.num_events, header.world_rank);
  }
  trace->num_events = trace->capacity = (size_t)header.num_events;
  return mp_comm_recv(world, trace->events, trace->num_events * sizeof *trace->events, from, err);
}

mp_status mp_trace_write(mp_trace *trace, mp_comm *world, const char *path, mp_error *err) {
  if (world == NULL || mp_comm_size(world) == 1) {
    const mp_trace *alone[1] = {trace};
    return mp_trace_write_merged(alone, 1, path, err);
  }
  const int size = mp_comm_size(world);
  mp_error local = MP_ERROR_INITIALIZER;
  mp_status status = MP_OK;
  if (mp_comm_rank(world) != 0) {
    trace_header header = header_of(trace);
    status = mp_comm_send(world, &header, sizeof header, 0, &local);
    if (status == MP_OK && trace->num_events > 0) {
      status = mp_comm_send(world, trace->events, trace->num_events * sizeof *trace->events, 0,
                            &local);
    }
  } else {
    mp_trace **received = calloc((size_t)size, sizeof *received);
    if (received == NULL) {
      status = mp_fail(&local, MP_ERR_RUNTIME, "trace: out of memory");
    } else {
      received[0] = trace;
      for (int r = 1; r < size && status == MP_OK; ++r) {
        status = receive_rank(world, r, &received[r], &local);
      }
      if (status == MP_OK) {
        status = mp_trace_write_merged((const mp_trace *const *)received, size, path, &local);
      }
      for (int r = 1; r < size; ++r) mp_trace_free(received[r]);
      free(received);
    }
  }
  /* Every rank learns rank 0's outcome (a rank whose own send failed keeps its error). */
  trace_result result;
  memset(&result, 0, sizeof result);
  if (mp_comm_rank(world) == 0) {
    result.status = (int32_t)status;
    snprintf(result.message, sizeof result.message, "%s", status == MP_OK ? "" : local.message);
  }
  mp_error broadcast_err = MP_ERROR_INITIALIZER;
  mp_status broadcast = mp_comm_broadcast(world, &result, sizeof result, 0, &broadcast_err);
  if (status != MP_OK) {
    if (err != NULL) *err = local;
    return status;
  }
  if (broadcast != MP_OK) {
    if (err != NULL) *err = broadcast_err;
    return broadcast;
  }
  if (result.status != MP_OK) {
    return mp_fail(err, (mp_status)result.status, "%s", result.message);
  }
  return MP_OK;
}
