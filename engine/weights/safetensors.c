/*
 * engine/weights/safetensors.c — reading, checking and writing safetensors files; see
 * safetensors.h.
 *
 * Opening follows the reference library's order of checks (safetensors 0.4.5, src/tensor.rs:
 * read_metadata, Metadata::validate): the 8-byte length, its cap and the file's size, UTF-8, JSON,
 * then each tensor entry, then the entries sorted by offsets must tile the data section from 0 to
 * the end of the file. cJSON is more forgiving than serde_json in two ways that matter here (it
 * stops at a NUL and lets control characters through inside strings), so the header's bytes are
 * checked for both before it is parsed.
 *
 * Bytes are decoded and encoded explicitly as little-endian, so the code is right on any host.
 * The float conversions are integer bit manipulation, not the FPU's: round to nearest even, the
 * same bits as torch's .to(torch.bfloat16) and .to(torch.float16) for every non-NaN input
 * (rounding.safetensors in the tests holds 1024 of them, edge cases first).
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/weights/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/float16.h"
#include "common/json_reader.h"
#include "common/text_buffer.h"

/* Dimensions, offsets and element counts stay below 2^53: cJSON's numbers are doubles, exact up
 * to there, and no file comes near it (2^53 bytes is 8 PiB). */
#define kMaxWholeNumber ((int64_t)1 << 53)

/* Bytes between two rows' parts of a block that a block read reads rather than skips: below a
 * page, the kernel reads them anyway. */
enum { kBlockGapBytes = 4096 };

static const char *const kDtypeNames[MP_SAFETENSORS_NUM_DTYPES] = {
    "BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
    "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64",
};
static const int kDtypeBytes[MP_SAFETENSORS_NUM_DTYPES] = {1, 1, 1, 1, 1, 2, 2, 2,
                                                           2, 4, 4, 4, 8, 8, 8};

const char *mp_safetensors_dtype_name(mp_safetensors_dtype dtype) {
  return (unsigned)dtype < MP_SAFETENSORS_NUM_DTYPES ? kDtypeNames[dtype] : "?";
}

int mp_safetensors_dtype_bytes(mp_safetensors_dtype dtype) {
  return (unsigned)dtype < MP_SAFETENSORS_NUM_DTYPES ? kDtypeBytes[dtype] : 0;
}

static bool is_float_dtype(mp_safetensors_dtype dtype) {
  return (MP_SAFETENSORS_FLOAT_DTYPES & MP_SAFETENSORS_DTYPE_BIT(dtype)) != 0;
}

/* ---------------------------------------------------------------------------------------------
 * Conversions between fp32 and the file's dtypes (BF16 and F16 rounding: common/float16.h, torch's
 * round to nearest even; a NaN becomes BF16 sign | 0x7fc0, F16 sign | 0x7e00)
 * ------------------------------------------------------------------------------------------- */

static uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* count elements of dtype at bytes -> fp32 at out[0], out[stride], ... */
static void decode_floats(mp_safetensors_dtype dtype, const unsigned char *bytes, int64_t count,
                          float *out, int64_t stride) {
  switch (dtype) {
    case MP_SAFETENSORS_F32:
      for (int64_t i = 0; i < count; ++i, bytes += 4) {
        out[i * stride] = bits_float((uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 |
                                     (uint32_t)bytes[2] << 16 | (uint32_t)bytes[3] << 24);
      }
      break;
    case MP_SAFETENSORS_BF16:
      for (int64_t i = 0; i < count; ++i, bytes += 2) {
        out[i * stride] = mp_float16_bf16_to_float((uint16_t)(bytes[0] | bytes[1] << 8));
      }
      break;
    case MP_SAFETENSORS_F16:
      for (int64_t i = 0; i < count; ++i, bytes += 2) {
        out[i * stride] = mp_float16_fp16_to_float((uint16_t)(bytes[0] | bytes[1] << 8));
      }
      break;
    default:
      break; /* callers convert float dtypes only */
  }
}

/* count fp32 values -> dtype at bytes. */
static void encode_floats(mp_safetensors_dtype dtype, const float *values, int64_t count,
                          unsigned char *bytes) {
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == MP_SAFETENSORS_F32) {
      const uint32_t bits = float_bits(values[i]);
      for (int b = 0; b < 4; ++b) *bytes++ = (unsigned char)(bits >> (8 * b));
    } else {
      const uint16_t h = dtype == MP_SAFETENSORS_BF16 ? mp_float16_bf16_from_float(values[i])
                                                      : mp_float16_fp16_from_float(values[i]);
      *bytes++ = (unsigned char)(h & 0xff);
      *bytes++ = (unsigned char)(h >> 8);
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * Text: UTF-8, and a growing byte buffer for the JSON the writers build
 * ------------------------------------------------------------------------------------------- */

/* Decodes one UTF-8 character at text[0 .. length); returns its byte length and stores the code
 * point, or returns 0 when it is not well-formed (overlong forms, surrogates and values past
 * U+10FFFF are not, as Rust's str::from_utf8 has it). */
static int utf8_decode(const unsigned char *text, size_t length, uint32_t *out_code_point) {
  const unsigned char c = text[0];
  if (c < 0x80) {
    *out_code_point = c;
    return 1;
  }
  int extra;
  uint32_t code_point, smallest;
  if (c >= 0xc2 && c <= 0xdf) {
    extra = 1, code_point = c & 0x1f, smallest = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    extra = 2, code_point = c & 0x0f, smallest = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    extra = 3, code_point = c & 0x07, smallest = 0x10000;
  } else {
    return 0;
  }
  if ((size_t)extra >= length) return 0;
  for (int i = 1; i <= extra; ++i) {
    if ((text[i] & 0xc0) != 0x80) return 0;
    code_point = code_point << 6 | (text[i] & 0x3f);
  }
  if (code_point < smallest || code_point > 0x10ffff ||
      (code_point >= 0xd800 && code_point <= 0xdfff)) {
    return 0;
  }
  *out_code_point = code_point;
  return extra + 1;
}

static bool is_utf8(const char *text) {
  const unsigned char *p = (const unsigned char *)text;
  size_t length = strlen(text);
  while (length > 0) {
    uint32_t code_point;
    const int n = utf8_decode(p, length, &code_point);
    if (n == 0) return false;
    p += n;
    length -= (size_t)n;
  }
  return true;
}

static void buffer_int(mp_text_buffer *buffer, int64_t value) {
  char digits[24];
  snprintf(digits, sizeof digits, "%lld", (long long)value);
  mp_text_buffer_append_text(buffer, digits);
}

/* A JSON string as serde_json writes it (the reference's header): '"' and '\\' escaped, the
 * control characters as \b \f \n \r \t or \u00xx, everything else (non-ASCII included) as is. */
static void buffer_json_string_serde(mp_text_buffer *buffer, const char *text) {
  mp_text_buffer_append_text(buffer, "\"");
  for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; ++p) {
    char escaped[8];
    switch (*p) {
      case '"':
        mp_text_buffer_append_text(buffer, "\\\"");
        break;
      case '\\':
        mp_text_buffer_append_text(buffer, "\\\\");
        break;
      case '\b':
        mp_text_buffer_append_text(buffer, "\\b");
        break;
      case '\f':
        mp_text_buffer_append_text(buffer, "\\f");
        break;
      case '\n':
        mp_text_buffer_append_text(buffer, "\\n");
        break;
      case '\r':
        mp_text_buffer_append_text(buffer, "\\r");
        break;
      case '\t':
        mp_text_buffer_append_text(buffer, "\\t");
        break;
      default:
        if (*p < 0x20) {
          snprintf(escaped, sizeof escaped, "\\u%04x", *p);
          mp_text_buffer_append_text(buffer, escaped);
        } else {
          mp_text_buffer_append(buffer, p, 1);
        }
    }
  }
  mp_text_buffer_append_text(buffer, "\"");
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii, transformers' index): '"' and
 * '\\' escaped, \b \f \n \r \t short, every other character outside ' ' .. '~' as \uxxxx, those
 * past U+FFFF as a surrogate pair. text must be UTF-8. */
static void buffer_json_string_python(mp_text_buffer *buffer, const char *text) {
  mp_text_buffer_append_text(buffer, "\"");
  const unsigned char *p = (const unsigned char *)text;
  size_t length = strlen(text);
  while (length > 0) {
    uint32_t c;
    int n = utf8_decode(p, length, &c);
    if (n == 0) n = 1, c = 0xfffd; /* callers check UTF-8 first */
    p += n;
    length -= (size_t)n;
    char escaped[16];
    switch (c) {
      case '"':
        mp_text_buffer_append_text(buffer, "\\\"");
        continue;
      case '\\':
        mp_text_buffer_append_text(buffer, "\\\\");
        continue;
      case '\b':
        mp_text_buffer_append_text(buffer, "\\b");
        continue;
      case '\f':
        mp_text_buffer_append_text(buffer, "\\f");
        continue;
      case '\n':
        mp_text_buffer_append_text(buffer, "\\n");
        continue;
      case '\r':
        mp_text_buffer_append_text(buffer, "\\r");
        continue;
      case '\t':
        mp_text_buffer_append_text(buffer, "\\t");
        continue;
      default:
        break;
    }
    if (c >= 0x20 && c <= 0x7e) {
      char one = (char)c;
      mp_text_buffer_append(buffer, &one, 1);
    } else if (c <= 0xffff) {
      snprintf(escaped, sizeof escaped, "\\u%04x", (unsigned)c);
      mp_text_buffer_append_text(buffer, escaped);
    } else {
      const uint32_t v = c - 0x10000;
      snprintf(escaped, sizeof escaped, "\\u%04x\\u%04x", (unsigned)(0xd800 + (v >> 10)),
               (unsigned)(0xdc00 + (v & 0x3ff)));
      mp_text_buffer_append_text(buffer, escaped);
    }
  }
  mp_text_buffer_append_text(buffer, "\"");
}

/* ---------------------------------------------------------------------------------------------
 * The open checkpoint
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  char *path;
  int fd;
  int64_t file_bytes;
  int64_t data_start; /* 8 + the header's length: where the data section begins */
  int num_metadata;
  char **metadata; /* (2 x num_metadata,): key, value, key, value, ... in header order */
} safetensors_file;

struct mp_safetensors {
  char *source;
  int num_files;
  safetensors_file *files; /* (num_files,) sorted by path */
  int num_tensors;
  mp_safetensors_tensor *tensors; /* (num_tensors,) sorted by name; names and shapes owned */
};

static void free_tensor_fields(mp_safetensors_tensor *tensors, int count) {
  for (int i = 0; i < count; ++i) {
    free((char *)tensors[i].name);
    free((int64_t *)tensors[i].shape);
  }
}

static void free_file(safetensors_file *file) {
  if (file->fd >= 0) close(file->fd);
  for (int i = 0; i < 2 * file->num_metadata; ++i) free(file->metadata[i]);
  free(file->metadata);
  free(file->path);
  memset(file, 0, sizeof *file);
  file->fd = -1;
}

void mp_safetensors_close(mp_safetensors *st) {
  if (st == NULL) return;
  for (int i = 0; i < st->num_files; ++i) free_file(&st->files[i]);
  free(st->files);
  free_tensor_fields(st->tensors, st->num_tensors);
  free(st->tensors);
  free(st->source);
  free(st);
}

static char *copy_text(const char *text) {
  const size_t n = strlen(text) + 1;
  char *copy = malloc(n);
  if (copy != NULL) memcpy(copy, text, n);
  return copy;
}

/* A whole number in [0, 2^53) into *out. */
static bool whole_number(const cJSON *item, int64_t *out) {
  if (!cJSON_IsNumber(item)) return false;
  const double value = item->valuedouble;
  if (!(value >= 0 && value < (double)kMaxWholeNumber)) return false; /* NaN fails too */
  const int64_t whole = (int64_t)value;
  if ((double)whole != value) return false;
  *out = whole;
  return true;
}

/* "[8, 6]" into text. */
static void format_shape(char *text, size_t bytes, int rank, const int64_t *shape) {
  size_t used = (size_t)snprintf(text, bytes, "[");
  for (int i = 0; i < rank && used < bytes; ++i) {
    used +=
        (size_t)snprintf(text + used, bytes - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  }
  if (used < bytes) snprintf(text + used, bytes - used, "]");
}

/* pread of exactly bytes at offset; a short read means the file shrank since it was opened. */
static mp_status read_exactly(const safetensors_file *file, int64_t offset, void *buffer,
                              size_t bytes, const char *what, mp_error *err) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        pread(file->fd, (char *)buffer + done, bytes - done, (off_t)(offset + (int64_t)done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return mp_fail(err, MP_ERR_RUNTIME, "%s: cannot read %s at byte %lld: %s", file->path, what,
                     (long long)(offset + (int64_t)done), strerror(errno));
    }
    if (n == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: cannot read %s: the file ends before byte %lld; it was truncated after "
                     "it was opened",
                     file->path, what, (long long)(offset + (int64_t)done));
    }
    done += (size_t)n;
  }
  return MP_OK;
}

/* The header's bytes are UTF-8 with no NUL and no unescaped control character inside a string
 * (serde_json refuses both; cJSON would stop at the NUL or let the control character through). */
static mp_status check_header_bytes(const char *path, const unsigned char *header, size_t length,
                                    mp_error *err) {
  bool in_string = false, escaped = false;
  size_t at = 0;
  while (at < length) {
    const unsigned char c = header[at];
    if (c == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: the header has a NUL byte at byte %zu of %zu; it is not JSON text (the "
                     "reference pads the header with spaces)",
                     path, at, length);
    }
    uint32_t code_point;
    const int n = utf8_decode(header + at, length - at, &code_point);
    if (n == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: the header is not UTF-8: byte %zu of %zu (0x%02x) starts no character",
                     path, at, length, c);
    }
    if (in_string) {
      if (c < 0x20) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: the header has control character 0x%02x unescaped inside a string "
                       "at byte %zu; it is not JSON",
                       path, c, at);
      }
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    }
    at += (size_t)n;
  }
  return MP_OK;
}

static mp_status parse_metadata(const char *path, const cJSON *metadata, safetensors_file *file,
                                mp_error *err) {
  if (cJSON_IsNull(metadata)) return MP_OK; /* the reference reads null as no metadata */
  if (!cJSON_IsObject(metadata)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: header: $.__metadata__: expected an object of strings, got %s", path,
                   mp_json_type_name(metadata));
  }
  const int count = cJSON_GetArraySize(metadata);
  file->metadata = calloc((size_t)(2 * count + 1), sizeof *file->metadata);
  if (file->metadata == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (const cJSON *entry = metadata->child; entry != NULL; entry = entry->next) {
    if (!cJSON_IsString(entry)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: header: $.__metadata__[\"%s\"]: expected a string, got %s (metadata "
                     "maps strings to strings)",
                     path, entry->string, mp_json_type_name(entry));
    }
    for (int i = 0; i < file->num_metadata; ++i) {
      if (strcmp(file->metadata[2 * i], entry->string) == 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: header: $.__metadata__: key \"%s\" given twice",
                       path, entry->string);
      }
    }
    const int at = file->num_metadata;
    file->metadata[2 * at] = copy_text(entry->string);
    file->metadata[2 * at + 1] = copy_text(entry->valuestring);
    file->num_metadata = at + 1;
    if (file->metadata[2 * at] == NULL || file->metadata[2 * at + 1] == NULL) {
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  return MP_OK;
}

/* One entry of the header, name -> {dtype, shape, data_offsets}, into *t; *out_begin and
 * *out_end are its offsets in the data section. Other keys are ignored, as the reference does. */
static mp_status parse_tensor_entry(const char *path, const cJSON *entry, mp_safetensors_tensor *t,
                                    int64_t *out_begin, int64_t *out_end, mp_error *err) {
  const char *name = entry->string;
  if (!cJSON_IsObject(entry)) {
    return mp_fail(
        err, MP_ERR_INPUT,
        "%s: tensor \"%s\": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, "
        "got %s",
        path, name, mp_json_type_name(entry));
  }
  const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
  for (const cJSON *field = entry->child; field != NULL; field = field->next) {
    const cJSON **slot = strcmp(field->string, "dtype") == 0          ? &dtype
                         : strcmp(field->string, "shape") == 0        ? &shape
                         : strcmp(field->string, "data_offsets") == 0 ? &offsets
                                                                      : NULL;
    if (slot == NULL) continue;
    if (*slot != NULL) {
      return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": \"%s\" given twice", path, name,
                     field->string);
    }
    *slot = field;
  }
  const char *missing = dtype == NULL     ? "dtype"
                        : shape == NULL   ? "shape"
                        : offsets == NULL ? "data_offsets"
                                          : NULL;
  if (missing != NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": no \"%s\" (each tensor needs dtype, shape and data_offsets)",
                   path, name, missing);
  }
  if (!cJSON_IsString(dtype)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": dtype: expected a string, got %s", path,
                   name, mp_json_type_name(dtype));
  }
  t->dtype = MP_SAFETENSORS_NUM_DTYPES;
  for (int d = 0; d < MP_SAFETENSORS_NUM_DTYPES; ++d) {
    if (strcmp(dtype->valuestring, kDtypeNames[d]) == 0) t->dtype = (mp_safetensors_dtype)d;
  }
  if (t->dtype == MP_SAFETENSORS_NUM_DTYPES) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": unknown dtype \"%s\" (known: BOOL, U8, I8, F8_E5M2, "
                   "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)",
                   path, name, dtype->valuestring);
  }
  if (!cJSON_IsArray(shape)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": shape: expected an array of whole numbers, got %s", path,
                   name, mp_json_type_name(shape));
  }
  const int rank = cJSON_GetArraySize(shape);
  int64_t *dims = malloc(sizeof *dims * (size_t)(rank > 0 ? rank : 1));
  if (dims == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  t->shape = dims;
  t->rank = rank;
  int64_t elements = 1;
  bool too_many = false;
  int i = 0;
  for (const cJSON *dim = shape->child; dim != NULL; dim = dim->next, ++i) {
    if (!whole_number(dim, &dims[i])) {
      char found[64];
      if (cJSON_IsNumber(dim)) {
        snprintf(found, sizeof found, "%.17g", dim->valuedouble);
      } else {
        snprintf(found, sizeof found, "%s", mp_json_type_name(dim));
      }
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: tensor \"%s\": shape[%d]: expected a whole number from 0 to 2^53 - 1, "
                     "got %s",
                     path, name, i, found);
    }
    if (!too_many && dims[i] != 0 && elements > kMaxWholeNumber / dims[i]) too_many = true;
    if (!too_many) elements *= dims[i];
  }
  if (too_many) {
    char text[256];
    format_shape(text, sizeof text, rank, dims);
    return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": shape %s has 2^53 elements or more", path,
                   name, text);
  }
  t->num_elements = elements;
  t->num_bytes = elements * kDtypeBytes[t->dtype];
  int64_t begin = 0, end = 0;
  if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
      !whole_number(offsets->child, &begin) || !whole_number(offsets->child->next, &end)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": data_offsets: expected [begin, end], two whole numbers "
                   "from 0 to 2^53 - 1",
                   path, name);
  }
  if (end < begin) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": data_offsets [%lld, %lld) run backwards (end before begin)",
                   path, name, (long long)begin, (long long)end);
  }
  if (end - begin != t->num_bytes) {
    char text[256];
    format_shape(text, sizeof text, rank, dims);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": shape %s of %s takes %lld bytes, but data_offsets [%lld, "
                   "%lld) hold %lld",
                   path, name, text, kDtypeNames[t->dtype], (long long)t->num_bytes,
                   (long long)begin, (long long)end, (long long)(end - begin));
  }
  *out_begin = begin;
  *out_end = end;
  return MP_OK;
}

static int compare_tensor_names(const void *a, const void *b) {
  return strcmp(((const mp_safetensors_tensor *)a)->name, ((const mp_safetensors_tensor *)b)->name);
}

/* Tensors ordered by where their bytes are (begin, then end, then name for a stable message). */
typedef struct {
  const mp_safetensors_tensor *tensor;
  int64_t begin, end;
} tensor_extent;

static int compare_extents(const void *a, const void *b) {
  const tensor_extent *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->tensor->name, y->tensor->name);
}

/* The reference's rule: sorted by offsets, the tensors tile the data section [0, data_bytes)
 * exactly: each begins where the one before ends, and the last ends at the end of the file. */
static mp_status check_extents(const char *path, tensor_extent *extents, int count,
                               int64_t data_bytes, int64_t file_bytes, mp_error *err) {
  qsort(extents, (size_t)count, sizeof *extents, compare_extents);
  int64_t covered = 0;
  for (int i = 0; i < count; ++i) {
    const tensor_extent *e = &extents[i];
    if (e->begin > covered) {
      char before[320];
      if (i == 0) {
        snprintf(before, sizeof before, "the data section starts at byte 0");
      } else {
        snprintf(before, sizeof before, "the tensor before it, \"%s\", ends at %lld",
                 extents[i - 1].tensor->name, (long long)covered);
      }
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: tensor \"%s\": data_offsets [%lld, %lld) leave bytes [%lld, %lld) of the "
                     "data section to no tensor (%s); the tensors must cover it with no gaps",
                     path, e->tensor->name, (long long)e->begin, (long long)e->end,
                     (long long)covered, (long long)e->begin, before);
    }
    if (e->begin < covered) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: tensor \"%s\": data_offsets [%lld, %lld) overlap tensor \"%s\" at "
                     "[%lld, %lld)",
                     path, e->tensor->name, (long long)e->begin, (long long)e->end,
                     extents[i - 1].tensor->name, (long long)extents[i - 1].begin,
                     (long long)extents[i - 1].end);
    }
    covered = e->end;
  }
  if (covered > data_bytes) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: truncated: tensor \"%s\" ends at byte %lld of the data section, but the "
                   "file (%lld bytes) holds only %lld bytes of data after its header",
                   path, extents[count - 1].tensor->name, (long long)covered, (long long)file_bytes,
                   (long long)data_bytes);
  }
  if (covered < data_bytes) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: the last %lld bytes of the file belong to no tensor (the tensors end at "
                   "byte %lld of the %lld-byte data section); the reference safetensors library "
                   "refuses such files",
                   path, (long long)(data_bytes - covered), (long long)covered,
                   (long long)data_bytes);
  }
  return MP_OK;
}

/* Parses and checks the tensors of a header already known to be UTF-8 JSON text. */
static mp_status parse_header(const char *path, const cJSON *root, safetensors_file *file,
                              mp_safetensors_tensor **out_tensors, int *out_count, mp_error *err) {
  if (!cJSON_IsObject(root)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: header: expected a JSON object of tensor name -> {dtype, shape, "
                   "data_offsets}, got %s",
                   path, mp_json_type_name(root));
  }
  const int entries = cJSON_GetArraySize(root);
  mp_safetensors_tensor *tensors = calloc((size_t)(entries > 0 ? entries : 1), sizeof *tensors);
  tensor_extent *extents = calloc((size_t)(entries > 0 ? entries : 1), sizeof *extents);
  if (tensors == NULL || extents == NULL) {
    free(tensors);
    free(extents);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  mp_status status = MP_OK;
  int count = 0;
  bool seen_metadata = false;
  for (const cJSON *entry = root->child; status == MP_OK && entry != NULL; entry = entry->next) {
    if (strcmp(entry->string, "__metadata__") == 0) {
      if (seen_metadata) {
        status = mp_fail(err, MP_ERR_INPUT, "%s: header: \"__metadata__\" given twice", path);
      } else {
        seen_metadata = true;
        status = parse_metadata(path, entry, file, err);
      }
      continue;
    }
    mp_safetensors_tensor *t = &tensors[count++];
    t->name = copy_text(entry->string);
    if (t->name == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
      break;
    }
    t->file = file->path;
    status =
        parse_tensor_entry(path, entry, t, &extents[count - 1].begin, &extents[count - 1].end, err);
    t->file_offset = file->data_start + extents[count - 1].begin;
  }
  if (status == MP_OK) {
    qsort(tensors, (size_t)count, sizeof *tensors, compare_tensor_names);
    for (int i = 1; i < count; ++i) {
      if (strcmp(tensors[i - 1].name, tensors[i].name) == 0) {
        status = mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\" appears twice in the header", path,
                         tensors[i].name);
        break;
      }
    }
  }
  if (status == MP_OK) {
    /* Sorting moved the tensors; the extents follow from their file offsets. */
    for (int i = 0; i < count; ++i) {
      extents[i].tensor = &tensors[i];
      extents[i].begin = tensors[i].file_offset - file->data_start;
      extents[i].end = extents[i].begin + tensors[i].num_bytes;
    }
    status = check_extents(path, extents, count, file->file_bytes - file->data_start,
                           file->file_bytes, err);
  }
  free(extents);
  if (status != MP_OK) {
    free_tensor_fields(tensors, count);
    free(tensors);
    return status;
  }
  *out_tensors = tensors;
  *out_count = count;
  return MP_OK;
}

/* Opens path into *file (owning path's copy) and its tensors, sorted by name. */
static mp_status open_one_file(const char *path, safetensors_file *file,
                               mp_safetensors_tensor **out_tensors, int *out_count, mp_error *err) {
  memset(file, 0, sizeof *file);
  file->fd = -1;
  file->path = copy_text(path);
  if (file->path == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  file->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (file->fd < 0) return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
  struct stat info;
  if (fstat(file->fd, &info) != 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot stat: %s", path, strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: not a regular file; expected a .safetensors file", path);
  }
  file->file_bytes = (int64_t)info.st_size;
  if (file->file_bytes < 8) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: %lld bytes, shorter than the 8-byte header length every safetensors file "
                   "starts with",
                   path, (long long)file->file_bytes);
  }
  unsigned char length_bytes[8];
  MP_TRY(read_exactly(file, 0, length_bytes, 8, "the header length", err));
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length_bytes[i];
  if (header_bytes > MP_SAFETENSORS_MAX_HEADER_BYTES) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: header length %llu bytes is over the limit of %d (the reference "
                   "safetensors library's); not a safetensors file, or a corrupt one",
                   path, (unsigned long long)header_bytes, MP_SAFETENSORS_MAX_HEADER_BYTES);
  }
  if ((int64_t)header_bytes > file->file_bytes - 8) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: header length %llu bytes runs past the end of the file (%lld bytes, so "
                   "at most %lld); the file is truncated or not a safetensors file",
                   path, (unsigned long long)header_bytes, (long long)file->file_bytes,
                   (long long)(file->file_bytes - 8));
  }
  file->data_start = 8 + (int64_t)header_bytes;
  unsigned char *header = malloc((size_t)header_bytes + 1);
  if (header == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: out of memory for a %llu-byte header", path,
                   (unsigned long long)header_bytes);
  }
  mp_status status = read_exactly(file, 8, header, (size_t)header_bytes, "the header", err);
  header[header_bytes] = '\0';
  if (status == MP_OK) status = check_header_bytes(path, header, (size_t)header_bytes, err);
  cJSON *root = NULL;
  if (status == MP_OK) {
    char source[MP_ATOMIC_FILE_PATH_BYTES + 16];
    snprintf(source, sizeof source, "%s: header", path);
    status = mp_json_parse_text((const char *)header, source, &root, err);
  }
  free(header);
  if (status == MP_OK) status = parse_header(path, root, file, out_tensors, out_count, err);
  cJSON_Delete(root);
  return status;
}

static mp_safetensors *new_checkpoint(const char *source, int num_files) {
  mp_safetensors *st = calloc(1, sizeof *st);
  if (st == NULL) return NULL;
  st->source = copy_text(source);
  st->files = calloc((size_t)(num_files > 0 ? num_files : 1), sizeof *st->files);
  if (st->source == NULL || st->files == NULL) {
    free(st->source);
    free(st->files);
    free(st);
    return NULL;
  }
  for (int i = 0; i < num_files; ++i) st->files[i].fd = -1;
  return st;
}

mp_status mp_safetensors_open_file(const char *path, mp_safetensors **out, mp_error *err) {
  *out = NULL;
  mp_safetensors *st = new_checkpoint(path, 1);
  if (st == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  st->num_files = 1;
  mp_status status = open_one_file(path, &st->files[0], &st->tensors, &st->num_tensors, err);
  if (status != MP_OK) {
    mp_safetensors_close(st);
    return status;
  }
  for (int i = 0; i < st->num_tensors; ++i) st->tensors[i].file = st->files[0].path;
  *out = st;
  return MP_OK;
}

/* weight_map entries, sorted by tensor name. */
typedef struct {
  const char *tensor;
  const char *file;
  int file_index;
} map_entry;

static int compare_map_entries(const void *a, const void *b) {
  return strcmp(((const map_entry *)a)->tensor, ((const map_entry *)b)->tensor);
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const mp_safetensors_tensor *find_in(const mp_safetensors_tensor *tensors, int count,
                                            const char *name) {
  mp_safetensors_tensor key;
  memset(&key, 0, sizeof key);
  key.name = name;
  return bsearch(&key, tensors, (size_t)count, sizeof *tensors, compare_tensor_names);
}

/* Reads the weight_map of an index into entries sorted by tensor name, and the distinct file
 * names sorted (pointing into root). */
static mp_status read_weight_map(const char *index_path, const cJSON *root, map_entry **out_map,
                                 int *out_map_count, const char ***out_files, int *out_file_count,
                                 mp_error *err) {
  mp_json_reader reader = {index_path, err};
  MP_TRY(mp_json_expect_object(&reader, root, "$", "a safetensors index"));
  const cJSON *weight_map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (weight_map == NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: $: no \"weight_map\" (tensor name -> file name); not a "
                   "model.safetensors.index.json",
                   index_path);
  }
  MP_TRY(mp_json_expect_object(&reader, weight_map, "$.weight_map",
                               "the map of tensor name -> file name"));
  const int count = cJSON_GetArraySize(weight_map);
  map_entry *map = calloc((size_t)(count > 0 ? count : 1), sizeof *map);
  const char **files = calloc((size_t)(count > 0 ? count : 1), sizeof *files);
  if (map == NULL || files == NULL) {
    free(map);
    free(files);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  mp_status status = MP_OK;
  int i = 0;
  for (const cJSON *entry = weight_map->child; entry != NULL; entry = entry->next, ++i) {
    const char *file = cJSON_IsString(entry) ? entry->valuestring : NULL;
    if (file == NULL) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: $.weight_map[\"%s\"]: expected a file name (a string), got %s",
                       index_path, entry->string, mp_json_type_name(entry));
      break;
    }
    /* Files sit beside the index: a name with a directory in it would let an index reach any
     * file on the machine. */
    if (file[0] == '\0' || strchr(file, '/') != NULL || strcmp(file, ".") == 0 ||
        strcmp(file, "..") == 0) {
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: $.weight_map[\"%s\"]: \"%s\" is not a file name in the index's "
                       "directory (no '/', not empty, not . or ..)",
                       index_path, entry->string, file);
      break;
    }
    map[i].tensor = entry->string;
    map[i].file = file;
    files[i] = file;
  }
  if (status == MP_OK) {
    qsort(map, (size_t)count, sizeof *map, compare_map_entries);
    for (int k = 1; k < count; ++k) {
      if (strcmp(map[k - 1].tensor, map[k].tensor) == 0) {
        status = mp_fail(err, MP_ERR_INPUT, "%s: $.weight_map: tensor \"%s\" listed twice",
                         index_path, map[k].tensor);
        break;
      }
    }
  }
  if (status != MP_OK) {
    free(map);
    free(files);
    return status;
  }
  qsort(files, (size_t)count, sizeof *files, compare_strings);
  int distinct = 0;
  for (int k = 0; k < count; ++k) {
    if (distinct == 0 || strcmp(files[distinct - 1], files[k]) != 0) files[distinct++] = files[k];
  }
  for (int k = 0; k < count; ++k) {
    const char **found =
        bsearch(&map[k].file, files, (size_t)distinct, sizeof *files, compare_strings);
    map[k].file_index = (int)(found - files);
  }
  *out_map = map;
  *out_map_count = count;
  *out_files = files;
  *out_file_count = distinct;
  return MP_OK;
}

/* Every weight_map entry is a tensor of its file, and every tensor of a file is in the map,
 * mapped to that file. */
static mp_status check_map_against_files(const char *index_path, const map_entry *map,
                                         int map_count, mp_safetensors_tensor *const *per_file,
                                         const int *per_file_count, const mp_safetensors *st,
                                         mp_error *err) {
  for (int k = 0; k < map_count; ++k) {
    const int f = map[k].file_index;
    if (find_in(per_file[f], per_file_count[f], map[k].tensor) != NULL) continue;
    for (int g = 0; g < st->num_files; ++g) {
      if (find_in(per_file[g], per_file_count[g], map[k].tensor) != NULL) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: $.weight_map puts tensor \"%s\" in %s, which has no such tensor (%s "
                       "has it)",
                       index_path, map[k].tensor, st->files[f].path, st->files[g].path);
      }
    }
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: $.weight_map puts tensor \"%s\" in %s, which has no such tensor",
                   index_path, map[k].tensor, st->files[f].path);
  }
  for (int f = 0; f < st->num_files; ++f) {
    for (int i = 0; i < per_file_count[f]; ++i) {
      map_entry key = {per_file[f][i].name, NULL, 0};
      const map_entry *entry =
          bsearch(&key, map, (size_t)map_count, sizeof *map, compare_map_entries);
      if (entry == NULL) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: %s holds tensor \"%s\", which $.weight_map does not list", index_path,
                       st->files[f].path, per_file[f][i].name);
      }
      if (entry->file_index != f) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s: %s holds tensor \"%s\", which $.weight_map puts in %s", index_path,
                       st->files[f].path, per_file[f][i].name, st->files[entry->file_index].path);
      }
    }
  }
  return MP_OK;
}

mp_status mp_safetensors_open_index(const char *index_path, mp_safetensors **out, mp_error *err) {
  *out = NULL;
  cJSON *root = NULL;
  MP_TRY(mp_json_load_file(index_path, &root, err));
  map_entry *map = NULL;
  const char **file_names = NULL;
  int map_count = 0, num_files = 0;
  mp_status status =
      read_weight_map(index_path, root, &map, &map_count, &file_names, &num_files, err);
  mp_safetensors *st = NULL;
  mp_safetensors_tensor **per_file = NULL;
  int *per_file_count = NULL;
  if (status == MP_OK) {
    st = new_checkpoint(index_path, num_files);
    per_file = calloc((size_t)(num_files > 0 ? num_files : 1), sizeof *per_file);
    per_file_count = calloc((size_t)(num_files > 0 ? num_files : 1), sizeof *per_file_count);
    if (st == NULL || per_file == NULL || per_file_count == NULL) {
      status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
  }
  /* The shards' paths: the index's directory, then the name. */
  const char *slash = strrchr(index_path, '/');
  const size_t dir_bytes = slash != NULL ? (size_t)(slash - index_path) + 1 : 0;
  for (int f = 0; status == MP_OK && f < num_files; ++f) {
    char path[MP_ATOMIC_FILE_PATH_BYTES];
    if (dir_bytes + strlen(file_names[f]) + 1 > sizeof path) {
      status =
          mp_fail(err, MP_ERR_INPUT, "%s: the path of %s is too long", index_path, file_names[f]);
      break;
    }
    memcpy(path, index_path, dir_bytes);
    strcpy(path + dir_bytes, file_names[f]);
    st->num_files = f + 1;
    if (access(path, F_OK) != 0) {
      const char *tensor = "";
      for (int k = 0; k < map_count; ++k) {
        if (map[k].file_index == f) {
          tensor = map[k].tensor;
          break;
        }
      }
      status = mp_fail(err, MP_ERR_INPUT,
                       "%s: $.weight_map puts tensor \"%s\" in %s, which is missing: %s",
                       index_path, tensor, path, strerror(errno));
      st->files[f].path = NULL;
      break;
    }
    status = open_one_file(path, &st->files[f], &per_file[f], &per_file_count[f], err);
  }
  if (status == MP_OK) {
    status = check_map_against_files(index_path, map, map_count, per_file, per_file_count, st, err);
  }
  if (status == MP_OK) {
    /* One table of every tensor, sorted by name; the per-file tables give up their fields. */
    st->tensors = calloc((size_t)(map_count > 0 ? map_count : 1), sizeof *st->tensors);
    if (st->tensors == NULL) status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    for (int f = 0; status == MP_OK && f < num_files; ++f) {
      for (int i = 0; i < per_file_count[f]; ++i) {
        per_file[f][i].file = st->files[f].path;
        per_file[f][i].file_index = f;
        st->tensors[st->num_tensors++] = per_file[f][i];
      }
      per_file_count[f] = 0; /* moved */
    }
    if (status == MP_OK) {
      qsort(st->tensors, (size_t)st->num_tensors, sizeof *st->tensors, compare_tensor_names);
    }
  }
  for (int f = 0; per_file != NULL && f < num_files; ++f) {
    free_tensor_fields(per_file[f], per_file_count[f]);
    free(per_file[f]);
  }
  free(per_file);
  free(per_file_count);
  free(map);
  free(file_names);
  cJSON_Delete(root);
  if (status != MP_OK) {
    mp_safetensors_close(st);
    return status;
  }
  *out = st;
  return MP_OK;
}

mp_status mp_safetensors_open_dir(const char *dir, mp_safetensors **out, mp_error *err) {
  *out = NULL;
  struct stat info;
  if (stat(dir, &info) != 0) return mp_fail(err, MP_ERR_INPUT, "%s: %s", dir, strerror(errno));
  if (!S_ISDIR(info.st_mode)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: not a directory; expected a Hugging Face checkpoint directory", dir);
  }
  char path[MP_ATOMIC_FILE_PATH_BYTES];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (access(path, F_OK) == 0) return mp_safetensors_open_file(path, out, err);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  if (access(path, F_OK) == 0) return mp_safetensors_open_index(path, out, err);
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: neither model.safetensors nor model.safetensors.index.json is there; save "
                 "the checkpoint with transformers' save_pretrained (safe_serialization=True, the "
                 "default)",
                 dir);
}

const char *mp_safetensors_source(const mp_safetensors *st) { return st->source; }
int mp_safetensors_num_tensors(const mp_safetensors *st) { return st->num_tensors; }

const mp_safetensors_tensor *mp_safetensors_tensor_at(const mp_safetensors *st, int index) {
  return index >= 0 && index < st->num_tensors ? &st->tensors[index] : NULL;
}

const mp_safetensors_tensor *mp_safetensors_find(const mp_safetensors *st, const char *name) {
  return find_in(st->tensors, st->num_tensors, name);
}

int mp_safetensors_num_files(const mp_safetensors *st) { return st->num_files; }

const char *mp_safetensors_file_path(const mp_safetensors *st, int file_index) {
  return file_index >= 0 && file_index < st->num_files ? st->files[file_index].path : NULL;
}

int mp_safetensors_num_metadata(const mp_safetensors *st, int file_index) {
  return file_index >= 0 && file_index < st->num_files ? st->files[file_index].num_metadata : 0;
}

void mp_safetensors_metadata_at(const mp_safetensors *st, int file_index, int entry,
                                const char **out_key, const char **out_value) {
  *out_key = *out_value = NULL;
  if (entry < 0 || entry >= mp_safetensors_num_metadata(st, file_index)) return;
  *out_key = st->files[file_index].metadata[2 * entry];
  *out_value = st->files[file_index].metadata[2 * entry + 1];
}

const char *mp_safetensors_metadata_get(const mp_safetensors *st, int file_index, const char *key) {
  for (int i = 0; i < mp_safetensors_num_metadata(st, file_index); ++i) {
    if (strcmp(st->files[file_index].metadata[2 * i], key) == 0) {
      return st->files[file_index].metadata[2 * i + 1];
    }
  }
  return NULL;
}

/* "<source>: no tensor "x"" with the closest name, if one is close. */
static mp_status fail_absent(const mp_safetensors *st, const char *name, mp_error *err) {
  const char **names = malloc(sizeof *names * (size_t)(st->num_tensors + 1));
  const char *closest = NULL;
  if (names != NULL) {
    for (int i = 0; i < st->num_tensors; ++i) names[i] = st->tensors[i].name;
    names[st->num_tensors] = NULL;
    closest = mp_closest_word(name, names);
  }
  mp_status status = closest != NULL
                         ? mp_fail(err, MP_ERR_INPUT, "%s: no tensor \"%s\"; did you mean \"%s\"?",
                                   st->source, name, closest)
                         : mp_fail(err, MP_ERR_INPUT, "%s: no tensor \"%s\" (it has %d tensors)",
                                   st->source, name, st->num_tensors);
  free(names);
  return status;
}

/* "BF16, F16 or F32" for a dtype set. */
static void format_dtype_set(char *text, size_t bytes, unsigned dtype_set) {
  int count = 0, total = 0;
  for (int d = 0; d < MP_SAFETENSORS_NUM_DTYPES; ++d) total += (dtype_set >> d) & 1;
  size_t used = 0;
  text[0] = '\0';
  for (int d = 0; d < MP_SAFETENSORS_NUM_DTYPES && used < bytes; ++d) {
    if (!((dtype_set >> d) & 1)) continue;
    const char *separator = count == 0 ? "" : count == total - 1 ? " or " : ", ";
    used += (size_t)snprintf(text + used, bytes - used, "%s%s", separator, kDtypeNames[d]);
    ++count;
  }
  if (total == 0) snprintf(text, bytes, "no dtype");
}

mp_status mp_safetensors_expect(const mp_safetensors *st, const char *name, unsigned dtype_set,
                                int rank, const int64_t *shape, const mp_safetensors_tensor **out,
                                mp_error *err) {
  if (out != NULL) *out = NULL;
  const mp_safetensors_tensor *t = mp_safetensors_find(st, name);
  if (t == NULL) return fail_absent(st, name, err);
  bool same_shape = t->rank == rank;
  for (int i = 0; same_shape && i < rank; ++i) same_shape = t->shape[i] == shape[i];
  if (!(dtype_set & MP_SAFETENSORS_DTYPE_BIT(t->dtype)) || !same_shape) {
    char dtypes[160], expected[256], found[256];
    format_dtype_set(dtypes, sizeof dtypes, dtype_set);
    format_shape(expected, sizeof expected, rank, shape);
    format_shape(found, sizeof found, t->rank, t->shape);
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\": expected %s of shape %s, found %s of shape %s", t->file,
                   name, dtypes, expected, kDtypeNames[t->dtype], found);
  }
  if (out != NULL) *out = t;
  return MP_OK;
}

/* The tensor called name, which the readers can convert to fp32. */
static mp_status find_float_tensor(const mp_safetensors *st, const char *name,
                                   const mp_safetensors_tensor **out, mp_error *err) {
  const mp_safetensors_tensor *t = mp_safetensors_find(st, name);
  if (t == NULL) return fail_absent(st, name, err);
  if (!is_float_dtype(t->dtype)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: tensor \"%s\" is %s; only BF16, F16 and F32 tensors convert to fp32",
                   t->file, name, kDtypeNames[t->dtype]);
  }
  *out = t;
  return MP_OK;
}

/* The matrix view of a tensor of rank >= 1: shape[0] rows of the other dimensions' product. */
static mp_status matrix_view(const mp_safetensors_tensor *t, int64_t *out_rows,
                             int64_t *out_columns, mp_error *err) {
  if (t->rank < 1) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: tensor \"%s\" is a scalar; it has no rows (read it with "
                   "mp_safetensors_read_elements)",
                   t->file, t->name);
  }
  /* At most 2^53 when shape[0] > 0 (opening checked the element count); with no rows the
   * product can be anything, so it saturates: every block of such a tensor is empty. */
  int64_t columns = 1;
  for (int i = 1; i < t->rank; ++i) {
    if (__builtin_mul_overflow(columns, t->shape[i], &columns)) columns = INT64_MAX;
  }
  *out_rows = t->shape[0];
  *out_columns = columns;
  return MP_OK;
}

static mp_status staging_buffer(const mp_safetensors_tensor *t, int64_t bytes_wanted,
                                unsigned char **out, mp_error *err) {
  const size_t bytes =
      (size_t)(bytes_wanted < MP_SAFETENSORS_STAGING_BYTES ? bytes_wanted
                                                           : MP_SAFETENSORS_STAGING_BYTES);
  *out = malloc(bytes > 0 ? bytes : 1);
  if (*out == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for %zu bytes of staging to read %s", bytes,
                   t->name);
  }
  return MP_OK;
}

static mp_status read_range(const mp_safetensors *st, const mp_safetensors_tensor *t, int64_t begin,
                            int64_t end, float *out, mp_error *err) {
  const int element_bytes = kDtypeBytes[t->dtype];
  unsigned char *staging = NULL;
  MP_TRY(staging_buffer(t, (end - begin) * element_bytes, &staging, err));
  const int64_t chunk = MP_SAFETENSORS_STAGING_BYTES / element_bytes;
  char what[64 + 256];
  snprintf(what, sizeof what, "tensor \"%s\"", t->name);
  mp_status status = MP_OK;
  for (int64_t at = begin; status == MP_OK && at < end; at += chunk) {
    const int64_t count = end - at < chunk ? end - at : chunk;
    status = read_exactly(&st->files[t->file_index], t->file_offset + at * element_bytes, staging,
                          (size_t)(count * element_bytes), what, err);
    if (status == MP_OK) decode_floats(t->dtype, staging, count, out + (at - begin), 1);
  }
  free(staging);
  return status;
}

mp_status mp_safetensors_read_elements(const mp_safetensors *st, const char *name, int64_t begin,
                                       int64_t end, float *out, mp_error *err) {
  const mp_safetensors_tensor *t = NULL;
  MP_TRY(find_float_tensor(st, name, &t, err));
  if (begin < 0 || end < begin || end > t->num_elements) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: tensor \"%s\": elements [%lld, %lld) are not inside its %lld elements",
                   t->file, name, (long long)begin, (long long)end, (long long)t->num_elements);
  }
  return read_range(st, t, begin, end, out, err);
}

mp_status mp_safetensors_read_rows(const mp_safetensors *st, const char *name, int64_t row_begin,
                                   int64_t row_end, float *out, mp_error *err) {
  const mp_safetensors_tensor *t = NULL;
  MP_TRY(find_float_tensor(st, name, &t, err));
  int64_t rows, columns;
  MP_TRY(matrix_view(t, &rows, &columns, err));
  if (row_begin < 0 || row_end < row_begin || row_end > rows) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: tensor \"%s\": rows [%lld, %lld) are not inside its %lld rows", t->file,
                   name, (long long)row_begin, (long long)row_end, (long long)rows);
  }
  return read_range(st, t, row_begin * columns, row_end * columns, out, err);
}

mp_status mp_safetensors_read_block(const mp_safetensors *st, const char *name, int64_t row_begin,
                                    int64_t row_end, int64_t col_begin, int64_t col_end,
                                    mp_safetensors_block_layout layout, float *out, mp_error *err) {
  const mp_safetensors_tensor *t = NULL;
  MP_TRY(find_float_tensor(st, name, &t, err));
  int64_t rows, columns;
  MP_TRY(matrix_view(t, &rows, &columns, err));
  if (row_begin < 0 || row_end < row_begin || row_end > rows || col_begin < 0 ||
      col_end < col_begin || col_end > columns) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: tensor \"%s\": the block rows [%lld, %lld) x columns [%lld, %lld) is not "
                   "inside its %lld x %lld",
                   t->file, name, (long long)row_begin, (long long)row_end, (long long)col_begin,
                   (long long)col_end, (long long)rows, (long long)columns);
  }
  const int64_t block_rows = row_end - row_begin, width = col_end - col_begin;
  if (block_rows == 0 || width == 0) return MP_OK;
  const int element_bytes = kDtypeBytes[t->dtype];
  const int64_t row_bytes = columns * element_bytes, part_bytes = width * element_bytes;
  /* Output position of element (row r of the block, column c of the block). */
  const int64_t row_step = layout == MP_SAFETENSORS_TRANSPOSED ? 1 : width;
  const int64_t column_step = layout == MP_SAFETENSORS_TRANSPOSED ? block_rows : 1;
  const safetensors_file *file = &st->files[t->file_index];
  char what[64 + 256];
  snprintf(what, sizeof what, "tensor \"%s\"", t->name);
  unsigned char *staging = NULL;
  mp_status status = MP_OK;
  if (row_bytes - part_bytes <= kBlockGapBytes && row_bytes <= MP_SAFETENSORS_STAGING_BYTES) {
    /* Several rows per pread: from the first row's part to the last one's, gaps included. */
    const int64_t rows_per_read = (MP_SAFETENSORS_STAGING_BYTES - part_bytes) / row_bytes + 1;
    const int64_t most_rows = rows_per_read < block_rows ? rows_per_read : block_rows;
    MP_TRY(staging_buffer(t, (most_rows - 1) * row_bytes + part_bytes, &staging, err));
    for (int64_t r = 0; status == MP_OK && r < block_rows; r += rows_per_read) {
      const int64_t n = block_rows - r < rows_per_read ? block_rows - r : rows_per_read;
      const int64_t offset =
          t->file_offset + ((row_begin + r) * columns + col_begin) * element_bytes;
      status = read_exactly(file, offset, staging, (size_t)((n - 1) * row_bytes + part_bytes), what,
                            err);
      for (int64_t i = 0; status == MP_OK && i < n; ++i) {
        decode_floats(t->dtype, staging + i * row_bytes, width, out + (r + i) * row_step,
                      column_step);
      }
    }
  } else {
    /* Each row's part alone, in pieces of at most the staging size. */
    MP_TRY(staging_buffer(t, part_bytes, &staging, err));
    const int64_t chunk = MP_SAFETENSORS_STAGING_BYTES / element_bytes;
    for (int64_t r = 0; status == MP_OK && r < block_rows; ++r) {
      for (int64_t c = 0; status == MP_OK && c < width; c += chunk) {
        const int64_t n = width - c < chunk ? width - c : chunk;
        const int64_t offset =
            t->file_offset + ((row_begin + r) * columns + col_begin + c) * element_bytes;
        status = read_exactly(file, offset, staging, (size_t)(n * element_bytes), what, err);
        if (status == MP_OK) {
          decode_floats(t->dtype, staging, n, out + r * row_step + c * column_step, column_step);
        }
      }
    }
  }
  free(staging);
  return status;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  char *name;
  mp_safetensors_dtype dtype;
  int rank;
  int64_t *shape; /* (rank,) */
  int64_t num_elements;
  int64_t data_begin; /* byte offset in the data section */
  int64_t written;    /* elements appended so far */
} writer_tensor;

struct mp_safetensors_writer {
  mp_atomic_file file;
  int num_tensors;
  writer_tensor *tensors;  /* (num_tensors,) in file order */
  writer_tensor **by_name; /* (num_tensors,) sorted by name, for appends */
  int64_t data_start;      /* 8 + header bytes */
  int64_t data_bytes;
  unsigned char *staging; /* MP_SAFETENSORS_STAGING_BYTES */
};

/* The reference's file order: dtype descending in its enum order (largest alignment first, so
 * every tensor is aligned to its element size), then name. */
static int compare_file_order(const void *a, const void *b) {
  const writer_tensor *x = a, *y = b;
  if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int compare_writer_names(const void *a, const void *b) {
  return strcmp((*(const writer_tensor *const *)a)->name, (*(const writer_tensor *const *)b)->name);
}

static void free_writer(mp_safetensors_writer *writer) {
  for (int i = 0; i < writer->num_tensors; ++i) {
    free(writer->tensors[i].name);
    free(writer->tensors[i].shape);
  }
  free(writer->tensors);
  free(writer->by_name);
  free(writer->staging);
  free(writer);
}

static mp_status check_specs(const char *path, const mp_safetensors_tensor_spec *tensors,
                             int num_tensors, const char *const *metadata, int num_metadata,
                             mp_error *err) {
  for (int m = 0; m < 2 * num_metadata; ++m) {
    if (metadata[m] == NULL || !is_utf8(metadata[m])) {
      return mp_fail(err, MP_ERR_INPUT, "%s: metadata %s %d is %s", path, m % 2 ? "value" : "key",
                     m / 2, metadata[m] == NULL ? "NULL" : "not UTF-8");
    }
    for (int k = 0; m % 2 == 0 && k < m; k += 2) {
      if (strcmp(metadata[k], metadata[m]) == 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: metadata key \"%s\" given twice", path, metadata[m]);
      }
    }
  }
  for (int i = 0; i < num_tensors; ++i) {
    const mp_safetensors_tensor_spec *spec = &tensors[i];
    if (spec->name == NULL || !is_utf8(spec->name)) {
      return mp_fail(err, MP_ERR_INPUT, "%s: tensor %d: the name is %s", path, i,
                     spec->name == NULL ? "NULL" : "not UTF-8");
    }
    if (strcmp(spec->name, "__metadata__") == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: tensor %d: \"__metadata__\" is the header's metadata key, not a tensor "
                     "name",
                     path, i);
    }
    if (!is_float_dtype(spec->dtype)) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: tensor \"%s\": dtype %s; the writer converts fp32 to F32, BF16 or F16 "
                     "only",
                     path, spec->name, mp_safetensors_dtype_name(spec->dtype));
    }
    if (spec->rank < 0 || (spec->rank > 0 && spec->shape == NULL)) {
      return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": rank %d without a shape", path,
                     spec->name, spec->rank);
    }
    int64_t elements = 1;
    for (int d = 0; d < spec->rank; ++d) {
      if (spec->shape[d] < 0) {
        return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": shape[%d] is %lld, negative", path,
                       spec->name, d, (long long)spec->shape[d]);
      }
      if (spec->shape[d] != 0 && elements > kMaxWholeNumber / spec->shape[d] / 8) {
        return mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\": 2^53 bytes or more", path,
                       spec->name);
      }
      elements *= spec->shape[d];
    }
  }
  return MP_OK;
}

/* The header as the reference writes it: compact JSON, "__metadata__" first, then the tensors in
 * file order, then spaces to a multiple of 8 bytes. */
static void build_header(const mp_safetensors_writer *writer, const char *const *metadata,
                         int num_metadata, mp_text_buffer *header) {
  mp_text_buffer_append_text(header, "{");
  if (num_metadata > 0) {
    mp_text_buffer_append_text(header, "\"__metadata__\":{");
    for (int m = 0; m < num_metadata; ++m) {
      if (m > 0) mp_text_buffer_append_text(header, ",");
      buffer_json_string_serde(header, metadata[2 * m]);
      mp_text_buffer_append_text(header, ":");
      buffer_json_string_serde(header, metadata[2 * m + 1]);
    }
    mp_text_buffer_append_text(header, writer->num_tensors > 0 ? "}," : "}");
  }
  for (int i = 0; i < writer->num_tensors; ++i) {
    const writer_tensor *t = &writer->tensors[i];
    if (i > 0) mp_text_buffer_append_text(header, ",");
    buffer_json_string_serde(header, t->name);
    mp_text_buffer_append_text(header, ":{\"dtype\":\"");
    mp_text_buffer_append_text(header, kDtypeNames[t->dtype]);
    mp_text_buffer_append_text(header, "\",\"shape\":[");
    for (int d = 0; d < t->rank; ++d) {
      if (d > 0) mp_text_buffer_append_text(header, ",");
      buffer_int(header, t->shape[d]);
    }
    mp_text_buffer_append_text(header, "],\"data_offsets\":[");
    buffer_int(header, t->data_begin);
    mp_text_buffer_append_text(header, ",");
    buffer_int(header, t->data_begin + t->num_elements * kDtypeBytes[t->dtype]);
    mp_text_buffer_append_text(header, "]}");
  }
  mp_text_buffer_append_text(header, "}");
  while (header->length % 8 != 0) mp_text_buffer_append_text(header, " ");
}

mp_status mp_safetensors_writer_create(const char *path, const mp_safetensors_tensor_spec *tensors,
                                       int num_tensors, const char *const *metadata,
                                       int num_metadata, mp_safetensors_writer **out,
                                       mp_error *err) {
  *out = NULL;
  if (metadata == NULL) num_metadata = 0;
  if (num_tensors < 0 || num_metadata < 0 || (num_tensors > 0 && tensors == NULL)) {
    return mp_fail(err, MP_ERR_INPUT, "%s: %d tensors and %d metadata entries", path, num_tensors,
                   num_metadata);
  }
  MP_TRY(check_specs(path, tensors, num_tensors, metadata, num_metadata, err));
  mp_safetensors_writer *writer = calloc(1, sizeof *writer);
  if (writer == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  writer->tensors = calloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *writer->tensors);
  writer->by_name = calloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *writer->by_name);
  writer->staging = malloc(MP_SAFETENSORS_STAGING_BYTES);
  if (writer->tensors == NULL || writer->by_name == NULL || writer->staging == NULL) {
    free_writer(writer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  for (int i = 0; i < num_tensors; ++i) {
    writer_tensor *t = &writer->tensors[i];
    t->name = copy_text(tensors[i].name);
    t->dtype = tensors[i].dtype;
    t->rank = tensors[i].rank;
    t->shape = malloc(sizeof *t->shape * (size_t)(t->rank > 0 ? t->rank : 1));
    writer->num_tensors = i + 1;
    if (t->name == NULL || t->shape == NULL) {
      free_writer(writer);
      return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    }
    t->num_elements = 1;
    for (int d = 0; d < t->rank; ++d) {
      t->shape[d] = tensors[i].shape[d];
      t->num_elements *= t->shape[d];
    }
  }
  qsort(writer->tensors, (size_t)num_tensors, sizeof *writer->tensors, compare_file_order);
  int64_t offset = 0;
  for (int i = 0; i < num_tensors; ++i) {
    writer->tensors[i].data_begin = offset;
    offset += writer->tensors[i].num_elements * kDtypeBytes[writer->tensors[i].dtype];
    writer->by_name[i] = &writer->tensors[i];
  }
  writer->data_bytes = offset;
  qsort(writer->by_name, (size_t)num_tensors, sizeof *writer->by_name, compare_writer_names);
  for (int i = 1; i < num_tensors; ++i) {
    if (strcmp(writer->by_name[i - 1]->name, writer->by_name[i]->name) == 0) {
      mp_status status = mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\" given twice", path,
                                 writer->by_name[i]->name);
      free_writer(writer);
      return status;
    }
  }
  mp_text_buffer header = {0};
  build_header(writer, metadata, num_metadata, &header);
  if (header.failed || header.length > MP_SAFETENSORS_MAX_HEADER_BYTES) {
    mp_status status =
        header.failed ? mp_fail(err, MP_ERR_RUNTIME, "out of memory")
                      : mp_fail(err, MP_ERR_INPUT,
                                "%s: the header would be %zu bytes, over the reference's limit of "
                                "%d; split the tensors over more files",
                                path, header.length, MP_SAFETENSORS_MAX_HEADER_BYTES);
    free(header.data);
    free_writer(writer);
    return status;
  }
  writer->data_start = 8 + (int64_t)header.length;
  mp_status status = mp_atomic_file_open(&writer->file, path, err);
  if (status != MP_OK) {
    free(header.data);
    free_writer(writer);
    return status;
  }
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = (unsigned char)((uint64_t)header.length >> (8 * i));
  mp_atomic_file_write(&writer->file, length_bytes, 8);
  mp_atomic_file_write(&writer->file, header.data, header.length);
  free(header.data);
  *out = writer;
  return MP_OK;
}

mp_status mp_safetensors_writer_append(mp_safetensors_writer *writer, const char *name,
                                       const float *values, int64_t count, mp_error *err) {
  writer_tensor key_tensor = {0};
  key_tensor.name = (char *)name;
  const writer_tensor *key = &key_tensor;
  writer_tensor **found = bsearch(&key, writer->by_name, (size_t)writer->num_tensors,
                                  sizeof *writer->by_name, compare_writer_names);
  if (found == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: no tensor \"%s\" was declared to the writer",
                   writer->file.path, name);
  }
  writer_tensor *t = *found;
  if (count < 0 || count > t->num_elements - t->written) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: tensor \"%s\": %lld more values after %lld of its %lld elements",
                   writer->file.path, name, (long long)count, (long long)t->written,
                   (long long)t->num_elements);
  }
  const int element_bytes = kDtypeBytes[t->dtype];
  const int64_t chunk = MP_SAFETENSORS_STAGING_BYTES / element_bytes;
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t n = count - done < chunk ? count - done : chunk;
    encode_floats(t->dtype, values + done, n, writer->staging);
    mp_atomic_file_write_at(
        &writer->file, writer->data_start + t->data_begin + (t->written + done) * element_bytes,
        writer->staging, (size_t)(n * element_bytes));
  }
  t->written += count;
  return MP_OK;
}

int64_t mp_safetensors_writer_file_bytes(const mp_safetensors_writer *writer) {
  return writer->data_start + writer->data_bytes;
}

mp_status mp_safetensors_writer_finish(mp_safetensors_writer *writer, mp_error *err) {
  for (int i = 0; i < writer->num_tensors; ++i) {
    const writer_tensor *t = writer->by_name[i];
    if (t->written != t->num_elements) {
      mp_status status =
          mp_fail(err, MP_ERR_RUNTIME,
                  "%s: tensor \"%s\" got %lld of its %lld values; the file is not "
                  "written",
                  writer->file.path, t->name, (long long)t->written, (long long)t->num_elements);
      mp_safetensors_writer_abort(writer);
      return status;
    }
  }
  mp_status status = mp_atomic_file_commit(&writer->file, err);
  free_writer(writer);
  return status;
}

void mp_safetensors_writer_abort(mp_safetensors_writer *writer) {
  if (writer == NULL) return;
  mp_atomic_file_abort(&writer->file);
  free_writer(writer);
}

typedef struct {
  const char *tensor, *file;
} index_entry;

static int compare_index_entries(const void *a, const void *b) {
  return strcmp(((const index_entry *)a)->tensor, ((const index_entry *)b)->tensor);
}

mp_status mp_safetensors_write_index(const char *path, const char *const *tensor_names,
                                     const char *const *file_names, int num_tensors,
                                     int64_t total_size, mp_error *err) {
  index_entry *entries = calloc((size_t)(num_tensors > 0 ? num_tensors : 1), sizeof *entries);
  if (entries == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  for (int i = 0; i < num_tensors; ++i) {
    if (tensor_names[i] == NULL || file_names[i] == NULL || !is_utf8(tensor_names[i]) ||
        !is_utf8(file_names[i])) {
      free(entries);
      return mp_fail(err, MP_ERR_INPUT, "%s: entry %d: a tensor or file name that is %s", path, i,
                     tensor_names[i] == NULL || file_names[i] == NULL ? "NULL" : "not UTF-8");
    }
    entries[i].tensor = tensor_names[i];
    entries[i].file = file_names[i];
  }
  qsort(entries, (size_t)num_tensors, sizeof *entries, compare_index_entries);
  for (int i = 1; i < num_tensors; ++i) {
    if (strcmp(entries[i - 1].tensor, entries[i].tensor) == 0) {
      mp_status status =
          mp_fail(err, MP_ERR_INPUT, "%s: tensor \"%s\" given twice", path, entries[i].tensor);
      free(entries);
      return status;
    }
  }
  /* json.dumps(index, indent=2, sort_keys=True) + "\n": "metadata" sorts before "weight_map". */
  mp_text_buffer text = {0};
  mp_text_buffer_append_text(&text, "{\n  \"metadata\": {\n    \"total_size\": ");
  buffer_int(&text, total_size);
  mp_text_buffer_append_text(&text,
              num_tensors > 0 ? "\n  },\n  \"weight_map\": {\n" : "\n  },\n  \"weight_map\": {}");
  for (int i = 0; i < num_tensors; ++i) {
    mp_text_buffer_append_text(&text, "    ");
    buffer_json_string_python(&text, entries[i].tensor);
    mp_text_buffer_append_text(&text, ": ");
    buffer_json_string_python(&text, entries[i].file);
    mp_text_buffer_append_text(&text, i + 1 < num_tensors ? ",\n" : "\n  }");
  }
  mp_text_buffer_append_text(&text, "\n}\n");
  free(entries);
  if (text.failed) {
    free(text.data);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  mp_status status = mp_write_file_atomically(path, text.data, text.length, err);
  free(text.data);
  return status;
}
