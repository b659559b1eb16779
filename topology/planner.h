/*
 * topology/planner.h — the search behind `mpengine plan`: every layout of a model on N devices
 * (dp x cp x pp x tp = N, micro-batch size, schedule, virtual stages, recomputation, sequence
 * parallelism, ZeRO-1), each cut into stages by the partitioner and predicted by the cost model,
 * the fastest that fit in memory ranked.
 *
 * Candidates: tp divides N, is at most the devices per node, and divides the heads, the MLP width
 * and the vocabulary padded to a multiple of 64 (the runtime's padding) of every block; cp is a
 * power of two with the sequence length a multiple of 2 cp and each of the 2 cp chunks at least
 * MP_PLANNER_MIN_CP_CHUNK tokens (a fixed --cp needs only the multiple); pp divides N / (tp cp)
 * and pp x v is at most the number of layers; dp = N / (tp cp pp) divides the global batch;
 * ep (expert parallelism, MoE models only) divides dp x cp and every MoE block's experts;
 * the micro-batch divides global batch / dp; interleaving needs pp >= 2, v in 2..8 and the number
 * of micro-batches a multiple of pp; sequence parallelism needs tp > 1, ZeRO-1 dp > 1.
 *
 * Speed (planning gpt-1t on 3072 GPUs, 20 000 layouts, takes well under 0.2 s on one core), by
 * exact pruning only: the top K are the top K of simulating every layout (exhaustive, below), the
 * same layouts with the same step times in the same order. Each layout's per-layer costs come from
 * mp_cost_layer once per (tp, cp, ep, micro-batch, recompute, sequence parallelism), its stage split
 * from
 * one dynamic programme per such table for all numbers of stages at once. Each layout then gets a
 * lower bound of the step time and of the memory mp_cost_estimate will give it, from those same
 * per-layer costs and split (mp_planner_layout_bounds):
 *   time    the largest, over pipeline ranks r, of r's work (m micro-batches through each of its
 *           chunks, forward and backward with their tp collectives) plus the forward of
 *           micro-batch 0 through stages 0 .. r - 1, which r's first action waits for, plus (all
 *           but zb-h1, whose last actions are weight gradients) the backward of the last
 *           micro-batch through those stages, which waits for r's last action; then plus the
 *           largest optimizer step. The simulator runs a rank's actions one at a time, each no
 *           earlier than its input arrives, and the step adds the largest exposed gradient
 *           reduction (>= 0) plus optimizer step over ranks to the pipeline's end, so the
 *           estimate is never less.
 *   memory  the largest, over ranks, of its parameters' weights, gradients and optimizer state,
 *           plus its fewest activation sets the schedule keeps alive at once (those of its
 *           warm-up forwards and one more) times its smallest chunk's, plus the workspace.
 * A table none of whose layouts fits by a bound that needs no split (the average rank's parameter
 * state; its time bound: the average rank's work, or the costliest layer's) is never split: its
 * layouts take those lower bounds. Layouts are then simulated in order of their time bound,
 * skipping those whose memory bound is over the device's memory, and the search stops once the
 * next bound is above the K-th best step time found: every layout left would be slower than K
 * that fit. (A bound has to beat its limit by a relative 1e-9 to prune, so round-off in the
 * estimate's own sums loses nothing; ties in step time are ranked by the order layouts are listed
 * in, so the order of simulation changes nothing.) Schedules are generated, checked and matched
 * once per (kind, pp, micro-batches, virtual stages) and timed for every layout that shares them.
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

/* The fewest tokens in each of the 2 cp chunks of a sequence for the free search to try a cp:
 * below a few flash-attention tiles a chunk's attention runs far under the kernel efficiency the
 * cost model assumes (it has one figure for every length), and the all-gather's latencies
 * approach its transfer time. So a sequence of 2048 tokens is tried at cp 2 at most, 131072 at
 * cp 128. Published long-context runs use far longer chunks (NeMo's Llama 3 8B table starts
 * context parallelism at 32K tokens with cp 2; Llama 3 ran 131072 at cp 16: chunks of 4096). */
enum { MP_PLANNER_MIN_CP_CHUNK = 512 };

/* The stage split: by time, the partitioner's fastest (topology/partition.h); or by memory, the
 * split whose fullest pipeline rank holds the least (its parameters' state, its activations
 * times the micro-batches the schedule keeps alive there, the last stage's tied head), as
 * DeepSpeed's partition_method="parameters" and Megatron's embedding-aware splits do for models
 * that do not fit otherwise: slower (the first and last stages get fewer blocks), smaller.
 * Interleaved layouts (a rank holding several chunks) keep the time split. When no layout fits
 * cut by time, the search runs again with each layout whose time split cannot fit by its memory
 * bound cut by memory instead, so a model that fits only so is still planned. A memory-split
 * candidate is sorted by bounds that hold for any split and refined to its split's when the
 * search reaches it, so the search stays exact for the splits it runs. */
typedef enum { MP_SPLIT_TIME = 0, MP_SPLIT_MEMORY = 1 } mp_planner_split;

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
  int zero_stage;        /* -1 free (0, 1, and on CPU ranks 2), or fixed: 0, 1, 2, 3 */
  bool exhaustive;       /* simulate every layout, no bound prunes any: the same ranking, slower
                            (what tests check the pruned search against) */
  int zero_shard_size;   /* 0: ZeRO over all of dp; else HSDP groups of this many dp ranks
                            (needs --dp and --zero 1 or 2 fixed, and divides dp) */
  mp_planner_split split; /* how layouts of one chunk per rank (virtual stages 1, pp > 1) are
                             cut into stages */
  int cp;                /* context parallelism: 0 searched (see the top of this file), else
                            fixed (the sequence length a multiple of 2 cp) */
  int ep;                /* expert parallelism: 0 searched (every divisor of dp x cp that
                            divides each MoE block's experts; 1 alone for a dense model), else
                            fixed (refused on a dense model above 1, and where it does not
                            divide the experts) */
} mp_planner_options;

#define MP_PLANNER_OPTIONS_INITIALIZER \
  {0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, false, 0, MP_SPLIT_TIME, 0, 0}

typedef struct {
  int num_results;             /* fitting layouts, fastest first, at most top_k */
  mp_estimate *results;        /* (top_k) */
  long candidates;             /* layouts considered */
  long simulated;              /* of which simulated to rank them */
  long pruned;                 /* of which ruled out by a bound without simulating: candidates -
                                  simulated, less any whose estimate failed */
  long pruned_by_memory;       /* of those, by the memory bound */
  int64_t global_batch, seq_len;
  bool have_overflow;          /* a faster layout than the winner was simulated and did not fit */
  mp_estimate *overflow;       /* the fastest such (or, with no result, the least overflowing);
                                  the pruned search also measures the layout with the smallest
                                  time bound that its memory bound ruled out, while the exhaustive
                                  one has simulated them all */
} mp_planner_result;

/* Searches. On success at least one result fits. Fails with MP_ERR_INPUT, explained, when no
 * layout can use options->gpus devices (naming why each size was ruled out), when fixed options
 * contradict each other or the model, or when nothing fits in memory (naming the smallest
 * overflow and its layout). Free *out with mp_planner_result_free, also after a failure. */
mp_status mp_plan_search(const mp_cluster *cluster, const mp_model *model,
                         const mp_planner_options *options, mp_planner_result *out,
                         mp_error *err);
void mp_planner_result_free(mp_planner_result *result);

/* Lower bounds of what mp_cost_estimate gives one layout: what the search prunes with (see the
 * top of this file). */
typedef struct {
  double step_s;             /* <= the estimate's step_s */
  double memory_bytes;       /* <= the estimate's memory_bytes (the fullest rank) */
  double quick_step_s;       /* <= step_s: the same without the split (averages over ranks) */
  double quick_memory_bytes; /* <= memory_bytes, likewise */
} mp_planner_bounds;

/* The bounds of layout cut by layers_per_stage (pp x virtual_stages counts; NULL: the
 * partitioner's split, the search's), from mp_cost_layer's per-layer costs. Fails with
 * MP_ERR_INPUT on sizes below 1, more stages than layers, or a split of the wrong sum;
 * MP_ERR_RUNTIME when out of memory. */
mp_status mp_planner_layout_bounds(const mp_cluster *cluster, const mp_model *model,
                                   const mp_layout *layout, const int *layers_per_stage,
                                   mp_planner_bounds *out, mp_error *err);

/* The vocabulary padded as the runtime pads it: up to a multiple of 64. */
int64_t mp_padded_vocab(int64_t vocab);

/* "dp 16 pp 8 tp 8 micro-batch 1 1f1b v1 recompute selective sequence-parallel zero-1", for
 * messages; "dp 4 cp 16 pp 16 ..." with context parallelism, "dp 16 ep 8 pp 4 ..." with expert
 * parallelism. */
const char *mp_layout_describe(const mp_layout *layout, char *out, int out_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_PLANNER_H */
