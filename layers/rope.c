/* layers/rope.c — rotary position embeddings on the CPU; see rope.h. */
#include "layers/rope.h"

#include <math.h>

void mp_rope_inv_freq(float *inv_freq, int HS, const mp_rope_spec *spec) {
  const int half = HS / 2;
  /* Hugging Face: 1 / base ** (arange(0, HS, 2).float() / HS), in fp32. */
  for (int i = 0; i < half; i++) {
    inv_freq[i] = 1.0f / powf((float)spec->theta, (float)(2 * i) / (float)HS);
  }
  if (!spec->llama3) return;
  /* _compute_llama3_parameters of transformers' modeling_rope_utils. */
  /* Tensor-and-number arithmetic in fp32, as torch does it for an fp32 tensor. */
  const float pi = 3.14159265358979323846f;
  const float old_positions = (float)spec->original_max_positions;
  const float low_wavelen = (float)(spec->original_max_positions / spec->low_freq_factor);
  const float high_wavelen = (float)(spec->original_max_positions / spec->high_freq_factor);
  const float factor = (float)spec->factor, low = (float)spec->low_freq_factor;
  const float span = (float)(spec->high_freq_factor - spec->low_freq_factor);
  for (int i = 0; i < half; i++) {
    const float f = inv_freq[i];
    const float wavelen = 2.0f * pi / f;
    if (wavelen > low_wavelen) {
      inv_freq[i] = f / factor;
    } else if (!(wavelen < high_wavelen)) {
      const float smooth = (old_positions / wavelen - low) / span;
      inv_freq[i] = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
}

/* sign +1 turns by the angle, -1 back. */
static void rotate(float *x, const float *inv_freq, const int32_t *positions, int B, int T,
                   int heads, int HS, size_t row_stride, float sign) {
  const int half = HS / 2;
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < half; i++) {
      /* Hugging Face forms the angle as an fp32 product, then its cos and sin. */
      const float angle = (float)(positions != NULL ? positions[t] : t) * inv_freq[i];
      const float c = cosf(angle), s = sign * sinf(angle);
      for (int b = 0; b < B; b++) {
        float *row = x + ((size_t)b * T + t) * row_stride;
        for (int h = 0; h < heads; h++) {
          float *head = row + (size_t)h * HS;
          const float lo = head[i], hi = head[i + half];
          head[i] = lo * c - hi * s;
          head[i + half] = hi * c + lo * s;
        }
      }
    }
  }
}

void mp_rope_forward_cpu(float *x, const float *inv_freq, int B, int T, int heads, int HS,
                         size_t row_stride) {
  rotate(x, inv_freq, NULL, B, T, heads, HS, row_stride, 1.0f);
}

void mp_rope_backward_cpu(float *dx, const float *inv_freq, int B, int T, int heads, int HS,
                          size_t row_stride) {
  rotate(dx, inv_freq, NULL, B, T, heads, HS, row_stride, -1.0f);
}

void mp_rope_forward_at_cpu(float *x, const float *inv_freq, const int32_t *positions, int B,
                            int T, int heads, int HS, size_t row_stride) {
  rotate(x, inv_freq, positions, B, T, heads, HS, row_stride, 1.0f);
}

void mp_rope_backward_at_cpu(float *dx, const float *inv_freq, const int32_t *positions, int B,
                             int T, int heads, int HS, size_t row_stride) {
  rotate(dx, inv_freq, positions, B, T, heads, HS, row_stride, -1.0f);
}
