/*
 * tools/cmd_data.c — `mpengine data`: token data for `run --data`.
 *
 *   mpengine data synth --out FILE --vocab V [--tokens N] [--seed S] [--successors K]
 *       writes an llm.c token shard drawn from a random Markov source and prints the source's
 *       entropy rate: the lowest loss any model can reach on it, the floor a training run's loss
 *       should approach (engine/data/markov_source.h).
 *   mpengine data inspect FILE|GLOB... [--vocab V]
 *       validates shards exactly as `run --data` will and prints what they hold.
 */
#define _POSIX_C_SOURCE 200809L
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_reader.h"
#include "engine/data/markov_source.h"
#include "engine/data/token_shard.h"
#include "tools/cli.h"
#include "tools/commands.h"

enum { kDefaultSeed = 1337, kDefaultTokens = 1000000 };

static const char kDataUsage[] =
    "mpengine data tokenize --tokenizer DIR|tokenizer.json --out PREFIX [options] FILES...\n"
    "       mpengine data decode --tokenizer DIR|tokenizer.json SHARD | --ids I,J,...\n"
    "       mpengine data synth --out FILE --vocab V [--tokens N] [--seed S] [--successors K]\n"
    "       mpengine data inspect FILE|GLOB... [--vocab V]";

/* Writes the sample as a shard through the streaming writer, whose id width follows vocab. */
static mp_status write_sample(const char *path, int64_t vocab, const uint16_t *sample,
                              int64_t count, mp_error *err) {
  mp_token_shard_writer *writer = NULL;
  MP_TRY(mp_token_shard_writer_open(path, vocab, &writer, err));
  enum { kPieceTokens = 1 << 16 };
  uint32_t *piece = malloc(kPieceTokens * sizeof *piece);
  if (piece == NULL) {
    mp_token_shard_writer_abort(writer);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  }
  mp_status status = MP_OK;
  for (int64_t at = 0; at < count && status == MP_OK; at += kPieceTokens) {
    const int64_t n = count - at < kPieceTokens ? count - at : kPieceTokens;
    for (int64_t i = 0; i < n; ++i) piece[i] = sample[at + i];
    status = mp_token_shard_writer_append(writer, piece, n, err);
  }
  free(piece);
  if (status != MP_OK) {
    mp_token_shard_writer_abort(writer);
    return status;
  }
  return mp_token_shard_writer_close(writer, err);
}

static int data_synth(int argc, char **argv) {
  cli_option options[] = {
      {"out", "FILE", "the token shard to write (replaced whole, never left half-written)", NULL},
      {"vocab", "V", "vocabulary size, 1 .. 65536: use the model's vocab_size", NULL},
      {"tokens", "N", "tokens to write (default 1000000)", NULL},
      {"seed", "S", "seed of the source and of the sample (default 1337)", NULL},
      {"successors", "K", "tokens that may follow each token, 2 .. 256 (default 4)", NULL},
      {0},
  };
  cli_command command = {
      .command = "data synth",
      .usage = "mpengine data synth --out FILE --vocab V [--tokens N] [--seed S] "
               "[--successors K]",
      .summary =
          "Write an llm.c token shard drawn from a random first-order Markov source and print\n"
          "its entropy rate in nats per token: the lowest loss any model can reach on it.\n"
          "Each token is followed by itself, by the next token id, or by K - 2 others drawn\n"
          "from the seed, with random probabilities; a small transformer learns the table from\n"
          "the previous token, so a correct training run's loss approaches the entropy rate.\n"
          "The same seed gives the same file on every machine.",
      .min_positionals = 0,
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  const char *out_path = cli_value(&command, "out");
  int64_t vocab = 0, tokens = 0, seed = 0, successors = 0;
  if (out_path == NULL) {
    mp_fail(&err, MP_ERR_INPUT, "missing option --out FILE: the token shard to write");
    return cli_report(&command, &err);
  }
  if (cli_value(&command, "vocab") == NULL) {
    mp_fail(&err, MP_ERR_INPUT,
            "missing option --vocab V: the vocabulary size, the model's vocab_size");
    return cli_report(&command, &err);
  }
  if (cli_int(&command, "vocab", 1, 0, &vocab, &err) != MP_OK ||
      cli_int(&command, "tokens", 1, kDefaultTokens, &tokens, &err) != MP_OK ||
      cli_int(&command, "seed", 0, kDefaultSeed, &seed, &err) != MP_OK ||
      cli_int(&command, "successors", 2, MP_MARKOV_DEFAULT_SUCCESSORS, &successors, &err) !=
          MP_OK) {
    return cli_report(&command, &err);
  }
  if (vocab > MP_MARKOV_MAX_VOCAB) {
    mp_fail(&err, MP_ERR_INPUT,
            "--vocab: must be at most %d (the synthetic Markov source draws uint16 ids), got "
            "%lld",
            MP_MARKOV_MAX_VOCAB, (long long)vocab);
    return cli_report(&command, &err);
  }
  if (tokens > MP_TOKEN_SHARD_MAX_TOKENS) {
    mp_fail(&err, MP_ERR_INPUT,
            "--tokens: must be at most %lld (a shard's header stores the count as an int32), "
            "got %lld",
            (long long)MP_TOKEN_SHARD_MAX_TOKENS, (long long)tokens);
    return cli_report(&command, &err);
  }
  if (successors > MP_MARKOV_MAX_SUCCESSORS) {
    mp_fail(&err, MP_ERR_INPUT, "--successors: must be at most %d, got %lld",
            MP_MARKOV_MAX_SUCCESSORS, (long long)successors);
    return cli_report(&command, &err);
  }

  mp_markov_source *source = NULL;
  if (mp_markov_source_build(vocab, (int)successors, (uint64_t)seed, &source, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  uint16_t *sample = malloc((size_t)tokens * sizeof *sample);
  if (sample == NULL) {
    mp_markov_source_free(source);
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory for %lld tokens", (long long)tokens);
    return cli_report(&command, &err);
  }
  mp_markov_source_sample(source, (uint64_t)seed, tokens, sample);
  int exit_code = CLI_EXIT_OK;
  if (write_sample(out_path, vocab, sample, tokens, &err) != MP_OK) {
    exit_code = cli_report(&command, &err);
  } else {
    printf("wrote %s: %lld tokens, vocab %lld, seed %lld; entropy rate %.4f nats/token (the "
           "lowest loss any model can reach)\n",
           out_path, (long long)tokens, (long long)vocab, (long long)seed,
           mp_markov_source_entropy_rate(source));
    printf("source: %lld successors per token; a model that ignores context stays at %.4f "
           "nats/token",
           (long long)(successors < vocab ? successors : vocab),
           mp_markov_source_unigram_entropy(source));
    if (tokens >= 2) {
      printf("; the true chain scores %.4f nats/token on this sample",
             mp_markov_source_mean_nll(source, sample, tokens));
    }
    printf("\n");
  }
  free(sample);
  mp_markov_source_free(source);
  return exit_code;
}

/* Prints one shard's summary after checking every id; fills err and returns its status when the
 * shard is bad. */
static mp_status inspect_file(const char *path, int64_t vocab, int64_t *total_tokens,
                              mp_error *err) {
  mp_token_shard *shard = NULL;
  MP_TRY(mp_token_shard_open(path, vocab, &shard, err));
  const int64_t count = mp_token_shard_count(shard);
  /* Which ids occur: a bitmap grown to the largest id seen, so a uint32 shard of a 128K
   * vocabulary needs 16 KB, not the 512 MB of every uint32. */
  enum { kPieceTokens = 1 << 20 };
  uint32_t *piece = malloc(kPieceTokens * sizeof *piece);
  unsigned char *seen = NULL;
  int64_t seen_bytes = 0, distinct = 0, largest = -1;
  mp_status status = piece != NULL ? MP_OK : mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  for (int64_t at = 0; at < count && status == MP_OK; at += kPieceTokens) {
    const int64_t n = count - at < kPieceTokens ? count - at : kPieceTokens;
    status = mp_token_shard_read(shard, at, n, piece, err);
    for (int64_t i = 0; i < n && status == MP_OK; ++i) {
      const int64_t id = piece[i];
      if (id / 8 >= seen_bytes) {
        const int64_t bytes = id / 8 + 1 + seen_bytes;
        unsigned char *grown = realloc(seen, (size_t)bytes);
        if (grown == NULL) {
          status = mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
          break;
        }
        memset(grown + seen_bytes, 0, (size_t)(bytes - seen_bytes));
        seen = grown;
        seen_bytes = bytes;
      }
      if (!(seen[id / 8] & (1u << (id % 8)))) {
        seen[id / 8] |= (unsigned char)(1u << (id % 8));
        ++distinct;
      }
      if (id > largest) largest = id;
    }
  }
  if (status == MP_OK) {
    const int width = mp_token_shard_id_bytes(shard);
    char format[96];
    snprintf(format, sizeof format, "uint%d ids, magic %d, version %d", 8 * width,
             (int)mp_token_shard_magic(shard), (int)mp_token_shard_version(shard));
    if (count == 0) {
      printf("%s: 0 tokens (an empty shard); %s\n", path, format);
    } else {
      printf("%s: %lld tokens, %lld distinct ids, largest id %lld; valid llm.c token shard "
             "(%s)\n",
             path, (long long)count, (long long)distinct, (long long)largest, format);
    }
    *total_tokens += count;
  }
  free(seen);
  free(piece);
  mp_token_shard_close(shard);
  return status;
}

static int data_inspect(int argc, char **argv) {
  cli_option options[] = {
      {"vocab", "V", "also check every id is below V, the model's vocab_size (default: any id "
       "the shard's width holds)", NULL},
      {0},
  };
  cli_command command = {
      .command = "data inspect",
      .usage = "mpengine data inspect FILE|GLOB... [--vocab V]",
      .summary = "Validate llm.c token shards, uint16 (magic 20240520) or uint32 (magic\n"
                 "20240801), as `run --data` will (magic, version, size against the token count,\n"
                 "every id below the vocabulary) and print what each holds and its format.\n"
                 "A quoted glob pattern is expanded in name order, as `run --data` expands it.",
      .min_positionals = 1,
      .max_positionals = 8,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  int64_t vocab = 0;
  if (cli_int(&command, "vocab", 1, MP_TOKEN_SHARD_U32_MAX_VOCAB, &vocab, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  if (vocab > MP_TOKEN_SHARD_U32_MAX_VOCAB) {
    mp_fail(&err, MP_ERR_INPUT,
            "--vocab: must be at most %lld (a token shard stores ids as uint32 at most), got "
            "%lld",
            (long long)MP_TOKEN_SHARD_U32_MAX_VOCAB, (long long)vocab);
    return cli_report(&command, &err);
  }
  int64_t total_tokens = 0;
  int files = 0;
  for (int p = 0; p < command.num_positionals; ++p) {
    /* GLOB_NOCHECK: a name that matches nothing is passed through, so the reader says
     * "cannot open" with the name the user typed. */
    glob_t matches;
    if (glob(command.positionals[p], GLOB_NOCHECK, NULL, &matches) != 0) {
      mp_fail(&err, MP_ERR_INPUT, "%s: cannot expand the pattern", command.positionals[p]);
      return cli_report(&command, &err);
    }
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      if (inspect_file(matches.gl_pathv[i], vocab, &total_tokens, &err) != MP_OK) {
        globfree(&matches);
        return cli_report(&command, &err);
      }
      ++files;
    }
    globfree(&matches);
  }
  if (files > 1) printf("total: %lld tokens in %d shards\n", (long long)total_tokens, files);
  return CLI_EXIT_OK;
}

int cmd_data(int argc, char **argv) {
  static const char *const kActions[] = {"tokenize", "decode", "synth", "inspect", NULL};
  const char *action = argc >= 2 ? argv[1] : NULL;
  if (action != NULL && strcmp(action, "tokenize") == 0) return data_tokenize(argc - 1, argv + 1);
  if (action != NULL && strcmp(action, "decode") == 0) return data_decode(argc - 1, argv + 1);
  if (action != NULL && strcmp(action, "synth") == 0) return data_synth(argc - 1, argv + 1);
  if (action != NULL && strcmp(action, "inspect") == 0) return data_inspect(argc - 1, argv + 1);
  if (action != NULL && (strcmp(action, "--help") == 0 || strcmp(action, "-h") == 0)) {
    printf("usage: %s\n\n"
           "Token data for `run --data GLOB` (llm.c token shards: a 256 x int32 header, then\n"
           "uint16 token ids, or uint32 for vocabularies over 65,536).\n\n"
           "actions:\n"
           "  tokenize   text files or JSON lines to shards, with exactly the ids of a Hugging\n"
           "             Face tokenizer.json\n"
           "  decode     a shard's ids (or --ids) back to text\n"
           "  synth      write a shard drawn from a random Markov source and print its entropy\n"
           "             rate, the lowest loss any model can reach on it\n"
           "  inspect    validate shards as `run --data` will and print what they hold\n\n"
           "run 'mpengine data <action> --help' for the options\n",
           kDataUsage);
    return CLI_EXIT_OK;
  }
  if (action == NULL) {
    fprintf(stderr, "mpengine data: missing action: tokenize, decode, synth or inspect\n");
  } else {
    const char *closest = mp_closest_word(action, kActions);
    if (closest != NULL) {
      fprintf(stderr, "mpengine data: unknown action '%s'; did you mean '%s'?\n", action,
              closest);
    } else {
      fprintf(stderr, "mpengine data: unknown action '%s' (actions: tokenize, decode, synth, inspect)\n", action);
    }
  }
  fprintf(stderr, "run 'mpengine data --help' for the actions\n");
  return CLI_EXIT_USAGE;
}
