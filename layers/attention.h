/*
 * layers/attention.h — causal multi-head self-attention, from packed q, k, v to the heads' output.
 *
 * The qkv projection (a matmul) comes before this and the output projection after it; this is
 * the part between: for every head, softmax(q k^T / sqrt(HS)) over the keys at or before each
 * query's position, applied to v. Layout follows llm.c: one token's row of inp holds all queries,
 * then all keys, then all values, each NH heads of HS channels.
 *
 * NH and HS are separate arguments and there are no globals, so tensor-parallel code calls this on
 * its own heads: with tp ranks it passes NH / tp heads and a qkv shard laid out the same way
 * (local queries, local keys, local values). A later CUDA twin (_cuda) keeps the same shapes.
 *
 * The CPU code walks tokens and heads in a fixed order, so results do not vary between runs.
 * These calls cannot fail: shapes are the caller's contract and no memory is allocated.
 */
#ifndef MPENGINE_LAYERS_ATTENTION_H
#define MPENGINE_LAYERS_ATTENTION_H

#ifdef __cplusplus
extern "C" {
#endif

/* Causal attention forward, with C = NH * HS.
 *   out    (B, T, C)       written: token t, head h at channels [h*HS, (h+1)*HS)
 *   preatt (B, NH, T, T)   written: q.k / sqrt(HS) for keys t2 <= t, 0 above the diagonal;
 *                          or NULL when nobody inspects it (the backward does not need it)
 *   att    (B, NH, T, T)   written: softmax of each row of preatt over t2 <= t, 0 above
 *   inp    (B, T, 3C)      q, k, v of every token */
void mp_attention_forward_cpu(float *out, float *preatt, float *att, const float *inp, int B, int T,
                              int NH, int HS);

/* Backward of mp_attention_forward_cpu; adds (+=) into dinp. datt and dpreatt are scratch that it
 * overwrites (the caller need not zero them).
 *   dinp    (B, T, 3C)     += gradient of q, k and v
 *   dpreatt (B, NH, T, T)  scratch, overwritten
 *   datt    (B, NH, T, T)  scratch, overwritten
 *   dout    (B, T, C)
 *   inp     (B, T, 3C)     the forward's input
 *   att     (B, NH, T, T)  as the forward wrote it */
void mp_attention_backward_cpu(float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int NH, int HS);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_ATTENTION_H */
