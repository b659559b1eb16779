/*
 * common/atomic_file.h — writing a file so that a reader (or a crash) never sees half of it.
 *
 * Every file mpengine writes for a user (plans, timelines, token shards, llm.c checkpoints,
 * checkpoint shards and manifests, cluster descriptions, bench dumps) goes through here: the
 * bytes go to "<path>.tmp-<pid>" in the same directory, are flushed and fsynced, the temporary is
 * renamed over <path>, and the directory is synced, so <path> holds either its old contents or
 * all of the new ones (DESIGN.md, principle 5).
 */
#ifndef MPENGINE_COMMON_ATOMIC_FILE_H
#define MPENGINE_COMMON_ATOMIC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_ATOMIC_FILE_PATH_BYTES = 4096 };

typedef struct {
  FILE *file;
  bool failed;   /* a write failed; commit reports it */
  int error;     /* errno of the first failure */
  char path[MP_ATOMIC_FILE_PATH_BYTES];
  char temporary[MP_ATOMIC_FILE_PATH_BYTES + 32];
} mp_atomic_file;

/* Creates the temporary file. MP_ERR_INPUT "<path>: cannot create: <reason>" when the directory
 * is missing or not writable (the user can fix the path). */
mp_status mp_atomic_file_open(mp_atomic_file *file, const char *path, mp_error *err);

/* Appends bytes; a failure is remembered and reported by commit. */
void mp_atomic_file_write(mp_atomic_file *file, const void *data, size_t bytes);

/* Writes bytes at byte offset of the file (which grows as needed), for files assembled out of
 * order from pieces; later appends continue after the last byte written. A failure is remembered
 * and reported by commit. */
void mp_atomic_file_write_at(mp_atomic_file *file, long long offset, const void *data,
                             size_t bytes);

/* Flushes, fsyncs, closes and renames into place, then syncs the directory. On any failure the
 * temporary is removed and MP_ERR_RUNTIME "<path>: cannot write: <reason>" is returned. */
mp_status mp_atomic_file_commit(mp_atomic_file *file, mp_error *err);

/* Gives up: closes and removes the temporary; <path> is untouched. */
void mp_atomic_file_abort(mp_atomic_file *file);

/* The whole of data in one call. */
mp_status mp_write_file_atomically(const char *path, const void *data, size_t bytes,
                                   mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_ATOMIC_FILE_H */
