/*
 * tests/fuzz/token_shard_fuzz.c — libFuzzer target: llm.c token shards of both formats (uint16,
 * magic 20240520; uint32, magic 20240801) through mp_token_shard_open and mp_token_shard_read,
 * via a memfd so the reader's real open/stat/mmap path runs.
 *
 * The vocabulary comes from header bytes 12..15 (int32 slot 3, which the format leaves 0 and the
 * reader ignores): 0 means every id is valid (2^32), anything else is the vocabulary size, so the
 * fuzzer also reaches the out-of-vocabulary refusal. A shard that opens is read whole in ranges
 * cut at a place taken from bytes 16..19, and each read is checked against the bytes themselves.
 */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/data/token_shard.h"

static uint32_t le32(const uint8_t *bytes) {
  return (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 |
         (uint32_t)bytes[3] << 24;
}

/* Reads [first, first + count) and checks every id against the raw bytes and the vocabulary:
 * the read must succeed exactly when every id is inside it. */
static void check_range(const mp_token_shard *shard, const uint8_t *data, int64_t vocab,
                        int64_t first, int64_t count, uint32_t *ids) {
  mp_error err = MP_ERROR_INITIALIZER;
  const int width = mp_token_shard_id_bytes(shard);
  int64_t first_bad = -1;
  for (int64_t i = first; i < first + count && first_bad < 0; ++i) {
    const uint8_t *at = data + 1024 + i * width;
    const uint32_t id = width == 2 ? (uint32_t)(at[0] | at[1] << 8) : le32(at);
    if ((int64_t)id >= vocab) first_bad = i;
  }
  const mp_status status = mp_token_shard_read(shard, first, count, ids, &err);
  if ((status == MP_OK) != (first_bad < 0)) abort();
  if (status != MP_OK && (status != MP_ERR_INPUT || err.message[0] == '\0')) abort();
  const int64_t good = first_bad < 0 ? count : first_bad - first;
  for (int64_t i = 0; i < good; ++i) {
    const uint8_t *at = data + 1024 + (first + i) * width;
    const uint32_t id = width == 2 ? (uint32_t)(at[0] | at[1] << 8) : le32(at);
    if (ids[i] != id) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int64_t vocab = MP_TOKEN_SHARD_U32_MAX_VOCAB;
  if (size >= 16 && le32(data + 12) != 0) vocab = le32(data + 12);
  char path[64];
  int fd = fuzz_memfd_path(data, size, path, sizeof path);
  if (fd < 0) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_token_shard *shard = NULL;
  if (mp_token_shard_open(path, vocab, &shard, &err) == MP_OK) {
    const int64_t count = mp_token_shard_count(shard);
    const int width = mp_token_shard_id_bytes(shard);
    if (count < 0 || (width != 2 && width != 4) || (size_t)(1024 + width * count) != size) {
      abort();
    }
    if ((width == 2) != (mp_token_shard_magic(shard) == MP_TOKEN_SHARD_MAGIC)) abort();
    uint32_t *ids = malloc((size_t)(count > 0 ? count : 1) * sizeof *ids);
    if (ids != NULL) {
      const int64_t cut = size >= 20 && count > 0 ? (int64_t)(le32(data + 16) % (uint32_t)count)
                                                   : 0;
      check_range(shard, data, vocab, 0, cut, ids);
      check_range(shard, data, vocab, cut, count - cut, ids);
      /* A range past the end is refused, never read. */
      if (mp_token_shard_read(shard, count - cut, cut + 1, ids, &err) != MP_ERR_INPUT) abort();
      free(ids);
    }
    mp_token_shard_close(shard);
  } else if (shard != NULL || err.message[0] == '\0') {
    abort();
  }
  close(fd);
  return 0;
}
