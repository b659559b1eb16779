/*
 * engine/data/tokenizer/decoder.h — tokenizer.json's "decoder": turns the tokens of the ids back
 * into text, as HF's decode_chain does: each step maps the list of token strings to a new list,
 * and the last list is joined.
 *
 * Implemented: ByteLevel (each token's characters back to bytes, then UTF-8 read lossily),
 * Metaspace (the replacement character to a space, dropped in the first token unless
 * prepend_scheme is never), Replace, ByteFallback (runs of <0xNN> tokens to their UTF-8, or one
 * U+FFFD per byte when invalid), Fuse (all tokens into one), Strip (up to start/stop copies of a
 * character at each end of each token) and Sequence (flattened). No decoder joins the tokens with
 * spaces, as HF does.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_DECODER_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/text_buffer.h"
#include "engine/data/tokenizer/hf_regex.h"
#include "engine/data/tokenizer/pre_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_DECODE_BYTE_LEVEL,
  MP_DECODE_METASPACE,
  MP_DECODE_REPLACE,
  MP_DECODE_BYTE_FALLBACK,
  MP_DECODE_FUSE,
  MP_DECODE_STRIP,
} mp_decode_kind;

typedef struct {
  mp_decode_kind kind;
  uint32_t character; /* Metaspace's replacement, Strip's content */
  mp_prepend_scheme prepend_scheme;
  mp_hf_regex *pattern; /* Replace's (owned) */
  char *content;        /* Replace's (owned, may be empty) */
  size_t content_bytes;
  size_t strip_start, strip_stop;
} mp_decode_step;

typedef struct {
  bool present; /* false: "decoder": null */
  mp_decode_step *steps;
  size_t count;
} mp_decoder;

/* Decodes tokens[0 .. count) (UTF-8 strings) into *out (cleared first). */
mp_status mp_decoder_run(const mp_decoder *decoder, const char *const *tokens, size_t count,
                         mp_text_buffer *out, mp_error *err);

void mp_decoder_free(mp_decoder *decoder);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_DECODER_H */
