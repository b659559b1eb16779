/*
 * tests/fuzz/tokenizer_json_fuzz.c — libFuzzer target: Hugging Face tokenizer.json files through
 * mp_tokenizer_load (via a memfd, so the real file path runs), and every tokenizer it accepts
 * through encode and decode.
 *
 * The input is split at its first NUL byte: before it the tokenizer.json, after it a text to
 * encode (the whole input is the JSON when there is no NUL). What an accepted tokenizer must
 * satisfy, or the target aborts: encoding the text (with and without the template's special
 * tokens) succeeds or fails with a message, every id it gives is below the vocabulary size, and
 * decoding those ids succeeds. A refused file must come with a message.
 */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data/tokenizer/tokenizer.h"

static void check_encoding(const mp_tokenizer *tokenizer, mp_token_encoder *encoder,
                           const char *text, size_t text_bytes, int add_special_tokens) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_token_ids ids = {0};
  const mp_status status =
      mp_token_encoder_encode(encoder, text, text_bytes, add_special_tokens, &ids, &err);
  if (status != MP_OK) {
    if (err.message[0] == '\0') abort();
    mp_token_ids_free(&ids);
    return;
  }
  const int64_t vocab = mp_tokenizer_vocab_size(tokenizer);
  for (size_t i = 0; i < ids.count; ++i) {
    if ((int64_t)ids.ids[i] >= vocab) {
      fprintf(stderr, "id %u of the encoding is outside the vocabulary (%lld)\n", ids.ids[i],
              (long long)vocab);
      abort();
    }
  }
  char *decoded = NULL;
  size_t decoded_bytes = 0;
  for (int skip = 0; skip < 2; ++skip) {
    if (mp_tokenizer_decode(tokenizer, ids.ids, ids.count, skip, &decoded, &decoded_bytes, &err) !=
        MP_OK) {
      fprintf(stderr, "decoding the encoder's own ids failed: %s\n", err.message);
      abort();
    }
    if (decoded == NULL || decoded[decoded_bytes] != '\0') abort();
    free(decoded);
    decoded = NULL;
  }
  mp_token_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  const size_t json_bytes = nul != NULL ? (size_t)(nul - data) : size;
  const char *text = nul != NULL ? (const char *)nul + 1 : "Hello world, 123 héllo 世界\n\n";
  const size_t text_bytes = nul != NULL ? size - json_bytes - 1 : strlen(text);
  char path[64];
  const int fd = fuzz_memfd_path(data, json_bytes, path, sizeof path);
  if (fd < 0) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_tokenizer *tokenizer = NULL;
  const mp_status status = mp_tokenizer_load(path, &tokenizer, &err);
  close(fd);
  if (status != MP_OK) {
    if (tokenizer != NULL || err.message[0] == '\0') abort();
    return 0;
  }
  mp_token_encoder *encoder = NULL;
  if (mp_token_encoder_create(tokenizer, &encoder, &err) == MP_OK) {
    check_encoding(tokenizer, encoder, text, text_bytes, 0);
    check_encoding(tokenizer, encoder, text, text_bytes, 1);
    mp_token_encoder_free(encoder);
  }
  mp_tokenizer_free(tokenizer);
  return 0;
}
