/*
 * layers/matmul.h — the linear layer of a transformer: out = inp @ weight^T + bias.
 *
 * Every projection in GPT (qkv, attention output, MLP up and down, the tied LM head) is this one
 * product. Layout follows llm.c: a weight is stored (OC, C), one row per output channel, so the
 * forward is a GEMM with the weight transposed. The CPU implementation runs on OpenBLAS sgemm,
 * which splits work over output tiles, never over the reduction, so its result does not depend on
 * how often it is called; bias sums run in a fixed order.
 *
 * Shapes are explicit arguments and nothing is global, so tensor-parallel code calls the same
 * functions on a column or row shard (OC or C divided by the tensor-parallel size). The CUDA twin
 * (_cuda, at the end of this header: device pointers, bf16 and a stream) keeps the same shapes.
 *
 * The CPU calls cannot fail: shapes are the caller's contract and no memory is allocated.
 */
#ifndef MPENGINE_LAYERS_MATMUL_H
#define MPENGINE_LAYERS_MATMUL_H

#include <stddef.h>

#include "common/error.h"
#include "layers/cublas_context.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = inp @ weight^T + bias, over BT = B*T rows.
 *   out    (BT, OC)  written
 *   inp    (BT, C)
 *   weight (OC, C)
 *   bias   (OC)      or NULL for no bias */
void mp_matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                           int BT, int C, int OC);

/* Backward of mp_matmul_forward_cpu. Adds (+=) into every gradient it is given, so gradients of
 * several micro-batches accumulate; callers zero them when a step begins. A NULL gradient is
 * skipped, which also gives the split backward of zero-bubble schedules: dinp alone is the
 * backward-input pass, dweight and dbias alone the backward-weight pass.
 *   dinp    (BT, C)   += dout @ weight,          or NULL
 *   dweight (OC, C)   += dout^T @ inp,           or NULL
 *   dbias   (OC)      += sum over rows of dout,  or NULL
 *   dout    (BT, OC)
 *   inp     (BT, C)   the forward's input (needed for dweight only)
 *   weight  (OC, C)   (needed for dinp only) */
void mp_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int BT, int C, int OC);

/* ---------------------------------------------------------------------------------------------
 * CUDA twin (layers/matmul_cuda.cu, Bazel target //layers:cuda_gemm).
 *
 * Mixed precision: activations and weights are bf16, every GEMM accumulates in fp32 on the bf16
 * tensor cores (cuBLASLt, CUBLAS_COMPUTE_32F), and weight and bias gradients are fp32 so that
 * micro-batches accumulate without bf16 round-off. All pointers are device pointers; every
 * launcher is asynchronous on `stream` (NULL is the default stream) and returns at once.
 *
 * Launchers return nothing. A failure (a cuBLAS or CUDA call, or a negative shape) is recorded in
 * the mp_cublas (layers/cublas_context.h, shared with the attention), the first one wins, and
 * mp_cublas_check reports it with the call, the file and the line; call it where the caller
 * synchronises anyway (end of a step). Faults of kernels that already ran show up at the next
 * synchronisation (mp_device_synchronize).
 *
 * Results are bitwise reproducible for the same shapes, buffers (their alignment steers cuBLAS's
 * choice of kernel), GPU model and cuBLAS version: no atomics, fixed-order reductions.
 */

/* out = inp @ weight^T + bias, rounded once to bf16 (the bias is added in fp32 by cuBLASLt's
 * epilogue before the rounding).
 *   out    (BT, OC)  bf16, written (=)
 *   inp    (BT, C)   bf16
 *   weight (OC, C)   bf16
 *   bias   (OC)      bf16, or NULL for no bias */
void mp_matmul_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *inp,
                            const mp_bf16 *weight, const mp_bf16 *bias, int BT, int C, int OC,
                            mp_cuda_stream stream);

/* Floats of device scratch that mp_matmul_backward_cuda needs for a dbias: one partial sum per
 * block of 128 rows and output channel, ceil(BT / 128) * OC. */
size_t mp_matmul_backward_cuda_scratch_floats(int BT, int OC);

/* Backward of mp_matmul_forward_cuda; like the CPU twin it adds (+=) into every gradient it is
 * given and skips a NULL one (zero-bubble's split: dinp alone, or dweight and dbias alone).
 *   dinp    (BT, C)   bf16 += dout @ weight (fp32 sum, one bf16 rounding),  or NULL
 *   dweight (OC, C)   fp32 += dout^T @ inp,                                  or NULL
 *   dbias   (OC)      fp32 += column sums of dout (fixed order, no atomics), or NULL
 *   dout    (BT, OC)  bf16
 *   inp     (BT, C)   bf16, the forward's input (needed for dweight only)
 *   weight  (OC, C)   bf16 (needed for dinp only)
 *   scratch           device, mp_matmul_backward_cuda_scratch_floats(BT, OC) floats (needed
 *                     for dbias only; overwritten) */
void mp_matmul_backward_cuda(mp_cublas *cublas, mp_bf16 *dinp, float *dweight, float *dbias,
                             const mp_bf16 *dout, const mp_bf16 *inp, const mp_bf16 *weight,
                             float *scratch, int BT, int C, int OC, mp_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_MATMUL_H */
