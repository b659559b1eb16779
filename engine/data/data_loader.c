/*
 * engine/data/data_loader.c — stateless batches over a token stream; see data_loader.h for the
 * sample layout and the per-epoch order.
 *
 * All tokens are held in memory as one uint16 array (2 bytes per token: 100 M tokens = 200 MB).
 * The only state is a cache of one epoch's permutation, rebuilt from (seed, epoch) whenever a
 * call needs another epoch, so results never depend on the order of calls.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/data/data_loader.h"

#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

#include "engine/data/token_shard.h"

struct mp_data_loader {
  char *name;             /* the glob pattern, or the in-memory source's description */
  char **files;           /* (num_files,) shard paths in reading order */
  int num_files;
  uint16_t *tokens;       /* (num_tokens,) the concatenated stream */
  int64_t num_tokens;     /* N */
  /* The cached permutation perm_e of one epoch: valid when permutation != NULL. */
  int64_t *permutation;   /* (permutation_size,) sample index at each position of the epoch */
  int64_t permutation_size;
  uint64_t permutation_seed;
  int64_t permutation_epoch;
};

/* ---- randomness: splitmix64 (Steele, Lea, Flood 2014), one stream per (seed, epoch) ---- */

typedef mp_rng rng;

/* The stream that shuffles epoch `epoch`; the constant keeps it apart from the Markov source's
 * streams for the same seed. */
static rng rng_for_epoch(uint64_t seed, int64_t epoch) {
  const uint64_t kShuffleStream = 0x53485546464C45ull; /* "SHUFFLE" */
  rng r = mp_rng_keyed(seed, kShuffleStream + (uint64_t)epoch * 0xD1B54A32D192ED03ull);
  return r;
}

/* ---- construction ---- */

static mp_status out_of_memory(const char *name, mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory for the token stream", name);
}

static char *copy_string(const char *text) {
  const size_t bytes = strlen(text) + 1;
  char *copy = malloc(bytes);
  if (copy != NULL) memcpy(copy, text, bytes);
  return copy;
}

void mp_data_loader_free(mp_data_loader *loader) {
  if (loader == NULL) return;
  for (int i = 0; i < loader->num_files; ++i) free(loader->files[i]);
  free(loader->files);
  free(loader->name);
  free(loader->tokens);
  free(loader->permutation);
  free(loader);
}

static int compare_paths(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

mp_status mp_data_loader_open_glob(const char *pattern, int64_t vocab_size, mp_data_loader **out,
                                   mp_error *err) {
  *out = NULL;
  glob_t matches;
  const int found = glob(pattern, 0, NULL, &matches);
  if (found == GLOB_NOMATCH || (found == 0 && matches.gl_pathc == 0)) {
    if (found == 0) globfree(&matches);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: no file matches this pattern; check the path, and quote the pattern so "
                   "that mpengine expands it, not the shell",
                   pattern);
  }
  if (found != 0) {
    return mp_fail(err, found == GLOB_NOSPACE ? MP_ERR_RUNTIME : MP_ERR_INPUT,
                   "%s: cannot expand the pattern (%s)", pattern,
                   found == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
  }
  mp_data_loader *loader = calloc(1, sizeof *loader);
  mp_status status = MP_OK;
  if (loader == NULL || (loader->name = copy_string(pattern)) == NULL ||
      (loader->files = calloc(matches.gl_pathc, sizeof *loader->files)) == NULL) {
    status = out_of_memory(pattern, err);
    goto done;
  }
  for (size_t i = 0; i < matches.gl_pathc; ++i) {
    if ((loader->files[i] = copy_string(matches.gl_pathv[i])) == NULL) {
      status = out_of_memory(pattern, err);
      goto done;
    }
    loader->num_files = (int)i + 1;
  }
  /* Byte order of the names, whatever the locale's collation, so every machine reads the same
   * stream. */
  qsort(loader->files, (size_t)loader->num_files, sizeof *loader->files, compare_paths);
  for (int i = 0; i < loader->num_files; ++i) {
    uint16_t *shard = NULL;
    int64_t count = 0;
    status = mp_token_shard_read(loader->files[i], vocab_size, &shard, &count, err);
    if (status != MP_OK) goto done;
    if (count > 0) {
      uint16_t *grown =
          realloc(loader->tokens, (size_t)(loader->num_tokens + count) * sizeof *grown);
      if (grown == NULL) {
        free(shard);
        status = out_of_memory(pattern, err);
        goto done;
      }
      loader->tokens = grown;
      memcpy(loader->tokens + loader->num_tokens, shard, (size_t)count * sizeof *shard);
      loader->num_tokens += count;
    }
    free(shard);
  }

done:
  globfree(&matches);
  if (status != MP_OK) {
    mp_data_loader_free(loader);
    return status;
  }
  *out = loader;
  return MP_OK;
}

mp_status mp_data_loader_from_tokens(const uint16_t *tokens, int64_t count, int64_t vocab_size,
                                     const char *name, mp_data_loader **out, mp_error *err) {
  *out = NULL;
  if (count < 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: negative token count %lld", name, (long long)count);
  }
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] >= vocab_size) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: token id %u at position %lld is outside the vocabulary of %lld ids "
                     "(0 .. %lld)",
                     name, (unsigned)tokens[i], (long long)i, (long long)vocab_size,
                     (long long)vocab_size - 1);
    }
  }
  mp_data_loader *loader = calloc(1, sizeof *loader);
  if (loader == NULL || (loader->name = copy_string(name)) == NULL ||
      (count > 0 && (loader->tokens = malloc((size_t)count * sizeof *tokens)) == NULL)) {
    mp_data_loader_free(loader);
    return out_of_memory(name, err);
  }
  if (count > 0) memcpy(loader->tokens, tokens, (size_t)count * sizeof *tokens);
  loader->num_tokens = count;
  *out = loader;
  return MP_OK;
}

mp_status mp_data_loader_hold_out(mp_data_loader *loader, int64_t count, mp_data_loader **out,
                                  mp_error *err) {
  *out = NULL;
  if (count < 1 || count >= loader->num_tokens) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: cannot hold out %lld of its %lld tokens for evaluation; give held-out "
                   "token shards with --val-data, or fewer --eval-batches",
                   loader->name, (long long)count, (long long)loader->num_tokens);
  }
  char name[512];
  snprintf(name, sizeof name, "%s, its last %lld tokens (held out)", loader->name,
           (long long)count);
  /* The tokens were checked when the loader was made: copy them as they are. */
  mp_data_loader *held = calloc(1, sizeof *held);
  if (held == NULL || (held->name = copy_string(name)) == NULL ||
      (held->tokens = malloc((size_t)count * sizeof *held->tokens)) == NULL) {
    mp_data_loader_free(held);
    return out_of_memory(loader->name, err);
  }
  memcpy(held->tokens, loader->tokens + (loader->num_tokens - count),
         (size_t)count * sizeof *held->tokens);
  held->num_tokens = count;
  loader->num_tokens -= count;
  free(loader->permutation); /* S changed: every epoch's order is drawn again */
  loader->permutation = NULL;
  *out = held;
  return MP_OK;
}

/* ---- queries ---- */

const char *mp_data_loader_name(const mp_data_loader *loader) { return loader->name; }

int mp_data_loader_num_files(const mp_data_loader *loader) { return loader->num_files; }

const char *mp_data_loader_file(const mp_data_loader *loader, int index) {
  if (index < 0 || index >= loader->num_files) return NULL;
  return loader->files[index];
}

int64_t mp_data_loader_num_tokens(const mp_data_loader *loader) { return loader->num_tokens; }

int64_t mp_data_loader_num_samples(const mp_data_loader *loader, int64_t seq_len) {
  if (seq_len < 1 || loader->num_tokens < 1) return 0;
  return (loader->num_tokens - 1) / seq_len;
}

mp_status mp_data_loader_check(const mp_data_loader *loader, int64_t seq_len, mp_error *err) {
  if (seq_len < 1) {
    return mp_fail(err, MP_ERR_INPUT, "sequence length %lld: must be at least 1",
                   (long long)seq_len);
  }
  if (mp_data_loader_num_samples(loader, seq_len) < 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: %lld tokens, too few for one sample of sequence length + 1 = %lld "
                   "tokens; use a shorter sequence length or more data",
                   loader->name, (long long)loader->num_tokens, (long long)seq_len + 1);
  }
  return MP_OK;
}

int64_t mp_data_loader_epoch(const mp_data_loader *loader, int64_t seq_len, int64_t global_batch,
                             int64_t step, int64_t sample) {
  const int64_t samples = mp_data_loader_num_samples(loader, seq_len);
  if (samples < 1) return 0;
  return (step * global_batch + sample) / samples;
}

/* Makes loader->permutation perm_epoch for (seed, samples): a Fisher-Yates shuffle of
 * 0 .. samples - 1 (Durstenfeld's form, from the last position down). */
static mp_status use_epoch(mp_data_loader *loader, uint64_t seed, int64_t samples, int64_t epoch,
                           mp_error *err) {
  if (loader->permutation != NULL && loader->permutation_size == samples &&
      loader->permutation_seed == seed && loader->permutation_epoch == epoch) {
    return MP_OK;
  }
  if (loader->permutation == NULL || loader->permutation_size != samples) {
    free(loader->permutation);
    loader->permutation = malloc((size_t)samples * sizeof *loader->permutation);
    if (loader->permutation == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory for the order of %lld samples",
                     loader->name, (long long)samples);
    }
  }
  int64_t *perm = loader->permutation;
  for (int64_t i = 0; i < samples; ++i) perm[i] = i;
  rng r = rng_for_epoch(seed, epoch);
  for (int64_t i = samples - 1; i > 0; --i) {
    const int64_t j = (int64_t)mp_rng_below(&r, (uint64_t)i + 1);
    const int64_t swap = perm[i];
    perm[i] = perm[j];
    perm[j] = swap;
  }
  loader->permutation_size = samples;
  loader->permutation_seed = seed;
  loader->permutation_epoch = epoch;
  return MP_OK;
}

mp_status mp_data_loader_batch(mp_data_loader *loader, uint64_t seed, int64_t seq_len,
                               int64_t global_batch, int64_t step, int64_t first_sample,
                               int64_t num_samples, int32_t *inputs, int32_t *targets,
                               mp_error *err) {
  MP_TRY(mp_data_loader_check(loader, seq_len, err));
  if (global_batch < 1 || step < 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: batch of step %lld with global batch size %lld: the step must be >= 0 "
                   "and the batch size >= 1",
                   loader->name, (long long)step, (long long)global_batch);
  }
  if (first_sample < 0 || num_samples < 0 || first_sample > global_batch - num_samples) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: rows %lld .. %lld are not inside the global batch of %lld rows "
                   "(0 .. %lld)",
                   loader->name, (long long)first_sample,
                   (long long)(first_sample + num_samples - 1), (long long)global_batch,
                   (long long)global_batch - 1);
  }
  if (step > (INT64_MAX - global_batch) / global_batch) {
    return mp_fail(err, MP_ERR_INPUT, "%s: step %lld x global batch %lld overflows 64 bits",
                   loader->name, (long long)step, (long long)global_batch);
  }
  const int64_t samples = mp_data_loader_num_samples(loader, seq_len);
  for (int64_t row = 0; row < num_samples; ++row) {
    const int64_t position = step * global_batch + first_sample + row;
    MP_TRY(use_epoch(loader, seed, samples, position / samples, err));
    const int64_t sample = loader->permutation[position % samples];
    const uint16_t *window = loader->tokens + sample * seq_len; /* seq_len + 1 tokens */
    int32_t *input_row = inputs + row * seq_len;
    int32_t *target_row = targets + row * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      input_row[t] = window[t];
      target_row[t] = window[t + 1];
    }
  }
  return MP_OK;
}
