/*
 * engine/data/tokenizer/decoder.c — the decoder chain (decoder.h). A list of tokens is one text
 * buffer and the spans of the tokens in it; each step writes a new list.
 */
#include "engine/data/tokenizer/decoder.h"

#include <stdlib.h>
#include <string.h>

#include "engine/data/tokenizer/byte_level.h"
#include "engine/data/tokenizer/utf8.h"

typedef struct {
  mp_text_buffer text;
  size_t *starts, *ends;
  size_t count, capacity;
} token_list;

static bool push(token_list *list, const char *bytes, size_t length) {
  if (list->count == list->capacity) {
    size_t capacity = list->capacity == 0 ? 64 : list->capacity * 2;
    size_t *starts = realloc(list->starts, capacity * sizeof *starts);
    if (starts == NULL) return false;
    list->starts = starts;
    size_t *ends = realloc(list->ends, capacity * sizeof *ends);
    if (ends == NULL) return false;
    list->ends = ends;
    list->capacity = capacity;
  }
  list->starts[list->count] = list->text.length;
  mp_text_buffer_append(&list->text, bytes, length);
  list->ends[list->count] = list->text.length;
  list->count++;
  return !list->text.failed;
}

/* Extends the last token by bytes. */
static void extend(token_list *list, const char *bytes, size_t length) {
  mp_text_buffer_append(&list->text, bytes, length);
  list->ends[list->count - 1] = list->text.length;
}

static void list_free(token_list *list) {
  mp_text_buffer_free(&list->text);
  free(list->starts);
  free(list->ends);
  memset(list, 0, sizeof *list);
}

static const char *token_text(const token_list *list, size_t i) {
  return list->text.data + list->starts[i];
}

static size_t token_bytes(const token_list *list, size_t i) {
  return list->ends[i] - list->starts[i];
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* HF: a 6-byte "<0x..>" whose two middle characters parse as a u8 in base 16 (Rust's
 * from_str_radix, which also takes a leading '+'). */
static int fallback_byte(const char *t, size_t n) {
  if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
  if (t[3] == '+') return hex_value(t[4]);
  int hi = hex_value(t[3]), lo = hex_value(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static bool flush_bytes(token_list *out, mp_text_buffer *bytes) {
  if (bytes->length == 0) return true;
  bool ok = true;
  if (mp_utf8_valid_prefix(bytes->data, bytes->length) == bytes->length) {
    ok = push(out, bytes->data, bytes->length);
  } else {
    for (size_t i = 0; i < bytes->length && ok; i++) ok = push(out, "\xEF\xBF\xBD", 3);
  }
  bytes->length = 0;
  return ok;
}

static mp_status run_step(const mp_decode_step *step, const token_list *in, token_list *out,
                          mp_hf_regex_scratch *scratch, mp_hf_match_list *matches,
                          mp_error *err) {
  switch (step->kind) {
    case MP_DECODE_BYTE_LEVEL: {
      mp_text_buffer raw = {0};
      for (size_t i = 0; i < in->count; i++) {
        const char *t = token_text(in, i);
        size_t n = token_bytes(in, i);
        size_t mark = raw.length;
        bool all = true;
        for (size_t k = 0; k < n;) {
          size_t length;
          int b = mp_byte_level_byte(mp_utf8_decode(t + k, n - k, &length));
          if (b < 0) {
            all = false;
            break;
          }
          char byte = (char)b;
          mp_text_buffer_append(&raw, &byte, 1);
          k += length;
        }
        if (!all) {
          raw.length = mark; /* the token's own bytes instead */
          mp_text_buffer_append(&raw, t, n);
        }
      }
      mp_text_buffer lossy = {0};
      mp_utf8_append_lossy(&lossy, raw.data == NULL ? "" : raw.data, raw.length);
      bool ok = !raw.failed && !lossy.failed && push(out, lossy.data == NULL ? "" : lossy.data,
                                                      lossy.length);
      mp_text_buffer_free(&raw);
      mp_text_buffer_free(&lossy);
      return ok ? MP_OK : mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
    }
    case MP_DECODE_METASPACE:
      for (size_t i = 0; i < in->count; i++) {
        const char *t = token_text(in, i);
        size_t n = token_bytes(in, i);
        if (!push(out, "", 0)) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory");
        for (size_t k = 0; k < n;) {
          size_t length;
          uint32_t c = mp_utf8_decode(t + k, n - k, &length);
          if (c == step->character) {
            if (!(i == 0 && step->prepend_scheme != MP_PREPEND_NEVER)) extend(out, " ", 1);
          } else {
            extend(out, t + k, length);
          }
          k += length;
        }
      }
      break;
    case MP_DECODE_REPLACE:
      for (size_t i = 0; i < in->count; i++) {
        const char *t = token_text(in, i);
        size_t n = token_bytes(in, i);
        MP_TRY(mp_hf_regex_find_all(step->pattern, scratch, t, n, matches, err));
        if (!push(out, "", 0)) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory");
        size_t at = 0;
        for (size_t m = 0; m < matches->count; m++) {
          extend(out, t + at, matches->items[m].start - at);
          extend(out, step->content, step->content_bytes);
          at = matches->items[m].end;
        }
        extend(out, t + at, n - at);
      }
      break;
    case MP_DECODE_BYTE_FALLBACK: {
      mp_text_buffer bytes = {0};
      bool ok = true;
      for (size_t i = 0; i < in->count && ok; i++) {
        const char *t = token_text(in, i);
        size_t n = token_bytes(in, i);
        int b = fallback_byte(t, n);
        if (b >= 0) {
          char byte = (char)b;
          mp_text_buffer_append(&bytes, &byte, 1);
          continue;
        }
        ok = flush_bytes(out, &bytes) && push(out, t, n);
      }
      ok = ok && flush_bytes(out, &bytes) && !bytes.failed;
      mp_text_buffer_free(&bytes);
      if (!ok) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
      break;
    }
    case MP_DECODE_FUSE:
      if (!push(out, in->text.data == NULL ? "" : in->text.data, in->text.length)) {
        return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
      }
      break;
    case MP_DECODE_STRIP:
      for (size_t i = 0; i < in->count; i++) {
        const char *t = token_text(in, i);
        size_t n = token_bytes(in, i);
        size_t start = 0, end = n;
        for (size_t k = 0; k < step->strip_start && start < end; k++) {
          size_t length;
          if (mp_utf8_decode(t + start, end - start, &length) != step->character) break;
          start += length;
        }
        for (size_t k = 0; k < step->strip_stop && end > start; k++) {
          size_t back = end - 1;
          while (back > start && ((unsigned char)t[back] & 0xC0) == 0x80) back--;
          size_t length;
          if (mp_utf8_decode(t + back, end - back, &length) != step->character) break;
          end = back;
        }
        if (!push(out, t + start, end - start)) {
          return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
        }
      }
      break;
  }
  if (out->text.failed) return mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
  return MP_OK;
}

mp_status mp_decoder_run(const mp_decoder *decoder, const char *const *tokens, size_t count,
                         mp_text_buffer *out, mp_error *err) {
  out->length = 0;
  token_list a = {0}, b = {0};
  mp_status status = MP_OK;
  mp_hf_regex_scratch *scratch = NULL;
  mp_hf_match_list matches = {0};
  for (size_t i = 0; i < count; i++) {
    if (!push(&a, tokens[i], strlen(tokens[i]))) {
      status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
      goto done;
    }
  }
  if (!decoder->present) {
    for (size_t i = 0; i < a.count; i++) {
      if (i > 0) mp_text_buffer_append(out, " ", 1);
      mp_text_buffer_append(out, token_text(&a, i), token_bytes(&a, i));
    }
    goto done;
  }
  for (size_t s = 0; s < decoder->count; s++) {
    if (decoder->steps[s].kind == MP_DECODE_REPLACE && scratch == NULL) {
      scratch = mp_hf_regex_scratch_create();
      if (scratch == NULL) {
        status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
        goto done;
      }
    }
    b.count = 0;
    b.text.length = 0;
    status = run_step(&decoder->steps[s], &a, &b, scratch, &matches, err);
    if (status != MP_OK) goto done;
    token_list swap = a;
    a = b;
    b = swap;
  }
  mp_text_buffer_append(out, a.text.data == NULL ? "" : a.text.data, a.text.length);
done:
  if (status == MP_OK && out->failed) {
    status = mp_fail(err, MP_ERR_RUNTIME, "tokenizer: out of memory decoding");
  }
  list_free(&a);
  list_free(&b);
  mp_hf_regex_scratch_free(scratch);
  mp_hf_match_list_free(&matches);
  return status;
}

void mp_decoder_free(mp_decoder *decoder) {
  for (size_t s = 0; s < decoder->count; s++) {
    mp_hf_regex_free(decoder->steps[s].pattern);
    free(decoder->steps[s].content);
  }
  free(decoder->steps);
  memset(decoder, 0, sizeof *decoder);
}
