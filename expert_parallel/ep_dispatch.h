/*
 * expert_parallel/ep_dispatch.h — expert parallelism for layers/moe.h's mixture-of-experts MLP on
 * the CPU (fp32): the experts are split over the ranks of an ep group, and each rank's tokens
 * travel to the ranks holding their experts and back through two all-to-alls, forward and
 * backward.
 *
 * Why: E experts of 2 x 3 C F weights each do not fit, or do not pay, on every rank; with ep ranks
 * each holds E / ep of them (rank r: experts [r E/ep, (r+1) E/ep)) and runs one GEMM pair per
 * local expert over the rows every rank sent it. Megatron-Core's all-to-all token dispatcher,
 * dropless (no capacity: every (token, slot) pair reaches its expert, an expert with no row on
 * any rank does no work).
 *
 * Forward of one rank (its own N tokens, different from the other ranks', as dp ranks' are):
 *   1. route (mp_moe_route_cpu): router, softmax, top-k (ties to the lowest index), weights; the
 *      N K (token, slot) rows grouped by expert into routed_in (N K, C), so the rows for rank r's
 *      experts are one contiguous run;
 *   2. counts: an all-to-all of E ints (this rank's rows per expert, E/ep to each rank), so each
 *      rank learns how many rows it receives from every rank for each of its experts;
 *   3. dispatch: an all-to-all-v of the rows (C floats each), run r to rank r;
 *   4. the local experts (mp_moe_experts_forward_cpu) over the received rows grouped by local
 *      expert, and within an expert by source rank, then that rank's order (expert, token): a
 *      fixed order whatever the timing, so results are deterministic;
 *   5. combine: the outputs go back by the reverse all-to-all-v into routed_out (N K, C), in
 *      routed_in's order, and mp_moe_combine_cpu sums them by their weights (plus the shared MLP)
 *      exactly as on one device.
 * Backward: the combine's backward gives the rows' output gradients, which travel to the experts
 * by the forward's all-to-all-v; the local experts' backward adds their weight gradients (local
 * experts only) and gives the rows' input gradients, which come back by the reverse one; then the
 * route's backward (router gradient, the aux and z losses) and the shared MLP's, as on one device.
 *
 * Equal to one device: a rank's out and dx are mp_moe_forward_cpu / _backward_cpu's over its own
 * tokens with all E experts (every addition into them is in the same order; only the experts'
 * GEMMs see more rows, tests/expert_parallel checks it), its router and shared gradients are
 * those of its own tokens, and its local experts' weight gradients are the SUM over the ep ranks
 * of the one-device gradients of those experts (the GEMM over all received rows). With ep folded
 * over dp (an ep group is ep ranks of one dp group of D ranks), the runtime then sums the expert
 * gradients over the expert-data-parallel group (the D / ep ranks of the dp group with the same
 * ep rank, so holding the same experts) and everything else (router, shared MLP) over the whole
 * dp group, as today; both then hold the sum over all D ranks' tokens, so they take the same
 * scale (a mean over dp divides both by D, not the experts' by D / ep).
 *
 * The aux-loss statistics stay per rank (mp_moe_stats_add(stats, &cache->tokens), as on one
 * device): the caller sums them over whoever shares these tokens (tp with sp, cp).
 *
 * A failure on one rank before an exchange (out of memory) leaves its peers in that exchange until
 * the communicator's timeout, which names the group (engine/comm/comm.h).
 */
#ifndef MPENGINE_EXPERT_PARALLEL_EP_DISPATCH_H
#define MPENGINE_EXPERT_PARALLEL_EP_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "expert_parallel/ep_comm.h"
#include "expert_parallel/ep_plan.h"
#include "layers/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the forward keeps for the backward (allocated by mp_moe_ep_forward_cpu). R is the rows
 * this rank's experts received from all ranks. */
typedef struct {
  mp_moe_cache tokens;     /* this rank's tokens as on one device: the routing, routed_in (the
                              rows sent), routed_out (the outputs received back), the shared MLP;
                              its routed_fc1 / routed_act are NULL */
  mp_ep_plan plan;         /* the exchange's counts and row order (ep_plan.h, shared with the
                              GPU dispatch) */
  size_t *send_floats;     /* (ep) floats sent to each rank (rows x C) */
  size_t *recv_floats;     /* (ep) floats received from each rank */
  mp_moe_expert_rows rows; /* the received rows grouped by local expert (offset: the plan's
                              local_offset): in, fc1, act kept; out NULL (it has gone back) */
} mp_moe_ep_cache;

/* Forward of the layer over this rank's tokens x (N, C) into out (N, C), as mp_moe_forward_cpu,
 * with the experts split over ep. shape is the whole layer's (experts = E, all of them); params
 * holds the router (E, C) and the shared MLP whole, and only this rank's experts in expert_fc1
 * (E/ep, 2F, C) and expert_fc2 (E/ep, C, F). Collective over ep: every rank calls it with the
 * same shape (its own tokens count N may differ). Fills *cache (free with
 * mp_moe_ep_cache_free). MP_ERR_INPUT for a shape mp_moe_forward_cpu refuses or E not a multiple
 * of ep; MP_ERR_RUNTIME when out of memory or an exchange fails (the message names the ep rank). */
mp_status mp_moe_ep_forward_cpu(float *out, const float *x, const mp_moe_params *params,
                                const mp_moe_shape *shape, const mp_ep_comm *ep,
                                mp_moe_ep_cache *cache, mp_error *err);

void mp_moe_ep_cache_free(mp_moe_ep_cache *cache);

/* Backward, as mp_moe_backward_cpu: adds (+=) into dx (N, C), grads->router, the shared MLP's
 * gradients, and grads->expert_fc1 / expert_fc2 (E/ep of them: this rank's experts, summed over
 * the rows of every ep rank). stats are the micro-batch's, as on one device. Collective over
 * ep, in the forwards' order. MP_ERR_RUNTIME when out of memory or an exchange fails. */
mp_status mp_moe_ep_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                                 const float *x, const mp_moe_params *params,
                                 const mp_ep_comm *ep, const mp_moe_ep_cache *cache,
                                 const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                                 mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_EXPERT_PARALLEL_EP_DISPATCH_H */
