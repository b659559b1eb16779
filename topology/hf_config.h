/*
 * topology/hf_config.h — a Hugging Face checkpoint's config.json turned into mpengine's model
 * description (topology/model.h), for `mpengine import` and, later, `run --init-from HF_DIR`.
 *
 * The mapping follows what transformers 4.46 builds from the same file, key by key, including
 * its defaults for keys a config leaves out (a Mistral config without sliding_window gets
 * MistralConfig's 4096, a Llama one without num_key_value_heads gets one kv head per query head).
 * Whatever the description cannot represent is refused with MP_ERR_INPUT naming the config key
 * and its value, never approximated: a description that silently differs from the checkpoint
 * would plan the wrong model and, once weights load, train a different one.
 *
 * The description's fields, from LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM:
 *   hidden, heads          hidden_size, num_attention_heads
 *   kv_heads               num_key_value_heads (absent or null: = heads)
 *   ffn_hidden, repeat     intermediate_size, num_hidden_layers
 *   vocab_size, seq_len    vocab_size, max_position_embeddings (options.seq_len overrides)
 *   max_positions          0: rotary embeddings, no learned position table
 *   norm, norm_eps         rmsnorm, rms_norm_eps (default 1e-6)
 *   activation             swiglu (hidden_act "silu", or its alias "swish")
 *   bias                   Llama: attention_bias and mlp_bias both true -> true, both false
 *                          -> false; Mistral: false; Qwen2: "qkv"
 *   rope_theta             rope_theta (default 10000)
 *   rope_scaling           rope_scaling with rope_type (or the older type) "llama3" and its
 *                          factor, low_freq_factor, high_freq_factor and
 *                          original_max_position_embeddings; null or "default": none
 *   dropout                0 (attention_dropout must be 0)
 *   tie_embedding          tie_word_embeddings (default false)
 * and from GPT2LMHeadModel:
 *   hidden, heads, repeat  n_embd, n_head, n_layer; kv_heads = heads
 *   ffn_hidden             n_inner (null: 4 * n_embd)
 *   vocab_size             vocab_size
 *   seq_len, max_positions n_positions (seq_len may be shorter: options.seq_len)
 *   norm, norm_eps         layernorm, layer_norm_epsilon (default 1e-5)
 *   activation, bias       gelu (activation_function "gelu_new" or "gelu_pytorch_tanh"), true
 *   dropout                resid_pdrop = embd_pdrop = attn_pdrop (default 0.1)
 *   tie_embedding          tie_word_embeddings (default true)
 * and from MixtralForCausalLM (Mistral's keys; no sliding window unless sliding_window is set)
 * and Qwen2MoeForCausalLM (Qwen2's keys), a "moe" block (topology/model.h):
 *   experts                num_local_experts (default 8) / num_experts (default 60)
 *   top_k                  num_experts_per_tok (default 2 / 4)
 *   expert_ffn_hidden      Mixtral: intermediate_size; Qwen2-MoE: moe_intermediate_size (1408)
 *   shared_ffn_hidden      Qwen2-MoE: shared_expert_intermediate_size (5632), shared_gate true
 *   normalize_top_k        Mixtral: true; Qwen2-MoE: norm_topk_prob (default false)
 *   aux_loss_coeff         router_aux_loss_coef (default 0.001) when output_router_logits is
 *                          true, else 0: transformers adds the loss only then
 *   router softmax, z_loss_coeff 0, capacity_factor null (both are dropless)
 * The name: options.name, else _name_or_path's last component, else the checkpoint
 * directory's name.
 *
 * Refused: another architecture (the message lists the supported ones); a model_type that disagrees
 * with the architecture; Qwen3MoeForCausalLM (its per-head query and key RMSNorm); Mixtral's
 * router_jitter_noise above 0; Qwen2-MoE's decoder_sparse_step other than 1 and a non-empty
 * mlp_only_layers (blocks of two shapes); a sliding window shorter than
 * max_position_embeddings (Mistral's sliding_window, Qwen2's use_sliding_window); on the dense
 * architectures, mixture-of-experts keys (num_local_experts, num_experts, num_experts_per_tok, n_routed_experts, n_shared_experts, moe_intermediate_size,
 * shared_expert_intermediate_size); a rope_scaling type other than llama3 / default (linear,
 * dynamic, yarn, longrope, ...), a llama3 one with high_freq_factor not above low_freq_factor, and
 * any scaling on Mistral (which transformers 4.46 ignores and later versions apply);
 * partial_rotary_factor other than 1; hidden_act other than silu (Llama family);
 * activation_function other than the tanh GELU gelu_new / gelu_pytorch_tanh (GPT-2: the exact erf
 * "gelu" is not mpengine's GELU); head_dim other than hidden_size / num_attention_heads (Llama,
 * Mistral; Qwen2 ignores head_dim); Llama biases on attention only or on the MLP only;
 * attention_dropout above 0 (mpengine's dropout covers the hidden states too); GPT-2 dropouts that
 * differ, scale_attn_weights false, scale_attn_by_inverse_layer_idx true, add_cross_attention true;
 * a missing required size (hidden_size, num_attention_heads, num_hidden_layers, intermediate_size,
 * vocab_size, max_position_embeddings; GPT-2: n_embd, n_head, n_layer, n_positions, vocab_size); a
 * value of the wrong type; a seq_len longer than GPT-2's position table; and anything the finished
 * description fails to load with (it is checked with mp_model_parse_text before it is returned).
 */
#ifndef MPENGINE_TOPOLOGY_HF_CONFIG_H
#define MPENGINE_TOPOLOGY_HF_CONFIG_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the caller may set instead of taking it from the checkpoint. */
typedef struct {
  int64_t seq_len;  /* > 0: the description's seq_len; 0: max_position_embeddings / n_positions */
  const char *name; /* non-NULL: the description's name; NULL: from the checkpoint (above) */
} mp_hf_import_options;

#define MP_HF_IMPORT_OPTIONS_INITIALIZER {0, NULL}

enum { MP_HF_ARCHITECTURE_BYTES = 64, MP_HF_PATH_BYTES = 4096 };

/* What was read, for the caller's report. */
typedef struct {
  char architecture[MP_HF_ARCHITECTURE_BYTES]; /* "LlamaForCausalLM" */
  char config_path[MP_HF_PATH_BYTES];          /* the config.json read */
} mp_hf_import_info;

/* Reads hf_path/config.json (hf_path may also be the config.json file itself) and builds the
 * model description in *out (keys in the order of examples/models/ (*.json); free it with
 * cJSON_Delete). options may be NULL (all defaults), info NULL when not wanted. Fails with
 * MP_ERR_INPUT naming the file, the key ("$.sliding_window") and its value for every refusal in
 * the list above, for a missing or unreadable config.json and for JSON syntax errors;
 * MP_ERR_RUNTIME when out of memory. *out is NULL on failure. */
mp_status mp_hf_config_to_model_json(const char *hf_path, const mp_hf_import_options *options,
                                     cJSON **out, mp_hf_import_info *info, mp_error *err);

/* A model description as text in the style of examples/models/ (*.json): the top-level keys one
 * per line, each node of "layers" on one line, ", " and ": " between items, numbers in their
 * shortest form that reads back exactly (8, 1e-05, 500000), and a final newline. *out_text is
 * freed with free(). MP_ERR_RUNTIME when out of memory, MP_ERR_INPUT when description is not an
 * object. */
mp_status mp_hf_model_json_text(const cJSON *description, char **out_text, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_HF_CONFIG_H */
