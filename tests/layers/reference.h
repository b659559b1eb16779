// tests/layers/reference.h — naive double-precision forwards of every layer in layers/, the
// references the float32 kernels' outputs are compared with.
//
// Written for obviousness, not speed: straight loops over the formula in each layer's header,
// with nothing shared with the code under test. Shapes are the same as the kernels'.
#ifndef MPENGINE_TESTS_LAYERS_REFERENCE_H
#define MPENGINE_TESTS_LAYERS_REFERENCE_H

#include <cstdint>
#include <vector>

namespace mp_test {

using dvec = std::vector<double>;

// (BT, OC) = inp (BT, C) @ weight^T (OC, C) + bias (OC); bias may be empty.
dvec ref_matmul(const dvec &inp, const dvec &weight, const dvec &bias, int BT, int C, int OC);

// Layernorm over C of inp (N, C) with weight, bias (C) and eps; mean and rstd (N) if not null.
dvec ref_layernorm(const dvec &inp, const dvec &weight, const dvec &bias, int N, int C, double eps,
                   dvec *mean = nullptr, dvec *rstd = nullptr);

// Tanh GELU, elementwise.
dvec ref_gelu(const dvec &inp);

// Causal attention: inp (B, T, (NH + 2 KVH) HS), q then k then v heads -> out (B, T, NH*HS); att
// (B, NH, T, T) if not null. Query head h reads kv head h / (NH / KVH); KVH 0 means NH.
dvec ref_attention(const dvec &inp, int B, int T, int NH, int HS, dvec *att = nullptr,
                   int KVH = 0);

// RMSNorm over C of inp (N, C): inp / sqrt(mean(inp^2) + eps) * weight.
dvec ref_rmsnorm(const dvec &inp, const dvec &weight, int N, int C, double eps);

// SwiGLU of inp (N, 2F), [gate | up] per row -> (N, F): silu(gate) * up.
dvec ref_swiglu(const dvec &inp, int N, int F);

// Rotate-half rotary embedding of `heads` heads of HS channels per token row of x (B, T, stride),
// token t at angle t * inv_freq[i] for the pair (i, i + HS/2); the rest of each row unchanged.
dvec ref_rope(const dvec &x, const dvec &inv_freq, int B, int T, int heads, int HS, int stride);

// wte[tokens] + wpe[t]: (B, T, C).
dvec ref_embedding(const std::vector<int32_t> &tokens, const dvec &wte, const dvec &wpe, int B,
                   int T, int C);

// Per-token -log softmax(logits[:V])[target] for logits (N, Vp); probs (N, Vp) if not null.
dvec ref_cross_entropy(const dvec &logits, const std::vector<int32_t> &targets, int N, int V,
                       int Vp, dvec *probs = nullptr);

// One GPT-2 block on inp (B, T, C), from the parameters in mp_gpt_block_params order, flat.
dvec ref_gpt_block(const dvec &inp, const dvec &params, int B, int T, int C, int NH, int F);

}  // namespace mp_test

#endif  // MPENGINE_TESTS_LAYERS_REFERENCE_H
