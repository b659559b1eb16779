/* engine/model/router_stats.c — router statistics through the pipeline; see router_stats.h. */
#include "engine/model/router_stats.h"

#include <stdlib.h>
#include <string.h>

/* The doubles carried: tokens, logsumexp_sq, routed (E), prob_sum (E). */
static size_t doubles_of(int experts) { return experts > 0 ? 2 + 2 * (size_t)experts : 0; }

size_t mp_router_stats_boundary_floats(int experts) {
  return doubles_of(experts) * sizeof(double) / sizeof(float);
}

void mp_router_stats_pack(const mp_moe_stats *stats, float *tail) {
  const size_t E = (size_t)stats->experts;
  char *out = (char *)tail;
  memcpy(out, &stats->tokens, sizeof(double));
  memcpy(out + sizeof(double), &stats->logsumexp_sq, sizeof(double));
  memcpy(out + 2 * sizeof(double), stats->routed, E * sizeof(double));
  memcpy(out + (2 + E) * sizeof(double), stats->prob_sum, E * sizeof(double));
}

void mp_router_stats_unpack(mp_moe_stats *stats, const float *tail) {
  const size_t E = (size_t)stats->experts;
  const char *in = (const char *)tail;
  memcpy(&stats->tokens, in, sizeof(double));
  memcpy(&stats->logsumexp_sq, in + sizeof(double), sizeof(double));
  memcpy(stats->routed, in + 2 * sizeof(double), E * sizeof(double));
  memcpy(stats->prob_sum, in + (2 + E) * sizeof(double), E * sizeof(double));
}

double mp_router_stats_loss(const mp_moe_stats *stats, double aux_coeff, double z_coeff) {
  double loss = 0.0;
  if (aux_coeff != 0.0) loss += aux_coeff * mp_moe_aux_loss(stats);
  if (z_coeff != 0.0) loss += z_coeff * mp_moe_z_loss(stats);
  return loss;
}

void mp_router_stats_add(mp_moe_stats *into, const mp_moe_stats *from) {
  into->tokens += from->tokens;
  into->logsumexp_sq += from->logsumexp_sq;
  for (int e = 0; e < into->experts; ++e) {
    into->routed[e] += from->routed[e];
    into->prob_sum[e] += from->prob_sum[e];
  }
}

mp_status mp_router_stats_sum(mp_moe_stats *stats, const mp_tp_comm *group, mp_error *err) {
  if (group->size <= 1) return MP_OK;
  const size_t floats = mp_router_stats_boundary_floats(stats->experts);
  const size_t E = (size_t)stats->experts;
  float *mine = malloc(floats * sizeof(float));
  float *all = malloc(floats * (size_t)group->size * sizeof(float));
  double *storage = malloc(2 * E * sizeof(double));
  mp_status status = MP_OK;
  if (mine == NULL || all == NULL || storage == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory for the router statistics");
  }
  if (status == MP_OK) {
    mp_router_stats_pack(stats, mine);
    status = mp_tp_all_gather(group, mine, all, floats, err);
  }
  if (status == MP_OK) {
    mp_moe_stats rank = {stats->experts, 0.0, storage, storage + E, 0.0};
    mp_moe_stats_clear(stats);
    for (int r = 0; r < group->size; ++r) {
      mp_router_stats_unpack(&rank, all + (size_t)r * floats);
      mp_router_stats_add(stats, &rank);
    }
  }
  free(mine);
  free(all);
  free(storage);
  return status;
}
