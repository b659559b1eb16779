/*
 * engine/model/stage_gpu.c — a rank's shard of a pipeline stage on a GPU; see stage_gpu.h.
 *
 * The forward and backward are the stage chain's (engine/model/stage_chain.h), run over the CUDA
 * kernel table below: layers/' CUDA twins in bf16, and around the row-parallel GEMMs, the
 * column-parallel input gradients, the embedding lookup and the cross-entropy the collectives of
 * tensor_parallel/ on device buffers. Every collective moves fp32 (bf16 widened exactly, rounded
 * once after a sum). This file owns the device's parameter state: fp32 master weights and
 * gradients, their bf16 copy, the AdamW moments.
 */
#include "engine/model/stage_gpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device/device.h"
#include "engine/model/stage_chain.h"
#include "layers/adamw.h"
#include "layers/attention.h"
#include "layers/cross_entropy.h"
#include "layers/cuda_launch.h"
#include "layers/cuda_types.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
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

/* q and k are the first NHl + KVHl heads of a qkv row. */
static void cuda_rope_forward(void *context, void *qkv) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  mp_rope_forward_cuda(qkv, k->inv_freq, d->B, d->T, d->NHl + d->KVHl, d->HS, (size_t)d->QKVl,
                       NULL);
}

static void cuda_rope_backward(void *context, void *dqkv) {
  const cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  mp_rope_backward_cuda(dqkv, k->inv_freq, d->B, d->T, d->NHl + d->KVHl, d->HS, (size_t)d->QKVl,
                        NULL);
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

static mp_status cuda_embedding_backward(void *context, float *dwte, float *dwpe,
                                         const void *dout, const int32_t *tokens,
                                         const int32_t *tokens_host, void *work, mp_error *err) {
  cuda_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  /* Without a position table the kernel's position gradient goes to a buffer nobody reads. */
  if (dwpe == NULL) dwpe = k->dwpe_unused;
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
                     k->rmsnorm_scratch, k->inv_freq, k->dwpe_unused};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
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

static mp_status cuda_kernels_create(const mp_stage_dims *d, cuda_kernels **out, mp_error *err) {
  *out = NULL;
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
  const size_t attention_bytes =
      d->num_layers == 0 ? 0
      : k->fused_attention ? mp_flash_attention_scratch_bytes(d->B, d->T, d->NHl, d->HS)
                           : mp_attention_cuda_scratch_bytes(d->B, d->T, d->NHl, d->HS);
  if (scratch_alloc(k, &k->attention_scratch, attention_bytes, err) != MP_OK) goto fail;
  if (d->embedding) {
    SCRATCH(k->embedding_workspace, mp_embedding_backward_cuda_workspace_ints(d->B, d->T));
    if (d->tp.size > 1) {
      SCRATCH(k->dwte_rows, ((size_t)d->Vl + 1) * C);
      SCRATCH(k->shard_tokens, BT);
    }
  }
  mp_stage_kernels *t = &k->table;
  t->context = k;
  t->name = "CUDA";
  t->element_bytes = sizeof(mp_bf16);
  t->attention_saved_bytes =
      k->fused_attention ? (size_t)d->B * d->NHl * d->T * sizeof(float)
                         : (size_t)d->B * d->NHl * d->T * (size_t)d->T * sizeof(mp_bf16);
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
  t->gelu_forward = cuda_gelu_forward;
  t->gelu_backward = cuda_gelu_backward;
  t->residual_forward = cuda_residual_forward;
  t->row_parallel_linear_forward = cuda_row_parallel_linear_forward;
  t->gather_sequence = cuda_gather_sequence;
  t->column_parallel_input_grad = cuda_column_parallel_input_grad;
  t->embedding_forward = cuda_embedding_forward;
  t->embedding_backward = cuda_embedding_backward;
  t->loss = cuda_loss;
  t->check = cuda_check;
  *out = k;
  return MP_OK;
fail:
  cuda_kernels_free(k);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

/* ---------------------------------------------------------------------------------------------
 * The stage: its device state and chain
 * ------------------------------------------------------------------------------------------- */

struct mp_stage_gpu {
  mp_stage_cpu *host;
  mp_tp_comm tp;
  size_t num_params, device_bytes;         /* num_params: floats of the shard's flat layout */
  size_t params_floats;                    /* the host's mp_stage_layout_params_floats: num_params,
                                              or with ZeRO-3 the outside tensors and the held
                                              block elements, in the host's order */
  float *master;                           /* (params_floats) */
  float *grads;                            /* (grads_floats): num_params, or windowed the
                                              tensors outside the blocks, packed */
  size_t grads_floats;
  float *adam_m, *adam_v;                  /* (moments_count): elements [moments_first, +count);
                                              NULL until first needed (whole_moments) */
  size_t moments_first, moments_count;     /* all of them, or this dp rank's part with ZeRO */
  bool windowed;                           /* ZeRO-2: block gradients pass through window */
  mp_grad_window window_kind;              /* which ones (mp_grad_window_for) */
  float *window, *window_2;                /* (the largest block's floats each): the blocks'
                                              gradients alternate between the two, so that a
                                              block's reduce-scatter overlaps the next one's
                                              backward (engine/model/stage_chain.h) */
  float *grad_part;                        /* (moments_count) ZeRO-2: the part's gradients,
                                              from mp_stage_gpu_keep_moments */
  size_t grad_part_count;
  mp_bf16 *weights;                        /* (params_floats) */
  mp_bf16 *weights_window, *weights_window_2; /* ZeRO-3: (the largest block's each) the chain's
                                              block weights, gathered before each pass: two,
                                              so that the next pass's gather (a prefetch)
                                              overlaps this one */
  float *norm_scratch;
  cuda_kernels *kernels;
  mp_stage_chain *chain;
};

static mp_status device_alloc(mp_stage_gpu *gpu, void **out, size_t bytes, mp_error *err) {
  MP_TRY(mp_device_alloc(out, bytes > 0 ? bytes : 1, err));
  gpu->device_bytes += bytes;
  return MP_OK;
}

#define ALLOC(field, count)                                                             \
  do {                                                                                  \
    if (device_alloc(gpu, (void **)&(field), (size_t)(count) * sizeof(*(field)), err) != \
        MP_OK) {                                                                        \
      goto fail;                                                                        \
    }                                                                                   \
  } while (0)

void mp_stage_gpu_free(mp_stage_gpu *gpu) {
  if (gpu == NULL) return;
  if (gpu->host != NULL) (void)mp_stage_cpu_set_param_store(gpu->host, NULL, NULL);
  mp_stage_chain_free(gpu->chain);
  cuda_kernels_free(gpu->kernels);
  void *buffers[] = {gpu->master, gpu->grads,     gpu->adam_m,         gpu->adam_v,
                     gpu->weights, gpu->window,    gpu->window_2,       gpu->weights_window,
                     gpu->weights_window_2, gpu->grad_part, gpu->norm_scratch};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
  free(gpu);
}

/* The host stage's store (mp_stage_param_store): the master weights at the host's stored index,
 * their bf16 copy refreshed on a write. Both synchronise with the default stream (cudaMemcpy). */
static mp_status check_stored(const mp_stage_gpu *gpu, size_t at, size_t count,
                               mp_error *err) {
  if (at <= gpu->params_floats && count <= gpu->params_floats - at) return MP_OK;
  return mp_fail(err, MP_ERR_RUNTIME, "stored parameters [%zu, +%zu) of %zu", at, count,
                 gpu->params_floats);
}

static mp_status store_read(void *context, size_t at, size_t count, float *dest, mp_error *err) {
  const mp_stage_gpu *gpu = context;
  MP_TRY(check_stored(gpu, at, count, err));
  return mp_device_copy_to_host(dest, gpu->master + at, count * sizeof(float), err);
}

static mp_status store_write(void *context, size_t at, size_t count, const float *src,
                             mp_error *err) {
  mp_stage_gpu *gpu = context;
  MP_TRY(check_stored(gpu, at, count, err));
  MP_TRY(mp_device_copy_to_device(gpu->master + at, src, count * sizeof(float), err));
  mp_bf16_from_float_cuda(gpu->weights + at, gpu->master + at, count, NULL);
  return MP_OK;
}

mp_status mp_stage_gpu_create(mp_stage_cpu *host, const mp_tp_comm *device_tp, int micro_batch,
                                  int seq_len, int num_slots, bool deferred_weights,
                                  mp_recompute recompute, bool windowed_block_grads,
                                  mp_stage_gpu **out, mp_error *err) {
  *out = NULL;
  /* What the chain cannot run is refused before the GPU is looked for. */
  MP_TRY(mp_stage_chain_check(num_slots, deferred_weights, recompute, err));
  int host_batch = 0, host_seq = 0;
  mp_stage_layout_micro_batch(mp_stage_cpu_layout(host), &host_batch, &host_seq);
  if (micro_batch != host_batch || seq_len != host_seq) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the GPU stage's micro-batch %d x %d tokens is not its host stage's (%d x %d)",
                   micro_batch, seq_len, host_batch, host_seq);
  }
  if (mp_stage_cpu_chain(host) != NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the host stage has activation slots: a GPU stage's host side has none, and "
                   "keeps its parameters on the device");
  }
  const bool sharded = mp_stage_layout_sharded_params(mp_stage_cpu_layout(host));
  if (sharded && (!windowed_block_grads || deferred_weights)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the host stage's block parameters are sharded (ZeRO-3): the GPU stage needs "
                   "windowed block gradients and whole backwards (not a zero-bubble schedule's "
                   "deferred weight gradients)");
  }
  if (mp_device_count() == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)");
  }
  const mp_tp_comm *tp = device_tp != NULL ? device_tp : mp_stage_cpu_comm(host);
  if (tp->size != mp_stage_cpu_comm(host)->size || tp->rank != mp_stage_cpu_comm(host)->rank) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the device tensor-parallel group (rank %d of %d) is not the host stage's "
                   "(rank %d of %d)",
                   tp->rank, tp->size, mp_stage_cpu_comm(host)->rank,
                   mp_stage_cpu_comm(host)->size);
  }
  mp_stage_gpu *gpu = calloc(1, sizeof *gpu);
  if (gpu == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  gpu->host = host;
  gpu->tp = *tp;
  gpu->num_params = mp_stage_layout_num_params(mp_stage_cpu_layout(host));
  gpu->params_floats = mp_stage_layout_params_floats(mp_stage_cpu_layout(host));
  /* What the device holds of the parameters (with ZeRO-3 not the whole flat layout). */
  const size_t P = gpu->params_floats;
  size_t blocks_first = 0, blocks_end = 0, largest_block = 0;
  mp_stage_layout_blocks_range(mp_stage_cpu_layout(host), &blocks_first, &blocks_end,
                               &largest_block);
  gpu->windowed = windowed_block_grads;
  gpu->window_kind = mp_grad_window_for(windowed_block_grads, deferred_weights);
  gpu->grads_floats =
      mp_stage_layout_grad_array_floats(mp_stage_cpu_layout(host), gpu->window_kind);
  ALLOC(gpu->master, P);
  ALLOC(gpu->grads, gpu->grads_floats);
  ALLOC(gpu->weights, P);
  /* The AdamW moments, and ZeRO-2's part gradients, come with the part
   * (mp_stage_gpu_keep_moments) or, without ZeRO, when first needed (whole_moments): a
   * buffer of the whole stage here, even for a moment, could be the allocation that does not
   * fit. */
  if (gpu->windowed) {
    ALLOC(gpu->window, largest_block);
    ALLOC(gpu->window_2, largest_block);
  }
  if (sharded) {
    ALLOC(gpu->weights_window, largest_block);
    ALLOC(gpu->weights_window_2, largest_block);
  }
  {
    /* Parameters and gradients start at zero, as the header says (device memory holds garbage). */
    float *zeroed[] = {gpu->master, gpu->grads};
    const size_t floats[] = {P, gpu->grads_floats};
    for (size_t i = 0; i < sizeof zeroed / sizeof zeroed[0]; ++i) {
      if (mp_device_memset(zeroed[i], 0, floats[i] * sizeof(float), err) != MP_OK) goto fail;
    }
    if (mp_device_memset(gpu->weights, 0, P * sizeof(mp_bf16), err) != MP_OK) goto fail;
  }
  ALLOC(gpu->norm_scratch, mp_grad_norm_cuda_scratch_floats(P));
  const mp_stage_dims dims = mp_stage_chain_dims(mp_stage_cpu_layout(host), &gpu->tp);
  if (cuda_kernels_create(&dims, &gpu->kernels, err) != MP_OK) goto fail;
  const mp_stage_chain_config config = {.layout = mp_stage_cpu_layout(host),
                                        .tp = &gpu->tp,
                                        .weights = gpu->weights,
                                        .grads = gpu->grads,
                                        .num_slots = num_slots,
                                        .deferred_weights = deferred_weights,
                                        .recompute = recompute,
                                        .block_grads_window = gpu->window,
                                        .block_grads_window_2 = gpu->window_2,
                                        .block_weights_window = gpu->weights_window,
                                        .block_weights_window_2 = gpu->weights_window_2};
  if (mp_stage_chain_create(&config, &gpu->kernels->table, &gpu->chain, err) != MP_OK) goto fail;
  gpu->device_bytes += gpu->kernels->device_bytes + mp_stage_chain_bytes(gpu->chain);
  /* The host stage reads and writes its parameters here: no host copy of them exists. */
  const mp_stage_param_store store = {gpu, store_read, store_write};
  if (mp_stage_cpu_set_param_store(host, &store, err) != MP_OK) goto fail;
  *out = gpu;
  return MP_OK;
fail:
  mp_stage_gpu_free(gpu);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

mp_stage_chain *mp_stage_gpu_chain(mp_stage_gpu *gpu) { return gpu->chain; }

size_t mp_stage_gpu_device_bytes(const mp_stage_gpu *gpu) { return gpu->device_bytes; }
float *mp_stage_gpu_device_grads(mp_stage_gpu *gpu) { return gpu->grads; }

/* The whole stage's AdamW moments (zeroed) unless a part was kept (mp_stage_gpu_keep_moments);
 * a windowed stage keeps a part, always. */
static mp_status whole_moments(mp_stage_gpu *gpu, mp_error *err) {
  if (gpu->adam_m != NULL) return MP_OK;
  if (gpu->windowed) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the GPU stage's gradients are windowed (ZeRO-2) but it keeps no part: call "
                   "mp_stage_gpu_keep_moments first");
  }
  return mp_stage_gpu_keep_moments(gpu, 0, gpu->num_params, err);
}

mp_status mp_stage_gpu_keep_moments(mp_stage_gpu *gpu, size_t first, size_t count,
                                        mp_error *err) {
  if (first > gpu->num_params || count > gpu->num_params - first) {
    return mp_fail(err, MP_ERR_INPUT, "moments of elements [%zu, %zu): the stage has %zu", first,
                   first + count, gpu->num_params);
  }
  mp_device_free(gpu->adam_m);
  mp_device_free(gpu->adam_v);
  gpu->adam_m = gpu->adam_v = NULL;
  gpu->device_bytes -= 2 * gpu->moments_count * sizeof(float);
  gpu->moments_first = first;
  gpu->moments_count = count;
  MP_TRY(device_alloc(gpu, (void **)&gpu->adam_m, count * sizeof(float), err));
  MP_TRY(device_alloc(gpu, (void **)&gpu->adam_v, count * sizeof(float), err));
  MP_TRY(mp_device_memset(gpu->adam_m, 0, count * sizeof(float), err));
  MP_TRY(mp_device_memset(gpu->adam_v, 0, count * sizeof(float), err));
  if (!gpu->windowed) return MP_OK;
  /* ZeRO-2: the part's gradients cover the moments' elements. */
  if (gpu->grad_part != NULL) {
    mp_device_free(gpu->grad_part);
    gpu->device_bytes -= gpu->grad_part_count * sizeof(float);
  }
  gpu->grad_part = NULL;
  gpu->grad_part_count = count;
  MP_TRY(device_alloc(gpu, (void **)&gpu->grad_part, count * sizeof(float), err));
  return mp_device_memset(gpu->grad_part, 0, count * sizeof(float), err);
}

float *mp_stage_gpu_device_params(mp_stage_gpu *gpu) { return gpu->master; }

/* Where flat elements [first, first + count) sit in the device's parameter arrays: where the
 * host stage stores them (mp_stage_layout_params_index), which they mirror; false when they are not
 * one stretch there. */
static bool held_offset(const mp_stage_gpu *gpu, size_t first, size_t count, size_t *at) {
  return mp_stage_layout_params_index(mp_stage_cpu_layout(gpu->host), first, count, at);
}

float *mp_stage_gpu_params_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  size_t at = 0;
  return held_offset(gpu, first, count, &at) ? gpu->master + at : NULL;
}

void *mp_stage_gpu_weights_at(mp_stage_gpu *gpu, size_t first, size_t count) {
  size_t at = 0;
  return held_offset(gpu, first, count, &at) ? gpu->weights + at : NULL;
}

void mp_stage_gpu_refresh_weights(mp_stage_gpu *gpu) {
  mp_bf16_from_float_cuda(gpu->weights, gpu->master, gpu->params_floats, NULL);
}

mp_status mp_stage_gpu_moments_at(mp_stage_gpu *gpu, size_t first, size_t count,
                                      float **adam_m, float **adam_v, mp_error *err) {
  MP_TRY(whole_moments(gpu, err));
  if (first < gpu->moments_first || first - gpu->moments_first > gpu->moments_count ||
      count > gpu->moments_count - (first - gpu->moments_first)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moments of elements [%zu, %zu): the GPU stage keeps those of [%zu, %zu)",
                   first, first + count, gpu->moments_first,
                   gpu->moments_first + gpu->moments_count);
  }
  *adam_m = gpu->adam_m + (first - gpu->moments_first);
  *adam_v = gpu->adam_v + (first - gpu->moments_first);
  return MP_OK;
}

static mp_status refuse_windowed(const mp_stage_gpu *gpu, const char *what, mp_error *err) {
  if (!gpu->windowed) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: the GPU stage's block gradients are windowed (ZeRO-2): each dp rank keeps "
                 "its part (mp_stage_gpu_part_squares, mp_stage_gpu_add_to_part)",
                 what);
}

mp_status mp_stage_gpu_download_grads(mp_stage_gpu *gpu, mp_error *err) {
  MP_TRY(refuse_windowed(gpu, "downloading the gradients", err));
  /* The host side has no gradient array until one is downloaded (tests, comparisons). */
  MP_TRY(mp_stage_cpu_alloc_grads(gpu->host, err));
  return mp_device_copy_to_host(mp_stage_cpu_grads(gpu->host), gpu->grads,
                                gpu->num_params * sizeof(float), err);
}

static mp_status need_part(const mp_stage_gpu *gpu, mp_error *err) {
  if (gpu->grad_part != NULL) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "the GPU stage's gradients are windowed (ZeRO-2) but it keeps no part: call "
                 "mp_stage_gpu_keep_moments first");
}

mp_status mp_stage_gpu_zero_grads(mp_stage_gpu *gpu, mp_error *err) {
  MP_TRY(mp_device_memset(gpu->grads, 0, gpu->grads_floats * sizeof(float), err));
  if (!gpu->windowed) return MP_OK;
  MP_TRY(need_part(gpu, err));
  return mp_device_memset(gpu->grad_part, 0, gpu->moments_count * sizeof(float), err);
}

void mp_stage_gpu_scale_grads(mp_stage_gpu *gpu, float scale) {
  if (gpu->windowed && gpu->grad_part != NULL) {
    mp_grad_scale_cuda(gpu->grad_part, gpu->moments_count, scale, NULL);
  } else {
    mp_grad_scale_cuda(gpu->grads, gpu->num_params, scale, NULL);
  }
}

float *mp_stage_gpu_tensor_grad(mp_stage_gpu *gpu, int index) {
  size_t offset = 0;
  return mp_stage_layout_grad_offset(mp_stage_cpu_layout(gpu->host), index, gpu->window_kind,
                                     &offset)
             ? gpu->grads + offset
             : NULL;
}

size_t mp_stage_gpu_grads_floats(const mp_stage_gpu *gpu) { return gpu->grads_floats; }

mp_status mp_stage_gpu_add_to_part(mp_stage_gpu *gpu, const float *sums, size_t first,
                                       size_t count, mp_cuda_stream stream, mp_error *err) {
  MP_TRY(gpu->windowed ? need_part(gpu, err) : MP_OK);
  if (!gpu->windowed || first < gpu->moments_first ||
      first + count > gpu->moments_first + gpu->moments_count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "gradient sums of elements [%zu, %zu) are not in the stage's ZeRO-2 part "
                   "[%zu, %zu)",
                   first, first + count, gpu->moments_first,
                   gpu->moments_first + (gpu->windowed ? gpu->moments_count : 0));
  }
  if (count > 0) {
    mp_add_f32_cuda(gpu->grad_part + (first - gpu->moments_first), sums, count, stream);
  }
  return MP_OK;
}

mp_status mp_stage_gpu_part_squares(mp_stage_gpu *gpu, double *squares, mp_error *err) {
  MP_TRY(gpu->windowed ? need_part(gpu, err)
                       : mp_fail(err, MP_ERR_INPUT, "the GPU stage keeps no ZeRO-2 part"));
  const size_t first = gpu->moments_first, end = first + gpu->moments_count;
  for (int i = 0; i < mp_stage_layout_num_tensors(mp_stage_cpu_layout(gpu->host)); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(mp_stage_cpu_layout(gpu->host), i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    squares[i] = 0.0;
    if (lo >= hi) continue;
    MP_TRY(mp_grad_norm_squared_cuda(gpu->grad_part + (lo - first), hi - lo, gpu->norm_scratch,
                                     &squares[i], NULL, err));
  }
  return MP_OK;
}

mp_status mp_stage_gpu_finish_grads(mp_stage_gpu *gpu, mp_error *err) {
  return mp_stage_chain_finish_grads(gpu->chain, err);
}

mp_status mp_stage_gpu_forward(mp_stage_gpu *gpu, int slot, const int32_t *inputs,
                                   const int32_t *targets, const float *input, float *output,
                                   float dloss, double *loss, mp_error *err) {
  return mp_stage_chain_forward(gpu->chain, slot, inputs, targets, input, output, dloss, loss,
                                err);
}

void mp_stage_gpu_discard(mp_stage_gpu *gpu, int slot) {
  mp_stage_chain_discard(gpu->chain, slot);
}

mp_status mp_stage_gpu_backward(mp_stage_gpu *gpu, int slot, const float *doutput,
                                    float *dinput, bool defer_weights, mp_error *err) {
  return mp_stage_chain_backward(gpu->chain, slot, doutput, dinput, defer_weights, err);
}

mp_status mp_stage_gpu_backward_weights(mp_stage_gpu *gpu, int slot, mp_error *err) {
  return mp_stage_chain_backward_weights(gpu->chain, slot, err);
}

mp_status mp_stage_gpu_grad_norm_squared(mp_stage_gpu *gpu, double *out, mp_error *err) {
  MP_TRY(refuse_windowed(gpu, "the gradient norm", err));
  /* Each reduction waits for the GPU, so neighbouring tensors that count alike (replicated, or
   * sharded; at tp = 1 all of them) are reduced as one run, its sum booked on the run's first
   * tensor: mp_stage_cpu_norm_from_squares only adds them up by kind. */
  const int n = mp_stage_layout_num_tensors(mp_stage_cpu_layout(gpu->host));
  double *squares = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  mp_status status = MP_OK;
  for (int i = 0; i < n && status == MP_OK;) {
    const mp_stage_tensor *first = mp_stage_layout_tensor(mp_stage_cpu_layout(gpu->host), i);
    if (first->tied_copy) {
      ++i;
      continue;
    }
    const bool replicated = first->split == MP_TP_REPLICATED || gpu->tp.size == 1;
    int end = i + 1;
    size_t count = first->count;
    for (; end < n; ++end) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(mp_stage_cpu_layout(gpu->host), end);
      const bool same = t->split == MP_TP_REPLICATED || gpu->tp.size == 1;
      if (t->tied_copy || same != replicated || t->offset != first->offset + count) break;
      count += t->count;
    }
    status = mp_grad_norm_squared_cuda(gpu->grads + first->offset, count, gpu->norm_scratch,
                                       &squares[i], NULL, err);
    i = end;
  }
  if (status == MP_OK) status = mp_stage_cpu_norm_from_squares(gpu->host, squares, out, err);
  free(squares);
  return status;
}

mp_status mp_stage_gpu_adamw(mp_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err) {
  MP_TRY(whole_moments(gpu, err));
  if (gpu->windowed) MP_TRY(need_part(gpu, err));
  /* Tensor by tensor (weight decay is a property of the tensor), over the elements whose
   * moments this rank keeps: all, or its ZeRO part (with ZeRO-2 the part's gradients). */
  const size_t first = gpu->moments_first, end = first + gpu->moments_count;
  for (int i = 0; i < mp_stage_layout_num_tensors(mp_stage_cpu_layout(gpu->host)); ++i) {
    const mp_stage_tensor *t = mp_stage_layout_tensor(mp_stage_cpu_layout(gpu->host), i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    if (lo >= hi) continue;
    const float *grads = gpu->windowed ? gpu->grad_part + (lo - first) : gpu->grads + lo;
    size_t at = 0; /* where the stage keeps them (with ZeRO-3 not at their offsets) */
    if (!held_offset(gpu, lo, hi - lo, &at)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "AdamW on elements [%zu, %zu): the stage does not hold them (ZeRO-3 part)",
                     lo, hi);
    }
    mp_adamw_update_cuda(gpu->master + at, gpu->weights + at, grads,
                         gpu->adam_m + (lo - first), gpu->adam_v + (lo - first), hi - lo,
                         adamw->learning_rate, adamw->beta1, adamw->beta2, adamw->eps,
                         t->full->weight_decay ? adamw->weight_decay : 0.0f, adamw->step, NULL);
  }
  return mp_device_synchronize(err);
}
