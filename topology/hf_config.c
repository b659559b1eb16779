/*
 * topology/hf_config.c — config.json of a Hugging Face checkpoint to a model description; see
 * hf_config.h for the mapping and the refusals.
 *
 * Reading is in two steps: the config's keys into an imported_model (every check that names a
 * config key happens here, so each refusal can say which key and value it is about), then the
 * imported_model into the description's JSON, which is parsed back with mp_model_parse_text so
 * that nothing is handed out that mp_model_load would refuse.
 *
 * Defaults are transformers 4.46's for the family (LlamaConfig, MistralConfig, Qwen2Config,
 * GPT2Config), because a key a checkpoint leaves out means whatever transformers fills in.
 * JSON null means "not set" where transformers treats None so (num_key_value_heads, head_dim,
 * n_inner, rope_scaling, sliding_window); elsewhere it is a value of the wrong type.
 */
#include "topology/hf_config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json_reader.h"
#include "common/text_buffer.h"
#include "topology/model.h"

typedef enum {
  FAMILY_LLAMA = 0,
  FAMILY_MISTRAL,
  FAMILY_QWEN2,
  FAMILY_GPT2,
  FAMILY_MIXTRAL,   /* Mistral's blocks with a mixture of experts */
  FAMILY_QWEN2_MOE, /* Qwen2's with experts and a gated shared expert */
  FAMILY_QWEN3_MOE, /* recognised to be refused by name: see read_llama_family */
} hf_family;

typedef struct {
  const char *architecture; /* the class in config.json's "architectures" */
  const char *model_type;   /* what transformers' Auto classes dispatch on */
  hf_family family;
} hf_architecture;

static const hf_architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", FAMILY_LLAMA},
    {"MistralForCausalLM", "mistral", FAMILY_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", FAMILY_QWEN2},
    {"GPT2LMHeadModel", "gpt2", FAMILY_GPT2},
    {"MixtralForCausalLM", "mixtral", FAMILY_MIXTRAL},
    {"Qwen2MoeForCausalLM", "qwen2_moe", FAMILY_QWEN2_MOE},
    {"Qwen3MoeForCausalLM", "qwen3_moe", FAMILY_QWEN3_MOE},
};
enum { kNumArchitectures = sizeof kArchitectures / sizeof kArchitectures[0] };

static const char kSupportedArchitectures[] =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, "
    "MixtralForCausalLM, Qwen2MoeForCausalLM";

/* Keys that make a block a mixture of experts (Mixtral, Qwen2-MoE, DeepSeek, OLMoE): the
 * description has one dense MLP per block. */
static const char *const kMixtureOfExpertsKeys[] = {
    "num_local_experts", "num_experts",   "num_experts_per_tok", "n_routed_experts",
    "n_shared_experts",  "moe_intermediate_size", "shared_expert_intermediate_size", NULL};

/* MistralConfig's and Qwen2Config's sliding_window when the key is absent. */
static const int64_t kTransformersDefaultSlidingWindow = 4096;

/* Everything the description needs, as read from the config. */
typedef struct {
  hf_family family;
  const char *architecture; /* "LlamaForCausalLM" */
  char name[MP_MODEL_NAME_BYTES];
  int64_t vocab_size, seq_len;
  int64_t max_positions; /* learned position rows: GPT-2's n_positions, 0 with rotary */
  int64_t hidden, heads, kv_heads, ffn_hidden, layers;
  bool rmsnorm;
  double norm_eps;
  bool swiglu;
  mp_bias_kind bias;
  double dropout;
  double rope_theta; /* 0: no rotary embedding (GPT-2) */
  mp_rope_scaling rope_scaling;
  bool tie_embedding;
  mp_moe_spec moe; /* experts > 0: Mixtral, Qwen2-MoE */
} imported_model;

/* ---- reading config keys --------------------------------------------------------------------- */

static const char *json_type_name(const cJSON *item) {
  if (item == NULL) return "nothing";
  if (cJSON_IsNull(item)) return "null";
  if (cJSON_IsBool(item)) return cJSON_IsTrue(item) ? "true" : "false";
  if (cJSON_IsNumber(item)) return "a number";
  if (cJSON_IsString(item)) return "a string";
  if (cJSON_IsArray(item)) return "an array";
  if (cJSON_IsObject(item)) return "an object";
  return "an unknown value";
}

static const cJSON *config_item(const cJSON *config, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(config, key);
}

static bool absent_or_null(const cJSON *config, const char *key) {
  const cJSON *item = config_item(config, key);
  return item == NULL || cJSON_IsNull(item);
}

/* A value as it appears in the config, shortened, for the messages: 4096, "yarn", true. */
static const char *value_text(const cJSON *item, char *out, size_t out_bytes) {
  char *printed = item != NULL ? cJSON_PrintUnformatted(item) : NULL;
  if (printed == NULL) {
    snprintf(out, out_bytes, "%s", json_type_name(item));
    return out;
  }
  if (strlen(printed) > 60) {
    snprintf(out, out_bytes, "%.57s...", printed);
  } else {
    snprintf(out, out_bytes, "%s", printed);
  }
  cJSON_free(printed);
  return out;
}

/* An integer key where absent or null means default_value (transformers' None). */
static mp_status optional_int_or_null(const mp_json_reader *reader, const cJSON *config,
                                      const char *key, int64_t default_value, int64_t *out) {
  if (absent_or_null(config, key)) {
    *out = default_value;
    return MP_OK;
  }
  return mp_json_require_int(reader, config, "$", key, MP_JSON_POSITIVE, out);
}

static mp_status require_size(const mp_json_reader *reader, const cJSON *config,
                              const char *key, int64_t *out) {
  return mp_json_require_int(reader, config, "$", key, MP_JSON_POSITIVE, out);
}

/* A flag that must keep the value the description implies (GPT-2's scale_attn_weights true). */
static mp_status require_flag(const mp_json_reader *reader, const cJSON *config,
                              const char *key, bool default_value, bool wanted,
                              const char *why) {
  bool value = default_value;
  MP_TRY(mp_json_optional_bool(reader, config, "$", key, default_value, &value));
  if (value == wanted) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: $.%s: %s cannot be imported: %s",
                 reader->source, key, value ? "true" : "false", why);
}

static mp_status read_dropout(const mp_json_reader *reader, const cJSON *config,
                              const char *key, double default_value, double *out) {
  MP_TRY(mp_json_optional_number(reader, config, "$", key, MP_JSON_NONNEGATIVE, default_value,
                                 out));
  if (*out < 1.0) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: $.%s: %g is not a probability in [0, 1)",
                 reader->source, key, *out);
}

/* ---- which architecture ---------------------------------------------------------------------- */

static mp_status read_architecture(const mp_json_reader *reader, const cJSON *config,
                                   const hf_architecture **out) {
  const cJSON *list = config_item(config, "architectures");
  const char *model_type = NULL;
  MP_TRY(mp_json_optional_string(reader, config, "$", "model_type", NULL, &model_type));
  *out = NULL;
  if (list == NULL || cJSON_IsNull(list)) {
    /* transformers' Auto classes pick the class from model_type; architectures is what
     * save_pretrained records, so a config without it is still a checkpoint's. */
    if (model_type == NULL) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: $: missing required key \"architectures\" (a list naming one of %s)",
                     reader->source, kSupportedArchitectures);
    }
    for (int i = 0; i < kNumArchitectures; ++i) {
      if (strcmp(model_type, kArchitectures[i].model_type) == 0) *out = &kArchitectures[i];
    }
    if (*out == NULL) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: $.model_type: \"%.60s\" cannot be imported (and there is no "
                     "architectures list); supported model types: llama, mistral, qwen2, gpt2, "
                     "mixtral, qwen2_moe",
                     reader->source, model_type);
    }
    return MP_OK;
  }
  char text[80];
  if (!cJSON_IsArray(list)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.architectures: must be a list naming the model class (one of %s), "
                   "got %s",
                   reader->source, kSupportedArchitectures, value_text(list, text, sizeof text));
  }
  const int count = cJSON_GetArraySize(list);
  if (count != 1) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.architectures: %s names %d classes; a checkpoint to import names one "
                   "(of %s)",
                   reader->source, value_text(list, text, sizeof text), count,
                   kSupportedArchitectures);
  }
  const cJSON *first = list->child;
  if (!cJSON_IsString(first) || first->valuestring == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.architectures[0]: must be a string (one of %s), got %s",
                   reader->source, kSupportedArchitectures, value_text(first, text, sizeof text));
  }
  for (int i = 0; i < kNumArchitectures; ++i) {
    if (strcmp(first->valuestring, kArchitectures[i].architecture) == 0) *out = &kArchitectures[i];
  }
  if (*out == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.architectures[0]: \"%.60s\" cannot be imported; supported "
                   "architectures: %s",
                   reader->source, first->valuestring, kSupportedArchitectures);
  }
  if (model_type != NULL && strcmp(model_type, (*out)->model_type) != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.model_type: \"%.60s\" does not match $.architectures[0] \"%s\" (whose "
                   "model_type is \"%s\"); transformers would build the model_type's class",
                   reader->source, model_type, (*out)->architecture, (*out)->model_type);
  }
  return MP_OK;
}

/* ---- checks every family shares -------------------------------------------------------------- */

static mp_status refuse_mixture_of_experts(const mp_json_reader *reader, const cJSON *config) {
  for (int i = 0; kMixtureOfExpertsKeys[i] != NULL; ++i) {
    const cJSON *item = config_item(config, kMixtureOfExpertsKeys[i]);
    /* null, 0 and false say "no experts", as transformers reads them. */
    if (item == NULL || cJSON_IsNull(item) || cJSON_IsFalse(item) ||
        (cJSON_IsNumber(item) && item->valuedouble == 0.0)) {
      continue;
    }
    char text[80];
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.%s: %s makes the blocks mixtures of experts, which the model "
                   "description cannot represent (each block has one dense MLP)",
                   reader->source, kMixtureOfExpertsKeys[i], value_text(item, text, sizeof text));
  }
  return MP_OK;
}

static mp_status check_heads(const mp_json_reader *reader, const char *hidden_key,
                             const char *heads_key, const imported_model *m) {
  if (m->hidden % m->heads != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.%s: %lld does not divide %s %lld; the head size must be a whole "
                   "number",
                   reader->source, heads_key, (long long)m->heads, hidden_key,
                   (long long)m->hidden);
  }
  if (m->kv_heads > m->heads || m->heads % m->kv_heads != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.num_key_value_heads: %lld does not divide %s %lld; each key/value "
                   "head serves a whole group of query heads",
                   reader->source, (long long)m->kv_heads, heads_key, (long long)m->heads);
  }
  return MP_OK;
}

/* A sliding window shorter than the context changes which tokens attend to which. */
static mp_status check_window(const mp_json_reader *reader, const char *key, const char *how,
                              int64_t window, int64_t max_positions) {
  if (window >= max_positions) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT,
                 "%s: $.%s: %s: attention sees only the last %lld tokens, which the model "
                 "description cannot represent (every token attends to the whole sequence); "
                 "only no window, or one of at least max_position_embeddings (%lld), imports",
                 reader->source, key, how, (long long)window, (long long)max_positions);
}

/* ---- the Llama family: Llama, Mistral, Qwen2 ------------------------------------------------- */

static mp_status read_rope_scaling(const mp_json_reader *reader, const cJSON *config,
                                   imported_model *m) {
  const cJSON *scaling = config_item(config, "rope_scaling");
  if (scaling == NULL || cJSON_IsNull(scaling)) return MP_OK;
  char text[80];
  if (!cJSON_IsObject(scaling)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling: must be an object or null, got %s", reader->source,
                   value_text(scaling, text, sizeof text));
  }
  /* transformers reads rope_type, and the older spelling "type" when rope_type is absent. */
  const char *type_key = config_item(scaling, "rope_type") != NULL ? "rope_type" : "type";
  const cJSON *type = config_item(scaling, type_key);
  if (type == NULL || cJSON_IsNull(type)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling: has no rope_type (or type); give \"llama3\", or set "
                   "rope_scaling to null for none",
                   reader->source);
  }
  if (!cJSON_IsString(type) || type->valuestring == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling.%s: must be a string, got %s", reader->source, type_key,
                   value_text(type, text, sizeof text));
  }
  if (strcmp(type->valuestring, "default") == 0) return MP_OK; /* plain RoPE */
  if (m->family == FAMILY_MISTRAL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling.%s: \"%.40s\" cannot be imported for "
                   "MistralForCausalLM: transformers 4.46 ignores rope_scaling there and later "
                   "versions apply it, so the checkpoint's positions are ambiguous; set "
                   "rope_scaling to null if it was trained without scaling",
                   reader->source, type_key, type->valuestring);
  }
  if (strcmp(type->valuestring, "llama3") != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling.%s: \"%.40s\" cannot be imported; the model description "
                   "knows \"llama3\" (Llama 3.1's frequency scaling) and \"default\" (none)",
                   reader->source, type_key, type->valuestring);
  }
  mp_rope_scaling *r = &m->rope_scaling;
  r->llama3 = true;
  MP_TRY(mp_json_require_number(reader, scaling, "$.rope_scaling", "factor", MP_JSON_POSITIVE,
                                &r->factor));
  MP_TRY(mp_json_require_number(reader, scaling, "$.rope_scaling", "low_freq_factor",
                                MP_JSON_POSITIVE, &r->low_freq_factor));
  MP_TRY(mp_json_require_number(reader, scaling, "$.rope_scaling", "high_freq_factor",
                                MP_JSON_POSITIVE, &r->high_freq_factor));
  MP_TRY(mp_json_require_int(reader, scaling, "$.rope_scaling",
                             "original_max_position_embeddings", MP_JSON_POSITIVE,
                             &r->original_max_positions));
  if (!(r->high_freq_factor > r->low_freq_factor)) {
    /* transformers would divide by zero (equal) or swap the bands (below). */
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.rope_scaling.high_freq_factor: %g must be above low_freq_factor %g",
                   reader->source, r->high_freq_factor, r->low_freq_factor);
  }
  return MP_OK;
}

/* The experts of Mixtral and Qwen2-MoE, with transformers 4.46's defaults (MixtralConfig,
 * Qwen2MoeConfig). The load-balancing loss joins transformers' loss only with
 * output_router_logits true, so its coefficient is router_aux_loss_coef then and 0 otherwise. */
static mp_status read_moe_config(const mp_json_reader *reader, const cJSON *config,
                                 imported_model *m) {
  mp_moe_spec *moe = &m->moe;
  const bool mixtral = m->family == FAMILY_MIXTRAL;
  const char *experts_key = mixtral ? "num_local_experts" : "num_experts";
  MP_TRY(mp_json_optional_int(reader, config, "$", experts_key, MP_JSON_POSITIVE, mixtral ? 8 : 60,
                              &moe->experts));
  MP_TRY(mp_json_optional_int(reader, config, "$", "num_experts_per_tok", MP_JSON_POSITIVE,
                              mixtral ? 2 : 4, &moe->top_k));
  if (moe->top_k > moe->experts) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.num_experts_per_tok: %lld is more than $.%s %lld",
                   reader->source, (long long)moe->top_k, experts_key, (long long)moe->experts);
  }
  bool output_router_logits = false;
  double coefficient = 0.001;
  MP_TRY(mp_json_optional_bool(reader, config, "$", "output_router_logits", false,
                               &output_router_logits));
  MP_TRY(mp_json_optional_number(reader, config, "$", "router_aux_loss_coef", MP_JSON_NONNEGATIVE,
                                 0.001, &coefficient));
  moe->aux_loss_coeff = output_router_logits ? coefficient : 0.0;
  moe->router = MP_MOE_ROUTER_SOFTMAX;
  if (mixtral) {
    moe->expert_ffn_hidden = m->ffn_hidden; /* intermediate_size: each expert's width */
    moe->normalize_top_k = true;            /* MixtralSparseMoeBlock always renormalises */
    double jitter = 0.0;
    MP_TRY(mp_json_optional_number(reader, config, "$", "router_jitter_noise",
                                   MP_JSON_NONNEGATIVE, 0.0, &jitter));
    if (jitter != 0.0) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: $.router_jitter_noise: %g cannot be imported; the model description's "
                     "router has no input noise (set it to 0)",
                     reader->source, jitter);
    }
    return MP_OK;
  }
  MP_TRY(mp_json_optional_int(reader, config, "$", "moe_intermediate_size", MP_JSON_POSITIVE,
                              1408, &moe->expert_ffn_hidden));
  MP_TRY(mp_json_optional_int(reader, config, "$", "shared_expert_intermediate_size",
                              MP_JSON_POSITIVE, 5632, &moe->shared_ffn_hidden));
  moe->shared_gate = true; /* Qwen2MoeSparseMoeBlock always gates its shared expert */
  MP_TRY(mp_json_optional_bool(reader, config, "$", "norm_topk_prob", false,
                               &moe->normalize_top_k));
  int64_t step = 1;
  MP_TRY(mp_json_optional_int(reader, config, "$", "decoder_sparse_step", MP_JSON_POSITIVE, 1,
                              &step));
  if (step != 1) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.decoder_sparse_step: %lld makes only one block in %lld a mixture of "
                   "experts, which the import cannot represent yet (it writes one block shape "
                   "for every layer); only 1 imports",
                   reader->source, (long long)step, (long long)step);
  }
  const cJSON *dense_layers = config_item(config, "mlp_only_layers");
  if (dense_layers != NULL && !cJSON_IsNull(dense_layers) &&
      (!cJSON_IsArray(dense_layers) || cJSON_GetArraySize(dense_layers) > 0)) {
    char text[80];
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.mlp_only_layers: %s gives those blocks a dense MLP, which the import "
                   "cannot represent yet (it writes one block shape for every layer); only [] "
                   "imports",
                   reader->source, value_text(dense_layers, text, sizeof text));
  }
  return MP_OK;
}

static mp_status read_llama_family(const mp_json_reader *reader, const cJSON *config,
                                   imported_model *m, int64_t *max_position_embeddings) {
  if (m->family == FAMILY_QWEN3_MOE) {
    /* Qwen3MoeAttention normalises each head's queries and keys (q_norm, k_norm) and sets its
     * head size by head_dim: neither is in the model description's block. */
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.architectures[0]: \"Qwen3MoeForCausalLM\" cannot be imported: its "
                   "attention applies an RMSNorm to each head's queries and keys (q_norm, "
                   "k_norm), which the model description cannot represent",
                   reader->source);
  }
  MP_TRY(require_size(reader, config, "hidden_size", &m->hidden));
  MP_TRY(require_size(reader, config, "num_attention_heads", &m->heads));
  MP_TRY(optional_int_or_null(reader, config, "num_key_value_heads", m->heads, &m->kv_heads));
  MP_TRY(require_size(reader, config, "intermediate_size", &m->ffn_hidden));
  MP_TRY(require_size(reader, config, "num_hidden_layers", &m->layers));
  MP_TRY(require_size(reader, config, "vocab_size", &m->vocab_size));
  MP_TRY(require_size(reader, config, "max_position_embeddings", max_position_embeddings));
  MP_TRY(check_heads(reader, "hidden_size", "num_attention_heads", m));
  /* Llama and Mistral read head_dim (Llama 3.2 writes it); Qwen2 in transformers 4.46 always
   * uses hidden_size / num_attention_heads, whatever a head_dim key says. */
  int64_t head_dim = m->hidden / m->heads;
  if (m->family != FAMILY_QWEN2 && m->family != FAMILY_QWEN2_MOE) {
    MP_TRY(optional_int_or_null(reader, config, "head_dim", m->hidden / m->heads, &head_dim));
  }
  if (head_dim != m->hidden / m->heads) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.head_dim: %lld differs from hidden_size / num_attention_heads = %lld, "
                   "which the model description cannot represent (its head size is hidden / "
                   "heads)",
                   reader->source, (long long)head_dim, (long long)(m->hidden / m->heads));
  }
  if (m->family == FAMILY_MIXTRAL || m->family == FAMILY_QWEN2_MOE) {
    MP_TRY(read_moe_config(reader, config, m));
  } else {
    MP_TRY(refuse_mixture_of_experts(reader, config));
  }

  m->rmsnorm = true;
  m->swiglu = true;
  m->max_positions = 0; /* rotary embeddings: no learned position table */
  MP_TRY(mp_json_optional_number(reader, config, "$", "rms_norm_eps", MP_JSON_POSITIVE, 1e-6,
                                 &m->norm_eps));
  MP_TRY(mp_json_optional_number(reader, config, "$", "rope_theta", MP_JSON_POSITIVE, 10000.0,
                                 &m->rope_theta));
  MP_TRY(read_rope_scaling(reader, config, m));
  double partial_rotary = 1.0;
  MP_TRY(mp_json_optional_number(reader, config, "$", "partial_rotary_factor", MP_JSON_POSITIVE,
                                 1.0, &partial_rotary));
  if (partial_rotary != 1.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.partial_rotary_factor: %g cannot be imported; the model description "
                   "rotates the whole head",
                   reader->source, partial_rotary);
  }
  const char *activation = NULL;
  MP_TRY(mp_json_optional_string(reader, config, "$", "hidden_act", "silu", &activation));
  if (strcmp(activation, "silu") != 0 && strcmp(activation, "swish") != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.hidden_act: \"%.40s\" cannot be imported; the model description's "
                   "SwiGLU gates with silu (hidden_act \"silu\")",
                   reader->source, activation);
  }
  MP_TRY(mp_json_optional_bool(reader, config, "$", "tie_word_embeddings", false,
                               &m->tie_embedding));
  /* The description's dropout is hidden and attention dropout at once; these models have only
   * attention dropout, so the one value they share is 0. */
  double attention_dropout = 0.0;
  MP_TRY(read_dropout(reader, config, "attention_dropout", 0.0, &attention_dropout));
  if (attention_dropout != 0.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.attention_dropout: %g cannot be imported; the model description's "
                   "dropout applies to the hidden states as well as to attention, and %s has "
                   "attention dropout only; set it to 0",
                   reader->source, attention_dropout, m->architecture);
  }
  m->dropout = 0.0;

  switch (m->family) {
    case FAMILY_LLAMA: {
      /* LlamaForCausalLM: attention_bias on q, k, v and o; mlp_bias on gate, up and down. */
      bool attention_bias = false, mlp_bias = false;
      MP_TRY(mp_json_optional_bool(reader, config, "$", "attention_bias", false,
                                   &attention_bias));
      MP_TRY(mp_json_optional_bool(reader, config, "$", "mlp_bias", false, &mlp_bias));
      if (attention_bias != mlp_bias) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: $.%s: true with %s false puts biases on %s only, which the model "
                       "description cannot represent (its bias is on every linear layer, on "
                       "none, or on q, k and v only)",
                       reader->source, attention_bias ? "attention_bias" : "mlp_bias",
                       attention_bias ? "mlp_bias" : "attention_bias",
                       attention_bias ? "the attention projections (q, k, v, o)"
                                      : "the MLP (gate, up, down)");
      }
      m->bias = attention_bias ? MP_BIAS_ALL : MP_BIAS_NONE;
      /* LlamaForCausalLM has no sliding window; a sliding_window key is ignored by it. */
      break;
    }
    case FAMILY_MISTRAL: {
      m->bias = MP_BIAS_NONE;
      const cJSON *window = config_item(config, "sliding_window");
      if (window == NULL) {
        MP_TRY(check_window(reader, "sliding_window",
                            "absent, so MistralConfig's default 4096 applies",
                            kTransformersDefaultSlidingWindow, *max_position_embeddings));
      } else if (!cJSON_IsNull(window)) {
        int64_t size = 0;
        MP_TRY(require_size(reader, config, "sliding_window", &size));
        char how[64];
        snprintf(how, sizeof how, "%lld", (long long)size);
        MP_TRY(check_window(reader, "sliding_window", how, size, *max_position_embeddings));
      }
      break;
    }
    case FAMILY_MIXTRAL: {
      /* MixtralConfig's sliding_window defaults to None (no window), unlike Mistral's. */
      m->bias = MP_BIAS_NONE;
      if (!absent_or_null(config, "sliding_window")) {
        int64_t size = 0;
        MP_TRY(require_size(reader, config, "sliding_window", &size));
        char how[64];
        snprintf(how, sizeof how, "%lld", (long long)size);
        MP_TRY(check_window(reader, "sliding_window", how, size, *max_position_embeddings));
      }
      break;
    }
    case FAMILY_QWEN2:
    case FAMILY_QWEN2_MOE: {
      m->bias = MP_BIAS_QKV; /* Qwen2ForCausalLM: biases on q, k and v, none elsewhere */
      bool use_window = false;
      MP_TRY(mp_json_optional_bool(reader, config, "$", "use_sliding_window", false,
                                   &use_window));
      if (use_window && !absent_or_null(config, "sliding_window")) {
        int64_t size = 0;
        MP_TRY(require_size(reader, config, "sliding_window", &size));
        char how[96];
        snprintf(how, sizeof how, "true with sliding_window %lld", (long long)size);
        MP_TRY(check_window(reader, "use_sliding_window", how, size, *max_position_embeddings));
      } else if (use_window && config_item(config, "sliding_window") == NULL) {
        MP_TRY(check_window(reader, "use_sliding_window",
                            "true with no sliding_window (Qwen2Config's default, 4096)",
                            kTransformersDefaultSlidingWindow, *max_position_embeddings));
      }
      break;
    }
    case FAMILY_GPT2:
    case FAMILY_QWEN3_MOE:
      break;
  }
  return MP_OK;
}

/* ---- GPT-2 ----------------------------------------------------------------------------------- */

static mp_status read_gpt2(const mp_json_reader *reader, const cJSON *config, imported_model *m,
                           int64_t *max_position_embeddings) {
  MP_TRY(require_size(reader, config, "n_embd", &m->hidden));
  MP_TRY(require_size(reader, config, "n_head", &m->heads));
  m->kv_heads = m->heads;
  MP_TRY(require_size(reader, config, "n_layer", &m->layers));
  MP_TRY(require_size(reader, config, "n_positions", max_position_embeddings));
  MP_TRY(require_size(reader, config, "vocab_size", &m->vocab_size));
  if (m->hidden > INT64_MAX / 4) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: $.n_embd: %lld is too large",
                   reader->source, (long long)m->hidden);
  }
  MP_TRY(optional_int_or_null(reader, config, "n_inner", 4 * m->hidden, &m->ffn_hidden));
  MP_TRY(check_heads(reader, "n_embd", "n_head", m));
  MP_TRY(refuse_mixture_of_experts(reader, config));
  m->rmsnorm = false;
  m->swiglu = false;
  m->bias = MP_BIAS_ALL;
  m->rope_theta = 0.0;
  m->max_positions = *max_position_embeddings;
  MP_TRY(mp_json_optional_number(reader, config, "$", "layer_norm_epsilon", MP_JSON_POSITIVE,
                                 1e-5, &m->norm_eps));
  const char *activation = NULL;
  MP_TRY(mp_json_optional_string(reader, config, "$", "activation_function", "gelu_new",
                                 &activation));
  /* mpengine's GELU is the tanh approximation (layers/gelu.h), which is transformers'
   * gelu_new and gelu_pytorch_tanh; its "gelu" is the exact erf form, a different function. */
  if (strcmp(activation, "gelu_new") != 0 && strcmp(activation, "gelu_pytorch_tanh") != 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.activation_function: \"%.40s\" cannot be imported; the model "
                   "description's GELU is the tanh approximation (activation_function "
                   "\"gelu_new\" or \"gelu_pytorch_tanh\")%s",
                   reader->source, activation,
                   strcmp(activation, "gelu") == 0 ? ", and \"gelu\" is the exact erf form"
                                                   : "");
  }
  /* GPT-2 drops out the embedding's output, the attention probabilities and each residual
   * branch: where Megatron-LM's hidden and attention dropout go, with one probability. */
  double resid = 0.1, embd = 0.1, attn = 0.1;
  MP_TRY(read_dropout(reader, config, "resid_pdrop", 0.1, &resid));
  MP_TRY(read_dropout(reader, config, "embd_pdrop", 0.1, &embd));
  MP_TRY(read_dropout(reader, config, "attn_pdrop", 0.1, &attn));
  if (embd != resid || attn != resid) {
    const bool embd_differs = embd != resid;
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: $.%s: %g differs from resid_pdrop %g; the model description has one "
                   "dropout probability for the embedding, attention and residual dropout",
                   reader->source, embd_differs ? "embd_pdrop" : "attn_pdrop",
                   embd_differs ? embd : attn, resid);
  }
  m->dropout = resid;
  MP_TRY(require_flag(reader, config, "scale_attn_weights", true, true,
                      "the model description scales attention scores by 1/sqrt(head size)"));
  MP_TRY(require_flag(reader, config, "scale_attn_by_inverse_layer_idx", false, false,
                      "the model description scales attention scores by 1/sqrt(head size) "
                      "only, not by the layer index"));
  MP_TRY(require_flag(reader, config, "add_cross_attention", false, false,
                      "the model description has no cross-attention layers"));
  /* PretrainedConfig's default, which GPT2Config keeps. */
  MP_TRY(mp_json_optional_bool(reader, config, "$", "tie_word_embeddings", true,
                               &m->tie_embedding));
  return MP_OK;
}

/* ---- the name -------------------------------------------------------------------------------- */

/* The last component of a path or hub id: "meta-llama/Llama-3.1-8B/" -> "Llama-3.1-8B". */
static void last_component(const char *path, char *out, size_t out_bytes) {
  size_t end = strlen(path);
  while (end > 1 && path[end - 1] == '/') --end;
  size_t start = end;
  while (start > 0 && path[start - 1] != '/') --start;
  snprintf(out, out_bytes, "%.*s", (int)(end - start), path + start);
}

static mp_status choose_name(const mp_json_reader *reader, const cJSON *config,
                             const char *directory, const mp_hf_import_options *options,
                             imported_model *m) {
  char name[MP_HF_PATH_BYTES] = "";
  if (options->name != NULL) {
    snprintf(name, sizeof name, "%s", options->name);
  } else {
    const cJSON *name_or_path = config_item(config, "_name_or_path");
    if (name_or_path != NULL && !cJSON_IsNull(name_or_path)) {
      if (!cJSON_IsString(name_or_path) || name_or_path->valuestring == NULL) {
        char text[80];
        return mp_fail(reader->err, MP_ERR_INPUT, "%s: $._name_or_path: must be a string, got %s",
                       reader->source, value_text(name_or_path, text, sizeof text));
      }
      last_component(name_or_path->valuestring, name, sizeof name);
    }
    if (name[0] == '\0' || strcmp(name, "/") == 0) {
      /* The directory's own name, also when it was given as "." or with a trailing slash. */
      char resolved[PATH_MAX];
      last_component(realpath(directory, resolved) != NULL ? resolved : directory, name,
                     sizeof name);
    }
  }
  if (name[0] == '\0' || strcmp(name, "/") == 0 || strcmp(name, ".") == 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: no model name: neither _name_or_path nor the directory's name gives one; "
                   "name the model",
                   reader->source);
  }
  if (strlen(name) >= sizeof m->name) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: the model name \"%.40s...\" is longer than %d bytes; choose a shorter one",
                   reader->source, name, MP_MODEL_NAME_BYTES - 1);
  }
  snprintf(m->name, sizeof m->name, "%s", name);
  return MP_OK;
}

/* ---- the description ------------------------------------------------------------------------- */

static bool add_number(cJSON *object, const char *key, double value) {
  return cJSON_AddNumberToObject(object, key, value) != NULL;
}

static bool add_string(cJSON *object, const char *key, const char *value) {
  return cJSON_AddStringToObject(object, key, value) != NULL;
}

static bool add_bool(cJSON *object, const char *key, bool value) {
  return cJSON_AddBoolToObject(object, key, value) != NULL;
}

static cJSON *add_node(cJSON *layers, const char *type) {
  cJSON *node = cJSON_CreateObject();
  if (node == NULL) return NULL;
  if (!cJSON_AddItemToArray(layers, node) || !add_string(node, "type", type)) return NULL;
  return node;
}

/* Builds the description with the keys in the order of examples/models/ (*.json); keys whose value
 * is the description's default (dropout 0, embedding and head vocab) are left out as there. */
static cJSON *build_description(const imported_model *m) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  bool ok = add_string(root, "name", m->name) &&
            add_number(root, "vocab_size", (double)m->vocab_size) &&
            add_number(root, "seq_len", (double)m->seq_len);
  cJSON *layers = ok ? cJSON_AddArrayToObject(root, "layers") : NULL;
  ok = layers != NULL;

  cJSON *embedding = ok ? add_node(layers, "embedding") : NULL;
  ok = embedding != NULL && add_number(embedding, "hidden", (double)m->hidden) &&
       add_number(embedding, "max_positions", (double)m->max_positions);

  cJSON *block = ok ? add_node(layers, "transformer") : NULL;
  ok = block != NULL && add_number(block, "hidden", (double)m->hidden) &&
       add_number(block, "heads", (double)m->heads) &&
       add_number(block, "kv_heads", (double)m->kv_heads) &&
       (m->moe.experts > 0 || add_number(block, "ffn_hidden", (double)m->ffn_hidden)) &&
       add_string(block, "norm", m->rmsnorm ? "rmsnorm" : "layernorm") &&
       add_number(block, "norm_eps", m->norm_eps) &&
       add_string(block, "activation", m->swiglu ? "swiglu" : "gelu");
  if (ok) {
    ok = m->bias == MP_BIAS_QKV ? add_string(block, "bias", "qkv")
                                : add_bool(block, "bias", m->bias == MP_BIAS_ALL);
  }
  if (ok && m->dropout > 0.0) ok = add_number(block, "dropout", m->dropout);
  if (ok && m->rope_theta > 0.0) ok = add_number(block, "rope_theta", m->rope_theta);
  if (ok && m->rope_scaling.llama3) {
    const mp_rope_scaling *r = &m->rope_scaling;
    cJSON *scaling = cJSON_AddObjectToObject(block, "rope_scaling");
    ok = scaling != NULL && add_string(scaling, "rope_type", "llama3") &&
         add_number(scaling, "factor", r->factor) &&
         add_number(scaling, "low_freq_factor", r->low_freq_factor) &&
         add_number(scaling, "high_freq_factor", r->high_freq_factor) &&
         add_number(scaling, "original_max_position_embeddings",
                    (double)r->original_max_positions);
  }
  if (ok && m->moe.experts > 0) {
    const mp_moe_spec *e = &m->moe;
    cJSON *moe = cJSON_AddObjectToObject(block, "moe");
    ok = moe != NULL && add_number(moe, "experts", (double)e->experts) &&
         add_number(moe, "top_k", (double)e->top_k) &&
         add_number(moe, "expert_ffn_hidden", (double)e->expert_ffn_hidden) &&
         add_number(moe, "shared_ffn_hidden", (double)e->shared_ffn_hidden) &&
         add_bool(moe, "shared_gate", e->shared_gate) && add_string(moe, "router", "softmax") &&
         add_bool(moe, "normalize_top_k", e->normalize_top_k) &&
         add_number(moe, "aux_loss_coeff", e->aux_loss_coeff) &&
         add_number(moe, "z_loss_coeff", 0.0) && cJSON_AddNullToObject(moe, "capacity_factor");
  }
  ok = ok && add_number(block, "repeat", (double)m->layers);

  cJSON *norm = ok ? add_node(layers, "layernorm") : NULL;
  ok = norm != NULL && add_number(norm, "hidden", (double)m->hidden) &&
       add_string(norm, "norm", m->rmsnorm ? "rmsnorm" : "layernorm") &&
       add_number(norm, "norm_eps", m->norm_eps);

  cJSON *head = ok ? add_node(layers, "lm_head") : NULL;
  ok = head != NULL && add_number(head, "hidden", (double)m->hidden) &&
       add_bool(head, "tie_embedding", m->tie_embedding);
  if (!ok) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

/* ---- the entry point ------------------------------------------------------------------------- */

static mp_status locate_config(const char *hf_path, char *config_path, size_t config_bytes,
                               char *directory, size_t directory_bytes, mp_error *err) {
  struct stat info;
  if (stat(hf_path, &info) != 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", hf_path, strerror(errno));
  }
  if (S_ISDIR(info.st_mode)) {
    if ((size_t)snprintf(config_path, config_bytes, "%s/config.json", hf_path) >= config_bytes ||
        (size_t)snprintf(directory, directory_bytes, "%s", hf_path) >= directory_bytes) {
      return mp_fail(err, MP_ERR_INPUT, "%.200s...: the path is too long", hf_path);
    }
    return MP_OK;
  }
  /* The config.json itself: its directory names the model. */
  if ((size_t)snprintf(config_path, config_bytes, "%s", hf_path) >= config_bytes) {
    return mp_fail(err, MP_ERR_INPUT, "%.200s...: the path is too long", hf_path);
  }
  const char *slash = strrchr(hf_path, '/');
  if (slash == NULL) {
    snprintf(directory, directory_bytes, ".");
  } else {
    snprintf(directory, directory_bytes, "%.*s", (int)(slash == hf_path ? 1 : slash - hf_path),
             hf_path);
  }
  return MP_OK;
}

mp_status mp_hf_config_to_model_json(const char *hf_path, const mp_hf_import_options *options,
                                     cJSON **out, mp_hf_import_info *info, mp_error *err) {
  *out = NULL;
  const mp_hf_import_options defaults = MP_HF_IMPORT_OPTIONS_INITIALIZER;
  if (options == NULL) options = &defaults;
  char config_path[MP_HF_PATH_BYTES], directory[MP_HF_PATH_BYTES];
  MP_TRY(locate_config(hf_path, config_path, sizeof config_path, directory, sizeof directory,
                       err));
  struct stat config_info;
  if (strcmp(config_path, hf_path) != 0 && stat(config_path, &config_info) != 0 &&
      errno == ENOENT) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: no config.json in it; give the directory of a Hugging Face checkpoint "
                   "(config.json beside model.safetensors) or the config.json itself",
                   hf_path);
  }
  cJSON *config = NULL;
  MP_TRY(mp_json_load_file(config_path, &config, err));
  mp_json_reader reader = {config_path, err};
  imported_model m;
  memset(&m, 0, sizeof m);
  int64_t max_position_embeddings = 0;
  const hf_architecture *architecture = NULL;
  mp_status status = mp_json_expect_object(&reader, config, "$", "a Hugging Face config");
  if (status == MP_OK) status = read_architecture(&reader, config, &architecture);
  if (status == MP_OK) {
    m.family = architecture->family;
    m.architecture = architecture->architecture;
    status = m.family == FAMILY_GPT2
                 ? read_gpt2(&reader, config, &m, &max_position_embeddings)
                 : read_llama_family(&reader, config, &m, &max_position_embeddings);
  }
  if (status == MP_OK) status = choose_name(&reader, config, directory, options, &m);
  cJSON_Delete(config);
  if (status != MP_OK) return status;

  m.seq_len = options->seq_len > 0 ? options->seq_len : max_position_embeddings;
  if (m.max_positions > 0 && m.seq_len > m.max_positions) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: seq_len %lld exceeds $.n_positions %lld, the rows of the learned "
                   "position table; choose at most %lld",
                   config_path, (long long)m.seq_len, (long long)m.max_positions,
                   (long long)m.max_positions);
  }
  cJSON *description = build_description(&m);
  if (description == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", config_path);

  /* What mp_model_load will read: any limit the checks above do not know (a vocabulary above
   * 2^24, say) shows here, before anything is written. */
  char *text = NULL;
  status = mp_hf_model_json_text(description, &text, err);
  if (status == MP_OK) {
    mp_model *model = NULL;
    status = mp_model_parse_text(text, "the imported description", &model, err);
    mp_model_free(model);
    if (status != MP_OK) {
      mp_error_prefix(err, "%s: cannot be imported", config_path);
    }
  }
  free(text);
  if (status != MP_OK) {
    cJSON_Delete(description);
    return status;
  }
  if (info != NULL) {
    snprintf(info->architecture, sizeof info->architecture, "%s", architecture->architecture);
    snprintf(info->config_path, sizeof info->config_path, "%s", config_path);
  }
  *out = description;
  return MP_OK;
}

/* ---- writing a description as text ----------------------------------------------------------- */

/* The shortest text that reads back as the same double, as Python's repr writes it: whole
 * numbers without a fraction (8, 500000), others with %g's exponent form (1e-05, 0.1). */
static void append_number(mp_text_buffer *buffer, double value) {
  char text[40];
  if (value == floor(value) && fabs(value) < 9007199254740992.0) {
    snprintf(text, sizeof text, "%.0f", value);
  } else {
    for (int precision = 1; precision <= 17; ++precision) {
      snprintf(text, sizeof text, "%.*g", precision, value);
      if (strtod(text, NULL) == value) break;
    }
  }
  mp_text_buffer_append_text(buffer, text);
}

static void append_string(mp_text_buffer *buffer, const char *text) {
  mp_text_buffer_append_text(buffer, "\"");
  for (const unsigned char *c = (const unsigned char *)text; *c != '\0'; ++c) {
    char escaped[8];
    if (*c == '"' || *c == '\\') {
      snprintf(escaped, sizeof escaped, "\\%c", *c);
    } else if (*c < 0x20) {
      snprintf(escaped, sizeof escaped, "\\u%04x", *c);
    } else {
      snprintf(escaped, sizeof escaped, "%c", *c);
    }
    mp_text_buffer_append_text(buffer, escaped);
  }
  mp_text_buffer_append_text(buffer, "\"");
}

/* One value on one line: {"type": "embedding", "hidden": 4096}. */
static void append_inline(mp_text_buffer *buffer, const cJSON *item) {
  if (cJSON_IsObject(item) || cJSON_IsArray(item)) {
    const bool object = cJSON_IsObject(item);
    mp_text_buffer_append_text(buffer, object ? "{" : "[");
    for (const cJSON *child = item->child; child != NULL; child = child->next) {
      if (object) {
        append_string(buffer, child->string != NULL ? child->string : "");
        mp_text_buffer_append_text(buffer, ": ");
      }
      append_inline(buffer, child);
      if (child->next != NULL) mp_text_buffer_append_text(buffer, ", ");
    }
    mp_text_buffer_append_text(buffer, object ? "}" : "]");
  } else if (cJSON_IsNumber(item)) {
    append_number(buffer, item->valuedouble);
  } else if (cJSON_IsString(item)) {
    append_string(buffer, item->valuestring != NULL ? item->valuestring : "");
  } else if (cJSON_IsBool(item)) {
    mp_text_buffer_append_text(buffer, cJSON_IsTrue(item) ? "true" : "false");
  } else {
    mp_text_buffer_append_text(buffer, "null");
  }
}

mp_status mp_hf_model_json_text(const cJSON *description, char **out_text, mp_error *err) {
  *out_text = NULL;
  if (!cJSON_IsObject(description)) {
    return mp_fail(err, MP_ERR_INPUT, "a model description is a JSON object");
  }
  mp_text_buffer buffer = {0};
  mp_text_buffer_append_text(&buffer, "{\n");
  for (const cJSON *child = description->child; child != NULL; child = child->next) {
    mp_text_buffer_append_text(&buffer, "  ");
    append_string(&buffer, child->string != NULL ? child->string : "");
    mp_text_buffer_append_text(&buffer, ": ");
    if (cJSON_IsArray(child) && child->child != NULL) {
      /* "layers": one node per line. */
      mp_text_buffer_append_text(&buffer, "[\n");
      for (const cJSON *item = child->child; item != NULL; item = item->next) {
        mp_text_buffer_append_text(&buffer, "    ");
        append_inline(&buffer, item);
        mp_text_buffer_append_text(&buffer, item->next != NULL ? ",\n" : "\n");
      }
      mp_text_buffer_append_text(&buffer, "  ]");
    } else {
      append_inline(&buffer, child);
    }
    mp_text_buffer_append_text(&buffer, child->next != NULL ? ",\n" : "\n");
  }
  mp_text_buffer_append_text(&buffer, "}\n");
  if (buffer.failed) {
    free(buffer.data);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory writing a model description");
  }
  *out_text = buffer.data;
  return MP_OK;
}
