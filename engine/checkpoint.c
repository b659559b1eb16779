/* engine/checkpoint.c — sharded checkpoints, crash-safe saves, exact resume and resharding; see
 * checkpoint.h. */
#include "engine/checkpoint.h"

#include "common/atomic_file.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensor_parallel/shard.h"

#define SHARD_MAGIC "MPCKSHD1"
enum { SHARD_HEADER_BYTES = 32, PATH_BYTES = 4096, FORMAT_VERSION = 1 };
static const char *const FORMAT_NAME = "mpengine-checkpoint";

/* ---- files ---- */

mp_status mp_checkpoint_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes,
                                      mp_error *err) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open the shard file: %s", path,
                   strerror(errno));
  }
  uint64_t hash = 14695981039346656037ull, total = 0;
  unsigned char buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, file)) > 0) {
    for (size_t i = 0; i < got; ++i) {
      hash ^= buffer[i];
      hash *= 1099511628211ull;
    }
    total += got;
  }
  const int failed = ferror(file);
  fclose(file);
  if (failed) return mp_fail(err, MP_ERR_INPUT, "%s: read error", path);
  *checksum = hash;
  *bytes = total;
  return MP_OK;
}

static mp_status sync_dir(const char *dir, mp_error *err) {
  const int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot open: %s", dir, strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) return mp_fail(err, MP_ERR_RUNTIME, "%s: fsync: %s", dir, strerror(errno));
  return MP_OK;
}

/* Writes the pieces to path atomically (common/atomic_file.h). */
static mp_status write_file_atomic(const char *path, const void *const *pieces,
                                   const size_t *sizes, int count, mp_error *err) {
  mp_atomic_file file;
  MP_TRY(mp_atomic_file_open(&file, path, err));
  for (int i = 0; i < count; ++i) mp_atomic_file_write(&file, pieces[i], sizes[i]);
  return mp_atomic_file_commit(&file, err);
}

/* Removes a checkpoint directory (flat: files only). */
static void remove_dir(const char *path) {
  DIR *dir = opendir(path);
  if (dir == NULL) return;
  struct dirent *entry;
  char file[PATH_BYTES];
  while ((entry = readdir(dir)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
    unlink(file);
  }
  closedir(dir);
  rmdir(path);
}

static char *read_text(const char *path) {
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

/* ---- the shard table ---- */

/* Floats of one rank's shard of every tensor, in layout order; offsets into the shard array. */
static mp_status shard_table(const mp_gpt_layout *layout, int tp, size_t *offsets, size_t *counts,
                             mp_tp_split *splits, size_t *total, mp_error *err) {
  size_t offset = 0;
  for (int i = 0; i < mp_gpt_layout_num_tensors(layout); ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
    MP_TRY(mp_tp_split_of(t->name, &splits[i], err));
    offsets[i] = offset;
    counts[i] = mp_tp_shard_floats(splits[i], t->rows, t->cols, tp);
    offset += counts[i];
  }
  *total = offset;
  return MP_OK;
}

static void config_json(cJSON *object, const mp_gpt_config *c) {
  cJSON_AddNumberToObject(object, "max_seq_len", c->max_seq_len);
  cJSON_AddNumberToObject(object, "vocab_size", c->vocab_size);
  cJSON_AddNumberToObject(object, "padded_vocab_size", c->padded_vocab_size);
  cJSON_AddNumberToObject(object, "num_layers", c->num_layers);
  cJSON_AddNumberToObject(object, "num_heads", c->num_heads);
  cJSON_AddNumberToObject(object, "channels", c->channels);
  cJSON_AddNumberToObject(object, "ffn_channels", c->ffn_channels);
}

static char *hex64(char out[17], uint64_t value) {
  snprintf(out, 17, "%016" PRIx64, value);
  return out;
}

static cJSON *build_manifest(const mp_checkpoint_context *ctx, int64_t step,
                             const char *tmp_dir, mp_error *err, mp_status *status) {
  const mp_plan *plan = ctx->plan;
  const mp_gpt_layout *layout = mp_trainer_layout(ctx->trainer);
  const int n = mp_gpt_layout_num_tensors(layout);
  const int tp = ctx->tp_size;
  *status = MP_OK;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", FORMAT_NAME);
  cJSON_AddNumberToObject(root, "version", FORMAT_VERSION);
  cJSON_AddNumberToObject(root, "step", (double)step);

  cJSON *p = cJSON_AddObjectToObject(root, "plan");
  cJSON_AddStringToObject(p, "source", plan->source);
  cJSON_AddNumberToObject(p, "dp", plan->dp);
  cJSON_AddNumberToObject(p, "pp", plan->pp);
  cJSON_AddNumberToObject(p, "tp", plan->tp);
  cJSON_AddBoolToObject(p, "sequence_parallel", plan->sequence_parallel);
  cJSON *batch = cJSON_AddObjectToObject(p, "batch");
  cJSON_AddNumberToObject(batch, "global_batch", (double)plan->global_batch);
  cJSON_AddNumberToObject(batch, "micro_batch", (double)plan->micro_batch);
  cJSON_AddNumberToObject(batch, "num_micro_batches", (double)plan->num_micro_batches);
  cJSON_AddNumberToObject(batch, "seq_len", (double)plan->seq_len);
  const mp_training_config *t = &plan->training;
  cJSON *training = cJSON_AddObjectToObject(p, "training");
  char seed[32];
  snprintf(seed, sizeof seed, "%" PRIu64, (uint64_t)t->seed);
  cJSON_AddNumberToObject(training, "steps", (double)t->steps);
  cJSON_AddStringToObject(training, "seed", seed);
  cJSON_AddNumberToObject(training, "learning_rate", t->learning_rate);
  cJSON_AddNumberToObject(training, "warmup_steps", (double)t->warmup_steps);
  cJSON_AddNumberToObject(training, "min_lr_ratio", t->min_lr_ratio);
  cJSON_AddNumberToObject(training, "weight_decay", t->weight_decay);
  cJSON_AddNumberToObject(training, "beta1", t->beta1);
  cJSON_AddNumberToObject(training, "beta2", t->beta2);
  cJSON_AddNumberToObject(training, "eps", t->eps);
  cJSON_AddNumberToObject(training, "grad_clip", t->grad_clip);

  cJSON *model = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(model, "name", mp_model_name(ctx->model));
  cJSON_AddStringToObject(model, "source", mp_model_source(ctx->model));
  cJSON_AddNumberToObject(model, "num_params", (double)mp_gpt_layout_num_params(layout));
  config_json(cJSON_AddObjectToObject(model, "config"), mp_gpt_layout_config(layout));
  char *description = read_text(mp_model_source(ctx->model));
  if (description != NULL) {
    cJSON_AddStringToObject(model, "description", description);
    free(description);
  } else {
    cJSON_AddNullToObject(model, "description");
  }

  cJSON *data = cJSON_AddObjectToObject(root, "data");
  cJSON_AddStringToObject(data, "seed", seed);
  cJSON_AddNumberToObject(data, "global_batch", (double)plan->global_batch);
  cJSON_AddNumberToObject(data, "seq_len", (double)plan->seq_len);
  cJSON_AddNumberToObject(data, "next_step", (double)step);
  cJSON_AddStringToObject(data, "note",
                          "the batch of a step is a pure function of (seed, step): the position "
                          "is the step");
  cJSON *rng = cJSON_AddObjectToObject(root, "rng");
  cJSON_AddStringToObject(rng, "seed", seed);
  cJSON_AddStringToObject(rng, "note",
                          "no RNG state beyond the seed: initialisation and data are pure "
                          "functions of (seed, name, index) and (seed, step); no dropout");
  cJSON *schedule = cJSON_AddObjectToObject(root, "lr_schedule");
  cJSON_AddNumberToObject(schedule, "step", (double)step);
  cJSON_AddNumberToObject(schedule, "total_steps", (double)t->steps);
  cJSON_AddNumberToObject(schedule, "next_learning_rate",
                          step < t->steps ? mp_training_learning_rate(t, step) : 0.0);
  cJSON_AddNumberToObject(schedule, "adamw_next_t", (double)(step + 1));

  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  size_t offset = 0;
  for (int i = 0; i < n && *status == MP_OK; ++i) {
    const mp_gpt_tensor *tensor = mp_gpt_layout_tensor(layout, i);
    mp_tp_split split;
    *status = mp_tp_split_of(tensor->name, &split, err);
    if (*status != MP_OK) break;
    const size_t count = mp_tp_shard_floats(split, tensor->rows, tensor->cols, tp);
    cJSON *item = cJSON_CreateObject();
    cJSON_AddItemToArray(tensors, item);
    cJSON_AddStringToObject(item, "name", tensor->name);
    const int shape[2] = {(int)tensor->rows, (int)tensor->cols};
    cJSON_AddItemToObject(item, "shape", cJSON_CreateIntArray(shape, 2));
    cJSON_AddStringToObject(item, "split", mp_tp_split_name(split));
    cJSON *shards = cJSON_AddArrayToObject(item, "shards");
    for (int r = 0; r < tp && *status == MP_OK; ++r) {
      mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
      int num_blocks = 0;
      *status = mp_tp_shard_blocks(split, tensor->rows, tensor->cols, r, tp, blocks,
                                   &num_blocks, err);
      if (*status != MP_OK) break;
      cJSON *shard = cJSON_CreateObject();
      cJSON_AddItemToArray(shards, shard);
      cJSON_AddNumberToObject(shard, "tp_rank", r);
      cJSON_AddNumberToObject(shard, "float_offset", (double)offset);
      cJSON_AddNumberToObject(shard, "floats", (double)count);
      cJSON *list = cJSON_AddArrayToObject(shard, "blocks");
      for (int b = 0; b < num_blocks; ++b) {
        const int block[4] = {(int)blocks[b].row_offset, (int)blocks[b].col_offset,
                              (int)blocks[b].rows, (int)blocks[b].cols};
        cJSON_AddItemToArray(list, cJSON_CreateIntArray(block, 4));
      }
    }
    offset += count;
  }
  cJSON *files = cJSON_AddArrayToObject(root, "shards");
  for (int r = 0; r < tp && *status == MP_OK; ++r) {
    char name[64], path[PATH_BYTES], hex[17];
    snprintf(name, sizeof name, "rank-%05d.bin", r);
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    uint64_t checksum = 0, bytes = 0;
    *status = mp_checkpoint_file_checksum(path, &checksum, &bytes, err);
    if (*status != MP_OK) {
      err->status = *status = MP_ERR_RUNTIME;
      break;
    }
    cJSON *file = cJSON_CreateObject();
    cJSON_AddItemToArray(files, file);
    cJSON_AddStringToObject(file, "file", name);
    cJSON_AddNumberToObject(file, "tp_rank", r);
    cJSON_AddNumberToObject(file, "tp_size", tp);
    cJSON_AddNumberToObject(file, "floats_per_array", (double)offset);
    cJSON_AddStringToObject(file, "arrays", "params, adam_m, adam_v (fp32, little-endian)");
    cJSON_AddNumberToObject(file, "bytes", (double)bytes);
    cJSON_AddStringToObject(file, "fnv1a64", hex64(hex, checksum));
  }
  return root;
}

/* Complete checkpoints under dir, newest first: steps[] (up to max). */
static int list_checkpoints(const char *dir, int64_t *steps, int max) {
  DIR *handle = opendir(dir);
  if (handle == NULL) return 0;
  int count = 0;
  struct dirent *entry;
  while ((entry = readdir(handle)) != NULL && count < max) {
    const char *name = entry->d_name;
    if (strncmp(name, "step-", 5) != 0 || name[5] == '\0') continue;
    char *end = NULL;
    const long long step = strtoll(name + 5, &end, 10);
    if (*end != '\0' || step < 0) continue;
    steps[count++] = step;
  }
  closedir(handle);
  for (int i = 1; i < count; ++i) { /* insertion sort, descending */
    const int64_t v = steps[i];
    int j = i - 1;
    while (j >= 0 && steps[j] < v) {
      steps[j + 1] = steps[j];
      --j;
    }
    steps[j + 1] = v;
  }
  return count;
}

/* True when path/manifest.json is a checkpoint manifest. */
static bool has_manifest(const char *path) {
  char file[PATH_BYTES];
  snprintf(file, sizeof file, "%s/manifest.json", path);
  char *text = read_text(file);
  if (text == NULL) return false;
  cJSON *root = cJSON_Parse(text);
  free(text);
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
  const bool ok = cJSON_IsString(format) && strcmp(format->valuestring, FORMAT_NAME) == 0;
  cJSON_Delete(root);
  return ok;
}

enum { MAX_LISTED = 4096 };

mp_status mp_checkpoint_save(const char *dir, int64_t step, int keep,
                             const mp_checkpoint_context *ctx, mp_error *err) {
  float *params = NULL, *m = NULL, *v = NULL;
  size_t count = 0;
  MP_TRY(mp_trainer_cpu_state(ctx->trainer, &params, &m, &v, &count, err));
  /* Rank 0 creates the temporary directory and tells the others its name. */
  int32_t pid = (int32_t)getpid();
  char tmp_dir[PATH_BYTES], final_dir[PATH_BYTES];
  if (ctx->tp_rank == 0) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
      return mp_fail(err, MP_ERR_RUNTIME, "--checkpoint-dir %s: cannot create: %s", dir,
                     strerror(errno));
    }
  }
  if (ctx->group != NULL) MP_TRY(mp_comm_broadcast(ctx->group, &pid, sizeof pid, 0, err));
  snprintf(tmp_dir, sizeof tmp_dir, "%s/step-%lld.tmp-%d", dir, (long long)step, (int)pid);
  snprintf(final_dir, sizeof final_dir, "%s/step-%lld", dir, (long long)step);
  if (ctx->tp_rank == 0) {
    remove_dir(tmp_dir);
    if (mkdir(tmp_dir, 0777) != 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot create: %s", tmp_dir, strerror(errno));
    }
  }
  if (ctx->group != NULL) MP_TRY(mp_comm_barrier(ctx->group, err));
  /* Every rank: its shard file. */
  char path[PATH_BYTES];
  snprintf(path, sizeof path, "%s/rank-%05d.bin", tmp_dir, ctx->tp_rank);
  unsigned char header[SHARD_HEADER_BYTES] = {0};
  memcpy(header, SHARD_MAGIC, 8);
  const uint32_t rank32 = (uint32_t)ctx->tp_rank, size32 = (uint32_t)ctx->tp_size;
  const uint64_t count64 = count, step64 = (uint64_t)step;
  memcpy(header + 8, &rank32, 4);
  memcpy(header + 12, &size32, 4);
  memcpy(header + 16, &count64, 8);
  memcpy(header + 24, &step64, 8);
  const void *pieces[4] = {header, params, m, v};
  const size_t sizes[4] = {sizeof header, count * sizeof(float), count * sizeof(float),
                           count * sizeof(float)};
  MP_TRY(write_file_atomic(path, pieces, sizes, 4, err));
  if (ctx->group != NULL) MP_TRY(mp_comm_barrier(ctx->group, err));
  if (ctx->tp_rank != 0) return MP_OK;
  /* Rank 0: the manifest last, then the directory into place. */
  mp_status status = MP_OK;
  cJSON *manifest = build_manifest(ctx, step, tmp_dir, err, &status);
  char *text = status == MP_OK ? cJSON_Print(manifest) : NULL;
  cJSON_Delete(manifest);
  if (status != MP_OK) return status;
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory writing the manifest");
  snprintf(path, sizeof path, "%s/manifest.json", tmp_dir);
  const void *text_piece[2] = {text, "\n"};
  const size_t text_sizes[2] = {strlen(text), 1};
  status = write_file_atomic(path, text_piece, text_sizes, 2, err);
  free(text);
  if (status != MP_OK) return status;
  MP_TRY(sync_dir(tmp_dir, err));
  struct stat info;
  if (stat(final_dir, &info) == 0) {
    /* Replacing step-N (a resumed run saving the step it resumed from): move it aside first. */
    char old[PATH_BYTES];
    snprintf(old, sizeof old, "%s.old-%d", final_dir, (int)pid);
    if (rename(final_dir, old) != 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot replace: %s", final_dir, strerror(errno));
    }
    remove_dir(old);
  }
  if (rename(tmp_dir, final_dir) != 0) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot rename into place: %s", final_dir,
                   strerror(errno));
  }
  MP_TRY(sync_dir(dir, err));
  if (keep > 0) {
    int64_t *steps = malloc(MAX_LISTED * sizeof *steps);
    if (steps == NULL) return MP_OK;
    const int n = list_checkpoints(dir, steps, MAX_LISTED);
    int complete = 0;
    for (int i = 0; i < n; ++i) {
      char candidate[PATH_BYTES];
      snprintf(candidate, sizeof candidate, "%s/step-%lld", dir, (long long)steps[i]);
      if (!has_manifest(candidate)) continue;
      if (++complete > keep) remove_dir(candidate);
    }
    free(steps);
  }
  return MP_OK;
}

mp_status mp_checkpoint_find_latest(const char *dir, char *path, size_t path_bytes,
                                    int64_t *step, mp_error *err) {
  int64_t *steps = malloc(MAX_LISTED * sizeof *steps);
  if (steps == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const int n = list_checkpoints(dir, steps, MAX_LISTED);
  for (int i = 0; i < n; ++i) {
    snprintf(path, path_bytes, "%s/step-%lld", dir, (long long)steps[i]);
    if (has_manifest(path)) {
      *step = steps[i];
      free(steps);
      return MP_OK;
    }
  }
  free(steps);
  return mp_fail(err, MP_ERR_INPUT,
                 "--resume: no checkpoint in %s (no step-<N> directory with a valid "
                 "manifest.json); drop --resume to start from scratch, or give the "
                 "--checkpoint-dir a run saved to",
                 dir);
}

/* ---- loading ---- */

typedef struct {
  char path[PATH_BYTES]; /* the checkpoint directory */
  char file[PATH_BYTES]; /* the manifest, as messages name it */
  cJSON *root;
  int64_t step;
  int tp;
  size_t floats; /* per array, per rank */
} manifest;

static mp_status manifest_int(const manifest *mf, const cJSON *object, const char *where,
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

/* Parses a manifest's text into mf (mf->path and mf->file set by the caller) and checks its
 * header: format, version, step, layout, the shard list's length and floats_per_array. */
static mp_status manifest_parse(const char *text, manifest *mf, mp_error *err) {
  const char *file = mf->file;
  mf->root = cJSON_Parse(text);
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(mf->root, "format");
  if (!cJSON_IsObject(mf->root) || !cJSON_IsString(format) ||
      strcmp(format->valuestring, FORMAT_NAME) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: not a checkpoint manifest (want an object with \"format\": \"%s\")",
                   file, FORMAT_NAME);
  }
  int64_t version = 0, tp = 0, dp = 0, pp = 0, floats = 0;
  MP_TRY(manifest_int(mf, mf->root, "$", "version", &version, err));
  if (version != FORMAT_VERSION) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: checkpoint format version %lld; this mpengine reads version %d", file,
                   (long long)version, FORMAT_VERSION);
  }
  MP_TRY(manifest_int(mf, mf->root, "$", "step", &mf->step, err));
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(mf->root, "plan");
  MP_TRY(manifest_int(mf, plan, "$.plan", "dp", &dp, err));
  MP_TRY(manifest_int(mf, plan, "$.plan", "pp", &pp, err));
  MP_TRY(manifest_int(mf, plan, "$.plan", "tp", &tp, err));
  if (dp != 1 || pp != 1 || tp < 1 || tp > 4096) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: saved with dp x pp x tp = %lld x %lld x %lld; this mpengine reads "
                   "checkpoints of dp = pp = 1 only",
                   file, (long long)dp, (long long)pp, (long long)tp);
  }
  mf->tp = (int)tp;
  const cJSON *shards = cJSON_GetObjectItemCaseSensitive(mf->root, "shards");
  if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) != mf->tp) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.shards must list %d shard files", file, mf->tp);
  }
  MP_TRY(manifest_int(mf, cJSON_GetArrayItem(shards, 0), "$.shards[0]", "floats_per_array",
                      &floats, err));
  /* Three arrays of floats plus the header must have a size_t byte count. */
  if (floats < 0 || (uint64_t)floats > (SIZE_MAX - SHARD_HEADER_BYTES) / (3 * sizeof(float))) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.shards[0].floats_per_array %lld is out of range",
                   file, (long long)floats);
  }
  mf->floats = (size_t)floats;
  return MP_OK;
}

static mp_status manifest_open(const char *path, manifest *mf, mp_error *err) {
  memset(mf, 0, sizeof *mf);
  snprintf(mf->path, sizeof mf->path, "%s", path);
  snprintf(mf->file, sizeof mf->file, "%s/manifest.json", path);
  char *text = read_text(mf->file);
  if (text == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot read it (%s); not a checkpoint directory",
                   mf->file, strerror(errno));
  }
  mp_status status = manifest_parse(text, mf, err);
  free(text);
  return status;
}

static void manifest_close(manifest *mf) { cJSON_Delete(mf->root); }

/* $.shards[r]'s file name (a plain name in the checkpoint directory) and checksum string. */
static mp_status shard_entry(const manifest *mf, int r, const cJSON **name, const cJSON **sum,
                             mp_error *err) {
  const cJSON *entry = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(mf->root, "shards"), r);
  *name = cJSON_GetObjectItemCaseSensitive(entry, "file");
  *sum = cJSON_GetObjectItemCaseSensitive(entry, "fnv1a64");
  if (!cJSON_IsString(*name) || !cJSON_IsString(*sum) || strchr((*name)->valuestring, '/') ||
      (*name)->valuestring[0] == '\0' || strcmp((*name)->valuestring, "..") == 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.shards[%d] needs file (a plain name) and fnv1a64",
                   mf->file, r);
  }
  return MP_OK;
}

/* Checks every shard file against the manifest: present, size, checksum, header. */
static mp_status manifest_verify_files(const manifest *mf, mp_error *err) {
  for (int r = 0; r < mf->tp; ++r) {
    const cJSON *name = NULL, *sum = NULL;
    MP_TRY(shard_entry(mf, r, &name, &sum, err));
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/%s", mf->path, name->valuestring);
    if (access(path, F_OK) != 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: missing shard file of tp rank %d (the checkpoint is incomplete; "
                     "resume from another step-<N>)",
                     path, r);
    }
    uint64_t checksum = 0, bytes = 0;
    MP_TRY(mp_checkpoint_file_checksum(path, &checksum, &bytes, err));
    char hex[17];
    hex64(hex, checksum);
    if (strcmp(hex, sum->valuestring) != 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: checksum mismatch (FNV-1a 64 %s, the manifest says %s): the shard is "
                     "corrupted; resume from another step-<N>",
                     path, hex, sum->valuestring);
    }
    if (bytes != SHARD_HEADER_BYTES + 3 * mf->floats * sizeof(float)) {
      return mp_fail(err, MP_ERR_INPUT, "%s: %llu bytes, want %zu", path,
                     (unsigned long long)bytes,
                     SHARD_HEADER_BYTES + 3 * mf->floats * sizeof(float));
    }
  }
  return MP_OK;
}

/* Reads rank r's three arrays (mf->floats each) into params, m, v. */
static mp_status read_shard(const manifest *mf, int r, float *params, float *m, float *v,
                            mp_error *err) {
  const cJSON *entry = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(mf->root, "shards"), r);
  char path[PATH_BYTES];
  snprintf(path, sizeof path, "%s/%s", mf->path,
           cJSON_GetObjectItemCaseSensitive(entry, "file")->valuestring);
  FILE *file = fopen(path, "rb");
  if (file == NULL) return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  unsigned char header[SHARD_HEADER_BYTES];
  bool ok = fread(header, 1, sizeof header, file) == sizeof header &&
            memcmp(header, SHARD_MAGIC, 8) == 0;
  uint32_t rank32 = 0, size32 = 0;
  memcpy(&rank32, header + 8, 4);
  memcpy(&size32, header + 12, 4);
  ok = ok && rank32 == (uint32_t)r && size32 == (uint32_t)mf->tp;
  ok = ok && fread(params, sizeof(float), mf->floats, file) == mf->floats &&
       fread(m, sizeof(float), mf->floats, file) == mf->floats &&
       fread(v, sizeof(float), mf->floats, file) == mf->floats;
  fclose(file);
  if (!ok) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: not the shard file of tp rank %d of %d (bad header or short)", path, r,
                   mf->tp);
  }
  return MP_OK;
}

/* Checks that the manifest's model is `layout` (naming the first difference). */
static mp_status check_model(const manifest *mf, const mp_gpt_layout *layout,
                             const char *model_source, mp_error *err) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf->root, "model");
  const cJSON *config = cJSON_GetObjectItemCaseSensitive(model, "config");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(model, "name");
  const mp_gpt_config *c = mp_gpt_layout_config(layout);
  const struct {
    const char *key;
    int value;
  } fields[] = {{"num_layers", c->num_layers},   {"num_heads", c->num_heads},
                {"channels", c->channels},       {"ffn_channels", c->ffn_channels},
                {"vocab_size", c->vocab_size},   {"padded_vocab_size", c->padded_vocab_size},
                {"max_seq_len", c->max_seq_len}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
    int64_t saved = 0;
    MP_TRY(manifest_int(mf, config, "$.model.config", fields[i].key, &saved, err));
    if (saved != fields[i].value) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s is a checkpoint of another model: %s %lld in the checkpoint (model "
                     "'%s'), %d in %s",
                     mf->path, fields[i].key, (long long)saved,
                     cJSON_IsString(name) ? name->valuestring : "?", fields[i].value,
                     model_source);
    }
  }
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(mf->root, "tensors");
  const int n = mp_gpt_layout_num_tensors(layout);
  if (!cJSON_IsArray(tensors) || cJSON_GetArraySize(tensors) != n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s is a checkpoint of another model: %d tensors in the checkpoint, %d in %s",
                   mf->path, cJSON_IsArray(tensors) ? cJSON_GetArraySize(tensors) : 0, n,
                   model_source);
  }
  for (int i = 0; i < n; ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
    const cJSON *item = cJSON_GetArrayItem(tensors, i);
    const cJSON *tname = cJSON_GetObjectItemCaseSensitive(item, "name");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsString(tname) || strcmp(tname->valuestring, t->name) != 0 ||
        cJSON_GetArraySize(shape) != 2 ||
        cJSON_GetArrayItem(shape, 0)->valuedouble != (double)t->rows ||
        cJSON_GetArrayItem(shape, 1)->valuedouble != (double)t->cols) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s is a checkpoint of another model: tensor %d is not %s (%zu x %zu) as "
                     "in %s",
                     mf->path, i, t->name, t->rows, t->cols, model_source);
    }
  }
  return MP_OK;
}

/* Global params, m, v (3 x num_params floats, may be NULL for m/v) from every shard file. */
static mp_status reassemble(const manifest *mf, const mp_gpt_layout *layout, float *params,
                            float *m, float *v, mp_error *err) {
  const int n = mp_gpt_layout_num_tensors(layout);
  size_t *offsets = calloc((size_t)n, sizeof *offsets);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  mp_tp_split *splits = calloc((size_t)n, sizeof *splits);
  float *shard = malloc(3 * mf->floats * sizeof(float) + 1);
  mp_status status = MP_OK;
  if (offsets == NULL || counts == NULL || splits == NULL || shard == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory reading %s", mf->path);
    goto out;
  }
  size_t total = 0;
  status = shard_table(layout, mf->tp, offsets, counts, splits, &total, err);
  if (status == MP_OK && total != mf->floats) {
    status = mp_fail(err, MP_ERR_INPUT, "%s: shard files hold %zu floats per array, want %zu",
                     mf->path, mf->floats, total);
  }
  for (int r = 0; r < mf->tp && status == MP_OK; ++r) {
    status = read_shard(mf, r, shard, shard + mf->floats, shard + 2 * mf->floats, err);
    float *outs[3] = {params, m, v};
    for (int a = 0; a < 3 && status == MP_OK; ++a) {
      if (outs[a] == NULL) continue;
      for (int i = 0; i < n && status == MP_OK; ++i) {
        const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
        status = mp_tp_shard_insert(outs[a] + t->offset, shard + a * mf->floats + offsets[i],
                                    splits[i], t->rows, t->cols, r, mf->tp, err);
      }
    }
  }
out:
  free(shard);
  free(splits);
  free(counts);
  free(offsets);
  return status;
}

static mp_status check_run(const manifest *mf, const mp_plan *plan, mp_error *err) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(mf->root, "plan");
  const cJSON *batch = cJSON_GetObjectItemCaseSensitive(p, "batch");
  const cJSON *training = cJSON_GetObjectItemCaseSensitive(p, "training");
  int64_t global_batch = 0, seq_len = 0;
  MP_TRY(manifest_int(mf, batch, "$.plan.batch", "global_batch", &global_batch, err));
  MP_TRY(manifest_int(mf, batch, "$.plan.batch", "seq_len", &seq_len, err));
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(training, "seed");
  char want[32];
  snprintf(want, sizeof want, "%" PRIu64, (uint64_t)plan->training.seed);
  if (global_batch != plan->global_batch || seq_len != plan->seq_len) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s was saved with global batch %lld x seq_len %lld, %s has %lld x %lld; "
                   "resume with the same batch (the data position depends on it)",
                   mf->path, (long long)global_batch, (long long)seq_len, plan->source,
                   (long long)plan->global_batch, (long long)plan->seq_len);
  }
  if (!cJSON_IsString(seed) || strcmp(seed->valuestring, want) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s was saved with seed %s, %s has seed %s; resume with the same seed (the "
                   "data order depends on it)",
                   mf->path, cJSON_IsString(seed) ? seed->valuestring : "?", plan->source, want);
  }
  return MP_OK;
}

mp_status mp_checkpoint_load(const char *path, const mp_checkpoint_context *ctx, int64_t *step,
                             mp_error *err) {
  float *params = NULL, *m = NULL, *v = NULL;
  size_t count = 0;
  MP_TRY(mp_trainer_cpu_state(ctx->trainer, &params, &m, &v, &count, err));
  const mp_gpt_layout *layout = mp_trainer_layout(ctx->trainer);
  manifest mf;
  mp_status status = manifest_open(path, &mf, err);
  if (status == MP_OK) status = check_model(&mf, layout, mp_model_source(ctx->model), err);
  if (status == MP_OK) status = check_run(&mf, ctx->plan, err);
  if (status == MP_OK) status = manifest_verify_files(&mf, err);
  if (status == MP_OK && mf.tp == ctx->tp_size) {
    if (mf.floats != count) {
      status = mp_fail(err, MP_ERR_INPUT, "%s: shard files hold %zu floats, this rank has %zu",
                       path, mf.floats, count);
    } else {
      status = read_shard(&mf, ctx->tp_rank, params, m, v, err);
    }
  } else if (status == MP_OK) {
    /* Resharding: the global tensors, then this rank's cut of each. */
    const size_t total = mp_gpt_layout_num_params(layout);
    float *full = malloc(3 * total * sizeof(float));
    const int n = mp_gpt_layout_num_tensors(layout);
    size_t *offsets = calloc((size_t)n, sizeof *offsets);
    size_t *counts = calloc((size_t)n, sizeof *counts);
    mp_tp_split *splits = calloc((size_t)n, sizeof *splits);
    size_t mine = 0;
    if (full == NULL || offsets == NULL || counts == NULL || splits == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory resharding %s", path);
    }
    if (status == MP_OK) status = reassemble(&mf, layout, full, full + total, full + 2 * total, err);
    if (status == MP_OK) status = shard_table(layout, ctx->tp_size, offsets, counts, splits, &mine, err);
    if (status == MP_OK && mine != count) {
      status = mp_fail(err, MP_ERR_RUNTIME, "shard of %zu floats, the trainer has %zu", mine, count);
    }
    float *outs[3] = {params, m, v};
    for (int a = 0; a < 3 && status == MP_OK; ++a) {
      for (int i = 0; i < n && status == MP_OK; ++i) {
        const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
        status = mp_tp_shard_extract(outs[a] + offsets[i], full + a * total + t->offset,
                                     splits[i], t->rows, t->cols, ctx->tp_rank, ctx->tp_size,
                                     err);
      }
    }
    free(splits);
    free(counts);
    free(offsets);
    free(full);
  }
  if (status == MP_OK) *step = mf.step;
  manifest_close(&mf);
  return status;
}

mp_status mp_checkpoint_read_params(const char *path, mp_gpt_layout **layout, float **params,
                                    int64_t *step, mp_error *err) {
  *layout = NULL;
  *params = NULL;
  manifest mf;
  mp_status status = manifest_open(path, &mf, err);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf.root, "model");
  const cJSON *description = cJSON_GetObjectItemCaseSensitive(model, "description");
  const cJSON *batch =
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mf.root, "plan"), "batch");
  int64_t seq_len = 0;
  if (status == MP_OK) status = manifest_int(&mf, batch, "$.plan.batch", "seq_len", &seq_len, err);
  if (status == MP_OK && (seq_len < 1 || seq_len > INT32_MAX)) {
    status = mp_fail(err, MP_ERR_INPUT, "%s: $.plan.batch.seq_len %lld is out of range", mf.file,
                     (long long)seq_len);
  }
  if (status == MP_OK && !cJSON_IsString(description)) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "%s/manifest.json: $.model.description is missing (the model file could "
                     "not be read when it was saved)",
                     path);
  }
  mp_model *parsed = NULL;
  char source[PATH_BYTES + 32];
  snprintf(source, sizeof source, "%s/manifest.json $.model.description", path);
  if (status == MP_OK) status = mp_model_parse_text(description->valuestring, source, &parsed, err);
  if (status == MP_OK) status = mp_gpt_layout_create(parsed, (int)seq_len, layout, err);
  if (status == MP_OK) status = check_model(&mf, *layout, source, err);
  if (status == MP_OK) status = manifest_verify_files(&mf, err);
  if (status == MP_OK) {
    *params = malloc(mp_gpt_layout_num_params(*layout) * sizeof(float));
    if (*params == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK) status = reassemble(&mf, *layout, *params, NULL, NULL, err);
  if (status == MP_OK) *step = mf.step;
  if (status != MP_OK) {
    free(*params);
    *params = NULL;
    mp_gpt_layout_free(*layout);
    *layout = NULL;
  }
  mp_model_free(parsed);
  manifest_close(&mf);
  return status;
}

mp_status mp_checkpoint_manifest_check_text(const char *text, const char *source, mp_error *err) {
  manifest mf;
  memset(&mf, 0, sizeof mf);
  snprintf(mf.path, sizeof mf.path, "%s", source);
  snprintf(mf.file, sizeof mf.file, "%s", source);
  mp_status status = manifest_parse(text, &mf, err);
  for (int r = 0; r < mf.tp && status == MP_OK; ++r) {
    const cJSON *name = NULL, *sum = NULL;
    status = shard_entry(&mf, r, &name, &sum, err);
  }
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(mf.root, "plan");
  const cJSON *batch = cJSON_GetObjectItemCaseSensitive(plan, "batch");
  int64_t global_batch = 0, seq_len = 0;
  if (status == MP_OK) {
    status = manifest_int(&mf, batch, "$.plan.batch", "global_batch", &global_batch, err);
  }
  if (status == MP_OK) status = manifest_int(&mf, batch, "$.plan.batch", "seq_len", &seq_len, err);
  if (status == MP_OK && (seq_len < 1 || seq_len > INT32_MAX)) {
    status = mp_fail(err, MP_ERR_INPUT, "%s: $.plan.batch.seq_len %lld is out of range", source,
                     (long long)seq_len);
  }
  /* The model: its description (when saved) must parse, and the shape and tensor table must be
   * those of the model it describes laid out at the saved seq_len, as export checks them. */
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(mf.root, "model");
  const cJSON *description = cJSON_GetObjectItemCaseSensitive(model, "description");
  mp_model *parsed = NULL;
  mp_gpt_layout *layout = NULL;
  char where[PATH_BYTES + 32];
  snprintf(where, sizeof where, "%s $.model.description", source);
  if (status == MP_OK && cJSON_IsString(description)) {
    status = mp_model_parse_text(description->valuestring, where, &parsed, err);
    if (status == MP_OK) status = mp_gpt_layout_create(parsed, (int)seq_len, &layout, err);
    if (status == MP_OK) status = check_model(&mf, layout, where, err);
  }
  mp_gpt_layout_free(layout);
  mp_model_free(parsed);
  manifest_close(&mf);
  return status;
}
