/*
 * layers/attention_internal.h — private to the attention's CUDA twin (attention_cuda.cu) and its
 * emulated and no-CUDA stand-ins (cuda_gemm_emulated.c, cuda_gemm_none.c): the layout of the
 * attention's device scratch, as plain C, so that every build reports the same size
 * (mp_attention_cuda_scratch_bytes) from one definition.
 */
#ifndef MPENGINE_LAYERS_ATTENTION_INTERNAL_H
#define MPENGINE_LAYERS_ATTENTION_INTERNAL_H

#include <stddef.h>

/* Byte offsets of the attention scratch's pieces (see mp_attention_cuda_scratch_bytes). */
typedef struct {
  size_t q, k, v;    /* (B, NH, T, HS) bf16 each */
  size_t y;          /* (B, NH, T, HS) bf16: forward y, backward dy */
  size_t dq, dk, dv; /* (B, NH, T, HS) fp32 each */
  size_t datt;       /* (B, NH, T, T) bf16: datt, then dpreatt in place */
  size_t total;      /* bytes */
} mp_attention_cuda_layout;

static inline size_t mp_attention_cuda_align_(size_t bytes) { return (bytes + 255) / 256 * 256; }

static inline mp_attention_cuda_layout mp_attention_cuda_layout_of(int B, int T, int NH, int HS) {
  mp_attention_cuda_layout layout;
  const int ok = B > 0 && T > 0 && NH > 0 && HS > 0;
  const size_t heads = ok ? (size_t)B * NH : 0;
  const size_t n = heads * (size_t)T * (size_t)HS; /* elements of one (B, NH, T, HS) tensor */
  const size_t bf16_bytes = mp_attention_cuda_align_(n * 2);
  const size_t f32_bytes = mp_attention_cuda_align_(n * 4);
  layout.q = 0;
  layout.k = layout.q + bf16_bytes;
  layout.v = layout.k + bf16_bytes;
  layout.y = layout.v + bf16_bytes;
  layout.dq = layout.y + bf16_bytes;
  layout.dk = layout.dq + f32_bytes;
  layout.dv = layout.dk + f32_bytes;
  layout.datt = layout.dv + f32_bytes;
  layout.total = layout.datt + mp_attention_cuda_align_(heads * (size_t)T * (size_t)T * 2);
  return layout;
}

#endif /* MPENGINE_LAYERS_ATTENTION_INTERNAL_H */
