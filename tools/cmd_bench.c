/*
 * tools/cmd_bench.c — `mpengine bench`: the benchmarks (DESIGN.md), one action each.
 *
 *   mpengine bench step MODEL.json [--micro-batch B] [--seq-len T] [--seed S]
 *                       [--init-from GPT2.bin] [--source markov|uniform] [--steps N]
 *                       [--warmup W] [--dump DIR]
 *       times full one-rank training steps of the model on one fixed batch: zero the gradients,
 *       forward, backward, global-norm clipping, AdamW, on the stage `run` trains on one rank
 *       (engine/model/stage_cpu.h at tp = 1, the whole chain). With --dump it first writes what a
 * peer
 *       implementation needs to check our numbers (tools/bench/torch_compare.py loads it into a
 *       PyTorch GPT-2 and compares the loss and every gradient).
 *
 * Why a fixed batch and a fixed optimizer here, not a plan: the peer must run exactly the same
 * step, so its hyperparameters are pinned (lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0,
 * clip at norm 1), and the BLAS thread count is left to the environment (OPENBLAS_NUM_THREADS)
 * so both sides can be given the same one.
 *
 * The dump directory (created if missing; only the four files below are replaced, each written to
 * a temporary name and renamed into place, anything else in DIR is left alone):
 *   model.bin   the weights before the step: llm.c's GPT-2 checkpoint, version 3 (fp32)
 *   grads.bin   d(mean loss)/d(weights) of one forward + backward, in the same header and order
 *   tokens.bin  the batch: 4 x int32 header (magic 20250517, version 1, B, T), then inputs (B, T)
 *               and targets (B, T) as int32, all little endian
 *   loss.txt    the mean cross-entropy of that forward in nats, printed with %.9g
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/json_reader.h"
#include "engine/model/param_layout.h"
#include "engine/model/stage_cpu.h"
#include "engine/data/markov_source.h"
#include "engine/weights/weight_source.h"
#include "engine/weights/llmc_file.h"
#include "layers/adamw.h"
#include "topology/model.h"
#include "common/atomic_file.h"
#include "tools/cli.h"
#include "tools/commands.h"

enum {
  kDefaultSeed = 1337,
  kDefaultMicroBatch = 4,
  kDefaultSeqLen = 64,
  kDefaultSteps = 10,
  kDefaultWarmup = 2,
  kTokensMagic = 20250517,
  kTokensVersion = 1,
};

/* The optimizer of the step, pinned so a peer implementation can run the same one. */
static const double kLearningRate = 1e-4;
static const double kBeta1 = 0.9;
static const double kBeta2 = 0.95;
static const double kAdamEps = 1e-8;
static const double kWeightDecay = 0.0;
static const double kGradClip = 1.0;

static double clock_seconds(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wall time, what the benchmark reports. */
static double now_seconds(void) { return clock_seconds(CLOCK_MONOTONIC); }

/* CPU time of the whole process (every thread): on a machine shared with other work it counts
 * only what we ran, not the time spent waiting for a core. */
static double cpu_seconds(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

/* splitmix64: the uniform token source, a pure function of the seed. */
static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Fills inputs and targets (B, T) from one stream of B * T + 1 tokens: row b reads tokens
 * [b T, b T + T) and predicts tokens [b T + 1, b T + T]. markov draws the stream from the
 * model-vocabulary Markov source of `run` (engine/data/markov_source.h), uniform draws every id
 * with equal probability. */
static mp_status draw_batch(const char *source_name, int64_t vocab, uint64_t seed, int B, int T,
                            int32_t *inputs, int32_t *targets, mp_error *err) {
  const int64_t count = (int64_t)B * T + 1;
  int32_t *stream = malloc((size_t)count * sizeof *stream);
  if (stream == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %lld tokens",
                                     (long long)count);
  if (strcmp(source_name, "markov") == 0) {
    mp_markov_source *source = NULL;
    uint16_t *sample = malloc((size_t)count * sizeof *sample);
    mp_status status = sample == NULL ? mp_fail(err, MP_ERR_RUNTIME, "out of memory")
                                      : mp_markov_source_build(vocab, MP_MARKOV_DEFAULT_SUCCESSORS,
                                                               seed, &source, err);
    if (status == MP_OK) {
      mp_markov_source_sample(source, seed, count, sample);
      for (int64_t i = 0; i < count; ++i) stream[i] = sample[i];
    }
    mp_markov_source_free(source);
    free(sample);
    if (status != MP_OK) {
      free(stream);
      return status;
    }
  } else {
    uint64_t state = seed;
    for (int64_t i = 0; i < count; ++i) stream[i] = (int32_t)(splitmix64(&state) % (uint64_t)vocab);
  }
  for (int b = 0; b < B; ++b) {
    memcpy(inputs + (size_t)b * T, stream + (size_t)b * T, (size_t)T * sizeof(int32_t));
    memcpy(targets + (size_t)b * T, stream + (size_t)b * T + 1, (size_t)T * sizeof(int32_t));
  }
  free(stream);
  return MP_OK;
}

/* Writes `bytes` from each of the `parts` buffers to path through a temporary name renamed into
 * place, so a reader never sees half a file. */
static mp_status write_file(const char *path, int parts, const void *const *data,
                            const size_t *bytes, mp_error *err) {
  mp_atomic_file file;
  MP_TRY(mp_atomic_file_open(&file, path, err));
  for (int i = 0; i < parts; ++i) mp_atomic_file_write(&file, data[i], bytes[i]);
  return mp_atomic_file_commit(&file, err);
}

/* One forward + backward (dloss 1) from zero gradients, then the four files of the file comment.
 * The weights are not changed. */
static mp_status dump_step(mp_stage_cpu *gpt, const char *dir, const int32_t *inputs,
                           const int32_t *targets, int B, int T, double *loss, mp_error *err) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    return mp_fail(err, MP_ERR_INPUT, "--dump %s: cannot create the directory: %s", dir,
                   strerror(errno));
  }
  struct stat info;
  if (stat(dir, &info) != 0 || !S_ISDIR(info.st_mode)) {
    return mp_fail(err, MP_ERR_INPUT, "--dump %s: exists and is not a directory", dir);
  }
  mp_stage_cpu_zero_grads(gpt);
  MP_TRY(mp_stage_cpu_forward(gpt, inputs, targets, 1.0f, loss, err));
  MP_TRY(mp_stage_cpu_backward(gpt, err));

  /* At tp = 1 the whole-model stage's arrays are the one-rank layout's flat arrays. */
  const mp_param_layout *layout = mp_stage_layout_model(mp_stage_cpu_layout(gpt));
  char path[1024];
  snprintf(path, sizeof path, "%s/model.bin", dir);
  MP_TRY(mp_llmc_save(layout, mp_stage_cpu_params(gpt), path, err));
  snprintf(path, sizeof path, "%s/grads.bin", dir);
  MP_TRY(mp_llmc_save(layout, mp_stage_cpu_grads(gpt), path, err));

  const size_t tokens = (size_t)B * (size_t)T;
  const int32_t header[4] = {kTokensMagic, kTokensVersion, B, T};
  const void *const token_parts[3] = {header, inputs, targets};
  const size_t token_bytes[3] = {sizeof header, tokens * sizeof(int32_t),
                                 tokens * sizeof(int32_t)};
  snprintf(path, sizeof path, "%s/tokens.bin", dir);
  MP_TRY(write_file(path, 3, token_parts, token_bytes, err));

  char text[64];
  snprintf(text, sizeof text, "%.9g\n", *loss);
  const void *const text_parts[1] = {text};
  const size_t text_bytes[1] = {strlen(text)};
  snprintf(path, sizeof path, "%s/loss.txt", dir);
  return write_file(path, 1, text_parts, text_bytes, err);
}

/* Seconds of each phase of one training step (wall), and of the whole step in CPU time. */
typedef struct {
  double total, forward, backward, optimizer, cpu;
} step_times;

/* One full training step (the pinned optimizer of the file comment) on the fixed batch; t is
 * AdamW's 1-based step count. Returns the loss. */
static mp_status train_step(mp_stage_cpu *gpt, float *adam_m, float *adam_v,
                            const int32_t *inputs, const int32_t *targets, int t,
                            step_times *times, double *loss, mp_error *err) {
  const double cpu_start = cpu_seconds();
  const double start = now_seconds();
  mp_stage_cpu_zero_grads(gpt);
  MP_TRY(mp_stage_cpu_forward(gpt, inputs, targets, 1.0f, loss, err));
  const double forward_done = now_seconds();
  MP_TRY(mp_stage_cpu_backward(gpt, err));
  const double backward_done = now_seconds();
  float *params = mp_stage_cpu_params(gpt);
  float *grads = mp_stage_cpu_grads(gpt);
  const size_t n = mp_stage_layout_num_params(mp_stage_cpu_layout(gpt));
  /* The clip factor multiplies each gradient inside AdamW: no separate scaling pass. */
  const float scale = mp_clip_scale(sqrt(mp_grad_norm_squared_cpu(grads, n)), kGradClip);
  for (int i = 0; i < mp_stage_layout_num_tensors(mp_stage_cpu_layout(gpt)); ++i) {
    const mp_stage_tensor *tensor = mp_stage_layout_tensor(mp_stage_cpu_layout(gpt), i);
    const size_t offset = tensor->offset;
    mp_adamw_update_scaled_cpu(params + offset, grads + offset, adam_m + offset, adam_v + offset,
                               tensor->count, (float)kLearningRate, (float)kBeta1,
                               (float)kBeta2, (float)kAdamEps,
                               tensor->full->weight_decay ? (float)kWeightDecay : 0.0f, t, scale);
  }
  const double end = now_seconds();
  times->cpu = cpu_seconds() - cpu_start;
  times->total = end - start;
  times->forward = forward_done - start;
  times->backward = backward_done - forward_done;
  times->optimizer = end - backward_done;
  return MP_OK;
}

static int compare_doubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of values (n >= 1); sorts them. */
static double median(double *values, int n) {
  qsort(values, (size_t)n, sizeof *values, compare_doubles);
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/* Everything bench step allocates, freed in one place. */
typedef struct {
  mp_model *model;
  mp_stage_cpu *gpt;            /* the whole model as one stage at tp = 1 */
  int32_t *inputs, *targets; /* (B, T) */
  float *adam_m, *adam_v;    /* (num_params,) */
  double *times;             /* (5, steps): total, forward, backward, optimizer, cpu */
} bench_state;

static void bench_state_free(bench_state *state) {
  free(state->times);
  free(state->adam_v);
  free(state->adam_m);
  free(state->targets);
  free(state->inputs);
  mp_stage_cpu_free(state->gpt);
  mp_model_free(state->model);
}

/* Runs warmup + steps training steps and prints the timing report. */
static mp_status time_steps(bench_state *state, int B, int T, int64_t warmup, int64_t steps,
                            mp_error *err) {
  const size_t n = mp_stage_layout_num_params(mp_stage_cpu_layout(state->gpt));
  state->adam_m = calloc(n, sizeof(float));
  state->adam_v = calloc(n, sizeof(float));
  state->times = calloc(5 * (size_t)steps, sizeof(double));
  if (state->adam_m == NULL || state->adam_v == NULL || state->times == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for optimizer state (%zu parameters)", n);
  }
  double *total = state->times, *forward = total + steps, *backward = forward + steps,
         *optimizer = backward + steps, *cpu = optimizer + steps;
  double first_loss = 0.0, last_loss = 0.0, sum = 0.0, fastest = INFINITY, slowest = 0.0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    step_times times;
    double loss = 0.0;
    MP_TRY(train_step(state->gpt, state->adam_m, state->adam_v, state->inputs, state->targets,
                      (int)(i + 1), &times, &loss, err));
    if (!isfinite(loss)) {
      return mp_fail(err, MP_ERR_RUNTIME, "step %lld: the loss is %g", (long long)i + 1, loss);
    }
    if (i == 0) first_loss = loss;
    last_loss = loss;
    if (i < warmup) continue;
    const int64_t k = i - warmup;
    total[k] = times.total;
    forward[k] = times.forward;
    backward[k] = times.backward;
    optimizer[k] = times.optimizer;
    cpu[k] = times.cpu;
    sum += times.total;
    if (times.total < fastest) fastest = times.total;
    if (times.total > slowest) slowest = times.total;
  }
  const int count = (int)steps;
  const double median_total = median(total, count);
  printf("timing: %lld steps after %lld warmup (zero grads, forward, backward, clip 1.0, "
         "AdamW lr %g betas (%g, %g) eps %g wd %g)\n",
         (long long)steps, (long long)warmup, kLearningRate, kBeta1, kBeta2, kAdamEps,
         kWeightDecay);
  printf("  step: median %.3f ms/step, mean %.3f ms, min %.3f ms, max %.3f ms; %.0f tokens/s\n",
         median_total * 1e3, sum / count * 1e3, fastest * 1e3, slowest * 1e3,
         (double)B * T / median_total);
  printf("  phases (median ms): forward %.3f, backward %.3f, optimizer %.3f\n",
         median(forward, count) * 1e3, median(backward, count) * 1e3,
         median(optimizer, count) * 1e3);
  printf("  cpu: median %.3f ms/step of process CPU time (not counting waits for a core)\n",
         median(cpu, count) * 1e3);
  printf("  loss %.9g at the first step, %.9g at the last\n", first_loss, last_loss);
  return MP_OK;
}

static int bench_step(int argc, char **argv) {
  cli_option options[] = {
      {"micro-batch", "B", "sequences in the batch (default 4)", NULL},
      {"seq-len", "T", "tokens per sequence (default 64)", NULL},
      {"seed", "S", "seed of the initial weights and of the tokens (default 1337)", NULL},
      {"init-from", "GPT2.bin|HF_DIR",
       "start from llm.c's GPT-2 checkpoint or a Hugging Face GPT-2 directory instead of the seed",
       NULL},
      {"source", "markov|uniform",
       "tokens from the model-vocabulary Markov source of `run` (default) or uniform", NULL},
      {"steps", "N", "timed training steps (default 10; 0 with --dump only dumps)", NULL},
      {"warmup", "W", "untimed training steps first (default 2)", NULL},
      {"dump", "DIR", "first write model.bin, grads.bin, tokens.bin, loss.txt into DIR", NULL},
      {0},
  };
  cli_command command = {
      .command = "bench step",
      .usage = "mpengine bench step MODEL.json [--micro-batch B] [--seq-len T] [--seed S] "
               "[--init-from GPT2.bin] [--steps N] [--warmup W] [--dump DIR]",
      .summary =
          "Time full one-rank training steps on one fixed batch: zero the gradients, forward,\n"
          "backward, clip the global norm at 1, AdamW (lr 1e-4, betas (0.9, 0.95), eps 1e-8,\n"
          "weight decay 0). Prints the median and mean time per step, tokens/s, and the median\n"
          "process CPU time per step (steadier than wall time on a busy machine). BLAS uses the\n"
          "threads the environment gives it (OPENBLAS_NUM_THREADS).\n\n"
          "--dump DIR first runs one forward + backward and writes, replacing only these files:\n"
          "  model.bin   the weights before the step (llm.c GPT-2 checkpoint, version 3, fp32)\n"
          "  grads.bin   the gradients of the mean loss, in the same header and tensor order\n"
          "  tokens.bin  int32 header (magic 20250517, version 1, B, T), inputs (B, T),\n"
          "              targets (B, T); int32 little endian\n"
          "  loss.txt    the loss in nats (%.9g)\n"
          "tools/bench/torch_compare.py checks them against PyTorch.",
      .min_positionals = 1,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  int64_t micro_batch = 0, seq_len = 0, seed = 0, steps = 0, warmup = 0;
  if (cli_int(&command, "micro-batch", 1, kDefaultMicroBatch, &micro_batch, &err) != MP_OK ||
      cli_int(&command, "seq-len", 1, kDefaultSeqLen, &seq_len, &err) != MP_OK ||
      cli_int(&command, "seed", 0, kDefaultSeed, &seed, &err) != MP_OK ||
      cli_int(&command, "steps", 0, kDefaultSteps, &steps, &err) != MP_OK ||
      cli_int(&command, "warmup", 0, kDefaultWarmup, &warmup, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  const int64_t limit = 1 << 20;
  if (micro_batch > limit || seq_len > limit || steps > limit || warmup > limit) {
    mp_fail(&err, MP_ERR_INPUT, "--micro-batch, --seq-len, --steps and --warmup must be at most "
                                "%lld", (long long)limit);
    return cli_report(&command, &err);
  }
  const char *source = cli_value(&command, "source") ? cli_value(&command, "source") : "markov";
  if (strcmp(source, "markov") != 0 && strcmp(source, "uniform") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--source: expected markov or uniform, got '%s'", source);
    return cli_report(&command, &err);
  }
  const char *dump_dir = cli_value(&command, "dump");
  if (steps == 0 && dump_dir == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "--steps 0 without --dump DIR does nothing; give one of them");
    return cli_report(&command, &err);
  }

  bench_state state;
  memset(&state, 0, sizeof state);
  int exit_code = CLI_EXIT_OK;
  const int B = (int)micro_batch, T = (int)seq_len;
  const mp_tp_comm single = mp_tp_comm_single();
  if (mp_model_load(command.positionals[0], &state.model, &err) != MP_OK ||
      mp_stage_cpu_create(state.model, B, T, &single, false, &state.gpt, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  const mp_model_config *c =
      mp_param_layout_config(mp_stage_layout_model(mp_stage_cpu_layout(state.gpt)));
  if (strcmp(source, "markov") == 0 && c->vocab_size > MP_MARKOV_MAX_VOCAB) {
    mp_fail(&err, MP_ERR_INPUT, "--source markov needs vocab_size <= %d (the model has %d); "
            "use --source uniform", MP_MARKOV_MAX_VOCAB, c->vocab_size);
    exit_code = cli_report(&command, &err);
    goto done;
  }
  const char *init_from = cli_value(&command, "init-from");
  if (init_from != NULL) {
    mp_weight_source *reader = NULL;
    mp_status loaded = mp_weight_source_open(mp_stage_layout_model(mp_stage_cpu_layout(state.gpt)),
                                             init_from, &reader, &err);
    if (loaded == MP_OK) loaded = mp_stage_cpu_fill_params(state.gpt, mp_weight_source_fill, reader, &err);
    mp_weight_source_close(reader);
    if (loaded != MP_OK) {
      exit_code = cli_report(&command, &err);
      goto done;
    }
  } else if (mp_stage_cpu_init_params(state.gpt, (uint64_t)seed, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  state.inputs = malloc((size_t)B * T * sizeof(int32_t));
  state.targets = malloc((size_t)B * T * sizeof(int32_t));
  if (state.inputs == NULL || state.targets == NULL) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory for the batch");
    exit_code = cli_report(&command, &err);
    goto done;
  }
  if (draw_batch(source, c->vocab_size, (uint64_t)seed, B, T, state.inputs, state.targets,
                 &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }

  printf("model %s: %d layers, %d heads, %d channels, vocab %d (padded %d), %zu parameters\n",
         mp_model_name(state.model), c->num_layers, c->num_heads, c->channels, c->vocab_size,
         c->padded_vocab_size, mp_stage_layout_num_params(mp_stage_cpu_layout(state.gpt)));
  printf("batch: %d x %d tokens from the %s source (seed %lld); weights from %s\n", B, T, source,
         (long long)seed, init_from != NULL ? init_from : "the seed");
  const char *coretype = getenv("OPENBLAS_CORETYPE");
  printf("BLAS: OpenBLAS, %d thread(s), core %s%s%s%s\n", openblas_get_num_threads(),
         openblas_get_corename(), coretype != NULL ? " (OPENBLAS_CORETYPE=" : "",
         coretype != NULL ? coretype : "", coretype != NULL ? ")" : "");
  fflush(stdout);

  if (dump_dir != NULL) {
    double loss = 0.0;
    if (dump_step(state.gpt, dump_dir, state.inputs, state.targets, B, T, &loss, &err) !=
        MP_OK) {
      exit_code = cli_report(&command, &err);
      goto done;
    }
    printf("dump: loss %.9g; wrote %s/{model.bin, grads.bin, tokens.bin, loss.txt}\n", loss,
           dump_dir);
    fflush(stdout);
  }
  if (steps > 0 && time_steps(&state, B, T, warmup, steps, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
done:
  bench_state_free(&state);
  return exit_code;
}

int cmd_bench(int argc, char **argv) {
  static const char *const kActions[] = {"step", "comm", NULL};
  const char *action = argc >= 2 ? argv[1] : NULL;
  if (action != NULL && strcmp(action, "step") == 0) return bench_step(argc - 1, argv + 1);
  if (action != NULL && strcmp(action, "comm") == 0) return cmd_bench_comm(argc - 1, argv + 1);
  if (action != NULL && (strcmp(action, "--help") == 0 || strcmp(action, "-h") == 0)) {
    printf("usage: mpengine bench step MODEL.json [options]\n"
           "       mpirun -np N mpengine bench comm [options]\n\n"
           "Benchmarks that check the numbers they time.\n\n"
           "actions:\n"
           "  step       time full training steps of a model on one rank; --dump writes the\n"
           "             weights, gradients, tokens and loss for tools/bench/torch_compare.py\n"
           "  comm       nccl-tests style table of send/recv and collectives on this machine\n\n"
           "run 'mpengine bench <action> --help' for the options\n");
    return CLI_EXIT_OK;
  }
  if (action == NULL) {
    fprintf(stderr, "mpengine bench: missing action: step or comm\n");
  } else {
    const char *closest = mp_closest_word(action, kActions);
    if (closest != NULL) {
      fprintf(stderr, "mpengine bench: unknown action '%s'; did you mean '%s'?\n", action,
              closest);
    } else {
      fprintf(stderr, "mpengine bench: unknown action '%s' (actions: step, comm)\n", action);
    }
  }
  fprintf(stderr, "run 'mpengine bench --help' for the actions\n");
  return CLI_EXIT_USAGE;
}
