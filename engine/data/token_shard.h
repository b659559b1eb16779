/*
 * engine/data/token_shard.h — llm.c token shards: the files `run --data GLOB` trains on and
 * `mpengine data synth` writes.
 *
 * Format (little-endian), as llm.c's dev/data scripts write it:
 *   header  256 x int32 (1024 bytes): [0] magic 20240520, [1] version 1, [2] token count N,
 *           the rest 0
 *   tokens  N x uint16, token ids
 * so a shard of N tokens is exactly 1024 + 2 N bytes.
 *
 * Shards come from outside, so every check that can fail is made here, once, where the tokens
 * enter: a wrong magic, a version, a size that disagrees with the count, or an id outside the
 * model's vocabulary each get one message naming the file, and the layers downstream trust them.
 * Writing goes through a temporary file in the same directory that is flushed to disk and then
 * renamed over the target, so a crash never leaves a half-written shard under the real name.
 */
#ifndef MPENGINE_ENGINE_TOKEN_SHARD_H
#define MPENGINE_ENGINE_TOKEN_SHARD_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  MP_TOKEN_SHARD_MAGIC = 20240520,
  MP_TOKEN_SHARD_VERSION = 1,
  MP_TOKEN_SHARD_HEADER_INTS = 256,
  MP_TOKEN_SHARD_HEADER_BYTES = 256 * 4,
  MP_TOKEN_SHARD_MAX_VOCAB = 65536, /* ids are uint16 */
};

/* Largest token count a shard can hold: the header stores it as an int32. */
#define MP_TOKEN_SHARD_MAX_TOKENS ((int64_t)INT32_MAX)

/* Reads the shard at path and checks it against a vocabulary of vocab_size ids (1 .. 65536; pass
 * MP_TOKEN_SHARD_MAX_VOCAB to accept every uint16). On success *out_tokens is a malloc'ed
 * (count,) array of token ids, freed by the caller with free(), and *out_count is count (a shard
 * of 0 tokens gives count 0 and a NULL array).
 * Fails with MP_ERR_INPUT and a message that starts with the path when the file cannot be opened,
 * is shorter than the 1024-byte header, has a magic other than 20240520 ("not an llm.c token
 * shard"), a version other than 1, a header count that disagrees with the file's size (both
 * stated, with the size expected), or a token id >= vocab_size (its position named); with
 * MP_ERR_RUNTIME when reading fails or memory runs out. */
mp_status mp_token_shard_read(const char *path, int64_t vocab_size, uint16_t **out_tokens,
                              int64_t *out_count, mp_error *err);

/* Writes count tokens (0 .. MP_TOKEN_SHARD_MAX_TOKENS) as a shard at path, replacing any file
 * there: the bytes go to "<path>.tmp.<pid>" in the same directory, are fsync'ed, and the file is
 * renamed into place, so path holds either its old contents or the whole new shard. Fails with
 * MP_ERR_INPUT when the temporary file cannot be created there (missing directory, no
 * permission) or count is out of range, with MP_ERR_RUNTIME when writing, syncing or renaming
 * fails (a full disk); the temporary file is removed then. */
mp_status mp_token_shard_write(const char *path, const uint16_t *tokens, int64_t count,
                               mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TOKEN_SHARD_H */
