/*
 * engine/model/stage_kernels_gpu.c — the GPU's kernel table of the stage chain
 * (engine/model/stage_kernels.h): layers/' CUDA twins in bf16, and around the row-parallel
 * GEMMs, the column-parallel input gradients, the embedding lookup and the cross-entropy the
 * collectives of tensor_parallel/ on device buffers. Every collective moves fp32 (bf16 widened
 * exactly, rounded once after a sum). The GPU stage (stage_gpu.c) runs the chain over it.
 *
 * Context parallelism: the cp group all-gathers each rank's whole qkv rows into the sequence's
 * (B, Tseq, QKVl) at their global positions. With the fused attention each of this rank's two
 * chunks is one window call (layers/attention.h, mp_attention_window): its queries against the
 * gathered prefix up to its last token, the outputs and row statistics written straight into
 * this rank's (B, T, ...) rows, and in the backward the keys' and values' gradient of that
 * prefix added into the sequence's rows; the group's reduce-scatter of those rows sums them for
 * each token's owner. The attention FLOPs are this rank's share, the planner's assumption.
 * The cuBLAS attention (head sizes the fused kernels lack) has no windows: it runs on the whole
 * sequence, keeps this rank's tokens' outputs, and in the backward gets exactly this rank's share
 * from output gradients that are non-zero at its tokens only (cp times the FLOPs).
 *
 * Mixture of experts (layers/moe_cuda.h): each tp rank runs the
 * whole layer over the micro-batch's BT tokens (gathered first with sequence parallelism), as the
 * chain asks. What a forward keeps is one device block of mp_moe_cache_cuda_bytes per layer and
 * micro-batch, held by the chain's slot until the backward releases it; released blocks are kept
 * as spares for the next forwards, so the table holds at most as many as were ever live at once
 * (a slot's layers, times the slots the schedule keeps). The backward's workspace and the
 * statistics' scratch are the table's, one each.
 * Expert parallelism (d.ep.size > 1; the stage's weights hold this ep rank's E / ep experts):
 * expert_parallel/ep_dispatch.h's algorithm on device buffers, built from moe_cuda.h's steps and
 * expert_parallel/ep_plan.h's bookkeeping (the CPU's counts, offsets and row order): route, the
 * counts' all-to-all, the rows to the ranks holding their experts, the local experts, the outputs
 * back, combine; the backward mirrored. The rows travel over the ep table (MPI), staged through
 * the host as fp32 (exact for bf16), and are put in the experts' order on the host on the way;
 * given a device table (d.ep_device: NCCL) they are widened, exchanged and permuted on the device
 * instead (one device copy per source rank and local expert). The received rows and their
 * activations are the forward's own device block, sized by what arrived.
 */
#include "engine/model/stage_kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "context_parallel/sequence_split.h"
#include "engine/device/device.h"
#include "expert_parallel/ep_comm.h"
#include "expert_parallel/ep_plan.h"
#include "layers/adamw.h"
#include "layers/attention.h"
#include "layers/cross_entropy.h"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "layers/moe_cuda.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"
#include "layers/tensor_parallel_cuda.h"

/* ---------------------------------------------------------------------------------------------
 * The CUDA kernel table (engine/model/stage_kernels.h)
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  mp_stage_kernels table; /* first: the table's context is this struct */
  mp_stage_dims d;
  mp_cublas *cublas;
  bool fused_attention;
  size_t device_bytes;       /* of the scratch below */
  float *reduce;             /* (BT, C) fp32: what a collective sums, the embedding lookup */
  float *slice;              /* (BTl, C) fp32, SP: a collective's slice of reduce */
  float *losses;             /* (BT) */
  float *losses_host;        /* (BT) */
  float *row_max, *gathered_max, *ce_stats; /* (BT), (tp, BT), (2, BT) */
  float *layernorm_scratch, *matmul_scratch;
  float *rmsnorm_scratch;    /* the RMSNorm backward's, with rmsnorm */
  float *inv_freq;           /* (HS / 2) rotary frequencies, with rope */
  float *dwpe_unused;        /* (T, C) the embedding backward's position gradient without a
                                position table, dropped */
  void *attention_scratch;
  int32_t *embedding_workspace;
  float *dwte_rows;          /* (Vl + 1, C) tp > 1: the embedding gradient by shard row; the last
                                row collects tokens of other ranks' ranges */
  int32_t *shard_tokens;     /* (BT) device: tokens as rows of dwte_rows */
  int32_t *shard_tokens_host;
  /* Context parallelism (cp > 1), else NULL: */
  int32_t *positions;        /* (T) device: each local token's position in its sequence */
  mp_bf16 *wpe_local;        /* (T, C) the position table's rows of this rank's tokens */
  float *dwpe_local;         /* (T, C) their gradient, added into the table's rows */
  float *cp_send, *cp_recv;  /* (B T, QKVl) and (cp, B T, QKVl) fp32: the exchange's */
  mp_bf16 *out_full, *dout_full; /* cuBLAS attention: (B, Tseq, Cl) the whole sequence's
                                    attention output and its gradient (non-zero at this rank's
                                    tokens only); NULL with the fused attention */
  /* Mixture of experts (moe.experts > 0), else NULL: */
  void *moe_workspace_device;          /* mp_moe_workspace_cuda_bytes: the backward's scratch */
  mp_moe_workspace_cuda moe_workspace; /* carved out of it */
  double *moe_stats_scratch;           /* (E + 1) the router statistics' device reduction */
  size_t moe_cache_bytes;              /* mp_moe_cache_cuda_bytes of the stage's shape */
  void **moe_spare;                    /* released caches' device blocks, reused by the next
                                          forwards (no cudaMalloc / cudaFree per layer and
                                          micro-batch): at most the most ever held at once */
  int moe_spare_count, moe_spare_capacity;
} cuda_kernels;

static mp_status cuda_alloc(void *context, size_t bytes, void **out, mp_error *err) {
  (void)context;
  MP_TRY(mp_device_alloc(out, bytes > 0 ? bytes : 1, err));
  /* The chain's buffers start at zero, as on the CPU (device memory holds garbage). */
  return mp_device_memset(*out, 0, bytes > 0 ? bytes : 1, err);
}

static void cuda_release(void *context, void *memory) {
  (void)context;
  mp_device_free(memory);
}

static mp_status cuda_zero(void *context, void *memory, size_t bytes, mp_error *err) {
  (void)context;
  return mp_device_memset(memory, 0, bytes, err);
}

static mp_status cuda_copy(void *context, void *dst, const void *src, size_t bytes,
                           mp_error *err) {
  (void)context;
  return mp_device_copy_on_device(dst, src, bytes, err);
}

static mp_status cuda_tokens_in(void *context, int32_t *dst, const int32_t *host, size_t count,
                                mp_error *err) {
  (void)context;
  return mp_device_copy_to_device(dst, host, count * sizeof(int32_t), err);
}

/* A stage boundary fp32 -> bf16 (the one rounding a one-GPU model makes there too), and back
 * exactly. */
static void cuda_from_boundary(void *context, void *act, const float *boundary, size_t n) {
  (void)context;
  mp_bf16_from_float_cuda(act, boundary, n, NULL);
}

static void cuda_to_boundary(void *context, float *boundary, const void *act, size_t n) {
  (void)context;
  mp_float_from_bf16_cuda(boundary, act, n, NULL);
}

static void cuda_layernorm_forward(void *context, void *out, float *mean, float *rstd,
                                   const void *inp, const void *weight, const void *bias,
                                   int rows, int C) {
  (void)context;
  mp_layernorm_forward_cuda(out, mean, rstd, inp, weight, bias, 1, rows, C, NULL);
}

static void cuda_layernorm_backward(void *context, void *dinp, float *dweight, float *dbias,
                                    const void *dout, const void *inp, const void *weight,
                                    const float *mean, const float *rstd, int rows, int C) {
  const cuda_kernels *k = context;
  mp_layernorm_backward_cuda(dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                             k->layernorm_scratch, 1, rows, C, NULL);
}

static void cuda_rmsnorm_forward(void *context, void *out, float *rstd, const void *inp,
                                 const void *weight, int rows, int C) {
  const cuda_kernels *k = context;
  mp_rmsnorm_forward_cuda(out, rstd, inp, weight, rows, C, k->d.norm_eps, NULL);
}

static void cuda_rmsnorm_backward(void *context, void *dinp, float *dweight, const void *dout,
                                  const void *inp, const void *weight, const float *rstd,
                                  int rows, int C) {
  const cuda_kernels *k = context;
  mp_rmsnorm_backward_cuda(dinp, dweight, dout, inp, weight, rstd, k->rmsnorm_scratch, rows, C,
                           NULL);
}

static void cuda_swiglu_forward(void *context, void *out, const void *inp, int rows, int F) {
  (void)context;
  mp_swiglu_forward_cuda(out, inp, rows, F, NULL);
}

static void cuda_swiglu_backward(void *context, void *dinp, const void *inp, const void *dout,
                                 int rows, int F) {
  (void)context;
  mp_swiglu_backward_cuda(dinp, inp, dout, rows, F, NULL);
}

/* q and k are the first NHl + KVHl heads of a qkv row; with context parallelism each token
 * turns by its global position. */
static void cuda_rope_forward(void *context, void *qkv) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  mp_rope_forward_at_cuda(qkv, k->inv_freq, k->positions, d->B, d->T, d->NHl + d->KVHl, d->HS,
                          (size_t)d->QKVl, NULL);
}

static void cuda_rope_backward(void *context, void *dqkv) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  mp_rope_backward_at_cuda(dqkv, k->inv_freq, k->positions, d->B, d->T, d->NHl + d->KVHl, d->HS,
                           (size_t)d->QKVl, NULL);
}

static void cuda_matmul_forward(void *context, void *out, const void *inp, const void *weight,
                                const void *bias, int BT, int C, int OC) {
  const cuda_kernels *k = context;
  mp_matmul_forward_cuda(k->cublas, out, inp, weight, bias, BT, C, OC, NULL);
}

static void cuda_matmul_backward(void *context, void *dinp, float *dweight, float *dbias,
                                 const void *dout, const void *inp, const void *weight, int BT,
                                 int C, int OC) {
  const cuda_kernels *k = context;
  mp_matmul_backward_cuda(k->cublas, dinp, dweight, dbias, dout, inp, weight, k->matmul_scratch,
                          BT, C, OC, NULL);
}

/* saved: the fused attention's row statistics lse (B, NHl, T) fp32, or cuBLAS attention's
 * probabilities (B, NHl, T, T) bf16. */
static void cuda_attention_forward(void *context, void *out, void *saved, const void *qkv) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (k->fused_attention) {
    mp_flash_attention_forward_cuda(out, saved, qkv, d->B, d->T, d->NHl, d->KVHl, d->HS, NULL);
  } else {
    mp_attention_forward_cuda(k->cublas, out, saved, qkv, k->attention_scratch, d->B, d->T,
                              d->NHl, d->KVHl, d->HS, NULL);
  }
}

static void cuda_attention_backward(void *context, void *dqkv, const void *dout, const void *qkv,
                                    const void *out, const void *saved) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (k->fused_attention) {
    mp_flash_attention_backward_cuda(dqkv, dout, qkv, out, saved, k->attention_scratch, d->B,
                                     d->T, d->NHl, d->KVHl, d->HS, NULL);
  } else {
    mp_attention_backward_cuda(k->cublas, dqkv, dout, qkv, saved, k->attention_scratch, d->B,
                               d->T, d->NHl, d->KVHl, d->HS, NULL);
  }
}

/* ---- context parallelism ---- */

/* The first global position of chunk j (0 or 1) of cp rank r: the rank's local tokens
 * [j c, (j + 1) c) of every sequence, c = T / 2, sit at positions [that, that + c). */
static int64_t chunk_position(const mp_stage_dims *d, int r, int j) {
  return mp_cp_position(d->Tseq, d->cp, r, (int64_t)j * (d->T / 2));
}

/* Between cp rank r's local rows (B T rows of `width` elements, bf16) and their rows of the
 * whole sequence's (B Tseq rows): two contiguous runs per sequence. */
static mp_status copy_rank_rows(const cuda_kernels *k, int r, mp_bf16 *full, mp_bf16 *local,
                                size_t width, bool to_full, mp_error *err) {
  const mp_stage_dims *d = &k->d;
  const size_t c = (size_t)d->T / 2, bytes = c * width * sizeof(mp_bf16);
  for (int b = 0; b < d->B; ++b) {
    for (int j = 0; j < 2; ++j) {
      mp_bf16 *whole =
          full + ((size_t)b * (size_t)d->Tseq + (size_t)chunk_position(d, r, j)) * width;
      mp_bf16 *mine = local + ((size_t)b * (size_t)d->T + (size_t)j * c) * width;
      MP_TRY(to_full ? mp_device_copy_on_device(whole, mine, bytes, err)
                     : mp_device_copy_on_device(mine, whole, bytes, err));
    }
  }
  return MP_OK;
}

/* kv_full (B, Tseq, QKVl): every cp rank's qkv rows at their positions, through fp32. */
static mp_status cuda_cp_gather_kv(void *context, void *kv_full, const void *qkv,
                                   mp_error *err) {
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  const size_t width = (size_t)d->QKVl, c = (size_t)d->T / 2;
  const size_t per_rank = (size_t)d->BT * width;
  mp_float_from_bf16_cuda(k->cp_send, qkv, per_rank, NULL);
  MP_TRY(mp_tp_all_gather(&d->cp_comm, k->cp_send, k->cp_recv, per_rank, err));
  for (int r = 0; r < d->cp; ++r) {
    for (int b = 0; b < d->B; ++b) {
      for (int j = 0; j < 2; ++j) {
        const size_t row = (size_t)b * (size_t)d->Tseq + (size_t)chunk_position(d, r, j);
        const size_t local = (size_t)b * (size_t)d->T + (size_t)j * c;
        mp_bf16_from_float_cuda((mp_bf16 *)kv_full + row * width,
                                k->cp_recv + (size_t)r * per_rank + local * width, c * width,
                                NULL);
      }
    }
  }
  return MP_OK;
}

/* Chunk j's window: its c = T / 2 queries at their global positions, into local rows j c on. */
static mp_attention_window chunk_window(const mp_stage_dims *d, int j) {
  const int c = d->T / 2;
  const mp_attention_window w = {(int)chunk_position(d, d->cp_rank, j), c, d->T, j * c};
  return w;
}

/* saved: this rank's tokens' lse (B, NHl, T) with the fused attention, or cuBLAS attention's
 * whole-sequence probabilities (B, NHl, Tseq, Tseq). */
static mp_status cuda_cp_attention_forward(void *context, void *out, void *saved,
                                           const void *qkv, const void *kv_full, mp_error *err) {
  (void)qkv;
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (k->fused_attention) {
    for (int j = 0; j < 2; ++j) {
      mp_flash_attention_forward_window_cuda(out, saved, kv_full, d->B, d->Tseq, d->NHl, d->KVHl,
                                             d->HS, chunk_window(d, j), NULL);
    }
    return MP_OK;
  }
  mp_attention_forward_cuda(k->cublas, k->out_full, saved, kv_full, k->attention_scratch, d->B,
                            d->Tseq, d->NHl, d->KVHl, d->HS, NULL);
  return copy_rank_rows(k, d->cp_rank, k->out_full, out, (size_t)d->Cl, false, err);
}

/* dkv_full (B, Tseq, QKVl), zeroed by the chain, += the gradient from this rank's queries: its
 * two windows with the fused attention, else the whole-sequence backward with this rank's output
 * gradients at its tokens and zeros elsewhere. */
static mp_status cuda_cp_attention_backward(void *context, void *dqkv, void *dkv_full,
                                            const void *dout, const void *qkv,
                                            const void *kv_full, const void *out,
                                            const void *saved, mp_error *err) {
  (void)dqkv, (void)qkv;
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (k->fused_attention) {
    for (int j = 0; j < 2; ++j) {
      mp_flash_attention_backward_window_cuda(dkv_full, dout, kv_full, out, saved,
                                              k->attention_scratch, d->B, d->Tseq, d->NHl,
                                              d->KVHl, d->HS, chunk_window(d, j), NULL);
    }
    return MP_OK;
  }
  const size_t full_bytes = (size_t)d->B * (size_t)d->Tseq * (size_t)d->Cl * sizeof(mp_bf16);
  MP_TRY(mp_device_memset(k->out_full, 0, full_bytes, err));
  MP_TRY(mp_device_memset(k->dout_full, 0, full_bytes, err));
  MP_TRY(copy_rank_rows(k, d->cp_rank, k->out_full, (mp_bf16 *)out, (size_t)d->Cl, true, err));
  MP_TRY(copy_rank_rows(k, d->cp_rank, k->dout_full, (mp_bf16 *)dout, (size_t)d->Cl, true, err));
  mp_attention_backward_cuda(k->cublas, dkv_full, k->dout_full, kv_full, saved,
                             k->attention_scratch, d->B, d->Tseq, d->NHl, d->KVHl, d->HS, NULL);
  return MP_OK;
}

/* dqkv (B T, QKVl) = the group's sum of every rank's dkv_full rows at this rank's tokens. */
static mp_status cuda_cp_reduce_scatter_kv(void *context, void *dqkv, const void *dkv_full,
                                           mp_error *err) {
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  const size_t width = (size_t)d->QKVl, c = (size_t)d->T / 2;
  const size_t per_rank = (size_t)d->BT * width;
  for (int r = 0; r < d->cp; ++r) {
    for (int b = 0; b < d->B; ++b) {
      for (int j = 0; j < 2; ++j) {
        const size_t row = (size_t)b * (size_t)d->Tseq + (size_t)chunk_position(d, r, j);
        const size_t local = (size_t)b * (size_t)d->T + (size_t)j * c;
        mp_float_from_bf16_cuda(k->cp_recv + (size_t)r * per_rank + local * width,
                                (const mp_bf16 *)dkv_full + row * width, c * width, NULL);
      }
    }
  }
  MP_TRY(mp_tp_reduce_scatter_sum(&d->cp_comm, k->cp_recv, k->cp_send, per_rank, err));
  mp_bf16_from_float_cuda(dqkv, k->cp_send, per_rank, NULL);
  return MP_OK;
}

static void cuda_gelu_forward(void *context, void *out, const void *inp, size_t n) {
  (void)context;
  mp_gelu_forward_cuda(out, inp, n, NULL);
}

static void cuda_gelu_backward(void *context, void *dinp, const void *inp, const void *dout,
                               size_t n) {
  (void)context;
  mp_gelu_backward_cuda(dinp, inp, dout, n, NULL);
}

static void cuda_residual_forward(void *context, void *out, const void *a, const void *b,
                                  size_t n) {
  (void)context;
  mp_residual_forward_cuda(out, a, b, n, NULL);
}

/* x (rows, cols) bf16, each rank's partial sum: summed over the group in fp32 (the reduce
 * buffer), the bias added, rounded once. */
static mp_status sum_over_group(cuda_kernels *k, mp_bf16 *x, const mp_bf16 *bias, int rows,
                                int cols, mp_error *err) {
  const size_t n = (size_t)rows * (size_t)cols;
  mp_float_from_bf16_cuda(k->reduce, x, n, NULL);
  MP_TRY(mp_tp_all_reduce_sum(&k->d.tp, k->reduce, n, err));
  mp_bf16_from_float_bias_cuda(x, k->reduce, bias, rows, cols, NULL);
  return MP_OK;
}

/* Megatron's gather_from_sequence_parallel_region through fp32 (exact both ways). */
static mp_status cuda_gather_sequence(void *context, void *full, const void *slice,
                                      mp_error *err) {
  cuda_kernels *k = context;
  const size_t n_local = (size_t)k->d.BTl * (size_t)k->d.C;
  mp_float_from_bf16_cuda(k->slice, slice, n_local, NULL);
  MP_TRY(mp_tp_all_gather(&k->d.tp, k->slice, k->reduce, n_local, err));
  mp_bf16_from_float_cuda(full, k->reduce, n_local * (size_t)k->d.tp.size, NULL);
  return MP_OK;
}

/* reduce_scatter_to_sequence_parallel_region: slice (BTl, C) = this rank's rows of partial
 * (BT, C) summed over the group in fp32, + bias (or NULL), rounded once. slice may be partial's
 * first rows (partial is widened whole before slice is written). */
static mp_status scatter_sequence(cuda_kernels *k, mp_bf16 *slice, const mp_bf16 *partial,
                                  const mp_bf16 *bias, mp_error *err) {
  const size_t n_local = (size_t)k->d.BTl * (size_t)k->d.C;
  mp_float_from_bf16_cuda(k->reduce, partial, n_local * (size_t)k->d.tp.size, NULL);
  MP_TRY(mp_tp_reduce_scatter_sum(&k->d.tp, k->reduce, k->slice, n_local, err));
  mp_bf16_from_float_bias_cuda(slice, k->slice, bias, k->d.BTl, k->d.C, NULL);
  return MP_OK;
}

/* Megatron's RowParallelLinear; at tp = 1 the one-GPU model's call (the bias in the epilogue). */
static mp_status cuda_row_parallel_linear_forward(void *context, void *out, const void *inp,
                                                  const void *weight, const void *bias, int Cl,
                                                  int OC, mp_error *err) {
  cuda_kernels *k = context;
  const int BT = k->d.BT;
  if (k->d.tp.size == 1) {
    mp_matmul_forward_cuda(k->cublas, out, inp, weight, bias, BT, Cl, OC, NULL);
    return MP_OK;
  }
  mp_matmul_forward_cuda(k->cublas, out, inp, weight, NULL, BT, Cl, OC, NULL);
  if (k->d.sp) return scatter_sequence(k, out, out, bias, err);
  return sum_over_group(k, out, bias, BT, OC, err);
}

static mp_status cuda_column_parallel_input_grad(void *context, void *dinp, mp_error *err) {
  cuda_kernels *k = context;
  if (k->d.tp.size == 1) return MP_OK;
  if (k->d.sp) return scatter_sequence(k, dinp, dinp, NULL, err);
  return sum_over_group(k, dinp, NULL, k->d.BT, k->d.C, err);
}

static mp_status cuda_embedding_forward(void *context, void *out, const int32_t *tokens,
                                        const int32_t *tokens_host, const void *wte,
                                        const void *wpe, void *work, mp_error *err) {
  (void)tokens_host, (void)work;
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (d->cp > 1 && wpe != NULL) {
    /* The table's rows of this rank's tokens (two runs), so that local token t reads row t. */
    const size_t c = (size_t)d->T / 2, bytes = c * (size_t)d->C * sizeof(mp_bf16);
    for (int j = 0; j < 2; ++j) {
      MP_TRY(mp_device_copy_on_device(
          k->wpe_local + (size_t)j * c * d->C,
          (const mp_bf16 *)wpe + (size_t)chunk_position(d, d->cp_rank, j) * d->C, bytes, err));
    }
    wpe = k->wpe_local;
  }
  if (d->tp.size == 1 && wpe != NULL) {
    mp_embedding_forward_cuda(out, tokens, wte, wpe, d->B, d->T, d->C, NULL);
    return MP_OK;
  }
  /* Megatron's VocabParallelEmbedding: each rank looks up the tokens of its vocabulary rows,
   * zeros elsewhere; the sum over the group is the whole lookup. Without a position table
   * (rotary embeddings) the lookup is the output: exact through fp32, at any tp. */
  mp_vocab_embedding_lookup_cuda(k->reduce, tokens, wte, d->vocab_start, d->Vl, d->BT, d->C,
                                 NULL);
  if (d->sp) {
    /* Summed onto this rank's token slice only, with the positions of its rows. */
    MP_TRY(mp_tp_reduce_scatter_sum(&d->tp, k->reduce, k->slice, (size_t)d->BTl * d->C, err));
    if (wpe == NULL) {
      mp_bf16_from_float_cuda(out, k->slice, (size_t)d->BTl * d->C, NULL);
    } else {
      mp_add_position_rows_cuda(out, k->slice, wpe, d->row0, d->BTl, d->T, d->C, NULL);
    }
    return MP_OK;
  }
  if (d->tp.size > 1) {
    MP_TRY(mp_tp_all_reduce_sum(&d->tp, k->reduce, (size_t)d->BT * d->C, err));
  }
  if (wpe == NULL) {
    mp_bf16_from_float_cuda(out, k->reduce, (size_t)d->BT * d->C, NULL);
  } else {
    mp_add_position_cuda(out, k->reduce, wpe, d->B, d->T, d->C, NULL);
  }
  return MP_OK;
}

static mp_status embedding_backward_rows(cuda_kernels *k, float *dwte, float *dwpe,
                                         const void *dout, const int32_t *tokens,
                                         const int32_t *tokens_host, void *work, mp_error *err);

static mp_status cuda_embedding_backward(void *context, float *dwte, float *dwpe,
                                         const void *dout, const int32_t *tokens,
                                         const int32_t *tokens_host, void *work, mp_error *err) {
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  float *table_grad = NULL; /* context parallelism: where dwpe_local's rows go */
  if (d->cp > 1 && dwpe != NULL) {
    table_grad = dwpe;
    dwpe = k->dwpe_local;
    MP_TRY(mp_device_memset(dwpe, 0, (size_t)d->T * d->C * sizeof(float), err));
  }
  /* Without a position table the kernel's position gradient goes to a buffer nobody reads. */
  if (dwpe == NULL) dwpe = k->dwpe_unused;
  MP_TRY(embedding_backward_rows(k, dwte, dwpe, dout, tokens, tokens_host, work, err));
  if (table_grad != NULL) {
    const size_t c = (size_t)d->T / 2;
    for (int j = 0; j < 2; ++j) {
      mp_add_f32_cuda(table_grad + (size_t)chunk_position(d, d->cp_rank, j) * d->C,
                      dwpe + (size_t)j * c * d->C, c * (size_t)d->C, NULL);
    }
  }
  return MP_OK;
}

/* The embedding backward into dwte and dwpe (rows of this rank's local tokens). */
static mp_status embedding_backward_rows(cuda_kernels *k, float *dwte, float *dwpe,
                                         const void *dout, const int32_t *tokens,
                                         const int32_t *tokens_host, void *work, mp_error *err) {
  const mp_stage_dims *d = &k->d;
  if (d->tp.size == 1) {
    mp_embedding_backward_cuda(dwte, dwpe, dout, tokens, tokens_host, k->embedding_workspace,
                               d->B, d->T, d->C, NULL);
    return MP_OK;
  }
  /* The one-GPU kernel on rows of this rank's shard: a token of another rank's range goes to an
   * extra row that is then dropped. wpe is replicated: every rank adds the whole gradient (with
   * sequence parallelism, of every rank's token slice, all-gathered into work). */
  if (d->sp) {
    MP_TRY(cuda_gather_sequence(k, work, dout, err));
    dout = work;
  }
  for (int i = 0; i < d->BT; ++i) {
    const int row = tokens_host[i] - d->vocab_start;
    k->shard_tokens_host[i] = row >= 0 && row < d->Vl ? row : d->Vl;
  }
  MP_TRY(mp_device_copy_to_device(k->shard_tokens, k->shard_tokens_host,
                                  (size_t)d->BT * sizeof(int32_t), err));
  const size_t rows_floats = ((size_t)d->Vl + 1) * (size_t)d->C;
  MP_TRY(mp_device_memset(k->dwte_rows, 0, rows_floats * sizeof(float), err));
  mp_embedding_backward_cuda(k->dwte_rows, dwpe, dout, k->shard_tokens, k->shard_tokens_host,
                             k->embedding_workspace, d->B, d->T, d->C, NULL);
  mp_add_f32_cuda(dwte, k->dwte_rows, (size_t)d->Vl * (size_t)d->C, NULL);
  return MP_OK;
}

/* The LM head's loss: fused in one kernel on one rank; over the group, Megatron's
 * vocabulary-parallel cross-entropy (row maxima, then sums of exponentials and target logits,
 * each combined over the group). Leaves dlogits in logits. */
static mp_status cuda_loss(void *context, void *logits, const int32_t *targets, float dloss,
                           double *mean_loss, mp_error *err) {
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  const int BT = d->BT;
  if (d->tp.size == 1) {
    mp_cross_entropy_fused_cuda(k->losses, logits, targets, dloss, d->B, d->T, d->V, d->Vp, NULL);
  } else {
    mp_vocab_ce_max_cuda(k->row_max, logits, BT, d->Vl, d->vocab_start, d->V, NULL);
    MP_TRY(mp_tp_all_gather(&d->tp, k->row_max, k->gathered_max, (size_t)BT, err));
    mp_max_over_ranks_cuda(k->row_max, k->gathered_max, d->tp.size, BT, NULL);
    mp_vocab_ce_partials_cuda(k->ce_stats, logits, targets, k->row_max, BT, d->Vl, d->vocab_start,
                              d->V, NULL);
    MP_TRY(mp_tp_all_reduce_sum(&d->tp, k->ce_stats, 2 * (size_t)BT, err));
    mp_vocab_ce_finish_cuda(k->losses, logits, targets, k->row_max, k->ce_stats, dloss, BT, d->Vl,
                            d->vocab_start, d->V, NULL);
  }
  if (mean_loss == NULL) return MP_OK;
  MP_TRY(mp_cublas_check(k->cublas, err));
  MP_TRY(mp_device_copy_to_host(k->losses_host, k->losses, (size_t)BT * sizeof(float), err));
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += k->losses_host[i];
  *mean_loss = sum / (double)BT;
  return MP_OK;
}

/* ---- mixture of experts ---- */

/* What a mixture-of-experts forward keeps for its backward (a block's moe_saved): the cache's
 * arrays, carved out of one device allocation, and the experts' row offsets on the host. With
 * expert parallelism also the exchange's plan and the rows this rank's experts received. */
typedef struct {
  mp_moe_cache_cuda cache;
  void *device;     /* mp_moe_cache_cuda_bytes(shape) */
  int *offset_host; /* (E + 1) */
  /* ep > 1 only (zero otherwise): */
  mp_ep_plan plan;               /* counts and row order (expert_parallel/ep_plan.h) */
  void *rows_device;             /* R (C + 2F + F) bf16: rows.in, rows.fc1, rows.act */
  mp_moe_expert_rows_cuda rows;  /* the received rows by local expert (out: NULL, gone back) */
} cuda_moe_saved;

/* The saved state's device block goes back to the spares (freed when they cannot grow). */
static void cuda_moe_release(void *context, void *saved) {
  cuda_kernels *k = context;
  cuda_moe_saved *s = saved;
  if (s == NULL) return;
  if (s->device != NULL && k->moe_spare_count == k->moe_spare_capacity) {
    const int capacity = k->moe_spare_capacity > 0 ? 2 * k->moe_spare_capacity : 8;
    void **grown = realloc(k->moe_spare, (size_t)capacity * sizeof *grown);
    if (grown != NULL) {
      k->moe_spare = grown;
      k->moe_spare_capacity = capacity;
    }
  }
  if (s->device != NULL && k->moe_spare_count < k->moe_spare_capacity) {
    k->moe_spare[k->moe_spare_count++] = s->device;
  } else {
    mp_device_free(s->device);
  }
  mp_device_free(s->rows_device);
  mp_ep_plan_free(&s->plan);
  free(s->offset_host);
  free(s);
}

/* A device block of moe_cache_bytes for a forward's cache: a spare, else a new one. */
static mp_status moe_cache_block(cuda_kernels *k, void **out, mp_error *err) {
  if (k->moe_spare_count > 0) {
    *out = k->moe_spare[--k->moe_spare_count];
    return MP_OK;
  }
  return mp_device_alloc(out, k->moe_cache_bytes, err);
}

/* The chain passes a block's tensors as mp_moe_params (float * members): on the GPU the weights
 * are the bf16 copy on the device, the gradients fp32 on the device. */
static mp_moe_weights_cuda moe_weights(const mp_moe_params *p) {
  const mp_moe_weights_cuda w = {(const mp_bf16 *)p->router,     (const mp_bf16 *)p->expert_fc1,
                                 (const mp_bf16 *)p->expert_fc2, (const mp_bf16 *)p->shared_fc1,
                                 (const mp_bf16 *)p->shared_fc2, (const mp_bf16 *)p->shared_gate};
  return w;
}

/* bytes rounded up to 256: the next array of a carved block starts where cuBLASLt assumes. */
static size_t aligned_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* Between the received rows (by source rank) and the experts' order on the device: one device
 * copy per (source rank, local expert) run of rows of row_bytes (ep_plan.h's runs). */
static mp_status ep_permute_device(const mp_ep_plan *plan, char *dst, const char *src,
                                   size_t row_bytes, bool to_experts, mp_error *err) {
  for (int source = 0; source < plan->ep; ++source) {
    for (int e = 0; e < plan->local_experts; ++e) {
      int received = 0, expert = 0;
      const int rows = mp_ep_plan_run(plan, source, e, &received, &expert);
      if (rows == 0) continue;
      const size_t to = (size_t)(to_experts ? expert : received) * row_bytes;
      const size_t from = (size_t)(to_experts ? received : expert) * row_bytes;
      MP_TRY(mp_device_copy_on_device(dst + to, src + from, (size_t)rows * row_bytes, err));
    }
  }
  return MP_OK;
}

/* ep_exchange_rows over the device table (NCCL): the rows widened to fp32 on the device, sent
 * GPU to GPU, put in the other order by device copies and rounded back (exactly). */
static mp_status ep_exchange_rows_device(const cuda_kernels *k, const mp_ep_plan *plan,
                                         mp_bf16 *dst, const mp_bf16 *src, bool to_experts,
                                         mp_error *err) {
  const int ep = plan->ep;
  const size_t C = (size_t)k->d.moe.channels, row_bytes = C * sizeof(float);
  size_t sent = 0; /* N K */
  for (int r = 0; r < ep; ++r) sent += plan->send_rows[r];
  const size_t R = (size_t)plan->received;
  const size_t src_rows = to_experts ? sent : R, dst_rows = to_experts ? R : sent;
  size_t *counts = calloc(2 * (size_t)ep, sizeof(size_t)); /* send (ep), then receive (ep) */
  if (counts == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  /* fp32, each 256-byte aligned: out (src_rows, C), in (dst_rows, C), ordered (R, C) */
  const size_t out_bytes = aligned_bytes(src_rows * row_bytes);
  const size_t in_bytes = aligned_bytes(dst_rows * row_bytes);
  void *scratch = NULL;
  mp_status status = mp_device_alloc(&scratch, out_bytes + in_bytes + R * row_bytes + 1, err);
  if (status != MP_OK) {
    free(counts);
    return status;
  }
  char *block = scratch;
  float *out = (float *)block, *in = (float *)(block + out_bytes),
        *ordered = (float *)(block + out_bytes + in_bytes);
  mp_ep_plan_counts(counts, to_experts ? plan->send_rows : plan->recv_rows_from, ep, C);
  mp_ep_plan_counts(counts + ep, to_experts ? plan->recv_rows_from : plan->send_rows, ep, C);
  if (to_experts) {
    mp_float_from_bf16_cuda(out, src, src_rows * C, NULL);
  } else { /* back into the received order (by source rank) first */
    mp_float_from_bf16_cuda(ordered, src, R * C, NULL);
    status = ep_permute_device(plan, (char *)out, (const char *)ordered, row_bytes, false, err);
  }
  if (status == MP_OK) {
    status = mp_ep_all_to_all_v_f32(&k->d.ep_device, out, counts, in, counts + ep, err);
  }
  if (status == MP_OK && to_experts) {
    status = ep_permute_device(plan, (char *)ordered, (const char *)in, row_bytes, true, err);
    if (status == MP_OK && R > 0) {
      mp_bf16_from_float_bias_cuda(dst, ordered, NULL, (int)R, (int)C, NULL);
    }
  } else if (status == MP_OK && sent > 0) {
    mp_bf16_from_float_bias_cuda(dst, in, NULL, (int)sent, (int)C, NULL);
  }
  if (status == MP_OK) status = mp_device_synchronize(err); /* before the scratch goes */
  mp_device_free(scratch);
  free(counts);
  return status;
}

/* Expert parallelism's exchange of rows of C bf16 between device buffers, staged through the
 * host over the ep table (MPI): to_experts, src is this rank's routed rows (N K, C; run r to rank
 * r) and dst the rows its experts received (R, C), by local expert then source rank (the plan's
 * order, expert_parallel/ep_plan.h, as on the CPU); else the reverse, src (R, C) by local expert
 * back into dst (N K, C) in the routed order. The rows travel as fp32 (bf16 widened exactly and
 * rounded back exactly: the bits arrive unchanged). Synchronous (the device copies wait for the
 * enqueued work). With a device table (d.ep_device, NCCL) the same on the device instead. */
static mp_status ep_exchange_rows(const cuda_kernels *k, const mp_ep_plan *plan, mp_bf16 *dst,
                                  const mp_bf16 *src, bool to_experts, mp_error *err) {
  if (k->d.ep_device.size > 1) return ep_exchange_rows_device(k, plan, dst, src, to_experts, err);
  const int ep = plan->ep;
  const size_t C = (size_t)k->d.moe.channels;
  size_t sent = 0; /* N K */
  for (int r = 0; r < ep; ++r) sent += plan->send_rows[r];
  const size_t R = (size_t)plan->received;
  const size_t src_rows = to_experts ? sent : R, dst_rows = to_experts ? R : sent;
  size_t *counts = calloc(2 * (size_t)ep, sizeof(size_t)); /* send (ep), then receive (ep) */
  mp_bf16 *staged = malloc((src_rows > dst_rows ? src_rows : dst_rows) * C * sizeof(mp_bf16) + 1);
  float *wide = malloc(src_rows * C * sizeof(float) + 1);     /* what goes out, fp32 */
  float *arrived = malloc(dst_rows * C * sizeof(float) + 1);  /* what comes in, fp32 */
  float *ordered = malloc(R * C * sizeof(float) + 1);         /* rows in the other order */
  mp_status status = MP_OK;
  if (counts == NULL || staged == NULL || wide == NULL || arrived == NULL || ordered == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "moe: out of host memory staging %zu rows of expert-parallel rank %d",
                     src_rows + dst_rows, k->d.ep.rank);
    goto done;
  }
  const size_t *out_rows = to_experts ? plan->send_rows : plan->recv_rows_from;
  const size_t *in_rows = to_experts ? plan->recv_rows_from : plan->send_rows;
  mp_ep_plan_counts(counts, out_rows, ep, C);
  mp_ep_plan_counts(counts + ep, in_rows, ep, C);
  status = mp_device_copy_to_host(staged, src, src_rows * C * sizeof(mp_bf16), err);
  if (status != MP_OK) goto done;
  if (to_experts) {
    mp_bf16_to_floats(wide, staged, src_rows * C);
  } else { /* back into the received order (by source rank) first */
    mp_bf16_to_floats(ordered, staged, R * C);
    mp_ep_plan_permute(plan, wide, ordered, C * sizeof(float), 0);
  }
  status = mp_ep_all_to_all_v_f32(&k->d.ep, wide, counts, arrived, counts + ep, err);
  if (status != MP_OK) goto done;
  if (to_experts) {
    mp_ep_plan_permute(plan, ordered, arrived, C * sizeof(float), 1);
    mp_bf16_from_floats(staged, ordered, R * C);
  } else {
    mp_bf16_from_floats(staged, arrived, sent * C);
  }
  status = mp_device_copy_to_device(dst, staged, dst_rows * C * sizeof(mp_bf16), err);
done:
  free(counts);
  free(staged);
  free(wide);
  free(arrived);
  free(ordered);
  return status;
}

/* Expert parallelism's forward after the route (expert_parallel/ep_dispatch.h's algorithm on
 * device buffers): the counts and the plan, the rows to their experts, this rank's experts, the
 * outputs back into the cache's routed_out, the combine. */
static mp_status moe_ep_forward(cuda_kernels *k, mp_bf16 *out, const mp_bf16 *x,
                                const mp_moe_weights_cuda *weights, cuda_moe_saved *s,
                                mp_error *err) {
  const mp_moe_shape *shape = &k->d.moe;
  const int E = shape->experts, C = shape->channels, F = shape->expert_ffn;
  if (E % k->d.ep.size != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe: %d experts cannot be split over an expert-parallel group of %d ranks "
                   "(rank %d): the experts must be a multiple of ep",
                   E, k->d.ep.size, k->d.ep.rank);
  }
  MP_TRY(mp_moe_route_cuda(k->cublas, x, weights, &s->cache, NULL, err));
  MP_TRY(mp_ep_plan_exchange(&s->plan, s->cache.expert_offset_host, E, C, 2 * F, &k->d.ep, err));
  const size_t R = (size_t)s->plan.received;
  /* in (R, C), fc1 (R, 2F), act (R, F): each 256-byte aligned, as cuBLASLt assumes. */
  const size_t in_bytes = aligned_bytes(R * (size_t)C * sizeof(mp_bf16));
  const size_t fc1_bytes = aligned_bytes(R * 2 * (size_t)F * sizeof(mp_bf16));
  const size_t act_bytes = aligned_bytes(R * (size_t)F * sizeof(mp_bf16));
  MP_TRY(mp_device_alloc(&s->rows_device, in_bytes + fc1_bytes + act_bytes + 1, err));
  char *block = s->rows_device;
  const mp_moe_expert_rows_cuda rows = {s->plan.local_experts,
                                        s->plan.local_offset,
                                        (mp_bf16 *)block,
                                        (mp_bf16 *)(block + in_bytes),
                                        (mp_bf16 *)(block + in_bytes + fc1_bytes),
                                        NULL,
                                        s->cache.gemm_pointers};
  s->rows = rows;
  MP_TRY(ep_exchange_rows(k, &s->plan, rows.in, s->cache.routed_in, true, err));
  /* The experts' outputs (R, C): a buffer of their own, freed once they have gone back. */
  mp_bf16 *rows_out = NULL;
  MP_TRY(mp_device_alloc((void **)&rows_out, (R * (size_t)C + 1) * sizeof(mp_bf16), err));
  mp_moe_expert_rows_cuda with_out = rows;
  with_out.out = rows_out;
  mp_moe_experts_forward_cuda(k->cublas, weights, shape, &with_out, NULL);
  mp_status status = ep_exchange_rows(k, &s->plan, s->cache.routed_out, rows_out, false, err);
  mp_device_free(rows_out);
  MP_TRY(status);
  mp_moe_combine_cuda(k->cublas, out, x, weights, &s->cache, NULL);
  return MP_OK;
}

/* Expert parallelism's backward (ep_dispatch.h's): the rows' output gradients to the experts,
 * their backward (this rank's experts' weight gradients, summed over every ep rank's rows), the
 * input gradients back, then the route's and the shared MLP's backward as on one device. */
static mp_status moe_ep_backward(cuda_kernels *k, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                                 const mp_bf16 *dout, const mp_bf16 *x,
                                 const mp_moe_weights_cuda *weights, const cuda_moe_saved *s,
                                 const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                                 mp_error *err) {
  const mp_moe_shape *shape = &k->d.moe;
  const size_t R = (size_t)s->plan.received, C = (size_t)shape->channels,
               F = (size_t)shape->expert_ffn;
  mp_moe_workspace_cuda *w = &k->moe_workspace;
  mp_moe_combine_backward_cuda(w->drouted, w->dweights, dout, &s->cache, NULL);
  /* drows_out (R, C), drows_in (R, C), dact (R, F), dfc1 (R, 2F), each 256-byte aligned. */
  const size_t rows_bytes = aligned_bytes(R * C * sizeof(mp_bf16));
  const size_t act_bytes = aligned_bytes(R * F * sizeof(mp_bf16));
  const size_t fc1_bytes = aligned_bytes(R * 2 * F * sizeof(mp_bf16));
  void *scratch = NULL;
  MP_TRY(mp_device_alloc(&scratch, 2 * rows_bytes + act_bytes + fc1_bytes + 1, err));
  char *block = scratch;
  mp_bf16 *drows_out = (mp_bf16 *)block, *drows_in = (mp_bf16 *)(block + rows_bytes),
          *dact = (mp_bf16 *)(block + 2 * rows_bytes),
          *dfc1 = (mp_bf16 *)(block + 2 * rows_bytes + act_bytes);
  mp_status status = ep_exchange_rows(k, &s->plan, drows_out, w->drouted, true, err);
  if (status == MP_OK) status = mp_device_memset(drows_in, 0, R * C * sizeof(mp_bf16), err);
  if (status == MP_OK) {
    mp_moe_experts_backward_cuda(k->cublas, drows_in, grads, drows_out, weights, shape, &s->rows,
                                 dact, dfc1, NULL);
    status = ep_exchange_rows(k, &s->plan, w->drouted_in, drows_in, false, err);
  }
  mp_device_free(scratch);
  MP_TRY(status);
  MP_TRY(mp_moe_route_backward_cuda(k->cublas, dx, grads->router, w->drouted_in, w->dweights, x,
                                    weights->router, &s->cache, stats, aux_coeff, z_coeff, w,
                                    NULL, err));
  mp_moe_shared_backward_cuda(k->cublas, dx, grads, dout, x, weights, &s->cache, w, NULL);
  return MP_OK;
}

/* out (BT, C) from inp (BT, C), both bf16: every token of the micro-batch (moe.tokens = BT).
 * With expert parallelism (d.ep.size > 1, as the CPU table decides) the rows travel to the ep
 * rank holding their experts and back (moe_ep_forward). */
static mp_status cuda_moe_forward(void *context, void *out, void **saved, const void *inp,
                                  const mp_moe_params *params, mp_moe_stats *stats,
                                  mp_error *err) {
  cuda_kernels *k = context;
  const mp_moe_shape *shape = &k->d.moe;
  cuda_moe_release(context, *saved);
  *saved = NULL;
  cuda_moe_saved *s = calloc(1, sizeof *s);
  if (s != NULL) s->offset_host = calloc((size_t)shape->experts + 1, sizeof(int));
  if (s == NULL || s->offset_host == NULL) {
    cuda_moe_release(context, s);
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory for a mixture of experts' offsets");
  }
  mp_status status = moe_cache_block(k, &s->device, err);
  if (status == MP_OK) {
    mp_moe_cache_cuda_carve(&s->cache, shape, s->device, s->offset_host);
    const mp_moe_weights_cuda weights = moe_weights(params);
    status = k->d.ep.size > 1
                 ? moe_ep_forward(k, out, inp, &weights, s, err)
                 : mp_moe_forward_cuda(k->cublas, out, inp, &weights, &s->cache, NULL, err);
  }
  if (status == MP_OK && stats != NULL) {
    status = mp_moe_stats_add_cuda(stats, &s->cache, k->moe_stats_scratch, NULL, err);
  }
  if (status != MP_OK) {
    cuda_moe_release(context, s);
    return status;
  }
  *saved = s;
  return MP_OK;
}

/* dinp (BT, C) bf16 += the layer's input gradient; the fp32 device gradients of grads +=. */
static mp_status cuda_moe_backward(void *context, void *dinp, mp_moe_params *grads,
                                   const void *dout, const void *inp,
                                   const mp_moe_params *params, const void *saved,
                                   const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                                   mp_error *err) {
  cuda_kernels *k = context;
  const cuda_moe_saved *s = saved;
  if (s == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "a mixture of experts' backward without its forward's saved state");
  }
  const mp_moe_weights_cuda weights = moe_weights(params);
  mp_moe_grads_cuda g = {grads->router,     grads->expert_fc1, grads->expert_fc2,
                         grads->shared_fc1, grads->shared_fc2, grads->shared_gate};
  if (k->d.ep.size > 1) {
    return moe_ep_backward(k, dinp, &g, dout, inp, &weights, s, stats, aux_coeff, z_coeff, err);
  }
  return mp_moe_backward_cuda(k->cublas, dinp, &g, dout, inp, &weights, &s->cache, stats,
                              aux_coeff, z_coeff, &k->moe_workspace, NULL, err);
}

/* The enqueued work's errors that no call returned: a failed cuBLAS call, a failed launch (each
 * named where it happened; layers/cuda_launch.h). */
static mp_status cuda_check(void *context, mp_error *err) {
  cuda_kernels *k = context;
  MP_TRY(mp_cublas_check(k->cublas, err));
  return mp_cuda_take_launch_failure(err);
}

static void cuda_kernels_free(cuda_kernels *k) {
  if (k == NULL) return;
  void *buffers[] = {k->reduce, k->slice, k->losses, k->row_max, k->gathered_max, k->ce_stats,
                     k->layernorm_scratch, k->matmul_scratch, k->attention_scratch,
                     k->embedding_workspace, k->dwte_rows, k->shard_tokens,
                     k->rmsnorm_scratch, k->inv_freq, k->dwpe_unused, k->positions,
                     k->wpe_local, k->dwpe_local, k->cp_send, k->cp_recv, k->out_full,
                     k->dout_full, k->moe_workspace_device, k->moe_stats_scratch};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
  for (int i = 0; i < k->moe_spare_count; ++i) mp_device_free(k->moe_spare[i]);
  free(k->moe_spare);
  if (k->cublas != NULL) mp_cublas_free(k->cublas);
  free(k->losses_host);
  free(k->shard_tokens_host);
  free(k);
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static mp_status scratch_alloc(cuda_kernels *k, void **out, size_t bytes, mp_error *err) {
  MP_TRY(mp_device_alloc(out, bytes > 0 ? bytes : 1, err));
  k->device_bytes += bytes;
  return MP_OK;
}

#define SCRATCH(field, count)                                                                  \
  do {                                                                                         \
    if (scratch_alloc(k, (void **)&(field), (size_t)(count) * sizeof(*(field)), err) != MP_OK) \
      goto fail;                                                                               \
  } while (0)

mp_status mp_stage_kernels_gpu_create(const mp_stage_dims *d, mp_stage_kernels **out,
                                      size_t *device_bytes, mp_error *err) {
  *out = NULL;
  *device_bytes = 0;
  if (d->moe.experts > 0 && d->moe.capacity_factor > 0.0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe.capacity_factor %g: the GPU stage routes dropless only (its route "
                   "kernel drops no (token, slot) pair); train it on the CPU backend or remove "
                   "capacity_factor",
                   d->moe.capacity_factor);
  }
  cuda_kernels *k = calloc(1, sizeof *k);
  if (k == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  k->d = *d;
  const size_t BT = (size_t)d->BT, C = (size_t)d->C;
  k->losses_host = calloc(BT, sizeof(float));
  k->shard_tokens_host = calloc(BT, sizeof(int32_t));
  if (k->losses_host == NULL || k->shard_tokens_host == NULL) {
    mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    goto fail;
  }
  if (mp_cublas_create(&k->cublas, err) != MP_OK) goto fail;
  const char *attention_choice = getenv("MPENGINE_ATTENTION");
  k->fused_attention = mp_flash_attention_supported(d->HS) &&
                       !(attention_choice != NULL && strcmp(attention_choice, "cublas") == 0);
  SCRATCH(k->reduce, BT * C);
  if (d->sp) SCRATCH(k->slice, (size_t)d->BTl * C);
  SCRATCH(k->losses, BT);
  SCRATCH(k->row_max, BT);
  SCRATCH(k->gathered_max, BT * (size_t)d->tp.size);
  SCRATCH(k->ce_stats, 2 * BT);
  SCRATCH(k->layernorm_scratch, mp_layernorm_backward_cuda_scratch_floats(d->B, d->T, d->C));
  if (d->rmsnorm) {
    SCRATCH(k->rmsnorm_scratch, mp_rmsnorm_backward_cuda_scratch_floats((int)BT, d->C));
  }
  if (d->rope && d->HS >= 2) {
    float inv_freq[512];
    const size_t half = (size_t)d->HS / 2;
    if (half > sizeof inv_freq / sizeof inv_freq[0]) {
      mp_fail(err, MP_ERR_INPUT, "rotary embeddings: head size %d is above the 1024 supported",
              d->HS);
      goto fail;
    }
    mp_rope_inv_freq(inv_freq, d->HS, &d->rope_spec);
    SCRATCH(k->inv_freq, half);
    if (mp_device_copy_to_device(k->inv_freq, inv_freq, half * sizeof(float), err) != MP_OK) {
      goto fail;
    }
  }
  if (d->embedding && d->rope) SCRATCH(k->dwpe_unused, (size_t)d->T * C);
  const size_t widest =
      max_size((size_t)d->Vl, max_size((size_t)d->FCl, max_size((size_t)d->QKVl, C)));
  SCRATCH(k->matmul_scratch, mp_matmul_backward_cuda_scratch_floats((int)BT, (int)widest));
  /* With context parallelism the fused attention's row statistics are this rank's tokens', the
   * cuBLAS attention's matrices the whole sequence's (the file comment). */
  const int cp = d->cp > 1 ? d->cp : 1, Tseq = d->T * cp;
  const size_t attention_bytes =
      d->num_layers == 0 ? 0
      : k->fused_attention ? mp_flash_attention_scratch_bytes(d->B, d->T, d->NHl, d->HS)
                           : mp_attention_cuda_scratch_bytes(d->B, Tseq, d->NHl, d->HS);
  if (scratch_alloc(k, &k->attention_scratch, attention_bytes, err) != MP_OK) goto fail;
  if (d->embedding) {
    SCRATCH(k->embedding_workspace, mp_embedding_backward_cuda_workspace_ints(d->B, d->T));
    if (d->tp.size > 1) {
      SCRATCH(k->dwte_rows, ((size_t)d->Vl + 1) * C);
      SCRATCH(k->shard_tokens, BT);
    }
  }
  if (cp > 1) {
    int32_t *positions = malloc((size_t)d->T * sizeof(int32_t));
    if (positions == NULL) {
      mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
      goto fail;
    }
    mp_cp_positions(positions, Tseq, cp, d->cp_rank);
    mp_status copied = MP_OK;
    if (scratch_alloc(k, (void **)&k->positions, (size_t)d->T * sizeof(int32_t), err) == MP_OK) {
      copied = mp_device_copy_to_device(k->positions, positions,
                                        (size_t)d->T * sizeof(int32_t), err);
    } else {
      copied = err->status;
    }
    free(positions);
    if (copied != MP_OK) goto fail;
    if (d->embedding && !d->rope) {
      SCRATCH(k->wpe_local, (size_t)d->T * C);
      SCRATCH(k->dwpe_local, (size_t)d->T * C);
    }
    if (d->num_layers > 0) {
      SCRATCH(k->cp_send, BT * (size_t)d->QKVl);
      SCRATCH(k->cp_recv, BT * (size_t)d->QKVl * (size_t)cp);
      if (!k->fused_attention) {
        SCRATCH(k->out_full, (size_t)d->B * (size_t)Tseq * (size_t)d->Cl);
        SCRATCH(k->dout_full, (size_t)d->B * (size_t)Tseq * (size_t)d->Cl);
      }
    }
  }
  if (d->moe.experts > 0 && d->num_layers > 0) {
    const size_t workspace_bytes = mp_moe_workspace_cuda_bytes(&d->moe);
    if (scratch_alloc(k, &k->moe_workspace_device, workspace_bytes, err) != MP_OK) goto fail;
    mp_moe_workspace_cuda_carve(&k->moe_workspace, &d->moe, k->moe_workspace_device);
    SCRATCH(k->moe_stats_scratch, (size_t)d->moe.experts + 1);
    k->moe_cache_bytes = mp_moe_cache_cuda_bytes(&d->moe);
  }
  mp_stage_kernels *t = &k->table;
  t->context = k;
  t->name = "CUDA";
  t->element_bytes = sizeof(mp_bf16);
  t->attention_saved_bytes =
      k->fused_attention ? (size_t)d->B * d->NHl * d->T * sizeof(float)
                         : (size_t)d->B * d->NHl * Tseq * (size_t)Tseq * sizeof(mp_bf16);
  /* The fused attention keeps no T x T matrix anyway; cuBLAS attention keeps its probabilities. */
  t->attention_recomputable = false;
  t->alloc = cuda_alloc;
  t->release = cuda_release;
  t->zero = cuda_zero;
  t->copy = cuda_copy;
  t->tokens_in = cuda_tokens_in;
  t->from_boundary = cuda_from_boundary;
  t->to_boundary = cuda_to_boundary;
  t->layernorm_forward = cuda_layernorm_forward;
  t->layernorm_backward = cuda_layernorm_backward;
  t->rmsnorm_forward = cuda_rmsnorm_forward;
  t->rmsnorm_backward = cuda_rmsnorm_backward;
  t->grouped_attention = true;
  t->swiglu_forward = cuda_swiglu_forward;
  t->swiglu_backward = cuda_swiglu_backward;
  t->rope_forward = cuda_rope_forward;
  t->rope_backward = cuda_rope_backward;
  t->matmul_forward = cuda_matmul_forward;
  t->matmul_backward = cuda_matmul_backward;
  t->attention_forward = cuda_attention_forward;
  t->attention_backward = cuda_attention_backward;
  t->cp_kv_full_bytes =
      cp > 1 ? (size_t)d->B * (size_t)Tseq * (size_t)d->QKVl * sizeof(mp_bf16) : 0;
  t->cp_gather_kv = cuda_cp_gather_kv;
  t->cp_attention_forward = cuda_cp_attention_forward;
  t->cp_attention_backward = cuda_cp_attention_backward;
  t->cp_reduce_scatter_kv = cuda_cp_reduce_scatter_kv;
  t->gelu_forward = cuda_gelu_forward;
  t->gelu_backward = cuda_gelu_backward;
  t->residual_forward = cuda_residual_forward;
  t->row_parallel_linear_forward = cuda_row_parallel_linear_forward;
  t->gather_sequence = cuda_gather_sequence;
  t->column_parallel_input_grad = cuda_column_parallel_input_grad;
  t->embedding_forward = cuda_embedding_forward;
  t->embedding_backward = cuda_embedding_backward;
  t->loss = cuda_loss;
  t->moe_forward = cuda_moe_forward;
  t->moe_backward = cuda_moe_backward;
  t->moe_release = cuda_moe_release;
  t->check = cuda_check;
  *out = &k->table;
  *device_bytes = k->device_bytes;
  return MP_OK;
fail:
  cuda_kernels_free(k);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

void mp_stage_kernels_gpu_free(mp_stage_kernels *kernels) {
  /* The table is the struct's first member. */
  cuda_kernels_free((cuda_kernels *)kernels);
}
