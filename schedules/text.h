/*
 * schedules/text.h — a growable string the timeline writers print into, so one writer serves a
 * file, stdout and a test's assertions alike. An allocation failure is remembered (out_of_memory)
 * and checked once at the end instead of after every append.
 */
#ifndef MPENGINE_SCHEDULES_TEXT_H
#define MPENGINE_SCHEDULES_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char *data;      /* NUL-terminated once anything was appended; NULL before */
  size_t length;   /* bytes, without the NUL */
  size_t capacity; /* bytes allocated */
  bool out_of_memory;
} mp_text;

#define MP_TEXT_INITIALIZER {NULL, 0, 0, false}

void mp_text_append(mp_text *text, const char *string);

/* Appends count copies of the character c. */
void mp_text_repeat(mp_text *text, char c, int count);

void mp_text_printf(mp_text *text, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* The text so far ("" when empty). */
const char *mp_text_string(const mp_text *text);

void mp_text_free(mp_text *text);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_SCHEDULES_TEXT_H */
