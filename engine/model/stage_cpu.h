/*
 * engine/model/stage_cpu.h — one rank's shard of the GPT (engine/model/param_layout.h), or of one
 * pipeline stage of it (mp_stage_span: a contiguous piece of embedding, blocks, final norm, LM
 * head), on a tensor-parallel group, on the CPU in fp32: its parameters and gradients as flat shard
 * arrays, and its forward and backward, the stage chain (engine/model/stage_chain.h: activation
 * slots, recomputation, the zero-bubble split) over the CPU's kernels. The pipeline's stage worker
 * (pipeline/stage_worker.h) drives a rank's stages through the trainer (engine/train/trainer.h);
 * with tp = 1 the group is mp_tp_comm_single.
 *
 * Where each number of the shard goes is the stage's layout (engine/model/stage_layout.h, pure:
 * the same for the chain, the GPU stage, the trainer and checkpoints); this stage holds the CPU's
 * arrays in it.
 *
 *   embedding   vocab-parallel lookup (tensor_parallel/vocab_parallel_embedding.h), wpe added
 *   blocks      qkv and fc column-parallel, attn_proj and fc_proj row-parallel
 *               (tensor_parallel/), layernorms replicated
 *   final norm  replicated (on this rank's token slice with sequence parallelism)
 *   LM head     tied to the wte shard: the logits of this rank's vocabulary range only
 *   loss        vocab-parallel cross-entropy, never gathering the (BT, Vp) logits
 *
 * Shard-first (DESIGN.md, principle 6): a stage allocates, initialises and loads only its own
 * shard. Initialisation draws each block of each shard directly from the pure function of (seed,
 * tensor name, element index) (mp_param_tensor_init_block), so tp = 2 starts from exactly the
 * numbers of tp = 1 (principle 2); an llm.c file is read in the byte ranges of the shard alone.
 *
 * Sequence parallelism: the layernorm gradients of a rank cover only its tokens. The backward
 * leaves them partial; mp_stage_cpu_finish_grads sums them (every block's ln1/ln2 and the final
 * norm) over the group once per step, after the last micro-batch and before clipping.
 *
 * Replicated tensors come out bitwise identical on every rank (tp_comm.h's contract), so the
 * ranks' identical optimizer steps keep them equal; mp_stage_cpu_grad_norm_squared counts them
 * once.
 *
 * Every call that communicates returns MP_OK or the collective's error (a timeout names the rank,
 * the group and the peer); all ranks of the group must make the same calls in the same order.
 */
#ifndef MPENGINE_ENGINE_MODEL_STAGE_CPU_H
#define MPENGINE_ENGINE_MODEL_STAGE_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "expert_parallel/ep_comm.h"
#include "engine/model/param_layout.h"
#include "engine/model/stage_layout.h"
#include "engine/model/stage_state.h"
#include "tensor_parallel/shard.h"
#include "tensor_parallel/tp_comm.h"
#include "topology/layer_cost.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_stage_cpu mp_stage_cpu;

/* The whole model on group tp with one activation slot; see mp_stage_cpu_create_stage. */
mp_status mp_stage_cpu_create(const mp_model *model, int micro_batch, int seq_len,
                           const mp_tp_comm *tp, bool sequence_parallel, mp_stage_cpu **out,
                           mp_error *err);

/* Lays out this rank's shard of config->span of `model` on group config->tp (tp->size ranks, this
 * one tp->rank; mp_stage_layout_create) and allocates parameters, gradients and num_slots (>= 1)
 * activation slots, each holding one (micro_batch, seq_len) micro-batch between its forward and
 * its backward (a pipeline rank has several in flight). With
 * deferred_weights each slot also keeps what the weight-gradient pass of a zero-bubble schedule
 * needs (mp_stage_chain_backward_weights). recompute trades compute for memory as the plan says:
 * selective keeps no attention matrices (B, NH/tp, T, T) per slot and recomputes each layer's right
 * before its backward; full keeps only each slot's input and tokens and reruns the stage's forward
 * at the start of the backward (not with deferred weights: MP_ERR_INPUT). Both give bitwise the
 * gradients of none. The table is copied; its context must outlive the model. MP_ERR_INPUT, naming
 * the model file and what to change, when the runtime cannot train the model
 * (mp_param_layout_create), the heads, ffn_hidden or padded vocabulary do not divide over tp, or
 * with sequence parallelism micro_batch x seq_len does not. zero->window_block_grads (ZeRO 2 and
 * 3): the stage holds no gradient of its blocks between their backwards (or with
 * deferred weights, of their GEMM weights between their Ws): each block's is formed in one window
 * of the largest block's floats, which the chain's hook must take after every block
 * (engine/model/stage_chain.h), and the gradient array holds only the other tensors
 * (mp_grad_window). zero->shard_block_params (ZeRO-3, with window_block_grads, without deferred
 * weights): the parameters too (mp_stage_layout_held_params).
 * Parameters start at zero: call an init or write function. */
typedef struct {
  int micro_batch, seq_len;      /* (B, T) of one micro-batch; T this rank's tokens of each
                                    sequence (seq_len / cp with context parallelism) */
  const mp_tp_comm *tp;          /* the tensor-parallel group (the table is copied; its context
                                    must outlive the stage) */
  bool sequence_parallel;
  mp_stage_span span;            /* which piece of the chain */
  int num_slots;                 /* micro-batches in flight, >= 1 */
  bool deferred_weights;         /* slots keep what a zero-bubble W needs */
  mp_recompute recompute;
  const mp_stage_zero *zero;     /* ZeRO's cut, or NULL */
  const mp_tp_comm *cp;          /* the context-parallel group (the table is copied, as tp's);
                                    NULL: none */
  const mp_ep_comm *ep;          /* the expert-parallel group (expert_parallel/ep_comm.h; the
                                    table is copied, as tp's): the stage holds its ep rank's
                                    experts only (mp_stage_layout_config's ep) and its MoE
                                    layers dispatch tokens over it; NULL: ep 1 */
} mp_stage_cpu_config;
mp_status mp_stage_cpu_create_stage(const mp_model *model, const mp_stage_cpu_config *config,
                                    mp_stage_cpu **out, mp_error *err);

void mp_stage_cpu_free(mp_stage_cpu *gpt);

/* Where each number of the stage goes (its span, micro-batch, tensor table, ZeRO's cuts). */
const mp_stage_layout *mp_stage_cpu_layout(const mp_stage_cpu *gpt);
const mp_tp_comm *mp_stage_cpu_comm(const mp_stage_cpu *gpt);

/* The stored parameter array (mp_stage_layout_params_floats floats: the flat shard, or under
 * ZeRO-3 the outside tensors and the held block elements) and the gradient array
 * (mp_stage_cpu_grads_floats). */
float *mp_stage_cpu_params(mp_stage_cpu *gpt);
float *mp_stage_cpu_grads(mp_stage_cpu *gpt);

/* The parameters by their place in the flat layout (mp_stage_layout_params_index finds where
 * they are stored, under ZeRO-3 too):
 *   params_at     a pointer into the host array; NULL when the elements are not one stretch of
 *                 the stored array
 *   read_params   dest = elements [first, first + count)
 *   write_params  elements [first, first + count) = src
 * read and write: MP_ERR_INPUT naming the element when the stage does not hold them all. */
float *mp_stage_cpu_params_at(mp_stage_cpu *gpt, size_t first, size_t count);
mp_status mp_stage_cpu_read_params(mp_stage_cpu *gpt, size_t first, size_t count, float *dest,
                                   mp_error *err);
mp_status mp_stage_cpu_write_params(mp_stage_cpu *gpt, size_t first, size_t count,
                                    const float *src, mp_error *err);

/* Windowed block gradients (config->zero->window_block_grads): mp_stage_cpu_grads has
 * mp_stage_cpu_grads_floats floats, the tensors outside the window in the layout's order, packed
 * (mp_stage_layout_grad_offset; without a window, num_params floats in the shard's layout).
 * mp_stage_cpu_tensor_grad is tensor index's gradient in it, NULL for a tensor of the window. */
mp_grad_window mp_stage_cpu_grad_window(const mp_stage_cpu *gpt);
size_t mp_stage_cpu_grads_floats(const mp_stage_cpu *gpt);
float *mp_stage_cpu_tensor_grad(mp_stage_cpu *gpt, int index);

/* GPT-2 initialisation from seed: this rank's shard of mp_param_layout_init_params, drawn block by
 * block without the full tensors (mp_stage_init_fill). */
mp_status mp_stage_cpu_init_params(mp_stage_cpu *gpt, uint64_t seed, mp_error *err);

/* Fills this rank's shard of each of the stage's tensors from fill, rectangle by rectangle, so
 * that no rank ever holds a full tensor: fill writes the (rows, cols) block at (row, col) of the
 * one-rank tensor of layout index `tensor` into dest (rows x cols, row-major). A source laid out
 * otherwise (GPT-2's transposed weights) still reads whole rows; on the CPU in place. Errors of
 * fill. Loading weights is this over a weight source (engine/weights/weight_source.h,
 * mp_weight_source_fill). */
mp_status mp_stage_cpu_fill_params(mp_stage_cpu *gpt, mp_stage_fill_fn fill, void *context,
                                mp_error *err);

/* The full one-rank arrays from every rank's shard, written on every rank (all-gather per
 * tensor): full has mp_param_layout_num_params floats, of which the stage's tensors are written
 * (all of them for a whole-model stage; a tied copy of wte is not written). Collective. For tests
 * that compare a shard with the one-rank model; a run never calls them (saves stream,
 * mp_trainer_save_llmc). */
mp_status mp_stage_cpu_gather_params(mp_stage_cpu *gpt, float *full, mp_error *err);
mp_status mp_stage_cpu_gather_grads(mp_stage_cpu *gpt, float *full, mp_error *err);

/* Zeroes the gradients, and ZeRO-2's part of them (mp_stage_cpu_keep_moments). */
void mp_stage_cpu_zero_grads(mp_stage_cpu *gpt);

/* The stage's forward and backward (engine/model/stage_chain.h, over the CPU's kernels). */
typedef struct mp_stage_chain mp_stage_chain;
mp_stage_chain *mp_stage_cpu_chain(mp_stage_cpu *gpt);

/* Forward of one micro-batch through the whole model (a whole-model stage, slot 0): inputs and
 * targets (B, T), every token of the micro-batch on every rank, each in [0, V). *loss = the mean
 * cross-entropy over the B*T tokens (identical on every rank); the loss gradient its backward
 * will use is formed now, weighted by dloss (1 for a lone micro-batch, 1 / num_micro_batches
 * when micro-batches accumulate). Collective. */
mp_status mp_stage_cpu_forward(mp_stage_cpu *gpt, const int32_t *inputs, const int32_t *targets,
                            float dloss, double *loss, mp_error *err);

/* Backward of the last forward: adds d(dloss x mean loss)/d(shard) into the gradients. With
 * sequence parallelism the layernorm gradients stay partial until mp_stage_cpu_finish_grads.
 * Collective. */
mp_status mp_stage_cpu_backward(mp_stage_cpu *gpt, mp_error *err);

/* mp_stage_chain_forward and _backward on the stage's chain (see there for the arguments). */
mp_status mp_stage_cpu_forward_stage(mp_stage_cpu *gpt, int slot, const int32_t *inputs,
                                  const int32_t *targets, const float *input, float *output,
                                  float dloss, double *loss, mp_error *err);
mp_status mp_stage_cpu_backward_stage(mp_stage_cpu *gpt, int slot, const float *doutput,
                                      float *dinput, bool defer_weights, mp_error *err);

/* Once per step, after the last micro-batch's backward: with sequence parallelism sums every
 * layernorm gradient (blocks' ln1, ln2 and the final norm) over the group; without it does
 * nothing. Collective. */
mp_status mp_stage_cpu_finish_grads(mp_stage_cpu *gpt, mp_error *err);

/* The squared global norm of the stage's gradient: every sharded tensor's squares summed over
 * the group, each replicated tensor counted once, a tied copy of wte not at all. The partial sums
 * travel as doubles and are added in rank order, so *out is bitwise the same on every rank and
 * clipping agrees (mp_stage_norm_from_squares). Call after mp_stage_cpu_finish_grads.
 * Collective. */
mp_status mp_stage_cpu_grad_norm_squared(mp_stage_cpu *gpt, double *out, mp_error *err);

/* The optimizer's state, as the GPU stage keeps it (mp_stage_gpu_keep_moments and the rest; the
 * trainer reaches both through mp_stage_cpu_state_ops, engine/model/stage_state.h):
 *   keep_moments  ZeRO: the AdamW moments of flat elements [first, first + count) only (this dp
 *                 rank's part), zeroed, and with windowed block gradients (ZeRO-2) the part's
 *                 summed gradients; without the call the moments are the whole stage's, made
 *                 when first needed. MP_ERR_INPUT for a range outside the stage.
 *   moments_at    pointers to the moments of [first, first + count); MP_ERR_INPUT outside them
 *   add_to_part   ZeRO-2: part += sums (count floats, elements [first, first + count) inside it)
 *   part_squares  ZeRO-2: each tensor's squares over the part (num_tensors doubles)
 *   grad_part     ZeRO-2: the part's gradients (count floats), NULL without a part
 *   scale_grads   gradients *= scale; with a ZeRO-2 part, the part's
 *   adamw         AdamW over the kept moments' elements, the gradients times
 *                 adamw->grad_scale inside the update (bitwise the separate scaling's result is
 *                 not promised: this is the CPU's one pass). */
mp_status mp_stage_cpu_keep_moments(mp_stage_cpu *gpt, size_t first, size_t count,
                                    mp_error *err);
mp_status mp_stage_cpu_moments_at(mp_stage_cpu *gpt, size_t first, size_t count, float **adam_m,
                                  float **adam_v, mp_error *err);
mp_status mp_stage_cpu_add_to_part(mp_stage_cpu *gpt, const float *sums, size_t first,
                                   size_t count, mp_error *err);
mp_status mp_stage_cpu_part_squares(mp_stage_cpu *gpt, double *squares, mp_error *err);
float *mp_stage_cpu_grad_part(mp_stage_cpu *gpt);
void mp_stage_cpu_scale_grads(mp_stage_cpu *gpt, float scale);
mp_status mp_stage_cpu_adamw(mp_stage_cpu *gpt, const mp_stage_adamw *adamw, mp_error *err);

/* The CPU stage's state table (engine/model/stage_state.h): its calls are this header's, its
 * memory the host's. */
const mp_stage_state_ops *mp_stage_cpu_state_ops(void);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_STAGE_CPU_H */
