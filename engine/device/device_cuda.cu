/* engine/device/device_cuda.cu — device.h over the CUDA runtime: cudaMalloc, streams, events. */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "layers/cuda_check.cuh"
#include "layers/cuda_launch.h"
#include "engine/device/device.h"

struct mp_device_timer {
  cudaEvent_t start, stop;
};

extern "C" int mp_device_count(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

extern "C" mp_status mp_device_select(int device, mp_error *err) {
  MP_CUDA_CHECK(cudaSetDevice(device));
  return MP_OK;
}

extern "C" mp_status mp_device_alloc(void **out, size_t bytes, mp_error *err) {
  *out = NULL;
  cudaError_t status = cudaMalloc(out, bytes > 0 ? bytes : 1);
  if (status != cudaSuccess) {
    *out = NULL;
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "cudaMalloc(%zu bytes) failed: %s, with %.2f of %.2f GiB free at %s:%d", bytes,
                   cudaGetErrorString(status), free_bytes / 1073741824.0,
                   total_bytes / 1073741824.0, __FILE__, __LINE__);
  }
  MP_CUDA_CHECK(cudaMemset(*out, 0, bytes));
  return MP_OK;
}

extern "C" void mp_device_free(void *pointer) {
  if (pointer != NULL) cudaFree(pointer);
}

extern "C" mp_status mp_device_copy_to_device(void *device_dst, const void *host_src, size_t bytes,
                                              mp_error *err) {
  MP_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
  return MP_OK;
}

extern "C" mp_status mp_device_copy_to_host(void *host_dst, const void *device_src, size_t bytes,
                                            mp_error *err) {
  MP_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
  return MP_OK;
}

extern "C" mp_status mp_device_copy_on_device(void *dst, const void *src, size_t bytes,
                                              mp_error *err) {
  MP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  return MP_OK;
}

extern "C" mp_status mp_device_memset(void *device_dst, int value, size_t bytes, mp_error *err) {
  MP_CUDA_CHECK(cudaMemset(device_dst, value, bytes));
  return MP_OK;
}

extern "C" mp_status mp_device_synchronize(mp_error *err) {
  MP_TRY(mp_cuda_take_launch_failure(err)); /* it names the kernel; the wait below would not */
  MP_CUDA_CHECK(cudaDeviceSynchronize());
  MP_CUDA_CHECK(cudaGetLastError());
  return MP_OK;
}

extern "C" mp_status mp_device_stream_create(mp_cuda_stream *out, mp_error *err) {
  cudaStream_t stream;
  MP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  *out = stream;
  return MP_OK;
}

extern "C" void mp_device_stream_destroy(mp_cuda_stream stream) {
  if (stream != NULL) cudaStreamDestroy(stream);
}

extern "C" mp_status mp_device_timer_create(mp_device_timer **out, mp_error *err) {
  mp_device_timer *timer = (mp_device_timer *)calloc(1, sizeof *timer);
  if (timer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  MP_CUDA_CHECK(cudaEventCreate(&timer->start));
  MP_CUDA_CHECK(cudaEventCreate(&timer->stop));
  *out = timer;
  return MP_OK;
}

extern "C" void mp_device_timer_free(mp_device_timer *timer) {
  if (timer == NULL) return;
  cudaEventDestroy(timer->start);
  cudaEventDestroy(timer->stop);
  free(timer);
}

extern "C" mp_status mp_device_timer_start(mp_device_timer *timer, mp_cuda_stream stream,
                                           mp_error *err) {
  MP_CUDA_CHECK(cudaEventRecord(timer->start, stream));
  return MP_OK;
}

extern "C" mp_status mp_device_timer_stop(mp_device_timer *timer, mp_cuda_stream stream,
                                          double *seconds, mp_error *err) {
  MP_CUDA_CHECK(cudaEventRecord(timer->stop, stream));
  MP_CUDA_CHECK(cudaEventSynchronize(timer->stop));
  float ms = 0.0f;
  MP_CUDA_CHECK(cudaEventElapsedTime(&ms, timer->start, timer->stop));
  *seconds = ms * 1e-3;
  return MP_OK;
}

extern "C" bool mp_device_allocator_usage(size_t *live_bytes, size_t *peak_bytes) {
  (void)live_bytes, (void)peak_bytes;
  return false;
}

extern "C" mp_status mp_device_memory(size_t *free_bytes, size_t *total_bytes, mp_error *err) {
  MP_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return MP_OK;
}
