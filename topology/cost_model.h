/*
 * topology/cost_model.h — seconds and bytes of one layout of one model on one cluster: what the
 * planner ranks, what `plan --explain` prints and what a plan file predicts.
 *
 * The model, stated so it can be checked by hand (tests/topology/cost_model_test.cc does):
 *
 * Every figure below is a physical quantity of the cluster (topology/cluster.h: datasheet peaks
 * and bandwidths, and the efficiencies measured by public benchmarks that each preset names) or of
 * the model (topology/layer_cost.h); nothing is fitted per model or per case. How well it matches
 * published runs: tests/topology/fidelity_test.cc and tools/bench/plan_fidelity.sh (Korthikanti
 * et al. 2022, Table 5 on A100: 3.5% mean, 5.5% largest error).
 *
 * Compute. Each of a layer's GEMMs (layer_cost.h lists them by shape) runs on one tp rank at its
 * roofline: the slower of its FLOPs at peak x efficiency(FLOPs of the launch) in the cluster's
 * training dtype (bf16 when the device has it, else fp32) and its bytes (both operands and the
 * result) at the memory bandwidth that streaming kernels reach (memory_bandwidth x
 * memory_efficiency). The attention products' K or N is the head size, so on a GPU they are
 * memory-bound. Backward runs each GEMM twice (input and weight gradients). Flash attention (the
 * CUDA backend's, layer_cost.h) is one kernel at peak x flash_attention_efficiency, 2.5 x its
 * forward time in backward (it recomputes the scores; Dao 2023). The memory-bound kernels between
 * the GEMMs (norms, residual adds, softmax, dropout, GELU/SwiGLU, embedding gathers,
 * cross-entropy) each cost the roofline of their bytes read and written (layer_cost.h) at the same
 * reachable bandwidth and their vector FLOPs at vector_tflops, or scalar_tflops for the one our CPU
 * backend runs as a scalar loop (the attention softmax's expf) (on a GPU the bytes always win; on
 * a CPU core the exps and tanh do); tp divides the part inside the split regions,
 * sequence parallelism the rest too.
 * Recomputation adds, in backward: selective, the attention products and the softmax and dropout
 * forward; full, the whole forward. Not modelled: kernel launch gaps beyond the GEMM curve's
 * fixed cost, GEMM shapes that tile badly, and compute slowed by concurrent communication kernels.
 *
 * Tensor parallelism (tp > 1, always inside one node). A transformer block does 2 all-reduces of
 * its (B, T, C) output in forward and 2 in backward, each a ring costing
 * 2(t-1)/t x bytes / (intra-node bandwidth x efficiency) + 2(t-1) x latency (so small messages
 * reach a lower bus bandwidth, as nccl-tests shows); with sequence parallelism the same bytes move
 * as 2 all-gathers and 2 reduce-scatters ((t-1)/t each), and backward all-gathers the two
 * column-parallel inputs once more, since only this rank's slice of them is kept (Megatron-LM's
 * sequence parallelism; the memory below assumes it). Full recomputation repeats the forward's 2
 * in backward instead. The vocab-parallel embedding does 1 all-reduce forward, the LM head 1
 * backward. Not overlapped with compute.
 *
 * Context parallelism (cp > 1; Megatron-Core's context_parallel_size, run as Llama 3 does it:
 * Dubey et al. 2024, section 3.3.2). Each of the cp ranks of a sequence holds T / cp of its
 * tokens, load-balanced (the sequence cut into 2 cp chunks, rank i holding chunks i and
 * 2 cp - 1 - i, so that each does the same causal work). Embedding, norms, linears, MLP, head
 * and loss run on the local B x T / cp tokens, so their compute, memory traffic, activations,
 * tp collectives and pipeline messages are those of a micro-batch of T / cp tokens per sequence
 * (layer_cost.h). Attention takes the local queries against the whole sequence's keys and
 * values: 4 B (T / cp) T h FLOPs per rank, 1/cp of the sequence's. Before it, each block
 * all-gathers K and V over the cp group (after tp's head split: this tp rank's kv heads, 2 x B x
 * T/cp x kv_heads/tp x head size elements from each rank in the training dtype); backward
 * gathers them again (a micro-batch keeps only its own tokens' K and V, as the runtime does) and
 * reduce-scatters dK and dV, the same bytes; each is a ring, (cp-1)/cp x the gathered bytes at
 * the link's bandwidth x efficiency plus (cp-1) latencies, on the intra-node link when the
 * tp x cp ranks of a cp group share a node (tp fastest, then cp: they are consecutive), else the
 * inter-node one. Full recomputation gathers K and V once more for the recomputed forward.
 * Overlap assumption: none. Megatron-Core's ring attention (p2p) hides its K/V exchange under
 * the attention of the chunk before; the all-gather version runs before the attention that
 * needs it, and Llama 3 chose it knowing its latency is exposed in the critical path, because
 * with grouped-query attention the K and V are much smaller than Q and the attention's
 * O(T^2) compute dwarfs the O(T) gather (Dubey et al. 2024, 3.3.2). So the gather and the
 * reduce-scatter add to the block's forward and backward time. Memory per rank: the block's
 * activations of its T / cp tokens, plus, in the workspace, the gathered K and V of the block
 * being computed and their gradient (the stage's two working buffers). The weights are replicated over dp x cp:
 * the gradient reduction and ZeRO (below) run over the dp x cp ranks (tp x cp x dp consecutive
 * ranks hold one pipeline rank's replicas). The global batch is still dp x micro-batch x
 * micro-batches sequences of T tokens; model FLOPs per step count every cp rank's share.
 *
 * Pipeline. Each stage boundary sends B x T/cp x C activations (divided by tp with sequence
 * parallelism, which scatters them over the tp ranks) in forward and the same gradient back;
 * ranks are placed tp fastest, then cp, then dp, then pp, so a boundary stays inside a node only
 * when both pp ranks' blocks of tp x cp x dp ranks share one. The slowest boundary's transfer
 * time is the simulator's point-to-point latency. The pipeline time is mp_schedule_simulate of
 * the generated schedule with these per-stage durations: the same code `mpengine schedule`
 * draws.
 *
 * Data parallelism. Each pipeline rank reduces its gradients (fp32, 4 bytes per parameter) over
 * its d = dp x cp replicas: a ring all-reduce 2(d-1)/d x bytes, or with ZeRO-1 a reduce-scatter
 * of the gradients plus an all-gather of the bf16 weights ((d-1)/d each), on the inter-node link
 * unless the whole dp x cp group sits in one node. Overlap assumption: gradients are bucketed
 * and reduced as the last micro-batch's backward produces them, so the duration of the rank's
 * last backward (all its chunks) is hidden, and so is the time the rank idles after its last
 * action while other ranks finish the pipeline; the rest is exposed. On CPU ranks (a cluster with
 * cores_per_node) nothing is hidden: Open MPI copies and reduces on the cores that compute and
 * progresses a collective only inside MPI calls. Links reach bandwidth x efficiency here too. With
 * a tied LM head and pp > 1 the first and last pipeline rank then all-reduce the token table's
 * gradient between them (fp32, their tp shard), exposed. Then the optimizer step, memory-bound at
 * the reachable bandwidth: 30 bytes per parameter (fp32 gradient, master weight, Adam m and v
 * read, the three written back, bf16 weights written), the optimizer part divided by dp with
 * ZeRO-1.
 * Step time = pipeline time + the largest (exposed dp + optimizer) over pipeline ranks.
 *
 * Memory per rank (mixed precision on a bf16 device: 2 B bf16 weights, 4 B fp32 gradients, 12 B
 * fp32 master weights and Adam m, v per parameter, the 12 B divided by dp x cp with ZeRO-1; fp32
 * on an fp32 device: 4 + 4 + 8). Parameters are divided by tp (norms too: a small overcount
 * ignored).
 * With a tied LM head and pp > 1 the last stage keeps its own copy of the token table, with its
 * gradients and optimizer state (Megatron's). Activations: layer_cost's bytes for the recompute
 * mode; of a block's, the 4 (B, T, C) norm inputs and outputs (with full recomputation the one
 * input kept) are replicated over tp unless sequence parallelism splits them, the rest is split by
 * tp (with dropout, the two residual masks are replicated too; layer_cost.h's
 * activation_replicated_bytes); the LM head's logits are split by tp (vocab-parallel). The
 * simulator's peak activation memory per rank (the schedule's live micro-batches times each stage's bytes) is used. Workspace:
 * the cluster's "workspace_gib" when it gives one, else 5% of device memory (CUDA context,
 * communication buffers, allocator fragmentation). A CPU rank's process needs about 170 MiB before
 * it holds any model (the libraries it maps, cuBLAS's among them, OpenBLAS's buffers, Open MPI's
 * shared memory): measured VmHWM of tiny-gpt ranks was 172-174 MiB whatever the layout, where 5% of
 * cpu-local's 2 GiB said 102 MiB. So `mpengine calibrate` measures its own resident memory and
 * writes it as cpu-local's workspace_gib. CPU ranks with dp > 1 hold one more copy of their
 * gradients while the all-reduces are in flight (mp_cost_dp_transient_bytes: gpt2-124m at dp = 2
 * peaked 492 MiB above the one-rank run, its gradients being 475 MiB); it is counted in the
 * workspace.
 *
 * Expert parallelism (ep > 1; Megatron-Core's expert_model_parallel_size with "parallel
 * folding": the experts use tp x ep x expert-dp x pp over the ranks attention uses as
 * tp x cp x dp x pp, expert-tp = tp here). A mixture-of-experts block's E experts are split over
 * groups of ep of the dp x cp ranks that share the other weights: each rank holds E / ep of them
 * (their weights, gradients and optimizer state), tp-split as a dense MLP is. The ep group of a
 * rank is ep consecutive dp-cp ranks (Megatron's order tp-ep-dp-pp for the experts: tp fastest,
 * so an ep group spans tp x ep consecutive world ranks); the expert-data-parallel group, which
 * sums the experts' gradients and over which ZeRO shards their state, is the dp x cp / ep ranks
 * with the same ep rank. Per MoE block and micro-batch the token dispatcher does 4 all-to-alls
 * (forward: dispatch and combine; backward: their gradients), each of this rank's routed copies
 * (B x T/cp x k x C elements in the training dtype, mp_layer_cost's dispatch_bytes; a tp rank
 * sends them all unless sequence parallelism cut them by tp), of which (ep-1)/ep leave the rank:
 * (ep-1)/ep x bytes / (bandwidth x efficiency) + (ep-1) latencies, on the intra-node link when
 * the tp x ep ranks of a group share a node, else on the inter-node one (all of it: the part that
 * stays inside a node is not credited). Full recomputation repeats the forward's 2 in backward.
 * Exposed, like the cp collectives (Megatron 0.9 overlaps none of them by default). The counts
 * exchanged before each dispatch (E integers) are not modelled. The expert GEMMs are the
 * grouped products layer_cost.h lists: E / ep experts of ep x B x T/cp x k / E rows each, each
 * its own GEMM on the cluster's efficiency curve (so small experts run below peak). Memory and
 * the data-parallel step: the experts' parameters (expert_params) count 1/ep on a rank, their
 * gradients reduce over the expert-data-parallel group (a ring over dp x cp / ep ranks, on the
 * dp group's link: it spans the same ranks), and ZeRO divides their optimizer state (and, by
 * stage, gradients and weights) by dp x cp / ep instead of dp x cp; the optimizer step of a
 * rank's experts runs on its expert shard. Not modelled: load imbalance between experts (the
 * routing is taken as balanced: dropless, each expert the average rows).
 *
 * Shared cores (a cluster with "cores_per_node", cpu-local once calibrated; cluster.h). The D
 * ranks of the fullest node (min(dp x cp x pp x tp, devices_per_node)) share its cores: each rank's
 * GEMMs run at the one-thread peak times its BLAS threads (mp_cluster_threads_per_device: `run`
 * gives each rank floor(cores / D) of them, at least 1), the rest of its work on one thread, and
 * every time of the rank (its layers' compute and tp collectives, the point-to-point transfer,
 * the dp reduction and the optimizer) is multiplied by mp_cluster_compute_slowdown
 * (max(1, D x threads / cores)): ranks beyond the cores take turns on them, and a rank waiting
 * for a message spins (engine/comm/comm_mpi.c), so it takes its turn too. Messages are included
 * because a shared-memory message is a copy a core makes: `mpirun -np 8 bench comm` on 2 cores
 * measured send/recv 2.4x (4 MiB) to 5.5x (1 KiB) slower than with 2 ranks. This is applied to
 * mp_cost_layer's times by mp_cost_layer_on_node, and to the pipeline's and the data-parallel
 * times in mp_cost_estimate; mp_cost_layer itself is one rank alone on its processor.
 */
#ifndef MPENGINE_TOPOLOGY_COST_MODEL_H
#define MPENGINE_TOPOLOGY_COST_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "topology/cluster.h"
#include "topology/layer_cost.h"
#include "topology/model.h"
#include "topology/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_COST_MAX_STAGES = 1024 };

#define MP_COST_WORKSPACE_FRACTION 0.05
#define MP_COST_OPTIMIZER_BYTES_PER_PARAM 30.0

/* ZeRO-2's reduce-scatter bucket for the tensors outside the blocks, in floats (the runtime's
 * MP_TRAINER_BUCKET_FLOATS, engine/train/trainer.h): with the one-block window, the largest of the two
 * bounds a rank's transient gradient buffers. */
#define MP_COST_ZERO2_BUCKET_FLOATS 4194304.0

/* One parallel layout: everything but the stage split. */
typedef struct {
  int dp, pp, tp, virtual_stages;
  int64_t micro_batch, num_micro_batches, seq_len;
  mp_schedule_kind schedule;
  mp_recompute recompute;
  bool sequence_parallel;
  /* ZeRO over dp (Rajbhandari et al. 2020): 0 replicated; 1 optimizer state sharded; 2 and
   * gradients (each block's reduce-scattered in each micro-batch's backward from a one-block
   * window, two alternating on GPUs so that it overlaps the next block's backward; the
   * embedding, final norm and head, whole until the step's end, reduce-scattered once, as
   * engine/train/trainer.h runs it);
   * 3 and the blocks' parameters (each block's gathered into a one-block window for its
   * forward, recomputed forward and backward in every micro-batch, torchtitan's
   * reshard_after_forward; on GPUs into two alternating windows, the next block's gather
   * prefetched while one computes; the embedding, final norm and head whole on every rank,
   * gathered once after the update). */
  int zero_stage;
  /* ZeRO 1 and 2 over groups of this many consecutive dp ranks, replicated across the groups
   * (HSDP): the state divides by it, the reduce-scatters and gathers run inside a group (on its
   * links: within a node when the group fits one) and each part is all-reduced across the
   * dp / zero_shard_size replicas. 0 or dp: all of dp. */
  int zero_shard_size;
  /* Context parallelism: the ranks that share each sequence, T / cp tokens each (0 or 1: none;
   * last, so that a layout written without it has none). The weights' replicas are dp x cp. */
  int cp;
  /* Expert parallelism: the ranks of dp x cp that split each MoE block's experts (0 or 1: none;
   * last, so that a layout written without it has none). It divides dp x cp and the experts. */
  int ep;
} mp_layout;

/* ep of layout: its ep, 1 when it is 0. */
int mp_layout_ep(const mp_layout *layout);

/* MP_OK when model can be laid out with expert parallelism ep: ep 1 always; ep > 1 needs a
 * mixture-of-experts block and every such block's experts a multiple of ep. Else MP_ERR_INPUT,
 * the message naming ep, the model file and the block ($.layers[i].moe.experts), unprefixed:
 * callers say where ep came from. */
mp_status mp_cost_check_ep(const mp_model *model, int ep, mp_error *err);

/* Whether layout's expert-parallel groups (tp x ep consecutive ranks) sit inside one node. */
bool mp_cost_ep_intra_node(const mp_cluster *cluster, const mp_layout *layout);

/* Seconds of one all-to-all over ranks devices of which each sends bytes in all (its share to
 * itself included): (n-1)/n of the bytes cross the link, plus (n-1) latencies; 0 for
 * ranks <= 1. */
double mp_cost_alltoall_seconds(double bytes, int ranks, double bandwidth, double latency);

/* cp of layout: its cp, 1 when it is 0. */
int mp_layout_cp(const mp_layout *layout);

/* The ranks that hold the same weights and sum their gradients: dp x cp. */
int mp_layout_replicas(const mp_layout *layout);

/* The ranks layout's ZeRO state is divided over: zero_shard_size (HSDP, cp 1), or dp x cp. */
int mp_layout_zero_shard(const mp_layout *layout);

/* The ranks the experts' ZeRO state is divided over and their gradients summed over (the
 * expert-data-parallel group): mp_layout_zero_shard / ep. */
int mp_layout_expert_shard(const mp_layout *layout);

/* One layer on one tp rank for one micro-batch. */
typedef struct {
  double forward_compute_s;  /* GEMMs + elementwise */
  double backward_compute_s; /* GEMMs + elementwise + recomputation */
  double recompute_s;        /* the recomputation part of backward_compute_s */
  double forward_tp_s;       /* tensor-parallel collectives */
  double backward_tp_s;
  double forward_cp_s;       /* context parallelism: the K and V all-gather */
  double backward_cp_s;      /* the K and V all-gather again and the dK and dV reduce-scatter
                                (and with full recomputation the recomputed forward's
                                all-gather) */
  double params;             /* parameters held by one tp rank */
  double activation_bytes;   /* kept from forward to backward, one tp (and cp) rank */
  double cp_buffer_bytes;    /* held only while the layer computes, cp > 1: the whole
                                sequence's K and V and their gradient, one tp rank */
  double cp_gather_bytes;    /* cp > 1: the K and V one all-gather collects, one tp rank */
  double attention_scratch_bytes; /* held only while the layer's backward runs: the unfused
                                     attention's two score-sized matrices, one tp rank */
  double forward_ep_s;       /* expert parallelism: the dispatch and combine all-to-alls */
  double backward_ep_s;      /* their gradients' (and with full recomputation the recomputed
                                forward's) */
  double expert_params;      /* of params, this rank's experts (E / ep of them, one tp rank's) */
  double ep_dispatch_bytes;  /* ep > 1: one all-to-all's bytes from this rank */
  double model_flops;        /* forward + backward FLOPs of the whole layer (no recompute) */
} mp_layer_time;

/* Everything one layer's micro-batch costs a rank: compute, tp and cp collectives, forward and
 * backward; what the partitioner balances. */
double mp_layer_time_seconds(const mp_layer_time *time);

/* Bytes per parameter under mixed precision on this cluster (see the top of this file). */
typedef struct {
  double weights, grads, optimizer;
} mp_state_bytes;
mp_state_bytes mp_cost_state_bytes(const mp_cluster *cluster);
/* The same per parameter of a rank under layout's ZeRO stage: the optimizer state (1 and up),
 * the gradients (2 and up) and the weights (3) divided over dp. */
mp_state_bytes mp_cost_sharded_state_bytes(const mp_cluster *cluster, const mp_layout *layout);
/* Bytes of a rank's weights, gradients and optimizer state (sharded as layout's ZeRO stage
 * shards them) for params parameters of which expert_params are experts (sharded over
 * mp_layout_expert_shard instead of mp_layout_zero_shard): what the planner's bounds and the
 * estimate's memory count for the parameter state. */
mp_state_bytes mp_cost_rank_state_bytes(const mp_cluster *cluster, const mp_layout *layout,
                                        double params, double expert_params);

/* Activation element size: 2 on a bf16 device, 4 on an fp32 one. */
int mp_cost_activation_bytes_per_element(const mp_cluster *cluster);

/* Seconds of one ring all-reduce of bytes over ranks devices on a link (2(n-1)/n of the bytes
 * plus 2(n-1) latencies); 0 for ranks <= 1. */
double mp_cost_allreduce_seconds(double bytes, int ranks, double bandwidth, double latency);

/* Seconds of one ring all-gather (or reduce-scatter) over ranks devices whose gathered buffer
 * (the reduce-scatter's input) is bytes: (n-1)/n of the bytes plus (n-1) latencies; 0 for
 * ranks <= 1. */
double mp_cost_allgather_seconds(double bytes, int ranks, double bandwidth, double latency);

/* Whether layout's cp groups sit inside one node (tp x cp consecutive ranks), so that their
 * collectives run on the intra-node link. */
bool mp_cost_cp_intra_node(const mp_cluster *cluster, const mp_layout *layout);

/* Seconds of the memory-bound AdamW step over params parameters of one rank under layout (only
 * dp and the ZeRO stage matter, and the shared-core slowdown): MP_COST_OPTIMIZER_BYTES_PER_PARAM
 * bytes each, less the moments ZeRO-1 leaves to other dp ranks, at the reachable bandwidth. */
double mp_cost_optimizer_seconds(const mp_cluster *cluster, const mp_layout *layout,
                                 double params);
/* The same for a rank holding params parameters of which expert_params are experts, whose
 * update runs on their expert shard (mp_layout_expert_shard). */
double mp_cost_rank_optimizer_seconds(const mp_cluster *cluster, const mp_layout *layout,
                                      double params, double expert_params);

/* The costs of one layer under a layout (only tp, cp, ep, micro_batch, seq_len, recompute and
 * sequence_parallel matter), on a device that is its own processor (no shared cores). */
void mp_cost_layer(const mp_cluster *cluster, const mp_layer_spec *layer, const mp_layout *layout,
                   mp_layer_time *out);

/* ---- ranks sharing a node's cores ("Shared cores" above) ---- */

/* mp_cluster_compute_slowdown for the ranks of layout on its fullest node (1 on a cluster without
 * cores_per_node, or with dp, pp or tp unset). */
double mp_cost_compute_slowdown(const mp_cluster *cluster, const mp_layout *layout);

/* mp_cost_layer as a rank of layout sees it on its node: GEMMs on the BLAS threads `run` gives
 * it, every time multiplied by mp_cost_compute_slowdown. Equal to mp_cost_layer on a cluster
 * without cores_per_node. What mp_cost_estimate, mp_cost_partition_costs and the planner use. */
void mp_cost_layer_on_node(const mp_cluster *cluster, const mp_layer_spec *layer,
                           const mp_layout *layout, mp_layer_time *out);

/* Bytes of a rank's workspace: the cluster's workspace_bytes, else MP_COST_WORKSPACE_FRACTION of
 * its device memory. */
double mp_cost_workspace_bytes(const mp_cluster *cluster);

/* Bytes a rank with dp > 1 holds while its gradients' all-reduces are in flight, besides the
 * gradients: on CPU ranks (a cluster with cores_per_node) grads_bytes, the temporaries of Open
 * MPI's non-blocking all-reduces, which engine/train/trainer.c posts for all its buckets at once; 0
 * elsewhere (NCCL reduces in place). Counted in the rank's workspace. */
double mp_cost_dp_transient_bytes(const mp_cluster *cluster, double grads_bytes);

/* The prediction for one layout with one stage split, per pipeline rank and as a whole. */
typedef struct {
  double compute_s;      /* forward + backward + recomputation, whole step */
  double recompute_s;    /* of which recomputation */
  double tp_comm_s;      /* tensor-parallel collectives, whole step */
  double cp_comm_s;      /* context-parallel K/V all-gathers and reduce-scatters, whole step */
  double ep_comm_s;      /* expert-parallel all-to-alls, whole step */
  double idle_s;         /* pipeline time - busy: bubble and point-to-point waits */
  double dp_comm_s;      /* gradient reduction, whole (on the first and last pipeline rank of a
                            tied head with pp > 1, with the token table's sum between them) */
  double dp_exposed_s;   /* of which not hidden */
  double optimizer_s;
  double end_wait_s;     /* waiting for the slowest rank's gradient reduction and optimizer */
  double weights_bytes, grads_bytes, optimizer_bytes, activation_bytes, workspace_bytes;
  double memory_bytes;   /* the sum of the five */
  double zero_gather_bytes, zero_reduce_scatter_bytes; /* ZeRO's dp traffic a step, per rank */
  int peak_live;         /* (micro-batch, chunk) activation sets alive at once */
  int first_stage;       /* the stages of chunk 0 .. v-1: first_stage + c * pp */
} mp_rank_estimate;

typedef struct {
  mp_layout layout;
  int num_stages;                         /* pp x virtual_stages */
  int layers_per_stage[MP_COST_MAX_STAGES];
  double stage_forward_s[MP_COST_MAX_STAGES];  /* one micro-batch, compute + tp comm */
  double stage_backward_s[MP_COST_MAX_STAGES];
  double stage_weight_gradient_s[MP_COST_MAX_STAGES]; /* zero-bubble's W: the part of
                                          stage_backward_s that is weight gradients; its B (input
                                          gradient) is the rest */
  double stage_activation_bytes[MP_COST_MAX_STAGES]; /* kept per alive micro-batch, one tp rank */
  double p2p_s;                           /* one activation transfer at the slowest boundary */
  bool p2p_inter_node;
  /* cp > 1: one block's K/V all-gather in forward and its backward's collectives (the
   * re-gather and the reduce-scatter, and the recomputed forward's gather with full
   * recomputation), one micro-batch, the costliest block's; on the inter-node link unless the tp x cp ranks of a cp group share a node. */
  double cp_layer_forward_s, cp_layer_backward_s;
  double cp_layer_gather_bytes;           /* the gathered K and V of one block, one rank */
  bool cp_inter_node;
  /* ep > 1: one MoE block's all-to-alls in forward (dispatch, combine) and backward, one
   * micro-batch, the costliest block's; the bytes one all-to-all sends from a rank. */
  double ep_layer_forward_s, ep_layer_backward_s;
  double ep_layer_dispatch_bytes;
  bool ep_inter_node;
  double pipeline_s;                      /* simulated */
  double step_s;                          /* pipeline + the largest dp exposed + optimizer */
  double bubble_fraction;                 /* the simulator's, of the pipeline time */
  double tokens_per_s;
  double model_flops_per_step;            /* 3 x forward, no recomputation */
  double tflops_per_gpu;                  /* model FLOPs / step / GPUs, in TFLOP/s */
  double mfu;                             /* of the training dtype's peak */
  double memory_bytes;                    /* the fullest rank */
  double capacity_bytes;
  bool fits;
  mp_rank_estimate ranks[MP_COST_MAX_STAGES]; /* (pp) */
} mp_estimate;

/* Per-layer time for the stage split: forward + backward (with tp communication) of one
 * micro-batch, the cost the partitioner balances. costs has mp_model_num_layers entries. */
void mp_cost_partition_costs(const mp_cluster *cluster, const mp_model *model,
                             const mp_layout *layout, double *costs);

/* Predicts one layout with the stage split layers_per_stage (pp x virtual_stages counts summing
 * to the model's layers; NULL: the partitioner's best split). Generates the schedule, simulates
 * it and fills *out (which is large: allocate it). Fails with MP_ERR_INPUT when the layout does not
 * fit the model (sizes, a split of the wrong length, a schedule that cannot run these numbers),
 * saying why. */
/* mp_cost_estimate of a plan as written (topology/plan.h): its layout, schedule, cluster, model
 * (model, or when NULL the plan's model file) and layers_per_stage (the partitioner's split when
 * the plan has none). Errors are prefixed with the plan file (and the JSON path where one is at
 * fault). */
mp_status mp_cost_estimate_plan(const mp_plan *plan, const mp_model *model, mp_estimate *out,
                                mp_error *err);

/* The simulator's durations (seconds) and memory (bytes) per stage from an estimate: F, B, and
 * for zero-bubble the input-gradient B and weight-gradient W; the p2p latency of one activation.
 * What mp_cost_estimate simulates, and `mpengine schedule --config` draws. MP_ERR_RUNTIME when out
 * of memory; free with mp_sim_costs_free. */
mp_status mp_cost_sim_costs(const mp_estimate *estimate, mp_sim_costs *out, mp_error *err);

mp_status mp_cost_estimate(const mp_cluster *cluster, const mp_model *model,
                           const mp_layout *layout, const int *layers_per_stage,
                           mp_estimate *out, mp_error *err);

/* mp_cost_estimate with the layout's schedule already generated and checked once (the planner
 * times one schedule for every layout that shares its kind, pp, micro-batches and virtual
 * stages): prepared is mp_sim_prepare (schedules/simulator.h, eager point-to-point) of
 * mp_schedule_generate(layout->schedule, pp, num_micro_batches, virtual_stages). The same *out, to
 * the bit. Fails with MP_ERR_INPUT as mp_cost_estimate does, and when prepared is another
 * schedule. */
mp_status mp_cost_estimate_prepared(const mp_cluster *cluster, const mp_model *model,
                                    const mp_layout *layout, const int *layers_per_stage,
                                    const mp_sim_prepared *prepared, mp_estimate *out,
                                    mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_COST_MODEL_H */
