/* engine/checkpoint.c — sharded checkpoints of any dp x pp x tp layout: crash-safe saves, exact
 * resume, resharding to any other layout, and the global parameters for export; see
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
#include <sys/types.h>
#include <unistd.h>

#include "engine/gpt_model_tp.h"
#include "tensor_parallel/shard.h"

#define SHARD_MAGIC_V1 "MPCKSHD1"
#define SHARD_MAGIC_V2 "MPCKSHD2"
enum {
  SHARD_HEADER_BYTES = 32,
  PATH_BYTES = 4096,
  FORMAT_VERSION = 2,
  MAX_GRID = 4096,       /* dp, pp, tp each at most this in a manifest */
  MAX_FILES = 1 << 16,   /* pp x tp files at most */
  FILE_NAME_BYTES = 256, /* a shard file's name */
};
static const char *const FORMAT_NAME = "mpengine-checkpoint";
static const size_t NOT_HELD = (size_t)-1;

/* ---- files ---- */

/* FNV-1a 64, continued over bytes. */
static uint64_t fnv1a64(uint64_t hash, const unsigned char *bytes, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}
static const uint64_t FNV_OFFSET = 14695981039346656037ull;

mp_status mp_checkpoint_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes,
                                      mp_error *err) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open the shard file: %s", path,
                   strerror(errno));
  }
  uint64_t hash = FNV_OFFSET, total = 0;
  unsigned char buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, file)) > 0) {
    hash = fnv1a64(hash, buffer, got);
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

static char *hex64(char out[17], uint64_t value) {
  snprintf(out, 17, "%016" PRIx64, value);
  return out;
}

static void shard_file_name(char *out, size_t bytes, int pp_rank, int tp_rank) {
  snprintf(out, bytes, "pp-%05d-tp-%05d.bin", pp_rank, tp_rank);
}

/* ---- agreement over the world ---- */

/* Every rank returns the status and message of the lowest world rank whose status is not MP_OK,
 * or MP_OK when there is none, so all ranks stop (or go on) together and rank 0 can print the
 * reason. Collective over world; with world NULL returns status. */
static mp_status agree(mp_comm *world, mp_status status, mp_error *err) {
  if (world == NULL) return status;
  const int size = mp_comm_size(world);
  float *flags = malloc((size_t)size * sizeof(float));
  mp_error mine = MP_ERROR_INITIALIZER;
  if (status != MP_OK) {
    if (err != NULL) mine = *err;
    mine.status = status;
  }
  if (flags == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const float flag = status != MP_OK ? 1.0f : 0.0f;
  mp_status comm = mp_comm_all_gather_f32(world, &flag, flags, 1, err);
  int first = -1;
  for (int r = 0; r < size && comm == MP_OK && first < 0; ++r) {
    if (flags[r] != 0.0f) first = r;
  }
  free(flags);
  if (comm != MP_OK) return comm;
  if (first < 0) return MP_OK;
  comm = mp_comm_broadcast(world, &mine, sizeof mine, first, err);
  if (comm != MP_OK) return comm;
  if (err != NULL) *err = mine;
  return mine.status != MP_OK ? mine.status : MP_ERR_RUNTIME;
}

/* ---- this rank's state: its chunks and their tensors ---- */

typedef struct {
  int global;          /* index in the one-rank layout */
  size_t offset;       /* floats from the start of the chunk's arrays */
  size_t count;        /* floats of this rank's shard */
  mp_tp_split split;
  bool tied_copy;      /* the last stage's copy of wte: not saved, loaded from wte */
} view_tensor;

typedef struct {
  float *params;       /* (count) */
  size_t count;
  float *m, *v;        /* AdamW moments of elements [first, first + moments) of params */
  size_t first, moments;
  int num_tensors;
  view_tensor *tensors;
  mp_gpt_stage stage;  /* the piece of the chain it holds */
  int stage_index;     /* c x pp + pp rank */
} view_chunk;

typedef struct {
  const mp_gpt_layout *layout;
  int num_chunks;
  view_chunk *chunks;
  int tp_rank, tp_size;
} rank_view;

static void view_free(rank_view *view) {
  for (int c = 0; c < view->num_chunks && view->chunks != NULL; ++c) {
    free(view->chunks[c].tensors);
  }
  free(view->chunks);
  memset(view, 0, sizeof *view);
}

/* The trainer's state as chunks: a parallel run's chunks (mp_trainer_chunk_cpu_state), or the
 * one-rank model as one chunk at tp = 1 (host copies on the CUDA backend). */
static mp_status view_create(const mp_checkpoint_context *ctx, rank_view *view, mp_error *err) {
  memset(view, 0, sizeof *view);
  mp_trainer *trainer = ctx->trainer;
  const mp_gpt_layout *layout = mp_trainer_layout(trainer);
  const int n = mp_gpt_layout_num_tensors(layout);
  const int num_chunks = mp_trainer_num_chunks(trainer);
  view->layout = layout;
  view->num_chunks = num_chunks > 0 ? num_chunks : 1;
  view->chunks = calloc((size_t)view->num_chunks, sizeof *view->chunks);
  if (view->chunks == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = MP_OK;
  if (num_chunks == 0) {
    view_chunk *chunk = &view->chunks[0];
    size_t count = 0;
    status = mp_trainer_cpu_state(trainer, &chunk->params, &chunk->m, &chunk->v, &count, err);
    chunk->count = chunk->moments = count;
    chunk->tensors = status == MP_OK ? calloc((size_t)n, sizeof *chunk->tensors) : NULL;
    if (status == MP_OK && chunk->tensors == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
    for (int i = 0; i < n && status == MP_OK; ++i) {
      const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
      view_tensor *vt = &chunk->tensors[chunk->num_tensors++];
      vt->global = i;
      vt->offset = t->offset;
      vt->count = t->rows * t->cols;
      vt->split = t->split;
    }
    chunk->stage = mp_gpt_stage_whole(mp_gpt_layout_config(layout)->num_layers);
    view->tp_rank = 0;
    view->tp_size = 1;
    if (status != MP_OK) view_free(view);
    return status;
  }
  for (int c = 0; c < num_chunks && status == MP_OK; ++c) {
    view_chunk *chunk = &view->chunks[c];
    mp_trainer_chunk_state state;
    status = mp_trainer_chunk_cpu_state(trainer, c, &state, err);
    if (status != MP_OK) break;
    mp_gpt_tp *gpt = mp_trainer_chunk(trainer, c);
    chunk->params = state.params;
    chunk->count = state.params_count;
    chunk->m = state.adam_m;
    chunk->v = state.adam_v;
    chunk->first = state.moments_first;
    chunk->moments = state.moments_count;
    chunk->stage = *mp_gpt_tp_stage(gpt);
    chunk->stage_index = c * ctx->plan->pp + ctx->pp_rank;
    view->tp_rank = mp_gpt_tp_comm(gpt)->rank;
    view->tp_size = mp_gpt_tp_comm(gpt)->size;
    const int count = mp_gpt_tp_num_tensors(gpt);
    chunk->tensors = calloc((size_t)(count > 0 ? count : 1), sizeof *chunk->tensors);
    if (chunk->tensors == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
      break;
    }
    int cursor = 0; /* the chunk's tensors come in the layout's order */
    for (int j = 0; j < count && status == MP_OK; ++j) {
      const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(gpt, j);
      while (cursor < n && strcmp(mp_gpt_layout_tensor(layout, cursor)->name, t->full->name) != 0) {
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
    }
  }
  if (status != MP_OK) view_free(view);
  return status;
}

mp_status mp_checkpoint_check_trainer(const mp_checkpoint_context *ctx, mp_error *err) {
  rank_view view;
  MP_TRY(view_create(ctx, &view, err));
  view_free(&view);
  return MP_OK;
}

/* ---- saving ---- */

/* What a writer tells world rank 0 about its file; followed on the wire by `num_tensors` int32
 * global tensor indices (in file order) and 5 int32 per chunk (stage index, embedding,
 * first_layer, num_layers, final_norm | head << 1). */
typedef struct {
  int32_t status; /* mp_status of the writer */
  int32_t num_tensors, num_chunks, pad;
  uint64_t checksum, bytes, floats;
  char message[MP_ERROR_MESSAGE_BYTES];
} file_record;

enum { CHUNK_INTS = 5 };

static size_t record_bytes(int num_tensors, int max_chunks) {
  return sizeof(file_record) + ((size_t)num_tensors + (size_t)CHUNK_INTS * (size_t)max_chunks) *
                                   sizeof(int32_t);
}

static int32_t *record_tensors(file_record *record) { return (int32_t *)(record + 1); }
static int32_t *record_chunks(file_record *record, int num_tensors) {
  return record_tensors(record) + num_tensors;
}

/* A file being written, with its FNV-1a 64 as it goes. */
typedef struct {
  mp_atomic_file file;
  bool open;
  uint64_t hash, bytes;
} hashed_file;

static void put(hashed_file *out, const void *data, size_t bytes) {
  if (!out->open) return;
  mp_atomic_file_write(&out->file, data, bytes);
  out->hash = fnv1a64(out->hash, data, bytes);
  out->bytes += bytes;
}

/* ZeRO-1 moments travel to dp rank 0 in pieces of at most this many floats, so no rank holds
 * more than its own part and one piece. */
enum { MOMENT_PIECE_FLOATS = 1 << 18 };

/* With ZeRO-1, every dp rank's part of chunk c's moments array (array 0: first moments, 1:
 * second) meets on dp rank 0: the others send (first, count), then the floats in pieces, in chunk
 * order, first moments of every chunk before second moments. */
static mp_status send_moments(const mp_checkpoint_context *ctx, const rank_view *view,
                              mp_error *err) {
  for (int a = 0; a < 2; ++a) {
    for (int c = 0; c < view->num_chunks; ++c) {
      const view_chunk *chunk = &view->chunks[c];
      const uint64_t part[2] = {chunk->first, chunk->moments};
      MP_TRY(mp_comm_send(ctx->dp, part, sizeof part, 0, err));
      const float *moments = a == 0 ? chunk->m : chunk->v;
      for (size_t at = 0; at < chunk->moments; at += MOMENT_PIECE_FLOATS) {
        const size_t n = chunk->moments - at < MOMENT_PIECE_FLOATS ? chunk->moments - at
                                                                   : MOMENT_PIECE_FLOATS;
        MP_TRY(mp_comm_send(ctx->dp, moments + at, n * sizeof(float), 0, err));
      }
    }
  }
  return MP_OK;
}

/* Writes elements [at, at + count) of a chunk's flat array (data) into the file, leaving out the
 * tied copy of wte: called in increasing order over the whole array, it writes the chunk's saved
 * tensors in order. */
static void put_flat(hashed_file *out, const view_chunk *chunk, size_t at, const float *data,
                     size_t count) {
  for (int j = 0; j < chunk->num_tensors; ++j) {
    const view_tensor *t = &chunk->tensors[j];
    if (t->tied_copy) continue;
    const size_t lo = t->offset > at ? t->offset : at;
    const size_t hi = t->offset + t->count < at + count ? t->offset + t->count : at + count;
    if (lo < hi) put(out, data + (lo - at), (hi - lo) * sizeof(float));
  }
}

/* dp rank 0's side: writes chunk's whole moments array `array` into out, its own part from memory
 * and every other dp rank's as it arrives, piece by piece (piece: MOMENT_PIECE_FLOATS floats). */
static mp_status stream_moments(const mp_checkpoint_context *ctx, const view_chunk *chunk,
                                int array, float *piece, hashed_file *out, mp_error *err) {
  size_t covered = 0;
  for (int d = 0; d < ctx->plan->dp; ++d) {
    uint64_t part[2] = {chunk->first, chunk->moments};
    if (d > 0) MP_TRY(mp_comm_recv(ctx->dp, part, sizeof part, d, err));
    if (part[0] != covered || part[1] > chunk->count - covered) {
      return mp_fail(err, MP_ERR_RUNTIME,
                     "ZeRO-1 moments of dp rank %d: elements [%" PRIu64 ", +%" PRIu64
                     ") do not follow the %zu before them in a chunk of %zu",
                     d, part[0], part[1], covered, chunk->count);
    }
    for (size_t at = 0; at < part[1]; at += MOMENT_PIECE_FLOATS) {
      const size_t n = part[1] - at < MOMENT_PIECE_FLOATS ? part[1] - at : MOMENT_PIECE_FLOATS;
      const float *data = (array == 0 ? chunk->m : chunk->v) + at;
      if (d > 0) {
        MP_TRY(mp_comm_recv(ctx->dp, piece, n * sizeof(float), d, err));
        data = piece;
      }
      put_flat(out, chunk, covered + at, data, n);
    }
    covered += part[1];
  }
  if (covered != chunk->count) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "ZeRO-1 moments: the dp ranks' parts cover %zu of %zu elements", covered,
                   chunk->count);
  }
  return MP_OK;
}

/* dp rank 0 of (pp_rank, tp_rank): writes its file into tmp_dir and fills record (always, with
 * the status and message on failure). */
static mp_status write_shard_file(const mp_checkpoint_context *ctx, const rank_view *view,
                                  const char *tmp_dir, int64_t step, bool zero,
                                  file_record *record, mp_error *err) {
  char name[FILE_NAME_BYTES], path[PATH_BYTES];
  shard_file_name(name, sizeof name, ctx->pp_rank, view->tp_rank);
  snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
  int32_t *tensors = record_tensors(record);
  uint64_t floats = 0;
  int k = 0;
  for (int c = 0; c < view->num_chunks; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    for (int j = 0; j < chunk->num_tensors; ++j) {
      if (chunk->tensors[j].tied_copy) continue;
      tensors[k++] = chunk->tensors[j].global;
      floats += chunk->tensors[j].count;
    }
  }
  record->num_tensors = k;
  record->num_chunks = view->num_chunks;
  int32_t *chunks = record_chunks(record, k);
  for (int c = 0; c < view->num_chunks; ++c) {
    const mp_gpt_stage *s = &view->chunks[c].stage;
    int32_t *out = chunks + CHUNK_INTS * c;
    out[0] = view->chunks[c].stage_index;
    out[1] = s->embedding;
    out[2] = s->first_layer;
    out[3] = s->num_layers;
    out[4] = (s->final_norm ? 1 : 0) | (s->head ? 2 : 0);
  }
  hashed_file out = {.hash = FNV_OFFSET};
  mp_status status = mp_atomic_file_open(&out.file, path, err);
  out.open = status == MP_OK;
  unsigned char header[SHARD_HEADER_BYTES] = {0};
  memcpy(header, SHARD_MAGIC_V2, 8);
  const uint32_t pp32 = (uint32_t)ctx->pp_rank, tp32 = (uint32_t)view->tp_rank;
  const uint64_t step64 = (uint64_t)step;
  memcpy(header + 8, &pp32, 4);
  memcpy(header + 12, &tp32, 4);
  memcpy(header + 16, &floats, 8);
  memcpy(header + 24, &step64, 8);
  put(&out, header, sizeof header);
  for (int c = 0; c < view->num_chunks; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    for (int j = 0; j < chunk->num_tensors; ++j) {
      const view_tensor *t = &chunk->tensors[j];
      if (!t->tied_copy) put(&out, chunk->params + t->offset, t->count * sizeof(float));
    }
  }
  /* The moments. With ZeRO-1 the other dp ranks' sends must be received even when this file
   * cannot be written, or they would wait for nothing. */
  mp_status comm = MP_OK;
  float *piece = NULL;
  if (zero && (piece = malloc(MOMENT_PIECE_FLOATS * sizeof(float))) == NULL) {
    comm = mp_fail(err, MP_ERR_RUNTIME, "out of memory gathering ZeRO-1 moments");
  }
  for (int a = 0; a < 2 && comm == MP_OK; ++a) {
    for (int c = 0; c < view->num_chunks && comm == MP_OK; ++c) {
      const view_chunk *chunk = &view->chunks[c];
      if (zero) {
        comm = stream_moments(ctx, chunk, a, piece, &out, err);
      } else if (chunk->first != 0 || chunk->moments != chunk->count) {
        comm = mp_fail(err, MP_ERR_RUNTIME,
                       "chunk %d keeps moments of elements [%zu, +%zu) of %zu without ZeRO-1", c,
                       chunk->first, chunk->moments, chunk->count);
      } else {
        put_flat(&out, chunk, 0, a == 0 ? chunk->m : chunk->v, chunk->count);
      }
    }
  }
  free(piece);
  if (comm != MP_OK) {
    if (out.open) mp_atomic_file_abort(&out.file);
    status = comm;
  } else if (status == MP_OK) {
    status = mp_atomic_file_commit(&out.file, err);
  }
  record->status = status;
  record->checksum = out.hash;
  record->bytes = out.bytes;
  record->floats = floats;
  snprintf(record->message, sizeof record->message, "%s", status != MP_OK ? err->message : "");
  return status;
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

/* The manifest's header sections: step, plan, model, data, RNG, learning-rate schedule. */
static void manifest_header(cJSON *root, const mp_checkpoint_context *ctx,
                            const mp_gpt_layout *layout, int64_t step) {
  const mp_plan *plan = ctx->plan;
  cJSON_AddStringToObject(root, "format", FORMAT_NAME);
  cJSON_AddNumberToObject(root, "version", FORMAT_VERSION);
  cJSON_AddNumberToObject(root, "step", (double)step);

  cJSON *p = cJSON_AddObjectToObject(root, "plan");
  cJSON_AddStringToObject(p, "source", plan->source);
  cJSON_AddNumberToObject(p, "dp", plan->dp);
  cJSON_AddNumberToObject(p, "pp", plan->pp);
  cJSON_AddNumberToObject(p, "tp", plan->tp);
  cJSON_AddNumberToObject(p, "virtual_stages", plan->virtual_stages);
  cJSON_AddNumberToObject(p, "zero_stage", plan->zero_stage);
  cJSON_AddBoolToObject(p, "sequence_parallel", plan->sequence_parallel);
  cJSON_AddStringToObject(p, "schedule", plan->schedule);
  if (plan->num_stage_counts > 0) {
    cJSON_AddItemToObject(p, "layers_per_stage",
                          cJSON_CreateIntArray(plan->layers_per_stage, plan->num_stage_counts));
  }
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
}

/* World rank 0: the manifest from every file's record (file f = pp rank x tp + tp rank). */
static mp_status build_manifest(const mp_checkpoint_context *ctx, const mp_gpt_layout *layout,
                                int64_t step, file_record *const *records, cJSON **out,
                                mp_error *err) {
  const int pp = ctx->plan->pp, tp = ctx->plan->tp, num_files = pp * tp;
  const int n = mp_gpt_layout_num_tensors(layout);
  /* offsets[f * n + i]: where tensor i sits in file f's arrays, or NOT_HELD. */
  size_t *offsets = malloc((size_t)num_files * (size_t)n * sizeof *offsets);
  if (offsets == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory writing the manifest");
  mp_status status = MP_OK;
  for (int f = 0; f < num_files && status == MP_OK; ++f) {
    size_t *mine = offsets + (size_t)f * (size_t)n;
    for (int i = 0; i < n; ++i) mine[i] = NOT_HELD;
    size_t offset = 0;
    const int32_t *list = record_tensors((file_record *)records[f]);
    for (int k = 0; k < records[f]->num_tensors && status == MP_OK; ++k) {
      const int i = list[k];
      mp_tp_split split;
      if (i < 0 || i >= n || mine[i] != NOT_HELD) {
        status = mp_fail(err, MP_ERR_RUNTIME, "file %d lists tensor %d twice or out of range", f,
                         i);
        break;
      }
      const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
      split = t->split;
      mine[i] = offset;
      offset += mp_tp_shard_floats(split, t->rows, t->cols, tp);
    }
    if (status == MP_OK && offset != records[f]->floats) {
      status = mp_fail(err, MP_ERR_RUNTIME, "file %d: %zu floats listed, %" PRIu64 " written", f,
                       offset, records[f]->floats);
    }
  }
  cJSON *root = cJSON_CreateObject();
  manifest_header(root, ctx, layout, step);
  cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
  char name[FILE_NAME_BYTES];
  for (int i = 0; i < n && status == MP_OK; ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
    const mp_tp_split split = t->split;
    int holder = -1, holders = 0;
    for (int p = 0; p < pp; ++p) {
      int count = 0;
      for (int r = 0; r < tp; ++r) count += offsets[(size_t)(p * tp + r) * n + i] != NOT_HELD;
      if (count == 0) continue;
      ++holders;
      holder = count == tp ? p : -1;
    }
    if (holders != 1 || holder < 0) {
      status = mp_fail(err, MP_ERR_RUNTIME,
                       "tensor %s: saved by %d pipeline ranks' files (want exactly one, from "
                       "every tp rank)",
                       t->name, holders);
      break;
    }
    cJSON *item = cJSON_CreateObject();
    cJSON_AddItemToArray(tensors, item);
    cJSON_AddStringToObject(item, "name", t->name);
    const int shape[2] = {(int)t->rows, (int)t->cols};
    cJSON_AddItemToObject(item, "shape", cJSON_CreateIntArray(shape, 2));
    cJSON_AddStringToObject(item, "split", mp_tp_split_name(split));
    cJSON_AddNumberToObject(item, "pp_rank", holder);
    cJSON *shards = cJSON_AddArrayToObject(item, "shards");
    const size_t floats = mp_tp_shard_floats(split, t->rows, t->cols, tp);
    for (int r = 0; r < tp && status == MP_OK; ++r) {
      mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
      int num_blocks = 0;
      status = mp_tp_shard_blocks(split, t->rows, t->cols, r, tp, blocks, &num_blocks, err);
      if (status != MP_OK) break;
      cJSON *shard = cJSON_CreateObject();
      cJSON_AddItemToArray(shards, shard);
      shard_file_name(name, sizeof name, holder, r);
      cJSON_AddStringToObject(shard, "file", name);
      cJSON_AddNumberToObject(shard, "tp_rank", r);
      cJSON_AddNumberToObject(shard, "float_offset",
                              (double)offsets[(size_t)(holder * tp + r) * n + i]);
      cJSON_AddNumberToObject(shard, "floats", (double)floats);
      cJSON *list = cJSON_AddArrayToObject(shard, "blocks");
      for (int b = 0; b < num_blocks; ++b) {
        const int block[4] = {(int)blocks[b].row_offset, (int)blocks[b].col_offset,
                              (int)blocks[b].rows, (int)blocks[b].cols};
        cJSON_AddItemToArray(list, cJSON_CreateIntArray(block, 4));
      }
    }
  }
  cJSON *files = cJSON_AddArrayToObject(root, "shards");
  for (int f = 0; f < num_files && status == MP_OK; ++f) {
    const file_record *record = records[f];
    const int p = f / tp, r = f % tp;
    char hex[17];
    shard_file_name(name, sizeof name, p, r);
    cJSON *file = cJSON_CreateObject();
    cJSON_AddItemToArray(files, file);
    cJSON_AddStringToObject(file, "file", name);
    cJSON_AddNumberToObject(file, "pp_rank", p);
    cJSON_AddNumberToObject(file, "tp_rank", r);
    cJSON_AddNumberToObject(file, "tp_size", tp);
    cJSON *stages = cJSON_AddArrayToObject(file, "stages");
    const int32_t *chunks = record_chunks((file_record *)record, record->num_tensors);
    for (int c = 0; c < record->num_chunks; ++c) {
      const int32_t *s = chunks + CHUNK_INTS * c;
      cJSON *stage = cJSON_CreateObject();
      cJSON_AddItemToArray(stages, stage);
      cJSON_AddNumberToObject(stage, "stage", s[0]);
      cJSON_AddBoolToObject(stage, "embedding", s[1] != 0);
      const int layers[2] = {s[2], s[3]};
      cJSON_AddItemToObject(stage, "layers", cJSON_CreateIntArray(layers, 2));
      cJSON_AddBoolToObject(stage, "final_norm", (s[4] & 1) != 0);
      cJSON_AddBoolToObject(stage, "head", (s[4] & 2) != 0);
    }
    cJSON_AddNumberToObject(file, "tensors", record->num_tensors);
    cJSON_AddNumberToObject(file, "floats_per_array", (double)record->floats);
    cJSON_AddStringToObject(file, "arrays", "params, adam_m, adam_v (fp32, little-endian)");
    cJSON_AddNumberToObject(file, "bytes", (double)record->bytes);
    cJSON_AddStringToObject(file, "fnv1a64", hex64(hex, record->checksum));
  }
  free(offsets);
  if (status != MP_OK) {
    cJSON_Delete(root);
    return status;
  }
  *out = root;
  return MP_OK;
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

/* World rank 0, every file written: the manifest last, the directory into place, --keep. */
static mp_status finish_save(const mp_checkpoint_context *ctx, const mp_gpt_layout *layout,
                             const char *dir, const char *tmp_dir, const char *final_dir,
                             int64_t step, int keep, int32_t pid, file_record *const *records,
                             mp_error *err) {
  const int num_files = ctx->plan->pp * ctx->plan->tp;
  for (int f = 0; f < num_files; ++f) {
    if (records[f]->status != MP_OK) {
      /* The writer's own error (it names the file). */
      return mp_fail(err, (mp_status)records[f]->status, "%s", records[f]->message);
    }
  }
  cJSON *manifest = NULL;
  MP_TRY(build_manifest(ctx, layout, step, records, &manifest, err));
  char *text = cJSON_Print(manifest);
  cJSON_Delete(manifest);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory writing the manifest");
  char path[PATH_BYTES];
  snprintf(path, sizeof path, "%s/manifest.json", tmp_dir);
  mp_atomic_file file;
  mp_status status = mp_atomic_file_open(&file, path, err);
  if (status == MP_OK) {
    mp_atomic_file_write(&file, text, strlen(text));
    mp_atomic_file_write(&file, "\n", 1);
    status = mp_atomic_file_commit(&file, err);
  }
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

mp_status mp_checkpoint_save(const char *dir, int64_t step, int keep,
                             const mp_checkpoint_context *ctx, mp_error *err) {
  const mp_plan *plan = ctx->plan;
  mp_comm *world = ctx->world;
  const int world_rank = world != NULL ? mp_comm_rank(world) : 0;
  rank_view view;
  /* The CUDA backend's state comes from the GPU into the host arrays the view reads. */
  mp_status status = mp_trainer_state_to_host(ctx->trainer, err);
  if (status == MP_OK) status = view_create(ctx, &view, err);
  status = agree(world, status, err);
  if (status != MP_OK) {
    if (view.chunks != NULL) view_free(&view);
    return status;
  }
  /* World rank 0 creates the temporary directory and tells the others its name. */
  int32_t pid = (int32_t)getpid();
  if (world != NULL) status = mp_comm_broadcast(world, &pid, sizeof pid, 0, err);
  char tmp_dir[PATH_BYTES], final_dir[PATH_BYTES];
  snprintf(tmp_dir, sizeof tmp_dir, "%s/step-%lld.tmp-%d", dir, (long long)step, (int)pid);
  snprintf(final_dir, sizeof final_dir, "%s/step-%lld", dir, (long long)step);
  if (status == MP_OK && world_rank == 0) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
      status = mp_fail(err, MP_ERR_RUNTIME, "--checkpoint-dir %s: cannot create: %s", dir,
                       strerror(errno));
    } else {
      remove_dir(tmp_dir);
      if (mkdir(tmp_dir, 0777) != 0) {
        status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot create: %s", tmp_dir, strerror(errno));
      }
    }
  }
  status = agree(world, status, err);
  if (status != MP_OK) {
    view_free(&view);
    return status;
  }
  /* The files: dp rank 0 of every (pp rank, tp rank) writes; with ZeRO-1 the other dp ranks send
   * it their parts of the moments. */
  const int n = mp_gpt_layout_num_tensors(view.layout);
  const int max_chunks = plan->virtual_stages > view.num_chunks ? plan->virtual_stages
                                                                : view.num_chunks;
  const size_t bytes = record_bytes(n, max_chunks);
  const bool zero = plan->zero_stage == 1 && plan->dp > 1 && ctx->dp != NULL;
  const int num_files = plan->pp * plan->tp;
  file_record *mine = calloc(1, bytes);
  file_record **records = world_rank == 0 ? calloc((size_t)num_files, sizeof *records) : NULL;
  if (mine == NULL || (world_rank == 0 && records == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK && ctx->dp_rank == 0) {
    /* Its outcome travels in its record; world rank 0 reports it. */
    (void)write_shard_file(ctx, &view, tmp_dir, step, zero, mine, err);
  } else if (status == MP_OK && zero) {
    status = send_moments(ctx, &view, err);
  }
  /* Every writer's record reaches world rank 0, which so waits for every file. */
  if (status == MP_OK && world_rank == 0) {
    for (int f = 0; f < num_files && status == MP_OK; ++f) {
      const int p = f / plan->tp, r = f % plan->tp;
      records[f] = f == 0 ? mine : calloc(1, bytes);
      if (records[f] == NULL) {
        status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
        break;
      }
      /* topology/grid.h: rank = tp_rank + tp x (dp_rank + dp x pp_rank), here dp_rank 0. */
      const int writer = r + plan->tp * plan->dp * p;
      if (writer != 0) status = mp_comm_recv(world, records[f], bytes, writer, err);
    }
    if (status == MP_OK) {
      status = finish_save(ctx, view.layout, dir, tmp_dir, final_dir, step, keep, pid, records,
                           err);
    }
    if (status != MP_OK) remove_dir(tmp_dir);
  } else if (status == MP_OK && ctx->dp_rank == 0) {
    status = mp_comm_send(world, mine, bytes, 0, err);
  }
  if (records != NULL) {
    for (int f = 1; f < num_files; ++f) free(records[f]);
    free(records);
  }
  free(mine);
  view_free(&view);
  return agree(world, status, err);
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
  char name[FILE_NAME_BYTES];
  char checksum[17]; /* FNV-1a 64, hex */
  int pp_rank, tp_rank, tp_size;
  size_t floats;     /* per array */
} ck_file;

typedef struct {
  int file;          /* index into the files */
  size_t offset;     /* floats from the start of each array of the file */
} ck_piece;

typedef struct {
  char name[MP_GPT_TENSOR_NAME_BYTES];
  size_t rows, cols;
  mp_tp_split split;
  int tp;            /* shards it was saved in */
  ck_piece *pieces;  /* (tp) by tp rank */
} ck_tensor;

typedef struct {
  char path[PATH_BYTES]; /* the checkpoint directory */
  char file[PATH_BYTES]; /* the manifest, as messages name it */
  cJSON *root;
  int version;
  int64_t step;
  int num_files;
  ck_file *files;
  int num_tensors;
  ck_tensor *tensors;
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

/* manifest_int within [lo, hi]. */
static mp_status manifest_range(const manifest *mf, const cJSON *object, const char *where,
                                const char *key, int64_t lo, int64_t hi, int64_t *out,
                                mp_error *err) {
  MP_TRY(manifest_int(mf, object, where, key, out, err));
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
static mp_status parse_files(manifest *mf, int pp, int tp, mp_error *err) {
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
        strcmp(name->valuestring, ".") == 0 || strlen(name->valuestring) >= FILE_NAME_BYTES ||
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
static mp_status parse_tensors(manifest *mf, mp_error *err) {
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
    if (tp < 1 || tp > MAX_GRID) {
      return mp_fail(err, MP_ERR_INPUT, "%s: %s.shards must list 1 to %d shards", mf->file,
                     where, MAX_GRID);
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

/* Parses a manifest's text into mf (mf->path and mf->file set by the caller) and checks it:
 * format, version, step, layout, the files and the tensor table. */
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
  int64_t version = 0, tp = 0, dp = 0, pp = 0;
  MP_TRY(manifest_int(mf, mf->root, "$", "version", &version, err));
  if (version != 1 && version != FORMAT_VERSION) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: checkpoint format version %lld; this mpengine reads versions 1 and %d",
                   file, (long long)version, FORMAT_VERSION);
  }
  mf->version = (int)version;
  MP_TRY(manifest_int(mf, mf->root, "$", "step", &mf->step, err));
  const cJSON *plan = cJSON_GetObjectItemCaseSensitive(mf->root, "plan");
  MP_TRY(manifest_range(mf, plan, "$.plan", "dp", 1, MAX_GRID, &dp, err));
  MP_TRY(manifest_range(mf, plan, "$.plan", "pp", 1, MAX_GRID, &pp, err));
  MP_TRY(manifest_range(mf, plan, "$.plan", "tp", 1, MAX_GRID, &tp, err));
  if (version == 1 && (dp != 1 || pp != 1)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: a version-1 checkpoint saved with dp x pp x tp = %lld x %lld x %lld; "
                   "version 1 holds dp = pp = 1 only",
                   file, (long long)dp, (long long)pp, (long long)tp);
  }
  if (pp * tp > MAX_FILES) {
    return mp_fail(err, MP_ERR_INPUT, "%s: pp x tp = %lld x %lld is more than %d files", file,
                   (long long)pp, (long long)tp, MAX_FILES);
  }
  MP_TRY(parse_files(mf, (int)pp, (int)tp, err));
  return parse_tensors(mf, err);
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

static void manifest_close(manifest *mf) {
  for (int i = 0; i < mf->num_tensors && mf->tensors != NULL; ++i) free(mf->tensors[i].pieces);
  free(mf->tensors);
  free(mf->files);
  cJSON_Delete(mf->root);
  memset(mf, 0, sizeof *mf);
}

static void describe_file(char *out, size_t bytes, const manifest *mf, const ck_file *file) {
  if (mf->version == 1) {
    snprintf(out, bytes, "tp rank %d", file->tp_rank);
  } else {
    snprintf(out, bytes, "pp rank %d, tp rank %d", file->pp_rank, file->tp_rank);
  }
}

/* Opens file f and checks its header: magic, coordinates, floats per array. */
static mp_status open_shard(const manifest *mf, int f, FILE **out, mp_error *err) {
  const ck_file *file = &mf->files[f];
  char path[PATH_BYTES], who[64];
  snprintf(path, sizeof path, "%s/%s", mf->path, file->name);
  describe_file(who, sizeof who, mf, file);
  *out = fopen(path, "rb");
  if (*out == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  unsigned char header[SHARD_HEADER_BYTES];
  bool ok = fread(header, 1, sizeof header, *out) == sizeof header;
  uint32_t a = 0, b = 0;
  uint64_t floats = 0;
  memcpy(&a, header + 8, 4);
  memcpy(&b, header + 12, 4);
  memcpy(&floats, header + 16, 8);
  if (mf->version == 1) {
    ok = ok && memcmp(header, SHARD_MAGIC_V1, 8) == 0 && a == (uint32_t)file->tp_rank &&
         b == (uint32_t)file->tp_size;
  } else {
    ok = ok && memcmp(header, SHARD_MAGIC_V2, 8) == 0 && a == (uint32_t)file->pp_rank &&
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
static mp_status verify_file(const manifest *mf, int f, mp_error *err) {
  const ck_file *file = &mf->files[f];
  char path[PATH_BYTES], who[64];
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
  hex64(hex, checksum);
  if (strcmp(hex, file->checksum) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: checksum mismatch (FNV-1a 64 %s, the manifest says %s): the shard is "
                   "corrupted; resume from another step-<N>",
                   path, hex, file->checksum);
  }
  const uint64_t want = SHARD_HEADER_BYTES + 3 * (uint64_t)file->floats * sizeof(float);
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
static mp_status verify_files(const manifest *mf, int first, int stride, mp_error *err) {
  for (int f = first; f < mf->num_files; f += stride) MP_TRY(verify_file(mf, f, err));
  return MP_OK;
}

/* The shard files a load reads, opened on first use. */
typedef struct {
  const manifest *mf;
  FILE **handles; /* (num_files) */
} shard_reader;

static mp_status reader_open(const manifest *mf, shard_reader *reader, mp_error *err) {
  reader->mf = mf;
  reader->handles = calloc((size_t)(mf->num_files > 0 ? mf->num_files : 1), sizeof(FILE *));
  if (reader->handles == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  return MP_OK;
}

static void reader_close(shard_reader *reader) {
  for (int f = 0; reader->handles != NULL && f < reader->mf->num_files; ++f) {
    if (reader->handles[f] != NULL) fclose(reader->handles[f]);
  }
  free(reader->handles);
  reader->handles = NULL;
}

/* dest (count floats) = array `array` (0 params, 1 first moments, 2 second moments) of file f
 * from float `offset`. */
static mp_status read_floats(shard_reader *reader, int f, int array, size_t offset, size_t count,
                             float *dest, mp_error *err) {
  const manifest *mf = reader->mf;
  if (reader->handles[f] == NULL) MP_TRY(open_shard(mf, f, &reader->handles[f], err));
  const ck_file *file = &mf->files[f];
  const off_t at = (off_t)SHARD_HEADER_BYTES +
                   ((off_t)array * (off_t)file->floats + (off_t)offset) * (off_t)sizeof(float);
  if (fseeko(reader->handles[f], at, SEEK_SET) != 0 ||
      fread(dest, sizeof(float), count, reader->handles[f]) != count) {
    return mp_fail(err, MP_ERR_INPUT, "%s/%s: short read at byte %lld (truncated?)", mf->path,
                   file->name, (long long)at);
  }
  return MP_OK;
}

typedef struct {
  shard_reader *reader;
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
static mp_status read_shard(shard_reader *reader, int i, int array, int rank, int size,
                            size_t first, size_t count, float *dest, mp_error *err) {
  const ck_tensor *t = &reader->mf->tensors[i];
  saved_source source = {reader, t, array};
  return mp_tp_shard_read(dest, first, count, t->split, t->rows, t->cols, rank, size, t->tp,
                          read_saved, &source, err);
}

/* Fills this rank's chunks: parameters, and the moments of the elements it keeps. */
static mp_status read_view(shard_reader *reader, const rank_view *view, mp_error *err) {
  for (int c = 0; c < view->num_chunks; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    const size_t lo = chunk->first, hi = chunk->first + chunk->moments;
    for (int j = 0; j < chunk->num_tensors; ++j) {
      const view_tensor *t = &chunk->tensors[j];
      MP_TRY(read_shard(reader, t->global, 0, view->tp_rank, view->tp_size, 0, t->count,
                        chunk->params + t->offset, err));
      /* The moments of the part of the tensor this dp rank keeps (all of it without ZeRO-1). */
      const size_t a = t->offset > lo ? t->offset : lo;
      const size_t b = t->offset + t->count < hi ? t->offset + t->count : hi;
      if (a >= b) continue;
      MP_TRY(read_shard(reader, t->global, 1, view->tp_rank, view->tp_size, a - t->offset, b - a,
                        chunk->m + (a - lo), err));
      MP_TRY(read_shard(reader, t->global, 2, view->tp_rank, view->tp_size, a - t->offset, b - a,
                        chunk->v + (a - lo), err));
    }
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
  const int n = mp_gpt_layout_num_tensors(layout);
  if (mf->num_tensors != n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s is a checkpoint of another model: %d tensors in the checkpoint, %d in %s",
                   mf->path, mf->num_tensors, n, model_source);
  }
  for (int i = 0; i < n; ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
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
  mp_comm *world = ctx->world;
  const int world_rank = world != NULL ? mp_comm_rank(world) : 0;
  const int world_size = world != NULL ? mp_comm_size(world) : 1;
  rank_view view;
  manifest mf;
  memset(&mf, 0, sizeof mf);
  mp_status status = view_create(ctx, &view, err);
  const bool have_view = status == MP_OK;
  if (status == MP_OK) status = manifest_open(path, &mf, err);
  if (status == MP_OK) status = check_model(&mf, view.layout, mp_model_source(ctx->model), err);
  if (status == MP_OK) status = check_run(&mf, ctx->plan, err);
  status = agree(world, status, err);
  /* The files' checksums, spread over the ranks. */
  if (status == MP_OK) status = verify_files(&mf, world_rank, world_size, err);
  status = agree(world, status, err);
  shard_reader reader = {NULL, NULL};
  if (status == MP_OK) status = reader_open(&mf, &reader, err);
  if (status == MP_OK) status = read_view(&reader, &view, err);
  if (reader.handles != NULL) reader_close(&reader);
  /* The CUDA backend's state goes from the host arrays the view wrote back to the GPU. */
  if (status == MP_OK) status = mp_trainer_state_to_device(ctx->trainer, err);
  status = agree(world, status, err);
  if (status == MP_OK) *step = mf.step;
  manifest_close(&mf);
  if (have_view) view_free(&view);
  return status;
}

mp_status mp_checkpoint_export_llmc(const char *path, const char *out, int64_t *step,
                                    size_t *num_params, mp_error *err) {
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
  mp_gpt_layout *layout = NULL;
  char source[PATH_BYTES + 32];
  snprintf(source, sizeof source, "%s/manifest.json $.model.description", path);
  if (status == MP_OK) status = mp_model_parse_text(description->valuestring, source, &parsed, err);
  if (status == MP_OK) status = mp_gpt_layout_create(parsed, (int)seq_len, &layout, err);
  if (status == MP_OK) status = check_model(&mf, layout, source, err);
  if (status == MP_OK) status = verify_files(&mf, 0, 1, err);
  /* Tensor by tensor: one buffer of the largest tensor, never the whole model. */
  size_t largest = 0;
  for (int i = 0; status == MP_OK && i < mp_gpt_layout_num_tensors(layout); ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
    if (t->rows * t->cols > largest) largest = t->rows * t->cols;
  }
  float *tensor = NULL;
  if (status == MP_OK && (tensor = malloc((largest > 0 ? largest : 1) * sizeof(float))) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for a tensor of %zu floats", largest);
  }
  mp_llmc_writer *writer = NULL;
  if (status == MP_OK) status = mp_llmc_writer_open(layout, out, &writer, err);
  shard_reader reader = {NULL, NULL};
  if (status == MP_OK) status = reader_open(&mf, &reader, err);
  for (int i = 0; status == MP_OK && i < mp_gpt_layout_num_tensors(layout); ++i) {
    const mp_gpt_tensor *t = mp_gpt_layout_tensor(layout, i);
    /* The full tensor is tp rank 0's shard at tp = 1. */
    status = read_shard(&reader, i, 0, 0, 1, 0, t->rows * t->cols, tensor, err);
    if (status == MP_OK) mp_llmc_writer_write(writer, i, 0, tensor, t->rows * t->cols);
  }
  if (reader.handles != NULL) reader_close(&reader);
  if (writer != NULL) {
    if (status == MP_OK) {
      status = mp_llmc_writer_commit(writer, err);
    } else {
      mp_llmc_writer_abort(writer);
    }
  }
  if (status == MP_OK) {
    *step = mf.step;
    *num_params = mp_gpt_layout_num_params(layout);
  }
  free(tensor);
  mp_gpt_layout_free(layout);
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
