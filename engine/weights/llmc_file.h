/*
 * engine/weights/llmc_file.h — llm.c's GPT-2 checkpoint files (train_gpt2.c's format): a 256 x int32
 * header (magic 20240326, version 3 = fp32 or 5 = bf16, max_seq_len, vocab, layers, heads,
 * channels, padded vocab), then the 16 parameter tensors in llm.c's order (wte, wpe, then each
 * per-layer tensor for all layers in turn, then lnfw, lnfb), read and written in the model's
 * parameter layout (engine/model/param_layout.h). Whole arrays for tests and tools; in parts for
 * a parallel run, whose ranks read only their shards' elements and whose save is streamed.
 */
#ifndef MPENGINE_ENGINE_WEIGHTS_LLMC_FILE_H
#define MPENGINE_ENGINE_WEIGHTS_LLMC_FILE_H

#include <stddef.h>

#include "common/error.h"
#include "engine/model/param_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llm.c files into / out of a flat array in this layout . llm.c's files
 * hold GPT-2: a Llama-family layout is refused naming the model. */
mp_status mp_llmc_load(const mp_param_layout *layout, float *params, const char *path,
                                  mp_error *err);
mp_status mp_llmc_save(const mp_param_layout *layout, const float *array,
                                  const char *path, mp_error *err);

/* llm.c files in parts, so a rank of a parallel run reads only its shards' elements and a save
 * is assembled tensor by tensor (or piece by piece) without the whole model in memory.
 * mp_llmc_reader_open checks the header against the layout and the size against the header
 * (errors as mp_llmc_load); mp_llmc_reader_read gets elements [first, first + count) of
 * tensor `tensor` (layout index) as fp32, one pread per run (bf16 widened). */
typedef struct mp_llmc_reader mp_llmc_reader;
mp_status mp_llmc_reader_open(const mp_param_layout *layout, const char *path,
                              mp_llmc_reader **out, mp_error *err);
mp_status mp_llmc_reader_read(mp_llmc_reader *reader, int tensor, size_t first, size_t count,
                              float *dest, mp_error *err);
void mp_llmc_reader_close(mp_llmc_reader *reader);

/* A version 3 (fp32) llm.c file written in any order: the header at open, then each element of
 * every tensor exactly once through mp_llmc_writer_write; commit renames it into place (and
 * frees the writer), abort removes it. The bytes equal mp_llmc_save's. */
typedef struct mp_llmc_writer mp_llmc_writer;
mp_status mp_llmc_writer_open(const mp_param_layout *layout, const char *path,
                              mp_llmc_writer **out, mp_error *err);
void mp_llmc_writer_write(mp_llmc_writer *writer, int tensor, size_t first, const float *data,
                          size_t count);
mp_status mp_llmc_writer_commit(mp_llmc_writer *writer, mp_error *err);
void mp_llmc_writer_abort(mp_llmc_writer *writer);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_WEIGHTS_LLMC_FILE_H */
