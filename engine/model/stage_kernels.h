/*
 * engine/model/stage_kernels.h — what a backend supplies to the stage chain
 * (engine/model/stage_chain.h): its memory, its element type and a small table of kernels. The
 * chain (embedding, blocks, final norm, LM head, loss; slots, recomputation, the zero-bubble split,
 * sequence parallelism) is written once over this table; the CPU's table wraps layers/ and
 * tensor_parallel/ in fp32 (engine/model/stage_kernels_cpu.c), the GPU's wraps their CUDA twins in
 * bf16 (engine/model/stage_gpu.c).
 *
 * Activations and weights are arrays of the backend's element (element_bytes: 4 for fp32, 2 for
 * bf16), passed as void pointers into the backend's memory; gradients, layernorm statistics and
 * stage boundaries are fp32 everywhere. Every kernel adds (+=) into the gradients it is given and
 * skips a NULL one (a bias the model has not, say), as layers/ does. Shapes are the stage's
 * (mp_stage_dims): BT = B*T tokens of a micro-batch, BTl = this rank's token rows (BT/tp with
 * sequence parallelism, else BT), Cl = C/tp, Fl = F/tp, NHl = NH/tp query heads and KVHl =
 * KVH/tp key/value heads, QKVl = (NHl + 2 KVHl) HS the width of a qkv row (q | k | v), FCl the
 * fc GEMM's width (Fl, or 2 Fl for SwiGLU's gate | up), Vl = Vp/tp vocabulary rows.
 *
 * The Llama family's kernels (rmsnorm, swiglu, rope and grouped-query attention) may be missing
 * from a backend that does not have them yet: the chain then refuses such a model, naming the
 * backend and the kernel.
 *
 * The tensor-parallel entries carry Megatron's collectives over the stage's group; every rank of
 * the group calls them in the same order. A kernel that only enqueues work (the GPU) reports its
 * failures through check.
 */
#ifndef MPENGINE_ENGINE_STAGE_KERNELS_H
#define MPENGINE_ENGINE_STAGE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "expert_parallel/ep_comm.h"
#include "layers/moe.h"
#include "layers/rope.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A stage's sizes on this rank. */
typedef struct {
  int B, T, C, HS;    /* micro-batch, sequence, channels, head size */
  int NHl, Cl, Fl;    /* this rank's query heads, their channels, its MLP channels */
  int KVHl, QKVl, FCl; /* its key/value heads, its qkv row's width, its fc GEMM's width */
  bool rmsnorm;       /* the norms are RMSNorm (no bias), else layernorm */
  float norm_eps;
  bool swiglu;        /* the MLP is SwiGLU over (gate | up), else GELU */
  bool rope;          /* rotary embeddings on q and k, as rope_spec says */
  mp_rope_spec rope_spec;
  int V, Vp, Vl;      /* vocabulary, padded, this rank's rows of it */
  int vocab_start;    /* first vocabulary row of this rank */
  int BT, BTl, row0;  /* tokens; this rank's token rows [row0, row0 + BTl) */
  bool sp;            /* sequence parallelism with tp > 1 */
  int num_layers;     /* the stage's blocks (0: no attention scratch is needed) */
  /* Context parallelism: T is this rank's tokens of each sequence, Tseq = cp x T the whole
   * sequence's; token t sits at position positions[t] (context_parallel/sequence_split.h); the
   * cp group's collectives run over cp_comm. cp 1: none (Tseq = T, positions t). */
  int cp, cp_rank, Tseq;
  mp_tp_comm cp_comm;
  bool embedding, head; /* the stage looks tokens up; it ends in the LM head and loss */
  mp_tp_comm tp;      /* the group the collectives run over (device buffers on a GPU) */
  /* Mixture of experts: every block's MLP (moe.experts > 0; 0 for a dense model), over all BT
   * tokens of the micro-batch on every tp rank (moe.tokens = BT): the experts are whole there. */
  mp_moe_shape moe;
  double moe_aux_loss_coeff, moe_z_loss_coeff;
  /* Expert parallelism: the group the experts are split over (the stage's weights hold this ep
   * rank's E / ep of them; expert_parallel/ep_dispatch.h moves the tokens); size 1: none. */
  mp_ep_comm ep;
  /* The same group for the GPU's rows on device buffers (engine/comm/ep_comm_nccl.h); size 0:
   * none, the rows are staged through the host over ep. */
  mp_ep_comm ep_device;
} mp_stage_dims;

typedef struct {
  void *context;
  const char *name;            /* "CPU", "CUDA": for messages */
  size_t element_bytes;        /* of activations and weights */
  size_t attention_saved_bytes; /* what one layer's attention keeps for its backward */
  /* Selective recomputation drops the saved attention (the (B, NHl, T, T) matrices) and reruns
   * attention_forward before each layer's backward; false where the backward needs little (a
   * fused attention keeps only row statistics) and selective changes nothing. */
  bool attention_recomputable;

  /* Memory of the backend: alloc returns zeroed bytes; copy moves bytes within it; tokens_in
   * copies host token ids into it. */
  mp_status (*alloc)(void *context, size_t bytes, void **out, mp_error *err);
  void (*release)(void *context, void *memory);
  mp_status (*zero)(void *context, void *memory, size_t bytes, mp_error *err);
  mp_status (*copy)(void *context, void *dst, const void *src, size_t bytes, mp_error *err);
  mp_status (*tokens_in)(void *context, int32_t *dst, const int32_t *host, size_t count,
                         mp_error *err);
  /* A stage boundary (n fp32 in the backend's memory) into an activation and back. */
  void (*from_boundary)(void *context, void *act, const float *boundary, size_t n);
  void (*to_boundary)(void *context, float *boundary, const void *act, size_t n);

  /* layers/: out (rows, C); dinp, dweight, dbias += */
  void (*layernorm_forward)(void *context, void *out, float *mean, float *rstd, const void *inp,
                            const void *weight, const void *bias, int rows, int C);
  void (*layernorm_backward)(void *context, void *dinp, float *dweight, float *dbias,
                             const void *dout, const void *inp, const void *weight,
                             const float *mean, const float *rstd, int rows, int C);
  /* out (BT, OC) = inp (BT, C) @ weight (OC, C)^T + bias (or NULL) */
  void (*matmul_forward)(void *context, void *out, const void *inp, const void *weight,
                         const void *bias, int BT, int C, int OC);
  void (*matmul_backward)(void *context, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight, int BT, int C,
                          int OC);
  /* RMSNorm (eps from the dims): out (rows, C), rstd (rows); NULL where the backend has none. */
  void (*rmsnorm_forward)(void *context, void *out, float *rstd, const void *inp,
                          const void *weight, int rows, int C);
  void (*rmsnorm_backward)(void *context, void *dinp, float *dweight, const void *dout,
                           const void *inp, const void *weight, const float *rstd, int rows,
                           int C);
  /* Causal attention over this rank's heads: out (BT, Cl) from qkv (BT, QKVl), each kv head
   * serving NHl / KVHl query heads; saved attention_saved_bytes; the backward adds into dqkv.
   * grouped_attention: the kernels take KVHl < NHl. */
  bool grouped_attention;
  void (*attention_forward)(void *context, void *out, void *saved, const void *qkv);
  void (*attention_backward)(void *context, void *dqkv, const void *dout, const void *qkv,
                             const void *out, const void *saved);
  void (*gelu_forward)(void *context, void *out, const void *inp, size_t n);
  void (*gelu_backward)(void *context, void *dinp, const void *inp, const void *dout, size_t n);
  void (*residual_forward)(void *context, void *out, const void *a, const void *b, size_t n);
  /* SwiGLU: out (rows, F) = silu(gate) * up of inp (rows, 2F) = (gate | up). */
  void (*swiglu_forward)(void *context, void *out, const void *inp, int rows, int F);
  void (*swiglu_backward)(void *context, void *dinp, const void *inp, const void *dout, int rows,
                          int F);
  /* Rotary embeddings in place on the q and k heads of qkv (BT, QKVl) (token t of a sequence at
   * position t); the backward turns their gradients back, in place. */
  void (*rope_forward)(void *context, void *qkv);
  void (*rope_backward)(void *context, void *dqkv);

  /* Context parallelism (dims cp > 1; NULL where the backend has none, and the chain then
   * refuses cp): kv_full and dkv_full are cp_kv_full_bytes each, the whole sequence's keys and
   * values (and their gradient) in the backend's layout: the CPU's (B, Tseq, 2 KVHl HS) keys
   * then values by global position (context_parallel/kv_exchange.h), the GPU's whole qkv rows.
   *   cp_gather_kv: kv_full from every cp rank's qkv (BT, QKVl), collective over the group.
   *   cp_attention_forward / _backward: attention_forward / _backward for this rank's queries at
   *     their positions against kv_full; the backward gets its forward's output (out) and
   *     writes into dkv_full (zeroed) and, on the CPU, its queries' gradient into dqkv.
   *   cp_reduce_scatter_kv: the group's sum of every rank's dkv_full at this rank's tokens, into
   *     dqkv (which the chain zeroed before the backward), collective. */
  size_t cp_kv_full_bytes;
  mp_status (*cp_gather_kv)(void *context, void *kv_full, const void *qkv, mp_error *err);
  mp_status (*cp_attention_forward)(void *context, void *out, void *saved, const void *qkv,
                                    const void *kv_full, mp_error *err);
  mp_status (*cp_attention_backward)(void *context, void *dqkv, void *dkv_full,
                                     const void *dout, const void *qkv, const void *kv_full,
                                     const void *out, const void *saved, mp_error *err);
  mp_status (*cp_reduce_scatter_kv)(void *context, void *dqkv, const void *dkv_full,
                                    mp_error *err);

  /* tensor_parallel/: Megatron's linear layers, embedding and loss over the group.
   * row_parallel_linear_forward: out (BT, OC) = inp (BT, Cl) @ weight^T summed over the group,
   *   + bias; with sequence parallelism this rank's rows of the sum, in out's first BTl rows.
   * gather_sequence: full (BT, C) = every rank's (BTl, C) slice in rank order; slice may be
   *   full's own rows [row0, row0 + BTl).
   * column_parallel_input_grad: dinp (BT, C), this rank's part of a column-parallel layer's input
   *   gradient, summed over the group in place; with sequence parallelism this rank's rows of
   *   the sum, in the first BTl rows. Nothing at tp = 1.
   * embedding_forward: out (BTl, C) = wte rows of the tokens (the vocabulary-parallel lookup) +
   *   wpe (NULL: no position table, and dwpe NULL too); embedding_backward adds the gradients
   *   from dout (BTl, C). tokens (BT) are in the backend's memory, tokens_host the same on the
   *   host; work is a free (BT, C) activation.
   * loss: the vocabulary-parallel cross-entropy of logits (BT, Vl), which it overwrites with
   *   d(dloss x mean loss)/d(logits); *mean_loss (unless NULL) the mean over the BT tokens. */
  mp_status (*row_parallel_linear_forward)(void *context, void *out, const void *inp,
                                           const void *weight, const void *bias, int Cl, int OC,
                                           mp_error *err);
  mp_status (*gather_sequence)(void *context, void *full, const void *slice, mp_error *err);
  mp_status (*column_parallel_input_grad)(void *context, void *dinp, mp_error *err);
  mp_status (*embedding_forward)(void *context, void *out, const int32_t *tokens,
                                 const int32_t *tokens_host, const void *wte, const void *wpe,
                                 void *work, mp_error *err);
  mp_status (*embedding_backward)(void *context, float *dwte, float *dwpe, const void *dout,
                                  const int32_t *tokens, const int32_t *tokens_host, void *work,
                                  mp_error *err);
  mp_status (*loss)(void *context, void *logits, const int32_t *targets, float dloss,
                    double *mean_loss, mp_error *err);
  /* Mixture of experts (dims moe.experts > 0; NULL where the backend has none, and the chain
   * then refuses an MoE model, naming the backend):
   *   moe_forward: out (BT, C) = the MoE MLP (layers/moe.h) of inp (BT, C) with the block's
   *     params; *saved receives what its backward needs (the backend's; a previous one there is
   *     released first); the layer's router statistics are added into stats (NULL: not counted,
   *     a recomputation).
   *   moe_backward: dinp (BT, C) and grads (NULL members: the tensors the model has not) +=
   *     the gradient of sum(out x dout) + aux_coeff x aux + z_coeff x z, stats being the
   *     micro-batch's final sums over all its MoE layers.
   *   moe_release: frees a saved (NULL is fine).
   * params and grads hold the block's tensors in the backend's memory, cast: the CPU's fp32
   * weights, the GPU's bf16 weights (layers/moe_cuda.h) and fp32 gradients on the device. */
  mp_status (*moe_forward)(void *context, void *out, void **saved, const void *inp,
                           const mp_moe_params *params, mp_moe_stats *stats, mp_error *err);
  mp_status (*moe_backward)(void *context, void *dinp, mp_moe_params *grads, const void *dout,
                            const void *inp, const mp_moe_params *params, const void *saved,
                            const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                            mp_error *err);
  void (*moe_release)(void *context, void *saved);

  /* The failures of work enqueued since the last check (NULL: every call reports its own). */
  mp_status (*check)(void *context, mp_error *err);
} mp_stage_kernels;

/* The CPU's table (fp32, layers/ and tensor_parallel/) for a stage of dims; *out is freed with
 * mp_stage_kernels_cpu_free. */
mp_status mp_stage_kernels_cpu_create(const mp_stage_dims *dims, mp_stage_kernels **out,
                                      mp_error *err);
void mp_stage_kernels_cpu_free(mp_stage_kernels *kernels);

/* The GPU's table (bf16 CUDA kernels, the layers/ CUDA twins, collectives on device buffers) on
 * the current GPU; *device_bytes: the device memory of its scratch. Freed with
 * mp_stage_kernels_gpu_free. Built where CUDA is (or emulated); the GPU stage's only. */
mp_status mp_stage_kernels_gpu_create(const mp_stage_dims *dims, mp_stage_kernels **out,
                                      size_t *device_bytes, mp_error *err);
void mp_stage_kernels_gpu_free(mp_stage_kernels *kernels);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_STAGE_KERNELS_H */
