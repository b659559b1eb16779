/*
 * tools/cmd_describe.c — `mpengine describe MODEL.json`: the per-layer table a user checks before
 * planning: parameters, forward and backward FLOPs for a micro-batch, activation memory kept for
 * backward under each recomputation mode, and the tensor handed to the next layer; then totals.
 * `--format json` prints the same numbers for programs. A model with mixture-of-experts blocks
 * also gets its active parameters (those one token uses: top_k of each block's experts, its router
 * and shared MLP); its FLOPs are what a dropless token-choice layer computes, which are the active
 * ones already.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "topology/layer_cost.h"
#include "topology/model.h"
#include "tools/cli.h"
#include "tools/commands.h"

static const char *kind_name(mp_layer_kind kind) {
  switch (kind) {
    case MP_LAYER_EMBEDDING: return "embedding";
    case MP_LAYER_TRANSFORMER: return "transformer";
    case MP_LAYER_LAYERNORM: return "layernorm";
    case MP_LAYER_LM_HEAD: return "lm_head";
    case MP_LAYER_CUSTOM: return "custom";
  }
  return "?";
}

/* 124439808 -> "124,439,808". */
static const char *with_commas(long long value, char *out, size_t out_bytes) {
  char digits[32];
  snprintf(digits, sizeof digits, "%lld", value < 0 ? -value : value);
  size_t length = strlen(digits), used = 0;
  if (value < 0 && used + 1 < out_bytes) out[used++] = '-';
  for (size_t i = 0; i < length && used + 1 < out_bytes; ++i) {
    if (i > 0 && (length - i) % 3 == 0 && used + 1 < out_bytes) out[used++] = ',';
    out[used++] = digits[i];
  }
  out[used] = '\0';
  return out;
}

static const char *human_count(double value, char *out, size_t out_bytes) {
  const char *units[] = {"", " K", " M", " B", " T"};
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  snprintf(out, out_bytes, "%.1f%s", value, units[unit]);
  return out;
}

static const double kMiB = 1024.0 * 1024.0;
static const double kGiB = 1024.0 * 1024.0 * 1024.0;

typedef struct {
  double forward_flops, backward_flops;
  double activation_bytes[MP_RECOMPUTE_COUNT];
  long long params, active_params;
} totals;

static void print_table(const mp_model *model, const mp_cost_shape *shape, const char *dtype) {
  printf("model %s: %d layers (%d transformer), vocab %lld, micro-batch %lld x sequence %lld, "
         "activations %s\n\n",
         mp_model_name(model), mp_model_num_layers(model), mp_model_num_transformer_layers(model),
         (long long)mp_model_vocab_size(model), (long long)shape->micro_batch,
         (long long)shape->seq_len, dtype);
  printf("%5s  %-16s %-11s %15s %11s %11s %11s %11s %11s %10s\n", "#", "layer", "kind", "params",
         "fwd GFLOP", "bwd GFLOP", "act MiB", "selective", "full", "out MiB");
  printf("%5s  %-16s %-11s %15s %11s %11s %11s %11s %11s %10s\n", "", "", "", "", "", "",
         "(none)", "recompute", "recompute", "");
  totals sum = {0};
  bool tied = false;
  char buffer[48];
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *layer = mp_model_layer(model, i);
    mp_layer_cost cost;
    mp_layer_cost_compute(layer, shape, &cost);
    if (layer->kind == MP_LAYER_LM_HEAD && layer->tie_embedding) tied = true;
    printf("%5d  %-16.16s %-11s %15s %11.3f %11.3f %11.2f %11.2f %11.2f %10.2f\n", i, layer->name,
           kind_name(layer->kind), with_commas(cost.params, buffer, sizeof buffer),
           cost.forward_flops / 1e9, cost.backward_flops / 1e9,
           cost.activation_bytes[MP_RECOMPUTE_NONE] / kMiB,
           cost.activation_bytes[MP_RECOMPUTE_SELECTIVE] / kMiB,
           cost.activation_bytes[MP_RECOMPUTE_FULL] / kMiB, cost.output_bytes / kMiB);
    sum.params += cost.params;
    sum.active_params += mp_layer_active_params(layer);
    sum.forward_flops += cost.forward_flops;
    sum.backward_flops += cost.backward_flops;
    for (int m = 0; m < MP_RECOMPUTE_COUNT; ++m) sum.activation_bytes[m] += cost.activation_bytes[m];
  }
  char human[32], human_total[32];
  const double tokens = (double)shape->micro_batch * (double)shape->seq_len;
  printf("\nparameters: %s (%s)%s\n", with_commas(sum.params, buffer, sizeof buffer),
         human_count((double)sum.params, human, sizeof human),
         tied ? "; the LM head is tied to the embedding and owns none" : "");
  const mp_layer_spec *moe = mp_model_first_moe_layer(model);
  if (moe != NULL) {
    printf("active parameters per token: %s (%s) of the %s total: each mixture-of-experts block "
           "routes a token to %lld of its %lld experts%s\n",
           with_commas(sum.active_params, buffer, sizeof buffer),
           human_count((double)sum.active_params, human, sizeof human),
           human_count((double)sum.params, human_total, sizeof human_total),
           (long long)moe->moe.top_k, (long long)moe->moe.experts,
           moe->moe.shared_ffn_hidden > 0 ? " plus its shared MLP" : "");
  }
  printf("FLOPs per micro-batch: forward %.3f GFLOP, backward %.3f GFLOP, total %.3f GFLOP "
         "(%.3f GFLOP per token)\n",
         sum.forward_flops / 1e9, sum.backward_flops / 1e9,
         (sum.forward_flops + sum.backward_flops) / 1e9,
         (sum.forward_flops + sum.backward_flops) / tokens / 1e9);
  printf("activations kept per micro-batch: %.2f MiB with no recomputation, %.2f MiB selective, "
         "%.2f MiB full\n",
         sum.activation_bytes[MP_RECOMPUTE_NONE] / kMiB,
         sum.activation_bytes[MP_RECOMPUTE_SELECTIVE] / kMiB,
         sum.activation_bytes[MP_RECOMPUTE_FULL] / kMiB);
  printf("training state on one device (bf16 weights, fp32 gradients, fp32 master weights and "
         "Adam moments: 18 bytes per parameter): %.2f GiB\n",
         (double)sum.params * 18.0 / kGiB);
}

static void add_number(cJSON *object, const char *key, double value) {
  cJSON_AddNumberToObject(object, key, value);
}

static int print_json(const mp_model *model, const mp_cost_shape *shape, const char *dtype) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "model", mp_model_name(model));
  add_number(root, "micro_batch", (double)shape->micro_batch);
  add_number(root, "seq_len", (double)shape->seq_len);
  cJSON_AddStringToObject(root, "activation_dtype", dtype);
  cJSON *layers = cJSON_AddArrayToObject(root, "layers");
  totals sum = {0};
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *layer = mp_model_layer(model, i);
    mp_layer_cost cost;
    mp_layer_cost_compute(layer, shape, &cost);
    cJSON *row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, "name", layer->name);
    cJSON_AddStringToObject(row, "kind", kind_name(layer->kind));
    add_number(row, "params", (double)cost.params);
    add_number(row, "active_params", (double)mp_layer_active_params(layer));
    add_number(row, "forward_flops", cost.forward_flops);
    add_number(row, "backward_flops", cost.backward_flops);
    cJSON *activation = cJSON_AddObjectToObject(row, "activation_bytes");
    cJSON *recompute = cJSON_AddObjectToObject(row, "recompute_flops");
    for (int m = 0; m < MP_RECOMPUTE_COUNT; ++m) {
      add_number(activation, mp_recompute_name((mp_recompute)m), cost.activation_bytes[m]);
      add_number(recompute, mp_recompute_name((mp_recompute)m), cost.recompute_flops[m]);
      sum.activation_bytes[m] += cost.activation_bytes[m];
    }
    add_number(row, "output_bytes", cost.output_bytes);
    cJSON_AddItemToArray(layers, row);
    sum.params += cost.params;
    sum.active_params += mp_layer_active_params(layer);
    sum.forward_flops += cost.forward_flops;
    sum.backward_flops += cost.backward_flops;
  }
  cJSON *total = cJSON_AddObjectToObject(root, "totals");
  add_number(total, "params", (double)sum.params);
  add_number(total, "active_params", (double)sum.active_params);
  add_number(total, "forward_flops", sum.forward_flops);
  add_number(total, "backward_flops", sum.backward_flops);
  cJSON *activation = cJSON_AddObjectToObject(total, "activation_bytes");
  for (int m = 0; m < MP_RECOMPUTE_COUNT; ++m) {
    add_number(activation, mp_recompute_name((mp_recompute)m), sum.activation_bytes[m]);
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (text == NULL) return CLI_EXIT_FAILURE;
  printf("%s\n", text);
  cJSON_free(text);
  return CLI_EXIT_OK;
}

int cmd_describe(int argc, char **argv) {
  cli_option options[] = {
      {"seq-len", "S", "tokens per sequence (default: the model's seq_len)", NULL},
      {"micro-batch", "B", "sequences per micro-batch (default 1)", NULL},
      {"dtype", "bf16|fp32", "activation element type for memory figures (default bf16)", NULL},
      {"format", "table|json", "output format (default table)", NULL},
      {0},
  };
  cli_command command = {
      .command = "describe",
      .usage = "mpengine describe MODEL.json [--seq-len S] [--micro-batch B] [--dtype bf16|fp32] "
               "[--format table|json]",
      .summary = "Print each layer's parameters, forward and backward FLOPs for one micro-batch,\n"
                 "activation memory kept for backward (no, selective and full recomputation),\n"
                 "and the tensor it hands to the next layer, then the totals.",
      .min_positionals = 1,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  const char *dtype = cli_value(&command, "dtype") ? cli_value(&command, "dtype") : "bf16";
  const char *format = cli_value(&command, "format") ? cli_value(&command, "format") : "table";
  if (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "fp32") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--dtype: expected bf16 or fp32, got '%s'", dtype);
    return cli_report(&command, &err);
  }
  if (strcmp(format, "table") != 0 && strcmp(format, "json") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--format: expected table or json, got '%s'", format);
    return cli_report(&command, &err);
  }
  mp_model *model = NULL;
  if (mp_model_load(command.positionals[0], &model, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  /* As the planner costs it: bf16 is the CUDA backend, which runs flash attention. */
  const bool bf16 = strcmp(dtype, "bf16") == 0;
  mp_cost_shape shape = {.bytes_per_element = bf16 ? 2 : 4, .backend_flash = bf16};
  int exit_code = CLI_EXIT_OK;
  if (cli_int(&command, "seq-len", 1, mp_model_seq_len(model), &shape.seq_len, &err) != MP_OK ||
      cli_int(&command, "micro-batch", 1, 1, &shape.micro_batch, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else if (shape.seq_len > (int64_t)1 << 24 || shape.micro_batch > (int64_t)1 << 24) {
    mp_fail(&err, MP_ERR_INPUT, "--seq-len and --micro-batch must be at most 16777216");
    exit_code = cli_report(&command, &err);
  } else if (strcmp(format, "json") == 0) {
    exit_code = print_json(model, &shape, dtype);
  } else {
    print_table(model, &shape, dtype);
  }
  mp_model_free(model);
  return exit_code;
}
