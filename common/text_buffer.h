/*
 * common/text_buffer.h — a growable, always NUL-terminated byte buffer for building text (JSON
 * headers, model descriptions) piece by piece. An allocation failure sets `failed` and makes
 * every later append a no-op, so a builder checks once at the end instead of after every piece.
 * Zero-initialise it ({0}); free data with free() (or mp_text_buffer_free).
 */
#ifndef MPENGINE_COMMON_TEXT_BUFFER_H
#define MPENGINE_COMMON_TEXT_BUFFER_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char *data;      /* NULL until the first append; then length bytes and a NUL */
  size_t length;   /* bytes, not counting the NUL */
  size_t capacity; /* bytes allocated */
  bool failed;     /* out of memory: data holds what came before */
} mp_text_buffer;

/* Appends count bytes (which may include NULs). */
void mp_text_buffer_append(mp_text_buffer *buffer, const void *bytes, size_t count);

/* Appends a NUL-terminated string. */
void mp_text_buffer_append_text(mp_text_buffer *buffer, const char *text);

void mp_text_buffer_free(mp_text_buffer *buffer);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_TEXT_BUFFER_H */
