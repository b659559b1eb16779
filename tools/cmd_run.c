/*
 * tools/cmd_run.c — `mpengine run --config PLAN.json`: train the plan's model.
 *
 * On one rank (CPU or one GPU), or on a dp x pp x tp grid of CPU ranks: one process per rank.
 * Started outside an MPI job (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment)
 * with a plan of more than one rank, it re-launches itself as
 *     mpirun -np N --oversubscribe [--allow-run-as-root] /proc/self/exe's target run <same args>
 * (N = dp x pp x tp, or --np) and exits with mpirun's status. Inside the job every rank builds
 * the world (every wait bounded by --comm-timeout) and its tensor-, data-, pipeline-parallel and
 * embedding groups from topology/grid.h, in that fixed order on every rank, and trains its
 * chunks of the model (engine/train/trainer.h); only world rank 0 prints and writes --metrics.
 * --trace FILE records every action and communication of every rank (engine/trace/trace.h), merged
 * by rank 0 into FILE at the end; --save-weights FILE writes the final weights as an llm.c
 * GPT-2 checkpoint. A rank that fails prints its error prefixed with its rank; input errors,
 * which every rank meets alike, are printed by rank 0 alone.
 *
 * Data comes from llm.c token shards (--data
 * GLOB) or, by default, from a synthetic Markov source generated in memory whose entropy rate is
 * printed next to the loss: the floor no model can beat. A line per step (every --log-every K
 * steps, by default about 50 lines a run, always the first and last step), or a progress bar
 * with an ETA when stdout is a terminal; --metrics FILE also writes one JSON object per step,
 * every step.
 *
 * Checkpoints (engine/checkpoint/checkpoint.h): --checkpoint-dir DIR saves every --save-every K
 * steps and at the end, keeping the --keep N newest; SIGTERM or SIGINT finishes the current step,
 * saves and exits 0 (with several ranks they agree on stopping with a one-float all-reduce per
 * step; the launcher passes SIGTERM / SIGINT it receives to the ranks as SIGTERM). --resume
 * continues from the newest complete checkpoint in DIR, under this plan's layout (any dp, pp, tp,
 * virtual stages and ZeRO stage: resharded when it differs from the saved one), and exits 2 when
 * there is none.
 *
 * Failures: a rank that dies makes mpirun end the job; the launcher forwards mpirun's stderr,
 * reads from it which rank died ("mpirun noticed that process rank N ... exited on signal S"),
 * names it in one line and exits 1 (mpirun's other non-zero codes become 1 too, apart from 2).
 * A hung rank makes its peers fail with the --comm-timeout error, and mpirun ends it.
 * MPENGINE_FAULT (kill:RANK:STEP, hang:RANK:STEP) injects those faults, for tests only.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "engine/cuda_backend/cuda_backend.h"
#include "engine/data/data_loader.h"
#include "engine/device/device.h"
#include "engine/device/gpu_probe.h"
#include "engine/model/param_layout.h"
#include "engine/data/markov_source.h"
#include "engine/comm/tp_comm_mpi.h"
#include "engine/trace/trace.h"
#include "engine/train/trainer.h"
#include "topology/cluster.h"
#include "topology/grid.h"
#include "topology/model.h"
#include "topology/plan.h"
#include "tools/cli.h"
#include "engine/comm/ep_comm_nccl.h"
#include "engine/comm/tp_comm_nccl.h"
#include "tools/hostfile.h"
#include "tools/launcher_env.h"
#include "tools/run_launcher.h"
#include "tools/commands.h"

typedef struct {
  mp_plan plan;
  mp_model *model;
  mp_data_loader *data;
  mp_data_loader *val_data; /* with --eval-every: the held-out batches */
  mp_markov_source *source; /* the synthetic default, or NULL with --data */
  uint16_t *synthetic_tokens;
  mp_trainer *trainer;
  mp_comm_world *world;     /* inside an MPI job of more than one rank, else NULL */
  mp_comm *tp_group;        /* this rank's tensor-parallel group, or NULL */
  mp_comm *dp_group, *pp_group, *embedding_group; /* its other groups, or NULL; dp_group is
                                                     the dp x cp replicas' with cp > 1 */
  mp_comm *cp_group;        /* context parallelism (cp > 1): the ranks sharing each sequence */
  mp_comm *world_group;     /* every rank: stop agreement, memory report, trace */
  mp_comm *zero_shard_group, *zero_replica_group; /* HSDP (zero_shard_size < dp), else NULL */
  mp_comm *ep_group, *expert_dp_group; /* expert parallelism (ep > 1): this rank's ep group and
                                          the replicas holding its experts, else NULL */
  mp_tp_comm tp_table;      /* the table over tp_group the trainer calls */
  mp_nccl_world *nccl_world; /* CUDA backend over NCCL (a GPU per rank), else NULL */
  mp_nccl_comm *nccl_cp;     /* with cp > 1 over NCCL: the context-parallel group's, or NULL */
  mp_nccl_comm *nccl_ep;     /* with ep > 1 over NCCL: the expert-parallel group's, or NULL */
  mp_ep_comm ep_device_table; /* over nccl_ep: the GPU stage's MoE rows */
  mp_tp_comm cp_device_table; /* over nccl_cp: the GPU stage's key/value exchange */
  mp_nccl_comm *nccl_tp, *nccl_pp, *nccl_dp; /* its communicators of the groups with more than
                                                one rank (dp: also --gpu-comm nccl), or NULL */
  mp_tp_comm tp_device_table; /* over nccl_tp: the GPU stage's device collectives */
  mp_grid_coord coord;      /* this rank's place in the grid */
  mp_trace *trace;          /* with --trace */
  int rank, world_size;     /* 0 and 1 without a world */
  char (*hosts)[64];        /* (world_size) each rank's host name (gethostname), gathered at
                               start-up; NULL until then */
  int metrics_fd;           /* --metrics, world rank 0 only; -1 otherwise */
  double entropy_floor;     /* nats per token, synthetic source only; NAN otherwise */
  double peak_flops_per_s;  /* the cluster's peak for the backend's dtype; 0 when unknown */
} run_state;

static void run_state_free(run_state *state) {
  free(state->hosts);
  state->hosts = NULL;
  if (state->metrics_fd >= 0) close(state->metrics_fd);
  mp_trainer_free(state->trainer);
  mp_data_loader_free(state->data);
  mp_data_loader_free(state->val_data);
  free(state->synthetic_tokens);
  mp_markov_source_free(state->source);
  mp_model_free(state->model);
  mp_trace_free(state->trace);
  mp_nccl_comm_free(state->nccl_dp);
  mp_nccl_comm_free(state->nccl_pp);
  mp_nccl_comm_free(state->nccl_tp);
  mp_nccl_comm_free(state->nccl_cp);
  mp_nccl_comm_free(state->nccl_ep);
  mp_nccl_world_free(state->nccl_world);
  mp_comm_free(state->expert_dp_group);
  mp_comm_free(state->ep_group);
  mp_comm_free(state->zero_replica_group);
  mp_comm_free(state->zero_shard_group);
  mp_comm_free(state->world_group);
  mp_comm_free(state->embedding_group);
  mp_comm_free(state->pp_group);
  mp_comm_free(state->dp_group);
  mp_comm_free(state->cp_group);
  mp_comm_free(state->tp_group);
}

/* Creates the group of `kind` this rank belongs to (collective over the world). */
static mp_status create_group(run_state *state, const mp_grid_shape *grid, mp_grid_kind kind,
                              mp_comm **out, mp_error *err) {
  const int capacity = mp_grid_group_capacity(grid, kind);
  int *members = malloc((size_t)(capacity > 0 ? capacity : 1) * sizeof(int));
  if (members == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const int count = mp_grid_group_of(grid, kind, state->rank, members);
  const mp_status status = mp_comm_group_create(state->world, members, count,
                                                mp_grid_kind_name(kind), out, err);
  free(members);
  return status;
}

/* Resident memory of this process in bytes (from /proc/self/statm), 0 when unknown. */
static double resident_bytes(void) {
  FILE *file = fopen("/proc/self/statm", "r");
  if (file == NULL) return 0.0;
  long pages_total = 0, pages_resident = 0;
  const int got = fscanf(file, "%ld %ld", &pages_total, &pages_resident);
  fclose(file);
  return got == 2 ? (double)pages_resident * (double)sysconf(_SC_PAGESIZE) : 0.0;
}

/* The largest resident memory over the ranks (collective over the world group when there is
 * one), in bytes. */
static mp_status max_resident_bytes(run_state *state, double *out, mp_error *err) {
  const float mine = (float)(resident_bytes() / 1048576.0); /* MiB: exact enough in a float */
  if (state->world_group == NULL) {
    *out = (double)mine * 1048576.0;
    return MP_OK;
  }
  float *all = malloc((size_t)state->world_size * sizeof(float));
  if (all == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  const mp_status status = mp_comm_all_gather_f32(state->world_group, &mine, all, 1, err);
  float most = 0.0f;
  for (int r = 0; r < state->world_size && status == MP_OK; ++r) {
    if (all[r] > most) most = all[r];
  }
  free(all);
  *out = (double)most * 1048576.0;
  return status;
}

/* This process's peak resident memory in bytes (VmHWM of /proc/self/status), 0 when unknown. */
static double peak_resident_bytes(void) {
  FILE *file = fopen("/proc/self/status", "r");
  if (file == NULL) return 0.0;
  char line[256];
  double kib = 0.0;
  while (fgets(line, sizeof line, file) != NULL) {
    if (strncmp(line, "VmHWM:", 6) == 0) {
      kib = strtod(line + 6, NULL);
      break;
    }
  }
  fclose(file);
  return kib * 1024.0;
}

/* The host of world rank r: gathered from the ranks (gethostname) once the world is up; before
 * that, the launcher's placement (MPENGINE_RANK_HOSTS, "host:ranks,..." in rank order); else
 * "?" for another rank, this machine's name for this one. */
static const char *rank_host(const run_state *state, int r) {
  static char placed[64], own[64];
  if (state->hosts != NULL && r >= 0 && r < state->world_size) return state->hosts[r];
  const char *table = getenv("MPENGINE_RANK_HOSTS");
  int first = 0;
  for (const char *entry = table; entry != NULL && *entry != '\0';) {
    const char *colon = strchr(entry, ':');
    if (colon == NULL) break;
    const int count = atoi(colon + 1);
    if (r >= first && r < first + count) {
      snprintf(placed, sizeof placed, "%.*s", (int)(colon - entry), entry);
      return placed;
    }
    first += count;
    entry = strchr(colon, ',');
    if (entry != NULL) ++entry;
  }
  if (r != state->rank) return "?";
  if (gethostname(own, sizeof own) != 0) snprintf(own, sizeof own, "?");
  own[sizeof own - 1] = '\0';
  return own;
}

/* Every rank's host name, gathered to all (collective over the world group), and on rank 0 one
 * line per host: its ranks and their (dp, pp, tp) ranges. A tp group's ranks are consecutive
 * (topology/grid.h), so a host that holds whole tp groups shows tp 0..tp-1. The names travel as
 * 32 uint16 words per rank through the bf16 all-gather, which moves the words unchanged. */
static mp_status gather_hosts(run_state *state, const mp_grid_shape *grid, mp_error *err) {
  enum { kWords = 32 };
  const int n = state->world_size;
  state->hosts = calloc((size_t)n, sizeof *state->hosts);
  uint16_t *all = calloc((size_t)n * kWords, sizeof *all);
  size_t *counts = malloc((size_t)n * sizeof *counts);
  if (state->hosts == NULL || all == NULL || counts == NULL) {
    free(all);
    free(counts);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  uint16_t mine[kWords] = {0};
  char name[2 * kWords] = "";
  if (gethostname(name, sizeof name) != 0) snprintf(name, sizeof name, "?");
  name[sizeof name - 1] = '\0';
  memcpy(mine, name, sizeof mine);
  for (int r = 0; r < n; ++r) counts[r] = kWords;
  mp_status status = state->world_group == NULL
                         ? (memcpy(all, mine, sizeof mine), MP_OK)
                         : mp_comm_all_gather_v_bf16(state->world_group, mine, all, counts, err);
  for (int r = 0; r < n && status == MP_OK; ++r) {
    memcpy(state->hosts[r], all + (size_t)r * kWords, sizeof state->hosts[r]);
    state->hosts[r][sizeof state->hosts[r] - 1] = '\0';
  }
  free(all);
  free(counts);
  if (status != MP_OK || n <= 1) return status;
  for (int first = 0; first < n;) {
    int last = first;
    while (last + 1 < n && strcmp(state->hosts[last + 1], state->hosts[first]) == 0) ++last;
    mp_grid_coord low = mp_grid_coord_of(grid, first), high = low;
    for (int r = first; r <= last; ++r) {
      const mp_grid_coord c = mp_grid_coord_of(grid, r);
      if (c.dp_rank < low.dp_rank) low.dp_rank = c.dp_rank;
      if (c.pp_rank < low.pp_rank) low.pp_rank = c.pp_rank;
      if (c.tp_rank < low.tp_rank) low.tp_rank = c.tp_rank;
      if (c.dp_rank > high.dp_rank) high.dp_rank = c.dp_rank;
      if (c.pp_rank > high.pp_rank) high.pp_rank = c.pp_rank;
      if (c.tp_rank > high.tp_rank) high.tp_rank = c.tp_rank;
    }
    char dp[24], pp[24], tp[24];
    snprintf(dp, sizeof dp, low.dp_rank == high.dp_rank ? "%d" : "%d-%d", low.dp_rank,
             high.dp_rank);
    snprintf(pp, sizeof pp, low.pp_rank == high.pp_rank ? "%d" : "%d-%d", low.pp_rank,
             high.pp_rank);
    snprintf(tp, sizeof tp, low.tp_rank == high.tp_rank ? "%d" : "%d-%d", low.tp_rank,
             high.tp_rank);
    char ranks[32];
    snprintf(ranks, sizeof ranks, first == last ? "rank %d" : "ranks %d-%d", first, last);
    printf("host %s: %s (dp %s, pp %s, tp %s)\n", state->hosts[first], ranks, dp, pp, tp);
    first = last + 1;
  }
  return MP_OK;
}

/* Prints every rank's peak resident memory with its grid coordinates (collective over the world
 * group when there is one), and on the CUDA backend the device memory its stages hold: what a
 * user compares with the plan's memory per rank. */
static mp_status print_peak_memory(run_state *state, mp_error *err) {
  const int n = state->world_size;
  const size_t device_bytes =
      state->trainer != NULL ? mp_trainer_device_bytes(state->trainer) : 0;
  /* Emulated CUDA's allocator counts its own bytes: printed beside the stages' totals, so that a
   * test need not trust what the stages say they hold. */
  size_t allocator_live = 0, allocator_peak = 0;
  const bool counted =
      device_bytes > 0 && mp_device_allocator_usage(&allocator_live, &allocator_peak);
  enum { kFields = 8 };
  float mine[kFields] = {(float)(peak_resident_bytes() / 1048576.0), (float)state->coord.dp_rank,
                         (float)state->coord.pp_rank, (float)state->coord.tp_rank,
                         (float)(device_bytes / 1048576.0), (float)state->coord.cp_rank,
                         (float)(allocator_live / 1048576.0), (float)(allocator_peak / 1048576.0)};
  float *all = malloc((size_t)n * sizeof mine);
  if (all == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  mp_status status = MP_OK;
  if (state->world_group == NULL) {
    memcpy(all, mine, sizeof mine);
  } else {
    status = mp_comm_all_gather_f32(state->world_group, mine, all, kFields, err);
  }
  if (status == MP_OK) {
    printf("memory: peak resident per rank (VmHWM):");
    for (int r = 0; r < n; ++r) {
      const float *m = all + kFields * r;
      char cp_text[16] = "";
      if (state->plan.cp > 1) snprintf(cp_text, sizeof cp_text, ", cp %d", (int)m[5]);
      printf("%s rank %d (dp %d%s, pp %d, tp %d) %.0f MiB on %s", r > 0 ? "," : "", r,
             (int)m[1], cp_text, (int)m[2], (int)m[3], (double)m[0], rank_host(state, r));
    }
    printf("\n");
    if (device_bytes > 0) {
      printf("memory: device held by the stages per rank:");
      for (int r = 0; r < n; ++r) {
        printf("%s rank %d %.1f MiB", r > 0 ? "," : "", r, (double)all[kFields * r + 4]);
      }
      printf("\n");
      if (counted) {
        printf("memory: device allocator per rank (emulated CUDA's own count, live now / peak):");
        for (int r = 0; r < n; ++r) {
          printf("%s rank %d %.1f / %.1f MiB", r > 0 ? "," : "", r,
                 (double)all[kFields * r + 6], (double)all[kFields * r + 7]);
        }
        printf("\n");
      }
    }
  }
  free(all);
  return status;
}

/* Inside the MPI job: the world (every wait bounded by comm_timeout), then every group of the
 * grid in one fixed order on every rank, this rank's coordinates; only world rank 0 keeps stdout.
 * MP_ERR_INPUT when the job's size is not the plan's. */
/* HSDP: the ZeRO shard group (zero_shard_size consecutive dp ranks) and replica group of this
 * rank, cut from its dp group's members (collective over the world, in this one order). */
static mp_status create_zero_groups(run_state *state, const mp_grid_shape *grid, mp_error *err) {
  const int shard = mp_plan_zero_shard(&state->plan);
  if (shard >= grid->dp) return MP_OK;
  int *dp_members = malloc((size_t)grid->dp * sizeof(int));
  int *members = malloc((size_t)grid->dp * sizeof(int));
  if (dp_members == NULL || members == NULL) {
    free(dp_members);
    free(members);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  mp_grid_group_of(grid, MP_GRID_DP, state->rank, dp_members);
  const mp_grid_coord me = mp_grid_coord_of(grid, state->rank);
  const int first = me.dp_rank / shard * shard;
  for (int i = 0; i < shard; ++i) members[i] = dp_members[first + i];
  mp_status status = mp_comm_group_create(state->world, members, shard, "zero-shard",
                                          &state->zero_shard_group, err);
  int count = 0;
  for (int d = me.dp_rank % shard; d < grid->dp; d += shard) members[count++] = dp_members[d];
  if (status == MP_OK) {
    status = mp_comm_group_create(state->world, members, count, "zero-replica",
                                  &state->zero_replica_group, err);
  }
  free(dp_members);
  free(members);
  return status;
}

/* Expert parallelism: this rank's ep group and expert-data-parallel group, folded over the dp x
 * cp replicas (topology/grid.h; collective over the world, in this one order). */
static mp_status create_ep_groups(run_state *state, const mp_grid_shape *grid, mp_error *err) {
  const int ep = mp_plan_ep(&state->plan);
  if (ep <= 1) return MP_OK;
  int *members = malloc((size_t)(grid->dp * grid->cp) * sizeof(int));
  if (members == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  int count = mp_grid_ep_group(grid, ep, state->rank, members);
  mp_status status =
      mp_comm_group_create(state->world, members, count, "ep", &state->ep_group, err);
  count = mp_grid_expert_dp_group(grid, ep, state->rank, members);
  if (status == MP_OK) {
    status = mp_comm_group_create(state->world, members, count, "expert-dp",
                                  &state->expert_dp_group, err);
  }
  free(members);
  return status;
}

static mp_status join_job(run_state *state, const mp_grid_shape *grid, double comm_timeout,
                          const char *config, mp_error *err) {
  const int plan_world = mp_grid_world_size(grid);
  MP_TRY(mp_comm_world_init(NULL, NULL, comm_timeout, &state->world, err));
  state->rank = mp_comm_world_rank(state->world);
  state->world_size = mp_comm_world_size(state->world);
  if (state->world_size != plan_world) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the MPI job has %d rank%s but %s needs dp x cp x pp x tp = %d x %d x %d x %d "
                   "= %d; start it with -np %d (or drop --np)",
                   state->world_size, state->world_size == 1 ? "" : "s", config, state->plan.dp,
                   grid->cp, state->plan.pp, state->plan.tp, plan_world, plan_world);
  }
  /* Every rank creates its groups in this one order (lazily created communicators in
   * different orders are a known source of hangs). */
  int *everyone = malloc((size_t)state->world_size * sizeof(int));
  if (everyone == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (int r = 0; r < state->world_size; ++r) everyone[r] = r;
  /* The weights' replicas: the dp group, or with context parallelism dp x cp. */
  const mp_grid_kind replicas = grid->cp > 1 ? MP_GRID_DP_CP : MP_GRID_DP;
  const mp_status groups =
      create_group(state, grid, MP_GRID_TP, &state->tp_group, err) != MP_OK ||
              (grid->cp > 1 && create_group(state, grid, MP_GRID_CP, &state->cp_group, err) !=
                                   MP_OK) ||
              create_group(state, grid, replicas, &state->dp_group, err) != MP_OK ||
              create_group(state, grid, MP_GRID_PP, &state->pp_group, err) != MP_OK ||
              create_group(state, grid, MP_GRID_EMBEDDING, &state->embedding_group, err) !=
                  MP_OK ||
              mp_comm_group_create(state->world, everyone, state->world_size, "world",
                                   &state->world_group, err) != MP_OK
          ? err->status
          : MP_OK;
  free(everyone);
  MP_TRY(groups);
  state->coord = mp_grid_coord_of(grid, state->rank);
  MP_TRY(create_zero_groups(state, grid, err));
  MP_TRY(create_ep_groups(state, grid, err));
  state->tp_table = mp_tp_comm_over_group(state->tp_group);
  /* Only world rank 0 speaks; the others' errors still reach stderr. */
  if (state->rank != 0 && freopen("/dev/null", "w", stdout) == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "cannot silence stdout");
  }
  return MP_OK;
}

/* The CUDA backend in a job: this rank's GPU (its index on the node modulo the GPUs) and the
 * groups' NCCL communicators when each rank of the node has a GPU of its own or gpu_comm is nccl
 * (else the groups go over MPI through the host: several ranks may then share a GPU); text gets
 * what the backend line says about it. */
static mp_status open_gpu_comms(run_state *state, mp_backend backend, const char *gpu_comm,
                                char *text, size_t text_bytes, mp_error *err) {
  text[0] = '\0';
  if (backend != MP_BACKEND_CUDA || state->world == NULL) return MP_OK;
  const int gpus = mp_device_count();
  const int device = gpus > 0 ? launcher_local_rank() % gpus : 0;
  const bool own_gpu = launcher_local_size() <= gpus;
  const bool use_nccl =
      strcmp(gpu_comm, "nccl") == 0 || (strcmp(gpu_comm, "auto") == 0 && own_gpu);
  MP_TRY(mp_device_select(device, err));
  /* The NCCL communicators, in one fixed order on every rank (tp, pp, dp) so that no rank
   * waits in one group's creation for a peer that waits in another's. --gpu-comm nccl asks for
   * NCCL even with dp = 1: the gradients then go through a one-rank communicator, which checks
   * NCCL on one GPU. */
  const bool want_dp = state->plan.dp > 1 || strcmp(gpu_comm, "nccl") == 0;
  if (use_nccl && (state->plan.tp > 1 || state->plan.pp > 1 || want_dp)) {
    if (mp_nccl_world_create(state->world, device, &state->nccl_world, err) != MP_OK ||
        (state->plan.tp > 1 &&
         mp_nccl_comm_create(state->nccl_world, state->tp_group, &state->nccl_tp, err) !=
            MP_OK) ||
        (state->plan.pp > 1 &&
         mp_nccl_comm_create(state->nccl_world, state->pp_group, &state->nccl_pp, err) !=
            MP_OK) ||
        (want_dp &&
         mp_nccl_comm_create(state->nccl_world, state->dp_group, &state->nccl_dp, err) !=
            MP_OK)) {
      return err->status;
    }
    if (state->nccl_tp != NULL) state->tp_device_table = mp_tp_comm_over_nccl(state->nccl_tp);
    /* Context parallelism's exchange, last so that the order above stays the one every rank of
     * a run without cp takes. */
    if (state->plan.cp > 1) {
      MP_TRY(mp_nccl_comm_create(state->nccl_world, state->cp_group, &state->nccl_cp, err));
      state->cp_device_table = mp_tp_comm_over_nccl(state->nccl_cp);
    }
    /* Expert parallelism's rows, after cp for the same reason. */
    if (state->ep_group != NULL && mp_comm_size(state->ep_group) > 1) {
      MP_TRY(mp_nccl_comm_create(state->nccl_world, state->ep_group, &state->nccl_ep, err));
      state->ep_device_table = mp_ep_comm_over_nccl(state->nccl_ep);
    }
  }
  if (mp_plan_world_size(&state->plan) > 1 || state->nccl_world != NULL) {
    snprintf(text, text_bytes, "; communication over %s",
             state->nccl_world != NULL ? "NCCL" : "MPI through the host");
  }
  return MP_OK;
}

/* The state line: ZeRO and recomputation as the trainer really runs them (read from its chunks,
 * not the plan), so that an option it dropped shows here. */
static void print_effective_state(const mp_trainer *trainer) {
  mp_trainer_effective e;
  mp_trainer_effective_of(trainer, &e);
  static const char *const kCut[] = {"", "optimizer state", "optimizer state and gradients",
                                     "optimizer state, gradients and block parameters"};
  char zero_text[200];
  if (e.zero_stage == 0) {
    snprintf(zero_text, sizeof zero_text, "no ZeRO (each rank keeps its shard's whole state)");
  } else if (e.zero_replicas > 1) {
    snprintf(zero_text, sizeof zero_text,
             "ZeRO-%d (%s cut over groups of %d ranks, %d replicas: hybrid sharding)",
             e.zero_stage, kCut[e.zero_stage], e.zero_ranks, e.zero_replicas);
  } else {
    snprintf(zero_text, sizeof zero_text, "ZeRO-%d (%s cut over %d ranks)", e.zero_stage,
             kCut[e.zero_stage], e.zero_ranks);
  }
  printf("state: %s; recomputation %s\n", zero_text, mp_recompute_name(e.recompute));
}

/* This rank's place among the dp x cp replicas: the dp-cp group's order (topology/grid.h). */
static int replica_rank(const run_state *state) {
  const int cp = state->plan.cp > 1 ? state->plan.cp : 1;
  return state->coord.dp_rank * cp + state->coord.cp_rank;
}

/* The trace recorder of this rank (engine/trace/trace.h), for --trace. */
static mp_status open_trace(run_state *state, const char *config, mp_error *err) {
  mp_trace_layout layout;
  memset(&layout, 0, sizeof layout);
  snprintf(layout.plan, sizeof layout.plan, "%s", config);
  snprintf(layout.schedule, sizeof layout.schedule, "%s", state->plan.schedule);
  /* The trace's grid is dp x pp x tp: with context parallelism its "dp" counts the dp x cp
   * replicas, and a rank's dp index is its replica's. */
  layout.dp = mp_plan_replicas(&state->plan);
  layout.pp = state->plan.pp;
  layout.tp = state->plan.tp;
  layout.virtual_stages = state->plan.virtual_stages;
  layout.num_micro_batches = (int)state->plan.num_micro_batches;
  return mp_trace_create(&layout, state->rank, replica_rank(state), state->coord.pp_rank,
                         state->coord.tp_rank, &state->trace, err);
}

/* What the trainer needs of the job: its groups, coordinates, trace and NCCL communicators. */
static mp_trainer_options trainer_options_of(run_state *state) {
  mp_trainer_options options = MP_TRAINER_OPTIONS_INITIALIZER;
  if (state->world != NULL) {
    options.tp = &state->tp_table;
    options.dp = state->dp_group;
    options.cp = state->cp_group;
    options.pp = state->pp_group;
    options.embedding = state->embedding_group;
    options.dp_rank = state->coord.dp_rank;
    options.pp_rank = state->coord.pp_rank;
  }
  options.trace = state->trace;
  options.nccl_dp = state->nccl_dp;
  options.zero_shard = state->zero_shard_group;
  options.zero_replica = state->zero_replica_group;
  options.ep = state->ep_group;
  options.expert_dp = state->expert_dp_group;
  options.nccl_pp = state->nccl_pp;
  options.tp_device = state->nccl_tp != NULL ? &state->tp_device_table : NULL;
  options.cp_device = state->nccl_cp != NULL ? &state->cp_device_table : NULL;
  options.ep_device = state->nccl_ep != NULL ? &state->ep_device_table : NULL;
  return options;
}

/* Ends a rank's message with where it runs and, when the job spans hosts, which ranks run on
 * which host (up to 8 hosts), so that the peers a message names (a group's ranks, a peer that
 * did not answer) are hosts too: "(rank 4 runs on node2; ranks 0-3 on node1, 4-7 on node2)". */
static void append_hosts(const run_state *state, mp_error *err) {
  char legend[512] = "";
  size_t used = 0;
  int runs = 0;
  bool several = false;
  /* Other ranks' hosts are known once gathered, or from the launcher's placement. */
  const bool known = state->hosts != NULL || getenv("MPENGINE_RANK_HOSTS") != NULL;
  for (int first = 0; known && first < state->world_size && runs <= 8;) {
    char host[64];
    snprintf(host, sizeof host, "%s", rank_host(state, first));
    int last = first;
    while (last + 1 < state->world_size && strcmp(rank_host(state, last + 1), host) == 0) ++last;
    if (first > 0 || last + 1 < state->world_size) several = true;
    char span[32];
    snprintf(span, sizeof span, first == last ? "%d" : "%d-%d", first, last);
    if (used < sizeof legend) {
      used += (size_t)snprintf(legend + used, sizeof legend - used, "%s%s on %s",
                               runs > 0 ? ", " : "; ranks ", span, host);
    }
    ++runs;
    first = last + 1;
  }
  const size_t length = strlen(err->message);
  snprintf(err->message + length, sizeof err->message - length, " (rank %d runs on %s%s)",
           state->rank, rank_host(state, state->rank), several && runs <= 8 ? legend : "");
}

/* cli_report from a rank of a parallel run: runtime errors are printed by the rank that met
 * them, prefixed "rank R: "; input errors, the same on every rank, by rank 0 alone. */
static int rank_report(cli_command *command, const run_state *state, const mp_error *err) {
  if (state->world_size <= 1) return cli_report(command, err);
  if (err->status == MP_ERR_INPUT && state->rank != 0) {
    return CLI_EXIT_USAGE;
  }
  char prefix[32];
  snprintf(prefix, sizeof prefix, "rank %d:", state->rank);
  mp_error prefixed = *err;
  if (strncmp(err->message, prefix, strlen(prefix)) != 0) {
    snprintf(prefixed.message, sizeof prefixed.message, "rank %d: %s", state->rank, err->message);
  }
  append_hosts(state, &prefixed);
  return cli_report(command, &prefixed);
}

/* Enough tokens for every step to see fresh samples, bounded so the default starts fast. */
static int64_t synthetic_token_count(const mp_plan *plan, int64_t steps) {
  const int64_t needed = steps * plan->global_batch * plan->seq_len + 1;
  const int64_t minimum = 64 * plan->seq_len + 1;
  const int64_t cap = (int64_t)1 << 22;
  int64_t count = needed < cap ? needed : cap;
  return count > minimum ? count : minimum;
}

static mp_status open_data(const char *data_glob, int64_t steps, run_state *state,
                           mp_error *err) {
  const mp_plan *plan = &state->plan;
  const int64_t vocab = mp_model_vocab_size(state->model);
  state->entropy_floor = NAN;
  if (data_glob != NULL) return mp_data_loader_open_glob(data_glob, vocab, &state->data, err);
  if (vocab > MP_MARKOV_MAX_VOCAB) {
    return mp_fail(err, MP_ERR_INPUT,
                   "the synthetic default source needs vocab_size <= %d (the model has %lld); "
                   "give token shards with --data",
                   MP_MARKOV_MAX_VOCAB, (long long)vocab);
  }
  MP_TRY(mp_markov_source_build(vocab, MP_MARKOV_DEFAULT_SUCCESSORS, plan->training.seed,
                                &state->source, err));
  const int64_t count = synthetic_token_count(plan, steps);
  state->synthetic_tokens = malloc((size_t)count * sizeof(uint16_t));
  if (state->synthetic_tokens == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %lld synthetic tokens",
                   (long long)count);
  }
  mp_markov_source_sample(state->source, plan->training.seed, count, state->synthetic_tokens);
  state->entropy_floor = mp_markov_source_entropy_rate(state->source);
  char name[128];
  snprintf(name, sizeof name, "synthetic Markov source (vocab %lld, seed %llu)", (long long)vocab,
           (unsigned long long)plan->training.seed);
  return mp_data_loader_from_tokens(state->synthetic_tokens, count, vocab, name, &state->data,
                                    err);
}

/* The held-out data of --eval-every: --val-data's shards; else the last tokens of --data's
 * stream (cut off the training data, so no step trains on them); else a sample of the synthetic
 * source of its own (another seed: tokens training never draws). Enough for `batches` global
 * batches without repeating a sample where the data allows. */
static mp_status open_val_data(const char *val_glob, const char *data_glob, int64_t batches,
                               run_state *state, mp_error *err) {
  const mp_plan *plan = &state->plan;
  const int64_t vocab = mp_model_vocab_size(state->model);
  const int64_t wanted = batches * plan->global_batch * plan->seq_len + 1;
  if (val_glob != NULL) {
    if (mp_data_loader_open_glob(val_glob, vocab, &state->val_data, err) != MP_OK) {
      return mp_error_prefix(err, "--val-data");
    }
  } else if (data_glob != NULL) {
    const int64_t tenth = mp_data_loader_num_tokens(state->data) / 10;
    MP_TRY(mp_data_loader_hold_out(state->data, wanted < tenth ? wanted : tenth,
                                   &state->val_data, err));
  } else {
    uint16_t *tokens = malloc((size_t)wanted * sizeof(uint16_t));
    if (tokens == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for held-out tokens");
    const uint64_t kValidationStream = 0x56414C4944415445ull; /* "VALIDATE" */
    mp_markov_source_sample(state->source, plan->training.seed ^ kValidationStream, wanted,
                            tokens);
    char name[160];
    snprintf(name, sizeof name, "held-out sample of the synthetic Markov source (%lld tokens)",
             (long long)wanted);
    const mp_status status =
        mp_data_loader_from_tokens(tokens, wanted, vocab, name, &state->val_data, err);
    free(tokens);
    MP_TRY(status);
  }
  return mp_data_loader_check(state->val_data, plan->seq_len, err);
}

/* The held-out loss: the mean over `batches` global batches of the held-out data (the same
 * batches at every evaluation), every rank taking part. */
static mp_status evaluate_held_out(run_state *state, int64_t batches, double *loss,
                                   mp_error *err) {
  double sum = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    double one = 0.0;
    MP_TRY(mp_trainer_evaluate(state->trainer, state->val_data, b, &one, err));
    sum += one;
  }
  *loss = sum / (double)batches;
  return MP_OK;
}

static void format_duration(double seconds, char *out, size_t out_bytes) {
  if (seconds < 0 || !isfinite(seconds)) seconds = 0;
  int total = (int)(seconds + 0.5);
  if (total >= 3600) {
    snprintf(out, out_bytes, "%dh%02dm", total / 3600, total / 60 % 60);
  } else {
    snprintf(out, out_bytes, "%dm%02ds", total / 60, total % 60);
  }
}

/* One step's line. peak_flops_per_s is every rank's peak together; TFLOP/s is per rank; memory is
 * the largest resident set over the ranks. */
static void print_step(const mp_step_metrics *m, int64_t steps, double floor, bool terminal,
                       double elapsed, double peak_flops_per_s, int ranks, double memory_bytes) {
  char floor_text[48] = "";
  if (isfinite(floor)) snprintf(floor_text, sizeof floor_text, " (floor %.4f)", floor);
  const double flops_per_s = m->flops / m->seconds;
  const double rank_flops_per_s = flops_per_s / (double)ranks;
  char memory_text[48] = "";
  if (memory_bytes > 0) {
    snprintf(memory_text, sizeof memory_text, " | mem %.0f MiB%s", memory_bytes / 1048576.0,
             ranks > 1 ? "/rank max" : "");
  }
  char mfu_text[48] = "";
  const double mfu = peak_flops_per_s > 0 ? flops_per_s / peak_flops_per_s : 0.0;
  if (mfu > 1.0) {
    /* Faster than the peak it is measured against: the peak is wrong, not the run. */
    snprintf(mfu_text, sizeof mfu_text, " | MFU n/a (above the peak)");
  } else if (peak_flops_per_s > 0) {
    snprintf(mfu_text, sizeof mfu_text, " | MFU %.1f%%", 100.0 * mfu);
  }
  if (!terminal) {
    printf("step %lld/%lld | loss %.6f%s | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.3f "
           "TFLOP/s%s%s%s\n",
           (long long)m->step + 1, (long long)steps, m->loss, floor_text, m->learning_rate,
           m->grad_norm, m->seconds * 1e3, m->tokens_per_s, rank_flops_per_s / 1e12,
           ranks > 1 ? "/rank" : "", mfu_text, memory_text);
    fflush(stdout);
    return;
  }
  const int width = 24;
  const int filled = (int)((double)(m->step + 1) / (double)steps * width);
  char bar[32];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
  bar[width] = '\0';
  char eta[16];
  format_duration(elapsed / (double)(m->step + 1) * (double)(steps - m->step - 1), eta,
                  sizeof eta);
  printf("\r[%s] %lld/%lld loss %.4f%s lr %.2e norm %.3f %.0f tok/s%s%s ETA %s   ", bar,
         (long long)m->step + 1, (long long)steps, m->loss, floor_text, m->learning_rate,
         m->grad_norm, m->tokens_per_s, mfu_text, memory_text, eta);
  if (m->step + 1 == steps) printf("\n");
  fflush(stdout);
}

/* One JSON object per line, each written by one write() of the whole line to a file opened
 * O_APPEND: a kill leaves whole lines only, and a resumed run's lines follow the earlier ones. */
static void write_metrics_line(int fd, const char *line) {
  const size_t length = strlen(line);
  if (write(fd, line, length) != (ssize_t)length) {
    fprintf(stderr, "mpengine run: warning: --metrics: a line could not be written whole: %s\n",
            strerror(errno));
  }
}

static void write_metrics(int fd, const mp_step_metrics *m) {
  char line[512];
  snprintf(line, sizeof line,
           "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.6g, "
           "\"tokens_per_s\": %.6g, \"tflops_per_s\": %.6g}\n",
           (long long)m->step, m->loss, m->learning_rate, m->grad_norm, m->seconds * 1e3,
           m->tokens_per_s, m->flops / m->seconds / 1e12);
  write_metrics_line(fd, line);
}

/* --metrics FILE before anything runs: a run that does not resume never truncates a file that
 * holds lines (another run's metrics) unless --overwrite-metrics says so; a resume appends. */
static mp_status check_metrics_file(const char *path, bool resume, bool overwrite,
                                    mp_error *err) {
  struct stat info;
  if (resume || overwrite || stat(path, &info) != 0 || info.st_size == 0) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "--metrics %s already holds %lld bytes of another run's metrics; give "
                 "--resume to continue that run and append to it, --overwrite-metrics to "
                 "replace it, or another file",
                 path, (long long)info.st_size);
}

static mp_status open_metrics_file(const char *path, bool resume, int *fd, mp_error *err) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (resume ? O_APPEND : O_TRUNC | O_APPEND);
  *fd = open(path, flags, 0666);
  if (*fd < 0) {
    return mp_fail(err, MP_ERR_INPUT, "--metrics %s: cannot %s the file: %s", path,
                   resume ? "open" : "create", strerror(errno));
  }
  return MP_OK;
}

/* Fault injection, for the failure tests only (tests/tools/failure_test.sh):
 * MPENGINE_FAULT="kill:RANK:STEP" makes world rank RANK raise SIGKILL on itself just before step
 * STEP (counted from 1, as printed); "hang:RANK:STEP" makes it stop answering there (it sleeps
 * until it is killed). The other ranks then meet the lost or silent peer as in a real failure.
 * A fault stands for one failure: a resumed run (--resume, or a --max-restarts restart) replays
 * the steps after its checkpoint without it. */
typedef struct {
  enum { FAULT_NONE, FAULT_KILL, FAULT_HANG } kind;
  long rank, step;
} run_fault;

/* Parses MPENGINE_FAULT strictly; MP_ERR_INPUT naming the variable when it is malformed. */
static mp_status parse_fault(run_fault *fault, mp_error *err) {
  memset(fault, 0, sizeof *fault);
  const char *text = getenv("MPENGINE_FAULT");
  if (text == NULL || text[0] == '\0') return MP_OK;
  const char *rest = NULL;
  if (strncmp(text, "kill:", 5) == 0) {
    fault->kind = FAULT_KILL;
    rest = text + 5;
  } else if (strncmp(text, "hang:", 5) == 0) {
    fault->kind = FAULT_HANG;
    rest = text + 5;
  }
  char *end = NULL;
  bool ok = rest != NULL && *rest >= '0' && *rest <= '9';
  if (ok) {
    errno = 0;
    fault->rank = strtol(rest, &end, 10);
    ok = errno == 0 && *end == ':' && end[1] >= '0' && end[1] <= '9' && fault->rank < INT_MAX;
  }
  if (ok) {
    rest = end + 1;
    fault->step = strtol(rest, &end, 10);
    ok = errno == 0 && *end == '\0' && fault->step >= 1;
  }
  if (!ok) {
    fault->kind = FAULT_NONE;
    return mp_fail(err, MP_ERR_INPUT,
                   "MPENGINE_FAULT='%s': expected kill:RANK:STEP or hang:RANK:STEP (RANK a "
                   "world rank from 0, STEP a step from 1); the variable is for tests, unset it "
                   "to train",
                   text);
  }
  return MP_OK;
}

/* Injects the fault of MPENGINE_FAULT when this rank is about to run step `step` (0-based). */
static void inject_fault(const run_fault *fault, int rank, int64_t step) {
  if (fault->kind == FAULT_NONE || fault->rank != rank || fault->step != step + 1) return;
  fprintf(stderr, "rank %d: MPENGINE_FAULT: %s before step %lld\n", rank,
          fault->kind == FAULT_KILL ? "SIGKILL" : "hanging", (long long)step + 1);
  fflush(NULL);
  if (fault->kind == FAULT_KILL) raise(SIGKILL);
  for (;;) pause();
}

/* Set by SIGTERM / SIGINT: finish the step, save, exit 0. */
static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int signal_number) { stop_signal = signal_number; }

/* What the user asked for, read and checked before any rank starts: the launcher checks it, and
 * each rank again (the same files give every rank the same answer). */
typedef struct {
  const char *config, *checkpoint_dir, *metrics_path, *trace_path, *init_from, *weights_path;
  const char *data, *val_data, *gpu_comm;
  bool resume, override_training;
  mp_backend backend;
  char backend_reason[128]; /* why auto chose it, for the banner */
  int64_t steps, save_every, keep, eval_every, eval_batches, np;
  int64_t max_restarts;     /* --max-restarts: restarts after a lost rank (0: none) */
  const char *hostfile;     /* --hostfile, or NULL: this machine */
  int64_t log_every;        /* a step line every K steps (and the run's first and last) */
  double comm_timeout;      /* seconds */
  run_fault fault;
} run_options;

/* A started rank's run beside its run_state: where it resumes from and what its checkpoints
 * carry. */
typedef struct {
  char run_id[MP_CHECKPOINT_RUN_ID_BYTES];
  char resumed_from[4096];
  int64_t first_step;
  mp_checkpoint_context checkpoint;
  char gpu_comm_text[96];
  double startup_began; /* seconds (cli_now_seconds) */
} run_start;

/* What the steps add up to, for the summary. */
typedef struct {
  mp_step_metrics metrics; /* the last step's */
  double elapsed, startup_s, saves_s, evals_s; /* seconds */
  int64_t step, saved_step;
  bool stopped;            /* by SIGTERM / SIGINT after a save */
} run_totals;

static mp_status usage_needs(cli_command *command, mp_error *err) {
  const bool has_dir = cli_value(command, "checkpoint-dir") != NULL;
  const bool resume = cli_flag(command, "resume");
  if (!has_dir && (resume || cli_value(command, "save-every") || cli_value(command, "keep"))) {
    return mp_fail(err, MP_ERR_INPUT, "--%s needs --checkpoint-dir DIR",
                   resume ? "resume" : cli_value(command, "save-every") ? "save-every" : "keep");
  }
  if (cli_value(command, "eval-every") == NULL &&
      (cli_value(command, "eval-batches") || cli_value(command, "val-data"))) {
    return mp_fail(err, MP_ERR_INPUT, "--%s needs --eval-every K",
                   cli_value(command, "eval-batches") ? "eval-batches" : "val-data");
  }
  if (resume && cli_value(command, "init-from")) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--resume and --init-from both set the weights; give one (a resume continues "
                   "from the checkpoint's weights and optimizer state)");
  }
  return MP_OK;
}

static mp_status choose_backend(cli_command *command, run_options *o, mp_error *err) {
  const char *name = cli_value(command, "backend") ? cli_value(command, "backend") : "auto";
  o->backend = MP_BACKEND_CPU;
  if (strcmp(name, "cuda") == 0) {
    o->backend = MP_BACKEND_CUDA;
  } else if (strcmp(name, "auto") == 0) {
    /* Without an NVIDIA driver the CUDA backend is not even loaded: a CPU rank maps no CUDA. */
    const int gpus = mp_cuda_backend_gpu_possible() ? mp_device_count() : 0;
    o->backend = gpus > 0 ? MP_BACKEND_CUDA : MP_BACKEND_CPU;
    mp_gpu_report report;
    mp_error probe = MP_ERROR_INITIALIZER;
    if (gpus > 0 && mp_gpu_probe(&report, &probe) == MP_OK && report.num_devices > 0) {
      snprintf(o->backend_reason, sizeof o->backend_reason, " (auto: %s, %d GPU%s visible)",
               report.devices[0].name, gpus, gpus == 1 ? "" : "s");
    } else {
      snprintf(o->backend_reason, sizeof o->backend_reason, " (auto: no GPU visible)");
    }
  } else if (strcmp(name, "cpu") != 0) {
    return mp_fail(err, MP_ERR_INPUT, "--backend: expected auto, cpu or cuda, got '%s'", name);
  }
  return MP_OK;
}

/* --save-weights writes llm.c's GPT-2 file: refused before training for a model it cannot hold. */
static mp_status check_save_weights(const run_state *state, const char *path, mp_error *err) {
  mp_param_layout *layout = NULL;
  if (mp_param_layout_create(state->model, (int)state->plan.seq_len, &layout, err) != MP_OK) {
    return MP_OK; /* the trainer reports what the runtime cannot run */
  }
  const bool gpt2 = mp_param_layout_config(layout)->family == MP_FAMILY_GPT2;
  mp_param_layout_free(layout);
  if (gpt2) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "--save-weights %s: llm.c's files hold GPT-2 models, and %s is a Llama-family "
                 "model; save a checkpoint (--checkpoint-dir) and write it as a Hugging Face "
                 "checkpoint with mpengine export --format hf",
                 path, state->plan.model_path);
}

/* Steps a run of `steps` prints at most this many lines for by default (--log-every). */
enum { RUN_DEFAULT_STEP_LINES = 50 };

/* --log-every's default: every step of a short run (at most RUN_DEFAULT_STEP_LINES steps), else
 * ceil(steps / RUN_DEFAULT_STEP_LINES), about that many lines. */
static int64_t default_log_every(int64_t steps) {
  if (steps <= RUN_DEFAULT_STEP_LINES) return 1;
  return (steps + RUN_DEFAULT_STEP_LINES - 1) / RUN_DEFAULT_STEP_LINES;
}

/* Whether step (0-based) gets its printed line: every --log-every-th, the run's first (the
 * resumed one after --resume) and its last; on a terminal every step redraws the progress bar.
 * --metrics keeps every step whatever this says. */
static bool step_logged(const run_options *o, int64_t first_step, int64_t step, bool terminal) {
  return terminal || step == first_step || step + 1 == o->steps || (step + 1) % o->log_every == 0;
}

/* Reads and checks every option, loads the plan and model into state. */
static mp_status read_options(cli_command *command, run_state *state, run_options *o,
                              mp_error *err) {
  memset(o, 0, sizeof *o);
  MP_TRY(usage_needs(command, err));
  MP_TRY(choose_backend(command, o, err));
  o->config = cli_value(command, "config");
  if (o->config == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "missing --config PLAN.json (usage: %s)", command->usage);
  }
  o->checkpoint_dir = cli_value(command, "checkpoint-dir");
  o->resume = cli_flag(command, "resume");
  o->override_training = cli_flag(command, "override-training");
  o->metrics_path = cli_value(command, "metrics");
  o->trace_path = cli_value(command, "trace");
  o->init_from = cli_value(command, "init-from");
  o->weights_path = cli_value(command, "save-weights");
  o->data = cli_value(command, "data");
  o->val_data = cli_value(command, "val-data");
  o->gpu_comm = cli_value(command, "gpu-comm") ? cli_value(command, "gpu-comm") : "auto";
  MP_TRY(mp_plan_load(o->config, &state->plan, err));
  MP_TRY(cli_int(command, "steps", 1, state->plan.training.steps, &o->steps, err));
  MP_TRY(cli_int(command, "save-every", 1, 0, &o->save_every, err));
  MP_TRY(cli_int(command, "keep", 1, 0, &o->keep, err));
  MP_TRY(cli_int(command, "eval-every", 1, 0, &o->eval_every, err));
  MP_TRY(cli_int(command, "eval-batches", 1, 4, &o->eval_batches, err));
  MP_TRY(cli_int(command, "log-every", 1, default_log_every(o->steps), &o->log_every, err));
  MP_TRY(mp_model_load(state->plan.model_path, &state->model, err));
  state->plan.training.steps = o->steps; /* the schedule decays over the steps actually run */
  MP_TRY(mp_trainer_check_layout(&state->plan, o->backend, err));
  if (o->backend == MP_BACKEND_CUDA) MP_TRY(mp_cuda_backend_load(err));
  if (o->backend == MP_BACKEND_CUDA && mp_device_count() == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--backend cuda: no CUDA GPU is visible (check nvidia-smi and "
                   "CUDA_VISIBLE_DEVICES), or use --backend cpu");
  }
  const int plan_world = mp_plan_world_size(&state->plan);
  MP_TRY(cli_int(command, "np", 1, plan_world, &o->np, err));
  o->hostfile = cli_value(command, "hostfile");
  o->max_restarts = 0;
  MP_TRY(cli_int(command, "max-restarts", 0, 0, &o->max_restarts, err));
  if (o->max_restarts > 0 && o->checkpoint_dir == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--max-restarts %lld: a restart resumes from the latest checkpoint, so it "
                   "needs --checkpoint-dir DIR (and --save-every K to lose at most K steps)",
                   (long long)o->max_restarts);
  }
  o->comm_timeout = 300.0;
  const char *timeout_text = cli_value(command, "comm-timeout");
  if (timeout_text != NULL) {
    char *end = NULL;
    o->comm_timeout = strtod(timeout_text, &end);
    if (end == timeout_text || *end != '\0' || !(o->comm_timeout > 0) ||
        !isfinite(o->comm_timeout)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "--comm-timeout: expected a positive number of seconds, got '%s'",
                     timeout_text);
    }
  }
  /* What a user wrote before is checked before any rank starts. */
  if (o->metrics_path != NULL) {
    MP_TRY(check_metrics_file(o->metrics_path, o->resume, cli_flag(command, "overwrite-metrics"),
                              err));
  }
  if (o->checkpoint_dir != NULL && !o->resume) {
    MP_TRY(mp_checkpoint_check_dir(o->checkpoint_dir, err));
  }
  MP_TRY(parse_fault(&o->fault, err));
  if (strcmp(o->gpu_comm, "auto") != 0 && strcmp(o->gpu_comm, "nccl") != 0 &&
      strcmp(o->gpu_comm, "mpi") != 0) {
    return mp_fail(err, MP_ERR_INPUT, "--gpu-comm: expected auto, nccl or mpi, got '%s'",
                   o->gpu_comm);
  }
  if (state->plan.seq_len > mp_model_seq_len(state->model)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: $.batch.seq_len %lld exceeds the model's seq_len %lld (%s)",
                   o->config, (long long)state->plan.seq_len,
                   (long long)mp_model_seq_len(state->model), state->plan.model_path);
  }
  if (o->trace_path != NULL && o->backend == MP_BACKEND_CUDA) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--trace records runs on the CPU backend for now; add --backend cpu, or leave "
                   "out --trace");
  }
  if (o->weights_path != NULL) MP_TRY(check_save_weights(state, o->weights_path, err));
  return MP_OK;
}

/* A joined rank's start-up: its GPU communicators, trace, data, trainer and weights (from
 * --init-from or the checkpoint it resumes), the run's id, and the metrics file. */
static mp_status start_rank(run_state *state, const run_options *o, run_start *s, mp_error *err) {
  /* Data parallelism on GPUs: each rank takes the GPU of its index on the node, and the gradients
   * go over NCCL when every rank of the node has a GPU of its own, else through the host over
   * MPI (several ranks sharing one GPU: NCCL refuses that). */
  MP_TRY(open_gpu_comms(state, o->backend, o->gpu_comm, s->gpu_comm_text,
                        sizeof s->gpu_comm_text, err));
  if (o->trace_path != NULL) MP_TRY(open_trace(state, o->config, err));
  const mp_trainer_options trainer_options = trainer_options_of(state);
  s->startup_began = cli_now_seconds();
  MP_TRY(open_data(o->data, o->steps, state, err));
  if (o->eval_every > 0) MP_TRY(open_val_data(o->val_data, o->data, o->eval_batches, state, err));
  MP_TRY(mp_trainer_create_parallel(&state->plan, state->model, state->data, o->backend,
                                    &trainer_options, &state->trainer, err));
  if (o->init_from != NULL) MP_TRY(mp_trainer_load_weights(state->trainer, o->init_from, err));
  /* The run's id goes into every checkpoint it saves: a fresh run's new one (world rank 0's,
   * broadcast only when there are checkpoints to name), or on --resume the id of the run it
   * continues. */
  int64_t found = 0;
  if (o->resume) {
    MP_TRY(mp_checkpoint_find_latest(o->checkpoint_dir, s->resumed_from, sizeof s->resumed_from,
                                     &found, err));
    MP_TRY(mp_checkpoint_run_id(s->resumed_from, s->run_id, sizeof s->run_id, err));
  }
  if (s->run_id[0] == '\0') mp_checkpoint_new_run_id(s->run_id, sizeof s->run_id);
  if (o->checkpoint_dir != NULL && state->world_group != NULL) {
    MP_TRY(mp_comm_broadcast(state->world_group, s->run_id, sizeof s->run_id, 0, err));
  }
  const mp_checkpoint_context checkpoint = {
      .plan = &state->plan, .model = state->model, .trainer = state->trainer,
      .world = state->world_group, .dp = state->dp_group, .ep = state->ep_group,
      .dp_rank = replica_rank(state),
      .pp_rank = state->coord.pp_rank, .tp_rank = state->coord.tp_rank, .run_id = s->run_id,
      .override_training = o->override_training};
  s->checkpoint = checkpoint;
  if (o->resume) {
    MP_TRY(mp_checkpoint_load(s->resumed_from, &s->checkpoint, &s->first_step, err));
    if (s->first_step > o->steps) {
      return mp_fail(err, MP_ERR_INPUT,
                     "--resume: %s has %lld steps done, more than --steps %lld; give --steps %lld "
                     "or more",
                     s->resumed_from, (long long)s->first_step, (long long)o->steps,
                     (long long)s->first_step);
    }
  } else if (o->checkpoint_dir != NULL) {
    MP_TRY(mp_checkpoint_check_trainer(&s->checkpoint, err));
  }
  if (state->rank == 0 && o->metrics_path != NULL) {
    MP_TRY(open_metrics_file(o->metrics_path, o->resume, &state->metrics_fd, err));
  }
  return MP_OK;
}

/* What is about to run: model, plan, backend and its peak, data, where the weights come from. */
static mp_status print_banner(run_state *state, const run_options *o, const run_start *s,
                              mp_error *err) {
  mp_cluster cluster;
  MP_TRY(mp_cluster_load(state->plan.cluster, &cluster, err));
  /* MFU of the whole job: the model's FLOPs against every rank's peak (on CPU ranks sharing
   * cores, the cores they keep busy: topology/cluster.h). */
  const bool shared_cores = o->backend == MP_BACKEND_CPU && cluster.cores_per_node > 0;
  const int dtype = o->backend == MP_BACKEND_CUDA ? MP_DTYPE_BF16 : MP_DTYPE_FP32;
  /* A GPU rank is its own device, whatever cores the plan's cluster says the host has. */
  state->peak_flops_per_s = shared_cores
                                ? mp_cluster_job_peak_flops(&cluster, dtype, state->world_size)
                                : cluster.peak_flops_per_s[dtype] * (double)state->world_size;
  const double busy_cores =
      shared_cores ? state->peak_flops_per_s / cluster.peak_flops_per_s[dtype] : 0.0;
  const mp_plan *plan = &state->plan;
  const mp_param_layout *layout = mp_trainer_layout(state->trainer);
  const mp_model_config *c = mp_param_layout_config(layout);
  printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %zu parameters\n",
         mp_model_name(state->model), c->num_layers, c->num_heads, c->channels, c->vocab_size,
         c->padded_vocab_size, mp_param_layout_num_params(layout));
  char ranks_text[224] = "1 rank";
  if (state->world_size > 1) {
    char cp_text[32] = "";
    if (plan->cp > 1) snprintf(cp_text, sizeof cp_text, " x cp %d", plan->cp);
    char ep_text[64] = "";
    if (mp_plan_ep(plan) > 1) {
      snprintf(ep_text, sizeof ep_text, ", ep %d: %d of the %d experts a rank", plan->ep,
               c->moe_experts / plan->ep, c->moe_experts);
    }
    snprintf(ranks_text, sizeof ranks_text,
             "%d ranks (dp %d%s x pp %d x tp %d%s%s; schedule %s, %d chunk%s per pipeline rank)",
             state->world_size, plan->dp, cp_text, plan->pp, plan->tp,
             plan->sequence_parallel ? ", sequence parallelism" : "", ep_text, plan->schedule,
             plan->virtual_stages, plan->virtual_stages == 1 ? "" : "s");
  }
  char every_text[64] = "";
  if (o->log_every > 1) {
    snprintf(every_text, sizeof every_text, " (a line every %lld: --log-every)",
             (long long)o->log_every);
  }
  printf("plan %s: %s, global batch %lld = %lld micro-batches x %lld sequences x %lld "
         "tokens, %lld steps%s\n",
         o->config, ranks_text, (long long)plan->global_batch,
         (long long)plan->num_micro_batches, (long long)plan->micro_batch,
         (long long)plan->seq_len, (long long)o->steps, every_text);
  print_effective_state(state->trainer);
  char ranks_times[64] = "";
  if (shared_cores) {
    snprintf(ranks_times, sizeof ranks_times, "%.0f busy core%s x ", busy_cores,
             busy_cores == 1.0 ? "" : "s");
  } else if (state->world_size > 1) {
    snprintf(ranks_times, sizeof ranks_times, "%d x ", state->world_size);
  }
  printf("backend: %s%s%s; MFU against %s%s's %s peak of %.2f TFLOP/s%s\n",
         mp_backend_name(o->backend), o->backend_reason, s->gpu_comm_text, ranks_times,
         cluster.name, o->backend == MP_BACKEND_CUDA ? "bf16" : "fp32",
         state->peak_flops_per_s / 1e12,
         cluster.placeholder ? " (uncalibrated placeholder: `mpengine calibrate` measures it)"
                             : "");
  const int num_files = mp_data_loader_num_files(state->data);
  if (num_files > 0) {
    printf("data: %s (%d file%s), %lld tokens\n", mp_data_loader_name(state->data), num_files,
           num_files == 1 ? "" : "s", (long long)mp_data_loader_num_tokens(state->data));
  } else {
    printf("data: %s, %lld tokens\n", mp_data_loader_name(state->data),
           (long long)mp_data_loader_num_tokens(state->data));
  }
  if (state->val_data != NULL) {
    printf("held-out data: %s, %lld tokens (evaluated every %lld steps over %lld batches)\n",
           mp_data_loader_name(state->val_data),
           (long long)mp_data_loader_num_tokens(state->val_data), (long long)o->eval_every,
           (long long)o->eval_batches);
  }
  if (isfinite(state->entropy_floor)) {
    printf("entropy floor of the source: %.4f nats/token (the lowest loss any model can "
           "reach)\n",
           state->entropy_floor);
  }
  if (o->init_from != NULL) printf("initialised from %s\n", o->init_from);
  if (o->resume) {
    printf("resumed from %s: %lld of %lld steps done\n", s->resumed_from,
           (long long)s->first_step, (long long)o->steps);
  }
  return MP_OK;
}

static mp_status save_checkpoint(const run_options *o, const run_start *s, int64_t step,
                                 run_totals *t, mp_error *err) {
  const double began = cli_now_seconds();
  MP_TRY(mp_checkpoint_save(o->checkpoint_dir, step, (int)o->keep, &s->checkpoint, err));
  t->saves_s += cli_now_seconds() - began;
  t->saved_step = step;
  printf("checkpoint: saved %s/step-%lld\n", o->checkpoint_dir, (long long)step);
  fflush(stdout);
  return MP_OK;
}

/* The held-out loss after step (0-based), printed and in --metrics. */
static mp_status run_evaluation(run_state *state, const run_options *o, int64_t step,
                                bool terminal, run_totals *t, mp_error *err) {
  double held_out = 0.0;
  const double began = cli_now_seconds();
  MP_TRY(evaluate_held_out(state, o->eval_batches, &held_out, err));
  t->evals_s += cli_now_seconds() - began;
  if (terminal) printf("\n");
  printf("eval after step %lld/%lld | held-out loss %.6f | %lld batches x %lld sequences\n",
         (long long)step + 1, (long long)o->steps, held_out, (long long)o->eval_batches,
         (long long)state->plan.global_batch);
  fflush(stdout);
  if (state->metrics_fd >= 0) {
    char line[160];
    snprintf(line, sizeof line, "{\"step\": %lld, \"val_loss\": %.9g, \"val_batches\": %lld}\n",
             (long long)step, held_out, (long long)o->eval_batches);
    write_metrics_line(state->metrics_fd, line);
  }
  return MP_OK;
}

/* The steps from s->first_step: each printed (and in --metrics), the held-out loss every
 * --eval-every, a checkpoint every --save-every and when every rank agrees a stop signal came. */
static mp_status train_steps(run_state *state, const run_options *o, const run_start *s,
                             bool terminal, run_totals *t, mp_error *err) {
  t->saved_step = o->resume ? s->first_step : -1;
  for (t->step = s->first_step; t->step < o->steps; ++t->step) {
    const int64_t step = t->step;
    if (!o->resume) inject_fault(&o->fault, state->rank, step);
    MP_TRY(mp_trainer_step(state->trainer, step, &t->metrics, err));
    t->elapsed += t->metrics.seconds;
    double memory_bytes = 0.0;
    MP_TRY(max_resident_bytes(state, &memory_bytes, err));
    const bool logged = step_logged(o, s->first_step, step, terminal);
    if (logged) {
      print_step(&t->metrics, o->steps, state->entropy_floor, terminal, t->elapsed,
                 state->peak_flops_per_s, state->world_size, memory_bytes);
    }
    if (state->metrics_fd >= 0) write_metrics(state->metrics_fd, &t->metrics);
    if (o->eval_every > 0 && ((step + 1) % o->eval_every == 0 || step + 1 == o->steps)) {
      MP_TRY(run_evaluation(state, o, step, terminal, t, err));
    }
    if (o->checkpoint_dir == NULL) continue;
    float stop = stop_signal != 0 ? 1.0f : 0.0f;
    if (state->world_group != NULL) {
      MP_TRY(mp_comm_all_reduce_sum_f32(state->world_group, &stop, 1, err));
    }
    t->stopped = stop > 0.0f;
    if (t->stopped && !logged) {
      /* A stopped run's last step is shown too. */
      print_step(&t->metrics, o->steps, state->entropy_floor, terminal, t->elapsed,
                 state->peak_flops_per_s, state->world_size, memory_bytes);
    }
    const bool due = (o->save_every > 0 && (step + 1) % o->save_every == 0) || step + 1 == o->steps;
    if (due || t->stopped) {
      if (terminal) printf("\n");
      MP_TRY(save_checkpoint(o, s, step + 1, t, err));
    }
    if (t->stopped) {
      ++t->step;
      break;
    }
  }
  return MP_OK;
}

/* After the last step: the final checkpoint, --save-weights, the trace, and the summary. */
static mp_status finish_run(run_state *state, const run_options *o, const run_start *s,
                            run_totals *t, mp_error *err) {
  if (o->checkpoint_dir != NULL && t->saved_step != o->steps) {
    MP_TRY(save_checkpoint(o, s, o->steps, t, err));
  }
  if (o->weights_path != NULL) {
    const double began = cli_now_seconds();
    mp_status saved = mp_trainer_save_llmc(state->trainer, o->weights_path, err);
    /* Only rank 0 writes: its outcome becomes every rank's, so none waits for it later. */
    MP_TRY(mp_comm_agree(state->world_group, saved, err));
    t->saves_s += cli_now_seconds() - began;
    printf("weights: saved %s (llm.c GPT-2 checkpoint, fp32)\n", o->weights_path);
  }
  if (state->trace != NULL) {
    MP_TRY(mp_trace_write(state->trace, state->world_group, o->trace_path, err));
    printf("trace: wrote %s (draw it with: mpengine timeline %s)\n", o->trace_path,
           o->trace_path);
  }
  printf("done: %lld steps in %.1f s, final loss %.6f", (long long)o->steps, t->elapsed,
         t->metrics.loss);
  if (isfinite(state->entropy_floor)) {
    printf(" (%.4f above the entropy floor %.4f)", t->metrics.loss - state->entropy_floor,
           state->entropy_floor);
  }
  printf("\n");
  printf("time: start-up %.2f s (data, model, initialisation%s), steps %.2f s, saves %.2f s",
         t->startup_s, o->init_from != NULL || o->resume ? ", loading" : "", t->elapsed,
         t->saves_s);
  if (o->eval_every > 0) printf(", held-out evaluation %.2f s", t->evals_s);
  printf("\n");
  return print_peak_memory(state, err);
}

static void catch_stop_signals(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, NULL);
  sigaction(SIGINT, &action, NULL);
}

/* Outside a job: the ranks under mpirun, on this machine or on --hostfile's hosts (read, names
 * resolved and whole tp groups placed before anything starts: bad input exits 2 here), and after
 * a lost rank with --max-restarts N, the job again from the latest complete checkpoint (--resume
 * added), at most N times. Returns the exit code. */
static int launch(cli_command *command, int argc, char **argv, const run_state *state,
                  const run_options *o) {
  const char *mpirun = cli_value(command, "mpirun") ? cli_value(command, "mpirun") : "mpirun";
  mp_error err = MP_ERROR_INITIALIZER;
  mp_hostfile hostfile = {0};
  mp_placement placement = {0};
  run_hosts hosts = {0};
  if (o->hostfile != NULL) {
    if (mp_hostfile_read(o->hostfile, &hostfile, &err) != MP_OK ||
        mp_hostfile_check_resolves(&hostfile, &err) != MP_OK ||
        mp_hostfile_place(&hostfile, (int)o->np, state->plan.tp, &placement, &err) != MP_OK) {
      mp_hostfile_free(&hostfile);
      return cli_report(command, &err);
    }
    hosts.hostfile = &hostfile;
    hosts.placement = &placement;
  }
  char **args = calloc((size_t)argc + 2, sizeof *args);
  if (args == NULL) {
    mp_placement_free(&placement);
    mp_hostfile_free(&hostfile);
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory");
    return cli_report(command, &err);
  }
  int count = argc;
  for (int i = 0; i < argc; ++i) args[i] = argv[i];
  int exit_code = CLI_EXIT_FAILURE;
  for (int64_t restart = 0;; ++restart) {
    bool lost = false;
    exit_code = run_relaunch(command, count, args, (int)o->np, mpirun, &hosts, &lost);
    if (exit_code == CLI_EXIT_OK || !lost || restart >= o->max_restarts) break;
    char latest[4096];
    int64_t step = 0;
    mp_error none = MP_ERROR_INITIALIZER;
    if (mp_checkpoint_find_latest(o->checkpoint_dir, latest, sizeof latest, &step, &none) !=
        MP_OK) {
      fprintf(stderr,
              "mpengine run: not restarting: %s holds no complete checkpoint yet to resume from "
              "(save more often with --save-every K)\n",
              o->checkpoint_dir);
      break;
    }
    fprintf(stderr, "mpengine run: restart %lld of %lld: resuming from %s (step %lld)\n",
            (long long)(restart + 1), (long long)o->max_restarts, latest, (long long)step);
    if (count == argc && !o->resume) args[count++] = "--resume";
  }
  free(args);
  mp_placement_free(&placement);
  mp_hostfile_free(&hostfile);
  return exit_code;
}

/* The run: options, the launcher (outside a job of several ranks), then on each rank start-up,
 * the steps and the finish; every error reported once, by the rank that met it. */
int cmd_run(int argc, char **argv) {
  cli_option options[] = {
      {"config", "PLAN.json", "the parallelism config to train (required)", NULL},
      {"steps", "N", "optimizer steps (default: the plan's training.steps)", NULL},
      {"data", "GLOB", "llm.c token shards (default: a synthetic Markov source in memory)", NULL},
      {"eval-every", "K", "every K steps and after the last, print and log the held-out loss", NULL},
      {"eval-batches", "N", "with --eval-every: global batches of held-out data per evaluation (default 4)", NULL},
      {"val-data", "GLOB", "with --eval-every: held-out llm.c token shards (default: the last tokens of --data, cut off the training data, or a held-out sample of the synthetic source)", NULL},
      {"backend", "auto|cpu|cuda", "where to compute (default auto: CUDA when a GPU is visible, else CPU)", NULL},
      {"init-from", "GPT2.bin|HF_DIR", "start from llm.c's GPT-2 checkpoint (fp32 or bf16) or a Hugging Face GPT-2 directory (config.json, safetensors)", NULL},
      {"metrics", "FILE", "also write one JSON object per step to FILE", NULL},
      {"log-every", "K", "print a step line every K steps, and for the first and last (default: every step of a run of at most 50, else about 50 lines; --metrics keeps every step)", NULL},
      {"checkpoint-dir", "DIR", "save sharded checkpoints under DIR/step-<N>/ (every --save-every steps, at the end, and on SIGTERM/SIGINT)", NULL},
      {"save-every", "K", "with --checkpoint-dir: save every K steps (default: only at the end)", NULL},
      {"keep", "N", "with --checkpoint-dir: keep the N newest checkpoints (default: all)", NULL},
      {"resume", NULL, "continue from the newest checkpoint in --checkpoint-dir (saved under any layout); --metrics appends", NULL},
      {"override-training", NULL, "with --resume: continue with this plan's training settings (steps, learning rate, warmup, decay, optimizer) where they differ from the checkpoint's", NULL},
      {"overwrite-metrics", NULL, "replace a --metrics FILE that holds another run's metrics", NULL},
      {"trace", "TRACE.json", "record every action and communication of every rank as a Chrome trace (draw it with mpengine timeline)", NULL},
      {"save-weights", "FILE.bin", "at the end, write the trained weights as an llm.c GPT-2 checkpoint (fp32)", NULL},
      {"np", "N", "ranks to start under mpirun (default: the plan's dp x pp x tp)", NULL},
      {"mpirun", "PATH", "the mpirun that starts the ranks (default: mpirun on PATH)", NULL},
      {"comm-timeout", "SECONDS", "a wait on a peer longer than this is an error, start-up's first connections included (default 300)", NULL},
      {"hostfile", "FILE", "run the ranks on the hosts of FILE (Open MPI's format: `host slots=N`), whole tensor-parallel groups per host, in the file's order", NULL},
      {"max-restarts", "N", "when a rank is lost, end the job and start it again from the latest checkpoint of --checkpoint-dir, at most N times (default 0)", NULL},
      {"gpu-comm", "auto|nccl|mpi", "CUDA backend: the groups (tp, pp, dp) over NCCL, or over MPI through the host, which lets ranks share a GPU (default auto: NCCL when each rank of a node has its own GPU)", NULL},
      {0},
  };
  cli_command command = {
      .command = "run",
      .usage = "mpengine run --config PLAN.json [--steps N] [--data GLOB] "
               "[--backend auto|cpu|cuda] [--init-from GPT2.bin|HF_DIR] [--metrics FILE] [--log-every K] "
               "[--checkpoint-dir DIR [--save-every K] [--keep N] [--resume [--override-training]]] "
               "[--overwrite-metrics] [--eval-every K [--eval-batches N] [--val-data GLOB]] "
               "[--trace TRACE.json] [--save-weights FILE.bin] [--np N] [--mpirun PATH] "
               "[--comm-timeout SECONDS] [--gpu-comm auto|nccl|mpi] [--hostfile FILE] "
               "[--max-restarts N]",
      .summary = "Train the model of a parallelism config on one rank or on its dp x pp x tp "
                 "ranks (launched\nunder mpirun; pipeline ranks execute the plan's schedule). "
                 "Prints a line per step (about 50\nin all for a long run, --log-every; a "
                 "progress bar with ETA on a terminal): loss, learning\nrate, gradient norm, "
                 "time, tokens/s, TFLOP/s per rank, MFU and the largest memory of a rank.",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  run_state state;
  memset(&state, 0, sizeof state);
  state.metrics_fd = -1;
  state.rank = 0;
  state.world_size = 1;
  run_options o;
  run_start s;
  memset(&s, 0, sizeof s);
  run_totals t;
  memset(&t, 0, sizeof t);
  t.metrics.loss = NAN;
  mp_error err = MP_ERROR_INITIALIZER;
  int exit_code = CLI_EXIT_OK;
  if (read_options(&command, &state, &o, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  if (!launcher_inside_job() && (o.np > 1 || o.hostfile != NULL)) {
    exit_code = launch(&command, argc, argv, &state, &o);
    goto done;
  }
  const mp_grid_shape grid = {state.plan.dp, state.plan.pp, state.plan.tp, state.plan.cp};
  if (launcher_inside_job() && join_job(&state, &grid, o.comm_timeout, o.config, &err) != MP_OK) {
    if (state.world == NULL && err.status == MP_ERR_RUNTIME) {
      /* MPI's world never came up (the peers did not connect): the launcher's word for the rank. */
      state.rank = launcher_world_rank();
      state.world_size = launcher_world_size();
    }
    exit_code = rank_report(&command, &state, &err);
    goto done;
  }
  if (state.world != NULL) {
    run_rank_joined(state.rank);
    if (gather_hosts(&state, &grid, &err) != MP_OK) {
      exit_code = rank_report(&command, &state, &err);
      goto done;
    }
  }
  if (start_rank(&state, &o, &s, &err) != MP_OK || print_banner(&state, &o, &s, &err) != MP_OK) {
    exit_code = rank_report(&command, &state, &err);
    goto done;
  }
  if (o.checkpoint_dir != NULL) catch_stop_signals();
  fflush(stdout);
  if (o.resume && s.first_step == o.steps) {
    printf("done: %s already has all %lld steps; nothing to run\n", s.resumed_from,
           (long long)o.steps);
    goto done;
  }
  if (state.trace != NULL && state.world_group != NULL &&
      mp_trace_align_clocks(state.trace, state.world_group, &err) != MP_OK) {
    exit_code = rank_report(&command, &state, &err);
    goto done;
  }
  t.startup_s = cli_now_seconds() - s.startup_began;
  /* Under mpirun stdout is mpirun's forwarding, often a pseudo-terminal: the launcher says
   * whether the user's stdout is a terminal (MPENGINE_STDOUT_TTY). */
  const char *tty = getenv("MPENGINE_STDOUT_TTY");
  const bool terminal = state.world != NULL ? (tty != NULL && strcmp(tty, "1") == 0)
                                            : isatty(STDOUT_FILENO);
  if (train_steps(&state, &o, &s, terminal, &t, &err) != MP_OK) {
    if (terminal) printf("\n");
    exit_code = rank_report(&command, &state, &err);
    goto done;
  }
  if (t.stopped) {
    printf("stopped by %s after step %lld/%lld; continue with --resume\n",
           stop_signal == SIGINT    ? "SIGINT"
           : stop_signal == SIGTERM ? "SIGTERM"
                                    : "a signal to another rank",
           (long long)t.step, (long long)o.steps);
    goto done;
  }
  if (finish_run(&state, &o, &s, &t, &err) != MP_OK) {
    exit_code = rank_report(&command, &state, &err);
    goto done;
  }
done:
  run_state_free(&state);
  run_rank_leaving(); /* whatever happened, this rank said it (the launcher names silent ones) */
  if (state.world != NULL) {
    if (exit_code == CLI_EXIT_FAILURE) {
      /* A runtime failure may be this rank's alone (a lost peer, a timeout): the others could be
       * waiting on it, and MPI_Finalize could too. Exit now; mpirun then ends the job. */
      fflush(NULL);
      _exit(exit_code);
    }
    mp_comm_world_finalize(state.world);
  }
  return exit_code;
}
