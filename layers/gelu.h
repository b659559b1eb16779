/*
 * layers/gelu.h — GPT-2's GELU activation in its tanh form, applied elementwise.
 *
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *
 * This is the approximation GPT-2 was trained with (not the erf form), so that GPT-2 weights
 * loaded from llm.c reproduce its outputs. These calls cannot fail. A later CUDA twin (_cuda) keeps
 * the same shapes.
 */
#ifndef MPENGINE_LAYERS_GELU_H
#define MPENGINE_LAYERS_GELU_H

#include <stddef.h>

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

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_GELU_H */
