/*
 * tensor_parallel/shard.h — which part of each full-model tensor a tensor-parallel rank holds,
 * and cutting it out of (or putting it back into) the full tensor.
 *
 * A shard is up to three row-major blocks of the full (rows, cols) tensor, stored one after the
 * other. Four ways to split cover GPT-2 (engine/model/param_layout.h's tensor names):
 *
 *   replicated  the whole tensor         embedding.wpe, ln1/ln2/final_norm weight and bias,
 *                                        attn_proj.bias, fc_proj.bias
 *   rows        rows [r*R/tp, (r+1)R/tp) embedding.wte and lm_head.weight (a vocabulary range),
 *                                        fc.weight, fc.bias; the Llama family's q, k, v (heads),
 *                                        gate and up (weights and biases)
 *   cols        cols [r*K/tp, (r+1)K/tp) attn_proj.weight, fc_proj.weight (row-parallel)
 *   qkv         the rows block of each of the three (R/3)-row blocks q, k, v, concatenated:
 *               qkv.weight, qkv.bias (this rank's heads' queries, keys and values)
 *
 * The same blocks serve three uses: cutting a rank's shard from a one-rank model's flat array
 * (so tp = 2 starts from the numbers of tp = 1), gathering shards back into full tensors
 * (checkpoints, resharding to another tp), and initialising a shard directly from the pure
 * initialisation function: for each block, engine/model/param_init.h's
 *   mp_init_fill_normal_block(shard + b.shard_offset, b.rows, b.cols, b.row_offset,
 *                             b.col_offset, full_cols, seed, name, std)
 * draws exactly the full tensor's numbers at those positions.
 */
#ifndef MPENGINE_TENSOR_PARALLEL_SHARD_H
#define MPENGINE_TENSOR_PARALLEL_SHARD_H

#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MP_TP_REPLICATED = 0,
  MP_TP_SPLIT_ROWS = 1,
  MP_TP_SPLIT_COLS = 2,
  MP_TP_SPLIT_QKV = 3,
} mp_tp_split;

/* "replicated", "rows", "cols", "qkv". */
const char *mp_tp_split_name(mp_tp_split split);

/* How the GPT tensor `name` ("embedding.wte", "block.3.qkv.weight", ...) is split. MP_OK, or
 * MP_ERR_INPUT naming the tensor when the name is not one of engine/model/param_layout.h's. */
mp_status mp_tp_split_of(const char *name, mp_tp_split *split, mp_error *err);

enum { MP_TP_SHARD_MAX_BLOCKS = 3 };

/* One block of a shard: full[row_offset + i][col_offset + j] for i < rows, j < cols, stored at
 * shard[shard_offset + i * cols + j]. */
typedef struct {
  size_t row_offset;
  size_t col_offset;
  size_t rows;
  size_t cols;
  size_t shard_offset;
} mp_tp_shard_block;

/* The blocks of rank `rank`'s shard of a (rows, cols) tensor (cols = 1 for vectors) split over
 * `size` ranks; *count gets their number (1 to 3). MP_ERR_INPUT, naming the dimension, when the
 * split dimension is not a multiple of size (for qkv: rows not a multiple of 3 * size), or rank
 * is outside [0, size). */
mp_status mp_tp_shard_blocks(mp_tp_split split, size_t rows, size_t cols, int rank, int size,
                             mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS], int *count,
                             mp_error *err);

/* Floats in one rank's shard (the same on every rank): rows * cols / size, or rows * cols when
 * replicated. */
size_t mp_tp_shard_floats(mp_tp_split split, size_t rows, size_t cols, int size);

/* shard (mp_tp_shard_floats) = rank's part of full (rows, cols). Errors as mp_tp_shard_blocks. */
mp_status mp_tp_shard_extract(float *shard, const float *full, mp_tp_split split, size_t rows,
                              size_t cols, int rank, int size, mp_error *err);

/* The inverse: writes rank's shard into its positions of full (rows, cols), leaving the rest.
 * Inserting every rank's shard rebuilds the full tensor. */
mp_status mp_tp_shard_insert(float *full, const float *shard, mp_tp_split split, size_t rows,
                             size_t cols, int rank, int size, mp_error *err);

/* Parts of a shard without the full tensor. A rank that loads, saves or reshards touches only its
 * own elements and a bounded buffer: it walks a range of its shard as runs that are contiguous in
 * the full tensor (mp_tp_shard_runs), or fills a range of its shard from wherever another layout
 * keeps those elements (mp_tp_shard_read), one request per run contiguous on both sides.
 *
 * visit(context, full_offset, shard_offset, count): elements [shard_offset, shard_offset + count)
 * of the shard are elements [full_offset, + count) of the row-major full tensor. */
typedef mp_status (*mp_tp_run_visitor)(void *context, size_t full_offset, size_t shard_offset,
                                       size_t count, mp_error *err);

/* Calls visit for elements [first, first + count) of rank's shard (split over size ranks) of a
 * (rows, cols) tensor, in shard order; stops at the first status that is not MP_OK and returns
 * it. Errors as mp_tp_shard_blocks, and MP_ERR_INPUT when the range is outside the shard. */
mp_status mp_tp_shard_runs(mp_tp_split split, size_t rows, size_t cols, int rank, int size,
                           size_t first, size_t count, mp_tp_run_visitor visit, void *context,
                           mp_error *err);

/* read(context, source_rank, source_offset, count, dest): count floats from source_offset of
 * source rank source_rank's shard (the source layout), into dest. */
typedef mp_status (*mp_tp_source_reader)(void *context, int source_rank, size_t source_offset,
                                         size_t count, float *dest, mp_error *err);

/* dest (count floats) = elements [first, first + count) of rank's shard (split over size ranks)
 * of a (rows, cols) tensor, read from a source that holds the same tensor split the same way over
 * source_size ranks (source_size 1: the full tensor; a replicated tensor is read from source rank
 * 0). Only the elements asked for are requested. Errors as mp_tp_shard_runs, or read's. */
mp_status mp_tp_shard_read(float *dest, size_t first, size_t count, mp_tp_split split,
                           size_t rows, size_t cols, int rank, int size, int source_size,
                           mp_tp_source_reader read, void *context, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TENSOR_PARALLEL_SHARD_H */
