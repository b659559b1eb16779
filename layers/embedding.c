/* layers/embedding.c — token and position embedding on the CPU; see embedding.h. */
#include "layers/embedding.h"

void mp_embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                              int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float *out_bt = out + ((size_t)b * T + t) * C;
      const float *wte_row = wte + (size_t)tokens[(size_t)b * T + t] * C;
      const float *wpe_row = wpe + (size_t)t * C;
      for (int i = 0; i < C; i++) out_bt[i] = wte_row[i] + wpe_row[i];
    }
  }
}

void mp_embedding_backward_cpu(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                               int B, int T, int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float *dout_bt = dout + ((size_t)b * T + t) * C;
      float *dwte_row = dwte + (size_t)tokens[(size_t)b * T + t] * C;
      float *dwpe_row = dwpe + (size_t)t * C;
      for (int i = 0; i < C; i++) {
        dwte_row[i] += dout_bt[i];
        dwpe_row[i] += dout_bt[i];
      }
    }
  }
}

mp_status mp_embedding_check_tokens(const int32_t *tokens, size_t n, int V, mp_error *err) {
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      return mp_fail(err, MP_ERR_INPUT,
                     "token %ld at position %zu is outside the vocabulary [0, %d); the data was "
                     "tokenized for a different vocabulary or the file is damaged",
                     (long)tokens[i], i, V);
    }
  }
  return MP_OK;
}
