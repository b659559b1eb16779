/*
 * engine/checkpoint.h — sharded training checkpoints: saved by every rank of a run, resumed
 * bit-for-bit under the same tensor-parallel size, or resharded to another one, and read back
 * whole for export (DESIGN.md principle 5, "Nothing is lost").
 *
 * A checkpoint is a directory DIR/step-<N>/ (N = completed optimizer steps) holding
 *   rank-<R>.bin    one per tensor-parallel rank: a 32-byte header (magic "MPCKSHD1", uint32
 *                   tp rank, uint32 tp size, uint64 floats per array, uint64 step), then that
 *                   rank's fp32 parameters, AdamW first moments and second moments, each in the
 *                   shard order of engine/gpt_model_tp.h (the one-rank layout's order at tp = 1)
 *   manifest.json   format "mpengine-checkpoint", version 1: the step, the plan (layout, batch,
 *                   training settings), the model (name, shape, and its description's JSON text
 *                   so export needs nothing else), the data position and RNG state (the seed and
 *                   the step: batches and initialisation are pure functions of them, so there is
 *                   nothing else to save), the learning-rate schedule state, every tensor of the
 *                   one-rank layout with its global shape, split (tensor_parallel/shard.h) and,
 *                   per rank file, where its shard sits in the file and which blocks of the global
 *                   tensor it holds, and each shard file's size and FNV-1a 64 checksum.
 *
 * Saving is crash-safe: the ranks write their files into DIR/step-<N>.tmp-<pid of rank 0>/
 * (temporary name, fsync, rename), meet at a barrier, and rank 0 writes the manifest (same way)
 * and renames the directory into place, then syncs DIR. A kill at any moment leaves every earlier
 * checkpoint whole; a directory without a valid manifest is never loaded.
 *
 * Checkpoints cover dp = pp = 1 layouts (any tp); runs with dp > 1, pp > 1 or ZeRO-1 are refused
 * at start-up when --checkpoint-dir is given (mp_trainer_cpu_state). The format's tensor table is
 * global, so any tp can load any tp's checkpoint.
 */
#ifndef MPENGINE_ENGINE_CHECKPOINT_H
#define MPENGINE_ENGINE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/comm.h"
#include "engine/gpt_model.h"
#include "engine/trainer.h"
#include "topology/model.h"
#include "topology/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a save or a load works on: this rank's trainer and where it sits. */
typedef struct {
  const mp_plan *plan;
  const mp_model *model;
  mp_trainer *trainer;
  mp_comm *group; /* the tensor-parallel group (barrier, broadcast), or NULL on one rank */
  int tp_rank;    /* 0 on one rank */
  int tp_size;    /* 1 on one rank */
} mp_checkpoint_context;

/* Saves the state after `step` completed steps as DIR/step-<step>/ (created with DIR when
 * missing; an existing step-<step> is replaced), then, on rank 0 and when keep > 0, removes all
 * but the `keep` newest complete checkpoints. Collective over ctx->group. MP_ERR_RUNTIME naming
 * the path when a file cannot be written; MP_ERR_INPUT on the CUDA backend. */
mp_status mp_checkpoint_save(const char *dir, int64_t step, int keep,
                             const mp_checkpoint_context *ctx, mp_error *err);

/* The newest complete checkpoint under dir (the step-<N> with the largest N whose manifest.json
 * names the format): its path in path (path_bytes) and *step. MP_ERR_INPUT saying so when there
 * is none (a resume must never silently start from scratch). */
mp_status mp_checkpoint_find_latest(const char *dir, char *path, size_t path_bytes,
                                    int64_t *step, mp_error *err);

/* Loads checkpoint directory path into ctx->trainer (every rank calls it; no communication):
 * checks the manifest, that it is of the same model (naming the first difference), batch and
 * seed, that every shard file is there with its checksum, then reads this rank's shard (same tp)
 * or reassembles the global tensors from every file and cuts this rank's shard (another tp).
 * *step = the completed steps. MP_ERR_INPUT naming the file and what is wrong. */
mp_status mp_checkpoint_load(const char *path, const mp_checkpoint_context *ctx, int64_t *step,
                             mp_error *err);

/* Export: reads checkpoint directory path whole (checksums verified), parses the model
 * description it carries and lays it out at the saved seq_len; *layout (free with
 * mp_gpt_layout_free) and *params (mp_gpt_layout_num_params floats, free with free()) get the
 * global fp32 parameters. MP_ERR_INPUT as mp_checkpoint_load. */
mp_status mp_checkpoint_read_params(const char *path, mp_gpt_layout **layout, float **params,
                                    int64_t *step, mp_error *err);

/* Parses and checks a manifest's JSON text as a load does before it opens any shard file (format,
 * version, layout, shard list, batch, and, when the manifest carries the model's description,
 * that description and the tensor table against it), without touching the disk; everything it
 * allocates is freed. source names the text in messages. MP_ERR_INPUT saying what is wrong. For
 * the fuzz target tests/fuzz/checkpoint_manifest_fuzz.c and for tools that vet a manifest. */
mp_status mp_checkpoint_manifest_check_text(const char *text, const char *source, mp_error *err);

/* FNV-1a 64 of a file's bytes (the manifest's checksums). MP_ERR_INPUT when it cannot be read. */
mp_status mp_checkpoint_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes,
                                      mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_CHECKPOINT_H */
