/*
 * tools/cmd_plan.c — `mpengine plan MODEL.json --gpus N`: the fastest layout of a model on N
 * devices of a cluster that fits in memory (topology/planner.h), printed as a ranked table or
 * JSON, explained with --explain (where the winner's step time and memory go, per pipeline rank),
 * and written with --out as the parallelism config `run` and `schedule` read.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "schedules/schedule.h"
#include "topology/cluster.h"
#include "topology/cost_model.h"
#include "topology/model.h"
#include "topology/plan.h"
#include "topology/planner.h"
#include "tools/cli.h"
#include "tools/commands.h"

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

static mp_status parse_choice(const cli_command *command, const char *name,
                              const char *const *names, int *out, mp_error *err) {
  const char *value = cli_value(command, name);
  if (value == NULL) return MP_OK;
  for (int i = 0; names[i] != NULL; ++i) {
    if (strcmp(value, names[i]) == 0) {
      *out = i;
      return MP_OK;
    }
  }
  char list[256] = "";
  for (int i = 0; names[i] != NULL; ++i) {
    strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, names[i], sizeof list - strlen(list) - 1);
  }
  return mp_fail(err, MP_ERR_INPUT, "--%s: expected one of %s, got '%s'", name, list, value);
}

static mp_status read_options(const cli_command *command, mp_planner_options *o, mp_error *err) {
  int64_t value;
  if (cli_value(command, "gpus") == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "--gpus N is required: how many devices to plan for");
  }
  MP_TRY(cli_int(command, "gpus", 1, 0, &value, err));
  if (value > (1 << 20)) return mp_fail(err, MP_ERR_INPUT, "--gpus: at most %d", 1 << 20);
  o->gpus = (int)value;
  MP_TRY(cli_int(command, "global-batch", 1, 0, &o->global_batch, err));
  MP_TRY(cli_int(command, "seq-len", 1, 0, &o->seq_len, err));
  MP_TRY(cli_int(command, "top", 1, 5, &value, err));
  o->top_k = value > MP_PLANNER_MAX_TOP ? MP_PLANNER_MAX_TOP + 1 : (int)value;
  const char *sizes[] = {"dp", "pp", "tp", "virtual-stages", "cp", "ep"};
  int *targets[] = {&o->dp, &o->pp, &o->tp, &o->virtual_stages, &o->cp, &o->ep};
  for (int i = 0; i < 6; ++i) {
    MP_TRY(cli_int(command, sizes[i], 1, 0, &value, err));
    if (value > (1 << 20)) return mp_fail(err, MP_ERR_INPUT, "--%s: too large", sizes[i]);
    *targets[i] = (int)value;
  }
  MP_TRY(cli_int(command, "micro-batch", 1, 0, &o->micro_batch, err));
  static const char *const kSchedules[] = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", NULL};
  static const char *const kRecompute[] = {"none", "selective", "full", NULL};
  static const char *const kBool[] = {"off", "on", NULL};
  static const char *const kZero[] = {"0", "1", "2", "3", NULL};
  MP_TRY(parse_choice(command, "schedule", kSchedules, &o->schedule, err));
  MP_TRY(parse_choice(command, "recompute", kRecompute, &o->recompute, err));
  MP_TRY(parse_choice(command, "sequence-parallel", kBool, &o->sequence_parallel, err));
  MP_TRY(parse_choice(command, "zero", kZero, &o->zero_stage, err));
  MP_TRY(cli_int(command, "zero-shard-size", 1, 0, &value, err));
  if (value > (1 << 20)) return mp_fail(err, MP_ERR_INPUT, "--zero-shard-size: too large");
  o->zero_shard_size = (int)value;
  o->exhaustive = cli_flag(command, "exhaustive");
  static const char *const kSplit[] = {"time", "memory", NULL};
  int split = MP_SPLIT_TIME;
  MP_TRY(parse_choice(command, "split", kSplit, &split, err));
  o->split = (mp_planner_split)split;
  return MP_OK;
}

static const char *short_schedule(mp_schedule_kind kind) {
  return kind == MP_SCHEDULE_INTERLEAVED_1F1B ? "interleaved" : mp_schedule_kind_name(kind);
}

/* Where the devices sit and what each holds, for the table's first line. GPUs: "8 per node, 80
 * GiB each". CPU ranks (cpu-local, or a cluster whose nodes' cores or memory its devices share):
 * the ranks a node really runs, not devices_per_node (cpu-local's 4096, "any number"): "2 ranks
 * on one node of 2 cores, sharing its 23.4 GiB: 11.7 GiB each". device_memory_bytes is already a
 * rank's share (cmd_plan sets it with mp_cluster_device_memory). */
static void describe_devices(const mp_cluster *cluster, int gpus, char *out, size_t out_bytes) {
  const double each = (double)cluster->device_memory_bytes / kGiB;
  if (cluster->node_memory_bytes <= 0 && cluster->cores_per_node <= 0 && !cluster->placeholder) {
    snprintf(out, out_bytes, "%d per node, %.0f GiB each", cluster->devices_per_node, each);
    return;
  }
  const int on_node = mp_cluster_devices_on_node(cluster, gpus);
  const int nodes = mp_cluster_nodes_used(cluster, gpus);
  char where[64] = "one node";
  if (nodes > 1) snprintf(where, sizeof where, "each of %d nodes", nodes);
  char cores[32] = "";
  if (cluster->cores_per_node > 0) {
    snprintf(cores, sizeof cores, " of %d core%s", cluster->cores_per_node,
             cluster->cores_per_node == 1 ? "" : "s");
  }
  char memory[96];
  if (cluster->node_memory_bytes > 0) {
    snprintf(memory, sizeof memory, ", sharing its %.1f GiB: %.1f GiB each",
             (double)cluster->node_memory_bytes / kGiB, each);
  } else {
    snprintf(memory, sizeof memory, ", %.1f GiB each", each);
  }
  snprintf(out, out_bytes, "%d rank%s on %s%s%s", on_node, on_node == 1 ? "" : "s", where, cores,
           memory);
}

static void print_table(const mp_planner_result *r, const mp_cluster *cluster,
                        const mp_model *model, int gpus) {
  char devices[256];
  describe_devices(cluster, gpus, devices, sizeof devices);
  printf("model %s on %d GPUs of %s (%s); global batch %lld x %lld tokens\n",
         mp_model_name(model), gpus, cluster->name, devices, (long long)r->global_batch,
         (long long)r->seq_len);
  if (cluster->placeholder && cluster->node_memory_bytes > 0) {
    printf("%s is uncalibrated: its figures are placeholders, not this machine's, except its "
           "memory (%.1f GiB, read from this machine and shared by the ranks); `mpengine "
           "calibrate` measures the rest\n",
           cluster->name, (double)cluster->node_memory_bytes / kGiB);
  } else if (cluster->placeholder) {
    printf("%s is uncalibrated: its figures are placeholders, not this machine's; `mpengine "
           "calibrate` measures them\n",
           cluster->name);
  }
  if (cluster->cores_per_node > 0) {
    /* CPU ranks share the node's cores (topology/cost_model.h, "Shared cores"). */
    const int ranks = mp_cluster_devices_on_node(cluster, gpus);
    const int threads = mp_cluster_threads_per_device(cluster, ranks);
    const double slowdown = mp_cluster_compute_slowdown(cluster, ranks);
    printf("%d rank%s on %d cores (%s): %d BLAS thread%s %s", ranks, ranks == 1 ? "" : "s",
           cluster->cores_per_node, cluster->name, threads, threads == 1 ? "" : "s",
           ranks == 1 ? "for its GEMMs" : "each");
    if (slowdown > 1.0) {
      printf(", taking turns on the cores: every time %.3gx a rank's alone on a core", slowdown);
    }
    printf("\n");
  }
  printf("searched %ld layouts, simulated %ld (bounds ruled out %ld, %ld by memory); best %d "
         "that fit:\n\n",
         r->candidates, r->simulated, r->pruned, r->pruned_by_memory, r->num_results);
  /* The ep column only for a model with experts (a dense model's is always 1). */
  const bool experts = mp_model_first_moe_layer(model) != NULL;
  printf("%4s %4s %4s", "rank", "dp", "cp");
  if (experts) printf(" %4s", "ep");
  printf(" %4s %4s %4s %-12s %2s %-9s %3s %4s %10s %11s %8s %6s %7s %15s\n",
         "pp", "tp", "mb", "schedule", "v", "recompute", "sp", "zero", "step s",
         "tokens/s", "TFLOP/s", "MFU", "bubble", "memory GiB");
  for (int i = 0; i < r->num_results; ++i) {
    const mp_estimate *e = &r->results[i];
    const mp_layout *l = &e->layout;
    char memory[40];
    snprintf(memory, sizeof memory, "%.1f/%.0f", e->memory_bytes / kGiB, e->capacity_bytes / kGiB);
    printf("%4d %4d %4d", i + 1, l->dp, mp_layout_cp(l));
    if (experts) printf(" %4d", mp_layout_ep(l));
    printf(" %4d %4d %4lld %-12s %2d %-9s %3s %4d %10.4g %11.4g %8.3g %5.1f%% "
           "%6.1f%% %15s\n",
           l->pp, l->tp, (long long)l->micro_batch,
           short_schedule(l->schedule),
           l->virtual_stages, mp_recompute_name(l->recompute), l->sequence_parallel ? "on" : "off",
           l->zero_stage, e->step_s, e->tokens_per_s, e->tflops_per_gpu, 100.0 * e->mfu,
           100.0 * e->bubble_fraction, memory);
  }
}

static void print_explain(const mp_planner_result *r, const mp_cluster *cluster) {
  const mp_estimate *e = &r->results[0];
  const mp_layout *l = &e->layout;
  char text[200];
  printf("\nexplain the winner (%s):\n", mp_layout_describe(l, text, sizeof text));
  printf("  stages: %d (pp %d x v %d), layers per stage:", e->num_stages, l->pp,
         l->virtual_stages);
  for (int s = 0; s < e->num_stages; ++s) printf(" %d", e->layers_per_stage[s]);
  printf("\n  %lld micro-batches of %lld x %lld tokens per dp rank; point-to-point %.3f ms per "
         "message (%s)\n",
         (long long)l->num_micro_batches, (long long)l->micro_batch, (long long)l->seq_len,
         e->p2p_s * 1e3, l->pp == 1 ? "none: one stage" : e->p2p_inter_node ? "across nodes" : "inside a node");
  const int cp = mp_layout_cp(l);
  if (cp > 1) {
    /* Context parallelism (cost_model.h): where its time and memory go. */
    printf("  context parallelism: cp %d ranks share each sequence, %lld of its %lld tokens each "
           "(2 chunks of %lld); activations per rank are those of %lld-token sequences (a "
           "block's gathered K and V are working memory)\n",
           cp, (long long)(l->seq_len / cp), (long long)l->seq_len,
           (long long)(l->seq_len / (2 * cp)), (long long)(l->seq_len / cp));
    printf("  K/V all-gather %.3f ms per block per micro-batch forward (%.2f MiB gathered), "
           "the K/V re-gather%s and dK/dV reduce-scatter %.3f ms backward, exposed, over the "
           "cp group of %d on %s\n",
           e->cp_layer_forward_s * 1e3, e->cp_layer_gather_bytes / (1024.0 * 1024.0),
           l->recompute == MP_RECOMPUTE_FULL ? "s (with the recomputed forward's)" : "",
           e->cp_layer_backward_s * 1e3,
           cp, e->cp_inter_node ? "the inter-node link" : "the intra-node link");
  }
  const int ep = mp_layout_ep(l);
  if (ep > 1) {
    /* Expert parallelism (cost_model.h): where the experts sit and what their all-to-alls cost. */
    const int dp_cp = mp_layout_replicas(l);
    printf("  expert parallelism: ep %d, folded over the dp x cp = %d ranks: each rank holds 1/%d "
           "of every mixture-of-experts block's experts, their gradients summed and ZeRO-sharded "
           "over the %d ranks of its expert-data-parallel group\n",
           ep, dp_cp, ep, dp_cp / ep);
    printf("  all-to-all (dispatch + combine) %.3f ms per MoE block per micro-batch forward, "
           "%.3f ms backward (%.2f MiB sent per all-to-all, (ep-1)/ep of it to other ranks), "
           "exposed, over the ep group of %d on %s\n",
           e->ep_layer_forward_s * 1e3, e->ep_layer_backward_s * 1e3,
           e->ep_layer_dispatch_bytes / (1024.0 * 1024.0), ep,
           e->ep_inter_node ? "the inter-node link" : "the intra-node link");
  }
  printf("  step time %.4f s = pipeline %.4f s (simulated %s) + gradient reduction and optimizer "
         "%.4f s\n",
         e->step_s, e->pipeline_s, mp_schedule_kind_name(l->schedule), e->step_s - e->pipeline_s);
  printf("\n  time per pipeline rank, seconds (each row sums to the step time):\n");
  printf("  %4s %10s %10s %10s", "pp", "compute", "(recomp)", "tp comm");
  if (cp > 1) printf(" %10s", "cp comm");
  if (ep > 1) printf(" %10s", "ep a2a");
  printf(" %12s %10s %10s %10s %9s\n", "bubble+p2p", "dp exposed", "optimizer", "end wait",
         "dp total");
  for (int p = 0; p < l->pp; ++p) {
    const mp_rank_estimate *k = &e->ranks[p];
    printf("  %4d %10.4f %10.4f %10.4f", p, k->compute_s, k->recompute_s, k->tp_comm_s);
    if (cp > 1) printf(" %10.4f", k->cp_comm_s);
    if (ep > 1) printf(" %10.4f", k->ep_comm_s);
    printf(" %12.4f %10.4f %10.4f %10.4f %9.4f\n", k->idle_s, k->dp_exposed_s, k->optimizer_s,
           k->end_wait_s, k->dp_comm_s);
  }
  if (l->zero_stage >= 1 && mp_layout_replicas(l) > 1) {
    static const char *const kWhat[] = {"", "optimizer state", "optimizer state and gradients",
                                        "optimizer state, gradients and parameters"};
    const int shard = mp_layout_zero_shard(l);
    if (shard < l->dp) {
      printf("\n  ZeRO-%d in groups of %d dp ranks, replicated %d times (HSDP; %s sharded); dp "
             "traffic per rank and step, GiB:\n",
             l->zero_stage, shard, l->dp / shard, kWhat[l->zero_stage]);
    } else if (cp > 1) {
      printf("\n  ZeRO-%d over dp %d x cp %d (%s sharded); dp traffic per rank and step, GiB:\n",
             l->zero_stage, l->dp, cp, kWhat[l->zero_stage]);
    } else {
      printf("\n  ZeRO-%d over dp %d (%s sharded); dp traffic per rank and step, GiB:\n",
             l->zero_stage, l->dp, kWhat[l->zero_stage]);
    }
    if (ep > 1) {
      printf("  (the experts' state over the %d ranks of their expert-data-parallel group; the "
             "traffic below is both)\n",
             mp_layout_expert_shard(l));
    }
    printf("  %4s %14s %16s %10s %10s %9s\n", "pp", "all-gathers", "reduce-scatters", "dp total",
           "exposed", "hidden");
    for (int p = 0; p < l->pp; ++p) {
      const mp_rank_estimate *k = &e->ranks[p];
      const double hidden = k->dp_comm_s > 0 ? 1.0 - k->dp_exposed_s / k->dp_comm_s : 0.0;
      printf("  %4d %14.3f %16.3f %9.4fs %9.4fs %8.1f%%\n", p, k->zero_gather_bytes / kGiB,
             k->zero_reduce_scatter_bytes / kGiB, k->dp_comm_s, k->dp_exposed_s, 100.0 * hidden);
    }
    if (l->zero_stage == 3 && cluster->cores_per_node == 0) {
      printf("  (ZeRO-3 on GPUs: each pass's first block waits for its gather, which the model "
             "counts as hidden; the free search leaves ZeRO-3 to --zero)\n");
    }
  }
  printf("\n  memory per GPU of each pipeline rank, GiB (capacity %.2f):\n", e->capacity_bytes / kGiB);
  printf("  %4s %9s %9s %10s %12s %6s %10s %9s %9s\n", "pp", "weights", "grads", "optimizer",
         "activations", "live", "workspace", "total", "free");
  for (int p = 0; p < l->pp; ++p) {
    const mp_rank_estimate *k = &e->ranks[p];
    printf("  %4d %9.2f %9.2f %10.2f %12.2f %6d %10.2f %9.2f %9.2f\n", p, k->weights_bytes / kGiB,
           k->grads_bytes / kGiB, k->optimizer_bytes / kGiB, k->activation_bytes / kGiB,
           k->peak_live, k->workspace_bytes / kGiB, k->memory_bytes / kGiB,
           (e->capacity_bytes - k->memory_bytes) / kGiB);
  }
  if (r->have_overflow) {
    const mp_estimate *o = r->overflow;
    printf("\n  faster but does not fit: %s, %.4f s per step, needs %.2f GiB, %.2f GiB over\n",
           mp_layout_describe(&o->layout, text, sizeof text), o->step_s, o->memory_bytes / kGiB,
           (o->memory_bytes - o->capacity_bytes) / kGiB);
  } else {
    printf("\n  no faster layout was ruled out by memory\n");
  }
}

static void add_estimate(cJSON *row, const mp_estimate *e) {
  const mp_layout *l = &e->layout;
  cJSON_AddNumberToObject(row, "dp", l->dp);
  cJSON_AddNumberToObject(row, "cp", mp_layout_cp(l));
  cJSON_AddNumberToObject(row, "ep", mp_layout_ep(l));
  cJSON_AddNumberToObject(row, "pp", l->pp);
  cJSON_AddNumberToObject(row, "tp", l->tp);
  cJSON_AddNumberToObject(row, "micro_batch", (double)l->micro_batch);
  cJSON_AddNumberToObject(row, "num_micro_batches", (double)l->num_micro_batches);
  cJSON_AddStringToObject(row, "schedule", mp_schedule_kind_name(l->schedule));
  cJSON_AddNumberToObject(row, "virtual_stages", l->virtual_stages);
  cJSON_AddStringToObject(row, "recompute", mp_recompute_name(l->recompute));
  cJSON_AddBoolToObject(row, "sequence_parallel", l->sequence_parallel);
  cJSON_AddNumberToObject(row, "zero_stage", l->zero_stage);
  cJSON_AddNumberToObject(row, "step_time_s", e->step_s);
  cJSON_AddNumberToObject(row, "pipeline_time_s", e->pipeline_s);
  cJSON_AddNumberToObject(row, "tokens_per_s", e->tokens_per_s);
  cJSON_AddNumberToObject(row, "tflops_per_gpu", e->tflops_per_gpu);
  cJSON_AddNumberToObject(row, "mfu", e->mfu);
  cJSON_AddNumberToObject(row, "bubble_fraction", e->bubble_fraction);
  cJSON_AddNumberToObject(row, "memory_bytes", e->memory_bytes);
  cJSON_AddNumberToObject(row, "memory_capacity_bytes", e->capacity_bytes);
  cJSON *stages = cJSON_AddArrayToObject(row, "layers_per_stage");
  for (int s = 0; s < e->num_stages; ++s) {
    cJSON_AddItemToArray(stages, cJSON_CreateNumber(e->layers_per_stage[s]));
  }
}

static void print_json(const mp_planner_result *r, const mp_model *model,
                       const mp_cluster *cluster, int gpus, double seconds) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "model", mp_model_name(model));
  cJSON_AddStringToObject(root, "cluster", cluster->name);
  cJSON_AddNumberToObject(root, "gpus", gpus);
  cJSON_AddNumberToObject(root, "global_batch", (double)r->global_batch);
  cJSON_AddNumberToObject(root, "seq_len", (double)r->seq_len);
  cJSON_AddNumberToObject(root, "candidates", (double)r->candidates);
  cJSON_AddNumberToObject(root, "simulated", (double)r->simulated);
  cJSON_AddNumberToObject(root, "pruned", (double)r->pruned);
  cJSON_AddNumberToObject(root, "pruned_by_memory", (double)r->pruned_by_memory);
  cJSON_AddNumberToObject(root, "search_seconds", seconds);
  cJSON *rows = cJSON_AddArrayToObject(root, "plans");
  for (int i = 0; i < r->num_results; ++i) {
    cJSON *row = cJSON_CreateObject();
    add_estimate(row, &r->results[i]);
    cJSON_AddItemToArray(rows, row);
  }
  char *text = cJSON_Print(root);
  if (text != NULL) printf("%s\n", text);
  free(text);
  cJSON_Delete(root);
}

static mp_status write_plan(const char *out_path, const char *model_path, const char *cluster_arg,
                            const mp_estimate *e, mp_error *err) {
  mp_plan plan;
  memset(&plan, 0, sizeof plan);
  char resolved[PATH_MAX];
  snprintf(plan.model_path, sizeof plan.model_path, "%s",
           realpath(model_path, resolved) != NULL ? resolved : model_path);
  if (mp_cluster_preset_json(cluster_arg) != NULL) {
    snprintf(plan.cluster, sizeof plan.cluster, "%s", cluster_arg);
  } else {
    snprintf(plan.cluster, sizeof plan.cluster, "%s",
             realpath(cluster_arg, resolved) != NULL ? resolved : cluster_arg);
  }
  const mp_layout *l = &e->layout;
  plan.dp = l->dp;
  plan.pp = l->pp;
  plan.tp = l->tp;
  plan.cp = mp_layout_cp(l);
  plan.ep = mp_layout_ep(l);
  plan.virtual_stages = l->virtual_stages;
  plan.sequence_parallel = l->sequence_parallel;
  plan.zero_stage = l->zero_stage;
  /* As the plan reader has it: the HSDP group, else dp (the state then spans dp x cp). */
  plan.zero_shard_size = mp_layout_zero_shard(l) < l->dp ? mp_layout_zero_shard(l) : l->dp;
  plan.micro_batch = l->micro_batch;
  plan.num_micro_batches = l->num_micro_batches;
  plan.global_batch = l->dp * l->micro_batch * l->num_micro_batches;
  plan.seq_len = l->seq_len;
  snprintf(plan.schedule, sizeof plan.schedule, "%s", mp_schedule_kind_name(l->schedule));
  plan.recompute = l->recompute;
  plan.num_stage_counts = e->num_stages;
  for (int s = 0; s < e->num_stages; ++s) plan.layers_per_stage[s] = e->layers_per_stage[s];
  plan.training = mp_training_config_default();
  mp_plan_prediction *predicted = calloc(1, sizeof *predicted);
  if (predicted == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  predicted->step_s = e->step_s;
  predicted->tokens_per_s = e->tokens_per_s;
  predicted->tflops_per_gpu = e->tflops_per_gpu;
  predicted->mfu = e->mfu;
  predicted->bubble_fraction = e->bubble_fraction;
  predicted->capacity_bytes = e->capacity_bytes;
  predicted->num_ranks = l->pp;
  for (int p = 0; p < l->pp && p < MP_PLAN_MAX_STAGES; ++p) {
    predicted->memory_bytes_per_rank[p] = e->ranks[p].memory_bytes;
  }
  mp_status status = mp_plan_write(&plan, predicted, out_path, err);
  free(predicted);
  return status;
}

int cmd_plan(int argc, char **argv) {
  cli_option options[] = {
      {"gpus", "N", "devices to plan for (required)", NULL},
      {"cluster", "NAME|FILE", "a100-80g, h100-sxm, h200-sxm, cpu-local (default: this machine, "
       "its ranks sharing its memory; calibrated by `mpengine calibrate`, else placeholder "
       "speeds) or a file", NULL},
      {"global-batch", "B", "sequences per optimizer step (default: N, one per GPU)", NULL},
      {"seq-len", "S", "tokens per sequence (default: the model's)", NULL},
      {"top", "K", "layouts to list (default 5)", NULL},
      {"out", "PLAN.json", "write the winner as a plan (replaces PLAN.json if it exists)", NULL},
      {"json", NULL, "print the ranked layouts as JSON", NULL},
      {"explain", NULL, "break the winner's step time and memory down per pipeline rank", NULL},
      {"dp", "D", "fix the data-parallel size", NULL},
      {"pp", "P", "fix the pipeline-parallel size", NULL},
      {"tp", "T", "fix the tensor-parallel size", NULL},
      {"cp", "C", "fix the context-parallel size: C ranks share each sequence (the sequence "
       "length a multiple of 2 C; searched: powers of two, chunks of 512 tokens or more)", NULL},
      {"ep", "E", "fix the expert-parallel size (mixture-of-experts models): each MoE block's "
       "experts split over E of the dp x cp ranks (E divides dp x cp and the experts; searched: "
       "every such divisor; 1 on a dense model)", NULL},
      {"micro-batch", "B", "fix the sequences per micro-batch", NULL},
      {"schedule", "K", "fix the schedule: gpipe, 1f1b, interleaved-1f1b, zb-h1", NULL},
      {"virtual-stages", "V", "fix the model chunks per pipeline rank", NULL},
      {"recompute", "MODE", "fix recomputation: none, selective, full", NULL},
      {"sequence-parallel", "on|off", "fix sequence parallelism", NULL},
      {"zero", "0|1|2|3", "fix the ZeRO stage (1: optimizer state sharded over dp; 2: and gradients; 3: and parameters, searched on CPU ranks only)", NULL},
      {"zero-shard-size", "S", "ZeRO 1 or 2 within groups of S dp ranks, replicated across them (HSDP; S divides --dp)", NULL},
      {"split", "time|memory", "cut the layers into stages for the fastest pipeline (time, the default) or for the least memory on the fullest rank (memory: fewer blocks on the stages holding the embedding, the head and the most micro-batches in flight; not for interleaved layouts)", NULL},
      {"exhaustive", NULL, "simulate every layout instead of skipping those a bound shows cannot "
       "make the top K (the same ranking, slower)", NULL},
      {0},
  };
  cli_command command = {
      .command = argv[0],
      .usage = "mpengine plan MODEL.json --gpus N [--cluster NAME|FILE] [--global-batch B] "
               "[--seq-len S] [--top K] [--out PLAN.json] [--json] [--explain]",
      .summary =
          "Search dp x cp x pp x tp (and ep over dp x cp for mixture-of-experts models), micro-batch, schedule, virtual stages, recomputation, "
          "sequence parallelism and ZeRO-1 for the fastest layout that fits in memory. Each layout's "
          "layers are cut into stages by dynamic programming, its pipeline is simulated with the "
          "cost model's durations (the schedule `mpengine schedule` draws), and the fastest "
          "that fit are ranked. Any choice can be fixed with its option.",
      .min_positionals = 1,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_planner_options planner_options = MP_PLANNER_OPTIONS_INITIALIZER;
  if (read_options(&command, &planner_options, &err) != MP_OK) return cli_report(&command, &err);
  const char *cluster_arg = cli_value(&command, "cluster");
  if (cluster_arg == NULL) cluster_arg = "cpu-local";
  mp_cluster cluster;
  if (mp_cluster_load(cluster_arg, &cluster, &err) != MP_OK) {
    mp_error_prefix(&err, "--cluster");
    return cli_report(&command, &err);
  }
  /* Ranks that share a node's memory (CPU ranks) each plan with their share of it. */
  cluster.device_memory_bytes = mp_cluster_device_memory(&cluster, planner_options.gpus);
  mp_model *model = NULL;
  if (mp_model_load(command.positionals[0], &model, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  mp_planner_result result;
  mp_status status = mp_plan_search(&cluster, model, &planner_options, &result, &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (status == MP_OK) {
    if (cli_flag(&command, "json")) {
      print_json(&result, model, &cluster, planner_options.gpus, seconds);
    } else {
      print_table(&result, &cluster, model, planner_options.gpus);
      printf("\nplanned in %.3f s\n", seconds);
    }
    if (cli_flag(&command, "explain")) print_explain(&result, &cluster);
    const char *out_path = cli_value(&command, "out");
    if (out_path != NULL) {
      status = write_plan(out_path, command.positionals[0], cluster_arg, &result.results[0], &err);
      if (status == MP_OK) {
        fprintf(stderr, "mpengine plan: wrote the winner to %s\n", out_path);
      }
    }
  }
  mp_planner_result_free(&result);
  mp_model_free(model);
  if (status == MP_ERR_INPUT && cluster.node_memory_bytes > 0 &&
      strstr(err.message, "fits on no layout") != NULL) {
    /* "Use more GPUs" does not help ranks that share one machine's memory. */
    const mp_error inner = err;
    mp_fail(&err, status, "%s (the ranks of %s share each node's %.1f GiB: more ranks on a node "
            "hold less each)", inner.message, cluster.name,
            (double)cluster.node_memory_bytes / kGiB);
  }
  if (status != MP_OK) return cli_report(&command, &err);
  return CLI_EXIT_OK;
}
