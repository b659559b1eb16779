/* tools/build_id.c — a hash of the executable as its build id; see build_id.h. */
#include "tools/build_id.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

mp_status mp_build_id_of_file(const char *path, char out[MP_BUILD_ID_BYTES], mp_error *err) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "cannot read %s to find this build's id: %s", path,
                   strerror(errno));
  }
  uint64_t hash = 14695981039346656037ull; /* FNV-1a's offset basis */
  unsigned char buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, file)) > 0) {
    for (size_t i = 0; i < got; ++i) {
      hash ^= buffer[i];
      hash *= 1099511628211ull; /* FNV's 64-bit prime */
    }
  }
  const int failed = ferror(file);
  fclose(file);
  if (failed) return mp_fail(err, MP_ERR_RUNTIME, "cannot read %s to find this build's id", path);
  snprintf(out, MP_BUILD_ID_BYTES, "%016llx", (unsigned long long)hash);
  return MP_OK;
}

mp_status mp_build_id(char out[MP_BUILD_ID_BYTES], mp_error *err) {
  return mp_build_id_of_file("/proc/self/exe", out, err);
}
