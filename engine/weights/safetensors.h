/*
 * engine/weights/safetensors.h — Hugging Face safetensors checkpoints: reading the tensors a rank
 * owns out of one file or a sharded set, and writing a file piece by piece.
 *
 * Format (https://github.com/huggingface/safetensors), all little-endian:
 *   u64        N, the byte length of the JSON header
 *   N bytes    the header, UTF-8 JSON: an object of tensor name -> {"dtype": "F32"|"BF16"|...,
 *              "shape": [d0, d1, ...], "data_offsets": [begin, end]}, and optionally
 *              "__metadata__": {string: string}; padded with spaces so that N % 8 == 0
 *   data       the tensors' bytes, row-major; [begin, end) is relative to the data section
 * A sharded checkpoint is several such files and model.safetensors.index.json:
 *   {"metadata": {"total_size": BYTES}, "weight_map": {tensor name: file name}}.
 *
 * Checkpoints come from outside, so opening checks everything the reference library
 * (safetensors 0.4.5, Rust) checks, the same way, and refuses with MP_ERR_INPUT and a message
 * naming the file and the tensor (or the JSON path): a file shorter than 8 bytes, a header length
 * over 100,000,000 bytes (the reference's cap) or past the end of the file, a header that is not
 * UTF-8, not JSON or not an object, an unknown dtype, a shape whose element count times the dtype's
 * size is not end - begin, offsets that run backwards, overlap, leave a gap, or do not cover the
 * data section exactly (the reference requires the tensors, sorted by offset, to tile it from
 * byte 0 to the end of the file: a truncated file and trailing bytes are both refused). Stricter
 * than the reference: a tensor name given twice (the reference keeps the last silently), a
 * dimension or offset of 2^53 or more (cJSON's numbers are doubles). Laxer, because cJSON does not
 * keep the text of numbers: a whole number written as 4.0 or 4e0 is accepted (the reference wants
 * 4). A sharded set is refused when the index is not JSON, its weight_map is missing or not an
 * object of file names, a file name is not a plain name in the index's directory, a named file is
 * missing or broken or lacks a tensor the map puts in it, or a file holds a tensor the map does
 * not list there.
 *
 * Shard-first (DESIGN.md, principle 6): opening reads only the headers; the readers take a block
 * of one tensor (a range of elements, of rows, or of rows x columns) and pread just those bytes
 * through a bounded staging buffer, converting BF16, F16 or F32 to fp32, so a rank never holds
 * more than its own slice. The writer takes every tensor's name, dtype and shape up front, writes
 * the header, then accepts each tensor's fp32 values in pieces of any size, converted to the
 * file's dtype (round to nearest even, as torch does), so an exporter streams a model it never
 * holds whole.
 *
 * What the writer writes is byte for byte what safetensors.torch.save_file writes for the same
 * tensors and metadata (tests/engine/safetensors_test.cc holds it to goldens from the reference):
 * tensors ordered by dtype, largest first in the reference's dtype order (F64 before F32 before
 * BF16 before F16), then by name; the header compact JSON with "__metadata__" first and each tensor
 * as {"dtype", "shape", "data_offsets"}, strings escaped as serde_json does, padded with spaces to
 * a multiple of 8. Two differences, both where the reference is not one thing to match: metadata
 * of two or more keys comes in the order given (the reference writes a Rust HashMap, in an order
 * that changes from run to run), and a NaN becomes BF16 0x7fc0 with its sign (torch's vectorized
 * conversion writes 0xffff, its scalar one 0x7fc0).
 *
 * Thread safety: an open mp_safetensors is read-only, and the readers allocate their own staging
 * buffers and use pread, so threads may read from one handle at once. A writer is one thread's.
 */
#ifndef MPENGINE_ENGINE_SAFETENSORS_H
#define MPENGINE_ENGINE_SAFETENSORS_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The reference's dtypes, in its order (the writer sorts by it, largest first). */
typedef enum {
  MP_SAFETENSORS_BOOL = 0,
  MP_SAFETENSORS_U8,
  MP_SAFETENSORS_I8,
  MP_SAFETENSORS_F8_E5M2,
  MP_SAFETENSORS_F8_E4M3,
  MP_SAFETENSORS_I16,
  MP_SAFETENSORS_U16,
  MP_SAFETENSORS_F16,
  MP_SAFETENSORS_BF16,
  MP_SAFETENSORS_I32,
  MP_SAFETENSORS_U32,
  MP_SAFETENSORS_F32,
  MP_SAFETENSORS_F64,
  MP_SAFETENSORS_I64,
  MP_SAFETENSORS_U64,
  MP_SAFETENSORS_NUM_DTYPES,
} mp_safetensors_dtype;

/* A set of dtypes, for mp_safetensors_expect: one bit per dtype. */
#define MP_SAFETENSORS_DTYPE_BIT(dtype) (1u << (unsigned)(dtype))
/* The dtypes the readers convert to fp32 and the writer converts to. */
#define MP_SAFETENSORS_FLOAT_DTYPES                                                               \
  (MP_SAFETENSORS_DTYPE_BIT(MP_SAFETENSORS_F32) | MP_SAFETENSORS_DTYPE_BIT(MP_SAFETENSORS_BF16) | \
   MP_SAFETENSORS_DTYPE_BIT(MP_SAFETENSORS_F16))

enum {
  /* The reference refuses longer headers (safetensors' MAX_HEADER_SIZE). */
  MP_SAFETENSORS_MAX_HEADER_BYTES = 100000000,
  /* The most bytes a read or a write buffers at once, whatever the size of the block. */
  MP_SAFETENSORS_STAGING_BYTES = 1 << 20,
};

/* The reference's name for dtype ("F32", "BF16", ...); "?" when out of range. */
const char *mp_safetensors_dtype_name(mp_safetensors_dtype dtype);

/* Bytes per element of dtype (1, 2, 4 or 8); 0 when out of range. */
int mp_safetensors_dtype_bytes(mp_safetensors_dtype dtype);

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

/* An open checkpoint: one safetensors file or a sharded set, its headers checked, a file
 * descriptor per file. */
typedef struct mp_safetensors mp_safetensors;

/* One tensor of an open checkpoint, valid until mp_safetensors_close. */
typedef struct {
  const char *name;
  const char *file; /* the path of the file holding it */
  int file_index;   /* 0 .. mp_safetensors_num_files - 1 */
  mp_safetensors_dtype dtype;
  int rank;             /* 0 for a scalar */
  const int64_t *shape; /* (rank,) */
  int64_t num_elements; /* product of shape (1 for a scalar) */
  int64_t num_bytes;    /* num_elements x dtype bytes */
  int64_t file_offset;  /* byte offset of its first element in the file */
} mp_safetensors_tensor;

/* Opens the safetensors file at path and checks its header (see the top of this file). Fails
 * with MP_ERR_INPUT and a message that starts with the path when it cannot be opened or is
 * refused; with MP_ERR_RUNTIME when memory runs out. *out is freed with mp_safetensors_close. */
mp_status mp_safetensors_open_file(const char *path, mp_safetensors **out, mp_error *err);

/* Opens a sharded checkpoint through its index (model.safetensors.index.json): every file its
 * weight_map names, from the index's directory, each opened once, and checks that the map and
 * the files agree tensor by tensor. Messages start with the index's path, or the shard's for a
 * refusal inside one file. */
mp_status mp_safetensors_open_index(const char *index_path, mp_safetensors **out, mp_error *err);

/* Opens a Hugging Face checkpoint directory as transformers' from_pretrained does: its
 * model.safetensors when there is one, else its model.safetensors.index.json; MP_ERR_INPUT
 * naming the directory when it has neither. */
mp_status mp_safetensors_open_dir(const char *dir, mp_safetensors **out, mp_error *err);

/* Closes the files and frees st (NULL is fine). */
void mp_safetensors_close(mp_safetensors *st);

/* The path that was opened (the file, the index or the directory's file). */
const char *mp_safetensors_source(const mp_safetensors *st);

/* Its tensors, sorted by name (strcmp order): index 0 .. num_tensors - 1. */
int mp_safetensors_num_tensors(const mp_safetensors *st);
const mp_safetensors_tensor *mp_safetensors_tensor_at(const mp_safetensors *st, int index);

/* The tensor called name, or NULL. */
const mp_safetensors_tensor *mp_safetensors_find(const mp_safetensors *st, const char *name);

/* Its files (one for a single file), in the order of their names, and each one's
 * "__metadata__" entries in header order. mp_safetensors_metadata_get returns NULL for a key the
 * file does not have. */
int mp_safetensors_num_files(const mp_safetensors *st);
const char *mp_safetensors_file_path(const mp_safetensors *st, int file_index);
int mp_safetensors_num_metadata(const mp_safetensors *st, int file_index);
void mp_safetensors_metadata_at(const mp_safetensors *st, int file_index, int entry,
                                const char **out_key, const char **out_value);
const char *mp_safetensors_metadata_get(const mp_safetensors *st, int file_index, const char *key);

/* Checks that the checkpoint has a tensor called name whose dtype is in dtype_set (a mask of
 * MP_SAFETENSORS_DTYPE_BIT, e.g. MP_SAFETENSORS_FLOAT_DTYPES) and whose shape is the (rank,)
 * array shape; *out (may be NULL) is the tensor. Fails with MP_ERR_INPUT:
 *   "<file>: tensor "<name>": expected F16, BF16 or F32 of shape [4, 8], found I64 of shape [8]"
 * and, when it is absent, "<source>: no tensor "<name>"" (with the closest name there is, if
 * one is close). */
mp_status mp_safetensors_expect(const mp_safetensors *st, const char *name, unsigned dtype_set,
                                int rank, const int64_t *shape, const mp_safetensors_tensor **out,
                                mp_error *err);

/* The readers below convert the tensor's BF16, F16 or F32 elements to fp32 into out, read with
 * pread through at most MP_SAFETENSORS_STAGING_BYTES of staging (never the whole file). They fail
 * with MP_ERR_INPUT naming the file and tensor when the tensor is absent or of another dtype, or
 * the file turns out shorter than it was when opened; with MP_ERR_RUNTIME when the block asked
 * for lies outside the tensor (a bug in the caller: check the shape with mp_safetensors_expect
 * first) or reading fails. A tensor of rank r >= 1 is seen as a matrix of shape[0] rows of
 * shape[1] x ... x shape[r-1] columns (1 column for rank 1). */

/* Elements [begin, end) of tensor name in row-major order (any rank): out is (end - begin,). */
mp_status mp_safetensors_read_elements(const mp_safetensors *st, const char *name, int64_t begin,
                                       int64_t end, float *out, mp_error *err);

/* Rows [row_begin, row_end): out is (row_end - row_begin, columns), e.g. a column-parallel
 * rank's part of an (out_features, in_features) weight. */
mp_status mp_safetensors_read_rows(const mp_safetensors *st, const char *name, int64_t row_begin,
                                   int64_t row_end, float *out, mp_error *err);

/* How mp_safetensors_read_block lays the block out. */
typedef enum {
  MP_SAFETENSORS_ROW_MAJOR = 0, /* out is (rows, columns) of the block */
  MP_SAFETENSORS_TRANSPOSED,    /* out is (columns, rows): the block's transpose, e.g. GPT-2's
                                   Conv1D (in, out) weights into mpengine's (out, in) */
} mp_safetensors_block_layout;

/* The block rows [row_begin, row_end) x columns [col_begin, col_end), e.g. a row-parallel rank's
 * columns of every row. Reads each row's part alone (bytes between rows are read only when fewer
 * than a page), so a rank reads about its own bytes. */
mp_status mp_safetensors_read_block(const mp_safetensors *st, const char *name, int64_t row_begin,
                                    int64_t row_end, int64_t col_begin, int64_t col_end,
                                    mp_safetensors_block_layout layout, float *out, mp_error *err);

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

/* A tensor to write: its name, its dtype in the file (F32, BF16 or F16) and its shape. */
typedef struct {
  const char *name;
  mp_safetensors_dtype dtype;
  int rank;
  const int64_t *shape; /* (rank,) */
} mp_safetensors_tensor_spec;

typedef struct mp_safetensors_writer mp_safetensors_writer;

/* Starts writing path with these num_tensors tensors and the "__metadata__" given as
 * num_metadata (key, value) pairs, metadata[2i] and metadata[2i + 1] (NULL or 0 for none; Hugging
 * Face's loaders expect {"format": "pt"}). The header goes out now; the file is written to a
 * temporary beside path and renamed into place by mp_safetensors_writer_finish. Fails with
 * MP_ERR_INPUT for a name given twice, a name or metadata string that is not UTF-8, the name
 * "__metadata__", a dtype other than F32, BF16 and F16, a negative dimension, or a tensor of
 * 2^53 bytes or more; and when the temporary cannot be created. The specs are copied. */
mp_status mp_safetensors_writer_create(const char *path, const mp_safetensors_tensor_spec *tensors,
                                       int num_tensors, const char *const *metadata,
                                       int num_metadata, mp_safetensors_writer **out,
                                       mp_error *err);

/* Appends the next count fp32 values (count,) of tensor name, in row-major order, converted to
 * its dtype. Tensors may come in any order, each one's pieces in order. Fails with MP_ERR_RUNTIME
 * (a bug in the caller) for an unknown name or more values than the tensor holds. */
mp_status mp_safetensors_writer_append(mp_safetensors_writer *writer, const char *name,
                                       const float *values, int64_t count, mp_error *err);

/* The size of the file being written, header included: 8 + header + data bytes. */
int64_t mp_safetensors_writer_file_bytes(const mp_safetensors_writer *writer);

/* Checks that every tensor got all its values, then flushes, syncs and renames the file into
 * place; frees writer either way. Fails with MP_ERR_RUNTIME naming the first tensor short of
 * values (the file is not written then) or when writing fails (a full disk). */
mp_status mp_safetensors_writer_finish(mp_safetensors_writer *writer, mp_error *err);

/* Gives up: removes the temporary and frees writer; path is untouched (NULL is fine). */
void mp_safetensors_writer_abort(mp_safetensors_writer *writer);

/* Writes a sharded checkpoint's index at path (atomically) as transformers' save_pretrained
 * does: {"metadata": {"total_size": total_size}, "weight_map": {name: file}} with sorted keys and
 * two-space indentation, non-ASCII characters as \uXXXX, and a final newline. tensor_names and
 * file_names are (num_tensors,); total_size is the sum of the tensors' data bytes. Fails with
 * MP_ERR_INPUT for a name given twice or not UTF-8, MP_ERR_RUNTIME when writing fails. */
mp_status mp_safetensors_write_index(const char *path, const char *const *tensor_names,
                                     const char *const *file_names, int num_tensors,
                                     int64_t total_size, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_SAFETENSORS_H */
