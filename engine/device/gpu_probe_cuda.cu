/*
 * engine/device/gpu_probe_cuda.cu — CUDA implementation of gpu_probe.h: device query, library
 * versions, and a saxpy kernel checked against the CPU, the smallest proof that kernels built here
 * run there.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cuda_check.cuh"
#include "engine/device/gpu_probe.h"

// ---------------------------------------------------------------------------------------------
// kernels

__global__ static void saxpy_kernel(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// ---------------------------------------------------------------------------------------------
// launchers and host code

extern "C" mp_status mp_gpu_probe(mp_gpu_report *report, mp_error *err) {
  memset(report, 0, sizeof *report);
  report->built_with_cuda = true;
  MP_CUDA_CHECK(cudaRuntimeGetVersion(&report->cuda_runtime_version));
  if (cudaDriverGetVersion(&report->cuda_driver_version) != cudaSuccess) {
    report->cuda_driver_version = 0;
  }
  ncclGetVersion(&report->nccl_version);
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    snprintf(report->no_device_reason, sizeof report->no_device_reason, "%s (%s)",
             cudaGetErrorString(status), cudaGetErrorName(status));
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return MP_OK;
  }
  if (count == 0) {
    snprintf(report->no_device_reason, sizeof report->no_device_reason, "no CUDA device visible");
    return MP_OK;
  }
  report->num_devices = count < MP_GPU_PROBE_MAX_DEVICES ? count : MP_GPU_PROBE_MAX_DEVICES;
  for (int d = 0; d < report->num_devices; ++d) {
    cudaDeviceProp prop;
    MP_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    mp_gpu_device_info *info = &report->devices[d];
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    info->memory_bytes = prop.totalGlobalMem;
    info->multiprocessors = prop.multiProcessorCount;
  }
  cublasHandle_t handle;
  if (cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
    cublasGetVersion(handle, &report->cublas_version);
    cublasDestroy(handle);
  }
  return MP_OK;
}

extern "C" mp_status mp_gpu_smoke_test(size_t n, double *max_abs_error, mp_error *err) {
  mp_status result = MP_ERR_RUNTIME;
  float *host_x = (float *)malloc(n * sizeof(float));  // (n,)
  float *host_y = (float *)malloc(n * sizeof(float));  // (n,)
  float *host_out = (float *)malloc(n * sizeof(float));  // (n,)
  float *device_x = NULL, *device_y = NULL;
  const float a = 1.5f;
  const int block = 256;
  if (host_x == NULL || host_y == NULL || host_out == NULL) {
    mp_fail(err, MP_ERR_RUNTIME, "out of host memory for %zu floats", n);
    goto cleanup;
  }
  for (size_t i = 0; i < n; ++i) {
    host_x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    host_y[i] = (float)i / (float)n;
  }
  MP_CUDA_CHECK_GOTO(cudaMalloc((void **)&device_x, n * sizeof(float)), cleanup);
  MP_CUDA_CHECK_GOTO(cudaMalloc((void **)&device_y, n * sizeof(float)), cleanup);
  MP_CUDA_CHECK_GOTO(cudaMemcpy(device_x, host_x, n * sizeof(float), cudaMemcpyHostToDevice),
                     cleanup);
  MP_CUDA_CHECK_GOTO(cudaMemcpy(device_y, host_y, n * sizeof(float), cudaMemcpyHostToDevice),
                     cleanup);
  saxpy_kernel<<<(unsigned)((n + block - 1) / block), block>>>((int)n, a, device_x, device_y);
  MP_CUDA_CHECK_GOTO(cudaGetLastError(), cleanup);
  MP_CUDA_CHECK_GOTO(cudaMemcpy(host_out, device_y, n * sizeof(float), cudaMemcpyDeviceToHost),
                     cleanup);
  *max_abs_error = 0.0;
  for (size_t i = 0; i < n; ++i) {
    double expected = (double)(a * host_x[i] + host_y[i]);
    double diff = fabs(expected - (double)host_out[i]);
    if (diff > *max_abs_error) *max_abs_error = diff;
  }
  result = MP_OK;
cleanup:
  cudaFree(device_y);
  cudaFree(device_x);
  free(host_out);
  free(host_y);
  free(host_x);
  return result;
}
