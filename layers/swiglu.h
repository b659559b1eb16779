/*
 * layers/swiglu.h — the SwiGLU activation of the Llama family's MLP (Shazeer 2020):
 * silu(gate) * up, from the fused gate-and-up projection's output.
 *
 * The input row holds the gate half, then the up half ([gate | up], 2F channels), the layout of
 * Megatron-Core's fused linear_fc1 (Hugging Face keeps gate_proj and up_proj as two tensors: the
 * same rows, stacked). silu(x) = x * sigmoid(x). The calls cannot fail. The CUDA twin (_cuda, at
 * the end of this header) keeps the same shapes on bf16.
 */
#ifndef MPENGINE_LAYERS_SWIGLU_H
#define MPENGINE_LAYERS_SWIGLU_H

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[n, f] = silu(inp[n, f]) * inp[n, F + f].
 *   out (N, F)   written
 *   inp (N, 2F)  [gate | up] per row */
void mp_swiglu_forward_cpu(float *out, const float *inp, int N, int F);

/* Backward; adds (+=) into dinp.
 *   dinp (N, 2F) += d(gate), d(up) per row
 *   inp  (N, 2F)    the forward's input
 *   dout (N, F) */
void mp_swiglu_backward_cpu(float *dinp, const float *inp, const float *dout, int N, int F);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/swiglu_cuda.cu, Bazel target //layers:cuda_elementwise): device pointers,
 * bf16, fp32 math (swiglu.c's formulas, with expf), each bf16 output rounded once (a += as one
 * rounding of old + new), enqueued on `stream` without waiting. No reductions: the same bits on
 * every run. */

/* out (N, F) = silu(gate) * up of inp (N, 2F). */
void mp_swiglu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, int N, int F,
                            mp_cuda_stream stream);

/* dinp (N, 2F) += the gradients of gate and up from dout (N, F); dinp must not alias the
 * others. */
void mp_swiglu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, int N, int F,
                             mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_SWIGLU_H */
