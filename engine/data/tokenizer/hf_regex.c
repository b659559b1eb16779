/*
 * engine/data/tokenizer/hf_regex.c — Oniguruma patterns rewritten for and run on PCRE2
 * (hf_regex.h).
 */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/data/tokenizer/hf_regex.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/text_buffer.h"

struct mp_hf_regex {
  pcre2_code *code; /* NULL for a literal */
  bool jit;         /* code was JIT-compiled: pcre2_jit_match applies */
  char *literal;
  size_t literal_bytes;
};

struct mp_hf_regex_scratch {
  pcre2_match_data *match_data; /* one pair: only the whole match is read */
  pcre2_match_context *context;
  pcre2_jit_stack *jit_stack;
};

/* The Oniguruma classes, as items that go inside a PCRE2 class. */
static const char kSpaceItems[] = "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}";
static const char kWordItems[] = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
static const char kHexItems[] = "0-9a-fA-F";

static void append_class(mp_text_buffer *out, const char *items, bool negated, bool in_class) {
  if (!in_class) mp_text_buffer_append_text(out, negated ? "[^" : "[");
  mp_text_buffer_append_text(out, items);
  if (!in_class) mp_text_buffer_append_text(out, "]");
}

static bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Rewrites an Oniguruma (Ruby syntax) pattern for PCRE2; false with why when it cannot. */
static bool translate(const char *p, size_t n, mp_text_buffer *out, char *why, size_t why_bytes) {
  bool in_class = false;
  size_t class_start = 0; /* index just after the '[' (and '^') that opened the class */
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\\' && i + 1 < n) {
      char e = p[++i];
      switch (e) {
        case 's': case 'S': case 'w': case 'W': case 'h': case 'H': {
          bool negated = e == 'S' || e == 'W' || e == 'H';
          const char *items = (e == 's' || e == 'S') ? kSpaceItems
                              : (e == 'w' || e == 'W') ? kWordItems : kHexItems;
          if (negated && in_class) {
            snprintf(why, why_bytes, "\\%c inside a character class (at byte %zu) has no PCRE2 "
                     "equivalent", e, i - 1);
            return false;
          }
          append_class(out, items, negated, in_class);
          continue;
        }
        case 'b': case 'B':
          snprintf(why, why_bytes, "\\%c (at byte %zu): Oniguruma's word boundary differs from "
                   "PCRE2's", e, i - 1);
          return false;
        case 'u':
          if (i + 4 < n && is_hex(p[i + 1]) && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
              is_hex(p[i + 4])) {
            mp_text_buffer_append_text(out, "\\x{");
            mp_text_buffer_append(out, p + i + 1, 4);
            mp_text_buffer_append_text(out, "}");
            i += 4;
            continue;
          }
          break;
        default:
          break;
      }
      mp_text_buffer_append(out, p + i - 1, 2);
      continue;
    }
    if (in_class) {
      if (c == '[' && !(i + 1 < n && p[i + 1] == ':')) {
        snprintf(why, why_bytes, "a nested character class (at byte %zu) is not supported", i);
        return false;
      }
      if (c == '[') {
        /* A POSIX class [:name:] passes through whole. */
        const char *close = strstr(p + i, ":]");
        size_t end = close == NULL ? n : (size_t)(close - p) + 2;
        mp_text_buffer_append(out, p + i, end - i);
        i = end - 1;
        continue;
      }
      if (c == '&' && i + 1 < n && p[i + 1] == '&') {
        snprintf(why, why_bytes, "class intersection && (at byte %zu) is not supported", i);
        return false;
      }
      if (c == ']' && i > class_start) in_class = false;
      mp_text_buffer_append(out, &c, 1);
      continue;
    }
    if (c == '[') {
      in_class = true;
      mp_text_buffer_append(out, &c, 1);
      if (i + 1 < n && p[i + 1] == '^') {
        mp_text_buffer_append(out, "^", 1);
        i++;
      }
      class_start = i + 1;
      continue;
    }
    if (c == '(' && i + 1 < n && p[i + 1] == '?') {
      /* An option group (?imx-imx) or (?imx-imx:...): Ruby's m is PCRE2's s. */
      size_t j = i + 2;
      while (j < n && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) j++;
      if (j > i + 2 && j < n && (p[j] == ':' || p[j] == ')')) {
        mp_text_buffer_append(out, "(?", 2);
        for (size_t k = i + 2; k < j; k++) mp_text_buffer_append(out, p[k] == 'm' ? "s" : p + k, 1);
        i = j - 1;
        continue;
      }
    }
    mp_text_buffer_append(out, &c, 1);
  }
  return true;
}

bool mp_hf_regex_compile(const char *pattern, size_t pattern_bytes, bool literal,
                         mp_hf_regex **out, char *why, size_t why_bytes) {
  *out = NULL;
  if (pattern_bytes == 0) {
    snprintf(why, why_bytes, "an empty pattern matches everywhere; mpengine refuses it");
    return false;
  }
  mp_hf_regex *regex = calloc(1, sizeof *regex);
  if (regex == NULL) {
    snprintf(why, why_bytes, "out of memory");
    return false;
  }
  if (literal) {
    regex->literal = malloc(pattern_bytes);
    if (regex->literal == NULL) {
      free(regex);
      snprintf(why, why_bytes, "out of memory");
      return false;
    }
    memcpy(regex->literal, pattern, pattern_bytes);
    regex->literal_bytes = pattern_bytes;
    *out = regex;
    return true;
  }
  mp_text_buffer translated = {0};
  if (!translate(pattern, pattern_bytes, &translated, why, why_bytes)) {
    mp_text_buffer_free(&translated);
    free(regex);
    return false;
  }
  if (translated.failed) {
    mp_text_buffer_free(&translated);
    free(regex);
    snprintf(why, why_bytes, "out of memory");
    return false;
  }
  pcre2_compile_context *context = pcre2_compile_context_create(NULL);
  if (context != NULL) pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int code_error = 0;
  PCRE2_SIZE error_offset = 0;
  regex->code = pcre2_compile((PCRE2_SPTR)translated.data, translated.length,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &code_error, &error_offset,
                              context);
  pcre2_compile_context_free(context);
  if (regex->code == NULL) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(code_error, message, sizeof message);
    snprintf(why, why_bytes, "PCRE2 cannot compile it (as \"%s\"): %s at byte %zu",
             translated.data, (const char *)message, (size_t)error_offset);
    mp_text_buffer_free(&translated);
    free(regex);
    return false;
  }
  mp_text_buffer_free(&translated);
  regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
  *out = regex;
  return true;
}

void mp_hf_regex_free(mp_hf_regex *regex) {
  if (regex == NULL) return;
  pcre2_code_free(regex->code);
  free(regex->literal);
  free(regex);
}

mp_hf_regex_scratch *mp_hf_regex_scratch_create(void) {
  mp_hf_regex_scratch *scratch = calloc(1, sizeof *scratch);
  if (scratch == NULL) return NULL;
  scratch->match_data = pcre2_match_data_create(1, NULL);
  scratch->context = pcre2_match_context_create(NULL);
  /* Long runs of spaces under \s+(?!\S) backtrack deeply: a JIT stack far above the 32 KiB
   * default keeps them from failing. */
  scratch->jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
  if (scratch->match_data == NULL || scratch->context == NULL || scratch->jit_stack == NULL) {
    mp_hf_regex_scratch_free(scratch);
    return NULL;
  }
  pcre2_jit_stack_assign(scratch->context, NULL, scratch->jit_stack);
  return scratch;
}

void mp_hf_regex_scratch_free(mp_hf_regex_scratch *scratch) {
  if (scratch == NULL) return;
  pcre2_match_data_free(scratch->match_data);
  pcre2_match_context_free(scratch->context);
  pcre2_jit_stack_free(scratch->jit_stack);
  free(scratch);
}

bool mp_hf_match_list_push(mp_hf_match_list *list, size_t start, size_t end) {
  if (list->count == list->capacity) {
    size_t capacity = list->capacity == 0 ? 64 : list->capacity * 2;
    mp_hf_match *items = realloc(list->items, capacity * sizeof *items);
    if (items == NULL) return false;
    list->items = items;
    list->capacity = capacity;
  }
  list->items[list->count].start = start;
  list->items[list->count].end = end;
  list->count++;
  return true;
}

void mp_hf_match_list_free(mp_hf_match_list *list) {
  free(list->items);
  memset(list, 0, sizeof *list);
}

static mp_status out_of_memory(mp_error *err) {
  return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory while matching a pattern");
}

mp_status mp_hf_regex_find_all(const mp_hf_regex *regex, mp_hf_regex_scratch *scratch,
                               const char *text, size_t bytes, mp_hf_match_list *out,
                               mp_error *err) {
  out->count = 0;
  if (regex->code == NULL) {
    size_t at = 0;
    while (at + regex->literal_bytes <= bytes) {
      const char *found = memmem(text + at, bytes - at, regex->literal, regex->literal_bytes);
      if (found == NULL) break;
      size_t start = (size_t)(found - text);
      if (!mp_hf_match_list_push(out, start, start + regex->literal_bytes)) {
        return out_of_memory(err);
      }
      at = start + regex->literal_bytes;
    }
    return MP_OK;
  }
  size_t search_from = 0;
  bool matched_before = false;
  size_t last_match_end = 0;
  PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(scratch->match_data);
  while (search_from <= bytes) {
    int rc = regex->jit ? pcre2_jit_match(regex->code, (PCRE2_SPTR)text, bytes, search_from, 0,
                                          scratch->match_data, scratch->context)
                        : pcre2_match(regex->code, (PCRE2_SPTR)text, bytes, search_from,
                                      PCRE2_NO_UTF_CHECK, scratch->match_data, scratch->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: the regex engine (PCRE2) failed: %s",
                     (const char *)message);
    }
    size_t start = ovector[0], end = ovector[1];
    if (start == end && matched_before && last_match_end == end) {
      /* The onig crate's rule: no empty match right after the last match; step one character. */
      size_t step = 1;
      if (search_from < bytes) {
        unsigned char lead = (unsigned char)text[search_from];
        step = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      }
      search_from += step;
      continue;
    }
    search_from = end;
    last_match_end = end;
    matched_before = true;
    if (!mp_hf_match_list_push(out, start, end)) return out_of_memory(err);
  }
  return MP_OK;
}
