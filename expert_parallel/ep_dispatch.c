/* expert_parallel/ep_dispatch.c — tokens to their experts and back over an ep group; see
 * ep_dispatch.h. The math is layers/moe.c's steps; this file only counts, exchanges and permutes
 * rows (the received buffer is by source rank, the experts want it by expert). */
#include "expert_parallel/ep_dispatch.h"

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
  mp_ep_plan_free(&c->plan);
  free(c->send_floats);
  free(c->recv_floats);
  free(c->rows.in);
  free(c->rows.fc1);
  free(c->rows.act);
  free(c->rows.out);
  memset(c, 0, sizeof *c);
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
  /* Counts: this rank's rows per expert, E/ep of them to each rank; the received rows' order. */
  mp_status status = mp_ep_plan_exchange(&cache->plan, cache->tokens.expert_offset, E, C, 2 * F,
                                         ep, err);
  float *received = NULL; /* (R, C) by source rank: the rows in, then their outputs back */
  if (status != MP_OK) goto done;
  const mp_ep_plan *plan = &cache->plan;
  const size_t total = (size_t)plan->received;
  bool ok = true;
  cache->send_floats = zalloc((size_t)size, sizeof(size_t), &ok);
  cache->recv_floats = zalloc((size_t)size, sizeof(size_t), &ok);
  cache->rows.in = zalloc(total * C, sizeof(float), &ok);
  cache->rows.fc1 = zalloc(total * 2 * F, sizeof(float), &ok);
  cache->rows.act = zalloc(total * F, sizeof(float), &ok);
  cache->rows.out = zalloc(total * C, sizeof(float), &ok);
  received = zalloc(total * C, sizeof(float), &ok);
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "moe: out of memory for the %d rows expert-parallel rank %d receives",
                     plan->received, ep->rank);
    goto done;
  }
  mp_ep_plan_counts(cache->send_floats, plan->send_rows, size, (size_t)C);
  mp_ep_plan_counts(cache->recv_floats, plan->recv_rows_from, size, (size_t)C);
  cache->rows.experts = plan->local_experts;
  cache->rows.offset = plan->local_offset;

  /* Dispatch, the local experts, and their outputs back to the ranks that sent the rows. */
  status = mp_ep_all_to_all_v_f32(ep, cache->tokens.routed_in, cache->send_floats, received,
                                  cache->recv_floats, err);
  if (status != MP_OK) goto done;
  const size_t row_bytes = sizeof(float) * (size_t)C;
  mp_ep_plan_permute(plan, cache->rows.in, received, row_bytes, 1);
  mp_moe_experts_forward_cpu(params, shape, &cache->rows);
  mp_ep_plan_permute(plan, received, cache->rows.out, row_bytes, 0);
  status = mp_ep_all_to_all_v_f32(ep, received, cache->recv_floats, cache->tokens.routed_out,
                                  cache->send_floats, err);
  if (status != MP_OK) goto done;
  free(cache->rows.out); /* gone back: the backward needs routed_out only */
  cache->rows.out = NULL;
  mp_moe_combine_cpu(out, x, params, &cache->tokens);

done:
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
  const int R = cache->plan.received;
  const size_t row_bytes = sizeof(float) * (size_t)C;
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
  mp_ep_plan_permute(&cache->plan, drows_out, received, row_bytes, 1);
  status = mp_moe_experts_backward_cpu(drows_in, grads, drows_out, params, shape, &cache->rows,
                                       err);
  if (status != MP_OK) goto done;
  mp_ep_plan_permute(&cache->plan, received, drows_in, row_bytes, 0);
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
