/*
 * tools/mpengine.c — the `mpengine` command: dispatches to one subcommand per file.
 *
 *   mpengine import HF_DIR --out M   a Hugging Face checkpoint's model description
 *   mpengine describe MODEL.json     per-layer parameters, FLOPs and memory
 *   mpengine plan MODEL.json --gpus N  search the 3D-parallel layout
 *   mpengine schedule ...            draw the pipeline schedule a plan will run
 *   mpengine run --config PLAN.json  train
 *   mpengine timeline TRACE.json     what a run really did
 *   mpengine calibrate               measure this machine for the cost model
 *   mpengine doctor --hostfile FILE  check a cluster's hosts before a job
 *   mpengine data synth|inspect      synthetic token data with a known floor; check shards
 *   mpengine bench step MODEL.json   time training steps; dump them for a peer to check
 *   mpengine version                 build and devices
 */
#include <stdio.h>
#include <string.h>

#include "common/json_reader.h"
#include "tools/blas_kernels.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} subcommand;

static const subcommand kSubcommands[] = {
    {"import", cmd_import, "write the model description of a Hugging Face checkpoint (config.json)"},
    {"describe", cmd_describe, "per-layer parameters, FLOPs and activation memory of a model"},
    {"plan", cmd_plan, "find the fastest dp x pp x tp layout that fits, write it as PLAN.json"},
    {"schedule", cmd_schedule, "show the pipeline schedule a plan will run"},
    {"run", cmd_run, "train with a parallelism config"},
    {"export", cmd_export, "write a checkpoint's weights as llm.c's GPT-2 file or a Hugging Face directory"},
    {"sample", cmd_sample, "continue a prompt with a trained model"},
    {"timeline", cmd_timeline, "show what a run really did, against its plan"},
    {"calibrate", cmd_calibrate, "measure this machine for the cost model"},
    {"doctor", cmd_doctor, "check a cluster's hosts before a job: builds, names, TCP, GPUs, links"},
    {"data", cmd_data, "text to token shards with a Hugging Face tokenizer, and back; check shards"},
    {"bench", cmd_bench, "benchmarks: time training steps (and dump them to check against a peer)"},
    {"version", cmd_version, "print the version, the build and the devices found"},
};
enum { kNumSubcommands = sizeof kSubcommands / sizeof kSubcommands[0] };

static void print_usage(FILE *out) {
  fprintf(out,
          "mpengine: pipeline + tensor + data parallel training of transformer models\n\n"
          "usage: mpengine <command> [options]    (mpengine <command> --help for its options)\n\n"
          "commands:\n");
  for (int i = 0; i < kNumSubcommands; ++i) {
    fprintf(out, "  %-10s %s\n", kSubcommands[i].name, kSubcommands[i].summary);
  }
  fprintf(out, "\nexit codes: 0 success, 1 failure while running, 2 bad usage or bad input\n");
}

int main(int argc, char **argv) {
  tools_select_blas_kernels(argv);
  if (argc < 2) {
    print_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
    print_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (strcmp(name, "--version") == 0) return cmd_version(1, argv + 1);
  for (int i = 0; i < kNumSubcommands; ++i) {
    if (strcmp(name, kSubcommands[i].name) == 0) return kSubcommands[i].run(argc - 1, argv + 1);
  }
  const char *names[kNumSubcommands + 1];
  for (int i = 0; i < kNumSubcommands; ++i) names[i] = kSubcommands[i].name;
  names[kNumSubcommands] = NULL;
  const char *closest = mp_closest_word(name, names);
  if (closest != NULL) {
    fprintf(stderr, "mpengine: unknown command '%s'; did you mean '%s'?\n", name, closest);
  } else {
    fprintf(stderr, "mpengine: unknown command '%s'\n", name);
  }
  fprintf(stderr, "run 'mpengine --help' for the commands\n");
  return CLI_EXIT_USAGE;
}
