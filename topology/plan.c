/* topology/plan.c — reading, checking and writing parallelism configs; see plan.h for the format.
 * The one writer and the one reader of the plan's JSON: the plan file (`mpengine plan --out`) and
 * the "plan" object of a checkpoint manifest (engine/checkpoint/) both go through them. */
#include "topology/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/json_reader.h"

static const char *const kTopKeys[] = {"format", "version", "model", "cluster", "parallel",
                                       "batch", "schedule", "layers_per_stage", "recompute",
                                       "training", "predicted", NULL};
static const char *const kParallelKeys[] = {"dp", "cp", "pp", "tp", "virtual_stages", "ep",
                                            "sequence_parallel", "zero_stage",
                                            "zero_shard_size", NULL};
static const char *const kBatchKeys[] = {"global_batch", "micro_batch", "num_micro_batches",
                                         "seq_len", NULL};
static const char *const kTrainingKeys[] = {"steps", "seed", "learning_rate", "warmup_steps",
                                            "min_lr_ratio", "weight_decay", "beta1", "beta2",
                                            "eps", "grad_clip", NULL};
static const char *const kScheduleNames[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", NULL};
static const char *const kRecomputeNames[] = {"none", "selective", "full", NULL};

enum { kMaxParallel = 1 << 20 };

mp_training_config mp_training_config_default(void) {
  mp_training_config config = {
      .steps = 100,
      .seed = 1337,
      .learning_rate = 6e-4,
      .warmup_steps = 0,
      .min_lr_ratio = 0.1,
      .weight_decay = 0.1,
      .beta1 = 0.9,
      .beta2 = 0.95,
      .eps = 1e-8,
      .grad_clip = 1.0,
  };
  return config;
}

double mp_training_learning_rate(const mp_training_config *training, int64_t step) {
  const double peak = training->learning_rate;
  if (step < training->warmup_steps) {
    return peak * (double)(step + 1) / (double)training->warmup_steps;
  }
  const int64_t decay_steps = training->steps - training->warmup_steps;
  if (decay_steps <= 1) return peak;
  double progress = (double)(step - training->warmup_steps) / (double)(decay_steps - 1);
  if (progress > 1.0) progress = 1.0;
  const double min_lr = peak * training->min_lr_ratio;
  return min_lr + 0.5 * (peak - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}

static void resolve_path(const char *base_dir, const char *path, char *out, size_t out_bytes) {
  if (path[0] == '/' || base_dir == NULL || base_dir[0] == '\0' || strcmp(base_dir, ".") == 0) {
    snprintf(out, out_bytes, "%s", path);
  } else {
    snprintf(out, out_bytes, "%s/%s", base_dir, path);
  }
}

static mp_status parse_int_field(const mp_json_reader *reader, const cJSON *object,
                                 const char *path, const char *key, bool required,
                                 int64_t default_value, int64_t *out) {
  if (required) {
    MP_TRY(mp_json_require_int(reader, object, path, key, MP_JSON_POSITIVE, out));
  } else {
    MP_TRY(mp_json_optional_int(reader, object, path, key, MP_JSON_POSITIVE, default_value, out));
  }
  if (*out > kMaxParallel * (int64_t)64) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: %lld is larger than the supported %lld",
                   reader->source, path, key, (long long)*out, (long long)kMaxParallel * 64);
  }
  return MP_OK;
}

static mp_status parse_parallel(const mp_json_reader *reader, const cJSON *root, mp_plan *plan) {
  const cJSON *parallel = cJSON_GetObjectItemCaseSensitive(root, "parallel");
  if (parallel == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $: missing required key \"parallel\" (an object with dp, pp, tp)",
                   reader->source);
  }
  MP_TRY(mp_json_expect_object(reader, parallel, "$.parallel", "the parallel layout"));
  MP_TRY(mp_json_check_keys(reader, parallel, "$.parallel", kParallelKeys));
  int64_t dp, cp, pp, tp, virtual_stages, zero_stage;
  MP_TRY(parse_int_field(reader, parallel, "$.parallel", "dp", true, 1, &dp));
  MP_TRY(mp_json_optional_int(reader, parallel, "$.parallel", "cp", MP_JSON_POSITIVE, 1, &cp));
  MP_TRY(parse_int_field(reader, parallel, "$.parallel", "pp", true, 1, &pp));
  MP_TRY(parse_int_field(reader, parallel, "$.parallel", "tp", true, 1, &tp));
  MP_TRY(parse_int_field(reader, parallel, "$.parallel", "virtual_stages", false, 1,
                         &virtual_stages));
  MP_TRY(mp_json_optional_bool(reader, parallel, "$.parallel", "sequence_parallel", false,
                               &plan->sequence_parallel));
  MP_TRY(mp_json_optional_int(reader, parallel, "$.parallel", "zero_stage", MP_JSON_NONNEGATIVE,
                              0, &zero_stage));
  if (zero_stage > 3) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_stage: %lld is not a ZeRO stage; use 0 (replicated), 1 "
                   "(optimizer state sharded across dp), 2 (and gradients) or 3 (and parameters)",
                   reader->source, (long long)zero_stage);
  }
  /* Each size may be up to 2^26 here, so dp x cp x pp x tp could overflow int64 (undefined
   * behaviour, found by tests/fuzz/plan_json_fuzz.c): bound the factors and the products one by
   * one, so that no product exceeds 2^40. */
  if (dp > kMaxParallel || pp > kMaxParallel || tp > kMaxParallel || cp > kMaxParallel ||
      dp * pp > kMaxParallel || dp * pp * tp > kMaxParallel || dp * pp * tp * cp > kMaxParallel) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel: dp x cp x pp x tp = %lld x %lld x %lld x %lld ranks is more "
                   "than the supported %d",
                   reader->source, (long long)dp, (long long)cp, (long long)pp, (long long)tp,
                   kMaxParallel);
  }
  plan->dp = (int)dp;
  plan->cp = (int)cp;
  plan->pp = (int)pp;
  plan->tp = (int)tp;
  plan->virtual_stages = (int)virtual_stages;
  plan->zero_stage = (int)zero_stage;
  int64_t shard = dp;
  MP_TRY(mp_json_optional_int(reader, parallel, "$.parallel", "zero_shard_size",
                              MP_JSON_POSITIVE, dp, &shard));
  if (dp % shard != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_shard_size: %lld does not divide dp %lld (ZeRO's groups "
                   "of dp ranks must tile it)",
                   reader->source, (long long)shard, (long long)dp);
  }
  if (shard < dp && zero_stage != 1 && zero_stage != 2) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_shard_size: %lld shards ZeRO's state within groups of "
                   "%lld of the %lld dp ranks, but zero_stage is %lld; hybrid sharding runs with "
                   "zero_stage 1 or 2",
                   reader->source, (long long)shard, (long long)shard, (long long)dp,
                   (long long)zero_stage);
  }
  if (shard < dp && cp > 1) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_shard_size: hybrid sharding (%lld of the %lld dp ranks) "
                   "does not run with context parallelism (cp %lld) yet; drop zero_shard_size to "
                   "shard ZeRO's state over all dp x cp ranks",
                   reader->source, (long long)shard, (long long)dp, (long long)cp);
  }
  plan->zero_shard_size = (int)shard;
  /* Expert parallelism, folded over the dp x cp ranks as Megatron-Core does: the experts' ranks
   * are groups of ep of them, so ep divides dp x cp (which is at most 2^20 here). */
  int64_t ep = 1;
  MP_TRY(mp_json_optional_int(reader, parallel, "$.parallel", "ep", MP_JSON_POSITIVE, 1, &ep));
  if ((dp * cp) % ep != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.ep: %lld does not divide dp x cp = %lld x %lld = %lld (the "
                   "expert-parallel groups are cut out of the dp x cp ranks that share the "
                   "other weights)",
                   reader->source, (long long)ep, (long long)dp, (long long)cp,
                   (long long)(dp * cp));
  }
  if (ep > 1 && shard < dp) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.parallel.zero_shard_size: hybrid sharding (%lld of the %lld dp ranks) "
                   "is not planned with expert parallelism (ep %lld) yet; drop one of them",
                   reader->source, (long long)shard, (long long)dp, (long long)ep);
  }
  plan->ep = (int)ep;
  return MP_OK;
}

int mp_plan_replicas(const mp_plan *plan) { return plan->dp * (plan->cp > 1 ? plan->cp : 1); }

int mp_plan_ep(const mp_plan *plan) { return plan->ep > 1 ? plan->ep : 1; }

int mp_plan_world_size(const mp_plan *plan) { return mp_plan_replicas(plan) * plan->pp * plan->tp; }

int mp_plan_zero_shard(const mp_plan *plan) {
  const int s = plan->zero_shard_size;
  return s > 0 && s < plan->dp ? s : mp_plan_replicas(plan);
}

static mp_status parse_batch(const mp_json_reader *reader, const cJSON *root, mp_plan *plan) {
  const cJSON *batch = cJSON_GetObjectItemCaseSensitive(root, "batch");
  if (batch == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $: missing required key \"batch\" (an object with global_batch, "
                   "micro_batch, num_micro_batches, seq_len)",
                   reader->source);
  }
  MP_TRY(mp_json_expect_object(reader, batch, "$.batch", "the batch sizes"));
  MP_TRY(mp_json_check_keys(reader, batch, "$.batch", kBatchKeys));
  MP_TRY(parse_int_field(reader, batch, "$.batch", "global_batch", true, 0, &plan->global_batch));
  MP_TRY(parse_int_field(reader, batch, "$.batch", "micro_batch", true, 0, &plan->micro_batch));
  MP_TRY(parse_int_field(reader, batch, "$.batch", "num_micro_batches", true, 0,
                         &plan->num_micro_batches));
  MP_TRY(parse_int_field(reader, batch, "$.batch", "seq_len", true, 0, &plan->seq_len));
  /* dp (<= 2^20) x micro_batch x num_micro_batches (each <= 2^26) can exceed int64; an
   * overflowing product (undefined behaviour, found by fuzzing) is refused like any mismatch. */
  int64_t product = 0;
  const bool overflow =
      __builtin_mul_overflow((int64_t)plan->dp, plan->micro_batch, &product) ||
      __builtin_mul_overflow(product, plan->num_micro_batches, &product);
  if (overflow) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.batch.global_batch: %lld, but dp x micro_batch x num_micro_batches = "
                   "%d x %lld x %lld is far larger; the global batch must be split whole across "
                   "dp ranks and micro-batches",
                   reader->source, (long long)plan->global_batch, plan->dp,
                   (long long)plan->micro_batch, (long long)plan->num_micro_batches);
  }
  if (plan->cp > 1 && plan->seq_len % (2 * plan->cp) != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.batch.seq_len: %lld tokens do not divide into 2 x cp = %d chunks "
                   "(context parallelism gives each of the cp %d ranks two chunks of every "
                   "sequence, one from each end); use a multiple of %d",
                   reader->source, (long long)plan->seq_len, 2 * plan->cp, plan->cp, 2 * plan->cp);
  }
  if (product != plan->global_batch) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.batch.global_batch: %lld, but dp x micro_batch x num_micro_batches = "
                   "%d x %lld x %lld = %lld; the global batch must be split whole across dp "
                   "ranks and micro-batches",
                   reader->source, (long long)plan->global_batch, plan->dp,
                   (long long)plan->micro_batch, (long long)plan->num_micro_batches,
                   (long long)product);
  }
  return MP_OK;
}

static mp_status parse_training(const mp_json_reader *reader, const cJSON *root, mp_plan *plan) {
  plan->training = mp_training_config_default();
  const cJSON *training = cJSON_GetObjectItemCaseSensitive(root, "training");
  if (training == NULL) return MP_OK;
  const char *path = "$.training";
  mp_training_config *t = &plan->training;
  MP_TRY(mp_json_expect_object(reader, training, path, "the training settings"));
  MP_TRY(mp_json_check_keys(reader, training, path, kTrainingKeys));
  int64_t seed = 0;
  MP_TRY(mp_json_optional_int(reader, training, path, "steps", MP_JSON_POSITIVE, t->steps,
                              &t->steps));
  MP_TRY(mp_json_optional_int(reader, training, path, "seed", MP_JSON_NONNEGATIVE,
                              (int64_t)t->seed, &seed));
  t->seed = (uint64_t)seed;
  MP_TRY(mp_json_optional_number(reader, training, path, "learning_rate", MP_JSON_POSITIVE,
                                 t->learning_rate, &t->learning_rate));
  MP_TRY(mp_json_optional_int(reader, training, path, "warmup_steps", MP_JSON_NONNEGATIVE,
                              t->warmup_steps, &t->warmup_steps));
  MP_TRY(mp_json_optional_number(reader, training, path, "min_lr_ratio", MP_JSON_NONNEGATIVE,
                                 t->min_lr_ratio, &t->min_lr_ratio));
  MP_TRY(mp_json_optional_number(reader, training, path, "weight_decay", MP_JSON_NONNEGATIVE,
                                 t->weight_decay, &t->weight_decay));
  MP_TRY(mp_json_optional_number(reader, training, path, "beta1", MP_JSON_NONNEGATIVE, t->beta1,
                                 &t->beta1));
  MP_TRY(mp_json_optional_number(reader, training, path, "beta2", MP_JSON_NONNEGATIVE, t->beta2,
                                 &t->beta2));
  MP_TRY(mp_json_optional_number(reader, training, path, "eps", MP_JSON_POSITIVE, t->eps,
                                 &t->eps));
  MP_TRY(mp_json_optional_number(reader, training, path, "grad_clip", MP_JSON_NONNEGATIVE,
                                 t->grad_clip, &t->grad_clip));
  if (t->beta1 >= 1.0 || t->beta2 >= 1.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.training: beta1 and beta2 must be below 1 (got %g and %g)",
                   reader->source, t->beta1, t->beta2);
  }
  if (t->min_lr_ratio > 1.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.training.min_lr_ratio: must be at most 1, got %g", reader->source,
                   t->min_lr_ratio);
  }
  return MP_OK;
}

static mp_status parse_plan(const mp_json_reader *reader, const cJSON *root, const char *base_dir,
                            mp_plan *plan) {
  MP_TRY(mp_json_expect_object(reader, root, "$", "a parallelism plan"));
  MP_TRY(mp_json_check_keys(reader, root, "$", kTopKeys));
  const char *format = NULL, *model = NULL, *cluster = NULL;
  MP_TRY(mp_json_optional_string(reader, root, "$", "format", "mpengine-plan", &format));
  if (strcmp(format, "mpengine-plan") != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.format: \"%.60s\" is not \"mpengine-plan\"; is this a plan file?",
                   reader->source, format);
  }
  int64_t version = 1;
  MP_TRY(mp_json_optional_int(reader, root, "$", "version", MP_JSON_POSITIVE, 1, &version));
  if (version != 1) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.version: %lld is newer than this mpengine reads (1); upgrade mpengine",
                   reader->source, (long long)version);
  }
  MP_TRY(mp_json_require_string(reader, root, "$", "model", &model));
  resolve_path(base_dir, model, plan->model_path, sizeof plan->model_path);
  MP_TRY(mp_json_optional_string(reader, root, "$", "cluster", "cpu-local", &cluster));
  if (strchr(cluster, '/') != NULL || strstr(cluster, ".json") != NULL) {
    resolve_path(base_dir, cluster, plan->cluster, sizeof plan->cluster);
  } else {
    snprintf(plan->cluster, sizeof plan->cluster, "%s", cluster);
  }
  MP_TRY(parse_parallel(reader, root, plan));
  MP_TRY(parse_batch(reader, root, plan));
  int schedule = 1, recompute = 0;
  MP_TRY(mp_json_optional_choice(reader, root, "$", "schedule", kScheduleNames, 1, &schedule));
  snprintf(plan->schedule, sizeof plan->schedule, "%s", kScheduleNames[schedule]);
  MP_TRY(mp_json_optional_choice(reader, root, "$", "recompute", kRecomputeNames, 0, &recompute));
  plan->recompute = (mp_recompute)recompute;

  const cJSON *stages = cJSON_GetObjectItemCaseSensitive(root, "layers_per_stage");
  if (stages != NULL) {
    /* pp (<= 2^20) x virtual_stages (<= 2^26) overflows int (undefined behaviour, found by
     * fuzzing): multiply in int64. */
    const int64_t want = (int64_t)plan->pp * plan->virtual_stages;
    MP_TRY(mp_json_require_array(reader, root, "$", "layers_per_stage", 1, &stages));
    if (cJSON_GetArraySize(stages) != want || want > MP_PLAN_MAX_STAGES) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: $.layers_per_stage: has %d entries; it needs pp x virtual_stages = %lld",
                     reader->source, cJSON_GetArraySize(stages), (long long)want);
    }
    int index = 0;
    for (const cJSON *item = stages->child; item != NULL; item = item->next, ++index) {
      if (!cJSON_IsNumber(item) || item->valuedouble < 1 || item->valuedouble > 1e6 ||
          item->valuedouble != floor(item->valuedouble)) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: $.layers_per_stage[%d]: must be a positive integer", reader->source,
                       index);
      }
      plan->layers_per_stage[index] = (int)item->valuedouble;
    }
    plan->num_stage_counts = (int)want;
  }
  return parse_training(reader, root, plan);
}

mp_status mp_plan_parse_json(const cJSON *root, const char *source, const char *base_dir,
                             mp_plan *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  snprintf(out->source, sizeof out->source, "%s", source);
  mp_json_reader reader = {source, err};
  return parse_plan(&reader, root, base_dir, out);
}

mp_status mp_plan_parse_text(const char *text, const char *source, const char *base_dir,
                             mp_plan *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  snprintf(out->source, sizeof out->source, "%s", source);
  cJSON *root = NULL;
  MP_TRY(mp_json_parse_text(text, source, &root, err));
  mp_status status = mp_plan_parse_json(root, source, base_dir, out, err);
  cJSON_Delete(root);
  return status;
}

mp_status mp_plan_load(const char *path, mp_plan *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  snprintf(out->source, sizeof out->source, "%s", path);
  cJSON *root = NULL;
  MP_TRY(mp_json_load_file(path, &root, err));
  char base_dir[MP_PLAN_PATH_BYTES];
  snprintf(base_dir, sizeof base_dir, "%s", path);
  char *slash = strrchr(base_dir, '/');
  if (slash != NULL) {
    *slash = '\0';
  } else {
    snprintf(base_dir, sizeof base_dir, ".");
  }
  mp_status status = mp_plan_parse_json(root, path, base_dir, out, err);
  cJSON_Delete(root);
  return status;
}

cJSON *mp_plan_to_json(const mp_plan *plan, const mp_plan_prediction *predicted) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  cJSON_AddStringToObject(root, "format", "mpengine-plan");
  cJSON_AddNumberToObject(root, "version", 1);
  cJSON_AddStringToObject(root, "model", plan->model_path);
  cJSON_AddStringToObject(root, "cluster", plan->cluster);
  cJSON *parallel = cJSON_AddObjectToObject(root, "parallel");
  cJSON_AddNumberToObject(parallel, "dp", plan->dp);
  if (plan->cp > 1) cJSON_AddNumberToObject(parallel, "cp", plan->cp);
  cJSON_AddNumberToObject(parallel, "pp", plan->pp);
  cJSON_AddNumberToObject(parallel, "tp", plan->tp);
  cJSON_AddNumberToObject(parallel, "virtual_stages", plan->virtual_stages);
  if (mp_plan_ep(plan) > 1) cJSON_AddNumberToObject(parallel, "ep", plan->ep);
  cJSON_AddBoolToObject(parallel, "sequence_parallel", plan->sequence_parallel);
  cJSON_AddNumberToObject(parallel, "zero_stage", plan->zero_stage);
  if (plan->zero_shard_size > 0 && plan->zero_shard_size < plan->dp) {
    cJSON_AddNumberToObject(parallel, "zero_shard_size", plan->zero_shard_size);
  }
  cJSON *batch = cJSON_AddObjectToObject(root, "batch");
  cJSON_AddNumberToObject(batch, "global_batch", (double)plan->global_batch);
  cJSON_AddNumberToObject(batch, "micro_batch", (double)plan->micro_batch);
  cJSON_AddNumberToObject(batch, "num_micro_batches", (double)plan->num_micro_batches);
  cJSON_AddNumberToObject(batch, "seq_len", (double)plan->seq_len);
  cJSON_AddStringToObject(root, "schedule", plan->schedule);
  if (plan->num_stage_counts > 0) {
    cJSON *stages = cJSON_AddArrayToObject(root, "layers_per_stage");
    for (int i = 0; i < plan->num_stage_counts; ++i) {
      cJSON_AddItemToArray(stages, cJSON_CreateNumber(plan->layers_per_stage[i]));
    }
  }
  cJSON_AddStringToObject(root, "recompute", mp_recompute_name(plan->recompute));
  const mp_training_config *t = &plan->training;
  cJSON *training = cJSON_AddObjectToObject(root, "training");
  cJSON_AddNumberToObject(training, "steps", (double)t->steps);
  cJSON_AddNumberToObject(training, "seed", (double)t->seed);
  cJSON_AddNumberToObject(training, "learning_rate", t->learning_rate);
  cJSON_AddNumberToObject(training, "warmup_steps", (double)t->warmup_steps);
  cJSON_AddNumberToObject(training, "min_lr_ratio", t->min_lr_ratio);
  cJSON_AddNumberToObject(training, "weight_decay", t->weight_decay);
  cJSON_AddNumberToObject(training, "beta1", t->beta1);
  cJSON_AddNumberToObject(training, "beta2", t->beta2);
  cJSON_AddNumberToObject(training, "eps", t->eps);
  cJSON_AddNumberToObject(training, "grad_clip", t->grad_clip);
  if (predicted != NULL) {
    cJSON *p = cJSON_AddObjectToObject(root, "predicted");
    cJSON_AddNumberToObject(p, "step_time_s", predicted->step_s);
    cJSON_AddNumberToObject(p, "tokens_per_s", predicted->tokens_per_s);
    cJSON_AddNumberToObject(p, "tflops_per_gpu", predicted->tflops_per_gpu);
    cJSON_AddNumberToObject(p, "mfu", predicted->mfu);
    cJSON_AddNumberToObject(p, "bubble_fraction", predicted->bubble_fraction);
    cJSON_AddNumberToObject(p, "memory_capacity_bytes", predicted->capacity_bytes);
    cJSON *memory = cJSON_AddArrayToObject(p, "memory_bytes_per_pp_rank");
    for (int i = 0; i < predicted->num_ranks; ++i) {
      cJSON_AddItemToArray(memory, cJSON_CreateNumber(predicted->memory_bytes_per_rank[i]));
    }
  }
  return root;
}

mp_status mp_plan_write(const mp_plan *plan, const mp_plan_prediction *predicted,
                        const char *path, mp_error *err) {
  cJSON *root = mp_plan_to_json(plan, predicted);
  char *text = root != NULL ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  mp_atomic_file file;
  mp_status status = mp_atomic_file_open(&file, path, err);
  if (status == MP_OK) {
    mp_atomic_file_write(&file, text, strlen(text));
    mp_atomic_file_write(&file, "\n", 1);
    status = mp_atomic_file_commit(&file, err);
  }
  free(text);
  return status;
}
