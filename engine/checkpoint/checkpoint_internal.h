/*
 * engine/checkpoint/checkpoint_internal.h — private to engine/checkpoint: what its three files
 * share.
 * The on-disk format (checkpoint_format.c): the shard files' names and headers, the manifest as
 * parsed and checked (the plan it was saved with, its files, and every tensor with the place of
 * each of its tp shards), and reading any range of any tensor's shard, in any tp layout, from the
 * shards that hold it; export (mp_checkpoint_export) and the fuzzer's manifest check live with it.
 * This rank's view of its state and the checkpoints of a directory (checkpoint.c), which saving
 * (checkpoint_save.c) and loading (checkpoint.c) build on. Not an API: callers use checkpoint.h.
 */
#ifndef MPENGINE_ENGINE_CHECKPOINT_INTERNAL_H
#define MPENGINE_ENGINE_CHECKPOINT_INTERNAL_H

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/model/param_layout.h"
#include "tensor_parallel/shard.h"
#include "topology/plan.h"

#define CK_SHARD_MAGIC_V1 "MPCKSHD1"
#define CK_SHARD_MAGIC_V2 "MPCKSHD2"
enum {
  CK_SHARD_HEADER_BYTES = 32,
  CK_PATH_BYTES = 4096,
  /* 3: the manifest's "plan" is the plan file's object (topology/plan.h); 2 wrote a flat plan of
   * its own, still read, as is 1 (one rank). */
  CK_FORMAT_VERSION = 3,
  CK_MAX_GRID = 4096,       /* dp, pp, tp each at most this in a manifest */
  CK_MAX_FILES = 1 << 16,   /* pp x tp files at most */
  CK_FILE_NAME_BYTES = 256, /* a shard file's name */
};
#define CK_FORMAT_NAME "mpengine-checkpoint"

/* FNV-1a 64, continued over bytes. */
static inline uint64_t ck_fnv1a64(uint64_t hash, const unsigned char *bytes, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}
#define CK_FNV_OFFSET 14695981039346656037ull

/* value as the manifest writes a checksum: 16 hex digits. */
static inline char *ck_hex64(char out[17], uint64_t value) {
  snprintf(out, 17, "%016" PRIx64, value);
  return out;
}

static inline void ck_shard_file_name(char *out, size_t bytes, int pp_rank, int tp_rank) {
  snprintf(out, bytes, "pp-%05d-tp-%05d.bin", pp_rank, tp_rank);
}


typedef struct {
  char name[CK_FILE_NAME_BYTES];
  char checksum[17]; /* FNV-1a 64, hex */
  int pp_rank, tp_rank, tp_size;
  size_t floats;     /* per array */
} ck_file;

typedef struct {
  int file;          /* index into the files */
  size_t offset;     /* floats from the start of each array of the file */
} ck_piece;

typedef struct {
  char name[MP_PARAM_NAME_BYTES];
  size_t rows, cols;
  mp_tp_split split;
  int tp;            /* shards it was saved in */
  ck_piece *pieces;  /* (tp) by tp rank */
} ck_tensor;

/* The training settings a resume compares with its plan's (all but the seed): their keys under
 * $.plan.training, and ck_training_values gives a config's in the same order. */
enum { CK_TRAINING_SETTINGS = 9 };
extern const char *const ck_training_keys[CK_TRAINING_SETTINGS];
void ck_training_values(const mp_training_config *t, double out[CK_TRAINING_SETTINGS]);

/* The plan a checkpoint was saved with ($.plan), as far as loading it needs. The manifest holds
 * the plan file's object (topology/plan.h: mp_plan_to_json, read back by mp_plan_parse_json);
 * manifests written before that hold a flat object (dp, pp, tp beside batch and training, the
 * seed a string), which is still read. */
typedef struct {
  int dp, pp, tp;
  int64_t global_batch, seq_len;
  bool has_seed;                /* false: a flat plan whose seed is missing or not a number */
  uint64_t seed;
  double training[CK_TRAINING_SETTINGS]; /* ck_training_keys' values; NaN where a flat plan
                                            lacks one (a resume then does not compare it) */
} ck_saved_plan;

typedef struct {
  char path[CK_PATH_BYTES]; /* the checkpoint directory */
  char file[CK_PATH_BYTES]; /* the manifest, as messages name it */
  cJSON *root;
  int version;
  int64_t step;
  ck_saved_plan plan;
  int num_files;
  ck_file *files;
  int num_tensors;
  ck_tensor *tensors;
} ck_manifest;

/* The shard files a load reads, opened on first use. */
typedef struct {
  const ck_manifest *mf;
  FILE **handles; /* (num_files) */
} ck_shard_reader;

/* The manifest's whole number at object[key] (where: its JSON path in messages). */
mp_status ck_manifest_int(const ck_manifest *mf, const cJSON *object, const char *where,
                          const char *key, int64_t *out, mp_error *err);
/* Reads and checks path/manifest.json (format, version, plan, files, tensors); ck_manifest_close
 * frees. */
mp_status ck_manifest_open(const char *path, ck_manifest *mf, mp_error *err);
void ck_manifest_close(ck_manifest *mf);
/* A file's text (at most 64 MiB), NUL-terminated, or NULL; free() it. */
char *ck_read_text(const char *path);
/* Checks that the manifest's model is `layout` (naming the first difference). */
mp_status ck_check_model(const ck_manifest *mf, const mp_param_layout *layout,
                         const char *model_source, mp_error *err);
/* Checks files first, first + stride, ...: present, checksum, size, header. */
mp_status ck_verify_files(const ck_manifest *mf, int first, int stride, mp_error *err);
mp_status ck_reader_open(const ck_manifest *mf, ck_shard_reader *reader, mp_error *err);
void ck_reader_close(ck_shard_reader *reader);
/* dest (count floats) = elements [first, first + count) of tp rank `rank` of `size`'s shard of
 * tensor i's array `array` (0 parameters, 1 and 2 AdamW's moments), read from the saved shards
 * that hold them, whatever tp they were saved with. */
mp_status ck_read_shard(ck_shard_reader *reader, int i, int array, int rank, int size,
                        size_t first, size_t count, float *dest, mp_error *err);

/* ---- this rank's state: its chunks and their tensors (checkpoint.c) ---- */

typedef struct {
  int global;          /* index in the one-rank layout */
  size_t offset;       /* floats from the start of the chunk's flat layout */
  size_t count;        /* floats of this rank's shard */
  mp_tp_split split;
  bool tied_copy;      /* the last stage's copy of wte: not saved, loaded from wte */
  int ep_rank, ep_size; /* expert parallelism: the shard is the run of count floats at
                           ep_rank x count of the whole (saved) tensor; ep_size 1 otherwise */
  /* The elements [held_first, held_first + held_count) of the shard this rank keeps: all of
   * them, or with ZeRO-3 a block tensor's part (mp_stage_layout_held_params). */
  size_t held_first, held_count;
} view_tensor;

typedef struct {
  int index;           /* the trainer's chunk, whose arrays mp_trainer_read_state reads */
  size_t count;        /* floats of its flat layout */
  size_t first, moments; /* the AdamW moments it keeps: of elements [first, first + moments) */
  int num_tensors;
  view_tensor *tensors;
  mp_stage_span stage;  /* the piece of the chain it holds */
  int stage_index;     /* c x pp + pp rank */
  bool sharded_params; /* ZeRO-3: this rank keeps only its part of the blocks' parameters */
} view_chunk;

typedef struct {
  const mp_param_layout *layout;
  mp_trainer *trainer;
  int num_chunks;
  view_chunk *chunks;
  int tp_rank, tp_size;
} rank_view;

/* Saves and loads move the AdamW moments (and ZeRO-3's parameters) in pieces of at most this many
 * floats, so that no rank holds more than its own part and one piece. */
enum { CK_PIECE_FLOATS = 1 << 18 };

/* The trainer's chunks and their tensors, as the files name them; ck_view_free frees. */
mp_status ck_view_create(const mp_checkpoint_context *ctx, rank_view *view, mp_error *err);
void ck_view_free(rank_view *view);

/* ---- the checkpoints of a directory (checkpoint.c) ---- */

enum { CK_MAX_LISTED = 4096 };
/* Complete checkpoints under dir, newest first: steps[] (up to max); returns how many. */
int ck_list_checkpoints(const char *dir, int64_t *steps, int max);
/* True when path/manifest.json is a checkpoint manifest; run_id (run_id_bytes) gets its run's id
 * (may be NULL). */
bool ck_read_manifest_run(const char *path, char *run_id, size_t run_id_bytes);
bool ck_has_manifest(const char *path);

#endif /* MPENGINE_ENGINE_CHECKPOINT_INTERNAL_H */
