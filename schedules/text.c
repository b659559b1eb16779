/* schedules/text.c — the growable string; see text.h. */
#include "schedules/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for `extra` more bytes and the NUL; false when out of memory. */
static bool reserve(mp_text *text, size_t extra) {
  if (text->out_of_memory) return false;
  size_t needed = text->length + extra + 1;
  if (needed <= text->capacity) return true;
  size_t capacity = text->capacity > 0 ? text->capacity : 256;
  while (capacity < needed) capacity *= 2;
  char *grown = realloc(text->data, capacity);
  if (grown == NULL) {
    text->out_of_memory = true;
    return false;
  }
  text->data = grown;
  text->capacity = capacity;
  return true;
}

void mp_text_append(mp_text *text, const char *string) {
  size_t n = strlen(string);
  if (!reserve(text, n)) return;
  memcpy(text->data + text->length, string, n + 1);
  text->length += n;
}

void mp_text_repeat(mp_text *text, char c, int count) {
  if (count <= 0 || !reserve(text, (size_t)count)) return;
  memset(text->data + text->length, c, (size_t)count);
  text->length += (size_t)count;
  text->data[text->length] = '\0';
}

void mp_text_printf(mp_text *text, const char *format, ...) {
  va_list args;
  va_start(args, format);
  int n = vsnprintf(NULL, 0, format, args);
  va_end(args);
  if (n < 0 || !reserve(text, (size_t)n)) return;
  va_start(args, format);
  vsnprintf(text->data + text->length, (size_t)n + 1, format, args);
  va_end(args);
  text->length += (size_t)n;
}

const char *mp_text_string(const mp_text *text) { return text->data != NULL ? text->data : ""; }

void mp_text_free(mp_text *text) {
  free(text->data);
  text->data = NULL;
  text->length = text->capacity = 0;
  text->out_of_memory = false;
}
