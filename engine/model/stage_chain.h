/*
 * engine/model/stage_chain.h — the forward and backward of one rank's shard of one pipeline stage,
 * written once for every backend: embedding, blocks, final norm, LM head and loss, the activation
 * slots of the micro-batches in flight, selective and full recomputation, the zero-bubble B/W
 * split and sequence parallelism, over a backend's kernel table (engine/model/stage_kernels.h). The
 * CPU stage (engine/model/stage_cpu.h) and the GPU stage (engine/model/stage_gpu.h) each own their
 * parameter arrays and run this chain on them.
 *
 * The block is data: each block tensor is found by its role in the layout's table
 * (mp_block_tensor, engine/model/param_layout.h) and its shard in the stage layout's table; a role
 * the model has not (a bias, the position table) is NULL and its kernel skips it. One chain runs
 * both families: the norm is layernorm or RMSNorm, the MLP GELU or SwiGLU over (gate | up), rotary
 * embeddings turn q and k after the qkv GEMM (and their gradients back before it), and the
 * attention groups query heads over kv heads.
 *
 * Megatron's tensor parallelism: qkv (q, k, v by heads, kv heads over tp) and fc (or gate and up)
 * column-parallel (their inputs gathered first with sequence parallelism), attn_proj and fc_proj
 * row-parallel, the vocabulary-parallel embedding, LM head (tied to wte, or its own) and
 * cross-entropy. With sequence parallelism (Korthikanti et al. 2022) the
 * layernorms, residual adds and the stage boundary hold this rank's token slice (BTl rows). A
 * slot keeps only its slice of each column-parallel GEMM's input (qkv, fc, the LM head), which
 * is all-gathered before the GEMM and again in the backward for its weight gradient, as Megatron
 * does (and the cost model counts); with deferred weights the gathered (BT, C) input is kept
 * instead, since W runs no collective. The layernorm gradients are then partial over this rank's
 * tokens until mp_stage_chain_finish_grads.
 *
 * Mixtures of experts (issue 33, ep 1): a block's MLP is the backend's moe_forward / moe_backward
 * (layers/moe.h on the CPU) over all BT tokens of the micro-batch on every tp rank, its router,
 * experts and shared expert whole there (expert-tp 1), so their gradients need no sum over tp.
 * The auxiliary losses are per micro-batch over all its MoE layers: the router statistics
 * (engine/model/router_stats.h) travel after the activations in the stage boundary, forward and
 * (final) backward, summed over the cp group where cp splits the tokens; the head stage adds the
 * aux losses to the loss. A zero-bubble B runs the MoE backward whole; full recomputation drops
 * the experts' saved state after the forward and rebuilds it at the backward.
 *
 * The backward keeps one residual-stream gradient that each layernorm backward adds its input
 * gradient into, so a block's input gradient is formed in place.
 *
 * Zero-bubble (Qi et al. 2023): a deferred backward (B) leaves the four GEMM weight gradients of
 * every block (qkv, attn_proj, fc, fc_proj) to mp_stage_chain_backward_weights (W), the slot
 * keeping those GEMMs' output gradients; B then W adds exactly what the whole backward adds.
 * Full recomputation: each slot keeps its tokens and input only; the backward reruns the forward
 * into one shared set of activations. Selective: the attention's saved matrices are shared and
 * recomputed before each layer's backward (where the backend's are worth dropping).
 *
 * ZeRO (engine/train/trainer.h): with a gradient window (ZeRO 2 and 3) each block's gradients are
 * formed in one window that a hook hands to the data-parallel reduce-scatter as the block's
 * backward (or W) ends; with a weights window (ZeRO-3) a hook gathers each block's weights into
 * it before every pass over the block. The tensors outside the blocks stay whole.
 */
#ifndef MPENGINE_ENGINE_STAGE_CHAIN_H
#define MPENGINE_ENGINE_STAGE_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/model/stage_layout.h"
#include "engine/model/stage_kernels.h"
#include "topology/layer_cost.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_stage_chain mp_stage_chain;

typedef struct {
  const mp_stage_layout *layout; /* span, shard table, micro-batch; must outlive the chain */
  const mp_tp_comm *tp;   /* the group for the kernels' collectives (copied) */
  const mp_tp_comm *cp;   /* the context-parallel group (copied); NULL without */
  void *weights;          /* the shard's weights, backend elements, in the layout's order */
  float *grads;           /* the shard's fp32 gradients, in the layout's order */
  int num_slots;          /* micro-batches in flight, >= 1 */
  bool deferred_weights;  /* slots keep what a zero-bubble W needs */
  mp_recompute recompute;
  /* NULL, or (ZeRO-2) a window of the layout's largest block's fp32 gradient floats
   * (mp_stage_layout_blocks_range) in the backend's memory: every block's gradient is formed there,
   * one block at a time, and handed to the grads hook, which must be set for every backward;
   * grads then holds only the other tensors, packed (mp_stage_layout_grad_offset). With deferred
   * weights only the GEMM weights' go through it, in whole backwards and in W (the window's
   * other elements stay zero), and B's norm and bias gradients stay in grads
   * (MP_GRAD_WINDOW_BLOCK_WEIGHTS). */
  float *block_grads_window;
  /* NULL, or with block_grads_window a second window like it: the blocks' gradients then go to
   * the two in turn (each block's to the one the block before it did not use, across passes
   * too), so that the hook may leave its read of one window (a reduce-scatter on another stream)
   * in flight while the next block's backward writes the other: it need only have finished
   * reading a window when it is handed the other one. */
  float *block_grads_window_2;
  /* NULL, or (ZeRO-3) a window of the largest block's weights (backend elements): every
   * block's weights are gathered there by the weights hook before each pass over the block (its
   * forward, recomputed forward and backward; a W needs none), and weights then holds only the
   * tensors outside the blocks, packed as a whole-block gradient window packs them. */
  void *block_weights_window;
  /* NULL, or with block_weights_window a second window like it: the passes over the blocks then
   * use the two in turn, so the weights hook may fill the other one with the next pass's block
   * (a prefetch) while this pass runs. */
  void *block_weights_window_2;
} mp_stage_chain_config;

/* The stage's sizes on this rank (for a backend's create). */
mp_stage_dims mp_stage_chain_dims(const mp_stage_layout *layout, const mp_tp_comm *tp,
                                  const mp_tp_comm *cp);

/* MP_OK when a chain of num_slots slots can run deferred weights and recompute; MP_ERR_INPUT
 * naming what to change otherwise (no slot; full recomputation with a zero-bubble schedule). A
 * backend checks this before it allocates anything; create checks it again. */
mp_status mp_stage_chain_check(int num_slots, bool deferred_weights, mp_recompute recompute,
                               mp_error *err);

/* Allocates the slots and working memory through kernels (which must outlive the chain).
 * MP_ERR_INPUT for full recomputation with deferred weights, or no slot; the backend's errors. */
mp_status mp_stage_chain_create(const mp_stage_chain_config *config,
                                const mp_stage_kernels *kernels, mp_stage_chain **out,
                                mp_error *err);
void mp_stage_chain_free(mp_stage_chain *chain);

/* Bytes the chain allocated through its backend (activations and working memory). */
size_t mp_stage_chain_bytes(const mp_stage_chain *chain);

/* The recomputation the chain really does, read from what it allocated: full when its slots keep
 * only their input (and the forward reruns at each backward), selective when its layers share one
 * set of attention matrices (rebuilt before each layer's backward), else none. A backend whose
 * attention keeps no T x T matrix (attention_recomputable false) has nothing for selective to
 * drop: none. */
mp_recompute mp_stage_chain_recompute(const mp_stage_chain *chain);

/* The gradient window the chain forms block gradients in (ZeRO 2 and 3), and whether it gathers
 * block weights into a window before each pass (ZeRO-3): what it really does, not what was
 * asked. */
mp_grad_window mp_stage_chain_grad_window(const mp_stage_chain *chain);
bool mp_stage_chain_gathers_weights(const mp_stage_chain *chain);

/* Forward of one micro-batch into slot.
 *   inputs, targets (B, T)  host token ids: inputs read by an embedding stage, targets by a head
 *   input   (boundary)      the previous stage's output, fp32 in the backend's memory; NULL on an
 *                           embedding stage
 *   output  (boundary)      written with the stage's output; NULL on a head stage
 *   dloss                   a head stage: the weight its backward gives the loss (1 / the step's
 *                           micro-batches); the loss gradient is formed here
 *   loss                    a head stage: the mean cross-entropy over B*T tokens
 * Collective over the group. */
mp_status mp_stage_chain_forward(mp_stage_chain *chain, int slot, const int32_t *inputs,
                                 const int32_t *targets, const float *input, float *output,
                                 float dloss, double *loss, mp_error *err);

/* Frees slot without a backward (a held-out loss). Out-of-range slots are ignored. */
void mp_stage_chain_discard(mp_stage_chain *chain, int slot);

/* For sampling (`mpengine sample`): while dest is set, every forward of a head stage copies its
 * logits, (B, T, Vl) fp32 in the backend's memory (Vl: this rank's padded vocabulary range), into
 * dest before the loss overwrites them with their gradient. NULL stops it. */
void mp_stage_chain_capture_logits(mp_stage_chain *chain, float *dest);

/* Backward of slot's micro-batch: doutput, the next stage's input gradient (NULL on a head
 * stage); dinput written with the gradient of the stage's input (NULL on an embedding stage).
 * defer_weights: zero-bubble's B (needs deferred_weights); the slot stays in use until its W.
 * Adds into the gradients. Collective. */
mp_status mp_stage_chain_backward(mp_stage_chain *chain, int slot, const float *doutput,
                                  float *dinput, bool defer_weights, mp_error *err);

/* Zero-bubble's W of slot: the GEMM weight gradients its deferred backward left. */
mp_status mp_stage_chain_backward_weights(mp_stage_chain *chain, int slot, mp_error *err);

/* Once per step after the last backward: with sequence parallelism sums every layernorm gradient
 * (the blocks' ln1, ln2 and the final norm's; with a window of whole blocks the final norm's
 * only) over the group; else nothing. Collective. */
mp_status mp_stage_chain_finish_grads(mp_stage_chain *chain, mp_error *err);

/* Data-parallel overlap (Megatron's gradient buckets): with a hook set, a whole backward and a W
 * call hook(context, grads, first, count) right after each block's kernels (the last block
 * first); grads points at the block's count floats, elements [first, first + count) of the
 * stage's flat layout, in the gradient array or the window (on a GPU complete once the stream
 * reaches that point). With a window of whole blocks, the block's layernorm gradients are
 * already summed over the group under sequence parallelism; a window is overwritten by the
 * next block's backward (with two windows, by the one after it). A
 * deferred backward (B) does not call it: the block's weight gradients wait for W. A failing hook
 * stops the backward with its error. NULL: none. */
typedef mp_status (*mp_stage_grads_hook)(void *context, float *grads, size_t first, size_t count,
                                         mp_error *err);
void mp_stage_chain_set_grads_hook(mp_stage_chain *chain, mp_stage_grads_hook hook,
                                   void *context);

/* ZeRO-3: hook(context, window, first, count, next) fills window with the block's count weights,
 * elements [first, first + count) of the stage's flat layout, before a pass over the block (on
 * a GPU, the kernels enqueued after it must find them there). With two weights windows, next
 * (else NULL) names the block of the pass after this one within the same forward or backward
 * and the window it will use, the other one: the hook may start filling it now (a prefetch,
 * which must not disturb what this pass reads), and next time finish it. It must be set on a
 * chain with a weights window: a pass without it is refused. */
typedef struct {
  void *window;
  size_t first, count;
} mp_stage_weights_next;
typedef mp_status (*mp_stage_weights_hook)(void *context, void *window, size_t first,
                                           size_t count, const mp_stage_weights_next *next,
                                           mp_error *err);
void mp_stage_chain_set_weights_hook(mp_stage_chain *chain, mp_stage_weights_hook hook,
                                     void *context);

/* [*first, *end): the floats of the gradient array the stage's blocks hold (contiguous);
 * *first == *end without blocks. */
void mp_stage_chain_blocks_range(const mp_stage_chain *chain, size_t *first, size_t *end);

/* The squared global norm of a stage's gradient from each tensor's sum of squares, squares[i] for
 * mp_stage_layout_tensor(layout, i): every sharded tensor's squares summed over the group tp,
 * each replicated tensor counted once, a tied copy of wte not at all, and the experts of an
 * expert-parallel layout (ep_size > 1) not at all: each rank holds other experts, so the trainer
 * sums their squares over the ep group itself (engine/train/dp_sync.c, zero.c). The partial sums travel as
 * doubles and are added in rank order, so *out is bitwise the same on every rank and clipping
 * agrees; both backends count alike. Collective. */
mp_status mp_stage_norm_from_squares(const mp_stage_layout *layout, const mp_tp_comm *tp,
                                     const double *squares, double *out, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_STAGE_CHAIN_H */
