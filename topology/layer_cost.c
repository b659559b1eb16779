/* topology/layer_cost.c — per-layer parameters, FLOPs and activation bytes; see layer_cost.h. */
#include "topology/layer_cost.h"

#include <string.h>

enum { kStatBytes = 4 }; /* fp32 statistics: norm mean / rstd, softmax log-sum-exp */

const char *mp_recompute_name(mp_recompute mode) {
  switch (mode) {
    case MP_RECOMPUTE_NONE: return "none";
    case MP_RECOMPUTE_SELECTIVE: return "selective";
    case MP_RECOMPUTE_FULL: return "full";
    case MP_RECOMPUTE_COUNT: break;
  }
  return "unknown";
}

static int64_t norm_params(mp_norm_kind norm, int64_t hidden) {
  return norm == MP_NORM_RMSNORM ? hidden : 2 * hidden; /* scale (and shift for layernorm) */
}

static int64_t norm_stats_per_token(mp_norm_kind norm) {
  return norm == MP_NORM_RMSNORM ? 1 : 2; /* rstd (and mean) */
}

static int64_t transformer_params(const mp_layer_spec *layer) {
  const int64_t h = layer->hidden;
  const int64_t kv_width = layer->kv_heads * (h / layer->heads);
  const int64_t f = layer->ffn_hidden;
  const int64_t bias = layer->bias ? 1 : 0;
  int64_t attention = h * (h + 2 * kv_width) + bias * (h + 2 * kv_width) /* qkv */
                      + h * h + bias * h;                                 /* output projection */
  int64_t mlp;
  if (layer->activation == MP_ACTIVATION_SWIGLU) {
    mlp = 2 * h * f + bias * 2 * f /* gate and up */ + f * h + bias * h /* down */;
  } else {
    mlp = h * f + bias * f + f * h + bias * h;
  }
  return attention + mlp + 2 * norm_params(layer->norm, h);
}

int64_t mp_layer_params(const mp_layer_spec *layer) {
  switch (layer->kind) {
    case MP_LAYER_EMBEDDING: return layer->vocab * layer->hidden + layer->max_positions * layer->hidden;
    case MP_LAYER_TRANSFORMER: return transformer_params(layer);
    case MP_LAYER_LAYERNORM: return 2 * layer->hidden;
    case MP_LAYER_LM_HEAD: return layer->tie_embedding ? 0 : layer->vocab * layer->hidden;
    case MP_LAYER_CUSTOM: return layer->custom_params;
  }
  return 0;
}

int64_t mp_model_params(const mp_model *model) {
  int64_t total = 0;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    total += mp_layer_params(mp_model_layer(model, i));
  }
  return total;
}

static void transformer_cost(const mp_layer_spec *layer, const mp_cost_shape *shape,
                             mp_layer_cost *out) {
  const double tokens = (double)shape->micro_batch * (double)shape->seq_len; /* B * T */
  const double t = (double)shape->seq_len;
  const double h = (double)layer->hidden;
  const double heads = (double)layer->heads;
  const double kv_width = (double)layer->kv_heads * (double)(layer->hidden / layer->heads);
  const double f = (double)layer->ffn_hidden;
  const double elem = (double)shape->bytes_per_element;
  const double mlp_matrices = layer->activation == MP_ACTIVATION_SWIGLU ? 3.0 : 2.0;

  const double qkv_flops = 2.0 * tokens * h * (h + 2.0 * kv_width);
  const double attention_core_flops = 2.0 * 2.0 * tokens * t * h; /* Q K^T and probs V */
  const double projection_flops = 2.0 * tokens * h * h;
  const double mlp_flops = mlp_matrices * 2.0 * tokens * h * f;
  out->forward_flops = qkv_flops + attention_core_flops + projection_flops + mlp_flops;
  out->backward_flops = 2.0 * out->forward_flops;
  out->recompute_flops[MP_RECOMPUTE_NONE] = 0.0;
  out->recompute_flops[MP_RECOMPUTE_SELECTIVE] = attention_core_flops;
  out->recompute_flops[MP_RECOMPUTE_FULL] = out->forward_flops;

  const double mlp_tensors = layer->activation == MP_ACTIVATION_SWIGLU ? 3.0 * f : 2.0 * f;
  /* norm1 in, norm1 out, attention out, norm2 in, norm2 out: 5h; qkv: h + 2 kv_width. */
  const double dense_elements = 6.0 * h + 2.0 * kv_width + mlp_tensors;
  const double stats = 2.0 * (double)norm_stats_per_token(layer->norm) * kStatBytes;
  const double probabilities = heads * t * elem;        /* (B, NH, T, T) per token */
  const double softmax_stats = heads * kStatBytes;      /* (B, NH, T) per token */
  out->activation_bytes[MP_RECOMPUTE_NONE] = tokens * (dense_elements * elem + stats + probabilities);
  out->activation_bytes[MP_RECOMPUTE_SELECTIVE] =
      tokens * (dense_elements * elem + stats + softmax_stats);
  out->activation_bytes[MP_RECOMPUTE_FULL] = tokens * h * elem;
  out->output_bytes = tokens * h * elem;
}

void mp_layer_cost_compute(const mp_layer_spec *layer, const mp_cost_shape *shape,
                           mp_layer_cost *out) {
  memset(out, 0, sizeof *out);
  out->params = mp_layer_params(layer);
  const double tokens = (double)shape->micro_batch * (double)shape->seq_len;
  const double elem = (double)shape->bytes_per_element;
  double kept = 0.0;
  switch (layer->kind) {
    case MP_LAYER_TRANSFORMER:
      transformer_cost(layer, shape, out);
      return;
    case MP_LAYER_EMBEDDING:
      kept = tokens * 4.0; /* int32 token ids, to scatter the gradient into the table */
      out->output_bytes = tokens * (double)layer->hidden * elem;
      break;
    case MP_LAYER_LAYERNORM:
      kept = tokens * ((double)layer->hidden * elem + 2.0 * kStatBytes);
      out->output_bytes = tokens * (double)layer->hidden * elem;
      break;
    case MP_LAYER_LM_HEAD:
      out->forward_flops = 2.0 * tokens * (double)layer->hidden * (double)layer->vocab;
      out->backward_flops = 2.0 * out->forward_flops;
      kept = tokens * ((double)layer->hidden + (double)layer->vocab) * elem;
      out->output_bytes = tokens * (double)layer->vocab * elem;
      break;
    case MP_LAYER_CUSTOM:
      out->forward_flops = tokens * layer->custom_forward_flops_per_token;
      out->backward_flops = 2.0 * out->forward_flops;
      kept = tokens * layer->custom_activation_bytes_per_token;
      out->output_bytes = tokens * layer->custom_output_bytes_per_token;
      break;
  }
  for (int mode = 0; mode < MP_RECOMPUTE_COUNT; ++mode) out->activation_bytes[mode] = kept;
}
