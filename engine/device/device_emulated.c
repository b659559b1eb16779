/*
 * engine/device/device_emulated.c — device.h for `--config=emulated` (third_party/cuda.bzl): one
 * emulated GPU whose memory is host memory, for tests of the GPU code paths on machines
 * without one. Work is synchronous, streams are NULL, and the reported memory is the machine's.
 *
 * Device allocations are filled with a NaN pattern (0xFF bytes), as fresh GPU memory holds
 * garbage: code that reads a buffer it never wrote shows up as NaN losses instead of passing on
 * malloc's zeros.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/device/device.h"
#include "layers/cuda_launch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int mp_device_count(void) { return 1; }

mp_status mp_device_select(int device, mp_error *err) {
  if (device != 0) {
    return mp_fail(err, MP_ERR_INPUT, "emulated CUDA has one device (0); asked for %d", device);
  }
  return MP_OK;
}

/* The allocator's own count of live device bytes (mp_device_allocator_usage): each block starts
 * with a header holding its size, as long as malloc's alignment so the block keeps it. */
enum { kHeaderBytes = 64 };
static size_t live_bytes, peak_bytes;

mp_status mp_device_alloc(void **out, size_t bytes, mp_error *err) {
  char *block = malloc(kHeaderBytes + (bytes > 0 ? bytes : 1));
  *out = NULL;
  if (block == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "emulated cudaMalloc of %zu bytes: out of host memory",
                   bytes);
  }
  memcpy(block, &bytes, sizeof bytes);
  *out = block + kHeaderBytes;
  memset(*out, 0xFF, bytes);
  const size_t now = __atomic_add_fetch(&live_bytes, bytes, __ATOMIC_RELAXED);
  size_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, true,
                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return MP_OK;
}

void mp_device_free(void *pointer) {
  if (pointer == NULL) return;
  char *block = (char *)pointer - kHeaderBytes;
  size_t bytes = 0;
  memcpy(&bytes, block, sizeof bytes);
  __atomic_sub_fetch(&live_bytes, bytes, __ATOMIC_RELAXED);
  free(block);
}

bool mp_device_allocator_usage(size_t *live, size_t *peak) {
  *live = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
  *peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  return true;
}

mp_status mp_device_copy_to_device(void *device_dst, const void *host_src, size_t bytes,
                                   mp_error *err) {
  (void)err;
  if (bytes > 0) memmove(device_dst, host_src, bytes);
  return MP_OK;
}

mp_status mp_device_copy_to_host(void *host_dst, const void *device_src, size_t bytes,
                                 mp_error *err) {
  (void)err;
  if (bytes > 0) memmove(host_dst, device_src, bytes);
  return MP_OK;
}

mp_status mp_device_copy_on_device(void *dst, const void *src, size_t bytes, mp_error *err) {
  (void)err;
  if (bytes > 0) memmove(dst, src, bytes);
  return MP_OK;
}

mp_status mp_device_memset(void *device_dst, int value, size_t bytes, mp_error *err) {
  (void)err;
  if (bytes > 0) memset(device_dst, value, bytes);
  return MP_OK;
}

mp_status mp_device_synchronize(mp_error *err) {
  return mp_cuda_take_launch_failure(err); /* as on a GPU: a recorded failed launch first */
}

mp_status mp_device_stream_create(mp_cuda_stream *out, mp_error *err) {
  (void)err;
  *out = NULL;
  return MP_OK;
}

void mp_device_stream_destroy(mp_cuda_stream stream) { (void)stream; }

struct mp_device_timer {
  double start_s;
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mp_status mp_device_timer_create(mp_device_timer **out, mp_error *err) {
  *out = calloc(1, sizeof **out);
  if (*out == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of host memory");
  return MP_OK;
}

void mp_device_timer_free(mp_device_timer *timer) { free(timer); }

mp_status mp_device_timer_start(mp_device_timer *timer, mp_cuda_stream stream, mp_error *err) {
  (void)stream, (void)err;
  timer->start_s = now_seconds();
  return MP_OK;
}

mp_status mp_device_timer_stop(mp_device_timer *timer, mp_cuda_stream stream, double *seconds,
                               mp_error *err) {
  (void)stream, (void)err;
  *seconds = now_seconds() - timer->start_s;
  return MP_OK;
}

mp_status mp_device_memory(size_t *free_bytes, size_t *total_bytes, mp_error *err) {
  (void)err;
  const long pages = sysconf(_SC_PHYS_PAGES), available = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  *total_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
  *free_bytes = available > 0 && page > 0 ? (size_t)available * (size_t)page : 0;
  return MP_OK;
}
