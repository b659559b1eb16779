/*
 * engine/data/tokenizer/hf_regex.h — the patterns of tokenizer.json (Split, Replace, ByteLevel's
 * GPT-2 pattern) found the way Hugging Face finds them, on PCRE2.
 *
 * `tokenizers` compiles these patterns with Oniguruma (Ruby syntax) and walks them with the onig
 * crate's find_iter. PCRE2 (UTF, UCP, JIT) runs the same backtracking, leftmost-first search; where
 * the two syntaxes give an escape different meanings the pattern is rewritten before compiling:
 *   \s  -> [\t\n\x0B\f\r\x{85}\p{Z}]   (Oniguruma's Unicode space; PCRE2's also holds U+180E)
 *   \w  -> [\p{L}\p{M}\p{Nd}\p{Pc}]     (Oniguruma's Unicode word; PCRE2 10.42 lacks M and Pc)
 *   \h  -> [0-9a-fA-F]                 (Ruby's hex digit; PCRE2's is horizontal space)
 *   \uHHHH -> \x{HHHH}; (?m) -> (?s) (Ruby's m is dot-all); ^ and $ match at lines (MULTILINE)
 * and what has no faithful rewrite (negated \S \W \H inside a class, \b, class intersection
 * `&&`, nested classes) is refused with the reason. A pattern given as a plain string ("String" in
 * tokenizer.json, escaped by HF) is searched as a literal.
 *
 * A compiled pattern is immutable and shared; the match data and JIT stack live in an
 * mp_hf_regex_scratch, one per thread.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_HF_REGEX_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_HF_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_hf_regex mp_hf_regex;
typedef struct mp_hf_regex_scratch mp_hf_regex_scratch;

/* One match: text[start .. end). */
typedef struct {
  size_t start, end;
} mp_hf_match;

typedef struct {
  mp_hf_match *items;
  size_t count, capacity;
} mp_hf_match_list;

/* Compiles `pattern` (pattern_bytes long): an Oniguruma regex, or with literal a plain string.
 * On failure returns false and writes why to why (why_bytes). */
bool mp_hf_regex_compile(const char *pattern, size_t pattern_bytes, bool literal,
                         mp_hf_regex **out, char *why, size_t why_bytes);
void mp_hf_regex_free(mp_hf_regex *regex);

mp_hf_regex_scratch *mp_hf_regex_scratch_create(void);
void mp_hf_regex_scratch_free(mp_hf_regex_scratch *scratch);

/* All matches of regex in text[0 .. bytes) (valid UTF-8), in order, as the onig crate's find_iter
 * yields them (an empty match right where the previous one ended is skipped). Appends to *out
 * (cleared first). MP_ERR_RUNTIME when the regex engine fails or memory runs out. */
mp_status mp_hf_regex_find_all(const mp_hf_regex *regex, mp_hf_regex_scratch *scratch,
                               const char *text, size_t bytes, mp_hf_match_list *out,
                               mp_error *err);

/* Appends one match to a list; false when memory runs out. */
bool mp_hf_match_list_push(mp_hf_match_list *list, size_t start, size_t end);
void mp_hf_match_list_free(mp_hf_match_list *list);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_HF_REGEX_H */
