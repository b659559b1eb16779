/*
 * layers/rmsnorm.h — root-mean-square normalisation over the channels of each token, as in the
 * Llama family (Zhang and Sennrich 2019; Hugging Face's LlamaRMSNorm, computed in fp32).
 *
 * Each row of C channels is divided by its root mean square, sqrt(mean(x^2) + eps), then scaled
 * by weight per channel; no mean is subtracted and there is no bias. The forward keeps each row's
 * 1/rms for the backward. The calls cannot fail: shapes are the caller's contract. The CUDA twin
 * (_cuda, at the end of this header) keeps the same shapes on bf16 activations.
 */
#ifndef MPENGINE_LAYERS_RMSNORM_H
#define MPENGINE_LAYERS_RMSNORM_H

#include <stddef.h>

#include "layers/cuda_types.h"

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

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/rmsnorm_cuda.cu, Bazel target //layers:cuda_elementwise), as layernorm.h's:
 * device pointers, bf16 activations and weight, fp32 statistics and weight gradient, enqueued on
 * `stream` without waiting (launch errors surface at the caller's next mp_device_synchronize).
 * Sums in fp32 (over the row by a warp, over the rows tile by tile: another order than the CPU
 * twin's, the same on every run); every bf16 output rounded once, a += as one rounding of
 * old + new. */

/* mp_rmsnorm_forward_cpu on bf16.
 *   out    (rows, C)  bf16, written
 *   rstd   (rows)     fp32, written, or NULL
 *   inp    (rows, C)  bf16
 *   weight (C)        bf16 */
void mp_rmsnorm_forward_cuda(mp_bf16 *out, float *rstd, const mp_bf16 *inp, const mp_bf16 *weight,
                             int rows, int C, float eps, mp_cuda_stream stream);

/* Backward of mp_rmsnorm_forward_cuda. dweight is deterministic: per-tile partial sums go to
 * scratch and a second kernel adds them in a fixed order.
 *   dinp    (rows, C)  bf16 += (must not alias dout or inp)
 *   dweight (C)        fp32 +=
 *   dout    (rows, C)  bf16
 *   inp     (rows, C)  bf16, the forward's input
 *   weight  (C)        bf16
 *   rstd    (rows)     fp32, as the forward wrote it
 *   scratch            mp_rmsnorm_backward_cuda_scratch_floats(rows, C) device floats, free for
 *                      this call until the stream has run it */
void mp_rmsnorm_backward_cuda(mp_bf16 *dinp, float *dweight, const mp_bf16 *dout,
                              const mp_bf16 *inp, const mp_bf16 *weight, const float *rstd,
                              float *scratch, int rows, int C, mp_cuda_stream stream);

/* Floats of scratch that mp_rmsnorm_backward_cuda needs: C * ceil(rows / 16) (one partial
 * dweight per tile of 16 rows), and at least 1. */
size_t mp_rmsnorm_backward_cuda_scratch_floats(int rows, int C);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_RMSNORM_H */
