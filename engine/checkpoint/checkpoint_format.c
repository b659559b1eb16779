/* engine/checkpoint/checkpoint_format.c — reading a checkpoint: its manifest parsed and checked,
 * its shard files verified and read range by range, and export to llm.c's format; see
 * checkpoint_internal.h.
 */
#include "engine/checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint.h"

mp_status mp_checkpoint_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes,
                                      mp_error *err) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open the shard file: %s", path,
                   strerror(errno));
  }
  uint64_t hash = CK_FNV_OFFSET, total = 0;
  unsigned char buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, file)) > 0) {
    hash = ck_fnv1a64(hash, buffer, got);
    total += got;
  }
  const int failed = ferror(file);
  fclose(file);
  if (failed) return mp_fail(err, MP_ERR_INPUT, "%s: read error", path);
  *checksum = hash;
  *bytes = total;
  return MP_OK;
}

char *ck_read_text(const char *path) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return NULL;
  char *text = NULL;
  if (fseek(file, 0, SEEK_END) == 0) {
    const long size = ftell(file);
    if (size >= 0 && size < (64L << 20) && fseek(file, 0, SEEK_SET) == 0) {
      text = malloc((size_t)size + 1);
      if (text != NULL && fread(text, 1, (size_t)size, file) != (size_t)size) {
        free(text);
        text = NULL;
      }
      if (text != NULL) text[size] = '\0';
    }
  }
  fclose(file);
  return text;
}

mp_status ck_manifest_int(const ck_manifest *mf, const cJSON *object, const char *where,
                              const char *key, int64_t *out, mp_error *err) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  /* Whole numbers within +-2^53 only: casting NaN, an infinity or 1e300 to int64_t is undefined
   * behaviour, and a fraction would be silently cut. */
  const double limit = 9007199254740992.0;
  if (!cJSON_IsNumber(item) || !(item->valuedouble >= -limit && item->valuedouble <= limit) ||
      item->valuedouble != (double)(int64_t)item->valuedouble) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: %s.%s is missing or not a whole number; the manifest is damaged",
                   mf->file, where, key);
  }
  *out = (int64_t)item->valuedouble;
  return MP_OK;
}

/* ck_manifest_int within [lo, hi]. */
static mp_status manifest_range(const ck_manifest *mf, const cJSON *object, const char *where,
                                const char *key, int64_t lo, int64_t hi, int64_t *out,
                                mp_error *err) {
  MP_TRY(ck_manifest_int(mf, object, where, key, out, err));
  if (*out < lo || *out > hi) {
    return mp_fail(err, MP_ERR_INPUT, "%s: %s.%s is %lld; want %lld to %lld", mf->file, where,
                   key, (long long)*out, (long long)lo, (long long)hi);
  }
  return MP_OK;
}

/* The largest floats per array a file may declare: three arrays and the header must have a
 * size_t byte count (and an off_t offset). */
static const int64_t MAX_FILE_FLOATS = ((int64_t)1 << 60) / (3 * (int64_t)sizeof(float));

/* $.shards: the files. Version 1: one per tp rank, floats_per_array of the first for all. */
static mp_status parse_files(ck_manifest *mf, int pp, int tp, mp_error *err) {
  const cJSON *shards = cJSON_GetObjectItemCaseSensitive(mf->root, "shards");
  const int want = pp * tp;
  if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) != want) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.shards must list %d shard files (pp %d x tp %d)",
                   mf->file, want, pp, tp);
  }
  mf->files = calloc((size_t)want, sizeof *mf->files);
  if (mf->files == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mf->num_files = want;
  int64_t shared_floats = 0;
  for (int f = 0; f < want; ++f) {
    const cJSON *entry = cJSON_GetArrayItem(shards, f);
    char where[64];
    snprintf(where, sizeof where, "$.shards[%d]", f);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "file");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(entry, "fnv1a64");
    if (!cJSON_IsString(name) || !cJSON_IsString(sum) || strchr(name->valuestring, '/') ||
        name->valuestring[0] == '\0' || strcmp(name->valuestring, "..") == 0 ||
        strcmp(name->valuestring, ".") == 0 || strlen(name->valuestring) >= CK_FILE_NAME_BYTES ||
        strlen(sum->valuestring) != 16) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: %s needs file (a plain name) and fnv1a64 (16 hex digits)", mf->file,
                     where);
    }
    ck_file *file = &mf->files[f];
    snprintf(file->name, sizeof file->name, "%s", name->valuestring);
    snprintf(file->checksum, sizeof file->checksum, "%s", sum->valuestring);
    for (int g = 0; g < f; ++g) {
      if (strcmp(mf->files[g].name, file->name) == 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: %s names %s twice", mf->file, where, file->name);
      }
    }
    int64_t floats = 0, pp_rank = 0, tp_rank = f;
    if (mf->version == 1) {
      if (f == 0) {
        MP_TRY(manifest_range(mf, entry, where, "floats_per_array", 0, MAX_FILE_FLOATS,
                              &shared_floats, err));
      }
      floats = shared_floats;
    } else {
      MP_TRY(manifest_range(mf, entry, where, "floats_per_array", 0, MAX_FILE_FLOATS, &floats,
                            err));
      MP_TRY(manifest_range(mf, entry, where, "pp_rank", 0, pp - 1, &pp_rank, err));
      MP_TRY(manifest_range(mf, entry, where, "tp_rank", 0, tp - 1, &tp_rank, err));
    }
    file->floats = (size_t)floats;
    file->pp_rank = (int)pp_rank;
    file->tp_rank = (int)tp_rank;
    file->tp_size = tp;
  }
  return MP_OK;
}

/* $.tensors: every tensor's shape and split (from its name), and where each tp shard sits. */
static mp_status parse_tensors(ck_manifest *mf, mp_error *err) {
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(mf->root, "tensors");
  if (!cJSON_IsArray(tensors) || cJSON_GetArraySize(tensors) < 1) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.tensors must be a non-empty array", mf->file);
  }
  const int n = cJSON_GetArraySize(tensors);
  mf->tensors = calloc((size_t)n, sizeof *mf->tensors);
  if (mf->tensors == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mf->num_tensors = n;
  for (int i = 0; i < n; ++i) {
    const cJSON *item = cJSON_GetArrayItem(tensors, i);
    ck_tensor *t = &mf->tensors[i];
    char where[64];
    snprintf(where, sizeof where, "$.tensors[%d]", i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(item, "shards");
    const double limit = 2147483647.0;
    const cJSON *rows = cJSON_GetArrayItem(shape, 0), *cols = cJSON_GetArrayItem(shape, 1);
    if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof t->name ||
        !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 2 || !cJSON_IsNumber(rows) ||
        !cJSON_IsNumber(cols) || !(rows->valuedouble >= 1 && rows->valuedouble <= limit) ||
        !(cols->valuedouble >= 1 && cols->valuedouble <= limit) ||
        rows->valuedouble != (double)(int64_t)rows->valuedouble ||
        cols->valuedouble != (double)(int64_t)cols->valuedouble || !cJSON_IsArray(shards)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: %s needs name, shape [rows, cols] (whole numbers >= 1) and shards",
                     mf->file, where);
    }
    snprintf(t->name, sizeof t->name, "%s", name->valuestring);
    t->rows = (size_t)rows->valuedouble;
    t->cols = (size_t)cols->valuedouble;
    mp_status status = mp_tp_split_of(t->name, &t->split, err);
    if (status != MP_OK) {
      return mp_fail(err, status, "%s: %s: not a tensor of the GPT model (%s)", mf->file, where,
                     t->name);
    }
    const int tp = cJSON_GetArraySize(shards);
    if (tp < 1 || tp > CK_MAX_GRID) {
      return mp_fail(err, MP_ERR_INPUT, "%s: %s.shards must list 1 to %d shards", mf->file,
                     where, CK_MAX_GRID);
    }
    t->tp = tp;
    t->pieces = calloc((size_t)tp, sizeof *t->pieces);
    if (t->pieces == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    for (int r = 0; r < tp; ++r) t->pieces[r].file = -1;
    const size_t want = mp_tp_shard_floats(t->split, t->rows, t->cols, tp);
    for (int s = 0; s < tp; ++s) {
      const cJSON *shard = cJSON_GetArrayItem(shards, s);
      char at[96];
      snprintf(at, sizeof at, "%s.shards[%d]", where, s);
      int64_t rank = 0, offset = 0, floats = 0;
      MP_TRY(manifest_range(mf, shard, at, "tp_rank", 0, tp - 1, &rank, err));
      MP_TRY(manifest_range(mf, shard, at, "float_offset", 0, MAX_FILE_FLOATS, &offset, err));
      MP_TRY(manifest_range(mf, shard, at, "floats", 0, MAX_FILE_FLOATS, &floats, err));
      int file = -1;
      if (mf->version == 1) {
        file = (int)rank < mf->num_files ? (int)rank : -1;
      } else {
        const cJSON *fname = cJSON_GetObjectItemCaseSensitive(shard, "file");
        for (int f = 0; cJSON_IsString(fname) && f < mf->num_files && file < 0; ++f) {
          if (strcmp(mf->files[f].name, fname->valuestring) == 0) file = f;
        }
      }
      if (file < 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: %s names no file of $.shards", mf->file, at);
      }
      if (t->pieces[rank].file >= 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: %s: tp rank %lld appears twice", mf->file, at,
                       (long long)rank);
      }
      mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
      int num_blocks = 0;
      mp_error inner = MP_ERROR_INITIALIZER;
      if (mp_tp_shard_blocks(t->split, t->rows, t->cols, (int)rank, tp, blocks, &num_blocks,
                             &inner) != MP_OK ||
          (size_t)floats != want) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: %s: %s (%zu x %zu, split %s) cannot be cut into %d shards of %lld "
                       "floats",
                       mf->file, at, t->name, t->rows, t->cols, mp_tp_split_name(t->split), tp,
                       (long long)floats);
      }
      const ck_file *holder = &mf->files[file];
      if (holder->tp_rank != (int)rank || (size_t)offset > holder->floats ||
          (size_t)floats > holder->floats - (size_t)offset) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: %s: the shard of tp rank %lld does not fit in %s (tp rank %d, %zu "
                       "floats per array)",
                       mf->file, at, (long long)rank, holder->name, holder->tp_rank,
                       holder->floats);
      }
      t->pieces[rank].file = file;
      t->pieces[rank].offset = (size_t)offset;
    }
  }
  return MP_OK;
}

const char *const ck_training_keys[CK_TRAINING_SETTINGS] = {
    "steps", "learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay",
    "beta1", "beta2",         "eps",          "grad_clip"};

void ck_training_values(const mp_training_config *t, double out[CK_TRAINING_SETTINGS]) {
  const double values[CK_TRAINING_SETTINGS] = {
      (double)t->steps, t->learning_rate, (double)t->warmup_steps,
      t->min_lr_ratio,  t->weight_decay,  t->beta1,
      t->beta2,         t->eps,           t->grad_clip};
  memcpy(out, values, sizeof values);
}

/* $.plan in the plan file's form, as mp_plan_to_json writes it: topology/plan.c's reader checks
 * the whole plan; its messages name "<manifest> $.plan" and the path inside the object. */
static mp_status parse_plan_object(ck_manifest *mf, const cJSON *object, mp_error *err) {
  char source[CK_PATH_BYTES + 16];
  snprintf(source, sizeof source, "%s $.plan", mf->file);
  mp_plan *plan = malloc(sizeof *plan); /* large (two 1024-entry arrays): off the stack */
  if (plan == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = mp_plan_parse_json(object, source, NULL, plan, err);
  ck_saved_plan *saved = &mf->plan;
  if (status == MP_OK) {
    saved->dp = plan->dp;
    saved->pp = plan->pp;
    saved->tp = plan->tp;
    saved->global_batch = plan->global_batch;
    saved->seq_len = plan->seq_len;
    saved->has_seed = true;
    saved->seed = plan->training.seed;
    ck_training_values(&plan->training, saved->training);
  }
  free(plan);
  MP_TRY(status);
  const struct {
    const char *key;
    int value;
  } grid[] = {{"dp", saved->dp}, {"pp", saved->pp}, {"tp", saved->tp}};
  for (int i = 0; i < 3; ++i) {
    if (grid[i].value > CK_MAX_GRID) {
      return mp_fail(err, MP_ERR_INPUT, "%s: $.plan.parallel.%s is %d; want 1 to %d", mf->file,
                     grid[i].key, grid[i].value, CK_MAX_GRID);
    }
  }
  return MP_OK;
}

/* A flat plan's seed: the string of its decimal digits that older manifests wrote, or a number
 * as the plan file writes it. False when it is neither. */
static bool flat_seed(const cJSON *item, uint64_t *out) {
  if (cJSON_IsNumber(item)) {
    const double value = item->valuedouble;
    if (!(value >= 0 && value <= 9007199254740992.0) || value != (double)(uint64_t)value) {
      return false;
    }
    *out = (uint64_t)value;
    return true;
  }
  if (!cJSON_IsString(item) || item->valuestring[0] < '0' || item->valuestring[0] > '9') {
    return false;
  }
  errno = 0;
  char *end = NULL;
  const unsigned long long value = strtoull(item->valuestring, &end, 10);
  char again[32];
  snprintf(again, sizeof again, "%llu", value);
  if (errno != 0 || *end != '\0' || strcmp(again, item->valuestring) != 0) return false;
  *out = (uint64_t)value;
  return true;
}

/* $.plan in the flat form of manifests written before it held the plan file's object: dp, pp, tp
 * (each 1 to CK_MAX_GRID), batch's global_batch and seq_len, training's settings where present
 * (NaN where not) and its seed (has_seed false when missing or not a whole number). */
static mp_status parse_flat_plan(ck_manifest *mf, const cJSON *object, mp_error *err) {
  ck_saved_plan *saved = &mf->plan;
  int64_t dp = 0, pp = 0, tp = 0;
  MP_TRY(manifest_range(mf, object, "$.plan", "dp", 1, CK_MAX_GRID, &dp, err));
  MP_TRY(manifest_range(mf, object, "$.plan", "pp", 1, CK_MAX_GRID, &pp, err));
  MP_TRY(manifest_range(mf, object, "$.plan", "tp", 1, CK_MAX_GRID, &tp, err));
  saved->dp = (int)dp;
  saved->pp = (int)pp;
  saved->tp = (int)tp;
  const cJSON *batch = cJSON_GetObjectItemCaseSensitive(object, "batch");
  MP_TRY(ck_manifest_int(mf, batch, "$.plan.batch", "global_batch", &saved->global_batch, err));
  MP_TRY(ck_manifest_int(mf, batch, "$.plan.batch", "seq_len", &saved->seq_len, err));
  if (saved->seq_len < 1 || saved->seq_len > INT32_MAX) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.plan.batch.seq_len %lld is out of range", mf->file,
                   (long long)saved->seq_len);
  }
  const cJSON *training = cJSON_GetObjectItemCaseSensitive(object, "training");
  for (int i = 0; i < CK_TRAINING_SETTINGS; ++i) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(training, ck_training_keys[i]);
    saved->training[i] = cJSON_IsNumber(item) ? item->valuedouble : NAN;
  }
  saved->has_seed = flat_seed(cJSON_GetObjectItemCaseSensitive(training, "seed"), &saved->seed);
  return MP_OK;
}

/* $.plan, either form: the plan file's object has "parallel", the flat one never had. */
static mp_status parse_plan(ck_manifest *mf, mp_error *err) {
  const cJSON *object = cJSON_GetObjectItemCaseSensitive(mf->root, "plan");
  if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(object, "parallel"))) {
    return parse_plan_object(mf, object, err);
  }
  return parse_flat_plan(mf, object, err);
}

/* Parses a manifest's text into mf (mf->path and mf->file set by the caller) and checks it:
 * format, version, step, the plan, the files and the tensor table. */
static mp_status manifest_parse(const char *text, ck_manifest *mf, mp_error *err) {
  const char *file = mf->file;
  mf->root = cJSON_Parse(text);
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(mf->root, "format");
  if (!cJSON_IsObject(mf->root) || !cJSON_IsString(format) ||
      strcmp(format->valuestring, CK_FORMAT_NAME) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: not a checkpoint manifest (want an object with \"format\": \"%s\")",
                   file, CK_FORMAT_NAME);
  }
  int64_t version = 0;
  MP_TRY(ck_manifest_int(mf, mf->root, "$", "version", &version, err));
  if (version < 1 || version > CK_FORMAT_VERSION) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: checkpoint format version %lld; this mpengine reads versions 1 to %d",
                   file, (long long)version, CK_FORMAT_VERSION);
  }
  mf->version = (int)version;
  MP_TRY(ck_manifest_int(mf, mf->root, "$", "step", &mf->step, err));
  MP_TRY(parse_plan(mf, err));
  const int64_t dp = mf->plan.dp, pp = mf->plan.pp, tp = mf->plan.tp;
  if (version == 1 && (dp != 1 || pp != 1)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: a version-1 checkpoint saved with dp x pp x tp = %lld x %lld x %lld; "
                   "version 1 holds dp = pp = 1 only",
                   file, (long long)dp, (long long)pp, (long long)tp);
  }
  if (pp * tp > CK_MAX_FILES) {
    return mp_fail(err, MP_ERR_INPUT, "%s: pp x tp = %lld x %lld is more than %d files", file,
                   (long long)pp, (long long)tp, CK_MAX_FILES);
  }
  MP_TRY(parse_files(mf, (int)pp, (int)tp, err));
  return parse_tensors(mf, err);
}

mp_status ck_manifest_open(const char *path, ck_manifest *mf, mp_error *err) {
  memset(mf, 0, sizeof *mf);
  snprintf(mf->path, sizeof mf->path, "%s", path);
  snprintf(mf->file, sizeof mf->file, "%s/manifest.json", path);
  char *text = ck_read_text(mf->file);
  if (text == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot read it (%s); not a checkpoint directory",
                   mf->file, strerror(errno));
  }
  mp_status status = manifest_parse(text, mf, err);
  free(text);
  return status;
}

void ck_manifest_close(ck_manifest *mf) {
  for (int i = 0; i < mf->num_tensors && mf->tensors != NULL; ++i) free(mf->tensors[i].pieces);
  free(mf->tensors);
  free(mf->files);
  cJSON_Delete(mf->root);
  memset(mf, 0, sizeof *mf);
}

static void describe_file(char *out, size_t bytes, const ck_manifest *mf, const ck_file *file) {
  if (mf->version == 1) {
    snprintf(out, bytes, "tp rank %d", file->tp_rank);
  } else {
    snprintf(out, bytes, "pp rank %d, tp rank %d", file->pp_rank, file->tp_rank);
  }
}

/* Opens file f and checks its header: magic, coordinates, floats per array. */
static mp_status open_shard(const ck_manifest *mf, int f, FILE **out, mp_error *err) {
  const ck_file *file = &mf->files[f];
  char path[CK_PATH_BYTES], who[64];
  snprintf(path, sizeof path, "%s/%s", mf->path, file->name);
  describe_file(who, sizeof who, mf, file);
  *out = fopen(path, "rb");
  if (*out == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  unsigned char header[CK_SHARD_HEADER_BYTES];
  bool ok = fread(header, 1, sizeof header, *out) == sizeof header;
  uint32_t a = 0, b = 0;
  uint64_t floats = 0;
  memcpy(&a, header + 8, 4);
  memcpy(&b, header + 12, 4);
  memcpy(&floats, header + 16, 8);
  if (mf->version == 1) {
    ok = ok && memcmp(header, CK_SHARD_MAGIC_V1, 8) == 0 && a == (uint32_t)file->tp_rank &&
         b == (uint32_t)file->tp_size;
  } else {
    ok = ok && memcmp(header, CK_SHARD_MAGIC_V2, 8) == 0 && a == (uint32_t)file->pp_rank &&
         b == (uint32_t)file->tp_rank;
  }
  ok = ok && floats == file->floats;
  if (!ok) {
    fclose(*out);
    *out = NULL;
    return mp_fail(err, MP_ERR_INPUT, "%s: not the shard file of %s (bad header)", path, who);
  }
  return MP_OK;
}

/* Checks file f against the manifest: present, checksum, size, header. */
static mp_status verify_file(const ck_manifest *mf, int f, mp_error *err) {
  const ck_file *file = &mf->files[f];
  char path[CK_PATH_BYTES], who[64];
  snprintf(path, sizeof path, "%s/%s", mf->path, file->name);
  describe_file(who, sizeof who, mf, file);
  if (access(path, F_OK) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: missing shard file of %s (the checkpoint is incomplete; resume from "
                   "another step-<N>)",
                   path, who);
  }
  uint64_t checksum = 0, bytes = 0;
  MP_TRY(mp_checkpoint_file_checksum(path, &checksum, &bytes, err));
  char hex[17];
  ck_hex64(hex, checksum);
  if (strcmp(hex, file->checksum) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: checksum mismatch (FNV-1a 64 %s, the manifest says %s): the shard is "
                   "corrupted; resume from another step-<N>",
                   path, hex, file->checksum);
  }
  const uint64_t want = CK_SHARD_HEADER_BYTES + 3 * (uint64_t)file->floats * sizeof(float);
  if (bytes != want) {
    return mp_fail(err, MP_ERR_INPUT, "%s: %llu bytes, want %llu", path,
                   (unsigned long long)bytes, (unsigned long long)want);
  }
  FILE *handle = NULL;
  MP_TRY(open_shard(mf, f, &handle, err));
  fclose(handle);
  return MP_OK;
}

/* Verifies files f = first, first + stride, ... (every file: 0, 1). */
mp_status ck_verify_files(const ck_manifest *mf, int first, int stride, mp_error *err) {
  for (int f = first; f < mf->num_files; f += stride) MP_TRY(verify_file(mf, f, err));
  return MP_OK;
}


mp_status ck_reader_open(const ck_manifest *mf, ck_shard_reader *reader, mp_error *err) {
  reader->mf = mf;
  reader->handles = calloc((size_t)(mf->num_files > 0 ? mf->num_files : 1), sizeof(FILE *));
  if (reader->handles == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  return MP_OK;
}

void ck_reader_close(ck_shard_reader *reader) {
  for (int f = 0; reader->handles != NULL && f < reader->mf->num_files; ++f) {
    if (reader->handles[f] != NULL) fclose(reader->handles[f]);
  }
  free(reader->handles);
  reader->handles = NULL;
}

/* dest (count floats) = array `array` (0 params, 1 first moments, 2 second moments) of file f
 * from float `offset`. */
static mp_status read_floats(ck_shard_reader *reader, int f, int array, size_t offset, size_t count,
                             float *dest, mp_error *err) {
  const ck_manifest *mf = reader->mf;
  if (reader->handles[f] == NULL) MP_TRY(open_shard(mf, f, &reader->handles[f], err));
  const ck_file *file = &mf->files[f];
  const off_t at = (off_t)CK_SHARD_HEADER_BYTES +
                   ((off_t)array * (off_t)file->floats + (off_t)offset) * (off_t)sizeof(float);
  if (fseeko(reader->handles[f], at, SEEK_SET) != 0 ||
      fread(dest, sizeof(float), count, reader->handles[f]) != count) {
    return mp_fail(err, MP_ERR_INPUT, "%s/%s: short read at byte %lld (truncated?)", mf->path,
                   file->name, (long long)at);
  }
  return MP_OK;
}

typedef struct {
  ck_shard_reader *reader;
  const ck_tensor *tensor;
  int array;
} saved_source;

static mp_status read_saved(void *context, int source_rank, size_t offset, size_t count,
                            float *dest, mp_error *err) {
  const saved_source *s = context;
  const ck_piece *piece = &s->tensor->pieces[source_rank];
  return read_floats(s->reader, piece->file, s->array, piece->offset + offset, count, dest, err);
}

/* dest (count floats) = elements [first, first + count) of tp rank `rank` of `size`'s shard of
 * tensor i's array `array`, read from the saved shards that hold them (any saved tp): only those
 * elements' bytes are read, one read per run contiguous in both layouts. */
mp_status ck_read_shard(ck_shard_reader *reader, int i, int array, int rank, int size,
                            size_t first, size_t count, float *dest, mp_error *err) {
  const ck_tensor *t = &reader->mf->tensors[i];
  saved_source source = {reader, t, array};
  return mp_tp_shard_read(dest, first, count, t->split, t->rows, t->cols, rank, size, t->tp,
                          read_saved, &source, err);
}

/* Checks that the manifest's model is `layout` (naming the first difference). */
mp_status ck_check_model(const ck_manifest *mf, const mp_param_layout *layout,
                             const char *model_source, mp_error *err) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf->root, "model");
  const cJSON *config = cJSON_GetObjectItemCaseSensitive(model, "config");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(model, "name");
  const mp_model_config *c = mp_param_layout_config(layout);
  const struct {
    const char *key;
    int value;
  } fields[] = {{"num_layers", c->num_layers},   {"num_heads", c->num_heads},
                {"channels", c->channels},       {"ffn_channels", c->ffn_channels},
                {"vocab_size", c->vocab_size},   {"padded_vocab_size", c->padded_vocab_size},
                {"max_seq_len", c->max_seq_len}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
    int64_t saved = 0;
    MP_TRY(ck_manifest_int(mf, config, "$.model.config", fields[i].key, &saved, err));
    if (saved != fields[i].value) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s is a checkpoint of another model: %s %lld in the checkpoint (model "
                     "'%s'), %d in %s",
                     mf->path, fields[i].key, (long long)saved,
                     cJSON_IsString(name) ? name->valuestring : "?", fields[i].value,
                     model_source);
    }
  }
  const int n = mp_param_layout_num_tensors(layout);
  if (mf->num_tensors != n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s is a checkpoint of another model: %d tensors in the checkpoint, %d in %s",
                   mf->path, mf->num_tensors, n, model_source);
  }
  for (int i = 0; i < n; ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    const ck_tensor *saved = &mf->tensors[i];
    if (strcmp(saved->name, t->name) != 0 || saved->rows != t->rows || saved->cols != t->cols) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s is a checkpoint of another model: tensor %d is not %s (%zu x %zu) as "
                     "in %s",
                     mf->path, i, t->name, t->rows, t->cols, model_source);
    }
  }
  return MP_OK;
}

mp_status mp_checkpoint_export(const char *path, mp_weight_format format,
                               const mp_weight_sink_options *options, const char *out,
                               int64_t *step, size_t *num_params, mp_error *err) {
  ck_manifest mf;
  mp_status status = ck_manifest_open(path, &mf, err);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf.root, "model");
  const cJSON *description = cJSON_GetObjectItemCaseSensitive(model, "description");
  const int64_t seq_len = mf.plan.seq_len; /* 1 to INT32_MAX: checked with the plan */
  if (status == MP_OK && !cJSON_IsString(description)) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "%s/manifest.json: $.model.description is missing (the model file could "
                     "not be read when it was saved)",
                     path);
  }
  mp_model *parsed = NULL;
  mp_param_layout *layout = NULL;
  char source[CK_PATH_BYTES + 32];
  snprintf(source, sizeof source, "%s/manifest.json $.model.description", path);
  if (status == MP_OK) status = mp_model_parse_text(description->valuestring, source, &parsed, err);
  if (status == MP_OK) status = mp_param_layout_create(parsed, (int)seq_len, &layout, err);
  if (status == MP_OK) status = ck_check_model(&mf, layout, source, err);
  if (status == MP_OK) status = ck_verify_files(&mf, 0, 1, err);
  /* Tensor by tensor: one buffer of the largest tensor, never the whole model. */
  size_t largest = 0;
  for (int i = 0; status == MP_OK && i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    if (t->rows * t->cols > largest) largest = t->rows * t->cols;
  }
  float *tensor = NULL;
  if (status == MP_OK && (tensor = malloc((largest > 0 ? largest : 1) * sizeof(float))) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for a tensor of %zu floats", largest);
  }
  mp_weight_sink *writer = NULL;
  if (status == MP_OK) status = mp_weight_sink_open(layout, format, out, options, &writer, err);
  ck_shard_reader reader = {NULL, NULL};
  if (status == MP_OK) status = ck_reader_open(&mf, &reader, err);
  for (int i = 0; status == MP_OK && i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    /* The full tensor is tp rank 0's shard at tp = 1. */
    status = ck_read_shard(&reader, i, 0, 0, 1, 0, t->rows * t->cols, tensor, err);
    if (status == MP_OK) status = mp_weight_sink_write(writer, i, tensor, err);
  }
  if (reader.handles != NULL) ck_reader_close(&reader);
  if (writer != NULL) {
    if (status == MP_OK) {
      status = mp_weight_sink_commit(writer, err);
    } else {
      mp_weight_sink_abort(writer);
    }
  }
  if (status == MP_OK) {
    *step = mf.step;
    *num_params = mp_param_layout_num_params(layout);
  }
  free(tensor);
  mp_param_layout_free(layout);
  mp_model_free(parsed);
  ck_manifest_close(&mf);
  return status;
}

mp_status mp_checkpoint_manifest_check_text(const char *text, const char *source, mp_error *err) {
  ck_manifest mf;
  memset(&mf, 0, sizeof mf);
  snprintf(mf.path, sizeof mf.path, "%s", source);
  snprintf(mf.file, sizeof mf.file, "%s", source);
  mp_status status = manifest_parse(text, &mf, err); /* the plan included, either form */
  const int64_t seq_len = mf.plan.seq_len;
  /* The model: its description (when saved) must parse, and the shape and tensor table must be
   * those of the model it describes laid out at the saved seq_len, as export checks them. */
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf.root, "model");
  const cJSON *description = cJSON_GetObjectItemCaseSensitive(model, "description");
  mp_model *parsed = NULL;
  mp_param_layout *layout = NULL;
  char where[CK_PATH_BYTES + 32];
  snprintf(where, sizeof where, "%s $.model.description", source);
  if (status == MP_OK && cJSON_IsString(description)) {
    status = mp_model_parse_text(description->valuestring, where, &parsed, err);
    if (status == MP_OK) status = mp_param_layout_create(parsed, (int)seq_len, &layout, err);
    if (status == MP_OK) status = ck_check_model(&mf, layout, where, err);
  }
  mp_param_layout_free(layout);
  mp_model_free(parsed);
  ck_manifest_close(&mf);
  return status;
}
