/*
 * layers/attention.c — causal multi-head attention on the CPU; see attention.h.
 *
 * The math is llm.c's, with one change in the backward: the softmax's Jacobian is applied as
 * dpreatt = att * (datt - sum(att * datt)) per row, O(T) instead of llm.c's O(T^2) double loop.
 */
#include "layers/attention.h"

#include <math.h>
#include <stddef.h>

void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int HS) {
  const int C = NH * HS;
  const size_t C3 = (size_t)3 * C;
  const float scale = 1.0f / sqrtf((float)HS);

  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const float *query = inp + ((size_t)b * T + t) * C3 + (size_t)h * HS;
        const size_t row = (((size_t)b * NH + h) * T + t) * T;
        float *att_row = att + row;
        float *preatt_row = preatt != NULL ? preatt + row : NULL;

        /* Scores against keys t2 <= t; the running maximum keeps exp() in range. */
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *key = inp + ((size_t)b * T + t2) * C3 + C + (size_t)h * HS;
          float dot = 0.0f;
          for (int i = 0; i < HS; i++) dot += query[i] * key[i];
          dot *= scale;
          att_row[t2] = dot;
          if (preatt_row != NULL) preatt_row[t2] = dot;
          if (dot > maxval) maxval = dot;
        }

        float expsum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          float e = expf(att_row[t2] - maxval);
          att_row[t2] = e;
          expsum += e;
        }
        const float expsum_inv = 1.0f / expsum;
        for (int t2 = 0; t2 < T; t2++) {
          if (t2 <= t) {
            att_row[t2] *= expsum_inv;
          } else {
            att_row[t2] = 0.0f; /* the causal mask */
            if (preatt_row != NULL) preatt_row[t2] = 0.0f;
          }
        }

        /* out = att @ v, over the same keys. */
        float *out_bth = out + ((size_t)b * T + t) * C + (size_t)h * HS;
        for (int i = 0; i < HS; i++) out_bth[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *value = inp + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * HS;
          const float a = att_row[t2];
          for (int i = 0; i < HS; i++) out_bth[i] += a * value[i];
        }
      }
    }
  }
}

void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int HS) {
  const int C = NH * HS;
  const size_t C3 = (size_t)3 * C;
  const float scale = 1.0f / sqrtf((float)HS);

  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const size_t row = (((size_t)b * NH + h) * T + t) * T;
        const float *att_row = att + row;
        float *datt_row = datt + row;
        float *dpreatt_row = dpreatt + row;
        const float *dout_bth = dout + ((size_t)b * T + t) * C + (size_t)h * HS;
        const float *query = inp + ((size_t)b * T + t) * C3 + (size_t)h * HS;
        float *dquery = dinp + ((size_t)b * T + t) * C3 + (size_t)h * HS;

        /* Through out = att @ v: datt[t2] = dout . v[t2], dv[t2] += att[t2] * dout. */
        for (int t2 = 0; t2 < T; t2++) {
          datt_row[t2] = 0.0f;
          dpreatt_row[t2] = 0.0f;
        }
        for (int t2 = 0; t2 <= t; t2++) {
          const size_t v_off = ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * HS;
          const float *value = inp + v_off;
          float *dvalue = dinp + v_off;
          float d = 0.0f;
          for (int i = 0; i < HS; i++) {
            d += value[i] * dout_bth[i];
            dvalue[i] += att_row[t2] * dout_bth[i];
          }
          datt_row[t2] = d;
        }

        /* Through the softmax: dpreatt = att * (datt - sum(att * datt)). */
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dot += att_row[t2] * datt_row[t2];
        for (int t2 = 0; t2 <= t; t2++) dpreatt_row[t2] = att_row[t2] * (datt_row[t2] - dot);

        /* Through preatt = q.k * scale. */
        for (int t2 = 0; t2 <= t; t2++) {
          const size_t k_off = ((size_t)b * T + t2) * C3 + C + (size_t)h * HS;
          const float *key = inp + k_off;
          float *dkey = dinp + k_off;
          const float g = dpreatt_row[t2] * scale;
          for (int i = 0; i < HS; i++) {
            dquery[i] += key[i] * g;
            dkey[i] += query[i] * g;
          }
        }
      }
    }
  }
}
