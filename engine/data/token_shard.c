/*
 * engine/data/token_shard.c — opening, checking, range-reading and writing llm.c token shards of
 * uint16 and uint32 ids; see token_shard.h.
 *
 * Bytes are decoded and encoded explicitly as little-endian, so the files are the same on every
 * host. Opening checks in the order a user would debug: can it be opened, is it long enough to
 * have a header, is it a token shard at all (magic), which version, does its size agree with its
 * count. The ids are checked as they are read, since reading them all at open would touch every
 * page of a corpus that a rank mostly never trains on.
 *
 * Reading maps the file rather than using pread: a window is a few kilobytes at a random place,
 * and the page cache then serves every rank of a host from one copy. After a range is copied out
 * its pages are dropped from this process (MADV_DONTNEED; they stay cached by the kernel), so the
 * resident memory of a process never grows with the shards it has read, only with what it keeps.
 * One caveat of mapping: a shard truncated by someone else while it is open raises SIGBUS on the
 * next read of the lost pages. Shards are written once and renamed into place, so that takes a
 * user overwriting a shard in place under a running job.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#include "engine/data/token_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"

/* The magic number of llm.c's GPT-2 checkpoints, named when someone passes one as data. */
enum { kLlmcCheckpointMagic = 20240326 };

/* Ids copied (and their pages released) per piece of a long read: 1 MiB of uint32. */
enum { kReadPieceIds = 1 << 18 };

/* Ids encoded per write when appending. */
enum { kWritePieceIds = 1 << 14 };

static int32_t read_le_int32(const unsigned char *bytes) {
  uint32_t value = (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 |
                   (uint32_t)bytes[3] << 24;
  return (int32_t)value;
}

static void write_le_int32(unsigned char *bytes, int32_t value) {
  uint32_t bits = (uint32_t)value;
  for (int i = 0; i < 4; ++i) bytes[i] = (unsigned char)(bits >> (8 * i));
}

static char *copy_string(const char *text) {
  const size_t bytes = strlen(text) + 1;
  char *copy = malloc(bytes);
  if (copy != NULL) memcpy(copy, text, bytes);
  return copy;
}

static mp_status check_vocab(const char *path, int64_t vocab_size, mp_error *err) {
  if (vocab_size < 1 || vocab_size > MP_TOKEN_SHARD_U32_MAX_VOCAB) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: vocabulary size %lld is outside 1 .. %lld, the ids a token shard can "
                   "hold (uint32)",
                   path, (long long)vocab_size, (long long)MP_TOKEN_SHARD_U32_MAX_VOCAB);
  }
  return MP_OK;
}

/* ---- reading ---- */

struct mp_token_shard {
  char *path;
  int64_t vocab_size;
  int32_t magic, version;
  int id_bytes;               /* 2 or 4 */
  int64_t count;              /* N */
  const unsigned char *map;   /* (map_bytes,) the whole file, header included; NULL when N = 0 */
  size_t map_bytes;
};

/* Checks the 1024-byte header against the file's size and fills the shard's format fields. */
static mp_status check_header(const char *path, const unsigned char *header, int64_t file_bytes,
                              mp_token_shard *shard, mp_error *err) {
  const int32_t magic = read_le_int32(header);
  int32_t expected_version = 0;
  const char *width = NULL;
  if (magic == MP_TOKEN_SHARD_MAGIC) {
    expected_version = MP_TOKEN_SHARD_VERSION;
    shard->id_bytes = 2;
    width = "uint16";
  } else if (magic == MP_TOKEN_SHARD_U32_MAGIC) {
    expected_version = MP_TOKEN_SHARD_U32_VERSION;
    shard->id_bytes = 4;
    width = "uint32";
  } else if (magic == kLlmcCheckpointMagic) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: bad magic number %d in the header (expected %d for uint16 ids or %d for "
                   "uint32 ids): not an llm.c token shard; %d marks an llm.c GPT-2 checkpoint "
                   "(use it with --init-from)",
                   path, magic, MP_TOKEN_SHARD_MAGIC, MP_TOKEN_SHARD_U32_MAGIC, magic);
  } else {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: bad magic number %d in the header (expected %d for uint16 ids or %d for "
                   "uint32 ids): not an llm.c token shard",
                   path, magic, MP_TOKEN_SHARD_MAGIC, MP_TOKEN_SHARD_U32_MAGIC);
  }
  const int32_t version = read_le_int32(header + 4);
  if (version != expected_version) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: token shard version %d, expected %d with magic %d (llm.c's shards of %s "
                   "tokens); write the shard again with llm.c's dev/data scripts or `mpengine "
                   "data tokenize`",
                   path, version, expected_version, magic, width);
  }
  const int64_t count = read_le_int32(header + 8);
  if (count < 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the header's token count %lld is negative; the shard is corrupt", path,
                   (long long)count);
  }
  const int64_t expected_bytes = MP_TOKEN_SHARD_HEADER_BYTES + shard->id_bytes * count;
  if (file_bytes < expected_bytes) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the header says %lld tokens, which take %d + %d x %lld = %lld bytes, but "
                   "the file is %lld bytes (%lld short); the shard is truncated: copy or write "
                   "it again",
                   path, (long long)count, MP_TOKEN_SHARD_HEADER_BYTES, shard->id_bytes,
                   (long long)count, (long long)expected_bytes, (long long)file_bytes,
                   (long long)(expected_bytes - file_bytes));
  }
  if (file_bytes > expected_bytes) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the header says %lld tokens, which take %d + %d x %lld = %lld bytes, but "
                   "the file is %lld bytes (%lld too many); the shard is corrupt",
                   path, (long long)count, MP_TOKEN_SHARD_HEADER_BYTES, shard->id_bytes,
                   (long long)count, (long long)expected_bytes, (long long)file_bytes,
                   (long long)(file_bytes - expected_bytes));
  }
  shard->magic = magic;
  shard->version = version;
  shard->count = count;
  return MP_OK;
}

void mp_token_shard_close(mp_token_shard *shard) {
  if (shard == NULL) return;
  if (shard->map != NULL) munmap((void *)shard->map, shard->map_bytes);
  free(shard->path);
  free(shard);
}

/* Reads exactly bytes at offset 0, for the header (before the file is mapped). */
static mp_status read_header(int fd, const char *path, unsigned char *header, mp_error *err) {
  size_t done = 0;
  while (done < MP_TOKEN_SHARD_HEADER_BYTES) {
    const ssize_t got =
        pread(fd, header + done, MP_TOKEN_SHARD_HEADER_BYTES - done, (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot read the header: %s", path,
                     got < 0 ? strerror(errno) : "unexpected end of file");
    }
    done += (size_t)got;
  }
  return MP_OK;
}

mp_status mp_token_shard_open(const char *path, int64_t vocab_size, mp_token_shard **out,
                              mp_error *err) {
  *out = NULL;
  MP_TRY(check_vocab(path, vocab_size, err));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  mp_status status = MP_OK;
  mp_token_shard *shard = calloc(1, sizeof *shard);
  if (shard == NULL || (shard->path = copy_string(path)) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
    goto done;
  }
  shard->vocab_size = vocab_size;
  struct stat info;
  if (fstat(fd, &info) != 0) {
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
  status = read_header(fd, path, header, err);
  if (status != MP_OK) goto done;
  status = check_header(path, header, file_bytes, shard, err);
  if (status != MP_OK || shard->count == 0) goto done;
  /* The whole file: mappings start at a page boundary, and the header is one. */
  shard->map_bytes = (size_t)file_bytes;
  void *map = mmap(NULL, shard->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    status = mp_fail(err, MP_ERR_RUNTIME, "%s: cannot map %lld bytes: %s", path,
                     (long long)file_bytes, strerror(errno));
    goto done;
  }
  shard->map = map;

done:
  close(fd); /* the mapping keeps the file */
  if (status != MP_OK) {
    mp_token_shard_close(shard);
    return status;
  }
  *out = shard;
  return MP_OK;
}

int64_t mp_token_shard_count(const mp_token_shard *shard) { return shard->count; }

int mp_token_shard_id_bytes(const mp_token_shard *shard) { return shard->id_bytes; }

int32_t mp_token_shard_magic(const mp_token_shard *shard) { return shard->magic; }

int32_t mp_token_shard_version(const mp_token_shard *shard) { return shard->version; }

const char *mp_token_shard_path(const mp_token_shard *shard) { return shard->path; }

static mp_status id_outside_vocabulary(const mp_token_shard *shard, int64_t index, uint32_t id,
                                       mp_error *err) {
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: token id %lu at token %lld (byte offset %lld) is outside the vocabulary of "
                 "%lld ids (0 .. %lld); the shard was made with another tokenizer, or the "
                 "model's vocab_size is too small",
                 shard->path, (unsigned long)id, (long long)index,
                 (long long)(MP_TOKEN_SHARD_HEADER_BYTES + index * shard->id_bytes),
                 (long long)shard->vocab_size, (long long)shard->vocab_size - 1);
}

/* Drops the pages of map[begin, end) from this process (not from the page cache), so reading a
 * corpus never adds to the process's resident memory. Advice only: a failure changes nothing. */
static void release_pages(const mp_token_shard *shard, size_t begin, size_t end) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t first_page = begin / page * page;
  size_t last = (end + page - 1) / page * page;
  if (last > shard->map_bytes) last = shard->map_bytes;
  if (last > first_page) {
    madvise((void *)(shard->map + first_page), last - first_page, MADV_DONTNEED);
  }
}

mp_status mp_token_shard_read(const mp_token_shard *shard, int64_t first, int64_t count,
                              uint32_t *dest, mp_error *err) {
  if (first < 0 || count < 0 || first > shard->count - count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tokens %lld .. %lld are not inside the shard's %lld tokens", shard->path,
                   (long long)first, (long long)(first + count - 1), (long long)shard->count);
  }
  const int64_t vocab = shard->vocab_size;
  for (int64_t at = 0; at < count; at += kReadPieceIds) {
    const int64_t n = count - at < kReadPieceIds ? count - at : kReadPieceIds;
    const size_t begin =
        MP_TOKEN_SHARD_HEADER_BYTES + (size_t)(first + at) * (size_t)shard->id_bytes;
    const unsigned char *bytes = shard->map + begin;
    uint32_t *out = dest + at;
    mp_status status = MP_OK;
    if (shard->id_bytes == 2) {
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t id = (uint32_t)bytes[2 * i] | (uint32_t)bytes[2 * i + 1] << 8;
        if (id >= vocab) {
          status = id_outside_vocabulary(shard, first + at + i, id, err);
          break;
        }
        out[i] = id;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t id = (uint32_t)bytes[4 * i] | (uint32_t)bytes[4 * i + 1] << 8 |
                            (uint32_t)bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
        if ((int64_t)id >= vocab) {
          status = id_outside_vocabulary(shard, first + at + i, id, err);
          break;
        }
        out[i] = id;
      }
    }
    release_pages(shard, begin, begin + (size_t)n * (size_t)shard->id_bytes);
    MP_TRY(status);
  }
  return MP_OK;
}

/* ---- writing ---- */

struct mp_token_shard_writer {
  mp_atomic_file file;
  int64_t vocab_size;
  int id_bytes;  /* 2 or 4 */
  int64_t count; /* tokens appended */
};

int mp_token_shard_id_bytes_for_vocab(int64_t vocab_size) {
  return vocab_size <= MP_TOKEN_SHARD_MAX_VOCAB ? 2 : 4;
}

/* The header of a shard of count ids of id_bytes each. */
static void encode_header(unsigned char *header, int id_bytes, int64_t count) {
  memset(header, 0, MP_TOKEN_SHARD_HEADER_BYTES);
  write_le_int32(header, id_bytes == 2 ? MP_TOKEN_SHARD_MAGIC : MP_TOKEN_SHARD_U32_MAGIC);
  write_le_int32(header + 4, id_bytes == 2 ? MP_TOKEN_SHARD_VERSION : MP_TOKEN_SHARD_U32_VERSION);
  write_le_int32(header + 8, (int32_t)count);
}

mp_status mp_token_shard_writer_open(const char *path, int64_t vocab_size,
                                     mp_token_shard_writer **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_vocab(path, vocab_size, err));
  struct stat info;
  if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: is a directory; name a file to write the shard to",
                   path);
  }
  mp_token_shard_writer *w = calloc(1, sizeof *w);
  if (w == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  const mp_status status = mp_atomic_file_open(&w->file, path, err);
  if (status != MP_OK) {
    free(w);
    return status;
  }
  w->vocab_size = vocab_size;
  w->id_bytes = mp_token_shard_id_bytes_for_vocab(vocab_size);
  /* A header with count 0 now, so the ids land at their offsets; close writes the real count. */
  unsigned char header[MP_TOKEN_SHARD_HEADER_BYTES];
  encode_header(header, w->id_bytes, 0);
  mp_atomic_file_write(&w->file, header, sizeof header);
  *out = w;
  return MP_OK;
}

mp_status mp_token_shard_writer_append(mp_token_shard_writer *w, const uint32_t *ids,
                                       int64_t count, mp_error *err) {
  const char *path = w->file.path;
  if (count < 0 || count > MP_TOKEN_SHARD_MAX_TOKENS - w->count) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: appending %lld tokens to the %lld written would pass the %lld a shard "
                   "holds (its header stores the count as an int32); start another shard",
                   path, (long long)count, (long long)w->count,
                   (long long)MP_TOKEN_SHARD_MAX_TOKENS);
  }
  /* Every id first, so a refused append writes nothing and the shard stays consistent. */
  for (int64_t i = 0; i < count; ++i) {
    if ((int64_t)ids[i] >= w->vocab_size) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: token id %lu (index %lld of this append, token %lld of the shard) is "
                     "outside the vocabulary of %lld ids (0 .. %lld)",
                     path, (unsigned long)ids[i], (long long)i, (long long)(w->count + i),
                     (long long)w->vocab_size, (long long)w->vocab_size - 1);
    }
  }
  unsigned char piece[4 * kWritePieceIds];
  for (int64_t at = 0; at < count; at += kWritePieceIds) {
    const int64_t n = count - at < kWritePieceIds ? count - at : kWritePieceIds;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t id = ids[at + i];
      unsigned char *bytes = piece + (size_t)i * (size_t)w->id_bytes;
      for (int b = 0; b < w->id_bytes; ++b) bytes[b] = (unsigned char)(id >> (8 * b));
    }
    mp_atomic_file_write(&w->file, piece, (size_t)n * (size_t)w->id_bytes);
  }
  if (w->file.failed) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot write: %s", path, strerror(w->file.error));
  }
  w->count += count;
  return MP_OK;
}

int64_t mp_token_shard_writer_count(const mp_token_shard_writer *w) { return w->count; }

mp_status mp_token_shard_writer_close(mp_token_shard_writer *w, mp_error *err) {
  unsigned char header[MP_TOKEN_SHARD_HEADER_BYTES];
  encode_header(header, w->id_bytes, w->count);
  mp_atomic_file_write_at(&w->file, 0, header, sizeof header);
  const mp_status status = mp_atomic_file_commit(&w->file, err);
  free(w);
  return status;
}

void mp_token_shard_writer_abort(mp_token_shard_writer *w) {
  if (w == NULL) return;
  mp_atomic_file_abort(&w->file);
  free(w);
}

mp_status mp_token_shard_write(const char *path, const uint16_t *tokens, int64_t count,
                               mp_error *err) {
  if (count < 0 || count > MP_TOKEN_SHARD_MAX_TOKENS) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: cannot write %lld tokens; a token shard holds 0 .. %lld (its header "
                   "stores the count as an int32)",
                   path, (long long)count, (long long)MP_TOKEN_SHARD_MAX_TOKENS);
  }
  mp_token_shard_writer *w = NULL;
  MP_TRY(mp_token_shard_writer_open(path, MP_TOKEN_SHARD_MAX_VOCAB, &w, err));
  uint32_t piece[kWritePieceIds];
  for (int64_t at = 0; at < count; at += kWritePieceIds) {
    const int64_t n = count - at < kWritePieceIds ? count - at : kWritePieceIds;
    for (int64_t i = 0; i < n; ++i) piece[i] = tokens[at + i];
    const mp_status status = mp_token_shard_writer_append(w, piece, n, err);
    if (status != MP_OK) {
      mp_token_shard_writer_abort(w);
      return status;
    }
  }
  return mp_token_shard_writer_close(w, err);
}
