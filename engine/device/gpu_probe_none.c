/* engine/device/gpu_probe_none.c — gpu_probe.h for builds without CUDA: reports that, finds no GPU.
 * */
#include <stdio.h>
#include <string.h>

#include "engine/device/gpu_probe.h"

mp_status mp_gpu_probe(mp_gpu_report *report, mp_error *err) {
  (void)err;
  memset(report, 0, sizeof *report);
  snprintf(report->no_device_reason, sizeof report->no_device_reason,
           "built without CUDA (no nvcc at build time)");
  return MP_OK;
}

mp_status mp_gpu_smoke_test(size_t n, double *max_abs_error, mp_error *err) {
  (void)n;
  *max_abs_error = 0.0;
  return mp_fail(err, MP_ERR_RUNTIME, "this mpengine was built without CUDA");
}
