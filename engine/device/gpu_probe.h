/*
 * engine/device/gpu_probe.h — what GPUs this process can use, and whether the CUDA build works on
 * them.
 *
 * `mpengine version` prints the report; tools/device_check.sh runs the smoke test on a real GPU.
 * A build without CUDA (no /usr/local/cuda where it was built) says so instead of failing.
 */
#ifndef MPENGINE_ENGINE_GPU_PROBE_H
#define MPENGINE_ENGINE_GPU_PROBE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_GPU_PROBE_MAX_DEVICES = 16 };

typedef struct {
  char name[128];
  int compute_major, compute_minor; /* 9.0 for Hopper */
  size_t memory_bytes;
  int multiprocessors;
} mp_gpu_device_info;

typedef struct {
  bool built_with_cuda;
  int cuda_runtime_version;       /* 13000 for CUDA 13.0; 0 without CUDA */
  int cuda_driver_version;        /* 0 when no driver is installed */
  int cublas_version;             /* cublasGetVersion; 0 when unavailable */
  int nccl_version;               /* ncclGetVersion, e.g. 22703; 0 when unavailable */
  int num_devices;
  mp_gpu_device_info devices[MP_GPU_PROBE_MAX_DEVICES];
  char no_device_reason[256];     /* why num_devices is 0 ("no CUDA driver", ...) */
} mp_gpu_report;

/* Fills report. Finding no GPU is not an error (num_devices 0, reason given); MP_ERR_RUNTIME only
 * when the CUDA runtime misbehaves. */
mp_status mp_gpu_probe(mp_gpu_report *report, mp_error *err);

/* On device 0: y = a * x + y for n floats with a CUDA kernel, checked element by element against
 * the same loop on the CPU. Stores the largest absolute difference. MP_ERR_RUNTIME without a GPU.
 * */
mp_status mp_gpu_smoke_test(size_t n, double *max_abs_error, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_GPU_PROBE_H */
