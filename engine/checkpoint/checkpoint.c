/* engine/checkpoint/checkpoint.c — sharded checkpoints of any dp x pp x tp layout: each rank's
 * view of its state, the checkpoints of a directory, and loads under any layout (resharded); see
 * checkpoint.h. Saving is checkpoint_save.c; the format itself (manifest parsing and checks,
 * reading shard ranges, export) is checkpoint_format.c. */
#include "engine/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/data/data_loader.h"

void ck_view_free(rank_view *view) {
  for (int c = 0; c < view->num_chunks && view->chunks != NULL; ++c) {
    free(view->chunks[c].tensors);
  }
  free(view->chunks);
  memset(view, 0, sizeof *view);
}

/* The trainer's chunks and their tensors, as the files name them. */
mp_status ck_view_create(const mp_checkpoint_context *ctx, rank_view *view, mp_error *err) {
  memset(view, 0, sizeof *view);
  mp_trainer *trainer = ctx->trainer;
  const mp_param_layout *layout = mp_trainer_layout(trainer);
  const int n = mp_param_layout_num_tensors(layout);
  const int num_chunks = mp_trainer_num_chunks(trainer);
  view->layout = layout;
  view->trainer = trainer;
  view->num_chunks = num_chunks;
  view->chunks = calloc((size_t)(num_chunks > 0 ? num_chunks : 1), sizeof *view->chunks);
  if (view->chunks == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = MP_OK;
  for (int c = 0; c < num_chunks && status == MP_OK; ++c) {
    view_chunk *chunk = &view->chunks[c];
    mp_trainer_chunk_state state;
    status = mp_trainer_chunk_state_of(trainer, c, &state, err);
    if (status != MP_OK) break;
    const mp_stage_layout *stage_layout = mp_trainer_chunk_layout(trainer, c);
    chunk->index = c;
    chunk->count = state.params_count;
    chunk->first = state.moments_first;
    chunk->moments = state.moments_count;
    chunk->stage = *mp_stage_layout_span(stage_layout);
    chunk->stage_index = c * ctx->plan->pp + ctx->pp_rank;
    mp_stage_layout_tp(stage_layout, &view->tp_rank, &view->tp_size);
    const int count = mp_stage_layout_num_tensors(stage_layout);
    chunk->tensors = calloc((size_t)(count > 0 ? count : 1), sizeof *chunk->tensors);
    if (chunk->tensors == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
      break;
    }
    int cursor = 0; /* the chunk's tensors come in the layout's order */
    for (int j = 0; j < count && status == MP_OK; ++j) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(stage_layout, j);
      while (cursor < n &&
             strcmp(mp_param_layout_tensor(layout, cursor)->name, t->full->name) != 0) {
        ++cursor;
      }
      if (cursor == n) {
        status = mp_fail(err, MP_ERR_RUNTIME, "chunk %d: tensor %s is not in the model's layout",
                         c, t->full->name);
        break;
      }
      view_tensor *vt = &chunk->tensors[chunk->num_tensors++];
      vt->global = cursor;
      vt->offset = t->offset;
      vt->count = t->count;
      vt->split = t->split;
      vt->tied_copy = t->tied_copy;
      vt->ep_rank = t->ep_rank;
      vt->ep_size = t->ep_size;
      mp_stage_layout_held_params(stage_layout, j, &vt->held_first, &vt->held_count);
    }
    chunk->sharded_params = mp_stage_layout_sharded_params(stage_layout);
  }
  if (status != MP_OK) ck_view_free(view);
  return status;
}

mp_status mp_checkpoint_check_trainer(const mp_checkpoint_context *ctx, mp_error *err) {
  rank_view view;
  MP_TRY(ck_view_create(ctx, &view, err));
  ck_view_free(&view);
  return MP_OK;
}

int ck_list_checkpoints(const char *dir, int64_t *steps, int max) {
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

/* True when path/manifest.json is a checkpoint manifest; run_id (run_id_bytes) gets the id of
 * the run that saved it, "" for a manifest older than run ids. */
bool ck_read_manifest_run(const char *path, char *run_id, size_t run_id_bytes) {
  char file[CK_PATH_BYTES];
  snprintf(file, sizeof file, "%s/manifest.json", path);
  if (run_id_bytes > 0) run_id[0] = '\0';
  char *text = ck_read_text(file);
  if (text == NULL) return false;
  cJSON *root = cJSON_Parse(text);
  free(text);
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
  const bool ok = cJSON_IsString(format) && strcmp(format->valuestring, CK_FORMAT_NAME) == 0;
  const cJSON *run = cJSON_GetObjectItemCaseSensitive(root, "run");
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(run, "id");
  if (ok && cJSON_IsString(id) && run_id_bytes > 0) {
    snprintf(run_id, run_id_bytes, "%s", id->valuestring);
  }
  cJSON_Delete(root);
  return ok;
}

bool ck_has_manifest(const char *path) { return ck_read_manifest_run(path, NULL, 0); }

mp_status mp_checkpoint_find_latest(const char *dir, char *path, size_t path_bytes,
                                    int64_t *step, mp_error *err) {
  int64_t *steps = malloc(CK_MAX_LISTED * sizeof *steps);
  if (steps == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const int n = ck_list_checkpoints(dir, steps, CK_MAX_LISTED);
  for (int i = 0; i < n; ++i) {
    snprintf(path, path_bytes, "%s/step-%lld", dir, (long long)steps[i]);
    if (ck_has_manifest(path)) {
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

mp_status mp_checkpoint_resolve(const char *dir, const char *option, char *path,
                                size_t path_bytes, int64_t *step, mp_error *err) {
  snprintf(path, path_bytes, "%s/manifest.json", dir);
  if (access(path, F_OK) == 0) {
    snprintf(path, path_bytes, "%s", dir);
    return MP_OK;
  }
  if (mp_checkpoint_find_latest(dir, path, path_bytes, step, err) == MP_OK) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s %s: neither a checkpoint (no manifest.json) nor a directory of checkpoints "
                 "(no step-<N> with a valid manifest.json)",
                 option, dir);
}

/* Elements [first, first + count) of array `array` (0 parameters, 1 and 2 the moments) of
 * tensor t's shard in the checkpoint into the trainer's chunk, from its flat element `dest`, in
 * pieces of CK_PIECE_FLOATS through piece. */
static mp_status read_into(ck_shard_reader *reader, const rank_view *view,
                           const view_chunk *chunk, const view_tensor *t, int array, size_t first,
                           size_t count, size_t dest, float *piece, mp_error *err) {
  static const mp_trainer_array kArrays[3] = {MP_TRAINER_PARAMS, MP_TRAINER_ADAM_M,
                                               MP_TRAINER_ADAM_V};
  for (size_t at = 0; at < count; at += CK_PIECE_FLOATS) {
    const size_t n = count - at < CK_PIECE_FLOATS ? count - at : CK_PIECE_FLOATS;
    /* An ep rank's experts are a run of rows of the saved (whole) tensor. */
    const size_t from = first + at + (size_t)t->ep_rank * t->count;
    MP_TRY(ck_read_shard(reader, t->global, array, view->tp_rank, view->tp_size, from, n, piece,
                         err));
    MP_TRY(mp_trainer_write_state(view->trainer, chunk->index, kArrays[array], dest + at, n, piece,
                                  err));
  }
  return MP_OK;
}

/* Fills this rank's chunks: parameters, and the moments of the elements it keeps. */
static mp_status read_view(ck_shard_reader *reader, const rank_view *view, float *piece,
                           mp_error *err) {
  for (int c = 0; c < view->num_chunks; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    const size_t lo = chunk->first, hi = chunk->first + chunk->moments;
    for (int j = 0; j < chunk->num_tensors; ++j) {
      const view_tensor *t = &chunk->tensors[j];
      /* The parameters it keeps: all of them, or with ZeRO-3 a block tensor's part. */
      MP_TRY(read_into(reader, view, chunk, t, 0, t->held_first, t->held_count,
                       t->offset + t->held_first, piece, err));
      /* The moments of the part of the tensor this dp rank keeps (all of it without ZeRO-1). */
      const size_t a = t->offset > lo ? t->offset : lo;
      const size_t b = t->offset + t->count < hi ? t->offset + t->count : hi;
      if (a >= b) continue;
      for (int array = 1; array <= 2; ++array) {
        MP_TRY(read_into(reader, view, chunk, t, array, a - t->offset, b - a, a, piece, err));
      }
    }
  }
  return MP_OK;
}

/* The data order a checkpoint's batches were drawn in (data_loader.h): $.data.order, or 1 (the
 * Fisher-Yates shuffle) in manifests written before the order was recorded. */
static mp_status check_data_order(const ck_manifest *mf, mp_error *err) {
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(mf->root, "data");
  const cJSON *order = cJSON_GetObjectItemCaseSensitive(data, "order");
  int64_t saved = MP_DATA_ORDER_FISHER_YATES;
  if (order != NULL) {
    if (!cJSON_IsNumber(order) || order->valuedouble != (double)(int64_t)order->valuedouble) {
      return mp_fail(err, MP_ERR_INPUT, "%s: $.data.order must be a whole number", mf->file);
    }
    saved = (int64_t)order->valuedouble;
  }
  if (saved == MP_DATA_ORDER_VERSION) return MP_OK;
  if (saved > MP_DATA_ORDER_VERSION) {
    return mp_fail(err, MP_ERR_INPUT,
                   "checkpoint %s was written with data order %lld; this mpengine reads data "
                   "order %d (%s) only: resume it with the newer mpengine that wrote it",
                   mf->path, (long long)saved, MP_DATA_ORDER_VERSION, MP_DATA_ORDER_NAME);
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "checkpoint %s was written with data order %lld%s; this mpengine reads data "
                 "order %d (%s), which draws other batches from the same seed, so the run cannot "
                 "continue exactly. Finish that run with the mpengine that wrote it, or start a "
                 "new run from its weights: `mpengine export --checkpoint %s --out model.bin` "
                 "(or `--format hf --out HF_DIR`), then `mpengine run --init-from` that file or "
                 "directory",
                 mf->path, (long long)saved,
                 saved == MP_DATA_ORDER_FISHER_YATES ? " (Fisher-Yates)" : "",
                 MP_DATA_ORDER_VERSION, MP_DATA_ORDER_NAME, mf->path);
}

/* A resume continues the saved run: the same batch and seed (the data order depends on them),
 * and unless override_training the same training settings (ck_training_keys), every one that
 * differs named with both values. A flat plan's missing setting is not compared. */
static mp_status check_run(const ck_manifest *mf, const mp_plan *plan, bool override_training,
                           mp_error *err) {
  const ck_saved_plan *saved = &mf->plan;
  MP_TRY(check_data_order(mf, err));
  if (saved->global_batch != plan->global_batch || saved->seq_len != plan->seq_len) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s was saved with global batch %lld x seq_len %lld, %s has %lld x %lld; "
                   "resume with the same batch (the data position depends on it)",
                   mf->path, (long long)saved->global_batch, (long long)saved->seq_len,
                   plan->source, (long long)plan->global_batch, (long long)plan->seq_len);
  }
  if (!saved->has_seed || saved->seed != plan->training.seed) {
    char was[32] = "?";
    if (saved->has_seed) snprintf(was, sizeof was, "%" PRIu64, saved->seed);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s was saved with seed %s, %s has seed %" PRIu64 "; resume with the same "
                   "seed (the data order depends on it)",
                   mf->path, was, plan->source, (uint64_t)plan->training.seed);
  }
  if (override_training) return MP_OK;
  /* Every field that differs, with both values: a changed --steps or learning rate silently
   * bends the learning-rate curve of a resumed run. */
  double now[CK_TRAINING_SETTINGS];
  ck_training_values(&plan->training, now);
  char differs[MP_ERROR_MESSAGE_BYTES / 2] = "";
  size_t used = 0;
  int count = 0;
  for (int i = 0; i < CK_TRAINING_SETTINGS; ++i) {
    const double was = saved->training[i];
    if (isnan(was) || was == now[i]) continue;
    const int wrote = snprintf(differs + used, sizeof differs - used, "%s%s %.9g (now %.9g)",
                               count > 0 ? ", " : "", ck_training_keys[i], was, now[i]);
    if (wrote > 0 && (size_t)wrote < sizeof differs - used) used += (size_t)wrote;
    ++count;
  }
  if (count > 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s was saved with other training settings than %s (with --steps): %s; "
                   "resume with the same settings, or give --override-training to continue "
                   "with the new ones (the learning-rate curve changes from here on)",
                   mf->path, plan->source, differs);
  }
  return MP_OK;
}

void mp_checkpoint_new_run_id(char *out, size_t out_bytes) {
  uint64_t bits = 0;
  const int fd = open("/dev/urandom", O_RDONLY);
  const bool got = fd >= 0 && read(fd, &bits, sizeof bits) == (ssize_t)sizeof bits;
  if (fd >= 0) close(fd);
  if (!got) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    bits = ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec ^ ((uint64_t)getpid() << 16);
  }
  snprintf(out, out_bytes, "%016" PRIx64, bits);
}

mp_status mp_checkpoint_run_id(const char *path, char *out, size_t out_bytes, mp_error *err) {
  if (!ck_read_manifest_run(path, out, out_bytes)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: no checkpoint manifest (manifest.json)", path);
  }
  return MP_OK;
}

mp_status mp_checkpoint_check_dir(const char *dir, mp_error *err) {
  int64_t *steps = malloc(CK_MAX_LISTED * sizeof *steps);
  if (steps == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const int n = ck_list_checkpoints(dir, steps, CK_MAX_LISTED);
  /* The oldest few by name, and the run of the oldest. */
  enum { NAMED = 8 };
  char names[NAMED * 32 + 8] = "";
  size_t used = 0;
  int complete = 0;
  char run_id[MP_CHECKPOINT_RUN_ID_BYTES] = "";
  for (int i = n - 1; i >= 0; --i) { /* oldest first */
    char path[CK_PATH_BYTES];
    snprintf(path, sizeof path, "%s/step-%lld", dir, (long long)steps[i]);
    char id[MP_CHECKPOINT_RUN_ID_BYTES];
    if (!ck_read_manifest_run(path, id, sizeof id)) continue;
    if (complete == 0) snprintf(run_id, sizeof run_id, "%s", id);
    if (complete < NAMED) {
      used += (size_t)snprintf(names + used, sizeof names - used, "%sstep-%lld",
                               complete > 0 ? ", " : "", (long long)steps[i]);
    } else if (complete == NAMED) {
      used += (size_t)snprintf(names + used, sizeof names - used, ", ...");
    }
    ++complete;
  }
  free(steps);
  if (complete == 0) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "--checkpoint-dir %s holds %d checkpoint%s of another run (%s%s%s); a new run "
                 "would replace some and leave the others. Continue that run with --resume, or "
                 "choose another --checkpoint-dir",
                 dir, complete, complete == 1 ? "" : "s", names,
                 run_id[0] != '\0' ? ", run " : "", run_id);
}

mp_status mp_checkpoint_load(const char *path, const mp_checkpoint_context *ctx, int64_t *step,
                             mp_error *err) {
  mp_comm *world = ctx->world;
  const int world_rank = world != NULL ? mp_comm_rank(world) : 0;
  const int world_size = world != NULL ? mp_comm_size(world) : 1;
  rank_view view;
  ck_manifest mf;
  memset(&mf, 0, sizeof mf);
  mp_status status = ck_view_create(ctx, &view, err);
  const bool have_view = status == MP_OK;
  if (status == MP_OK) status = ck_manifest_open(path, &mf, err);
  if (status == MP_OK) status = ck_check_model(&mf, view.layout, mp_model_source(ctx->model), err);
  if (status == MP_OK) status = check_run(&mf, ctx->plan, ctx->override_training, err);
  status = mp_comm_agree(world, status, err);
  /* The files' checksums, spread over the ranks. */
  if (status == MP_OK) status = ck_verify_files(&mf, world_rank, world_size, err);
  status = mp_comm_agree(world, status, err);
  ck_shard_reader reader = {NULL, NULL};
  if (status == MP_OK) status = ck_reader_open(&mf, &reader, err);
  float *piece = status == MP_OK ? malloc(CK_PIECE_FLOATS * sizeof(float)) : NULL;
  if (status == MP_OK && piece == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory reading a checkpoint");
  }
  if (status == MP_OK) status = read_view(&reader, &view, piece, err);
  free(piece);
  if (reader.handles != NULL) ck_reader_close(&reader);
  status = mp_comm_agree(world, status, err);
  if (status == MP_OK) *step = mf.step;
  ck_manifest_close(&mf);
  if (have_view) ck_view_free(&view);
  return status;
}

