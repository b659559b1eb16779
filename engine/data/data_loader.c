/*
 * engine/data/data_loader.c — stateless batches over a token stream; see data_loader.h for the
 * sample layout and the per-epoch order.
 *
 * The stream is a list of mapped shards (or one in-memory array), shared by reference between a
 * loader and its held-out split, each of which reads a range of it. A window is read straight
 * from the shard (or shards: it may span a boundary) that holds it, so memory stays bounded by
 * one window whatever the corpus. The only state is a cache of one epoch's round keys and the
 * window buffer, so results never depend on the order of calls.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/data/data_loader.h"

#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/sample_order.h"
#include "engine/data/token_shard.h"

/* Largest vocabulary a loader serves: its batches hold ids as int32. */
#define kMaxLoaderVocab ((int64_t)1 << 31)

/* The tokens, shared by a loader and its held-out split (whichever is freed last closes them). */
typedef struct {
  int references;
  char **files;              /* (num_files,) shard paths in reading order */
  mp_token_shard **shards;   /* (num_files,) open shards */
  int64_t *starts;           /* (num_files + 1,) stream index of each shard's first token; the
                                last is the stream's length */
  int num_files;
  uint16_t *memory;          /* (total,) in-memory tokens, checked at construction; or NULL */
  int64_t total;             /* tokens in the stream */
} token_stream;

struct mp_data_loader {
  char *name;              /* the glob pattern, or the in-memory source's description */
  token_stream *stream;
  int64_t first_token;     /* this loader's tokens are stream[first_token, first_token + N) */
  int64_t num_tokens;      /* N */
  /* The order of one epoch, cached: valid when has_order. */
  bool has_order;
  mp_sample_order order;
  uint64_t order_seed;
  int64_t order_epoch;
  uint32_t *window;        /* (window_capacity,) one window's ids */
  int64_t window_capacity;
};

/* ---- the stream ---- */

static void stream_release(token_stream *stream) {
  if (stream == NULL || --stream->references > 0) return;
  for (int i = 0; i < stream->num_files; ++i) {
    mp_token_shard_close(stream->shards[i]);
    free(stream->files[i]);
  }
  free(stream->shards);
  free(stream->files);
  free(stream->starts);
  free(stream->memory);
  free(stream);
}

/* Copies stream tokens [first, first + count) into dest, crossing shard boundaries. */
static mp_status stream_read(const token_stream *stream, int64_t first, int64_t count,
                             uint32_t *dest, mp_error *err) {
  if (stream->memory != NULL) {
    for (int64_t i = 0; i < count; ++i) dest[i] = stream->memory[first + i];
    return MP_OK;
  }
  /* The last shard that starts at or before `first` (binary search: there may be thousands). */
  int lo = 0, hi = stream->num_files - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (stream->starts[mid] <= first) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  for (int shard = lo; count > 0; ++shard) {
    const int64_t local = first - stream->starts[shard];
    const int64_t available = stream->starts[shard + 1] - first;
    if (available <= 0) continue; /* an empty shard */
    const int64_t n = count < available ? count : available;
    MP_TRY(mp_token_shard_read(stream->shards[shard], local, n, dest, err));
    first += n;
    dest += n;
    count -= n;
  }
  return MP_OK;
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
  stream_release(loader->stream);
  free(loader->name);
  free(loader->window);
  free(loader);
}

/* A loader named `name` over a new, empty stream. */
static mp_data_loader *new_loader(const char *name) {
  mp_data_loader *loader = calloc(1, sizeof *loader);
  if (loader == NULL) return NULL;
  loader->stream = calloc(1, sizeof *loader->stream);
  loader->name = copy_string(name);
  if (loader->stream == NULL || loader->name == NULL) {
    mp_data_loader_free(loader);
    return NULL;
  }
  loader->stream->references = 1;
  return loader;
}

static mp_status check_loader_vocab(const char *name, int64_t vocab_size, mp_error *err) {
  if (vocab_size < 1 || vocab_size > kMaxLoaderVocab) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: vocabulary size %lld is outside 1 .. %lld (batches hold ids as int32)",
                   name, (long long)vocab_size, (long long)kMaxLoaderVocab);
  }
  return MP_OK;
}

static int compare_paths(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

mp_status mp_data_loader_open_glob(const char *pattern, int64_t vocab_size, mp_data_loader **out,
                                   mp_error *err) {
  *out = NULL;
  MP_TRY(check_loader_vocab(pattern, vocab_size, err));
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
  mp_status status = MP_OK;
  mp_data_loader *loader = new_loader(pattern);
  token_stream *stream = loader != NULL ? loader->stream : NULL;
  const size_t n = matches.gl_pathc;
  if (loader == NULL || (stream->files = calloc(n, sizeof *stream->files)) == NULL ||
      (stream->shards = calloc(n, sizeof *stream->shards)) == NULL ||
      (stream->starts = calloc(n + 1, sizeof *stream->starts)) == NULL) {
    status = out_of_memory(pattern, err);
    goto done;
  }
  for (size_t i = 0; i < n; ++i) {
    if ((stream->files[i] = copy_string(matches.gl_pathv[i])) == NULL) {
      status = out_of_memory(pattern, err);
      goto done;
    }
    stream->num_files = (int)i + 1;
  }
  /* Byte order of the names, whatever the locale's collation, so every machine reads the same
   * stream. */
  qsort(stream->files, n, sizeof *stream->files, compare_paths);
  for (int i = 0; i < stream->num_files; ++i) {
    status = mp_token_shard_open(stream->files[i], vocab_size, &stream->shards[i], err);
    if (status != MP_OK) goto done;
    stream->starts[i] = stream->total;
    stream->total += mp_token_shard_count(stream->shards[i]);
  }
  stream->starts[stream->num_files] = stream->total;
  loader->num_tokens = stream->total;

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
  MP_TRY(check_loader_vocab(name, vocab_size, err));
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
  mp_data_loader *loader = new_loader(name);
  if (loader == NULL ||
      (count > 0 && (loader->stream->memory = malloc((size_t)count * sizeof *tokens)) == NULL)) {
    mp_data_loader_free(loader);
    return out_of_memory(name, err);
  }
  if (count > 0) memcpy(loader->stream->memory, tokens, (size_t)count * sizeof *tokens);
  loader->stream->total = count;
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
  mp_data_loader *held = calloc(1, sizeof *held);
  if (held == NULL || (held->name = copy_string(name)) == NULL) {
    mp_data_loader_free(held);
    return out_of_memory(loader->name, err);
  }
  /* The same stream, a range of it: the tokens were checked (or will be, as they are read)
   * against the same vocabulary. */
  held->stream = loader->stream;
  ++loader->stream->references;
  held->first_token = loader->first_token + loader->num_tokens - count;
  held->num_tokens = count;
  loader->num_tokens -= count;
  loader->has_order = false; /* S changed: every epoch's order is drawn again */
  *out = held;
  return MP_OK;
}

/* ---- queries ---- */

const char *mp_data_loader_name(const mp_data_loader *loader) { return loader->name; }

int mp_data_loader_num_files(const mp_data_loader *loader) { return loader->stream->num_files; }

const char *mp_data_loader_file(const mp_data_loader *loader, int index) {
  if (index < 0 || index >= loader->stream->num_files) return NULL;
  return loader->stream->files[index];
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

/* The sample at `position` of the endless sequence of epochs, through the cached order. */
static int64_t sample_at(mp_data_loader *loader, uint64_t seed, int64_t samples,
                         int64_t position) {
  const int64_t epoch = position / samples;
  if (!loader->has_order || loader->order.samples != samples || loader->order_seed != seed ||
      loader->order_epoch != epoch) {
    mp_sample_order_init(&loader->order, seed, epoch, samples);
    loader->order_seed = seed;
    loader->order_epoch = epoch;
    loader->has_order = true;
  }
  return mp_sample_order_at(&loader->order, position % samples);
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
  const int64_t window_tokens = seq_len + 1;
  if (loader->window_capacity < window_tokens) {
    uint32_t *grown = realloc(loader->window, (size_t)window_tokens * sizeof *grown);
    if (grown == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory for a window of %lld tokens",
                     loader->name, (long long)window_tokens);
    }
    loader->window = grown;
    loader->window_capacity = window_tokens;
  }
  const int64_t samples = mp_data_loader_num_samples(loader, seq_len);
  for (int64_t row = 0; row < num_samples; ++row) {
    const int64_t position = step * global_batch + first_sample + row;
    const int64_t sample = sample_at(loader, seed, samples, position);
    MP_TRY(stream_read(loader->stream, loader->first_token + sample * seq_len, window_tokens,
                       loader->window, err));
    int32_t *input_row = inputs + row * seq_len;
    int32_t *target_row = targets + row * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      input_row[t] = (int32_t)loader->window[t];
      target_row[t] = (int32_t)loader->window[t + 1];
    }
  }
  return MP_OK;
}
