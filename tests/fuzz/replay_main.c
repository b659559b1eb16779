/*
 * tests/fuzz/replay_main.c — a main() for the fuzz targets without libFuzzer: calls
 * LLVMFuzzerTestOneInput once on the bytes of every file named on the command line (a directory
 * is read file by file), so the committed corpora run as a regression test under any compiler.
 * Exits 0 when every input ran (a crash or abort in a target fails the test by itself), 1 when a
 * file cannot be read.
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    fprintf(stderr, "replay: %s: cannot open\n", path);
    return 1;
  }
  size_t capacity = 4096, size = 0;
  uint8_t *data = malloc(capacity);
  for (;;) {
    if (data == NULL) {
      fclose(file);
      fprintf(stderr, "replay: %s: out of memory\n", path);
      return 1;
    }
    size += fread(data + size, 1, capacity - size, file);
    if (size < capacity) break;
    capacity *= 2;
    data = realloc(data, capacity);
  }
  int failed = ferror(file);
  fclose(file);
  if (failed) {
    free(data);
    fprintf(stderr, "replay: %s: read error\n", path);
    return 1;
  }
  /* Exactly size bytes, so AddressSanitizer sees a read past the input. */
  uint8_t *exact = malloc(size > 0 ? size : 1);
  if (exact == NULL) {
    free(data);
    return 1;
  }
  memcpy(exact, data, size);
  free(data);
  LLVMFuzzerTestOneInput(exact, size);
  free(exact);
  return 0;
}

static int replay(const char *path, int *count) {
  struct stat info;
  if (stat(path, &info) != 0) {
    fprintf(stderr, "replay: %s: not found\n", path);
    return 1;
  }
  if (!S_ISDIR(info.st_mode)) {
    ++*count;
    return replay_file(path);
  }
  DIR *dir = opendir(path);
  if (dir == NULL) return 1;
  int failures = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char child[4096];
    snprintf(child, sizeof child, "%s/%s", path, entry->d_name);
    failures += replay(child, count);
  }
  closedir(dir);
  return failures;
}

int main(int argc, char **argv) {
  int failures = 0, count = 0;
  for (int i = 1; i < argc; ++i) failures += replay(argv[i], &count);
  printf("replayed %d inputs, %d unreadable\n", count, failures);
  return failures == 0 && count > 0 ? 0 : 1;
}
