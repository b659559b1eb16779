/*
 * layers/attention.c — causal multi-head attention on the CPU; see attention.h.
 *
 * The math is llm.c's, with one change in the backward: the softmax's Jacobian is applied as
 * dpreatt = att * (datt - sum(att * datt)) per row, O(T) instead of llm.c's O(T^2) double loop.
 */
#include "layers/attention.h"

#include <cblas.h>
#include <math.h>
#include <stddef.h>

/* The products run through sgemm per (batch, head) over the full T x T square — twice the
 * multiply-adds of the causal triangle, but at BLAS speed rather than scalar dot products — and
 * the masked upper triangle is then set to exactly 0, as the loops it replaced did. */

/* Row-major views into the (B, T, 3C) qkv tensor: part 0 q, 1 k, 2 v of head h in batch b. */
static const float *qkv_part(const float *inp, int b, int T, int C, int h, int HS, int part) {
  return inp + (size_t)b * T * 3 * C + (size_t)part * C + (size_t)h * HS;
}

void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int HS) {
  const int C = NH * HS;
  const int C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);

  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float *query = qkv_part(inp, b, T, C, h, HS, 0); /* (T, HS), row stride 3C */
      const float *key = qkv_part(inp, b, T, C, h, HS, 1);
      const float *value = qkv_part(inp, b, T, C, h, HS, 2);
      float *att_bh = att + ((size_t)b * NH + h) * T * T; /* (T, T) */
      /* att = scale * q k^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, query, C3, key, C3,
                  0.0f, att_bh, T);
      for (int t = 0; t < T; t++) {
        float *att_row = att_bh + (size_t)t * T;
        float *preatt_row = preatt != NULL ? preatt + ((size_t)b * NH + h) * T * T + (size_t)t * T
                                           : NULL;
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          if (preatt_row != NULL) preatt_row[t2] = att_row[t2];
          if (att_row[t2] > maxval) maxval = att_row[t2];
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
      }
      /* out[b, :, h] = att v, written with row stride C */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, att_bh, T, value, C3,
                  0.0f, out + (size_t)b * T * C + (size_t)h * HS, C);
    }
  }
}

void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int HS) {
  const int C = NH * HS;
  const int C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);

  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t square = ((size_t)b * NH + h) * T * T;
      const float *att_bh = att + square;
      float *datt_bh = datt + square;
      float *dpreatt_bh = dpreatt + square;
      const float *dout_bh = dout + (size_t)b * T * C + (size_t)h * HS; /* (T, HS), stride C */
      const float *query = qkv_part(inp, b, T, C, h, HS, 0);
      const float *key = qkv_part(inp, b, T, C, h, HS, 1);
      const float *value = qkv_part(inp, b, T, C, h, HS, 2);
      float *dquery = (float *)qkv_part(dinp, b, T, C, h, HS, 0);
      float *dkey = (float *)qkv_part(dinp, b, T, C, h, HS, 1);
      float *dvalue = (float *)qkv_part(dinp, b, T, C, h, HS, 2);

      /* Through out = att v: datt = dout v^T, dv += att^T dout. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, dout_bh, C, value, C3,
                  0.0f, datt_bh, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, att_bh, T, dout_bh, C,
                  1.0f, dvalue, C3);
      /* Through the softmax: dpreatt = att * (datt - sum(att * datt)), 0 where masked. */
      for (int t = 0; t < T; t++) {
        const float *att_row = att_bh + (size_t)t * T;
        float *datt_row = datt_bh + (size_t)t * T;
        float *dpreatt_row = dpreatt_bh + (size_t)t * T;
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dot += att_row[t2] * datt_row[t2];
        for (int t2 = 0; t2 < T; t2++) {
          if (t2 <= t) {
            dpreatt_row[t2] = att_row[t2] * (datt_row[t2] - dot);
          } else {
            datt_row[t2] = 0.0f;
            dpreatt_row[t2] = 0.0f;
          }
        }
      }
      /* Through preatt = scale * q k^T: dq += scale dpreatt k, dk += scale dpreatt^T q. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, scale, dpreatt_bh, T, key,
                  C3, 1.0f, dquery, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, dpreatt_bh, T, query,
                  C3, 1.0f, dkey, C3);
    }
  }
}
