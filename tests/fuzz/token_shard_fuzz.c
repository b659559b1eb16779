/*
 * tests/fuzz/token_shard_fuzz.c — libFuzzer target: llm.c token shards (mp_token_shard_read),
 * through a memfd so the reader's real open/stat/read path runs.
 *
 * The vocabulary comes from header bytes 12..13 (int32 slot 3, which the format leaves 0 and the
 * reader ignores): 0 means 65536 (every uint16 is valid), anything else is the vocabulary size, so
 * the fuzzer also reaches the out-of-vocabulary refusal.
 */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/data/token_shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int64_t vocab = MP_TOKEN_SHARD_MAX_VOCAB;
  if (size >= 14 && (data[12] | data[13]) != 0) vocab = data[12] | data[13] << 8;
  char path[64];
  int fd = fuzz_memfd_path(data, size, path, sizeof path);
  if (fd < 0) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  uint16_t *tokens = NULL;
  int64_t count = -1;
  if (mp_token_shard_read(path, vocab, &tokens, &count, &err) == MP_OK) {
    if (count < 0 || (size_t)(1024 + 2 * count) != size || (count > 0) != (tokens != NULL)) abort();
    for (int64_t i = 0; i < count; ++i) {
      if (tokens[i] >= vocab) abort();
    }
    free(tokens);
  } else if (tokens != NULL || count != 0 || err.message[0] == '\0') {
    abort();
  }
  close(fd);
  return 0;
}
