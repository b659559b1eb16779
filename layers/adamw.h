/*
 * layers/adamw.h — the optimizer step: global gradient-norm clipping, then AdamW.
 *
 * Clipping comes in three parts so parallel code can put a sum across ranks in the middle: each
 * rank takes the squared norm of the gradients it owns (mp_grad_norm_squared_cpu), the squares
 * are summed over the ranks, mp_clip_scale turns the global norm into one factor, and each rank
 * scales its gradients by it (mp_grad_scale_cpu), or hands it to mp_adamw_update_scaled_cpu,
 * which applies it inside the update and saves a pass over the gradients. A one-rank run does
 * the same with no sum.
 *
 * AdamW is Loshchilov and Hutter's, as in PyTorch and llm.c: Adam moments with bias correction,
 * and weight decay applied to the parameter directly (decoupled), not added to the gradient.
 * Which tensors are decayed is the caller's choice: it calls the update once per group with its
 * own weight_decay. The CPU calls cannot fail. The CUDA twins (_cuda, at the end of this header)
 * keep the same shapes, on fp32 master weights with an optional bf16 working copy.
 */
#ifndef MPENGINE_LAYERS_ADAMW_H
#define MPENGINE_LAYERS_ADAMW_H

#include <stddef.h>

#include "common/error.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step, t = 1 for the first step. For each of the n elements, with g = grads[i]:
 *   m = beta1 m + (1 - beta1) g;          v = beta2 v + (1 - beta2) g^2
 *   m_hat = m / (1 - beta1^t);            v_hat = v / (1 - beta2^t)
 *   param -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay param)
 *   params (n) updated in place
 *   grads  (n)
 *   m      (n) first moment, updated (zero before step 1)
 *   v      (n) second moment, updated (zero before step 1) */
void mp_adamw_update_cpu(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t);

/* mp_adamw_update_cpu with g = grads[i] * grad_scale (one float multiply, as mp_grad_scale_cpu
 * does), leaving grads as they are: clipping folded into the update, so it costs no pass of its
 * own over the gradients. Gives the same bits as mp_grad_scale_cpu then mp_adamw_update_cpu.
 * The arrays must not overlap.
 *   params (n) updated in place
 *   grads  (n) not modified
 *   m, v   (n) moments, updated
 *   grad_scale  mp_clip_scale's factor (1: no clipping) */
void mp_adamw_update_scaled_cpu(float *params, const float *grads, float *m, float *v, size_t n,
                                float lr, float beta1, float beta2, float eps, float weight_decay,
                                int t, float grad_scale);

/* Sum of grads[i]^2 over n elements, accumulated in double in index order, so the result is the
 * same on every run. The global gradient norm is the square root of its sum over all tensors
 * (and ranks).
 *   grads (n) */
double mp_grad_norm_squared_cpu(const float *grads, size_t n);

/* The factor to multiply every gradient by so the global norm is at most max_norm:
 * max_norm / norm when norm > max_norm, else 1. max_norm <= 0 turns clipping off (returns 1).
 * A norm that is NaN also returns 1: callers check the norm is finite before stepping. */
float mp_clip_scale(double norm, double max_norm);

/* grads *= scale, elementwise.
 *   grads (n) updated in place */
void mp_grad_scale_cpu(float *grads, size_t n, float scale);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/adamw_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them.
 * Master weights, gradients and moments are fp32. */

/* mp_adamw_update_cpu on the GPU, with the same fp32 operations in the same order (no fused
 * multiply-adds), then the bf16 working copy of the updated weights.
 *   params      (n) fp32 master weights, updated in place
 *   params_bf16 (n) written: bf16(params) after the update; or NULL
 *   grads       (n) fp32
 *   m, v        (n) fp32 moments, updated */
void mp_adamw_update_cuda(float *params, mp_bf16 *params_bf16, const float *grads, float *m,
                          float *v, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t, mp_cuda_stream stream);

/* Sum of grads[i]^2 over n elements into *out_host, in double, deterministic: a fixed number of
 * blocks (a function of n only) each sum a fixed stride, then one block adds the partials in
 * order. Waits for `stream` (the value is needed on the host). Returns MP_OK, or MP_ERR_RUNTIME
 * with the CUDA call in err on any CUDA error (including earlier asynchronous ones on the stream)
 * or when scratch is not 8-byte aligned.
 *   grads   (n) device
 *   scratch mp_grad_norm_cuda_scratch_floats(n) device floats (holds doubles: 8-byte aligned) */
mp_status mp_grad_norm_squared_cuda(const float *grads, size_t n, float *scratch,
                                    double *out_host, mp_cuda_stream stream, mp_error *err);

/* Floats of scratch that mp_grad_norm_squared_cuda needs (at most 2 * 1025). */
size_t mp_grad_norm_cuda_scratch_floats(size_t n);

/* grads *= scale, elementwise (the same single multiply as the CPU).
 *   grads (n) updated in place */
void mp_grad_scale_cuda(float *grads, size_t n, float scale, mp_cuda_stream stream);

/* out = bf16(in), round to nearest even: fp32 master -> bf16 working copy at init or load.
 *   out (n) written
 *   in  (n) */
void mp_bf16_from_float_cuda(mp_bf16 *out, const float *in, size_t n, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_ADAMW_H */
