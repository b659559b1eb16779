/*
 * common/error.h — the status and message that every library call of mpengine returns.
 *
 * Library code never prints and never exits: it returns an mp_status and fills an mp_error with
 * one message that names the file, the JSON path or the rank it is about and says what would fix
 * it. Only tools/ turns that into output and an exit code; the status values are the exit codes.
 */
#ifndef MPENGINE_COMMON_ERROR_H
#define MPENGINE_COMMON_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_OK = 0,
  MP_ERR_RUNTIME = 1, /* a failure while running: a lost peer, a full disk, a CUDA error */
  MP_ERR_INPUT = 2,   /* bad usage or bad input: the user can fix it */
} mp_status;

enum { MP_ERROR_MESSAGE_BYTES = 2048 };

typedef struct {
  mp_status status;
  char message[MP_ERROR_MESSAGE_BYTES];
} mp_error;

#define MP_ERROR_INITIALIZER {MP_OK, {0}}

/* Records status and a printf-style message in err (which may be NULL); returns status. */
mp_status mp_fail(mp_error *err, mp_status status, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

/* Puts "prefix: " in front of err's message, keeping its status; returns the status. Callers use
 * it to add the file or rank a lower layer did not know about. */
mp_status mp_error_prefix(mp_error *err, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

void mp_error_clear(mp_error *err);

/* "ok", "runtime error", "input error". */
const char *mp_status_name(mp_status status);

/* Returns from the calling function when expr yields a status other than MP_OK. */
#define MP_TRY(expr)                        \
  do {                                      \
    mp_status mp_try_status_ = (expr);      \
    if (mp_try_status_ != MP_OK) return mp_try_status_; \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_ERROR_H */
