/*
 * layers/swiglu.h — the SwiGLU activation of the Llama family's MLP (Shazeer 2020):
 * silu(gate) * up, from the fused gate-and-up projection's output.
 *
 * The input row holds the gate half, then the up half ([gate | up], 2F channels), the layout of
 * Megatron-Core's fused linear_fc1 (Hugging Face keeps gate_proj and up_proj as two tensors: the
 * same rows, stacked). silu(x) = x * sigmoid(x). The calls cannot fail. The CUDA twin comes with
 * the Llama family's GPU path.
 */
#ifndef MPENGINE_LAYERS_SWIGLU_H
#define MPENGINE_LAYERS_SWIGLU_H

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

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_SWIGLU_H */
