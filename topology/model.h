/*
 * topology/model.h — a model description (JSON) read into an ordered chain of layers.
 *
 * The planner, `mpengine describe` and the runtime all start here. The JSON names the model's
 * nodes in order; a transformer node with "repeat": 12 becomes 12 layers, so every later stage
 * (partitioning, costs, the runtime's parameter names) sees one record per layer.
 *
 * Format (keys in snake_case; unknown keys are refused with the closest known key named):
 *   {
 *     "name": "gpt2-124m",
 *     "vocab_size": 50257,            vocabulary of the tokenizer
 *     "seq_len": 1024,                default sequence length for costs and training
 *     "layers": [
 *       {"type": "embedding", "hidden": 768, "vocab": 50257, "max_positions": 1024},
 *       {"type": "transformer", "hidden": 768, "heads": 12, "ffn_hidden": 3072, "repeat": 12,
 *        "kv_heads": 12, "norm": "layernorm", "activation": "gelu", "bias": true,
 *        "dropout": 0, "attention": "flash", "norm_eps": 1e-5, "rope_theta": 500000,
 *        "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
 *                         "high_freq_factor": 4, "original_max_position_embeddings": 8192}},
 *       {"type": "layernorm", "hidden": 768, "norm": "layernorm", "norm_eps": 1e-5},
 *       {"type": "lm_head", "hidden": 768, "vocab": 50257, "tie_embedding": true},
 *       {"type": "custom", "name": "moe-router", "params": 1000, "forward_flops_per_token": 2e3,
 *        "activation_bytes_per_token": 64, "output_bytes_per_token": 1536}
 *     ]
 *   }
 * Defaults: embedding.vocab and lm_head.vocab = vocab_size; max_positions = seq_len (0 for no
 * learned position table); ffn_hidden = 4 * hidden; kv_heads = heads; norm layernorm;
 * activation gelu; bias true; dropout 0; norm_eps 1e-5; no rotary embedding (rope_theta absent);
 * repeat 1; tie_embedding true. "bias" is true (every linear layer), false (none: Llama,
 * Mistral) or "qkv" (only the query, key and value projections: Qwen2). "rope_theta" gives the
 * block rotary position embeddings in Hugging Face's rotate-half convention (a model with them
 * normally has no learned position table: "max_positions": 0 on the embedding), "rope_scaling"
 * Llama 3.1's frequency scaling (mp_rope_scaling; no other rope_type is known). The layernorm
 * node (the final norm) takes "norm" and "norm_eps" like a block. "dropout" is the probability
 * of Megatron-LM's hidden and attention dropout (GPT-3-style runs use 0.1): it costs memory
 * traffic and 1-byte masks, which the planner counts; the runtime trains without dropout and
 * refuses a model with dropout > 0. "attention" is how the attention core runs, for the costs:
 * "unfused" (batched Q K^T and P V GEMMs with the (B, NH, T, T) probabilities in memory, as
 * Megatron-LM ran in 2022 and our CPU backend runs), "flash" (one fused kernel that keeps only
 * per-row statistics, as our CUDA backend runs), or absent: the backend's own (flash on a bf16
 * device, unfused on an fp32 one). A `custom` node lets the planner plan
 * a layer the runtime cannot run: its costs are given, not derived.
 *
 * Mixture of experts (issue 33): a transformer node's MLP is E experts, of which a router sends
 * every token to its top k, when the node has "moe" (Mixtral, Qwen2-MoE, Qwen3-MoE):
 *   "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 14336,
 *           "shared_ffn_hidden": 0, "shared_gate": false, "router": "softmax",
 *           "normalize_top_k": true, "aux_loss_coeff": 0.02, "z_loss_coeff": 0,
 *           "capacity_factor": null}
 * experts (E), top_k (k <= E) and expert_ffn_hidden (each expert's SwiGLU width) are required.
 * shared_ffn_hidden is the width of an MLP every token also goes through (Qwen2-MoE's
 * shared_expert; several shared experts of one width are one MLP of their summed width), 0 or
 * absent for none; shared_gate scales its output by sigmoid(x . w) per token (Qwen2-MoE's
 * shared_expert_gate), and needs a shared MLP. router "softmax" (the only one): softmax over all
 * E logits, then the k largest probabilities, ties to the lowest expert index; normalize_top_k
 * (default true: Mixtral; Qwen2-MoE's norm_topk_prob false) divides them by their sum.
 * aux_loss_coeff (default 0) weighs the Switch / Mixtral load-balancing loss, z_loss_coeff
 * (default 0) ST-MoE's router z-loss; capacity_factor null or absent is dropless, a positive
 * number caps each expert at capacity_factor x k x tokens / E. An MoE block needs activation
 * swiglu and no MLP biases (bias false or "qkv"), and takes no "ffn_hidden" (its ffn_hidden
 * field is set to expert_ffn_hidden).
 */
#ifndef MPENGINE_TOPOLOGY_MODEL_H
#define MPENGINE_TOPOLOGY_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_LAYER_EMBEDDING = 0,
  MP_LAYER_TRANSFORMER,
  MP_LAYER_LAYERNORM,
  MP_LAYER_LM_HEAD,
  MP_LAYER_CUSTOM,
} mp_layer_kind;

typedef enum { MP_NORM_LAYERNORM = 0, MP_NORM_RMSNORM } mp_norm_kind;
typedef enum { MP_ACTIVATION_GELU = 0, MP_ACTIVATION_SWIGLU } mp_activation_kind;
typedef enum { MP_BIAS_NONE = 0, MP_BIAS_QKV, MP_BIAS_ALL } mp_bias_kind;

/* Llama 3.1's rotary frequency scaling (Hugging Face's rope_scaling with rope_type "llama3"):
 * wavelengths above original_max_positions / low_freq_factor are divided by factor, those below
 * original_max_positions / high_freq_factor kept, and those between interpolated. */
typedef struct {
  bool llama3; /* false: no scaling */
  double factor, low_freq_factor, high_freq_factor;
  int64_t original_max_positions;
} mp_rope_scaling;

typedef enum {
  MP_ATTENTION_BACKEND = 0, /* the backend's own: flash on a bf16 device, unfused on fp32 */
  MP_ATTENTION_UNFUSED,
  MP_ATTENTION_FLASH,
} mp_attention_kind;

enum { MP_MODEL_NAME_BYTES = 128 };

typedef enum { MP_MOE_ROUTER_SOFTMAX = 0 } mp_moe_router;

/* A transformer block's mixture-of-experts MLP (the "moe" object above); experts == 0: a dense
 * block. */
typedef struct {
  int64_t experts;           /* E */
  int64_t top_k;             /* k, 1 <= k <= E */
  int64_t expert_ffn_hidden; /* F, each expert's SwiGLU width */
  int64_t shared_ffn_hidden; /* Fs, the shared MLP's width; 0 for none */
  bool shared_gate;          /* the shared MLP's output scaled by sigmoid(x . w_gate) */
  mp_moe_router router;
  bool normalize_top_k;      /* the k routing weights divided by their sum */
  double aux_loss_coeff;     /* load-balancing loss weight */
  double z_loss_coeff;       /* router z-loss weight */
  double capacity_factor;    /* 0: dropless */
} mp_moe_spec;

/* One layer of the expanded chain. Fields that do not apply to a kind are 0. */
typedef struct {
  mp_layer_kind kind;
  char name[MP_MODEL_NAME_BYTES]; /* "embedding", "block.3", "final_norm", "lm_head", custom's */
  int json_index;                 /* index of the node in $.layers it came from */
  int repeat_index;               /* 0 .. repeat-1 within that node */
  int64_t hidden;                 /* C */
  int64_t heads;                  /* NH; head size = hidden / heads */
  int64_t kv_heads;               /* key/value heads (grouped-query attention when < heads) */
  int64_t ffn_hidden;             /* MLP width */
  int64_t vocab;                  /* V, embedding and lm_head */
  int64_t max_positions;          /* learned position table rows, embedding only */
  mp_norm_kind norm;
  mp_activation_kind activation;
  mp_bias_kind bias;              /* transformer: which linear layers carry biases */
  double norm_eps;                /* transformer and layernorm nodes: the norm's epsilon */
  double rope_theta;              /* transformer: rotary embedding base; 0 for none */
  mp_rope_scaling rope_scaling;   /* transformer, with rope_theta */
  double dropout;                 /* transformer: hidden and attention dropout probability */
  mp_attention_kind attention;
  mp_moe_spec moe;                /* transformer: moe.experts > 0 for a mixture of experts */
  bool tie_embedding;             /* lm_head shares the embedding's token table */
  /* custom only */
  int64_t custom_params;
  double custom_forward_flops_per_token;
  double custom_activation_bytes_per_token; /* kept for backward */
  double custom_output_bytes_per_token;     /* handed to the next layer */
} mp_layer_spec;

typedef struct mp_model mp_model;

/* Reads a model description from a file. MP_ERR_INPUT with a message naming the file and the
 * JSON path for every mistake: missing file, syntax error (line:column), unknown key (with the
 * closest known key), wrong type, non-positive size, hidden not divisible by heads, heads not
 * divisible by kv_heads, repeat < 1, empty layers, an lm_head tied to an embedding that does not
 * exist or differs in shape. On success *out is freed with mp_model_free. */
mp_status mp_model_load(const char *path, mp_model **out, mp_error *err);

/* The same from JSON text; source names it in messages. */
mp_status mp_model_parse_text(const char *text, const char *source, mp_model **out,
                              mp_error *err);

void mp_model_free(mp_model *model);

const char *mp_model_name(const mp_model *model);
const char *mp_model_source(const mp_model *model); /* the file (or source name) it came from */
int64_t mp_model_vocab_size(const mp_model *model);
int64_t mp_model_seq_len(const mp_model *model);
int mp_model_num_layers(const mp_model *model); /* after expanding repeat */
const mp_layer_spec *mp_model_layer(const mp_model *model, int index);

/* Number of transformer layers (the "l" of the closed forms). */
int mp_model_num_transformer_layers(const mp_model *model);

/* Whether layer is a transformer block with a mixture-of-experts MLP. */
bool mp_layer_is_moe(const mp_layer_spec *layer);

/* The first mixture-of-experts layer of model, NULL when it has none. */
const mp_layer_spec *mp_model_first_moe_layer(const mp_model *model);


#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_MODEL_H */
