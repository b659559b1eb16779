/*
 * layers/embedding.h — GPT-2's input embedding: a token's row of wte plus its position's row of
 * wpe.
 *
 * Token ids come from data files, so they are checked once (mp_embedding_check_tokens) where they
 * enter, and the forward and backward trust them. The backward adds into the rows that were used,
 * in token order, so a token seen twice accumulates twice and the result does not vary between
 * runs. The CUDA twin (_cuda, at the end of this header: bf16, device pointers, a stream) keeps
 * the same shapes and the same order.
 */
#ifndef MPENGINE_LAYERS_EMBEDDING_H
#define MPENGINE_LAYERS_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
 *   out    (B, T, C)  written
 *   tokens (B, T)     each in [0, V)
 *   wte    (V, C)     token embedding (tied to the LM head in GPT-2)
 *   wpe    (maxT, C)  position embedding, T <= maxT */
void mp_embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                              int B, int T, int C);

/* Backward of mp_embedding_forward_cpu; adds (+=) into the rows of dwte and dwpe that were used.
 *   dwte   (V, C)     +=
 *   dwpe   (maxT, C)  += (rows 0..T-1)
 *   dout   (B, T, C)
 *   tokens (B, T) */
void mp_embedding_backward_cpu(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                               int B, int T, int C);

/* Checks that each of the n token ids lies in [0, V). Returns MP_OK, or MP_ERR_INPUT with a
 * message naming the first bad position and value, in err (which may be NULL). The same check
 * serves the targets of cross-entropy. */
mp_status mp_embedding_check_tokens(const int32_t *tokens, size_t n, int V, mp_error *err);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/embedding_cuda.cu, Bazel target //layers:cuda_elementwise).
 *
 * Built where nvcc exists (sm_80, sm_90). Pointers are device pointers unless named _host;
 * activations and weights are bf16 (mp_bf16), statistics and weight gradients fp32. Each call
 * enqueues its kernels on `stream` and returns without waiting; launch errors are not checked
 * here: the caller's next mp_device_synchronize (engine/device/device.h) reports them.
 * Outputs and gradient rows are the CPU twin's, on a padded vocabulary Vp. */

/* out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], summed in fp32, rounded to bf16.
 *   out    (B, T, C)  written
 *   tokens (B, T)     device, each in [0, Vp)
 *   wte    (Vp, C)
 *   wpe    (maxT, C)  T <= maxT */
void mp_embedding_forward_cuda(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                               const mp_bf16 *wpe, int B, int T, int C, mp_cuda_stream stream);

/* Backward of mp_embedding_forward_cuda, deterministic (no float atomics) and in the CPU twin's
 * order, so on the same inputs dwte and dwpe equal mp_embedding_backward_cpu's bit for bit.
 *   dwte        (Vp, C)    += (fp32)
 *   dwpe        (maxT, C)  += (fp32, rows 0..T-1)
 *   dout        (B, T, C)
 *   tokens      (B, T)     device
 *   tokens_host (B, T)     the same ids on the host; read before the call returns
 *   workspace   mp_embedding_backward_cuda_workspace_ints(B, T) device ints, free for this call
 *               until the stream has run it
 * The host sorts the positions by token and copies them to workspace; a small host buffer
 * (B*T and max token id ints) is malloc'd per call and freed by a host callback queued on
 * `stream`, so the call does not wait for the GPU. Should that malloc fail, the used rows of dwte
 * are set to NaN (the step's gradient norm then fails its finiteness check) instead of being
 * silently wrong. */
void mp_embedding_backward_cuda(float *dwte, float *dwpe, const mp_bf16 *dout,
                                const int32_t *tokens, const int32_t *tokens_host,
                                int32_t *workspace, int B, int T, int C, mp_cuda_stream stream);

/* Ints of device workspace that mp_embedding_backward_cuda needs: 3 * B * T + 1. */
size_t mp_embedding_backward_cuda_workspace_ints(int B, int T);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_EMBEDDING_H */
