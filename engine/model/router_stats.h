/*
 * engine/model/router_stats.h — a micro-batch's mixture-of-experts router statistics on their way
 * through the pipeline (issue 33). The auxiliary losses (the load-balancing loss and the z-loss,
 * layers/moe.h) are defined per micro-batch over ALL its MoE layers: each layer adds its
 * statistics (per expert: routed (token, slot) pairs and summed router probabilities; the token
 * count and the sum of logsumexp^2) after its forward, so
 *   - a stage receives the sums of the layers before it WITH the activations (a tail of the
 *     boundary: mp_router_stats_boundary_floats), adds its own layers' and sends them on;
 *   - the last stage has the micro-batch's final sums: it adds aux_coeff x aux + z_coeff x z to
 *     the loss, and every layer's backward needs those final sums, so they travel back along the
 *     pipeline WITH the gradients (the same tail of the gradient boundary).
 * The sums are small (2E + 2 doubles), carried bit for bit as doubles in pairs of floats.
 *
 * Across tensor parallelism nothing is summed: every tp rank routes all of the micro-batch's
 * tokens (the experts are whole on every tp rank, expert-tp 1), so its sums are already the
 * micro-batch's. Context parallelism splits each sequence's tokens over the cp group: a stage's
 * own layers' sums are added over the group (mp_router_stats_sum) before they join the ones it
 * received.
 */
#ifndef MPENGINE_ENGINE_MODEL_ROUTER_STATS_H
#define MPENGINE_ENGINE_MODEL_ROUTER_STATS_H

#include <stddef.h>

#include "common/error.h"
#include "layers/moe.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The floats the statistics of a model with `experts` experts take at the end of a stage
 * boundary (0 for a dense model: experts 0). */
size_t mp_router_stats_boundary_floats(int experts);

/* stats (its experts, routed and prob_sum set) into tail (mp_router_stats_boundary_floats). */
void mp_router_stats_pack(const mp_moe_stats *stats, float *tail);

/* tail (written by mp_router_stats_pack) into stats, replacing what it held. */
void mp_router_stats_unpack(mp_moe_stats *stats, const float *tail);

/* into += from (the same experts). */
void mp_router_stats_add(mp_moe_stats *into, const mp_moe_stats *from);

/* stats = the sum of every rank's stats over group, added in rank order, so bitwise the same on
 * every rank (one all-gather). Collective; MP_ERR_RUNTIME when out of memory, the group's
 * errors. */
mp_status mp_router_stats_sum(mp_moe_stats *stats, const mp_tp_comm *group, mp_error *err);

/* The auxiliary part of the micro-batch's loss: aux_coeff x load-balancing + z_coeff x z-loss. */
double mp_router_stats_loss(const mp_moe_stats *stats, double aux_coeff, double z_coeff);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_ROUTER_STATS_H */
