/*
 * layers/cuda_elementwise_emulated.c — //layers:cuda_elementwise under
 * `--define mpengine_cuda=emulated` (third_party/cuda.bzl): the CUDA C API of adamw.h,
 * cross_entropy.h, embedding.h, gelu.h, layernorm.h, residual.h, rmsnorm.h, rope.h and swiglu.h,
 * run on the CPU so that the GPU code above the kernels can be tested on machines without a GPU.
 * Test-only.
 *
 * "Device" pointers are host memory (engine/device/device_emulated.c) and streams are ignored: every call
 * has finished when it returns. Each launcher widens its bf16 inputs to fp32 temporaries, runs the
 * CPU twin, and rounds to bf16 where the CUDA kernel rounds: once per bf16 output, and a bf16 +=
 * is one rounding of (old + new), as the kernels form it in fp32. fp32 outputs (statistics,
 * weight gradients, optimizer state) are updated in fp32 directly.
 *
 * What is not emulated: the kernels' exact bits where they sum in another order than the CPU twin
 * (layernorm and RMSNorm statistics and weight gradients, the cross-entropy row sums; the results
 * agree with the CUDA build to the kernel tests' tolerances, not bit for bit), the GPU's expf,
 * sincosf and FMA contractions (within a few ulp of the host's), the 128-bit and unaligned load
 * paths, asynchrony, the embedding backward's NaN poisoning when its host buffer cannot be
 * allocated, and every scratch or workspace buffer (sized as the CUDA build sizes them, never
 * touched). The launchers return void, so should a temporary fail to allocate they print a
 * message to stderr and abort(): acceptable for test-only code.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/adamw.h"
#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"

/* ---- helpers ---- */

/* n floats (uninitialised), or abort() naming `who`. */
static float *floats_or_abort(size_t n, const char *who) {
  float *values = (float *)malloc((n > 0 ? n : 1) * sizeof(float));
  if (values == NULL) {
    fprintf(stderr, "%s (emulated CUDA): out of host memory for %zu floats\n", who, n);
    abort();
  }
  return values;
}

/* A new fp32 copy of in (n), widened exactly. */
static float *widen(const mp_bf16 *in, size_t n, const char *who) {
  float *out = floats_or_abort(n, who);
  mp_bf16_to_floats(out, in, n);
  return out;
}

/* ---- embedding ---- */

void mp_embedding_forward_cuda(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                               const mp_bf16 *wpe, int B, int T, int C, mp_cuda_stream stream) {
  (void)stream;
  /* A loop rather than the CPU twin: widening the whole (Vp, C) table per call would cost more
   * than the lookup. The same fp32 sum and one rounding as the kernel. */
  for (size_t bt = 0; bt < (size_t)B * T; bt++) {
    const mp_bf16 *token_row = wte + (size_t)tokens[bt] * C;
    const mp_bf16 *position_row = wpe + (bt % (size_t)T) * C;
    for (int c = 0; c < C; c++) {
      out[bt * C + c] =
          mp_bf16_from_float(mp_bf16_to_float(token_row[c]) + mp_bf16_to_float(position_row[c]));
    }
  }
}

void mp_embedding_backward_cuda(float *dwte, float *dwpe, const mp_bf16 *dout,
                                const int32_t *tokens, const int32_t *tokens_host,
                                int32_t *workspace, int B, int T, int C, mp_cuda_stream stream) {
  (void)tokens, (void)workspace, (void)stream;
  const size_t n = (size_t)B * T * C;
  if (n == 0) return;
  /* The kernel's rows come from tokens_host (its sort); the CPU twin adds in the same order. */
  float *dout_f = widen(dout, n, "mp_embedding_backward_cuda");
  mp_embedding_backward_cpu(dwte, dwpe, dout_f, tokens_host, B, T, C);
  free(dout_f);
}

size_t mp_embedding_backward_cuda_workspace_ints(int B, int T) { return 3 * (size_t)B * T + 1; }

/* ---- layernorm ---- */

void mp_layernorm_forward_cuda(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *inp,
                               const mp_bf16 *weight, const mp_bf16 *bias, int B, int T, int C,
                               mp_cuda_stream stream) {
  (void)stream;
  const size_t n = (size_t)B * T * C;
  if (n == 0) return;
  const char *who = "mp_layernorm_forward_cuda";
  float *inp_f = widen(inp, n, who);
  float *weight_f = widen(weight, (size_t)C, who);
  float *bias_f = widen(bias, (size_t)C, who);
  float *out_f = floats_or_abort(n, who);
  mp_layernorm_forward_cpu(out_f, mean, rstd, inp_f, weight_f, bias_f, B, T, C);
  mp_bf16_from_floats(out, out_f, n);
  free(out_f);
  free(bias_f);
  free(weight_f);
  free(inp_f);
}

void mp_layernorm_backward_cuda(mp_bf16 *dinp, float *dweight, float *dbias, const mp_bf16 *dout,
                                const mp_bf16 *inp, const mp_bf16 *weight, const float *mean,
                                const float *rstd, float *scratch, int B, int T, int C,
                                mp_cuda_stream stream) {
  (void)scratch, (void)stream;
  const size_t n = (size_t)B * T * C;
  if (n == 0) return;
  const char *who = "mp_layernorm_backward_cuda";
  float *dinp_f = widen(dinp, n, who); /* the += runs in fp32 from the old bf16 values */
  float *dout_f = widen(dout, n, who);
  float *inp_f = widen(inp, n, who);
  float *weight_f = widen(weight, (size_t)C, who);
  mp_layernorm_backward_cpu(dinp_f, dweight, dbias, dout_f, inp_f, weight_f, mean, rstd, B, T, C);
  mp_bf16_from_floats(dinp, dinp_f, n);
  free(weight_f);
  free(inp_f);
  free(dout_f);
  free(dinp_f);
}

size_t mp_layernorm_backward_cuda_scratch_floats(int B, int T, int C) {
  return 2 * (((size_t)B * T + 15) / 16) * (size_t)C;
}

/* ---- GELU ---- */

void mp_gelu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, size_t n, mp_cuda_stream stream) {
  (void)stream;
  if (n == 0) return;
  float *x = widen(inp, n, "mp_gelu_forward_cuda"); /* a copy, so out may be inp */
  mp_gelu_forward_cpu(x, x, n);
  mp_bf16_from_floats(out, x, n);
  free(x);
}

void mp_gelu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, size_t n,
                           mp_cuda_stream stream) {
  (void)stream;
  if (n == 0) return;
  const char *who = "mp_gelu_backward_cuda";
  float *dinp_f = widen(dinp, n, who);
  float *inp_f = widen(inp, n, who);
  float *dout_f = widen(dout, n, who);
  mp_gelu_backward_cpu(dinp_f, inp_f, dout_f, n);
  mp_bf16_from_floats(dinp, dinp_f, n);
  free(dout_f);
  free(inp_f);
  free(dinp_f);
}

/* ---- residual (one fp32 addition per element: loops, no temporaries) ---- */

void mp_residual_forward_cuda(mp_bf16 *out, const mp_bf16 *inp1, const mp_bf16 *inp2, size_t n,
                              mp_cuda_stream stream) {
  (void)stream;
  for (size_t i = 0; i < n; i++) {
    out[i] = mp_bf16_from_float(mp_bf16_to_float(inp1[i]) + mp_bf16_to_float(inp2[i]));
  }
}

void mp_residual_backward_cuda(mp_bf16 *dinp1, mp_bf16 *dinp2, const mp_bf16 *dout, size_t n,
                               mp_cuda_stream stream) {
  (void)stream;
  for (size_t i = 0; i < n; i++) {
    const float dy = mp_bf16_to_float(dout[i]);
    dinp1[i] = mp_bf16_from_float(mp_bf16_to_float(dinp1[i]) + dy);
    dinp2[i] = mp_bf16_from_float(mp_bf16_to_float(dinp2[i]) + dy); /* after: aliases add twice */
  }
}

/* ---- fused softmax + cross-entropy ---- */

void mp_cross_entropy_fused_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                                 float dloss, int B, int T, int V, int Vp, mp_cuda_stream stream) {
  (void)stream;
  const size_t n = (size_t)B * T * Vp;
  if (n == 0) return;
  /* The CPU twin ignores the padding columns [V, Vp) whatever they hold and writes their
   * probability and gradient as 0, so the gradient is written (=) over every column. */
  float *x = widen(logits, n, "mp_cross_entropy_fused_cuda");
  mp_cross_entropy_forward_cpu(losses, x, x, targets, B, T, V, Vp);
  mp_cross_entropy_backward_in_place_cpu(x, targets, dloss, B, T, V, Vp);
  mp_bf16_from_floats(logits, x, n);
  free(x);
}

/* ---- optimizer ---- */

void mp_adamw_update_cuda(float *params, mp_bf16 *params_bf16, const float *grads, float *m,
                          float *v, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t, mp_cuda_stream stream) {
  (void)stream;
  if (n == 0) return;
  mp_adamw_update_cpu(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
  if (params_bf16 != NULL) mp_bf16_from_floats(params_bf16, params, n);
}

mp_status mp_grad_norm_squared_cuda(const float *grads, size_t n, float *scratch,
                                    double *out_host, mp_cuda_stream stream, mp_error *err) {
  (void)stream;
  *out_host = 0.0;
  if (n == 0) return MP_OK;
  if (((uintptr_t)scratch & 7u) != 0) { /* the CUDA build's check, kept for the same contract */
    return mp_fail(err, MP_ERR_RUNTIME,
                   "mp_grad_norm_squared_cuda: scratch %p is not 8-byte aligned; it holds doubles "
                   "(pass memory from mp_device_alloc)",
                   (void *)scratch);
  }
  *out_host = mp_grad_norm_squared_cpu(grads, n); /* double, in index order */
  return MP_OK;
}

size_t mp_grad_norm_cuda_scratch_floats(size_t n) {
  size_t blocks = (n + 256 * 16 - 1) / (256 * 16);
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  return 2 * (blocks + 1);
}

void mp_grad_scale_cuda(float *grads, size_t n, float scale, mp_cuda_stream stream) {
  (void)stream;
  mp_grad_scale_cpu(grads, n, scale);
}

void mp_bf16_from_float_cuda(mp_bf16 *out, const float *in, size_t n, mp_cuda_stream stream) {
  (void)stream;
  mp_bf16_from_floats(out, in, n);
}

/* ---- RMSNorm ---- */

void mp_rmsnorm_forward_cuda(mp_bf16 *out, float *rstd, const mp_bf16 *inp, const mp_bf16 *weight,
                             int rows, int C, float eps, mp_cuda_stream stream) {
  (void)stream;
  if (rows <= 0 || C <= 0) return;
  const size_t n = (size_t)rows * C;
  const char *who = "mp_rmsnorm_forward_cuda";
  float *inp_f = widen(inp, n, who);
  float *weight_f = widen(weight, (size_t)C, who);
  float *out_f = floats_or_abort(n, who);
  mp_rmsnorm_forward_cpu(out_f, rstd, inp_f, weight_f, rows, C, eps);
  mp_bf16_from_floats(out, out_f, n);
  free(out_f);
  free(weight_f);
  free(inp_f);
}

void mp_rmsnorm_backward_cuda(mp_bf16 *dinp, float *dweight, const mp_bf16 *dout,
                              const mp_bf16 *inp, const mp_bf16 *weight, const float *rstd,
                              float *scratch, int rows, int C, mp_cuda_stream stream) {
  (void)scratch, (void)stream;
  if (rows <= 0 || C <= 0) return;
  const size_t n = (size_t)rows * C;
  const char *who = "mp_rmsnorm_backward_cuda";
  float *dinp_f = widen(dinp, n, who); /* the += runs in fp32 from the old bf16 values */
  float *dout_f = widen(dout, n, who);
  float *inp_f = widen(inp, n, who);
  float *weight_f = widen(weight, (size_t)C, who);
  mp_rmsnorm_backward_cpu(dinp_f, dweight, dout_f, inp_f, weight_f, rstd, rows, C);
  mp_bf16_from_floats(dinp, dinp_f, n);
  free(weight_f);
  free(inp_f);
  free(dout_f);
  free(dinp_f);
}

size_t mp_rmsnorm_backward_cuda_scratch_floats(int rows, int C) {
  const size_t floats = rows > 0 && C > 0 ? (((size_t)rows + 15) / 16) * (size_t)C : 0;
  return floats > 0 ? floats : 1;
}

/* ---- SwiGLU ---- */

void mp_swiglu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, int N, int F,
                            mp_cuda_stream stream) {
  (void)stream;
  if (N <= 0 || F <= 0) return;
  const size_t n = (size_t)N * F;
  const char *who = "mp_swiglu_forward_cuda";
  float *inp_f = widen(inp, 2 * n, who);
  float *out_f = floats_or_abort(n, who);
  mp_swiglu_forward_cpu(out_f, inp_f, N, F);
  mp_bf16_from_floats(out, out_f, n);
  free(out_f);
  free(inp_f);
}

void mp_swiglu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, int N, int F,
                             mp_cuda_stream stream) {
  (void)stream;
  if (N <= 0 || F <= 0) return;
  const size_t n = (size_t)N * F;
  const char *who = "mp_swiglu_backward_cuda";
  float *dinp_f = widen(dinp, 2 * n, who);
  float *inp_f = widen(inp, 2 * n, who);
  float *dout_f = widen(dout, n, who);
  mp_swiglu_backward_cpu(dinp_f, inp_f, dout_f, N, F);
  mp_bf16_from_floats(dinp, dinp_f, 2 * n);
  free(dout_f);
  free(inp_f);
  free(dinp_f);
}

/* ---- rotary embeddings ---- */

/* The CPU twin on an fp32 copy of x's whole extent; only the rotated heads are written back, so
 * the rest of each row keeps its bits (whatever they are, NaN payloads included). */
static void rope_emulated(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int B,
                          int T, int heads, int HS, size_t row_stride, int backward,
                          const char *who) {
  if (B <= 0 || T <= 0 || heads <= 0 || HS / 2 <= 0) return;
  const size_t rows = (size_t)B * T, width = (size_t)heads * HS;
  const size_t extent = (rows - 1) * row_stride + width;
  float *x_f = widen(x, extent, who);
  if (backward) {
    mp_rope_backward_at_cpu(x_f, inv_freq, positions, B, T, heads, HS, row_stride);
  } else {
    mp_rope_forward_at_cpu(x_f, inv_freq, positions, B, T, heads, HS, row_stride);
  }
  for (size_t r = 0; r < rows; r++) {
    mp_bf16_from_floats(x + r * row_stride, x_f + r * row_stride, width);
  }
  free(x_f);
}

void mp_rope_forward_cuda(mp_bf16 *x, const float *inv_freq, int B, int T, int heads, int HS,
                          size_t row_stride, mp_cuda_stream stream) {
  (void)stream;
  rope_emulated(x, inv_freq, NULL, B, T, heads, HS, row_stride, 0, "mp_rope_forward_cuda");
}

void mp_rope_backward_cuda(mp_bf16 *dx, const float *inv_freq, int B, int T, int heads, int HS,
                           size_t row_stride, mp_cuda_stream stream) {
  (void)stream;
  rope_emulated(dx, inv_freq, NULL, B, T, heads, HS, row_stride, 1, "mp_rope_backward_cuda");
}

void mp_rope_forward_at_cuda(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int B,
                             int T, int heads, int HS, size_t row_stride, mp_cuda_stream stream) {
  (void)stream;
  rope_emulated(x, inv_freq, positions, B, T, heads, HS, row_stride, 0,
                "mp_rope_forward_at_cuda");
}

void mp_rope_backward_at_cuda(mp_bf16 *dx, const float *inv_freq, const int32_t *positions,
                              int B, int T, int heads, int HS, size_t row_stride,
                              mp_cuda_stream stream) {
  (void)stream;
  rope_emulated(dx, inv_freq, positions, B, T, heads, HS, row_stride, 1,
                "mp_rope_backward_at_cuda");
}
