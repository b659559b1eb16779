/*
 * engine/gpt_model_gpu.c — the one-rank GPT on a GPU; see gpt_model_gpu.h.
 *
 * Plain C over the CUDA twins' C API (layers/) and engine/device.h: the chain of kernels is the
 * CPU model's, operand for operand. The backward keeps one residual-stream gradient buffer
 * (dresidual): each layernorm backward adds its input gradient into it, which is exactly the
 * residual branches' sum, so no separate residual backward kernels run.
 */
#include "engine/gpt_model_gpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "layers/adamw.h"
#include "layers/attention.h"
#include "layers/cross_entropy.h"
#include "layers/cuda_types.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/matmul.h"
#include "layers/residual.h"

enum { kBlockTensors = 12 };

/* One block's weights in llm.c's per-layer order (the layout's order). */
typedef struct {
  mp_bf16 *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
      *fcprojb;
} block_weights;

typedef struct {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
      *fcprojb;
} block_grads;

/* What one block's forward keeps for its backward. */
typedef struct {
  mp_bf16 *ln1;               /* (B, T, C) */
  float *ln1_mean, *ln1_rstd; /* (B, T) */
  mp_bf16 *qkv;               /* (B, T, 3C) */
  mp_bf16 *atty;              /* (B, T, C) */
  mp_bf16 *att;               /* (B, NH, T, T), cuBLAS attention only */
  float *lse;                 /* (B, NH, T), fused attention only: each query row's log-sum-exp */
  mp_bf16 *residual2;         /* (B, T, C) */
  mp_bf16 *ln2;               /* (B, T, C) */
  float *ln2_mean, *ln2_rstd; /* (B, T) */
  mp_bf16 *fch;               /* (B, T, F) */
  mp_bf16 *fch_gelu;          /* (B, T, F) */
  mp_bf16 *out;               /* (B, T, C) */
} block_acts;

struct mp_gpt_gpu {
  mp_gpt_layout *layout;
  int B, T;
  bool fused_attention; /* flash attention (no T x T matrix) rather than cuBLAS attention */
  size_t device_bytes;
  mp_cublas *cublas;
  /* parameters, (P,) each */
  float *master;
  mp_bf16 *weights;
  float *grads;
  float *adam_m, *adam_v;
  mp_bf16 *wte, *wpe, *lnfw, *lnfb;
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  block_weights *blocks; /* (L,) */
  block_grads *dblocks;  /* (L,) */
  /* activations of one micro-batch */
  int32_t *inputs, *targets; /* (B, T) device */
  int32_t *inputs_host;      /* (B, T) the last forward's inputs, for the embedding backward */
  mp_bf16 *encoded;          /* (B, T, C) */
  block_acts *acts;          /* (L,) */
  mp_bf16 *projection;       /* (B, T, C) attn_proj / fc_proj outputs before their residual */
  mp_bf16 *lnf;              /* (B, T, C) */
  float *lnf_mean, *lnf_rstd;
  mp_bf16 *logits;           /* (B, T, Vp), dlogits after the loss kernel */
  float *losses;             /* (B, T) */
  float *losses_host;        /* (B, T) */
  /* backward working memory */
  mp_bf16 *dresidual;        /* (B, T, C) */
  mp_bf16 *dnorm;            /* (B, T, C) gradient of a layernorm output */
  mp_bf16 *datty;            /* (B, T, C) */
  mp_bf16 *dqkv;             /* (B, T, 3C) */
  mp_bf16 *dfch, *dfch_gelu; /* (B, T, F) */
  float *layernorm_scratch, *matmul_scratch, *norm_scratch;
  void *attention_scratch;
  int32_t *embedding_workspace;
};

/* Allocates bytes on the device into *out, tallying the total. */
static mp_status device_alloc(mp_gpt_gpu *gpt, void **out, size_t bytes, mp_error *err) {
  MP_TRY(mp_device_alloc(out, bytes, err));
  gpt->device_bytes += bytes;
  return MP_OK;
}

#define ALLOC(field, count)                                                             \
  do {                                                                                  \
    if (device_alloc(gpt, (void **)&(field), (size_t)(count) * sizeof(*(field)), err) != \
        MP_OK) {                                                                        \
      goto fail;                                                                        \
    }                                                                                   \
  } while (0)

static void point_weights(const mp_gpt_layout *layout, int layer, mp_bf16 *base,
                          block_weights *w) {
  mp_bf16 **fields[kBlockTensors] = {&w->ln1w, &w->ln1b,     &w->qkvw, &w->qkvb,
                                     &w->attprojw, &w->attprojb, &w->ln2w, &w->ln2b,
                                     &w->fcw,  &w->fcb,      &w->fcprojw, &w->fcprojb};
  for (int k = 0; k < kBlockTensors; ++k) {
    *fields[k] = base + mp_gpt_layout_tensor(layout, 2 + layer * kBlockTensors + k)->offset;
  }
}

static void point_grads(const mp_gpt_layout *layout, int layer, float *base, block_grads *g) {
  float **fields[kBlockTensors] = {&g->ln1w, &g->ln1b,     &g->qkvw, &g->qkvb,
                                   &g->attprojw, &g->attprojb, &g->ln2w, &g->ln2b,
                                   &g->fcw,  &g->fcb,      &g->fcprojw, &g->fcprojb};
  for (int k = 0; k < kBlockTensors; ++k) {
    *fields[k] = base + mp_gpt_layout_tensor(layout, 2 + layer * kBlockTensors + k)->offset;
  }
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

mp_status mp_gpt_gpu_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt_gpu **out,
                            mp_error *err) {
  *out = NULL;
  if (mp_device_count() == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)");
  }
  mp_gpt_gpu *gpt = calloc(1, sizeof *gpt);
  if (gpt == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  mp_status status = mp_gpt_layout_create(model, seq_len, &gpt->layout, err);
  if (status != MP_OK) {
    free(gpt);
    return status;
  }
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const int B = micro_batch, T = seq_len, C = c->channels, NH = c->num_heads;
  const int F = c->ffn_channels, L = c->num_layers, Vp = c->padded_vocab_size;
  const size_t BT = (size_t)B * (size_t)T, P = mp_gpt_layout_num_params(gpt->layout);
  gpt->B = B;
  gpt->T = T;
  gpt->blocks = calloc((size_t)L, sizeof *gpt->blocks);
  gpt->dblocks = calloc((size_t)L, sizeof *gpt->dblocks);
  gpt->acts = calloc((size_t)L, sizeof *gpt->acts);
  gpt->inputs_host = calloc(BT, sizeof(int32_t));
  gpt->losses_host = calloc(BT, sizeof(float));
  if (gpt->blocks == NULL || gpt->dblocks == NULL || gpt->acts == NULL ||
      gpt->inputs_host == NULL || gpt->losses_host == NULL) {
    mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    goto fail;
  }
  if (mp_cublas_create(&gpt->cublas, err) != MP_OK) goto fail;
  /* MPENGINE_ATTENTION=cublas selects the unfused path, to compare the two in benchmarks. */
  const char *attention_choice = getenv("MPENGINE_ATTENTION");
  gpt->fused_attention = mp_flash_attention_supported(C / NH) &&
                         !(attention_choice != NULL && strcmp(attention_choice, "cublas") == 0);

  ALLOC(gpt->master, P);
  ALLOC(gpt->weights, P);
  ALLOC(gpt->grads, P);
  ALLOC(gpt->adam_m, P);
  ALLOC(gpt->adam_v, P);
  {
    /* Parameters and gradients start at zero, as the header says (device memory holds garbage). */
    void *zeroed[] = {gpt->master, gpt->grads, gpt->adam_m, gpt->adam_v};
    for (size_t i = 0; i < sizeof zeroed / sizeof zeroed[0]; ++i) {
      if (mp_device_memset(zeroed[i], 0, P * sizeof(float), err) != MP_OK) goto fail;
    }
    if (mp_device_memset(gpt->weights, 0, P * sizeof(mp_bf16), err) != MP_OK) goto fail;
  }
  gpt->wte = gpt->weights + mp_gpt_layout_tensor(gpt->layout, 0)->offset;
  gpt->wpe = gpt->weights + mp_gpt_layout_tensor(gpt->layout, 1)->offset;
  gpt->dwte = gpt->grads + mp_gpt_layout_tensor(gpt->layout, 0)->offset;
  gpt->dwpe = gpt->grads + mp_gpt_layout_tensor(gpt->layout, 1)->offset;
  const int last = mp_gpt_layout_num_tensors(gpt->layout);
  gpt->lnfw = gpt->weights + mp_gpt_layout_tensor(gpt->layout, last - 2)->offset;
  gpt->lnfb = gpt->weights + mp_gpt_layout_tensor(gpt->layout, last - 1)->offset;
  gpt->dlnfw = gpt->grads + mp_gpt_layout_tensor(gpt->layout, last - 2)->offset;
  gpt->dlnfb = gpt->grads + mp_gpt_layout_tensor(gpt->layout, last - 1)->offset;
  for (int l = 0; l < L; ++l) {
    point_weights(gpt->layout, l, gpt->weights, &gpt->blocks[l]);
    point_grads(gpt->layout, l, gpt->grads, &gpt->dblocks[l]);
  }

  ALLOC(gpt->inputs, BT);
  ALLOC(gpt->targets, BT);
  ALLOC(gpt->encoded, BT * C);
  for (int l = 0; l < L; ++l) {
    block_acts *a = &gpt->acts[l];
    ALLOC(a->ln1, BT * C);
    ALLOC(a->ln1_mean, BT);
    ALLOC(a->ln1_rstd, BT);
    ALLOC(a->qkv, BT * 3 * C);
    ALLOC(a->atty, BT * C);
    if (gpt->fused_attention) {
      ALLOC(a->lse, (size_t)B * NH * T);
    } else {
      ALLOC(a->att, (size_t)B * NH * T * T);
    }
    ALLOC(a->residual2, BT * C);
    ALLOC(a->ln2, BT * C);
    ALLOC(a->ln2_mean, BT);
    ALLOC(a->ln2_rstd, BT);
    ALLOC(a->fch, BT * F);
    ALLOC(a->fch_gelu, BT * F);
    ALLOC(a->out, BT * C);
  }
  ALLOC(gpt->projection, BT * C);
  ALLOC(gpt->lnf, BT * C);
  ALLOC(gpt->lnf_mean, BT);
  ALLOC(gpt->lnf_rstd, BT);
  ALLOC(gpt->logits, BT * Vp);
  ALLOC(gpt->losses, BT);
  ALLOC(gpt->dresidual, BT * C);
  ALLOC(gpt->dnorm, BT * C);
  ALLOC(gpt->datty, BT * C);
  ALLOC(gpt->dqkv, BT * 3 * C);
  ALLOC(gpt->dfch, BT * F);
  ALLOC(gpt->dfch_gelu, BT * F);
  ALLOC(gpt->layernorm_scratch, mp_layernorm_backward_cuda_scratch_floats(B, T, C));
  const int widest = max_size((size_t)Vp, max_size((size_t)F, 3 * (size_t)C));
  ALLOC(gpt->matmul_scratch, mp_matmul_backward_cuda_scratch_floats((int)BT, widest));
  ALLOC(gpt->norm_scratch, mp_grad_norm_cuda_scratch_floats(P));
  const size_t attention_scratch_bytes =
      gpt->fused_attention ? mp_flash_attention_scratch_bytes(B, T, NH, C / NH)
                           : mp_attention_cuda_scratch_bytes(B, T, NH, C / NH);
  if (device_alloc(gpt, &gpt->attention_scratch, attention_scratch_bytes, err) != MP_OK) {
    goto fail;
  }
  ALLOC(gpt->embedding_workspace, mp_embedding_backward_cuda_workspace_ints(B, T));
  *out = gpt;
  return MP_OK;
fail:
  mp_gpt_gpu_free(gpt);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

void mp_gpt_gpu_free(mp_gpt_gpu *gpt) {
  if (gpt == NULL) return;
  void *buffers[] = {gpt->master, gpt->weights, gpt->grads, gpt->adam_m, gpt->adam_v,
                     gpt->inputs, gpt->targets, gpt->encoded, gpt->projection, gpt->lnf,
                     gpt->lnf_mean, gpt->lnf_rstd, gpt->logits, gpt->losses, gpt->dresidual,
                     gpt->dnorm, gpt->datty, gpt->dqkv, gpt->dfch, gpt->dfch_gelu,
                     gpt->layernorm_scratch, gpt->matmul_scratch, gpt->norm_scratch,
                     gpt->attention_scratch, gpt->embedding_workspace};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
  if (gpt->acts != NULL) {
    for (int l = 0; l < mp_gpt_layout_config(gpt->layout)->num_layers; ++l) {
      block_acts *a = &gpt->acts[l];
      void *per_layer[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->att, a->lse,
                           a->residual2, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu,
                           a->out};
      for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; ++i) {
        mp_device_free(per_layer[i]);
      }
    }
  }
  if (gpt->cublas != NULL) mp_cublas_free(gpt->cublas);
  free(gpt->losses_host);
  free(gpt->inputs_host);
  free(gpt->acts);
  free(gpt->dblocks);
  free(gpt->blocks);
  mp_gpt_layout_free(gpt->layout);
  free(gpt);
}

const mp_gpt_layout *mp_gpt_gpu_layout(const mp_gpt_gpu *gpt) { return gpt->layout; }
size_t mp_gpt_gpu_device_bytes(const mp_gpt_gpu *gpt) { return gpt->device_bytes; }

mp_status mp_gpt_gpu_set_params(mp_gpt_gpu *gpt, const float *host_params, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout);
  MP_TRY(mp_device_copy_to_device(gpt->master, host_params, P * sizeof(float), err));
  mp_bf16_from_float_cuda(gpt->weights, gpt->master, P, NULL);
  MP_TRY(mp_device_memset(gpt->adam_m, 0, P * sizeof(float), err));
  MP_TRY(mp_device_memset(gpt->adam_v, 0, P * sizeof(float), err));
  return mp_device_synchronize(err);
}

mp_status mp_gpt_gpu_get_params(mp_gpt_gpu *gpt, float *host_params, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout);
  return mp_device_copy_to_host(host_params, gpt->master, P * sizeof(float), err);
}

mp_status mp_gpt_gpu_get_grads(mp_gpt_gpu *gpt, float *host_grads, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout);
  return mp_device_copy_to_host(host_grads, gpt->grads, P * sizeof(float), err);
}

mp_status mp_gpt_gpu_get_state(mp_gpt_gpu *gpt, float *host_params, float *adam_m, float *adam_v,
                               mp_error *err) {
  const size_t bytes = mp_gpt_layout_num_params(gpt->layout) * sizeof(float);
  MP_TRY(mp_device_copy_to_host(host_params, gpt->master, bytes, err));
  MP_TRY(mp_device_copy_to_host(adam_m, gpt->adam_m, bytes, err));
  return mp_device_copy_to_host(adam_v, gpt->adam_v, bytes, err);
}

mp_status mp_gpt_gpu_set_state(mp_gpt_gpu *gpt, const float *host_params, const float *adam_m,
                               const float *adam_v, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout), bytes = P * sizeof(float);
  MP_TRY(mp_device_copy_to_device(gpt->master, host_params, bytes, err));
  mp_bf16_from_float_cuda(gpt->weights, gpt->master, P, NULL);
  MP_TRY(mp_device_copy_to_device(gpt->adam_m, adam_m, bytes, err));
  MP_TRY(mp_device_copy_to_device(gpt->adam_v, adam_v, bytes, err));
  return mp_device_synchronize(err);
}

float *mp_gpt_gpu_device_grads(mp_gpt_gpu *gpt) { return gpt->grads; }

mp_status mp_gpt_gpu_scale_grads(mp_gpt_gpu *gpt, float scale, mp_error *err) {
  mp_grad_scale_cuda(gpt->grads, mp_gpt_layout_num_params(gpt->layout), scale, NULL);
  return mp_device_synchronize(err);
}

mp_status mp_gpt_gpu_zero_grads(mp_gpt_gpu *gpt, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout);
  return mp_device_memset(gpt->grads, 0, P * sizeof(float), err);
}

mp_status mp_gpt_gpu_forward(mp_gpt_gpu *gpt, const int32_t *inputs, const int32_t *targets,
                             float dloss, double *loss, mp_error *err) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const int B = gpt->B, T = gpt->T, C = c->channels, NH = c->num_heads, F = c->ffn_channels;
  const int BT = B * T, Vp = c->padded_vocab_size;
  const mp_cuda_stream stream = NULL;
  memcpy(gpt->inputs_host, inputs, (size_t)BT * sizeof(int32_t));
  MP_TRY(mp_device_copy_to_device(gpt->inputs, inputs, (size_t)BT * sizeof(int32_t), err));
  MP_TRY(mp_device_copy_to_device(gpt->targets, targets, (size_t)BT * sizeof(int32_t), err));

  mp_embedding_forward_cuda(gpt->encoded, gpt->inputs, gpt->wte, gpt->wpe, B, T, C, stream);
  const mp_bf16 *x = gpt->encoded;
  for (int l = 0; l < c->num_layers; ++l) {
    const block_weights *w = &gpt->blocks[l];
    block_acts *a = &gpt->acts[l];
    mp_layernorm_forward_cuda(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, B, T, C,
                              stream);
    mp_matmul_forward_cuda(gpt->cublas, a->qkv, a->ln1, w->qkvw, w->qkvb, BT, C, 3 * C, stream);
    if (gpt->fused_attention) {
      mp_flash_attention_forward_cuda(a->atty, a->lse, a->qkv, B, T, NH, C / NH, stream);
    } else {
      mp_attention_forward_cuda(gpt->cublas, a->atty, a->att, a->qkv, gpt->attention_scratch, B,
                                T, NH, C / NH, stream);
    }
    mp_matmul_forward_cuda(gpt->cublas, gpt->projection, a->atty, w->attprojw, w->attprojb, BT, C,
                           C, stream);
    mp_residual_forward_cuda(a->residual2, x, gpt->projection, (size_t)BT * C, stream);
    mp_layernorm_forward_cuda(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2w, w->ln2b, B,
                              T, C, stream);
    mp_matmul_forward_cuda(gpt->cublas, a->fch, a->ln2, w->fcw, w->fcb, BT, C, F, stream);
    mp_gelu_forward_cuda(a->fch_gelu, a->fch, (size_t)BT * F, stream);
    mp_matmul_forward_cuda(gpt->cublas, gpt->projection, a->fch_gelu, w->fcprojw, w->fcprojb, BT,
                           F, C, stream);
    mp_residual_forward_cuda(a->out, a->residual2, gpt->projection, (size_t)BT * C, stream);
    x = a->out;
  }
  mp_layernorm_forward_cuda(gpt->lnf, gpt->lnf_mean, gpt->lnf_rstd, x, gpt->lnfw, gpt->lnfb, B, T,
                            C, stream);
  mp_matmul_forward_cuda(gpt->cublas, gpt->logits, gpt->lnf, gpt->wte, NULL, BT, C, Vp, stream);
  mp_cross_entropy_fused_cuda(gpt->losses, gpt->logits, gpt->targets, dloss, B, T, c->vocab_size,
                              Vp, stream);
  MP_TRY(mp_cublas_check(gpt->cublas, err));
  MP_TRY(mp_device_copy_to_host(gpt->losses_host, gpt->losses, (size_t)BT * sizeof(float), err));
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += gpt->losses_host[i];
  *loss = sum / (double)BT;
  return MP_OK;
}

mp_status mp_gpt_gpu_backward(mp_gpt_gpu *gpt, mp_error *err) {
  const mp_gpt_config *c = mp_gpt_layout_config(gpt->layout);
  const int B = gpt->B, T = gpt->T, C = c->channels, NH = c->num_heads, F = c->ffn_channels;
  const int BT = B * T, Vp = c->padded_vocab_size, L = c->num_layers;
  const size_t act_bytes = (size_t)BT * C * sizeof(mp_bf16);
  const mp_cuda_stream stream = NULL;
  /* The LM head and the final layernorm; dresidual then holds d(loss)/d(last block's output). */
  MP_TRY(mp_device_memset(gpt->dnorm, 0, act_bytes, err));
  mp_matmul_backward_cuda(gpt->cublas, gpt->dnorm, gpt->dwte, NULL, gpt->logits, gpt->lnf,
                          gpt->wte, gpt->matmul_scratch, BT, C, Vp, stream);
  MP_TRY(mp_device_memset(gpt->dresidual, 0, act_bytes, err));
  const mp_bf16 *last = L > 0 ? gpt->acts[L - 1].out : gpt->encoded;
  mp_layernorm_backward_cuda(gpt->dresidual, gpt->dlnfw, gpt->dlnfb, gpt->dnorm, last, gpt->lnfw,
                             gpt->lnf_mean, gpt->lnf_rstd, gpt->layernorm_scratch, B, T, C,
                             stream);
  for (int l = L - 1; l >= 0; --l) {
    const block_weights *w = &gpt->blocks[l];
    const block_grads *g = &gpt->dblocks[l];
    const block_acts *a = &gpt->acts[l];
    const mp_bf16 *inp = l == 0 ? gpt->encoded : gpt->acts[l - 1].out;
    /* out = residual2 + fc_proj(gelu(fc(ln2(residual2)))): the MLP branch. */
    MP_TRY(mp_device_memset(gpt->dfch_gelu, 0, (size_t)BT * F * sizeof(mp_bf16), err));
    mp_matmul_backward_cuda(gpt->cublas, gpt->dfch_gelu, g->fcprojw, g->fcprojb, gpt->dresidual,
                            a->fch_gelu, w->fcprojw, gpt->matmul_scratch, BT, F, C, stream);
    MP_TRY(mp_device_memset(gpt->dfch, 0, (size_t)BT * F * sizeof(mp_bf16), err));
    mp_gelu_backward_cuda(gpt->dfch, a->fch, gpt->dfch_gelu, (size_t)BT * F, stream);
    MP_TRY(mp_device_memset(gpt->dnorm, 0, act_bytes, err));
    mp_matmul_backward_cuda(gpt->cublas, gpt->dnorm, g->fcw, g->fcb, gpt->dfch, a->ln2, w->fcw,
                            gpt->matmul_scratch, BT, C, F, stream);
    mp_layernorm_backward_cuda(gpt->dresidual, g->ln2w, g->ln2b, gpt->dnorm, a->residual2, w->ln2w,
                               a->ln2_mean, a->ln2_rstd, gpt->layernorm_scratch, B, T, C, stream);
    /* residual2 = inp + attn_proj(attention(qkv(ln1(inp)))): the attention branch. */
    MP_TRY(mp_device_memset(gpt->datty, 0, act_bytes, err));
    mp_matmul_backward_cuda(gpt->cublas, gpt->datty, g->attprojw, g->attprojb, gpt->dresidual,
                            a->atty, w->attprojw, gpt->matmul_scratch, BT, C, C, stream);
    MP_TRY(mp_device_memset(gpt->dqkv, 0, (size_t)BT * 3 * C * sizeof(mp_bf16), err));
    if (gpt->fused_attention) {
      mp_flash_attention_backward_cuda(gpt->dqkv, gpt->datty, a->qkv, a->atty, a->lse,
                                       gpt->attention_scratch, B, T, NH, C / NH, stream);
    } else {
      mp_attention_backward_cuda(gpt->cublas, gpt->dqkv, gpt->datty, a->qkv, a->att,
                                 gpt->attention_scratch, B, T, NH, C / NH, stream);
    }
    MP_TRY(mp_device_memset(gpt->dnorm, 0, act_bytes, err));
    mp_matmul_backward_cuda(gpt->cublas, gpt->dnorm, g->qkvw, g->qkvb, gpt->dqkv, a->ln1, w->qkvw,
                            gpt->matmul_scratch, BT, C, 3 * C, stream);
    mp_layernorm_backward_cuda(gpt->dresidual, g->ln1w, g->ln1b, gpt->dnorm, inp, w->ln1w,
                               a->ln1_mean, a->ln1_rstd, gpt->layernorm_scratch, B, T, C, stream);
  }
  mp_embedding_backward_cuda(gpt->dwte, gpt->dwpe, gpt->dresidual, gpt->inputs, gpt->inputs_host,
                             gpt->embedding_workspace, B, T, C, stream);
  MP_TRY(mp_cublas_check(gpt->cublas, err));
  return MP_OK;
}

mp_status mp_gpt_gpu_optimizer_step(mp_gpt_gpu *gpt, const mp_gpu_adamw *adamw,
                                    double *grad_norm, mp_error *err) {
  const size_t P = mp_gpt_layout_num_params(gpt->layout);
  const mp_cuda_stream stream = NULL;
  double norm_squared = 0.0;
  MP_TRY(mp_grad_norm_squared_cuda(gpt->grads, P, gpt->norm_scratch, &norm_squared, stream, err));
  *grad_norm = sqrt(norm_squared);
  const float scale = mp_clip_scale(*grad_norm, adamw->grad_clip);
  if (scale != 1.0f) mp_grad_scale_cuda(gpt->grads, P, scale, stream);
  for (int i = 0; i < mp_gpt_layout_num_tensors(gpt->layout); ++i) {
    const mp_gpt_tensor *tensor = mp_gpt_layout_tensor(gpt->layout, i);
    const size_t offset = tensor->offset;
    mp_adamw_update_cuda(gpt->master + offset, gpt->weights + offset, gpt->grads + offset,
                         gpt->adam_m + offset, gpt->adam_v + offset, tensor->rows * tensor->cols,
                         adamw->learning_rate, adamw->beta1, adamw->beta2, adamw->eps,
                         tensor->weight_decay ? adamw->weight_decay : 0.0f, adamw->step, stream);
  }
  return mp_device_synchronize(err);
}
