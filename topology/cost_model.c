/* topology/cost_model.c — the planner's cost and memory model; the model itself is stated in
 * cost_model.h. */
#include "topology/cost_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedules/simulator.h"
#include "topology/partition.h"

mp_state_bytes mp_cost_state_bytes(const mp_cluster *cluster) {
  mp_state_bytes bytes;
  if (mp_cluster_training_dtype(cluster) == MP_DTYPE_BF16) {
    bytes.weights = 2.0;
    bytes.grads = 4.0;
    bytes.optimizer = 12.0;
  } else {
    bytes.weights = 4.0; /* fp32 weights are the master weights */
    bytes.grads = 4.0;
    bytes.optimizer = 8.0;
  }
  return bytes;
}

int mp_cost_activation_bytes_per_element(const mp_cluster *cluster) {
  return mp_cluster_training_dtype(cluster) == MP_DTYPE_BF16 ? 2 : 4;
}

double mp_cost_allreduce_seconds(double bytes, int ranks, double bandwidth, double latency) {
  if (ranks <= 1 || bytes <= 0.0) return 0.0;
  const double n = (double)ranks;
  return 2.0 * (n - 1.0) / n * bytes / bandwidth + 2.0 * (n - 1.0) * latency;
}

double mp_cost_allgather_seconds(double bytes, int ranks, double bandwidth, double latency) {
  if (ranks <= 1 || bytes <= 0.0) return 0.0;
  const double n = (double)ranks;
  return (n - 1.0) / n * bytes / bandwidth + (n - 1.0) * latency;
}

int mp_layout_cp(const mp_layout *layout) { return layout->cp > 1 ? layout->cp : 1; }

int mp_layout_ep(const mp_layout *layout) { return layout->ep > 1 ? layout->ep : 1; }

double mp_cost_alltoall_seconds(double bytes, int ranks, double bandwidth, double latency) {
  /* Each rank keeps 1/n of its bytes and exchanges the rest with the n-1 others: the bytes an
   * all-gather of the same buffer moves, and as many latencies. */
  return mp_cost_allgather_seconds(bytes, ranks, bandwidth, latency);
}

bool mp_cost_ep_intra_node(const mp_cluster *cluster, const mp_layout *layout) {
  return mp_cluster_same_node(cluster, 0, layout->tp * mp_layout_ep(layout) - 1);
}

mp_status mp_cost_check_ep(const mp_model *model, int ep, mp_error *err) {
  if (ep <= 1) return MP_OK;
  const mp_layer_spec *first = mp_model_first_moe_layer(model);
  if (first == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "ep %d splits the experts of mixture-of-experts blocks over ranks, but model "
                   "%s (%s) has no such block; use ep 1",
                   ep, mp_model_name(model), mp_model_source(model));
  }
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *layer = mp_model_layer(model, i);
    if (mp_layer_is_moe(layer) && layer->moe.experts % ep != 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "ep %d does not divide the %lld experts of %s (%s: $.layers[%d].moe.experts); "
                     "each expert-parallel rank holds experts / ep whole experts",
                     ep, (long long)layer->moe.experts, layer->name, mp_model_source(model),
                     layer->json_index);
    }
  }
  return MP_OK;
}

int mp_layout_replicas(const mp_layout *layout) { return layout->dp * mp_layout_cp(layout); }

bool mp_cost_cp_intra_node(const mp_cluster *cluster, const mp_layout *layout) {
  return mp_cluster_same_node(cluster, 0, layout->tp * mp_layout_cp(layout) - 1);
}

double mp_layer_time_seconds(const mp_layer_time *t) {
  return t->forward_compute_s + t->backward_compute_s + t->forward_tp_s + t->backward_tp_s +
         t->forward_cp_s + t->backward_cp_s + t->forward_ep_s + t->backward_ep_s;
}

/* Seconds of one GEMM shape on one tp rank: the roofline of its FLOPs, at peak x the efficiency
 * of one launch of that many FLOPs (a batched product is one launch; a wide one, an LM head, at
 * the cluster's wide_gemm_efficiency of that), and of its bytes (both operands and the result, in
 * activation elements) at the memory bandwidth. A thin product (the attention ones, whose K or N
 * is the head size) is memory-bound on a GPU. */
static double gemm_shape_seconds(const mp_cluster *cluster, const mp_gemm_shape *g, double tp,
                                 int elem) {
  double n = g->n, k = g->k, batch = g->batch;
  switch (g->split) {
    case MP_GEMM_SPLIT_N: n /= tp; break;
    case MP_GEMM_SPLIT_K: k /= tp; break;
    case MP_GEMM_SPLIT_BATCH: batch /= tp; break;
    case MP_GEMM_SPLIT_NONE: break;
  }
  const double flops = 2.0 * g->m * n * k * batch;
  if (!(flops > 0.0)) return 0.0;
  /* A grouped product (the experts) is batch GEMMs, each at the efficiency of its own size. */
  double compute =
      g->grouped ? batch * mp_cluster_gemm_seconds(cluster, mp_cluster_training_dtype(cluster),
                                                   flops / batch)
                 : mp_cluster_gemm_seconds(cluster, mp_cluster_training_dtype(cluster), flops);
  if (!g->attention_core && mp_cluster_wide_gemm(k, n)) {
    compute /= mp_cluster_wide_gemm_efficiency(cluster);
  }
  const double bytes = batch * (g->m * k + k * n + g->m * n) * elem;
  return fmax(compute, bytes / mp_cluster_memory_bandwidth(cluster));
}

void mp_cost_layer(const mp_cluster *cluster, const mp_layer_spec *layer, const mp_layout *layout,
                   mp_layer_time *out) {
  memset(out, 0, sizeof *out);
  const int elem = mp_cost_activation_bytes_per_element(cluster);
  /* Our CUDA backend (bf16) runs flash attention, the CPU backend (fp32) the unfused products. */
  const int cp = mp_layout_cp(layout), ep = mp_layout_ep(layout);
  const mp_cost_shape shape = {layout->micro_batch, layout->seq_len, elem,
                               mp_cluster_training_dtype(cluster) == MP_DTYPE_BF16, cp, ep};
  mp_layer_cost cost;
  mp_layer_cost_compute(layer, &shape, &cost);
  const double t = (double)layout->tp;
  const bool sp = layout->sequence_parallel;
  /* This cp rank's tokens: the tp collectives move (B, T / cp, C). */
  const double tokens = (double)layout->micro_batch * (double)layout->seq_len / (double)cp;
  const double bsh = tokens * (double)layer->hidden * elem; /* one (B, T, C) tensor */
  const double memory_bw = mp_cluster_memory_bandwidth(cluster);

  /* GEMMs: the backward's input and weight gradients are each a product of the forward's size. */
  double forward_gemm = 0.0, attention_gemm = 0.0;
  for (int i = 0; i < cost.num_gemms; ++i) {
    const double seconds = gemm_shape_seconds(cluster, &cost.gemms[i], t, elem);
    forward_gemm += seconds;
    if (cost.gemms[i].attention_core) attention_gemm += seconds;
  }
  /* A layer known only by its FLOPs (custom): one GEMM of them. */
  const mp_dtype dtype = mp_cluster_training_dtype(cluster);
  if (cost.num_gemms == 0) {
    forward_gemm = mp_cluster_gemm_seconds(cluster, dtype, cost.forward_flops / t);
  }
  double backward_gemm = cost.num_gemms == 0
                             ? mp_cluster_gemm_seconds(cluster, dtype, cost.backward_flops / t)
                             : 2.0 * forward_gemm;
  /* Flash attention: its backward recomputes the scores and does 4 products, 2.5 x the forward's
   * FLOPs (Dao 2023); the heads are split over tp. */
  const double flash_forward =
      cost.flash_attention_flops / t / mp_cluster_flash_attention_flops_per_s(cluster);
  forward_gemm += flash_forward;
  backward_gemm += 2.5 * flash_forward;
  /* Memory-bound kernels, each at the roofline of its bytes and its vector FLOPs: tp splits one
   * part, sequence parallelism the other too. */
  const double replicated_share = sp ? 1.0 / t : 1.0;
  const double vector_rate = mp_cluster_vector_flops_per_s(cluster);
  const double scalar_rate = mp_cluster_scalar_flops_per_s(cluster);
  double forward_memory = 0.0, backward_memory = 0.0, attention_memory = 0.0;
  for (int i = 0; i < cost.num_kernels; ++i) {
    const mp_elementwise_kernel *k = &cost.kernels[i];
    const double share = k->split ? 1.0 / t : replicated_share;
    const double rate = k->scalar ? scalar_rate : vector_rate;
    const double seconds = share * fmax(k->bytes / memory_bw, k->vector_flops / rate);
    if (k->backward) {
      backward_memory += seconds;
    } else {
      forward_memory += seconds;
      if (k->attention) attention_memory += seconds;
    }
  }
  out->forward_compute_s = forward_gemm + forward_memory;
  switch (layout->recompute) {
    case MP_RECOMPUTE_NONE: out->recompute_s = 0.0; break;
    case MP_RECOMPUTE_SELECTIVE: out->recompute_s = attention_gemm + attention_memory; break;
    case MP_RECOMPUTE_FULL: out->recompute_s = out->forward_compute_s; break;
    case MP_RECOMPUTE_COUNT: break;
  }
  out->backward_compute_s = backward_gemm + backward_memory + out->recompute_s;
  out->model_flops = cost.forward_flops + cost.backward_flops;
  /* This rank's experts: E / ep of them. */
  out->expert_params = (double)cost.expert_params / ep / t;
  out->params = ((double)cost.params - (double)cost.expert_params) / t + out->expert_params;
  out->attention_scratch_bytes = cost.attention_scratch_bytes / t;

  const double ar = mp_cost_allreduce_seconds(bsh, layout->tp,
                                              mp_cluster_link_bandwidth(cluster, true),
                                              mp_cluster_collective_latency(cluster, true));
  const double kept = cost.activation_bytes[layout->recompute];
  const double replicated = cost.activation_replicated_bytes[layout->recompute];
  out->activation_bytes = (kept - replicated) / t + replicated * replicated_share;
  switch (layer->kind) {
    case MP_LAYER_TRANSFORMER: {
      out->forward_tp_s = 2.0 * ar;
      out->backward_tp_s = 2.0 * ar;
      if (layout->recompute == MP_RECOMPUTE_FULL) {
        out->backward_tp_s += 2.0 * ar;
      } else if (sp) {
        /* Sequence parallelism keeps only this rank's slice of the column-parallel linears'
         * inputs, so backward all-gathers both again for the weight gradients (Megatron-LM). */
        out->backward_tp_s += ar;
      }
      /* Context parallelism: this tp rank's kv heads of the whole sequence, gathered in forward,
       * gathered again in backward (a micro-batch keeps its own tokens' only) and their
       * gradients reduce-scattered (a ring each, the same bytes), exposed (cost_model.h); full
       * recomputation's forward gathers once more. One block's gathered K and V and their
       * gradient are the stage's working buffers. */
      const double kv = cost.kv_gather_bytes / t;
      const bool intra = mp_cost_cp_intra_node(cluster, layout);
      const double gather =
          mp_cost_allgather_seconds(kv, cp, mp_cluster_link_bandwidth(cluster, intra),
                                    mp_cluster_collective_latency(cluster, intra));
      const bool full = layout->recompute == MP_RECOMPUTE_FULL;
      out->forward_cp_s = gather;
      out->backward_cp_s = full ? 3.0 * gather : 2.0 * gather;
      out->cp_buffer_bytes = 2.0 * kv;
      out->cp_gather_bytes = cp > 1 ? kv : 0.0;
      /* Expert parallelism: dispatch and combine forward, their gradients backward (and the
       * recomputed forward's two with full recomputation), exposed (cost_model.h). */
      if (ep > 1 && cost.dispatch_bytes > 0.0) {
        const double bytes = cost.dispatch_bytes / (sp ? t : 1.0);
        const bool ep_intra = mp_cost_ep_intra_node(cluster, layout);
        const double a2a =
            mp_cost_alltoall_seconds(bytes, ep, mp_cluster_link_bandwidth(cluster, ep_intra),
                                     mp_cluster_collective_latency(cluster, ep_intra));
        out->forward_ep_s = 2.0 * a2a;
        out->backward_ep_s = full ? 4.0 * a2a : 2.0 * a2a;
        out->ep_dispatch_bytes = bytes;
      }
      break;
    }
    case MP_LAYER_EMBEDDING: out->forward_tp_s = ar; break;
    case MP_LAYER_LM_HEAD: out->backward_tp_s = ar; break;
    case MP_LAYER_LAYERNORM:
    case MP_LAYER_CUSTOM: break;
  }
}

int mp_layout_zero_shard(const mp_layout *layout) {
  const int s = layout->zero_shard_size; /* HSDP: groups of s of the dp ranks (cp 1) */
  return s > 0 && s < layout->dp ? s : mp_layout_replicas(layout);
}

int mp_layout_expert_shard(const mp_layout *layout) {
  const int shard = mp_layout_zero_shard(layout), ep = mp_layout_ep(layout);
  return shard % ep == 0 ? shard / ep : 1;
}

/* The state bytes per parameter when ZeRO divides by shard ranks. */
static mp_state_bytes state_sharded_over(const mp_cluster *cluster, const mp_layout *layout,
                                         int shard) {
  mp_state_bytes state = mp_cost_state_bytes(cluster);
  const double d = shard > 1 ? (double)shard : 1.0;
  if (layout->zero_stage >= 1) state.optimizer /= d;
  if (layout->zero_stage >= 2) state.grads /= d;
  if (layout->zero_stage >= 3) state.weights /= d;
  return state;
}

mp_state_bytes mp_cost_rank_state_bytes(const mp_cluster *cluster, const mp_layout *layout,
                                        double params, double expert_params) {
  const mp_state_bytes dense = state_sharded_over(cluster, layout, mp_layout_zero_shard(layout));
  const mp_state_bytes experts =
      state_sharded_over(cluster, layout, mp_layout_expert_shard(layout));
  const double others = params - expert_params;
  mp_state_bytes bytes = {others * dense.weights + expert_params * experts.weights,
                          others * dense.grads + expert_params * experts.grads,
                          others * dense.optimizer + expert_params * experts.optimizer};
  return bytes;
}

mp_state_bytes mp_cost_sharded_state_bytes(const mp_cluster *cluster, const mp_layout *layout) {
  return state_sharded_over(cluster, layout, mp_layout_zero_shard(layout));
}

/* mp_cost_optimizer_seconds with ZeRO over shard ranks. */
static double optimizer_seconds_over(const mp_cluster *cluster, const mp_layout *layout,
                                     double params, int shard) {
  const mp_state_bytes state = mp_cost_state_bytes(cluster);
  const double d = (double)shard;
  /* ZeRO-1: each rank reads and writes only its 1/dp of the fp32 moments' state; ZeRO-2 and 3:
   * the whole update (gradients, master weights, moments) runs on its 1/dp of the parameters. */
  const double bytes_per_param =
      layout->zero_stage >= 2 && d > 1
          ? MP_COST_OPTIMIZER_BYTES_PER_PARAM / d
          : MP_COST_OPTIMIZER_BYTES_PER_PARAM -
                (layout->zero_stage == 1 ? state.optimizer * 2.0 * (1.0 - 1.0 / d) : 0.0);
  return params * bytes_per_param / mp_cluster_memory_bandwidth(cluster) *
         mp_cost_compute_slowdown(cluster, layout);
}

double mp_cost_optimizer_seconds(const mp_cluster *cluster, const mp_layout *layout,
                                 double params) {
  return optimizer_seconds_over(cluster, layout, params, mp_layout_zero_shard(layout));
}

double mp_cost_rank_optimizer_seconds(const mp_cluster *cluster, const mp_layout *layout,
                                      double params, double expert_params) {
  return optimizer_seconds_over(cluster, layout, params - expert_params,
                                mp_layout_zero_shard(layout)) +
         optimizer_seconds_over(cluster, layout, expert_params, mp_layout_expert_shard(layout));
}

/* ---- ranks sharing a node's cores (cost_model.h, "Shared cores") -------------------------- */

/* The ranks of layout: dp x cp x pp x tp. */
static int layout_ranks(const mp_layout *layout) {
  return layout->dp * mp_layout_cp(layout) * layout->pp * layout->tp;
}

double mp_cost_compute_slowdown(const mp_cluster *cluster, const mp_layout *layout) {
  const int devices = mp_cluster_devices_on_node(cluster, layout_ranks(layout));
  return mp_cluster_compute_slowdown(cluster, devices);
}

void mp_cost_layer_on_node(const mp_cluster *cluster, const mp_layer_spec *layer,
                           const mp_layout *layout, mp_layer_time *out) {
  const int devices = mp_cluster_devices_on_node(cluster, layout_ranks(layout));
  const int threads = mp_cluster_threads_per_device(cluster, devices);
  if (threads > 1) {
    /* The rank's GEMMs run on its BLAS threads: the one-thread peak times the threads, at the
     * threads' measured efficiency. */
    mp_cluster threaded = *cluster;
    const double scale = threads * mp_cluster_blas_thread_efficiency(cluster, threads);
    for (int dtype = 0; dtype < MP_DTYPE_COUNT; ++dtype) {
      threaded.peak_flops_per_s[dtype] *= scale;
    }
    mp_cost_layer(&threaded, layer, layout, out);
  } else {
    mp_cost_layer(cluster, layer, layout, out);
  }
  const double slowdown = mp_cluster_compute_slowdown(cluster, devices);
  out->forward_compute_s *= slowdown;
  out->backward_compute_s *= slowdown;
  out->recompute_s *= slowdown;
  out->forward_tp_s *= slowdown;
  out->backward_tp_s *= slowdown;
  out->forward_cp_s *= slowdown;
  out->backward_cp_s *= slowdown;
  out->forward_ep_s *= slowdown;
  out->backward_ep_s *= slowdown;
}

double mp_cost_workspace_bytes(const mp_cluster *cluster) {
  if (cluster->workspace_bytes > 0) return (double)cluster->workspace_bytes;
  return MP_COST_WORKSPACE_FRACTION * (double)cluster->device_memory_bytes;
}

double mp_cost_dp_transient_bytes(const mp_cluster *cluster, double grads_bytes) {
  return cluster->cores_per_node > 0 ? grads_bytes : 0.0; /* CPU ranks: MPI on host memory */
}

void mp_cost_partition_costs(const mp_cluster *cluster, const mp_model *model,
                             const mp_layout *layout, double *costs) {
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    mp_layer_time time;
    mp_cost_layer_on_node(cluster, mp_model_layer(model, i), layout, &time);
    costs[i] = mp_layer_time_seconds(&time);
  }
}

/* The token table a tied LM head shares, in elements, or 0. */
static double tied_table_params(const mp_model *model) {
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *layer = mp_model_layer(model, i);
    if (layer->kind == MP_LAYER_LM_HEAD && layer->tie_embedding) {
      return (double)layer->vocab * (double)layer->hidden;
    }
  }
  return 0.0;
}

static mp_status check_layout(const mp_model *model, const mp_layout *l, mp_error *err) {
  if (l->dp < 1 || l->pp < 1 || l->tp < 1 || l->virtual_stages < 1 || l->micro_batch < 1 ||
      l->num_micro_batches < 1 || l->seq_len < 1 || l->cp < 0) {
    return mp_fail(err, MP_ERR_INPUT, "dp, cp, pp, tp, virtual stages, micro-batch, "
                                      "micro-batches and sequence length must all be at least 1");
  }
  const int cp = mp_layout_cp(l);
  if (cp > 1 && l->seq_len % (2 * cp) != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "cp %d needs the sequence length to be a multiple of 2 x cp = %d (each cp rank "
                   "holds 2 of 2 cp equal chunks of a sequence), but it is %lld",
                   cp, 2 * cp, (long long)l->seq_len);
  }
  const int ep = mp_layout_ep(l);
  if (l->ep < 0 || l->dp * cp % ep != 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "ep %d does not divide dp x cp = %d x %d = %d (the expert-parallel groups are "
                   "cut out of the dp x cp ranks)",
                   l->ep, l->dp, cp, l->dp * cp);
  }
  if (ep > 1 && l->zero_shard_size > 0 && l->zero_shard_size < l->dp) {
    return mp_fail(err, MP_ERR_INPUT,
                   "hybrid sharding (ZeRO over groups of %d of the %d dp ranks) is not modelled "
                   "with expert parallelism (ep %d)",
                   l->zero_shard_size, l->dp, ep);
  }
  MP_TRY(mp_cost_check_ep(model, ep, err));
  const int stages = l->pp * l->virtual_stages;
  if (stages > mp_model_num_layers(model) || stages > MP_COST_MAX_STAGES) {
    return mp_fail(err, MP_ERR_INPUT,
                   "pp x virtual stages = %d x %d = %d stages, but model %s has %d layers "
                   "(every stage needs one)",
                   l->pp, l->virtual_stages, stages, mp_model_name(model),
                   mp_model_num_layers(model));
  }
  return MP_OK;
}

mp_status mp_cost_sim_costs(const mp_estimate *estimate, mp_sim_costs *out, mp_error *err) {
  const int pp = estimate->layout.pp, v = estimate->layout.virtual_stages;
  memset(out, 0, sizeof *out);
  MP_TRY(mp_sim_costs_init_unit(out, pp, v, err));
  out->time_unit = MP_TIME_SECONDS;
  out->memory_unit = MP_MEMORY_BYTES;
  out->p2p_latency = estimate->p2p_s;
  for (int s = 0; s < estimate->num_stages; ++s) {
    const double b = estimate->stage_backward_s[s], w = estimate->stage_weight_gradient_s[s];
    out->duration[MP_ACTION_FORWARD][s] = estimate->stage_forward_s[s];
    out->duration[MP_ACTION_BACKWARD][s] = b;
    out->duration[MP_ACTION_BACKWARD_INPUT][s] = b - w;
    out->duration[MP_ACTION_BACKWARD_WEIGHT][s] = w;
    out->activation_memory[s] = estimate->stage_activation_bytes[s];
  }
  return MP_OK;
}

/* mp_cost_estimate, timing `prepared` (the layout's schedule, checked) when it is not NULL, else
 * generating and checking the schedule itself. */
static mp_status estimate_layout(const mp_cluster *cluster, const mp_model *model,
                                 const mp_layout *layout, const int *layers_per_stage,
                                 const mp_sim_prepared *prepared, mp_estimate *out,
                                 mp_error *err) {
  memset(out, 0, sizeof *out);
  MP_TRY(check_layout(model, layout, err));
  const int n = mp_model_num_layers(model);
  const int pp = layout->pp, v = layout->virtual_stages, stages = pp * v;
  const double m = (double)layout->num_micro_batches;
  out->layout = *layout;
  out->num_stages = stages;

  mp_layer_time *times = malloc(sizeof(mp_layer_time) * (size_t)n);
  double *costs = malloc(sizeof(double) * (size_t)n);
  if (times == NULL || costs == NULL) {
    free(times);
    free(costs);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory estimating a layout");
  }
  for (int i = 0; i < n; ++i) {
    mp_cost_layer_on_node(cluster, mp_model_layer(model, i), layout, &times[i]);
    costs[i] = mp_layer_time_seconds(&times[i]);
  }
  mp_status status = MP_OK;
  if (layers_per_stage != NULL) {
    int sum = 0;
    for (int s = 0; s < stages; ++s) {
      out->layers_per_stage[s] = layers_per_stage[s];
      if (layers_per_stage[s] < 1) {
        status = mp_fail(err, MP_ERR_INPUT, "layers_per_stage[%d] is %d; every stage needs a "
                                            "layer", s, layers_per_stage[s]);
      }
      sum += layers_per_stage[s];
    }
    if (status == MP_OK && sum != n) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "layers_per_stage sums to %d, but model %s has %d layers (embedding, "
                       "blocks, final norm and LM head each count one)",
                       sum, mp_model_name(model), n);
    }
  } else {
    double bottleneck = 0.0;
    status = mp_partition_chain(costs, n, stages, out->layers_per_stage, &bottleneck, err);
  }
  if (status != MP_OK) {
    free(times);
    free(costs);
    return status;
  }

  /* Per stage: durations, parameters, activations. */
  double stage_params[MP_COST_MAX_STAGES], stage_act[MP_COST_MAX_STAGES];
  double stage_compute[MP_COST_MAX_STAGES], stage_recompute[MP_COST_MAX_STAGES];
  double stage_tp[MP_COST_MAX_STAGES], stage_fwd_compute[MP_COST_MAX_STAGES];
  double stage_cp[MP_COST_MAX_STAGES];            /* the cp collectives, one micro-batch */
  double stage_ep[MP_COST_MAX_STAGES];            /* the ep all-to-alls, one micro-batch */
  double stage_expert_params[MP_COST_MAX_STAGES]; /* of stage_params, the experts' */
  double stage_cp_buffer[MP_COST_MAX_STAGES];     /* the largest layer's transient bytes */
  double stage_largest_layer[MP_COST_MAX_STAGES]; /* parameters of its largest layer */
  /* ZeRO-2: the blocks' parameters (their gradients pass through a one-block window) and the
   * largest block's; the rest (embedding, final norm, head) keeps whole gradients. */
  double stage_block_params[MP_COST_MAX_STAGES], stage_largest_block[MP_COST_MAX_STAGES];
  const int elem = mp_cost_activation_bytes_per_element(cluster);
  double model_flops = 0.0, boundary_bytes = 0.0;
  int layer = 0;
  for (int s = 0; s < stages; ++s) {
    double f = 0, b = 0, tpf = 0, tpb = 0, params = 0, act = 0, rec = 0, largest = 0;
    double block_params = 0, largest_block = 0, cpf = 0, cpb = 0, cp_buffer = 0;
    double epf = 0, epb = 0, expert_params = 0;
    for (int i = 0; i < out->layers_per_stage[s]; ++i, ++layer) {
      const mp_layer_time *t = &times[layer];
      if (t->params > largest) largest = t->params;
      if (mp_model_layer(model, layer)->kind == MP_LAYER_TRANSFORMER) {
        block_params += t->params;
        if (t->params > largest_block) largest_block = t->params;
      }
      f += t->forward_compute_s;
      b += t->backward_compute_s;
      rec += t->recompute_s;
      tpf += t->forward_tp_s;
      tpb += t->backward_tp_s;
      cpf += t->forward_cp_s;
      cpb += t->backward_cp_s;
      epf += t->forward_ep_s;
      epb += t->backward_ep_s;
      expert_params += t->expert_params;
      if (t->forward_ep_s > out->ep_layer_forward_s) {
        out->ep_layer_forward_s = t->forward_ep_s;
        out->ep_layer_backward_s = t->backward_ep_s;
        out->ep_layer_dispatch_bytes = t->ep_dispatch_bytes;
      }
      /* What a layer holds only while it computes: the cp buffers and the unfused attention's
       * backward scratch (the largest layer's, in the workspace). */
      const double transient = t->cp_buffer_bytes + t->attention_scratch_bytes;
      if (transient > cp_buffer) cp_buffer = transient;
      if (t->forward_cp_s > out->cp_layer_forward_s) {
        out->cp_layer_forward_s = t->forward_cp_s;
        out->cp_layer_backward_s = t->backward_cp_s;
        out->cp_layer_gather_bytes = t->cp_gather_bytes;
      }
      params += t->params;
      act += t->activation_bytes;
      model_flops += t->model_flops;
      const double hidden = (double)mp_model_layer(model, layer)->hidden;
      const double bytes = (double)layout->micro_batch * (double)layout->seq_len /
                           (double)mp_layout_cp(layout) * hidden * elem;
      if (bytes > boundary_bytes) boundary_bytes = bytes;
    }
    out->stage_forward_s[s] = f + tpf + cpf + epf;
    out->stage_backward_s[s] = b + tpb + cpb + epb;
    stage_cp[s] = cpf + cpb;
    stage_ep[s] = epf + epb;
    stage_expert_params[s] = expert_params;
    stage_cp_buffer[s] = cp_buffer;
    stage_compute[s] = f + b;
    stage_fwd_compute[s] = f;
    stage_recompute[s] = rec;
    stage_tp[s] = tpf + tpb;
    stage_params[s] = params;
    stage_act[s] = act;
    stage_largest_layer[s] = largest;
    stage_block_params[s] = block_params;
    stage_largest_block[s] = largest_block;
  }
  free(times);
  free(costs);
  if (stages > 1 && pp > 1 && tied_table_params(model) > 0.0) {
    stage_params[stages - 1] += tied_table_params(model) / layout->tp;
  }

  /* Point-to-point: the slowest boundary between neighbouring pipeline ranks. */
  if (layout->sequence_parallel) boundary_bytes /= layout->tp;
  /* A pipeline rank's ranks: tp fastest, then cp, then dp (grid.h). */
  const int block = layout->tp * mp_layout_cp(layout) * layout->dp;
  out->cp_inter_node = mp_layout_cp(layout) > 1 && !mp_cost_cp_intra_node(cluster, layout);
  out->ep_inter_node = mp_layout_ep(layout) > 1 && !mp_cost_ep_intra_node(cluster, layout);
  bool inter = false;
  for (int r = 0; r + 1 < pp; ++r) {
    if (!mp_cluster_same_node(cluster, r * block, (r + 2) * block - 1)) inter = true;
  }
  if (v > 1 && pp > 1 && !mp_cluster_same_node(cluster, 0, pp * block - 1)) inter = true;
  out->p2p_inter_node = inter;
  out->p2p_s = pp > 1 ? mp_cluster_p2p_seconds(cluster, !inter, boundary_bytes) : 0.0;
  const double slowdown = mp_cost_compute_slowdown(cluster, layout); /* shared cores */
  out->p2p_s *= slowdown;

  /* The schedule, simulated with these durations. */
  mp_schedule generated = MP_SCHEDULE_INITIALIZER;
  mp_sim_prepared own;
  memset(&own, 0, sizeof own);
  if (prepared == NULL) {
    status = mp_schedule_generate(layout->schedule, pp, (int)layout->num_micro_batches, v,
                                  &generated, err);
    if (status == MP_OK) status = mp_sim_prepare(&generated, MP_P2P_EAGER, &own, err);
    if (status != MP_OK) {
      mp_sim_prepared_free(&own);
      mp_schedule_free(&generated);
      return status;
    }
    prepared = &own;
  }
  const mp_schedule *schedule = prepared->schedule;
  for (int s = 0; s < stages; ++s) {
    /* Zero-bubble: the input gradient carries the recomputation and the tp collectives, the
     * weight gradient half of the backward GEMMs. */
    out->stage_weight_gradient_s[s] =
        0.5 * (stage_compute[s] - stage_fwd_compute[s] - stage_recompute[s]);
    out->stage_activation_bytes[s] = stage_act[s];
  }
  mp_sim_costs sim_costs;
  mp_simulation sim;
  memset(&sim, 0, sizeof sim);
  status = mp_cost_sim_costs(out, &sim_costs, err);
  if (status == MP_OK) {
    status = mp_schedule_simulate_prepared(prepared, &sim_costs, &sim, err);
  }
  if (status != MP_OK) {
    mp_simulation_free(&sim);
    mp_sim_costs_free(&sim_costs);
    mp_sim_prepared_free(&own);
    mp_schedule_free(&generated);
    return status;
  }
  out->pipeline_s = sim.step_time;
  out->bubble_fraction = sim.bubble_fraction;

  /* Data parallelism, optimizer and memory, per pipeline rank. */
  const mp_state_bytes state = mp_cost_state_bytes(cluster);
  const int d = mp_layout_replicas(layout); /* the gradients are summed over dp x cp */
  const bool dp_intra = mp_cluster_same_node(cluster, 0, block - 1);
  const double dp_bw = mp_cluster_link_bandwidth(cluster, dp_intra);
  const double dp_lat = mp_cluster_collective_latency(cluster, dp_intra);
  out->capacity_bytes = (double)cluster->device_memory_bytes;
  double tail = 0.0;
  for (int r = 0; r < pp; ++r) {
    mp_rank_estimate *rank = &out->ranks[r];
    rank->first_stage = r;
    double params = 0.0, last_backward = 0.0, all_compute = 0.0, largest_layer = 0.0;
    double block_params = 0.0, largest_block = 0.0, cp_buffer = 0.0, expert_params = 0.0;
    for (int c = 0; c < v; ++c) {
      const int s = c * pp + r;
      params += stage_params[s];
      expert_params += stage_expert_params[s];
      rank->ep_comm_s += m * stage_ep[s];
      block_params += stage_block_params[s];
      if (stage_largest_block[s] > largest_block) largest_block = stage_largest_block[s];
      all_compute += m * (out->stage_forward_s[s] + out->stage_backward_s[s]);
      if (stage_largest_layer[s] > largest_layer) largest_layer = stage_largest_layer[s];
      rank->compute_s += m * stage_compute[s];
      rank->recompute_s += m * stage_recompute[s];
      rank->tp_comm_s += m * stage_tp[s];
      rank->cp_comm_s += m * stage_cp[s];
      if (stage_cp_buffer[s] > cp_buffer) cp_buffer = stage_cp_buffer[s];
      last_backward += out->stage_backward_s[s];
    }
    rank->idle_s = sim.step_time - sim.busy_time[r];
    const double grad_bytes = params * state.grads, weight_bytes = params * state.weights;
    /* The experts' gradients are summed (and their state sharded) over the expert-data-parallel
     * group of d / ep ranks, the rest over d: the collectives below are the rest's, the experts'
     * are added after them. */
    const double expert_grad_bytes = expert_params * state.grads;
    const double expert_weight_bytes = expert_params * state.weights;
    const double dense_grad_bytes = grad_bytes - expert_grad_bytes;
    const double dense_weight_bytes = weight_bytes - expert_weight_bytes;
    const double block_grad_bytes = block_params * state.grads - expert_grad_bytes;
    const int zero = d > 1 ? layout->zero_stage : 0;
    /* HSDP: ZeRO's collectives inside a group of `shard` dp ranks (tp x shard consecutive
     * ranks), then each rank's part all-reduced over the replicas. */
    const int shard = zero >= 1 ? mp_layout_zero_shard(layout) : d;
    const double frac = (double)(shard - 1) / shard;
    const bool shard_intra = mp_cluster_same_node(cluster, 0, layout->tp * shard - 1);
    const double shard_bw = shard < d ? mp_cluster_link_bandwidth(cluster, shard_intra) : dp_bw;
    const double shard_lat =
        shard < d ? mp_cluster_collective_latency(cluster, shard_intra) : dp_lat;
    const double replicas_s =
        shard < d ? mp_cost_allreduce_seconds(dense_grad_bytes / shard, d / shard, dp_bw, dp_lat)
                  : 0.0;
    /* The dp collectives of a step. ZeRO 0 and 1 reduce once, after the rank's last backward;
     * ZeRO-2 reduce-scatters each block's gradients in every micro-batch's backward and the
     * rest (embedding, final norm, head) once, after the last (engine/train/trainer.h); ZeRO-3 also
     * gathers each block's weights for its forward, its recomputed forward (full recomputation)
     * and its backward in every micro-batch (reshard after forward), and the rest after the
     * update. The parameter all-gather of ZeRO 1 and 2 counts with the reduction, as one dp
     * time (the overlap assumption of cost_model.h). */
    double dp_comm = 0.0;
    const double zero2_scatter_bytes =
        m * block_grad_bytes + (dense_grad_bytes - block_grad_bytes);
    const double block_weight_bytes = block_params * state.weights - expert_weight_bytes;
    const double passes = layout->recompute == MP_RECOMPUTE_FULL ? 3.0 : 2.0;
    const double zero3_gather_bytes =
        m * passes * block_weight_bytes + (dense_weight_bytes - block_weight_bytes);
    if (zero == 1) {
      dp_comm = frac * (dense_grad_bytes + dense_weight_bytes) / shard_bw +
                2.0 * (shard - 1) * shard_lat + replicas_s;
    } else if (zero == 2) {
      dp_comm = frac * zero2_scatter_bytes / shard_bw + (m + 1.0) * (shard - 1) * shard_lat +
                frac * dense_weight_bytes / shard_bw + (shard - 1) * shard_lat + replicas_s;
    } else if (zero == 3) {
      dp_comm = frac * (zero3_gather_bytes + zero2_scatter_bytes) / shard_bw +
                (m * (passes + 1.0) + 2.0) * (shard - 1) * shard_lat;
    } else if (d > 1) {
      dp_comm = mp_cost_allreduce_seconds(dense_grad_bytes, d, dp_bw, dp_lat);
    }
    /* The experts (all inside blocks), over the de = d / ep ranks of their expert-data-parallel
     * group, which spans the dp x cp group's ranks (the dp link); nothing with de = 1. */
    const int de = mp_layout_expert_shard(layout);
    const double efrac = (double)(de - 1) / de;
    double expert_gather = 0.0, expert_scatter = 0.0;
    if (expert_params > 0.0 && de > 1) {
      if (zero == 0) {
        dp_comm += mp_cost_allreduce_seconds(expert_grad_bytes, de, dp_bw, dp_lat);
      } else {
        /* ZeRO 1: one reduce-scatter and one all-gather; 2: a reduce-scatter per micro-batch;
         * 3: and a gather per pass. */
        expert_scatter = (zero >= 2 ? m : 1.0) * expert_grad_bytes;
        expert_gather = (zero == 3 ? m * passes : 1.0) * expert_weight_bytes;
        const double collectives = (zero == 1 ? 2.0 : zero == 2 ? m + 1.0 : m * (passes + 1.0));
        dp_comm += efrac * (expert_scatter + expert_gather) / dp_bw +
                   collectives * (de - 1) * dp_lat;
      }
    }
    rank->dp_comm_s = dp_comm * slowdown;
    rank->zero_gather_bytes = zero == 3   ? frac * zero3_gather_bytes + efrac * expert_gather
                              : zero >= 1 ? frac * dense_weight_bytes + efrac * expert_gather
                                          : 0.0;
    rank->zero_reduce_scatter_bytes =
        zero >= 2   ? frac * zero2_scatter_bytes + efrac * expert_scatter
        : zero == 1 ? frac * dense_grad_bytes + efrac * expert_scatter
                    : 0.0;
    const int last = schedule->ranks[r].num_actions - 1;
    const double idle_after = last >= 0 ? sim.step_time - sim.end[r][last] : 0.0;
    /* What hides it: the last backward (and the idle time after it) for one reduction after
     * the backward, every micro-batch's compute for ZeRO 2 and 3, whose collectives run inside
     * it. CPU ranks (a cluster whose devices share cores) copy and reduce on the cores that
     * compute, and Open MPI progresses a collective only inside MPI calls: nothing overlaps. */
    const double cover = zero >= 2 ? all_compute : last_backward + idle_after;
    rank->dp_exposed_s = cluster->cores_per_node > 0 ? rank->dp_comm_s
                                                     : fmax(0.0, rank->dp_comm_s - cover);
    /* A tied LM head: the first and the last pipeline rank sum their two copies of the token
     * table's gradient (fp32, this tp rank's shard) once the backwards are done and before the
     * norm (Megatron's embedding all-reduce): exposed on every cluster. */
    if (pp > 1 && (r == 0 || r == pp - 1) && tied_table_params(model) > 0.0) {
      const bool intra = mp_cluster_same_node(cluster, 0, (pp - 1) * block + block - 1);
      const double tied_s =
          slowdown * mp_cost_allreduce_seconds(tied_table_params(model) / layout->tp *
                                                   state.grads,
                                               2, mp_cluster_link_bandwidth(cluster, intra),
                                               mp_cluster_collective_latency(cluster, intra));
      rank->dp_comm_s += tied_s;
      rank->dp_exposed_s += tied_s;
    }
    rank->optimizer_s = mp_cost_rank_optimizer_seconds(cluster, layout, params, expert_params);
    if (rank->dp_exposed_s + rank->optimizer_s > tail) tail = rank->dp_exposed_s + rank->optimizer_s;

    /* The parameter state, the experts' sharded over their expert-data-parallel group. */
    const mp_state_bytes held = mp_cost_rank_state_bytes(cluster, layout, params, expert_params);
    rank->weights_bytes = held.weights;
    /* ZeRO-3 keeps its part of the blocks' weights, the weights outside the blocks whole (every
     * rank's embedding, final norm and head) and a block's at a time in a window: on GPUs two
     * (the next block's gather prefetched while one computes), on CPU ranks one. */
    if (zero == 3) {
      const double weight_windows = cluster->cores_per_node > 0 ? 1.0 : 2.0;
      rank->weights_bytes = ((block_params - expert_params) / (double)shard +
                             expert_params / (double)de + (params - block_params)) *
                                state.weights +
                            weight_windows * largest_block * state.weights;
    }
    rank->grads_bytes = held.grads;
    /* ZeRO 2 and 3 keep the gradients outside the blocks whole until the step's end (their dp
     * part counted above, with the blocks'). */
    if (zero >= 2) rank->grads_bytes += (params - block_params) * state.grads;
    const double d_shard = (double)shard;
    rank->optimizer_bytes = held.optimizer;
    rank->activation_bytes = sim.peak_activation_memory[r];
    rank->peak_live = sim.peak_live[r];
    /* What the layer being computed holds only then: with cp > 1 the gathered K and V and their
     * gradient, and the unfused attention's backward scratch. */
    rank->workspace_bytes = mp_cost_workspace_bytes(cluster) + cp_buffer;
    /* The dp collectives' buffers: every bucket's temporaries on CPU ranks (ZeRO 0 and 1). ZeRO-2:
     * the one-block window, and one reduce-scatter's input at a time (the window, or a bucket of
     * the tensors outside the blocks) and its output; ZeRO-3: one layer's gradients. */
    if (d > 1 && zero >= 2) {
      const double bucket = fmax(largest_block, (double)MP_COST_ZERO2_BUCKET_FLOATS) * state.grads;
      const double scatter = fmin(bucket, grad_bytes);
      /* GPUs alternate two windows, so that a block's reduce-scatter overlaps the next block's
       * backward; CPU ranks reduce on the cores that compute, with one. */
      const double windows = cluster->cores_per_node > 0 ? 1.0 : 2.0;
      rank->workspace_bytes += windows * largest_block * state.grads +
                               mp_cost_dp_transient_bytes(cluster, scatter) +
                               fmin(scatter, grad_bytes / d_shard);
    } else if (d > 1) {
      rank->workspace_bytes += mp_cost_dp_transient_bytes(
          cluster, zero >= 2 ? largest_layer * state.grads : rank->grads_bytes);
      if (zero >= 2) rank->workspace_bytes += largest_layer * state.grads;
    }
    rank->memory_bytes = rank->weights_bytes + rank->grads_bytes + rank->optimizer_bytes +
                         rank->activation_bytes + rank->workspace_bytes;
    if (rank->memory_bytes > out->memory_bytes) out->memory_bytes = rank->memory_bytes;
  }
  for (int r = 0; r < pp; ++r) {
    out->ranks[r].end_wait_s = tail - out->ranks[r].dp_exposed_s - out->ranks[r].optimizer_s;
  }
  out->step_s = sim.step_time + tail;
  const double gpus = (double)layout_ranks(layout);
  const double global_batch = (double)layout->dp * (double)layout->micro_batch * m;
  /* Each cp rank computes 1/cp of every sequence's FLOPs. */
  out->model_flops_per_step = model_flops * m * layout->dp * mp_layout_cp(layout);
  out->tokens_per_s = global_batch * (double)layout->seq_len / out->step_s;
  out->tflops_per_gpu = out->model_flops_per_step / out->step_s / gpus / 1e12;
  /* Against the job's peak (on shared cores, the cores its ranks keep busy). */
  const double job_peak =
      mp_cluster_job_peak_flops(cluster, mp_cluster_training_dtype(cluster), (int)gpus);
  out->mfu = job_peak > 0 ? out->model_flops_per_step / out->step_s / job_peak : 0.0;
  out->fits = out->memory_bytes <= out->capacity_bytes;
  mp_simulation_free(&sim);
  mp_sim_costs_free(&sim_costs);
  mp_sim_prepared_free(&own);
  mp_schedule_free(&generated);
  return MP_OK;
}

mp_status mp_cost_estimate_plan(const mp_plan *plan, const mp_model *model, mp_estimate *out,
                                mp_error *err) {
  mp_layout layout;
  memset(&layout, 0, sizeof layout);
  layout.dp = plan->dp;
  layout.pp = plan->pp;
  layout.tp = plan->tp;
  layout.virtual_stages = plan->virtual_stages;
  layout.micro_batch = plan->micro_batch;
  layout.num_micro_batches = plan->num_micro_batches;
  layout.seq_len = plan->seq_len;
  layout.recompute = plan->recompute;
  layout.sequence_parallel = plan->sequence_parallel;
  layout.zero_stage = plan->zero_stage;
  layout.zero_shard_size = plan->zero_shard_size;
  layout.cp = plan->cp;
  layout.ep = plan->ep;
  if (mp_schedule_kind_parse(plan->schedule, &layout.schedule, err) != MP_OK) {
    return mp_error_prefix(err, "%s: $.schedule", plan->source);
  }
  mp_cluster cluster;
  if (mp_cluster_load(plan->cluster, &cluster, err) != MP_OK) {
    return mp_error_prefix(err, "%s: $.cluster", plan->source);
  }
  mp_model *loaded = NULL;
  if (model == NULL) {
    MP_TRY(mp_model_load(plan->model_path, &loaded, err));
    model = loaded;
  }
  /* ep against the model: a dense model takes none, an MoE one a divisor of its experts. */
  if (mp_cost_check_ep(model, mp_plan_ep(plan), err) != MP_OK) {
    mp_model_free(loaded);
    return mp_error_prefix(err, "%s: $.parallel.ep", plan->source);
  }
  const mp_status status =
      mp_cost_estimate(&cluster, model, &layout,
                       plan->num_stage_counts > 0 ? plan->layers_per_stage : NULL, out, err);
  mp_model_free(loaded);
  if (status != MP_OK) mp_error_prefix(err, "%s", plan->source);
  return status;
}

mp_status mp_cost_estimate(const mp_cluster *cluster, const mp_model *model,
                           const mp_layout *layout, const int *layers_per_stage,
                           mp_estimate *out, mp_error *err) {
  return estimate_layout(cluster, model, layout, layers_per_stage, NULL, out, err);
}

mp_status mp_cost_estimate_prepared(const mp_cluster *cluster, const mp_model *model,
                                    const mp_layout *layout, const int *layers_per_stage,
                                    const mp_sim_prepared *prepared, mp_estimate *out,
                                    mp_error *err) {
  const mp_schedule *schedule = prepared->schedule;
  if (schedule == NULL || schedule->kind != layout->schedule || schedule->pp != layout->pp ||
      schedule->num_micro_batches != layout->num_micro_batches ||
      schedule->virtual_stages != layout->virtual_stages || schedule->forward_only ||
      prepared->p2p_model != MP_P2P_EAGER) {
    memset(out, 0, sizeof *out);
    return mp_fail(err, MP_ERR_INPUT,
                   "the prepared schedule is not the layout's: it must be the eager-checked "
                   "training schedule %s for pp %d, %lld micro-batches, %d virtual stages",
                   mp_schedule_kind_name(layout->schedule), layout->pp,
                   (long long)layout->num_micro_batches, layout->virtual_stages);
  }
  return estimate_layout(cluster, model, layout, layers_per_stage, prepared, out, err);
}
