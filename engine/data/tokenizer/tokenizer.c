/*
 * engine/data/tokenizer/tokenizer.c — encoding and decoding with a loaded tokenizer
 * (tokenizer.h); loading is tokenizer_json.c.
 *
 * encode follows HF's Tokenizer::encode for one sequence, one piece at a time (depth first: each
 * piece's result depends on that piece alone, so the ids are the same as HF's breadth-first
 * passes): repair UTF-8; cut out raw-matched added tokens; normalize each piece between them;
 * cut out normalized-matched added tokens; pre-tokenize; BPE each word; wrap in the template.
 */
#include "engine/data/tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/data/tokenizer/utf8.h"

void mp_token_ids_free(mp_token_ids *ids) {
  if (ids == NULL) return;
  free(ids->ids);
  ids->ids = NULL;
  ids->count = ids->capacity = 0;
}

const char *mp_tokenizer_path(const mp_tokenizer *tokenizer) { return tokenizer->path; }

int64_t mp_tokenizer_vocab_size(const mp_tokenizer *tokenizer) { return tokenizer->vocab_size; }

int64_t mp_tokenizer_token_to_id(const mp_tokenizer *tokenizer, const char *token) {
  uint32_t id;
  size_t bytes = strlen(token);
  if (mp_string_table_get(&tokenizer->added.by_content, token, bytes, &id)) return id;
  if (mp_string_table_get(&tokenizer->bpe.vocab, token, bytes, &id)) return id;
  return -1;
}

const char *mp_tokenizer_id_to_token(const mp_tokenizer *tokenizer, int64_t id) {
  if (id < 0 || id > UINT32_MAX) return NULL;
  const mp_added_token *added = mp_added_vocabulary_find(&tokenizer->added, (uint32_t)id);
  if (added != NULL) return added->content;
  if (id < tokenizer->bpe.id_count) return tokenizer->bpe.id_to_token[id];
  return NULL;
}

int mp_tokenizer_is_special(const mp_tokenizer *tokenizer, int64_t id) {
  /* HF asks by text: whether the id's token is the content of a special added token. */
  const char *token = mp_tokenizer_id_to_token(tokenizer, id);
  uint32_t one;
  return token != NULL &&
         mp_string_table_get(&tokenizer->added.special, token, strlen(token), &one);
}

void mp_tokenizer_template_prefix(const mp_tokenizer *tokenizer, int64_t *out_ids, int max_ids,
                                  int *out_count) {
  int n = 0;
  for (size_t i = 0; i < tokenizer->prefix_count && n < max_ids; i++) {
    out_ids[n++] = tokenizer->prefix_ids[i];
  }
  *out_count = n;
}

mp_status mp_token_encoder_create(const mp_tokenizer *tokenizer, mp_token_encoder **out,
                                  mp_error *err) {
  *out = NULL;
  mp_token_encoder *encoder = calloc(1, sizeof *encoder);
  if (encoder == NULL) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory");
  encoder->tokenizer = tokenizer;
  encoder->pre.regex = mp_hf_regex_scratch_create();
  encoder->bpe = mp_bpe_scratch_create();
  if (encoder->pre.regex == NULL || encoder->bpe == NULL) {
    mp_token_encoder_free(encoder);
    return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory creating an encoder");
  }
  *out = encoder;
  return MP_OK;
}

void mp_token_encoder_free(mp_token_encoder *encoder) {
  if (encoder == NULL) return;
  mp_text_buffer_free(&encoder->arena);
  mp_text_buffer_free(&encoder->normalized);
  mp_text_buffer_free(&encoder->spare);
  mp_added_piece_list_free(&encoder->raw_pieces);
  mp_added_piece_list_free(&encoder->normalized_pieces);
  mp_word_list_free(&encoder->words);
  mp_pre_tokenizer_scratch_free(&encoder->pre);
  mp_bpe_scratch_free(encoder->bpe);
  free(encoder);
}

static mp_status out_of_memory(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory while encoding");
}

/* Pre-tokenizes and encodes arena[offset, offset + bytes), a piece free of added tokens. */
static mp_status encode_piece(mp_token_encoder *encoder, size_t offset, size_t bytes,
                              bool at_input_start, mp_token_ids *out, mp_error *err) {
  const mp_tokenizer *tokenizer = encoder->tokenizer;
  encoder->words.count = 0;
  mp_word word = {offset, bytes, false, at_input_start};
  if (!mp_word_list_push(&encoder->words, word)) return out_of_memory(err);
  MP_TRY(mp_pre_tokenizer_run(&tokenizer->pre_tokenizer, &encoder->pre, &encoder->arena,
                              &encoder->words, err));
  for (size_t w = 0; w < encoder->words.count; w++) {
    const mp_word *piece = &encoder->words.items[w];
    MP_TRY(mp_bpe_encode_word(&tokenizer->bpe, encoder->bpe, encoder->arena.data + piece->offset,
                              piece->bytes, piece->byte_level, out, err));
  }
  return MP_OK;
}

/* How a stretch of text between added tokens is encoded: arena[offset, offset + bytes). */
typedef mp_status (*text_encoder)(mp_token_encoder *encoder, size_t offset, size_t bytes,
                                  bool at_input_start, mp_token_ids *out, mp_error *err);

/* The pieces of a split by added tokens, in order: each added token's id, and each stretch of
 * text between them through encode_text (a piece's start is relative to arena offset base). */
static mp_status encode_pieces(mp_token_encoder *encoder, const mp_added_piece_list *pieces,
                               size_t base, bool at_input_start, text_encoder encode_text,
                               mp_token_ids *out, mp_error *err) {
  for (size_t p = 0; p < pieces->count; p++) {
    const mp_added_piece piece = pieces->items[p];
    if (piece.end == piece.start) continue;
    if (piece.id >= 0) {
      const uint32_t id = (uint32_t)piece.id;
      if (!mp_token_ids_append(out, &id, 1)) return out_of_memory(err);
      continue;
    }
    MP_TRY(encode_text(encoder, base + piece.start, piece.end - piece.start,
                       at_input_start && piece.start == 0, out, err));
  }
  return MP_OK;
}

/* Normalizes arena[offset, offset + bytes) (text between raw-matched added tokens), cuts out the
 * normalized-matched ones and encodes the rest. */
static mp_status encode_raw_piece(mp_token_encoder *encoder, size_t offset, size_t bytes,
                                  bool at_input_start, mp_token_ids *out, mp_error *err) {
  const mp_tokenizer *tokenizer = encoder->tokenizer;
  size_t start = offset, length = bytes;
  if (tokenizer->normalizer.count > 0) {
    MP_TRY(mp_normalizer_run(&tokenizer->normalizer, encoder->pre.regex, &encoder->pre.matches,
                             encoder->arena.data + offset, bytes, &encoder->normalized,
                             &encoder->spare, err));
    start = encoder->arena.length;
    length = encoder->normalized.length;
    mp_text_buffer_append(&encoder->arena, encoder->normalized.data, length);
    if (encoder->arena.failed) return out_of_memory(err);
  }
  if (length == 0) return MP_OK;
  if (tokenizer->added.normalized.count == 0) {
    return encode_piece(encoder, start, length, at_input_start, out, err);
  }
  mp_added_piece_list *pieces = &encoder->normalized_pieces;
  if (!mp_added_vocabulary_split(&tokenizer->added, &tokenizer->added.normalized,
                                 encoder->arena.data + start, length, pieces)) {
    return out_of_memory(err);
  }
  return encode_pieces(encoder, pieces, start, at_input_start, encode_piece, out, err);
}

mp_status mp_token_encoder_encode(mp_token_encoder *encoder, const char *text, size_t text_bytes,
                                  int add_special_tokens, mp_token_ids *out, mp_error *err) {
  const mp_tokenizer *tokenizer = encoder->tokenizer;
  if (add_special_tokens &&
      !mp_token_ids_append(out, tokenizer->prefix_ids, tokenizer->prefix_count)) {
    return out_of_memory(err);
  }
  mp_text_buffer *arena = &encoder->arena;
  arena->length = 0;
  mp_utf8_append_lossy(arena, text, text_bytes);
  if (arena->failed) return out_of_memory(err);
  size_t input_bytes = arena->length;
  if (input_bytes > 0) {
    mp_added_piece_list *pieces = &encoder->raw_pieces;
    if (!mp_added_vocabulary_split(&tokenizer->added, &tokenizer->added.raw, arena->data,
                                   input_bytes, pieces)) {
      return out_of_memory(err);
    }
    MP_TRY(encode_pieces(encoder, pieces, 0, true, encode_raw_piece, out, err));
  }
  if (add_special_tokens &&
      !mp_token_ids_append(out, tokenizer->suffix_ids, tokenizer->suffix_count)) {
    return out_of_memory(err);
  }
  return MP_OK;
}

mp_status mp_tokenizer_decode(const mp_tokenizer *tokenizer, const uint32_t *ids, size_t count,
                              int skip_special_tokens, char **out_text, size_t *out_bytes,
                              mp_error *err) {
  *out_text = NULL;
  *out_bytes = 0;
  const char **tokens = malloc((count == 0 ? 1 : count) * sizeof *tokens);
  if (tokens == NULL) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) {
    const char *token = mp_tokenizer_id_to_token(tokenizer, ids[i]);
    if (token == NULL) {
      free(tokens);
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: id %u (at position %zu) is not in the vocabulary (ids 0 .. %lld)",
                     tokenizer->path, ids[i], i, (long long)tokenizer->vocab_size - 1);
    }
    if (skip_special_tokens && mp_tokenizer_is_special(tokenizer, ids[i])) continue;
    tokens[kept++] = token;
  }
  mp_text_buffer text = {0};
  mp_status status = mp_decoder_run(&tokenizer->decoder, tokens, kept, &text, err);
  free(tokens);
  if (status != MP_OK) {
    mp_text_buffer_free(&text);
    return status;
  }
  if (text.data == NULL) {
    text.data = calloc(1, 1);
    if (text.data == NULL) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory");
  }
  *out_text = text.data;
  *out_bytes = text.length;
  return MP_OK;
}
