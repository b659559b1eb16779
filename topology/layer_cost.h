/*
 * topology/layer_cost.h — what one layer costs for a micro-batch: parameters, FLOPs, and the
 * activation memory it keeps from forward to backward under each recomputation mode.
 *
 * These numbers feed `mpengine describe`, the stage partitioner and the planner's cost and memory
 * model. Conventions (Megatron-LM's, so MFU figures compare with theirs):
 *   - FLOPs count matrix products only, 2 per multiply-add; the attention score and value products
 *     count the full T x T square (no causal halving). Backward = 2 x forward (input gradient and
 *     weight gradient). Elementwise work (norms, GELU, softmax) is left to the memory-bandwidth
 *     term of the cost model.
 *   - Activations are what our runtime keeps for backward, per token, in elements of
 *     bytes_per_element (2 for bf16) plus fp32 norm and softmax statistics:
 *       transformer, none: norm1 in, norm1 out, qkv, attention probabilities (heads x T), attention
 *         out, norm2 in, norm2 out, MLP pre-activation and post-activation (3 tensors for SwiGLU);
 *       selective: the same without the heads x T probabilities, which are recomputed from qkv
 *         (only their per-head softmax statistics are kept);
 *       full: only the layer's input; the whole layer forward is recomputed in backward.
 *     Embedding keeps the token ids (int32), a norm its input and statistics, the LM head its
 *     input and the (T, V) logits for the loss gradient, in every mode; custom layers keep what
 *     their description says in every mode.
 */
#ifndef MPENGINE_TOPOLOGY_LAYER_COST_H
#define MPENGINE_TOPOLOGY_LAYER_COST_H

#include <stdint.h>

#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_RECOMPUTE_NONE = 0,
  MP_RECOMPUTE_SELECTIVE,
  MP_RECOMPUTE_FULL,
  MP_RECOMPUTE_COUNT,
} mp_recompute;

/* "none", "selective", "full". */
const char *mp_recompute_name(mp_recompute mode);

typedef struct {
  int64_t micro_batch;   /* B, sequences per micro-batch */
  int64_t seq_len;       /* T, tokens per sequence */
  int bytes_per_element; /* activation element size: 2 for bf16, 4 for fp32 */
} mp_cost_shape;

typedef struct {
  int64_t params;                               /* 0 for a tied LM head */
  double forward_flops;                         /* for (B, T) */
  double backward_flops;                        /* input + weight gradients */
  double recompute_flops[MP_RECOMPUTE_COUNT];   /* extra forward work done during backward */
  double activation_bytes[MP_RECOMPUTE_COUNT];  /* kept from forward until backward */
  double output_bytes;                          /* tensor handed to the next layer, (B, T, C) */
} mp_layer_cost;

/* Parameters of one layer (weights and biases); a tied LM head owns none. */
int64_t mp_layer_params(const mp_layer_spec *layer);

/* Costs of one layer for the given micro-batch shape. */
void mp_layer_cost_compute(const mp_layer_spec *layer, const mp_cost_shape *shape,
                           mp_layer_cost *out);

/* Sum of mp_layer_params over the model: llm.c's count for GPT-2 (124,439,808 for 124M). */
int64_t mp_model_params(const mp_model *model);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_LAYER_COST_H */
