/* layers/matmul.c — the linear layer on OpenBLAS sgemm (row-major); see matmul.h. */
#include "layers/matmul.h"

#include <cblas.h>
#include <stddef.h>
#include <string.h>

#include "layers/residual.h"

void mp_matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                           int BT, int C, int OC) {
  /* Start from the bias (or zero) in every row, then add inp @ weight^T with beta = 1. */
  float beta = 0.0f;
  if (bias != NULL) {
    for (int r = 0; r < BT; r++) memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, weight, C, beta,
              out, OC);
}

void mp_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int BT, int C, int OC) {
  if (dinp != NULL) {
    /* dinp (BT, C) += dout (BT, OC) @ weight (OC, C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  if (dweight != NULL) {
    /* dweight (OC, C) += dout^T (OC, BT) @ inp (BT, C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
  }
  if (dbias != NULL) {
    /* Rows in order, so the sum is the same on every call; four columns at a time, each
     * column's sum unchanged. */
    for (int r = 0; r < BT; r++) {
      const float *dout_r = dout + (size_t)r * OC;
      mp_residual_forward_cpu(dbias, dbias, dout_r, (size_t)OC); /* dbias += dout_r */
    }
  }
}
