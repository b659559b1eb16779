/*
 * engine/device/device.h — the accelerator as the engine sees it: memory, copies, streams and
 * events.
 *
 * The CUDA implementation (device_cuda.cu) uses plain cudaMalloc, never managed memory; a build
 * without CUDA (device_none.c) finds no device and fails every allocation with a message that
 * says so. Callers get MP_ERR_RUNTIME with the CUDA call, file and line on any CUDA error.
 */
#ifndef MPENGINE_ENGINE_DEVICE_H
#define MPENGINE_ENGINE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible CUDA devices; 0 without CUDA or without a driver. */
int mp_device_count(void);

/* Makes `device` current for this thread. */
mp_status mp_device_select(int device, mp_error *err);

/* Device memory of `bytes` (zeroed); *out is NULL on failure. */
mp_status mp_device_alloc(void **out, size_t bytes, mp_error *err);
void mp_device_free(void *pointer);

mp_status mp_device_copy_to_device(void *device_dst, const void *host_src, size_t bytes,
                                   mp_error *err);
mp_status mp_device_copy_to_host(void *host_dst, const void *device_src, size_t bytes,
                                 mp_error *err);
mp_status mp_device_copy_on_device(void *dst, const void *src, size_t bytes, mp_error *err);
mp_status mp_device_memset(void *device_dst, int value, size_t bytes, mp_error *err);

/* Waits for all work on the current device; reports any asynchronous kernel error. */
mp_status mp_device_synchronize(mp_error *err);

/* Streams and timing events. */
mp_status mp_device_stream_create(mp_cuda_stream *out, mp_error *err);
void mp_device_stream_destroy(mp_cuda_stream stream);

typedef struct mp_device_timer mp_device_timer;
mp_status mp_device_timer_create(mp_device_timer **out, mp_error *err);
void mp_device_timer_free(mp_device_timer *timer);
mp_status mp_device_timer_start(mp_device_timer *timer, mp_cuda_stream stream, mp_error *err);
/* Seconds since start, after waiting for the stream to reach this point. */
mp_status mp_device_timer_stop(mp_device_timer *timer, mp_cuda_stream stream, double *seconds,
                               mp_error *err);

/* Free and total memory of the current device, in bytes. */
mp_status mp_device_memory(size_t *free_bytes, size_t *total_bytes, mp_error *err);

/* Emulated CUDA only: the bytes of device memory live now and the most live at once since the
 * process started, counted by the allocator itself, so that a test can check what a stage holds
 * without trusting the stage's own totals. false, with nothing written, where no such count is
 * kept (a real GPU, whose driver's mp_device_memory also counts other processes; no CUDA). */
bool mp_device_allocator_usage(size_t *live_bytes, size_t *peak_bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DEVICE_H */
