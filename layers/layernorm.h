/*
 * layers/layernorm.h — layer normalisation over the channels of each token, as in GPT-2.
 *
 * Each row of C channels is shifted to mean 0 and scaled to variance 1 (the biased variance, over
 * C, plus MP_LAYERNORM_EPS), then scaled by weight and shifted by bias per channel. The forward
 * keeps each row's mean and 1/std so the backward does not recompute them (llm.c's layout).
 *
 * These calls cannot fail: shapes are the caller's contract and no memory is allocated. The CUDA
 * twin (_cuda, at the end of this header: bf16, device pointers, a stream) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_LAYERNORM_H
#define MPENGINE_LAYERS_LAYERNORM_H

#include <stddef.h>

#include "layers/cuda_types.h"

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

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/layernorm_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them.
 * Statistics and accumulations are fp32. */

/* mp_layernorm_forward_cpu on bf16: out rounded to bf16, mean and rstd fp32.
 *   out    (B, T, C)  written
 *   mean   (B, T)     written, or NULL
 *   rstd   (B, T)     written, or NULL
 *   inp    (B, T, C)
 *   weight (C)
 *   bias   (C) */
void mp_layernorm_forward_cuda(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *inp,
                               const mp_bf16 *weight, const mp_bf16 *bias, int B, int T, int C,
                               mp_cuda_stream stream);

/* Backward of mp_layernorm_forward_cuda. dweight and dbias are deterministic: per-tile partial
 * sums go to scratch and a second kernel adds them in a fixed order.
 *   dinp    (B, T, C)  += (bf16; must not alias dout or inp)
 *   dweight (C)        += (fp32)
 *   dbias   (C)        += (fp32)
 *   dout    (B, T, C)
 *   inp     (B, T, C)  the forward's input
 *   weight  (C)
 *   mean    (B, T)     as the forward wrote it
 *   rstd    (B, T)     as the forward wrote it
 *   scratch mp_layernorm_backward_cuda_scratch_floats(B, T, C) device floats, free for this call
 *           until the stream has run it */
void mp_layernorm_backward_cuda(mp_bf16 *dinp, float *dweight, float *dbias, const mp_bf16 *dout,
                                const mp_bf16 *inp, const mp_bf16 *weight, const float *mean,
                                const float *rstd, float *scratch, int B, int T, int C,
                                mp_cuda_stream stream);

/* Floats of scratch that mp_layernorm_backward_cuda needs: 2 * C * ceil(B * T / 16). */
size_t mp_layernorm_backward_cuda_scratch_floats(int B, int T, int C);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_LAYERNORM_H */
