/* engine/gpt_model.c — the one-rank GPT: parameter layout, init, forward, backward, llm.c I/O.
 * See gpt_model.h. */
#include "engine/gpt_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "engine/param_init.h"
#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/gpt_block.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"

enum {
  kVocabPadding = 64,
  kLlmcMagic = 20240326,
  kLlmcVersionFp32 = 3,
  kLlmcVersionBf16 = 5,
  kLlmcHeaderInts = 256,
  kBlockTensors = 12,
};

/* llm.c's per-layer tensor names in its file order, as our tensor names' suffixes. */
static const char *const kBlockTensorNames[kBlockTensors] = {
    "ln1.weight",     "ln1.bias",     "qkv.weight", "qkv.bias", "attn_proj.weight",
    "attn_proj.bias", "ln2.weight",   "ln2.bias",   "fc.weight", "fc.bias",
    "fc_proj.weight", "fc_proj.bias",
};

struct mp_gpt_layout {
  mp_gpt_config config;
  char model_source[1024];
  size_t num_params;
  int num_tensors;
  mp_gpt_tensor *tensors; /* (num_tensors,) in the order of the flat array */
};

struct mp_gpt {
  mp_gpt_layout layout;
  int B, T;
  float *params; /* (num_params,) */
  float *grads;  /* (num_params,) */
  /* views into params and grads */
  float *wte, *wpe, *lnfw, *lnfb;       /* (Vp, C), (maxT, C), (C), (C) */
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  mp_gpt_block_params *blocks;          /* (L,) */
  mp_gpt_block_params *dblocks;         /* (L,) */
  /* activations of one micro-batch */
  mp_gpt_block_shape shape;
  float *activation_memory;
  float *encoded;                       /* (B, T, C) */
  mp_gpt_block_acts *acts;              /* (L,) */
  float *lnf, *lnf_mean, *lnf_rstd;     /* (B, T, C), (B, T), (B, T) */
  float *logits;                        /* (B, T, Vp): logits, then (in the forward's cross-
                                           entropy) their softmax, then (in backward) dlogits */
  float *dresidual, *dresidual_next;    /* (B, T, C) each */
  float *dlnf;                          /* (B, T, C) */
  mp_gpt_block_scratch scratch;
  int32_t *inputs, *targets;            /* (B, T) copies of the last forward's tokens */
};

static mp_status unsupported(const mp_model *model, const mp_layer_spec *layer, const char *what,
                             mp_error *err) {
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: $.layers[%d] (%s): %s; the runtime trains GPT-2-style models (embedding, "
                 "transformer blocks with layernorm, gelu, biases and kv_heads = heads, a final "
                 "layernorm, an LM head tied to the embedding); this model can be planned but "
                 "not run",
                 mp_model_source(model), layer->json_index, layer->name, what);
}

/* Fills config from the model, refusing what the runtime cannot run. */
static mp_status read_config(const mp_model *model, int seq_len, mp_gpt_config *config,
                             mp_error *err) {
  memset(config, 0, sizeof *config);
  int n = mp_model_num_layers(model);
  int index = 0;
  const mp_layer_spec *embedding = mp_model_layer(model, index);
  if (embedding->kind != MP_LAYER_EMBEDDING) {
    return unsupported(model, embedding, "the first layer must be the embedding", err);
  }
  if (embedding->max_positions < 1) {
    return unsupported(model, embedding, "a learned position table (max_positions > 0) is needed",
                       err);
  }
  config->channels = (int)embedding->hidden;
  config->vocab_size = (int)mp_model_vocab_size(model);
  config->max_seq_len = (int)embedding->max_positions;
  ++index;
  const mp_layer_spec *first_block = NULL;
  while (index < n && mp_model_layer(model, index)->kind == MP_LAYER_TRANSFORMER) {
    const mp_layer_spec *block = mp_model_layer(model, index);
    if (block->norm != MP_NORM_LAYERNORM) return unsupported(model, block, "rmsnorm", err);
    if (block->activation != MP_ACTIVATION_GELU) return unsupported(model, block, "swiglu", err);
    if (!block->bias) return unsupported(model, block, "bias false", err);
    if (block->kv_heads != block->heads) {
      return unsupported(model, block, "grouped-query attention (kv_heads < heads)", err);
    }
    if (first_block == NULL) {
      first_block = block;
    } else if (block->heads != first_block->heads || block->ffn_hidden != first_block->ffn_hidden) {
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
  config->ffn_channels = (int)first_block->ffn_hidden;
  if (index >= n || mp_model_layer(model, index)->kind != MP_LAYER_LAYERNORM) {
    const mp_layer_spec *layer = mp_model_layer(model, index < n ? index : n - 1);
    return unsupported(model, layer, "a final layernorm must follow the blocks", err);
  }
  ++index;
  if (index >= n || mp_model_layer(model, index)->kind != MP_LAYER_LM_HEAD) {
    const mp_layer_spec *layer = mp_model_layer(model, index < n ? index : n - 1);
    return unsupported(model, layer, "an lm_head must follow the final layernorm", err);
  }
  const mp_layer_spec *head = mp_model_layer(model, index);
  if (!head->tie_embedding) return unsupported(model, head, "an untied LM head", err);
  if (index + 1 != n) {
    return unsupported(model, mp_model_layer(model, index + 1), "layers after the LM head", err);
  }
  config->padded_vocab_size =
      (config->vocab_size + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  if (seq_len > config->max_seq_len) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: sequence length %d exceeds the position table ($.layers[0].max_positions "
                   "= %d); shorten seq_len or raise max_positions",
                   mp_model_source(model), seq_len, config->max_seq_len);
  }
  return MP_OK;
}

static void add_tensor(mp_gpt_layout *layout, const char *name, size_t *offset, size_t rows,
                       size_t cols, bool weight_decay) {
  mp_gpt_tensor *tensor = &layout->tensors[layout->num_tensors++];
  snprintf(tensor->name, sizeof tensor->name, "%s", name);
  tensor->offset = *offset;
  tensor->rows = rows;
  tensor->cols = cols;
  tensor->weight_decay = weight_decay;
  *offset += rows * cols;
}

/* Lays out the tensor table in the order of the flat array: wte, wpe, blocks, final norm. The
 * block order matches mp_gpt_block_params_point. */
static void build_tensor_table(mp_gpt_layout *layout) {
  const mp_gpt_config *c = &layout->config;
  const size_t C = (size_t)c->channels, F = (size_t)c->ffn_channels;
  size_t offset = 0;
  add_tensor(layout, "embedding.wte", &offset, (size_t)c->padded_vocab_size, C, true);
  add_tensor(layout, "embedding.wpe", &offset, (size_t)c->max_seq_len, C, true);
  const size_t rows[kBlockTensors] = {C, C, 3 * C, 3 * C, C, C, C, C, F, F, C, C};
  const size_t cols[kBlockTensors] = {1, 1, C, 1, C, 1, 1, 1, C, 1, F, 1};
  for (int l = 0; l < c->num_layers; ++l) {
    for (int k = 0; k < kBlockTensors; ++k) {
      char name[MP_GPT_TENSOR_NAME_BYTES];
      snprintf(name, sizeof name, "block.%d.%s", l, kBlockTensorNames[k]);
      add_tensor(layout, name, &offset, rows[k], cols[k], cols[k] > 1);
    }
  }
  add_tensor(layout, "final_norm.weight", &offset, C, 1, false);
  add_tensor(layout, "final_norm.bias", &offset, C, 1, false);
  layout->num_params = offset;
}

static void point_parameters(mp_gpt *gpt, float *base, float **wte, float **wpe,
                             mp_gpt_block_params *blocks, float **lnfw, float **lnfb) {
  const mp_gpt_config *c = &gpt->layout.config;
  *wte = base + gpt->layout.tensors[0].offset;
  *wpe = base + gpt->layout.tensors[1].offset;
  for (int l = 0; l < c->num_layers; ++l) {
    mp_gpt_block_params_point(&blocks[l], base + gpt->layout.tensors[2 + l * kBlockTensors].offset,
                              c->channels, c->ffn_channels);
  }
  *lnfw = base + gpt->layout.tensors[gpt->layout.num_tensors - 2].offset;
  *lnfb = base + gpt->layout.tensors[gpt->layout.num_tensors - 1].offset;
}

static mp_status layout_init(const mp_model *model, int seq_len, mp_gpt_layout *layout,
                             mp_error *err) {
  memset(layout, 0, sizeof *layout);
  MP_TRY(read_config(model, seq_len, &layout->config, err));
  snprintf(layout->model_source, sizeof layout->model_source, "%s", mp_model_source(model));
  layout->tensors = calloc((size_t)(2 + layout->config.num_layers * kBlockTensors + 2),
                           sizeof *layout->tensors);
  if (layout->tensors == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  build_tensor_table(layout);
  return MP_OK;
}

mp_status mp_gpt_layout_create(const mp_model *model, int seq_len, mp_gpt_layout **out,
                               mp_error *err) {
  *out = NULL;
  mp_gpt_layout *layout = calloc(1, sizeof *layout);
  if (layout == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = layout_init(model, seq_len, layout, err);
  if (status != MP_OK) {
    mp_gpt_layout_free(layout);
    return status;
  }
  *out = layout;
  return MP_OK;
}

void mp_gpt_layout_free(mp_gpt_layout *layout) {
  if (layout == NULL) return;
  free(layout->tensors);
  free(layout);
}

const mp_gpt_config *mp_gpt_layout_config(const mp_gpt_layout *layout) { return &layout->config; }
size_t mp_gpt_layout_num_params(const mp_gpt_layout *layout) { return layout->num_params; }
int mp_gpt_layout_num_tensors(const mp_gpt_layout *layout) { return layout->num_tensors; }

const mp_gpt_tensor *mp_gpt_layout_tensor(const mp_gpt_layout *layout, int index) {
  return index >= 0 && index < layout->num_tensors ? &layout->tensors[index] : NULL;
}

mp_status mp_gpt_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt **out,
                        mp_error *err) {
  *out = NULL;
  mp_gpt *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  mp_status status = layout_init(model, seq_len, &gpt->layout, err);
  const mp_gpt_config config = gpt->layout.config;
  const mp_gpt_block_shape shape = {micro_batch, seq_len, config.channels, config.num_heads,
                                    config.ffn_channels};
  if (status == MP_OK) status = mp_gpt_block_shape_check(&shape, err);
  if (status != MP_OK) {
    mp_gpt_free(gpt);
    return status;
  }
  gpt->B = micro_batch;
  gpt->T = seq_len;
  const int L = config.num_layers;
  gpt->blocks = calloc((size_t)L, sizeof *gpt->blocks);
  gpt->dblocks = calloc((size_t)L, sizeof *gpt->dblocks);
  gpt->acts = calloc((size_t)L, sizeof *gpt->acts);
  if (gpt->blocks == NULL || gpt->dblocks == NULL || gpt->acts == NULL) {
    mp_gpt_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory creating the model");
  }
  gpt->params = calloc(gpt->layout.num_params, sizeof(float));
  gpt->grads = calloc(gpt->layout.num_params, sizeof(float));

  gpt->shape = shape;
  const size_t BT = (size_t)micro_batch * (size_t)seq_len;
  const size_t C = (size_t)config.channels, Vp = (size_t)config.padded_vocab_size;
  const size_t per_block = mp_gpt_block_acts_count(&gpt->shape);
  const size_t total = BT * C /* encoded */ + (size_t)L * per_block + BT * C + 2 * BT /* lnf */ +
                       BT * Vp /* logits */ + 3 * BT * C /* dresidual x2, dlnf */ +
                       mp_gpt_block_scratch_count(&gpt->shape);
  gpt->activation_memory = calloc(total, sizeof(float));
  gpt->inputs = calloc(BT, sizeof(int32_t));
  gpt->targets = calloc(BT, sizeof(int32_t));
  if (gpt->params == NULL || gpt->grads == NULL || gpt->activation_memory == NULL ||
      gpt->inputs == NULL || gpt->targets == NULL) {
    size_t bytes = (2 * gpt->layout.num_params + total) * sizeof(float);
    mp_gpt_free(gpt);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "out of memory: the model needs %.1f MiB for parameters, gradients and "
                   "activations; lower micro_batch or seq_len",
                   (double)bytes / (1024.0 * 1024.0));
  }
  point_parameters(gpt, gpt->params, &gpt->wte, &gpt->wpe, gpt->blocks, &gpt->lnfw, &gpt->lnfb);
  point_parameters(gpt, gpt->grads, &gpt->dwte, &gpt->dwpe, gpt->dblocks, &gpt->dlnfw,
                   &gpt->dlnfb);
  float *cursor = gpt->activation_memory;
  gpt->encoded = cursor;
  cursor += BT * C;
  for (int l = 0; l < L; ++l) cursor += mp_gpt_block_acts_point(&gpt->acts[l], cursor, &gpt->shape);
  gpt->lnf = cursor;
  cursor += BT * C;
  gpt->lnf_mean = cursor;
  cursor += BT;
  gpt->lnf_rstd = cursor;
  cursor += BT;
  gpt->logits = cursor;
  cursor += BT * Vp;
  gpt->dresidual = cursor;
  cursor += BT * C;
  gpt->dresidual_next = cursor;
  cursor += BT * C;
  gpt->dlnf = cursor;
  cursor += BT * C;
  mp_gpt_block_scratch_point(&gpt->scratch, cursor, &gpt->shape);
  *out = gpt;
  return MP_OK;
}

void mp_gpt_free(mp_gpt *gpt) {
  if (gpt == NULL) return;
  free(gpt->targets);
  free(gpt->inputs);
  free(gpt->activation_memory);
  free(gpt->grads);
  free(gpt->params);
  free(gpt->acts);
  free(gpt->dblocks);
  free(gpt->blocks);
  free(gpt->layout.tensors);
  free(gpt);
}

const mp_gpt_config *mp_gpt_get_config(const mp_gpt *gpt) { return &gpt->layout.config; }
const mp_gpt_layout *mp_gpt_get_layout(const mp_gpt *gpt) { return &gpt->layout; }
size_t mp_gpt_num_params(const mp_gpt *gpt) { return gpt->layout.num_params; }
float *mp_gpt_params(mp_gpt *gpt) { return gpt->params; }
float *mp_gpt_grads(mp_gpt *gpt) { return gpt->grads; }
int mp_gpt_num_tensors(const mp_gpt *gpt) { return gpt->layout.num_tensors; }

const mp_gpt_tensor *mp_gpt_tensor_at(const mp_gpt *gpt, int index) {
  return index >= 0 && index < gpt->layout.num_tensors ? &gpt->layout.tensors[index] : NULL;
}

const mp_gpt_tensor *mp_gpt_find_tensor(const mp_gpt *gpt, const char *name) {
  for (int i = 0; i < gpt->layout.num_tensors; ++i) {
    if (strcmp(gpt->layout.tensors[i].name, name) == 0) return &gpt->layout.tensors[i];
  }
  return NULL;
}

static bool ends_with(const char *text, const char *suffix) {
  size_t a = strlen(text), b = strlen(suffix);
  return a >= b && strcmp(text + a - b, suffix) == 0;
}

void mp_gpt_layout_init_params(const mp_gpt_layout *layout, float *params, uint64_t seed) {
  const float std = 0.02f;
  const float residual_std = std / sqrtf(2.0f * (float)layout->config.num_layers);
  for (int i = 0; i < layout->num_tensors; ++i) {
    const mp_gpt_tensor *tensor = &layout->tensors[i];
    float *data = params + tensor->offset;
    const size_t count = tensor->rows * tensor->cols;
    if (ends_with(tensor->name, ".bias")) {
      mp_init_fill_constant(data, count, 0.0f);
    } else if (ends_with(tensor->name, "ln1.weight") || ends_with(tensor->name, "ln2.weight") ||
               ends_with(tensor->name, "final_norm.weight")) {
      mp_init_fill_constant(data, count, 1.0f);
    } else if (ends_with(tensor->name, "attn_proj.weight") ||
               ends_with(tensor->name, "fc_proj.weight")) {
      mp_init_fill_normal(data, count, seed, tensor->name, 0, residual_std);
    } else {
      mp_init_fill_normal(data, count, seed, tensor->name, 0, std);
    }
  }
}

void mp_gpt_init_params(mp_gpt *gpt, uint64_t seed) {
  mp_gpt_layout_init_params(&gpt->layout, gpt->params, seed);
}

void mp_gpt_zero_grads(mp_gpt *gpt) { memset(gpt->grads, 0, gpt->layout.num_params * sizeof(float)); }

double mp_gpt_forward(mp_gpt *gpt, const int32_t *inputs, const int32_t *targets) {
  const mp_gpt_config *c = &gpt->layout.config;
  const int B = gpt->B, T = gpt->T, C = c->channels;
  const size_t BT = (size_t)B * (size_t)T;
  memcpy(gpt->inputs, inputs, BT * sizeof(int32_t));
  memcpy(gpt->targets, targets, BT * sizeof(int32_t));
  mp_embedding_forward_cpu(gpt->encoded, inputs, gpt->wte, gpt->wpe, B, T, C);
  const float *x = gpt->encoded;
  for (int l = 0; l < c->num_layers; ++l) {
    mp_gpt_block_forward_cpu(&gpt->shape, &gpt->blocks[l], &gpt->acts[l], x);
    x = gpt->acts[l].out;
  }
  mp_layernorm_forward_cpu(gpt->lnf, gpt->lnf_mean, gpt->lnf_rstd, x, gpt->lnfw, gpt->lnfb, B, T,
                           C);
  mp_matmul_forward_cpu(gpt->logits, gpt->lnf, gpt->wte, NULL, (int)BT, C, c->padded_vocab_size);
  /* The softmax overwrites the logits: only it is needed for the backward. */
  return mp_cross_entropy_forward_cpu(NULL, gpt->logits, gpt->logits, targets, B, T,
                                      c->vocab_size, c->padded_vocab_size);
}

/* Turns the forward's probabilities into dlogits in place, so each forward has one backward (as
 * gpt_model.h says: the backward of the last forward). */
void mp_gpt_backward(mp_gpt *gpt, float dloss) {
  const mp_gpt_config *c = &gpt->layout.config;
  const int B = gpt->B, T = gpt->T, C = c->channels, L = c->num_layers;
  const size_t BT = (size_t)B * (size_t)T;
  float *dlogits = gpt->logits; /* the forward's probabilities, turned into dlogits in place */
  mp_cross_entropy_backward_in_place_cpu(dlogits, gpt->targets, dloss, B, T, c->vocab_size,
                                         c->padded_vocab_size);
  memset(gpt->dlnf, 0, BT * (size_t)C * sizeof(float));
  mp_matmul_backward_cpu(gpt->dlnf, gpt->dwte, NULL, dlogits, gpt->lnf, gpt->wte, (int)BT, C,
                         c->padded_vocab_size);
  const float *last = L > 0 ? gpt->acts[L - 1].out : gpt->encoded;
  memset(gpt->dresidual, 0, BT * (size_t)C * sizeof(float));
  mp_layernorm_backward_cpu(gpt->dresidual, gpt->dlnfw, gpt->dlnfb, gpt->dlnf, last, gpt->lnfw,
                            gpt->lnf_mean, gpt->lnf_rstd, B, T, C);
  for (int l = L - 1; l >= 0; --l) {
    const float *inp = l == 0 ? gpt->encoded : gpt->acts[l - 1].out;
    memset(gpt->dresidual_next, 0, BT * (size_t)C * sizeof(float));
    mp_gpt_block_backward_cpu(&gpt->shape, gpt->dresidual_next, &gpt->dblocks[l], &gpt->scratch,
                              gpt->dresidual, inp, &gpt->blocks[l], &gpt->acts[l]);
    float *swap = gpt->dresidual;
    gpt->dresidual = gpt->dresidual_next;
    gpt->dresidual_next = swap;
  }
  mp_embedding_backward_cpu(gpt->dwte, gpt->dwpe, gpt->dresidual, gpt->inputs, B, T, C);
}

/* ---------------------------------------------------------------------------------------------
 * llm.c checkpoints: a 256 x int32 header, then wte, wpe, and each per-layer tensor for all L
 * layers in turn (ln1w for every layer, then ln1b for every layer, ...), then lnfw, lnfb. */

static const char *const kHeaderFields[8] = {"magic", "version", "max_seq_len", "vocab_size",
                                             "num_layers", "num_heads", "channels",
                                             "padded_vocab_size"};

/* Visits every tensor in llm.c's file order, calling visit(tensor, context). */
static void for_each_in_llmc_order(const mp_gpt_layout *layout,
                                   void (*visit)(const mp_gpt_tensor *, void *), void *context) {
  visit(&layout->tensors[0], context);
  visit(&layout->tensors[1], context);
  for (int k = 0; k < kBlockTensors; ++k) {
    for (int l = 0; l < layout->config.num_layers; ++l) {
      visit(&layout->tensors[2 + l * kBlockTensors + k], context);
    }
  }
  visit(&layout->tensors[layout->num_tensors - 2], context);
  visit(&layout->tensors[layout->num_tensors - 1], context);
}

typedef struct {
  float *params;
  const unsigned char *file_data; /* after the header */
  size_t cursor;                  /* elements consumed */
  int bytes_per_element;          /* 4 fp32, 2 bf16 */
  mp_atomic_file *out;
} llmc_io;

static void load_tensor(const mp_gpt_tensor *tensor, void *context) {
  llmc_io *io = context;
  const size_t count = tensor->rows * tensor->cols;
  float *dst = io->params + tensor->offset;
  const unsigned char *src = io->file_data + io->cursor * (size_t)io->bytes_per_element;
  if (io->bytes_per_element == 4) {
    memcpy(dst, src, count * sizeof(float));
  } else {
    for (size_t i = 0; i < count; ++i) {
      uint32_t bits = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
      memcpy(&dst[i], &bits, sizeof bits);
    }
  }
  io->cursor += count;
}

static void save_tensor(const mp_gpt_tensor *tensor, void *context) {
  llmc_io *io = context;
  mp_atomic_file_write(io->out, io->params + tensor->offset,
                       tensor->rows * tensor->cols * sizeof(float));
}

static void llmc_header(const mp_gpt_config *c, int32_t *header) {
  memset(header, 0, kLlmcHeaderInts * sizeof(int32_t));
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionFp32;
  header[2] = c->max_seq_len;
  header[3] = c->vocab_size;
  header[4] = c->num_layers;
  header[5] = c->num_heads;
  header[6] = c->channels;
  header[7] = c->padded_vocab_size;
}

mp_status mp_gpt_layout_load_llmc(const mp_gpt_layout *layout, float *params, const char *path,
                                  mp_error *err) {
  const mp_gpt_config *c = &layout->config;
  FILE *file = fopen(path, "rb");
  if (file == NULL) return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  int32_t header[kLlmcHeaderInts];
  if (fread(header, sizeof(int32_t), kLlmcHeaderInts, file) != kLlmcHeaderInts) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: shorter than llm.c's 1024-byte checkpoint header; not a GPT-2 checkpoint",
                   path);
  }
  if (header[0] != kLlmcMagic) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: bad magic %d (expected %d); not an llm.c GPT-2 checkpoint", path,
                   header[0], kLlmcMagic);
  }
  if (header[1] != kLlmcVersionFp32 && header[1] != kLlmcVersionBf16) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: version %d is not supported (3 = fp32 or 5 = bf16)", path, header[1]);
  }
  if (c->ffn_channels != 4 * c->channels) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: llm.c checkpoints have ffn_hidden = 4 x hidden, but the model (%s) has "
                   "ffn_hidden %d and hidden %d",
                   path, layout->model_source, c->ffn_channels, c->channels);
  }
  int32_t expected[kLlmcHeaderInts];
  llmc_header(c, expected);
  for (int i = 2; i < 8; ++i) {
    if (header[i] != expected[i]) {
      fclose(file);
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: %s is %d in the checkpoint but %d in the model description (%s); "
                     "give the description that matches the checkpoint",
                     path, kHeaderFields[i], header[i], expected[i], layout->model_source);
    }
  }
  const int bytes_per_element = header[1] == kLlmcVersionFp32 ? 4 : 2;
  const size_t payload = layout->num_params * (size_t)bytes_per_element;
  unsigned char *data = malloc(payload + 1);
  if (data == NULL) {
    fclose(file);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory reading %zu bytes", path, payload);
  }
  size_t got = fread(data, 1, payload + 1, file);
  fclose(file);
  if (got != payload) {
    free(data);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: holds %s%zu bytes of parameters, but the header's model needs %zu (%zu "
                   "parameters of %d bytes); the file is truncated or corrupt",
                   path, got > payload ? "more than " : "", got > payload ? payload : got, payload,
                   layout->num_params, bytes_per_element);
  }
  llmc_io io = {.params = params, .file_data = data, .bytes_per_element = bytes_per_element};
  for_each_in_llmc_order(layout, load_tensor, &io);
  free(data);
  return MP_OK;
}

mp_status mp_gpt_load_llmc(mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_load_llmc(&gpt->layout, gpt->params, path, err);
}

/* Writes array (num_params floats, in our flat layout) under llm.c's version 3 header in llm.c's
 * tensor order, to a temporary name renamed into place: the parameters or their gradients. */
mp_status mp_gpt_layout_save_llmc(const mp_gpt_layout *layout, const float *array,
                                  const char *path, mp_error *err) {
  mp_atomic_file file;
  MP_TRY(mp_atomic_file_open(&file, path, err));
  int32_t header[kLlmcHeaderInts];
  llmc_header(&layout->config, header);
  mp_atomic_file_write(&file, header, sizeof header);
  llmc_io io = {.params = (float *)array, .out = &file};
  for_each_in_llmc_order(layout, save_tensor, &io);
  return mp_atomic_file_commit(&file, err);
}

mp_status mp_gpt_save_llmc(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_save_llmc(&gpt->layout, gpt->params, path, err);
}

mp_status mp_gpt_save_llmc_gradients(const mp_gpt *gpt, const char *path, mp_error *err) {
  return mp_gpt_layout_save_llmc(&gpt->layout, gpt->grads, path, err);
}
