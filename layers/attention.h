/*
 * layers/attention.h — causal self-attention with kv-head groups (multi-head, grouped-query and
 * multi-query), from packed q, k, v to the heads' output.
 *
 * The qkv projection (a matmul) comes before this and the output projection after it; this is
 * the part between: for every query head, softmax(q k^T / sqrt(HS)) over the keys at or before
 * each query's position, applied to v. Layout follows llm.c: one token's row of inp holds all
 * queries (NH heads of HS channels), then all keys, then all values (KVH heads each), width
 * W = (NH + 2 KVH) HS; query head h reads kv head h / (NH / KVH). KVH = NH is GPT-2's
 * multi-head attention.
 *
 * NH, KVH and HS are separate arguments and there are no globals, so tensor-parallel code calls
 * this on its own heads: with tp ranks it passes NH / tp and KVH / tp heads and a qkv shard laid
 * out the same way (local queries, local keys, local values). The CUDA twins (_cuda, at the end
 * of this header) keep the same shapes.
 *
 * The CPU code walks tokens and heads in a fixed order, so results do not vary between runs.
 * The CPU calls cannot fail: shapes are the caller's contract and no memory is allocated.
 */
#ifndef MPENGINE_LAYERS_ATTENTION_H
#define MPENGINE_LAYERS_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layers/cublas_context.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Causal attention forward, with C = NH * HS, over NH query heads and KVH key/value heads
 * (grouped-query attention: query head h reads kv head h / (NH / KVH); KVH = NH is multi-head
 * attention, KVH = 1 multi-query). The input row of a token is [q (NH*HS) | k (KVH*HS) | v
 * (KVH*HS)], width W = (NH + 2 KVH) HS: 3C for multi-head attention.
 *   out    (B, T, C)       written: token t, head h at channels [h*HS, (h+1)*HS)
 *   preatt (B, NH, T, T)   written: q.k / sqrt(HS) for keys t2 <= t, 0 above the diagonal;
 *                          or NULL when nobody inspects it (the backward does not need it)
 *   att    (B, NH, T, T)   written: softmax of each row of preatt over t2 <= t, 0 above
 *   inp    (B, T, W)       q, k, v of every token */
void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int KVH, int HS);

/* Backward of mp_attention_forward_cpu; adds (+=) into dinp (a kv head's gradient sums over its
 * query heads). datt and dpreatt are scratch that it overwrites (the caller need not zero them).
 *   dinp    (B, T, W)      += gradient of q, k and v
 *   dpreatt (B, NH, T, T)  scratch, overwritten
 *   datt    (B, NH, T, T)  scratch, overwritten
 *   dout    (B, T, C)
 *   inp     (B, T, W)      the forward's input
 *   att     (B, NH, T, T)  as the forward wrote it */
void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int KVH,
                               int HS);

/* Context parallelism (context_parallel/): this rank's queries against the whole sequence's keys
 * and values, gathered from the cp group. Query t of a sequence sits at global position
 * positions[t] (Tq entries) and attends to keys 0 .. positions[t]; the same math and order as
 * mp_attention_forward_cpu, which it equals when Tq = Tk and positions[t] = t.
 *   out    (B, Tq, C)        written
 *   preatt (B, NH, Tq, Tk)   written as in mp_attention_forward_cpu, or NULL
 *   att    (B, NH, Tq, Tk)   written
 *   qkv    (B, Tq, W)        this rank's tokens; only their queries are read
 *   kv     (B, Tk, 2 KVH HS) every token's key (KVH HS) then value, by global position */
void mp_attention_forward_at_cpu(float *out, float *preatt, float *att, const float *qkv,
                                 const float *kv, const int32_t *positions, int B, int Tq, int Tk,
                                 int NH, int KVH, int HS);

/* Backward of mp_attention_forward_at_cpu: dqkv's queries (B, Tq, W) += their gradient (its keys
 * and values are not touched), dkv (B, Tk, 2 KVH HS) += the keys' and values' gradient from this
 * rank's queries (the cp group sums them: context_parallel/kv_exchange.h). dpreatt and datt
 * (B, NH, Tq, Tk) are scratch. */
void mp_attention_backward_at_cpu(float *dqkv, float *dkv, float *dpreatt, float *datt,
                                  const float *dout, const float *qkv, const float *kv,
                                  const float *att, const int32_t *positions, int B, int Tq,
                                  int Tk, int NH, int KVH, int HS);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/attention_cuda.cu, Bazel target //layers:cuda_gemm), llm.c's attention on
 * cuBLAS: q, k and v are permuted to (B, NH, T, HS) in scratch (each kv head copied to the
 * NH / KVH query heads that read it, as Hugging Face's repeat_kv), the scores and the mix with v
 * are strided-batched bf16 GEMMs over the B * NH heads with fp32 accumulation, and a row-wise
 * causal softmax (fp32 math) sits between them. Same math and scale (1 / sqrtf(HS)) as the CPU
 * twin; the T x T matrices are bf16, like llm.c's, which keeps their memory traffic down: the
 * scores are rounded to bf16 before the softmax (a logit x is off by up to |x| * 2^-9).
 *
 * The qkv layout is the CPU twin's: a token's row is [q (NH*HS) | k (KVH*HS) | v (KVH*HS)], width
 * W = (NH + 2 KVH) HS (3C for multi-head attention); KVH must divide NH.
 *
 * Device pointers, asynchronous on `stream`; failures (a negative shape, a KVH that does not
 * divide NH) are recorded in the mp_cublas and reported by mp_cublas_check
 * (layers/cublas_context.h).
 * Results are bitwise reproducible for the same shapes, buffers, GPU model and cuBLAS version.
 */

/* Bytes of device scratch that both calls need (the backward's layout; the forward uses the
 * head of it), each piece aligned to 256 bytes, the same for every KVH (kv heads are expanded to
 * their query heads):
 *   q, k, v    (B, NH, T, HS) bf16 each
 *   y / dy     (B, NH, T, HS) bf16: the heads' output (forward), dout permuted (backward)
 *   dq, dk, dv (B, NH, T, HS) fp32 each (backward; dk, dv per query head, summed over each
 *              group when added into dqkv)
 *   datt       (B, NH, T, T)  bf16: datt, then dpreatt in place (backward)
 * About B*T*C * 20 + B*NH*T*T * 2 bytes. */
size_t mp_attention_cuda_scratch_bytes(int B, int T, int NH, int HS);

/* Causal attention forward, with C = NH * HS over NH query heads and KVH kv heads.
 *   out     (B, T, C)      bf16, written (=)
 *   att     (B, NH, T, T)  bf16, written (=): softmax probabilities over t2 <= t, exactly 0
 *                          above the diagonal; kept for the backward
 *   qkv     (B, T, W)      bf16: q, k, v of every token, as the CPU twin's inp
 *   scratch                mp_attention_cuda_scratch_bytes(B, T, NH, HS) bytes, overwritten */
void mp_attention_forward_cuda(mp_cublas *cublas, mp_bf16 *out, mp_bf16 *att, const mp_bf16 *qkv,
                               void *scratch, int B, int T, int NH, int KVH, int HS,
                               mp_cuda_stream stream);

/* Backward of mp_attention_forward_cuda; adds (+=) into dqkv like the CPU twin (the sum, over
 * the group's query heads for a kv head, is formed in fp32 in a fixed order and rounded to bf16
 * once).
 *   dqkv    (B, T, W)      bf16 += gradient of q, k and v
 *   dout    (B, T, C)      bf16
 *   qkv     (B, T, W)      bf16, the forward's input
 *   att     (B, NH, T, T)  bf16, as the forward wrote it
 *   scratch                mp_attention_cuda_scratch_bytes(B, T, NH, HS) bytes, overwritten
 *                          (need not hold anything from the forward) */
void mp_attention_backward_cuda(mp_cublas *cublas, mp_bf16 *dqkv, const mp_bf16 *dout,
                                const mp_bf16 *qkv, const mp_bf16 *att, void *scratch, int B,
                                int T, int NH, int KVH, int HS, mp_cuda_stream stream);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin: fused (flash) attention (layers/flash_attention_cuda.cu, Bazel target
 * //layers:cuda_gemm), FlashAttention-2 style: tensor-core tiles of 64 queries x 64 keys, an
 * online softmax in fp32, and no T x T matrix in device memory. The forward keeps, per query row,
 * the log-sum-exp of its scaled scores (lse) for the backward, which recomputes the probabilities
 * from q, k and lse. Same math as the CPU twin: scale 1 / sqrtf(HS), query t attends keys 0..t,
 * query head h reads kv head h / (NH / KVH). q, k and v are read from the (B, T, W) activations
 * (W = (NH + 2 KVH) HS, as the cuBLAS twin's) and out is written in (B, T, C), no permutes.
 *
 * Precision: bf16 inputs, fp32 scores, softmax and accumulators; the probabilities (and in the
 * backward dS = P o (dP - D)) are rounded to bf16 as tensor-core inputs, and every output element
 * is rounded to bf16 once (a kv head's dK and dV are summed over its group's query heads in fp32
 * registers first). No atomics: results are bitwise reproducible for the same shapes, GPU model
 * and build.
 *
 * Device pointers, asynchronous on `stream`, nothing allocated. qkv, out, dout and dqkv must be
 * 16-byte aligned (cudaMalloc'd buffers, or offsets into them that are multiples of 8 elements)
 * and lse 4-byte aligned. The launchers do nothing for an empty shape, a KVH that does not divide
 * NH, or a head size that mp_flash_attention_supported rejects (callers choose the cuBLAS twin
 * then); launch errors are not checked here: the caller's next mp_device_synchronize
 * (engine/device/device.h) reports them. Built without CUDA (cuda_gemm_none.c), nothing is supported and
 * the launchers do nothing. */

/* Which queries a fused call computes (context parallelism, context_parallel/): the window's
 * q_rows queries of each sequence sit at global positions [q_begin, q_begin + q_rows), rows of
 * qkv (B, T, W) like the keys and values, and attend to keys 0 .. their position: the keys and
 * values read are qkv's rows [0, q_begin + q_rows), so a cp rank's chunk attends to the gathered
 * prefix without a mask tensor. out, lse and dout hold out_rows rows per sequence (this rank's
 * tokens), the window's first query at row out_row0. The whole-sequence call is the window
 * {0, T, T, 0}; one outside qkv or out makes the launchers do nothing. */
typedef struct {
  int q_begin;  /* global position (row of qkv) of the window's first query */
  int q_rows;   /* queries per sequence */
  int out_rows; /* rows per sequence of out, lse and dout */
  int out_row0; /* their row of the window's first query */
} mp_attention_window;

static inline mp_attention_window mp_attention_whole_sequence(int T) {
  mp_attention_window w = {0, T, T, 0};
  return w;
}

/* True for the head sizes the fused kernels are compiled for: 32, 64 and 128. */
bool mp_flash_attention_supported(int HS);

/* Bytes of device scratch mp_flash_attention_backward_cuda needs: D (B, NH, T) fp32 (the row
 * sums of dout o out, per query head: the same for every KVH), rounded up to a multiple of 256
 * bytes; 0 for an empty shape. */
size_t mp_flash_attention_scratch_bytes(int B, int T, int NH, int HS);

/* Causal attention forward, with C = NH * HS over NH query heads and KVH kv heads.
 *   out  (B, T, C)   bf16, written (=): token t, head h at channels [h*HS, (h+1)*HS)
 *   lse  (B, NH, T)  fp32, written (=): log(sum_{t2 <= t} exp(q_t . k_t2 / sqrt(HS))), for the
 *                    backward
 *   qkv  (B, T, W)   bf16: query head h at channels [h*HS, (h+1)*HS), kv head g's key at
 *                    [(NH + g) HS, ...) and its value at [(NH + KVH + g) HS, ...) */
void mp_flash_attention_forward_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B, int T,
                                     int NH, int KVH, int HS, mp_cuda_stream stream);

/* Backward of mp_flash_attention_forward_cuda; adds (+=) into dqkv like the CPU twin (each
 * element's sum, over the group's query heads for a kv head, is formed in fp32 in a fixed order
 * and rounded to bf16 once).
 *   dqkv     (B, T, W)   bf16 += gradient of q, k and v (must not alias the inputs)
 *   dout     (B, T, C)   bf16
 *   qkv      (B, T, W)   bf16, the forward's input
 *   out      (B, T, C)   bf16, the forward's output
 *   lse      (B, NH, T)  fp32, as the forward wrote it
 *   scratch              mp_flash_attention_scratch_bytes(B, T, NH, HS) bytes, overwritten (need
 *                        not hold anything from the forward) */
void mp_flash_attention_backward_cuda(mp_bf16 *dqkv, const mp_bf16 *dout, const mp_bf16 *qkv,
                                      const mp_bf16 *out, const float *lse, void *scratch, int B,
                                      int T, int NH, int KVH, int HS, mp_cuda_stream stream);

/* The two calls above for one window (mp_attention_window): out, lse and dout as
 * (B, w.out_rows, C) and (B, NH, w.out_rows), only the window's rows written or read; dqkv
 * (B, T, W) += the window's queries' gradient and the gradient of keys and values
 * 0 .. q_begin + q_rows - 1 from them (a cp rank adds its share; the group sums them). The
 * backward's scratch is mp_flash_attention_scratch_bytes(B, w.out_rows, NH, HS). The calls for
 * the windows of one buffer may follow each other on a stream: each adds into dqkv. */
void mp_flash_attention_forward_window_cuda(mp_bf16 *out, float *lse, const mp_bf16 *qkv, int B,
                                            int T, int NH, int KVH, int HS,
                                            mp_attention_window window, mp_cuda_stream stream);
void mp_flash_attention_backward_window_cuda(mp_bf16 *dqkv, const mp_bf16 *dout,
                                             const mp_bf16 *qkv, const mp_bf16 *out,
                                             const float *lse, void *scratch, int B, int T,
                                             int NH, int KVH, int HS,
                                             mp_attention_window window, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_ATTENTION_H */
