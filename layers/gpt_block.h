/*
 * layers/gpt_block.h — one GPT-2 transformer block, forward and backward, on one device.
 *
 *   ln1 = layernorm(inp)            qkv = ln1 @ qkvw^T + qkvb       atty = attention(qkv)
 *   residual2 = inp + atty @ attprojw^T + attprojb
 *   ln2 = layernorm(residual2)      fch = ln2 @ fcw^T + fcb         fch_gelu = gelu(fch)
 *   out = residual2 + fch_gelu @ fcprojw^T + fcprojb
 *
 * It composes the layer kernels (matmul.h, layernorm.h, attention.h, gelu.h, residual.h) over
 * three structs of named pointers, llm.c's ParameterTensors and ActivationTensors for one layer.
 * The caller owns the memory: the _point functions cut the pointers out of one allocation of
 * _count floats, so a parameter set is one flat array that AdamW and gradient clipping can walk.
 * Serves the one-rank engine and is the reference that tensor-parallel blocks are tested against.
 */
#ifndef MPENGINE_LAYERS_GPT_BLOCK_H
#define MPENGINE_LAYERS_GPT_BLOCK_H

#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes of one block's run: B sequences of T tokens, C channels, NH heads of C / NH channels,
 * and F channels in the MLP (4C in GPT-2). */
typedef struct {
  int B;
  int T;
  int C;
  int NH;
  int F;
} mp_gpt_block_shape;

/* Returns MP_OK, or MP_ERR_INPUT with a message in err (which may be NULL) when a size is not
 * positive or C is not a multiple of NH. The other calls trust a checked shape. */
mp_status mp_gpt_block_shape_check(const mp_gpt_block_shape *shape, mp_error *err);

/* One block's parameters (or their gradients), in llm.c's per-layer order. */
typedef struct {
  float *ln1w;     /* (C) */
  float *ln1b;     /* (C) */
  float *qkvw;     /* (3C, C) */
  float *qkvb;     /* (3C) */
  float *attprojw; /* (C, C) */
  float *attprojb; /* (C) */
  float *ln2w;     /* (C) */
  float *ln2b;     /* (C) */
  float *fcw;      /* (F, C) */
  float *fcb;      /* (F) */
  float *fcprojw;  /* (C, F) */
  float *fcprojb;  /* (C) */
} mp_gpt_block_params;

/* Number of floats in one block's parameters: 4C^2 + 2CF + 9C + F. */
size_t mp_gpt_block_params_count(int C, int F);

/* Points every field of params into memory, in the order above; returns the floats used
 * (mp_gpt_block_params_count). */
size_t mp_gpt_block_params_point(mp_gpt_block_params *params, float *memory, int C, int F);

/* What the forward keeps for the backward. */
typedef struct {
  float *ln1;       /* (B, T, C) */
  float *ln1_mean;  /* (B, T) */
  float *ln1_rstd;  /* (B, T) */
  float *qkv;       /* (B, T, 3C) */
  float *atty;      /* (B, T, C)  attention output, before the projection */
  float *preatt;    /* (B, NH, T, T) */
  float *att;       /* (B, NH, T, T) */
  float *attproj;   /* (B, T, C) */
  float *residual2; /* (B, T, C)  inp + attproj */
  float *ln2;       /* (B, T, C) */
  float *ln2_mean;  /* (B, T) */
  float *ln2_rstd;  /* (B, T) */
  float *fch;       /* (B, T, F) */
  float *fch_gelu;  /* (B, T, F) */
  float *fcproj;    /* (B, T, C) */
  float *out;       /* (B, T, C)  residual2 + fcproj: the block's output, the next block's input */
} mp_gpt_block_acts;

size_t mp_gpt_block_acts_count(const mp_gpt_block_shape *shape);
size_t mp_gpt_block_acts_point(mp_gpt_block_acts *acts, float *memory,
                               const mp_gpt_block_shape *shape);

/* Gradients of the activations inside the block: working memory of the backward, which
 * overwrites it. */
typedef struct {
  float *dln1;       /* (B, T, C) */
  float *dqkv;       /* (B, T, 3C) */
  float *datty;      /* (B, T, C) */
  float *dpreatt;    /* (B, NH, T, T) */
  float *datt;       /* (B, NH, T, T) */
  float *dresidual2; /* (B, T, C) */
  float *dln2;       /* (B, T, C) */
  float *dfch;       /* (B, T, F) */
  float *dfch_gelu;  /* (B, T, F) */
} mp_gpt_block_scratch;

size_t mp_gpt_block_scratch_count(const mp_gpt_block_shape *shape);
size_t mp_gpt_block_scratch_point(mp_gpt_block_scratch *scratch, float *memory,
                                  const mp_gpt_block_shape *shape);

/* Runs the block on inp (B, T, C); writes every field of acts, the output in acts->out. */
void mp_gpt_block_forward_cpu(const mp_gpt_block_shape *shape, const mp_gpt_block_params *params,
                              mp_gpt_block_acts *acts, const float *inp);

/* Backward of mp_gpt_block_forward_cpu, from dout = d(loss)/d(acts->out).
 *   dinp   (B, T, C)  += gradient of the block's input
 *   grads             += gradient of every parameter (same layout as params)
 *   scratch           overwritten
 *   dout   (B, T, C)
 *   inp    (B, T, C)  the forward's input
 *   params, acts      as the forward used and wrote them */
void mp_gpt_block_backward_cpu(const mp_gpt_block_shape *shape, float *dinp,
                               mp_gpt_block_params *grads, mp_gpt_block_scratch *scratch,
                               const float *dout, const float *inp,
                               const mp_gpt_block_params *params, const mp_gpt_block_acts *acts);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_GPT_BLOCK_H */
