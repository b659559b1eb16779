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
#include <stdint.h>

/* The products run through sgemm per (batch, head) over the full T x T square — twice the
 * multiply-adds of the causal triangle, but at BLAS speed rather than scalar dot products — and
 * the masked upper triangle is then set to exactly 0, as the loops it replaced did. */

/* One call's operands: query head h of token (b, t) at q + (b Tq + t) q_stride + h HS, and kv
 * head g's key and value of token (b, t2) at k (and v) + (b Tk + t2) kv_stride + g HS. Query t of
 * a sequence sits at position q_pos[t] (NULL: t) and sees the keys at positions 0 .. that; the
 * keys are the whole sequence in order. The gradients dq, dk, dv (backward) share the strides. */
typedef struct {
  int B, Tq, Tk, NH, KVH, HS;
  const float *q, *k, *v;
  size_t q_stride, kv_stride;
  const int32_t *q_pos;
} attention_view;

/* The last key query t sees. */
static int last_key(const attention_view *a, int t) { return a->q_pos != NULL ? a->q_pos[t] : t; }

static void forward(const attention_view *a, float *out, float *preatt, float *att) {
  const int NH = a->NH, HS = a->HS, Tq = a->Tq, Tk = a->Tk, C = NH * HS;
  const float scale = 1.0f / sqrtf((float)HS);
  const int group = NH / a->KVH;
  const int q_stride = (int)a->q_stride, kv_stride = (int)a->kv_stride;

  for (int b = 0; b < a->B; b++) {
    for (int h = 0; h < NH; h++) {
      const float *query = a->q + (size_t)b * Tq * a->q_stride + (size_t)h * HS; /* (Tq, HS) */
      const size_t kv_at = (size_t)b * Tk * a->kv_stride + (size_t)(h / group) * HS;
      const float *key = a->k + kv_at, *value = a->v + kv_at; /* (Tk, HS) */
      float *att_bh = att + ((size_t)b * NH + h) * Tq * Tk; /* (Tq, Tk) */
      /* att = scale * q k^T */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, HS, scale, query, q_stride, key,
                  kv_stride, 0.0f, att_bh, Tk);
      for (int t = 0; t < Tq; t++) {
        const int last = last_key(a, t);
        float *att_row = att_bh + (size_t)t * Tk;
        float *preatt_row =
            preatt != NULL ? preatt + ((size_t)b * NH + h) * Tq * Tk + (size_t)t * Tk : NULL;
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= last; t2++) {
          if (preatt_row != NULL) preatt_row[t2] = att_row[t2];
          if (att_row[t2] > maxval) maxval = att_row[t2];
        }
        float expsum = 0.0f;
        for (int t2 = 0; t2 <= last; t2++) {
          float e = expf(att_row[t2] - maxval);
          att_row[t2] = e;
          expsum += e;
        }
        const float expsum_inv = 1.0f / expsum;
        for (int t2 = 0; t2 < Tk; t2++) {
          if (t2 <= last) {
            att_row[t2] *= expsum_inv;
          } else {
            att_row[t2] = 0.0f; /* the causal mask */
            if (preatt_row != NULL) preatt_row[t2] = 0.0f;
          }
        }
      }
      /* out[b, :, h] = att v, written with row stride C */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, HS, Tk, 1.0f, att_bh, Tk, value,
                  kv_stride, 0.0f, out + (size_t)b * Tq * C + (size_t)h * HS, C);
    }
  }
}

static void backward(const attention_view *a, float *dq, float *dk, float *dv, float *dpreatt,
                     float *datt, const float *dout, const float *att) {
  const int NH = a->NH, HS = a->HS, Tq = a->Tq, Tk = a->Tk, C = NH * HS;
  const float scale = 1.0f / sqrtf((float)HS);
  const int group = NH / a->KVH;
  const int q_stride = (int)a->q_stride, kv_stride = (int)a->kv_stride;

  for (int b = 0; b < a->B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t square = ((size_t)b * NH + h) * Tq * Tk;
      const float *att_bh = att + square;
      float *datt_bh = datt + square;
      float *dpreatt_bh = dpreatt + square;
      const float *dout_bh = dout + (size_t)b * Tq * C + (size_t)h * HS; /* (Tq, HS), stride C */
      const size_t q_at = (size_t)b * Tq * a->q_stride + (size_t)h * HS;
      const size_t kv_at = (size_t)b * Tk * a->kv_stride + (size_t)(h / group) * HS;
      const float *query = a->q + q_at, *key = a->k + kv_at, *value = a->v + kv_at;
      /* A kv head's gradient sums over its group's query heads (beta = 1 below). */
      float *dquery = dq + q_at, *dkey = dk + kv_at, *dvalue = dv + kv_at;

      /* Through out = att v: datt = dout v^T, dv += att^T dout. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, HS, 1.0f, dout_bh, C, value,
                  kv_stride, 0.0f, datt_bh, Tk);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, Tq, 1.0f, att_bh, Tk, dout_bh,
                  C, 1.0f, dvalue, kv_stride);
      /* Through the softmax: dpreatt = att * (datt - sum(att * datt)), 0 where masked. */
      for (int t = 0; t < Tq; t++) {
        const int last = last_key(a, t);
        const float *att_row = att_bh + (size_t)t * Tk;
        float *datt_row = datt_bh + (size_t)t * Tk;
        float *dpreatt_row = dpreatt_bh + (size_t)t * Tk;
        float dot = 0.0f;
        for (int t2 = 0; t2 <= last; t2++) dot += att_row[t2] * datt_row[t2];
        for (int t2 = 0; t2 < Tk; t2++) {
          if (t2 <= last) {
            dpreatt_row[t2] = att_row[t2] * (datt_row[t2] - dot);
          } else {
            datt_row[t2] = 0.0f;
            dpreatt_row[t2] = 0.0f;
          }
        }
      }
      /* Through preatt = scale * q k^T: dq += scale dpreatt k, dk += scale dpreatt^T q. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, HS, Tk, scale, dpreatt_bh, Tk,
                  key, kv_stride, 1.0f, dquery, q_stride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, HS, Tq, scale, dpreatt_bh, Tk,
                  query, q_stride, 1.0f, dkey, kv_stride);
    }
  }
}

/* The view of a (B, T, W) qkv tensor attending to itself (W = (NH + 2 KVH) HS). */
static attention_view self_view(const float *inp, int B, int T, int NH, int KVH, int HS) {
  const size_t W = (size_t)(NH + 2 * KVH) * HS;
  const attention_view a = {B,   T,   T, NH, KVH, HS, inp, inp + (size_t)NH * HS,
                            inp + (size_t)(NH + KVH) * HS, W, W, NULL};
  return a;
}

/* The view of a qkv tensor's queries (B, Tq, W) against gathered keys and values (B, Tk, 2 KVH
 * HS), k then v. */
static attention_view gathered_view(const float *qkv, const float *kv, const int32_t *positions,
                                    int B, int Tq, int Tk, int NH, int KVH, int HS) {
  const attention_view a = {B,  Tq, Tk, NH, KVH, HS, qkv, kv, kv + (size_t)KVH * HS,
                            (size_t)(NH + 2 * KVH) * HS, (size_t)2 * KVH * HS, positions};
  return a;
}

void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int KVH, int HS) {
  const attention_view a = self_view(inp, B, T, NH, KVH, HS);
  forward(&a, out, preatt, att);
}

void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int KVH,
                               int HS) {
  const attention_view a = self_view(inp, B, T, NH, KVH, HS);
  const attention_view d = self_view(dinp, B, T, NH, KVH, HS);
  backward(&a, (float *)d.q, (float *)d.k, (float *)d.v, dpreatt, datt, dout, att);
}

void mp_attention_forward_at_cpu(float *out, float *preatt, float *att, const float *qkv,
                                 const float *kv, const int32_t *positions, int B, int Tq, int Tk,
                                 int NH, int KVH, int HS) {
  const attention_view a = gathered_view(qkv, kv, positions, B, Tq, Tk, NH, KVH, HS);
  forward(&a, out, preatt, att);
}

void mp_attention_backward_at_cpu(float *dqkv, float *dkv, float *dpreatt, float *datt,
                                  const float *dout, const float *qkv, const float *kv,
                                  const float *att, const int32_t *positions, int B, int Tq,
                                  int Tk, int NH, int KVH, int HS) {
  const attention_view a = gathered_view(qkv, kv, positions, B, Tq, Tk, NH, KVH, HS);
  const attention_view d = gathered_view(dqkv, dkv, positions, B, Tq, Tk, NH, KVH, HS);
  backward(&a, (float *)d.q, (float *)d.k, (float *)d.v, dpreatt, datt, dout, att);
}
