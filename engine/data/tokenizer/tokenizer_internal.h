/*
 * engine/data/tokenizer/tokenizer_internal.h — what a loaded tokenizer and an encoder hold, shared
 * by the loader (tokenizer_json.c) and the runner (tokenizer.c). Not part of the API.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_INTERNAL_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_INTERNAL_H

#include "common/text_buffer.h"
#include "engine/data/tokenizer/added_vocabulary.h"
#include "engine/data/tokenizer/bpe.h"
#include "engine/data/tokenizer/decoder.h"
#include "engine/data/tokenizer/normalizer.h"
#include "engine/data/tokenizer/pre_tokenizer.h"
#include "engine/data/tokenizer/tokenizer.h"

struct mp_tokenizer {
  char *path; /* the tokenizer.json */
  mp_added_vocabulary added;
  mp_normalizer normalizer;
  mp_pre_tokenizer pre_tokenizer;
  mp_bpe bpe;
  /* The post-processor's single-sequence template, reduced to the ids around the sequence. */
  uint32_t *prefix_ids, *suffix_ids;
  size_t prefix_count, suffix_count;
  mp_decoder decoder;
  int64_t vocab_size; /* one more than the largest id */
};

struct mp_token_encoder {
  const mp_tokenizer *tokenizer;
  mp_text_buffer arena;      /* the input (repaired), and every rewritten word */
  mp_text_buffer normalized; /* one piece, normalized */
  mp_text_buffer spare;      /* the normalizer's other buffer */
  mp_added_piece_list raw_pieces, normalized_pieces;
  mp_word_list words;
  mp_pre_tokenizer_scratch pre;
  mp_bpe_scratch *bpe;
};

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_INTERNAL_H */
