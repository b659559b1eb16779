/*
 * layers/rmsnorm.h — root-mean-square normalisation over the channels of each token, as in the
 * Llama family (Zhang and Sennrich 2019; Hugging Face's LlamaRMSNorm, computed in fp32).
 *
 * Each row of C channels is divided by its root mean square, sqrt(mean(x^2) + eps), then scaled
 * by weight per channel; no mean is subtracted and there is no bias. The forward keeps each row's
 * 1/rms for the backward. The calls cannot fail: shapes are the caller's contract. The CUDA twin
 * comes with the Llama family's GPU path.
 */
#ifndef MPENGINE_LAYERS_RMSNORM_H
#define MPENGINE_LAYERS_RMSNORM_H

#ifdef __cplusplus
extern "C" {
#endif

/* out = inp * rstd * weight, row by row.
 *   out    (rows, C)  written
 *   rstd   (rows)     written (1 / sqrt(mean(inp^2) + eps)), or NULL when no backward follows
 *   inp    (rows, C)
 *   weight (C)
 *   eps    the model's norm_eps (Llama 3: 1e-5, Llama 2: 1e-6) */
void mp_rmsnorm_forward_cpu(float *out, float *rstd, const float *inp, const float *weight,
                            int rows, int C, float eps);

/* Backward of mp_rmsnorm_forward_cpu; adds (+=) into dinp and dweight.
 *   dinp    (rows, C)  +=
 *   dweight (C)        += (summed over the rows)
 *   dout    (rows, C)
 *   inp     (rows, C)  the forward's input
 *   weight  (C)
 *   rstd    (rows)     as the forward wrote it */
void mp_rmsnorm_backward_cpu(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int rows, int C);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_RMSNORM_H */
