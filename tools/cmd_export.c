/*
 * tools/cmd_export.c — `mpengine export --checkpoint DIR --out model.bin`: a checkpoint to llm.c's
 * GPT-2 format (version 3, fp32), so llm.c and its tools can use what mpengine trained.
 *
 * DIR is one checkpoint (DIR/manifest.json) or a --checkpoint-dir, whose newest complete
 * checkpoint is taken. It may come from any layout (dp, pp, tp, virtual stages, ZeRO-1; or a
 * version-1 checkpoint): every shard file is checked against the manifest's checksum and each
 * global tensor is gathered from the files of the pipeline rank holding it (engine/checkpoint.h);
 * the model comes from the description the manifest carries, so the export needs no other file.
 * The result equals what `mpengine run --save-weights` writes at that step and loads with
 * `mpengine run --init-from model.bin`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/gpt_model.h"
#include "tools/cli.h"
#include "tools/commands.h"

int cmd_export(int argc, char **argv) {
  cli_option options[] = {
      {"checkpoint", "DIR", "a checkpoint (DIR/manifest.json) or a --checkpoint-dir (its newest) (required)", NULL},
      {"out", "FILE", "llm.c GPT-2 checkpoint to write (version 3, fp32) (required)", NULL},
      {0},
  };
  cli_command command = {
      .command = "export",
      .usage = "mpengine export --checkpoint DIR --out model.bin",
      .summary = "Write a checkpoint's weights (gathered from every shard) in llm.c's GPT-2 "
                 "format, version 3.",
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
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  int64_t step = 0;
  if (access(path, F_OK) == 0) {
    snprintf(path, sizeof path, "%s", dir);
  } else if (mp_checkpoint_find_latest(dir, path, sizeof path, &step, &err) != MP_OK) {
    mp_fail(&err, MP_ERR_INPUT,
            "--checkpoint %s: neither a checkpoint (no manifest.json) nor a directory of "
            "checkpoints (no step-<N> with a valid manifest.json)",
            dir);
    return cli_report(&command, &err);
  }
  size_t num_params = 0;
  int exit_code = CLI_EXIT_OK;
  if (mp_checkpoint_export_llmc(path, out, &step, &num_params, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else {
    printf("exported %s (step %lld, %zu parameters) to %s (llm.c GPT-2, version 3, fp32)\n",
           path, (long long)step, num_params, out);
  }
  return exit_code;
}
