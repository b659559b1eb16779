/*
 * engine/trace/trace_reader.c — reading a trace back into schedules' drawing types; see
 * trace_reader.h.
 *
 * The whole file is parsed with cJSON (through common/json_reader.h, for messages with line and
 * column), validated into a flat array of slices (compute, communication, step), and the tree is
 * freed. Everything after that works on the array.
 */
#include "engine/trace/trace_reader.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json_reader.h"
#include "schedules/checker.h"

/* Times further than this from the zero are refused: they would overflow the drawing. */
static const double kMaxMicroseconds = 1e15;

typedef enum {
  SLICE_COMPUTE = 0,
  SLICE_COMMUNICATION = 1,
  SLICE_STEP = 2,
} slice_category;

typedef struct {
  int64_t step;
  double start_s, end_s;
  size_t order;    /* position in the file, to keep recording order among equal starts */
  int rank;        /* world rank ("pid") */
  int category;    /* slice_category */
  int kind;        /* compute: mp_action_kind */
  int micro_batch, chunk, stage;
} trace_slice;

typedef struct {
  int dp, pp, tp;
} rank_coord;

struct mp_trace_file {
  char path[1024];
  mp_trace_summary summary;
  rank_coord *ranks;      /* (world_size) */
  trace_slice *slices;    /* (num_slices) */
  size_t num_slices;
  int64_t *steps;         /* (summary.num_steps) distinct steps with actions, ascending */
};

/* ---- reading --------------------------------------------------------------------------------- */

/* The whole file as a NUL-terminated string. */
static mp_status read_text(const char *path, char **out, mp_error *err) {
  *out = NULL;
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  size_t capacity = 1 << 16, length = 0;
  char *text = malloc(capacity);
  while (text != NULL) {
    if (capacity - length < 2) {
      char *grown = realloc(text, 2 * capacity);
      if (grown == NULL) {
        free(text);
        text = NULL;
        break;
      }
      text = grown;
      capacity *= 2;
    }
    size_t got = fread(text + length, 1, capacity - length - 1, file);
    length += got;
    if (got == 0) break;
  }
  const bool failed = ferror(file) != 0;
  fclose(file);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory reading it", path);
  if (failed) {
    free(text);
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot read (not a regular file?)", path);
  }
  text[length] = '\0';
  if (strlen(text) != length) {
    free(text);
    return mp_fail(err, MP_ERR_INPUT, "%s: not a trace: it holds a NUL byte (a binary file?)",
                   path);
  }
  *out = text;
  return MP_OK;
}

/* An int within [low, high] under key; the message names the range. */
static mp_status require_int_in(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, int64_t low, int64_t high,
                                int64_t *out) {
  MP_TRY(mp_json_require_int(reader, object, path, key, MP_JSON_ANY, out));
  if (*out < low || *out > high) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: %lld is outside %lld .. %lld",
                   reader->source, path, key, (long long)*out, (long long)low, (long long)high);
  }
  return MP_OK;
}

/* A string under key, which may be empty. */
static mp_status require_any_string(const mp_json_reader *reader, const cJSON *object,
                                    const char *path, const char *key, const char **out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: missing required key \"%s\" (a string)",
                   reader->source, path, key);
  }
  if (!cJSON_IsString(item) || item->valuestring == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be a string", reader->source,
                   path, key);
  }
  *out = item->valuestring;
  return MP_OK;
}

static mp_status read_layout(const mp_json_reader *reader, const cJSON *root,
                             mp_trace_file *file) {
  const cJSON *object = cJSON_GetObjectItemCaseSensitive(root, "mpengine");
  if (object == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $: not an mpengine trace: no \"mpengine\" object (record one with "
                   "`mpengine run --config PLAN.json --trace TRACE.json`; the chrome timeline of "
                   "`mpengine schedule` is a drawing, not a measurement)",
                   reader->source);
  }
  const char *path = "$.mpengine";
  MP_TRY(mp_json_expect_object(reader, object, path, "the run's layout"));
  static const char *const kKeys[] = {
      "format",     "version", "plan",       "schedule",  "dp",       "pp",
      "tp",         "virtual_stages",        "num_micro_batches",    "world_size",
      "steps",      "first_step",            "last_step", "complete", "dropped_events",
      "ranks",      NULL};
  MP_TRY(mp_json_check_keys(reader, object, path, kKeys));
  const char *format = NULL;
  MP_TRY(mp_json_require_string(reader, object, path, "format", &format));
  if (strcmp(format, MP_TRACE_FORMAT) != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mpengine.format: expected \"%s\", got \"%.64s\"; not an mpengine trace",
                   reader->source, MP_TRACE_FORMAT, format);
  }
  int64_t version = 0;
  MP_TRY(mp_json_require_int(reader, object, path, "version", MP_JSON_POSITIVE, &version));
  if (version != MP_TRACE_VERSION) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mpengine.version: version %lld is not known; this mpengine reads "
                   "version %d",
                   reader->source, (long long)version, MP_TRACE_VERSION);
  }
  mp_trace_layout *layout = &file->summary.layout;
  const char *plan = NULL, *schedule = NULL;
  MP_TRY(require_any_string(reader, object, path, "plan", &plan));
  MP_TRY(mp_json_require_string(reader, object, path, "schedule", &schedule));
  if (strlen(plan) >= sizeof layout->plan) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: $.mpengine.plan: longer than %zu characters",
                   reader->source, sizeof layout->plan - 1);
  }
  if (strlen(schedule) >= sizeof layout->schedule) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: $.mpengine.schedule: \"%.40s...\" is not a "
                   "schedule kind", reader->source, schedule);
  }
  snprintf(layout->plan, sizeof layout->plan, "%s", plan);
  snprintf(layout->schedule, sizeof layout->schedule, "%s", schedule);
  int64_t dp, pp, tp, v, m, world_size, dropped;
  MP_TRY(require_int_in(reader, object, path, "dp", 1, 1 << 20, &dp));
  MP_TRY(require_int_in(reader, object, path, "pp", 1, MP_SCHEDULE_MAX_PP, &pp));
  MP_TRY(require_int_in(reader, object, path, "tp", 1, 1 << 20, &tp));
  MP_TRY(require_int_in(reader, object, path, "virtual_stages", 1, MP_SCHEDULE_MAX_VIRTUAL_STAGES,
                        &v));
  MP_TRY(require_int_in(reader, object, path, "num_micro_batches", 1,
                        MP_SCHEDULE_MAX_MICRO_BATCHES, &m));
  MP_TRY(require_int_in(reader, object, path, "world_size", 1, 1 << 20, &world_size));
  if (dp * pp * tp != world_size) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mpengine.world_size: %lld, but dp x pp x tp = %lld x %lld x %lld = %lld",
                   reader->source, (long long)world_size, (long long)dp, (long long)pp,
                   (long long)tp, (long long)(dp * pp * tp));
  }
  int64_t ignored;
  MP_TRY(mp_json_require_int(reader, object, path, "steps", MP_JSON_NONNEGATIVE, &ignored));
  MP_TRY(mp_json_require_int(reader, object, path, "first_step", MP_JSON_ANY, &ignored));
  MP_TRY(mp_json_require_int(reader, object, path, "last_step", MP_JSON_ANY, &ignored));
  MP_TRY(mp_json_require_int(reader, object, path, "dropped_events", MP_JSON_NONNEGATIVE,
                             &dropped));
  if (cJSON_GetObjectItemCaseSensitive(object, "complete") == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mpengine: missing required key \"complete\" (true or false)",
                   reader->source);
  }
  MP_TRY(mp_json_optional_bool(reader, object, path, "complete", true, &file->summary.complete));
  layout->dp = (int)dp;
  layout->pp = (int)pp;
  layout->tp = (int)tp;
  layout->virtual_stages = (int)v;
  layout->num_micro_batches = (int)m;
  file->summary.world_size = (int)world_size;
  file->summary.dropped_events = dropped;

  const cJSON *ranks = NULL;
  MP_TRY(mp_json_require_array(reader, object, path, "ranks", 1, &ranks));
  if (cJSON_GetArraySize(ranks) != world_size) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mpengine.ranks: %d entries, but world_size is %lld (one per rank)",
                   reader->source, cJSON_GetArraySize(ranks), (long long)world_size);
  }
  file->ranks = calloc((size_t)world_size, sizeof *file->ranks);
  if (file->ranks == NULL) return mp_fail(reader->err, MP_ERR_RUNTIME, "%s: out of memory",
                                          reader->source);
  static const char *const kRankKeys[] = {"rank", "dp", "pp", "tp", "events", NULL};
  int index = 0;
  for (const cJSON *rank = ranks->child; rank != NULL; rank = rank->next, ++index) {
    char rank_path[MP_JSON_PATH_BYTES];
    mp_json_path_index(rank_path, sizeof rank_path, "$.mpengine.ranks", index);
    MP_TRY(mp_json_expect_object(reader, rank, rank_path, "a rank"));
    MP_TRY(mp_json_check_keys(reader, rank, rank_path, kRankKeys));
    int64_t number, rd, rp, rt, events;
    MP_TRY(require_int_in(reader, rank, rank_path, "rank", index, index, &number));
    MP_TRY(require_int_in(reader, rank, rank_path, "dp", 0, dp - 1, &rd));
    MP_TRY(require_int_in(reader, rank, rank_path, "pp", 0, pp - 1, &rp));
    MP_TRY(require_int_in(reader, rank, rank_path, "tp", 0, tp - 1, &rt));
    MP_TRY(mp_json_require_int(reader, rank, rank_path, "events", MP_JSON_NONNEGATIVE, &events));
    for (int earlier = 0; earlier < index; ++earlier) {
      if (file->ranks[earlier].dp == rd && file->ranks[earlier].pp == rp &&
          file->ranks[earlier].tp == rt) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s: rank %d has the grid position (dp %lld, pp %lld, tp %lld) of rank "
                       "%d",
                       reader->source, rank_path, index, (long long)rd, (long long)rp,
                       (long long)rt, earlier);
      }
    }
    file->ranks[index] = (rank_coord){(int)rd, (int)rp, (int)rt};
  }
  return MP_OK;
}

/* The kind named by mp_action_kind_name, or -1. */
static int parse_action_kind(const char *name) {
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    if (strcmp(name, mp_action_kind_name((mp_action_kind)k)) == 0) return k;
  }
  return -1;
}

/* One "X" event of category `category` into *slice. */
static mp_status read_slice(const mp_json_reader *reader, const mp_trace_file *file,
                            const cJSON *event, const char *path, int category,
                            trace_slice *slice) {
  const mp_trace_layout *layout = &file->summary.layout;
  int64_t pid;
  double ts, dur;
  MP_TRY(require_int_in(reader, event, path, "pid", 0, file->summary.world_size - 1, &pid));
  MP_TRY(mp_json_require_number(reader, event, path, "ts", MP_JSON_ANY, &ts));
  MP_TRY(mp_json_require_number(reader, event, path, "dur", MP_JSON_NONNEGATIVE, &dur));
  if (fabs(ts) > kMaxMicroseconds || dur > kMaxMicroseconds) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: \"ts\" %.17g and \"dur\" %.17g must be within %.0e microseconds "
                   "(about 30 years) of the trace's zero",
                   reader->source, path, ts, dur, kMaxMicroseconds);
  }
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(event, "args");
  char args_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(args_path, sizeof args_path, path, "args");
  if (args == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: missing required key \"args\" (an object)",
                   reader->source, path);
  }
  MP_TRY(mp_json_expect_object(reader, args, args_path, "the slice's arguments"));
  int64_t step;
  MP_TRY(mp_json_require_int(reader, args, args_path, "step", MP_JSON_ANY, &step));
  memset(slice, 0, sizeof *slice);
  slice->step = step;
  slice->start_s = ts * 1e-6;
  slice->end_s = (ts + dur) * 1e-6;
  slice->rank = (int)pid;
  slice->category = category;
  if (category != SLICE_COMPUTE) return MP_OK;

  const char *kind_name = NULL;
  MP_TRY(mp_json_require_string(reader, args, args_path, "kind", &kind_name));
  slice->kind = parse_action_kind(kind_name);
  if (slice->kind < 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.kind: unknown action kind \"%.40s\" (kinds: forward, backward, "
                   "input-gradient backward, weight-gradient backward)",
                   reader->source, args_path, kind_name);
  }
  int64_t micro_batch, chunk, stage;
  MP_TRY(require_int_in(reader, args, args_path, "micro_batch", 0,
                        layout->num_micro_batches - 1, &micro_batch));
  MP_TRY(require_int_in(reader, args, args_path, "chunk", 0, layout->virtual_stages - 1, &chunk));
  MP_TRY(require_int_in(reader, args, args_path, "stage", 0,
                        (int64_t)layout->pp * layout->virtual_stages - 1, &stage));
  const int pp_rank = file->ranks[pid].pp;
  const int expected = mp_stage_index(layout->pp, pp_rank, (int)chunk);
  if (stage != expected) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.stage: %lld, but chunk %lld of pipeline rank %d (world rank %lld) is "
                   "stage %d",
                   reader->source, args_path, (long long)stage, (long long)chunk, pp_rank,
                   (long long)pid, expected);
  }
  slice->micro_batch = (int)micro_batch;
  slice->chunk = (int)chunk;
  slice->stage = (int)stage;
  return MP_OK;
}

static mp_status read_events(const mp_json_reader *reader, const cJSON *root,
                             mp_trace_file *file) {
  const cJSON *events = NULL;
  MP_TRY(mp_json_require_array(reader, root, "$", "traceEvents", 0, &events));
  const int count = cJSON_GetArraySize(events);
  file->slices = malloc((size_t)(count > 0 ? count : 1) * sizeof *file->slices);
  if (file->slices == NULL) {
    return mp_fail(reader->err, MP_ERR_RUNTIME, "%s: out of memory reading %d events",
                   reader->source, count);
  }
  int index = 0;
  for (const cJSON *event = events->child; event != NULL; event = event->next, ++index) {
    char path[MP_JSON_PATH_BYTES];
    mp_json_path_index(path, sizeof path, "$.traceEvents", index);
    MP_TRY(mp_json_expect_object(reader, event, path, "a trace event"));
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(event, "ph");
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(event, "cat");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0 || !cJSON_IsString(cat)) {
      continue; /* metadata, flows, and slices of other tools */
    }
    int category;
    if (strcmp(cat->valuestring, "compute") == 0) {
      category = SLICE_COMPUTE;
    } else if (strcmp(cat->valuestring, "communication") == 0) {
      category = SLICE_COMMUNICATION;
    } else if (strcmp(cat->valuestring, "step") == 0) {
      category = SLICE_STEP;
    } else {
      continue;
    }
    trace_slice *slice = &file->slices[file->num_slices];
    MP_TRY(read_slice(reader, file, event, path, category, slice));
    slice->order = file->num_slices++;
  }
  return MP_OK;
}

static int compare_int64(const void *pa, const void *pb) {
  int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
  return a < b ? -1 : a > b ? 1 : 0;
}

/* The distinct steps of the compute slices. */
static mp_status collect_steps(mp_trace_file *file, mp_error *err) {
  mp_trace_summary *summary = &file->summary;
  summary->first_step = summary->last_step = -1;
  file->steps = malloc((file->num_slices > 0 ? file->num_slices : 1) * sizeof *file->steps);
  if (file->steps == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", file->path);
  size_t n = 0;
  for (size_t i = 0; i < file->num_slices; ++i) {
    if (file->slices[i].category == SLICE_COMPUTE) file->steps[n++] = file->slices[i].step;
  }
  qsort(file->steps, n, sizeof *file->steps, compare_int64);
  size_t distinct = 0;
  for (size_t i = 0; i < n; ++i) {
    if (distinct == 0 || file->steps[i] != file->steps[distinct - 1]) {
      file->steps[distinct++] = file->steps[i];
    }
  }
  summary->num_steps = (int)distinct;
  if (distinct > 0) {
    summary->first_step = file->steps[0];
    summary->last_step = file->steps[distinct - 1];
  }
  return MP_OK;
}

mp_status mp_trace_read(const char *path, mp_trace_file **out, mp_error *err) {
  *out = NULL;
  mp_trace_file *file = calloc(1, sizeof *file);
  if (file == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  snprintf(file->path, sizeof file->path, "%s", path);
  char *text = NULL;
  cJSON *root = NULL;
  mp_status status = read_text(path, &text, err);
  if (status == MP_OK) {
    status = mp_json_parse_text(text, path, &root, err);
    free(text);
  }
  mp_json_reader reader = {path, err};
  if (status == MP_OK) status = mp_json_expect_object(&reader, root, "$", "an mpengine trace");
  if (status == MP_OK) status = read_layout(&reader, root, file);
  if (status == MP_OK) status = read_events(&reader, root, file);
  cJSON_Delete(root);
  if (status == MP_OK) status = collect_steps(file, err);
  if (status != MP_OK) {
    mp_trace_file_free(file);
    return status;
  }
  *out = file;
  return MP_OK;
}

void mp_trace_file_free(mp_trace_file *file) {
  if (file == NULL) return;
  free(file->ranks);
  free(file->slices);
  free(file->steps);
  free(file);
}

const mp_trace_summary *mp_trace_file_summary(const mp_trace_file *file) {
  return &file->summary;
}

bool mp_trace_file_has_step(const mp_trace_file *file, int64_t step) {
  return file->summary.num_steps > 0 &&
         bsearch(&step, file->steps, (size_t)file->summary.num_steps, sizeof *file->steps,
                 compare_int64) != NULL;
}

static mp_status check_step(const mp_trace_file *file, int64_t step, mp_error *err) {
  if (mp_trace_file_has_step(file, step)) return MP_OK;
  const mp_trace_summary *summary = &file->summary;
  if (summary->num_steps == 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: the trace recorded no actions (no step to show)",
                   file->path);
  }
  if (summary->num_steps == summary->last_step - summary->first_step + 1) {
    return mp_fail(err, MP_ERR_INPUT, "%s: step %lld is not in the trace (it recorded steps %lld "
                   "to %lld)",
                   file->path, (long long)step, (long long)summary->first_step,
                   (long long)summary->last_step);
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: step %lld is not in the trace (it recorded %d steps between %lld and %lld)",
                 file->path, (long long)step, summary->num_steps, (long long)summary->first_step,
                 (long long)summary->last_step);
}

/* ---- one step -------------------------------------------------------------------------------- */

/* Sorts compute slices by rank, then start, then file order. */
static int compare_slices(const void *pa, const void *pb) {
  const trace_slice *a = *(const trace_slice *const *)pa, *b = *(const trace_slice *const *)pb;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  if (a->start_s != b->start_s) return a->start_s < b->start_s ? -1 : 1;
  return a->order < b->order ? -1 : a->order > b->order ? 1 : 0;
}

/* The world rank drawn as pipeline rank p (dp 0, tp 0), or -1. */
static int drawn_rank(const mp_trace_file *file, int p) {
  for (int r = 0; r < file->summary.world_size; ++r) {
    if (file->ranks[r].dp == 0 && file->ranks[r].tp == 0 && file->ranks[r].pp == p) return r;
  }
  return -1;
}

static bool alloc_rows(int pp, const mp_schedule *schedule, double ***rows) {
  *rows = calloc((size_t)pp, sizeof **rows);
  if (*rows == NULL) return false;
  for (int r = 0; r < pp; ++r) {
    const int n = schedule->ranks[r].num_actions;
    (*rows)[r] = calloc((size_t)(n > 0 ? n : 1), sizeof ***rows);
    if ((*rows)[r] == NULL) return false;
  }
  return true;
}

mp_status mp_trace_step_timeline(const mp_trace_file *file, int64_t step, mp_schedule *schedule,
                                 mp_simulation *simulation, mp_error *err) {
  memset(simulation, 0, sizeof *simulation);
  *schedule = (mp_schedule)MP_SCHEDULE_INITIALIZER;
  MP_TRY(check_step(file, step, err));
  const mp_trace_layout *layout = &file->summary.layout;
  mp_schedule_kind kind;
  if (mp_schedule_kind_parse(layout->schedule, &kind, err) != MP_OK) {
    return mp_error_prefix(err, "%s: $.mpengine.schedule", file->path);
  }
  const int pp = layout->pp;
  int *drawn = malloc((size_t)pp * sizeof *drawn);
  const trace_slice **picked = malloc((file->num_slices > 0 ? file->num_slices : 1) *
                                      sizeof *picked);
  if (drawn == NULL || picked == NULL) {
    free(drawn);
    free(picked);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", file->path);
  }
  mp_status status = MP_OK;
  for (int p = 0; p < pp && status == MP_OK; ++p) {
    drawn[p] = drawn_rank(file, p);
    if (drawn[p] < 0) {
      status = mp_fail(err, MP_ERR_INPUT, "%s: $.mpengine.ranks: no rank at dp 0, pp %d, tp 0",
                       file->path, p);
    }
  }
  size_t num_picked = 0;
  for (size_t i = 0; i < file->num_slices && status == MP_OK; ++i) {
    const trace_slice *slice = &file->slices[i];
    if (slice->category != SLICE_COMPUTE || slice->step != step) continue;
    const rank_coord *coord = &file->ranks[slice->rank];
    if (coord->dp == 0 && coord->tp == 0) picked[num_picked++] = slice;
  }
  qsort(picked, num_picked, sizeof *picked, compare_slices);
  if (status == MP_OK) {
    status = mp_schedule_init(schedule, kind, pp, layout->num_micro_batches,
                              layout->virtual_stages, err);
    if (status != MP_OK) mp_error_prefix(err, "%s: $.mpengine", file->path);
  }
  double origin = INFINITY;
  for (size_t i = 0; i < num_picked && status == MP_OK; ++i) {
    const trace_slice *slice = picked[i];
    status = mp_schedule_append(schedule, file->ranks[slice->rank].pp,
                                (mp_action_kind)slice->kind, slice->micro_batch, slice->chunk,
                                err);
    if (slice->start_s < origin) origin = slice->start_s;
  }
  if (status == MP_OK && mp_schedule_check(schedule, MP_P2P_EAGER, err) != MP_OK) {
    status = mp_error_prefix(err,
                             "%s: step %lld: the actions recorded on the pipeline ranks (at dp 0, "
                             "tp 0) are not a whole %s schedule%s",
                             file->path, (long long)step, layout->schedule,
                             file->summary.complete ? "" : " (the trace dropped events)");
  }

  /* The measured times, 0 at the earliest start. */
  if (status == MP_OK) {
    simulation->pp = pp;
    simulation->time_unit = MP_TIME_SECONDS;
    simulation->memory_unit = MP_MEMORY_MICRO_BATCHES;
    simulation->p2p_model = MP_P2P_EAGER;
    simulation->p2p_latency = 0.0;
    simulation->busy_time = calloc((size_t)pp, sizeof *simulation->busy_time);
    simulation->rank_bubble_fraction = calloc((size_t)pp, sizeof(double));
    simulation->peak_activation_memory = calloc((size_t)pp, sizeof(double));
    simulation->peak_live = calloc((size_t)pp, sizeof(int));
    if (!alloc_rows(pp, schedule, &simulation->start) ||
        !alloc_rows(pp, schedule, &simulation->end) || simulation->busy_time == NULL ||
        simulation->rank_bubble_fraction == NULL || simulation->peak_activation_memory == NULL ||
        simulation->peak_live == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", file->path);
    }
  }
  if (status == MP_OK) {
    int *next = calloc((size_t)pp, sizeof *next);
    if (next == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", file->path);
    for (size_t i = 0; i < num_picked && status == MP_OK; ++i) {
      const int p = file->ranks[picked[i]->rank].pp;
      const int a = next[p]++;
      const double start = picked[i]->start_s - origin;
      const double end = picked[i]->end_s - origin;
      simulation->start[p][a] = start;
      simulation->end[p][a] = end;
      simulation->busy_time[p] += end - start;
      if (end > simulation->step_time) simulation->step_time = end;
    }
    free(next);
  }
  if (status == MP_OK) {
    const double per_chunk = 1.0 / layout->virtual_stages;
    double sum = 0.0;
    for (int p = 0; p < pp; ++p) {
      double memory = 0.0, peak = 0.0;
      const mp_rank_actions *list = &schedule->ranks[p];
      for (int a = 0; a < list->num_actions; ++a) {
        const mp_action_kind k = list->actions[a].kind;
        if (k == MP_ACTION_FORWARD) {
          memory += per_chunk;
          if (memory > peak) peak = memory;
        } else if (k != MP_ACTION_BACKWARD_INPUT) {
          memory -= per_chunk;
        }
      }
      simulation->peak_activation_memory[p] = peak;
      if (peak > simulation->max_peak_activation_memory) {
        simulation->max_peak_activation_memory = peak;
      }
      simulation->peak_live[p] = mp_schedule_peak_live(schedule, p);
      const double step_time = simulation->step_time;
      simulation->rank_bubble_fraction[p] =
          step_time > 0 ? (step_time - simulation->busy_time[p]) / step_time : 0.0;
      sum += simulation->rank_bubble_fraction[p];
    }
    simulation->bubble_fraction = sum / pp;
  }
  free(drawn);
  free(picked);
  return status;
}

/* ---- the measurement ------------------------------------------------------------------------- */

void mp_trace_step_measurement_free(mp_trace_step_measurement *measurement) {
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    free(measurement->mean_s[k]);
    free(measurement->count[k]);
  }
  memset(measurement, 0, sizeof *measurement);
}

mp_status mp_trace_measure_step(const mp_trace_file *file, int64_t step,
                                mp_trace_step_measurement *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  MP_TRY(check_step(file, step, err));
  const mp_trace_layout *layout = &file->summary.layout;
  const int num_stages = layout->pp * layout->virtual_stages;
  out->step = step;
  out->num_stages = num_stages;
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    out->mean_s[k] = calloc((size_t)num_stages, sizeof *out->mean_s[k]);
    out->count[k] = calloc((size_t)num_stages, sizeof *out->count[k]);
    if (out->mean_s[k] == NULL || out->count[k] == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", file->path);
    }
  }
  double step_start = INFINITY, step_end = -INFINITY;
  double any_start = INFINITY, any_end = -INFINITY;
  for (size_t i = 0; i < file->num_slices; ++i) {
    const trace_slice *slice = &file->slices[i];
    if (slice->step != step) continue;
    if (slice->category == SLICE_STEP) {
      step_start = fmin(step_start, slice->start_s);
      step_end = fmax(step_end, slice->end_s);
      continue;
    }
    any_start = fmin(any_start, slice->start_s);
    any_end = fmax(any_end, slice->end_s);
    if (slice->category == SLICE_COMPUTE) {
      out->mean_s[slice->kind][slice->stage] += slice->end_s - slice->start_s;
      out->count[slice->kind][slice->stage] += 1;
    }
  }
  for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
    for (int s = 0; s < num_stages; ++s) {
      if (out->count[k][s] > 0) out->mean_s[k][s] /= out->count[k][s];
    }
  }
  out->step_from_step_slices = step_end >= step_start;
  out->step_s = out->step_from_step_slices ? step_end - step_start : any_end - any_start;
  return MP_OK;
}
