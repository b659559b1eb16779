/*
 * layers/moe_cuda_emulated.c — the kernels of //layers:cuda_moe (moe_cuda_internal.h and the
 * steps of moe_cuda.h that are kernels) under `--define mpengine_cuda=emulated`
 * (third_party/cuda.bzl): run on the CPU so that the GPU twin of the mixture of experts is tested
 * on machines without a GPU. Test-only. moe_cuda.c's compositions (the expert and shared GEMMs
 * through the emulated matmul and SwiGLU twins) are the CUDA build's own.
 *
 * "Device" pointers are host memory (engine/device/device_emulated.c), streams are ignored. The
 * grouped GEMM is cuBLAS's column-major contract written out, so the shapes, leading dimensions
 * and offsets moe_cuda.c hands to cuBLAS are checked here. Each other step runs moe.c's CPU step
 * on its bf16 inputs widened to fp32 (the route: mp_moe_route_cpu; the weighted sum:
 * mp_moe_combine_cpu; their backwards: mp_moe_combine_backward_cpu and
 * mp_moe_route_backward_cpu) and rounds to bf16 where the CUDA build rounds: routed_in (exact,
 * a copy), out once, drouted once, dx as one rounding of old + new. The router's arrays (logits,
 * probs, weights) and gradients are fp32 as in the CUDA build. The shared gate's two small loops
 * have no CPU step of their own (moe.c folds them into the shared MLP's) and are written here.
 *
 * What is not emulated: cuBLAS's and the kernels' summation orders (the results agree with the
 * CUDA build to the kernel test's tolerances, not bit for bit), FMA contraction, asynchrony. The
 * launchers return void, so should a temporary fail to allocate they print a message to stderr
 * and abort(): acceptable for test-only code.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/moe.h"
#include "layers/moe_cuda.h"
#include "layers/moe_cuda_internal.h"

/* ---- helpers ---- */

static void *zeros_or_abort(size_t count, size_t size, const char *who) {
  void *values = calloc(count > 0 ? count : 1, size);
  if (values == NULL) {
    fprintf(stderr, "%s (emulated CUDA): out of host memory for %zu values\n", who, count);
    abort();
  }
  return values;
}

/* A new fp32 copy of in (n), widened exactly. */
static float *widen(const mp_bf16 *in, size_t n, const char *who) {
  float *out = zeros_or_abort(n, sizeof(float), who);
  if (in != NULL) mp_bf16_to_floats(out, in, n);
  return out;
}

/* dst (n) = bf16(dst + delta), the sum in fp32, one rounding per element. */
static void add_round(mp_bf16 *dst, const float *delta, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mp_bf16_from_float(mp_bf16_to_float(dst[i]) + delta[i]);
}

/* The CPU cache's view of a device cache's router and grouping arrays (fp32 and ints are the
 * same on both), without its shared MLP (shape->shared_ffn 0: the GEMMs are moe_cuda.c's). */
static mp_moe_cache cpu_view(const mp_moe_cache_cuda *cache) {
  mp_moe_cache view;
  memset(&view, 0, sizeof view);
  view.shape = cache->shape;
  view.shape.shared_ffn = 0;
  view.shape.shared_gate = false;
  view.logits = cache->logits;
  view.probs = cache->probs;
  view.selected = cache->selected;
  view.weights = cache->weights;
  view.expert_offset = cache->expert_offset;
  view.routed_slot = cache->routed_slot;
  return view;
}

/* ---- moe_cuda_internal.h ---- */

void mp_moe_cuda_route(mp_cublas *cublas, const mp_bf16 *x, const mp_bf16 *router,
                       mp_moe_cache_cuda *cache, mp_cuda_stream stream) {
  (void)cublas;
  (void)stream;
  mp_moe_shape shape = cache->shape;
  shape.shared_ffn = 0; /* the route reads the router alone */
  shape.shared_gate = false;
  const size_t N = (size_t)shape.tokens, C = (size_t)shape.channels, E = (size_t)shape.experts;
  const size_t K = (size_t)shape.top_k, NK = N * K;
  float *x_wide = widen(x, N * C, "moe route");
  float *router_wide = widen(router, E * C, "moe route");
  mp_moe_params params = {router_wide, NULL, NULL, NULL, NULL, NULL};
  mp_moe_cache routed;
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_moe_route_cpu(x_wide, &params, &shape, &routed, &err) != MP_OK) {
    fprintf(stderr, "moe route (emulated CUDA): %s\n", err.message);
    abort();
  }
  memcpy(cache->logits, routed.logits, N * E * sizeof(float));
  memcpy(cache->probs, routed.probs, N * E * sizeof(float));
  memcpy(cache->selected, routed.selected, NK * sizeof(int));
  memcpy(cache->weights, routed.weights, NK * sizeof(float));
  memcpy(cache->expert_offset, routed.expert_offset, (E + 1) * sizeof(int));
  memcpy(cache->routed_slot, routed.routed_slot, NK * sizeof(int));
  for (size_t row = 0; row < NK; ++row) {
    cache->slot_row[routed.routed_slot[row]] = (int)row;
    /* A gathered row is a copy: its bf16 bits are x's. */
    memcpy(cache->routed_in + row * C, x + (size_t)(routed.routed_slot[row] / (int)K) * C,
           C * sizeof(mp_bf16));
  }
  mp_moe_cache_free(&routed);
  free(x_wide);
  free(router_wide);
}

mp_status mp_moe_cuda_copy_offsets(int *host, const int *device, int n, mp_cuda_stream stream,
                                   mp_error *err) {
  (void)stream;
  (void)err;
  memcpy(host, device, (size_t)n * sizeof(int));
  return MP_OK;
}

/* cublasGemmGroupedBatchedEx's contract, column-major, naively: each C_p element the fp32 sum of
 * its k products, plus beta times the old value, rounded once. It takes the host arrays as they
 * are (the CUDA build copies the pointers to pointer_scratch first), so the emulated run checks
 * the shapes, leading dimensions and offsets moe_cuda.c hands to cuBLAS. */
void mp_moe_cuda_grouped_gemm(mp_cublas *cublas, int count, bool trans_a, const int *m,
                              const int *n, const int *k, const mp_bf16 *const *a, const int *lda,
                              const mp_bf16 *const *b, const int *ldb, float beta,
                              mp_bf16 *const *c, const int *ldc, void **pointer_scratch,
                              mp_cuda_stream stream) {
  (void)cublas;
  (void)pointer_scratch;
  (void)stream;
  if (count > MP_MOE_GEMM_GROUP) {
    fprintf(stderr, "moe grouped GEMM (emulated CUDA): %d problems, at most %d\n", count,
            (int)MP_MOE_GEMM_GROUP);
    abort();
  }
  for (int p = 0; p < count; ++p) {
    for (int j = 0; j < n[p]; ++j) {
      for (int i = 0; i < m[p]; ++i) {
        float sum = 0.0f;
        for (int l = 0; l < k[p]; ++l) {
          const mp_bf16 a_il =
              trans_a ? a[p][l + (size_t)i * lda[p]] : a[p][i + (size_t)l * lda[p]];
          sum += mp_bf16_to_float(a_il) * mp_bf16_to_float(b[p][l + (size_t)j * ldb[p]]);
        }
        mp_bf16 *out = &c[p][i + (size_t)j * ldc[p]];
        *out = mp_bf16_from_float(sum + (beta != 0.0f ? beta * mp_bf16_to_float(*out) : 0.0f));
      }
    }
  }
}

void mp_moe_cuda_zero(void *p, size_t bytes, mp_cuda_stream stream) {
  (void)stream;
  if (bytes > 0) memset(p, 0, bytes);
}

static float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

void mp_moe_cuda_gate(float *gate, const mp_bf16 *x, const mp_bf16 *gate_weight, int N, int C,
                      mp_cuda_stream stream) {
  (void)stream;
  for (int t = 0; t < N; ++t) {
    float dot = 0.0f;
    if (gate_weight != NULL) {
      for (int c = 0; c < C; ++c) {
        dot += mp_bf16_to_float(x[(size_t)t * C + c]) * mp_bf16_to_float(gate_weight[c]);
      }
    }
    gate[t] = gate_weight != NULL ? sigmoid(dot) : 1.0f;
  }
}

void mp_moe_cuda_weighted_sum(mp_bf16 *out, const mp_bf16 *routed_out, const float *weights,
                              const int *routed_slot, const int *slot_row,
                              const mp_bf16 *shared_out, const float *gate, int N, int K, int C,
                              mp_cuda_stream stream) {
  (void)stream;
  (void)slot_row;
  const size_t NK = (size_t)N * K, NC = (size_t)N * C;
  /* moe.c's weighted sum: a view with the routed arrays and no shared MLP; its rows are all
   * N K pairs (the GPU twin is dropless), as one expert's. */
  int rows[2] = {0, (int)NK};
  mp_moe_cache view;
  memset(&view, 0, sizeof view);
  view.shape.tokens = N;
  view.shape.channels = C;
  view.shape.experts = 1;
  view.shape.top_k = K;
  view.expert_offset = rows;
  view.weights = (float *)weights;
  view.routed_slot = (int *)routed_slot;
  view.routed_out = widen(routed_out, NK * C, "moe weighted sum");
  float *sum = zeros_or_abort(NC, sizeof(float), "moe weighted sum");
  mp_moe_combine_cpu(sum, NULL, NULL, &view);
  for (size_t i = 0; i < NC; ++i) {
    if (shared_out != NULL) sum[i] += gate[i / C] * mp_bf16_to_float(shared_out[i]);
    out[i] = mp_bf16_from_float(sum[i]);
  }
  free(view.routed_out);
  free(sum);
}

void mp_moe_cuda_shared_gate_backward(mp_bf16 *dshared, mp_bf16 *dx, float *dgate_weight,
                                      float *dlogit, const mp_bf16 *dout, const mp_bf16 *x,
                                      const mp_bf16 *gate_weight, const mp_bf16 *shared_out,
                                      const float *gate, int N, int C, mp_cuda_stream stream) {
  (void)stream;
  for (int t = 0; t < N; ++t) {
    const size_t row = (size_t)t * C;
    const float g = gate[t];
    float dg = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float d = mp_bf16_to_float(dout[row + c]);
      dshared[row + c] = mp_bf16_from_float(g * d);
      dg += d * mp_bf16_to_float(shared_out[row + c]);
    }
    if (gate_weight == NULL) continue;
    dlogit[t] = dg * g * (1.0f - g);
    for (int c = 0; c < C; ++c) {
      dx[row + c] = mp_bf16_from_float(mp_bf16_to_float(dx[row + c]) +
                                       dlogit[t] * mp_bf16_to_float(gate_weight[c]));
    }
  }
  if (gate_weight == NULL) return;
  for (int c = 0; c < C; ++c) {
    float sum = 0.0f;
    for (int t = 0; t < N; ++t) sum += dlogit[t] * mp_bf16_to_float(x[(size_t)t * C + c]);
    dgate_weight[c] += sum;
  }
}

/* ---- the steps of moe_cuda.h that are kernels ---- */

void mp_moe_combine_backward_cuda(mp_bf16 *drouted, float *dweights, const mp_bf16 *dout,
                                  const mp_moe_cache_cuda *cache, mp_cuda_stream stream) {
  (void)stream;
  const size_t N = (size_t)cache->shape.tokens, C = (size_t)cache->shape.channels;
  const size_t NK = N * (size_t)cache->shape.top_k;
  mp_moe_cache view = cpu_view(cache);
  view.routed_out = widen(cache->routed_out, NK * C, "moe combine backward");
  float *dout_wide = widen(dout, N * C, "moe combine backward");
  float *drouted_wide = zeros_or_abort(NK * C, sizeof(float), "moe combine backward");
  mp_moe_combine_backward_cpu(drouted_wide, dweights, dout_wide, &view);
  mp_bf16_from_floats(drouted, drouted_wide, NK * C);
  free(view.routed_out);
  free(dout_wide);
  free(drouted_wide);
}

mp_status mp_moe_route_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, float *drouter,
                                     const mp_bf16 *drouted_in, const float *dweights,
                                     const mp_bf16 *x, const mp_bf16 *router,
                                     const mp_moe_cache_cuda *cache, const mp_moe_stats *stats,
                                     double aux_coeff, double z_coeff,
                                     mp_moe_workspace_cuda *workspace, mp_cuda_stream stream,
                                     mp_error *err) {
  (void)cublas;
  (void)workspace;
  (void)stream;
  const size_t N = (size_t)cache->shape.tokens, C = (size_t)cache->shape.channels;
  const size_t E = (size_t)cache->shape.experts, NK = N * (size_t)cache->shape.top_k;
  const mp_moe_cache view = cpu_view(cache);
  float *x_wide = widen(x, N * C, "moe route backward");
  float *router_wide = widen(router, E * C, "moe route backward");
  float *drouted_in_wide = widen(drouted_in, NK * C, "moe route backward");
  float *dx_wide = zeros_or_abort(N * C, sizeof(float), "moe route backward");
  const mp_status status =
      mp_moe_route_backward_cpu(dx_wide, drouter, drouted_in_wide, dweights, x_wide, router_wide,
                                &view, stats, aux_coeff, z_coeff, err);
  if (status == MP_OK) add_round(dx, dx_wide, N * C);
  free(x_wide);
  free(router_wide);
  free(drouted_in_wide);
  free(dx_wide);
  return status;
}

mp_status mp_moe_stats_add_cuda(mp_moe_stats *stats, const mp_moe_cache_cuda *cache,
                                double *scratch, mp_cuda_stream stream, mp_error *err) {
  (void)scratch;
  (void)stream;
  (void)err;
  const mp_moe_cache view = cpu_view(cache);
  mp_moe_stats_add(stats, &view);
  return MP_OK;
}
