/* layers/moe_cuda.c — the GPU twin of the mixture-of-experts MLP: the steps of moe_cuda.h
 * composed from the kernels of moe_cuda_kernels.cu (moe_cuda_internal.h, the grouped GEMM among
 * them) and the matmul and SwiGLU twins (layers/matmul.h, layers/swiglu.h). Plain C over the CUDA
 * C API, so the CUDA, emulated and none builds share it. */
#include "layers/moe_cuda.h"

#include <stdbool.h>
#include <stdint.h>

#include "layers/matmul.h"
#include "layers/moe_cuda_internal.h"
#include "layers/swiglu.h"

/* ---- one allocation cut into named arrays ---- */

enum { kCarveAlignment = 256 };

/* Points *at at the next `bytes` of the allocation from *cursor (256-byte aligned), or at NULL
 * when bytes is 0; advances *cursor. base is NULL when only the size is wanted. */
static void *carve(char *base, size_t *cursor, size_t bytes) {
  if (bytes == 0) return NULL;
  const size_t at = (*cursor + kCarveAlignment - 1) / kCarveAlignment * kCarveAlignment;
  *cursor = at + bytes;
  return base != NULL ? base + at : NULL;
}

/* Fills *cache from device (NULL: sizes only); returns the bytes used. */
static size_t cache_layout(mp_moe_cache_cuda *cache, const mp_moe_shape *shape, char *device) {
  const size_t N = (size_t)shape->tokens, C = (size_t)shape->channels, E = (size_t)shape->experts;
  const size_t NK = N * (size_t)shape->top_k, F = (size_t)shape->expert_ffn;
  const size_t Fs = (size_t)shape->shared_ffn;
  size_t cursor = 0;
  cache->shape = *shape;
  cache->logits = carve(device, &cursor, N * E * sizeof(float));
  cache->probs = carve(device, &cursor, N * E * sizeof(float));
  cache->selected = carve(device, &cursor, NK * sizeof(int));
  cache->weights = carve(device, &cursor, NK * sizeof(float));
  cache->expert_offset = carve(device, &cursor, (E + 1) * sizeof(int));
  cache->routed_slot = carve(device, &cursor, NK * sizeof(int));
  cache->slot_row = carve(device, &cursor, NK * sizeof(int));
  cache->routed_in = carve(device, &cursor, NK * C * sizeof(mp_bf16));
  cache->routed_fc1 = carve(device, &cursor, NK * 2 * F * sizeof(mp_bf16));
  cache->routed_act = carve(device, &cursor, NK * F * sizeof(mp_bf16));
  cache->routed_out = carve(device, &cursor, NK * C * sizeof(mp_bf16));
  const size_t shared_tokens = Fs > 0 ? N : 0;
  cache->shared_fc1 = carve(device, &cursor, shared_tokens * 2 * Fs * sizeof(mp_bf16));
  cache->shared_act = carve(device, &cursor, shared_tokens * Fs * sizeof(mp_bf16));
  cache->shared_out = carve(device, &cursor, shared_tokens * C * sizeof(mp_bf16));
  cache->shared_gate = carve(device, &cursor, shared_tokens * sizeof(float));
  cache->gemm_pointers = carve(device, &cursor, 3 * MP_MOE_GEMM_GROUP * sizeof(void *));
  return cursor;
}

static size_t workspace_layout(mp_moe_workspace_cuda *w, const mp_moe_shape *shape, char *device) {
  const size_t N = (size_t)shape->tokens, C = (size_t)shape->channels, E = (size_t)shape->experts;
  const size_t NK = N * (size_t)shape->top_k, F = (size_t)shape->expert_ffn;
  const size_t Fs = (size_t)shape->shared_ffn;
  const size_t rows = NK > N ? NK : N, width = F > Fs ? F : Fs;
  size_t cursor = 0;
  w->dweights = carve(device, &cursor, NK * sizeof(float));
  w->drouted = carve(device, &cursor, NK * C * sizeof(mp_bf16));
  w->drouted_in = carve(device, &cursor, NK * C * sizeof(mp_bf16));
  w->dact = carve(device, &cursor, rows * width * sizeof(mp_bf16));
  w->dfc1 = carve(device, &cursor, rows * 2 * width * sizeof(mp_bf16));
  w->dshared = carve(device, &cursor, N * C * sizeof(mp_bf16));
  w->dlogits = carve(device, &cursor, N * E * sizeof(float));
  w->dx_router = carve(device, &cursor, N * C * sizeof(float));
  w->x_wide = carve(device, &cursor, N * C * sizeof(float));
  w->router_wide = carve(device, &cursor, E * C * sizeof(float));
  w->aux_grad = carve(device, &cursor, E * sizeof(double));
  return cursor;
}

size_t mp_moe_cache_cuda_bytes(const mp_moe_shape *shape) {
  mp_moe_cache_cuda sizes;
  return cache_layout(&sizes, shape, NULL);
}

size_t mp_moe_workspace_cuda_bytes(const mp_moe_shape *shape) {
  mp_moe_workspace_cuda sizes;
  return workspace_layout(&sizes, shape, NULL);
}

void mp_moe_cache_cuda_carve(mp_moe_cache_cuda *cache, const mp_moe_shape *shape, void *device,
                             int *offset_host) {
  cache_layout(cache, shape, (char *)device);
  cache->expert_offset_host = offset_host;
}

void mp_moe_workspace_cuda_carve(mp_moe_workspace_cuda *workspace, const mp_moe_shape *shape,
                                 void *device) {
  workspace_layout(workspace, shape, (char *)device);
}

/* ---- the steps ---- */

mp_status mp_moe_route_cuda(mp_cublas *cublas, const mp_bf16 *x,
                            const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                            mp_cuda_stream stream, mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  const int F = shape->expert_ffn, Fs = shape->shared_ffn;
  if (N < 0 || C < 1 || E < 1 || K < 1 || K > E || F < 1 || Fs < 0 ||
      (shape->shared_gate && Fs == 0) ||
      (Fs > 0 && (weights->shared_fc1 == NULL || weights->shared_fc2 == NULL)) ||
      (shape->shared_gate && weights->shared_gate == NULL)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe (CUDA): shape out of range (tokens %d, channels %d, experts %d, top_k %d, "
                   "expert_ffn %d, shared_ffn %d) or shared weights missing",
                   N, C, E, K, F, Fs);
  }
  if (shape->capacity_factor > 0.0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe (CUDA): capacity_factor %g: the route kernel is dropless only (the CPU "
                   "layer, layers/moe.h, drops)",
                   shape->capacity_factor);
  }
  mp_moe_cuda_route(cublas, x, weights->router, cache, stream);
  return mp_moe_cuda_copy_offsets(cache->expert_offset_host, cache->expert_offset, E + 1, stream,
                                  err);
}

/* The experts' GEMMs of one kind, grouped: for each expert e with rows (count_e of them),
 * row-major out_e (count_e, N) = bf16(beta out_e + in_e (count_e, K) @ W_e^T) with W_e (N, K) when
 * weight_transposed (a forward), or in_e @ W_e with W_e (K, N) (an input gradient); in, out and
 * the weights are strided by their expert (rows times K or N, N K per weight). In cuBLAS's
 * column-major terms out_e^T (N x count_e) = op(W_e) (N x K) in_e^T (K x count_e). */
static void grouped_gemms(mp_cublas *cublas, const mp_moe_expert_rows_cuda *rows, bool forward,
                          mp_bf16 *out, const mp_bf16 *in, const mp_bf16 *weight, int N, int K,
                          float beta, mp_cuda_stream stream) {
  int m[MP_MOE_GEMM_GROUP], n[MP_MOE_GEMM_GROUP], k[MP_MOE_GEMM_GROUP];
  int lda[MP_MOE_GEMM_GROUP], ldb[MP_MOE_GEMM_GROUP], ldc[MP_MOE_GEMM_GROUP];
  const mp_bf16 *a[MP_MOE_GEMM_GROUP], *b[MP_MOE_GEMM_GROUP];
  mp_bf16 *c[MP_MOE_GEMM_GROUP];
  int count = 0;
  for (int e = 0; e < rows->experts; ++e) {
    const int first = rows->offset[e], rows_e = rows->offset[e + 1] - first;
    if (rows_e > 0) {
      m[count] = N;
      n[count] = rows_e;
      k[count] = K;
      a[count] = weight + (size_t)e * N * K;
      lda[count] = forward ? K : N; /* W_e (N, K) row-major is (K x N) column-major, and back */
      b[count] = in + (size_t)first * K;
      ldb[count] = K;
      c[count] = out + (size_t)first * N;
      ldc[count] = N;
      ++count;
    }
    if (count == MP_MOE_GEMM_GROUP || (e + 1 == rows->experts && count > 0)) {
      mp_moe_cuda_grouped_gemm(cublas, count, forward, m, n, k, a, lda, b, ldb, beta, c, ldc,
                               rows->gemm_pointers, stream);
      count = 0;
    }
  }
}

void mp_moe_experts_forward_cuda(mp_cublas *cublas, const mp_moe_weights_cuda *weights,
                                 const mp_moe_shape *shape, const mp_moe_expert_rows_cuda *rows,
                                 mp_cuda_stream stream) {
  const int C = shape->channels, F = shape->expert_ffn;
  if (rows->gemm_pointers != NULL) {
    const int R = rows->offset[rows->experts];
    grouped_gemms(cublas, rows, true, rows->fc1, rows->in, weights->expert_fc1, 2 * F, C, 0.0f,
                  stream);
    mp_swiglu_forward_cuda(rows->act, rows->fc1, R, F, stream); /* row by row: all at once */
    grouped_gemms(cublas, rows, true, rows->out, rows->act, weights->expert_fc2, C, F, 0.0f,
                  stream);
    return;
  }
  for (int e = 0; e < rows->experts; ++e) {
    const int first = rows->offset[e], count = rows->offset[e + 1] - first;
    if (count == 0) continue; /* an expert with no row does no work */
    mp_bf16 *fc1 = rows->fc1 + (size_t)first * 2 * F, *act = rows->act + (size_t)first * F;
    mp_matmul_forward_cuda(cublas, fc1, rows->in + (size_t)first * C,
                           weights->expert_fc1 + (size_t)e * 2 * F * C, NULL, count, C, 2 * F,
                           stream);
    mp_swiglu_forward_cuda(act, fc1, count, F, stream);
    mp_matmul_forward_cuda(cublas, rows->out + (size_t)first * C, act,
                           weights->expert_fc2 + (size_t)e * C * F, NULL, count, F, C, stream);
  }
}

void mp_moe_combine_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *x,
                         const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                         mp_cuda_stream stream) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, K = shape->top_k, Fs = shape->shared_ffn;
  if (N == 0) return;
  if (Fs > 0) {
    mp_matmul_forward_cuda(cublas, cache->shared_fc1, x, weights->shared_fc1, NULL, N, C, 2 * Fs,
                           stream);
    mp_swiglu_forward_cuda(cache->shared_act, cache->shared_fc1, N, Fs, stream);
    mp_matmul_forward_cuda(cublas, cache->shared_out, cache->shared_act, weights->shared_fc2, NULL,
                           N, Fs, C, stream);
    mp_moe_cuda_gate(cache->shared_gate, x, shape->shared_gate ? weights->shared_gate : NULL, N,
                     C, stream);
  }
  mp_moe_cuda_weighted_sum(out, cache->routed_out, cache->weights, cache->routed_slot,
                           cache->slot_row, Fs > 0 ? cache->shared_out : NULL, cache->shared_gate,
                           N, K, C, stream);
}

void mp_moe_experts_backward_cuda(mp_cublas *cublas, mp_bf16 *din, mp_moe_grads_cuda *grads,
                                  const mp_bf16 *dout, const mp_moe_weights_cuda *weights,
                                  const mp_moe_shape *shape, const mp_moe_expert_rows_cuda *rows,
                                  mp_bf16 *dact, mp_bf16 *dfc1, mp_cuda_stream stream) {
  const int C = shape->channels, F = shape->expert_ffn;
  const int R = rows->offset[rows->experts];
  /* The SwiGLU's backward adds (+=) into d(fc1), and so does the loop's fc2 backward into
   * d(act): start them at zero. */
  mp_moe_cuda_zero(dfc1, (size_t)R * 2 * F * sizeof(mp_bf16), stream);
  if (rows->gemm_pointers != NULL) {
    /* The input gradients grouped: d(act) = dout @ W2_e (written), the SwiGLU's backward over
     * every row, din += d(fc1) @ W1_e. */
    grouped_gemms(cublas, rows, false, dact, dout, weights->expert_fc2, F, C, 0.0f, stream);
    mp_swiglu_backward_cuda(dfc1, rows->fc1, dact, R, F, stream);
    grouped_gemms(cublas, rows, false, din, dfc1, weights->expert_fc1, C, 2 * F, 1.0f, stream);
  } else {
    mp_moe_cuda_zero(dact, (size_t)R * F * sizeof(mp_bf16), stream);
  }
  for (int e = 0; e < rows->experts; ++e) {
    const int first = rows->offset[e], count = rows->offset[e + 1] - first;
    if (count == 0) continue;
    mp_bf16 *dact_e = dact + (size_t)first * F, *dfc1_e = dfc1 + (size_t)first * 2 * F;
    const mp_bf16 *act_e = rows->act + (size_t)first * F, *in_e = rows->in + (size_t)first * C;
    float *dfc1_w = grads->expert_fc1 + (size_t)e * 2 * F * C;
    float *dfc2_w = grads->expert_fc2 + (size_t)e * C * F;
    if (rows->gemm_pointers != NULL) { /* the weight gradients alone: fp32 += */
      mp_matmul_backward_cuda(cublas, NULL, dfc2_w, NULL, dout + (size_t)first * C, act_e, NULL,
                              NULL, count, F, C, stream);
      mp_matmul_backward_cuda(cublas, NULL, dfc1_w, NULL, dfc1_e, in_e, NULL, NULL, count, C,
                              2 * F, stream);
      continue;
    }
    mp_matmul_backward_cuda(cublas, dact_e, dfc2_w, NULL, dout + (size_t)first * C, act_e,
                            weights->expert_fc2 + (size_t)e * C * F, NULL, count, F, C, stream);
    mp_swiglu_backward_cuda(dfc1_e, rows->fc1 + (size_t)first * 2 * F, dact_e, count, F, stream);
    mp_matmul_backward_cuda(cublas, din + (size_t)first * C, dfc1_w, NULL, dfc1_e, in_e,
                            weights->expert_fc1 + (size_t)e * 2 * F * C, NULL, count, C, 2 * F,
                            stream);
  }
}

void mp_moe_shared_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                                 const mp_bf16 *dout, const mp_bf16 *x,
                                 const mp_moe_weights_cuda *weights,
                                 const mp_moe_cache_cuda *cache,
                                 mp_moe_workspace_cuda *workspace, mp_cuda_stream stream) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, Fs = shape->shared_ffn;
  if (Fs == 0 || N == 0) return;
  const bool gated = shape->shared_gate;
  /* The gate: dshared = g dout, and the gate's own gradients (dlogits is scratch here). */
  mp_moe_cuda_shared_gate_backward(workspace->dshared, dx, gated ? grads->shared_gate : NULL,
                                   workspace->dlogits, dout, x,
                                   gated ? weights->shared_gate : NULL, cache->shared_out,
                                   cache->shared_gate, N, C, stream);
  /* The MLP, as one expert over every token. */
  mp_moe_cuda_zero(workspace->dact, (size_t)N * Fs * sizeof(mp_bf16), stream);
  mp_moe_cuda_zero(workspace->dfc1, (size_t)N * 2 * Fs * sizeof(mp_bf16), stream);
  mp_matmul_backward_cuda(cublas, workspace->dact, grads->shared_fc2, NULL, workspace->dshared,
                          cache->shared_act, weights->shared_fc2, NULL, N, Fs, C, stream);
  mp_swiglu_backward_cuda(workspace->dfc1, cache->shared_fc1, workspace->dact, N, Fs, stream);
  mp_matmul_backward_cuda(cublas, dx, grads->shared_fc1, NULL, workspace->dfc1, x,
                          weights->shared_fc1, NULL, N, C, 2 * Fs, stream);
}

/* ---- the one-device composition ---- */

/* Every expert is on this device: the rows are the cache's own. */
static mp_moe_expert_rows_cuda own_rows(const mp_moe_cache_cuda *cache) {
  const mp_moe_expert_rows_cuda rows = {cache->shape.experts, cache->expert_offset_host,
                                        cache->routed_in,     cache->routed_fc1,
                                        cache->routed_act,    cache->routed_out,
                                        cache->gemm_pointers};
  return rows;
}

mp_status mp_moe_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *x,
                              const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                              mp_cuda_stream stream, mp_error *err) {
  MP_TRY(mp_moe_route_cuda(cublas, x, weights, cache, stream, err));
  const mp_moe_expert_rows_cuda rows = own_rows(cache);
  mp_moe_experts_forward_cuda(cublas, weights, &cache->shape, &rows, stream);
  mp_moe_combine_cuda(cublas, out, x, weights, cache, stream);
  return MP_OK;
}

mp_status mp_moe_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                               const mp_bf16 *dout, const mp_bf16 *x,
                               const mp_moe_weights_cuda *weights, const mp_moe_cache_cuda *cache,
                               const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                               mp_moe_workspace_cuda *workspace, mp_cuda_stream stream,
                               mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const size_t NK = (size_t)shape->tokens * shape->top_k;
  mp_moe_combine_backward_cuda(workspace->drouted, workspace->dweights, dout, cache, stream);
  mp_moe_cuda_zero(workspace->drouted_in, NK * shape->channels * sizeof(mp_bf16), stream);
  const mp_moe_expert_rows_cuda rows = own_rows(cache);
  mp_moe_experts_backward_cuda(cublas, workspace->drouted_in, grads, workspace->drouted, weights,
                               shape, &rows, workspace->dact, workspace->dfc1, stream);
  MP_TRY(mp_moe_route_backward_cuda(cublas, dx, grads->router, workspace->drouted_in,
                                    workspace->dweights, x, weights->router, cache, stats,
                                    aux_coeff, z_coeff, workspace, stream, err));
  mp_moe_shared_backward_cuda(cublas, dx, grads, dout, x, weights, cache, workspace, stream);
  return MP_OK;
}
