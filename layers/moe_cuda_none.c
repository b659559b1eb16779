/*
 * layers/moe_cuda_none.c — the kernels of //layers:cuda_moe on a machine without CUDA: the route
 * and the statistics say so (MP_ERR_RUNTIME), the other launchers do nothing. moe_cuda.c (sizes,
 * carving, compositions) is built as everywhere, so callers that only plan memory still link.
 */
#include <stddef.h>

#include "common/error.h"
#include "layers/moe_cuda.h"
#include "layers/moe_cuda_internal.h"

static mp_status without_cuda(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME,
                 "the mixture of experts on GPUs is not available: mpengine was built without "
                 "CUDA (no nvcc at /usr/local/cuda or $CUDA_PATH when Bazel configured); use "
                 "--backend cpu");
}

void mp_moe_cuda_route(mp_cublas *cublas, const mp_bf16 *x, const mp_bf16 *router,
                       mp_moe_cache_cuda *cache, mp_cuda_stream stream) {
  (void)cublas, (void)x, (void)router, (void)cache, (void)stream;
}

mp_status mp_moe_cuda_copy_offsets(int *host, const int *device, int n, mp_cuda_stream stream,
                                   mp_error *err) {
  (void)host, (void)device, (void)n, (void)stream;
  return without_cuda(err);
}

void mp_moe_cuda_grouped_gemm(mp_cublas *cublas, int count, bool trans_a, const int *m,
                              const int *n, const int *k, const mp_bf16 *const *a, const int *lda,
                              const mp_bf16 *const *b, const int *ldb, float beta,
                              mp_bf16 *const *c, const int *ldc, void **pointer_scratch,
                              mp_cuda_stream stream) {
  (void)cublas, (void)count, (void)trans_a, (void)m, (void)n, (void)k, (void)a, (void)lda,
      (void)b, (void)ldb, (void)beta, (void)c, (void)ldc, (void)pointer_scratch, (void)stream;
}

void mp_moe_cuda_zero(void *p, size_t bytes, mp_cuda_stream stream) {
  (void)p, (void)bytes, (void)stream;
}

void mp_moe_cuda_gate(float *gate, const mp_bf16 *x, const mp_bf16 *gate_weight, int N, int C,
                      mp_cuda_stream stream) {
  (void)gate, (void)x, (void)gate_weight, (void)N, (void)C, (void)stream;
}

void mp_moe_cuda_weighted_sum(mp_bf16 *out, const mp_bf16 *routed_out, const float *weights,
                              const int *routed_slot, const int *slot_row,
                              const mp_bf16 *shared_out, const float *gate, int N, int K, int C,
                              mp_cuda_stream stream) {
  (void)out, (void)routed_out, (void)weights, (void)routed_slot, (void)slot_row,
      (void)shared_out, (void)gate, (void)N, (void)K, (void)C, (void)stream;
}

void mp_moe_cuda_shared_gate_backward(mp_bf16 *dshared, mp_bf16 *dx, float *dgate_weight,
                                      float *dlogit, const mp_bf16 *dout, const mp_bf16 *x,
                                      const mp_bf16 *gate_weight, const mp_bf16 *shared_out,
                                      const float *gate, int N, int C, mp_cuda_stream stream) {
  (void)dshared, (void)dx, (void)dgate_weight, (void)dlogit, (void)dout, (void)x,
      (void)gate_weight, (void)shared_out, (void)gate, (void)N, (void)C, (void)stream;
}

void mp_moe_combine_backward_cuda(mp_bf16 *drouted, float *dweights, const mp_bf16 *dout,
                                  const mp_moe_cache_cuda *cache, mp_cuda_stream stream) {
  (void)drouted, (void)dweights, (void)dout, (void)cache, (void)stream;
}

mp_status mp_moe_route_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, float *drouter,
                                     const mp_bf16 *drouted_in, const float *dweights,
                                     const mp_bf16 *x, const mp_bf16 *router,
                                     const mp_moe_cache_cuda *cache, const mp_moe_stats *stats,
                                     double aux_coeff, double z_coeff,
                                     mp_moe_workspace_cuda *workspace, mp_cuda_stream stream,
                                     mp_error *err) {
  (void)cublas, (void)dx, (void)drouter, (void)drouted_in, (void)dweights, (void)x, (void)router,
      (void)cache, (void)stats, (void)aux_coeff, (void)z_coeff, (void)workspace, (void)stream;
  return without_cuda(err);
}

mp_status mp_moe_stats_add_cuda(mp_moe_stats *stats, const mp_moe_cache_cuda *cache,
                                double *scratch, mp_cuda_stream stream, mp_error *err) {
  (void)stats, (void)cache, (void)scratch, (void)stream;
  return without_cuda(err);
}
