/*
 * engine/data/token_shard.c — reading, validating and writing llm.c token shards; see
 * token_shard.h.
 *
 * Bytes are decoded and encoded explicitly as little-endian, so the files are the same on every
 * host. Reading validates in the order a user would debug: can it be opened, is it long enough to
 * have a header, is it a token shard at all (magic), which version, does its size agree with its
 * count, are its ids inside the vocabulary.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/data/token_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"

/* The magic number of llm.c's GPT-2 checkpoints, named when someone passes one as data. */
enum { kLlmcCheckpointMagic = 20240326 };

static int32_t read_le_int32(const unsigned char *bytes) {
  uint32_t value = (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 |
                   (uint32_t)bytes[3] << 24;
  return (int32_t)value;
}

static void write_le_int32(unsigned char *bytes, int32_t value) {
  uint32_t bits = (uint32_t)value;
  for (int i = 0; i < 4; ++i) bytes[i] = (unsigned char)(bits >> (8 * i));
}

static uint16_t read_le_uint16(const unsigned char *bytes) {
  return (uint16_t)(bytes[0] | bytes[1] << 8);
}

/* Checks the 1024-byte header against the file's size; *out_count is the header's count. */
static mp_status check_header(const char *path, const unsigned char *header, int64_t file_bytes,
                              int64_t *out_count, mp_error *err) {
  const int32_t magic = read_le_int32(header);
  if (magic != MP_TOKEN_SHARD_MAGIC) {
    if (magic == kLlmcCheckpointMagic) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: bad magic number %d in the header (expected %d): not an llm.c token "
                     "shard; %d marks an llm.c GPT-2 checkpoint (use it with --init-from)",
                     path, magic, MP_TOKEN_SHARD_MAGIC, magic);
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: bad magic number %d in the header (expected %d): not an llm.c token shard",
                   path, magic, MP_TOKEN_SHARD_MAGIC);
  }
  const int32_t version = read_le_int32(header + 4);
  if (version != MP_TOKEN_SHARD_VERSION) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: token shard version %d, expected %d (llm.c's shards of uint16 tokens); "
                   "write the shard again with llm.c's dev/data scripts or `mpengine data synth`",
                   path, version, MP_TOKEN_SHARD_VERSION);
  }
  const int64_t count = read_le_int32(header + 8);
  if (count < 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the header's token count %lld is negative; the shard is corrupt", path,
                   (long long)count);
  }
  const int64_t expected_bytes = MP_TOKEN_SHARD_HEADER_BYTES + 2 * count;
  if (file_bytes != expected_bytes) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the header says %lld tokens, which take %d + 2 x %lld = %lld bytes, but "
                   "the file is %lld bytes; the shard is truncated or corrupt",
                   path, (long long)count, MP_TOKEN_SHARD_HEADER_BYTES, (long long)count,
                   (long long)expected_bytes, (long long)file_bytes);
  }
  *out_count = count;
  return MP_OK;
}

/* Decodes count little-endian uint16 ids from bytes into tokens, failing on the first id that is
 * not below vocab_size. */
static mp_status decode_tokens(const char *path, const unsigned char *bytes, int64_t first,
                               int64_t count, int64_t vocab_size, uint16_t *tokens,
                               mp_error *err) {
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t id = read_le_uint16(bytes + 2 * i);
    if (id >= vocab_size) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: token id %u at position %lld is outside the vocabulary of %lld ids "
                     "(0 .. %lld); the shard was made with another tokenizer, or the model's "
                     "vocab_size is too small",
                     path, (unsigned)id, (long long)(first + i), (long long)vocab_size,
                     (long long)vocab_size - 1);
    }
    tokens[i] = id;
  }
  return MP_OK;
}

mp_status mp_token_shard_read(const char *path, int64_t vocab_size, uint16_t **out_tokens,
                              int64_t *out_count, mp_error *err) {
  *out_tokens = NULL;
  *out_count = 0;
  if (vocab_size < 1 || vocab_size > MP_TOKEN_SHARD_MAX_VOCAB) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: vocabulary size %lld is outside 1 .. %d, the ids a uint16 token shard "
                   "can hold",
                   path, (long long)vocab_size, MP_TOKEN_SHARD_MAX_VOCAB);
  }
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  mp_status status = MP_OK;
  uint16_t *tokens = NULL;
  unsigned char *chunk = NULL;
  struct stat info;
  if (fstat(fileno(file), &info) != 0) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot stat: %s", path, strerror(errno));
    goto done;
  }
  if (S_ISDIR(info.st_mode)) {
    status = mp_fail(err, MP_ERR_INPUT, "%s: is a directory, not a token shard", path);
    goto done;
  }
  const int64_t file_bytes = (int64_t)info.st_size;
  if (file_bytes < MP_TOKEN_SHARD_HEADER_BYTES) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "%s: %lld bytes, shorter than the %d-byte header of an llm.c token shard",
                     path, (long long)file_bytes, MP_TOKEN_SHARD_HEADER_BYTES);
    goto done;
  }
  unsigned char header[MP_TOKEN_SHARD_HEADER_BYTES];
  if (fread(header, 1, sizeof header, file) != sizeof header) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot read the header: %s", path,
                     ferror(file) ? strerror(errno) : "unexpected end of file");
    goto done;
  }
  int64_t count = 0;
  status = check_header(path, header, file_bytes, &count, err);
  if (status != MP_OK || count == 0) goto done;

  tokens = malloc((size_t)count * sizeof *tokens);
  enum { kChunkTokens = 1 << 16 };
  chunk = malloc(2 * kChunkTokens);
  if (tokens == NULL || chunk == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory for %lld tokens", path,
                     (long long)count);
    goto done;
  }
  for (int64_t first = 0; first < count; first += kChunkTokens) {
    const int64_t n = count - first < kChunkTokens ? count - first : kChunkTokens;
    if (fread(chunk, 2, (size_t)n, file) != (size_t)n) {
      status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot read tokens %lld .. %lld: %s", path,
                       (long long)first, (long long)(first + n - 1),
                       ferror(file) ? strerror(errno) : "the file shrank while being read");
      goto done;
    }
    status = decode_tokens(path, chunk, first, n, vocab_size, tokens + first, err);
    if (status != MP_OK) goto done;
  }
  *out_tokens = tokens;
  *out_count = count;
  tokens = NULL;

done:
  free(chunk);
  free(tokens);
  fclose(file);
  return status;
}

mp_status mp_token_shard_write(const char *path, const uint16_t *tokens, int64_t count,
                               mp_error *err) {
  if (count < 0 || count > MP_TOKEN_SHARD_MAX_TOKENS) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: cannot write %lld tokens; a token shard holds 0 .. %lld (its header "
                   "stores the count as an int32)",
                   path, (long long)count, (long long)MP_TOKEN_SHARD_MAX_TOKENS);
  }
  struct stat info;
  if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: is a directory; name a file to write the shard to",
                   path);
  }
  mp_atomic_file file;
  MP_TRY(mp_atomic_file_open(&file, path, err));
  unsigned char header[MP_TOKEN_SHARD_HEADER_BYTES] = {0};
  write_le_int32(header, MP_TOKEN_SHARD_MAGIC);
  write_le_int32(header + 4, MP_TOKEN_SHARD_VERSION);
  write_le_int32(header + 8, (int32_t)count);
  mp_atomic_file_write(&file, header, sizeof header);
  /* Tokens are written little-endian whatever the host, a chunk at a time. */
  enum { kChunkTokens = 1 << 16 };
  unsigned char chunk[2 * kChunkTokens];
  for (int64_t first = 0; first < count; first += kChunkTokens) {
    const int64_t n = count - first < kChunkTokens ? count - first : kChunkTokens;
    for (int64_t i = 0; i < n; ++i) {
      chunk[2 * i] = (unsigned char)(tokens[first + i] & 0xff);
      chunk[2 * i + 1] = (unsigned char)(tokens[first + i] >> 8);
    }
    mp_atomic_file_write(&file, chunk, (size_t)(2 * n));
  }
  return mp_atomic_file_commit(&file, err);
}
