/* common/error.c — filling mp_error messages; see error.h. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

mp_status mp_fail(mp_error *err, mp_status status, const char *format, ...) {
  if (err == NULL) return status;
  err->status = status;
  va_list args;
  va_start(args, format);
  vsnprintf(err->message, sizeof err->message, format, args);
  va_end(args);
  return status;
}

mp_status mp_error_prefix(mp_error *err, const char *format, ...) {
  if (err == NULL) return MP_OK;
  char prefix[MP_ERROR_MESSAGE_BYTES];
  va_list args;
  va_start(args, format);
  vsnprintf(prefix, sizeof prefix, format, args);
  va_end(args);
  char joined[MP_ERROR_MESSAGE_BYTES];
  snprintf(joined, sizeof joined, "%s: %s", prefix, err->message);
  memcpy(err->message, joined, sizeof joined);
  return err->status;
}

void mp_error_clear(mp_error *err) {
  if (err == NULL) return;
  err->status = MP_OK;
  err->message[0] = '\0';
}

const char *mp_status_name(mp_status status) {
  switch (status) {
    case MP_OK: return "ok";
    case MP_ERR_RUNTIME: return "runtime error";
    case MP_ERR_INPUT: return "input error";
  }
  return "unknown status";
}
