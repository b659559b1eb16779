/*
 * tools/cmd_import.c — `mpengine import HF_DIR --out MODEL.json`: the model description of a
 * Hugging Face checkpoint, from its config.json, to plan, describe and (once weights load) run.
 *
 * The mapping and every refusal live in topology/hf_config.h, so that `run --init-from HF_DIR`
 * reads a checkpoint the same way; this file parses the options, writes the file and says what
 * it wrote. A file that exists is never replaced without --force: an import is usually the
 * first step of editing a description by hand, and the edits must not be lost to a rerun.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/atomic_file.h"
#include "topology/hf_config.h"
#include "topology/layer_cost.h"
#include "topology/model.h"
#include "tools/cli.h"
#include "tools/commands.h"

/* 8030261248 -> "8,030,261,248". */
static const char *with_commas(long long value, char *out, size_t out_bytes) {
  char digits[32];
  snprintf(digits, sizeof digits, "%lld", value);
  size_t length = strlen(digits), used = 0;
  for (size_t i = 0; i < length && used + 2 < out_bytes; ++i) {
    if (i > 0 && (length - i) % 3 == 0) out[used++] = ',';
    out[used++] = digits[i];
  }
  out[used] = '\0';
  return out;
}

/* "32 blocks, hidden 4096, 32 heads (8 kv), ffn 14336 swiglu, rmsnorm, rope 500000 llama3,
 * vocab 128256, seq_len 8192, untied head, 8,030,261,248 parameters"; a mixture of experts:
 * "ffn 8 experts x 14336 swiglu (top 2)", "+ shared 5632 gated", and "(12,879,925,248 active)". */
static void summarize(const mp_model *model, char *out, size_t out_bytes) {
  const mp_layer_spec *block = NULL, *head = NULL;
  for (int i = 0; i < mp_model_num_layers(model); ++i) {
    const mp_layer_spec *layer = mp_model_layer(model, i);
    if (layer->kind == MP_LAYER_TRANSFORMER && block == NULL) block = layer;
    if (layer->kind == MP_LAYER_LM_HEAD) head = layer;
  }
  char params[32], rope[64] = "learned positions";
  with_commas((long long)mp_model_params(model), params, sizeof params);
  if (block != NULL && block->rope_theta > 0.0) {
    snprintf(rope, sizeof rope, "rope %.15g%s", block->rope_theta,
             block->rope_scaling.llama3 ? " llama3-scaled" : "");
  }
  static const char *const kBias[] = {"no biases", "q-k-v biases", "biases"};
  char ffn[128] = "", active[64] = "";
  if (block != NULL && mp_layer_is_moe(block)) {
    const mp_moe_spec *moe = &block->moe;
    char shared[48] = "";
    if (moe->shared_ffn_hidden > 0) {
      snprintf(shared, sizeof shared, " + shared %lld%s", (long long)moe->shared_ffn_hidden,
               moe->shared_gate ? " gated" : "");
    }
    snprintf(ffn, sizeof ffn, "%lld experts x %lld swiglu (top %lld)%s",
             (long long)moe->experts, (long long)moe->expert_ffn_hidden, (long long)moe->top_k,
             shared);
    char count[32];
    snprintf(active, sizeof active, " (%s active)",
             with_commas((long long)mp_model_active_params(model), count, sizeof count));
  } else {
    snprintf(ffn, sizeof ffn, "%lld %s", block ? (long long)block->ffn_hidden : 0LL,
             block && block->activation == MP_ACTIVATION_SWIGLU ? "swiglu" : "gelu");
  }
  snprintf(out, out_bytes,
           "%d blocks, hidden %lld, %lld heads (%lld kv), ffn %s, %s, %s, %s, vocab %lld, "
           "seq_len %lld, %s head, %s parameters%s",
           mp_model_num_transformer_layers(model), block ? (long long)block->hidden : 0LL,
           block ? (long long)block->heads : 0LL, block ? (long long)block->kv_heads : 0LL,
           ffn, block && block->norm == MP_NORM_RMSNORM ? "rmsnorm" : "layernorm",
           block ? kBias[block->bias] : "", rope, (long long)mp_model_vocab_size(model),
           (long long)mp_model_seq_len(model), head && head->tie_embedding ? "tied" : "untied",
           params, active);
}

static mp_status write_description(const char *out, const char *text, mp_error *err) {
  if (strcmp(out, "-") == 0) {
    if (fputs(text, stdout) == EOF || fflush(stdout) != 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "stdout: cannot write: %s", strerror(errno));
    }
    return MP_OK;
  }
  return mp_write_file_atomically(out, text, strlen(text), err);
}

int cmd_import(int argc, char **argv) {
  cli_option options[] = {
      {"out", "MODEL.json|-", "the model description to write; - for stdout (required)", NULL},
      {"seq-len", "S", "the description's seq_len (default: max_position_embeddings; GPT-2: "
                       "n_positions, its most)", NULL},
      {"name", "NAME", "the model's name (default: _name_or_path's last part, else HF_DIR's "
                       "name)", NULL},
      {"force", NULL, "replace MODEL.json if it exists (without it, an existing file is an "
                      "error)", NULL},
      {0},
  };
  cli_command command = {
      .command = "import",
      .usage = "mpengine import HF_DIR --out MODEL.json|- [--seq-len S] [--name NAME] [--force]",
      .summary =
          "Write the model description (topology/model.h) of a Hugging Face checkpoint from its\n"
          "HF_DIR/config.json (HF_DIR may also be the config.json itself): LlamaForCausalLM,\n"
          "MistralForCausalLM without a sliding window, Qwen2ForCausalLM and GPT2LMHeadModel,\n"
          "with transformers' defaults for the keys a config leaves out. What the description\n"
          "cannot represent is refused (exit 2) naming the config key and its value: sliding\n"
          "windows, mixtures of experts, rope_scaling other than llama3, activations other than\n"
          "silu (GPT-2: the tanh GELU), a head_dim other than hidden / heads, biases on\n"
          "attention or the MLP alone, attention-only dropout, other architectures. The\n"
          "result loads with describe, plan and run; the weights do not come with it yet.",
      .min_positionals = 1,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  const char *out = cli_value(&command, "out");
  if (out == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing --out MODEL.json (or --out - for stdout) (usage: %s)",
            command.usage);
    return cli_report(&command, &err);
  }
  mp_hf_import_options import_options = MP_HF_IMPORT_OPTIONS_INITIALIZER;
  if (cli_int(&command, "seq-len", 1, 0, &import_options.seq_len, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  import_options.name = cli_value(&command, "name");
  /* Checked before reading anything, so the refusal comes first and costs nothing. The file
   * could still appear between here and the rename; for a file a person edits, that is not a
   * race worth a second mechanism. */
  struct stat existing;
  if (strcmp(out, "-") != 0 && !cli_flag(&command, "force") && lstat(out, &existing) == 0) {
    mp_fail(&err, MP_ERR_INPUT,
            "--out %s: the file exists; import does not replace it (give --force to, or "
            "another --out)",
            out);
    return cli_report(&command, &err);
  }

  cJSON *description = NULL;
  mp_hf_import_info info;
  if (mp_hf_config_to_model_json(command.positionals[0], &import_options, &description, &info,
                                 &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  char *text = NULL;
  mp_model *model = NULL;
  mp_status status = mp_hf_model_json_text(description, &text, &err);
  cJSON_Delete(description);
  if (status == MP_OK) status = mp_model_parse_text(text, out, &model, &err);
  if (status == MP_OK) status = write_description(out, text, &err);
  int exit_code = CLI_EXIT_OK;
  if (status != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else {
    /* On stderr, so that --out - leaves stdout to the description alone. */
    char summary[512];
    summarize(model, summary, sizeof summary);
    fprintf(stderr, "mpengine import: wrote %s: %s (%s from %s): %s\n",
            strcmp(out, "-") == 0 ? "stdout" : out, mp_model_name(model), info.architecture,
            info.config_path, summary);
  }
  mp_model_free(model);
  free(text);
  return exit_code;
}
