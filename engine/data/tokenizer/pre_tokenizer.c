/*
 * engine/data/tokenizer/pre_tokenizer.c — the pre-tokenizer chain (pre_tokenizer.h).
 *
 * Every split follows HF's NormalizedString::split: the pattern's matches and the gaps between
 * them become events covering the text in order, each marked match or not (invert flips the
 * marks); the behavior then merges or drops events, and empty pieces are dropped.
 */
#include "engine/data/tokenizer/pre_tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "engine/data/tokenizer/byte_level.h"
#include "engine/data/tokenizer/utf8.h"

typedef struct {
  size_t start, end; /* relative to the word */
  bool is_match;
} split_event;

typedef struct {
  split_event *items;
  size_t count;
} event_list;

static mp_status out_of_memory(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory while pre-tokenizing");
}

bool mp_word_list_push(mp_word_list *list, mp_word word) {
  if (list->count == list->capacity) {
    size_t capacity = list->capacity == 0 ? 64 : list->capacity * 2;
    mp_word *items = realloc(list->items, capacity * sizeof *items);
    if (items == NULL) return false;
    list->items = items;
    list->capacity = capacity;
  }
  list->items[list->count++] = word;
  return true;
}

void mp_word_list_free(mp_word_list *list) {
  free(list->items);
  memset(list, 0, sizeof *list);
}

static bool push_event(mp_pre_tokenizer_scratch *scratch, event_list *events, size_t start,
                       size_t end, bool is_match) {
  if (events->count == scratch->events_capacity) {
    size_t capacity = scratch->events_capacity == 0 ? 64 : scratch->events_capacity * 2;
    split_event *items = realloc(scratch->events, capacity * sizeof *items);
    if (items == NULL) return false;
    scratch->events = items;
    scratch->events_capacity = capacity;
    events->items = items;
  }
  events->items[events->count].start = start;
  events->items[events->count].end = end;
  events->items[events->count].is_match = is_match;
  events->count++;
  return true;
}

/* Matches (from scratch->matches) and the gaps between them, as HF's Pattern::find_matches. */
static bool events_from_matches(mp_pre_tokenizer_scratch *scratch, size_t bytes, bool invert,
                                event_list *events) {
  events->count = 0;
  events->items = scratch->events;
  if (bytes == 0) return push_event(scratch, events, 0, 0, invert);
  size_t previous = 0;
  for (size_t m = 0; m < scratch->matches.count; m++) {
    const mp_hf_match *match = &scratch->matches.items[m];
    if (previous != match->start && !push_event(scratch, events, previous, match->start, invert)) {
      return false;
    }
    if (!push_event(scratch, events, match->start, match->end, !invert)) return false;
    previous = match->end;
  }
  if (previous != bytes && !push_event(scratch, events, previous, bytes, invert)) return false;
  return true;
}

/* Every character for which is_delimiter holds is a match of its own (HF's Pattern for a
 * char predicate). */
typedef bool (*char_predicate)(uint32_t c, uint32_t character);

static bool is_character(uint32_t c, uint32_t character) { return c == character; }
static bool is_numeric(uint32_t c, uint32_t character) { return mp_unicode_is_numeric(c); }
static bool is_whitespace(uint32_t c, uint32_t character) { return mp_unicode_is_whitespace(c); }

static bool match_characters(mp_pre_tokenizer_scratch *scratch, const char *text, size_t bytes,
                             char_predicate predicate, uint32_t character) {
  scratch->matches.count = 0;
  size_t i = 0;
  while (i < bytes) {
    size_t length;
    uint32_t c = mp_utf8_decode(text + i, bytes - i, &length);
    if (predicate(c, character) && !mp_hf_match_list_push(&scratch->matches, i, i + length)) {
      return false;
    }
    i += length;
  }
  return true;
}

/* Applies behavior to the events (in place) — HF's NormalizedString::split. */
static void apply_behavior(event_list *events, mp_split_behavior behavior) {
  split_event *e = events->items;
  size_t n = events->count, kept = 0;
  bool previous_match = false;
  switch (behavior) {
    case MP_SPLIT_ISOLATED:
      return;
    case MP_SPLIT_REMOVED:
      for (size_t i = 0; i < n; i++) {
        if (!e[i].is_match) e[kept++] = e[i];
      }
      break;
    case MP_SPLIT_CONTIGUOUS:
      for (size_t i = 0; i < n; i++) {
        if (e[i].is_match == previous_match && kept > 0) {
          e[kept - 1].end = e[i].end;
        } else {
          e[kept++] = e[i];
        }
        previous_match = e[i].is_match;
      }
      break;
    case MP_SPLIT_MERGED_WITH_PREVIOUS:
      for (size_t i = 0; i < n; i++) {
        bool is_match = e[i].is_match;
        if (is_match && !previous_match && kept > 0) {
          e[kept - 1].end = e[i].end;
        } else {
          e[kept++] = e[i];
        }
        previous_match = is_match;
      }
      break;
    case MP_SPLIT_MERGED_WITH_NEXT: {
      /* Folded from the right, written from the right end of the same array. */
      size_t write = n;
      for (size_t i = n; i-- > 0;) {
        bool is_match = e[i].is_match;
        if (is_match && !previous_match && write < n) {
          e[write].start = e[i].start;
        } else {
          e[--write] = e[i];
        }
        previous_match = is_match;
      }
      kept = n - write;
      memmove(e, e + write, kept * sizeof *e);
      break;
    }
  }
  events->count = kept;
}

/* Appends the non-empty events of word as words to out. */
static bool emit(const event_list *events, const mp_word *word, mp_word_list *out) {
  for (size_t i = 0; i < events->count; i++) {
    const split_event *e = &events->items[i];
    if (e->end == e->start) continue;
    mp_word piece = {word->offset + e->start, e->end - e->start, false,
                     word->at_input_start && e->start == 0};
    if (!mp_word_list_push(out, piece)) return false;
  }
  return true;
}

bool mp_arena_reserve(mp_text_buffer *arena, size_t extra) {
  if (arena->failed) return false;
  if (arena->length + extra + 1 <= arena->capacity) return true;
  size_t capacity = arena->capacity ? arena->capacity : 256;
  while (arena->length + extra + 1 > capacity) capacity *= 2;
  char *grown = realloc(arena->data, capacity);
  if (grown == NULL) {
    arena->failed = true;
    return false;
  }
  arena->data = grown;
  arena->capacity = capacity;
  return true;
}

void mp_word_write_byte_level(mp_text_buffer *arena, mp_word *word) {
  if (!mp_arena_reserve(arena, 2 * word->bytes)) return;
  size_t offset = arena->length;
  for (size_t i = 0; i < word->bytes; i++) {
    char utf8[2];
    uint8_t b = (uint8_t)arena->data[word->offset + i];
    mp_text_buffer_append(arena, utf8, mp_byte_level_utf8(b, utf8));
  }
  word->offset = offset;
  word->bytes = arena->length - offset;
  word->byte_level = false;
}

/* Writes prefix + text of word (with every `from` character replaced by `to`) into the arena. */
static void write_metaspace(mp_text_buffer *arena, mp_word *word, bool prepend, const char *rep,
                            size_t rep_bytes) {
  /* Room first: the text is read from the arena while the arena is appended to. */
  if (!mp_arena_reserve(arena, (word->bytes + 1) * (rep_bytes > 1 ? rep_bytes : 1))) return;
  size_t offset = arena->length;
  if (prepend) mp_text_buffer_append(arena, rep, rep_bytes);
  size_t start = word->offset, end = word->offset + word->bytes;
  size_t run = start;
  for (size_t i = start; i < end; i++) {
    if (arena->data[i] == ' ') {
      mp_text_buffer_append(arena, arena->data + run, i - run);
      mp_text_buffer_append(arena, rep, rep_bytes);
      run = i + 1;
    }
  }
  mp_text_buffer_append(arena, arena->data + run, end - run);
  word->offset = offset;
  word->bytes = arena->length - offset;
}

static mp_status split_word(const mp_pre_tokenize_step *step, mp_pre_tokenizer_scratch *scratch,
                            mp_text_buffer *arena, mp_word word, mp_word_list *out,
                            mp_error *err) {
  event_list events = {scratch->events, 0};
  const char *text = arena->data + word.offset;
  switch (step->kind) {
    case MP_PRE_SPLIT:
      MP_TRY(mp_hf_regex_find_all(step->pattern, scratch->regex, text, word.bytes,
                                  &scratch->matches, err));
      if (!events_from_matches(scratch, word.bytes, step->invert, &events)) {
        return out_of_memory(err);
      }
      apply_behavior(&events, step->behavior);
      break;
    case MP_PRE_BYTE_LEVEL:
      if (step->add_prefix_space && text[0] != ' ') {
        if (!mp_arena_reserve(arena, word.bytes + 1)) return out_of_memory(err);
        size_t offset = arena->length;
        mp_text_buffer_append(arena, " ", 1);
        mp_text_buffer_append(arena, arena->data + word.offset, word.bytes);
        if (arena->failed) return out_of_memory(err);
        word.offset = offset;
        word.bytes += 1;
        text = arena->data + word.offset;
      }
      if (step->pattern == NULL) {
        word.byte_level = true;
        if (!mp_word_list_push(out, word)) return out_of_memory(err);
        return MP_OK;
      }
      MP_TRY(mp_hf_regex_find_all(step->pattern, scratch->regex, text, word.bytes,
                                  &scratch->matches, err));
      if (!events_from_matches(scratch, word.bytes, false, &events)) return out_of_memory(err);
      break;
    case MP_PRE_METASPACE: {
      char rep[4];
      size_t rep_bytes = mp_utf8_encode(step->character, rep);
      bool starts_with_rep = word.bytes >= rep_bytes && memcmp(text, rep, rep_bytes) == 0;
      /* A leading space becomes the replacement too, so it counts as "starts with" it. */
      if (!starts_with_rep && text[0] == ' ' && rep_bytes > 0) starts_with_rep = true;
      bool prepend = (step->prepend_scheme == MP_PREPEND_ALWAYS && !starts_with_rep) ||
                     (step->prepend_scheme == MP_PREPEND_FIRST && !starts_with_rep &&
                      word.at_input_start);
      if (prepend || memchr(text, ' ', word.bytes) != NULL) {
        write_metaspace(arena, &word, prepend, rep, rep_bytes);
        if (arena->failed) return out_of_memory(err);
        text = arena->data + word.offset;
      }
      if (!step->split) {
        if (!mp_word_list_push(out, word)) return out_of_memory(err);
        return MP_OK;
      }
      if (!match_characters(scratch, text, word.bytes, is_character, step->character) ||
          !events_from_matches(scratch, word.bytes, false, &events)) {
        return out_of_memory(err);
      }
      apply_behavior(&events, MP_SPLIT_MERGED_WITH_NEXT);
      break;
    }
    case MP_PRE_DIGITS:
    case MP_PRE_WHITESPACE_SPLIT:
    case MP_PRE_CHAR_DELIMITER: {
      char_predicate predicate = step->kind == MP_PRE_DIGITS          ? is_numeric
                                 : step->kind == MP_PRE_WHITESPACE_SPLIT ? is_whitespace
                                                                        : is_character;
      if (!match_characters(scratch, text, word.bytes, predicate, step->character) ||
          !events_from_matches(scratch, word.bytes, false, &events)) {
        return out_of_memory(err);
      }
      apply_behavior(&events, step->kind == MP_PRE_DIGITS
                                  ? (step->individual_digits ? MP_SPLIT_ISOLATED
                                                             : MP_SPLIT_CONTIGUOUS)
                                  : MP_SPLIT_REMOVED);
      break;
    }
  }
  size_t first = out->count;
  if (!emit(&events, &word, out)) return out_of_memory(err);
  if (step->kind == MP_PRE_BYTE_LEVEL) {
    for (size_t i = first; i < out->count; i++) out->items[i].byte_level = true;
  }
  return MP_OK;
}

mp_status mp_pre_tokenizer_run(const mp_pre_tokenizer *pre_tokenizer,
                               mp_pre_tokenizer_scratch *scratch, mp_text_buffer *arena,
                               mp_word_list *words, mp_error *err) {
  for (size_t s = 0; s < pre_tokenizer->count; s++) {
    const mp_pre_tokenize_step *step = &pre_tokenizer->steps[s];
    scratch->spare.count = 0;
    for (size_t w = 0; w < words->count; w++) {
      mp_word word = words->items[w];
      if (word.byte_level) {
        mp_word_write_byte_level(arena, &word);
        if (arena->failed) return out_of_memory(err);
      }
      MP_TRY(split_word(step, scratch, arena, word, &scratch->spare, err));
    }
    mp_word_list swap = *words;
    *words = scratch->spare;
    scratch->spare = swap;
  }
  return MP_OK;
}

void mp_pre_tokenizer_scratch_free(mp_pre_tokenizer_scratch *scratch) {
  mp_hf_regex_scratch_free(scratch->regex);
  mp_hf_match_list_free(&scratch->matches);
  mp_word_list_free(&scratch->spare);
  free(scratch->events);
  memset(scratch, 0, sizeof *scratch);
}

void mp_pre_tokenizer_free(mp_pre_tokenizer *pre_tokenizer) {
  for (size_t s = 0; s < pre_tokenizer->count; s++) mp_hf_regex_free(pre_tokenizer->steps[s].pattern);
  free(pre_tokenizer->steps);
  memset(pre_tokenizer, 0, sizeof *pre_tokenizer);
}
