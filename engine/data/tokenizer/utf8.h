/*
 * engine/data/tokenizer/utf8.h — UTF-8 and the Unicode character classes that Hugging Face's
 * `tokenizers` (Rust) tests characters with, so that mpengine classifies every character as it does.
 *
 * Rust's `char::is_whitespace` is the White_Space property, `char::is_numeric` the general
 * categories Nd, Nl and No, and the `regex` crate's `\w` (added tokens' single_word) is
 * Alphabetic, M, Nd, Pc and Join_Control. ICU answers the non-ASCII cases.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_UTF8_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/text_buffer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Decodes the code point at text[0 .. bytes) of valid UTF-8; stores its length in *length. */
uint32_t mp_utf8_decode(const char *text, size_t bytes, size_t *length);

/* Writes code point c as UTF-8 to out (4 bytes of room); returns the length. */
size_t mp_utf8_encode(uint32_t c, char *out);

/* Length of the maximal valid UTF-8 prefix of text: bytes when all of it is valid. */
size_t mp_utf8_valid_prefix(const char *text, size_t bytes);

/* Appends text to out with every maximal invalid subpart replaced by U+FFFD, as Python's
 * bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do. */
void mp_utf8_append_lossy(mp_text_buffer *out, const char *text, size_t bytes);

/* Rust's char::is_whitespace (White_Space). */
bool mp_unicode_is_whitespace(uint32_t c);

/* Rust's char::is_numeric (general category Nd, Nl or No). */
bool mp_unicode_is_numeric(uint32_t c);

/* The Rust regex crate's Unicode \w: Alphabetic, M, Nd, Pc, Join_Control. */
bool mp_unicode_is_word(uint32_t c);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_UTF8_H */
