/*
 * engine/data/tokenizer/tokenizer_json.c — loading a Hugging Face tokenizer.json (tokenizer.h):
 * every part is read into the structures the encoder runs, and every part or option whose ids
 * mpengine would not reproduce is refused here, naming the file and the JSON path.
 *
 * Like `tokenizers`, keys that a part does not use are ignored (they cannot change HF's ids
 * either); options that exist and would change the ids are read or refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json_reader.h"
#include "engine/data/tokenizer/tokenizer_internal.h"
#include "engine/data/tokenizer/utf8.h"

/* ---- reading helpers ---------------------------------------------------------------------- */

typedef struct {
  const char *source; /* the file, heading every message */
  mp_error *err;
} loader;

static mp_status out_of_memory(const loader *l) {
  return mp_fail(l->err, MP_ERR_RUNTIME, "%s: out of memory loading the tokenizer", l->source);
}

static mp_status not_implemented(const loader *l, const char *path, const char *value,
                                 const char *implemented) {
  return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: \"%s\" is not implemented (mpengine implements %s)",
                 l->source, path, value, implemented);
}

static mp_status wrong_type(const loader *l, const char *path, const char *expected,
                            const cJSON *item) {
  return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: expected %s, got %s", l->source, path, expected,
                 mp_json_type_name(item));
}

static bool is_null(const cJSON *item) { return item == NULL || cJSON_IsNull(item); }

/* An object's "type": a non-empty string. */
static mp_status read_type(const loader *l, const cJSON *object, const char *path,
                           const char **out) {
  if (!cJSON_IsObject(object)) return wrong_type(l, path, "an object", object);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(object, "type");
  char type_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(type_path, sizeof type_path, path, "type");
  if (!cJSON_IsString(type)) return wrong_type(l, type_path, "a string", type);
  *out = type->valuestring;
  return MP_OK;
}

/* A boolean that may be absent or null (HF's Option<bool>). */
static mp_status read_bool(const loader *l, const cJSON *object, const char *path,
                           const char *key, bool default_value, bool *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  *out = default_value;
  if (is_null(item)) return MP_OK;
  if (!cJSON_IsBool(item)) {
    char item_path[MP_JSON_PATH_BYTES];
    mp_json_path_key(item_path, sizeof item_path, path, key);
    return wrong_type(l, item_path, "true or false", item);
  }
  *out = cJSON_IsTrue(item);
  return MP_OK;
}

/* A string that may be empty; NULL when absent or null and not required. */
static mp_status read_string(const loader *l, const cJSON *object, const char *path,
                             const char *key, bool required, const char **out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  *out = NULL;
  char item_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(item_path, sizeof item_path, path, key);
  if (is_null(item)) {
    if (!required) return MP_OK;
    return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: missing; expected a string", l->source,
                   item_path);
  }
  if (!cJSON_IsString(item)) return wrong_type(l, item_path, "a string", item);
  *out = item->valuestring;
  return MP_OK;
}

/* A non-negative whole number below 2^32. */
static mp_status read_u32(const loader *l, const cJSON *item, const char *path, uint32_t *out) {
  if (!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble > 4294967295.0 ||
      item->valuedouble != (double)(uint64_t)item->valuedouble) {
    return wrong_type(l, path, "a whole number from 0 to 4294967295", item);
  }
  *out = (uint32_t)item->valuedouble;
  return MP_OK;
}

/* A string of exactly one character (Rust's char). */
static mp_status read_char(const loader *l, const cJSON *object, const char *path,
                           const char *key, uint32_t *out) {
  const char *text;
  MP_TRY(read_string(l, object, path, key, true, &text));
  size_t bytes = strlen(text), length = 0;
  if (bytes > 0 && mp_utf8_valid_prefix(text, bytes) == bytes) mp_utf8_decode(text, bytes, &length);
  if (bytes == 0 || length != bytes) {
    char item_path[MP_JSON_PATH_BYTES];
    mp_json_path_key(item_path, sizeof item_path, path, key);
    return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: expected one character, got \"%s\"", l->source,
                   item_path, text);
  }
  *out = mp_utf8_decode(text, bytes, &length);
  return MP_OK;
}

static char *copy_text(const char *text) {
  size_t bytes = strlen(text);
  char *copy = malloc(bytes + 1);
  if (copy != NULL) memcpy(copy, text, bytes + 1);
  return copy;
}

/* A pattern object {"String": "..."} or {"Regex": "..."} under key. */
static mp_status read_pattern(const loader *l, const cJSON *object, const char *path,
                              mp_hf_regex **out) {
  const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(object, "pattern");
  char pattern_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(pattern_path, sizeof pattern_path, path, "pattern");
  if (!cJSON_IsObject(pattern)) return wrong_type(l, pattern_path, "an object", pattern);
  const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
  const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
  const cJSON *chosen = string != NULL ? string : regex;
  char chosen_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(chosen_path, sizeof chosen_path, pattern_path, string != NULL ? "String" : "Regex");
  if (chosen == NULL) {
    return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: expected {\"String\": ...} or {\"Regex\": ...}",
                   l->source, pattern_path);
  }
  if (!cJSON_IsString(chosen)) return wrong_type(l, chosen_path, "a string", chosen);
  char why[512];
  if (!mp_hf_regex_compile(chosen->valuestring, strlen(chosen->valuestring), string != NULL, out,
                           why, sizeof why)) {
    return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: the pattern \"%s\" is not supported: %s",
                   l->source, chosen_path, chosen->valuestring, why);
  }
  return MP_OK;
}

/* Metaspace's prepend_scheme, with the legacy add_prefix_space (HF's rules). */
static mp_status read_prepend_scheme(const loader *l, const cJSON *object, const char *path,
                                     mp_prepend_scheme *out) {
  static const char *const kSchemes[] = {"always", "first", "never"};
  const char *scheme;
  MP_TRY(read_string(l, object, path, "prepend_scheme", false, &scheme));
  *out = MP_PREPEND_ALWAYS;
  if (scheme != NULL) {
    bool found = false;
    for (int i = 0; i < 3; i++) {
      if (strcmp(scheme, kSchemes[i]) == 0) {
        *out = (mp_prepend_scheme)i;
        found = true;
      }
    }
    if (!found) {
      char scheme_path[MP_JSON_PATH_BYTES];
      mp_json_path_key(scheme_path, sizeof scheme_path, path, "prepend_scheme");
      return mp_fail(l->err, MP_ERR_INPUT,
                     "%s: %s: \"%s\" is not a prepend scheme (expected always, first or never)",
                     l->source, scheme_path, scheme);
    }
  }
  const cJSON *add_prefix_space = cJSON_GetObjectItemCaseSensitive(object, "add_prefix_space");
  if (cJSON_IsFalse(add_prefix_space)) {
    if (*out != MP_PREPEND_NEVER) {
      return mp_fail(l->err, MP_ERR_INPUT,
                     "%s: %s: add_prefix_space false does not match prepend_scheme (Hugging Face "
                     "refuses it too); set prepend_scheme to \"never\"",
                     l->source, path);
    }
  }
  return MP_OK;
}

/* Grows an array of steps by one (zeroed); NULL when memory runs out. */
static void *add_step(void **steps, size_t *count, size_t step_bytes) {
  void *grown = realloc(*steps, (*count + 1) * step_bytes);
  if (grown == NULL) return NULL;
  *steps = grown;
  void *step = (char *)grown + *count * step_bytes;
  memset(step, 0, step_bytes);
  (*count)++;
  return step;
}

/* Calls read_one on each element of object[key] (an array), with its path. */
static mp_status read_sequence(const loader *l, const cJSON *object, const char *path,
                               const char *key, void *target,
                               mp_status (*read_one)(const loader *, const cJSON *, const char *,
                                                     void *)) {
  const cJSON *items = cJSON_GetObjectItemCaseSensitive(object, key);
  char items_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(items_path, sizeof items_path, path, key);
  if (!cJSON_IsArray(items)) return wrong_type(l, items_path, "an array", items);
  int index = 0;
  for (const cJSON *item = items->child; item != NULL; item = item->next, index++) {
    char item_path[MP_JSON_PATH_BYTES];
    mp_json_path_index(item_path, sizeof item_path, items_path, index);
    MP_TRY(read_one(l, item, item_path, target));
  }
  return MP_OK;
}

/* ---- normalizer --------------------------------------------------------------------------- */

static const char kNormalizers[] =
    "NFC, NFD, NFKC, NFKD, Prepend, Replace, Lowercase, Strip, ByteLevel and Sequence";

static mp_status read_normalizer(const loader *l, const cJSON *item, const char *path,
                                 void *target) {
  mp_normalizer *normalizer = target;
  const char *type;
  MP_TRY(read_type(l, item, path, &type));
  if (strcmp(type, "Sequence") == 0) {
    return read_sequence(l, item, path, "normalizers", normalizer, read_normalizer);
  }
  static const char *const kSimple[] = {"NFC", "NFD", "NFKC", "NFKD"};
  static const mp_normalize_kind kSimpleKinds[] = {MP_NORMALIZE_NFC, MP_NORMALIZE_NFD,
                                                   MP_NORMALIZE_NFKC, MP_NORMALIZE_NFKD};
  int simple = -1;
  for (int i = 0; i < 4; i++) {
    if (strcmp(type, kSimple[i]) == 0) simple = i;
  }
  bool known = simple >= 0 || strcmp(type, "Prepend") == 0 || strcmp(type, "Replace") == 0 ||
               strcmp(type, "Lowercase") == 0 || strcmp(type, "Strip") == 0 ||
               strcmp(type, "ByteLevel") == 0;
  char type_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(type_path, sizeof type_path, path, "type");
  if (!known) return not_implemented(l, type_path, type, kNormalizers);
  mp_normalize_step *step = add_step((void **)&normalizer->steps, &normalizer->count, sizeof *step);
  if (step == NULL) return out_of_memory(l);
  if (simple >= 0) {
    step->kind = kSimpleKinds[simple];
  } else if (strcmp(type, "Prepend") == 0) {
    const char *prepend;
    step->kind = MP_NORMALIZE_PREPEND;
    MP_TRY(read_string(l, item, path, "prepend", true, &prepend));
    if ((step->text = copy_text(prepend)) == NULL) return out_of_memory(l);
    step->text_bytes = strlen(prepend);
  } else if (strcmp(type, "Replace") == 0) {
    const char *content;
    step->kind = MP_NORMALIZE_REPLACE;
    MP_TRY(read_pattern(l, item, path, &step->pattern));
    MP_TRY(read_string(l, item, path, "content", true, &content));
    if ((step->text = copy_text(content)) == NULL) return out_of_memory(l);
    step->text_bytes = strlen(content);
  } else if (strcmp(type, "Lowercase") == 0) {
    step->kind = MP_NORMALIZE_LOWERCASE;
  } else if (strcmp(type, "Strip") == 0) {
    step->kind = MP_NORMALIZE_STRIP;
    MP_TRY(read_bool(l, item, path, "strip_left", false, &step->strip_left));
    MP_TRY(read_bool(l, item, path, "strip_right", false, &step->strip_right));
  } else {
    step->kind = MP_NORMALIZE_BYTE_LEVEL;
  }
  return MP_OK;
}

/* ---- pre-tokenizer ------------------------------------------------------------------------ */

static const char kPreTokenizers[] =
    "Split, ByteLevel, Metaspace, Digits, WhitespaceSplit, CharDelimiterSplit and Sequence";

/* The pattern ByteLevel splits with when use_regex (GPT-2's). */
static const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static mp_status read_pre_tokenizer(const loader *l, const cJSON *item, const char *path,
                                    void *target) {
  mp_pre_tokenizer *pre = target;
  const char *type;
  MP_TRY(read_type(l, item, path, &type));
  if (strcmp(type, "Sequence") == 0) {
    return read_sequence(l, item, path, "pretokenizers", pre, read_pre_tokenizer);
  }
  static const char *const kTypes[] = {"Split",  "ByteLevel",       "Metaspace",
                                       "Digits", "WhitespaceSplit", "CharDelimiterSplit"};
  static const mp_pre_tokenize_kind kKinds[] = {MP_PRE_SPLIT,  MP_PRE_BYTE_LEVEL,
                                                MP_PRE_METASPACE, MP_PRE_DIGITS,
                                                MP_PRE_WHITESPACE_SPLIT, MP_PRE_CHAR_DELIMITER};
  int kind = -1;
  for (int i = 0; i < 6; i++) {
    if (strcmp(type, kTypes[i]) == 0) kind = i;
  }
  char type_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(type_path, sizeof type_path, path, "type");
  if (kind < 0) return not_implemented(l, type_path, type, kPreTokenizers);
  mp_pre_tokenize_step *step = add_step((void **)&pre->steps, &pre->count, sizeof *step);
  if (step == NULL) return out_of_memory(l);
  step->kind = kKinds[kind];
  switch (step->kind) {
    case MP_PRE_SPLIT: {
      static const char *const kBehaviors[] = {"Removed", "Isolated", "MergedWithPrevious",
                                               "MergedWithNext", "Contiguous"};
      const char *behavior;
      MP_TRY(read_pattern(l, item, path, &step->pattern));
      MP_TRY(read_string(l, item, path, "behavior", true, &behavior));
      int found = -1;
      for (int i = 0; i < 5; i++) {
        if (strcmp(behavior, kBehaviors[i]) == 0) found = i;
      }
      if (found < 0) {
        char behavior_path[MP_JSON_PATH_BYTES];
        mp_json_path_key(behavior_path, sizeof behavior_path, path, "behavior");
        return mp_fail(l->err, MP_ERR_INPUT,
                       "%s: %s: \"%s\" is not a split behavior (expected Removed, Isolated, "
                       "MergedWithPrevious, MergedWithNext or Contiguous)",
                       l->source, behavior_path, behavior);
      }
      step->behavior = (mp_split_behavior)found;
      MP_TRY(read_bool(l, item, path, "invert", false, &step->invert));
      break;
    }
    case MP_PRE_BYTE_LEVEL: {
      bool use_regex;
      MP_TRY(read_bool(l, item, path, "add_prefix_space", true, &step->add_prefix_space));
      MP_TRY(read_bool(l, item, path, "use_regex", true, &use_regex));
      if (use_regex) {
        char why[256];
        if (!mp_hf_regex_compile(kGpt2Pattern, strlen(kGpt2Pattern), false, &step->pattern, why,
                                 sizeof why)) {
          return mp_fail(l->err, MP_ERR_RUNTIME, "%s: %s: cannot compile GPT-2's pattern: %s",
                         l->source, path, why);
        }
      }
      break;
    }
    case MP_PRE_METASPACE:
      MP_TRY(read_char(l, item, path, "replacement", &step->character));
      MP_TRY(read_prepend_scheme(l, item, path, &step->prepend_scheme));
      MP_TRY(read_bool(l, item, path, "split", true, &step->split));
      break;
    case MP_PRE_DIGITS:
      MP_TRY(read_bool(l, item, path, "individual_digits", false, &step->individual_digits));
      break;
    case MP_PRE_WHITESPACE_SPLIT:
      break;
    case MP_PRE_CHAR_DELIMITER:
      MP_TRY(read_char(l, item, path, "delimiter", &step->character));
      break;
  }
  return MP_OK;
}

/* ---- model -------------------------------------------------------------------------------- */

/* Looks a merge's token up; fails naming it (HF refuses such a file too). */
static mp_status merge_token_id(const loader *l, const mp_bpe *bpe, const char *path,
                                const char *token, size_t bytes, uint32_t *id) {
  if (mp_string_table_get(&bpe->vocab, token, bytes, id)) return MP_OK;
  return mp_fail(l->err, MP_ERR_INPUT, "%s: %s: the token \"%.*s\" is not in $.model.vocab",
                 l->source, path, (int)bytes, token);
}

static mp_status read_merges(const loader *l, const cJSON *model, mp_bpe *bpe) {
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  if (!cJSON_IsArray(merges)) return wrong_type(l, "$.model.merges", "an array", merges);
  if (!mp_bpe_reserve_merges(bpe, (size_t)cJSON_GetArraySize(merges))) return out_of_memory(l);
  size_t prefix_bytes =
      bpe->continuing_subword_prefix ? strlen(bpe->continuing_subword_prefix) : 0;
  char *joined = NULL;
  size_t joined_capacity = 0;
  uint32_t rank = 0;
  mp_status status = MP_OK;
  for (const cJSON *merge = merges->child; merge != NULL; merge = merge->next, rank++) {
    char path[MP_JSON_PATH_BYTES];
    mp_json_path_index(path, sizeof path, "$.model.merges", (int)rank);
    const char *left, *right;
    size_t left_bytes, right_bytes;
    if (cJSON_IsString(merge)) {
      /* HF's legacy form: exactly two parts around one space. */
      const char *space = strchr(merge->valuestring, ' ');
      if (space == NULL || strchr(space + 1, ' ') != NULL) {
        status = mp_fail(l->err, MP_ERR_INPUT,
                         "%s: %s: \"%s\" is not a merge (two tokens separated by one space)",
                         l->source, path, merge->valuestring);
        break;
      }
      left = merge->valuestring;
      left_bytes = (size_t)(space - left);
      right = space + 1;
      right_bytes = strlen(right);
    } else if (cJSON_IsArray(merge) && cJSON_GetArraySize(merge) == 2 &&
               cJSON_IsString(merge->child) && cJSON_IsString(merge->child->next)) {
      left = merge->child->valuestring;
      left_bytes = strlen(left);
      right = merge->child->next->valuestring;
      right_bytes = strlen(right);
    } else {
      status = wrong_type(l, path, "a merge (\"a b\" or [\"a\", \"b\"])", merge);
      break;
    }
    uint32_t left_id, right_id, merged_id;
    status = merge_token_id(l, bpe, path, left, left_bytes, &left_id);
    if (status == MP_OK) status = merge_token_id(l, bpe, path, right, right_bytes, &right_id);
    if (status != MP_OK) break;
    if (right_bytes < prefix_bytes) {
      status = mp_fail(l->err, MP_ERR_INPUT,
                       "%s: %s: \"%s\" is shorter than the continuing_subword_prefix", l->source,
                       path, right);
      break;
    }
    size_t merged_bytes = left_bytes + right_bytes - prefix_bytes;
    if (merged_bytes + 1 > joined_capacity) {
      joined_capacity = 2 * (merged_bytes + 1);
      char *grown = realloc(joined, joined_capacity);
      if (grown == NULL) {
        status = out_of_memory(l);
        break;
      }
      joined = grown;
    }
    memcpy(joined, left, left_bytes);
    memcpy(joined + left_bytes, right + prefix_bytes, right_bytes - prefix_bytes);
    status = merge_token_id(l, bpe, path, joined, merged_bytes, &merged_id);
    if (status != MP_OK) break;
    if (!mp_bpe_add_merge(bpe, left_id, right_id, rank, merged_id)) {
      status = out_of_memory(l);
      break;
    }
  }
  free(joined);
  return status;
}

static mp_status read_model(const loader *l, const cJSON *root, mp_bpe *bpe) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!cJSON_IsObject(model)) return wrong_type(l, "$.model", "an object", model);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
  if (type == NULL) {
    /* Old files leave the type out; HF then takes a model with merges as BPE. */
    if (cJSON_GetObjectItemCaseSensitive(model, "merges") == NULL) {
      return mp_fail(l->err, MP_ERR_INPUT,
                     "%s: $.model: no \"type\" and no \"merges\": not a BPE model (mpengine "
                     "implements BPE)", l->source);
    }
  } else if (!cJSON_IsString(type)) {
    return wrong_type(l, "$.model.type", "a string", type);
  } else if (strcmp(type->valuestring, "BPE") != 0) {
    return not_implemented(l, "$.model.type", type->valuestring, "BPE");
  }
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (!is_null(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0)) {
    if (cJSON_IsNumber(dropout)) {
      return mp_fail(l->err, MP_ERR_INPUT,
                     "%s: $.model.dropout: %g is not implemented (BPE dropout makes the ids "
                     "random); set it to null", l->source, dropout->valuedouble);
    }
    return wrong_type(l, "$.model.dropout", "null or a number", dropout);
  }
  const char *unk, *prefix, *suffix;
  MP_TRY(read_string(l, model, "$.model", "unk_token", false, &unk));
  MP_TRY(read_string(l, model, "$.model", "continuing_subword_prefix", false, &prefix));
  MP_TRY(read_string(l, model, "$.model", "end_of_word_suffix", false, &suffix));
  MP_TRY(read_bool(l, model, "$.model", "fuse_unk", false, &bpe->fuse_unk));
  MP_TRY(read_bool(l, model, "$.model", "byte_fallback", false, &bpe->byte_fallback));
  MP_TRY(read_bool(l, model, "$.model", "ignore_merges", false, &bpe->ignore_merges));
  if ((unk != NULL && (bpe->unk_token = copy_text(unk)) == NULL) ||
      (prefix != NULL && prefix[0] != '\0' &&
       (bpe->continuing_subword_prefix = copy_text(prefix)) == NULL) ||
      (suffix != NULL && suffix[0] != '\0' && (bpe->end_of_word_suffix = copy_text(suffix)) == NULL)) {
    return out_of_memory(l);
  }
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  if (!cJSON_IsObject(vocab)) return wrong_type(l, "$.model.vocab", "an object", vocab);
  for (const cJSON *entry = vocab->child; entry != NULL; entry = entry->next) {
    char path[MP_JSON_PATH_BYTES];
    snprintf(path, sizeof path, "$.model.vocab[\"%.200s\"]", entry->string);
    uint32_t id;
    MP_TRY(read_u32(l, entry, path, &id));
    if (!mp_string_table_put(&bpe->vocab, entry->string, strlen(entry->string), id)) {
      return out_of_memory(l);
    }
  }
  MP_TRY(read_merges(l, model, bpe));
  if (!mp_bpe_finish(bpe)) return out_of_memory(l);
  return MP_OK;
}

/* ---- added tokens ------------------------------------------------------------------------- */

typedef struct {
  mp_added_token *items;
  size_t count;
} token_array;

static bool same_token(const mp_added_token *a, const mp_added_token *b) {
  return strcmp(a->content, b->content) == 0 && a->single_word == b->single_word &&
         a->lstrip == b->lstrip && a->rstrip == b->rstrip && a->normalized == b->normalized &&
         a->special == b->special;
}

static bool push_token(token_array *array, const mp_added_token *token) {
  mp_added_token *grown = realloc(array->items, (array->count + 1) * sizeof *grown);
  if (grown == NULL) return false;
  array->items = grown;
  array->items[array->count++] = *token;
  return true;
}

static int compare_ids(const void *a, const void *b) {
  uint32_t x = ((const mp_added_token *)a)->id, y = ((const mp_added_token *)b)->id;
  return x < y ? -1 : x > y;
}

/* HF's AddedVocabulary::add_tokens (ids) and refresh_added_tokens (the two tries). */
static mp_status read_added_tokens(const loader *l, const cJSON *root, mp_tokenizer *tokenizer) {
  mp_added_vocabulary *added = &tokenizer->added;
  const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (is_null(tokens)) return MP_OK;
  if (!cJSON_IsArray(tokens)) return wrong_type(l, "$.added_tokens", "an array", tokens);
  token_array parsed = {0}, by_id = {0}, specials = {0}, others = {0};
  mp_status status = MP_OK;
  int index = 0;
  for (const cJSON *item = tokens->child; item != NULL; item = item->next, index++) {
    char path[MP_JSON_PATH_BYTES];
    mp_json_path_index(path, sizeof path, "$.added_tokens", index);
    if (!cJSON_IsObject(item)) {
      status = wrong_type(l, path, "an object", item);
      goto done;
    }
    mp_added_token token = {0};
    const char *content;
    if ((status = read_string(l, item, path, "content", true, &content)) != MP_OK ||
        (status = read_bool(l, item, path, "special", false, &token.special)) != MP_OK ||
        (status = read_bool(l, item, path, "single_word", false, &token.single_word)) != MP_OK ||
        (status = read_bool(l, item, path, "lstrip", false, &token.lstrip)) != MP_OK ||
        (status = read_bool(l, item, path, "rstrip", false, &token.rstrip)) != MP_OK ||
        (status = read_bool(l, item, path, "normalized", !token.special, &token.normalized)) !=
            MP_OK) {
      goto done;
    }
    token.content = (char *)content; /* borrowed from the JSON tree until copied below */
    token.content_bytes = strlen(content);
    if (!push_token(&parsed, &token)) {
      status = out_of_memory(l);
      goto done;
    }
  }
  /* Special tokens first, each content once. */
  for (size_t i = 0; i < parsed.count; i++) {
    mp_added_token *t = &parsed.items[i];
    uint32_t one;
    if (t->special && t->content_bytes > 0 &&
        !mp_string_table_get(&added->special, t->content, t->content_bytes, &one)) {
      if (!mp_string_table_put(&added->special, t->content, t->content_bytes, 1) ||
          !push_token(&specials, t)) {
        status = out_of_memory(l);
        goto done;
      }
    }
  }
  uint32_t model_size = (uint32_t)tokenizer->bpe.vocab.count;
  bool any_added = false;
  uint32_t max_added = 0;
  for (size_t i = 0; i < parsed.count; i++) {
    mp_added_token token = parsed.items[i];
    bool duplicate = false;
    for (size_t k = 0; k < by_id.count && !duplicate; k++) {
      duplicate = same_token(&by_id.items[k], &token);
    }
    if (token.content_bytes == 0 || duplicate) continue;
    uint32_t id;
    if (!mp_string_table_get(&added->by_content, token.content, token.content_bytes, &id) &&
        !mp_string_table_get(&tokenizer->bpe.vocab, token.content, token.content_bytes, &id)) {
      id = !any_added ? model_size
           : (max_added >= model_size || model_size == 0) ? max_added + 1
                                                           : model_size;
    }
    token.id = id;
    if (!mp_string_table_put(&added->by_content, token.content, token.content_bytes, id)) {
      status = out_of_memory(l);
      goto done;
    }
    if (!any_added || id > max_added) max_added = id;
    any_added = true;
    /* The id -> token map keeps the last token given that id. */
    size_t k = 0;
    while (k < by_id.count && by_id.items[k].id != id) k++;
    if (k < by_id.count) {
      by_id.items[k] = token;
    } else if (!push_token(&by_id, &token)) {
      status = out_of_memory(l);
      goto done;
    }
    uint32_t one;
    if (!mp_string_table_get(&added->special, token.content, token.content_bytes, &one) &&
        !push_token(&others, &token)) {
      status = out_of_memory(l);
      goto done;
    }
  }
  /* The tries: special tokens, then the others; normalized ones by their normalized content. */
  mp_hf_regex_scratch *scratch = mp_hf_regex_scratch_create();
  mp_hf_match_list matches = {0};
  mp_text_buffer normalized = {0}, spare = {0};
  if (scratch == NULL) {
    status = out_of_memory(l);
    goto done;
  }
  for (size_t i = 0; i < specials.count + others.count && status == MP_OK; i++) {
    const mp_added_token *t = i < specials.count ? &specials.items[i]
                                                 : &others.items[i - specials.count];
    uint32_t id = 0;
    mp_string_table_get(&added->by_content, t->content, t->content_bytes, &id);
    if (!t->normalized) {
      if (!mp_token_trie_add(&added->raw, t->content, t->content_bytes, id)) status = out_of_memory(l);
      continue;
    }
    status = mp_normalizer_run(&tokenizer->normalizer, scratch, &matches, t->content,
                               t->content_bytes, &normalized, &spare, l->err);
    if (status == MP_OK && normalized.length > 0 &&
        !mp_token_trie_add(&added->normalized, normalized.data, normalized.length, id)) {
      status = out_of_memory(l);
    }
  }
  mp_hf_regex_scratch_free(scratch);
  mp_hf_match_list_free(&matches);
  mp_text_buffer_free(&normalized);
  mp_text_buffer_free(&spare);
  if (status != MP_OK) goto done;
  /* Own copies of the contents, sorted by id for lookups. */
  if (by_id.count > 1) qsort(by_id.items, by_id.count, sizeof *by_id.items, compare_ids);
  for (size_t i = 0; i < by_id.count; i++) {
    by_id.items[i].content = copy_text(by_id.items[i].content);
    if (by_id.items[i].content == NULL) {
      for (size_t k = 0; k < i; k++) free(by_id.items[k].content);
      status = out_of_memory(l);
      goto done;
    }
  }
  added->tokens = by_id.items;
  added->count = by_id.count;
  by_id.items = NULL;
done:
  free(parsed.items);
  free(by_id.items);
  free(specials.items);
  free(others.items);
  return status;
}

/* ---- post-processor ----------------------------------------------------------------------- */

typedef struct {
  uint32_t *prefix, *suffix;
  size_t prefix_count, suffix_count;
} id_frame;

static bool append_ids(uint32_t **ids, size_t *count, const uint32_t *more, size_t more_count) {
  if (more_count == 0) return true;
  uint32_t *grown = realloc(*ids, (*count + more_count + 1) * sizeof *grown);
  if (grown == NULL) return false;
  memcpy(grown + *count, more, more_count * sizeof *more);
  *ids = grown;
  *count += more_count;
  return true;
}

/* Wraps the frame so far in prefix/suffix: a later processor adds outside the earlier. */
static bool wrap_frame(id_frame *frame, const uint32_t *prefix, size_t prefix_count,
                       const uint32_t *suffix, size_t suffix_count) {
  uint32_t *new_prefix = NULL;
  size_t new_count = 0;
  if (!append_ids(&new_prefix, &new_count, prefix, prefix_count) ||
      !append_ids(&new_prefix, &new_count, frame->prefix, frame->prefix_count)) {
    free(new_prefix);
    return false;
  }
  free(frame->prefix);
  frame->prefix = new_prefix;
  frame->prefix_count = new_count;
  return append_ids(&frame->suffix, &frame->suffix_count, suffix, suffix_count);
}

/* RobertaProcessing's and BertProcessing's "cls"/"sep": ["token", id]. */
static mp_status read_pair_token(const loader *l, const cJSON *item, const char *path,
                                 const char *key, uint32_t *id) {
  const cJSON *pair = cJSON_GetObjectItemCaseSensitive(item, key);
  char pair_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(pair_path, sizeof pair_path, path, key);
  if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(pair->child)) {
    return wrong_type(l, pair_path, "[\"token\", id]", pair);
  }
  char id_path[MP_JSON_PATH_BYTES];
  mp_json_path_index(id_path, sizeof id_path, pair_path, 1);
  return read_u32(l, pair->child->next, id_path, id);
}

static mp_status read_template(const loader *l, const cJSON *item, const char *path,
                               id_frame *frame) {
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(item, "single");
  const cJSON *special = cJSON_GetObjectItemCaseSensitive(item, "special_tokens");
  char single_path[MP_JSON_PATH_BYTES], special_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(single_path, sizeof single_path, path, "single");
  mp_json_path_key(special_path, sizeof special_path, path, "special_tokens");
  if (!cJSON_IsArray(single)) return wrong_type(l, single_path, "an array", single);
  if (!cJSON_IsObject(special)) return wrong_type(l, special_path, "an object", special);
  uint32_t *prefix = NULL, *suffix = NULL;
  size_t prefix_count = 0, suffix_count = 0;
  int sequences = 0, index = 0;
  mp_status status = MP_OK;
  for (const cJSON *piece = single->child; piece != NULL && status == MP_OK;
       piece = piece->next, index++) {
    char piece_path[MP_JSON_PATH_BYTES];
    mp_json_path_index(piece_path, sizeof piece_path, single_path, index);
    const cJSON *sequence = cJSON_GetObjectItemCaseSensitive(piece, "Sequence");
    const cJSON *token = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(sequence != NULL ? sequence : token, "id");
    if ((sequence == NULL && token == NULL) || !cJSON_IsString(id)) {
      status = wrong_type(l, piece_path, "{\"Sequence\": {\"id\": ...}} or {\"SpecialToken\": "
                          "{\"id\": ...}}", piece);
      break;
    }
    if (sequence != NULL) {
      if (strcmp(id->valuestring, "A") != 0 || ++sequences > 1) {
        status = mp_fail(l->err, MP_ERR_INPUT,
                         "%s: %s: a single-sequence template takes the sequence $A once, got "
                         "\"%s\"", l->source, piece_path, id->valuestring);
      }
      continue;
    }
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(special, id->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    if (!cJSON_IsArray(ids)) {
      status = mp_fail(l->err, MP_ERR_INPUT, "%s: %s: the special token \"%s\" is not in %s "
                       "(with its \"ids\")", l->source, piece_path, id->valuestring,
                       special_path);
      break;
    }
    int k = 0;
    for (const cJSON *value = ids->child; value != NULL && status == MP_OK;
         value = value->next, k++) {
      char id_path[MP_JSON_PATH_BYTES];
      snprintf(id_path, sizeof id_path, "%s[\"%.64s\"].ids[%d]", special_path, id->valuestring, k);
      uint32_t v;
      status = read_u32(l, value, id_path, &v);
      if (status == MP_OK) {
        bool ok = sequences == 0 ? append_ids(&prefix, &prefix_count, &v, 1)
                                 : append_ids(&suffix, &suffix_count, &v, 1);
        if (!ok) status = out_of_memory(l);
      }
    }
  }
  if (status == MP_OK && sequences == 0) {
    status = mp_fail(l->err, MP_ERR_INPUT, "%s: %s: the template has no sequence $A", l->source,
                     single_path);
  }
  if (status == MP_OK && !wrap_frame(frame, prefix, prefix_count, suffix, suffix_count)) {
    status = out_of_memory(l);
  }
  free(prefix);
  free(suffix);
  return status;
}

static const char kPostProcessors[] =
    "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing and Sequence";

static mp_status read_post_processor(const loader *l, const cJSON *item, const char *path,
                                     void *target) {
  id_frame *frame = target;
  const char *type;
  MP_TRY(read_type(l, item, path, &type));
  char type_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(type_path, sizeof type_path, path, "type");
  if (strcmp(type, "Sequence") == 0) {
    return read_sequence(l, item, path, "processors", frame, read_post_processor);
  }
  if (strcmp(type, "ByteLevel") == 0) return MP_OK; /* it only trims offsets */
  if (strcmp(type, "TemplateProcessing") == 0) return read_template(l, item, path, frame);
  if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
    uint32_t cls, sep;
    MP_TRY(read_pair_token(l, item, path, "cls", &cls));
    MP_TRY(read_pair_token(l, item, path, "sep", &sep));
    if (!wrap_frame(frame, &cls, 1, &sep, 1)) return out_of_memory(l);
    return MP_OK;
  }
  return not_implemented(l, type_path, type, kPostProcessors);
}

/* ---- decoder ------------------------------------------------------------------------------ */

static const char kDecoders[] =
    "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence";

static mp_status read_decoder(const loader *l, const cJSON *item, const char *path,
                              void *target) {
  mp_decoder *decoder = target;
  const char *type;
  MP_TRY(read_type(l, item, path, &type));
  if (strcmp(type, "Sequence") == 0) {
    return read_sequence(l, item, path, "decoders", decoder, read_decoder);
  }
  static const char *const kTypes[] = {"ByteLevel",    "Metaspace", "Replace",
                                       "ByteFallback", "Fuse",      "Strip"};
  int kind = -1;
  for (int i = 0; i < 6; i++) {
    if (strcmp(type, kTypes[i]) == 0) kind = i;
  }
  char type_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(type_path, sizeof type_path, path, "type");
  if (kind < 0) return not_implemented(l, type_path, type, kDecoders);
  mp_decode_step *step = add_step((void **)&decoder->steps, &decoder->count, sizeof *step);
  if (step == NULL) return out_of_memory(l);
  step->kind = (mp_decode_kind)kind; /* kTypes is in mp_decode_kind's order */
  switch (step->kind) {
    case MP_DECODE_METASPACE:
      MP_TRY(read_char(l, item, path, "replacement", &step->character));
      MP_TRY(read_prepend_scheme(l, item, path, &step->prepend_scheme));
      break;
    case MP_DECODE_REPLACE: {
      const char *content;
      MP_TRY(read_pattern(l, item, path, &step->pattern));
      MP_TRY(read_string(l, item, path, "content", true, &content));
      if ((step->content = copy_text(content)) == NULL) return out_of_memory(l);
      step->content_bytes = strlen(content);
      break;
    }
    case MP_DECODE_STRIP: {
      const cJSON *start = cJSON_GetObjectItemCaseSensitive(item, "start");
      const cJSON *stop = cJSON_GetObjectItemCaseSensitive(item, "stop");
      char start_path[MP_JSON_PATH_BYTES], stop_path[MP_JSON_PATH_BYTES];
      mp_json_path_key(start_path, sizeof start_path, path, "start");
      mp_json_path_key(stop_path, sizeof stop_path, path, "stop");
      uint32_t start_count, stop_count;
      MP_TRY(read_char(l, item, path, "content", &step->character));
      MP_TRY(read_u32(l, start, start_path, &start_count));
      MP_TRY(read_u32(l, stop, stop_path, &stop_count));
      step->strip_start = start_count;
      step->strip_stop = stop_count;
      break;
    }
    default:
      break;
  }
  return MP_OK;
}

/* ---- the whole file ----------------------------------------------------------------------- */

/* A part ($.normalizer, ...) that may be null. */
static mp_status read_part(const loader *l, const cJSON *root, const char *key, void *target,
                           mp_status (*read_one)(const loader *, const cJSON *, const char *,
                                                 void *)) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
  if (is_null(item)) return MP_OK;
  char path[MP_JSON_PATH_BYTES];
  mp_json_path_key(path, sizeof path, "$", key);
  return read_one(l, item, path, target);
}

static mp_status read_tokenizer(const loader *l, const cJSON *root, mp_tokenizer *tokenizer) {
  if (!cJSON_IsObject(root)) return wrong_type(l, "$", "an object (a tokenizer.json)", root);
  static const char *const kRefused[] = {"truncation", "padding"};
  for (int i = 0; i < 2; i++) {
    if (!is_null(cJSON_GetObjectItemCaseSensitive(root, kRefused[i]))) {
      return mp_fail(l->err, MP_ERR_INPUT,
                     "%s: $.%s: %s is not implemented (mpengine tokenizes whole documents); set "
                     "it to null", l->source, kRefused[i], kRefused[i]);
    }
  }
  MP_TRY(read_model(l, root, &tokenizer->bpe));
  MP_TRY(read_part(l, root, "normalizer", &tokenizer->normalizer, read_normalizer));
  MP_TRY(read_part(l, root, "pre_tokenizer", &tokenizer->pre_tokenizer, read_pre_tokenizer));
  id_frame frame = {0};
  mp_status status = read_part(l, root, "post_processor", &frame, read_post_processor);
  tokenizer->prefix_ids = frame.prefix;
  tokenizer->prefix_count = frame.prefix_count;
  tokenizer->suffix_ids = frame.suffix;
  tokenizer->suffix_count = frame.suffix_count;
  if (status != MP_OK) return status;
  const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  tokenizer->decoder.present = !is_null(decoder);
  MP_TRY(read_part(l, root, "decoder", &tokenizer->decoder, read_decoder));
  MP_TRY(read_added_tokens(l, root, tokenizer));
  int64_t size = tokenizer->bpe.id_count;
  for (size_t i = 0; i < tokenizer->added.count; i++) {
    if ((int64_t)tokenizer->added.tokens[i].id + 1 > size) size = tokenizer->added.tokens[i].id + 1;
  }
  tokenizer->vocab_size = size;
  /* HF emits a template's ids as written; one outside the vocabulary could be neither trained on
   * nor decoded, so the file is refused rather than passed on. */
  for (int part = 0; part < 2; part++) {
    const uint32_t *ids = part == 0 ? tokenizer->prefix_ids : tokenizer->suffix_ids;
    const size_t count = part == 0 ? tokenizer->prefix_count : tokenizer->suffix_count;
    for (size_t i = 0; i < count; i++) {
      if (mp_tokenizer_id_to_token(tokenizer, ids[i]) == NULL) {
        return mp_fail(l->err, MP_ERR_INPUT,
                       "%s: $.post_processor: the template's special token id %u is no token of "
                       "the vocabulary ($.model.vocab and $.added_tokens, ids 0 .. %lld)",
                       l->source, ids[i], (long long)size - 1);
      }
    }
  }
  return MP_OK;
}

mp_status mp_tokenizer_load(const char *path, mp_tokenizer **out, mp_error *err) {
  *out = NULL;
  struct stat info;
  char *file = NULL;
  if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
    size_t bytes = strlen(path) + sizeof "/tokenizer.json";
    file = malloc(bytes);
    if (file != NULL) snprintf(file, bytes, "%s/tokenizer.json", path);
  } else {
    file = copy_text(path);
  }
  if (file == NULL) return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  cJSON *root = NULL;
  mp_status status = mp_json_load_file(file, &root, err);
  if (status != MP_OK) {
    free(file);
    return status;
  }
  mp_tokenizer *tokenizer = calloc(1, sizeof *tokenizer);
  if (tokenizer == NULL) {
    cJSON_Delete(root);
    free(file);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory", path);
  }
  tokenizer->path = file;
  loader l = {file, err};
  status = read_tokenizer(&l, root, tokenizer);
  cJSON_Delete(root);
  if (status != MP_OK) {
    mp_tokenizer_free(tokenizer);
    return status;
  }
  *out = tokenizer;
  return MP_OK;
}

void mp_tokenizer_free(mp_tokenizer *tokenizer) {
  if (tokenizer == NULL) return;
  mp_added_vocabulary_free(&tokenizer->added);
  mp_normalizer_free(&tokenizer->normalizer);
  mp_pre_tokenizer_free(&tokenizer->pre_tokenizer);
  mp_bpe_free(&tokenizer->bpe);
  free(tokenizer->prefix_ids);
  free(tokenizer->suffix_ids);
  mp_decoder_free(&tokenizer->decoder);
  free(tokenizer->path);
  free(tokenizer);
}
