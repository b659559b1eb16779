/*
 * engine/data/tokenizer/added_vocabulary.h — tokenizer.json's "added_tokens", found in the text
 * before anything else runs, as HF's AddedVocabulary does:
 *   1. tokens that are special or not `normalized` are matched on the raw text;
 *   2. each piece between them is normalized, and the `normalized` tokens (their content run
 *      through the normalizer) are matched on it.
 * Matching is leftmost-longest and non-overlapping (HF builds an Aho-Corasick automaton with
 * MatchKind::LeftmostLongest; a byte trie tried at each position gives the same matches). A match
 * of a single_word token with a word character (Rust regex \w) on either side is skipped; lstrip
 * and rstrip take the white space beside it into the token.
 *
 * Ids are assigned as HF assigns them on load (the ids written in the file are only checked by
 * HF): a content already in the model's vocabulary keeps that id, others take the next id after
 * the largest added one (or after the model's vocabulary).
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_ADDED_VOCABULARY_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_ADDED_VOCABULARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/data/tokenizer/string_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char *content; /* owned, NUL-terminated */
  size_t content_bytes;
  uint32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
} mp_added_token;

/* A byte trie of patterns; a node's value is the matched token id + 1 (0: no pattern ends). */
typedef struct {
  int32_t first_child, next_sibling;
  uint32_t value;
  uint8_t byte;
} mp_trie_node;

typedef struct {
  mp_trie_node *nodes; /* node 0 is the root */
  size_t count, capacity;
  bool first_bytes[256]; /* a pattern starts with this byte */
} mp_token_trie;

typedef struct {
  mp_added_token *tokens; /* one per id, in HF's id -> token map (the last definition wins) */
  size_t count;
  mp_string_table by_content; /* content -> id */
  mp_string_table special;    /* contents of special tokens -> 1 */
  mp_token_trie raw;          /* special or not normalized: matched on the raw text */
  mp_token_trie normalized;   /* matched on normalized text, by normalized content */
} mp_added_vocabulary;

/* A piece of text: an added token (id >= 0) or text between them (id -1). */
typedef struct {
  size_t start, end;
  int64_t id;
} mp_added_piece;

typedef struct {
  mp_added_piece *items;
  size_t count, capacity;
} mp_added_piece_list;

/* Adds a pattern to a trie; false when memory runs out. */
bool mp_token_trie_add(mp_token_trie *trie, const char *pattern, size_t bytes, uint32_t id);

/* The token with this id, or NULL. */
const mp_added_token *mp_added_vocabulary_find(const mp_added_vocabulary *vocabulary,
                                               uint32_t id);

/* HF's AddedVocabulary::find_matches: cuts text[0 .. bytes) into pieces by the tokens of trie
 * (out cleared first; empty pieces are kept out). False when memory runs out. */
bool mp_added_vocabulary_split(const mp_added_vocabulary *vocabulary, const mp_token_trie *trie,
                               const char *text, size_t bytes, mp_added_piece_list *out);

void mp_added_piece_list_free(mp_added_piece_list *list);
void mp_added_vocabulary_free(mp_added_vocabulary *vocabulary);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_ADDED_VOCABULARY_H */
