/*
 * tests/fuzz/safetensors_fuzz.c — libFuzzer target: safetensors files (mp_safetensors_open_file,
 * then every reader on every tensor it accepts) through a memfd, and sharded indexes
 * (mp_safetensors_open_index).
 *
 * An input that starts with the 4 bytes "idx\n" is the text of a model.safetensors.index.json;
 * it is written beside links to the two golden shards of tests/engine/testdata/safetensors/sharded
 * (in a temporary directory made once) and opened there, so the fuzzer reaches the checks of the
 * map against real files. Any other input is one safetensors file. ("idx\n" read as a header
 * length is over the 100 MB cap, so no file input is lost to the index mode.)
 *
 * What an accepted file must satisfy, or the target aborts: the tensors tile the data section
 * (their bytes lie inside the file), each tensor's element count agrees with its bytes, names are
 * sorted and unique, mp_safetensors_expect accepts each tensor's own dtype and shape, and for the
 * float dtypes rows, row-major and transposed blocks and element ranges all give the same numbers;
 * a file of float tensors written back by mp_safetensors_writer reads back to the same numbers. A
 * refusal must come with a message.
 */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/weights/safetensors.h"

static const char *const kShards[2] = {"model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors"};
static const char kShardDir[] = "tests/engine/testdata/safetensors/sharded/";

static char g_dir[3072];

static void remove_work_dir(void) {
  char path[4096];
  for (int i = 0; i < 2; ++i) {
    snprintf(path, sizeof path, "%s/%s", g_dir, kShards[i]);
    unlink(path);
  }
  const char *others[2] = {"model.safetensors.index.json", "round_trip.safetensors"};
  for (int i = 0; i < 2; ++i) {
    snprintf(path, sizeof path, "%s/%s", g_dir, others[i]);
    unlink(path);
  }
  rmdir(g_dir);
}

/* The work directory (under $TEST_TMPDIR in a Bazel test, else /tmp) with links to the golden
 * shards; aborts when they are not there (the harness runs from the repository root, or from the
 * test's runfiles). */
static void setup(void) {
  if (g_dir[0] != '\0') return;
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/mpengine-safetensors-fuzz-XXXXXX",
           tmp != NULL && strlen(tmp) < 2048 ? tmp : "/tmp");
  if (mkdtemp(g_dir) == NULL) abort();
  atexit(remove_work_dir);
  for (int i = 0; i < 2; ++i) {
    char relative[160], target[4096], link[4096];
    snprintf(relative, sizeof relative, "%s%s", kShardDir, kShards[i]);
    if (realpath(relative, target) == NULL) {
      fprintf(stderr, "safetensors_fuzz: %s not found; run from the repository root\n", relative);
      abort();
    }
    snprintf(link, sizeof link, "%s/%s", g_dir, kShards[i]);
    if (symlink(target, link) != 0) abort();
  }
}

static bool same_float(float a, float b) {
  if (a != a && b != b) return true; /* NaN payloads need not survive a conversion */
  return memcmp(&a, &b, sizeof a) == 0;
}

static bool is_float(mp_safetensors_dtype dtype) {
  return (MP_SAFETENSORS_FLOAT_DTYPES & MP_SAFETENSORS_DTYPE_BIT(dtype)) != 0;
}

/* The matrix view's column count, saturated (as the library does) for tensors of no rows. */
static int64_t columns_of(const mp_safetensors_tensor *t) {
  int64_t columns = 1;
  for (int i = 1; i < t->rank; ++i) {
    if (__builtin_mul_overflow(columns, t->shape[i], &columns)) columns = INT64_MAX;
  }
  return columns;
}

/* Every reader on tensor t agrees with a read of all its elements. */
static void check_reads(const mp_safetensors *st, const mp_safetensors_tensor *t) {
  mp_error err = MP_ERROR_INITIALIZER;
  const int64_t n = t->num_elements;
  float *all = malloc(sizeof *all * (size_t)(n > 0 ? n : 1));
  float *part = malloc(sizeof *part * (size_t)(n > 0 ? n : 1));
  if (all == NULL || part == NULL) abort();
  if (mp_safetensors_read_elements(st, t->name, 0, n, all, &err) != MP_OK) abort();
  if (n > 2 && mp_safetensors_read_elements(st, t->name, 1, n - 1, part, &err) != MP_OK) abort();
  for (int64_t i = 1; n > 2 && i < n - 1; ++i) {
    if (!same_float(part[i - 1], all[i])) abort();
  }
  if (t->rank >= 1) {
    const int64_t rows = t->shape[0], columns = columns_of(t);
    if (mp_safetensors_read_rows(st, t->name, 0, rows, part, &err) != MP_OK) abort();
    for (int64_t i = 0; i < n; ++i) {
      if (!same_float(part[i], all[i])) abort();
    }
    if (rows > 0) {
      const int64_t r0 = rows / 3, r1 = rows - rows / 4, c0 = columns / 3,
                    c1 = columns - columns / 4;
      const int64_t height = r1 - r0, width = c1 - c0;
      for (int layout = 0; layout < 2; ++layout) {
        if (mp_safetensors_read_block(st, t->name, r0, r1, c0, c1,
                                      (mp_safetensors_block_layout)layout, part, &err) != MP_OK) {
          abort();
        }
        for (int64_t r = 0; r < height; ++r) {
          for (int64_t c = 0; c < width; ++c) {
            const float got = layout == 0 ? part[r * width + c] : part[c * height + r];
            if (!same_float(got, all[(r0 + r) * columns + c0 + c])) abort();
          }
        }
      }
    }
    /* Out of range is refused, never read. */
    if (mp_safetensors_read_rows(st, t->name, 0, rows + 1, part, &err) != MP_ERR_RUNTIME) abort();
  } else if (mp_safetensors_read_rows(st, t->name, 0, 1, part, &err) != MP_ERR_RUNTIME) {
    abort();
  }
  if (mp_safetensors_read_elements(st, t->name, 0, n + 1, part, &err) != MP_ERR_RUNTIME) abort();
  free(part);
  free(all);
}

/* Writes the float tensors of st to a file with the writer and checks they read back the same. */
static void check_round_trip(const mp_safetensors *st) {
  const int count = mp_safetensors_num_tensors(st);
  mp_safetensors_tensor_spec *specs = calloc((size_t)(count > 0 ? count : 1), sizeof *specs);
  if (specs == NULL) abort();
  for (int i = 0; i < count; ++i) {
    const mp_safetensors_tensor *t = mp_safetensors_tensor_at(st, i);
    specs[i] = (mp_safetensors_tensor_spec){t->name, t->dtype, t->rank, t->shape};
  }
  const int num_metadata = mp_safetensors_num_metadata(st, 0);
  const char **metadata = calloc((size_t)(2 * num_metadata + 1), sizeof *metadata);
  if (metadata == NULL) abort();
  for (int m = 0; m < num_metadata; ++m) {
    mp_safetensors_metadata_at(st, 0, m, &metadata[2 * m], &metadata[2 * m + 1]);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/round_trip.safetensors", g_dir);
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors_writer *writer = NULL;
  /* The reader accepts what the writer refuses only for metadata or names that are not UTF-8,
   * and the header check refuses those; so creating must work. */
  if (mp_safetensors_writer_create(path, specs, count, metadata, num_metadata, &writer, &err) !=
      MP_OK) {
    abort();
  }
  for (int i = 0; i < count; ++i) {
    const mp_safetensors_tensor *t = mp_safetensors_tensor_at(st, i);
    float *values = malloc(sizeof *values * (size_t)(t->num_elements > 0 ? t->num_elements : 1));
    if (values == NULL) abort();
    if (mp_safetensors_read_elements(st, t->name, 0, t->num_elements, values, &err) != MP_OK ||
        mp_safetensors_writer_append(writer, t->name, values, t->num_elements, &err) != MP_OK) {
      abort();
    }
    free(values);
  }
  if (mp_safetensors_writer_finish(writer, &err) != MP_OK) abort();
  mp_safetensors *back = NULL;
  if (mp_safetensors_open_file(path, &back, &err) != MP_OK) abort();
  if (mp_safetensors_num_tensors(back) != count) abort();
  for (int i = 0; i < count; ++i) {
    const mp_safetensors_tensor *t = mp_safetensors_tensor_at(st, i);
    const mp_safetensors_tensor *u = mp_safetensors_tensor_at(back, i);
    if (strcmp(t->name, u->name) != 0 || t->dtype != u->dtype || t->rank != u->rank) abort();
    const int64_t n = t->num_elements;
    float *a = malloc(sizeof *a * (size_t)(n > 0 ? n : 1)),
          *b = malloc(sizeof *b * (size_t)(n > 0 ? n : 1));
    if (a == NULL || b == NULL) abort();
    if (mp_safetensors_read_elements(st, t->name, 0, n, a, &err) != MP_OK ||
        mp_safetensors_read_elements(back, t->name, 0, n, b, &err) != MP_OK) {
      abort();
    }
    for (int64_t j = 0; j < n; ++j) {
      if (!same_float(a[j], b[j])) abort();
    }
    free(a);
    free(b);
  }
  mp_safetensors_close(back);
  free(metadata);
  free(specs);
}

static void check_accepted(const mp_safetensors *st, int64_t total_bytes_limit) {
  const int count = mp_safetensors_num_tensors(st);
  bool all_float = true;
  int64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const mp_safetensors_tensor *t = mp_safetensors_tensor_at(st, i);
    if (i > 0 && strcmp(mp_safetensors_tensor_at(st, i - 1)->name, t->name) >= 0) abort();
    if (mp_safetensors_find(st, t->name) != t) abort();
    int64_t elements = 1;
    for (int d = 0; d < t->rank; ++d) elements *= t->shape[d]; /* checked below 2^53 */
    if (elements != t->num_elements) abort();
    if (t->num_bytes != elements * mp_safetensors_dtype_bytes(t->dtype)) abort();
    if (t->file_offset < 8 || t->num_bytes > total_bytes_limit) abort();
    bytes += t->num_bytes;
    mp_error err = MP_ERROR_INITIALIZER;
    const mp_safetensors_tensor *found = NULL;
    if (mp_safetensors_expect(st, t->name, MP_SAFETENSORS_DTYPE_BIT(t->dtype), t->rank, t->shape,
                              &found, &err) != MP_OK ||
        found != t) {
      abort();
    }
    if (is_float(t->dtype)) {
      check_reads(st, t);
    } else {
      all_float = false;
      float one;
      if (mp_safetensors_read_elements(st, t->name, 0, 0, &one, &err) != MP_ERR_INPUT) abort();
    }
  }
  if (bytes > total_bytes_limit) abort();
  if (all_float && mp_safetensors_num_files(st) == 1) check_round_trip(st);
}

static void fuzz_index(const uint8_t *data, size_t size) {
  setup();
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_dir);
  FILE *file = fopen(path, "wb");
  if (file == NULL) abort();
  if (size > 0 && fwrite(data, 1, size, file) != size) abort();
  fclose(file);
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors *st = NULL;
  if (mp_safetensors_open_index(path, &st, &err) == MP_OK) {
    check_accepted(st, 1 << 20);
    mp_safetensors_close(st);
  } else if (st != NULL || err.message[0] == '\0') {
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= 4 && memcmp(data, "idx\n", 4) == 0) {
    fuzz_index(data + 4, size - 4);
    return 0;
  }
  setup(); /* the round trip writes into the work directory */
  char path[64];
  int fd = fuzz_memfd_path(data, size, path, sizeof path);
  if (fd < 0) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_safetensors *st = NULL;
  if (mp_safetensors_open_file(path, &st, &err) == MP_OK) {
    check_accepted(st, (int64_t)size);
    mp_safetensors_close(st);
  } else if (st != NULL || err.message[0] == '\0') {
    abort();
  }
  close(fd);
  return 0;
}
