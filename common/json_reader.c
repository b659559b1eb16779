/* common/json_reader.c — see json_reader.h. */
#include "common/json_reader.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whole numbers up to this magnitude are exact in a double. */
#define MP_JSON_MAX_EXACT_INT 9007199254740992.0

const char *mp_json_type_name(const cJSON *item) {
  if (item == NULL) return "nothing";
  if (cJSON_IsObject(item)) return "an object";
  if (cJSON_IsArray(item)) return "an array";
  if (cJSON_IsString(item)) return "a string";
  if (cJSON_IsNumber(item)) return "a number";
  if (cJSON_IsBool(item)) return "a boolean";
  if (cJSON_IsNull(item)) return "null";
  return "an invalid value";
}

/* "a positive integer", "a non-negative number", "an integer". */
static const char *kind_words(mp_json_range range, bool integer) {
  switch (range) {
    case MP_JSON_POSITIVE: return integer ? "a positive integer" : "a positive number";
    case MP_JSON_NONNEGATIVE: return integer ? "a non-negative integer" : "a non-negative number";
    case MP_JSON_ANY: break;
  }
  return integer ? "an integer" : "a number";
}

void mp_json_path_key(char *out, size_t out_bytes, const char *parent, const char *key) {
  snprintf(out, out_bytes, "%s.%s", parent, key);
}

void mp_json_path_index(char *out, size_t out_bytes, const char *parent, int index) {
  snprintf(out, out_bytes, "%s[%d]", parent, index);
}

int mp_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return (int)(la > lb ? la : lb);
  int row[65];
  for (size_t j = 0; j <= lb; ++j) row[j] = (int)j;
  for (size_t i = 1; i <= la; ++i) {
    int diagonal = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; ++j) {
      int above = row[j];
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int best = diagonal + cost;
      if (above + 1 < best) best = above + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diagonal = above;
    }
  }
  return row[lb];
}

const char *mp_closest_word(const char *word, const char *const *candidates) {
  const char *best = NULL;
  int best_distance = 1 << 30;
  for (int i = 0; candidates[i] != NULL; ++i) {
    int distance = mp_edit_distance(word, candidates[i]);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidates[i];
    }
  }
  int word_length = (int)strlen(word);
  int allowed = word_length / 3 > 2 ? word_length / 3 : 2;
  return best_distance <= allowed ? best : NULL;
}

static void line_and_column(const char *text, const char *position, int *line, int *column) {
  *line = 1;
  *column = 1;
  for (const char *p = text; p < position && *p != '\0'; ++p) {
    if (*p == '\n') {
      ++*line;
      *column = 1;
    } else {
      ++*column;
    }
  }
}

/* A strict JSON syntax scanner, run only after cJSON has refused a text: cJSON does not say where
 * inside an object or array the mistake is, and users need the exact line and column. */
typedef struct {
  const char *p;
  const char *error_at;
  const char *expected;
  int depth;
} syntax_scanner;

enum { kMaxJsonDepth = 1000 }; /* cJSON's CJSON_NESTING_LIMIT */

static bool scan_fail(syntax_scanner *s, const char *expected) {
  if (s->error_at == NULL) {
    s->error_at = s->p;
    s->expected = expected;
  }
  return false;
}

static void scan_space(syntax_scanner *s) {
  while (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r') ++s->p;
}

static bool scan_value(syntax_scanner *s);

static bool scan_string(syntax_scanner *s) {
  if (*s->p != '"') return scan_fail(s, "a string in double quotes");
  ++s->p;
  for (;;) {
    unsigned char c = (unsigned char)*s->p;
    if (c == '\0') return scan_fail(s, "a closing '\"'");
    if (c < 0x20) return scan_fail(s, "a character (control characters must be escaped)");
    if (c == '"') {
      ++s->p;
      return true;
    }
    if (c == '\\') {
      ++s->p;
      if (*s->p == 'u') {
        for (int i = 1; i <= 4; ++i) {
          char h = s->p[i];
          bool hex = (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
          if (!hex) {
            s->p += i;
            return scan_fail(s, "four hex digits after \\u");
          }
        }
        s->p += 5;
        continue;
      }
      if (*s->p == '\0' || strchr("\"\\/bfnrt", *s->p) == NULL) {
        return scan_fail(s, "an escape (\\\", \\\\, \\/, \\b, \\f, \\n, \\r, \\t or \\u)");
      }
    }
    ++s->p;
  }
}

static bool scan_digits(syntax_scanner *s) {
  if (*s->p < '0' || *s->p > '9') return scan_fail(s, "a digit");
  while (*s->p >= '0' && *s->p <= '9') ++s->p;
  return true;
}

static bool scan_number(syntax_scanner *s) {
  if (*s->p == '-') ++s->p;
  if (*s->p == '0') {
    ++s->p;
  } else if (!scan_digits(s)) {
    return false;
  }
  if (*s->p == '.') {
    ++s->p;
    if (!scan_digits(s)) return false;
  }
  if (*s->p == 'e' || *s->p == 'E') {
    ++s->p;
    if (*s->p == '+' || *s->p == '-') ++s->p;
    if (!scan_digits(s)) return false;
  }
  return true;
}

static bool scan_word(syntax_scanner *s, const char *word) {
  size_t length = strlen(word);
  if (strncmp(s->p, word, length) != 0) return scan_fail(s, "a value");
  s->p += length;
  return true;
}

static bool scan_object(syntax_scanner *s) {
  ++s->p; /* '{' */
  scan_space(s);
  if (*s->p == '}') {
    ++s->p;
    return true;
  }
  for (;;) {
    scan_space(s);
    if (*s->p != '"') return scan_fail(s, "a key in double quotes");
    if (!scan_string(s)) return false;
    scan_space(s);
    if (*s->p != ':') return scan_fail(s, "':' after the key");
    ++s->p;
    if (!scan_value(s)) return false;
    scan_space(s);
    if (*s->p == '}') {
      ++s->p;
      return true;
    }
    if (*s->p != ',') return scan_fail(s, "',' or '}'");
    ++s->p;
  }
}

static bool scan_array(syntax_scanner *s) {
  ++s->p; /* '[' */
  scan_space(s);
  if (*s->p == ']') {
    ++s->p;
    return true;
  }
  for (;;) {
    if (!scan_value(s)) return false;
    scan_space(s);
    if (*s->p == ']') {
      ++s->p;
      return true;
    }
    if (*s->p != ',') return scan_fail(s, "',' or ']'");
    ++s->p;
  }
}

static bool scan_value(syntax_scanner *s) {
  scan_space(s);
  if (s->depth >= kMaxJsonDepth) return scan_fail(s, "nesting no deeper than 1000 levels");
  bool ok;
  switch (*s->p) {
    case '{':
      ++s->depth;
      ok = scan_object(s);
      --s->depth;
      return ok;
    case '[':
      ++s->depth;
      ok = scan_array(s);
      --s->depth;
      return ok;
    case '"': return scan_string(s);
    case 't': return scan_word(s, "true");
    case 'f': return scan_word(s, "false");
    case 'n': return scan_word(s, "null");
    default:
      if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) return scan_number(s);
      return scan_fail(s, "a value");
  }
}

/* Fills *at and *expected with the first syntax error of text; false if the scanner finds none. */
static bool find_syntax_error(const char *text, const char **at, const char **expected) {
  syntax_scanner s = {text, NULL, NULL, 0};
  if (scan_value(&s)) {
    scan_space(&s);
    if (*s.p != '\0') scan_fail(&s, "the end of the text after the top-level value");
  }
  if (s.error_at == NULL) return false;
  *at = s.error_at;
  *expected = s.expected;
  return true;
}

mp_status mp_json_parse_text(const char *text, const char *source, cJSON **out_root,
                             mp_error *err) {
  *out_root = NULL;
  const char *p = text;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
  if (*p == '\0') return mp_fail(err, MP_ERR_INPUT, "%s: empty, expected a JSON object", source);
  const char *parse_end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &parse_end, 1);
  if (root == NULL) {
    const char *position = parse_end != NULL ? parse_end : text;
    const char *expected = NULL;
    bool located = find_syntax_error(text, &position, &expected);
    int line, column;
    line_and_column(text, position, &line, &column);
    char found[24];
    size_t n = 0;
    for (const char *q = position; *q != '\0' && *q != '\n' && n + 1 < 16; ++q) {
      found[n++] = *q;
    }
    found[n] = '\0';
    if (!located) {
      return mp_fail(err, MP_ERR_INPUT, "%s:%d:%d: JSON syntax error near '%s'", source, line,
                     column, found);
    }
    if (n == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s:%d:%d: JSON syntax error: expected %s, found the end of %s", source,
                     line, column, expected, *position == '\0' ? "the file" : "the line");
    }
    return mp_fail(err, MP_ERR_INPUT, "%s:%d:%d: JSON syntax error: expected %s, found '%s'",
                   source, line, column, expected, found);
  }
  *out_root = root;
  return MP_OK;
}

mp_status mp_json_load_file(const char *path, cJSON **out_root, mp_error *err) {
  *out_root = NULL;
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  }
  if (fseek(file, 0, SEEK_END) != 0) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot read: not a regular file", path);
  }
  long size = ftell(file);
  if (size < 0 || size > MP_JSON_MAX_FILE_BYTES) {
    fclose(file);
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot read: not a regular file or larger than %d bytes",
                   path, MP_JSON_MAX_FILE_BYTES);
  }
  rewind(file);
  char *text = malloc((size_t)size + 1);
  if (text == NULL) {
    fclose(file);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory reading %ld bytes", path, size);
  }
  size_t got = fread(text, 1, (size_t)size, file);
  fclose(file);
  if (got != (size_t)size) {
    free(text);
    return mp_fail(err, MP_ERR_INPUT, "%s: short read (%zu of %ld bytes)", path, got, size);
  }
  text[size] = '\0';
  if (strlen(text) != (size_t)size) {
    free(text);
    return mp_fail(err, MP_ERR_INPUT, "%s: contains a NUL byte; not a JSON text file", path);
  }
  mp_status status = mp_json_parse_text(text, path, out_root, err);
  free(text);
  return status;
}

mp_status mp_json_expect_object(const mp_json_reader *reader, const cJSON *item,
                                const char *path, const char *what) {
  if (cJSON_IsObject(item)) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: expected %s (a JSON object), got %s",
                 reader->source, path, what, mp_json_type_name(item));
}

static bool is_known(const char *key, const char *const *known_keys) {
  for (int i = 0; known_keys[i] != NULL; ++i) {
    if (strcmp(key, known_keys[i]) == 0) return true;
  }
  return false;
}

mp_status mp_json_check_keys(const mp_json_reader *reader, const cJSON *object, const char *path,
                             const char *const *known_keys) {
  for (const cJSON *child = object->child; child != NULL; child = child->next) {
    const char *key = child->string != NULL ? child->string : "";
    if (!is_known(key, known_keys)) {
      char known_list[512] = "";
      size_t used = 0;
      for (int i = 0; known_keys[i] != NULL && used < sizeof known_list; ++i) {
        used += (size_t)snprintf(known_list + used, sizeof known_list - used, "%s%s",
                                 i ? ", " : "", known_keys[i]);
      }
      const char *closest = mp_closest_word(key, known_keys);
      if (closest != NULL) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s: unknown key \"%s\"; did you mean \"%s\"? (known keys: %s)",
                       reader->source, path, key, closest, known_list);
      }
      return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: unknown key \"%s\" (known keys: %s)",
                     reader->source, path, key, known_list);
    }
    for (const cJSON *earlier = object->child; earlier != child; earlier = earlier->next) {
      if (earlier->string != NULL && strcmp(earlier->string, key) == 0) {
        return mp_fail(reader->err, MP_ERR_INPUT,
                       "%s: %s: key \"%s\" is given twice; keep one", reader->source, path, key);
      }
    }
  }
  return MP_OK;
}

static mp_status check_range(const mp_json_reader *reader, const char *path, const char *key,
                             mp_json_range range, double value, bool integer) {
  bool ok = range == MP_JSON_ANY || (range == MP_JSON_POSITIVE && value > 0) ||
            (range == MP_JSON_NONNEGATIVE && value >= 0);
  if (ok) return MP_OK;
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be %s, got %.17g",
                 reader->source, path, key, kind_words(range, integer), value);
}

static mp_status read_number(const mp_json_reader *reader, const cJSON *item, const char *path,
                             const char *key, mp_json_range range, bool integer, double *out) {
  const char *kind = kind_words(range, integer);
  if (!cJSON_IsNumber(item)) {
    if (cJSON_IsString(item)) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: %s.%s: must be %s, got a string (\"%.40s\"); drop the quotes",
                     reader->source, path, key, kind, item->valuestring);
    }
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be %s, got %s",
                   reader->source, path, key, kind, mp_json_type_name(item));
  }
  double value = item->valuedouble;
  if (!isfinite(value)) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be a finite number", reader->source,
                   path, key);
  }
  if (integer) {
    if (value != floor(value)) {
      return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be %s, got %.17g",
                     reader->source, path, key, kind, value);
    }
    if (fabs(value) > MP_JSON_MAX_EXACT_INT) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: %s.%s: %.17g is too large (integers must be within 2^53)",
                     reader->source, path, key, value);
    }
  }
  MP_TRY(check_range(reader, path, key, range, value, integer));
  *out = value;
  return MP_OK;
}

static mp_status missing(const mp_json_reader *reader, const char *path, const char *key,
                         const char *what) {
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: missing required key \"%s\" (%s)",
                 reader->source, path, key, what);
}

mp_status mp_json_require_int(const mp_json_reader *reader, const cJSON *object, const char *path,
                              const char *key, mp_json_range range, int64_t *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) {
    return missing(reader, path, key, kind_words(range, true));
  }
  double value;
  MP_TRY(read_number(reader, item, path, key, range, true, &value));
  *out = (int64_t)value;
  return MP_OK;
}

mp_status mp_json_optional_int(const mp_json_reader *reader, const cJSON *object,
                               const char *path, const char *key, mp_json_range range,
                               int64_t default_value, int64_t *out) {
  if (cJSON_GetObjectItemCaseSensitive(object, key) == NULL) {
    *out = default_value;
    return MP_OK;
  }
  return mp_json_require_int(reader, object, path, key, range, out);
}

mp_status mp_json_require_number(const mp_json_reader *reader, const cJSON *object,
                                 const char *path, const char *key, mp_json_range range,
                                 double *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) {
    return missing(reader, path, key, kind_words(range, false));
  }
  return read_number(reader, item, path, key, range, false, out);
}

mp_status mp_json_optional_number(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, mp_json_range range,
                                  double default_value, double *out) {
  if (cJSON_GetObjectItemCaseSensitive(object, key) == NULL) {
    *out = default_value;
    return MP_OK;
  }
  return mp_json_require_number(reader, object, path, key, range, out);
}

mp_status mp_json_require_string(const mp_json_reader *reader, const cJSON *object,
                                 const char *path, const char *key, const char **out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) return missing(reader, path, key, "a string");
  if (!cJSON_IsString(item) || item->valuestring == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be a string, got %s",
                   reader->source, path, key, mp_json_type_name(item));
  }
  if (item->valuestring[0] == '\0') {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must not be empty", reader->source,
                   path, key);
  }
  *out = item->valuestring;
  return MP_OK;
}

mp_status mp_json_optional_string(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, const char *default_value,
                                  const char **out) {
  if (cJSON_GetObjectItemCaseSensitive(object, key) == NULL) {
    *out = default_value;
    return MP_OK;
  }
  return mp_json_require_string(reader, object, path, key, out);
}

mp_status mp_json_optional_bool(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, bool default_value, bool *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) {
    *out = default_value;
    return MP_OK;
  }
  if (!cJSON_IsBool(item)) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be true or false, got %s",
                   reader->source, path, key, mp_json_type_name(item));
  }
  *out = cJSON_IsTrue(item);
  return MP_OK;
}

mp_status mp_json_optional_choice(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, const char *const *choices,
                                  int default_index, int *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) {
    *out = default_index;
    return MP_OK;
  }
  char choice_list[256] = "";
  size_t used = 0;
  for (int i = 0; choices[i] != NULL && used < sizeof choice_list; ++i) {
    used += (size_t)snprintf(choice_list + used, sizeof choice_list - used, "%s\"%s\"",
                             i ? ", " : "", choices[i]);
  }
  if (!cJSON_IsString(item) || item->valuestring == NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be one of %s, got %s",
                   reader->source, path, key, choice_list, mp_json_type_name(item));
  }
  for (int i = 0; choices[i] != NULL; ++i) {
    if (strcmp(item->valuestring, choices[i]) == 0) {
      *out = i;
      return MP_OK;
    }
  }
  const char *closest = mp_closest_word(item->valuestring, choices);
  if (closest != NULL) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.%s: \"%.40s\" is not one of %s; did you mean \"%s\"?", reader->source,
                   path, key, item->valuestring, choice_list, closest);
  }
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: \"%.40s\" is not one of %s",
                 reader->source, path, key, item->valuestring, choice_list);
}

mp_status mp_json_require_array(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, int min_items,
                                const cJSON **out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) return missing(reader, path, key, "an array");
  if (!cJSON_IsArray(item)) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be an array, got %s",
                   reader->source, path, key, mp_json_type_name(item));
  }
  int count = cJSON_GetArraySize(item);
  if (count < min_items) {
    if (count == 0) {
      return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: is empty; it needs at least %d item%s",
                     reader->source, path, key, min_items, min_items == 1 ? "" : "s");
    }
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: has %d items; it needs at least %d",
                   reader->source, path, key, count, min_items);
  }
  *out = item;
  return MP_OK;
}
