/*
 * engine/data/tokenizer/bpe.c — the BPE model (bpe.h).
 */
#include "engine/data/tokenizer/bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/tokenizer/byte_level.h"
#include "engine/data/tokenizer/utf8.h"

/* Words this long or longer are not cached (HF's MAX_LENGTH): they are rare, and would fill it. */
enum { CACHE_MAX_WORD_BYTES = 256, CACHE_MAX_ENTRIES = 1 << 17 };

typedef struct {
  uint32_t id;
  int32_t prev, next;
  uint32_t bytes; /* 0: merged into the symbol on its left */
} symbol;

typedef struct {
  uint32_t rank, pos, merged;
} queued_merge;

typedef struct {
  uint64_t hash;
  uint32_t key_offset, key_bytes;
  uint32_t ids_offset, ids_count;
  bool byte_level;
} cache_entry;

struct mp_bpe_scratch {
  symbol *symbols;
  size_t symbols_capacity;
  queued_merge *queue;
  size_t queue_count, queue_capacity;
  char *text; /* a word's byte map, or a character with its prefix/suffix */
  size_t text_capacity;
  mp_token_ids word_ids;
  /* The word cache: open addressing over entries; keys and ids in two arenas. */
  uint32_t *slots;
  size_t slot_mask;
  cache_entry *entries;
  size_t entry_count;
  char *keys;
  size_t keys_bytes, keys_capacity;
  uint32_t *ids;
  size_t ids_count, ids_capacity;
};

bool mp_token_ids_append(mp_token_ids *out, const uint32_t *ids, size_t count) {
  if (count == 0) return true;
  if (out->count + count > out->capacity) {
    size_t capacity = out->capacity == 0 ? 256 : out->capacity;
    while (capacity < out->count + count) capacity *= 2;
    uint32_t *grown = realloc(out->ids, capacity * sizeof *grown);
    if (grown == NULL) return false;
    out->ids = grown;
    out->capacity = capacity;
  }
  memcpy(out->ids + out->count, ids, count * sizeof *ids);
  out->count += count;
  return true;
}

/* ---- merges ---------------------------------------------------------------------------- */

static size_t pair_hash(uint32_t left, uint32_t right) {
  uint64_t key = ((uint64_t)left << 32) | right;
  key *= 0x9E3779B97F4A7C15ull;
  return (size_t)(key ^ (key >> 29));
}

bool mp_bpe_reserve_merges(mp_bpe *bpe, size_t count) {
  size_t capacity = 64;
  while (capacity < count * 2) capacity *= 2;
  free(bpe->merges);
  bpe->merges = malloc(capacity * sizeof *bpe->merges);
  if (bpe->merges == NULL) return false;
  for (size_t i = 0; i < capacity; i++) bpe->merges[i].rank = UINT32_MAX;
  bpe->merge_mask = capacity - 1;
  return true;
}

bool mp_bpe_add_merge(mp_bpe *bpe, uint32_t left, uint32_t right, uint32_t rank,
                      uint32_t merged) {
  if (bpe->merges == NULL) return false;
  size_t s = pair_hash(left, right) & bpe->merge_mask;
  for (;;) {
    mp_bpe_merge *m = &bpe->merges[s];
    if (m->rank == UINT32_MAX || (m->left == left && m->right == right)) {
      m->left = left;
      m->right = right;
      m->rank = rank;
      m->merged = merged;
      return true;
    }
    s = (s + 1) & bpe->merge_mask;
  }
}

static const mp_bpe_merge *find_merge(const mp_bpe *bpe, uint32_t left, uint32_t right) {
  if (bpe->merges == NULL) return NULL;
  size_t s = pair_hash(left, right) & bpe->merge_mask;
  for (;;) {
    const mp_bpe_merge *m = &bpe->merges[s];
    if (m->rank == UINT32_MAX) return NULL;
    if (m->left == left && m->right == right) return m;
    s = (s + 1) & bpe->merge_mask;
  }
}

bool mp_bpe_finish(mp_bpe *bpe) {
  uint32_t id_count = 0;
  for (size_t i = 0; i < bpe->vocab.count; i++) {
    if (bpe->vocab.entries[i].value >= id_count) id_count = bpe->vocab.entries[i].value + 1;
  }
  bpe->id_count = id_count;
  bpe->id_to_token = calloc(id_count == 0 ? 1 : id_count, sizeof *bpe->id_to_token);
  if (bpe->id_to_token == NULL) return false;
  /* A duplicated id keeps the entry read last. */
  for (size_t i = 0; i < bpe->vocab.count; i++) {
    bpe->id_to_token[bpe->vocab.entries[i].value] = mp_string_table_key(&bpe->vocab, i);
  }
  bool all_bytes = true;
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    uint32_t id;
    bpe->byte_fallback_ids[b] = mp_string_table_get(&bpe->vocab, name, 6, &id) ? (int64_t)id : -1;
    char utf8[2];
    size_t length = mp_byte_level_utf8((uint8_t)b, utf8);
    bpe->byte_level_ids[b] = mp_string_table_get(&bpe->vocab, utf8, length, &id) ? (int64_t)id : -1;
    if (bpe->byte_level_ids[b] < 0) all_bytes = false;
  }
  bpe->byte_level_direct =
      all_bytes && bpe->continuing_subword_prefix == NULL && bpe->end_of_word_suffix == NULL;
  return true;
}

void mp_bpe_free(mp_bpe *bpe) {
  mp_string_table_free(&bpe->vocab);
  free(bpe->id_to_token);
  free(bpe->merges);
  free(bpe->unk_token);
  free(bpe->continuing_subword_prefix);
  free(bpe->end_of_word_suffix);
  memset(bpe, 0, sizeof *bpe);
}

/* ---- scratch and cache -------------------------------------------------------------------- */

mp_bpe_scratch *mp_bpe_scratch_create(void) { return calloc(1, sizeof(mp_bpe_scratch)); }

void mp_bpe_scratch_free(mp_bpe_scratch *scratch) {
  if (scratch == NULL) return;
  free(scratch->symbols);
  free(scratch->queue);
  free(scratch->text);
  free(scratch->word_ids.ids);
  free(scratch->slots);
  free(scratch->entries);
  free(scratch->keys);
  free(scratch->ids);
  free(scratch);
}

static bool grow(void **items, size_t *capacity, size_t needed, size_t item_bytes) {
  if (needed <= *capacity) return true;
  size_t c = *capacity == 0 ? 64 : *capacity;
  while (c < needed) c *= 2;
  void *grown = realloc(*items, c * item_bytes);
  if (grown == NULL) return false;
  *items = grown;
  *capacity = c;
  return true;
}

static void cache_clear(mp_bpe_scratch *s) {
  if (s->slots != NULL) memset(s->slots, 0, (s->slot_mask + 1) * sizeof *s->slots);
  s->entry_count = 0;
  s->keys_bytes = 0;
  s->ids_count = 0;
}

static const cache_entry *cache_get(const mp_bpe_scratch *s, const char *word, size_t bytes,
                                    bool byte_level, uint64_t hash) {
  if (s->slots == NULL) return NULL;
  size_t slot = hash & s->slot_mask;
  for (;;) {
    uint32_t index = s->slots[slot];
    if (index == 0) return NULL;
    const cache_entry *e = &s->entries[index - 1];
    if (e->hash == hash && e->key_bytes == bytes && e->byte_level == byte_level &&
        memcmp(s->keys + e->key_offset, word, bytes) == 0) {
      return e;
    }
    slot = (slot + 1) & s->slot_mask;
  }
}

/* Best effort: a cache that cannot grow just does not keep the word. */
static void cache_put(mp_bpe_scratch *s, const char *word, size_t bytes, bool byte_level,
                      uint64_t hash, const uint32_t *ids, size_t count) {
  if (s->slots == NULL) {
    s->slots = calloc((size_t)CACHE_MAX_ENTRIES * 2, sizeof *s->slots);
    s->entries = malloc((size_t)CACHE_MAX_ENTRIES * sizeof *s->entries);
    if (s->slots == NULL || s->entries == NULL) {
      free(s->slots);
      free(s->entries);
      s->slots = NULL;
      s->entries = NULL;
      return;
    }
    s->slot_mask = (size_t)CACHE_MAX_ENTRIES * 2 - 1;
  }
  if (s->entry_count == CACHE_MAX_ENTRIES) cache_clear(s);
  if (!grow((void **)&s->keys, &s->keys_capacity, s->keys_bytes + bytes, 1) ||
      !grow((void **)&s->ids, &s->ids_capacity, s->ids_count + count, sizeof *s->ids)) {
    return;
  }
  cache_entry *e = &s->entries[s->entry_count];
  e->hash = hash;
  e->key_offset = (uint32_t)s->keys_bytes;
  e->key_bytes = (uint32_t)bytes;
  e->ids_offset = (uint32_t)s->ids_count;
  e->ids_count = (uint32_t)count;
  e->byte_level = byte_level;
  memcpy(s->keys + s->keys_bytes, word, bytes);
  s->keys_bytes += bytes;
  if (count > 0) memcpy(s->ids + s->ids_count, ids, count * sizeof *ids);
  s->ids_count += count;
  size_t slot = hash & s->slot_mask;
  while (s->slots[slot] != 0) slot = (slot + 1) & s->slot_mask;
  s->slots[slot] = (uint32_t)++s->entry_count;
}

/* ---- merging ------------------------------------------------------------------------------ */

static bool queue_before(const queued_merge *a, const queued_merge *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static bool queue_push(mp_bpe_scratch *s, uint32_t rank, uint32_t pos, uint32_t merged) {
  if (!grow((void **)&s->queue, &s->queue_capacity, s->queue_count + 1, sizeof *s->queue)) {
    return false;
  }
  queued_merge item = {rank, pos, merged};
  size_t i = s->queue_count++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!queue_before(&item, &s->queue[parent])) break;
    s->queue[i] = s->queue[parent];
    i = parent;
  }
  s->queue[i] = item;
  return true;
}

static queued_merge queue_pop(mp_bpe_scratch *s) {
  queued_merge top = s->queue[0];
  queued_merge last = s->queue[--s->queue_count];
  size_t i = 0, n = s->queue_count;
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && queue_before(&s->queue[child + 1], &s->queue[child])) child++;
    if (!queue_before(&s->queue[child], &last)) break;
    s->queue[i] = s->queue[child];
    i = child;
  }
  if (n > 0) s->queue[i] = last;
  return top;
}

/* HF's Word::merge_all over s->symbols[0 .. count). */
static bool merge_all(const mp_bpe *bpe, mp_bpe_scratch *s, size_t count) {
  symbol *sym = s->symbols;
  s->queue_count = 0;
  for (size_t i = 0; i + 1 < count; i++) {
    const mp_bpe_merge *m = find_merge(bpe, sym[i].id, sym[i + 1].id);
    if (m != NULL && !queue_push(s, m->rank, (uint32_t)i, m->merged)) return false;
  }
  while (s->queue_count > 0) {
    queued_merge top = queue_pop(s);
    symbol *current = &sym[top.pos];
    if (current->bytes == 0 || current->next == -1) continue;
    symbol right = sym[current->next];
    /* Skip an entry made stale by an earlier merge. */
    const mp_bpe_merge *m = find_merge(bpe, current->id, right.id);
    if (m == NULL || m->merged != top.merged) continue;
    sym[current->next].bytes = 0;
    current->id = top.merged;
    current->bytes += right.bytes;
    current->next = right.next;
    if (right.next >= 0 && (size_t)right.next < count) sym[right.next].prev = (int32_t)top.pos;
    if (current->prev >= 0) {
      const mp_bpe_merge *with_prev = find_merge(bpe, sym[current->prev].id, current->id);
      if (with_prev != NULL &&
          !queue_push(s, with_prev->rank, (uint32_t)current->prev, with_prev->merged)) {
        return false;
      }
    }
    if (current->next >= 0 && (size_t)current->next < count) {
      const mp_bpe_merge *with_next = find_merge(bpe, current->id, sym[current->next].id);
      if (with_next != NULL && !queue_push(s, with_next->rank, top.pos, with_next->merged)) {
        return false;
      }
    }
  }
  return true;
}

static bool add_symbol(mp_bpe_scratch *s, size_t *count, uint32_t id, size_t bytes) {
  if (!grow((void **)&s->symbols, &s->symbols_capacity, *count + 1, sizeof *s->symbols)) {
    return false;
  }
  symbol *sym = &s->symbols[*count];
  sym->id = id;
  sym->bytes = (uint32_t)bytes;
  sym->prev = (int32_t)*count - 1;
  sym->next = -1;
  if (*count > 0) s->symbols[*count - 1].next = (int32_t)*count;
  (*count)++;
  return true;
}

static mp_status out_of_memory(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory while encoding a word");
}

/* HF's BPE::merge_word's first half: the characters of text as symbols. */
static mp_status initial_symbols(const mp_bpe *bpe, mp_bpe_scratch *s, const char *text,
                                 size_t bytes, size_t *count, mp_error *err) {
  size_t prefix_bytes = bpe->continuing_subword_prefix ? strlen(bpe->continuing_subword_prefix) : 0;
  size_t suffix_bytes = bpe->end_of_word_suffix ? strlen(bpe->end_of_word_suffix) : 0;
  bool unk_pending = false;
  uint32_t unk_id = 0;
  size_t unk_bytes = 0;
  char piece[64];
  for (size_t i = 0; i < bytes;) {
    size_t length;
    mp_utf8_decode(text + i, bytes - i, &length);
    bool first = i == 0, last = i + length >= bytes;
    const char *key = text + i;
    size_t key_bytes = length;
    if ((!first && prefix_bytes > 0) || (last && suffix_bytes > 0)) {
      size_t p = !first ? prefix_bytes : 0, q = last ? suffix_bytes : 0;
      if (p + length + q > sizeof piece) {
        return mp_fail(err, MP_ERR_INPUT, "tokenizer: continuing_subword_prefix or "
                       "end_of_word_suffix longer than %zu bytes", sizeof piece - 8);
      }
      if (p > 0) memcpy(piece, bpe->continuing_subword_prefix, p);
      memcpy(piece + p, text + i, length);
      if (q > 0) memcpy(piece + p + length, bpe->end_of_word_suffix, q);
      key = piece;
      key_bytes = p + length + q;
    }
    uint32_t id;
    if (mp_string_table_get(&bpe->vocab, key, key_bytes, &id)) {
      if (unk_pending) {
        if (!add_symbol(s, count, unk_id, unk_bytes)) return out_of_memory(err);
        unk_pending = false;
      }
      if (!add_symbol(s, count, id, length)) return out_of_memory(err);
      i += length;
      continue;
    }
    if (bpe->byte_fallback) {
      bool all = true;
      for (size_t k = 0; k < key_bytes; k++) {
        if (bpe->byte_fallback_ids[(uint8_t)key[k]] < 0) all = false;
      }
      if (all) {
        /* As HF: the pending unknown stays pending across byte-fallback tokens. */
        for (size_t k = 0; k < key_bytes; k++) {
          if (!add_symbol(s, count, (uint32_t)bpe->byte_fallback_ids[(uint8_t)key[k]], 1)) {
            return out_of_memory(err);
          }
        }
        i += length;
        continue;
      }
    }
    if (bpe->unk_token != NULL) {
      uint32_t unk;
      if (!mp_string_table_get(&bpe->vocab, bpe->unk_token, strlen(bpe->unk_token), &unk)) {
        return mp_fail(err, MP_ERR_INPUT,
                       "tokenizer: the unknown token \"%s\" (model.unk_token) is not in the "
                       "vocabulary, and the text has a character the vocabulary lacks",
                       bpe->unk_token);
      }
      if (unk_pending && bpe->fuse_unk) {
        unk_bytes += length;
      } else {
        if (unk_pending && !add_symbol(s, count, unk_id, unk_bytes)) return out_of_memory(err);
        unk_pending = true;
        unk_id = unk;
        unk_bytes = length;
      }
    }
    i += length;
  }
  if (unk_pending && !add_symbol(s, count, unk_id, unk_bytes)) return out_of_memory(err);
  return MP_OK;
}

/* Writes the byte map of word into s->text; returns its length (or SIZE_MAX out of memory). */
static size_t write_byte_map(mp_bpe_scratch *s, const char *word, size_t bytes) {
  if (!grow((void **)&s->text, &s->text_capacity, 2 * bytes + 1, 1)) return SIZE_MAX;
  size_t n = 0;
  for (size_t i = 0; i < bytes; i++) n += mp_byte_level_utf8((uint8_t)word[i], s->text + n);
  return n;
}

mp_status mp_bpe_encode_word(const mp_bpe *bpe, mp_bpe_scratch *s, const char *word,
                             size_t bytes, bool byte_level, mp_token_ids *out, mp_error *err) {
  if (bytes == 0) return MP_OK;
  bool cacheable = bytes < CACHE_MAX_WORD_BYTES;
  uint64_t hash = 0;
  if (cacheable) {
    hash = mp_hash_bytes(word, bytes);
    const cache_entry *hit = cache_get(s, word, bytes, byte_level, hash);
    if (hit != NULL) {
      /* A word may encode to no id at all (every symbol unknown and no unk token). */
      if (hit->ids_count > 0 &&
          !mp_token_ids_append(out, s->ids + hit->ids_offset, hit->ids_count)) {
        return out_of_memory(err);
      }
      return MP_OK;
    }
  }
  const char *text = word;
  size_t text_bytes = bytes;
  if (byte_level && (bpe->ignore_merges || !bpe->byte_level_direct)) {
    text_bytes = write_byte_map(s, word, bytes);
    if (text_bytes == SIZE_MAX) return out_of_memory(err);
    text = s->text;
  }
  s->word_ids.count = 0;
  uint32_t whole;
  if (bpe->ignore_merges && mp_string_table_get(&bpe->vocab, text, text_bytes, &whole)) {
    if (!mp_token_ids_append(&s->word_ids, &whole, 1)) return out_of_memory(err);
  } else {
    size_t count = 0;
    if (byte_level && bpe->byte_level_direct) {
      if (!grow((void **)&s->symbols, &s->symbols_capacity, bytes, sizeof *s->symbols)) {
        return out_of_memory(err);
      }
      for (size_t i = 0; i < bytes; i++) {
        symbol *sym = &s->symbols[i];
        sym->id = (uint32_t)bpe->byte_level_ids[(uint8_t)word[i]];
        sym->bytes = 1;
        sym->prev = (int32_t)i - 1;
        sym->next = i + 1 < bytes ? (int32_t)i + 1 : -1;
      }
      count = bytes;
    } else {
      MP_TRY(initial_symbols(bpe, s, text, text_bytes, &count, err));
    }
    if (!merge_all(bpe, s, count)) return out_of_memory(err);
    for (size_t i = 0; i < count; i++) {
      if (s->symbols[i].bytes != 0 && !mp_token_ids_append(&s->word_ids, &s->symbols[i].id, 1)) {
        return out_of_memory(err);
      }
    }
  }
  if (cacheable) cache_put(s, word, bytes, byte_level, hash, s->word_ids.ids, s->word_ids.count);
  if (!mp_token_ids_append(out, s->word_ids.ids, s->word_ids.count)) return out_of_memory(err);
  return MP_OK;
}
