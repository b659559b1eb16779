/*
 * layers/layernorm.h — layer normalisation over the channels of each token, as in GPT-2.
 *
 * Each row of C channels is shifted to mean 0 and scaled to variance 1 (the biased variance, over
 * C, plus MP_LAYERNORM_EPS), then scaled by weight and shifted by bias per channel. The forward
 * keeps each row's mean and 1/std so the backward does not recompute them (llm.c's layout).
 *
 * These calls cannot fail: shapes are the caller's contract and no memory is allocated. A later
 * CUDA twin (_cuda) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_LAYERNORM_H
#define MPENGINE_LAYERS_LAYERNORM_H

#ifdef __cplusplus
extern "C" {
#endif

/* GPT-2's epsilon, added to the variance before the square root. */
#define MP_LAYERNORM_EPS 1e-5f

/* out = (inp - mean) * rstd * weight + bias, row by row.
 *   out    (B, T, C)  written
 *   mean   (B, T)     written, or NULL when no backward follows
 *   rstd   (B, T)     written (1 / sqrt(var + eps)), or NULL when no backward follows
 *   inp    (B, T, C)
 *   weight (C)
 *   bias   (C) */
void mp_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int B, int T, int C);

/* Backward of mp_layernorm_forward_cpu; adds (+=) into dinp, dweight and dbias.
 *   dinp    (B, T, C)  +=
 *   dweight (C)        +=
 *   dbias   (C)        +=
 *   dout    (B, T, C)
 *   inp     (B, T, C)  the forward's input
 *   weight  (C)
 *   mean    (B, T)     as the forward wrote it
 *   rstd    (B, T)     as the forward wrote it */
void mp_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_LAYERNORM_H */
