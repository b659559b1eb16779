/*
 * layers/moe.h — a mixture-of-experts MLP on one device (CPU, fp32), forward and backward:
 * the router, the top-k choice, one GEMM pair per expert over the tokens routed to it, the
 * weighted combine, an optional shared MLP with its sigmoid gate, and the router's auxiliary
 * losses (the Switch / Mixtral load-balancing loss and ST-MoE's z-loss).
 *
 * It is transformers 4.46's MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock, written once above
 * layers/matmul.h and layers/swiglu.h (tests/layers/moe_test.cc holds it to their goldens):
 *   logits (N, E) = x @ router^T;  p = softmax(logits) over all E experts
 *   the k largest p of each token (ties to the lowest expert index: deterministic; torch.topk's
 *     choice among equal values is not specified), their weights w = p, divided by their sum
 *     when normalize_top_k (Mixtral; Qwen2-MoE's norm_topk_prob)
 *   out[t] = sum over its k experts e of w * down_e(silu(gate_e x) * up_e x)
 *            + [sigmoid(x . shared_gate)] * shared(x)
 * Dropless by default: every token reaches its k experts, an expert with no token does no work.
 * With a capacity factor (shape.capacity_factor > 0; Switch Transformer, Megatron-Core's token
 * dropping), each expert takes at most
 *   capacity = ceil(capacity_factor x N x K / E)   (token, slot) pairs of the N tokens routed here
 * (mp_moe_capacity), per call, that is per micro-batch and layer. The pairs beyond capacity are
 * dropped in token order: an expert keeps its first `capacity` tokens (Megatron's "position" drop
 * policy). A dropped pair is in no routed array (expert_offset[E] < N K rows), contributes nothing
 * to out and gets no gradient; the kept weights are not renormalised (a dropped slot's weight is
 * simply unused, though its probability still enters normalize_top_k's sum). The auxiliary loss
 * statistics count the routing before dropping (selected), as Megatron and Switch do. Dropping
 * depends only on this call's tokens, so it is deterministic and the same on every layout that
 * routes the same tokens: under expert parallelism each rank drops among its own tokens before
 * the dispatch. Expert
 * weights are stacked: expert_fc1 (E, 2F, C) holds each expert's gate rows then up rows
 * (swiglu.h's [gate | up]: Hugging Face's gate_proj / w1 over up_proj / w3), expert_fc2 (E, C, F)
 * its down_proj / w2.
 *
 * The layer is written as separable steps, so that expert parallelism (expert_parallel/) can move
 * the grouped rows to the ranks holding their experts between them:
 *   route    (mp_moe_route_cpu): router logits, softmax, top-k, weights; this rank's (token, slot)
 *            pairs grouped by expert (expert e's rows after those of experts 0 .. e-1, tokens in
 *            order within an expert) and gathered into routed_in (N K, C);
 *   experts  (mp_moe_experts_forward_cpu / _backward_cpu): one GEMM pair per expert over any
 *            (rows, C) buffer grouped by expert (mp_moe_expert_rows): this rank's own rows on one
 *            device, the rows every rank sent to its local experts under expert parallelism;
 *   combine  (mp_moe_combine_cpu): the weighted sum of routed_out back to the tokens, then the
 *            shared MLP.
 * The backward runs them in reverse: mp_moe_combine_backward_cpu, the experts' backward,
 * mp_moe_route_backward_cpu (the gathered rows' gradients to the tokens, and the router's), then
 * mp_moe_shared_backward_cpu. mp_moe_forward_cpu and mp_moe_backward_cpu are their one-device
 * composition (every expert local), bit for bit what they computed before the split. Their GPU
 * twin, on bf16 device buffers, is layers/moe_cuda.h (dropless only: it refuses a capacity
 * factor).
 *
 * The load-balancing loss is transformers' load_balancing_loss_func over the router logits of
 * every layer it is given, as one set of tokens:
 *   aux = E * sum_e (routed_e / n) * (sum of p_e / n),   n = tokens x layers counted
 * where routed_e counts the (token, slot) pairs sent to e; only the probabilities carry a
 * gradient. Defined per micro-batch (issue 33): a micro-batch's layers each add their statistics
 * (mp_moe_stats_add) after their forward; the loss and its gradient then come from the sum, so
 * every layer's backward needs the statistics of all of them. The z-loss is the mean over the
 * same tokens of logsumexp(logits)^2.
 */
#ifndef MPENGINE_LAYERS_MOE_H
#define MPENGINE_LAYERS_MOE_H

#include <stdbool.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int tokens;          /* N = B * T */
  int channels;        /* C */
  int experts;         /* E */
  int top_k;           /* K, 1 <= K <= E */
  int expert_ffn;      /* F, each expert's width */
  int shared_ffn;      /* Fs, the shared MLP's width; 0 for none */
  bool shared_gate;    /* the shared MLP's output scaled by sigmoid(x . shared_gate) */
  bool normalize_top_k;
  double capacity_factor; /* 0: dropless; > 0: each expert's capacity (above, mp_moe_capacity) */
} mp_moe_shape;

/* Parameters (or their gradients, the same shapes). The shared ones are NULL without them. */
typedef struct {
  float *router;      /* (E, C) */
  float *expert_fc1;  /* (E, 2F, C) [gate | up] rows per expert */
  float *expert_fc2;  /* (E, C, F) */
  float *shared_fc1;  /* (2Fs, C) */
  float *shared_fc2;  /* (C, Fs) */
  float *shared_gate; /* (1, C) */
} mp_moe_params;

/* What the forward keeps for the backward (allocated by mp_moe_forward_cpu). */
typedef struct {
  mp_moe_shape shape;
  float *logits;        /* (N, E) router logits */
  float *probs;         /* (N, E) their softmax */
  int *selected;        /* (N, K) the chosen experts, by falling probability */
  float *weights;       /* (N, K) their combine weights */
  int *expert_offset;   /* (E + 1) where each expert's rows start in the routed arrays;
                           expert_offset[E] = R, the rows kept (N K when dropless) */
  int *routed_slot;     /* (N K, R used) routed row -> token * K + slot, grouped by expert,
                           tokens in order within an expert */
  float *routed_in;     /* (N K, C) the tokens gathered to their experts */
  float *routed_fc1;    /* (N K, 2F) (mp_moe_forward_cpu's; NULL after mp_moe_route_cpu alone:
                           expert parallelism keeps its received rows' own) */
  float *routed_act;    /* (N K, F) (likewise) */
  float *routed_out;    /* (N K, C) each expert's output, before its weight, in routed_in's
                           order */
  float *shared_fc1;    /* (N, 2Fs) */
  float *shared_act;    /* (N, Fs) */
  float *shared_out;    /* (N, C) before its gate */
  float *shared_gate;   /* (N) sigmoid of the gate's logit */
} mp_moe_cache;

/* Router statistics of the layers of one micro-batch, summed, for the auxiliary losses. */
typedef struct {
  int experts;
  double tokens;          /* token x layer pairs counted */
  double *routed;         /* (E) (token, slot) pairs sent to each expert; caller's storage */
  double *prob_sum;       /* (E) sum of each expert's router probability; caller's storage */
  double logsumexp_sq;    /* sum of logsumexp(logits)^2 */
} mp_moe_stats;

/* Each expert's capacity in (token, slot) pairs: ceil(capacity_factor x N x K / E), or N K (no
 * expert can receive more) when dropless (capacity_factor <= 0). */
int mp_moe_capacity(const mp_moe_shape *shape);

/* Forward: out (N, C) written; x (N, C). Fills *cache (free with mp_moe_cache_free).
 * MP_ERR_RUNTIME when out of memory, MP_ERR_INPUT for a shape out of range (K not in [1, E],
 * a shared gate without a shared MLP, missing shared weights). */
mp_status mp_moe_forward_cpu(float *out, const float *x, const mp_moe_params *params,
                             const mp_moe_shape *shape, mp_moe_cache *cache, mp_error *err);

void mp_moe_cache_free(mp_moe_cache *cache);

/* Zeroes stats->routed and prob_sum (experts of each) and the sums. */
void mp_moe_stats_clear(mp_moe_stats *stats);

/* Adds one layer's forward (its cache) to stats. */
void mp_moe_stats_add(mp_moe_stats *stats, const mp_moe_cache *cache);

/* The load-balancing loss and the z-loss of the statistics (0 when no token was counted). */
double mp_moe_aux_loss(const mp_moe_stats *stats);
double mp_moe_z_loss(const mp_moe_stats *stats);

/* Backward of the loss  sum(out * dout) + aux_coeff * aux + z_coeff * z  through one layer,
 * stats being the micro-batch's (this layer's included). Adds (+=) into dx (N, C) and every
 * gradient in grads (the shared ones when the layer has them). MP_ERR_RUNTIME when out of
 * memory. */
mp_status mp_moe_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                              const float *x, const mp_moe_params *params,
                              const mp_moe_cache *cache, const mp_moe_stats *stats,
                              double aux_coeff, double z_coeff, mp_error *err);

/* ---------------------------------------------------------------------------------------------
 * The steps (expert_parallel/ep_dispatch.h composes them across an ep group)
 * ------------------------------------------------------------------------------------------- */

/* Rows of tokens grouped by expert, and what the experts' forward keeps of them. Expert e (of
 * `experts`, indexed from the first expert of the weights given with them) owns the rows
 * [offset[e], offset[e + 1]); R = offset[experts] rows in all (0 is fine, and so is an expert
 * with none). */
typedef struct {
  int experts;       /* El: E on one device, E / ep under expert parallelism */
  const int *offset; /* (El + 1) */
  float *in;         /* (R, C) the rows' inputs */
  float *fc1;        /* (R, 2F) [gate | up] (written by the forward) */
  float *act;        /* (R, F) SwiGLU of fc1 (written by the forward) */
  float *out;        /* (R, C) each row's expert output, before its weight (written) */
} mp_moe_expert_rows;

/* Route: checks the shape (as mp_moe_forward_cpu), allocates every array of *cache but
 * routed_fc1 and routed_act, and fills the router's (logits, probs, selected, weights), the
 * grouping (expert_offset, routed_slot) and routed_in. Only params->router (E, C) is read; the
 * shared weights are checked to be there. Fails as mp_moe_forward_cpu. */
mp_status mp_moe_route_cpu(const float *x, const mp_moe_params *params, const mp_moe_shape *shape,
                           mp_moe_cache *cache, mp_error *err);

/* The experts over rows grouped by expert: fc1, act and out written from in, expert e's GEMMs
 * with params->expert_fc1 + e (2F C) and expert_fc2 + e (C F), that is the stacks of the
 * rows->experts experts the rows belong to. shape gives C and F. Experts with no row do nothing. */
void mp_moe_experts_forward_cpu(const mp_moe_params *params, const mp_moe_shape *shape,
                                mp_moe_expert_rows *rows);

/* Backward of the experts: din (R, C) += the rows' input gradients; grads->expert_fc1 and
 * expert_fc2 (the same experts' stacks) += their weight gradients, from dout (R, C) the gradient
 * of rows->out. MP_ERR_RUNTIME when out of memory (a scratch of the largest expert's rows). */
mp_status mp_moe_experts_backward_cpu(float *din, mp_moe_params *grads, const float *dout,
                                      const mp_moe_params *params, const mp_moe_shape *shape,
                                      const mp_moe_expert_rows *rows, mp_error *err);

/* Combine: out (N, C) = for each token the sum of its routed_out rows times their weights (rows
 * in routed order), plus the gated shared MLP of x, whose arrays in *cache it fills. */
void mp_moe_combine_cpu(float *out, const float *x, const mp_moe_params *params,
                        mp_moe_cache *cache);

/* Backward of the combine's weighted sum: drouted (N K, C; its R kept rows) = each routed row's
 * output gradient (its weight times its token's dout), dweights (N, K) = each weight's
 * (dout . routed_out), 0 for a dropped pair. Both written. */
void mp_moe_combine_backward_cpu(float *drouted, float *dweights, const float *dout,
                                 const mp_moe_cache *cache);

/* Backward of the route: dx (N, C) += drouted_in (N K, C) (the gradient of routed_in) scattered
 * back to the tokens, then += the router's input gradient; drouter (E, C) += its weight gradient,
 * from dweights (N, K) and the auxiliary losses of stats (as mp_moe_backward_cpu). router (E, C)
 * is the router's weight. MP_ERR_RUNTIME when out of memory. */
mp_status mp_moe_route_backward_cpu(float *dx, float *drouter, const float *drouted_in,
                                    const float *dweights, const float *x, const float *router,
                                    const mp_moe_cache *cache, const mp_moe_stats *stats,
                                    double aux_coeff, double z_coeff, mp_error *err);

/* Backward of the shared MLP and its gate (nothing without one): dx += its input gradient,
 * grads->shared_* += its weight gradients. MP_ERR_RUNTIME when out of memory. */
mp_status mp_moe_shared_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                                     const float *x, const mp_moe_params *params,
                                     const mp_moe_cache *cache, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_MOE_H */
