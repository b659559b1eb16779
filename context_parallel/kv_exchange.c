/* context_parallel/kv_exchange.c — the keys' and values' all-gather and their gradients'
 * reduce-scatter over the cp group; see the header. */
#include "context_parallel/kv_exchange.h"

#include <string.h>

#include "context_parallel/sequence_split.h"

mp_status mp_cp_gather_kv(const mp_tp_comm *cp, const mp_cp_kv_shape *shape, float *kv_full,
                          const float *qkv, float *send, float *recv, mp_error *err) {
  const int cp_size = cp->size, Tl = shape->T / cp_size, W = shape->Q + shape->KV;
  const size_t row_bytes = (size_t)shape->KV * sizeof(float);
  const size_t per_rank = (size_t)shape->B * Tl * shape->KV;
  for (int b = 0; b < shape->B; ++b) {
    for (int t = 0; t < Tl; ++t) {
      const size_t local = (size_t)b * Tl + t;
      memcpy(send + local * shape->KV, qkv + local * W + shape->Q, row_bytes);
    }
  }
  MP_TRY(mp_tp_all_gather(cp, send, recv, per_rank, err));
  for (int r = 0; r < cp_size; ++r) {
    for (int b = 0; b < shape->B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const int64_t position = mp_cp_position(shape->T, cp_size, r, t);
        memcpy(kv_full + ((size_t)b * shape->T + (size_t)position) * shape->KV,
               recv + r * per_rank + ((size_t)b * Tl + t) * shape->KV, row_bytes);
      }
    }
  }
  return MP_OK;
}

mp_status mp_cp_reduce_scatter_kv(const mp_tp_comm *cp, const mp_cp_kv_shape *shape, float *dqkv,
                                  const float *dkv_full, float *send, float *recv, mp_error *err) {
  const int cp_size = cp->size, Tl = shape->T / cp_size, W = shape->Q + shape->KV;
  const size_t row_bytes = (size_t)shape->KV * sizeof(float);
  const size_t per_rank = (size_t)shape->B * Tl * shape->KV;
  /* Chunk r of the reduce-scatter's input: the rows of rank r's tokens, in its local order. */
  for (int r = 0; r < cp_size; ++r) {
    for (int b = 0; b < shape->B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const int64_t position = mp_cp_position(shape->T, cp_size, r, t);
        memcpy(recv + r * per_rank + ((size_t)b * Tl + t) * shape->KV,
               dkv_full + ((size_t)b * shape->T + (size_t)position) * shape->KV, row_bytes);
      }
    }
  }
  MP_TRY(mp_tp_reduce_scatter_sum(cp, recv, send, per_rank, err));
  for (size_t local = 0; local < (size_t)shape->B * Tl; ++local) {
    float *row = dqkv + local * W + shape->Q;
    const float *sum = send + local * shape->KV;
    for (int i = 0; i < shape->KV; ++i) row[i] += sum[i];
  }
  return MP_OK;
}
