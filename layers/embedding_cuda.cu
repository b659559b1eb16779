/*
 * layers/embedding_cuda.cu — token and position embedding on the GPU; see embedding.h.
 *
 * Forward: one thread per 8 channels (128-bit loads) of one token when C is a multiple of 8 and
 * the tables are 16-byte aligned, else one thread per channel; the sum is taken in fp32 and
 * rounded once to bf16.
 *
 * Backward without float atomics, so every run gives the same bits, and in the CPU's order, so
 * the fp32 gradients equal mp_embedding_backward_cpu's on the same inputs:
 *   dwpe: one thread per (t, c) adds dout[b, t, c] for b = 0, 1, ... in turn.
 *   dwte: the host sorts the B*T positions by token with a stable counting sort (tokens_host),
 *         copies the buckets to the device workspace, and one block per distinct token adds its
 *         positions' rows in increasing position order, one thread per channel.
 * The host buckets live in a malloc'd buffer that a host callback on `stream` frees once the copy
 * has been consumed, so the call never waits for the GPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_common.cuh"
#include "layers/embedding.h"
#include "layers/cuda_launch.h"

// ---------------------------------------------------------------------------------------------
// kernels

// out (B*T, C) = wte[tokens] (Vp, C) + wpe[t] (maxT, C); one thread per VEC channels of a token.
template <int VEC>
__global__ void embedding_forward_kernel(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                                         const mp_bf16 *wpe, int BT, int T, int C) {
  const size_t packs_per_row = (size_t)(C / VEC);
  const size_t pack = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (pack >= (size_t)BT * packs_per_row) return;
  const size_t bt = pack / packs_per_row;
  const size_t c = (pack % packs_per_row) * VEC;
  const size_t t = bt % (size_t)T;
  const size_t token = (size_t)tokens[bt];
  float token_part[VEC], position_part[VEC];
  mp_load_bf16<VEC>(token_part, wte + token * C + c);
  mp_load_bf16<VEC>(position_part, wpe + t * C + c);
#pragma unroll
  for (int k = 0; k < VEC; k++) token_part[k] += position_part[k];
  mp_store_bf16<VEC>(out + bt * C + c, token_part);
}

// dwpe (T, C) += sum over b of dout (B, T, C); one thread per (t, c), b in increasing order.
__global__ void embedding_backward_wpe_kernel(float *dwpe, const mp_bf16 *dout, int B, int T,
                                              int C) {
  const size_t tc = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t TC = (size_t)T * C;
  if (tc >= TC) return;
  float sum = dwpe[tc];
  for (int b = 0; b < B; b++) sum += mp_bf16_to_float_device(dout[(size_t)b * TC + tc]);
  dwpe[tc] = sum;
}

// dwte[token] (C) += dout[p] (C) for each position p of the token, in increasing p.
//   bucket_tokens (buckets)      the distinct token ids, one per block (blockIdx.x)
//   bucket_starts (buckets + 1)  bucket k's positions are positions[starts[k] .. starts[k+1])
//   positions     (B*T)          flat positions b*T + t, sorted by token, stable
// blockIdx.y * blockDim.x + threadIdx.x is the channel.
__global__ void embedding_backward_wte_kernel(float *dwte, const mp_bf16 *dout,
                                              const int32_t *bucket_tokens,
                                              const int32_t *bucket_starts,
                                              const int32_t *positions, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int bucket = blockIdx.x;
  const int begin = bucket_starts[bucket];
  const int end = bucket_starts[bucket + 1];
  float *row = dwte + (size_t)bucket_tokens[bucket] * C;
  float sum = row[c];
  for (int i = begin; i < end; i++) {
    sum += mp_bf16_to_float_device(dout[(size_t)positions[i] * C + c]);
  }
  row[c] = sum;
}

// Sets every used row of dwte (B*T, C) to NaN: the failure signal when the host cannot allocate
// its bucket buffer (see mp_embedding_backward_cuda).
__global__ void embedding_backward_wte_poison_kernel(float *dwte, const int32_t *tokens, int BT,
                                                     int C) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)BT * C) return;
  dwte[(size_t)tokens[i / C] * C + i % C] = NAN;
}

// ---------------------------------------------------------------------------------------------
// launchers

static constexpr int kEmbeddingThreads = 256;

static void CUDART_CB free_host_buffer(void *buffer) { free(buffer); }

extern "C" void mp_embedding_forward_cuda(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                                          const mp_bf16 *wpe, int B, int T, int C,
                                          mp_cuda_stream stream) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;
  if (C % 8 == 0 && mp_aligned16(out) && mp_aligned16(wte) && mp_aligned16(wpe)) {
    const size_t blocks = mp_ceil_div((size_t)BT * (C / 8), kEmbeddingThreads);
    embedding_forward_kernel<8>
        <<<(unsigned)blocks, kEmbeddingThreads, 0, stream>>>(out, tokens, wte, wpe, BT, T, C);
    MP_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  } else {
    const size_t blocks = mp_ceil_div((size_t)BT * C, kEmbeddingThreads);
    embedding_forward_kernel<1>
        <<<(unsigned)blocks, kEmbeddingThreads, 0, stream>>>(out, tokens, wte, wpe, BT, T, C);
    MP_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  }
}

extern "C" size_t mp_embedding_backward_cuda_workspace_ints(int B, int T) {
  // positions (B*T) + bucket starts (at most B*T + 1) + bucket tokens (at most B*T)
  return 3 * (size_t)B * T + 1;
}

extern "C" void mp_embedding_backward_cuda(float *dwte, float *dwpe, const mp_bf16 *dout,
                                           const int32_t *tokens, const int32_t *tokens_host,
                                           int32_t *workspace, int B, int T, int C,
                                           mp_cuda_stream stream) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;

  const size_t wpe_blocks = mp_ceil_div((size_t)T * C, kEmbeddingThreads);
  embedding_backward_wpe_kernel<<<(unsigned)wpe_blocks, kEmbeddingThreads, 0, stream>>>(dwpe, dout,
                                                                                        B, T, C);
  MP_CUDA_CHECK_LAUNCH("embedding_backward_wpe_kernel");

  // Stable counting sort of the positions by token, on the host. Token ids are trusted to lie in
  // [0, Vp) (mp_embedding_check_tokens checks them where data enters).
  int32_t max_token = 0;
  for (int p = 0; p < BT; p++) {
    if (tokens_host[p] > max_token) max_token = tokens_host[p];
  }
  const size_t count_slots = (size_t)max_token + 2;  // counts[token + 1], then starts[token]
  const size_t staged_ints = (size_t)BT + 2 * (size_t)BT + 1;
  int32_t *host = (int32_t *)malloc((count_slots + staged_ints) * sizeof(int32_t));
  if (host == NULL) {
    // No host memory for a few hundred KB: make the failure impossible to miss rather than
    // returning a wrong gradient. The used rows turn NaN, so the step's gradient norm is not
    // finite and the trainer stops.
    const size_t blocks = mp_ceil_div((size_t)BT * C, kEmbeddingThreads);
    embedding_backward_wte_poison_kernel<<<(unsigned)blocks, kEmbeddingThreads, 0, stream>>>(
        dwte, tokens, BT, C);
    MP_CUDA_CHECK_LAUNCH("embedding_backward_wte_poison_kernel");
    return;
  }
  int32_t *starts = host;                // (max_token + 2)
  int32_t *staged = host + count_slots;  // positions (BT), bucket starts, bucket tokens
  memset(starts, 0, count_slots * sizeof(int32_t));
  for (int p = 0; p < BT; p++) starts[tokens_host[p] + 1]++;
  int buckets = 0;
  for (int32_t v = 0; v <= max_token; v++) {
    if (starts[v + 1] > 0) buckets++;
    starts[v + 1] += starts[v];  // now starts[v] is where token v's positions begin
  }
  int32_t *positions = staged;                           // (BT)
  int32_t *bucket_starts = staged + BT;                  // (buckets + 1)
  int32_t *bucket_tokens = bucket_starts + buckets + 1;  // (buckets)
  int bucket = 0;
  for (int32_t v = 0; v <= max_token; v++) {
    if (starts[v + 1] > starts[v]) {
      bucket_starts[bucket] = starts[v];
      bucket_tokens[bucket] = v;
      bucket++;
    }
  }
  bucket_starts[buckets] = BT;
  for (int p = 0; p < BT; p++) positions[starts[tokens_host[p]]++] = p;  // stable: p ascends

  const size_t used_ints = (size_t)BT + 2 * (size_t)buckets + 1;
  cudaMemcpyAsync(workspace, staged, used_ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream);
  const dim3 wte_grid((unsigned)buckets, (unsigned)mp_ceil_div((size_t)C, kEmbeddingThreads));
  embedding_backward_wte_kernel<<<wte_grid, kEmbeddingThreads, 0, stream>>>(
      dwte, dout, workspace + BT + buckets + 1, workspace + BT, workspace, C);
  MP_CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
  // Free the host buffer once the stream has passed the copy; if no callback can be queued, wait.
  if (cudaLaunchHostFunc(stream, free_host_buffer, host) != cudaSuccess) {
    cudaStreamSynchronize(stream);
    free(host);
  }
}
