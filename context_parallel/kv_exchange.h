/*
 * context_parallel/kv_exchange.h — attention's keys and values across a context-parallel group,
 * Llama 3's way: each rank all-gathers every rank's keys and values (after tensor parallelism's
 * head split, so only this tp rank's kv heads travel: few with grouped-query attention) into the
 * whole sequence in global order, attends with its own queries, and in the backward
 * reduce-scatters the keys' and values' gradients back to the ranks that own those tokens.
 *
 * Shapes (fp32, host memory): a local qkv row holds q (Q floats) then k and v (KV floats
 * together), width W = Q + KV; every sequence has Tl = T / cp local tokens on each rank
 * (sequence_split.h says which). The group is a mp_tp_comm table (tensor_parallel/tp_comm.h) over
 * the cp ranks: its rank is the cp rank. send and recv are the caller's scratch, B x Tl x KV and
 * cp x B x Tl x KV floats.
 */
#ifndef MPENGINE_CONTEXT_PARALLEL_KV_EXCHANGE_H
#define MPENGINE_CONTEXT_PARALLEL_KV_EXCHANGE_H

#include <stddef.h>

#include "common/error.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int B;      /* sequences */
  int T;      /* tokens of a whole sequence (cp x Tl) */
  int Q, KV;  /* floats of a local row's queries, and of its keys and values together */
} mp_cp_kv_shape;

/* kv_full (B, T, KV) = every cp rank's keys and values, each token at its global position, from
 * the k | v part of this rank's qkv (B, Tl, Q + KV). */
mp_status mp_cp_gather_kv(const mp_tp_comm *cp, const mp_cp_kv_shape *shape, float *kv_full,
                          const float *qkv, float *send, float *recv, mp_error *err);

/* dqkv's k | v part (B, Tl, Q + KV) += the sum over the cp ranks of their dkv_full (B, T, KV) at
 * this rank's tokens. */
mp_status mp_cp_reduce_scatter_kv(const mp_tp_comm *cp, const mp_cp_kv_shape *shape, float *dqkv,
                                  const float *dkv_full, float *send, float *recv, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_CONTEXT_PARALLEL_KV_EXCHANGE_H */
