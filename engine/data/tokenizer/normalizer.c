/*
 * engine/data/tokenizer/normalizer.c — the normalizer chain (normalizer.h). Each step reads one
 * buffer and writes the other; the two swap, so a chain allocates nothing once warm.
 */
#include "engine/data/tokenizer/normalizer.h"

#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "engine/data/tokenizer/byte_level.h"
#include "engine/data/tokenizer/utf8.h"

static bool is_ascii(const char *text, size_t bytes) {
  for (size_t i = 0; i < bytes; i++) {
    if ((unsigned char)text[i] >= 0x80) return false;
  }
  return true;
}

static mp_status icu_failed(mp_error *err, const char *what, UErrorCode code) {
  return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: ICU %s failed: %s", what, u_errorName(code));
}

/* UTF-8 -> UTF-16 -> normalized UTF-16 -> UTF-8. ASCII is already in every normal form. */
static mp_status unicode_normalize(mp_normalize_kind kind, const char *text, size_t bytes,
                                   mp_text_buffer *out, mp_error *err) {
  if (is_ascii(text, bytes)) {
    mp_text_buffer_append(out, text, bytes);
    return MP_OK;
  }
  UErrorCode code = U_ZERO_ERROR;
  const UNormalizer2 *form = kind == MP_NORMALIZE_NFC    ? unorm2_getNFCInstance(&code)
                             : kind == MP_NORMALIZE_NFD  ? unorm2_getNFDInstance(&code)
                             : kind == MP_NORMALIZE_NFKC ? unorm2_getNFKCInstance(&code)
                                                         : unorm2_getNFKDInstance(&code);
  if (U_FAILURE(code)) return icu_failed(err, "normalizer lookup", code);
  if (bytes > INT32_MAX / 4) {
    return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: a piece of %zu bytes is too long to normalize",
                   bytes);
  }
  int32_t units = 0;
  UChar *utf16 = malloc((bytes + 1) * sizeof(UChar));
  /* Normalization can grow text (NFKD of U+FDFA is 18 units); retried below when it does. */
  int32_t normalized_capacity = (int32_t)bytes * 3 + 16;
  UChar *normalized = malloc((size_t)normalized_capacity * sizeof(UChar));
  mp_status status = MP_OK;
  if (utf16 == NULL || normalized == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory normalizing text");
    goto done;
  }
  u_strFromUTF8(utf16, (int32_t)bytes + 1, &units, text, (int32_t)bytes, &code);
  if (U_FAILURE(code)) {
    status = icu_failed(err, "UTF-8 decoding", code);
    goto done;
  }
  int32_t length = unorm2_normalize(form, utf16, units, normalized, normalized_capacity, &code);
  if (code == U_BUFFER_OVERFLOW_ERROR) {
    code = U_ZERO_ERROR;
    free(normalized);
    normalized_capacity = length + 1;
    normalized = malloc((size_t)normalized_capacity * sizeof(UChar));
    if (normalized == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory normalizing text");
      goto done;
    }
    length = unorm2_normalize(form, utf16, units, normalized, normalized_capacity, &code);
  }
  if (U_FAILURE(code)) {
    status = icu_failed(err, "normalization", code);
    goto done;
  }
  int32_t utf8_length = 0;
  code = U_ZERO_ERROR;
  u_strToUTF8(NULL, 0, &utf8_length, normalized, length, &code);
  code = U_ZERO_ERROR;
  char *room = malloc((size_t)utf8_length + 1);
  if (room == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory normalizing text");
    goto done;
  }
  u_strToUTF8(room, utf8_length + 1, &utf8_length, normalized, length, &code);
  if (U_FAILURE(code)) {
    free(room);
    status = icu_failed(err, "UTF-8 encoding", code);
    goto done;
  }
  mp_text_buffer_append(out, room, (size_t)utf8_length);
  free(room);
done:
  free(utf16);
  free(normalized);
  return status;
}

/* Rust's char::to_lowercase, one character at a time (no context: a final sigma stays σ). */
static mp_status lowercase(const char *text, size_t bytes, mp_text_buffer *out, mp_error *err) {
  size_t i = 0;
  while (i < bytes) {
    unsigned char b = (unsigned char)text[i];
    if (b < 0x80) {
      char c = (b >= 'A' && b <= 'Z') ? (char)(b + 32) : (char)b;
      mp_text_buffer_append(out, &c, 1);
      i++;
      continue;
    }
    size_t length;
    uint32_t c = mp_utf8_decode(text + i, bytes - i, &length);
    UChar one[2], lower[8];
    int32_t units = 0;
    U16_APPEND_UNSAFE(one, units, (UChar32)c);
    UErrorCode code = U_ZERO_ERROR;
    int32_t lower_units = u_strToLower(lower, 8, one, units, "", &code);
    char utf8[32];
    int32_t utf8_length = 0;
    if (U_SUCCESS(code)) u_strToUTF8(utf8, sizeof utf8, &utf8_length, lower, lower_units, &code);
    if (U_FAILURE(code)) return icu_failed(err, "lowercasing", code);
    mp_text_buffer_append(out, utf8, (size_t)utf8_length);
    i += length;
  }
  return MP_OK;
}

static void strip(const char *text, size_t bytes, bool left, bool right, mp_text_buffer *out) {
  size_t start = 0, end = bytes;
  while (left && start < end) {
    size_t length;
    uint32_t c = mp_utf8_decode(text + start, end - start, &length);
    if (!mp_unicode_is_whitespace(c)) break;
    start += length;
  }
  while (right && end > start) {
    size_t back = end - 1;
    while (back > start && ((unsigned char)text[back] & 0xC0) == 0x80) back--;
    size_t length;
    uint32_t c = mp_utf8_decode(text + back, end - back, &length);
    if (!mp_unicode_is_whitespace(c)) break;
    end = back;
  }
  mp_text_buffer_append(out, text + start, end - start);
}

static mp_status replace(const mp_normalize_step *step, mp_hf_regex_scratch *scratch,
                         mp_hf_match_list *matches, const char *text, size_t bytes,
                         mp_text_buffer *out, mp_error *err) {
  MP_TRY(mp_hf_regex_find_all(step->pattern, scratch, text, bytes, matches, err));
  size_t at = 0;
  for (size_t m = 0; m < matches->count; m++) {
    mp_text_buffer_append(out, text + at, matches->items[m].start - at);
    mp_text_buffer_append(out, step->text, step->text_bytes);
    at = matches->items[m].end;
  }
  mp_text_buffer_append(out, text + at, bytes - at);
  return MP_OK;
}

mp_status mp_normalizer_run(const mp_normalizer *normalizer, mp_hf_regex_scratch *scratch,
                            mp_hf_match_list *matches, const char *text, size_t bytes,
                            mp_text_buffer *out, mp_text_buffer *spare, mp_error *err) {
  out->length = 0;
  mp_text_buffer_append(out, text, bytes);
  for (size_t s = 0; s < normalizer->count; s++) {
    const mp_normalize_step *step = &normalizer->steps[s];
    spare->length = 0;
    const char *in = out->data == NULL ? "" : out->data;
    size_t in_bytes = out->length;
    switch (step->kind) {
      case MP_NORMALIZE_NFC:
      case MP_NORMALIZE_NFD:
      case MP_NORMALIZE_NFKC:
      case MP_NORMALIZE_NFKD:
        MP_TRY(unicode_normalize(step->kind, in, in_bytes, spare, err));
        break;
      case MP_NORMALIZE_PREPEND:
        if (in_bytes > 0) mp_text_buffer_append(spare, step->text, step->text_bytes);
        mp_text_buffer_append(spare, in, in_bytes);
        break;
      case MP_NORMALIZE_REPLACE:
        MP_TRY(replace(step, scratch, matches, in, in_bytes, spare, err));
        break;
      case MP_NORMALIZE_LOWERCASE:
        MP_TRY(lowercase(in, in_bytes, spare, err));
        break;
      case MP_NORMALIZE_STRIP:
        strip(in, in_bytes, step->strip_left, step->strip_right, spare);
        break;
      case MP_NORMALIZE_BYTE_LEVEL:
        for (size_t i = 0; i < in_bytes; i++) {
          char utf8[2];
          mp_text_buffer_append(spare, utf8, mp_byte_level_utf8((uint8_t)in[i], utf8));
        }
        break;
    }
    mp_text_buffer swap = *out;
    *out = *spare;
    *spare = swap;
  }
  if (out->failed || spare->failed) {
    return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory normalizing text");
  }
  return MP_OK;
}

void mp_normalizer_free(mp_normalizer *normalizer) {
  for (size_t s = 0; s < normalizer->count; s++) {
    free(normalizer->steps[s].text);
    mp_hf_regex_free(normalizer->steps[s].pattern);
  }
  free(normalizer->steps);
  memset(normalizer, 0, sizeof *normalizer);
}
