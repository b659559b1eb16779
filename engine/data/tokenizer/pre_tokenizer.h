/*
 * engine/data/tokenizer/pre_tokenizer.h — tokenizer.json's "pre_tokenizer": cuts each normalized
 * piece of text into the words the model encodes one at a time (and may rewrite them).
 *
 * Implemented: Split (a pattern and HF's SplitDelimiterBehavior: Removed, Isolated,
 * MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, the GPT-2
 * pattern when use_regex, then the byte map), Metaspace (spaces to the replacement character,
 * prepend_scheme always/first/never, split), Digits, WhitespaceSplit, CharDelimiterSplit and
 * Sequence (flattened into the chain).
 *
 * Words are spans of an arena the encoder owns. ByteLevel's byte map is applied lazily: a word
 * marks that it stands for its mapped text, which the BPE model reads byte by byte without
 * writing it out; a later step that needs the text writes it out first.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_PRE_TOKENIZER_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_PRE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/text_buffer.h"
#include "engine/data/tokenizer/hf_regex.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One word: arena bytes [offset, offset + bytes). */
typedef struct {
  size_t offset, bytes;
  bool byte_level;     /* stands for the GPT-2 byte map of its bytes (not yet written out) */
  bool at_input_start; /* begins at byte 0 of the input (Metaspace's prepend_scheme "first") */
} mp_word;

typedef struct {
  mp_word *items;
  size_t count, capacity;
} mp_word_list;

/* HF's SplitDelimiterBehavior: what becomes of the matched delimiters. */
typedef enum {
  MP_SPLIT_REMOVED,
  MP_SPLIT_ISOLATED,
  MP_SPLIT_MERGED_WITH_PREVIOUS,
  MP_SPLIT_MERGED_WITH_NEXT,
  MP_SPLIT_CONTIGUOUS,
} mp_split_behavior;

typedef enum { MP_PREPEND_ALWAYS, MP_PREPEND_FIRST, MP_PREPEND_NEVER } mp_prepend_scheme;

typedef enum {
  MP_PRE_SPLIT,
  MP_PRE_BYTE_LEVEL,
  MP_PRE_METASPACE,
  MP_PRE_DIGITS,
  MP_PRE_WHITESPACE_SPLIT,
  MP_PRE_CHAR_DELIMITER,
} mp_pre_tokenize_kind;

typedef struct {
  mp_pre_tokenize_kind kind;
  mp_hf_regex *pattern; /* Split's; ByteLevel's GPT-2 pattern when use_regex (owned) */
  mp_split_behavior behavior;
  bool invert;
  bool add_prefix_space; /* ByteLevel */
  uint32_t character;    /* Metaspace's replacement, CharDelimiterSplit's delimiter */
  mp_prepend_scheme prepend_scheme;
  bool split;             /* Metaspace */
  bool individual_digits; /* Digits */
} mp_pre_tokenize_step;

typedef struct {
  mp_pre_tokenize_step *steps;
  size_t count;
} mp_pre_tokenizer;

/* Working space of one encoder. */
typedef struct {
  mp_hf_regex_scratch *regex;
  mp_hf_match_list matches;
  mp_word_list spare;
  void *events; /* the split events (private) */
  size_t events_capacity;
} mp_pre_tokenizer_scratch;

/* Runs the chain on *words (in place; spans of *arena, which grows). */
mp_status mp_pre_tokenizer_run(const mp_pre_tokenizer *pre_tokenizer,
                               mp_pre_tokenizer_scratch *scratch, mp_text_buffer *arena,
                               mp_word_list *words, mp_error *err);

/* Makes room for extra more bytes in arena, so that its own bytes can be appended to it;
 * false (and arena->failed) when memory runs out. */
bool mp_arena_reserve(mp_text_buffer *arena, size_t extra);

/* Writes out the byte map of a byte_level word into the arena (the word then points there). */
void mp_word_write_byte_level(mp_text_buffer *arena, mp_word *word);

bool mp_word_list_push(mp_word_list *list, mp_word word);
void mp_word_list_free(mp_word_list *list);
void mp_pre_tokenizer_scratch_free(mp_pre_tokenizer_scratch *scratch);
void mp_pre_tokenizer_free(mp_pre_tokenizer *pre_tokenizer);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_PRE_TOKENIZER_H */
