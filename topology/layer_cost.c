/* topology/layer_cost.c — per-layer parameters, FLOPs and activation bytes; see layer_cost.h. */
#include "topology/layer_cost.h"

#include <string.h>

enum { kStatBytes = 4 }; /* fp32 statistics: norm mean / rstd, softmax log-sum-exp */

/* Vector FLOPs per element of the memory-bound kernels (layer_cost.h), an exp, tanh or sigmoid
 * counting kTranscendentalFlops. */
#define kTranscendentalFlops 20.0
#define kAddFlops 1.0
#define kDropoutFlops 2.0 /* compare the random draw, scale */
#define kLayernormForwardFlops 8.0 /* mean, variance, normalise, scale, shift */
#define kLayernormBackwardFlops 12.0
#define kRmsnormForwardFlops 5.0
#define kRmsnormBackwardFlops 8.0
/* Causal: the max, subtract, exp and sum run over the half of the row that is not masked, the
 * normalisation over all of it. */
#define kSoftmaxForwardFlops (0.5 * (3.0 + kTranscendentalFlops) + 1.0)
#define kSoftmaxBackwardFlops 3.0 /* the row's dot product of y and dy, subtract, multiply */
#define kGeluForwardFlops (8.0 + kTranscendentalFlops)   /* tanh approximation */
#define kGeluBackwardFlops (14.0 + kTranscendentalFlops) /* the tanh again, and its derivative */
#define kSwigluForwardFlops (3.0 + kTranscendentalFlops) /* silu(gate) * up */
#define kSwigluBackwardFlops (8.0 + kTranscendentalFlops)
#define kRopeFlops 3.0 /* two products and a sum per rotated element */
#define kCrossEntropyForwardFlops (3.0 + kTranscendentalFlops)
#define kCrossEntropyBackwardFlops 2.0

static void add_kernel(mp_layer_cost *out, bool backward, int traffic, bool attention,
                       double bytes, double vector_flops) {
  mp_elementwise_kernel *k = &out->kernels[out->num_kernels++];
  k->scalar = false;
  k->backward = backward;
  k->split = traffic == MP_TRAFFIC_SPLIT;
  k->attention = attention;
  k->bytes = bytes;
  k->vector_flops = vector_flops;
  if (backward) {
    out->backward_memory_bytes[traffic] += bytes;
  } else {
    out->forward_memory_bytes[traffic] += bytes;
    if (attention) out->attention_memory_bytes += bytes;
  }
}

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

/* An MoE block's MLP with `routed` of its experts: the router, those experts (gate, up and down,
 * no biases) and the shared MLP with its gate. */
static int64_t moe_mlp_params(const mp_layer_spec *layer, int64_t routed) {
  const mp_moe_spec *m = &layer->moe;
  const int64_t h = layer->hidden;
  return m->experts * h + routed * 3 * h * m->expert_ffn_hidden + 3 * h * m->shared_ffn_hidden +
         (m->shared_gate ? h : 0);
}

static int64_t transformer_params_with(const mp_layer_spec *layer, bool active) {
  const int64_t h = layer->hidden;
  const int64_t kv_width = layer->kv_heads * (h / layer->heads);
  const int64_t f = layer->ffn_hidden;
  const int64_t qkv_bias = layer->bias != MP_BIAS_NONE ? 1 : 0;
  const int64_t bias = layer->bias == MP_BIAS_ALL ? 1 : 0;
  int64_t attention = h * (h + 2 * kv_width) + qkv_bias * (h + 2 * kv_width) /* qkv */
                      + h * h + bias * h;                                     /* projection */
  int64_t mlp;
  if (mp_layer_is_moe(layer)) {
    mlp = moe_mlp_params(layer, active ? layer->moe.top_k : layer->moe.experts);
  } else if (layer->activation == MP_ACTIVATION_SWIGLU) {
    mlp = 2 * h * f + bias * 2 * f /* gate and up */ + f * h + bias * h /* down */;
  } else {
    mlp = h * f + bias * f + f * h + bias * h;
  }
  return attention + mlp + 2 * norm_params(layer->norm, h);
}

static int64_t transformer_params(const mp_layer_spec *layer) {
  return transformer_params_with(layer, false);
}

int64_t mp_layer_active_params(const mp_layer_spec *layer) {
  if (layer->kind == MP_LAYER_TRANSFORMER) return transformer_params_with(layer, true);
  return mp_layer_params(layer);
}

int64_t mp_model_active_params(const mp_model *model) {
  int64_t total = 0;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    total += mp_layer_active_params(mp_model_layer(model, i));
  }
  return total;
}

int64_t mp_layer_params(const mp_layer_spec *layer) {
  switch (layer->kind) {
    case MP_LAYER_EMBEDDING: return layer->vocab * layer->hidden + layer->max_positions * layer->hidden;
    case MP_LAYER_TRANSFORMER: return transformer_params(layer);
    case MP_LAYER_LAYERNORM: return norm_params(layer->norm, layer->hidden);
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

static void add_gemm(mp_layer_cost *out, double m, double n, double k, double batch,
                     mp_gemm_split split, bool attention_core) {
  mp_gemm_shape *g = &out->gemms[out->num_gemms++];
  g->m = m;
  g->n = n;
  g->k = k;
  g->batch = batch;
  g->split = split;
  g->attention_core = attention_core;
  g->grouped = false;
  out->forward_flops += 2.0 * m * n * k * batch;
}

bool mp_layer_flash_attention(const mp_layer_spec *layer, const mp_cost_shape *shape) {
  if (layer->kind != MP_LAYER_TRANSFORMER) return false;
  return layer->attention == MP_ATTENTION_FLASH ||
         (layer->attention == MP_ATTENTION_BACKEND && shape->backend_flash);
}

int mp_cost_shape_ep(const mp_cost_shape *shape) {
  return shape->expert_parallel > 1 ? shape->expert_parallel : 1;
}

int mp_cost_shape_cp(const mp_cost_shape *shape) {
  return shape->context_parallel > 1 ? shape->context_parallel : 1;
}

/* This cp rank's tokens per sequence: T / cp (T itself without cp). */
static double local_seq_len(const mp_cost_shape *shape) {
  return (double)shape->seq_len / (double)mp_cost_shape_cp(shape);
}

static void transformer_cost(const mp_layer_spec *layer, const mp_cost_shape *shape,
                             mp_layer_cost *out) {
  const double tq = local_seq_len(shape); /* queries per sequence on this cp rank */
  const double tokens = (double)shape->micro_batch * tq; /* B * T / cp */
  const double t = (double)shape->seq_len;               /* keys per sequence: all of them */
  const double h = (double)layer->hidden;
  const double heads = (double)layer->heads;
  const double head_size = (double)(layer->hidden / layer->heads);
  const double kv_width = (double)layer->kv_heads * head_size;
  const double f = (double)layer->ffn_hidden;
  const double elem = (double)shape->bytes_per_element;
  const bool swiglu = layer->activation == MP_ACTIVATION_SWIGLU;
  const double mask = layer->dropout > 0.0 ? 1.0 : 0.0; /* bytes per masked element */
  const double sequences_x_heads = (double)shape->micro_batch * heads;
  const bool flash = mp_layer_flash_attention(layer, shape);
  const double attention_core_flops = 2.0 * 2.0 * tokens * t * h;

  add_gemm(out, tokens, h + 2.0 * kv_width, h, 1.0, MP_GEMM_SPLIT_N, false); /* qkv */
  if (flash) {
    out->flash_attention_flops = attention_core_flops;
    out->forward_flops += attention_core_flops;
  } else {
    add_gemm(out, tq, t, head_size, sequences_x_heads, MP_GEMM_SPLIT_BATCH, true); /* Q K^T */
    add_gemm(out, tq, head_size, t, sequences_x_heads, MP_GEMM_SPLIT_BATCH, true); /* P V */
  }
  add_gemm(out, tokens, h, h, 1.0, MP_GEMM_SPLIT_K, false);                      /* projection */
  const bool moe = mp_layer_is_moe(layer);
  const double experts = (double)layer->moe.experts;
  const double top_k = (double)layer->moe.top_k;
  const double shared_f = (double)layer->moe.shared_ffn_hidden;
  if (moe) {
    add_gemm(out, tokens, experts, h, 1.0, MP_GEMM_SPLIT_NONE, false);        /* router */
    /* The routed experts, grouped: this rank's E / ep experts, each over the rows its ep
     * group's tokens send it (layer_cost.h). */
    const double ep = (double)mp_cost_shape_ep(shape);
    const double rows = ep * tokens * top_k / experts, local = experts / ep;
    add_gemm(out, rows, 2.0 * f, h, local, MP_GEMM_SPLIT_N, false);           /* gate+up */
    out->gemms[out->num_gemms - 1].grouped = true;
    add_gemm(out, rows, h, f, local, MP_GEMM_SPLIT_K, false);                 /* down */
    out->gemms[out->num_gemms - 1].grouped = true;
    out->expert_params = layer->moe.experts * 3 * layer->hidden * layer->moe.expert_ffn_hidden;
    out->dispatch_bytes = tokens * top_k * h * (double)shape->bytes_per_element;
    if (shared_f > 0.0) {
      add_gemm(out, tokens, 2.0 * shared_f, h, 1.0, MP_GEMM_SPLIT_N, false);  /* shared gate+up */
      add_gemm(out, tokens, h, shared_f, 1.0, MP_GEMM_SPLIT_K, false);        /* shared down */
      if (layer->moe.shared_gate) {
        add_gemm(out, tokens, 1.0, h, 1.0, MP_GEMM_SPLIT_NONE, false);        /* its gate */
      }
    }
  } else {
    add_gemm(out, tokens, swiglu ? 2.0 * f : f, h, 1.0, MP_GEMM_SPLIT_N, false); /* fc1/gate+up */
    add_gemm(out, tokens, h, f, 1.0, MP_GEMM_SPLIT_K, false);                     /* fc2 / down */
  }
  /* The activation's width per token: an MoE block's k routed copies and its shared MLP. */
  const double act_f = moe ? top_k * f + shared_f : f;
  out->backward_flops = 2.0 * out->forward_flops;
  out->recompute_flops[MP_RECOMPUTE_NONE] = 0.0;
  out->recompute_flops[MP_RECOMPUTE_SELECTIVE] = flash ? 0.0 : attention_core_flops;
  out->recompute_flops[MP_RECOMPUTE_FULL] = out->forward_flops;

  /* The memory-bound kernels, per token (layer_cost.h): bytes read + written, vector FLOPs. */
  const double norm_stats = (double)norm_stats_per_token(layer->norm) * kStatBytes;
  const bool rms = layer->norm == MP_NORM_RMSNORM;
  const double norm_flops_forward = rms ? kRmsnormForwardFlops : kLayernormForwardFlops;
  const double norm_flops_backward = rms ? kRmsnormBackwardFlops : kLayernormBackwardFlops;
  const double scores = flash ? 0.0 : heads * t; /* (B, NH, T, T) elements per token in memory */
  const double dropout_flops = mask * kDropoutFlops;
  for (int norm = 0; norm < 2; ++norm) { /* before attention and before the MLP */
    add_kernel(out, false, MP_TRAFFIC_REPLICATED, false, tokens * (2.0 * h * elem + norm_stats),
               tokens * h * norm_flops_forward);
    add_kernel(out, false, MP_TRAFFIC_REPLICATED, false, tokens * (3.0 * h * elem + mask * h),
               tokens * h * (kAddFlops + dropout_flops)); /* bias, dropout, residual add */
    add_kernel(out, true, MP_TRAFFIC_REPLICATED, false, tokens * (3.0 * h * elem + norm_stats),
               tokens * h * norm_flops_backward);
    add_kernel(out, true, MP_TRAFFIC_REPLICATED, false,
               tokens * (3.0 * h * elem + mask * (2.0 * h * elem + h)),
               tokens * h * (kAddFlops + dropout_flops));
  }
  if (scores > 0.0) {
    add_kernel(out, false, MP_TRAFFIC_SPLIT, true, tokens * 2.0 * scores * elem,
               tokens * scores * kSoftmaxForwardFlops);
    out->kernels[out->num_kernels - 1].scalar = true; /* layers/attention.c: expf per score */
    add_kernel(out, true, MP_TRAFFIC_SPLIT, false, tokens * 3.0 * scores * elem,
               tokens * scores * kSoftmaxBackwardFlops);
    out->kernels[out->num_kernels - 1].scalar = true;
    if (mask > 0.0) {
      add_kernel(out, false, MP_TRAFFIC_SPLIT, true, tokens * scores * (2.0 * elem + 1.0),
                 tokens * scores * kDropoutFlops);
      add_kernel(out, true, MP_TRAFFIC_SPLIT, false, tokens * scores * (2.0 * elem + 1.0),
                 tokens * scores * kDropoutFlops);
    }
  }
  add_kernel(out, false, MP_TRAFFIC_SPLIT, false, tokens * (swiglu ? 3.0 : 2.0) * act_f * elem,
             tokens * act_f * (swiglu ? kSwigluForwardFlops : kGeluForwardFlops));
  add_kernel(out, true, MP_TRAFFIC_SPLIT, false, tokens * (swiglu ? 5.0 : 3.0) * act_f * elem,
             tokens * act_f * (swiglu ? kSwigluBackwardFlops : kGeluBackwardFlops));
  if (moe) {
    /* The router's softmax and top-k over E fp32 logits, and its gradient. */
    add_kernel(out, false, MP_TRAFFIC_REPLICATED, false, tokens * 3.0 * experts * kStatBytes,
               tokens * experts * (3.0 + kTranscendentalFlops));
    add_kernel(out, true, MP_TRAFFIC_REPLICATED, false, tokens * 3.0 * experts * kStatBytes,
               tokens * experts * kSoftmaxBackwardFlops);
    /* Gather each token's k copies to their experts, and the weighted combine back; the same
     * twice in backward. */
    add_kernel(out, false, MP_TRAFFIC_REPLICATED, false, tokens * 4.0 * top_k * h * elem,
               tokens * top_k * h * 2.0 * kAddFlops);
    add_kernel(out, true, MP_TRAFFIC_REPLICATED, false, tokens * 4.0 * top_k * h * elem,
               tokens * top_k * h * 2.0 * kAddFlops);
  }
  if (layer->rope_theta > 0.0) { /* rotate the queries and keys, and their gradients back */
    const double rotated = h + kv_width;
    add_kernel(out, false, MP_TRAFFIC_SPLIT, false, tokens * 2.0 * rotated * elem,
               tokens * rotated * kRopeFlops);
    add_kernel(out, true, MP_TRAFFIC_SPLIT, false, tokens * 2.0 * rotated * elem,
               tokens * rotated * kRopeFlops);
  }

  /* MoE: per routed copy its gathered input, gate+up, activation and output; the shared MLP's
   * three tensors and its gate; the router's probabilities in fp32 (counted in elements). */
  const double mlp_tensors =
      moe ? top_k * (2.0 * h + 3.0 * f) + 3.0 * shared_f + (layer->moe.shared_gate ? 1.0 : 0.0) +
                experts * kStatBytes / elem
          : (swiglu ? 3.0 * f : 2.0 * f);
  /* norm1 in, norm1 out, attention out, norm2 in, norm2 out: 5h; qkv: h + 2 kv_width. */
  const double dense_elements = 6.0 * h + 2.0 * kv_width + mlp_tensors;
  const double stats = 2.0 * norm_stats;
  const double residual_masks = 2.0 * mask * h;
  const double probabilities = scores * elem * (1.0 + mask) + scores * mask; /* + dropout's */
  const double softmax_stats = heads * kStatBytes;      /* (B, NH, T) per token */
  out->attention_scratch_bytes = tokens * 2.0 * scores * elem;
  /* cp > 1: the whole sequence's K and V, gathered over the cp group for each pass over the
   * block (not kept between them: working memory, not activations). */
  out->kv_gather_bytes = mp_cost_shape_cp(shape) > 1
                             ? 2.0 * (double)shape->micro_batch * t * kv_width * elem
                             : 0.0;
  out->activation_bytes[MP_RECOMPUTE_NONE] =
      tokens * (dense_elements * elem + stats + residual_masks +
                (flash ? softmax_stats : probabilities));
  out->activation_bytes[MP_RECOMPUTE_SELECTIVE] =
      tokens * (dense_elements * elem + stats + residual_masks + softmax_stats);
  out->activation_bytes[MP_RECOMPUTE_FULL] = tokens * h * elem;
  /* The 4 (B, T, C) norm inputs and outputs (the norm outputs are the column-parallel linears'
   * inputs) and the residual masks; with full recomputation the layer's input. */
  const double replicated = tokens * (4.0 * h * elem + residual_masks);
  out->activation_replicated_bytes[MP_RECOMPUTE_NONE] = replicated;
  out->activation_replicated_bytes[MP_RECOMPUTE_SELECTIVE] = replicated;
  out->activation_replicated_bytes[MP_RECOMPUTE_FULL] = tokens * h * elem;
  out->output_bytes = tokens * h * elem;
}

void mp_layer_cost_compute(const mp_layer_spec *layer, const mp_cost_shape *shape,
                           mp_layer_cost *out) {
  memset(out, 0, sizeof *out);
  out->params = mp_layer_params(layer);
  const double tokens = (double)shape->micro_batch * local_seq_len(shape); /* this cp rank's */
  const double elem = (double)shape->bytes_per_element;
  const double h = (double)layer->hidden;
  double kept = 0.0, replicated = 0.0;
  switch (layer->kind) {
    case MP_LAYER_TRANSFORMER:
      transformer_cost(layer, shape, out);
      return;
    case MP_LAYER_EMBEDDING: {
      kept = tokens * 4.0; /* int32 token ids, to scatter the gradient into the table */
      replicated = kept;
      out->output_bytes = tokens * h * elem;
      const double tables = layer->max_positions > 0 ? 2.0 : 1.0;
      add_kernel(out, false, MP_TRAFFIC_REPLICATED, false, tokens * (tables + 1.0) * h * elem,
                 tokens * h * (tables - 1.0) * kAddFlops);
      /* The gradient read once per table and added into its fp32 rows. */
      add_kernel(out, true, MP_TRAFFIC_REPLICATED, false,
                 tokens * tables * (h * elem + 2.0 * h * 4.0), tokens * tables * h * kAddFlops);
      break;
    }
    case MP_LAYER_LAYERNORM:
      kept = tokens * (h * elem + 2.0 * kStatBytes);
      replicated = kept;
      out->output_bytes = tokens * h * elem;
      add_kernel(out, false, MP_TRAFFIC_REPLICATED, false,
                 tokens * (2.0 * h * elem + 2.0 * kStatBytes),
                 tokens * h * (layer->norm == MP_NORM_RMSNORM ? kRmsnormForwardFlops
                                                              : kLayernormForwardFlops));
      add_kernel(out, true, MP_TRAFFIC_REPLICATED, false,
                 tokens * (3.0 * h * elem + 2.0 * kStatBytes),
                 tokens * h * (layer->norm == MP_NORM_RMSNORM ? kRmsnormBackwardFlops
                                                              : kLayernormBackwardFlops));
      break;
    case MP_LAYER_LM_HEAD: {
      const double v = (double)layer->vocab;
      add_gemm(out, tokens, v, h, 1.0, MP_GEMM_SPLIT_N, false);
      out->backward_flops = 2.0 * out->forward_flops;
      kept = tokens * (h + v) * elem;
      replicated = tokens * h * elem;
      out->output_bytes = tokens * v * elem;
      /* The cross-entropy: max, exp-sum and the target's logit forward, its gradient back. */
      add_kernel(out, false, MP_TRAFFIC_SPLIT, false, tokens * 4.0 * v * elem,
                 tokens * v * kCrossEntropyForwardFlops);
      add_kernel(out, true, MP_TRAFFIC_SPLIT, false, tokens * 2.0 * v * elem,
                 tokens * v * kCrossEntropyBackwardFlops);
      break;
    }
    case MP_LAYER_CUSTOM:
      out->forward_flops = tokens * layer->custom_forward_flops_per_token;
      out->backward_flops = 2.0 * out->forward_flops;
      kept = tokens * layer->custom_activation_bytes_per_token;
      out->output_bytes = tokens * layer->custom_output_bytes_per_token;
      break;
  }
  for (int mode = 0; mode < MP_RECOMPUTE_COUNT; ++mode) {
    out->activation_bytes[mode] = kept;
    out->activation_replicated_bytes[mode] = replicated;
  }
}
