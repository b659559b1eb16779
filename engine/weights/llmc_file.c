/* engine/weights/llmc_file.c — llm.c's GPT-2 checkpoint files, read and written in the model's
 * parameter layout; see llmc_file.h. */
#include "engine/weights/llmc_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/float16.h"

enum {
  kLlmcMagic = 20240326,
  kLlmcVersionFp32 = 3,
  kLlmcVersionBf16 = 5,
  kLlmcHeaderInts = 256,
};

/* ---------------------------------------------------------------------------------------------
 * llm.c checkpoints: a 256 x int32 header, then wte, wpe, and each per-layer tensor for all L
 * layers in turn (ln1w for every layer, then ln1b for every layer, ...), then lnfw, lnfb. */

static const char *const kHeaderFields[8] = {"magic", "version", "max_seq_len", "vocab_size",
                                             "num_layers", "num_heads", "channels",
                                             "padded_vocab_size"};

/* llm.c's files hold GPT-2 only. */
static mp_status check_llmc_family(const mp_param_layout *layout, const char *path, mp_error *err) {
  if (mp_param_layout_config(layout)->family == MP_FAMILY_GPT2) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "%s: llm.c's checkpoint files hold GPT-2 models, and %s is a Llama-family model "
                 "(rmsnorm, swiglu, rotary embeddings, kv_heads, biases or an untied head); use "
                 "a Hugging Face checkpoint directory",
                 path, mp_param_layout_model_source(layout));
}

/* Visits every tensor in llm.c's file order, calling visit(tensor, context). */
static void for_each_in_llmc_order(const mp_param_layout *layout,
                                   void (*visit)(const mp_param_tensor *, void *), void *context) {
  const int per_block = mp_param_layout_tensors_per_block(layout);
  visit(mp_param_layout_tensor(layout, 0), context);
  visit(mp_param_layout_tensor(layout, 1), context);
  for (int k = 0; k < per_block; ++k) {
    for (int l = 0; l < mp_param_layout_config(layout)->num_layers; ++l) {
      visit(mp_param_layout_tensor(layout, mp_param_layout_block_index(layout, 0, MP_BLOCK_LN1_WEIGHT) + l * per_block + k), context);
    }
  }
  visit(mp_param_layout_tensor(layout, mp_param_layout_num_tensors(layout) - 2), context);
  visit(mp_param_layout_tensor(layout, mp_param_layout_num_tensors(layout) - 1), context);
}

/* Element offset (after the header) of every tensor in llm.c's file, indexed like the layout. */
typedef struct {
  size_t *offsets;
  size_t cursor;
  const mp_param_tensor *first;
  size_t wte_rows; /* the file's padded vocabulary */
} llmc_offsets;

static void place_tensor(const mp_param_tensor *tensor, void *context) {
  llmc_offsets *o = context;
  o->offsets[tensor - o->first] = o->cursor;
  o->cursor += (tensor == o->first ? o->wte_rows : tensor->rows) * tensor->cols;
}

/* wte_rows: the file's padded vocabulary, which llm.c pads to 128 and mpengine to 64. */
static size_t *llmc_file_offsets(const mp_param_layout *layout, size_t wte_rows) {
  llmc_offsets o = {calloc((size_t)mp_param_layout_num_tensors(layout), sizeof(size_t)), 0, mp_param_layout_tensor(layout, 0),
                    wte_rows};
  if (o.offsets != NULL) for_each_in_llmc_order(layout, place_tensor, &o);
  return o.offsets;
}

static void llmc_header(const mp_model_config *c, int32_t *header) {
  memset(header, 0, kLlmcHeaderInts * sizeof(int32_t));
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionFp32;
  header[2] = c->max_seq_len;
  header[3] = c->vocab_size;
  header[4] = c->num_layers;
  header[5] = c->num_heads;
  header[6] = c->channels;
  header[7] = c->padded_vocab_size;
}

struct mp_llmc_reader {
  const mp_param_layout *layout;
  char path[MP_ATOMIC_FILE_PATH_BYTES];
  int fd;
  int bytes_per_element; /* 4 fp32, 2 bf16 */
  size_t *offsets;
  size_t padded_vocab;   /* the file's wte rows (its header's padded_vocab_size) */
};

void mp_llmc_reader_close(mp_llmc_reader *reader) {
  if (reader == NULL) return;
  if (reader->fd >= 0) close(reader->fd);
  free(reader->offsets);
  free(reader);
}

/* Checks the header against the layout and the file's size against the header. */
static mp_status check_llmc_file(mp_llmc_reader *r, mp_error *err) {
  const mp_param_layout *layout = r->layout;
  const mp_model_config *c = mp_param_layout_config(layout);
  const char *path = r->path;
  int32_t header[kLlmcHeaderInts];
  if (pread(r->fd, header, sizeof header, 0) != (ssize_t)sizeof header) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: shorter than llm.c's 1024-byte checkpoint header; not a GPT-2 checkpoint",
                   path);
  }
  if (header[0] != kLlmcMagic) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: bad magic %d (expected %d); not an llm.c GPT-2 checkpoint", path,
                   header[0], kLlmcMagic);
  }
  if (header[1] != kLlmcVersionFp32 && header[1] != kLlmcVersionBf16) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: version %d is not supported (3 = fp32 or 5 = bf16)", path, header[1]);
  }
  if (c->ffn_channels != 4 * c->channels) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: llm.c checkpoints have ffn_hidden = 4 x hidden, but the model (%s) has "
                   "ffn_hidden %d and hidden %d",
                   path, mp_param_layout_model_source(layout), c->ffn_channels, c->channels);
  }
  int32_t expected[kLlmcHeaderInts];
  llmc_header(c, expected);
  /* The padding is the writer's choice (llm.c's train_gpt2.py pads to 128, mpengine to 64): its
   * rows take no part in the model; only the real rows must be there. */
  if (header[7] < c->vocab_size) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: padded_vocab_size %d is below the vocabulary %d of the model description "
                   "(%s)",
                   path, header[7], c->vocab_size, mp_param_layout_model_source(layout));
  }
  expected[7] = header[7];
  r->padded_vocab = (size_t)header[7];
  for (int i = 2; i < 8; ++i) {
    if (header[i] != expected[i]) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s: %s is %d in the checkpoint but %d in the model description (%s); "
                     "give the description that matches the checkpoint",
                     path, kHeaderFields[i], header[i], expected[i], mp_param_layout_model_source(layout));
    }
  }
  r->bytes_per_element = header[1] == kLlmcVersionFp32 ? 4 : 2;
  const size_t C = (size_t)c->channels;
  const size_t file_params = mp_param_layout_num_params(layout) - (size_t)c->padded_vocab_size * C +
                             r->padded_vocab * C;
  const size_t payload = file_params * (size_t)r->bytes_per_element;
  struct stat st;
  if (fstat(r->fd, &st) != 0) {
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot stat: %s", path, strerror(errno));
  }
  const size_t got = (size_t)st.st_size - sizeof header;
  if (got != payload) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: holds %s%zu bytes of parameters, but the header's model needs %zu (%zu "
                   "parameters of %d bytes); the file is truncated or corrupt",
                   path, got > payload ? "more than " : "", got > payload ? payload : got, payload,
                   file_params, r->bytes_per_element);
  }
  return MP_OK;
}

mp_status mp_llmc_reader_open(const mp_param_layout *layout, const char *path,
                              mp_llmc_reader **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_llmc_family(layout, path, err));
  mp_llmc_reader *r = calloc(1, sizeof *r);
  if (r == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  r->layout = layout;
  snprintf(r->path, sizeof r->path, "%s", path);
  r->fd = open(path, O_RDONLY);
  if (r->fd < 0) {
    const int e = errno;
    mp_llmc_reader_close(r);
    return mp_fail(err, MP_ERR_INPUT, "%s: cannot open: %s", path, strerror(e));
  }
  mp_status status = check_llmc_file(r, err);
  if (status == MP_OK && (r->offsets = llmc_file_offsets(layout, r->padded_vocab)) == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  if (status != MP_OK) {
    mp_llmc_reader_close(r);
    return status;
  }
  *out = r;
  return MP_OK;
}

/* count bytes at offset, or an error naming the file. */
static mp_status pread_all(const mp_llmc_reader *r, void *dest, size_t count, off_t offset,
                           mp_error *err) {
  unsigned char *at = dest;
  while (count > 0) {
    const ssize_t got = pread(r->fd, at, count, offset);
    if (got <= 0) {
      return mp_fail(err, MP_ERR_INPUT, "%s: short read at byte %lld: %s", r->path,
                     (long long)offset, got < 0 ? strerror(errno) : "end of file");
    }
    at += got;
    count -= (size_t)got;
    offset += got;
  }
  return MP_OK;
}

mp_status mp_llmc_reader_read(mp_llmc_reader *r, int tensor, size_t first, size_t count,
                              float *dest, mp_error *err) {
  const mp_param_tensor *t = mp_param_layout_tensor(r->layout, tensor);
  if (t == NULL || first > t->rows * t->cols || count > t->rows * t->cols - first) {
    return mp_fail(err, MP_ERR_RUNTIME, "%s: elements [%zu, +%zu) of tensor %d are outside it",
                   r->path, first, count, tensor);
  }
  if (tensor == 0) {
    /* wte: the file's rows as far as both paddings go; ours past the file's read as zero (the
     * padding takes no part in the model; llm.c writes its padding rows as zero). */
    const size_t in_file = r->padded_vocab * t->cols;
    const size_t held = first >= in_file ? 0 : (first + count <= in_file ? count : in_file - first);
    for (size_t i = held; i < count; ++i) dest[i] = 0.0f;
    count = held;
    if (count == 0) return MP_OK;
  }
  const size_t bpe = (size_t)r->bytes_per_element;
  off_t at = (off_t)(kLlmcHeaderInts * sizeof(int32_t) + (r->offsets[tensor] + first) * bpe);
  if (bpe == 4) return pread_all(r, dest, count * sizeof(float), at, err);
  /* bf16: the high half of an fp32, widened through a bounded buffer. */
  enum { kPiece = 1 << 15 };
  uint16_t piece[kPiece];
  while (count > 0) {
    const size_t n = count < kPiece ? count : kPiece;
    MP_TRY(pread_all(r, piece, n * 2, at, err));
    for (size_t i = 0; i < n; ++i) {
      const unsigned char *b = (const unsigned char *)&piece[i]; /* little-endian on disk */
      dest[i] = mp_float16_bf16_to_float((uint16_t)(b[0] | (b[1] << 8)));
    }
    dest += n;
    count -= n;
    at += (off_t)(n * 2);
  }
  return MP_OK;
}

mp_status mp_llmc_load(const mp_param_layout *layout, float *params, const char *path,
                                  mp_error *err) {
  mp_llmc_reader *reader = NULL;
  MP_TRY(mp_llmc_reader_open(layout, path, &reader, err));
  mp_status status = MP_OK;
  for (int i = 0; i < mp_param_layout_num_tensors(layout) && status == MP_OK; ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    status = mp_llmc_reader_read(reader, i, 0, t->rows * t->cols, params + t->offset, err);
  }
  mp_llmc_reader_close(reader);
  return status;
}

struct mp_llmc_writer {
  const mp_param_layout *layout;
  mp_atomic_file file;
  size_t *offsets;
};

mp_status mp_llmc_writer_open(const mp_param_layout *layout, const char *path,
                              mp_llmc_writer **out, mp_error *err) {
  *out = NULL;
  MP_TRY(check_llmc_family(layout, path, err));
  mp_llmc_writer *w = calloc(1, sizeof *w);
  if (w == NULL ||
      (w->offsets = llmc_file_offsets(layout, (size_t)mp_param_layout_config(layout)->padded_vocab_size)) == NULL) {
    free(w);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  w->layout = layout;
  const mp_status status = mp_atomic_file_open(&w->file, path, err);
  if (status != MP_OK) {
    free(w->offsets);
    free(w);
    return status;
  }
  int32_t header[kLlmcHeaderInts];
  llmc_header(mp_param_layout_config(layout), header);
  mp_atomic_file_write(&w->file, header, sizeof header);
  *out = w;
  return MP_OK;
}

void mp_llmc_writer_write(mp_llmc_writer *w, int tensor, size_t first, const float *data,
                          size_t count) {
  const long long at =
      (long long)(kLlmcHeaderInts * sizeof(int32_t) + (w->offsets[tensor] + first) * sizeof(float));
  mp_atomic_file_write_at(&w->file, at, data, count * sizeof(float));
}

mp_status mp_llmc_writer_commit(mp_llmc_writer *w, mp_error *err) {
  const mp_status status = mp_atomic_file_commit(&w->file, err);
  free(w->offsets);
  free(w);
  return status;
}

void mp_llmc_writer_abort(mp_llmc_writer *w) {
  if (w == NULL) return;
  mp_atomic_file_abort(&w->file);
  free(w->offsets);
  free(w);
}

/* Writes array (num_params floats, in our flat layout) under llm.c's version 3 header in llm.c's
 * tensor order, to a temporary name renamed into place: the parameters or their gradients. */
mp_status mp_llmc_save(const mp_param_layout *layout, const float *array,
                                  const char *path, mp_error *err) {
  mp_llmc_writer *writer = NULL;
  MP_TRY(mp_llmc_writer_open(layout, path, &writer, err));
  for (int i = 0; i < mp_param_layout_num_tensors(layout); ++i) {
    const mp_param_tensor *t = mp_param_layout_tensor(layout, i);
    mp_llmc_writer_write(writer, i, 0, array + t->offset, t->rows * t->cols);
  }
  return mp_llmc_writer_commit(writer, err);
}
