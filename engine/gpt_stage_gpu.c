/*
 * engine/gpt_stage_gpu.c — a rank's shard of a pipeline stage on a GPU; see gpt_stage_gpu.h.
 *
 * The kernel chain is engine/gpt_model_gpu.c's, operand for operand, on this rank's heads, MLP
 * channels and vocabulary rows; around the row-parallel GEMMs, the column-parallel input
 * gradients, the embedding lookup and the cross-entropy it adds the collectives of
 * tensor_parallel/ (through the host stage's mp_tp_comm, on device buffers). As in the one-GPU
 * model, the backward keeps one residual-stream gradient (dresidual) that each layernorm backward
 * adds its input gradient into.
 *
 * Sequence parallelism (Korthikanti et al. 2022; tensor_parallel/mappings.h), with tp > 1: the
 * layernorms, the residual adds and the stage boundary hold this rank's token slice, rows
 * [row0, row0 + BTl) of the B*T (BTl = B*T/tp, row0 = rank * BTl). A layernorm writes its rows of
 * the column-parallel GEMM's (BT, C) input, which is then all-gathered in place and kept for the
 * backward (qkv, fc, the LM head); a row-parallel GEMM's (BT, C) partial product is
 * reduce-scattered to the slice, the bias added and rounded once (attn_proj, fc_proj); the
 * embedding's lookup is reduce-scattered and the slice's positions added. The backward runs the
 * mirrors: a row-parallel GEMM's output gradient all-gathered, a column-parallel input gradient
 * reduce-scattered. Every collective moves fp32 (bf16 widened exactly, rounded once after a sum).
 * The layernorm gradients are then partial sums over this rank's tokens until
 * mp_gpt_stage_gpu_finish_grads. With tp = 1 sequence parallelism is the identity: nothing changes.
 */
#include "engine/gpt_stage_gpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
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
#include "layers/tensor_parallel_cuda.h"

enum { kBlockTensors = 12 };

/* One block's tensors in the layout's per-layer order, as pointers into a flat shard array. */
typedef struct {
  mp_bf16 *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
      *fcprojb;
} block_weights;

typedef struct {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
      *fcprojb;
} block_grads;

/* What one block's forward keeps for its backward (Cl = C/tp, Fl = F/tp, NHl = NH/tp; BTl = BT/tp
 * with sequence parallelism, else BT). */
typedef struct {
  mp_bf16 *ln1;               /* (BT, C) the qkv GEMM's input (all-gathered with SP) */
  float *ln1_mean, *ln1_rstd; /* (BTl) */
  mp_bf16 *qkv;               /* (BT, 3Cl) this rank's q, k, v */
  mp_bf16 *atty;              /* (BT, Cl) */
  mp_bf16 *att;               /* (B, NHl, T, T), cuBLAS attention only */
  float *lse;                 /* (B, NHl, T), fused attention only */
  mp_bf16 *residual2;         /* (BTl, C) */
  mp_bf16 *ln2;               /* (BT, C) the fc GEMM's input (all-gathered with SP) */
  float *ln2_mean, *ln2_rstd; /* (BTl) */
  mp_bf16 *fch, *fch_gelu;    /* (BT, Fl) */
  mp_bf16 *out;               /* (BTl, C) */
} block_acts;

/* Zero-bubble (deferred weights): what one block's W needs beyond its activations, kept by its B:
 * the output gradients of the four GEMMs (Qi et al. 2023's split, as
 * tensor_parallel/gpt_block.h's mp_tp_block_deferred keeps them on the CPU). */
typedef struct {
  mp_bf16 *dfcproj;  /* (BT, C) fc_proj's output gradient (all-gathered with SP) */
  mp_bf16 *dfch;     /* (BT, Fl) fc's output gradient */
  mp_bf16 *dattproj; /* (BT, C) attn_proj's output gradient (all-gathered with SP) */
  mp_bf16 *dqkv;     /* (BT, 3Cl) qkv's output gradient */
} block_deferred;

/* One micro-batch between its forward and its backward (its W with deferred weights). With full
 * recomputation a light slot owns only its tokens, targets and input; its activation pointers are
 * the shared set's (gpu->shared), which the backward refills by running the forward again. */
typedef struct {
  bool in_use;
  bool weights_pending;        /* a deferred backward (B) ran; its W has not */
  bool light;                  /* full recomputation: the activations are gpu->shared's */
  float dloss;                 /* the head's loss scale, for the recomputed cross-entropy */
  int32_t *inputs, *targets;   /* (B, T) device */
  int32_t *inputs_host;        /* (B, T) for the embedding backward */
  mp_bf16 *input;              /* (BTl, C) the stage's input: embedding output or received */
  block_acts *acts;            /* (num_layers) */
  block_deferred *deferred;    /* (num_layers) with deferred weights, else NULL */
  mp_bf16 *lnf;                /* (BTl, C) */
  float *lnf_mean, *lnf_rstd;  /* (BTl) */
  mp_bf16 *head_input;         /* (BT, C) SP: the LM head's input all-gathered; else NULL */
  mp_bf16 *logits;             /* (BT, Vl), dlogits after the forward's cross-entropy */
} slot_acts;

struct mp_gpt_stage_gpu {
  mp_gpt_tp *host;
  const mp_gpt_layout *layout;
  mp_gpt_stage stage;
  mp_tp_comm tp;
  int B, T, C, NH, NHl, HS, Cl, Fl, Vl, V, Vp, vocab_start;
  bool fused_attention;
  bool sp;      /* sequence parallelism with tp > 1 */
  int BTl, row0; /* this rank's token rows [row0, row0 + BTl): all BT rows without SP */
  size_t num_params, device_bytes;
  mp_cublas *cublas;
  float *master, *grads;                   /* (num_params) */
  float *adam_m, *adam_v;                  /* (moments_count): elements [moments_first, +count) */
  size_t moments_first, moments_count;     /* all of them, or this dp rank's part with ZeRO-1 */
  mp_bf16 *weights;                        /* (num_params) */
  mp_bf16 *wte, *wpe, *lnfw, *lnfb;        /* NULL where the stage does not hold them */
  float *dwte, *dwpe, *dlnfw, *dlnfb;
  block_weights *blocks;                   /* (num_layers) */
  block_grads *dblocks;
  size_t *block_first, *block_count;       /* (num_layers) each block's gradient floats */
  mp_gpt_stage_gpu_grads_hook grads_hook;
  void *grads_hook_context;
  bool deferred_weights;     /* zero-bubble: slots keep what W needs */
  mp_recompute recompute;
  int num_slots;
  slot_acts *slots;
  slot_acts shared;          /* full recomputation: the one set of activations; else unused */
  /* shared by every slot */
  mp_bf16 *projection;       /* (BT, C) a row-parallel GEMM's output */
  float *reduce;             /* (BT, C) fp32: what a collective sums, the embedding lookup */
  float *slice;              /* (BTl, C) fp32, SP: a collective's slice of reduce */
  mp_bf16 *dout_total;       /* (BT, C) SP: a row-parallel GEMM's all-gathered output gradient */
  float *losses;             /* (BT) */
  float *losses_host;        /* (BT) */
  float *row_max, *gathered_max, *ce_stats; /* (BT), (tp, BT), (2, BT) */
  mp_bf16 *dresidual, *dnorm;              /* (BT, C); with SP a slice's in the first BTl rows */
  mp_bf16 *datty;                          /* (BT, Cl) */
  mp_bf16 *dqkv;                           /* (BT, 3Cl) */
  mp_bf16 *dfch, *dfch_gelu;               /* (BT, Fl) */
  float *layernorm_scratch, *matmul_scratch, *norm_scratch;
  void *attention_scratch;
  int32_t *embedding_workspace;
  float *dwte_rows;          /* (Vl + 1, C) tp > 1: the embedding gradient by shard row; the last
                                row collects tokens of other ranks' ranges */
  int32_t *shard_tokens;     /* (BT) device: tokens as rows of dwte_rows */
  int32_t *shard_tokens_host;
};

static mp_status device_alloc(mp_gpt_stage_gpu *gpu, void **out, size_t bytes, mp_error *err) {
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

/* The offset in the shard arrays of the layout's tensor full_index, or -1 if the stage lacks it. */
static int shard_tensor(const mp_gpt_stage_gpu *gpu, int full_index);

static long shard_offset(const mp_gpt_stage_gpu *gpu, int full_index) {
  const int i = shard_tensor(gpu, full_index);
  return i < 0 ? -1 : (long)mp_gpt_tp_tensor_at(gpu->host, i)->offset;
}

static mp_bf16 *weight_view(const mp_gpt_stage_gpu *gpu, int full_index) {
  const long offset = shard_offset(gpu, full_index);
  return offset < 0 ? NULL : gpu->weights + offset;
}

static float *grad_view(const mp_gpt_stage_gpu *gpu, int full_index) {
  const long offset = shard_offset(gpu, full_index);
  return offset < 0 ? NULL : gpu->grads + offset;
}

/* The shard table's index of the layout's tensor full_index, or -1. */
static int shard_tensor(const mp_gpt_stage_gpu *gpu, int full_index) {
  const mp_gpt_tensor *full = mp_gpt_layout_tensor(gpu->layout, full_index);
  for (int i = 0; i < mp_gpt_tp_num_tensors(gpu->host); ++i) {
    if (mp_gpt_tp_tensor_at(gpu->host, i)->full == full) return i;
  }
  return -1;
}

static void point_block(mp_gpt_stage_gpu *gpu, int l, int layer) {
  block_weights *w = &gpu->blocks[l];
  block_grads *g = &gpu->dblocks[l];
  mp_bf16 **wf[kBlockTensors] = {&w->ln1w, &w->ln1b, &w->qkvw, &w->qkvb, &w->attprojw,
                                 &w->attprojb, &w->ln2w, &w->ln2b, &w->fcw, &w->fcb,
                                 &w->fcprojw, &w->fcprojb};
  float **gf[kBlockTensors] = {&g->ln1w, &g->ln1b, &g->qkvw, &g->qkvb, &g->attprojw,
                               &g->attprojb, &g->ln2w, &g->ln2b, &g->fcw, &g->fcb,
                               &g->fcprojw, &g->fcprojb};
  for (int k = 0; k < kBlockTensors; ++k) {
    *wf[k] = weight_view(gpu, 2 + layer * kBlockTensors + k);
    *gf[k] = grad_view(gpu, 2 + layer * kBlockTensors + k);
  }
  const mp_gpt_tp_tensor *first =
      mp_gpt_tp_tensor_at(gpu->host, shard_tensor(gpu, 2 + layer * kBlockTensors));
  const mp_gpt_tp_tensor *last =
      mp_gpt_tp_tensor_at(gpu->host, shard_tensor(gpu, 2 + layer * kBlockTensors + 11));
  gpu->block_first[l] = first->offset;
  gpu->block_count[l] = last->offset + last->count - first->offset;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static mp_status alloc_slot(mp_gpt_stage_gpu *gpu, slot_acts *s, mp_error *err) {
  const size_t BT = (size_t)gpu->B * (size_t)gpu->T, C = (size_t)gpu->C;
  const size_t Cl = (size_t)gpu->Cl, Fl = (size_t)gpu->Fl, BTl = (size_t)gpu->BTl;
  const int L = gpu->stage.num_layers;
  s->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *s->acts);
  s->inputs_host = calloc(BT, sizeof(int32_t));
  if (s->acts == NULL || s->inputs_host == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  ALLOC(s->inputs, BT);
  ALLOC(s->targets, BT);
  ALLOC(s->input, BTl * C);
  for (int l = 0; l < L; ++l) {
    block_acts *a = &s->acts[l];
    ALLOC(a->ln1, BT * C);
    ALLOC(a->ln1_mean, BTl);
    ALLOC(a->ln1_rstd, BTl);
    ALLOC(a->qkv, BT * 3 * Cl);
    ALLOC(a->atty, BT * Cl);
    if (gpu->fused_attention) {
      ALLOC(a->lse, (size_t)gpu->B * gpu->NHl * gpu->T);
    } else {
      ALLOC(a->att, (size_t)gpu->B * gpu->NHl * gpu->T * gpu->T);
    }
    ALLOC(a->residual2, BTl * C);
    ALLOC(a->ln2, BT * C);
    ALLOC(a->ln2_mean, BTl);
    ALLOC(a->ln2_rstd, BTl);
    ALLOC(a->fch, BT * Fl);
    ALLOC(a->fch_gelu, BT * Fl);
    ALLOC(a->out, BTl * C);
  }
  if (gpu->stage.final_norm) {
    ALLOC(s->lnf, BTl * C);
    ALLOC(s->lnf_mean, BTl);
    ALLOC(s->lnf_rstd, BTl);
  }
  if (gpu->stage.head) ALLOC(s->logits, BT * (size_t)gpu->Vl);
  if (gpu->stage.head && gpu->sp) ALLOC(s->head_input, BT * C);
  if (gpu->deferred_weights) {
    s->deferred = calloc((size_t)(L > 0 ? L : 1), sizeof *s->deferred);
    if (s->deferred == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    for (int l = 0; l < L; ++l) {
      block_deferred *d = &s->deferred[l];
      ALLOC(d->dfcproj, BT * C);
      ALLOC(d->dfch, BT * Fl);
      ALLOC(d->dattproj, BT * C);
      ALLOC(d->dqkv, BT * 3 * Cl);
    }
  }
  return MP_OK;
fail:
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

/* Full recomputation: a slot that owns its tokens, targets and input (the embedding's output or
 * the received boundary, (BTl, C) bf16) only; its activation pointers are gpu->shared's. */
static mp_status alloc_light_slot(mp_gpt_stage_gpu *gpu, slot_acts *s, mp_error *err) {
  const size_t BT = (size_t)gpu->B * (size_t)gpu->T, C = (size_t)gpu->C;
  const int L = gpu->stage.num_layers;
  *s = gpu->shared;
  s->light = true;
  s->inputs = s->targets = s->inputs_host = NULL;
  s->input = NULL;
  s->deferred = NULL;
  s->acts = calloc((size_t)(L > 0 ? L : 1), sizeof *s->acts);
  s->inputs_host = calloc(BT, sizeof(int32_t));
  if (s->acts == NULL || s->inputs_host == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  }
  if (L > 0) memcpy(s->acts, gpu->shared.acts, (size_t)L * sizeof *s->acts);
  ALLOC(s->inputs, BT);
  ALLOC(s->targets, BT);
  ALLOC(s->input, (size_t)gpu->BTl * C);
  return MP_OK;
fail:
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

static void free_slot(slot_acts *s, int num_layers) {
  void *own[] = {s->inputs, s->targets, s->input};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; ++i) mp_device_free(own[i]);
  if (s->light) { /* the rest is the shared set's */
    free(s->acts);
    free(s->inputs_host);
    return;
  }
  void *tail[] = {s->lnf, s->lnf_mean, s->lnf_rstd, s->head_input, s->logits};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; ++i) mp_device_free(tail[i]);
  for (int l = 0; s->deferred != NULL && l < num_layers; ++l) {
    const block_deferred *d = &s->deferred[l];
    void *kept[] = {d->dfcproj, d->dfch, d->dattproj, d->dqkv};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; ++i) mp_device_free(kept[i]);
  }
  free(s->deferred);
  for (int l = 0; s->acts != NULL && l < num_layers; ++l) {
    block_acts *a = &s->acts[l];
    void *per_layer[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->att, a->lse,
                         a->residual2, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu,
                         a->out};
    for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; ++i) {
      mp_device_free(per_layer[i]);
    }
  }
  free(s->acts);
  free(s->inputs_host);
}

void mp_gpt_stage_gpu_free(mp_gpt_stage_gpu *gpu) {
  if (gpu == NULL) return;
  for (int s = 0; gpu->slots != NULL && s < gpu->num_slots; ++s) {
    free_slot(&gpu->slots[s], gpu->stage.num_layers);
  }
  free_slot(&gpu->shared, gpu->stage.num_layers);
  void *buffers[] = {gpu->master, gpu->grads, gpu->adam_m, gpu->adam_v, gpu->weights,
                     gpu->projection, gpu->reduce, gpu->slice, gpu->dout_total, gpu->losses,
                     gpu->row_max, gpu->gathered_max, gpu->ce_stats, gpu->dresidual, gpu->dnorm,
                     gpu->datty, gpu->dqkv, gpu->dfch, gpu->dfch_gelu, gpu->layernorm_scratch,
                     gpu->matmul_scratch, gpu->norm_scratch, gpu->attention_scratch,
                     gpu->embedding_workspace, gpu->dwte_rows, gpu->shard_tokens};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) mp_device_free(buffers[i]);
  if (gpu->cublas != NULL) mp_cublas_free(gpu->cublas);
  free(gpu->slots);
  free(gpu->blocks);
  free(gpu->dblocks);
  free(gpu->block_first);
  free(gpu->block_count);
  free(gpu->losses_host);
  free(gpu->shard_tokens_host);
  free(gpu);
}

mp_status mp_gpt_stage_gpu_create(mp_gpt_tp *host, const mp_tp_comm *device_tp, int micro_batch,
                                  int seq_len, int num_slots, bool deferred_weights,
                                  mp_recompute recompute, mp_gpt_stage_gpu **out, mp_error *err) {
  *out = NULL;
  if (recompute == MP_RECOMPUTE_FULL && deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "full recomputation cannot run a zero-bubble schedule: its weight pass needs "
                   "activations that the recomputation of the next micro-batch overwrites; use "
                   "recompute \"selective\" or \"none\", or another schedule");
  }
  if (num_slots < 1) {
    return mp_fail(err, MP_ERR_INPUT, "a stage needs at least one activation slot; got %d",
                   num_slots);
  }
  const size_t channels = (size_t)mp_gpt_layout_config(mp_gpt_tp_layout(host))->channels;
  /* With sequence parallelism the host stage's boundary is its token slice. */
  const size_t split = mp_gpt_tp_sequence_parallel(host) ? (size_t)mp_gpt_tp_comm(host)->size : 1;
  const size_t tokens = micro_batch < 1 || seq_len < 1 ? 0 : (size_t)micro_batch * (size_t)seq_len;
  if (tokens == 0 || tokens % split != 0 ||
      mp_gpt_tp_boundary_floats(host) != tokens / split * channels) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the GPU stage's micro-batch %d x %d tokens%s is not its host stage's (%zu "
                   "boundary floats of %zu channels)",
                   micro_batch, seq_len,
                   split > 1 ? " (over the tensor-parallel group, sequence parallel)" : "",
                   mp_gpt_tp_boundary_floats(host), channels);
  }
  if (mp_device_count() == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES)");
  }
  mp_gpt_stage_gpu *gpu = calloc(1, sizeof *gpu);
  if (gpu == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  gpu->host = host;
  gpu->layout = mp_gpt_tp_layout(host);
  gpu->stage = *mp_gpt_tp_stage(host);
  gpu->tp = device_tp != NULL ? *device_tp : *mp_gpt_tp_comm(host);
  if (gpu->tp.size != mp_gpt_tp_comm(host)->size || gpu->tp.rank != mp_gpt_tp_comm(host)->rank) {
    mp_fail(err, MP_ERR_INPUT,
            "the device tensor-parallel group (rank %d of %d) is not the host stage's (rank %d of "
            "%d)",
            gpu->tp.rank, gpu->tp.size, mp_gpt_tp_comm(host)->rank, mp_gpt_tp_comm(host)->size);
    free(gpu);
    return MP_ERR_INPUT;
  }
  const mp_gpt_config *c = mp_gpt_layout_config(gpu->layout);
  gpu->B = micro_batch;
  gpu->T = seq_len;
  gpu->C = c->channels;
  gpu->NH = c->num_heads;
  gpu->NHl = c->num_heads / gpu->tp.size;
  gpu->HS = c->channels / c->num_heads;
  gpu->Cl = gpu->NHl * gpu->HS;
  gpu->Fl = c->ffn_channels / gpu->tp.size;
  gpu->V = c->vocab_size;
  gpu->Vp = c->padded_vocab_size;
  gpu->Vl = c->padded_vocab_size / gpu->tp.size;
  gpu->vocab_start = gpu->tp.rank * gpu->Vl;
  gpu->sp = mp_gpt_tp_sequence_parallel(host) && gpu->tp.size > 1;
  gpu->BTl = gpu->sp ? micro_batch * seq_len / gpu->tp.size : micro_batch * seq_len;
  gpu->row0 = gpu->sp ? gpu->tp.rank * gpu->BTl : 0;
  gpu->num_params = mp_gpt_tp_num_params(host);
  gpu->num_slots = num_slots;
  gpu->deferred_weights = deferred_weights;
  gpu->recompute = recompute;
  const int L = gpu->stage.num_layers;
  const size_t BT = (size_t)micro_batch * (size_t)seq_len, C = (size_t)gpu->C;
  const size_t P = gpu->num_params;
  gpu->blocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpu->blocks);
  gpu->dblocks = calloc((size_t)(L > 0 ? L : 1), sizeof *gpu->dblocks);
  gpu->block_first = calloc((size_t)(L > 0 ? L : 1), sizeof *gpu->block_first);
  gpu->block_count = calloc((size_t)(L > 0 ? L : 1), sizeof *gpu->block_count);
  gpu->slots = calloc((size_t)num_slots, sizeof *gpu->slots);
  gpu->losses_host = calloc(BT, sizeof(float));
  gpu->shard_tokens_host = calloc(BT, sizeof(int32_t));
  if (gpu->blocks == NULL || gpu->dblocks == NULL || gpu->block_first == NULL ||
      gpu->block_count == NULL || gpu->slots == NULL ||
      gpu->losses_host == NULL || gpu->shard_tokens_host == NULL) {
    mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
    goto fail;
  }
  if (mp_cublas_create(&gpu->cublas, err) != MP_OK) goto fail;
  const char *attention_choice = getenv("MPENGINE_ATTENTION");
  gpu->fused_attention = mp_flash_attention_supported(gpu->HS) &&
                         !(attention_choice != NULL && strcmp(attention_choice, "cublas") == 0);

  ALLOC(gpu->master, P);
  ALLOC(gpu->grads, P);
  gpu->moments_count = P;
  ALLOC(gpu->adam_m, P);
  ALLOC(gpu->adam_v, P);
  ALLOC(gpu->weights, P);
  {
    /* Parameters and gradients start at zero, as the header says (device memory holds garbage). */
    void *zeroed[] = {gpu->master, gpu->grads, gpu->adam_m, gpu->adam_v};
    for (size_t i = 0; i < sizeof zeroed / sizeof zeroed[0]; ++i) {
      if (mp_device_memset(zeroed[i], 0, P * sizeof(float), err) != MP_OK) goto fail;
    }
    if (mp_device_memset(gpu->weights, 0, P * sizeof(mp_bf16), err) != MP_OK) goto fail;
  }
  const int all = mp_gpt_layout_num_tensors(gpu->layout);
  gpu->wte = weight_view(gpu, 0);
  gpu->wpe = weight_view(gpu, 1);
  gpu->lnfw = weight_view(gpu, all - 2);
  gpu->lnfb = weight_view(gpu, all - 1);
  gpu->dwte = grad_view(gpu, 0);
  gpu->dwpe = grad_view(gpu, 1);
  gpu->dlnfw = grad_view(gpu, all - 2);
  gpu->dlnfb = grad_view(gpu, all - 1);
  for (int l = 0; l < L; ++l) point_block(gpu, l, gpu->stage.first_layer + l);
  if (recompute == MP_RECOMPUTE_FULL) {
    if (alloc_slot(gpu, &gpu->shared, err) != MP_OK) goto fail;
    for (int s = 0; s < num_slots; ++s) {
      if (alloc_light_slot(gpu, &gpu->slots[s], err) != MP_OK) goto fail;
    }
  } else {
    for (int s = 0; s < num_slots; ++s) {
      if (alloc_slot(gpu, &gpu->slots[s], err) != MP_OK) goto fail;
    }
  }
  const size_t Cl = (size_t)gpu->Cl, Fl = (size_t)gpu->Fl;
  ALLOC(gpu->projection, BT * C);
  ALLOC(gpu->reduce, BT * C);
  if (gpu->sp) {
    ALLOC(gpu->slice, (size_t)gpu->BTl * C);
    ALLOC(gpu->dout_total, BT * C);
  }
  ALLOC(gpu->losses, BT);
  ALLOC(gpu->row_max, BT);
  ALLOC(gpu->gathered_max, BT * (size_t)gpu->tp.size);
  ALLOC(gpu->ce_stats, 2 * BT);
  ALLOC(gpu->dresidual, BT * C);
  ALLOC(gpu->dnorm, BT * C);
  ALLOC(gpu->datty, BT * Cl);
  ALLOC(gpu->dqkv, BT * 3 * Cl);
  ALLOC(gpu->dfch, BT * Fl);
  ALLOC(gpu->dfch_gelu, BT * Fl);
  ALLOC(gpu->layernorm_scratch, mp_layernorm_backward_cuda_scratch_floats(gpu->B, gpu->T, gpu->C));
  const size_t widest = max_size((size_t)gpu->Vl, max_size(Fl, max_size(3 * Cl, C)));
  ALLOC(gpu->matmul_scratch, mp_matmul_backward_cuda_scratch_floats((int)BT, (int)widest));
  ALLOC(gpu->norm_scratch, mp_grad_norm_cuda_scratch_floats(P));
  const size_t attention_bytes =
      gpu->fused_attention ? mp_flash_attention_scratch_bytes(gpu->B, gpu->T, gpu->NHl, gpu->HS)
                           : mp_attention_cuda_scratch_bytes(gpu->B, gpu->T, gpu->NHl, gpu->HS);
  if (device_alloc(gpu, &gpu->attention_scratch, attention_bytes, err) != MP_OK) goto fail;
  if (gpu->stage.embedding) {
    ALLOC(gpu->embedding_workspace, mp_embedding_backward_cuda_workspace_ints(gpu->B, gpu->T));
    if (gpu->tp.size > 1) {
      ALLOC(gpu->dwte_rows, ((size_t)gpu->Vl + 1) * C);
      ALLOC(gpu->shard_tokens, BT);
    }
  }
  *out = gpu;
  return MP_OK;
fail:
  mp_gpt_stage_gpu_free(gpu);
  return err != NULL && err->status != MP_OK ? err->status : MP_ERR_RUNTIME;
}

size_t mp_gpt_stage_gpu_device_bytes(const mp_gpt_stage_gpu *gpu) { return gpu->device_bytes; }
float *mp_gpt_stage_gpu_device_grads(mp_gpt_stage_gpu *gpu) { return gpu->grads; }

mp_status mp_gpt_stage_gpu_upload_params(mp_gpt_stage_gpu *gpu, mp_error *err) {
  const size_t P = gpu->num_params;
  MP_TRY(mp_device_copy_to_device(gpu->master, mp_gpt_tp_params(gpu->host), P * sizeof(float),
                                  err));
  mp_bf16_from_float_cuda(gpu->weights, gpu->master, P, NULL);
  MP_TRY(mp_device_memset(gpu->adam_m, 0, gpu->moments_count * sizeof(float), err));
  MP_TRY(mp_device_memset(gpu->adam_v, 0, gpu->moments_count * sizeof(float), err));
  return mp_device_synchronize(err);
}

mp_status mp_gpt_stage_gpu_keep_moments(mp_gpt_stage_gpu *gpu, size_t first, size_t count,
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
  return mp_device_memset(gpu->adam_v, 0, count * sizeof(float), err);
}

float *mp_gpt_stage_gpu_device_params(mp_gpt_stage_gpu *gpu) { return gpu->master; }

void mp_gpt_stage_gpu_refresh_weights(mp_gpt_stage_gpu *gpu) {
  mp_bf16_from_float_cuda(gpu->weights, gpu->master, gpu->num_params, NULL);
}

mp_status mp_gpt_stage_gpu_download_params(mp_gpt_stage_gpu *gpu, mp_error *err) {
  return mp_device_copy_to_host(mp_gpt_tp_params(gpu->host), gpu->master,
                                gpu->num_params * sizeof(float), err);
}

mp_status mp_gpt_stage_gpu_download_state(mp_gpt_stage_gpu *gpu, float *adam_m, float *adam_v,
                                          mp_error *err) {
  const size_t bytes = gpu->moments_count * sizeof(float);
  MP_TRY(mp_gpt_stage_gpu_download_params(gpu, err));
  MP_TRY(mp_device_copy_to_host(adam_m, gpu->adam_m, bytes, err));
  return mp_device_copy_to_host(adam_v, gpu->adam_v, bytes, err);
}

mp_status mp_gpt_stage_gpu_upload_state(mp_gpt_stage_gpu *gpu, const float *adam_m,
                                        const float *adam_v, mp_error *err) {
  const size_t bytes = gpu->moments_count * sizeof(float);
  MP_TRY(mp_device_copy_to_device(gpu->master, mp_gpt_tp_params(gpu->host),
                                  gpu->num_params * sizeof(float), err));
  mp_bf16_from_float_cuda(gpu->weights, gpu->master, gpu->num_params, NULL);
  MP_TRY(mp_device_copy_to_device(gpu->adam_m, adam_m, bytes, err));
  MP_TRY(mp_device_copy_to_device(gpu->adam_v, adam_v, bytes, err));
  return mp_device_synchronize(err);
}

mp_status mp_gpt_stage_gpu_download_grads(mp_gpt_stage_gpu *gpu, mp_error *err) {
  return mp_device_copy_to_host(mp_gpt_tp_grads(gpu->host), gpu->grads,
                                gpu->num_params * sizeof(float), err);
}

mp_status mp_gpt_stage_gpu_zero_grads(mp_gpt_stage_gpu *gpu, mp_error *err) {
  return mp_device_memset(gpu->grads, 0, gpu->num_params * sizeof(float), err);
}

void mp_gpt_stage_gpu_set_grads_hook(mp_gpt_stage_gpu *gpu, mp_gpt_stage_gpu_grads_hook hook,
                                     void *context) {
  gpu->grads_hook = hook;
  gpu->grads_hook_context = context;
}

void mp_gpt_stage_gpu_blocks_range(const mp_gpt_stage_gpu *gpu, size_t *first, size_t *end) {
  const int L = gpu->stage.num_layers;
  *first = L > 0 ? gpu->block_first[0] : 0;
  *end = L > 0 ? gpu->block_first[L - 1] + gpu->block_count[L - 1] : 0;
}

void mp_gpt_stage_gpu_scale_grads(mp_gpt_stage_gpu *gpu, float scale) {
  mp_grad_scale_cuda(gpu->grads, gpu->num_params, scale, NULL);
}

/* x (rows, cols) bf16, each rank's partial sum: summed over the group in fp32 (the reduce
 * buffer), the bias added, rounded once. */
static mp_status sum_over_group(mp_gpt_stage_gpu *gpu, mp_bf16 *x, const mp_bf16 *bias, int rows,
                                int cols, mp_error *err) {
  const size_t n = (size_t)rows * (size_t)cols;
  mp_float_from_bf16_cuda(gpu->reduce, x, n, NULL);
  MP_TRY(mp_tp_all_reduce_sum(&gpu->tp, gpu->reduce, n, err));
  mp_bf16_from_float_bias_cuda(x, gpu->reduce, bias, rows, cols, NULL);
  return MP_OK;
}

/* Sequence parallelism into a tensor-parallel region (Megatron's gather_from_sequence_parallel_
 * region): full (BT, C) = every rank's slice (BTl, C) in rank order, through fp32 (exact both
 * ways). slice may be full's own rows [row0, row0 + BTl). */
static mp_status gather_sequence(mp_gpt_stage_gpu *gpu, mp_bf16 *full, const mp_bf16 *slice,
                                 mp_error *err) {
  const size_t n_local = (size_t)gpu->BTl * (size_t)gpu->C;
  mp_float_from_bf16_cuda(gpu->slice, slice, n_local, NULL);
  MP_TRY(mp_tp_all_gather(&gpu->tp, gpu->slice, gpu->reduce, n_local, err));
  mp_bf16_from_float_cuda(full, gpu->reduce, n_local * (size_t)gpu->tp.size, NULL);
  return MP_OK;
}

/* Sequence parallelism out of a tensor-parallel region (reduce_scatter_to_sequence_parallel_
 * region): slice (BTl, C) = this rank's rows of partial (BT, C), each rank's partial sum, summed
 * over the group in fp32, + bias (or NULL), rounded once. slice may be partial's first rows
 * (partial is widened whole before slice is written). */
static mp_status scatter_sequence(mp_gpt_stage_gpu *gpu, mp_bf16 *slice, const mp_bf16 *partial,
                                  const mp_bf16 *bias, mp_error *err) {
  const size_t n_local = (size_t)gpu->BTl * (size_t)gpu->C;
  mp_float_from_bf16_cuda(gpu->reduce, partial, n_local * (size_t)gpu->tp.size, NULL);
  MP_TRY(mp_tp_reduce_scatter_sum(&gpu->tp, gpu->reduce, gpu->slice, n_local, err));
  mp_bf16_from_float_bias_cuda(slice, gpu->slice, bias, gpu->BTl, gpu->C, NULL);
  return MP_OK;
}

/* out (BT, OC) = inp (BT, Cl) @ weight^T summed over the group, + bias: a row-parallel linear
 * layer's forward (Megatron's RowParallelLinear). With sequence parallelism (OC = C) only this
 * rank's rows of the sum, in out's first BTl rows. With tp = 1, the one-GPU model's call. */
static mp_status row_parallel_forward(mp_gpt_stage_gpu *gpu, mp_bf16 *out, const mp_bf16 *inp,
                                      const mp_bf16 *weight, const mp_bf16 *bias, int Cl, int OC,
                                      mp_error *err) {
  const int BT = gpu->B * gpu->T;
  if (gpu->tp.size == 1) {
    mp_matmul_forward_cuda(gpu->cublas, out, inp, weight, bias, BT, Cl, OC, NULL);
    return MP_OK;
  }
  mp_matmul_forward_cuda(gpu->cublas, out, inp, weight, NULL, BT, Cl, OC, NULL);
  if (gpu->sp) return scatter_sequence(gpu, out, out, bias, err);
  return sum_over_group(gpu, out, bias, BT, OC, err);
}

/* The gradient of a column-parallel layer's replicated input (BT, C): each rank holds the part
 * through its output channels; summed over the group. With sequence parallelism only this rank's
 * rows of the sum, in dinp's first BTl rows (the gradient of its slice of the layernorm output). */
static mp_status column_parallel_input_grad(mp_gpt_stage_gpu *gpu, mp_bf16 *dinp, mp_error *err) {
  if (gpu->tp.size == 1) return MP_OK;
  if (gpu->sp) return scatter_sequence(gpu, dinp, dinp, NULL, err);
  return sum_over_group(gpu, dinp, NULL, gpu->B * gpu->T, gpu->C, err);
}

static mp_status check_slot(const mp_gpt_stage_gpu *gpu, int slot, bool want_in_use,
                            mp_error *err) {
  if (slot < 0 || slot >= gpu->num_slots) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d: the stage has %d", slot,
                   gpu->num_slots);
  }
  if (gpu->slots[slot].in_use != want_in_use) {
    return mp_fail(err, MP_ERR_INPUT, "activation slot %d is %s", slot,
                   want_in_use ? "empty: no forward ran into it" : "still holding a micro-batch");
  }
  return MP_OK;
}

static mp_status embedding_forward(mp_gpt_stage_gpu *gpu, slot_acts *s, mp_error *err) {
  const int B = gpu->B, T = gpu->T, C = gpu->C;
  if (gpu->tp.size == 1) {
    mp_embedding_forward_cuda(s->input, s->inputs, gpu->wte, gpu->wpe, B, T, C, NULL);
    return MP_OK;
  }
  /* Megatron's VocabParallelEmbedding: each rank looks up the tokens of its vocabulary rows,
   * zeros elsewhere; the sum over the group is the whole lookup. */
  mp_vocab_embedding_lookup_cuda(gpu->reduce, s->inputs, gpu->wte, gpu->vocab_start, gpu->Vl,
                                 B * T, C, NULL);
  if (gpu->sp) {
    /* Summed onto this rank's token slice only, with the positions of its rows. */
    MP_TRY(mp_tp_reduce_scatter_sum(&gpu->tp, gpu->reduce, gpu->slice, (size_t)gpu->BTl * C,
                                    err));
    mp_add_position_rows_cuda(s->input, gpu->slice, gpu->wpe, gpu->row0, gpu->BTl, T, C, NULL);
    return MP_OK;
  }
  MP_TRY(mp_tp_all_reduce_sum(&gpu->tp, gpu->reduce, (size_t)B * T * C, err));
  mp_add_position_cuda(s->input, gpu->reduce, gpu->wpe, B, T, C, NULL);
  return MP_OK;
}

static mp_status embedding_backward(mp_gpt_stage_gpu *gpu, const slot_acts *s, mp_error *err) {
  const int B = gpu->B, T = gpu->T, C = gpu->C, BT = B * T;
  if (gpu->tp.size == 1) {
    mp_embedding_backward_cuda(gpu->dwte, gpu->dwpe, gpu->dresidual, s->inputs, s->inputs_host,
                               gpu->embedding_workspace, B, T, C, NULL);
    return MP_OK;
  }
  /* The one-GPU kernel on rows of this rank's shard: a token of another rank's range goes to an
   * extra row that is then dropped. wpe is replicated: every rank adds the whole gradient (with
   * sequence parallelism, of every rank's token slice, all-gathered). */
  const mp_bf16 *dout = gpu->dresidual;
  if (gpu->sp) {
    MP_TRY(gather_sequence(gpu, gpu->dout_total, gpu->dresidual, err));
    dout = gpu->dout_total;
  }
  for (int i = 0; i < BT; ++i) {
    const int row = s->inputs_host[i] - gpu->vocab_start;
    gpu->shard_tokens_host[i] = row >= 0 && row < gpu->Vl ? row : gpu->Vl;
  }
  MP_TRY(mp_device_copy_to_device(gpu->shard_tokens, gpu->shard_tokens_host,
                                  (size_t)BT * sizeof(int32_t), err));
  const size_t rows_floats = ((size_t)gpu->Vl + 1) * (size_t)C;
  MP_TRY(mp_device_memset(gpu->dwte_rows, 0, rows_floats * sizeof(float), err));
  mp_embedding_backward_cuda(gpu->dwte_rows, gpu->dwpe, dout, gpu->shard_tokens,
                             gpu->shard_tokens_host, gpu->embedding_workspace, B, T, C, NULL);
  mp_add_f32_cuda(gpu->dwte, gpu->dwte_rows, (size_t)gpu->Vl * (size_t)C, NULL);
  return MP_OK;
}

/* The LM head's loss: fused in one kernel on one rank; over the group, Megatron's
 * vocabulary-parallel cross-entropy (row maxima, then sums of exponentials and target logits,
 * each combined over the group). Leaves dlogits in s->logits and the per-token losses in
 * gpu->losses. */
static mp_status cross_entropy(mp_gpt_stage_gpu *gpu, slot_acts *s, float dloss, mp_error *err) {
  const int BT = gpu->B * gpu->T;
  if (gpu->tp.size == 1) {
    mp_cross_entropy_fused_cuda(gpu->losses, s->logits, s->targets, dloss, gpu->B, gpu->T, gpu->V,
                                gpu->Vp, NULL);
    return MP_OK;
  }
  mp_vocab_ce_max_cuda(gpu->row_max, s->logits, BT, gpu->Vl, gpu->vocab_start, gpu->V, NULL);
  MP_TRY(mp_tp_all_gather(&gpu->tp, gpu->row_max, gpu->gathered_max, (size_t)BT, err));
  mp_max_over_ranks_cuda(gpu->row_max, gpu->gathered_max, gpu->tp.size, BT, NULL);
  mp_vocab_ce_partials_cuda(gpu->ce_stats, s->logits, s->targets, gpu->row_max, BT, gpu->Vl,
                            gpu->vocab_start, gpu->V, NULL);
  MP_TRY(mp_tp_all_reduce_sum(&gpu->tp, gpu->ce_stats, 2 * (size_t)BT, err));
  mp_vocab_ce_finish_cuda(gpu->losses, s->logits, s->targets, gpu->row_max, gpu->ce_stats, dloss,
                          BT, gpu->Vl, gpu->vocab_start, gpu->V, NULL);
  return MP_OK;
}

static mp_status block_forward(mp_gpt_stage_gpu *gpu, int l, block_acts *a, const mp_bf16 *x,
                               mp_error *err) {
  const int B = gpu->B, T = gpu->T, C = gpu->C, BT = B * T, Cl = gpu->Cl, Fl = gpu->Fl;
  const int BTl = gpu->BTl;
  const size_t mine = (size_t)gpu->row0 * (size_t)C; /* this rank's rows of a (BT, C) input */
  const block_weights *w = &gpu->blocks[l];
  mp_layernorm_forward_cuda(a->ln1 + mine, a->ln1_mean, a->ln1_rstd, x, w->ln1w, w->ln1b, 1, BTl,
                            C, NULL);
  if (gpu->sp) MP_TRY(gather_sequence(gpu, a->ln1, a->ln1 + mine, err));
  mp_matmul_forward_cuda(gpu->cublas, a->qkv, a->ln1, w->qkvw, w->qkvb, BT, C, 3 * Cl, NULL);
  if (gpu->fused_attention) {
    mp_flash_attention_forward_cuda(a->atty, a->lse, a->qkv, B, T, gpu->NHl, gpu->HS, NULL);
  } else {
    mp_attention_forward_cuda(gpu->cublas, a->atty, a->att, a->qkv, gpu->attention_scratch, B, T,
                              gpu->NHl, gpu->HS, NULL);
  }
  MP_TRY(row_parallel_forward(gpu, gpu->projection, a->atty, w->attprojw, w->attprojb, Cl, C,
                              err));
  mp_residual_forward_cuda(a->residual2, x, gpu->projection, (size_t)BTl * C, NULL);
  mp_layernorm_forward_cuda(a->ln2 + mine, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2w,
                            w->ln2b, 1, BTl, C, NULL);
  if (gpu->sp) MP_TRY(gather_sequence(gpu, a->ln2, a->ln2 + mine, err));
  mp_matmul_forward_cuda(gpu->cublas, a->fch, a->ln2, w->fcw, w->fcb, BT, C, Fl, NULL);
  mp_gelu_forward_cuda(a->fch_gelu, a->fch, (size_t)BT * Fl, NULL);
  MP_TRY(row_parallel_forward(gpu, gpu->projection, a->fch_gelu, w->fcprojw, w->fcprojb, Fl, C,
                              err));
  mp_residual_forward_cuda(a->out, a->residual2, gpu->projection, (size_t)BTl * C, NULL);
  return MP_OK;
}

/* The gradient of a row-parallel GEMM's output (BT, C) into *out: dresidual itself, or with
 * sequence parallelism every rank's slice of it all-gathered (into keep, or dout_total). keep
 * (zero-bubble's deferral) receives it for the block's W: gathered there, or copied. */
static mp_status row_parallel_output_grad(mp_gpt_stage_gpu *gpu, mp_bf16 *keep,
                                          const mp_bf16 **out, mp_error *err) {
  if (gpu->sp) {
    mp_bf16 *total = keep != NULL ? keep : gpu->dout_total;
    MP_TRY(gather_sequence(gpu, total, gpu->dresidual, err));
    *out = total;
    return MP_OK;
  }
  if (keep != NULL) {
    MP_TRY(mp_device_copy_on_device(keep, gpu->dresidual,
                                    (size_t)gpu->B * gpu->T * gpu->C * sizeof(mp_bf16), err));
    *out = keep;
    return MP_OK;
  }
  *out = gpu->dresidual;
  return MP_OK;
}

/* Adds the block's parameter gradients and turns dresidual (the gradient of the block's output)
 * into the gradient of its input inp. With d (zero-bubble's B), the four GEMMs' weight gradients
 * are left out and their output gradients kept in d for block_backward_weights; everything else
 * (the input gradient, the layernorms', the biases') is added as the whole backward adds it, with
 * the same kernels on the same numbers. */
static mp_status block_backward(mp_gpt_stage_gpu *gpu, int l, const block_acts *a,
                                const mp_bf16 *inp, block_deferred *d, mp_error *err) {
  const int B = gpu->B, T = gpu->T, C = gpu->C, BT = B * T, Cl = gpu->Cl, Fl = gpu->Fl;
  const block_weights *w = &gpu->blocks[l];
  const block_grads *g = &gpu->dblocks[l];
  const int BTl = gpu->BTl;
  const size_t act_bytes = (size_t)BT * C * sizeof(mp_bf16);
  mp_cublas *cublas = gpu->cublas;
  const bool defer = d != NULL;
  mp_bf16 *dfch = defer ? d->dfch : gpu->dfch;
  mp_bf16 *dqkv = defer ? d->dqkv : gpu->dqkv;
  /* The MLP branch. fc_proj is row-parallel: its input gradient is this rank's channels, its
   * bias gradient whole (dout is replicated). */
  const mp_bf16 *dout = NULL;
  MP_TRY(row_parallel_output_grad(gpu, defer ? d->dfcproj : NULL, &dout, err));
  MP_TRY(mp_device_memset(gpu->dfch_gelu, 0, (size_t)BT * Fl * sizeof(mp_bf16), err));
  mp_matmul_backward_cuda(cublas, gpu->dfch_gelu, defer ? NULL : g->fcprojw, g->fcprojb, dout,
                          a->fch_gelu, w->fcprojw, gpu->matmul_scratch, BT, Fl, C, NULL);
  MP_TRY(mp_device_memset(dfch, 0, (size_t)BT * Fl * sizeof(mp_bf16), err));
  mp_gelu_backward_cuda(dfch, a->fch, gpu->dfch_gelu, (size_t)BT * Fl, NULL);
  MP_TRY(mp_device_memset(gpu->dnorm, 0, act_bytes, err));
  mp_matmul_backward_cuda(cublas, gpu->dnorm, defer ? NULL : g->fcw, g->fcb, dfch, a->ln2, w->fcw,
                          gpu->matmul_scratch, BT, C, Fl, NULL);
  MP_TRY(column_parallel_input_grad(gpu, gpu->dnorm, err));
  mp_layernorm_backward_cuda(gpu->dresidual, g->ln2w, g->ln2b, gpu->dnorm, a->residual2, w->ln2w,
                             a->ln2_mean, a->ln2_rstd, gpu->layernorm_scratch, 1, BTl, C, NULL);
  /* The attention branch. */
  MP_TRY(row_parallel_output_grad(gpu, defer ? d->dattproj : NULL, &dout, err));
  MP_TRY(mp_device_memset(gpu->datty, 0, (size_t)BT * Cl * sizeof(mp_bf16), err));
  mp_matmul_backward_cuda(cublas, gpu->datty, defer ? NULL : g->attprojw, g->attprojb, dout,
                          a->atty, w->attprojw, gpu->matmul_scratch, BT, Cl, C, NULL);
  MP_TRY(mp_device_memset(dqkv, 0, (size_t)BT * 3 * Cl * sizeof(mp_bf16), err));
  if (gpu->fused_attention) {
    mp_flash_attention_backward_cuda(dqkv, gpu->datty, a->qkv, a->atty, a->lse,
                                     gpu->attention_scratch, B, T, gpu->NHl, gpu->HS, NULL);
  } else {
    mp_attention_backward_cuda(cublas, dqkv, gpu->datty, a->qkv, a->att, gpu->attention_scratch,
                               B, T, gpu->NHl, gpu->HS, NULL);
  }
  MP_TRY(mp_device_memset(gpu->dnorm, 0, act_bytes, err));
  mp_matmul_backward_cuda(cublas, gpu->dnorm, defer ? NULL : g->qkvw, g->qkvb, dqkv, a->ln1,
                          w->qkvw, gpu->matmul_scratch, BT, C, 3 * Cl, NULL);
  MP_TRY(column_parallel_input_grad(gpu, gpu->dnorm, err));
  mp_layernorm_backward_cuda(gpu->dresidual, g->ln1w, g->ln1b, gpu->dnorm, inp, w->ln1w,
                             a->ln1_mean, a->ln1_rstd, gpu->layernorm_scratch, 1, BTl, C, NULL);
  return MP_OK;
}

/* Zero-bubble's W of one block: the four GEMM weight gradients block_backward left out, from the
 * output gradients it kept in d and the forward's activations; no collective (each rank's shard
 * of a weight gradient is its own). */
static void block_backward_weights(mp_gpt_stage_gpu *gpu, int l, const block_acts *a,
                                   const block_deferred *d) {
  const int BT = gpu->B * gpu->T, C = gpu->C, Cl = gpu->Cl, Fl = gpu->Fl;
  const block_grads *g = &gpu->dblocks[l];
  mp_cublas *cublas = gpu->cublas;
  mp_matmul_backward_cuda(cublas, NULL, g->fcprojw, NULL, d->dfcproj, a->fch_gelu, NULL, NULL, BT,
                          Fl, C, NULL);
  mp_matmul_backward_cuda(cublas, NULL, g->fcw, NULL, d->dfch, a->ln2, NULL, NULL, BT, C, Fl,
                          NULL);
  mp_matmul_backward_cuda(cublas, NULL, g->attprojw, NULL, d->dattproj, a->atty, NULL, NULL, BT,
                          Cl, C, NULL);
  mp_matmul_backward_cuda(cublas, NULL, g->qkvw, NULL, d->dqkv, a->ln1, NULL, NULL, BT, C, 3 * Cl,
                          NULL);
}

/* The last activation of the stage before its final norm or head. */
static const mp_bf16 *before_tail(const mp_gpt_stage_gpu *gpu, const slot_acts *s) {
  const int L = gpu->stage.num_layers;
  return L > 0 ? s->acts[L - 1].out : s->input;
}

/* A stage boundary (BTl, C) fp32 on the device -> dst bf16 (the one rounding a one-GPU model
 * makes there too). */
static void boundary_in(mp_gpt_stage_gpu *gpu, mp_bf16 *dst, const float *boundary) {
  mp_bf16_from_float_cuda(dst, boundary, (size_t)gpu->BTl * gpu->C, NULL);
}

/* src bf16 -> a stage boundary (BTl, C) fp32 on the device, exactly. */
static void boundary_out(mp_gpt_stage_gpu *gpu, float *boundary, const mp_bf16 *src) {
  mp_float_from_bf16_cuda(boundary, src, (size_t)gpu->BTl * gpu->C, NULL);
}

/* The enqueued work's errors that no call returned: a failed cuBLAS call, a failed launch (each
 * named where it happened; layers/cuda_launch.h). */
static mp_status kernels_check(mp_gpt_stage_gpu *gpu, mp_error *err) {
  MP_TRY(mp_cublas_check(gpu->cublas, err));
  return mp_cuda_take_launch_failure(err);
}

/* The stage's forward of micro-batch s. Recomputing (full recomputation, at the backward): the
 * slot already holds its tokens, targets, input and dloss; the embedding is not run again (its
 * output is the slot's input), output is NULL and no loss is reported. The same kernels and
 * collectives on the same numbers: the activations come back bit for bit, on every tp rank
 * together. */
static mp_status stage_forward(mp_gpt_stage_gpu *gpu, slot_acts *s, const int32_t *inputs,
                               const int32_t *targets, const float *input, float *output,
                               double *loss, bool recomputing, mp_error *err) {
  const mp_gpt_stage *st = &gpu->stage;
  const int B = gpu->B, T = gpu->T, C = gpu->C, BT = B * T;
  const size_t token_bytes = (size_t)BT * sizeof(int32_t);
  if (recomputing) {
    /* s->input holds the embedding's output or the received boundary */
  } else if (st->embedding) {
    memcpy(s->inputs_host, inputs, token_bytes);
    MP_TRY(mp_device_copy_to_device(s->inputs, inputs, token_bytes, err));
    MP_TRY(embedding_forward(gpu, s, err));
  } else {
    boundary_in(gpu, s->input, input);
  }
  const mp_bf16 *x = s->input;
  for (int l = 0; l < st->num_layers; ++l) {
    MP_TRY(block_forward(gpu, l, &s->acts[l], x, err));
    x = s->acts[l].out;
  }
  if (st->final_norm) {
    mp_layernorm_forward_cuda(s->lnf, s->lnf_mean, s->lnf_rstd, x, gpu->lnfw, gpu->lnfb, 1,
                              gpu->BTl, C, NULL);
    x = s->lnf;
  }
  if (!st->head) {
    if (output != NULL) boundary_out(gpu, output, x);
    return kernels_check(gpu, err);
  }
  if (!recomputing) MP_TRY(mp_device_copy_to_device(s->targets, targets, token_bytes, err));
  /* The LM head, tied to this rank's rows of wte: the logits of its vocabulary range, for every
   * token (with sequence parallelism its input all-gathered first). */
  if (gpu->sp) {
    MP_TRY(gather_sequence(gpu, s->head_input, x, err));
    x = s->head_input;
  }
  mp_matmul_forward_cuda(gpu->cublas, s->logits, x, gpu->wte, NULL, BT, C, gpu->Vl, NULL);
  MP_TRY(cross_entropy(gpu, s, s->dloss, err));
  MP_TRY(mp_cublas_check(gpu->cublas, err));
  if (recomputing) return MP_OK;
  MP_TRY(mp_device_copy_to_host(gpu->losses_host, gpu->losses, (size_t)BT * sizeof(float), err));
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += gpu->losses_host[i];
  *loss = sum / (double)BT;
  return MP_OK;
}

mp_status mp_gpt_stage_gpu_forward(mp_gpt_stage_gpu *gpu, int slot, const int32_t *inputs,
                                   const int32_t *targets, const float *input, float *output,
                                   float dloss, double *loss, mp_error *err) {
  MP_TRY(check_slot(gpu, slot, false, err));
  slot_acts *s = &gpu->slots[slot];
  s->dloss = dloss;
  MP_TRY(stage_forward(gpu, s, inputs, targets, input, output, loss, false, err));
  s->in_use = true;
  return kernels_check(gpu, err);
}

void mp_gpt_stage_gpu_discard(mp_gpt_stage_gpu *gpu, int slot) {
  if (slot >= 0 && slot < gpu->num_slots) {
    gpu->slots[slot].in_use = false;
    gpu->slots[slot].weights_pending = false;
  }
}

mp_status mp_gpt_stage_gpu_backward(mp_gpt_stage_gpu *gpu, int slot, const float *doutput,
                                    float *dinput, bool defer_weights, mp_error *err) {
  MP_TRY(check_slot(gpu, slot, true, err));
  if (defer_weights && !gpu->deferred_weights) {
    return mp_fail(err, MP_ERR_INPUT,
                   "a deferred backward needs a stage created with deferred weights");
  }
  slot_acts *s = &gpu->slots[slot];
  if (s->weights_pending) {
    return mp_fail(err, MP_ERR_INPUT,
                   "activation slot %d already ran its backward; its weight gradients (W) are "
                   "pending",
                   slot);
  }
  const mp_gpt_stage *st = &gpu->stage;
  const int B = gpu->B, T = gpu->T, C = gpu->C, BT = B * T, L = st->num_layers;
  const size_t act_bytes = (size_t)BT * C * sizeof(mp_bf16);
  if (s->light) {
    /* Full recomputation: the forward again into the shared activations (every tp rank does). */
    MP_TRY(stage_forward(gpu, s, NULL, NULL, NULL, NULL, NULL, true, err));
  }
  const mp_bf16 *tail_input = before_tail(gpu, s);
  /* g: the gradient of the stage's last activation (the final norm's output, or the blocks'). */
  mp_bf16 *g = st->final_norm ? gpu->dnorm : gpu->dresidual;
  if (st->head) {
    const mp_bf16 *head_input = gpu->sp ? s->head_input : st->final_norm ? s->lnf : tail_input;
    MP_TRY(mp_device_memset(g, 0, act_bytes, err));
    mp_matmul_backward_cuda(gpu->cublas, g, gpu->dwte, NULL, s->logits, head_input, gpu->wte,
                            gpu->matmul_scratch, BT, C, gpu->Vl, NULL);
    MP_TRY(column_parallel_input_grad(gpu, g, err));
  } else {
    boundary_in(gpu, g, doutput);
  }
  if (st->final_norm) {
    MP_TRY(mp_device_memset(gpu->dresidual, 0, act_bytes, err));
    mp_layernorm_backward_cuda(gpu->dresidual, gpu->dlnfw, gpu->dlnfb, gpu->dnorm, tail_input,
                               gpu->lnfw, s->lnf_mean, s->lnf_rstd, gpu->layernorm_scratch, 1,
                               gpu->BTl, C, NULL);
  }
  for (int l = L - 1; l >= 0; --l) {
    const mp_bf16 *inp = l == 0 ? s->input : s->acts[l - 1].out;
    MP_TRY(block_backward(gpu, l, &s->acts[l], inp, defer_weights ? &s->deferred[l] : NULL,
                          err));
    if (gpu->grads_hook != NULL && !defer_weights) {
      MP_TRY(gpu->grads_hook(gpu->grads_hook_context, gpu->grads + gpu->block_first[l],
                             gpu->block_count[l], err));
    }
  }
  /* Zero-bubble: the slot's activations and kept gradients feed its W. */
  s->weights_pending = defer_weights;
  s->in_use = defer_weights;
  if (st->embedding) {
    MP_TRY(embedding_backward(gpu, s, err));
    return kernels_check(gpu, err);
  }
  boundary_out(gpu, dinput, gpu->dresidual);
  return kernels_check(gpu, err);
}

mp_status mp_gpt_stage_gpu_backward_weights(mp_gpt_stage_gpu *gpu, int slot, mp_error *err) {
  MP_TRY(check_slot(gpu, slot, true, err));
  slot_acts *s = &gpu->slots[slot];
  if (!s->weights_pending) {
    return mp_fail(err, MP_ERR_INPUT,
                   "activation slot %d has no deferred weight gradients (its backward was whole, "
                   "or has not run)",
                   slot);
  }
  for (int l = gpu->stage.num_layers - 1; l >= 0; --l) {
    block_backward_weights(gpu, l, &s->acts[l], &s->deferred[l]);
    if (gpu->grads_hook != NULL) {
      MP_TRY(gpu->grads_hook(gpu->grads_hook_context, gpu->grads + gpu->block_first[l],
                             gpu->block_count[l], err));
    }
  }
  s->weights_pending = false;
  s->in_use = false;
  return kernels_check(gpu, err);
}

/* w (C) and b (C) summed over the tensor-parallel group: one collective when b follows w (the
 * layout keeps a layernorm's weight and bias next to each other). */
static mp_status sum_norm_grads(mp_gpt_stage_gpu *gpu, float *w, float *b, mp_error *err) {
  const size_t C = (size_t)gpu->C;
  if (b == w + C) return mp_tp_all_reduce_sum(&gpu->tp, w, 2 * C, err);
  MP_TRY(mp_tp_all_reduce_sum(&gpu->tp, w, C, err));
  return mp_tp_all_reduce_sum(&gpu->tp, b, C, err);
}

mp_status mp_gpt_stage_gpu_finish_grads(mp_gpt_stage_gpu *gpu, mp_error *err) {
  if (!gpu->sp) return MP_OK;
  for (int l = 0; l < gpu->stage.num_layers; ++l) {
    const block_grads *g = &gpu->dblocks[l];
    MP_TRY(sum_norm_grads(gpu, g->ln1w, g->ln1b, err));
    MP_TRY(sum_norm_grads(gpu, g->ln2w, g->ln2b, err));
  }
  if (gpu->stage.final_norm) MP_TRY(sum_norm_grads(gpu, gpu->dlnfw, gpu->dlnfb, err));
  return MP_OK;
}

mp_status mp_gpt_stage_gpu_grad_norm_squared(mp_gpt_stage_gpu *gpu, double *out, mp_error *err) {
  /* Each reduction waits for the GPU, so neighbouring tensors that count alike (replicated, or
   * sharded; at tp = 1 all of them) are reduced as one run, its sum booked on the run's first
   * tensor: mp_gpt_tp_norm_from_squares only adds them up by kind. */
  const int n = mp_gpt_tp_num_tensors(gpu->host);
  double *squares = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (squares == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  mp_status status = MP_OK;
  for (int i = 0; i < n && status == MP_OK;) {
    const mp_gpt_tp_tensor *first = mp_gpt_tp_tensor_at(gpu->host, i);
    if (first->tied_copy) {
      ++i;
      continue;
    }
    const bool replicated = first->split == MP_TP_REPLICATED || gpu->tp.size == 1;
    int end = i + 1;
    size_t count = first->count;
    for (; end < n; ++end) {
      const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(gpu->host, end);
      const bool same = t->split == MP_TP_REPLICATED || gpu->tp.size == 1;
      if (t->tied_copy || same != replicated || t->offset != first->offset + count) break;
      count += t->count;
    }
    status = mp_grad_norm_squared_cuda(gpu->grads + first->offset, count, gpu->norm_scratch,
                                       &squares[i], NULL, err);
    i = end;
  }
  if (status == MP_OK) status = mp_gpt_tp_norm_from_squares(gpu->host, squares, out, err);
  free(squares);
  return status;
}

mp_status mp_gpt_stage_gpu_adamw(mp_gpt_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err) {
  /* Tensor by tensor (weight decay is a property of the tensor), over the elements whose
   * moments this rank keeps: all, or its ZeRO-1 part. */
  const size_t first = gpu->moments_first, end = first + gpu->moments_count;
  for (int i = 0; i < mp_gpt_tp_num_tensors(gpu->host); ++i) {
    const mp_gpt_tp_tensor *t = mp_gpt_tp_tensor_at(gpu->host, i);
    const size_t lo = t->offset > first ? t->offset : first;
    const size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
    if (lo >= hi) continue;
    mp_adamw_update_cuda(gpu->master + lo, gpu->weights + lo, gpu->grads + lo,
                         gpu->adam_m + (lo - first), gpu->adam_v + (lo - first), hi - lo,
                         adamw->learning_rate, adamw->beta1, adamw->beta2, adamw->eps,
                         t->full->weight_decay ? adamw->weight_decay : 0.0f, adamw->step, NULL);
  }
  return mp_device_synchronize(err);
}
