/*
 * layers/gelu.h — GPT-2's GELU activation in its tanh form, applied elementwise.
 *
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *
 * This is the approximation GPT-2 was trained with (not the erf form), so that GPT-2 weights
 * loaded from llm.c reproduce its outputs. These calls cannot fail. The CUDA twin (_cuda, at the
 * end of this header: bf16, device pointers, a stream) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_GELU_H
#define MPENGINE_LAYERS_GELU_H

#include <stddef.h>

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = gelu(inp), elementwise over n values (in the MLP: n = B * T * 4C).
 *   out (n) written; may be the same buffer as inp
 *   inp (n) */
void mp_gelu_forward_cpu(float *out, const float *inp, size_t n);

/* dinp += gelu'(inp) * dout, elementwise.
 *   dinp (n) +=
 *   inp  (n) the forward's input
 *   dout (n) */
void mp_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t n);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/gelu_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them.
 * Math in fp32, one rounding to bf16 per output. */

/* out = gelu(inp), elementwise.
 *   out (n) written; may be the same buffer as inp
 *   inp (n) */
void mp_gelu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, size_t n, mp_cuda_stream stream);

/* dinp += gelu'(inp) * dout, elementwise, as the CPU twin.
 *   dinp (n) += (must not alias inp or dout)
 *   inp  (n) the forward's input
 *   dout (n) */
void mp_gelu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, size_t n,
                           mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_GELU_H */
