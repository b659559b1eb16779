/*
 * layers/embedding.h — GPT-2's input embedding: a token's row of wte plus its position's row of
 * wpe.
 *
 * Token ids come from data files, so they are checked once (mp_embedding_check_tokens) where they
 * enter, and the forward and backward trust them. The backward adds into the rows that were used,
 * in token order, so a token seen twice accumulates twice and the result does not vary between
 * runs. A later CUDA twin (_cuda) keeps the same shapes.
 */
#ifndef MPENGINE_LAYERS_EMBEDDING_H
#define MPENGINE_LAYERS_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
 *   out    (B, T, C)  written
 *   tokens (B, T)     each in [0, V)
 *   wte    (V, C)     token embedding (tied to the LM head in GPT-2)
 *   wpe    (maxT, C)  position embedding, T <= maxT */
void mp_embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                              int B, int T, int C);

/* Backward of mp_embedding_forward_cpu; adds (+=) into the rows of dwte and dwpe that were used.
 *   dwte   (V, C)     +=
 *   dwpe   (maxT, C)  += (rows 0..T-1)
 *   dout   (B, T, C)
 *   tokens (B, T) */
void mp_embedding_backward_cpu(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                               int B, int T, int C);

/* Checks that each of the n token ids lies in [0, V). Returns MP_OK, or MP_ERR_INPUT with a
 * message naming the first bad position and value, in err (which may be NULL). The same check
 * serves the targets of cross-entropy. */
mp_status mp_embedding_check_tokens(const int32_t *tokens, size_t n, int V, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_EMBEDDING_H */
