/*
 * engine/data/token_shard.h — llm.c token shards: the files `run --data GLOB` trains on,
 * `mpengine data synth` and `data tokenize` write and `data inspect` checks.
 *
 * Format (little-endian), as llm.c's dev/data/data_common.py writes it:
 *   header  256 x int32 (1024 bytes): [0] magic, [1] version, [2] token count N, the rest 0
 *   tokens  N x id, where the magic and version say how wide an id is:
 *             magic 20240520, version 1: uint16 ids (GPT-2; vocabularies up to 65,536)
 *             magic 20240801, version 7: uint32 ids (Llama 3's 128,256 and other large ones)
 * so a shard of N tokens is exactly 1024 + 2 N or 1024 + 4 N bytes. Writers choose the width
 * from the vocabulary size: uint16 when every id fits, uint32 above.
 *
 * Shards come from outside, so every check that can fail is made here, where the tokens enter:
 * a wrong magic, a version, a size that disagrees with the count, or an id outside the model's
 * vocabulary each get one message naming the file (and for an id, its token index and byte
 * offset), and the layers downstream trust them.
 *
 * Reading never loads a shard whole: mp_token_shard_open checks the header and the size and
 * maps the file (mmap, read-only, shared with the page cache); mp_token_shard_read copies a
 * range of ids out, checking each, and then drops those pages from the process again. So a
 * rank's memory holds only the windows it is reading, whatever the corpus's size (DESIGN.md,
 * shard-first). The ids of a range are checked when the range is read: `data inspect` reads
 * every range of a shard, a training run only the windows it draws.
 *
 * Writing goes through a temporary file in the same directory that is flushed to disk and then
 * renamed over the target (common/atomic_file.h), so a crash never leaves a half-written shard
 * under the real name.
 */
#ifndef MPENGINE_ENGINE_TOKEN_SHARD_H
#define MPENGINE_ENGINE_TOKEN_SHARD_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  /* llm.c's first format: uint16 ids ("gpt-2" in data_common.py). */
  MP_TOKEN_SHARD_MAGIC = 20240520,
  MP_TOKEN_SHARD_VERSION = 1,
  /* llm.c's second format: uint32 ids ("llama-3" in data_common.py). */
  MP_TOKEN_SHARD_U32_MAGIC = 20240801,
  MP_TOKEN_SHARD_U32_VERSION = 7,
  MP_TOKEN_SHARD_HEADER_INTS = 256,
  MP_TOKEN_SHARD_HEADER_BYTES = 256 * 4,
  MP_TOKEN_SHARD_MAX_VOCAB = 65536, /* the largest vocabulary written with uint16 ids */
};

/* Largest token count a shard can hold: the header stores it as an int32. */
#define MP_TOKEN_SHARD_MAX_TOKENS ((int64_t)INT32_MAX)

/* Largest vocabulary any shard can hold: every uint32 id. */
#define MP_TOKEN_SHARD_U32_MAX_VOCAB ((int64_t)1 << 32)

/* ---- reading ---- */

typedef struct mp_token_shard mp_token_shard;

/* Opens the shard at path for ids below vocab_size (1 .. MP_TOKEN_SHARD_U32_MAX_VOCAB; pass the
 * model's vocab_size, or MP_TOKEN_SHARD_U32_MAX_VOCAB to accept every id): checks its header
 * and that its size is the header plus count ids, and maps it. No id is read yet. On success
 * *out is closed with mp_token_shard_close.
 * Fails with MP_ERR_INPUT and a message that starts with the path when the file cannot be
 * opened, is a directory, is shorter than the 1024-byte header, has a magic other than 20240520
 * or 20240801 ("not an llm.c token shard"), a version other than its magic's (1 or 7), a
 * negative count, or a size that disagrees with the count (the sizes stated, with the size
 * expected: "truncated" when it is shorter); or when vocab_size is out of range. MP_ERR_RUNTIME
 * when mapping fails or memory runs out. */
mp_status mp_token_shard_open(const char *path, int64_t vocab_size, mp_token_shard **out,
                              mp_error *err);

/* N, the number of tokens the shard holds. */
int64_t mp_token_shard_count(const mp_token_shard *shard);

/* The width of an id in the file: 2 (magic 20240520) or 4 (magic 20240801). */
int mp_token_shard_id_bytes(const mp_token_shard *shard);

/* The header's magic and version (20240520 and 1, or 20240801 and 7). */
int32_t mp_token_shard_magic(const mp_token_shard *shard);
int32_t mp_token_shard_version(const mp_token_shard *shard);

/* The path it was opened with. */
const char *mp_token_shard_path(const mp_token_shard *shard);

/* Copies ids first .. first + count - 1 into dest (count ids), checking each against the
 * vocabulary the shard was opened with. Reads only the pages of that range, and releases them
 * from the process's memory afterwards (they stay in the page cache). Fails with MP_ERR_INPUT on
 * the first id >= vocab_size, naming the file, the token's index and byte offset, the id and the
 * vocabulary size (dest then holds the ids before it), or when the range is not inside
 * 0 .. N - 1. Safe to call from several threads on one shard. */
mp_status mp_token_shard_read(const mp_token_shard *shard, int64_t first, int64_t count,
                              uint32_t *dest, mp_error *err);

/* Unmaps and frees; NULL is ignored. */
void mp_token_shard_close(mp_token_shard *shard);

/* ---- writing ---- */

typedef struct mp_token_shard_writer mp_token_shard_writer;

/* The id width a writer chooses for vocab_size: 2 when vocab_size <= 65536, else 4. */
int mp_token_shard_id_bytes_for_vocab(int64_t vocab_size);

/* Starts a shard at path for ids below vocab_size (1 .. MP_TOKEN_SHARD_U32_MAX_VOCAB): uint16
 * ids (magic 20240520, version 1) when vocab_size <= 65536, uint32 ids (magic 20240801,
 * version 7) above. The bytes go to "<path>.tmp-<pid>" in the same directory; path itself is
 * untouched until mp_token_shard_writer_close renames the finished shard over it. Fails with
 * MP_ERR_INPUT when vocab_size is out of range, path is a directory, or the temporary file
 * cannot be created there (missing directory, no permission). On success *out is finished with
 * mp_token_shard_writer_close or mp_token_shard_writer_abort. */
mp_status mp_token_shard_writer_open(const char *path, int64_t vocab_size,
                                     mp_token_shard_writer **out, mp_error *err);

/* Appends count ids. Fails with MP_ERR_INPUT, appending none of them, when one is >= the
 * writer's vocab_size (named with its index in ids and in the shard) or the shard would pass
 * MP_TOKEN_SHARD_MAX_TOKENS (start another shard); with MP_ERR_RUNTIME when writing fails (a full
 * disk). After a failure the writer can still be closed or aborted. */
mp_status mp_token_shard_writer_append(mp_token_shard_writer *w, const uint32_t *ids,
                                       int64_t count, mp_error *err);

/* The number of tokens appended so far. */
int64_t mp_token_shard_writer_count(const mp_token_shard_writer *w);

/* Writes the count into the header, fsyncs, renames the shard into place, syncs the directory,
 * and frees w (whatever the outcome). MP_ERR_RUNTIME when any of that, or an earlier write,
 * failed; the temporary file is removed then and path keeps its old contents. */
mp_status mp_token_shard_writer_close(mp_token_shard_writer *w, mp_error *err);

/* Gives up: removes the temporary file and frees w; path is untouched. NULL is ignored. */
void mp_token_shard_writer_abort(mp_token_shard_writer *w);

/* Writes count uint16 tokens (0 .. MP_TOKEN_SHARD_MAX_TOKENS) as a uint16 shard at path in one
 * call, through a writer for vocabulary 65536 (so the errors are the writer's). */
mp_status mp_token_shard_write(const char *path, const uint16_t *tokens, int64_t count,
                               mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TOKEN_SHARD_H */
