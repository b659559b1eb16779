/*
 * common/json_reader.h — reading the JSON files users write (model, cluster, plan, manifest) so that
 * every mistake gets one message naming the file and the JSON path, and what would fix it.
 *
 * Paths are written JSONPath-style: "$", "$.layers[2].hidden". Syntax errors carry line and
 * column. An unknown key is named with the closest known key ("did you mean"), so a typo never
 * silently falls back to a default.
 */
#ifndef MPENGINE_COMMON_JSON_READER_H
#define MPENGINE_COMMON_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_JSON_PATH_BYTES = 256, MP_JSON_MAX_FILE_BYTES = 64 << 20 };

/* Where values come from: `source` (a file name, or "<string>") heads every message. */
typedef struct {
  const char *source;
  mp_error *err;
} mp_json_reader;

/* Range a number must fall in. */
typedef enum {
  MP_JSON_ANY = 0,
  MP_JSON_NONNEGATIVE, /* >= 0 */
  MP_JSON_POSITIVE,    /* > 0 */
} mp_json_range;

/* Reads and parses a whole file. Fails with MP_ERR_INPUT naming the file when it cannot be
 * opened, is empty or too large, or is not JSON (with line and column). The caller frees
 * *out_root with cJSON_Delete. */
mp_status mp_json_load_file(const char *path, cJSON **out_root, mp_error *err);

/* Parses text; `source` names it in messages. */
mp_status mp_json_parse_text(const char *text, const char *source, cJSON **out_root,
                             mp_error *err);

/* Fails unless item is an object; `what` says what it should describe ("a model description"). */
mp_status mp_json_expect_object(const mp_json_reader *reader, const cJSON *item,
                                const char *path, const char *what);

/* Fails on the first key of object not in known_keys (NULL-terminated), suggesting the closest
 * known key, and on a key given twice. */
mp_status mp_json_check_keys(const mp_json_reader *reader, const cJSON *object, const char *path,
                             const char *const *known_keys);

/* Integer values (whole numbers within +-2^53). require_* fails when the key is absent;
 * optional_* stores default_value then. */
mp_status mp_json_require_int(const mp_json_reader *reader, const cJSON *object, const char *path,
                              const char *key, mp_json_range range, int64_t *out);
mp_status mp_json_optional_int(const mp_json_reader *reader, const cJSON *object,
                               const char *path, const char *key, mp_json_range range,
                               int64_t default_value, int64_t *out);

/* Finite numbers. */
mp_status mp_json_require_number(const mp_json_reader *reader, const cJSON *object,
                                 const char *path, const char *key, mp_json_range range,
                                 double *out);
mp_status mp_json_optional_number(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, mp_json_range range,
                                  double default_value, double *out);

/* Strings; *out points into the cJSON tree. Empty strings are refused. */
mp_status mp_json_require_string(const mp_json_reader *reader, const cJSON *object,
                                 const char *path, const char *key, const char **out);
mp_status mp_json_optional_string(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, const char *default_value,
                                  const char **out);

mp_status mp_json_optional_bool(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, bool default_value, bool *out);

/* A string that must be one of choices (NULL-terminated); *out is its index. */
mp_status mp_json_optional_choice(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, const char *key, const char *const *choices,
                                  int default_index, int *out);

/* An array under key; min_items > 0 refuses shorter ones. */
mp_status mp_json_require_array(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, int min_items,
                                const cJSON **out);

/* What a JSON value is, for messages: "an object", "an array", "a string", "a number",
 * "a boolean", "null", or "nothing" for NULL. */
const char *mp_json_type_name(const cJSON *item);

/* Builds child paths: "<parent>.<key>" and "<parent>[<index>]". */
void mp_json_path_key(char *out, size_t out_bytes, const char *parent, const char *key);
void mp_json_path_index(char *out, size_t out_bytes, const char *parent, int index);

/* Edit distance between a and b, for "did you mean" suggestions. */
int mp_edit_distance(const char *a, const char *b);

/* The entry of candidates (NULL-terminated) closest to word, or NULL when none is close. */
const char *mp_closest_word(const char *word, const char *const *candidates);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_COMMON_JSON_READER_H */
