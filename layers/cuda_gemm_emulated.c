/*
 * layers/cuda_gemm_emulated.c — //layers:cuda_gemm under `--define mpengine_cuda=emulated`
 * (third_party/cuda.bzl): the CUDA C API of cublas_context.h, matmul.h and attention.h run on the
 * CPU, so that the GPU code above the kernels can be tested on machines without a GPU. Test-only.
 *
 * "Device" pointers are host memory (engine/device/device_emulated.c) and streams are ignored: every call
 * has finished when it returns. An mp_cublas is a small struct that keeps the first failure, as
 * the CUDA build's does: negative shapes, a dbias without scratch, and out of host memory for a
 * temporary are recorded there and reported by mp_cublas_check. Each launcher widens its bf16
 * inputs to fp32 temporaries, runs the CPU twin (OpenBLAS), and rounds to bf16 where the CUDA
 * build rounds: once per bf16 output, and a bf16 += (dinp, dqkv) as one rounding of
 * (old + new), the new part summed in fp32 first, as cuBLAS with beta = 1 and
 * accumulate_dqkv_kernel do. fp32 gradients (dweight, dbias) are added to in fp32 directly.
 *
 * What is not emulated: cuBLAS's exact bits, and the attention's bf16 intermediates (the CUDA
 * build rounds the scores, dy, datt and dpreatt to bf16; here they stay fp32 and only att and out
 * are rounded), so results agree with the CUDA build to the kernel tests' tolerances, not bit for
 * bit; asynchrony; and the scratch buffers (sized as the CUDA build sizes them, never touched).
 * The fused (flash) attention is its contract in fp32 (see its section below).
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "layers/attention.h"
#include "layers/attention_internal.h"
#include "layers/cublas_context.h"
#include "layers/cuda_types.h"
#include "layers/matmul.h"
#include "layers/matmul_internal.h"

struct mp_cublas {
  mp_status failure; /* MP_OK until a launcher fails; the first failure is kept */
  char failure_message[MP_ERROR_MESSAGE_BYTES];
};

/* ---- helpers ---- */


/* Keeps status and message in cublas unless an earlier failure is already kept. */
static void record_failure(mp_cublas *cublas, mp_status status, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
static void record_failure(mp_cublas *cublas, mp_status status, const char *format, ...) {
  if (cublas == NULL || cublas->failure != MP_OK) return;
  cublas->failure = status;
  va_list args;
  va_start(args, format);
  vsnprintf(cublas->failure_message, sizeof cublas->failure_message, format, args);
  va_end(args);
}

/* n floats, zeroed; NULL (recorded in cublas, naming `who`) when out of host memory. */
static float *zeros(mp_cublas *cublas, size_t n, const char *who) {
  float *values = (float *)calloc(n > 0 ? n : 1, sizeof(float));
  if (values == NULL) {
    record_failure(cublas, MP_ERR_RUNTIME, "%s (emulated CUDA): out of host memory for %zu floats",
                   who, n);
  }
  return values;
}

/* A new fp32 copy of in (n), widened exactly; NULL (recorded) when out of host memory. */
static float *widen(mp_cublas *cublas, const mp_bf16 *in, size_t n, const char *who) {
  float *out = zeros(cublas, n, who);
  if (out != NULL) mp_bf16_to_floats(out, in, n);
  return out;
}

/* dst (n) = bf16(dst + delta), the sum in fp32, one rounding per element. */
static void add_round(mp_bf16 *dst, const float *delta, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mp_bf16_from_float(mp_bf16_to_float(dst[i]) + delta[i]);
}

/* ---- the mp_cublas context ---- */

mp_status mp_cublas_create(mp_cublas **out, mp_error *err) {
  *out = (mp_cublas *)calloc(1, sizeof **out);
  if (*out == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory for mp_cublas");
  (*out)->failure = MP_OK;
  return MP_OK;
}

void mp_cublas_free(mp_cublas *cublas) { free(cublas); }

mp_status mp_cublas_check(mp_cublas *cublas, mp_error *err) {
  if (cublas == NULL) return mp_fail(err, MP_ERR_INPUT, "mp_cublas_check: no mp_cublas (NULL)");
  if (cublas->failure == MP_OK) return MP_OK;
  const mp_status status = cublas->failure;
  mp_fail(err, status, "%s", cublas->failure_message);
  cublas->failure = MP_OK;
  cublas->failure_message[0] = '\0';
  return status;
}

/* ---- matmul ---- */

void mp_matmul_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *inp,
                            const mp_bf16 *weight, const mp_bf16 *bias, int BT, int C, int OC,
                            mp_cuda_stream stream) {
  (void)stream;
  const char *who = "mp_matmul_forward_cuda";
  if (BT < 0 || C < 0 || OC < 0) {
    record_failure(cublas, MP_ERR_INPUT, "%s: negative shape BT=%d C=%d OC=%d", who, BT, C, OC);
    return;
  }
  if (BT == 0 || OC == 0) return;
  const size_t n_out = (size_t)BT * OC;
  if (C == 0) { /* an empty product: out is the bias, or zero (OpenBLAS rejects lda = 0) */
    for (size_t i = 0; i < n_out; i++) out[i] = bias != NULL ? bias[i % (size_t)OC] : 0;
    return;
  }
  float *inp_f = widen(cublas, inp, (size_t)BT * C, who);
  float *weight_f = widen(cublas, weight, (size_t)OC * C, who);
  float *bias_f = bias != NULL ? widen(cublas, bias, (size_t)OC, who) : NULL;
  float *out_f = zeros(cublas, n_out, who);
  if (inp_f != NULL && weight_f != NULL && (bias == NULL || bias_f != NULL) && out_f != NULL) {
    mp_matmul_forward_cpu(out_f, inp_f, weight_f, bias_f, BT, C, OC); /* bias added in fp32 */
    mp_bf16_from_floats(out, out_f, n_out);
  }
  free(out_f);
  free(bias_f);
  free(weight_f);
  free(inp_f);
}

size_t mp_matmul_backward_cuda_scratch_floats(int BT, int OC) {
  return OC > 0 ? mp_matmul_dbias_row_blocks(BT) * (size_t)OC : 0;
}

void mp_matmul_backward_cuda(mp_cublas *cublas, mp_bf16 *dinp, float *dweight, float *dbias,
                             const mp_bf16 *dout, const mp_bf16 *inp, const mp_bf16 *weight,
                             float *scratch, int BT, int C, int OC, mp_cuda_stream stream) {
  (void)stream;
  const char *who = "mp_matmul_backward_cuda";
  if (BT < 0 || C < 0 || OC < 0) {
    record_failure(cublas, MP_ERR_INPUT, "%s: negative shape BT=%d C=%d OC=%d", who, BT, C, OC);
    return;
  }
  if (dbias != NULL && scratch == NULL && BT > 0 && OC > 0) {
    record_failure(cublas, MP_ERR_INPUT,
                   "%s: dbias needs scratch of mp_matmul_backward_cuda_scratch_floats(%d, %d) = "
                   "%zu floats, got NULL",
                   who, BT, OC, mp_matmul_backward_cuda_scratch_floats(BT, OC));
    return;
  }
  if (BT == 0 || OC == 0) return;
  float *dout_f = widen(cublas, dout, (size_t)BT * OC, who);
  if (dout_f == NULL) return;
  if (dinp != NULL && C > 0) {
    float *weight_f = widen(cublas, weight, (size_t)OC * C, who);
    float *grad = zeros(cublas, (size_t)BT * C, who);
    if (weight_f != NULL && grad != NULL) {
      mp_matmul_backward_cpu(grad, NULL, NULL, dout_f, NULL, weight_f, BT, C, OC);
      add_round(dinp, grad, (size_t)BT * C);
    }
    free(grad);
    free(weight_f);
  }
  if (dweight != NULL && C > 0) {
    float *inp_f = widen(cublas, inp, (size_t)BT * C, who);
    if (inp_f != NULL) mp_matmul_backward_cpu(NULL, dweight, NULL, dout_f, inp_f, NULL, BT, C, OC);
    free(inp_f);
  }
  if (dbias != NULL) mp_matmul_backward_cpu(NULL, NULL, dbias, dout_f, NULL, NULL, BT, C, OC);
  free(dout_f);
}

/* ---- attention (the cuBLAS twin) ---- */

/* False (and nothing to do) for a negative shape or a KVH that does not divide NH, recorded, or
 * an empty one (as attention_cuda.cu). */
static bool attention_shape_ok(mp_cublas *cublas, const char *who, int B, int T, int NH, int KVH,
                               int HS) {
  if (B < 0 || T < 0 || NH < 0 || KVH < 0 || HS < 0) {
    record_failure(cublas, MP_ERR_INPUT, "%s: negative shape B=%d T=%d NH=%d KVH=%d HS=%d", who, B,
                   T, NH, KVH, HS);
    return false;
  }
  if (B == 0 || T == 0 || NH == 0 || HS == 0) return false;
  if (KVH == 0 || NH % KVH != 0) {
    record_failure(cublas, MP_ERR_INPUT, "%s: KVH=%d kv heads must divide NH=%d query heads", who,
                   KVH, NH);
    return false;
  }
  return true;
}

size_t mp_attention_cuda_scratch_bytes(int B, int T, int NH, int HS) {
  return mp_attention_cuda_layout_of(B, T, NH, HS).total;
}

void mp_attention_forward_cuda(mp_cublas *cublas, mp_bf16 *out, mp_bf16 *att, const mp_bf16 *qkv,
                               void *scratch, int B, int T, int NH, int KVH, int HS,
                               mp_cuda_stream stream) {
  (void)scratch, (void)stream;
  const char *who = "mp_attention_forward_cuda";
  if (!attention_shape_ok(cublas, who, B, T, NH, KVH, HS)) return;
  const size_t n_out = (size_t)B * T * NH * HS, n_att = (size_t)B * NH * T * T;
  const size_t n_qkv = (size_t)B * T * (NH + 2 * KVH) * HS;
  float *qkv_f = widen(cublas, qkv, n_qkv, who);
  float *out_f = zeros(cublas, n_out, who);
  float *att_f = zeros(cublas, n_att, who);
  if (qkv_f != NULL && out_f != NULL && att_f != NULL) {
    /* +0 above the diagonal */
    mp_attention_forward_cpu(out_f, NULL, att_f, qkv_f, B, T, NH, KVH, HS);
    mp_bf16_from_floats(out, out_f, n_out);
    mp_bf16_from_floats(att, att_f, n_att);
  }
  free(att_f);
  free(out_f);
  free(qkv_f);
}

void mp_attention_backward_cuda(mp_cublas *cublas, mp_bf16 *dqkv, const mp_bf16 *dout,
                                const mp_bf16 *qkv, const mp_bf16 *att, void *scratch, int B,
                                int T, int NH, int KVH, int HS, mp_cuda_stream stream) {
  (void)scratch, (void)stream;
  const char *who = "mp_attention_backward_cuda";
  if (!attention_shape_ok(cublas, who, B, T, NH, KVH, HS)) return;
  const size_t n_out = (size_t)B * T * NH * HS, n_att = (size_t)B * NH * T * T;
  const size_t n_qkv = (size_t)B * T * (NH + 2 * KVH) * HS;
  float *qkv_f = widen(cublas, qkv, n_qkv, who);
  float *dout_f = widen(cublas, dout, n_out, who);
  float *att_f = widen(cublas, att, n_att, who);
  float *grad = zeros(cublas, n_qkv, who);
  float *dpreatt = zeros(cublas, n_att, who);
  float *datt = zeros(cublas, n_att, who);
  if (qkv_f != NULL && dout_f != NULL && att_f != NULL && grad != NULL && dpreatt != NULL &&
      datt != NULL) {
    mp_attention_backward_cpu(grad, dpreatt, datt, dout_f, qkv_f, att_f, B, T, NH, KVH, HS);
    add_round(dqkv, grad, n_qkv);
  }
  free(datt);
  free(dpreatt);
  free(grad);
  free(att_f);
  free(dout_f);
  free(qkv_f);
}

/* ---- fused (flash) attention ----
 * The fused kernels' contract (out, lse, the backward from lse; windows for context parallelism)
 * in fp32 from the bf16 inputs, with one rounding per bf16 output and per bf16 += (dqkv): the
 * probabilities and dS that the CUDA build rounds to bf16 stay fp32 here. Head sizes are the
 * CUDA build's (32, 64, 128), so the same models take the fused path in both builds. */

bool mp_flash_attention_supported(int HS) { return HS == 32 || HS == 64 || HS == 128; }

size_t mp_flash_attention_scratch_bytes(int B, int T, int NH, int HS) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return 0;
  const size_t bytes = (size_t)B * NH * T * sizeof(float); /* D (B, NH, T) */
  return (bytes + 255) / 256 * 256;
}

static bool flash_window_ok(int B, int T, int NH, int KVH, int HS, mp_attention_window w) {
  return B > 0 && T > 0 && NH > 0 && KVH > 0 && NH % KVH == 0 &&
         mp_flash_attention_supported(HS) && w.q_begin >= 0 && w.q_rows > 0 &&
         w.q_begin + w.q_rows <= T && w.out_row0 >= 0 && w.out_row0 + w.q_rows <= w.out_rows;
}

/* The scaled scores of window query i (global position p) of head h against keys 0..p, their
 * softmax against lse (or, lse NULL, their own max and sum: returned as the log-sum-exp), from
 * the widened qkv (B, T, W) of batch b. probs (p + 1) written. */
static float flash_probs(float *probs, const float *qkv_b, int p, int h, int g, int NH, int KVH,
                         int HS, const float *lse) {
  const size_t W = (size_t)(NH + 2 * KVH) * HS;
  const float scale = 1.0f / sqrtf((float)HS);
  const float *q = qkv_b + (size_t)p * W + (size_t)h * HS;
  float max = -INFINITY;
  for (int t = 0; t <= p; t++) {
    const float *k = qkv_b + (size_t)t * W + (size_t)(NH + g) * HS;
    float dot = 0.0f;
    for (int c = 0; c < HS; c++) dot += q[c] * k[c];
    probs[t] = dot * scale;
    if (probs[t] > max) max = probs[t];
  }
  if (lse != NULL) {
    for (int t = 0; t <= p; t++) probs[t] = expf(probs[t] - *lse);
    return *lse;
  }
  float sum = 0.0f;
  for (int t = 0; t <= p; t++) {
    probs[t] = expf(probs[t] - max);
    sum += probs[t];
  }
  for (int t = 0; t <= p; t++) probs[t] /= sum;
  return max + logf(sum);
}

void mp_flash_attention_forward_window_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B,
                                            int T, int NH, int KVH, int HS,
                                            mp_attention_window w, mp_cuda_stream stream) {
  (void)stream;
  if (!flash_window_ok(B, T, NH, KVH, HS, w)) return;
  const size_t W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
  const int q_end = w.q_begin + w.q_rows;
  float *qkv_f = widen(NULL, qkv, (size_t)B * T * W, "flash attention");
  float *probs = malloc((size_t)q_end * sizeof(float));
  float *row = malloc((size_t)HS * sizeof(float));
  if (qkv_f != NULL && probs != NULL && row != NULL) {
    for (int b = 0; b < B; b++) {
      const float *qkv_b = qkv_f + (size_t)b * T * W;
      for (int h = 0; h < NH; h++) {
        const int g = h / (NH / KVH);
        for (int i = 0; i < w.q_rows; i++) {
          const int p = w.q_begin + i;
          const size_t out_row = (size_t)b * w.out_rows + w.out_row0 + i;
          lse[((size_t)b * NH + h) * w.out_rows + w.out_row0 + i] =
              flash_probs(probs, qkv_b, p, h, g, NH, KVH, HS, NULL);
          for (int c = 0; c < HS; c++) row[c] = 0.0f;
          for (int t = 0; t <= p; t++) {
            const float *v = qkv_b + (size_t)t * W + (size_t)(NH + KVH + g) * HS;
            for (int c = 0; c < HS; c++) row[c] += probs[t] * v[c];
          }
          mp_bf16_from_floats(out + out_row * C + (size_t)h * HS, row, (size_t)HS);
        }
      }
    }
  }
  free(row);
  free(probs);
  free(qkv_f);
}

void mp_flash_attention_backward_window_cuda(mp_bf16 *dqkv, const mp_bf16 *dout,
                                             const mp_bf16 *qkv, const mp_bf16 *out,
                                             const float *lse, void *scratch, int B, int T,
                                             int NH, int KVH, int HS, mp_attention_window w,
                                             mp_cuda_stream stream) {
  (void)stream, (void)scratch;
  if (!flash_window_ok(B, T, NH, KVH, HS, w)) return;
  const size_t W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
  const int q_end = w.q_begin + w.q_rows;
  const float scale = 1.0f / sqrtf((float)HS);
  float *qkv_f = widen(NULL, qkv, (size_t)B * T * W, "flash attention");
  float *grad = calloc((size_t)B * T * W, sizeof(float));
  float *probs = malloc((size_t)q_end * sizeof(float));
  float *dy = malloc((size_t)HS * sizeof(float));
  if (qkv_f != NULL && grad != NULL && probs != NULL && dy != NULL) {
    for (int b = 0; b < B; b++) {
      const float *qkv_b = qkv_f + (size_t)b * T * W;
      float *grad_b = grad + (size_t)b * T * W;
      for (int h = 0; h < NH; h++) {
        const int g = h / (NH / KVH);
        for (int i = 0; i < w.q_rows; i++) {
          const int p = w.q_begin + i;
          const size_t out_row = (size_t)b * w.out_rows + w.out_row0 + i;
          const float row_lse = lse[((size_t)b * NH + h) * w.out_rows + w.out_row0 + i];
          flash_probs(probs, qkv_b, p, h, g, NH, KVH, HS, &row_lse);
          const mp_bf16 *dy_row = dout + out_row * C + (size_t)h * HS;
          const mp_bf16 *y_row = out + out_row * C + (size_t)h * HS;
          float D = 0.0f;
          for (int c = 0; c < HS; c++) {
            dy[c] = mp_bf16_to_float(dy_row[c]);
            D += dy[c] * mp_bf16_to_float(y_row[c]);
          }
          const float *q = qkv_b + (size_t)p * W + (size_t)h * HS;
          float *dq = grad_b + (size_t)p * W + (size_t)h * HS;
          for (int t = 0; t <= p; t++) {
            const float *k = qkv_b + (size_t)t * W + (size_t)(NH + g) * HS;
            const float *v = k + (size_t)KVH * HS;
            float *dk = grad_b + (size_t)t * W + (size_t)(NH + g) * HS;
            float *dv = dk + (size_t)KVH * HS;
            float dp = 0.0f;
            for (int c = 0; c < HS; c++) dp += dy[c] * v[c];
            const float ds = probs[t] * (dp - D) * scale;
            for (int c = 0; c < HS; c++) {
              dq[c] += ds * k[c];
              dk[c] += ds * q[c];
              dv[c] += probs[t] * dy[c];
            }
          }
        }
      }
    }
    for (int b = 0; b < B; b++) {
      const size_t first = (size_t)b * T * W;
      add_round(dqkv + first, grad + first, (size_t)q_end * W); /* rows past q_end: untouched */
    }
  }
  free(dy);
  free(probs);
  free(grad);
  free(qkv_f);
}

void mp_flash_attention_forward_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B, int T,
                                     int NH, int KVH, int HS, mp_cuda_stream stream) {
  mp_flash_attention_forward_window_cuda(out, lse, qkv, B, T, NH, KVH, HS,
                                         mp_attention_whole_sequence(T), stream);
}

void mp_flash_attention_backward_cuda(mp_bf16 *dqkv, const mp_bf16 *dout, const mp_bf16 *qkv,
                                      const mp_bf16 *out, const float *lse, void *scratch, int B,
                                      int T, int NH, int KVH, int HS, mp_cuda_stream stream) {
  mp_flash_attention_backward_window_cuda(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KVH, HS,
                                          mp_attention_whole_sequence(T), stream);
}
