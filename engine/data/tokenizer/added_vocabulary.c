/*
 * engine/data/tokenizer/added_vocabulary.c — matching added tokens (added_vocabulary.h).
 */
#include "engine/data/tokenizer/added_vocabulary.h"

#include <stdlib.h>
#include <string.h>

#include "engine/data/tokenizer/utf8.h"

static int32_t new_node(mp_token_trie *trie, uint8_t byte) {
  if (trie->count == trie->capacity) {
    size_t capacity = trie->capacity == 0 ? 64 : trie->capacity * 2;
    mp_trie_node *nodes = realloc(trie->nodes, capacity * sizeof *nodes);
    if (nodes == NULL) return -1;
    trie->nodes = nodes;
    trie->capacity = capacity;
  }
  mp_trie_node *node = &trie->nodes[trie->count];
  node->first_child = -1;
  node->next_sibling = -1;
  node->value = 0;
  node->byte = byte;
  return (int32_t)trie->count++;
}

static int32_t child(const mp_token_trie *trie, int32_t node, uint8_t byte) {
  for (int32_t c = trie->nodes[node].first_child; c >= 0; c = trie->nodes[c].next_sibling) {
    if (trie->nodes[c].byte == byte) return c;
  }
  return -1;
}

bool mp_token_trie_add(mp_token_trie *trie, const char *pattern, size_t bytes, uint32_t id) {
  if (bytes == 0) return true; /* HF never adds an empty token */
  if (trie->count == 0 && new_node(trie, 0) < 0) return false;
  int32_t node = 0;
  for (size_t i = 0; i < bytes; i++) {
    uint8_t b = (uint8_t)pattern[i];
    int32_t next = child(trie, node, b);
    if (next < 0) {
      next = new_node(trie, b);
      if (next < 0) return false;
      trie->nodes[next].next_sibling = trie->nodes[node].first_child;
      trie->nodes[node].first_child = next;
    }
    node = next;
  }
  /* Two patterns with one content: Aho-Corasick reports the first added. */
  if (trie->nodes[node].value == 0) trie->nodes[node].value = id + 1;
  trie->first_bytes[(uint8_t)pattern[0]] = true;
  return true;
}

/* The longest pattern starting at text[at]: its end, and its id in *id; 0 when none. */
static size_t longest_at(const mp_token_trie *trie, const char *text, size_t bytes, size_t at,
                         uint32_t *id) {
  int32_t node = 0;
  size_t end = 0;
  for (size_t i = at; i < bytes; i++) {
    node = child(trie, node, (uint8_t)text[i]);
    if (node < 0) break;
    if (trie->nodes[node].value != 0) {
      end = i + 1;
      *id = trie->nodes[node].value - 1;
    }
  }
  return end;
}

const mp_added_token *mp_added_vocabulary_find(const mp_added_vocabulary *vocabulary,
                                               uint32_t id) {
  /* tokens are sorted by id */
  size_t low = 0, high = vocabulary->count;
  while (low < high) {
    size_t mid = (low + high) / 2;
    if (vocabulary->tokens[mid].id < id) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  if (low < vocabulary->count && vocabulary->tokens[low].id == id) return &vocabulary->tokens[low];
  return NULL;
}

static bool push_piece(mp_added_piece_list *list, size_t start, size_t end, int64_t id) {
  if (list->count == list->capacity) {
    size_t capacity = list->capacity == 0 ? 16 : list->capacity * 2;
    mp_added_piece *items = realloc(list->items, capacity * sizeof *items);
    if (items == NULL) return false;
    list->items = items;
    list->capacity = capacity;
  }
  list->items[list->count].start = start;
  list->items[list->count].end = end;
  list->items[list->count].id = id;
  list->count++;
  return true;
}

/* The character before text[at] (at > 0). */
static uint32_t char_before(const char *text, size_t at) {
  size_t back = at - 1;
  while (back > 0 && ((unsigned char)text[back] & 0xC0) == 0x80) back--;
  size_t length;
  return mp_utf8_decode(text + back, at - back, &length);
}

bool mp_added_vocabulary_split(const mp_added_vocabulary *vocabulary, const mp_token_trie *trie,
                               const char *text, size_t bytes, mp_added_piece_list *out) {
  out->count = 0;
  size_t start_offset = 0;
  size_t at = 0;
  if (trie->count > 0) {
    while (at < bytes) {
      if (!trie->first_bytes[(uint8_t)text[at]]) {
        at++;
        continue;
      }
      uint32_t id = 0;
      size_t stop = longest_at(trie, text, bytes, at, &id);
      if (stop == 0) {
        at++;
        continue;
      }
      size_t start = at;
      at = stop; /* the automaton goes on after the match, whatever rstrip takes */
      const mp_added_token *token = mp_added_vocabulary_find(vocabulary, id);
      if (token == NULL) continue;
      if (token->single_word) {
        bool start_space = start == 0 || !mp_unicode_is_word(char_before(text, start));
        size_t length;
        bool stop_space = stop == bytes ||
                          !mp_unicode_is_word(mp_utf8_decode(text + stop, bytes - stop, &length));
        if (!start_space || !stop_space) continue;
      }
      if (token->lstrip) {
        size_t new_start = start;
        while (new_start > 0 && mp_unicode_is_whitespace(char_before(text, new_start))) {
          uint32_t c = char_before(text, new_start);
          char utf8[4];
          new_start -= mp_utf8_encode(c, utf8);
        }
        start = new_start > start_offset ? new_start : start_offset;
      }
      if (token->rstrip) {
        while (stop < bytes) {
          size_t length;
          uint32_t c = mp_utf8_decode(text + stop, bytes - stop, &length);
          if (!mp_unicode_is_whitespace(c)) break;
          stop += length;
        }
      }
      if (start_offset < start && !push_piece(out, start_offset, start, -1)) return false;
      if (!push_piece(out, start, stop, token->id)) return false;
      start_offset = stop;
    }
  }
  if (start_offset < bytes && !push_piece(out, start_offset, bytes, -1)) return false;
  return true;
}

void mp_added_piece_list_free(mp_added_piece_list *list) {
  free(list->items);
  memset(list, 0, sizeof *list);
}

void mp_added_vocabulary_free(mp_added_vocabulary *vocabulary) {
  for (size_t i = 0; i < vocabulary->count; i++) free(vocabulary->tokens[i].content);
  free(vocabulary->tokens);
  mp_string_table_free(&vocabulary->by_content);
  mp_string_table_free(&vocabulary->special);
  free(vocabulary->raw.nodes);
  free(vocabulary->normalized.nodes);
  memset(vocabulary, 0, sizeof *vocabulary);
}
