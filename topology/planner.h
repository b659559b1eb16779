/*
 * topology/planner.h — the search behind `mpengine plan`: every layout of a model on N devices
 * (dp x pp x tp = N, micro-batch size, schedule, virtual stages, recomputation, sequence
 * parallelism, ZeRO-1), each cut into stages by the partitioner and predicted by the cost model,
 * the fastest that fit in memory ranked.
 *
 * Candidates: tp divides N, is at most the devices per node, and divides the heads, the MLP width
 * and the vocabulary padded to a multiple of 64 (the runtime's padding) of every block; pp divides
 * N / tp and pp x v is at most the number of layers; dp = N / (tp pp) divides the global batch;
 * the micro-batch divides global batch / dp; interleaving needs pp >= 2, v in 2..8 and the number
 * of micro-batches a multiple of pp; sequence parallelism needs tp > 1, ZeRO-1 dp > 1.
 *
 * Speed (planning gpt-1t on 3072 GPUs must take well under a second): every candidate gets a
 * cheap bound first: a lower bound of its step time (the busiest pipeline rank's work plus the
 * forward it must wait for before its first action, plus its optimizer step) and of its memory
 * (the static state plus the fewest live micro-batches the schedule can hold). Candidates are then
 * simulated in order of their time bound, and the search stops when the next bound is slower
 * than the K-th best simulated step time, so the top K are exact with respect to the cost model.
 */
#ifndef MPENGINE_TOPOLOGY_PLANNER_H
#define MPENGINE_TOPOLOGY_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "topology/cluster.h"
#include "topology/cost_model.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_PLANNER_MAX_TOP = 100 };

/* What to search; a field at 0 (or -1 where stated) is searched, anything else is fixed. */
typedef struct {
  int gpus;
  int64_t global_batch; /* 0: one sequence per device, N */
  int64_t seq_len;      /* 0: the model's */
  int top_k;            /* results kept, 1 .. MP_PLANNER_MAX_TOP; 0: 5 */
  int dp, pp, tp, virtual_stages;
  int64_t micro_batch;
  int schedule;          /* -1 free, else an mp_schedule_kind */
  int recompute;         /* -1 free, else an mp_recompute */
  int sequence_parallel; /* -1 free, 0, 1 */
  int zero_stage;        /* -1 free, 0, 1 */
} mp_planner_options;

#define MP_PLANNER_OPTIONS_INITIALIZER \
  {0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1}

typedef struct {
  int num_results;             /* fitting layouts, fastest first, at most top_k */
  mp_estimate *results;        /* (top_k) */
  long candidates;             /* layouts considered */
  long simulated;              /* of which generated and simulated */
  int64_t global_batch, seq_len;
  bool have_overflow;          /* a faster layout than the winner was simulated and did not fit */
  mp_estimate *overflow;       /* the fastest such (or, with no result, the least overflowing) */
} mp_planner_result;

/* Searches. On success at least one result fits. Fails with MP_ERR_INPUT, explained, when no
 * layout can use options->gpus devices (naming why each size was ruled out), when fixed options
 * contradict each other or the model, or when nothing fits in memory (naming the smallest
 * overflow and its layout). Free *out with mp_planner_result_free, also after a failure. */
mp_status mp_plan_search(const mp_cluster *cluster, const mp_model *model,
                         const mp_planner_options *options, mp_planner_result *out,
                         mp_error *err);
void mp_planner_result_free(mp_planner_result *result);

/* The vocabulary padded as the runtime pads it: up to a multiple of 64. */
int64_t mp_padded_vocab(int64_t vocab);

/* "dp 16 pp 8 tp 8 mb 1 1f1b v1 recompute selective sp zero1", for messages. */
const char *mp_layout_describe(const mp_layout *layout, char *out, int out_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_PLANNER_H */
