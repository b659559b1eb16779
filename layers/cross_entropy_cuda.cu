/*
 * layers/cross_entropy_cuda.cu — softmax, cross-entropy and its gradient fused in one kernel on
 * the GPU (llm.c's fused classifier); see cross_entropy.h.
 *
 * One block per token row. Pass 1 reads the row's V real logits once and keeps, per thread, a
 * running maximum and the sum of exp(logit - maximum) rescaled whenever the maximum grows (online
 * softmax); a block reduction in a fixed order combines them, all in fp32. Thread 0 writes the
 * loss log(sum) - (logit[target] - max). Pass 2 overwrites the row with the gradient of the mean
 * loss, (softmax - onehot) * dloss / (B*T) in [0, V) and 0 in the padding [V, Vp), so the
 * probabilities are never stored. Rows of Vp % 8 == 0 move 8 logits per 128-bit access.
 */
#include <math.h>

#include "layers/cross_entropy.h"
#include "layers/cuda_common.cuh"
#include "layers/cuda_launch.h"

static constexpr int kCrossEntropyThreads = 1024;

// ---------------------------------------------------------------------------------------------
// kernels

// losses (rows) written; logits (rows, Vp) in: logits, out: dlogits; targets (rows).
// Block = row.
template <int VEC>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_fused_kernel(float *losses, mp_bf16 *logits, const int32_t *targets,
                               float dloss_per_token, int V, int Vp) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  mp_bf16 *row_logits = logits + row * (size_t)Vp;
  const int target = targets[row];
  // Read before the barriers in the reductions below; pass 2 overwrites it after them.
  const float target_logit = mp_bf16_to_float_device(row_logits[target]);

  float thread_max = -INFINITY, thread_sum = 0.0f;
  for (int i = threadIdx.x * VEC; i < V; i += blockDim.x * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, row_logits + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      if (i + k < V) {
        if (x[k] > thread_max) {
          thread_sum *= expf(thread_max - x[k]);
          thread_max = x[k];
        }
        thread_sum += expf(x[k] - thread_max);
      }
    }
  }
  const float row_max = mp_block_max(thread_max, shared);
  // A thread that saw no logits has max -inf and sum 0: exp(-inf) * 0 = 0.
  const float row_sum = mp_block_sum(thread_sum * expf(thread_max - row_max), shared);
  if (threadIdx.x == 0) losses[row] = logf(row_sum) - (target_logit - row_max);

  const float sum_inv = 1.0f / row_sum;
  for (int i = threadIdx.x * VEC; i < Vp; i += blockDim.x * VEC) {
    float x[VEC];
    mp_load_bf16<VEC>(x, row_logits + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const int column = i + k;
      if (column < V) {
        const float prob = expf(x[k] - row_max) * sum_inv;
        const float indicator = column == target ? 1.0f : 0.0f;
        x[k] = (prob - indicator) * dloss_per_token;
      } else {
        x[k] = 0.0f;
      }
    }
    mp_store_bf16<VEC>(row_logits + i, x);
  }
}

// ---------------------------------------------------------------------------------------------
// launchers

extern "C" void mp_cross_entropy_fused_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                                            float dloss, int B, int T, int V, int Vp,
                                            mp_cuda_stream stream) {
  const int rows = B * T;
  if (rows == 0) return;
  const float dloss_per_token = dloss / (float)rows;  // as mp_cross_entropy_backward_cpu
  if (Vp % 8 == 0 && mp_aligned16(logits)) {
    cross_entropy_fused_kernel<8><<<(unsigned)rows, kCrossEntropyThreads, 0, stream>>>(
        losses, logits, targets, dloss_per_token, V, Vp);
    MP_CUDA_CHECK_LAUNCH("cross_entropy_fused_kernel");
  } else {
    cross_entropy_fused_kernel<1><<<(unsigned)rows, kCrossEntropyThreads, 0, stream>>>(
        losses, logits, targets, dloss_per_token, V, Vp);
    MP_CUDA_CHECK_LAUNCH("cross_entropy_fused_kernel");
  }
}
