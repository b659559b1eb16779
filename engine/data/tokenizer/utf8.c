/*
 * engine/data/tokenizer/utf8.c — UTF-8 decoding, lossy repair and character classes (utf8.h).
 */
#include "engine/data/tokenizer/utf8.h"

#include <unicode/uchar.h>

uint32_t mp_utf8_decode(const char *text, size_t bytes, size_t *length) {
  const unsigned char *s = (const unsigned char *)text;
  if (s[0] < 0x80 || bytes < 2) {
    *length = 1;
    return s[0];
  }
  if (s[0] < 0xE0) {
    *length = 2;
    return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
  }
  if (s[0] < 0xF0 || bytes < 4) {
    *length = 3;
    return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  }
  *length = 4;
  return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
         ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

size_t mp_utf8_encode(uint32_t c, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (c < 0x80) {
    o[0] = (unsigned char)c;
    return 1;
  }
  if (c < 0x800) {
    o[0] = (unsigned char)(0xC0 | (c >> 6));
    o[1] = (unsigned char)(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (c >> 12));
    o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (c & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (c >> 18));
  o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (c & 0x3F));
  return 4;
}

/* Length of the valid sequence at s[0 .. n), or 0 when it is invalid; *subpart is then the length
 * of its maximal invalid subpart (Unicode's "maximal subpart" rule: the longest prefix that could
 * start a valid sequence, at least one byte). */
static size_t sequence_length(const unsigned char *s, size_t n, size_t *subpart) {
  unsigned char b = s[0];
  size_t need;
  unsigned char low = 0x80, high = 0xBF; /* allowed range of the second byte */
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) low = 0xA0;
    if (b == 0xED) high = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) low = 0x90;
    if (b == 0xF4) high = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < need; i++) {
    if (i >= n) break;
    unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (s[i] < lo || s[i] > hi) break;
  }
  if (i == need) return need;
  *subpart = i;
  return 0;
}

size_t mp_utf8_valid_prefix(const char *text, size_t bytes) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < bytes) {
    /* ASCII runs eight bytes at a time: most text is mostly ASCII. */
    while (i + 8 <= bytes) {
      uint64_t word;
      __builtin_memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= bytes) break;
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t subpart;
    size_t n = sequence_length(s + i, bytes - i, &subpart);
    if (n == 0) return i;
    i += n;
  }
  return bytes;
}

void mp_utf8_append_lossy(mp_text_buffer *out, const char *text, size_t bytes) {
  static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
  if (bytes == 0) {
    mp_text_buffer_append(out, "", 0); /* text may be NULL */
    return;
  }
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < bytes) {
    size_t valid = mp_utf8_valid_prefix(text + i, bytes - i);
    mp_text_buffer_append(out, text + i, valid);
    i += valid;
    if (i >= bytes) break;
    size_t subpart = 1;
    sequence_length(s + i, bytes - i, &subpart);
    mp_text_buffer_append(out, replacement, 3);
    i += subpart;
  }
}

bool mp_unicode_is_whitespace(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool mp_unicode_is_numeric(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  int8_t type = u_charType((UChar32)c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool mp_unicode_is_word(uint32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (u_hasBinaryProperty((UChar32)c, UCHAR_ALPHABETIC)) return true;
  if (u_hasBinaryProperty((UChar32)c, UCHAR_JOIN_CONTROL)) return true;
  int32_t mask = U_GET_GC_MASK((UChar32)c);
  return (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}
