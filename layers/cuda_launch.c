/* layers/cuda_launch.c — the first failed kernel launch of each thread; see cuda_launch.h. Plain C:
 * the record is the same with real CUDA, emulated or without it. */
#include "layers/cuda_launch.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct {
  bool failed;
  char kernel[96], file[160], text[160];
  int line;
} launch_failure;

static _Thread_local launch_failure first_failure;

void mp_cuda_record_launch_failure(const char *kernel, const char *file, int line,
                                   const char *error_text) {
  if (first_failure.failed) return;
  first_failure.failed = true;
  snprintf(first_failure.kernel, sizeof first_failure.kernel, "%s", kernel);
  snprintf(first_failure.file, sizeof first_failure.file, "%s", file);
  snprintf(first_failure.text, sizeof first_failure.text, "%s",
           error_text != NULL ? error_text : "unknown error");
  first_failure.line = line;
}

mp_status mp_cuda_take_launch_failure(mp_error *err) {
  if (!first_failure.failed) return MP_OK;
  first_failure.failed = false;
  return mp_fail(err, MP_ERR_RUNTIME, "kernel %s launched at %s:%d failed: %s",
                 first_failure.kernel, first_failure.file, first_failure.line,
                 first_failure.text);
}
