/*
 * layers/residual.h — the residual connection: the stream plus a sublayer's output.
 *
 * GPT adds the attention and the MLP outputs back into the residual stream; the backward sends
 * the same gradient to both branches. These calls cannot fail. A later CUDA twin (_cuda) keeps the
 * same shapes.
 */
#ifndef MPENGINE_LAYERS_RESIDUAL_H
#define MPENGINE_LAYERS_RESIDUAL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = inp1 + inp2, elementwise over n values (in GPT: n = B * T * C).
 *   out  (n) written; may be the same buffer as inp1 or inp2
 *   inp1 (n)
 *   inp2 (n) */
void mp_residual_forward_cpu(float *out, const float *inp1, const float *inp2, size_t n);

/* dinp1 += dout and dinp2 += dout.
 *   dinp1 (n) +=
 *   dinp2 (n) +=
 *   dout  (n) */
void mp_residual_backward_cpu(float *dinp1, float *dinp2, const float *dout, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_RESIDUAL_H */
