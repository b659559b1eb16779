/* common/atomic_file.c — temporary file, fsync, rename, directory sync; see atomic_file.h. */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <unistd.h>

mp_status mp_atomic_file_open(mp_atomic_file *file, const char *path, mp_error *err) {
  memset(file, 0, sizeof *file);
  if (strlen(path) >= sizeof file->path) {
    return mp_fail(err, MP_ERR_INPUT, "%.200s...: the path is longer than %d bytes", path,
                   MP_ATOMIC_FILE_PATH_BYTES - 1);
  }
  snprintf(file->path, sizeof file->path, "%s", path);
  snprintf(file->temporary, sizeof file->temporary, "%s.tmp-%ld", path, (long)getpid());
  file->file = fopen(file->temporary, "wb");
  if (file->file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
  }
  return MP_OK;
}

void mp_atomic_file_write(mp_atomic_file *file, const void *data, size_t bytes) {
  if (file->failed || bytes == 0) return;
  if (fwrite(data, 1, bytes, file->file) != bytes) {
    file->failed = true;
    file->error = errno;
  }
}

void mp_atomic_file_write_at(mp_atomic_file *file, long long offset, const void *data,
                             size_t bytes) {
  if (file->failed || bytes == 0) return;
  if (fseeko(file->file, (off_t)offset, SEEK_SET) != 0 ||
      fwrite(data, 1, bytes, file->file) != bytes) {
    file->failed = true;
    file->error = errno;
  }
}

static void sync_directory_of(const char *path) {
  char copy[MP_ATOMIC_FILE_PATH_BYTES];
  snprintf(copy, sizeof copy, "%s", path);
  const int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return; /* the rename has happened; a directory we cannot open is not fatal */
  fsync(fd);
  close(fd);
}

mp_status mp_atomic_file_commit(mp_atomic_file *file, mp_error *err) {
  if (!file->failed && (fflush(file->file) != 0 || fsync(fileno(file->file)) != 0)) {
    file->failed = true;
    file->error = errno;
  }
  if (fclose(file->file) != 0 && !file->failed) {
    file->failed = true;
    file->error = errno;
  }
  file->file = NULL;
  if (!file->failed && rename(file->temporary, file->path) != 0) {
    file->failed = true;
    file->error = errno;
  }
  if (file->failed) {
    unlink(file->temporary);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot write: %s", file->path,
                   strerror(file->error));
  }
  sync_directory_of(file->path);
  return MP_OK;
}

void mp_atomic_file_abort(mp_atomic_file *file) {
  if (file->file != NULL) fclose(file->file);
  file->file = NULL;
  unlink(file->temporary);
}

mp_status mp_write_file_atomically(const char *path, const void *data, size_t bytes,
                                   mp_error *err) {
  mp_atomic_file file;
  MP_TRY(mp_atomic_file_open(&file, path, err));
  mp_atomic_file_write(&file, data, bytes);
  return mp_atomic_file_commit(&file, err);
}
