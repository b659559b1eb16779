/*
 * tools/document_separator.c — see document_separator.h.
 */
#include "tools/document_separator.h"

#include <stdio.h>
#include <string.h>

mp_status mp_document_separator(const mp_tokenizer *tokenizer, const char *option,
                                  uint32_t *ids, int *count, char *name, size_t name_bytes,
                                  mp_error *err) {
  *count = 0;
  if (option != NULL) {
    int64_t id = mp_tokenizer_token_to_id(tokenizer, option);
    if (id < 0) {
      return mp_fail(err, MP_ERR_INPUT, "--separator %s: %s has no such token", option,
                     mp_tokenizer_path(tokenizer));
    }
    ids[(*count)++] = (uint32_t)id;
    snprintf(name, name_bytes, "%s (--separator)", option);
    return MP_OK;
  }
  int64_t prefix[MP_MAX_SEPARATOR_IDS];
  int prefix_count = 0;
  mp_tokenizer_template_prefix(tokenizer, prefix, MP_MAX_SEPARATOR_IDS, &prefix_count);
  if (prefix_count > 0) {
    name[0] = '\0';
    for (int i = 0; i < prefix_count; ++i) {
      ids[(*count)++] = (uint32_t)prefix[i];
      size_t used = strlen(name);
      snprintf(name + used, name_bytes - used, "%s%s", i > 0 ? " " : "",
               mp_tokenizer_id_to_token(tokenizer, prefix[i]));
    }
    size_t used = strlen(name);
    snprintf(name + used, name_bytes - used, " (the tokenizer's template prefix)");
    return MP_OK;
  }
  static const char *const kEndOfText[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", NULL};
  for (int i = 0; kEndOfText[i] != NULL; ++i) {
    int64_t id = mp_tokenizer_token_to_id(tokenizer, kEndOfText[i]);
    if (id >= 0) {
      ids[(*count)++] = (uint32_t)id;
      snprintf(name, name_bytes, "%s (end of text)", kEndOfText[i]);
      return MP_OK;
    }
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: no document separator: its post-processor adds no prefix and it has no "
                 "<|endoftext|>, <|end_of_text|> or </s> token; name one with --separator TOKEN",
                 mp_tokenizer_path(tokenizer));
}

