/* engine/model/param_layout.c — a model's parameter layout (the tensor table) and its
 * initialisation. See param_layout.h. */
#include "engine/model/param_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "engine/model/param_init.h"
#include "tensor_parallel/shard.h"

enum {
  kVocabPadding = 64,
};


struct mp_param_layout {
  mp_model_config config;
  char model_source[1024];
  size_t num_params;
  int num_tensors;
  mp_param_tensor *tensors; /* (num_tensors,) in the order of the flat array */
  int first_block;        /* table index of block 0's first tensor */
  int tensors_per_block;
  int block_slot[MP_BLOCK_TENSORS]; /* a role's place within a block, -1 when absent */
  int global_index[MP_GLOBAL_TENSORS];
};

static mp_status unsupported(const mp_model *model, const mp_layer_spec *layer, const char *what,
                             mp_error *err) {
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: $.layers[%d] (%s): %s; the runtime trains GPT-2 and Llama-family models "
                 "(an embedding, transformer blocks of one shape, a final norm, an LM head); "
                 "this model can be planned but not run",
                 mp_model_source(model), layer->json_index, layer->name, what);
}

static mp_rope_spec rope_spec_of(const mp_layer_spec *block) {
  mp_rope_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.theta = block->rope_theta;
  spec.llama3 = block->rope_scaling.llama3;
  spec.factor = block->rope_scaling.factor;
  spec.low_freq_factor = block->rope_scaling.low_freq_factor;
  spec.high_freq_factor = block->rope_scaling.high_freq_factor;
  spec.original_max_positions = (double)block->rope_scaling.original_max_positions;
  return spec;
}

static bool same_moe(const mp_moe_spec *a, const mp_moe_spec *b) {
  return a->experts == b->experts && a->top_k == b->top_k &&
         a->expert_ffn_hidden == b->expert_ffn_hidden &&
         a->shared_ffn_hidden == b->shared_ffn_hidden && a->shared_gate == b->shared_gate &&
         a->router == b->router && a->normalize_top_k == b->normalize_top_k &&
         a->aux_loss_coeff == b->aux_loss_coeff && a->z_loss_coeff == b->z_loss_coeff &&
         a->capacity_factor == b->capacity_factor;
}

/* The block's choices, which every block must share with the first. */
static bool same_block(const mp_layer_spec *a, const mp_layer_spec *b) {
  return a->heads == b->heads && a->kv_heads == b->kv_heads && a->ffn_hidden == b->ffn_hidden &&
         a->norm == b->norm && a->norm_eps == b->norm_eps && a->activation == b->activation &&
         a->bias == b->bias && a->rope_theta == b->rope_theta &&
         a->rope_scaling.llama3 == b->rope_scaling.llama3 &&
         a->rope_scaling.factor == b->rope_scaling.factor &&
         a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor &&
         a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor &&
         a->rope_scaling.original_max_positions == b->rope_scaling.original_max_positions &&
         same_moe(&a->moe, &b->moe);
}

static mp_status read_block(const mp_model *model, const mp_layer_spec *block, int64_t channels,
                            mp_error *err) {
  if (block->dropout > 0.0) {
    return unsupported(model, block, "dropout > 0 (the runtime trains without dropout)", err);
  }
  if (block->hidden != channels) {
    return unsupported(model, block, "a hidden size other than the embedding's", err);
  }
  if (block->heads < 1 || channels % block->heads != 0) {
    return unsupported(model, block, "heads must divide hidden", err);
  }
  if (block->kv_heads < 1 || block->heads % block->kv_heads != 0) {
    return unsupported(model, block, "kv_heads must divide heads", err);
  }
  if (block->rope_theta > 0.0 && (channels / block->heads) % 2 != 0) {
    return unsupported(model, block, "rotary embeddings need an even head size", err);
  }
  if (!(block->norm_eps > 0.0)) return unsupported(model, block, "norm_eps must be > 0", err);
  if (block->norm == MP_NORM_LAYERNORM && block->norm_eps != 1e-5) {
    return unsupported(model, block, "layernorm with norm_eps other than 1e-5", err);
  }
  return MP_OK;
}

/* Fills config from the model, refusing what the runtime cannot run. */
static mp_status read_config(const mp_model *model, int seq_len, mp_model_config *config,
                             mp_error *err) {
  memset(config, 0, sizeof *config);
  int n = mp_model_num_layers(model);
  int index = 0;
  const mp_layer_spec *embedding = mp_model_layer(model, index);
  if (embedding->kind != MP_LAYER_EMBEDDING) {
    return unsupported(model, embedding, "the first layer must be the embedding", err);
  }
  config->channels = (int)embedding->hidden;
  config->vocab_size = (int)mp_model_vocab_size(model);
  config->max_seq_len = (int)embedding->max_positions;
  config->learned_positions = embedding->max_positions > 0;
  ++index;
  const mp_layer_spec *first_block = NULL;
  while (index < n && mp_model_layer(model, index)->kind == MP_LAYER_TRANSFORMER) {
    const mp_layer_spec *block = mp_model_layer(model, index);
    MP_TRY(read_block(model, block, embedding->hidden, err));
    if (first_block == NULL) {
      first_block = block;
    } else if (mp_layer_is_moe(block) != mp_layer_is_moe(first_block)) {
      return unsupported(model, block,
                         "blocks of different shapes (dense and mixture-of-experts MLPs mixed; "
                         "the runtime trains models whose blocks are all one or the other)",
                         err);
    } else if (!same_block(block, first_block)) {
      return unsupported(model, block, "blocks of different shapes", err);
    }
    ++index;
  }
  if (first_block == NULL) {
    const mp_layer_spec *layer = mp_model_layer(model, index < n ? index : n - 1);
    return unsupported(model, layer, "transformer blocks must follow the embedding", err);
  }
  config->num_layers = index - 1;
  config->num_heads = (int)first_block->heads;
  config->num_kv_heads = (int)first_block->kv_heads;
  config->ffn_channels = (int)first_block->ffn_hidden;
  config->rmsnorm = first_block->norm == MP_NORM_RMSNORM;
  config->norm_eps = first_block->norm_eps;
  config->swiglu = first_block->activation == MP_ACTIVATION_SWIGLU;
  config->bias = first_block->bias;
  config->rope = first_block->rope_theta > 0.0;
  if (config->rope) config->rope_spec = rope_spec_of(first_block);
  if (mp_layer_is_moe(first_block)) {
    const mp_moe_spec *moe = &first_block->moe;
    config->moe_experts = (int)moe->experts;
    config->moe_top_k = (int)moe->top_k;
    config->ffn_channels = (int)moe->expert_ffn_hidden;
    config->moe_shared_ffn = (int)moe->shared_ffn_hidden;
    config->moe_shared_gate = moe->shared_gate;
    config->moe_normalize_top_k = moe->normalize_top_k;
    config->moe_aux_loss_coeff = moe->aux_loss_coeff;
    config->moe_z_loss_coeff = moe->z_loss_coeff;
    config->moe_capacity_factor = moe->capacity_factor;
  }
  if (!config->rope && !config->learned_positions) {
    return unsupported(model, embedding,
                       "a model without rotary embeddings needs a learned position table "
                       "(max_positions > 0)",
                       err);
  }
  if (config->rope && config->learned_positions) {
    return unsupported(model, embedding,
                       "rotary embeddings with a learned position table too (max_positions must "
                       "be 0 with rope_theta)",
                       err);
  }
  if (index >= n || mp_model_layer(model, index)->kind != MP_LAYER_LAYERNORM) {
    const mp_layer_spec *layer = mp_model_layer(model, index < n ? index : n - 1);
    return unsupported(model, layer, "a final norm must follow the blocks", err);
  }
  const mp_layer_spec *final_norm = mp_model_layer(model, index);
  if (final_norm->norm != first_block->norm || final_norm->norm_eps != first_block->norm_eps) {
    return unsupported(model, final_norm, "a final norm unlike the blocks' (norm, norm_eps)", err);
  }
  ++index;
  if (index >= n || mp_model_layer(model, index)->kind != MP_LAYER_LM_HEAD) {
    const mp_layer_spec *layer = mp_model_layer(model, index < n ? index : n - 1);
    return unsupported(model, layer, "an lm_head must follow the final norm", err);
  }
  const mp_layer_spec *head = mp_model_layer(model, index);
  config->tied_head = head->tie_embedding;
  if (index + 1 != n) {
    return unsupported(model, mp_model_layer(model, index + 1), "layers after the LM head", err);
  }
  config->family = !config->rmsnorm && !config->swiglu && !config->rope &&
                           config->num_kv_heads == config->num_heads &&
                           config->bias == MP_BIAS_ALL && config->tied_head &&
                           config->norm_eps == 1e-5
                       ? MP_FAMILY_GPT2
                       : MP_FAMILY_LLAMA;
  config->padded_vocab_size =
      (config->vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  if (config->learned_positions && seq_len > config->max_seq_len) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: sequence length %d exceeds the position table ($.layers[0].max_positions "
                   "= %d); shorten seq_len or raise max_positions",
                   mp_model_source(model), seq_len, config->max_seq_len);
  }
  if (!config->learned_positions) {
    /* Rotary embeddings: the model's own sequence length (a Hugging Face checkpoint's
     * max_position_embeddings when imported), or the run's if that is longer. */
    const int64_t model_seq_len = mp_model_seq_len(model);
    config->max_seq_len = model_seq_len > seq_len ? (int)model_seq_len : seq_len;
  }
  return MP_OK;
}

/* Whether the model has a block tensor of role, and its name within the block. */
static bool block_role(const mp_model_config *c, mp_block_tensor role, const char **suffix) {
  const bool gpt2 = c->family == MP_FAMILY_GPT2;
  const bool layernorm = !c->rmsnorm;
  const bool any_bias = c->bias != MP_BIAS_NONE, all_bias = c->bias == MP_BIAS_ALL;
  const bool moe = c->moe_experts > 0, shared = moe && c->moe_shared_ffn > 0;
  switch (role) {
    case MP_BLOCK_FC_WEIGHT:
    case MP_BLOCK_UP_WEIGHT:
    case MP_BLOCK_FC_BIAS:
    case MP_BLOCK_UP_BIAS:
    case MP_BLOCK_FC_PROJ_WEIGHT:
    case MP_BLOCK_FC_PROJ_BIAS:
      if (moe) return false; /* the experts replace the dense MLP */
      break;
    default: break;
  }
  switch (role) {
    case MP_BLOCK_ROUTER_WEIGHT: *suffix = "router.weight"; return moe;
    case MP_BLOCK_EXPERT_FC1_WEIGHT: *suffix = "expert_fc1.weight"; return moe;
    case MP_BLOCK_EXPERT_FC2_WEIGHT: *suffix = "expert_fc2.weight"; return moe;
    case MP_BLOCK_SHARED_FC1_WEIGHT: *suffix = "shared_fc1.weight"; return shared;
    case MP_BLOCK_SHARED_FC2_WEIGHT: *suffix = "shared_fc2.weight"; return shared;
    case MP_BLOCK_SHARED_GATE_WEIGHT:
      *suffix = "shared_gate.weight";
      return shared && c->moe_shared_gate;
    case MP_BLOCK_LN1_WEIGHT: *suffix = "ln1.weight"; return true;
    case MP_BLOCK_LN1_BIAS: *suffix = "ln1.bias"; return layernorm;
    case MP_BLOCK_QKV_WEIGHT: *suffix = gpt2 ? "qkv.weight" : "q.weight"; return true;
    case MP_BLOCK_K_WEIGHT: *suffix = "k.weight"; return !gpt2;
    case MP_BLOCK_V_WEIGHT: *suffix = "v.weight"; return !gpt2;
    case MP_BLOCK_QKV_BIAS: *suffix = gpt2 ? "qkv.bias" : "q.bias"; return any_bias;
    case MP_BLOCK_K_BIAS: *suffix = "k.bias"; return !gpt2 && any_bias;
    case MP_BLOCK_V_BIAS: *suffix = "v.bias"; return !gpt2 && any_bias;
    case MP_BLOCK_ATTN_PROJ_WEIGHT: *suffix = "attn_proj.weight"; return true;
    case MP_BLOCK_ATTN_PROJ_BIAS: *suffix = "attn_proj.bias"; return all_bias;
    case MP_BLOCK_LN2_WEIGHT: *suffix = "ln2.weight"; return true;
    case MP_BLOCK_LN2_BIAS: *suffix = "ln2.bias"; return layernorm;
    case MP_BLOCK_FC_WEIGHT: *suffix = c->swiglu ? "gate.weight" : "fc.weight"; return true;
    case MP_BLOCK_UP_WEIGHT: *suffix = "up.weight"; return c->swiglu;
    case MP_BLOCK_FC_BIAS: *suffix = c->swiglu ? "gate.bias" : "fc.bias"; return all_bias;
    case MP_BLOCK_UP_BIAS: *suffix = "up.bias"; return c->swiglu && all_bias;
    case MP_BLOCK_FC_PROJ_WEIGHT: *suffix = "fc_proj.weight"; return true;
    case MP_BLOCK_FC_PROJ_BIAS: *suffix = "fc_proj.bias"; return all_bias;
    case MP_BLOCK_TENSORS: break;
  }
  return false;
}

/* A block tensor's shape (cols = 1 for vectors), tensor-parallel split and initial values. */
static void block_shape(const mp_model_config *c, mp_block_tensor role, size_t *rows,
                        size_t *cols, mp_tp_split *split, mp_param_init_rule *init) {
  const size_t C = (size_t)c->channels, F = (size_t)c->ffn_channels;
  const size_t E = (size_t)c->moe_experts, Fs = (size_t)c->moe_shared_ffn;
  const size_t kv = (size_t)c->num_kv_heads * (C / (size_t)c->num_heads);
  const bool gpt2 = c->family == MP_FAMILY_GPT2;
  *cols = 1;
  *split = MP_TP_REPLICATED;
  *init = MP_INIT_ZERO;
  switch (role) {
    case MP_BLOCK_LN1_WEIGHT:
    case MP_BLOCK_LN2_WEIGHT: *rows = C; *init = MP_INIT_ONE; return;
    case MP_BLOCK_LN1_BIAS:
    case MP_BLOCK_LN2_BIAS:
    case MP_BLOCK_ATTN_PROJ_BIAS:
    case MP_BLOCK_FC_PROJ_BIAS: *rows = C; return;
    case MP_BLOCK_QKV_WEIGHT:
      *rows = gpt2 ? 3 * C : C, *cols = C, *init = MP_INIT_NORMAL;
      *split = gpt2 ? MP_TP_SPLIT_QKV : MP_TP_SPLIT_ROWS;
      return;
    case MP_BLOCK_K_WEIGHT:
    case MP_BLOCK_V_WEIGHT:
      *rows = kv, *cols = C, *init = MP_INIT_NORMAL, *split = MP_TP_SPLIT_ROWS;
      return;
    case MP_BLOCK_QKV_BIAS:
      *rows = gpt2 ? 3 * C : C, *split = gpt2 ? MP_TP_SPLIT_QKV : MP_TP_SPLIT_ROWS;
      return;
    case MP_BLOCK_K_BIAS:
    case MP_BLOCK_V_BIAS: *rows = kv, *split = MP_TP_SPLIT_ROWS; return;
    case MP_BLOCK_ATTN_PROJ_WEIGHT:
      *rows = C, *cols = C, *init = MP_INIT_NORMAL_RESIDUAL, *split = MP_TP_SPLIT_COLS;
      return;
    case MP_BLOCK_FC_WEIGHT:
    case MP_BLOCK_UP_WEIGHT:
      *rows = F, *cols = C, *init = MP_INIT_NORMAL, *split = MP_TP_SPLIT_ROWS;
      return;
    case MP_BLOCK_FC_BIAS:
    case MP_BLOCK_UP_BIAS: *rows = F, *split = MP_TP_SPLIT_ROWS; return;
    case MP_BLOCK_FC_PROJ_WEIGHT:
      *rows = C, *cols = F, *init = MP_INIT_NORMAL_RESIDUAL, *split = MP_TP_SPLIT_COLS;
      return;
    /* The experts, router and shared MLP: whole on every tensor-parallel rank. */
    case MP_BLOCK_ROUTER_WEIGHT: *rows = E, *cols = C, *init = MP_INIT_NORMAL; return;
    case MP_BLOCK_EXPERT_FC1_WEIGHT: *rows = E * 2 * F, *cols = C, *init = MP_INIT_NORMAL; return;
    case MP_BLOCK_EXPERT_FC2_WEIGHT:
      *rows = E * C, *cols = F, *init = MP_INIT_NORMAL_RESIDUAL;
      return;
    case MP_BLOCK_SHARED_FC1_WEIGHT: *rows = 2 * Fs, *cols = C, *init = MP_INIT_NORMAL; return;
    case MP_BLOCK_SHARED_FC2_WEIGHT:
      *rows = C, *cols = Fs, *init = MP_INIT_NORMAL_RESIDUAL;
      return;
    case MP_BLOCK_SHARED_GATE_WEIGHT: *rows = 1, *cols = C, *init = MP_INIT_NORMAL; return;
    case MP_BLOCK_TENSORS: break;
  }
  *rows = 0;
}

static void add_tensor(mp_param_layout *layout, const char *name, size_t *offset, size_t rows,
                       size_t cols, mp_tp_split split, mp_param_init_rule init) {
  mp_param_tensor *tensor = &layout->tensors[layout->num_tensors++];
  snprintf(tensor->name, sizeof tensor->name, "%s", name);
  tensor->offset = *offset;
  tensor->rows = rows;
  tensor->cols = cols;
  /* Matrices and embeddings decay; biases and norms do not. */
  tensor->weight_decay = cols > 1;
  tensor->split = split;
  tensor->init = init;
  *offset += rows * cols;
}

static void add_global(mp_param_layout *layout, mp_global_tensor which, const char *name,
                       size_t *offset, size_t rows, size_t cols, mp_tp_split split,
                       mp_param_init_rule init) {
  layout->global_index[which] = layout->num_tensors;
  add_tensor(layout, name, offset, rows, cols, split, init);
}

/* Lays out the tensor table in the order of the flat array: wte, wpe, blocks, final norm, an
 * untied head; GPT-2's matches llm.c's files. */
static void build_tensor_table(mp_param_layout *layout) {
  const mp_model_config *c = &layout->config;
  const size_t C = (size_t)c->channels;
  size_t offset = 0;
  for (int g = 0; g < MP_GLOBAL_TENSORS; ++g) layout->global_index[g] = -1;
  add_global(layout, MP_GLOBAL_WTE, "embedding.wte", &offset, (size_t)c->padded_vocab_size, C,
             MP_TP_SPLIT_ROWS, MP_INIT_NORMAL);
  if (c->learned_positions) {
    add_global(layout, MP_GLOBAL_WPE, "embedding.wpe", &offset, (size_t)c->max_seq_len, C,
               MP_TP_REPLICATED, MP_INIT_NORMAL);
  }
  layout->first_block = layout->num_tensors;
  layout->tensors_per_block = 0;
  for (int r = 0; r < MP_BLOCK_TENSORS; ++r) {
    const char *suffix = NULL;
    const bool present = block_role(c, (mp_block_tensor)r, &suffix);
    layout->block_slot[r] = present ? layout->tensors_per_block++ : -1;
  }
  for (int l = 0; l < c->num_layers; ++l) {
    for (int r = 0; r < MP_BLOCK_TENSORS; ++r) {
      const char *suffix = NULL;
      if (!block_role(c, (mp_block_tensor)r, &suffix)) continue;
      size_t rows = 0, cols = 0;
      mp_tp_split split;
      mp_param_init_rule init;
      block_shape(c, (mp_block_tensor)r, &rows, &cols, &split, &init);
      char name[MP_PARAM_NAME_BYTES];
      snprintf(name, sizeof name, "block.%d.%s", l, suffix);
      add_tensor(layout, name, &offset, rows, cols, split, init);
    }
  }
  add_global(layout, MP_GLOBAL_LNF_WEIGHT, "final_norm.weight", &offset, C, 1, MP_TP_REPLICATED,
             MP_INIT_ONE);
  if (!c->rmsnorm) {
    add_global(layout, MP_GLOBAL_LNF_BIAS, "final_norm.bias", &offset, C, 1, MP_TP_REPLICATED,
               MP_INIT_ZERO);
  }
  if (!c->tied_head) {
    add_global(layout, MP_GLOBAL_LM_HEAD, "lm_head.weight", &offset, (size_t)c->padded_vocab_size,
               C, MP_TP_SPLIT_ROWS, MP_INIT_NORMAL);
  }
  layout->num_params = offset;
}

static mp_status layout_init(const mp_model *model, int seq_len, mp_param_layout *layout,
                             mp_error *err) {
  memset(layout, 0, sizeof *layout);
  MP_TRY(read_config(model, seq_len, &layout->config, err));
  snprintf(layout->model_source, sizeof layout->model_source, "%s", mp_model_source(model));
  layout->tensors = calloc((size_t)(MP_GLOBAL_TENSORS +
                                    layout->config.num_layers * MP_BLOCK_TENSORS),
                           sizeof *layout->tensors);
  if (layout->tensors == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  build_tensor_table(layout);
  return MP_OK;
}

mp_status mp_param_layout_create(const mp_model *model, int seq_len, mp_param_layout **out,
                               mp_error *err) {
  *out = NULL;
  mp_param_layout *layout = calloc(1, sizeof *layout);
  if (layout == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = layout_init(model, seq_len, layout, err);
  if (status != MP_OK) {
    mp_param_layout_free(layout);
    return status;
  }
  *out = layout;
  return MP_OK;
}

void mp_param_layout_free(mp_param_layout *layout) {
  if (layout == NULL) return;
  free(layout->tensors);
  free(layout);
}

const mp_model_config *mp_param_layout_config(const mp_param_layout *layout) {
  return &layout->config;
}
size_t mp_param_layout_num_params(const mp_param_layout *layout) { return layout->num_params; }
const char *mp_param_layout_model_source(const mp_param_layout *layout) {
  return layout->model_source;
}
int mp_param_layout_num_tensors(const mp_param_layout *layout) { return layout->num_tensors; }

const mp_param_tensor *mp_param_layout_tensor(const mp_param_layout *layout, int index) {
  return index >= 0 && index < layout->num_tensors ? &layout->tensors[index] : NULL;
}

int mp_param_layout_block_index(const mp_param_layout *layout, int layer, mp_block_tensor role) {
  if (role < 0 || role >= MP_BLOCK_TENSORS || layout->block_slot[role] < 0) return -1;
  return layout->first_block + layer * layout->tensors_per_block + layout->block_slot[role];
}

int mp_param_layout_tensors_per_block(const mp_param_layout *layout) {
  return layout->tensors_per_block;
}

int mp_param_layout_global_index(const mp_param_layout *layout, mp_global_tensor which) {
  return which >= 0 && which < MP_GLOBAL_TENSORS ? layout->global_index[which] : -1;
}

int mp_param_layout_layer_of(const mp_param_layout *layout, int index) {
  const int end = layout->first_block + layout->config.num_layers * layout->tensors_per_block;
  if (index < layout->first_block || index >= end) return -1;
  return (index - layout->first_block) / layout->tensors_per_block;
}

void mp_param_tensor_init_block(const mp_param_layout *layout, const mp_param_tensor *tensor,
                              float *out, size_t rows, size_t cols, size_t row_offset,
                              size_t col_offset, uint64_t seed) {
  const float std = 0.02f;
  switch (tensor->init) {
    case MP_INIT_ZERO:
    case MP_INIT_ONE:
      mp_init_fill_constant(out, rows * cols, tensor->init == MP_INIT_ONE ? 1.0f : 0.0f);
      return;
    case MP_INIT_NORMAL:
    case MP_INIT_NORMAL_RESIDUAL: {
      const float s = tensor->init == MP_INIT_NORMAL
                          ? std
                          : std / sqrtf(2.0f * (float)layout->config.num_layers);
      if (cols == tensor->cols) {
        /* Whole rows are one contiguous run of the tensor's elements. */
        mp_init_fill_normal(out, rows * cols, seed, tensor->name, row_offset * cols, s);
      } else {
        mp_init_fill_normal_block(out, rows, cols, row_offset, col_offset, tensor->cols, seed,
                                  tensor->name, s);
      }
      return;
    }
  }
}

void mp_param_layout_init_params(const mp_param_layout *layout, float *params, uint64_t seed) {
  for (int i = 0; i < layout->num_tensors; ++i) {
    const mp_param_tensor *t = &layout->tensors[i];
    mp_param_tensor_init_block(layout, t, params + t->offset, t->rows, t->cols, 0, 0, seed);
  }
}
