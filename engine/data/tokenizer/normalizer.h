/*
 * engine/data/tokenizer/normalizer.h — tokenizer.json's "normalizer": a chain of string rewrites
 * run on each piece of text between added tokens, before pre-tokenization.
 *
 * Implemented: NFC, NFD, NFKC, NFKD (ICU), Prepend (Llama 2's "▁", only before non-empty text),
 * Replace (a literal or an Oniguruma pattern, every match), Lowercase (Rust's per-character
 * char::to_lowercase), Strip (White_Space at either end), ByteLevel (GPT-2's byte map) and Sequence
 * (flattened into the chain). HF tracks offsets through each rewrite; mpengine needs only the text.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_NORMALIZER_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_NORMALIZER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "common/text_buffer.h"
#include "engine/data/tokenizer/hf_regex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_NORMALIZE_NFC,
  MP_NORMALIZE_NFD,
  MP_NORMALIZE_NFKC,
  MP_NORMALIZE_NFKD,
  MP_NORMALIZE_PREPEND,
  MP_NORMALIZE_REPLACE,
  MP_NORMALIZE_LOWERCASE,
  MP_NORMALIZE_STRIP,
  MP_NORMALIZE_BYTE_LEVEL,
} mp_normalize_kind;

typedef struct {
  mp_normalize_kind kind;
  char *text; /* Prepend's prefix, Replace's content (owned, may be empty) */
  size_t text_bytes;
  mp_hf_regex *pattern; /* Replace's (owned) */
  bool strip_left, strip_right;
} mp_normalize_step;

typedef struct {
  mp_normalize_step *steps; /* in order; count 0 = no normalizer */
  size_t count;
} mp_normalizer;

/* Runs the chain on text[0 .. bytes) (valid UTF-8) into *out (cleared first); *spare is working
 * space. MP_ERR_RUNTIME when memory runs out or ICU or the regex engine fails. */
mp_status mp_normalizer_run(const mp_normalizer *normalizer, mp_hf_regex_scratch *scratch,
                            mp_hf_match_list *matches, const char *text, size_t bytes,
                            mp_text_buffer *out, mp_text_buffer *spare, mp_error *err);

void mp_normalizer_free(mp_normalizer *normalizer);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_NORMALIZER_H */
