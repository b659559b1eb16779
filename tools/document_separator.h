/*
 * tools/document_separator.h — the token ids that start every document, as llm.c's data scripts
 * write them: GPT-2's shards put <|endoftext|> before each document, Llama 3's <|begin_of_text|>.
 * `data tokenize` writes them and `sample` starts a prompt with them, so that a model sees a
 * prompt the way it saw its training documents.
 */
#ifndef MPENGINE_TOOLS_DOCUMENT_SEPARATOR_H
#define MPENGINE_TOOLS_DOCUMENT_SEPARATOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/data/tokenizer/tokenizer.h"

enum { MP_MAX_SEPARATOR_IDS = 8 };

/* The separator: the token `option` names (--separator; NULL for the default), else the
 * tokenizer's template prefix (Llama 3's <|begin_of_text|>, Llama 2's <s>), else its
 * <|endoftext|>, <|end_of_text|> or </s>. Writes up to MP_MAX_SEPARATOR_IDS ids and their
 * count, and a description for logs ("<|endoftext|> (end of text)") into name. MP_ERR_INPUT when
 * the token named does not exist or the tokenizer has none of these, saying to use --separator. */
mp_status mp_document_separator(const mp_tokenizer *tokenizer, const char *option, uint32_t *ids,
                                int *count, char *name, size_t name_bytes, mp_error *err);

#endif /* MPENGINE_TOOLS_DOCUMENT_SEPARATOR_H */
