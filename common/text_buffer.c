/* common/text_buffer.c — see text_buffer.h. */
#include "common/text_buffer.h"

#include <stdlib.h>
#include <string.h>

void mp_text_buffer_append(mp_text_buffer *buffer, const void *bytes, size_t count) {
  if (buffer->failed) return;
  if (buffer->length + count + 1 > buffer->capacity) {
    size_t capacity = buffer->capacity ? buffer->capacity : 256;
    while (buffer->length + count + 1 > capacity) capacity *= 2;
    char *grown = realloc(buffer->data, capacity);
    if (grown == NULL) {
      buffer->failed = true;
      return;
    }
    buffer->data = grown;
    buffer->capacity = capacity;
  }
  memcpy(buffer->data + buffer->length, bytes, count);
  buffer->length += count;
  buffer->data[buffer->length] = '\0';
}

void mp_text_buffer_append_text(mp_text_buffer *buffer, const char *text) {
  mp_text_buffer_append(buffer, text, strlen(text));
}

void mp_text_buffer_free(mp_text_buffer *buffer) {
  free(buffer->data);
  buffer->data = NULL;
  buffer->length = buffer->capacity = 0;
  buffer->failed = false;
}
