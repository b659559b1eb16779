/*
 * tools/cmd_data_tokenize.c — `mpengine data tokenize` (text to llm.c token shards with a Hugging
 * Face tokenizer.json) and `mpengine data decode` (shards or ids back to text).
 *
 * Documents flow in batches of a bounded size: the main thread reads a batch (whole text files,
 * or JSON lines), the worker threads encode its documents, and the main thread appends their ids
 * in input order to the shard being written. So the output does not depend on --threads, and
 * memory is bounded by the batch, never by the corpus.
 *
 * Layout of the output, as llm.c's dev/data scripts write it: every document starts with the
 * tokenizer's document separator; the first --val-tokens tokens of that stream go to
 * PREFIX_val_000000.bin, the rest to PREFIX_train_000001.bin, PREFIX_train_000002.bin, ... of at
 * most --shard-tokens each (a document may straddle two shards, as in llm.c). Shards are written
 * through temporary files and renamed, and existing shards under PREFIX are never replaced
 * unless --overwrite says so. Even then they stay whole until the new set is: an overwriting run
 * writes under a hidden staging prefix beside PREFIX and renames its shards over the old ones
 * only after its last shard, then removes the old shards it did not replace; a run that fails
 * leaves the old set as it was.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/data/token_shard.h"
#include "engine/data/tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/document_separator.h"

enum {
  kDefaultShardTokens = 100000000, /* llm.c's shard size */
  kBatchTextBytes = 8 << 20,       /* text read per batch, shared by the workers */
  kBatchDocuments = 4096,
  kMaxThreads = 256,
};

/* ---- documents and batches ---------------------------------------------------------------- */

typedef struct {
  char *text; /* owned, text_bytes long (not NUL-terminated) */
  size_t text_bytes;
  mp_token_ids ids; /* the encoding, filled by a worker; capacity reused between batches */
} tokenize_document;

typedef struct {
  tokenize_document *documents;
  int count, capacity;
  size_t text_bytes;
} tokenize_batch;

static void batch_clear(tokenize_batch *batch) {
  for (int i = 0; i < batch->count; ++i) {
    free(batch->documents[i].text);
    batch->documents[i].text = NULL;
    batch->documents[i].ids.count = 0;
  }
  batch->count = 0;
  batch->text_bytes = 0;
}

static void batch_free(tokenize_batch *batch) {
  batch_clear(batch);
  for (int i = 0; i < batch->capacity; ++i) mp_token_ids_free(&batch->documents[i].ids);
  free(batch->documents);
}

/* Takes ownership of text. */
static mp_status batch_add(tokenize_batch *batch, char *text, size_t text_bytes, mp_error *err) {
  if (batch->count == batch->capacity) {
    int capacity = batch->capacity == 0 ? 256 : 2 * batch->capacity;
    tokenize_document *grown = realloc(batch->documents, (size_t)capacity * sizeof *grown);
    if (grown == NULL) {
      free(text);
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a batch of documents");
    }
    memset(grown + batch->capacity, 0, (size_t)(capacity - batch->capacity) * sizeof *grown);
    batch->documents = grown;
    batch->capacity = capacity;
  }
  tokenize_document *document = &batch->documents[batch->count++];
  document->text = text;
  document->text_bytes = text_bytes;
  document->ids.count = 0;
  batch->text_bytes += text_bytes;
  return MP_OK;
}

static int batch_full(const tokenize_batch *batch) {
  return batch->text_bytes >= kBatchTextBytes || batch->count >= kBatchDocuments;
}

/* ---- input: text files (a document each) and JSON lines ------------------------------------- */

typedef struct {
  const char *const *paths; /* "-" is standard input */
  int num_paths;
  int jsonl;
  const char *field;
  /* position */
  int path_index;
  FILE *jsonl_file; /* the JSON-lines file being read, NULL between files */
  int64_t jsonl_line;
  char *line;
  size_t line_capacity;
  int64_t documents_read;
  int64_t bytes_read;
} tokenize_input;

static mp_status read_whole(const char *path, char **out_text, size_t *out_bytes, mp_error *err) {
  FILE *file = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  size_t capacity = 1 << 16, bytes = 0;
  char *text = malloc(capacity);
  while (text != NULL) {
    if (bytes == capacity) {
      char *grown = realloc(text, capacity * 2);
      if (grown == NULL) {
        free(text);
        text = NULL;
        break;
      }
      text = grown;
      capacity *= 2;
    }
    size_t got = fread(text + bytes, 1, capacity - bytes, file);
    bytes += got;
    if (got == 0) break;
  }
  int read_error = ferror(file);
  if (file != stdin) fclose(file);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory reading it", path);
  if (read_error) {
    free(text);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: read error", path);
  }
  *out_text = text;
  *out_bytes = bytes;
  return MP_OK;
}

/* The document of one JSON line: the string at $.<field>. A blank line is skipped (*out_text
 * stays NULL). */
static mp_status jsonl_document(const tokenize_input *input, const char *path, const char *line,
                                size_t line_bytes, char **out_text, size_t *out_bytes,
                                mp_error *err) {
  *out_text = NULL;
  size_t start = 0;
  while (start < line_bytes && (line[start] == ' ' || line[start] == '\t' ||
                                line[start] == '\r' || line[start] == '\n')) {
    ++start;
  }
  if (start == line_bytes) return MP_OK;
  cJSON *object = cJSON_ParseWithLength(line, line_bytes);
  if (object == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s:%lld: not a JSON object (each line of --jsonl input "
                   "is one, like {\"%s\": \"...\"})",
                   path, (long long)input->jsonl_line, input->field);
  }
  const cJSON *value = cJSON_IsObject(object)
                           ? cJSON_GetObjectItemCaseSensitive(object, input->field)
                           : NULL;
  mp_status status = MP_OK;
  if (!cJSON_IsObject(object)) {
    status = mp_fail(err, MP_ERR_INPUT, "%s:%lld: $: expected a JSON object, like {\"%s\": "
                     "\"...\"}",
                     path, (long long)input->jsonl_line, input->field);
  } else if (value == NULL) {
    status = mp_fail(err, MP_ERR_INPUT, "%s:%lld: $.%s: missing (choose the field with "
                     "--field NAME)",
                     path, (long long)input->jsonl_line, input->field);
  } else if (!cJSON_IsString(value)) {
    status = mp_fail(err, MP_ERR_INPUT, "%s:%lld: $.%s: expected a string", path,
                     (long long)input->jsonl_line, input->field);
  } else {
    *out_bytes = strlen(value->valuestring);
    *out_text = malloc(*out_bytes + 1);
    if (*out_text == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "%s:%lld: out of memory", path,
                       (long long)input->jsonl_line);
    } else {
      memcpy(*out_text, value->valuestring, *out_bytes + 1);
    }
  }
  cJSON_Delete(object);
  return status;
}

/* Fills batch with the next documents; *done is set when the input is exhausted. */
static mp_status input_fill(tokenize_input *input, tokenize_batch *batch, int *done,
                            mp_error *err) {
  *done = 0;
  while (!batch_full(batch)) {
    if (input->path_index >= input->num_paths) {
      *done = 1;
      return MP_OK;
    }
    const char *path = input->paths[input->path_index];
    if (!input->jsonl) {
      char *text = NULL;
      size_t bytes = 0;
      MP_TRY(read_whole(path, &text, &bytes, err));
      input->path_index++;
      input->bytes_read += (int64_t)bytes;
      input->documents_read++;
      MP_TRY(batch_add(batch, text, bytes, err));
      continue;
    }
    if (input->jsonl_file == NULL) {
      input->jsonl_file = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
      if (input->jsonl_file == NULL) {
        return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
      }
      input->jsonl_line = 0;
    }
    ssize_t line_bytes = getline(&input->line, &input->line_capacity, input->jsonl_file);
    if (line_bytes < 0) {
      int read_error = ferror(input->jsonl_file);
      if (input->jsonl_file != stdin) fclose(input->jsonl_file);
      input->jsonl_file = NULL;
      if (read_error) return mp_fail(err, MP_ERR_RUNTIME, "%s: read error", path);
      input->path_index++;
      continue;
    }
    input->jsonl_line++;
    input->bytes_read += line_bytes;
    char *text = NULL;
    size_t text_bytes = 0;
    MP_TRY(jsonl_document(input, path, input->line, (size_t)line_bytes, &text, &text_bytes, err));
    if (text == NULL) continue;
    input->documents_read++;
    MP_TRY(batch_add(batch, text, text_bytes, err));
  }
  return MP_OK;
}

static void input_close(tokenize_input *input) {
  if (input->jsonl_file != NULL && input->jsonl_file != stdin) fclose(input->jsonl_file);
  input->jsonl_file = NULL;
  free(input->line);
  input->line = NULL;
}

/* ---- workers -------------------------------------------------------------------------------- */

typedef struct {
  mp_token_encoder *encoder;
  tokenize_batch *batch;
  int worker, num_workers;
  mp_error err;
  mp_status status;
} tokenize_worker;

/* Documents are dealt round-robin: a batch holds many, and their sizes are mixed. */
static void *encode_share(void *arg) {
  tokenize_worker *worker = arg;
  worker->status = MP_OK;
  for (int i = worker->worker; i < worker->batch->count; i += worker->num_workers) {
    tokenize_document *document = &worker->batch->documents[i];
    document->ids.count = 0;
    worker->status = mp_token_encoder_encode(worker->encoder, document->text, document->text_bytes,
                                             0, &document->ids, &worker->err);
    if (worker->status != MP_OK) break;
  }
  return NULL;
}

/* The shards of a prefix that exist: *found of them; the caller globfree()s when *found > 0. */
static void glob_prefix_shards(const char *prefix, glob_t *matches, int *found) {
  char pattern[4200];
  snprintf(pattern, sizeof pattern, "%s_*_[0-9][0-9][0-9][0-9][0-9][0-9].bin", prefix);
  *found = glob(pattern, 0, NULL, matches) == 0 ? (int)matches->gl_pathc : 0;
}

/* ---- output: val and train shards ----------------------------------------------------------- */

typedef struct {
  const char *prefix;
  int64_t vocab_size;
  int64_t val_tokens;   /* tokens still owed to the val shard */
  int64_t shard_tokens; /* most tokens per train shard */
  int next_index;       /* llm.c numbers shards across splits: val 0, train 1, 2, ... */
  mp_token_shard_writer *writer;
  char writer_path[4096];
  int writer_is_val;
  /* what was written, for the summary and for removal after a failure */
  char (*written)[4096];
  int64_t *written_tokens;
  int num_written, written_capacity;
  int64_t total_tokens, val_total;
} tokenize_output;

static mp_status output_finish_shard(tokenize_output *output, mp_error *err) {
  if (output->writer == NULL) return MP_OK;
  int64_t count = mp_token_shard_writer_count(output->writer);
  mp_token_shard_writer *writer = output->writer;
  output->writer = NULL;
  MP_TRY(mp_token_shard_writer_close(writer, err));
  if (output->num_written == output->written_capacity) {
    int capacity = output->written_capacity == 0 ? 16 : 2 * output->written_capacity;
    char(*paths)[4096] = realloc(output->written, (size_t)capacity * sizeof *paths);
    if (paths != NULL) output->written = paths;
    int64_t *counts = realloc(output->written_tokens, (size_t)capacity * sizeof *counts);
    if (counts != NULL) output->written_tokens = counts;
    if (paths == NULL || counts == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    output->written_capacity = capacity;
  }
  snprintf(output->written[output->num_written], sizeof output->written[0], "%s",
           output->writer_path);
  output->written_tokens[output->num_written++] = count;
  return MP_OK;
}

static void shard_path(const char *prefix, int is_val, int index, char *path, size_t path_bytes) {
  snprintf(path, path_bytes, "%s_%s_%06d.bin", prefix, is_val ? "val" : "train", index);
}

static mp_status output_open_shard(tokenize_output *output, int is_val, mp_error *err) {
  shard_path(output->prefix, is_val, output->next_index++, output->writer_path,
             sizeof output->writer_path);
  output->writer_is_val = is_val;
  return mp_token_shard_writer_open(output->writer_path, output->vocab_size, &output->writer,
                                    err);
}

static mp_status output_append(tokenize_output *output, const uint32_t *ids, int64_t count,
                               mp_error *err) {
  while (count > 0) {
    int want_val = output->val_tokens > 0;
    if (output->writer != NULL && output->writer_is_val != want_val) {
      MP_TRY(output_finish_shard(output, err));
    }
    if (output->writer != NULL && !want_val &&
        mp_token_shard_writer_count(output->writer) >= output->shard_tokens) {
      MP_TRY(output_finish_shard(output, err));
    }
    if (output->writer == NULL) MP_TRY(output_open_shard(output, want_val, err));
    int64_t room = want_val ? output->val_tokens
                            : output->shard_tokens - mp_token_shard_writer_count(output->writer);
    int64_t take = count < room ? count : room;
    MP_TRY(mp_token_shard_writer_append(output->writer, ids, take, err));
    if (want_val) {
      output->val_tokens -= take;
      output->val_total += take;
    }
    output->total_tokens += take;
    ids += take;
    count -= take;
  }
  return MP_OK;
}

/* After a failure: nothing half-done stays under PREFIX. */
static void output_discard(tokenize_output *output) {
  if (output->writer != NULL) mp_token_shard_writer_abort(output->writer);
  output->writer = NULL;
  for (int i = 0; i < output->num_written; ++i) unlink(output->written[i]);
  output->num_written = 0;
}

/* Overwriting: the new shards were written under a staging prefix beside PREFIX
 * (output->prefix), so that a failed run leaves the old ones whole. Now each is renamed to its
 * name under final_prefix, and the old shards the new set does not replace are removed. */
static mp_status output_commit(tokenize_output *output, const char *final_prefix,
                               mp_error *err) {
  const size_t staged_length = strlen(output->prefix);
  for (int i = 0; i < output->num_written; ++i) {
    char final_path[4096];
    snprintf(final_path, sizeof final_path, "%s%s", final_prefix,
             output->written[i] + staged_length);
    if (rename(output->written[i], final_path) != 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "cannot rename %s to %s: %s", output->written[i],
                     final_path, strerror(errno));
    }
    snprintf(output->written[i], sizeof output->written[0], "%s", final_path);
  }
  glob_t matches;
  int found = 0;
  glob_prefix_shards(final_prefix, &matches, &found);
  for (int m = 0; m < found; ++m) {
    int replaced = 0;
    for (int i = 0; i < output->num_written && !replaced; ++i) {
      replaced = strcmp(matches.gl_pathv[m], output->written[i]) == 0;
    }
    if (!replaced) unlink(matches.gl_pathv[m]);
  }
  if (found > 0) globfree(&matches);
  return MP_OK;
}

/* The staging prefix of an overwrite: a hidden name beside PREFIX (same directory, so the final
 * renames stay on one file system), unique to this process. */
static void staging_prefix(const char *prefix, char *staged, size_t staged_bytes) {
  const char *slash = strrchr(prefix, '/');
  const int dir_length = slash != NULL ? (int)(slash - prefix) + 1 : 0;
  snprintf(staged, staged_bytes, "%.*s.%s.tokenize-%ld", dir_length, prefix,
           prefix + dir_length, (long)getpid());
}

static void output_free(tokenize_output *output) {
  free(output->written);
  free(output->written_tokens);
}

/* Creates the directories PREFIX's shards go in, as llm.c's scripts create their data directory;
 * an existing one is fine. */
static mp_status make_prefix_directory(const char *prefix, mp_error *err) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", prefix) >= (int)sizeof path) {
    return mp_fail(err, MP_ERR_INPUT, "--out %s: the path is too long", prefix);
  }
  char *slash = strrchr(path, '/');
  if (slash == NULL || slash == path) return MP_OK;
  *slash = '\0';
  for (char *cursor = path + 1; ; ++cursor) {
    const int end = *cursor == '\0';
    if (*cursor == '/' || end) {
      *cursor = '\0';
      if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        return mp_fail(err, MP_ERR_INPUT, "--out %s: cannot create the directory %s: %s", prefix,
                       path, strerror(errno));
      }
      if (end) break;
      *cursor = '/';
    }
  }
  return MP_OK;
}

/* Refuses to run when shards of this prefix exist already, unless overwriting was asked for;
 * *existing says whether there are some (they are replaced only once the new ones are whole:
 * output_commit). */
static mp_status check_prefix_free(const char *prefix, int overwrite, int *existing,
                                   mp_error *err) {
  glob_t matches;
  int found = 0;
  glob_prefix_shards(prefix, &matches, &found);
  *existing = found > 0;
  mp_status status = MP_OK;
  if (found > 0 && !overwrite) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "--out %s: %s exists (%d shard%s of that prefix): choose another --out, or "
                     "pass --overwrite to replace them",
                     prefix, matches.gl_pathv[0], found, found == 1 ? "" : "s");
  }
  if (found > 0) globfree(&matches);
  return status;
}

/* ---- progress --------------------------------------------------------------------------------- */

static void print_progress(const tokenize_input *input, const tokenize_output *output,
                           double seconds, int final) {
  double megabytes = (double)input->bytes_read / 1e6;
  double rate = seconds > 0 ? 1.0 / seconds : 0.0;
  fprintf(stderr, "\r%.1f MB read, %.2f MB/s, %.0f tokens/s, %lld documents, %lld tokens%s",
          megabytes, megabytes * rate, (double)output->total_tokens * rate,
          (long long)input->documents_read, (long long)output->total_tokens, final ? "\n" : "");
  fflush(stderr);
}

/* Expands every argument as a glob (a quoted one too), in name order; "-" stays standard input.
 * A name that matches nothing is an error naming it. */
static mp_status expand_inputs(const cli_command *command, char ***out_paths, int *out_count,
                               mp_error *err) {
  char **paths = NULL;
  int count = 0, capacity = 0;
  for (int p = 0; p < command->num_positionals; ++p) {
    const char *arg = command->positionals[p];
    glob_t matches = {0};
    int from_glob = strcmp(arg, "-") != 0 && glob(arg, 0, NULL, &matches) == 0;
    size_t n = from_glob ? matches.gl_pathc : 1;
    if (!from_glob && strcmp(arg, "-") != 0) {
      struct stat info;
      if (stat(arg, &info) != 0) {
        for (int i = 0; i < count; ++i) free(paths[i]);
        free(paths);
        return mp_fail(err, MP_ERR_INPUT, "%s: no such file (and no file matches it as a "
                       "pattern)", arg);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const char *path = from_glob ? matches.gl_pathv[i] : arg;
      struct stat info;
      if (strcmp(path, "-") != 0 && stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
        mp_fail(err, MP_ERR_INPUT, "%s: is a directory (name its files, or a quoted glob such "
                "as '%s/*.txt')", path, path);
        if (from_glob) globfree(&matches);
        for (int j = 0; j < count; ++j) free(paths[j]);
        free(paths);
        return MP_ERR_INPUT;
      }
      if (count == capacity) {
        capacity = capacity == 0 ? 64 : 2 * capacity;
        char **grown = realloc(paths, (size_t)capacity * sizeof *grown);
        if (grown == NULL) {
          if (from_glob) globfree(&matches);
          for (int j = 0; j < count; ++j) free(paths[j]);
          free(paths);
          return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
        }
        paths = grown;
      }
      paths[count++] = strdup(path);
    }
    if (from_glob) globfree(&matches);
  }
  *out_paths = paths;
  *out_count = count;
  return MP_OK;
}

static int data_tokenize_fail(cli_command *command, mp_error *err, tokenize_output *output) {
  output_discard(output);
  return cli_report(command, err);
}

int data_tokenize(int argc, char **argv) {
  cli_option options[] = {
      {"tokenizer", "DIR|tokenizer.json", "the Hugging Face tokenizer (required)", NULL},
      {"out", "PREFIX", "write PREFIX_val_000000.bin, PREFIX_train_000001.bin, ... (required)",
       NULL},
      {"val-tokens", "N", "the first N tokens go to the val shard (default 0: no val shard)",
       NULL},
      {"shard-tokens", "N", "most tokens per train shard (default 100000000, as llm.c)", NULL},
      {"threads", "N", "encoding threads (default: every core)", NULL},
      {"jsonl", NULL, "inputs are JSON lines, one document per line", NULL},
      {"field", "NAME", "with --jsonl: the document's field (default text)", NULL},
      {"separator", "TOKEN", "the token before every document (default: the tokenizer's "
       "template prefix, else <|endoftext|>)", NULL},
      {"overwrite", NULL, "replace shards of PREFIX that exist already", NULL},
      {0},
  };
  cli_command command = {
      .command = "data tokenize",
      .usage = "mpengine data tokenize --tokenizer DIR|tokenizer.json --out PREFIX "
               "[--val-tokens N] [--shard-tokens N] [--threads N] [--jsonl [--field NAME]] "
               "FILES...|GLOB|-",
      .summary =
          "Tokenize text into llm.c token shards for `run --data`, with exactly the ids of\n"
          "Hugging Face `tokenizers` for the same tokenizer.json. Each input file is one\n"
          "document (with --jsonl, each line's --field is); '-' reads standard input. Every\n"
          "document starts with the separator token, as llm.c's scripts write it. Ids are\n"
          "uint16 for vocabularies up to 65,536 and uint32 above. Invalid UTF-8 is read as\n"
          "U+FFFD, as Python's decode(errors=\"replace\") does.",
      .min_positionals = 1,
      .max_positionals = CLI_MAX_POSITIONALS,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  tokenize_output output = {0};
  const char *tokenizer_path = cli_value(&command, "tokenizer");
  const char *prefix = cli_value(&command, "out");
  if (tokenizer_path == NULL || prefix == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing option %s", tokenizer_path == NULL
                                                          ? "--tokenizer DIR|tokenizer.json"
                                                          : "--out PREFIX");
    return cli_report(&command, &err);
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t val_tokens = 0, shard_tokens = 0, threads = 0;
  if (cli_int(&command, "val-tokens", 0, 0, &val_tokens, &err) != MP_OK ||
      cli_int(&command, "shard-tokens", 1, kDefaultShardTokens, &shard_tokens, &err) != MP_OK ||
      cli_int(&command, "threads", 1, cores > 0 ? cores : 1, &threads, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  if (shard_tokens > MP_TOKEN_SHARD_MAX_TOKENS || val_tokens > MP_TOKEN_SHARD_MAX_TOKENS) {
    mp_fail(&err, MP_ERR_INPUT, "--%s: must be at most %lld (a shard's header stores its count "
            "as an int32)", shard_tokens > MP_TOKEN_SHARD_MAX_TOKENS ? "shard-tokens" :
            "val-tokens", (long long)MP_TOKEN_SHARD_MAX_TOKENS);
    return cli_report(&command, &err);
  }
  if (threads > kMaxThreads) threads = kMaxThreads;
  const char *field = cli_value(&command, "field");
  if (field != NULL && !cli_flag(&command, "jsonl")) {
    mp_fail(&err, MP_ERR_INPUT, "--field: only with --jsonl");
    return cli_report(&command, &err);
  }

  char **paths = NULL;
  int num_paths = 0;
  if (expand_inputs(&command, &paths, &num_paths, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  mp_tokenizer *tokenizer = NULL;
  int existing = 0;
  if (mp_tokenizer_load(tokenizer_path, &tokenizer, &err) != MP_OK ||
      check_prefix_free(prefix, cli_flag(&command, "overwrite"), &existing, &err) != MP_OK ||
      make_prefix_directory(prefix, &err) != MP_OK) {
    for (int i = 0; i < num_paths; ++i) free(paths[i]);
    free(paths);
    mp_tokenizer_free(tokenizer);
    return cli_report(&command, &err);
  }
  uint32_t separator[MP_MAX_SEPARATOR_IDS];
  int separator_count = 0;
  char separator_name[512];
  tokenize_worker workers[kMaxThreads];
  memset(workers, 0, sizeof workers);
  int num_workers = 0;
  tokenize_batch batch = {0};
  tokenize_input input = {
      .paths = (const char *const *)paths,
      .num_paths = num_paths,
      .jsonl = cli_flag(&command, "jsonl"),
      .field = field != NULL ? field : "text",
  };
  char staged[4096];
  if (existing) staging_prefix(prefix, staged, sizeof staged);
  output.prefix = existing ? staged : prefix;
  output.vocab_size = mp_tokenizer_vocab_size(tokenizer);
  output.val_tokens = val_tokens;
  output.shard_tokens = shard_tokens;
  int exit_code = CLI_EXIT_OK;
  if (mp_document_separator(tokenizer, cli_value(&command, "separator"), separator, &separator_count,
                       separator_name, sizeof separator_name, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
    goto done;
  }
  for (; num_workers < threads; ++num_workers) {
    workers[num_workers].worker = num_workers;
    workers[num_workers].num_workers = (int)threads;
    workers[num_workers].batch = &batch;
    mp_error_clear(&workers[num_workers].err);
    if (mp_token_encoder_create(tokenizer, &workers[num_workers].encoder, &err) != MP_OK) {
      exit_code = cli_report(&command, &err);
      goto done;
    }
  }

  int progress = isatty(STDERR_FILENO);
  double start = cli_now_seconds(), last_progress = start;
  for (int done_reading = 0; !done_reading;) {
    batch_clear(&batch);
    if (input_fill(&input, &batch, &done_reading, &err) != MP_OK) {
      exit_code = data_tokenize_fail(&command, &err, &output);
      goto done;
    }
    pthread_t handles[kMaxThreads];
    for (int w = 1; w < num_workers; ++w) {
      pthread_create(&handles[w], NULL, encode_share, &workers[w]);
    }
    encode_share(&workers[0]);
    for (int w = 1; w < num_workers; ++w) pthread_join(handles[w], NULL);
    for (int w = 0; w < num_workers; ++w) {
      if (workers[w].status != MP_OK) {
        err = workers[w].err;
        exit_code = data_tokenize_fail(&command, &err, &output);
        goto done;
      }
    }
    for (int i = 0; i < batch.count; ++i) {
      if (output_append(&output, separator, separator_count, &err) != MP_OK ||
          output_append(&output, batch.documents[i].ids.ids,
                        (int64_t)batch.documents[i].ids.count, &err) != MP_OK) {
        exit_code = data_tokenize_fail(&command, &err, &output);
        goto done;
      }
    }
    double now = cli_now_seconds();
    if (progress && now - last_progress >= 0.5) {
      print_progress(&input, &output, now - start, 0);
      last_progress = now;
    }
  }
  if (output_finish_shard(&output, &err) != MP_OK ||
      (existing && output_commit(&output, prefix, &err) != MP_OK)) {
    exit_code = data_tokenize_fail(&command, &err, &output);
    goto done;
  }
  double seconds = cli_now_seconds() - start;
  if (progress) print_progress(&input, &output, seconds, 1);
  if (input.documents_read == 0) {
    printf("no documents: nothing written\n");
  }
  for (int i = 0; i < output.num_written; ++i) {
    printf("wrote %s: %lld tokens (uint%d ids)\n", output.written[i],
           (long long)output.written_tokens[i], output.vocab_size > MP_TOKEN_SHARD_MAX_VOCAB
                                                    ? 32 : 16);
  }
  printf("tokenized %lld documents (%.1f MB) into %lld tokens (%lld val) with %s (vocabulary "
         "%lld), each document after %s; %d thread%s, %.1f s, %.2f MB/s, %.0f tokens/s\n",
         (long long)input.documents_read, (double)input.bytes_read / 1e6,
         (long long)output.total_tokens, (long long)output.val_total,
         mp_tokenizer_path(tokenizer), (long long)output.vocab_size, separator_name,
         num_workers, num_workers == 1 ? "" : "s", seconds,
         seconds > 0 ? (double)input.bytes_read / 1e6 / seconds : 0.0,
         seconds > 0 ? (double)output.total_tokens / seconds : 0.0);
  if (val_tokens > 0 && output.val_total < val_tokens) {
    printf("note: the text gave only %lld tokens, all of them to the val shard; lower "
           "--val-tokens to keep some for training\n", (long long)output.val_total);
  }

done:
  input_close(&input);
  batch_free(&batch);
  for (int w = 0; w < num_workers; ++w) mp_token_encoder_free(workers[w].encoder);
  mp_tokenizer_free(tokenizer);
  output_free(&output);
  for (int i = 0; i < num_paths; ++i) free(paths[i]);
  free(paths);
  return exit_code;
}

/* ---- decode ------------------------------------------------------------------------------- */

/* Parses "1,2,3" into ids. */
static mp_status parse_ids(const char *text, uint32_t **out_ids, size_t *out_count,
                           mp_error *err) {
  size_t capacity = 16, count = 0;
  uint32_t *ids = malloc(capacity * sizeof *ids);
  const char *cursor = text;
  while (ids != NULL && *cursor != '\0') {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(cursor, &end, 10);
    if (end == cursor || errno != 0 || value > UINT32_MAX || *cursor == '-') {
      free(ids);
      return mp_fail(err, MP_ERR_INPUT, "--ids: '%s' is not a comma-separated list of ids "
                     "(at character %d)", text, (int)(cursor - text) + 1);
    }
    if (count == capacity) {
      uint32_t *grown = realloc(ids, 2 * capacity * sizeof *ids);
      if (grown == NULL) break;
      ids = grown;
      capacity *= 2;
    }
    ids[count++] = (uint32_t)value;
    cursor = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') {
      free(ids);
      return mp_fail(err, MP_ERR_INPUT, "--ids: '%s' is not a comma-separated list of ids "
                     "(at character %d)", text, (int)(end - text) + 1);
    }
  }
  if (ids == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  *out_ids = ids;
  *out_count = count;
  return MP_OK;
}

int data_decode(int argc, char **argv) {
  cli_option options[] = {
      {"tokenizer", "DIR|tokenizer.json", "the Hugging Face tokenizer (required)", NULL},
      {"ids", "I,J,...", "decode these ids instead of a shard", NULL},
      {"first", "N", "the shard's first token to decode (default 0)", NULL},
      {"tokens", "N", "tokens to decode (default: to the end of the shard)", NULL},
      {"skip-special", NULL, "leave out special tokens (separators)", NULL},
      {0},
  };
  cli_command command = {
      .command = "data decode",
      .usage = "mpengine data decode --tokenizer DIR|tokenizer.json SHARD [--first N] "
               "[--tokens N] [--skip-special] | --ids I,J,...",
      .summary = "Print the text of token ids: a range of an llm.c token shard, or the ids given\n"
                 "with --ids, decoded as Hugging Face `tokenizers` decodes them.",
      .min_positionals = 0,
      .max_positionals = 1,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  mp_error err = MP_ERROR_INITIALIZER;
  const char *tokenizer_path = cli_value(&command, "tokenizer");
  const char *id_list = cli_value(&command, "ids");
  if (tokenizer_path == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing option --tokenizer DIR|tokenizer.json");
    return cli_report(&command, &err);
  }
  if ((id_list == NULL) == (command.num_positionals == 0)) {
    mp_fail(&err, MP_ERR_INPUT, "give either a SHARD or --ids I,J,..., not %s",
            id_list == NULL ? "neither" : "both");
    return cli_report(&command, &err);
  }
  int64_t first = 0, tokens = -1;
  if (cli_int(&command, "first", 0, 0, &first, &err) != MP_OK ||
      cli_int(&command, "tokens", 0, -1, &tokens, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  mp_tokenizer *tokenizer = NULL;
  if (mp_tokenizer_load(tokenizer_path, &tokenizer, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  int64_t vocab = mp_tokenizer_vocab_size(tokenizer);
  uint32_t *ids = NULL;
  size_t count = 0;
  mp_status status = MP_OK;
  if (id_list != NULL) {
    status = parse_ids(id_list, &ids, &count, &err);
  } else {
    mp_token_shard *shard = NULL;
    status = mp_token_shard_open(command.positionals[0], vocab, &shard, &err);
    if (status == MP_OK) {
      int64_t total = mp_token_shard_count(shard);
      if (first > total) {
        status = mp_fail(&err, MP_ERR_INPUT, "--first %lld: %s holds only %lld tokens",
                         (long long)first, command.positionals[0], (long long)total);
      } else {
        count = (size_t)(tokens < 0 || first + tokens > total ? total - first : tokens);
        ids = malloc((count > 0 ? count : 1) * sizeof *ids);
        status = ids == NULL ? mp_fail(&err, MP_ERR_RUNTIME, "out of memory")
                             : mp_token_shard_read(shard, first, (int64_t)count, ids, &err);
      }
      mp_token_shard_close(shard);
    }
  }
  char *text = NULL;
  size_t text_bytes = 0;
  if (status == MP_OK) {
    status = mp_tokenizer_decode(tokenizer, ids, count, cli_flag(&command, "skip-special"), &text,
                                 &text_bytes, &err);
  }
  int exit_code = CLI_EXIT_OK;
  if (status != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else {
    fwrite(text, 1, text_bytes, stdout);
    if (text_bytes == 0 || text[text_bytes - 1] != '\n') fputc('\n', stdout);
  }
  free(text);
  free(ids);
  mp_tokenizer_free(tokenizer);
  return exit_code;
}
