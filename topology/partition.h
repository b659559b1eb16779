/*
 * topology/partition.h — cutting a chain of layers into contiguous pipeline stages so that the
 * slowest stage is as fast as possible.
 *
 * The planner gives each layer of the expanded chain (embedding, blocks, final norm, LM head) a
 * cost in seconds for one micro-batch (forward + backward + recomputation on one tensor-parallel
 * rank); the first and last stage carry the embedding and the LM head, so an even split by layer
 * count is often not the best one (users' most common complaint). This is the classic linear
 * partition problem, solved exactly by dynamic programming over the chain:
 *   best[j][i] = min over s of max(best[j-1][s], cost(s..i-1))
 * best[j-1][s] grows with s and cost(s..i-1) shrinks with s, so the minimum sits where the two
 * cross; the crossing moves right as i grows, so one pointer per row finds every one: O(k n) for
 * n layers and k stages.
 */
#ifndef MPENGINE_TOPOLOGY_PARTITION_H
#define MPENGINE_TOPOLOGY_PARTITION_H

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Splits costs[0..n) (each >= 0) into k contiguous non-empty parts minimising the largest part
 * sum. Writes the k part sizes to counts (in order; they sum to n) and that largest sum to
 * *bottleneck. Among optimal splits it returns one whose later parts are as large as allowed
 * (ties resolved the same way every time). Fails with MP_ERR_INPUT when k < 1 or k > n (a stage
 * needs a layer), or a cost is negative or not finite; MP_ERR_RUNTIME when out of memory. */
mp_status mp_partition_chain(const double *costs, int n, int k, int *counts, double *bottleneck,
                             mp_error *err);

/* mp_partition_chain for every k in 1 .. max_parts from one dynamic programme, which costs what
 * the largest k alone costs (the planner needs many k for one chain). The split of k parts goes to
 * counts + k (k - 1) / 2 (counts holds max_parts (max_parts + 1) / 2 entries) and is the split
 * mp_partition_chain gives for k, to the bit; its bottleneck to bottlenecks[k] when bottlenecks is
 * not NULL ((max_parts + 1) entries). Fails as mp_partition_chain does for k = max_parts. */
mp_status mp_partition_chain_all(const double *costs, int n, int max_parts, int *counts,
                                 double *bottlenecks, mp_error *err);

/* Splits n layers into k contiguous non-empty stages minimising the largest stage cost when a
 * stage's cost depends on its place in the pipeline: stage j (0-based) over layers [s, i) costs
 *   fixed[j] + a_weight[j] * (a[s] + ... + a[i - 1]) + b_weight[j] * (b[s] + ... + b[i - 1])
 * (a pipeline rank's memory: its layers' parameters a times the state bytes of each, their
 * activations b times the micro-batches the schedule keeps alive there, plus what only that
 * stage holds, such as the tied head's copy of the token table). Writes the k stage sizes to
 * counts and the largest cost to *bottleneck; among optimal splits, later stages as large as
 * allowed. Exact, in O(k n^2) at worst and far less when stages are short (a stage's start is
 * searched only while its own cost stays below the best found). MP_ERR_INPUT when k < 1 or
 * k > n, or a value is negative or not finite; MP_ERR_RUNTIME when out of memory. */
mp_status mp_partition_chain_staged(const double *a, const double *b, int n, int k,
                                    const double *a_weight, const double *b_weight,
                                    const double *fixed, int *counts, double *bottleneck,
                                    mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_PARTITION_H */
