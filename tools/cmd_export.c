/*
 * tools/cmd_export.c — `mpengine export --checkpoint DIR --out model.bin` (or `--format hf --out
 * HF_DIR`): a checkpoint to llm.c's GPT-2 format (version 3, fp32), so llm.c and its tools can
 * use what mpengine trained, or to a Hugging Face directory (GPT2LMHeadModel, or for the Llama
 * family LlamaForCausalLM / Qwen2ForCausalLM with q-k-v biases: config.json and
 * model.safetensors, fp32; --max-shard-size splits it into a sharded set with its index, as
 * save_pretrained does) that transformers' from_pretrained loads. An existing HF --out is refused
 * unless --force.
 *
 * DIR is one checkpoint (DIR/manifest.json) or a --checkpoint-dir, whose newest complete
 * checkpoint is taken. It may come from any layout (dp, pp, tp, virtual stages, ZeRO-1; or a
 * version-1 checkpoint): every shard file is checked against the manifest's checksum and each
 * global tensor is gathered from the files of the pipeline rank holding it
 * (engine/checkpoint/checkpoint.h); the model comes from the description the manifest carries, so
 * the export needs no other file. The llm.c result equals what `mpengine run --save-weights` writes
 * at that step; both load with `mpengine run --init-from`.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/model/param_layout.h"
#include "tools/cli.h"
#include "tools/commands.h"

/* transformers' convert_file_size_to_int for byte units: a whole number of bytes, or one with
 * KB, MB, GB (10^3, 10^6, 10^9) or KiB, MiB, GiB (2^10, 2^20, 2^30), case-insensitive. */
static mp_status parse_size(const char *text, int64_t *out, mp_error *err) {
  char *end = NULL;
  const double value = strtod(text, &end);
  static const struct {
    const char *unit;
    double scale;
  } units[] = {{"", 1.0},      {"B", 1.0},          {"KB", 1e3},         {"MB", 1e6},
               {"GB", 1e9},    {"KIB", 1024.0},     {"MIB", 1048576.0},  {"GIB", 1073741824.0}};
  for (size_t i = 0; end != text && i < sizeof units / sizeof units[0]; ++i) {
    if (strcasecmp(end, units[i].unit) == 0 && value * units[i].scale >= 1.0 &&
        value * units[i].scale < 9e18) {
      *out = (int64_t)(value * units[i].scale);
      return MP_OK;
    }
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "--max-shard-size %s: expected a size in bytes, or with KB, MB, GB, KiB, MiB or "
                 "GiB (e.g. 5GB)",
                 text);
}

int cmd_export(int argc, char **argv) {
  cli_option options[] = {
      {"checkpoint", "DIR", "a checkpoint (DIR/manifest.json) or a --checkpoint-dir (its newest) (required)", NULL},
      {"out", "FILE|DIR", "llm.c GPT-2 checkpoint to write (version 3, fp32), or with --format hf the directory (required)", NULL},
      {"format", "llmc|hf", "llmc: llm.c's GPT-2 file (default); hf: a Hugging Face directory (config.json, model.safetensors) of GPT2LMHeadModel, LlamaForCausalLM or Qwen2ForCausalLM", NULL},
      {"max-shard-size", "SIZE", "with --format hf: split the weights into files of at most SIZE (bytes, or 200KB, 5GB, 2GiB ... as transformers' max_shard_size)", NULL},
      {"force", NULL, "with --format hf: write into an --out that exists", NULL},
      {0},
  };
  cli_command command = {
      .command = "export",
      .usage = "mpengine export --checkpoint DIR --out model.bin | --format hf --out HF_DIR "
               "[--max-shard-size SIZE] [--force]",
      .summary = "Write a checkpoint's weights (gathered from every shard) in llm.c's GPT-2 "
                 "format, version 3, or as a Hugging Face checkpoint (GPT-2, Llama or Qwen2).",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  mp_error err = MP_ERROR_INITIALIZER;
  const char *dir = cli_value(&command, "checkpoint");
  const char *out = cli_value(&command, "out");
  if (dir == NULL || out == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing --%s (usage: %s)", dir == NULL ? "checkpoint" : "out",
            command.usage);
    return cli_report(&command, &err);
  }
  const char *format_name = cli_value(&command, "format");
  const bool hf = format_name != NULL && strcmp(format_name, "hf") == 0;
  if (!hf && format_name != NULL && strcmp(format_name, "llmc") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--format %s: expected llmc or hf", format_name);
    return cli_report(&command, &err);
  }
  if (hf && !cli_flag(&command, "force") && access(out, F_OK) == 0) {
    mp_fail(&err, MP_ERR_INPUT, "--out %s exists; give --force to write into it, or another --out",
            out);
    return cli_report(&command, &err);
  }
  mp_weight_sink_options sink_options = MP_WEIGHT_SINK_OPTIONS_INITIALIZER;
  const char *max_shard = cli_value(&command, "max-shard-size");
  if (max_shard != NULL && !hf) {
    mp_fail(&err, MP_ERR_INPUT, "--max-shard-size needs --format hf");
    return cli_report(&command, &err);
  }
  if (max_shard != NULL && parse_size(max_shard, &sink_options.max_shard_bytes, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  char path[4096];
  int64_t step = 0;
  if (mp_checkpoint_resolve(dir, "--checkpoint", path, sizeof path, &step, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  size_t num_params = 0;
  int exit_code = CLI_EXIT_OK;
  if (mp_checkpoint_export(path, hf ? MP_WEIGHT_FORMAT_HF : MP_WEIGHT_FORMAT_LLMC, &sink_options,
                           out, &step, &num_params, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else {
    printf("exported %s (step %lld, %zu parameters) to %s (%s)\n", path, (long long)step,
           num_params, out,
           hf ? "Hugging Face checkpoint: config.json and safetensors, fp32"
              : "llm.c GPT-2, version 3, fp32");
  }
  return exit_code;
}
