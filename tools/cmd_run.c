/*
 * tools/cmd_run.c — `mpengine run --config PLAN.json`: train the plan's model.
 *
 * Today on one rank (dp = pp = tp = 1) on the CPU. Data comes from llm.c token shards (--data
 * GLOB) or, by default, from a synthetic Markov source generated in memory whose entropy rate is
 * printed next to the loss: the floor no model can beat. One line per step, or a progress bar
 * with an ETA when stdout is a terminal; --metrics FILE also writes one JSON object per step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data_loader.h"
#include "engine/device.h"
#include "engine/gpu_probe.h"
#include "engine/gpt_model.h"
#include "engine/markov_source.h"
#include "engine/trainer.h"
#include "topology/cluster.h"
#include "topology/model.h"
#include "topology/plan.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct {
  mp_plan plan;
  mp_model *model;
  mp_data_loader *data;
  mp_markov_source *source; /* the synthetic default, or NULL with --data */
  uint16_t *synthetic_tokens;
  mp_trainer *trainer;
  FILE *metrics;
  double entropy_floor;     /* nats per token, synthetic source only; NAN otherwise */
  double peak_flops_per_s;  /* the cluster's peak for the backend's dtype; 0 when unknown */
} run_state;

static void run_state_free(run_state *state) {
  if (state->metrics != NULL) fclose(state->metrics);
  mp_trainer_free(state->trainer);
  mp_data_loader_free(state->data);
  free(state->synthetic_tokens);
  mp_markov_source_free(state->source);
  mp_model_free(state->model);
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

static void format_duration(double seconds, char *out, size_t out_bytes) {
  if (seconds < 0 || !isfinite(seconds)) seconds = 0;
  int total = (int)(seconds + 0.5);
  if (total >= 3600) {
    snprintf(out, out_bytes, "%dh%02dm", total / 3600, total / 60 % 60);
  } else {
    snprintf(out, out_bytes, "%dm%02ds", total / 60, total % 60);
  }
}

static void print_step(const mp_step_metrics *m, int64_t steps, double floor, bool terminal,
                       double elapsed, double peak_flops_per_s) {
  char floor_text[48] = "";
  if (isfinite(floor)) snprintf(floor_text, sizeof floor_text, " (floor %.4f)", floor);
  const double flops_per_s = m->flops / m->seconds;
  char mfu_text[48] = "";
  if (peak_flops_per_s > 0) {
    snprintf(mfu_text, sizeof mfu_text, " | MFU %.1f%%", 100.0 * flops_per_s / peak_flops_per_s);
  }
  if (!terminal) {
    printf("step %lld/%lld | loss %.6f%s | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f "
           "TFLOP/s%s\n",
           (long long)m->step + 1, (long long)steps, m->loss, floor_text, m->learning_rate,
           m->grad_norm, m->seconds * 1e3, m->tokens_per_s, flops_per_s / 1e12, mfu_text);
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
  printf("\r[%s] %lld/%lld loss %.4f%s lr %.2e norm %.3f %.0f tok/s%s ETA %s   ", bar,
         (long long)m->step + 1, (long long)steps, m->loss, floor_text, m->learning_rate,
         m->grad_norm, m->tokens_per_s, mfu_text, eta);
  if (m->step + 1 == steps) printf("\n");
  fflush(stdout);
}

static void write_metrics(FILE *file, const mp_step_metrics *m) {
  fprintf(file,
          "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.6g, "
          "\"tokens_per_s\": %.6g, \"tflops_per_s\": %.6g}\n",
          (long long)m->step, m->loss, m->learning_rate, m->grad_norm, m->seconds * 1e3,
          m->tokens_per_s, m->flops / m->seconds / 1e12);
  fflush(file);
}

static int refuse(cli_command *command, const char *option, const char *arrives_with) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_fail(&err, MP_ERR_INPUT, "--%s is not implemented yet: %s", option, arrives_with);
  return cli_report(command, &err);
}

int cmd_run(int argc, char **argv) {
  cli_option options[] = {
      {"config", "PLAN.json", "the parallelism config to train (required)", NULL},
      {"steps", "N", "optimizer steps (default: the plan's training.steps)", NULL},
      {"data", "GLOB", "llm.c token shards (default: a synthetic Markov source in memory)", NULL},
      {"backend", "auto|cpu|cuda", "where to compute (default auto: CUDA when a GPU is visible, else CPU)", NULL},
      {"init-from", "GPT2.bin", "start from llm.c's GPT-2 checkpoint (fp32 or bf16)", NULL},
      {"metrics", "FILE", "also write one JSON object per step to FILE", NULL},
      {"checkpoint-dir", "DIR", "save checkpoints here (issue 7)", NULL},
      {"resume", NULL, "continue from the newest checkpoint (issue 7)", NULL},
      {"trace", "TRACE.json", "record a timeline of the run (issue 10)", NULL},
      {0},
  };
  cli_command command = {
      .command = "run",
      .usage = "mpengine run --config PLAN.json [--steps N] [--data GLOB] "
               "[--backend auto|cpu|cuda] [--init-from GPT2.bin] [--metrics FILE]",
      .summary = "Train the model of a parallelism config. Prints one line per step (a progress "
                 "bar with ETA\non a terminal): loss, learning rate, gradient norm, time and "
                 "tokens/s.",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  if (cli_flag(&command, "checkpoint-dir") || cli_flag(&command, "resume")) {
    return refuse(&command, cli_flag(&command, "resume") ? "resume" : "checkpoint-dir",
                  "sharded checkpoints arrive with issue 7");
  }
  if (cli_flag(&command, "trace")) {
    return refuse(&command, "trace", "the measured timeline arrives with issue 10");
  }
  const char *backend_name =
      cli_value(&command, "backend") ? cli_value(&command, "backend") : "auto";
  mp_error err = MP_ERROR_INITIALIZER;
  mp_backend backend = MP_BACKEND_CPU;
  char backend_reason[128] = "";
  if (strcmp(backend_name, "cuda") == 0) {
    backend = MP_BACKEND_CUDA;
  } else if (strcmp(backend_name, "auto") == 0) {
    const int gpus = mp_device_count();
    backend = gpus > 0 ? MP_BACKEND_CUDA : MP_BACKEND_CPU;
    mp_gpu_report report;
    if (gpus > 0 && mp_gpu_probe(&report, &err) == MP_OK && report.num_devices > 0) {
      snprintf(backend_reason, sizeof backend_reason, " (auto: %s, %d GPU%s visible)",
               report.devices[0].name, gpus, gpus == 1 ? "" : "s");
    } else {
      snprintf(backend_reason, sizeof backend_reason, " (auto: no GPU visible)");
    }
    mp_error_clear(&err);
  } else if (strcmp(backend_name, "cpu") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--backend: expected auto, cpu or cuda, got '%s'", backend_name);
    return cli_report(&command, &err);
  }
  const char *config = cli_value(&command, "config");
  if (config == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing --config PLAN.json (usage: %s)", command.usage);
    return cli_report(&command, &err);
  }

  run_state state;
  memset(&state, 0, sizeof state);
  int exit_code = CLI_EXIT_OK;
  int64_t steps = 0;
  if (mp_plan_load(config, &state.plan, &err) != MP_OK ||
      cli_int(&command, "steps", 1, state.plan.training.steps, &steps, &err) != MP_OK ||
      mp_model_load(state.plan.model_path, &state.model, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  state.plan.training.steps = steps; /* the schedule decays over the steps actually run */
  if (state.plan.seq_len > mp_model_seq_len(state.model)) {
    mp_fail(&err, MP_ERR_INPUT, "%s: $.batch.seq_len %lld exceeds the model's seq_len %lld (%s)",
            config, (long long)state.plan.seq_len, (long long)mp_model_seq_len(state.model),
            state.plan.model_path);
    exit_code = cli_report(&command, &err);
    goto done;
  }
  if (open_data(cli_value(&command, "data"), steps, &state, &err) != MP_OK ||
      mp_trainer_create(&state.plan, state.model, state.data, backend, &state.trainer, &err) !=
          MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  const char *init_from = cli_value(&command, "init-from");
  if (init_from != NULL && mp_trainer_load_llmc(state.trainer, init_from, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  const char *metrics_path = cli_value(&command, "metrics");
  if (metrics_path != NULL && (state.metrics = fopen(metrics_path, "w")) == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "--metrics %s: cannot create the file", metrics_path);
    exit_code = cli_report(&command, &err);
    goto done;
  }

  mp_cluster cluster;
  if (mp_cluster_load(state.plan.cluster, &cluster, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  state.peak_flops_per_s =
      cluster.peak_flops_per_s[backend == MP_BACKEND_CUDA ? MP_DTYPE_BF16 : MP_DTYPE_FP32];
  const mp_gpt_layout *layout = mp_trainer_layout(state.trainer);
  const mp_gpt_config *c = mp_gpt_layout_config(layout);
  printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %zu parameters\n",
         mp_model_name(state.model), c->num_layers, c->num_heads, c->channels, c->vocab_size,
         c->padded_vocab_size, mp_gpt_layout_num_params(layout));
  printf("plan %s: 1 rank, global batch %lld = %lld micro-batches x %lld sequences x %lld "
         "tokens, %lld steps\n",
         config, (long long)state.plan.global_batch, (long long)state.plan.num_micro_batches,
         (long long)state.plan.micro_batch, (long long)state.plan.seq_len, (long long)steps);
  printf("backend: %s%s; MFU against %s's %s peak of %.1f TFLOP/s\n", mp_backend_name(backend),
         backend_reason, cluster.name, backend == MP_BACKEND_CUDA ? "bf16" : "fp32",
         state.peak_flops_per_s / 1e12);
  const int num_files = mp_data_loader_num_files(state.data);
  if (num_files > 0) {
    printf("data: %s (%d file%s), %lld tokens\n", mp_data_loader_name(state.data), num_files,
           num_files == 1 ? "" : "s", (long long)mp_data_loader_num_tokens(state.data));
  } else {
    printf("data: %s, %lld tokens\n", mp_data_loader_name(state.data),
           (long long)mp_data_loader_num_tokens(state.data));
  }
  if (isfinite(state.entropy_floor)) {
    printf("entropy floor of the source: %.4f nats/token (the lowest loss any model can "
           "reach)\n",
           state.entropy_floor);
  }
  if (init_from != NULL) printf("initialised from %s\n", init_from);
  fflush(stdout);

  const bool terminal = isatty(STDOUT_FILENO);
  double elapsed = 0.0;
  mp_step_metrics metrics;
  for (int64_t step = 0; step < steps; ++step) {
    if (mp_trainer_step(state.trainer, step, &metrics, &err) != MP_OK) {
      if (terminal) printf("\n");
      exit_code = cli_report(&command, &err);
      goto done;
    }
    elapsed += metrics.seconds;
    print_step(&metrics, steps, state.entropy_floor, terminal, elapsed, state.peak_flops_per_s);
    if (state.metrics != NULL) write_metrics(state.metrics, &metrics);
  }
  printf("done: %lld steps in %.1f s, final loss %.6f", (long long)steps, elapsed, metrics.loss);
  if (isfinite(state.entropy_floor)) {
    printf(" (%.4f above the entropy floor %.4f)", metrics.loss - state.entropy_floor,
           state.entropy_floor);
  }
  printf("\n");
done:
  run_state_free(&state);
  return exit_code;
}
