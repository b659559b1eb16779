/* engine/device/device_none.c — device.h for builds without CUDA: no device, every call says why.
 * */
#include "engine/device/device.h"

static mp_status no_cuda(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME,
                 "this mpengine was built without CUDA (no /usr/local/cuda at build time)");
}

int mp_device_count(void) { return 0; }
mp_status mp_device_select(int device, mp_error *err) { (void)device; return no_cuda(err); }
mp_status mp_device_alloc(void **out, size_t bytes, mp_error *err) {
  (void)bytes;
  *out = NULL;
  return no_cuda(err);
}
void mp_device_free(void *pointer) { (void)pointer; }
mp_status mp_device_copy_to_device(void *d, const void *h, size_t b, mp_error *err) {
  (void)d, (void)h, (void)b;
  return no_cuda(err);
}
mp_status mp_device_copy_to_host(void *h, const void *d, size_t b, mp_error *err) {
  (void)d, (void)h, (void)b;
  return no_cuda(err);
}
mp_status mp_device_copy_on_device(void *d, const void *s, size_t b, mp_error *err) {
  (void)d, (void)s, (void)b;
  return no_cuda(err);
}
mp_status mp_device_memset(void *d, int v, size_t b, mp_error *err) {
  (void)d, (void)v, (void)b;
  return no_cuda(err);
}
mp_status mp_device_synchronize(mp_error *err) { return no_cuda(err); }
mp_status mp_device_stream_create(mp_cuda_stream *out, mp_error *err) {
  *out = NULL;
  return no_cuda(err);
}
void mp_device_stream_destroy(mp_cuda_stream stream) { (void)stream; }
mp_status mp_device_timer_create(mp_device_timer **out, mp_error *err) {
  *out = NULL;
  return no_cuda(err);
}
void mp_device_timer_free(mp_device_timer *timer) { (void)timer; }
mp_status mp_device_timer_start(mp_device_timer *t, mp_cuda_stream s, mp_error *err) {
  (void)t, (void)s;
  return no_cuda(err);
}
mp_status mp_device_timer_stop(mp_device_timer *t, mp_cuda_stream s, double *seconds,
                               mp_error *err) {
  (void)t, (void)s;
  *seconds = 0;
  return no_cuda(err);
}
bool mp_device_allocator_usage(size_t *live_bytes, size_t *peak_bytes) {
  (void)live_bytes, (void)peak_bytes;
  return false;
}

mp_status mp_device_memory(size_t *free_bytes, size_t *total_bytes, mp_error *err) {
  *free_bytes = *total_bytes = 0;
  return no_cuda(err);
}
