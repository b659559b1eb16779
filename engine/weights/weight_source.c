/* engine/weights/weight_source.c — the weight-source interface and its llm.c and Hugging Face GPT-2
 * implementations. See weight_source.h. */
#include "engine/weights/weight_source.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/atomic_file.h"
#include "engine/weights/safetensors.h"
#include "topology/hf_config.h"
#include "topology/model.h"
#include "engine/weights/llmc_file.h"

struct mp_weight_source {
  const mp_weight_source_ops *ops;
  void *impl;
  const mp_param_layout *layout;
};

static mp_status wrap(const mp_weight_source_ops *ops, void *impl, const mp_param_layout *layout,
                      mp_weight_source **out, mp_error *err) {
  mp_weight_source *source = calloc(1, sizeof *source);
  if (source == NULL) {
    ops->close(impl);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  source->ops = ops;
  source->impl = impl;
  source->layout = layout;
  *out = source;
  return MP_OK;
}

mp_status mp_weight_source_read(mp_weight_source *source, int tensor, size_t row, size_t rows,
                                size_t col, size_t cols, float *dest, mp_error *err) {
  const mp_param_tensor *t = mp_param_layout_tensor(source->layout, tensor);
  if (t == NULL || row > t->rows || rows > t->rows - row || col > t->cols ||
      cols > t->cols - col) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: block [%zu, +%zu) x [%zu, +%zu) of tensor %d is "
                   "outside it", source->ops->kind, row, rows, col, cols, tensor);
  }
  return source->ops->read(source->impl, tensor, t, row, rows, col, cols, dest, err);
}

mp_status mp_weight_source_fill(void *source, int tensor, size_t row, size_t rows, size_t col,
                                size_t cols, float *dest, mp_error *err) {
  return mp_weight_source_read(source, tensor, row, rows, col, cols, dest, err);
}

const char *mp_weight_source_kind(const mp_weight_source *source) { return source->ops->kind; }

void mp_weight_source_close(mp_weight_source *source) {
  if (source == NULL) return;
  source->ops->close(source->impl);
  free(source);
}

mp_status mp_weight_source_open(const mp_param_layout *layout, const char *path,
                                mp_weight_source **out, mp_error *err) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    return mp_weight_source_open_hf(layout, path, out, err);
  }
  return mp_weight_source_open_llmc(layout, path, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * llm.c files: engine/model/param_layout.h's reader already reads in the layout's terms. */

static mp_status llmc_read(void *impl, int tensor, const mp_param_tensor *t, size_t row,
                           size_t rows, size_t col, size_t cols, float *dest, mp_error *err) {
  if (cols == t->cols)
    return mp_llmc_reader_read(impl, tensor, row * t->cols, rows * cols, dest, err);
  for (size_t r = 0; r < rows; ++r) {
    MP_TRY(
        mp_llmc_reader_read(impl, tensor, (row + r) * t->cols + col, cols, dest + r * cols, err));
  }
  return MP_OK;
}

static void llmc_close(void *impl) { mp_llmc_reader_close(impl); }

static const mp_weight_source_ops kLlmcOps = {"llm.c checkpoint", llmc_read, llmc_close};

mp_status mp_weight_source_open_llmc(const mp_param_layout *layout, const char *path,
                                     mp_weight_source **out, mp_error *err) {
  *out = NULL;
  mp_llmc_reader *reader = NULL;
  MP_TRY(mp_llmc_reader_open(layout, path, &reader, err));
  return wrap(&kLlmcOps, reader, layout, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face GPT-2 directories. */

enum { kHfNameBytes = 128 };

/* A block tensor's GPT-2 name (after "h.<l>.") and whether GPT-2 stores it transposed (Conv1D). */
static const struct {
  const char *ours, *hf;
  bool transposed;
} kHfBlockNames[] = {
    {"ln1.weight", "ln_1.weight", false},
    {"ln1.bias", "ln_1.bias", false},
    {"qkv.weight", "attn.c_attn.weight", true},
    {"qkv.bias", "attn.c_attn.bias", false},
    {"attn_proj.weight", "attn.c_proj.weight", true},
    {"attn_proj.bias", "attn.c_proj.bias", false},
    {"ln2.weight", "ln_2.weight", false},
    {"ln2.bias", "ln_2.bias", false},
    {"fc.weight", "mlp.c_fc.weight", true},
    {"fc.bias", "mlp.c_fc.bias", false},
    {"fc_proj.weight", "mlp.c_proj.weight", true},
    {"fc_proj.bias", "mlp.c_proj.bias", false},
};

/* One Hugging Face tensor holding a run of rows of one of ours: a mixture of experts' stacked
 * tensors are many of theirs (each expert's gate, up and down projections). */
typedef struct {
  char name[kHfNameBytes];
  size_t row0, rows; /* our rows [row0, row0 + rows) are the file tensor's rows */
} hf_piece;

typedef struct {
  const mp_param_layout *layout;
  mp_safetensors *st;
  hf_piece **pieces;           /* (num_tensors,) NULL, or an MoE tensor's file tensors */
  int *num_pieces;             /* (num_tensors,) 0: the tensor is names[i] whole */
  char (*names)[kHfNameBytes]; /* (num_tensors,) the file's name of each layout tensor */
  bool *transposed;            /* (num_tensors,) stored (cols, rows) */
  size_t *file_rows;           /* (num_tensors,) rows in the file (wte: vocab_size) */
} hf_source;

static void hf_close(void *impl) {
  hf_source *s = impl;
  if (s == NULL) return;
  mp_safetensors_close(s->st);
  for (int i = 0; s->pieces != NULL && i < mp_param_layout_num_tensors(s->layout); ++i) {
    free(s->pieces[i]);
  }
  free(s->pieces);
  free(s->num_pieces);
  free(s->names);
  free(s->transposed);
  free(s->file_rows);
  free(s);
}

/* A Llama-family block tensor's name after "layers.<l>." (LlamaForCausalLM, Qwen2ForCausalLM,
 * MistralForCausalLM: nn.Linear weights, (out, in) as ours). */
static const struct {
  const char *ours, *hf;
} kHfLlamaBlockNames[] = {
    {"ln1.weight", "input_layernorm.weight"},
    {"q.weight", "self_attn.q_proj.weight"},
    {"k.weight", "self_attn.k_proj.weight"},
    {"v.weight", "self_attn.v_proj.weight"},
    {"q.bias", "self_attn.q_proj.bias"},
    {"k.bias", "self_attn.k_proj.bias"},
    {"v.bias", "self_attn.v_proj.bias"},
    {"attn_proj.weight", "self_attn.o_proj.weight"},
    {"attn_proj.bias", "self_attn.o_proj.bias"},
    {"ln2.weight", "post_attention_layernorm.weight"},
    {"gate.weight", "mlp.gate_proj.weight"},
    {"up.weight", "mlp.up_proj.weight"},
    {"gate.bias", "mlp.gate_proj.bias"},
    {"up.bias", "mlp.up_proj.bias"},
    {"fc_proj.weight", "mlp.down_proj.weight"},
    {"fc_proj.bias", "mlp.down_proj.bias"},
};

/* The Llama family's file name for our tensor `ours` (prefix "model." or ""; the untied head
 * is outside the model's prefix); false if unknown. */
static bool hf_llama_name(const char *ours, const char *prefix, char *out) {
  const char *plain = NULL;
  if (strcmp(ours, "embedding.wte") == 0) plain = "embed_tokens.weight";
  if (strcmp(ours, "final_norm.weight") == 0) plain = "norm.weight";
  if (strcmp(ours, "lm_head.weight") == 0) {
    snprintf(out, kHfNameBytes, "lm_head.weight");
    return true;
  }
  if (plain != NULL) {
    snprintf(out, kHfNameBytes, "%s%s", prefix, plain);
    return true;
  }
  int layer = 0, used = 0;
  if (sscanf(ours, "block.%d.%n", &layer, &used) != 1 || used == 0) return false;
  for (size_t k = 0; k < sizeof kHfLlamaBlockNames / sizeof kHfLlamaBlockNames[0]; ++k) {
    if (strcmp(ours + used, kHfLlamaBlockNames[k].ours) == 0) {
      snprintf(out, kHfNameBytes, "%slayers.%d.%s", prefix, layer, kHfLlamaBlockNames[k].hf);
      return true;
    }
  }
  return false;
}

/* A mixture-of-experts block tensor as Hugging Face stores it, in pieces of our rows (out: room
 * for 2E): Mixtral's layers.l.block_sparse_moe.{gate, experts.e.w1 | w3 | w2} (w1 the gate
 * projection, w3 the up, w2 the down), Qwen2-MoE's layers.l.mlp.{gate, experts.e.gate_proj |
 * up_proj | down_proj, shared_expert.{gate,up,down}_proj, shared_expert_gate}; nn.Linear (out,
 * in) everywhere, as ours. Returns the number of pieces, 0 when `ours` is no MoE tensor. */
static int hf_moe_pieces(const mp_model_config *c, const char *ours, const char *prefix,
                         bool mixtral, hf_piece *out) {
  int layer = 0, used = 0;
  if (c->moe_experts == 0 || sscanf(ours, "block.%d.%n", &layer, &used) != 1 || used == 0) {
    return 0;
  }
  const char *role = ours + used;
  const size_t E = (size_t)c->moe_experts, F = (size_t)c->ffn_channels;
  const size_t C = (size_t)c->channels, Fs = (size_t)c->moe_shared_ffn;
  char base[kHfNameBytes];
  snprintf(base, sizeof base, "%slayers.%d.%s", prefix, layer,
           mixtral ? "block_sparse_moe" : "mlp");
  const char *gate = mixtral ? "w1" : "gate_proj", *up = mixtral ? "w3" : "up_proj";
  const char *down = mixtral ? "w2" : "down_proj";
  int n = 0;
#define PIECE(first, count, ...)                                          \
  do {                                                                    \
    snprintf(out[n].name, kHfNameBytes, __VA_ARGS__);                     \
    out[n].row0 = (first);                                                \
    out[n].rows = (count);                                                \
    ++n;                                                                  \
  } while (0)
  if (strcmp(role, "router.weight") == 0) {
    PIECE(0, E, "%s.gate.weight", base);
  } else if (strcmp(role, "expert_fc1.weight") == 0) {
    for (size_t e = 0; e < E; ++e) {
      PIECE(e * 2 * F, F, "%s.experts.%zu.%s.weight", base, e, gate);
      PIECE(e * 2 * F + F, F, "%s.experts.%zu.%s.weight", base, e, up);
    }
  } else if (strcmp(role, "expert_fc2.weight") == 0) {
    for (size_t e = 0; e < E; ++e) PIECE(e * C, C, "%s.experts.%zu.%s.weight", base, e, down);
  } else if (strcmp(role, "shared_fc1.weight") == 0) {
    PIECE(0, Fs, "%s.shared_expert.gate_proj.weight", base);
    PIECE(Fs, Fs, "%s.shared_expert.up_proj.weight", base);
  } else if (strcmp(role, "shared_fc2.weight") == 0) {
    PIECE(0, C, "%s.shared_expert.down_proj.weight", base);
  } else if (strcmp(role, "shared_gate.weight") == 0) {
    PIECE(0, 1, "%s.shared_expert_gate.weight", base);
  }
#undef PIECE
  return n;
}

/* Whether an MoE layout's files name the experts as Mixtral does (block_sparse_moe) rather than
 * Qwen2-MoE (mlp): the first layer's router says. */
static bool hf_moe_mixtral_names(const mp_safetensors *st, const char *prefix) {
  char name[kHfNameBytes];
  snprintf(name, sizeof name, "%slayers.0.block_sparse_moe.gate.weight", prefix);
  return mp_safetensors_find(st, name) != NULL;
}

/* GPT-2's file name for our tensor `ours` (prefix "transformer." or ""); false if unknown. */
static bool hf_gpt2_name(const char *ours, const char *prefix, char *out, bool *transposed) {
  *transposed = false;
  const char *plain = NULL;
  if (strcmp(ours, "embedding.wte") == 0) plain = "wte.weight";
  if (strcmp(ours, "embedding.wpe") == 0) plain = "wpe.weight";
  if (strcmp(ours, "final_norm.weight") == 0) plain = "ln_f.weight";
  if (strcmp(ours, "final_norm.bias") == 0) plain = "ln_f.bias";
  if (plain != NULL) {
    snprintf(out, kHfNameBytes, "%s%s", prefix, plain);
    return true;
  }
  int layer = 0, used = 0;
  if (sscanf(ours, "block.%d.%n", &layer, &used) != 1 || used == 0) return false;
  for (size_t k = 0; k < sizeof kHfBlockNames / sizeof kHfBlockNames[0]; ++k) {
    if (strcmp(ours + used, kHfBlockNames[k].ours) == 0) {
      snprintf(out, kHfNameBytes, "%sh.%d.%s", prefix, layer, kHfBlockNames[k].hf);
      *transposed = kHfBlockNames[k].transposed;
      return true;
    }
  }
  return false;
}

static bool is_gpt2(const mp_param_layout *layout) {
  return mp_param_layout_config(layout)->family == MP_FAMILY_GPT2;
}

/* Layout tensor i as Hugging Face stores it: its name (under prefix), rank and shape, whether it
 * is stored transposed (GPT-2's Conv1D), and its rows in our orientation (the vocabulary
 * tables: vocab_size, without the padding). */
static mp_status hf_tensor_of(const mp_param_layout *layout, int i, const char *prefix, char *name,
                              int *rank, int64_t *shape, bool *transposed, size_t *file_rows,
                              mp_error *err) {
  const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
  *transposed = false;
  if (is_gpt2(layout) ? !hf_gpt2_name(t->name, prefix, name, transposed)
                      : !hf_llama_name(t->name, prefix, name)) {
    return mp_fail(err, MP_ERR_RUNTIME, "no Hugging Face %s name for tensor %s",
                   is_gpt2(layout) ? "GPT-2" : "Llama-family", t->name);
  }
  const bool vocabulary = i == mp_param_layout_global_index(layout, MP_GLOBAL_WTE) ||
                          i == mp_param_layout_global_index(layout, MP_GLOBAL_LM_HEAD);
  *file_rows = vocabulary ? (size_t)mp_param_layout_config(layout)->vocab_size : t->rows;
  *rank = t->cols == 1 ? 1 : 2;
  shape[0] = (int64_t)(*transposed ? t->cols : *file_rows);
  shape[1] = (int64_t)(*transposed ? t->rows : t->cols);
  return MP_OK;
}

/* config.json describes layout's model, or a refusal naming the first key that differs. */
static mp_status hf_check_config(const mp_param_layout *layout, const char *dir,
                                 const char *model_source, mp_error *err) {
  cJSON *json = NULL;
  mp_hf_import_info info;
  MP_TRY(mp_hf_config_to_model_json(dir, NULL, &json, &info, err));
  /* Dropout is how the checkpoint was trained, not what its weights are (GPT-2's own config says
   * 0.1): the run's description decides it, so the comparison leaves it out. */
  const cJSON *layer = NULL;
  cJSON_ArrayForEach(layer, cJSON_GetObjectItemCaseSensitive(json, "layers")) {
    cJSON_DeleteItemFromObjectCaseSensitive((cJSON *)layer, "dropout");
  }
  char *text = cJSON_PrintUnformatted(json);
  cJSON_Delete(json);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_model *model = NULL;
  mp_status status = mp_model_parse_text(text, info.config_path, &model, err);
  free(text);
  mp_param_layout *theirs = NULL;
  if (status == MP_OK) status = mp_param_layout_create(model, 1, &theirs, err);
  mp_model_free(model);
  if (status != MP_OK) return status;
  const mp_model_config *a = mp_param_layout_config(theirs), *b = mp_param_layout_config(layout);
  const bool gpt2 = a->family == MP_FAMILY_GPT2;
  /* Each choice under the config key that holds it (GPT-2's or the Llama family's); the
   * description's choices that config.json cannot hold last, under the description's key. */
  const struct {
    const char *key;
    double file, ours;
  } fields[] = {
      {"vocab_size", a->vocab_size, b->vocab_size},
      {gpt2 ? "n_positions" : "max_position_embeddings", a->learned_positions ? a->max_seq_len : 0,
       b->learned_positions ? b->max_seq_len : 0},
      {gpt2 ? "n_layer" : "num_hidden_layers", a->num_layers, b->num_layers},
      {gpt2 ? "n_head" : "num_attention_heads", a->num_heads, b->num_heads},
      {gpt2 ? "n_head" : "num_key_value_heads", a->num_kv_heads, b->num_kv_heads},
      {gpt2 ? "n_embd" : "hidden_size", a->channels, b->channels},
      {gpt2 ? "n_inner" : "intermediate_size", a->ffn_channels, b->ffn_channels},
      {gpt2 ? "layer_norm_epsilon" : "rms_norm_eps", a->norm_eps, b->norm_eps},
      {"tie_word_embeddings", a->tied_head, b->tied_head},
      {"rope_theta", a->rope ? a->rope_spec.theta : 0, b->rope ? b->rope_spec.theta : 0},
      {"rope_scaling.factor", a->rope_spec.llama3 ? a->rope_spec.factor : 0,
       b->rope_spec.llama3 ? b->rope_spec.factor : 0},
      {"rope_scaling.low_freq_factor", a->rope_spec.llama3 ? a->rope_spec.low_freq_factor : 0,
       b->rope_spec.llama3 ? b->rope_spec.low_freq_factor : 0},
      {"rope_scaling.high_freq_factor", a->rope_spec.llama3 ? a->rope_spec.high_freq_factor : 0,
       b->rope_spec.llama3 ? b->rope_spec.high_freq_factor : 0},
      {"rope_scaling.original_max_position_embeddings",
       a->rope_spec.llama3 ? a->rope_spec.original_max_positions : 0,
       b->rope_spec.llama3 ? b->rope_spec.original_max_positions : 0},
      {"$.layers[1].norm (1: rmsnorm)", a->rmsnorm, b->rmsnorm},
      {"$.layers[1].activation (1: swiglu)", a->swiglu, b->swiglu},
      {"$.layers[1].bias (0: none, 1: qkv, 2: all)", a->bias, b->bias},
      {"num_local_experts (num_experts)", a->moe_experts, b->moe_experts},
      {"num_experts_per_tok", a->moe_top_k, b->moe_top_k},
      {"shared_expert_intermediate_size", a->moe_shared_ffn, b->moe_shared_ffn},
      {"norm_topk_prob", a->moe_experts > 0 && a->moe_normalize_top_k,
       b->moe_experts > 0 && b->moe_normalize_top_k},
  };
  mp_param_layout_free(theirs);
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
    if (fields[i].file != fields[i].ours) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: %s is %g in the checkpoint but %g in the model description (%s); give "
                     "the description that matches the checkpoint (mpengine import writes it)",
                     info.config_path, fields[i].key, fields[i].file, fields[i].ours,
                     model_source);
    }
  }
  return MP_OK;
}

static mp_status hf_prepare(hf_source *s, mp_error *err) {
  const mp_param_layout *layout = s->layout;
  const int n = mp_param_layout_num_tensors(layout);
  s->names = calloc((size_t)n, sizeof *s->names);
  s->transposed = calloc((size_t)n, sizeof *s->transposed);
  s->file_rows = calloc((size_t)n, sizeof *s->file_rows);
  if (s->names == NULL || s->transposed == NULL || s->file_rows == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  /* Some exports drop the model's prefix ("transformer.", "model."); transformers loads both. */
  const char *base = is_gpt2(layout) ? "transformer." : "model.";
  const char *first = is_gpt2(layout) ? "wte.weight" : "embed_tokens.weight";
  char prefixed[kHfNameBytes];
  snprintf(prefixed, sizeof prefixed, "%s%s", base, first);
  const char *prefix = mp_safetensors_find(s->st, prefixed) == NULL &&
                               mp_safetensors_find(s->st, first) != NULL
                           ? ""
                           : base;
  const mp_model_config *c = mp_param_layout_config(layout);
  const bool mixtral = c->moe_experts > 0 && hf_moe_mixtral_names(s->st, prefix);
  s->pieces = calloc((size_t)n, sizeof *s->pieces);
  s->num_pieces = calloc((size_t)n, sizeof *s->num_pieces);
  if (s->pieces == NULL || s->num_pieces == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  for (int i = 0; i < n; ++i) {
    int64_t shape[2];
    int rank = 0;
    if (c->moe_experts > 0) {
      const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
      hf_piece *pieces = calloc(2 * (size_t)c->moe_experts + 2, sizeof *pieces);
      if (pieces == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
      s->pieces[i] = pieces;
      s->num_pieces[i] = hf_moe_pieces(c, t->name, prefix, mixtral, pieces);
      for (int p = 0; p < s->num_pieces[i]; ++p) {
        shape[0] = (int64_t)pieces[p].rows;
        shape[1] = (int64_t)t->cols;
        MP_TRY(mp_safetensors_expect(s->st, pieces[p].name, MP_SAFETENSORS_FLOAT_DTYPES, 2, shape,
                                     NULL, err));
      }
      if (s->num_pieces[i] > 0) continue;
    }
    MP_TRY(hf_tensor_of(layout, i, prefix, s->names[i], &rank, shape, &s->transposed[i],
                        &s->file_rows[i], err));
    MP_TRY(mp_safetensors_expect(s->st, s->names[i], MP_SAFETENSORS_FLOAT_DTYPES, rank, shape,
                                 NULL, err));
  }
  return MP_OK;
}

static mp_status hf_read(void *impl, int tensor, const mp_param_tensor *t, size_t row, size_t rows,
                         size_t col, size_t cols, float *dest, mp_error *err) {
  const hf_source *s = impl;
  const char *name = s->names[tensor];
  if (s->num_pieces[tensor] > 0) {
    /* Each file tensor's share of our rows [row, row + rows): only those bytes are read. */
    for (int p = 0; p < s->num_pieces[tensor]; ++p) {
      const hf_piece *piece = &s->pieces[tensor][p];
      const size_t lo = row > piece->row0 ? row : piece->row0;
      const size_t hi = row + rows < piece->row0 + piece->rows ? row + rows
                                                               : piece->row0 + piece->rows;
      if (lo >= hi) continue;
      MP_TRY(mp_safetensors_read_block(s->st, piece->name, (int64_t)(lo - piece->row0),
                                       (int64_t)(hi - piece->row0), (int64_t)col,
                                       (int64_t)(col + cols), MP_SAFETENSORS_ROW_MAJOR,
                                       dest + (lo - row) * cols, err));
    }
    return MP_OK;
  }
  if (s->transposed[tensor]) {
    /* The file holds the (cols, rows) transpose: our rows [row, +rows) x columns [col, +cols)
     * are its rows [col, +cols) x columns [row, +rows). */
    return mp_safetensors_read_block(s->st, name, (int64_t)col, (int64_t)(col + cols),
                                     (int64_t)row, (int64_t)(row + rows),
                                     MP_SAFETENSORS_TRANSPOSED, dest, err);
  }
  /* Row-major on both sides; rows past the file's (wte's padding) are zero. */
  const size_t held = s->file_rows[tensor];
  const size_t in_file = row >= held ? 0 : (row + rows <= held ? rows : held - row);
  if (in_file > 0) {
    MP_TRY(mp_safetensors_read_block(s->st, name, (int64_t)row, (int64_t)(row + in_file),
                                     (int64_t)col, (int64_t)(col + cols), MP_SAFETENSORS_ROW_MAJOR,
                                     dest, err));
  }
  for (size_t i = in_file * cols; i < rows * cols; ++i) dest[i] = 0.0f;
  return MP_OK;
}

static const mp_weight_source_ops kHfOps = {"Hugging Face checkpoint", hf_read, hf_close};

mp_status mp_weight_source_open_hf(const mp_param_layout *layout, const char *dir,
                                   mp_weight_source **out, mp_error *err) {
  *out = NULL;
  MP_TRY(hf_check_config(layout, dir, mp_param_layout_model_source(layout), err));
  hf_source *s = calloc(1, sizeof *s);
  if (s == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  s->layout = layout;
  mp_status status = mp_safetensors_open_dir(dir, &s->st, err);
  if (status == MP_OK) status = hf_prepare(s, err);
  if (status != MP_OK) {
    hf_close(s);
    return status;
  }
  return wrap(&kHfOps, s, layout, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Sinks. */

typedef struct {
  /* t is layout tensor `tensor`. */
  mp_status (*write)(void *impl, int tensor, const mp_param_tensor *t, const float *data,
                     mp_error *err);
  mp_status (*commit)(void *impl, mp_error *err); /* frees impl */
  void (*abort)(void *impl);                     /* frees impl */
} sink_ops;

struct mp_weight_sink {
  const sink_ops *ops;
  void *impl;
  const mp_param_layout *layout;
};

static mp_status llmc_sink_write(void *impl, int tensor, const mp_param_tensor *t,
                                 const float *data, mp_error *err) {
  (void)err;
  mp_llmc_writer_write(impl, tensor, 0, data, t->rows * t->cols);
  return MP_OK;
}

static mp_status llmc_sink_commit(void *impl, mp_error *err) {
  return mp_llmc_writer_commit(impl, err);
}

static void llmc_sink_abort(void *impl) { mp_llmc_writer_abort(impl); }

static const sink_ops kLlmcSinkOps = {llmc_sink_write, llmc_sink_commit, llmc_sink_abort};

enum { kHfPathBytes = 4200, kHfFileNameBytes = 64 };

typedef struct {
  const mp_param_layout *layout;
  char dir[kHfPathBytes];
  int num_files;                      /* 1: model.safetensors; more: a sharded set and its index */
  mp_safetensors_writer **writers;    /* (num_files,) */
  char (*file_names)[kHfFileNameBytes]; /* (num_files,) */
  /* The file's tensors ("outs"): one per layout tensor, or a mixture of experts' pieces (each
   * expert's projections), in the layout's order; indexed by out. */
  int num_outs;
  int *first_out, *outs_of;           /* (num_tensors,) a layout tensor's outs */
  size_t *row0;                       /* (num_outs,) the out's first row of its layout tensor */
  int *file_of;                       /* (num_outs,) the file each goes to */
  int64_t total_bytes;                /* every tensor's data bytes, for the index */
  char (*names)[kHfNameBytes]; /* (num_outs,) */
  bool *transposed;            /* (num_outs,) */
  size_t *file_rows;           /* (num_outs,) rows written (wte: vocab_size; a piece's rows) */
  float *column;               /* (largest rows,) one column of a transposed tensor */
} hf_sink;

static void hf_sink_free(hf_sink *s) {
  free(s->writers);
  free(s->file_names);
  free(s->first_out);
  free(s->outs_of);
  free(s->row0);
  free(s->file_of);
  free(s->names);
  free(s->transposed);
  free(s->file_rows);
  free(s->column);
  free(s);
}

static mp_status hf_sink_write(void *impl, int tensor, const mp_param_tensor *t,
                               const float *data, mp_error *err) {
  hf_sink *s = impl;
  for (int o = s->first_out[tensor]; o < s->first_out[tensor] + s->outs_of[tensor]; ++o) {
    const char *name = s->names[o];
    mp_safetensors_writer *writer = s->writers[s->file_of[o]];
    if (!s->transposed[o]) {
      MP_TRY(mp_safetensors_writer_append(writer, name, data + s->row0[o] * t->cols,
                                          (int64_t)(s->file_rows[o] * t->cols), err));
      continue;
    }
    /* The file's row j is our column j. */
    for (size_t j = 0; j < t->cols; ++j) {
      for (size_t r = 0; r < t->rows; ++r) s->column[r] = data[r * t->cols + j];
      MP_TRY(mp_safetensors_writer_append(writer, name, s->column, (int64_t)t->rows, err));
    }
  }
  return MP_OK;
}

/* A number written as a float ("8.0", not cJSON's "8"): transformers checks that rope_scaling's
 * factors are floats. */
static void add_float(cJSON *object, const char *key, double value) {
  char text[64];
  for (int digits = 1; digits <= 17; ++digits) { /* the shortest that reads back exactly */
    snprintf(text, sizeof text, "%.*g", digits, value);
    if (strtod(text, NULL) == value) break;
  }
  if (value == (double)(long long)value && fabs(value) < 1e15) {
    snprintf(text, sizeof text, "%.1f", value); /* 500000.0, as Python writes it */
  }
  if (strpbrk(text, ".eEn") == NULL) strncat(text, ".0", sizeof text - strlen(text) - 1);
  cJSON_AddRawToObject(object, key, text);
}

/* The sizes every Llama-family config.json (Llama, Qwen2, Mixtral, Qwen2-MoE) carries. */
static void add_llama_sizes(cJSON *root, const mp_model_config *c) {
  cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
  cJSON_AddNumberToObject(root, "hidden_size", c->channels);
  cJSON_AddNumberToObject(root, "intermediate_size", c->ffn_channels);
  cJSON_AddNumberToObject(root, "num_hidden_layers", c->num_layers);
  cJSON_AddNumberToObject(root, "num_attention_heads", c->num_heads);
  cJSON_AddNumberToObject(root, "num_key_value_heads", c->num_kv_heads);
}

/* Their activation, context length, RMSNorm epsilon and rotary base. */
static void add_llama_norm_and_rope(cJSON *root, const mp_model_config *c) {
  cJSON_AddStringToObject(root, "hidden_act", "silu");
  cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_seq_len);
  add_float(root, "rms_norm_eps", c->norm_eps);
  add_float(root, "rope_theta", c->rope_spec.theta);
}

/* MixtralConfig's (no shared expert) or Qwen2MoeConfig's fields, as config.json text (free()):
 * output_router_logits true with router_aux_loss_coef when the model trains with a
 * load-balancing loss, as transformers then adds it to the loss. */
static char *hf_moe_config_text(const mp_model_config *c) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  const bool mixtral = c->moe_shared_ffn == 0;
  cJSON *architectures = cJSON_AddArrayToObject(root, "architectures");
  if (architectures != NULL) {
    cJSON_AddItemToArray(architectures, cJSON_CreateString(mixtral ? "MixtralForCausalLM"
                                                                   : "Qwen2MoeForCausalLM"));
  }
  cJSON_AddStringToObject(root, "model_type", mixtral ? "mixtral" : "qwen2_moe");
  add_llama_sizes(root, c);
  add_llama_norm_and_rope(root, c);
  add_float(root, "attention_dropout", 0.0);
  cJSON_AddNumberToObject(root, "num_experts_per_tok", c->moe_top_k);
  if (mixtral) {
    cJSON_AddNumberToObject(root, "num_local_experts", c->moe_experts);
    cJSON_AddNullToObject(root, "sliding_window");
    add_float(root, "router_jitter_noise", 0.0);
  } else {
    cJSON_AddNumberToObject(root, "num_experts", c->moe_experts);
    cJSON_AddNumberToObject(root, "moe_intermediate_size", c->ffn_channels);
    cJSON_AddNumberToObject(root, "shared_expert_intermediate_size", c->moe_shared_ffn);
    cJSON_AddBoolToObject(root, "norm_topk_prob", c->moe_normalize_top_k);
    cJSON_AddNumberToObject(root, "decoder_sparse_step", 1);
    cJSON_AddItemToObject(root, "mlp_only_layers", cJSON_CreateArray());
    cJSON_AddBoolToObject(root, "use_sliding_window", 0);
    cJSON_AddNullToObject(root, "rope_scaling");
  }
  cJSON_AddBoolToObject(root, "output_router_logits", c->moe_aux_loss_coeff > 0.0);
  add_float(root, "router_aux_loss_coef", c->moe_aux_loss_coeff > 0.0 ? c->moe_aux_loss_coeff
                                                                       : 0.001);
  cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tied_head);
  cJSON_AddStringToObject(root, "torch_dtype", "float32");
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

/* LlamaConfig's (Qwen2Config's with q-k-v biases) fields, as config.json text (free()). */
static char *hf_llama_config_text(const mp_model_config *c) {
  if (c->moe_experts > 0) return hf_moe_config_text(c);
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  const bool qwen2 = c->bias == MP_BIAS_QKV;
  cJSON *architectures = cJSON_AddArrayToObject(root, "architectures");
  if (architectures != NULL) {
    cJSON_AddItemToArray(architectures,
                         cJSON_CreateString(qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
  }
  cJSON_AddStringToObject(root, "model_type", qwen2 ? "qwen2" : "llama");
  add_llama_sizes(root, c);
  if (!qwen2) cJSON_AddNumberToObject(root, "head_dim", c->channels / c->num_heads);
  add_llama_norm_and_rope(root, c);
  if (c->rope_spec.llama3) {
    cJSON *scaling = cJSON_AddObjectToObject(root, "rope_scaling");
    if (scaling != NULL) {
      cJSON_AddStringToObject(scaling, "rope_type", "llama3");
      add_float(scaling, "factor", c->rope_spec.factor);
      add_float(scaling, "low_freq_factor", c->rope_spec.low_freq_factor);
      add_float(scaling, "high_freq_factor", c->rope_spec.high_freq_factor);
      cJSON_AddNumberToObject(scaling, "original_max_position_embeddings",
                              c->rope_spec.original_max_positions);
    }
  } else {
    cJSON_AddNullToObject(root, "rope_scaling");
  }
  if (qwen2) {
    cJSON_AddBoolToObject(root, "use_sliding_window", 0);
  } else {
    cJSON_AddBoolToObject(root, "attention_bias", c->bias == MP_BIAS_ALL);
    cJSON_AddBoolToObject(root, "mlp_bias", c->bias == MP_BIAS_ALL);
  }
  add_float(root, "attention_dropout", 0.0);
  cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tied_head);
  cJSON_AddStringToObject(root, "torch_dtype", "float32");
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

/* GPT2Config's fields for transformers' GPT2LMHeadModel, as config.json text (free()). */
static char *hf_config_text(const mp_model_config *c) {
  if (c->family != MP_FAMILY_GPT2) return hf_llama_config_text(c);
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  cJSON *architectures = cJSON_AddArrayToObject(root, "architectures");
  if (architectures != NULL) {
    cJSON_AddItemToArray(architectures, cJSON_CreateString("GPT2LMHeadModel"));
  }
  cJSON_AddStringToObject(root, "model_type", "gpt2");
  cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
  cJSON_AddNumberToObject(root, "n_positions", c->max_seq_len);
  cJSON_AddNumberToObject(root, "n_ctx", c->max_seq_len);
  cJSON_AddNumberToObject(root, "n_embd", c->channels);
  cJSON_AddNumberToObject(root, "n_layer", c->num_layers);
  cJSON_AddNumberToObject(root, "n_head", c->num_heads);
  if (c->ffn_channels == 4 * c->channels) {
    cJSON_AddNullToObject(root, "n_inner");
  } else {
    cJSON_AddNumberToObject(root, "n_inner", c->ffn_channels);
  }
  cJSON_AddStringToObject(root, "activation_function", "gelu_new");
  cJSON_AddNumberToObject(root, "layer_norm_epsilon", 1e-5);
  cJSON_AddNumberToObject(root, "resid_pdrop", 0.0);
  cJSON_AddNumberToObject(root, "embd_pdrop", 0.0);
  cJSON_AddNumberToObject(root, "attn_pdrop", 0.0);
  cJSON_AddBoolToObject(root, "scale_attn_weights", 1);
  cJSON_AddBoolToObject(root, "tie_word_embeddings", 1);
  cJSON_AddStringToObject(root, "torch_dtype", "float32");
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

static mp_status hf_sink_commit(void *impl, mp_error *err) {
  hf_sink *s = impl;
  mp_status status = MP_OK;
  for (int f = 0; f < s->num_files; ++f) {
    if (status == MP_OK) {
      status = mp_safetensors_writer_finish(s->writers[f], err);
    } else {
      mp_safetensors_writer_abort(s->writers[f]);
    }
  }
  char path[kHfPathBytes + 64];
  const int n = s->num_outs;
  if (status == MP_OK && s->num_files > 1) {
    const char **names = calloc((size_t)n, sizeof *names),
               **files = calloc((size_t)n, sizeof *files);
    if (names == NULL || files == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    for (int i = 0; status == MP_OK && i < n; ++i) {
      names[i] = s->names[i];
      files[i] = s->file_names[s->file_of[i]];
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", s->dir);
    if (status == MP_OK)
      status = mp_safetensors_write_index(path, names, files, n, s->total_bytes, err);
    free(names);
    free(files);
  }
  char *text = status == MP_OK ? hf_config_text(mp_param_layout_config(s->layout)) : NULL;
  if (status == MP_OK && text == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  if (status == MP_OK) {
    mp_atomic_file file;
    snprintf(path, sizeof path, "%s/config.json", s->dir);
    status = mp_atomic_file_open(&file, path, err);
    if (status == MP_OK) {
      mp_atomic_file_write(&file, text, strlen(text));
      mp_atomic_file_write(&file, "\n", 1);
      status = mp_atomic_file_commit(&file, err);
    }
  }
  free(text);
  hf_sink_free(s);
  return status;
}

static void hf_sink_abort(void *impl) {
  hf_sink *s = impl;
  for (int f = 0; s->writers != NULL && f < s->num_files; ++f) {
    mp_safetensors_writer_abort(s->writers[f]);
  }
  hf_sink_free(s);
}

static const sink_ops kHfSinkOps = {hf_sink_write, hf_sink_commit, hf_sink_abort};

/* Assigns tensors to files as transformers' save_pretrained does (huggingface_hub's
 * split_state_dict_into_shards) over the state dict's order, which is the layout's: a tensor
 * larger than max_bytes gets a file of its own at once; one that would take the current file past
 * max_bytes closes it first. Files are numbered in the order they are closed. max_bytes 0: one
 * file. members is (n,) scratch. Returns the number of files. */
static int hf_assign_files(const int64_t *bytes, int n, int64_t max_bytes, int *file_of,
                           int *members) {
  int files = 0, pending = 0;
  int64_t used = 0;
  for (int i = 0; i < n; ++i) {
    if (max_bytes > 0 && bytes[i] > max_bytes) {
      file_of[i] = files++;
      continue;
    }
    if (max_bytes > 0 && used + bytes[i] > max_bytes) {
      for (int k = 0; k < pending; ++k) file_of[members[k]] = files;
      ++files;
      pending = 0;
      used = 0;
    }
    members[pending++] = i;
    used += bytes[i];
  }
  if (pending > 0) {
    for (int k = 0; k < pending; ++k) file_of[members[k]] = files;
    ++files;
  }
  return files;
}

static mp_status hf_sink_open(const mp_param_layout *layout, const char *dir, int64_t max_bytes,
                              hf_sink **out, mp_error *err) {
  *out = NULL;
  const mp_model_config *c = mp_param_layout_config(layout);
  if (c->family != MP_FAMILY_GPT2 && (!c->rmsnorm || !c->swiglu || !c->rope)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: no Hugging Face architecture holds this model (the Llama family's "
                   "blocks with %s); export writes GPT2LMHeadModel, LlamaForCausalLM and "
                   "Qwen2ForCausalLM checkpoints",
                   mp_param_layout_model_source(layout),
                   !c->rmsnorm ? "layernorm" : !c->swiglu ? "gelu" : "no rotary embeddings");
  }
  if (c->moe_experts > 0) {
    /* Mixtral: no biases, no shared expert, renormalised top-k; Qwen2-MoE: q-k-v biases and a
     * gated shared expert. */
    const bool mixtral = c->moe_shared_ffn == 0 && c->bias == MP_BIAS_NONE &&
                         c->moe_normalize_top_k && !c->rope_spec.llama3;
    const bool qwen2_moe = c->moe_shared_ffn > 0 && c->moe_shared_gate &&
                           c->bias == MP_BIAS_QKV && !c->rope_spec.llama3;
    if (!mixtral && !qwen2_moe) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: no Hugging Face architecture holds this mixture of experts; export "
                     "writes MixtralForCausalLM (no biases, no shared expert, normalize_top_k) "
                     "and Qwen2MoeForCausalLM (q-k-v biases, a shared expert with its gate)",
                     mp_param_layout_model_source(layout));
    }
  }
  struct stat st;
  if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot create the directory: %s", dir,
                   strerror(errno));
  }
  const int tensors = mp_param_layout_num_tensors(layout);
  /* The outs: a mixture of experts' tensors are 2E + ... of theirs (at most 2E + 2 each). */
  int n = 0;
  hf_piece *pieces = c->moe_experts > 0 ? calloc(2 * (size_t)c->moe_experts + 2, sizeof *pieces)
                                        : NULL;
  const char *prefix = is_gpt2(layout) ? "transformer." : "model.";
  const bool mixtral = c->moe_experts > 0 && c->moe_shared_ffn == 0;
  for (int i = 0; i < tensors; ++i) {
    const int k = pieces != NULL
                      ? hf_moe_pieces(c, mp_param_layout_tensor(layout, i)->name, prefix, mixtral,
                                      pieces)
                      : 0;
    n += k > 0 ? k : 1;
  }
  hf_sink *s = calloc(1, sizeof *s);
  mp_safetensors_tensor_spec *specs = calloc((size_t)n, sizeof *specs);
  mp_safetensors_tensor_spec *subset = calloc((size_t)n, sizeof *subset);
  int64_t (*shapes)[2] = calloc((size_t)n, sizeof *shapes);
  int64_t *bytes = calloc((size_t)n, sizeof *bytes);
  mp_status status = MP_OK;
  if (s == NULL || specs == NULL || subset == NULL || shapes == NULL || bytes == NULL ||
      (s->names = calloc((size_t)n, sizeof *s->names)) == NULL ||
      (s->transposed = calloc((size_t)n, sizeof *s->transposed)) == NULL ||
      (s->file_rows = calloc((size_t)n, sizeof *s->file_rows)) == NULL ||
      (s->file_of = calloc((size_t)n, sizeof *s->file_of)) == NULL ||
      (s->row0 = calloc((size_t)n, sizeof *s->row0)) == NULL ||
      (s->first_out = calloc((size_t)tensors, sizeof *s->first_out)) == NULL ||
      (s->outs_of = calloc((size_t)tensors, sizeof *s->outs_of)) == NULL ||
      (c->moe_experts > 0 && pieces == NULL)) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  size_t largest = 1;
  int o = 0;
  for (int i = 0; status == MP_OK && i < tensors; ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    const int k = pieces != NULL ? hf_moe_pieces(c, t->name, prefix, mixtral, pieces) : 0;
    s->first_out[i] = o;
    s->outs_of[i] = k > 0 ? k : 1;
    for (int p = 0; p < s->outs_of[i]; ++p, ++o) {
      if (k > 0) {
        snprintf(s->names[o], kHfNameBytes, "%s", pieces[p].name);
        s->row0[o] = pieces[p].row0;
        s->file_rows[o] = pieces[p].rows;
        specs[o].rank = 2;
        shapes[o][0] = (int64_t)pieces[p].rows;
        shapes[o][1] = (int64_t)t->cols;
      } else {
        status = hf_tensor_of(layout, i, prefix, s->names[o], &specs[o].rank, shapes[o],
                              &s->transposed[o], &s->file_rows[o], err);
        if (status != MP_OK) break;
      }
      specs[o].name = s->names[o];
      specs[o].dtype = MP_SAFETENSORS_F32;
      specs[o].shape = shapes[o];
      bytes[o] = (int64_t)sizeof(float) * shapes[o][0] * (specs[o].rank == 2 ? shapes[o][1] : 1);
      s->total_bytes += bytes[o];
    }
    if (t->rows > largest) largest = t->rows;
  }
  free(pieces);
  if (s != NULL) s->num_outs = n;
  if (status == MP_OK) {
    s->layout = layout;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    int *members = malloc((size_t)n * sizeof *members);
    if (members == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    } else {
      s->num_files = hf_assign_files(bytes, n, max_bytes, s->file_of, members);
      free(members);
    }
  }
  if (status == MP_OK) {
    if ((s->column = malloc(largest * sizeof(float))) == NULL ||
        (s->writers = calloc((size_t)s->num_files, sizeof *s->writers)) == NULL ||
        (s->file_names = calloc((size_t)s->num_files, sizeof *s->file_names)) == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  const char *const metadata[2] = {"format", "pt"};
  for (int f = 0; status == MP_OK && f < s->num_files; ++f) {
    if (s->num_files == 1) {
      snprintf(s->file_names[f], kHfFileNameBytes, "model.safetensors");
    } else {
      snprintf(s->file_names[f], kHfFileNameBytes, "model-%05d-of-%05d.safetensors", f + 1,
               s->num_files);
    }
    int count = 0;
    for (int i = 0; i < n; ++i) {
      if (s->file_of[i] == f) subset[count++] = specs[i];
    }
    char path[kHfPathBytes + 64];
    snprintf(path, sizeof path, "%s/%s", dir, s->file_names[f]);
    status = mp_safetensors_writer_create(path, subset, count, metadata, 1, &s->writers[f], err);
  }
  free(specs);
  free(subset);
  free(shapes);
  free(bytes);
  if (status != MP_OK) {
    if (s != NULL) hf_sink_abort(s);
    return status;
  }
  *out = s;
  return MP_OK;
}

mp_status mp_weight_sink_open(const mp_param_layout *layout, mp_weight_format format,
                              const char *path, const mp_weight_sink_options *options,
                              mp_weight_sink **out, mp_error *err) {
  *out = NULL;
  mp_weight_sink *sink = calloc(1, sizeof *sink);
  if (sink == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  sink->layout = layout;
  mp_status status;
  if (format == MP_WEIGHT_FORMAT_HF) {
    hf_sink *impl = NULL;
    status = hf_sink_open(layout, path, options != NULL ? options->max_shard_bytes : 0, &impl, err);
    sink->ops = &kHfSinkOps;
    sink->impl = impl;
  } else {
    mp_llmc_writer *impl = NULL;
    status = mp_llmc_writer_open(layout, path, &impl, err);
    sink->ops = &kLlmcSinkOps;
    sink->impl = impl;
  }
  if (status != MP_OK) {
    free(sink);
    return status;
  }
  *out = sink;
  return MP_OK;
}

mp_status mp_weight_sink_write(mp_weight_sink *sink, int tensor, const float *data,
                               mp_error *err) {
  const mp_param_tensor *t = mp_param_layout_tensor(sink->layout, tensor);
  if (t == NULL) return mp_fail(err, MP_ERR_RUNTIME, "no tensor %d in the layout", tensor);
  return sink->ops->write(sink->impl, tensor, t, data, err);
}

mp_status mp_weight_sink_commit(mp_weight_sink *sink, mp_error *err) {
  const mp_status status = sink->ops->commit(sink->impl, err);
  free(sink);
  return status;
}

void mp_weight_sink_abort(mp_weight_sink *sink) {
  if (sink == NULL) return;
  sink->ops->abort(sink->impl);
  free(sink);
}
