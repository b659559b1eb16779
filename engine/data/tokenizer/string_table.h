/*
 * engine/data/tokenizer/string_table.h — a hash table from byte strings to 32-bit values: the
 * vocabulary (token text -> id) and the added tokens. Open addressing over one array of slots,
 * keys copied into one arena (NUL-terminated, so a key can be handed out as a C string): no
 * allocation per entry, and a lookup touches one slot and one key in the common case.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_STRING_TABLE_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_STRING_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t hash;
  size_t key_offset; /* into keys */
  uint32_t key_bytes;
  uint32_t value;
} mp_string_entry;

typedef struct {
  uint32_t *slots; /* entry index + 1; 0 = empty; capacity a power of two */
  size_t slot_mask;
  mp_string_entry *entries;
  size_t count, entry_capacity;
  char *keys;
  size_t keys_bytes, keys_capacity;
} mp_string_table;

/* A 64-bit hash of bytes (eight at a time). */
uint64_t mp_hash_bytes(const void *bytes, size_t count);

/* Inserts key -> value, or overwrites the value of an existing key. False when memory runs out. */
bool mp_string_table_put(mp_string_table *table, const char *key, size_t key_bytes,
                         uint32_t value);

/* Looks key up: true and *value when present. */
bool mp_string_table_get(const mp_string_table *table, const char *key, size_t key_bytes,
                         uint32_t *value);

/* The stored copy of entry i's key (NUL-terminated). */
const char *mp_string_table_key(const mp_string_table *table, size_t entry);

void mp_string_table_free(mp_string_table *table);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_STRING_TABLE_H */
