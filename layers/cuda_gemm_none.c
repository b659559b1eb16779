/*
 * layers/cuda_gemm_none.c — //layers:cuda_gemm on a machine without CUDA (the CUDA twins of
 * cublas_context.h, matmul.h and attention.h): mp_cublas_create says so, the launchers (which need
 * an mp_cublas) do nothing, no head size has fused attention, and the scratch sizes are the real
 * ones, so callers that only plan memory still link and run.
 */
#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/attention.h"
#include "layers/attention_internal.h"
#include "layers/cublas_context.h"
#include "layers/matmul.h"
#include "layers/matmul_internal.h"

mp_status mp_cublas_create(mp_cublas **out, mp_error *err) {
  *out = NULL;
  return mp_fail(err, MP_ERR_RUNTIME,
                 "cuBLAS is not available: mpengine was built without CUDA (no nvcc at "
                 "/usr/local/cuda or $CUDA_PATH when Bazel configured); use --backend cpu");
}

void mp_cublas_free(mp_cublas *cublas) { (void)cublas; }

mp_status mp_cublas_check(mp_cublas *cublas, mp_error *err) {
  (void)cublas;
  return mp_fail(err, MP_ERR_RUNTIME, "cuBLAS is not available: mpengine was built without CUDA");
}

void mp_matmul_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *inp,
                            const mp_bf16 *weight, const mp_bf16 *bias, int BT, int C, int OC,
                            mp_cuda_stream stream) {
  (void)cublas, (void)out, (void)inp, (void)weight, (void)bias, (void)BT, (void)C, (void)OC,
      (void)stream;
}

size_t mp_matmul_backward_cuda_scratch_floats(int BT, int OC) {
  return OC > 0 ? mp_matmul_dbias_row_blocks(BT) * (size_t)OC : 0;
}

void mp_matmul_backward_cuda(mp_cublas *cublas, mp_bf16 *dinp, float *dweight, float *dbias,
                             const mp_bf16 *dout, const mp_bf16 *inp, const mp_bf16 *weight,
                             float *scratch, int BT, int C, int OC, mp_cuda_stream stream) {
  (void)cublas, (void)dinp, (void)dweight, (void)dbias, (void)dout, (void)inp, (void)weight,
      (void)scratch, (void)BT, (void)C, (void)OC, (void)stream;
}

size_t mp_attention_cuda_scratch_bytes(int B, int T, int NH, int HS) {
  return mp_attention_cuda_layout_of(B, T, NH, HS).total;
}

void mp_attention_forward_cuda(mp_cublas *cublas, mp_bf16 *out, mp_bf16 *att, const mp_bf16 *qkv,
                               void *scratch, int B, int T, int NH, int KVH, int HS,
                               mp_cuda_stream stream) {
  (void)cublas, (void)out, (void)att, (void)qkv, (void)scratch, (void)B, (void)T, (void)NH,
      (void)KVH, (void)HS, (void)stream;
}

void mp_attention_backward_cuda(mp_cublas *cublas, mp_bf16 *dqkv, const mp_bf16 *dout,
                                const mp_bf16 *qkv, const mp_bf16 *att, void *scratch, int B,
                                int T, int NH, int KVH, int HS, mp_cuda_stream stream) {
  (void)cublas, (void)dqkv, (void)dout, (void)qkv, (void)att, (void)scratch, (void)B, (void)T,
      (void)NH, (void)KVH, (void)HS, (void)stream;
}

bool mp_flash_attention_supported(int HS) {
  (void)HS;
  return false;
}

size_t mp_flash_attention_scratch_bytes(int B, int T, int NH, int HS) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return 0;
  const size_t bytes = (size_t)B * NH * T * sizeof(float); /* D (B, NH, T) */
  return (bytes + 255) / 256 * 256;
}

void mp_flash_attention_forward_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B, int T,
                                     int NH, int KVH, int HS, mp_cuda_stream stream) {
  (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)NH, (void)KVH, (void)HS, (void)stream;
}

void mp_flash_attention_backward_cuda(mp_bf16 *dqkv, const mp_bf16 *dout, const mp_bf16 *qkv,
                                      const mp_bf16 *out, const float *lse, void *scratch, int B,
                                      int T, int NH, int KVH, int HS, mp_cuda_stream stream) {
  (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)scratch, (void)B, (void)T,
      (void)NH, (void)KVH, (void)HS, (void)stream;
}

void mp_flash_attention_forward_window_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B,
                                            int T, int NH, int KVH, int HS,
                                            mp_attention_window window, mp_cuda_stream stream) {
  (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)NH, (void)KVH, (void)HS, (void)window,
      (void)stream;
}

void mp_flash_attention_backward_window_cuda(mp_bf16 *dqkv, const mp_bf16 *dout,
                                             const mp_bf16 *qkv, const mp_bf16 *out,
                                             const float *lse, void *scratch, int B, int T,
                                             int NH, int KVH, int HS,
                                             mp_attention_window window, mp_cuda_stream stream) {
  (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)scratch, (void)B, (void)T,
      (void)NH, (void)KVH, (void)HS, (void)window, (void)stream;
}
