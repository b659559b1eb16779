/*
 * topology/plan.h — the parallelism config ("plan"): what `mpengine plan` writes and what
 * `mpengine run` and `mpengine schedule` read. It says how one model is laid out on a cluster and
 * how a step is driven; the optimizer settings ride along so a plan file is a whole training job.
 *
 * Format (unknown keys are refused with the closest known key named):
 *   {
 *     "format": "mpengine-plan", "version": 1,
 *     "model": "../models/tiny-gpt.json",   model description; a relative path is taken from the
 *                                           plan file's own directory
 *     "cluster": "cpu-local",               preset name or cluster file (relative as above)
 *     "parallel": {"dp": 1, "pp": 1, "tp": 1,
 *                  "cp": 1,                 optional: context parallelism, the ranks that
 *                                           share each sequence (seq_len a multiple of 2 cp);
 *                                           written only above 1
 *                  "ep": 1,                 optional: expert parallelism, the ranks that
 *                                           split each mixture-of-experts block's experts,
 *                                           folded over the dp x cp ranks (Megatron-Core's
 *                                           expert_model_parallel_size): it divides dp x cp
 *                                           (and the model's experts, checked with the
 *                                           model); written only above 1
 *                  "virtual_stages": 1,     model chunks per pipeline rank (interleaving)
 *                  "sequence_parallel": false, "zero_stage": 0,
 *                  "zero_shard_size": 4},      optional, with zero_stage 1 or 2: ZeRO shards
 *                                           over groups of this many consecutive dp ranks and
 *                                           replicates across the groups (FSDP's hybrid
 *                                           sharding, HSDP); it divides dp; default dp
 *     "batch": {"global_batch": 16,         sequences per optimizer step, over all dp ranks
 *               "micro_batch": 4,           sequences per forward/backward
 *               "num_micro_batches": 4,     per dp rank and step: global = dp x micro x num
 *               "seq_len": 64},             tokens per sequence
 *     "schedule": "1f1b",                   gpipe | 1f1b | interleaved-1f1b | zb-h1
 *     "layers_per_stage": [8],              optional: pp x virtual_stages counts, in order
 *     "recompute": "none",                  none | selective | full
 *     "training": {                         optional, every key optional (defaults shown)
 *       "steps": 100, "seed": 1337,
 *       "learning_rate": 6e-4, "warmup_steps": 0, "min_lr_ratio": 0.1,  cosine decay to
 *                                           min_lr_ratio x learning_rate at the last step
 *       "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
 *       "grad_clip": 1.0                    global gradient-norm clip; 0 disables
 *     },
 *     "predicted": {...}                    optional, written by the planner, not read by run
 *   }
 */
#ifndef MPENGINE_TOPOLOGY_PLAN_H
#define MPENGINE_TOPOLOGY_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/error.h"
#include "topology/layer_cost.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_PLAN_PATH_BYTES = 1024, MP_PLAN_MAX_STAGES = 1024 };

typedef struct {
  int64_t steps;
  uint64_t seed;
  double learning_rate;  /* peak, reached after warmup_steps */
  int64_t warmup_steps;  /* linear from learning_rate / warmup_steps at step 0 */
  double min_lr_ratio;   /* cosine decay ends at min_lr_ratio x learning_rate */
  double weight_decay;   /* decoupled (AdamW), on matrices and embeddings, not biases or norms */
  double beta1, beta2, eps;
  double grad_clip;      /* max global gradient norm; 0 = no clipping */
} mp_training_config;

typedef struct {
  char source[MP_PLAN_PATH_BYTES];     /* the plan file, for messages */
  char model_path[MP_PLAN_PATH_BYTES]; /* resolved against the plan's directory */
  char cluster[MP_PLAN_PATH_BYTES];    /* preset name, or resolved path */
  int dp, pp, tp, virtual_stages;
  int cp;                              /* context-parallel ranks per sequence (1: none); the
                                          world is dp x cp x pp x tp */
  int ep;                              /* expert-parallel ranks (0, a plan built in code, or 1:
                                          none): each MoE block's experts are split over groups
                                          of ep of the dp x cp ranks; it divides dp x cp */
  bool sequence_parallel;
  int zero_stage;                      /* 0 .. 3 */
  int zero_shard_size;                 /* dp ranks a ZeRO part is cut over: dp, or fewer
                                          (HSDP: replicas of dp / zero_shard_size groups);
                                          0 (a plan built in code): dp */
  int64_t global_batch, micro_batch, num_micro_batches, seq_len;
  char schedule[32];
  mp_recompute recompute;
  int num_stage_counts;                /* 0 when layers_per_stage is absent */
  int layers_per_stage[MP_PLAN_MAX_STAGES];
  mp_training_config training;
} mp_plan;

/* The defaults of the "training" section. */
mp_training_config mp_training_config_default(void);

/* The ranks that hold the same weights and sum their gradients: dp x cp (cp 0, a plan built in
 * code, counts as 1). */
int mp_plan_replicas(const mp_plan *plan);

/* The plan's ep: its ep, 1 when it is 0 (a plan built in code). */
int mp_plan_ep(const mp_plan *plan);

/* The ranks the plan runs on: dp x cp x pp x tp. */
int mp_plan_world_size(const mp_plan *plan);

/* The ranks the plan's ZeRO state is cut over: zero_shard_size when it is set and below dp
 * (hybrid sharding, cp 1 only), else all dp x cp replicas. */
int mp_plan_zero_shard(const mp_plan *plan);

/* Reads and validates a plan file: sizes positive, global_batch = dp x micro_batch x
 * num_micro_batches, schedule and recompute known, layers_per_stage has pp x virtual_stages
 * entries, seq_len a multiple of 2 cp, ep dividing dp x cp (and not with hybrid sharding). Errors name the file and the JSON path (MP_ERR_INPUT). */
mp_status mp_plan_load(const char *path, mp_plan *out, mp_error *err);

/* The same from text; relative model and cluster paths are resolved against base_dir. */
mp_status mp_plan_parse_text(const char *text, const char *source, const char *base_dir,
                             mp_plan *out, mp_error *err);

/* The same from a parsed JSON object (the plan file's root, or the "plan" object a checkpoint
 * manifest holds); source names it in messages, which give JSON paths from that object ($). */
mp_status mp_plan_parse_json(const cJSON *root, const char *source, const char *base_dir,
                             mp_plan *out, mp_error *err);

/* What the planner predicts for a plan, written as its "predicted" object (run does not read
 * it). memory_bytes_per_rank has num_ranks entries, one per pipeline rank. */
typedef struct {
  double step_s, tokens_per_s, tflops_per_gpu, mfu, bubble_fraction;
  double capacity_bytes;
  int num_ranks;
  double memory_bytes_per_rank[MP_PLAN_MAX_STAGES];
} mp_plan_prediction;

/* The plan (and predicted, when not NULL) as a JSON object in the format above: the one writer
 * of a plan, for the plan file (mp_plan_write) and a checkpoint manifest's "plan". model_path and
 * cluster are written as they are; the training section in full, its seed a number (exact for
 * every seed a plan file can hold, which are within 2^53); zero_shard_size only when it is below
 * dp. mp_plan_parse_json of it gives back the plan. NULL when out of memory; cJSON_Delete frees.
 */
cJSON *mp_plan_to_json(const mp_plan *plan, const mp_plan_prediction *predicted);

/* Writes plan (and predicted, when not NULL) to path in the format above, through a temporary
 * name in the same directory renamed into place, so a reader never sees half a file; an existing
 * file at path is replaced (the caller decides whether that is wanted); the text is
 * mp_plan_to_json's. Fails with MP_ERR_RUNTIME naming the path when it cannot be written.
 * mp_plan_load of the file gives back the plan. */
mp_status mp_plan_write(const mp_plan *plan, const mp_plan_prediction *predicted,
                        const char *path, mp_error *err);

/* Learning rate at step (0-based) of a run of training->steps steps: linear warmup, then cosine
 * decay from learning_rate to min_lr_ratio x learning_rate. */
double mp_training_learning_rate(const mp_training_config *training, int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_PLAN_H */
