/* tools/blas_kernels.c — choosing OpenBLAS kernels by re-executing once; see blas_kernels.h. */
#include "tools/blas_kernels.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

void tools_select_blas_kernels(char **argv) {
  if (getenv("OPENBLAS_CORETYPE") != NULL) return;
  const char *core = openblas_get_corename();
  if (core == NULL || strcasecmp(core, "prescott") != 0) return;
  __builtin_cpu_init();
  const char *better = NULL;
  if (__builtin_cpu_supports("avx512bf16")) {
    better = "Cooperlake";
  } else if (__builtin_cpu_supports("avx512f")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2")) {
    better = "Haswell";
  }
  if (better == NULL) return;
  if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with the kernels already loaded */
}
