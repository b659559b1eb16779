/* engine/comm/comm_staging_none.c — comm_staging.h for builds without CUDA: every pointer is host
 * memory, so the MPI communicators never stage; the copies say why they cannot run. */
#include <stdlib.h>

#include "engine/comm/comm_staging.h"

bool mp_staging_is_device(const void *pointer) {
  (void)pointer;
  return false;
}

const char *mp_staging_backend(void) { return "host"; }

mp_status mp_staging_host_alloc(void **out, size_t bytes, mp_error *err) {
  *out = malloc(bytes > 0 ? bytes : 1);
  if (*out == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %zu bytes", bytes);
  return MP_OK;
}

void mp_staging_host_free(void *pointer) { free(pointer); }

mp_status mp_staging_copy(void *dst, const void *src, size_t bytes, mp_error *err) {
  (void)dst, (void)src;
  if (bytes == 0) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "this mpengine was built without CUDA/NCCL (no /usr/local/cuda at build time): "
                 "it cannot copy GPU buffers");
}
