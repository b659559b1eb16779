/*
 * engine/model/param_layout.h — a model's parameters (GPT-2 and the Llama family): the layout of
 * its one flat array (so the optimizer, clipping and checkpoints walk one buffer), the tensor table
 * every stage, shard, checkpoint and llm.c file reads (each tensor's shape, tensor-parallel split
 * and init rule), the initialisation, and llm.c's checkpoint files. The forward and backward are
 * the stage's (engine/model/stage_cpu.h); the one-rank model (tests/support/one_rank_model.h) is
 * that stage at tp = 1.
 *
 * Built from a model description (topology/model.h) that the runtime can train: an embedding,
 * transformer blocks, a final norm and an LM head. Two families share the chain
 * (engine/model/stage_chain.h), the table says which tensors a model has:
 *   GPT-2: a learned position table, layernorm, GELU, biases everywhere, multi-head attention
 *     with a fused qkv tensor, the head tied to the embedding (llm.c's tensors, in llm.c's
 *     order);
 *   the Llama family: RMSNorm (its epsilon), SwiGLU (gate and up tensors), rotary embeddings
 *     (Hugging Face's rotate-half, Llama 3.1's scaling), grouped-query attention with separate
 *     q, k, v tensors, biases none, on q-k-v only (Qwen2) or everywhere, a tied or untied head.
 * A model mixing the two (rmsnorm with gelu, say) is laid out as the Llama family. A Llama-family
 * model whose blocks all carry "moe" (Mixtral, Qwen2-MoE) has a router, stacked experts and an
 * optional gated shared expert in place of the dense MLP's tensors (MP_BLOCK_ROUTER_WEIGHT ...);
 * dense and MoE blocks mixed are refused. Custom nodes,
 * dropout and blocks of different shapes can be planned but not run, and are refused naming the
 * layer.
 *
 * The vocabulary is padded to a multiple of 64 (llm.c's 50257 -> 50304) so the LM-head GEMM
 * tiles well; padded logits take no part in the loss. Parameters are initialised by
 * engine/model/param_init.h from (seed, tensor name, element index) with GPT-2's scheme, which is
 * also the Llama family's usual one (Megatron-LM's, torchtitan's with depth scaling): N(0, 0.02),
 * residual projections (attn_proj, fc_proj) N(0, 0.02 / sqrt(2 L)), norm weights 1, biases 0.
 */
#ifndef MPENGINE_ENGINE_MODEL_PARAM_LAYOUT_H
#define MPENGINE_ENGINE_MODEL_PARAM_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "layers/rope.h"
#include "tensor_parallel/shard.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_PARAM_NAME_BYTES = 64 };

/* The model families whose tensors the layout knows (see above). */
typedef enum { MP_FAMILY_GPT2 = 0, MP_FAMILY_LLAMA } mp_model_family;

/* The sizes and choices the runtime works with. */
typedef struct {
  int max_seq_len; /* rows of the position table; with rotary embeddings the model's seq_len */
  int vocab_size;  /* V */
  int padded_vocab_size; /* Vp, a multiple of 64 */
  int num_layers;  /* L */
  int num_heads;   /* NH; head size HS = C / NH */
  int num_kv_heads; /* KVH: NH for multi-head attention, 1 for multi-query */
  int channels;    /* C */
  int ffn_channels; /* F */
  mp_model_family family;
  bool rmsnorm;        /* else layernorm (with bias) */
  double norm_eps;     /* 1e-5 for GPT-2 */
  bool swiglu;         /* else GELU (tanh) */
  mp_bias_kind bias;   /* which linear layers carry biases */
  bool learned_positions; /* embedding.wpe exists */
  bool rope;           /* rotary embeddings on q and k, as rope_spec says */
  mp_rope_spec rope_spec;
  bool tied_head;      /* the LM head is embedding.wte; else its own lm_head.weight */
  /* Mixture of experts (issue 33): every block's MLP is `moe_experts` SwiGLU experts of width
   * ffn_channels (layers/moe.h), a softmax router choosing moe_top_k of them per token, and
   * optionally a shared SwiGLU MLP of width moe_shared_ffn (with a sigmoid gate); 0 experts: the
   * dense MLP. A model whose blocks mix dense and MoE MLPs is refused (blocks of one shape). */
  int moe_experts;       /* E; 0 for a dense model */
  int moe_top_k;         /* K */
  int moe_shared_ffn;    /* Fs; 0 for none */
  bool moe_shared_gate;
  bool moe_normalize_top_k;
  double moe_aux_loss_coeff; /* the load-balancing loss's weight in the micro-batch's loss */
  double moe_z_loss_coeff;   /* the router z-loss's */
  double moe_capacity_factor; /* 0: dropless; else each expert's capacity (layers/moe.h) */
} mp_model_config;

/* A tensor's initial values (GPT-2's scheme). */
typedef enum {
  MP_INIT_ZERO = 0,         /* biases */
  MP_INIT_ONE,              /* norm weights */
  MP_INIT_NORMAL,           /* N(0, 0.02) */
  MP_INIT_NORMAL_RESIDUAL,  /* N(0, 0.02 / sqrt(2 L)): projections into the residual */
} mp_param_init_rule;

/* One named parameter tensor inside the flat array: a row of the model's tensor table, which the
 * stages, shard slicing, initialisation, checkpoints and llm.c files all read. */
typedef struct {
  char name[MP_PARAM_NAME_BYTES]; /* "embedding.wte", "block.3.qkv.weight", ... */
  size_t offset;                       /* floats from the start of the flat array */
  size_t rows, cols;                   /* cols = 1 for vectors */
  bool weight_decay;                   /* matrices and embeddings decay; biases and norms not */
  mp_tp_split split; /* how tensor parallelism cuts it (tensor_parallel/shard.h) */
  mp_param_init_rule init;
} mp_param_tensor;

/* The roles of a transformer block's tensors, in the order of the layout's block table (GPT-2's
 * order is llm.c's). A model has a subset: GPT-2 the fused qkv tensors and no K, V, UP; the
 * Llama family q, k and v separately (QKV_* is q, K_* and V_* follow it, so a rank's shards of
 * the three are one (q | k | v) matrix) and SwiGLU's gate (FC_*) and up (UP_*), which likewise
 * make one (gate | up) matrix. The stage chain (engine/model/stage_chain.h) finds each by its role.
 * */
typedef enum {
  MP_BLOCK_LN1_WEIGHT = 0,
  MP_BLOCK_LN1_BIAS,
  MP_BLOCK_QKV_WEIGHT,
  MP_BLOCK_K_WEIGHT,
  MP_BLOCK_V_WEIGHT,
  MP_BLOCK_QKV_BIAS,
  MP_BLOCK_K_BIAS,
  MP_BLOCK_V_BIAS,
  MP_BLOCK_ATTN_PROJ_WEIGHT,
  MP_BLOCK_ATTN_PROJ_BIAS,
  MP_BLOCK_LN2_WEIGHT,
  MP_BLOCK_LN2_BIAS,
  MP_BLOCK_FC_WEIGHT,
  MP_BLOCK_UP_WEIGHT,
  MP_BLOCK_FC_BIAS,
  MP_BLOCK_UP_BIAS,
  MP_BLOCK_FC_PROJ_WEIGHT,
  MP_BLOCK_FC_PROJ_BIAS,
  /* A mixture-of-experts block's MLP instead of FC_* / UP_* / FC_PROJ_* (layers/moe.h's shapes;
   * each whole on every tensor-parallel rank: expert-tp 1): */
  MP_BLOCK_ROUTER_WEIGHT,      /* (E, C) */
  MP_BLOCK_EXPERT_FC1_WEIGHT,  /* (E 2F, C): each expert's gate rows then its up rows */
  MP_BLOCK_EXPERT_FC2_WEIGHT,  /* (E C, F): each expert's down projection */
  MP_BLOCK_SHARED_FC1_WEIGHT,  /* (2Fs, C) [gate | up] of the shared MLP */
  MP_BLOCK_SHARED_FC2_WEIGHT,  /* (C, Fs) */
  MP_BLOCK_SHARED_GATE_WEIGHT, /* (1, C) */
  MP_BLOCK_TENSORS
} mp_block_tensor;

/* The tensors outside the blocks. */
typedef enum {
  MP_GLOBAL_WTE = 0,        /* token embedding (and the LM head when tied) */
  MP_GLOBAL_WPE,            /* learned position embedding */
  MP_GLOBAL_LNF_WEIGHT,     /* final norm */
  MP_GLOBAL_LNF_BIAS,
  MP_GLOBAL_LM_HEAD,        /* an untied LM head */
  MP_GLOBAL_TENSORS
} mp_global_tensor;

/* The parameter layout of a model, without any memory: its config and tensor table. The CPU and
 * GPU stages (stage_cpu.h, stage_gpu.h) share it, so one flat fp32 array means the same
 * thing everywhere (initialisation, llm.c files, checkpoints). */
typedef struct mp_param_layout mp_param_layout;

/* Checks that the runtime can train `model` at seq_len and lays it out. MP_ERR_INPUT naming the
 * model file and the layer for models it cannot run (custom nodes, dropout, blocks of different
 * shapes), or a seq_len beyond the position table. */
mp_status mp_param_layout_create(const mp_model *model, int seq_len, mp_param_layout **out,
                               mp_error *err);
void mp_param_layout_free(mp_param_layout *layout);
const mp_model_config *mp_param_layout_config(const mp_param_layout *layout);
size_t mp_param_layout_num_params(const mp_param_layout *layout);
int mp_param_layout_num_tensors(const mp_param_layout *layout);
const mp_param_tensor *mp_param_layout_tensor(const mp_param_layout *layout, int index);
/* The table index of block layer's tensor of role, of a global tensor (-1: the model has none);
 * the block layer holds the tensor of table index (-1 outside the blocks). A block's tensors are
 * the tensors_per_block rows of the table from block_index(layer, LN1_WEIGHT). */
int mp_param_layout_block_index(const mp_param_layout *layout, int layer, mp_block_tensor role);
int mp_param_layout_tensors_per_block(const mp_param_layout *layout);
int mp_param_layout_global_index(const mp_param_layout *layout, mp_global_tensor which);
int mp_param_layout_layer_of(const mp_param_layout *layout, int index);
/* The model description's file (its source name), for messages. */
const char *mp_param_layout_model_source(const mp_param_layout *layout);

/* GPT-2 initialisation of params (mp_param_layout_num_params floats) from seed. */
void mp_param_layout_init_params(const mp_param_layout *layout, float *params, uint64_t seed);

/* The initial values of the (rows, cols) block at (row_offset, col_offset) of tensor (a row of
 * layout's table) into out (rows x cols, row-major): exactly the numbers
 * mp_param_layout_init_params puts there, drawn without the rest of the tensor. */
void mp_param_tensor_init_block(const mp_param_layout *layout, const mp_param_tensor *tensor,
                              float *out, size_t rows, size_t cols, size_t row_offset,
                              size_t col_offset, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_PARAM_LAYOUT_H */
