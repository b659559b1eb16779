/*
 * topology/model.c — parsing and validating model descriptions; see model.h for the format.
 *
 * Validation happens here, once, so that every consumer (costs, planner, runtime) can trust the
 * shapes: sizes are positive and bounded (so parameter counts cannot overflow), heads divide the
 * hidden size, consecutive layers agree on the hidden size, and a tied LM head has an embedding of
 * the same shape to tie to.
 */
#include "topology/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_reader.h"

/* Bounds that keep every parameter and FLOP count far from int64 overflow while admitting any
 * model anyone trains (GPT-1T has hidden 25600, vocab 51200, 128 layers). */
enum {
  kMaxHidden = 1 << 20,
  kMaxFfnHidden = 1 << 23,
  kMaxVocab = 1 << 24,
  kMaxPositions = 1 << 24,
  kMaxRepeat = 1 << 16,
  kMaxLayers = 1 << 17,
};

/* A custom node's parameters: 2^40 (1.1e12) per layer. Without a bound, 2^53 params repeated
 * 65536 times overflowed mp_model_params (undefined behaviour, found by
 * tests/fuzz/model_json_fuzz.c); with it, 2^17 layers stay below 2^63 whatever their kinds. */
static const int64_t kMaxCustomParams = (int64_t)1 << 40;

struct mp_model {
  char name[MP_MODEL_NAME_BYTES];
  char source[1024];
  int64_t vocab_size;
  int64_t seq_len;
  int num_layers;
  mp_layer_spec *layers; /* (num_layers,) */
};

static const char *const kTypeNames[] = {"embedding", "transformer", "layernorm", "lm_head",
                                         "custom", NULL};
static const char *const kNormNames[] = {"layernorm", "rmsnorm", NULL};
static const char *const kActivationNames[] = {"gelu", "swiglu", NULL};
static const char *const kAttentionNames[] = {"backend", "unfused", "flash", NULL};

static const char *const kTopKeys[] = {"name", "vocab_size", "seq_len", "layers", NULL};
static const char *const kEmbeddingKeys[] = {"type", "hidden", "vocab", "max_positions", NULL};
static const char *const kTransformerKeys[] = {"type", "hidden", "heads", "kv_heads",
                                               "ffn_hidden", "norm", "activation", "bias",
                                               "dropout", "attention", "norm_eps", "rope_theta",
                                               "rope_scaling", "repeat", "moe", NULL};
static const char *const kMoeKeys[] = {"experts", "top_k", "expert_ffn_hidden",
                                       "shared_ffn_hidden", "shared_gate", "router",
                                       "normalize_top_k", "aux_loss_coeff", "z_loss_coeff",
                                       "capacity_factor", NULL};
static const char *const kMoeRouterNames[] = {"softmax", NULL};
static const char *const kLayernormKeys[] = {"type", "hidden", "norm", "norm_eps", NULL};
static const char *const kRopeScalingKeys[] = {"rope_type", "factor", "low_freq_factor",
                                               "high_freq_factor",
                                               "original_max_position_embeddings", NULL};
static const char *const kRopeTypes[] = {"llama3", NULL};
static const char *const kBiasNames[] = {"none", "qkv", "all", NULL};
static const char *const kLmHeadKeys[] = {"type", "hidden", "vocab", "tie_embedding", NULL};
static const char *const kCustomKeys[] = {"type", "name", "params", "forward_flops_per_token",
                                          "activation_bytes_per_token",
                                          "output_bytes_per_token", "repeat", NULL};

static mp_status at_most(const mp_json_reader *reader, const char *path, const char *key,
                         int64_t value, int64_t limit) {
  if (value <= limit) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: %lld is larger than the supported %lld",
                 reader->source, path, key, (long long)value, (long long)limit);
}

static mp_status read_size(const mp_json_reader *reader, const cJSON *node, const char *path,
                           const char *key, bool required, int64_t default_value, int64_t limit,
                           int64_t *out) {
  if (required) {
    MP_TRY(mp_json_require_int(reader, node, path, key, MP_JSON_POSITIVE, out));
  } else {
    MP_TRY(mp_json_optional_int(reader, node, path, key, MP_JSON_POSITIVE, default_value, out));
  }
  return at_most(reader, path, key, *out, limit);
}

/* "bias": true, false, or one of kBiasNames. */
static mp_status read_bias(const mp_json_reader *reader, const cJSON *node, const char *path,
                           mp_bias_kind *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(node, "bias");
  *out = MP_BIAS_ALL;
  if (item == NULL) return MP_OK;
  if (cJSON_IsBool(item)) {
    *out = cJSON_IsTrue(item) ? MP_BIAS_ALL : MP_BIAS_NONE;
    return MP_OK;
  }
  if (!cJSON_IsString(item)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.bias: must be true, false or one of \"none\", \"qkv\", \"all\"",
                   reader->source, path);
  }
  int choice = 0;
  MP_TRY(mp_json_optional_choice(reader, node, path, "bias", kBiasNames, 2, &choice));
  *out = (mp_bias_kind)choice;
  return MP_OK;
}

static mp_status read_norm(const mp_json_reader *reader, const cJSON *node, const char *path,
                           mp_layer_spec *spec) {
  int norm = 0;
  MP_TRY(mp_json_optional_choice(reader, node, path, "norm", kNormNames, 0, &norm));
  spec->norm = (mp_norm_kind)norm;
  MP_TRY(mp_json_optional_number(reader, node, path, "norm_eps", MP_JSON_POSITIVE, 1e-5,
                                 &spec->norm_eps));
  return MP_OK;
}

static mp_status read_rope(const mp_json_reader *reader, const cJSON *node, const char *path,
                           mp_layer_spec *spec) {
  MP_TRY(mp_json_optional_number(reader, node, path, "rope_theta", MP_JSON_POSITIVE, 0.0,
                                 &spec->rope_theta));
  const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(node, "rope_scaling");
  if (scaling == NULL) return MP_OK;
  char scaling_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(scaling_path, sizeof scaling_path, path, "rope_scaling");
  if (spec->rope_theta <= 0.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: rope_scaling needs rope_theta (the rotary base it scales)",
                   reader->source, path);
  }
  MP_TRY(mp_json_expect_object(reader, scaling, scaling_path, "a rope_scaling object"));
  MP_TRY(mp_json_check_keys(reader, scaling, scaling_path, kRopeScalingKeys));
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
  if (type == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: missing required key \"rope_type\" (\"llama3\")", reader->source,
                   scaling_path);
  }
  int rope_type = 0;
  MP_TRY(mp_json_optional_choice(reader, scaling, scaling_path, "rope_type", kRopeTypes, 0,
                                 &rope_type));
  mp_rope_scaling *r = &spec->rope_scaling;
  r->llama3 = true;
  MP_TRY(mp_json_require_number(reader, scaling, scaling_path, "factor", MP_JSON_POSITIVE,
                                &r->factor));
  MP_TRY(mp_json_require_number(reader, scaling, scaling_path, "low_freq_factor",
                                MP_JSON_POSITIVE, &r->low_freq_factor));
  MP_TRY(mp_json_require_number(reader, scaling, scaling_path, "high_freq_factor",
                                MP_JSON_POSITIVE, &r->high_freq_factor));
  MP_TRY(mp_json_require_int(reader, scaling, scaling_path, "original_max_position_embeddings",
                             MP_JSON_POSITIVE, &r->original_max_positions));
  if (!(r->high_freq_factor > r->low_freq_factor)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: high_freq_factor %g must be above low_freq_factor %g",
                   reader->source, scaling_path, r->high_freq_factor, r->low_freq_factor);
  }
  return MP_OK;
}

/* "moe" of a transformer node (model.h). The summed width of the experts and the shared MLP is
 * held to kMaxFfnHidden, the bound of one dense MLP, so that an MoE block's parameters stay within
 * a dense block's and the counts of 2^17 layers within int64. */
static mp_status read_moe(const mp_json_reader *reader, const cJSON *node, const char *path,
                          mp_layer_spec *spec) {
  const cJSON *moe = cJSON_GetObjectItemCaseSensitive(node, "moe");
  if (moe == NULL) return MP_OK;
  char moe_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(moe_path, sizeof moe_path, path, "moe");
  MP_TRY(mp_json_expect_object(reader, moe, moe_path, "a mixture-of-experts object"));
  MP_TRY(mp_json_check_keys(reader, moe, moe_path, kMoeKeys));
  if (cJSON_GetObjectItemCaseSensitive(node, "ffn_hidden") != NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.ffn_hidden: a block with \"moe\" has no dense MLP; give each "
                   "expert's width as moe.expert_ffn_hidden and remove ffn_hidden",
                   reader->source, path);
  }
  mp_moe_spec *m = &spec->moe;
  MP_TRY(read_size(reader, moe, moe_path, "experts", true, 0, kMaxFfnHidden, &m->experts));
  MP_TRY(read_size(reader, moe, moe_path, "top_k", true, 0, kMaxFfnHidden, &m->top_k));
  if (m->top_k > m->experts) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.top_k: %lld is more than experts %lld; each token goes to top_k "
                   "distinct experts",
                   reader->source, moe_path, (long long)m->top_k, (long long)m->experts);
  }
  MP_TRY(read_size(reader, moe, moe_path, "expert_ffn_hidden", true, 0, kMaxFfnHidden,
                   &m->expert_ffn_hidden));
  MP_TRY(mp_json_optional_int(reader, moe, moe_path, "shared_ffn_hidden", MP_JSON_NONNEGATIVE, 0,
                              &m->shared_ffn_hidden));
  MP_TRY(at_most(reader, moe_path, "shared_ffn_hidden", m->shared_ffn_hidden, kMaxFfnHidden));
  const int64_t width = m->experts * m->expert_ffn_hidden + m->shared_ffn_hidden;
  if (width > kMaxFfnHidden) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: experts x expert_ffn_hidden + shared_ffn_hidden = %lld is larger "
                   "than the supported %d",
                   reader->source, moe_path, (long long)width, kMaxFfnHidden);
  }
  MP_TRY(mp_json_optional_bool(reader, moe, moe_path, "shared_gate", false, &m->shared_gate));
  if (m->shared_gate && m->shared_ffn_hidden == 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.shared_gate: true, but there is no shared MLP to gate; set "
                   "shared_ffn_hidden or remove shared_gate",
                   reader->source, moe_path);
  }
  int router = 0;
  MP_TRY(mp_json_optional_choice(reader, moe, moe_path, "router", kMoeRouterNames, 0, &router));
  m->router = (mp_moe_router)router;
  MP_TRY(mp_json_optional_bool(reader, moe, moe_path, "normalize_top_k", true,
                               &m->normalize_top_k));
  MP_TRY(mp_json_optional_number(reader, moe, moe_path, "aux_loss_coeff", MP_JSON_NONNEGATIVE,
                                 0.0, &m->aux_loss_coeff));
  MP_TRY(mp_json_optional_number(reader, moe, moe_path, "z_loss_coeff", MP_JSON_NONNEGATIVE, 0.0,
                                 &m->z_loss_coeff));
  const cJSON *capacity = cJSON_GetObjectItemCaseSensitive(moe, "capacity_factor");
  if (capacity != NULL && !cJSON_IsNull(capacity)) {
    MP_TRY(mp_json_require_number(reader, moe, moe_path, "capacity_factor", MP_JSON_POSITIVE,
                                  &m->capacity_factor));
  }
  if (spec->activation != MP_ACTIVATION_SWIGLU) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.activation: the experts are SwiGLU MLPs (Mixtral, Qwen2-MoE); set "
                   "\"activation\": \"swiglu\"",
                   reader->source, path);
  }
  if (spec->bias == MP_BIAS_ALL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.bias: the experts carry no biases; set \"bias\" to false or \"qkv\"",
                   reader->source, path);
  }
  spec->ffn_hidden = m->expert_ffn_hidden;
  return MP_OK;
}

/* Parses one node of $.layers into spec (repeat not yet expanded). */
static mp_status parse_node(const mp_json_reader *reader, const cJSON *node, const char *path,
                            const mp_model *model, mp_layer_spec *spec, int64_t *repeat) {
  MP_TRY(mp_json_expect_object(reader, node, path, "a layer node"));
  int type = 0;
  const cJSON *type_item = cJSON_GetObjectItemCaseSensitive(node, "type");
  if (type_item == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: missing required key \"type\" (one of \"embedding\", "
                   "\"transformer\", \"layernorm\", \"lm_head\", \"custom\")",
                   reader->source, path);
  }
  MP_TRY(mp_json_optional_choice(reader, node, path, "type", kTypeNames, 0, &type));
  memset(spec, 0, sizeof *spec);
  spec->kind = (mp_layer_kind)type;
  *repeat = 1;
  switch (spec->kind) {
    case MP_LAYER_EMBEDDING:
      MP_TRY(mp_json_check_keys(reader, node, path, kEmbeddingKeys));
      MP_TRY(read_size(reader, node, path, "hidden", true, 0, kMaxHidden, &spec->hidden));
      MP_TRY(read_size(reader, node, path, "vocab", false, model->vocab_size, kMaxVocab,
                       &spec->vocab));
      MP_TRY(mp_json_optional_int(reader, node, path, "max_positions", MP_JSON_NONNEGATIVE,
                                  model->seq_len, &spec->max_positions));
      MP_TRY(at_most(reader, path, "max_positions", spec->max_positions, kMaxPositions));
      if (spec->vocab < model->vocab_size) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s.vocab: %lld is smaller than $.vocab_size %lld; token ids up to "
                       "vocab_size - 1 need a row each",
                       reader->source, path, (long long)spec->vocab,
                       (long long)model->vocab_size);
      }
      if (spec->max_positions > 0 && model->seq_len > spec->max_positions) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: $.seq_len: %lld exceeds %s.max_positions %lld; shorten seq_len or "
                       "raise max_positions",
                       reader->source, (long long)model->seq_len, path,
                       (long long)spec->max_positions);
      }
      break;
    case MP_LAYER_TRANSFORMER: {
      MP_TRY(mp_json_check_keys(reader, node, path, kTransformerKeys));
      MP_TRY(read_size(reader, node, path, "hidden", true, 0, kMaxHidden, &spec->hidden));
      MP_TRY(read_size(reader, node, path, "heads", true, 0, kMaxHidden, &spec->heads));
      MP_TRY(read_size(reader, node, path, "kv_heads", false, spec->heads, kMaxHidden,
                       &spec->kv_heads));
      MP_TRY(read_size(reader, node, path, "ffn_hidden", false, 4 * spec->hidden, kMaxFfnHidden,
                       &spec->ffn_hidden));
      int activation = 0;
      MP_TRY(read_norm(reader, node, path, spec));
      MP_TRY(mp_json_optional_choice(reader, node, path, "activation", kActivationNames, 0,
                                     &activation));
      spec->activation = (mp_activation_kind)activation;
      MP_TRY(read_bias(reader, node, path, &spec->bias));
      MP_TRY(read_rope(reader, node, path, spec));
      MP_TRY(mp_json_optional_number(reader, node, path, "dropout", MP_JSON_ANY, 0.0,
                                     &spec->dropout));
      if (!(spec->dropout >= 0.0 && spec->dropout < 1.0)) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s.dropout: %g is not a probability in [0, 1)", reader->source, path,
                       spec->dropout);
      }
      int attention = 0;
      MP_TRY(mp_json_optional_choice(reader, node, path, "attention", kAttentionNames, 0,
                                     &attention));
      spec->attention = (mp_attention_kind)attention;
      MP_TRY(read_size(reader, node, path, "repeat", false, 1, kMaxRepeat, repeat));
      MP_TRY(read_moe(reader, node, path, spec));
      if (spec->hidden % spec->heads != 0) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s: hidden %lld is not divisible by heads %lld; the head size "
                       "hidden / heads must be a whole number",
                       reader->source, path, (long long)spec->hidden, (long long)spec->heads);
      }
      if (spec->kv_heads > spec->heads || spec->heads % spec->kv_heads != 0) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s: heads %lld is not a multiple of kv_heads %lld; each key/value "
                       "head serves a whole group of query heads",
                       reader->source, path, (long long)spec->heads, (long long)spec->kv_heads);
      }
      break;
    }
    case MP_LAYER_LAYERNORM:
      MP_TRY(mp_json_check_keys(reader, node, path, kLayernormKeys));
      MP_TRY(read_size(reader, node, path, "hidden", true, 0, kMaxHidden, &spec->hidden));
      MP_TRY(read_norm(reader, node, path, spec));
      break;
    case MP_LAYER_LM_HEAD:
      MP_TRY(mp_json_check_keys(reader, node, path, kLmHeadKeys));
      MP_TRY(read_size(reader, node, path, "hidden", true, 0, kMaxHidden, &spec->hidden));
      MP_TRY(read_size(reader, node, path, "vocab", false, model->vocab_size, kMaxVocab,
                       &spec->vocab));
      MP_TRY(mp_json_optional_bool(reader, node, path, "tie_embedding", true,
                                   &spec->tie_embedding));
      if (spec->vocab < model->vocab_size) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s.vocab: %lld is smaller than $.vocab_size %lld", reader->source,
                       path, (long long)spec->vocab, (long long)model->vocab_size);
      }
      break;
    case MP_LAYER_CUSTOM: {
      MP_TRY(mp_json_check_keys(reader, node, path, kCustomKeys));
      const char *name = NULL;
      MP_TRY(mp_json_require_string(reader, node, path, "name", &name));
      snprintf(spec->name, sizeof spec->name, "%s", name);
      MP_TRY(mp_json_require_int(reader, node, path, "params", MP_JSON_NONNEGATIVE,
                                 &spec->custom_params));
      MP_TRY(at_most(reader, path, "params", spec->custom_params, kMaxCustomParams));
      MP_TRY(mp_json_require_number(reader, node, path, "forward_flops_per_token",
                                    MP_JSON_NONNEGATIVE, &spec->custom_forward_flops_per_token));
      MP_TRY(mp_json_require_number(reader, node, path, "activation_bytes_per_token",
                                    MP_JSON_NONNEGATIVE,
                                    &spec->custom_activation_bytes_per_token));
      MP_TRY(mp_json_require_number(reader, node, path, "output_bytes_per_token",
                                    MP_JSON_NONNEGATIVE, &spec->custom_output_bytes_per_token));
      MP_TRY(read_size(reader, node, path, "repeat", false, 1, kMaxRepeat, repeat));
      break;
    }
  }
  return MP_OK;
}

/* Checks that a layer's input width matches the width the layer before it hands on. */
static mp_status check_chain(const mp_json_reader *reader, const mp_model *model,
                             const mp_layer_spec *spec, const char *path,
                             const char *const *paths) {
  const mp_layer_spec *previous =
      model->num_layers > 0 ? &model->layers[model->num_layers - 1] : NULL;
  if (spec->kind == MP_LAYER_EMBEDDING || spec->kind == MP_LAYER_CUSTOM || previous == NULL ||
      previous->kind == MP_LAYER_CUSTOM || previous->kind == MP_LAYER_LM_HEAD) {
    return MP_OK;
  }
  if (spec->hidden != previous->hidden) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.hidden: %lld does not match the hidden size %lld of %s before it",
                   reader->source, path, (long long)spec->hidden, (long long)previous->hidden,
                   paths[previous->json_index]);
  }
  return MP_OK;
}

static mp_status check_tie(const mp_json_reader *reader, const mp_model *model,
                           const mp_layer_spec *head, const char *path) {
  if (!head->tie_embedding) return MP_OK;
  for (int i = 0; i < model->num_layers; ++i) {
    const mp_layer_spec *layer = &model->layers[i];
    if (layer->kind != MP_LAYER_EMBEDDING) continue;
    if (layer->vocab != head->vocab || layer->hidden != head->hidden) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: %s.tie_embedding: the head (vocab %lld, hidden %lld) cannot share the "
                     "embedding's table (vocab %lld, hidden %lld); make the shapes equal or set "
                     "tie_embedding to false",
                     reader->source, path, (long long)head->vocab, (long long)head->hidden,
                     (long long)layer->vocab, (long long)layer->hidden);
    }
    return MP_OK;
  }
  return mp_fail(reader->err, MP_ERR_INPUT,
                 "%s: %s.tie_embedding: true, but no embedding layer precedes it; add an "
                 "embedding or set tie_embedding to false",
                 reader->source, path);
}

static void name_layer(mp_layer_spec *spec, int *counts) {
  int seen = counts[spec->kind]++;
  switch (spec->kind) {
    case MP_LAYER_EMBEDDING:
      snprintf(spec->name, sizeof spec->name, seen ? "embedding.%d" : "embedding", seen);
      break;
    case MP_LAYER_TRANSFORMER:
      snprintf(spec->name, sizeof spec->name, "block.%d", seen);
      break;
    case MP_LAYER_LAYERNORM:
      snprintf(spec->name, sizeof spec->name, seen ? "norm.%d" : "final_norm", seen);
      break;
    case MP_LAYER_LM_HEAD:
      snprintf(spec->name, sizeof spec->name, seen ? "lm_head.%d" : "lm_head", seen);
      break;
    case MP_LAYER_CUSTOM:
      if (spec->repeat_index > 0) {
        char base[MP_MODEL_NAME_BYTES];
        snprintf(base, sizeof base, "%s", spec->name);
        snprintf(spec->name, sizeof spec->name, "%.100s.%d", base, spec->repeat_index);
      }
      break;
  }
}

static mp_status parse_model(const mp_json_reader *reader, const cJSON *root, mp_model *model) {
  MP_TRY(mp_json_expect_object(reader, root, "$", "a model description"));
  MP_TRY(mp_json_check_keys(reader, root, "$", kTopKeys));
  const char *name = NULL;
  MP_TRY(mp_json_require_string(reader, root, "$", "name", &name));
  snprintf(model->name, sizeof model->name, "%s", name);
  MP_TRY(mp_json_require_int(reader, root, "$", "vocab_size", MP_JSON_POSITIVE,
                             &model->vocab_size));
  MP_TRY(at_most(reader, "$", "vocab_size", model->vocab_size, kMaxVocab));
  MP_TRY(mp_json_require_int(reader, root, "$", "seq_len", MP_JSON_POSITIVE, &model->seq_len));
  MP_TRY(at_most(reader, "$", "seq_len", model->seq_len, kMaxPositions));
  const cJSON *layers = NULL;
  MP_TRY(mp_json_require_array(reader, root, "$", "layers", 1, &layers));

  int num_nodes = cJSON_GetArraySize(layers);
  /* First pass: parse nodes and count the expanded layers. */
  mp_layer_spec *node_specs = calloc((size_t)num_nodes, sizeof *node_specs);
  int64_t *repeats = calloc((size_t)num_nodes, sizeof *repeats);
  char(*paths)[MP_JSON_PATH_BYTES] = calloc((size_t)num_nodes, MP_JSON_PATH_BYTES);
  const char **path_list = calloc((size_t)num_nodes + 1, sizeof *path_list);
  mp_status status = MP_OK;
  if (node_specs == NULL || repeats == NULL || paths == NULL || path_list == NULL) {
    status = mp_fail(reader->err, MP_ERR_RUNTIME, "%s: out of memory", reader->source);
    goto done;
  }
  int64_t total = 0;
  int index = 0;
  for (const cJSON *node = layers->child; node != NULL; node = node->next, ++index) {
    mp_json_path_index(paths[index], MP_JSON_PATH_BYTES, "$.layers", index);
    path_list[index] = paths[index];
    status = parse_node(reader, node, paths[index], model, &node_specs[index], &repeats[index]);
    if (status != MP_OK) goto done;
    node_specs[index].json_index = index;
    total += repeats[index];
  }
  if (total > kMaxLayers) {
    status = mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: $.layers: expands to %lld layers, more than the supported %d",
                     reader->source, (long long)total, kMaxLayers);
    goto done;
  }
  model->layers = calloc((size_t)total, sizeof *model->layers);
  if (model->layers == NULL) {
    status = mp_fail(reader->err, MP_ERR_RUNTIME, "%s: out of memory", reader->source);
    goto done;
  }
  int counts[MP_LAYER_CUSTOM + 1] = {0};
  for (int n = 0; n < num_nodes; ++n) {
    status = check_chain(reader, model, &node_specs[n], paths[n], path_list);
    if (status != MP_OK) goto done;
    if (node_specs[n].kind == MP_LAYER_LM_HEAD) {
      status = check_tie(reader, model, &node_specs[n], paths[n]);
      if (status != MP_OK) goto done;
    }
    for (int64_t r = 0; r < repeats[n]; ++r) {
      mp_layer_spec *spec = &model->layers[model->num_layers];
      *spec = node_specs[n];
      spec->repeat_index = (int)r;
      name_layer(spec, counts);
      model->num_layers++;
    }
  }
done:
  free(path_list);
  free(paths);
  free(repeats);
  free(node_specs);
  return status;
}

static mp_status model_from_json(const cJSON *root, const char *source, mp_model **out,
                                 mp_error *err) {
  mp_model *model = calloc(1, sizeof *model);
  if (model == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", source);
  snprintf(model->source, sizeof model->source, "%s", source);
  mp_json_reader reader = {source, err};
  mp_status status = parse_model(&reader, root, model);
  if (status != MP_OK) {
    mp_model_free(model);
    return status;
  }
  *out = model;
  return MP_OK;
}

mp_status mp_model_parse_text(const char *text, const char *source, mp_model **out,
                              mp_error *err) {
  *out = NULL;
  cJSON *root = NULL;
  MP_TRY(mp_json_parse_text(text, source, &root, err));
  mp_status status = model_from_json(root, source, out, err);
  cJSON_Delete(root);
  return status;
}

mp_status mp_model_load(const char *path, mp_model **out, mp_error *err) {
  *out = NULL;
  cJSON *root = NULL;
  MP_TRY(mp_json_load_file(path, &root, err));
  mp_status status = model_from_json(root, path, out, err);
  cJSON_Delete(root);
  return status;
}

void mp_model_free(mp_model *model) {
  if (model == NULL) return;
  free(model->layers);
  free(model);
}

const char *mp_model_name(const mp_model *model) { return model->name; }
const char *mp_model_source(const mp_model *model) { return model->source; }
int64_t mp_model_vocab_size(const mp_model *model) { return model->vocab_size; }
int64_t mp_model_seq_len(const mp_model *model) { return model->seq_len; }
int mp_model_num_layers(const mp_model *model) { return model->num_layers; }

const mp_layer_spec *mp_model_layer(const mp_model *model, int index) {
  if (index < 0 || index >= model->num_layers) return NULL;
  return &model->layers[index];
}

int mp_model_num_transformer_layers(const mp_model *model) {
  int count = 0;
  for (int i = 0; i < model->num_layers; ++i) {
    if (model->layers[i].kind == MP_LAYER_TRANSFORMER) ++count;
  }
  return count;
}

bool mp_layer_is_moe(const mp_layer_spec *layer) {
  return layer->kind == MP_LAYER_TRANSFORMER && layer->moe.experts > 0;
}

const mp_layer_spec *mp_model_first_moe_layer(const mp_model *model) {
  for (int i = 0; i < model->num_layers; ++i) {
    if (mp_layer_is_moe(&model->layers[i])) return &model->layers[i];
  }
  return NULL;
}
