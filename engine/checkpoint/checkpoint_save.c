/* engine/checkpoint/checkpoint_save.c — crash-safe saves of any dp x pp x tp layout (see
 * checkpoint.h): every rank writes its shard file, world rank 0 the manifest last, and the
 * directory goes into place by one rename; --keep's pruning and the left-overs of saves that did
 * not finish. */
#include "engine/checkpoint/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h> /* RENAME_EXCHANGE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/data/data_loader.h"
#include "engine/model/stage_cpu.h"
#include "tensor_parallel/shard.h"

static const size_t NOT_HELD = (size_t)-1;

enum { MAX_UNFINISHED = 1024 };

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
  char file[CK_PATH_BYTES];
  while ((entry = readdir(dir)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
    unlink(file);
  }
  closedir(dir);
  rmdir(path);
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
  out->hash = ck_fnv1a64(out->hash, data, bytes);
  out->bytes += bytes;
}

/* The arrays of the file, in its order after the parameters: the AdamW moments. */
static const mp_trainer_array kMoments[2] = {MP_TRAINER_ADAM_M, MP_TRAINER_ADAM_V};

/* n floats of array's part of chunk from element `at` of the part, into piece (host memory), from
 * wherever the backend keeps them. */
static mp_status read_part(const rank_view *view, const view_chunk *chunk,
                           mp_trainer_array array, size_t at, size_t n, float *piece,
                           mp_error *err) {
  return mp_trainer_read_state(view->trainer, chunk->index, array, chunk->first + at, n, piece,
                               err);
}

static bool sharded_params(const rank_view *view) {
  for (int c = 0; c < view->num_chunks; ++c) {
    if (view->chunks[c].sharded_params) return true;
  }
  return false;
}

/* With ZeRO, every dp rank's part of chunk c's moments arrays (and with ZeRO-3 of its
 * parameters) meets on dp rank 0: the others send (first, count), then the floats in pieces, in
 * chunk order: the parameters of every chunk (ZeRO-3), then the first moments, then the second,
 * the order of the file. */
static mp_status send_moments(const mp_checkpoint_context *ctx, const rank_view *view,
                              mp_error *err) {
  float *piece = malloc(CK_PIECE_FLOATS * sizeof(float));
  if (piece == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory sending ZeRO's parts");
  mp_status status = MP_OK;
  const mp_trainer_array arrays[3] = {MP_TRAINER_PARAMS, MP_TRAINER_ADAM_M, MP_TRAINER_ADAM_V};
  for (int k = sharded_params(view) ? 0 : 1; k < 3 && status == MP_OK; ++k) {
    for (int c = 0; c < view->num_chunks && status == MP_OK; ++c) {
      const view_chunk *chunk = &view->chunks[c];
      const uint64_t part[2] = {chunk->first, chunk->moments};
      status = mp_comm_send(ctx->dp, part, sizeof part, 0, err);
      for (size_t at = 0; at < chunk->moments && status == MP_OK; at += CK_PIECE_FLOATS) {
        const size_t n = chunk->moments - at < CK_PIECE_FLOATS ? chunk->moments - at
                                                                   : CK_PIECE_FLOATS;
        status = read_part(view, chunk, arrays[k], at, n, piece, err);
        if (status == MP_OK) status = mp_comm_send(ctx->dp, piece, n * sizeof(float), 0, err);
      }
    }
  }
  free(piece);
  return status;
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

/* dp rank 0's side: writes chunk's whole array `array` into out, its own part as it reads it
 * and every other dp rank's as it arrives, piece by piece (piece: CK_PIECE_FLOATS floats). */
static mp_status stream_moments(const mp_checkpoint_context *ctx, const rank_view *view,
                                const view_chunk *chunk, mp_trainer_array array, float *piece,
                                hashed_file *out, mp_error *err) {
  size_t covered = 0;
  for (int d = 0; d < mp_plan_zero_shard(ctx->plan); ++d) {
    uint64_t part[2] = {chunk->first, chunk->moments};
    if (d > 0) MP_TRY(mp_comm_recv(ctx->dp, part, sizeof part, d, err));
    if (part[0] != covered || part[1] > chunk->count - covered) {
      return mp_fail(err, MP_ERR_RUNTIME,
                     "ZeRO-1 moments of dp rank %d: elements [%" PRIu64 ", +%" PRIu64
                     ") do not follow the %zu before them in a chunk of %zu",
                     d, part[0], part[1], covered, chunk->count);
    }
    for (size_t at = 0; at < part[1]; at += CK_PIECE_FLOATS) {
      const size_t n = part[1] - at < CK_PIECE_FLOATS ? part[1] - at : CK_PIECE_FLOATS;
      if (d > 0) {
        MP_TRY(mp_comm_recv(ctx->dp, piece, n * sizeof(float), d, err));
      } else {
        MP_TRY(read_part(view, chunk, array, at, n, piece, err));
      }
      put_flat(out, chunk, covered + at, piece, n);
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

/* Writes chunk's whole array `array` of this rank into out, read piece by piece (piece:
 * CK_PIECE_FLOATS floats) from wherever the backend keeps it. */
static mp_status put_own(const rank_view *view, const view_chunk *chunk, mp_trainer_array array,
                         float *piece, hashed_file *out, mp_error *err) {
  for (size_t at = 0; at < chunk->count; at += CK_PIECE_FLOATS) {
    const size_t n = chunk->count - at < CK_PIECE_FLOATS ? chunk->count - at
                                                             : CK_PIECE_FLOATS;
    MP_TRY(mp_trainer_read_state(view->trainer, chunk->index, array, at, n, piece, err));
    put_flat(out, chunk, at, piece, n);
  }
  return MP_OK;
}

/* Expert parallelism: every array of the file (the parameters, then each moment; chunk by
 * chunk, tensor by tensor, each expert tensor whole: ep rank 0's rows, then ep rank 1's, ...)
 * walked in segments, each held by one replica (the dp x cp group's rank q): without ZeRO ep
 * rank e's rows by replica e (the writer's ep group) and the other tensors by the writer; with
 * ZeRO (cut over the expert-data-parallel group of replicas e, e + ep, e + 2 ep, ...) a segment
 * of ep rank e's part d of the moments (and with ZeRO-3 of its block parameters) by replica
 * e + ep x d. The writer (replica 0, out non-NULL) reads its own segments and receives the others
 * over ctx->dp, in pieces of CK_PIECE_FLOATS through piece; every other replica sends the
 * segments it holds, in the same order. */
static mp_status walk_expert_parallel(const mp_checkpoint_context *ctx, const rank_view *view,
                                      float *piece, hashed_file *out, mp_error *err) {
  const mp_trainer_array arrays[3] = {MP_TRAINER_PARAMS, MP_TRAINER_ADAM_M, MP_TRAINER_ADAM_V};
  const int ep = mp_comm_size(ctx->ep);
  const int zero_size = (ctx->dp != NULL ? mp_comm_size(ctx->dp) : 1) / ep;
  const bool zero = ctx->plan->zero_stage >= 1 && zero_size > 1;
  const int me = ctx->dp_rank;
  for (int k = 0; k < 3; ++k) {
    for (int c = 0; c < view->num_chunks; ++c) {
      const view_chunk *chunk = &view->chunks[c];
      size_t blocks_first = 0, blocks_end = 0, largest = 0;
      mp_stage_layout_blocks_range(mp_trainer_chunk_layout(view->trainer, chunk->index),
                                   &blocks_first, &blocks_end, &largest);
      const size_t part = (chunk->count + (size_t)zero_size - 1) / (size_t)zero_size;
      for (int j = 0; j < chunk->num_tensors; ++j) {
        const view_tensor *t = &chunk->tensors[j];
        if (t->tied_copy) continue;
        const bool in_blocks = t->offset >= blocks_first && t->offset < blocks_end;
        const bool parted = zero && (k > 0 || (chunk->sharded_params && in_blocks));
        for (int e = 0; e < t->ep_size; ++e) {
          for (size_t x = t->offset; x < t->offset + t->count;) {
            size_t end = t->offset + t->count;
            int holder = e;
            if (parted) {
              const size_t d = x / part;
              holder = e + ep * (int)d;
              if ((d + 1) * part < end) end = (d + 1) * part;
            }
            for (size_t at = x; at < end && (out != NULL || holder == me);
                 at += CK_PIECE_FLOATS) {
              const size_t n = end - at < CK_PIECE_FLOATS ? end - at : CK_PIECE_FLOATS;
              if (holder == me) {
                MP_TRY(mp_trainer_read_state(view->trainer, chunk->index, arrays[k], at, n,
                                             piece, err));
              }
              if (out == NULL) {
                MP_TRY(mp_comm_send(ctx->dp, piece, n * sizeof(float), 0, err));
              } else {
                if (holder != me) MP_TRY(mp_comm_recv(ctx->dp, piece, n * sizeof(float), holder,
                                                      err));
                put(out, piece, n * sizeof(float));
              }
            }
            x = end;
          }
        }
      }
    }
  }
  return MP_OK;
}

/* An ep rank's side of walk_expert_parallel: sends the segments it holds. */
static mp_status send_expert_parallel(const mp_checkpoint_context *ctx, const rank_view *view,
                                      mp_error *err) {
  float *piece = malloc(CK_PIECE_FLOATS * sizeof(float));
  if (piece == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory sending experts");
  const mp_status status = walk_expert_parallel(ctx, view, piece, NULL, err);
  free(piece);
  return status;
}

/* dp rank 0 of (pp_rank, tp_rank): writes its file into tmp_dir and fills record (always, with
 * the status and message on failure). */
static mp_status write_shard_file(const mp_checkpoint_context *ctx, const rank_view *view,
                                  const char *tmp_dir, int64_t step, bool zero,
                                  file_record *record, mp_error *err) {
  char name[CK_FILE_NAME_BYTES], path[CK_PATH_BYTES];
  ck_shard_file_name(name, sizeof name, ctx->pp_rank, view->tp_rank);
  snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
  int32_t *tensors = record_tensors(record);
  uint64_t floats = 0;
  int k = 0;
  for (int c = 0; c < view->num_chunks; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    for (int j = 0; j < chunk->num_tensors; ++j) {
      if (chunk->tensors[j].tied_copy) continue;
      tensors[k++] = chunk->tensors[j].global;
      floats += chunk->tensors[j].count * (size_t)chunk->tensors[j].ep_size; /* experts whole */
    }
  }
  record->num_tensors = k;
  record->num_chunks = view->num_chunks;
  int32_t *chunks = record_chunks(record, k);
  for (int c = 0; c < view->num_chunks; ++c) {
    const mp_stage_span *s = &view->chunks[c].stage;
    int32_t *out = chunks + CHUNK_INTS * c;
    out[0] = view->chunks[c].stage_index;
    out[1] = s->embedding;
    out[2] = s->first_layer;
    out[3] = s->num_layers;
    out[4] = (s->final_norm ? 1 : 0) | (s->head ? 2 : 0);
  }
  hashed_file out = {.hash = CK_FNV_OFFSET};
  mp_status status = mp_atomic_file_open(&out.file, path, err);
  out.open = status == MP_OK;
  unsigned char header[CK_SHARD_HEADER_BYTES] = {0};
  memcpy(header, CK_SHARD_MAGIC_V2, 8);
  const uint32_t pp32 = (uint32_t)ctx->pp_rank, tp32 = (uint32_t)view->tp_rank;
  const uint64_t step64 = (uint64_t)step;
  memcpy(header + 8, &pp32, 4);
  memcpy(header + 12, &tp32, 4);
  memcpy(header + 16, &floats, 8);
  memcpy(header + 24, &step64, 8);
  put(&out, header, sizeof header);
  /* The parameters, then the moments. With ZeRO the other dp ranks' sends must be received even
   * when this file cannot be written, or they would wait for nothing. */
  mp_status comm = MP_OK;
  float *piece = malloc(CK_PIECE_FLOATS * sizeof(float));
  const bool sharded = sharded_params(view);
  const bool experts = ctx->ep != NULL; /* expert parallelism */
  if (piece == NULL) comm = mp_fail(err, MP_ERR_RUNTIME, "out of memory writing a checkpoint");
  if (experts && comm == MP_OK) { /* every array, from the replicas that hold it */
    comm = walk_expert_parallel(ctx, view, piece, &out, err);
  }
  for (int c = 0; c < view->num_chunks && comm == MP_OK && !experts; ++c) {
    const view_chunk *chunk = &view->chunks[c];
    if (sharded) { /* ZeRO-3: the blocks' parameters come from every dp rank's part */
      comm = stream_moments(ctx, view, chunk, MP_TRAINER_PARAMS, piece, &out, err);
    } else {
      comm = put_own(view, chunk, MP_TRAINER_PARAMS, piece, &out, err);
    }
  }
  for (int a = 0; a < 2 && comm == MP_OK && !experts; ++a) {
    for (int c = 0; c < view->num_chunks && comm == MP_OK; ++c) {
      const view_chunk *chunk = &view->chunks[c];
      if (zero) {
        comm = stream_moments(ctx, view, chunk, kMoments[a], piece, &out, err);
      } else if (chunk->first != 0 || chunk->moments != chunk->count) {
        comm = mp_fail(err, MP_ERR_RUNTIME,
                       "chunk %d keeps moments of elements [%zu, +%zu) of %zu without ZeRO-1", c,
                       chunk->first, chunk->moments, chunk->count);
      } else {
        comm = put_own(view, chunk, kMoments[a], piece, &out, err);
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

static void config_json(cJSON *object, const mp_model_config *c) {
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
                            const mp_param_layout *layout, int64_t step) {
  const mp_plan *plan = ctx->plan;
  cJSON_AddStringToObject(root, "format", CK_FORMAT_NAME);
  cJSON_AddNumberToObject(root, "version", CK_FORMAT_VERSION);
  cJSON_AddNumberToObject(root, "step", (double)step);
  /* Which run saved it: a fresh run refuses a directory of another run's checkpoints, and
   * --keep prunes only its own (mp_checkpoint_check_dir). */
  cJSON *run = cJSON_AddObjectToObject(root, "run");
  cJSON_AddStringToObject(run, "id", ctx->run_id != NULL ? ctx->run_id : "");
  cJSON_AddStringToObject(run, "plan", plan->source); /* the plan file it was started with */
  /* The plan in the plan file's form, from its one writer (topology/plan.c), read back by
   * mp_plan_parse_json (ck_manifest_open); the seed a number, as below. */
  cJSON_AddItemToObject(root, "plan", mp_plan_to_json(plan, NULL));
  const mp_training_config *t = &plan->training;
  const double seed = (double)t->seed;

  cJSON *model = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(model, "name", mp_model_name(ctx->model));
  cJSON_AddStringToObject(model, "source", mp_model_source(ctx->model));
  cJSON_AddNumberToObject(model, "num_params", (double)mp_param_layout_num_params(layout));
  config_json(cJSON_AddObjectToObject(model, "config"), mp_param_layout_config(layout));
  char *description = ck_read_text(mp_model_source(ctx->model));
  if (description != NULL) {
    cJSON_AddStringToObject(model, "description", description);
    free(description);
  } else {
    cJSON_AddNullToObject(model, "description");
  }

  cJSON *data = cJSON_AddObjectToObject(root, "data");
  cJSON_AddNumberToObject(data, "seed", seed);
  cJSON_AddNumberToObject(data, "global_batch", (double)plan->global_batch);
  cJSON_AddNumberToObject(data, "seq_len", (double)plan->seq_len);
  cJSON_AddNumberToObject(data, "next_step", (double)step);
  /* Which order the samples are drawn in (data_loader.h): a resume under another order would
   * draw other batches, so it is refused (check_run). */
  cJSON_AddNumberToObject(data, "order", MP_DATA_ORDER_VERSION);
  cJSON_AddStringToObject(data, "order_name", MP_DATA_ORDER_NAME);
  cJSON_AddStringToObject(data, "note",
                          "the batch of a step is a pure function of (seed, step): the position "
                          "is the step");
  cJSON *rng = cJSON_AddObjectToObject(root, "rng");
  cJSON_AddNumberToObject(rng, "seed", seed);
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
static mp_status build_manifest(const mp_checkpoint_context *ctx, const mp_param_layout *layout,
                                int64_t step, file_record *const *records, cJSON **out,
                                mp_error *err) {
  const int pp = ctx->plan->pp, tp = ctx->plan->tp, num_files = pp * tp;
  const int n = mp_param_layout_num_tensors(layout);
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
      const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
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
  char name[CK_FILE_NAME_BYTES];
  for (int i = 0; i < n && status == MP_OK; ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
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
      ck_shard_file_name(name, sizeof name, holder, r);
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
    ck_shard_file_name(name, sizeof name, p, r);
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
    cJSON_AddStringToObject(file, "fnv1a64", ck_hex64(hex, record->checksum));
  }
  free(offsets);
  if (status != MP_OK) {
    cJSON_Delete(root);
    return status;
  }
  *out = root;
  return MP_OK;
}

/* Left-overs of saves that did not finish (a kill between mkdir and the rename into place):
 * DIR/step-<N>.tmp-<pid> and DIR/step-<N>.old-<pid>. No run resumes from them (they have no
 * manifest, or are a replaced copy), so the next save removes them before it starts. */
static void remove_unfinished_saves(const char *dir) {
  /* One at a time: a directory is not changed while it is being listed. */
  for (int removed = 0; removed < MAX_UNFINISHED; ++removed) {
    DIR *handle = opendir(dir);
    if (handle == NULL) return;
    char found[CK_PATH_BYTES] = "";
    struct dirent *entry;
    while ((entry = readdir(handle)) != NULL) {
      const char *name = entry->d_name;
      if (strncmp(name, "step-", 5) != 0) continue;
      if (strstr(name, ".tmp-") == NULL && strstr(name, ".old-") == NULL) continue;
      snprintf(found, sizeof found, "%s/%s", dir, name);
      break;
    }
    closedir(handle);
    if (found[0] == '\0') return;
    remove_dir(found);
  }
}

/* World rank 0, every file written: the manifest last, the directory into place, --keep. */
static mp_status finish_save(const mp_checkpoint_context *ctx, const mp_param_layout *layout,
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
  char path[CK_PATH_BYTES];
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
    /* Replacing step-N (a resumed run saving the step it resumed from): the two directories
     * swap names in one step, so step-N is whole at every moment; the old one goes after. */
    if (syscall(SYS_renameat2, AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
      MP_TRY(sync_dir(dir, err));
      remove_dir(tmp_dir);
    } else {
      /* A file system without the exchange: the old copy is moved aside and removed only once
       * the new one is in place (a kill in between leaves step-N.old-PID whole). */
      char old[CK_PATH_BYTES];
      snprintf(old, sizeof old, "%s.old-%d", final_dir, (int)pid);
      if (rename(final_dir, old) != 0) {
        return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot replace: %s", final_dir,
                       strerror(errno));
      }
      if (rename(tmp_dir, final_dir) != 0) {
        const int saved = errno;
        rename(old, final_dir);
        return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot rename into place: %s", final_dir,
                       strerror(saved));
      }
      MP_TRY(sync_dir(dir, err));
      remove_dir(old);
    }
  } else if (rename(tmp_dir, final_dir) != 0) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot rename into place: %s", final_dir,
                   strerror(errno));
  }
  MP_TRY(sync_dir(dir, err));
  if (keep > 0) {
    int64_t *steps = malloc(CK_MAX_LISTED * sizeof *steps);
    if (steps == NULL) return MP_OK;
    const int n = ck_list_checkpoints(dir, steps, CK_MAX_LISTED);
    int complete = 0;
    for (int i = 0; i < n; ++i) {
      char candidate[CK_PATH_BYTES];
      snprintf(candidate, sizeof candidate, "%s/step-%lld", dir, (long long)steps[i]);
      /* Only this run's checkpoints count and go: another run's are not ours to remove. */
      char run_id[MP_CHECKPOINT_RUN_ID_BYTES];
      if (!ck_read_manifest_run(candidate, run_id, sizeof run_id)) continue;
      if (ctx->run_id == NULL || strcmp(run_id, ctx->run_id) != 0) continue;
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
  memset(&view, 0, sizeof view); /* view_create may not run */
  mp_status status = ck_view_create(ctx, &view, err);
  status = mp_comm_agree(world, status, err);
  if (status != MP_OK) {
    if (view.chunks != NULL) ck_view_free(&view);
    return status;
  }
  /* World rank 0 creates the temporary directory and tells the others its name. */
  int32_t pid = (int32_t)getpid();
  if (world != NULL) status = mp_comm_broadcast(world, &pid, sizeof pid, 0, err);
  char tmp_dir[CK_PATH_BYTES], final_dir[CK_PATH_BYTES];
  snprintf(tmp_dir, sizeof tmp_dir, "%s/step-%lld.tmp-%d", dir, (long long)step, (int)pid);
  snprintf(final_dir, sizeof final_dir, "%s/step-%lld", dir, (long long)step);
  if (status == MP_OK && world_rank == 0) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
      status = mp_fail(err, MP_ERR_RUNTIME, "--checkpoint-dir %s: cannot create: %s", dir,
                       strerror(errno));
    } else {
      remove_unfinished_saves(dir); /* this save's own tmp_dir too, should it exist */
      if (mkdir(tmp_dir, 0777) != 0) {
        status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot create: %s", tmp_dir, strerror(errno));
      }
    }
  }
  status = mp_comm_agree(world, status, err);
  if (status != MP_OK) {
    ck_view_free(&view);
    return status;
  }
  /* The files: dp rank 0 of every (pp rank, tp rank) writes; with ZeRO-1 the other dp ranks send
   * it their parts of the moments. */
  const int n = mp_param_layout_num_tensors(view.layout);
  const int max_chunks = plan->virtual_stages > view.num_chunks ? plan->virtual_stages
                                                                : view.num_chunks;
  const size_t bytes = record_bytes(n, max_chunks);
  const bool zero = plan->zero_stage >= 1 && mp_plan_zero_shard(plan) > 1 && ctx->dp != NULL;
  const int num_files = plan->pp * plan->tp;
  file_record *mine = calloc(1, bytes);
  file_record **records = world_rank == 0 ? calloc((size_t)num_files, sizeof *records) : NULL;
  if (mine == NULL || (world_rank == 0 && records == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status == MP_OK && ctx->dp_rank == 0) {
    /* Its outcome travels in its record; world rank 0 reports it. */
    (void)write_shard_file(ctx, &view, tmp_dir, step, zero, mine, err);
  } else if (status == MP_OK && ctx->ep != NULL) {
    /* Expert parallelism: the other experts, and with ZeRO the parts, from their holders. */
    status = send_expert_parallel(ctx, &view, err);
  } else if (status == MP_OK && zero && ctx->dp_rank < mp_plan_zero_shard(plan)) {
    /* With HSDP the first shard group's parts cover the moments; its replicas hold the same. */
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
      /* topology/grid.h: rank = tp_rank + tp x (cp_rank + cp x (dp_rank + dp x pp_rank)), here
       * dp_rank and cp_rank 0. */
      const int writer = r + plan->tp * mp_plan_replicas(plan) * p;
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
  ck_view_free(&view);
  return mp_comm_agree(world, status, err);
}

