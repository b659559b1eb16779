/*
 * layers/residual.h — the residual connection: the stream plus a sublayer's output.
 *
 * GPT adds the attention and the MLP outputs back into the residual stream; the backward sends
 * the same gradient to both branches. These calls cannot fail. The CUDA twin (_cuda, at the end of
 * this header: bf16, device pointers, a stream) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_RESIDUAL_H
#define MPENGINE_LAYERS_RESIDUAL_H

#include <stddef.h>

#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = inp1 + inp2, elementwise over n values (in GPT: n = B * T * C). out may be inp1: then it
 * is inp1 += inp2, which the backward passes use to accumulate.
 *   out  (n) written; may be the same buffer as inp1 or inp2
 *   inp1 (n)
 *   inp2 (n) */
void mp_residual_forward_cpu(float *out, const float *inp1, const float *inp2, size_t n);

/* dinp1 += dout and dinp2 += dout.
 *   dinp1 (n) +=
 *   dinp2 (n) +=
 *   dout  (n) */
void mp_residual_backward_cpu(float *dinp1, float *dinp2, const float *dout, size_t n);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/residual_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them.
 * Sums in fp32, one rounding to bf16 per output. */

/* out = inp1 + inp2, elementwise.
 *   out  (n) written; may be the same buffer as inp1 or inp2
 *   inp1 (n)
 *   inp2 (n) */
void mp_residual_forward_cuda(mp_bf16 *out, const mp_bf16 *inp1, const mp_bf16 *inp2, size_t n,
                              mp_cuda_stream stream);

/* dinp1 += dout and dinp2 += dout, as the CPU twin.
 *   dinp1 (n) += (must not alias dout)
 *   dinp2 (n) += (must not alias dout)
 *   dout  (n) */
void mp_residual_backward_cuda(mp_bf16 *dinp1, mp_bf16 *dinp2, const mp_bf16 *dout, size_t n,
                               mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_RESIDUAL_H */
