/*
 * tools/cmd_sample.c — `mpengine sample`: text from a trained model, on one CPU rank.
 *
 *   mpengine sample --checkpoint DIR | --init-from HF_DIR --tokenizer DIR|tokenizer.json
 *       --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]
 *
 * The model is the one-rank stage every layout shares (engine/model/stage_cpu.h), filled from a
 * Hugging Face directory through the weight source `run --init-from` uses. A checkpoint is first
 * exported to such a directory under $TMPDIR (engine/checkpoint's export, which gathers every
 * shard from any layout), then read the same way and removed: one reader of weights, not two.
 *
 * Each new token reruns the forward over the whole window (no key/value cache): sampling here is
 * for looking at what a model learned, not for serving it. The prompt starts with the document
 * separator the training shards put before every document (tools/document_separator.h).
 * Temperature 0 is greedy decoding: the first of the largest logits, as torch.argmax picks it.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/rng.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/data/tokenizer/tokenizer.h"
#include "engine/model/stage_chain.h"
#include "engine/model/stage_cpu.h"
#include "engine/weights/weight_source.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/document_separator.h"
#include "topology/hf_config.h"
#include "topology/model.h"

enum { kDefaultTokens = 64, kDefaultSeed = 1337 };

static int remove_entry(const char *path, const struct stat *info, int flag, struct FTW *ftw) {
  (void)info;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* The model description of a Hugging Face directory, as `mpengine import` writes it. */
static mp_status model_of_hf_dir(const char *dir, mp_model **out, mp_error *err) {
  cJSON *description = NULL;
  mp_hf_import_info info;
  MP_TRY(mp_hf_config_to_model_json(dir, NULL, &description, &info, err));
  char *text = NULL;
  mp_status status = mp_hf_model_json_text(description, &text, err);
  cJSON_Delete(description);
  if (status == MP_OK) status = mp_model_parse_text(text, info.config_path, out, err);
  free(text);
  return status;
}

/* The next token from one position's logits (the first V of them). */
static int64_t choose_token(float *logits, int64_t V, double temperature, int64_t top_k,
                            mp_rng *rng) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  if (temperature <= 0.0) return best;
  /* Top-k keeps the k largest logits: a threshold at the k-th largest (ties kept). */
  float threshold = -INFINITY;
  if (top_k > 0 && top_k < V) {
    float *sorted = malloc((size_t)V * sizeof *sorted);
    if (sorted != NULL) {
      memcpy(sorted, logits, (size_t)V * sizeof *sorted);
      /* partial selection: the k-th largest by a simple nth-element */
      int64_t lo = 0, hi = V - 1, k = top_k - 1;
      while (lo < hi) {
        float pivot = sorted[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
          while (sorted[i] > pivot) ++i;
          while (sorted[j] < pivot) --j;
          if (i <= j) {
            float t = sorted[i];
            sorted[i++] = sorted[j];
            sorted[j--] = t;
          }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break;
      }
      threshold = sorted[k];
      free(sorted);
    }
  }
  double max_logit = logits[best], sum = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    double p = logits[v] >= threshold ? exp((logits[v] - max_logit) / temperature) : 0.0;
    logits[v] = (float)p;
    sum += p;
  }
  double u = mp_rng_uniform(rng) * sum, running = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    running += logits[v];
    if (u < running) return v;
  }
  return best;
}

static mp_status parse_double(const char *option, const char *text, double fallback, double *out,
                              mp_error *err) {
  if (text == NULL) {
    *out = fallback;
    return MP_OK;
  }
  char *end = NULL;
  *out = strtod(text, &end);
  if (end == text || *end != '\0' || !(*out >= 0.0) || isinf(*out)) {
    return mp_fail(err, MP_ERR_INPUT, "--%s: expected a number >= 0, got '%s'", option, text);
  }
  return MP_OK;
}

int cmd_sample(int argc, char **argv) {
  cli_option options[] = {
      {"checkpoint", "DIR", "a checkpoint (DIR/manifest.json) or a --checkpoint-dir (its newest)",
       NULL},
      {"init-from", "HF_DIR", "a Hugging Face directory (config.json, safetensors)", NULL},
      {"tokenizer", "DIR|tokenizer.json", "the Hugging Face tokenizer the model was trained "
       "with (required)", NULL},
      {"prompt", "TEXT", "the text to continue (default: empty, only the separator)", NULL},
      {"tokens", "N", "tokens to generate (default 64)", NULL},
      {"temperature", "T", "softmax temperature; 0 is greedy (default 1)", NULL},
      {"top-k", "K", "sample among the K most likely tokens only (default 0: all)", NULL},
      {"seed", "S", "seed of the sampling (default 1337)", NULL},
      {"separator", "TOKEN", "the token before the prompt (default: as `data tokenize`)", NULL},
      {"print-ids", NULL, "also print the generated ids", NULL},
      {0},
  };
  cli_command command = {
      .command = "sample",
      .usage = "mpengine sample --checkpoint DIR | --init-from HF_DIR --tokenizer "
               "DIR|tokenizer.json [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] "
               "[--seed S]",
      .summary = "Continue a prompt with a trained model on one CPU rank, and print the text.\n"
                 "The weights come from an mpengine checkpoint saved under any layout, or from a\n"
                 "Hugging Face directory. Temperature 0 decodes greedily.",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  mp_error err = MP_ERROR_INITIALIZER;
  const char *checkpoint = cli_value(&command, "checkpoint");
  const char *init_from = cli_value(&command, "init-from");
  const char *tokenizer_path = cli_value(&command, "tokenizer");
  const char *prompt = cli_value(&command, "prompt") ? cli_value(&command, "prompt") : "";
  if ((checkpoint == NULL) == (init_from == NULL)) {
    mp_fail(&err, MP_ERR_INPUT, "give the weights with --checkpoint DIR or --init-from HF_DIR "
            "(%s)", checkpoint == NULL ? "neither was given" : "not both");
    return cli_report(&command, &err);
  }
  if (tokenizer_path == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing option --tokenizer DIR|tokenizer.json: the tokenizer "
            "the model was trained with");
    return cli_report(&command, &err);
  }
  int64_t tokens = 0, top_k = 0, seed = 0;
  double temperature = 0.0;
  if (cli_int(&command, "tokens", 1, kDefaultTokens, &tokens, &err) != MP_OK ||
      cli_int(&command, "top-k", 0, 0, &top_k, &err) != MP_OK ||
      cli_int(&command, "seed", 0, kDefaultSeed, &seed, &err) != MP_OK ||
      parse_double("temperature", cli_value(&command, "temperature"), 1.0, &temperature,
                   &err) != MP_OK) {
    return cli_report(&command, &err);
  }

  int exit_code = CLI_EXIT_OK;
  char export_dir[4096] = "";
  char hf_dir[4200];
  mp_tokenizer *tokenizer = NULL;
  mp_token_encoder *encoder = NULL;
  mp_model *model = NULL;
  mp_stage_cpu *stage = NULL;
  mp_token_ids prompt_ids = {0};
  uint32_t *sequence = NULL;
  int32_t *inputs = NULL, *targets = NULL;
  float *logits = NULL;
  char *text = NULL;
  mp_weight_source *source = NULL;

  if (mp_tokenizer_load(tokenizer_path, &tokenizer, &err) != MP_OK) goto fail;
  if (checkpoint != NULL) {
    char path[4096];
    int64_t step = 0;
    const char *tmp = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    snprintf(export_dir, sizeof export_dir, "%s/mpengine-sample-XXXXXX", tmp);
    if (mp_checkpoint_resolve(checkpoint, "--checkpoint", path, sizeof path, &step, &err) !=
        MP_OK) {
      export_dir[0] = '\0';
      goto fail;
    }
    if (mkdtemp(export_dir) == NULL) {
      mp_fail(&err, MP_ERR_RUNTIME, "cannot create a directory under %s (set TMPDIR)", tmp);
      export_dir[0] = '\0';
      goto fail;
    }
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", export_dir);
    size_t num_params = 0;
    if (mp_checkpoint_export(path, MP_WEIGHT_FORMAT_HF, NULL, hf_dir, &step, &num_params, &err) !=
        MP_OK) {
      goto fail;
    }
    fprintf(stderr, "sample: %s (step %lld, %zu parameters)\n", path, (long long)step,
            num_params);
  } else {
    snprintf(hf_dir, sizeof hf_dir, "%s", init_from);
  }
  if (model_of_hf_dir(hf_dir, &model, &err) != MP_OK) goto fail;
  const int64_t model_vocab = mp_model_vocab_size(model);
  if (mp_tokenizer_vocab_size(tokenizer) > model_vocab) {
    mp_fail(&err, MP_ERR_INPUT, "--tokenizer %s: its vocabulary has %lld ids but the model's "
            "has %lld (%s): it is not the tokenizer the model was trained with",
            mp_tokenizer_path(tokenizer), (long long)mp_tokenizer_vocab_size(tokenizer),
            (long long)model_vocab, checkpoint != NULL ? checkpoint : init_from);
    goto fail;
  }

  uint32_t separator[MP_MAX_SEPARATOR_IDS];
  int separator_count = 0;
  char separator_name[512];
  if (mp_document_separator(tokenizer, cli_value(&command, "separator"), separator,
                            &separator_count, separator_name, sizeof separator_name,
                            &err) != MP_OK ||
      mp_token_encoder_create(tokenizer, &encoder, &err) != MP_OK ||
      mp_token_encoder_encode(encoder, prompt, strlen(prompt), 0, &prompt_ids, &err) != MP_OK) {
    goto fail;
  }
  const int64_t prompt_count = separator_count + (int64_t)prompt_ids.count;
  const int64_t total = prompt_count + tokens;
  sequence = malloc((size_t)total * sizeof *sequence);
  if (sequence == NULL) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory");
    goto fail;
  }
  memcpy(sequence, separator, (size_t)separator_count * sizeof *sequence);
  if (prompt_ids.count > 0) {
    memcpy(sequence + separator_count, prompt_ids.ids, prompt_ids.count * sizeof *sequence);
  }

  /* The window: as long as prompt and completion, up to the model's context. */
  const mp_tp_comm single = mp_tp_comm_single();
  int64_t context = total;
  {
    mp_stage_cpu *probe = NULL;
    if (mp_stage_cpu_create(model, 1, 1, &single, false, &probe, &err) != MP_OK) goto fail;
    const mp_model_config *c =
        mp_param_layout_config(mp_stage_layout_model(mp_stage_cpu_layout(probe)));
    if (context > c->max_seq_len) context = c->max_seq_len;
    mp_stage_cpu_free(probe);
  }
  const int T = (int)context;
  if (mp_stage_cpu_create(model, 1, T, &single, false, &stage, &err) != MP_OK) goto fail;
  const mp_model_config *config =
      mp_param_layout_config(mp_stage_layout_model(mp_stage_cpu_layout(stage)));
  const int64_t V = config->vocab_size, Vp = config->padded_vocab_size;
  if (mp_weight_source_open(mp_stage_layout_model(mp_stage_cpu_layout(stage)), hf_dir, &source,
                            &err) != MP_OK ||
      mp_stage_cpu_fill_params(stage, mp_weight_source_fill, source, &err) != MP_OK) {
    goto fail;
  }
  inputs = calloc((size_t)T, sizeof *inputs);
  targets = calloc((size_t)T, sizeof *targets);
  logits = malloc((size_t)T * (size_t)Vp * sizeof *logits);
  if (inputs == NULL || targets == NULL || logits == NULL) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory for a window of %d tokens", T);
    goto fail;
  }
  mp_stage_chain_capture_logits(mp_stage_cpu_chain(stage), logits);
  mp_rng rng = mp_rng_keyed((uint64_t)seed, 0x73616d706c65ULL /* "sample" */);
  double start = cli_now_seconds();
  for (int64_t length = prompt_count; length < total; ++length) {
    const int64_t first = length > T ? length - T : 0;
    const int64_t window = length - first;
    for (int64_t t = 0; t < T; ++t) inputs[t] = t < window ? (int32_t)sequence[first + t] : 0;
    double loss = 0.0;
    if (mp_stage_cpu_forward(stage, inputs, targets, 1.0f, &loss, &err) != MP_OK) goto fail;
    sequence[length] =
        (uint32_t)choose_token(logits + (size_t)(window - 1) * (size_t)Vp, V, temperature, top_k,
                               &rng);
  }
  double seconds = cli_now_seconds() - start;
  size_t text_bytes = 0;
  if (mp_tokenizer_decode(tokenizer, sequence + prompt_count, (size_t)tokens, 0, &text,
                          &text_bytes, &err) != MP_OK) {
    goto fail;
  }
  printf("%s", prompt);
  fwrite(text, 1, text_bytes, stdout);
  printf("\n");
  if (cli_flag(&command, "print-ids")) {
    printf("ids:");
    for (int64_t i = prompt_count; i < total; ++i) printf(" %u", sequence[i]);
    printf("\n");
  }
  fprintf(stderr, "sample: %lld tokens after %lld of prompt (%s first), window %d, "
          "temperature %g, top-k %lld, seed %lld; %.1f tokens/s\n",
          (long long)tokens, (long long)prompt_count, separator_name, T, temperature,
          (long long)top_k, (long long)seed, seconds > 0 ? (double)tokens / seconds : 0.0);
  goto done;

fail:
  exit_code = cli_report(&command, &err);
done:
  free(text);
  free(logits);
  free(inputs);
  free(targets);
  free(sequence);
  mp_token_ids_free(&prompt_ids);
  mp_weight_source_close(source);
  mp_stage_cpu_free(stage);
  mp_model_free(model);
  mp_token_encoder_free(encoder);
  mp_tokenizer_free(tokenizer);
  if (export_dir[0] != '\0') nftw(export_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  return exit_code;
}
