/*
 * tests/fuzz/fuzz_util.h — what the fuzz targets share: a NUL-terminated copy of the input for
 * the text parsers, and an anonymous in-memory file (memfd) for the readers that take a path, so
 * that the real file-reading code runs without touching the disk. Include it before any system
 * header: it defines _GNU_SOURCE.
 */
#ifndef MPENGINE_TESTS_FUZZ_FUZZ_UTIL_H
#define MPENGINE_TESTS_FUZZ_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A malloc'ed copy of data with a NUL after it; NULL when out of memory. */
static inline char *fuzz_text_copy(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (text == NULL) return NULL;
  if (size > 0) memcpy(text, data, size);
  text[size] = '\0';
  return text;
}

/* Writes data into a fresh memfd and puts a path naming it ("/proc/self/fd/N") in path; returns
 * the fd (close it when done) or -1. */
static inline int fuzz_memfd_path(const uint8_t *data, size_t size, char *path,
                                  size_t path_bytes) {
  int fd = memfd_create("mpengine-fuzz", 0);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    done += (size_t)n;
  }
  snprintf(path, path_bytes, "/proc/self/fd/%d", fd);
  return fd;
}

#endif /* MPENGINE_TESTS_FUZZ_FUZZ_UTIL_H */
