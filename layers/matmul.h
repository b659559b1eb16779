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
 * functions on a column or row shard (OC or C divided by the tensor-parallel size). A later CUDA
 * twin (_cuda, device pointers and a stream) keeps the same shapes.
 *
 * These calls cannot fail: shapes are the caller's contract and no memory is allocated.
 */
#ifndef MPENGINE_LAYERS_MATMUL_H
#define MPENGINE_LAYERS_MATMUL_H

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

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_MATMUL_H */
