/* expert_parallel/ep_dispatch.c — tokens to their experts and back over an ep group; see
 * ep_dispatch.h. The math is layers/moe.c's steps; this file only counts, exchanges and permutes
 * rows (the received buffer is by source rank, the experts want it by expert). */
#include "expert_parallel/ep_dispatch.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t count, size_t size, bool *ok) {
  if (count == 0) count = 1;
  void *p = calloc(count, size);
  if (p == NULL) *ok = false;
  return p;
}

void mp_moe_ep_cache_free(mp_moe_ep_cache *c) {
  if (c == NULL) return;
  mp_moe_cache_free(&c->tokens);
  free(c->recv_rows);
  free(c->send_floats);
  free(c->recv_floats);
  free(c->local_offset);
  free(c->source_row);
  free(c->rows.in);
  free(c->rows.fc1);
  free(c->rows.act);
  free(c->rows.out);
  memset(c, 0, sizeof *c);
}

/* dst row i (C floats) = src row map[i], for rows rows; or the reverse (dst row map[i] = src row
 * i) when scatter. */
static void permute_rows(float *dst, const float *src, const int *map, int rows, int C,
                         bool scatter) {
  for (int i = 0; i < rows; ++i) {
    const size_t to = (size_t)(scatter ? map[i] : i) * C, from = (size_t)(scatter ? i : map[i]) * C;
    memcpy(dst + to, src + from, sizeof(float) * (size_t)C);
  }
}

/* From the counts every rank sent (recv_rows), the received buffer's layout (by source rank,
 * then local expert) and the experts' (by local expert, then source rank): local_offset and
 * source_row. */
static void group_received(mp_moe_ep_cache *c) {
  const int ep = c->ep, El = c->local_experts;
  c->local_offset[0] = 0;
  for (int e = 0; e < El; ++e) {
    int rows = 0;
    for (int s = 0; s < ep; ++s) rows += c->recv_rows[s * El + e];
    c->local_offset[e + 1] = c->local_offset[e] + rows;
  }
  int at = 0; /* the start of block (s, e) in the received buffer */
  for (int s = 0; s < ep; ++s) {
    for (int e = 0; e < El; ++e) {
      const int count = c->recv_rows[s * El + e];
      int row = c->local_offset[e]; /* after the rows of sources before s */
      for (int s2 = 0; s2 < s; ++s2) row += c->recv_rows[s2 * El + e];
      for (int i = 0; i < count; ++i) c->source_row[row + i] = at + i;
      at += count;
    }
  }
}

mp_status mp_moe_ep_forward_cpu(float *out, const float *x, const mp_moe_params *params,
                                const mp_moe_shape *shape, const mp_ep_comm *ep,
                                mp_moe_ep_cache *cache, mp_error *err) {
  memset(cache, 0, sizeof *cache);
  const int size = ep->size, E = shape->experts, C = shape->channels, F = shape->expert_ffn;
  if (size < 1 || ep->rank < 0 || ep->rank >= size || E % size != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe: %d experts cannot be split over an expert-parallel group of %d ranks "
                   "(rank %d): the experts must be a multiple of ep",
                   E, size, ep->rank);
  }
  MP_TRY(mp_moe_route_cpu(x, params, shape, &cache->tokens, err));
  const int El = E / size;
  cache->ep = size;
  cache->local_experts = El;
  cache->first_expert = ep->rank * El;
  bool ok = true;
  int32_t *send_rows = zalloc((size_t)E, sizeof(int32_t), &ok); /* (E) this rank's per expert */
  cache->recv_rows = zalloc((size_t)E, sizeof(int32_t), &ok);
  cache->send_floats = zalloc((size_t)size, sizeof(size_t), &ok);
  cache->recv_floats = zalloc((size_t)size, sizeof(size_t), &ok);
  cache->local_offset = zalloc((size_t)El + 1, sizeof(int), &ok);
  float *received = NULL; /* (R, C) by source rank: the rows in, then their outputs back */
  mp_status status = MP_OK;
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for the expert-parallel counts");
    goto done;
  }

  /* Counts: this rank's rows per expert, E/ep of them to each rank. */
  const int *offset = cache->tokens.expert_offset;
  for (int e = 0; e < E; ++e) send_rows[e] = offset[e + 1] - offset[e];
  status = mp_ep_all_to_all_i32(ep, send_rows, cache->recv_rows, (size_t)El, err);
  if (status != MP_OK) goto done;
  size_t total = 0; /* R */
  for (int r = 0; r < size; ++r) {
    cache->send_floats[r] = (size_t)(offset[(r + 1) * El] - offset[r * El]) * C;
    size_t rows = 0;
    for (int e = 0; e < El; ++e) rows += (size_t)cache->recv_rows[r * El + e];
    cache->recv_floats[r] = rows * C;
    total += rows;
  }
  if (total * (size_t)C > (size_t)INT_MAX || total * 2 * (size_t)F > (size_t)INT_MAX) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "moe: expert-parallel rank %d receives %zu rows of %d floats, more than one "
                     "exchange carries; use smaller micro-batches",
                     ep->rank, total, C);
    goto done;
  }
  const int R = (int)total;
  cache->source_row = zalloc(total, sizeof(int), &ok);
  cache->rows.in = zalloc(total * C, sizeof(float), &ok);
  cache->rows.fc1 = zalloc(total * 2 * F, sizeof(float), &ok);
  cache->rows.act = zalloc(total * F, sizeof(float), &ok);
  cache->rows.out = zalloc(total * C, sizeof(float), &ok);
  received = zalloc(total * C, sizeof(float), &ok);
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "moe: out of memory for the %d rows expert-parallel rank %d receives", R,
                     ep->rank);
    goto done;
  }
  group_received(cache);
  cache->rows.experts = El;
  cache->rows.offset = cache->local_offset;

  /* Dispatch, the local experts, and their outputs back to the ranks that sent the rows. */
  status = mp_ep_all_to_all_v_f32(ep, cache->tokens.routed_in, cache->send_floats, received,
                                  cache->recv_floats, err);
  if (status != MP_OK) goto done;
  permute_rows(cache->rows.in, received, cache->source_row, R, C, false);
  mp_moe_experts_forward_cpu(params, shape, &cache->rows);
  permute_rows(received, cache->rows.out, cache->source_row, R, C, true);
  status = mp_ep_all_to_all_v_f32(ep, received, cache->recv_floats, cache->tokens.routed_out,
                                  cache->send_floats, err);
  if (status != MP_OK) goto done;
  free(cache->rows.out); /* gone back: the backward needs routed_out only */
  cache->rows.out = NULL;
  mp_moe_combine_cpu(out, x, params, &cache->tokens);

done:
  free(send_rows);
  free(received);
  if (status != MP_OK) mp_moe_ep_cache_free(cache);
  return status;
}

mp_status mp_moe_ep_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                                 const float *x, const mp_moe_params *params,
                                 const mp_ep_comm *ep, const mp_moe_ep_cache *cache,
                                 const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                                 mp_error *err) {
  const mp_moe_shape *shape = &cache->tokens.shape;
  const int N = shape->tokens, C = shape->channels;
  const size_t NK = (size_t)N * shape->top_k;
  const int R = cache->local_offset[cache->local_experts];
  bool ok = true;
  float *dweights = zalloc(NK, sizeof(float), &ok);          /* (N, K) */
  float *drouted = zalloc(NK * C, sizeof(float), &ok);       /* (N K, C) d(routed_out) */
  float *drouted_in = zalloc(NK * C, sizeof(float), &ok);    /* (N K, C) d(routed_in) */
  float *received = zalloc((size_t)R * C, sizeof(float), &ok); /* (R, C) by source rank */
  float *drows_out = zalloc((size_t)R * C, sizeof(float), &ok); /* (R, C) by local expert */
  float *drows_in = zalloc((size_t)R * C, sizeof(float), &ok);  /* (R, C) by local expert */
  mp_status status = MP_OK;
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "moe: out of memory for the expert-parallel backward of %d tokens and %d "
                     "received rows",
                     N, R);
    goto done;
  }
  /* The rows' output gradients to the experts, the experts' backward, the input gradients back. */
  mp_moe_combine_backward_cpu(drouted, dweights, dout, &cache->tokens);
  status = mp_ep_all_to_all_v_f32(ep, drouted, cache->send_floats, received, cache->recv_floats,
                                  err);
  if (status != MP_OK) goto done;
  permute_rows(drows_out, received, cache->source_row, R, C, false);
  status = mp_moe_experts_backward_cpu(drows_in, grads, drows_out, params, shape, &cache->rows,
                                       err);
  if (status != MP_OK) goto done;
  permute_rows(received, drows_in, cache->source_row, R, C, true);
  status = mp_ep_all_to_all_v_f32(ep, received, cache->recv_floats, drouted_in, cache->send_floats,
                                  err);
  if (status != MP_OK) goto done;
  /* The router and the shared MLP, as on one device. */
  status = mp_moe_route_backward_cpu(dx, grads->router, drouted_in, dweights, x, params->router,
                                     &cache->tokens, stats, aux_coeff, z_coeff, err);
  if (status == MP_OK) {
    status = mp_moe_shared_backward_cpu(dx, grads, dout, x, params, &cache->tokens, err);
  }
done:
  free(dweights);
  free(drouted);
  free(drouted_in);
  free(received);
  free(drows_out);
  free(drows_in);
  return status;
}
