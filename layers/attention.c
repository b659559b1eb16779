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

/* Row-major views into the (B, T, W) qkv tensor of batch b: query head h, and the key and value
 * of kv head g (W = (NH + 2 KVH) HS). */
typedef struct {
  int NH, KVH, HS, W;
} qkv_layout;

static const float *query_of(const float *inp, const qkv_layout *q, int b, int T, int h) {
  return inp + (size_t)b * T * q->W + (size_t)h * q->HS;
}

static const float *key_of(const float *inp, const qkv_layout *q, int b, int T, int g) {
  return inp + (size_t)b * T * q->W + (size_t)(q->NH + g) * q->HS;
}

static const float *value_of(const float *inp, const qkv_layout *q, int b, int T, int g) {
  return inp + (size_t)b * T * q->W + (size_t)(q->NH + q->KVH + g) * q->HS;
}

void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int KVH, int HS) {
  const int C = NH * HS;
  const qkv_layout q = {NH, KVH, HS, (NH + 2 * KVH) * HS};
  const int W = q.W; /* the row stride of q, k and v */
  const float scale = 1.0f / sqrtf((float)HS);
  const int group = NH / KVH;

  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float *query = query_of(inp, &q, b, T, h); /* (T, HS), row stride W */
      const float *key = key_of(inp, &q, b, T, h / group);
      const float *value = value_of(inp, &q, b, T, h / group);
      float *att_bh = att + ((size_t)b * NH + h) * T * T; /* (T, T) */
      /* att = scale * q k^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, query, W, key, W,
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
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, att_bh, T, value, W,
                  0.0f, out + (size_t)b * T * C + (size_t)h * HS, C);
    }
  }
}

void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int KVH,
                               int HS) {
  const int C = NH * HS;
  const qkv_layout q = {NH, KVH, HS, (NH + 2 * KVH) * HS};
  const int W = q.W; /* the row stride of q, k and v */
  const float scale = 1.0f / sqrtf((float)HS);
  const int group = NH / KVH;

  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t square = ((size_t)b * NH + h) * T * T;
      const float *att_bh = att + square;
      float *datt_bh = datt + square;
      float *dpreatt_bh = dpreatt + square;
      const float *dout_bh = dout + (size_t)b * T * C + (size_t)h * HS; /* (T, HS), stride C */
      const float *query = query_of(inp, &q, b, T, h);
      const float *key = key_of(inp, &q, b, T, h / group);
      const float *value = value_of(inp, &q, b, T, h / group);
      /* A kv head's gradient sums over its group's query heads (beta = 1 below). */
      float *dquery = (float *)query_of(dinp, &q, b, T, h);
      float *dkey = (float *)key_of(dinp, &q, b, T, h / group);
      float *dvalue = (float *)value_of(dinp, &q, b, T, h / group);

      /* Through out = att v: datt = dout v^T, dv += att^T dout. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, dout_bh, C, value, W,
                  0.0f, datt_bh, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, att_bh, T, dout_bh, C,
                  1.0f, dvalue, W);
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
                  W, 1.0f, dquery, W);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, dpreatt_bh, T, query,
                  W, 1.0f, dkey, W);
    }
  }
}
