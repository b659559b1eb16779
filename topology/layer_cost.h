/*
 * topology/layer_cost.h — what one layer costs for a micro-batch: parameters, FLOPs, and the
 * activation memory it keeps from forward to backward under each recomputation mode.
 *
 * These numbers feed `mpengine describe`, the stage partitioner and the planner's cost and memory
 * model. Conventions (Megatron-LM's, so MFU figures compare with theirs):
 *   - FLOPs count matrix products only, 2 per multiply-add; the attention score and value products
 *     count the full T x T square (no causal halving). Backward = 2 x forward (input gradient and
 *     weight gradient). For the Llama family this is Megatron-Core's num_floating_point_operations:
 *     the query-group term (kv_heads / heads of the q projection's width for k and v) and the
 *     gated linear unit's 3/2 (SwiGLU's gate, up and down matrices).
 *   - The matrix products are also listed by shape (gemms), so that a cost model can see a small
 *     or thin GEMM (the attention products' K is the head size) for what it is.
 *   - Memory-bound work between the GEMMs is counted in bytes read and written
 *     (forward_memory_bytes, backward_memory_bytes), per kernel as a fused Megatron-style runtime
 *     runs it, with bytes_per_element activations, 1-byte dropout masks and fp32 statistics:
 *       forward, per token: each norm reads and writes (B, T, C) (plus its fp32 statistics: 2 for
 *         layernorm, 1 for RMSNorm); each residual add (bias, dropout and add fused) reads 2 and
 *         writes 1 (B, T, C) and writes a mask when dropout > 0; the softmax reads the scores and
 *         writes the probabilities (heads x T per token), the attention dropout reads them and
 *         writes its output and mask; GELU reads and writes the MLP width, SwiGLU reads 2 and
 *         writes 1; rotary embeddings read and write the queries and keys;
 *       backward: each norm reads x and dy and writes dx, each residual gradient add reads 2 and
 *         writes 1, each dropout reads dy and its mask and writes dx, the softmax reads y and dy
 *         and writes dx, GELU reads x and dy and writes dx, SwiGLU reads gate, up and dy and
 *         writes both gradients, rotary embeddings rotate the query and key gradients back;
 *       the embedding reads its rows and writes (B, T, C) (the position table too), and adds its
 *         gradient into the fp32 table; the LM head's cross-entropy reads the (T, V) logits 3 times
 *         and writes them once forward (max, exp-sum, the target's logit, the probabilities), and
 *         reads and writes them once backward.
 *     Each kernel also counts its vector FLOPs per element (layer_cost.c: a layernorm 8, a residual
 *     add 1, a causal softmax 12.5, GELU 28, an exp, tanh or sigmoid 20): on a GPU they are far
 *     below its memory time, on a CPU core the exp in the softmax and the tanh in GELU are not.
 *     Of these bytes, tp splits what lies between a column- and a row-parallel linear (softmax,
 *     dropout over the probabilities, the activation function, the logits); the (B, T, C) work
 *     outside (norms, residual adds, their dropout) is replicated on every tp rank unless sequence
 *     parallelism splits it: index [MP_TRAFFIC_SPLIT] and [MP_TRAFFIC_REPLICATED].
 *   - Flash attention (mp_layer_flash_attention) is one kernel: Q K^T and P V are not GEMMs but
 *     flash_attention_flops (the same 4 B T^2 h), no (B, NH, T, T) tensor is read, written or kept
 *     (the dropout happens inside), only the per-row log-sum-exp statistics are kept, and
 *     selective recomputation has nothing left to recompute.
 *   - Activations are what our runtime keeps for backward, per token, in elements of
 *     bytes_per_element (2 for bf16) plus fp32 norm and softmax statistics:
 *       transformer, none: norm1 in, norm1 out, qkv, attention probabilities (heads x T), attention
 *         out, norm2 in, norm2 out, MLP pre-activation and post-activation (3 tensors for SwiGLU),
 *         and with dropout > 0 the two residual dropout masks (1 byte per element), the attention
 *         dropout's mask and output (heads x T): Korthikanti et al. 2022's 34sbh + 5as^2b bytes
 *         per layer with dropout, 32sbh + 2as^2b without;
 *       selective: the same without the heads x T tensors, which are recomputed from qkv
 *         (only their per-head softmax statistics are kept);
 *       full: only the layer's input; the whole layer forward is recomputed in backward.
 *     Embedding keeps the token ids (int32), a norm its input and statistics, the LM head its
 *     input and the (T, V) logits for the loss gradient, in every mode; custom layers keep what
 *     their description says in every mode. activation_replicated_bytes is the part tp does not
 *     split (the norms' inputs and outputs and the masks; the LM head's input), which only sequence
 *     parallelism divides.
 *   - Context parallelism (shape->context_parallel = cp > 1): each of cp ranks holds T / cp of
 *     every sequence's tokens (2 cp chunks, rank i chunks i and 2 cp - 1 - i, so that causal work
 *     is balanced) and the costs are one such rank's. Everything token-wise (the linears, norms,
 *     MLP, embedding, head, loss, their bytes and activations) is for its B T / cp tokens; the
 *     attention takes its T / cp queries against all T keys and values, gathered over the cp
 *     group: its FLOPs are 4 B (T / cp) T h (1/cp of the whole sequence's), its scores heads x T
 *     per local token. The gathered K and V (kv_gather_bytes, 2 B T kv_width elements) are not
 *     kept: a block's backward gathers them again (the runtime keeps each micro-batch's own
 *     tokens only; engine/model/stage_chain.c), so they are working memory of one block, with
 *     their gradient (cost_model.h's cp buffers), not activations.
 *   - A mixture-of-experts block (mp_layer_is_moe): its MLP is the router GEMM (tokens, E, C),
 *     each token's top_k experts (as one GEMM pair over tokens x top_k rows: gate and up to 2F,
 *     down to C), and the shared MLP (2Fs, then C) with its gate (tokens, 1, C) when it has one:
 *     the FLOPs are those a dropless token-choice layer computes, whatever the routing. Its
 *     parameters are all E experts (mp_layer_params); the active ones (mp_layer_active_params) those
 *     a token uses: attention, norms, router, top_k experts and the shared MLP. Kept for backward,
 *     per token, in place of the dense MLP's tensors: the router's E probabilities (fp32), and per
 *     routed copy its gathered input (C), gate-and-up output (2F), activation (F) and expert
 *     output (C), plus the shared MLP's 3 Fs and its gate; the memory-bound kernels add the
 *     SwiGLU over k F + Fs, the router softmax and top-k over E, and the permutation and combine
 *     (each reads and writes k C). The routed experts' products are listed at their real size
 *     (grouped: one GEMM per expert, each with its own efficiency on a cost model's curve): under
 *     expert parallelism ep (shape->expert_parallel), this rank holds E / ep experts and receives
 *     the routed copies of the ep ranks of its expert-parallel group, so each local expert
 *     multiplies ep x tokens x k / E rows on average (dropless, balanced routing: the average is
 *     what is costed; a skewed router makes the busiest expert slower, not modelled), E / ep
 *     of them; at ep 1, tokens x k / E rows for each of the E experts. The FLOPs and the kept
 *     activations are the same at every ep (as many copies arrive as leave). expert_params is
 *     the E experts' share of params (all of them, whatever ep: a cost model divides by ep);
 *     dispatch_bytes is what one all-to-all of the block moves from this rank, its tokens' k
 *     routed copies of C elements (B x T/cp x k x C).
 */
#ifndef MPENGINE_TOPOLOGY_LAYER_COST_H
#define MPENGINE_TOPOLOGY_LAYER_COST_H

#include <stdbool.h>
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
  int64_t seq_len;       /* T, tokens per sequence (the whole sequence, also with cp) */
  int bytes_per_element; /* activation element size: 2 for bf16, 4 for fp32 */
  bool backend_flash;    /* the backend runs flash attention where the layer does not say */
  int context_parallel;  /* cp, the ranks sharing each sequence (0 or 1: none): the costs are
                            then one cp rank's, for its T / cp tokens (see the top of this file) */
  int expert_parallel;   /* ep, the ranks splitting each MoE block's experts (0 or 1: none): the
                            routed experts' GEMMs are then this rank's E / ep experts' */
} mp_cost_shape;

/* ep of shape: expert_parallel, 1 when it is 0 (a shape built without it). */
int mp_cost_shape_ep(const mp_cost_shape *shape);

/* cp of shape: context_parallel, 1 when it is 0 (a shape built without it). */
int mp_cost_shape_cp(const mp_cost_shape *shape);

/* One memory-bound kernel between the GEMMs, for (B, T): what it reads and writes and the vector
 * (non-matrix) FLOPs it computes, an exp, tanh or sigmoid counting 20. */
typedef struct {
  double bytes, vector_flops;
  bool backward;  /* runs in backward (else forward) */
  bool split;     /* divided by tp (else replicated over tp unless sequence parallelism splits it) */
  bool attention; /* forward softmax or attention dropout: what selective recomputation repeats */
  bool scalar;    /* our CPU backend runs it as a scalar loop (the attention softmax's expf):
                     costed at scalar_tflops there */
} mp_elementwise_kernel;

/* Which dimension of a GEMM the tensor-parallel group splits. */
typedef enum {
  MP_GEMM_SPLIT_NONE = 0,
  MP_GEMM_SPLIT_N,     /* column-parallel: the output features */
  MP_GEMM_SPLIT_K,     /* row-parallel: the input features (the partial sums are all-reduced) */
  MP_GEMM_SPLIT_BATCH, /* attention's per-head products: the heads */
} mp_gemm_split;

/* batch independent products (m, k) @ (k, n), all of one shape. */
typedef struct {
  double m, n, k, batch;
  mp_gemm_split split;
  bool attention_core; /* Q K^T or P V: what selective recomputation repeats */
  bool grouped;        /* the batch products are separate GEMMs (a grouped GEMM: one per
                          expert), each as small as it is; else one batched launch */
} mp_gemm_shape;

enum {
  MP_LAYER_MAX_GEMMS = 10,
  MP_LAYER_MAX_KERNELS = 24,
  MP_TRAFFIC_REPLICATED = 0, /* index of the memory-traffic arrays: replicated over tp unless SP */
  MP_TRAFFIC_SPLIT = 1,      /* divided by tp */
};

typedef struct {
  int64_t params;                               /* 0 for a tied LM head */
  double forward_flops;                         /* for (B, T) */
  double backward_flops;                        /* input + weight gradients */
  double recompute_flops[MP_RECOMPUTE_COUNT];   /* extra forward work done during backward */
  double activation_bytes[MP_RECOMPUTE_COUNT];  /* kept from forward until backward */
  double activation_replicated_bytes[MP_RECOMPUTE_COUNT]; /* of activation_bytes: not tp-split */
  double output_bytes;                          /* tensor handed to the next layer, (B, T, C) */
  int num_gemms;                                /* 0 for a custom layer (FLOPs only) */
  mp_gemm_shape gemms[MP_LAYER_MAX_GEMMS];      /* the forward's; backward repeats each twice */
  int num_kernels;
  mp_elementwise_kernel kernels[MP_LAYER_MAX_KERNELS];
  double forward_memory_bytes[2];               /* the kernels' bytes by [MP_TRAFFIC_*] */
  double backward_memory_bytes[2];
  double attention_memory_bytes;                /* of forward_memory_bytes[SPLIT]: softmax and
                                                   attention dropout, repeated by selective */
  double flash_attention_flops;                 /* the fused attention kernel's forward FLOPs (in
                                                   forward_flops; its products are not in gemms);
                                                   0 when the attention is unfused */
  double attention_scratch_bytes;               /* unfused attention: what its backward holds
                                                   while it runs, two matrices of the scores
                                                   (the CPU's dpreatt and datt); 0 when fused */
  double kv_gather_bytes;                       /* cp > 1: the K and V of the whole sequence that
                                                   attention gathers over the cp group, 2 B T x
                                                   kv_heads x head size elements (all tp ranks'
                                                   heads); 0 otherwise */
  int64_t expert_params;                        /* MoE: of params, the E routed experts' (gate,
                                                   up and down); 0 otherwise */
  double dispatch_bytes;                        /* MoE: one all-to-all's bytes from this rank,
                                                   B x T/cp x k x C elements; 0 otherwise */
} mp_layer_cost;

/* Whether a transformer layer's attention runs as one fused (flash) kernel under shape. */
bool mp_layer_flash_attention(const mp_layer_spec *layer, const mp_cost_shape *shape);

/* Parameters of one layer (weights and biases); a tied LM head owns none. A mixture-of-experts
 * block counts all its experts. */
int64_t mp_layer_params(const mp_layer_spec *layer);

/* Of mp_layer_params, those one token uses: an MoE block's top_k experts instead of all E (and
 * its router and shared MLP); every parameter of any other layer. */
int64_t mp_layer_active_params(const mp_layer_spec *layer);

/* Costs of one layer for the given micro-batch shape. */
void mp_layer_cost_compute(const mp_layer_spec *layer, const mp_cost_shape *shape,
                           mp_layer_cost *out);

/* Sum of mp_layer_params over the model: llm.c's count for GPT-2 (124,439,808 for 124M). */
int64_t mp_model_params(const mp_model *model);

/* Sum of mp_layer_active_params: Mixtral-8x7B's 12.9 B of its 46.7 B. Equal to mp_model_params
 * for a model without experts. */
int64_t mp_model_active_params(const mp_model *model);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_LAYER_COST_H */
