/*
 * engine/checkpoint/checkpoint.h — sharded training checkpoints of any layout `mpengine run` trains
 * (dp x pp x tp, virtual stages, ZeRO-1): saved by the ranks of a run, resumed bit-for-bit under
 * the same layout, or under any other layout (resharded), and read back whole for export (DESIGN.md
 * principle 5, "Nothing is lost").
 *
 * A checkpoint is a directory DIR/step-<N>/ (N = completed optimizer steps) holding
 *   pp-<P>-tp-<T>.bin  one per (pipeline rank P, tensor-parallel rank T), written by that
 *                   position's data-parallel rank 0 (the state is the same on every dp replica,
 *                   except ZeRO-1's AdamW moments: dp rank d holds part d of each chunk's moments,
 *                   and sends it to dp rank 0 over the dp group for the save). A 32-byte header
 *                   (magic "MPCKSHD2", uint32 pp rank, uint32 tp rank, uint64 floats per array,
 *                   uint64 step), then three fp32 arrays of that many floats, little-endian:
 *                   parameters, AdamW first moments, second moments. Each array holds the rank's
 *                   chunks in order (chunk c = stage c x pp + P), each chunk's tensors in the
 *                   one-rank layout's order, each tensor's tp shard as engine/model/stage_cpu.h
 * cuts
 *                   it. The last stage's tied copy of the token table (embedding.wte on a stage
 *                   without the embedding) is not saved: it is bitwise the first stage's wte, and
 *                   so are its AdamW moments, because the trainer sums the two gradients over the
 *                   embedding group before anything else touches them, so both copies see the same
 *                   gradient, clipping scale and update (engine/train/trainer.c,
 * finish_parallel_step;
 *                   the dp all-reduce then sees equal inputs for both, which Open MPI sums alike:
 *                   the bit-exact resume tests of pp = 2 would catch a difference).
 *                   Why per (pp, tp) and not per world rank: the dp replicas hold the same state,
 *                   so one copy is enough (dp times less disk and I/O), and the files do not depend
 *                   on dp at all; the price is one gather of ZeRO-1's moments over dp per save.
 *   manifest.json   format "mpengine-checkpoint", version 2: the step, the plan (the plan file's
 *                   object, topology/plan.h's mp_plan_to_json; manifests written before it held
 *                   a flat one, layout beside batch and training with the seed a string, still
 *                   read), the run (its id and plan file), the model (name, shape, and its description's JSON
 *                   text so export needs nothing else), the data position and RNG state (the seed
 *                   and the step: batches and initialisation are pure functions of them, so there
 *                   is nothing else to save), the learning-rate schedule state; the GLOBAL tensor
 *                   table: every tensor of the one-rank layout with its full shape, its split
 *                   (tensor_parallel/shard.h), the pipeline rank holding it and, per tp rank, the
 *                   file, the float offset inside each array and the blocks of the full tensor
 *                   that shard holds; and per file its coordinates, its stages (chain pieces), size
 *                   and FNV-1a 64 checksum.
 *
 * Expert parallelism: an ep rank holds only its experts' rows of each block's expert_fc1 and
 * expert_fc2; dp rank 0 (ep rank 0) writes the tensors whole, the other ep ranks of its ep group
 * sending it their rows (parameters and moments) in pieces (with ZeRO, cut over the
 * expert-data-parallel group, each part from the replica holding it), so the files do not depend
 * on ep, and a load reads each rank's run of rows.
 *
 * Loading under any layout: each rank, for each tensor of each of its chunks (the tied copy
 * reads wte), reads the shards the table names: its own shard directly when the tp sizes agree
 * (replicated tensors from tp rank 0's file), else the full tensor reassembled from every shard
 * and cut again; AdamW's moments likewise, only the part this dp rank keeps under ZeRO-1. So a
 * checkpoint of (dp, pp, tp, v, ZeRO) resumes under any other (dp', pp', tp', v', ZeRO'): the
 * losses then agree with an uninterrupted run to float round-off (the reductions' order differs);
 * under the same layout they are the very same numbers. Version-1 checkpoints (dp = pp = 1,
 * rank-<R>.bin per tp rank, header "MPCKSHD1") load the same way.
 *
 * Saving is crash-safe: world rank 0 creates DIR/step-<N>.tmp-<its pid>/ and tells the others; the
 * writers write their files there (temporary name, fsync, rename) and send world rank 0 a record
 * (their tensors, size, checksum, or their error), which rank 0 waits for from every writer (a
 * barrier over the world group); rank 0 then writes the manifest last (same way), renames the
 * directory into place and syncs DIR; a final agreement over the world group makes every rank
 * return the same status. A kill at any moment leaves every earlier checkpoint whole; a directory
 * without a valid manifest is never loaded. Loading checks the files' checksums spread over the
 * ranks (file f by world rank f mod world size) and agrees on the outcome, so every rank reports
 * the same error and none starts training alone.
 *
 * Saves and loads move the state in pieces of at most 1 MiB (mp_trainer_read_state,
 * mp_trainer_write_state), from and to wherever the backend keeps it: on the CUDA backend the
 * GPU, with no host copy of the state. The files are the same, so a run saved on GPUs resumes on
 * CPUs and the other way round.
 */
#ifndef MPENGINE_ENGINE_CHECKPOINT_H
#define MPENGINE_ENGINE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/model/param_layout.h"
#include "engine/train/trainer.h"
#include "engine/weights/weight_source.h"
#include "topology/model.h"
#include "topology/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a save or a load works on: this rank's trainer and where it sits (topology/grid.h). */
typedef struct {
  const mp_plan *plan;
  const mp_model *model;
  mp_trainer *trainer;
  mp_comm *world; /* every rank of the job, group rank = world rank; NULL on one rank */
  mp_comm *dp;    /* the ranks that hold the same state: this rank's dp x cp group (group rank =
                     dp_rank below); NULL when dp = cp = 1 */
  int dp_rank, pp_rank, tp_rank; /* this rank's coordinates, dp_rank its place among the dp x cp
                                    replicas (dp rank x cp + cp rank); 0 on one rank */
  /* The run a save belongs to (the manifest's "run": {"id"}), the same on every rank: a fresh
   * run's new id, or on --resume the id of the checkpoint it continues. --keep prunes only
   * checkpoints of this id. NULL or "" for none. */
  const char *run_id;
  /* A load accepts training settings that differ from the checkpoint's (steps, learning rate,
   * warmup, decay, the optimizer's): Megatron's --override-opt_param-scheduler. Otherwise it
   * refuses them, naming each. */
  bool override_training;
  mp_comm *ep;    /* expert parallelism: this rank's ep group (group rank = ep rank = dp_rank
                     mod ep, topology/grid.h), whose ranks hold different experts: a save
                     gathers them onto the writer, so the files hold every expert whole, as at
                     ep 1 (and resume at any ep); NULL: ep 1 */
} mp_checkpoint_context;

/* Bytes of a run id with its NUL; mp_checkpoint_new_run_id writes 16 hex digits. */
enum { MP_CHECKPOINT_RUN_ID_BYTES = 64 };

/* A new run id (16 hex digits from /dev/urandom, or the clock and pid without it). */
void mp_checkpoint_new_run_id(char *out, size_t out_bytes);

/* The run id of checkpoint directory path (its manifest), "" for a checkpoint older than run
 * ids. MP_ERR_INPUT when path holds no checkpoint manifest. */
mp_status mp_checkpoint_run_id(const char *path, char *out, size_t out_bytes, mp_error *err);

/* For a run that does not resume: MP_OK when dir is missing or holds no complete checkpoint;
 * otherwise MP_ERR_INPUT naming dir and its checkpoints (another run's: saving into dir would
 * replace some of them and leave the others, and a later --resume would mix the two runs) and
 * saying how to continue that run (--resume) or to choose another directory. Reads dir only. */
mp_status mp_checkpoint_check_dir(const char *dir, mp_error *err);

/* MP_OK when the trainer's state can be checkpointed (any layout, either backend); MP_ERR_INPUT
 * saying what to change otherwise. No communication: `mpengine run` calls it before the first
 * step when --checkpoint-dir is given. */
mp_status mp_checkpoint_check_trainer(const mp_checkpoint_context *ctx, mp_error *err);

/* Saves the state after `step` completed steps as DIR/step-<step>/ (created with DIR when
 * missing; an existing step-<step> is replaced by swapping the two in one rename, so it is whole
 * at every moment), then, on world rank 0 and when keep > 0, removes all but the `keep` newest
 * complete checkpoints of ctx->run_id (another run's are left alone). Left-overs of saves that
 * were killed (step-<N>.tmp-<pid>, step-<N>.old-<pid>) are removed first. Collective over
 * ctx->world (and ctx->dp with ZeRO-1); every rank returns the same status. MP_ERR_RUNTIME naming
 * the path when a file cannot be written. */
mp_status mp_checkpoint_save(const char *dir, int64_t step, int keep,
                             const mp_checkpoint_context *ctx, mp_error *err);

/* The newest complete checkpoint under dir (the step-<N> with the largest N whose manifest.json
 * names the format): its path in path (path_bytes) and *step. MP_ERR_INPUT saying so when there
 * is none (a resume must never silently start from scratch). */
mp_status mp_checkpoint_find_latest(const char *dir, char *path, size_t path_bytes,
                                    int64_t *step, mp_error *err);

/* What a user's --checkpoint DIR names (export, sample): DIR itself when it holds manifest.json,
 * else the newest checkpoint under it (mp_checkpoint_find_latest, *step set; left alone for DIR
 * itself). MP_ERR_INPUT saying it is neither, naming `option` ("--checkpoint"). */
mp_status mp_checkpoint_resolve(const char *dir, const char *option, char *path,
                                size_t path_bytes, int64_t *step, mp_error *err);

/* Loads checkpoint directory path (saved under any layout, version 1 or 2) into ctx->trainer:
 * checks the manifest, that it is of the same model (naming the first difference), batch and
 * seed, the training settings (each one that differs, with both values, unless
 * ctx->override_training), that every shard file is there with its checksum (spread over the
 * ranks), then fills each of this rank's chunks: parameters and the AdamW moments it keeps, read
 * from the files that hold them (see the file comment). Collective over ctx->world; every rank
 * returns the same status. *step = the completed steps. MP_ERR_INPUT naming the file and what is
 * wrong. */
mp_status mp_checkpoint_load(const char *path, const mp_checkpoint_context *ctx, int64_t *step,
                             mp_error *err);

/* Export: writes the global fp32 parameters of checkpoint directory path (checksums verified)
 * to `out` in format (engine/weights/weight_source.h's sinks: llm.c's GPT-2 file, version 3, or a
 * Hugging Face GPT2LMHeadModel directory; options as mp_weight_sink_open's, NULL for defaults),
 * laid out from the model description the manifest carries at the saved seq_len; each tensor
 * reassembled from its shards on its own, so the memory needed is one tensor. *step and *num_params
 * describe what was written. MP_ERR_INPUT as mp_checkpoint_load; MP_ERR_RUNTIME (or MP_ERR_INPUT
 * for a bad path) when out cannot be written. */
mp_status mp_checkpoint_export(const char *path, mp_weight_format format,
                               const mp_weight_sink_options *options, const char *out,
                               int64_t *step, size_t *num_params, mp_error *err);

/* Parses and checks a manifest's JSON text as a load does before it opens any shard file (format,
 * version, the plan in either form, file list, the tensor table and every shard's place in its
 * file, and, when the manifest carries the model's description, that description and the tensor
 * table against it), without touching the disk; everything it allocates is freed. source names
 * the text in messages. MP_ERR_INPUT saying what is wrong. For the fuzz target
 * tests/fuzz/checkpoint_manifest_fuzz.c and for tools that vet a manifest. */
mp_status mp_checkpoint_manifest_check_text(const char *text, const char *source, mp_error *err);

/* FNV-1a 64 of a file's bytes (the manifest's checksums). MP_ERR_INPUT when it cannot be read. */
mp_status mp_checkpoint_file_checksum(const char *path, uint64_t *checksum, uint64_t *bytes,
                                      mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_CHECKPOINT_H */
