/*
 * layers/cuda_elementwise_none.c — //layers:cuda_elementwise in a build without CUDA.
 *
 * Without nvcc there is no device memory (engine/device/device_none.c fails every allocation and counts
 * no device), so no caller can hold the device pointers these calls take: the launchers are
 * unreachable and do nothing, the size queries answer as the CUDA build does, and the one call
 * with a status says the build has no CUDA. It exists so that code and tests naming the CUDA
 * twins still link, and the tests report themselves skipped.
 */
#include "layers/adamw.h"
#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/gelu.h"
#include "layers/layernorm.h"
#include "layers/residual.h"
#include "layers/rmsnorm.h"
#include "layers/rope.h"
#include "layers/swiglu.h"

void mp_embedding_forward_cuda(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                               const mp_bf16 *wpe, int B, int T, int C, mp_cuda_stream stream) {}

void mp_embedding_backward_cuda(float *dwte, float *dwpe, const mp_bf16 *dout,
                                const int32_t *tokens, const int32_t *tokens_host,
                                int32_t *workspace, int B, int T, int C, mp_cuda_stream stream) {}

size_t mp_embedding_backward_cuda_workspace_ints(int B, int T) { return 3 * (size_t)B * T + 1; }

void mp_layernorm_forward_cuda(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *inp,
                               const mp_bf16 *weight, const mp_bf16 *bias, int B, int T, int C,
                               mp_cuda_stream stream) {}

void mp_layernorm_backward_cuda(mp_bf16 *dinp, float *dweight, float *dbias, const mp_bf16 *dout,
                                const mp_bf16 *inp, const mp_bf16 *weight, const float *mean,
                                const float *rstd, float *scratch, int B, int T, int C,
                                mp_cuda_stream stream) {}

size_t mp_layernorm_backward_cuda_scratch_floats(int B, int T, int C) {
  return 2 * (((size_t)B * T + 15) / 16) * (size_t)C;
}

void mp_gelu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, size_t n, mp_cuda_stream stream) {}

void mp_gelu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, size_t n,
                           mp_cuda_stream stream) {}

void mp_residual_forward_cuda(mp_bf16 *out, const mp_bf16 *inp1, const mp_bf16 *inp2, size_t n,
                              mp_cuda_stream stream) {}

void mp_residual_backward_cuda(mp_bf16 *dinp1, mp_bf16 *dinp2, const mp_bf16 *dout, size_t n,
                               mp_cuda_stream stream) {}

void mp_cross_entropy_fused_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                                 float dloss, int B, int T, int V, int Vp, mp_cuda_stream stream) {}

void mp_adamw_update_cuda(float *params, mp_bf16 *params_bf16, const float *grads, float *m,
                          float *v, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t, mp_cuda_stream stream) {}

mp_status mp_grad_norm_squared_cuda(const float *grads, size_t n, float *scratch,
                                    double *out_host, mp_cuda_stream stream, mp_error *err) {
  *out_host = 0.0;
  return mp_fail(err, MP_ERR_RUNTIME,
                 "mp_grad_norm_squared_cuda: this build has no CUDA (nvcc was not found when it "
                 "was built); install the CUDA toolkit and rebuild, or use the CPU backend");
}

size_t mp_grad_norm_cuda_scratch_floats(size_t n) {
  size_t blocks = (n + 256 * 16 - 1) / (256 * 16);
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  return 2 * (blocks + 1);
}

void mp_grad_scale_cuda(float *grads, size_t n, float scale, mp_cuda_stream stream) {}

void mp_bf16_from_float_cuda(mp_bf16 *out, const float *in, size_t n, mp_cuda_stream stream) {}

void mp_rmsnorm_forward_cuda(mp_bf16 *out, float *rstd, const mp_bf16 *inp, const mp_bf16 *weight,
                             int rows, int C, float eps, mp_cuda_stream stream) {}

void mp_rmsnorm_backward_cuda(mp_bf16 *dinp, float *dweight, const mp_bf16 *dout,
                              const mp_bf16 *inp, const mp_bf16 *weight, const float *rstd,
                              float *scratch, int rows, int C, mp_cuda_stream stream) {}

size_t mp_rmsnorm_backward_cuda_scratch_floats(int rows, int C) {
  const size_t floats = rows > 0 && C > 0 ? (((size_t)rows + 15) / 16) * (size_t)C : 0;
  return floats > 0 ? floats : 1;
}

void mp_swiglu_forward_cuda(mp_bf16 *out, const mp_bf16 *inp, int N, int F,
                            mp_cuda_stream stream) {}

void mp_swiglu_backward_cuda(mp_bf16 *dinp, const mp_bf16 *inp, const mp_bf16 *dout, int N, int F,
                             mp_cuda_stream stream) {}

void mp_rope_forward_cuda(mp_bf16 *x, const float *inv_freq, int B, int T, int heads, int HS,
                          size_t row_stride, mp_cuda_stream stream) {}

void mp_rope_backward_cuda(mp_bf16 *dx, const float *inv_freq, int B, int T, int heads, int HS,
                           size_t row_stride, mp_cuda_stream stream) {}

void mp_rope_forward_at_cuda(mp_bf16 *x, const float *inv_freq, const int32_t *positions, int B,
                             int T, int heads, int HS, size_t row_stride, mp_cuda_stream stream) {}

void mp_rope_backward_at_cuda(mp_bf16 *dx, const float *inv_freq, const int32_t *positions,
                              int B, int T, int heads, int HS, size_t row_stride,
                              mp_cuda_stream stream) {}
