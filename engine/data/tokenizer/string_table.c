/*
 * engine/data/tokenizer/string_table.c — open-addressing string table (string_table.h).
 */
#include "engine/data/tokenizer/string_table.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t a, uint64_t b) {
  __uint128_t product = (__uint128_t)a * b;
  return (uint64_t)product ^ (uint64_t)(product >> 64);
}

uint64_t mp_hash_bytes(const void *bytes, size_t count) {
  const unsigned char *p = (const unsigned char *)bytes;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ count;
  while (count >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = mix(h ^ w, 0xA0761D6478BD642Full);
    p += 8;
    count -= 8;
  }
  uint64_t tail = 0;
  for (size_t i = 0; i < count; i++) tail |= (uint64_t)p[i] << (8 * i);
  h = mix(h ^ tail, 0xE7037ED1A0B428DBull);
  return mix(h, 0x8EBC6AF09C88C6E3ull);
}

static bool grow_slots(mp_string_table *table) {
  size_t capacity = table->slots == NULL ? 64 : (table->slot_mask + 1) * 2;
  uint32_t *slots = calloc(capacity, sizeof *slots);
  if (slots == NULL) return false;
  size_t mask = capacity - 1;
  for (size_t i = 0; i < table->count; i++) {
    size_t s = table->entries[i].hash & mask;
    while (slots[s] != 0) s = (s + 1) & mask;
    slots[s] = (uint32_t)(i + 1);
  }
  free(table->slots);
  table->slots = slots;
  table->slot_mask = mask;
  return true;
}

static uint32_t *find_slot(const mp_string_table *table, const char *key, size_t key_bytes,
                           uint64_t hash) {
  size_t s = hash & table->slot_mask;
  for (;;) {
    uint32_t *slot = &table->slots[s];
    if (*slot == 0) return slot;
    const mp_string_entry *e = &table->entries[*slot - 1];
    if (e->hash == hash && e->key_bytes == key_bytes &&
        memcmp(table->keys + e->key_offset, key, key_bytes) == 0) {
      return slot;
    }
    s = (s + 1) & table->slot_mask;
  }
}

bool mp_string_table_put(mp_string_table *table, const char *key, size_t key_bytes,
                         uint32_t value) {
  if (key_bytes > UINT32_MAX) return false;
  /* Load factor at most one half keeps probe chains short. */
  if (table->slots == NULL || (table->count + 1) * 2 > table->slot_mask + 1) {
    if (!grow_slots(table)) return false;
  }
  uint64_t hash = mp_hash_bytes(key, key_bytes);
  uint32_t *slot = find_slot(table, key, key_bytes, hash);
  if (*slot != 0) {
    table->entries[*slot - 1].value = value;
    return true;
  }
  if (table->count == table->entry_capacity) {
    size_t capacity = table->entry_capacity == 0 ? 64 : table->entry_capacity * 2;
    mp_string_entry *entries = realloc(table->entries, capacity * sizeof *entries);
    if (entries == NULL) return false;
    table->entries = entries;
    table->entry_capacity = capacity;
  }
  if (table->keys_bytes + key_bytes + 1 > table->keys_capacity) {
    size_t capacity = table->keys_capacity == 0 ? 4096 : table->keys_capacity;
    while (capacity < table->keys_bytes + key_bytes + 1) capacity *= 2;
    char *keys = realloc(table->keys, capacity);
    if (keys == NULL) return false;
    table->keys = keys;
    table->keys_capacity = capacity;
  }
  memcpy(table->keys + table->keys_bytes, key, key_bytes);
  table->keys[table->keys_bytes + key_bytes] = '\0';
  mp_string_entry *e = &table->entries[table->count];
  e->hash = hash;
  e->key_offset = table->keys_bytes;
  e->key_bytes = (uint32_t)key_bytes;
  e->value = value;
  table->keys_bytes += key_bytes + 1;
  table->count++;
  *slot = (uint32_t)table->count;
  return true;
}

bool mp_string_table_get(const mp_string_table *table, const char *key, size_t key_bytes,
                         uint32_t *value) {
  if (table->slots == NULL) return false;
  uint32_t *slot = find_slot(table, key, key_bytes, mp_hash_bytes(key, key_bytes));
  if (*slot == 0) return false;
  *value = table->entries[*slot - 1].value;
  return true;
}

const char *mp_string_table_key(const mp_string_table *table, size_t entry) {
  return table->keys + table->entries[entry].key_offset;
}

void mp_string_table_free(mp_string_table *table) {
  free(table->slots);
  free(table->entries);
  free(table->keys);
  memset(table, 0, sizeof *table);
}
