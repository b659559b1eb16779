/* engine/model/stage_kernels_cpu.c — the stage chain's kernels on the CPU in fp32: layers/ and
 * tensor_parallel/ behind engine/model/stage_kernels.h. */
#include "engine/model/stage_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "context_parallel/kv_exchange.h"
#include "context_parallel/sequence_split.h"
#include "layers/attention.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "expert_parallel/ep_dispatch.h"
#include "layers/moe.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/row_parallel_linear.h"
#include "tensor_parallel/vocab_parallel_cross_entropy.h"
#include "tensor_parallel/vocab_parallel_embedding.h"

typedef struct {
  mp_stage_kernels table; /* first: the table's context is this struct */
  mp_stage_dims d;
  size_t attention_floats; /* (B, NHl, T, Tseq): the saved probabilities */
  float *slice;            /* (BTl, C) a collective's slice, with sequence parallelism */
  float *dpreatt, *datt;   /* (B, NHl, T, Tseq) the attention backward's scratch */
  int32_t *positions;      /* (T) each local token's position in its sequence; NULL with cp 1 */
  mp_cp_kv_shape kv_shape; /* context parallelism: the key/value exchange's shape */
  float *kv_send, *kv_recv; /* its scratch: (B T, 2 KVHl HS) and cp times that */
  float *ce_work;          /* mp_tp_vocab_cross_entropy_work_floats */
  float *inv_freq;         /* (HS / 2) rotary frequencies, with rope */
} cpu_kernels;

static mp_status cpu_alloc(void *context, size_t bytes, void **out, mp_error *err) {
  (void)context;
  *out = calloc(1, bytes > 0 ? bytes : 1);
  if (*out == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %zu bytes", bytes);
  return MP_OK;
}

static void cpu_release(void *context, void *memory) {
  (void)context;
  free(memory);
}

static mp_status cpu_zero(void *context, void *memory, size_t bytes, mp_error *err) {
  (void)context, (void)err;
  memset(memory, 0, bytes);
  return MP_OK;
}

static mp_status cpu_copy(void *context, void *dst, const void *src, size_t bytes,
                          mp_error *err) {
  (void)context, (void)err;
  memcpy(dst, src, bytes);
  return MP_OK;
}

static mp_status cpu_tokens_in(void *context, int32_t *dst, const int32_t *host, size_t count,
                               mp_error *err) {
  return cpu_copy(context, dst, host, count * sizeof(int32_t), err);
}

static void cpu_from_boundary(void *context, void *act, const float *boundary, size_t n) {
  (void)context;
  memcpy(act, boundary, n * sizeof(float));
}

static void cpu_to_boundary(void *context, float *boundary, const void *act, size_t n) {
  (void)context;
  memcpy(boundary, act, n * sizeof(float));
}

static void cpu_layernorm_forward(void *context, void *out, float *mean, float *rstd,
                                  const void *inp, const void *weight, const void *bias, int rows,
                                  int C) {
  (void)context;
  mp_layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, 1, rows, C);
}

static void cpu_layernorm_backward(void *context, void *dinp, float *dweight, float *dbias,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *mean, const float *rstd, int rows, int C) {
  (void)context;
  mp_layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, 1, rows, C);
}

static void cpu_matmul_forward(void *context, void *out, const void *inp, const void *weight,
                               const void *bias, int BT, int C, int OC) {
  (void)context;
  mp_matmul_forward_cpu(out, inp, weight, bias, BT, C, OC);
}

static void cpu_matmul_backward(void *context, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight, int BT,
                                int C, int OC) {
  (void)context;
  mp_matmul_backward_cpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC);
}

/* saved: the probabilities att (B, NHl, T, T), all the backward reads (the scores before the
 * softmax, which layers/attention.h can also write, are not kept). */
static void cpu_attention_forward(void *context, void *out, void *saved, const void *qkv) {
  const cpu_kernels *k = context;
  mp_attention_forward_cpu(out, NULL, saved, qkv, k->d.B, k->d.T, k->d.NHl, k->d.KVHl, k->d.HS);
}

static void cpu_attention_backward(void *context, void *dqkv, const void *dout, const void *qkv,
                                   const void *out, const void *saved) {
  (void)out;
  const cpu_kernels *k = context;
  const float *att = saved;
  mp_attention_backward_cpu(dqkv, k->dpreatt, k->datt, dout, qkv, att, k->d.B, k->d.T, k->d.NHl,
                            k->d.KVHl, k->d.HS);
}

static mp_status cpu_cp_attention_forward(void *context, void *out, void *saved,
                                          const void *qkv, const void *kv_full, mp_error *err) {
  (void)err;
  const cpu_kernels *k = context;
  mp_attention_forward_at_cpu(out, NULL, saved, qkv, kv_full, k->positions, k->d.B, k->d.T,
                              k->d.Tseq, k->d.NHl, k->d.KVHl, k->d.HS);
  return MP_OK;
}

static mp_status cpu_cp_attention_backward(void *context, void *dqkv, void *dkv_full,
                                           const void *dout, const void *qkv, const void *kv_full,
                                           const void *out, const void *saved, mp_error *err) {
  (void)out, (void)err;
  const cpu_kernels *k = context;
  const float *att = saved;
  mp_attention_backward_at_cpu(dqkv, dkv_full, k->dpreatt, k->datt, dout, qkv, kv_full, att,
                               k->positions, k->d.B, k->d.T, k->d.Tseq, k->d.NHl, k->d.KVHl,
                               k->d.HS);
  return MP_OK;
}

static mp_status cpu_cp_gather_kv(void *context, void *kv_full, const void *qkv, mp_error *err) {
  cpu_kernels *k = context;
  return mp_cp_gather_kv(&k->d.cp_comm, &k->kv_shape, kv_full, qkv, k->kv_send, k->kv_recv, err);
}

static mp_status cpu_cp_reduce_scatter_kv(void *context, void *dqkv, const void *dkv_full,
                                          mp_error *err) {
  cpu_kernels *k = context;
  return mp_cp_reduce_scatter_kv(&k->d.cp_comm, &k->kv_shape, dqkv, dkv_full, k->kv_send,
                                 k->kv_recv, err);
}

static void cpu_rmsnorm_forward(void *context, void *out, float *rstd, const void *inp,
                                const void *weight, int rows, int C) {
  const cpu_kernels *k = context;
  mp_rmsnorm_forward_cpu(out, rstd, inp, weight, rows, C, k->d.norm_eps);
}

static void cpu_rmsnorm_backward(void *context, void *dinp, float *dweight, const void *dout,
                                 const void *inp, const void *weight, const float *rstd, int rows,
                                 int C) {
  (void)context;
  mp_rmsnorm_backward_cpu(dinp, dweight, dout, inp, weight, rstd, rows, C);
}

static void cpu_swiglu_forward(void *context, void *out, const void *inp, int rows, int F) {
  (void)context;
  mp_swiglu_forward_cpu(out, inp, rows, F);
}

static void cpu_swiglu_backward(void *context, void *dinp, const void *inp, const void *dout,
                                int rows, int F) {
  (void)context;
  mp_swiglu_backward_cpu(dinp, inp, dout, rows, F);
}

/* q and k are the first NHl + KVHl heads of a qkv row. */
static void cpu_rope_forward(void *context, void *qkv) {
  const cpu_kernels *k = context;
  mp_rope_forward_at_cpu(qkv, k->inv_freq, k->positions, k->d.B, k->d.T, k->d.NHl + k->d.KVHl,
                         k->d.HS, (size_t)k->d.QKVl);
}

static void cpu_rope_backward(void *context, void *dqkv) {
  const cpu_kernels *k = context;
  mp_rope_backward_at_cpu(dqkv, k->inv_freq, k->positions, k->d.B, k->d.T,
                          k->d.NHl + k->d.KVHl, k->d.HS, (size_t)k->d.QKVl);
}

static void cpu_gelu_forward(void *context, void *out, const void *inp, size_t n) {
  (void)context;
  mp_gelu_forward_cpu(out, inp, n);
}

static void cpu_gelu_backward(void *context, void *dinp, const void *inp, const void *dout,
                              size_t n) {
  (void)context;
  mp_gelu_backward_cpu(dinp, inp, dout, n);
}

static void cpu_residual_forward(void *context, void *out, const void *a, const void *b,
                                 size_t n) {
  (void)context;
  mp_residual_forward_cpu(out, a, b, n);
}

static mp_status cpu_row_parallel_linear_forward(void *context, void *out, const void *inp,
                                                 const void *weight, const void *bias, int Cl,
                                                 int OC, mp_error *err) {
  cpu_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (!d->sp) {
    return mp_tp_row_linear_forward(&d->tp, false, out, inp, weight, bias, NULL, d->BT, Cl, OC,
                                    err);
  }
  /* The partial product in out, reduce-scattered to the slice, which goes back to out's rows. */
  MP_TRY(mp_tp_row_linear_forward(&d->tp, true, k->slice, inp, weight, bias, out, d->BT, Cl, OC,
                                  err));
  memcpy(out, k->slice, (size_t)d->BTl * (size_t)OC * sizeof(float));
  return MP_OK;
}

static mp_status cpu_gather_sequence(void *context, void *full, const void *slice,
                                     mp_error *err) {
  cpu_kernels *k = context;
  const size_t n_local = (size_t)k->d.BTl * (size_t)k->d.C;
  /* The all-gather may not read from its output: the slice goes through a copy. */
  memcpy(k->slice, slice, n_local * sizeof(float));
  return mp_tp_gather_from_sequence_forward(&k->d.tp, k->slice, full, n_local, err);
}

static mp_status cpu_column_parallel_input_grad(void *context, void *dinp, mp_error *err) {
  cpu_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  if (d->tp.size == 1) return MP_OK;
  if (!d->sp) return mp_tp_copy_to_region_backward(&d->tp, dinp, (size_t)d->BT * d->C, err);
  const size_t n_local = (size_t)d->BTl * (size_t)d->C;
  MP_TRY(mp_tp_gather_from_sequence_backward(&d->tp, dinp, k->slice, n_local, err));
  memcpy(dinp, k->slice, n_local * sizeof(float));
  return MP_OK;
}

static mp_status cpu_embedding_forward(void *context, void *out, const int32_t *tokens,
                                       const int32_t *tokens_host, const void *wte,
                                       const void *wpe, void *work, mp_error *err) {
  (void)tokens_host;
  const cpu_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  return mp_tp_vocab_embedding_forward(&d->tp, d->sp, out, tokens, wte, wpe, k->positions,
                                       d->sp ? work : NULL, d->B, d->T, d->C, d->Vp, err);
}

static mp_status cpu_embedding_backward(void *context, float *dwte, float *dwpe, const void *dout,
                                        const int32_t *tokens, const int32_t *tokens_host,
                                        void *work, mp_error *err) {
  (void)tokens_host;
  const cpu_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  return mp_tp_vocab_embedding_backward(&d->tp, d->sp, dwte, dwpe, k->positions, dout,
                                        d->sp ? work : NULL, tokens, d->B, d->T, d->C, d->Vp,
                                        err);
}

static mp_status cpu_loss(void *context, void *logits, const int32_t *targets, float dloss,
                          double *mean_loss, mp_error *err) {
  cpu_kernels *k = context;
  const mp_stage_dims *d = &k->d;
  double ignored = 0.0;
  /* The softmax over the logits in place, then the loss gradient over the probabilities. */
  MP_TRY(mp_tp_vocab_cross_entropy_forward(&d->tp, mean_loss != NULL ? mean_loss : &ignored, NULL,
                                           logits, logits, targets, k->ce_work, d->BT, d->V, d->Vp,
                                           err));
  mp_tp_vocab_cross_entropy_backward_in_place(&d->tp, logits, targets, dloss, d->BT, d->V, d->Vp);
  return MP_OK;
}

/* The mixture-of-experts MLP: layers/moe.h over the micro-batch's BT tokens, or with expert
 * parallelism (d.ep.size > 1) expert_parallel/ep_dispatch.h over the ep group (the weights hold
 * this ep rank's experts); what it keeps is its cache (mp_moe_cache, or mp_moe_ep_cache), on the
 * heap. At ep 1 the one-device layer runs, so results there stay bitwise those of before. */
static void cpu_moe_release(void *context, void *saved) {
  const cpu_kernels *k = context;
  if (saved == NULL) return;
  if (k->d.ep.size > 1) {
    mp_moe_ep_cache_free(saved);
  } else {
    mp_moe_cache_free(saved);
  }
  free(saved);
}

static mp_status cpu_moe_forward(void *context, void *out, void **saved, const void *inp,
                                 const mp_moe_params *params, mp_moe_stats *stats,
                                 mp_error *err) {
  cpu_kernels *k = context;
  cpu_moe_release(context, *saved);
  *saved = NULL;
  if (k->d.ep.size > 1) {
    mp_moe_ep_cache *cache = calloc(1, sizeof *cache);
    if (cache == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    const mp_status status =
        mp_moe_ep_forward_cpu(out, inp, params, &k->d.moe, &k->d.ep, cache, err);
    if (status != MP_OK) {
      cpu_moe_release(context, cache);
      return status;
    }
    if (stats != NULL) mp_moe_stats_add(stats, &cache->tokens);
    *saved = cache;
    return MP_OK;
  }
  mp_moe_cache *cache = calloc(1, sizeof *cache);
  if (cache == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const mp_status status = mp_moe_forward_cpu(out, inp, params, &k->d.moe, cache, err);
  if (status != MP_OK) {
    cpu_moe_release(context, cache);
    return status;
  }
  if (stats != NULL) mp_moe_stats_add(stats, cache);
  *saved = cache;
  return MP_OK;
}

static mp_status cpu_moe_backward(void *context, void *dinp, mp_moe_params *grads,
                                  const void *dout, const void *inp, const mp_moe_params *params,
                                  const void *saved, const mp_moe_stats *stats, double aux_coeff,
                                  double z_coeff, mp_error *err) {
  const cpu_kernels *k = context;
  if (k->d.ep.size > 1) {
    return mp_moe_ep_backward_cpu(dinp, grads, dout, inp, params, &k->d.ep, saved, stats,
                                  aux_coeff, z_coeff, err);
  }
  return mp_moe_backward_cpu(dinp, grads, dout, inp, params, saved, stats, aux_coeff, z_coeff,
                             err);
}

void mp_stage_kernels_cpu_free(mp_stage_kernels *kernels) {
  if (kernels == NULL) return;
  cpu_kernels *k = (cpu_kernels *)kernels;
  free(k->slice);
  free(k->dpreatt);
  free(k->datt);
  free(k->ce_work);
  free(k->inv_freq);
  free(k->positions);
  free(k->kv_send);
  free(k->kv_recv);
  free(k);
}

mp_status mp_stage_kernels_cpu_create(const mp_stage_dims *dims, mp_stage_kernels **out,
                                      mp_error *err) {
  *out = NULL;
  cpu_kernels *k = calloc(1, sizeof *k);
  if (k == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  k->d = *dims;
  const int cp = dims->cp > 1 ? dims->cp : 1;
  const size_t Tseq = (size_t)dims->T * (size_t)cp;
  k->attention_floats = (size_t)dims->B * (size_t)dims->NHl * (size_t)dims->T * Tseq;
  /* Scratch for what the stage runs only: the attention backward's two (B, NHl, T, Tseq)
   * matrices are the largest working memory of a stage with blocks. */
  const size_t slice = dims->sp ? (size_t)dims->BTl * (size_t)dims->C : 1;
  const size_t attention =
      dims->num_layers > 0 && k->attention_floats > 0 ? k->attention_floats : 1;
  const size_t ce = dims->head ? mp_tp_vocab_cross_entropy_work_floats(&dims->tp, dims->BT) : 1;
  k->slice = malloc(slice * sizeof(float));
  k->dpreatt = malloc(attention * sizeof(float));
  k->datt = malloc(attention * sizeof(float));
  k->ce_work = malloc(ce * sizeof(float));
  k->inv_freq = malloc((size_t)(dims->HS / 2 > 0 ? dims->HS / 2 : 1) * sizeof(float));
  if (k->slice == NULL || k->dpreatt == NULL || k->datt == NULL || k->ce_work == NULL ||
      k->inv_freq == NULL) {
    mp_stage_kernels_cpu_free(&k->table);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the stage's scratch");
  }
  if (cp > 1) {
    const size_t kv = (size_t)dims->B * (size_t)dims->T * 2 * (size_t)dims->KVHl * dims->HS;
    k->positions = malloc((size_t)dims->T * sizeof(int32_t));
    k->kv_send = malloc((kv > 0 ? kv : 1) * sizeof(float));
    k->kv_recv = malloc((kv > 0 ? kv : 1) * (size_t)cp * sizeof(float));
    if (k->positions == NULL || k->kv_send == NULL || k->kv_recv == NULL) {
      mp_stage_kernels_cpu_free(&k->table);
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory for the stage's scratch");
    }
    mp_cp_positions(k->positions, (int64_t)Tseq, cp, dims->cp_rank);
    const mp_cp_kv_shape shape = {dims->B, (int)Tseq, dims->NHl * dims->HS,
                                  2 * dims->KVHl * dims->HS};
    k->kv_shape = shape;
  }
  if (dims->rope) mp_rope_inv_freq(k->inv_freq, dims->HS, &dims->rope_spec);
  mp_stage_kernels *t = &k->table;
  t->context = k;
  t->name = "CPU";
  t->element_bytes = sizeof(float);
  t->attention_saved_bytes = k->attention_floats * sizeof(float);
  t->attention_recomputable = true;
  t->alloc = cpu_alloc;
  t->release = cpu_release;
  t->zero = cpu_zero;
  t->copy = cpu_copy;
  t->tokens_in = cpu_tokens_in;
  t->from_boundary = cpu_from_boundary;
  t->to_boundary = cpu_to_boundary;
  t->layernorm_forward = cpu_layernorm_forward;
  t->layernorm_backward = cpu_layernorm_backward;
  t->matmul_forward = cpu_matmul_forward;
  t->matmul_backward = cpu_matmul_backward;
  t->rmsnorm_forward = cpu_rmsnorm_forward;
  t->rmsnorm_backward = cpu_rmsnorm_backward;
  t->grouped_attention = true;
  t->attention_forward = cpu_attention_forward;
  t->attention_backward = cpu_attention_backward;
  t->gelu_forward = cpu_gelu_forward;
  t->gelu_backward = cpu_gelu_backward;
  t->residual_forward = cpu_residual_forward;
  t->swiglu_forward = cpu_swiglu_forward;
  t->swiglu_backward = cpu_swiglu_backward;
  t->rope_forward = cpu_rope_forward;
  t->rope_backward = cpu_rope_backward;
  t->cp_kv_full_bytes = cp > 1 ? (size_t)dims->B * Tseq * 2 * (size_t)dims->KVHl *
                                      (size_t)dims->HS * sizeof(float)
                               : 0;
  t->cp_gather_kv = cpu_cp_gather_kv;
  t->cp_attention_forward = cpu_cp_attention_forward;
  t->cp_attention_backward = cpu_cp_attention_backward;
  t->cp_reduce_scatter_kv = cpu_cp_reduce_scatter_kv;
  t->row_parallel_linear_forward = cpu_row_parallel_linear_forward;
  t->gather_sequence = cpu_gather_sequence;
  t->column_parallel_input_grad = cpu_column_parallel_input_grad;
  t->embedding_forward = cpu_embedding_forward;
  t->embedding_backward = cpu_embedding_backward;
  t->loss = cpu_loss;
  t->moe_forward = cpu_moe_forward;
  t->moe_backward = cpu_moe_backward;
  t->moe_release = cpu_moe_release;
  t->check = NULL;
  *out = t;
  return MP_OK;
}
