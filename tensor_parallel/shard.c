/* tensor_parallel/shard.c — the parts of full tensors that tensor-parallel ranks hold; see
 * shard.h. */
#include "tensor_parallel/shard.h"

#include <stdbool.h>
#include <string.h>

const char *mp_tp_split_name(mp_tp_split split) {
  switch (split) {
    case MP_TP_REPLICATED:
      return "replicated";
    case MP_TP_SPLIT_ROWS:
      return "rows";
    case MP_TP_SPLIT_COLS:
      return "cols";
    case MP_TP_SPLIT_QKV:
      return "qkv";
  }
  return "unknown";
}

static bool ends_with(const char *text, const char *suffix) {
  const size_t a = strlen(text), b = strlen(suffix);
  return a >= b && strcmp(text + a - b, suffix) == 0;
}

mp_status mp_tp_split_of(const char *name, mp_tp_split *split, mp_error *err) {
  static const struct {
    const char *suffix;
    mp_tp_split split;
  } kBlockSplits[] = {
      {".ln1.weight", MP_TP_REPLICATED},       {".ln1.bias", MP_TP_REPLICATED},
      {".qkv.weight", MP_TP_SPLIT_QKV},        {".qkv.bias", MP_TP_SPLIT_QKV},
      {".attn_proj.weight", MP_TP_SPLIT_COLS}, {".attn_proj.bias", MP_TP_REPLICATED},
      {".ln2.weight", MP_TP_REPLICATED},       {".ln2.bias", MP_TP_REPLICATED},
      {".fc.weight", MP_TP_SPLIT_ROWS},        {".fc.bias", MP_TP_SPLIT_ROWS},
      {".fc_proj.weight", MP_TP_SPLIT_COLS},   {".fc_proj.bias", MP_TP_REPLICATED},
      /* The Llama family: separate q, k and v (split by heads) and SwiGLU's gate and up. */
      {".q.weight", MP_TP_SPLIT_ROWS},         {".q.bias", MP_TP_SPLIT_ROWS},
      {".k.weight", MP_TP_SPLIT_ROWS},         {".k.bias", MP_TP_SPLIT_ROWS},
      {".v.weight", MP_TP_SPLIT_ROWS},         {".v.bias", MP_TP_SPLIT_ROWS},
      {".gate.weight", MP_TP_SPLIT_ROWS},      {".gate.bias", MP_TP_SPLIT_ROWS},
      {".up.weight", MP_TP_SPLIT_ROWS},        {".up.bias", MP_TP_SPLIT_ROWS},
      /* A mixture of experts' (issue 33): whole on every tp rank (expert-tp 1). */
      {".router.weight", MP_TP_REPLICATED},    {".expert_fc1.weight", MP_TP_REPLICATED},
      {".expert_fc2.weight", MP_TP_REPLICATED}, {".shared_fc1.weight", MP_TP_REPLICATED},
      {".shared_fc2.weight", MP_TP_REPLICATED}, {".shared_gate.weight", MP_TP_REPLICATED},
  };
  if (strcmp(name, "embedding.wte") == 0 || strcmp(name, "lm_head.weight") == 0) {
    *split = MP_TP_SPLIT_ROWS;
    return MP_OK;
  }
  if (strcmp(name, "embedding.wpe") == 0 || strcmp(name, "final_norm.weight") == 0 ||
      strcmp(name, "final_norm.bias") == 0) {
    *split = MP_TP_REPLICATED;
    return MP_OK;
  }
  if (strncmp(name, "block.", 6) == 0) {
    for (size_t i = 0; i < sizeof kBlockSplits / sizeof kBlockSplits[0]; i++) {
      if (ends_with(name, kBlockSplits[i].suffix)) {
        *split = kBlockSplits[i].split;
        return MP_OK;
      }
    }
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "tensor \"%s\" has no tensor-parallel split: expected a GPT tensor name "
                 "(embedding.wte, embedding.wpe, block.<l>.<qkv|q|k|v|fc|gate|up|...>.<weight|bias>, "
                 "final_norm.<weight|bias>, lm_head.weight)",
                 name);
}

mp_status mp_tp_shard_blocks(mp_tp_split split, size_t rows, size_t cols, int rank, int size,
                             mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS], int *count,
                             mp_error *err) {
  if (size < 1 || rank < 0 || rank >= size) {
    return mp_fail(err, MP_ERR_INPUT, "tensor-parallel rank %d is outside [0, %d)", rank, size);
  }
  const size_t n = (size_t)size, r = (size_t)rank;
  switch (split) {
    case MP_TP_REPLICATED:
      blocks[0] = (mp_tp_shard_block){0, 0, rows, cols, 0};
      *count = 1;
      return MP_OK;
    case MP_TP_SPLIT_ROWS:
      if (rows % n != 0) break;
      blocks[0] = (mp_tp_shard_block){r * (rows / n), 0, rows / n, cols, 0};
      *count = 1;
      return MP_OK;
    case MP_TP_SPLIT_COLS:
      if (cols % n != 0) break;
      blocks[0] = (mp_tp_shard_block){0, r * (cols / n), rows, cols / n, 0};
      *count = 1;
      return MP_OK;
    case MP_TP_SPLIT_QKV: {
      if (rows % (3 * n) != 0) break;
      const size_t third = rows / 3, local = third / n;
      for (size_t k = 0; k < 3; k++) {
        blocks[k] = (mp_tp_shard_block){k * third + r * local, 0, local, cols, k * local * cols};
      }
      *count = 3;
      return MP_OK;
    }
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "a (%zu, %zu) tensor split by %s does not divide over tp = %d ranks (the split "
                 "dimension must be a multiple of tp%s)",
                 rows, cols, mp_tp_split_name(split), size,
                 split == MP_TP_SPLIT_QKV ? ", times 3 for q, k and v" : "");
}

size_t mp_tp_shard_floats(mp_tp_split split, size_t rows, size_t cols, int size) {
  return split == MP_TP_REPLICATED ? rows * cols : rows * cols / (size_t)size;
}

/* Copies between a shard and its full tensor; to_shard chooses the direction, and only the
 * destination is written (the callers' const casts are safe). */
static mp_status copy_blocks(float *shard, float *full, bool to_shard, mp_tp_split split,
                             size_t rows, size_t cols, int rank, int size, mp_error *err) {
  mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
  int count = 0;
  MP_TRY(mp_tp_shard_blocks(split, rows, cols, rank, size, blocks, &count, err));
  for (int k = 0; k < count; k++) {
    const mp_tp_shard_block *b = &blocks[k];
    for (size_t i = 0; i < b->rows; i++) {
      float *s = shard + b->shard_offset + i * b->cols;
      float *f = full + (b->row_offset + i) * cols + b->col_offset;
      if (to_shard) {
        memcpy(s, f, b->cols * sizeof(float));
      } else {
        memcpy(f, s, b->cols * sizeof(float));
      }
    }
  }
  return MP_OK;
}

mp_status mp_tp_shard_extract(float *shard, const float *full, mp_tp_split split, size_t rows,
                              size_t cols, int rank, int size, mp_error *err) {
  return copy_blocks(shard, (float *)full, true, split, rows, cols, rank, size, err);
}

mp_status mp_tp_shard_insert(float *full, const float *shard, mp_tp_split split, size_t rows,
                             size_t cols, int rank, int size, mp_error *err) {
  return copy_blocks((float *)shard, full, false, split, rows, cols, rank, size, err);
}

mp_status mp_tp_shard_runs(mp_tp_split split, size_t rows, size_t cols, int rank, int size,
                           size_t first, size_t count, mp_tp_run_visitor visit, void *context,
                           mp_error *err) {
  mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
  int num_blocks = 0;
  MP_TRY(mp_tp_shard_blocks(split, rows, cols, rank, size, blocks, &num_blocks, err));
  const size_t total = mp_tp_shard_floats(split, rows, cols, size);
  if (first > total || count > total - first) {
    return mp_fail(err, MP_ERR_INPUT,
                   "elements [%zu, +%zu) are outside a shard of %zu of a (%zu, %zu) tensor",
                   first, count, total, rows, cols);
  }
  const size_t end = first + count;
  for (int k = 0; k < num_blocks; k++) {
    const mp_tp_shard_block *b = &blocks[k];
    const size_t b_end = b->shard_offset + b->rows * b->cols;
    size_t at = first > b->shard_offset ? first : b->shard_offset;
    const size_t stop = end < b_end ? end : b_end;
    while (at < stop) {
      const size_t i = (at - b->shard_offset) / b->cols, j = (at - b->shard_offset) % b->cols;
      /* A block as wide as the tensor is contiguous in it: one run for all its rows. */
      const size_t run_end = b->cols == cols ? stop : at + (b->cols - j < stop - at ? b->cols - j
                                                                                    : stop - at);
      const size_t full = (b->row_offset + i) * cols + b->col_offset + j;
      MP_TRY(visit(context, full, at, run_end - at, err));
      at = run_end;
    }
  }
  return MP_OK;
}

typedef struct {
  float *dest;      /* element `first` of the destination range */
  size_t first;
  mp_tp_split split;
  size_t rows, cols;
  int source_size;
  mp_tp_source_reader read;
  void *context;
} shard_read;

/* One destination run (contiguous in the full tensor) from the source shards that hold it. */
static mp_status read_run(void *context, size_t full_offset, size_t shard_offset, size_t count,
                          mp_error *err) {
  const shard_read *r = context;
  float *dest = r->dest + (shard_offset - r->first);
  if (r->split == MP_TP_REPLICATED || r->source_size == 1) {
    return r->read(r->context, 0, full_offset, count, dest, err);
  }
  while (count > 0) {
    const size_t i = full_offset / r->cols, j = full_offset % r->cols;
    size_t source_rank = 0, source_offset = 0, n = 0;
    const size_t S = (size_t)r->source_size;
    switch (r->split) {
      case MP_TP_SPLIT_ROWS: {
        const size_t per = r->rows / S;
        source_rank = i / per;
        source_offset = full_offset - source_rank * per * r->cols;
        n = (source_rank + 1) * per * r->cols - full_offset;
        break;
      }
      case MP_TP_SPLIT_COLS: {
        const size_t per = r->cols / S;
        source_rank = j / per;
        source_offset = i * per + (j - source_rank * per);
        n = per - (j - source_rank * per);
        break;
      }
      case MP_TP_SPLIT_QKV: {
        const size_t third = r->rows / 3, per = third / S, part = i / third, within = i % third;
        source_rank = within / per;
        source_offset = (part * per + within - source_rank * per) * r->cols + j;
        n = (part * third + (source_rank + 1) * per) * r->cols - full_offset;
        break;
      }
      case MP_TP_REPLICATED:
        break;
    }
    if (n > count) n = count;
    MP_TRY(r->read(r->context, (int)source_rank, source_offset, n, dest, err));
    dest += n;
    full_offset += n;
    count -= n;
  }
  return MP_OK;
}

mp_status mp_tp_shard_read(float *dest, size_t first, size_t count, mp_tp_split split,
                           size_t rows, size_t cols, int rank, int size, int source_size,
                           mp_tp_source_reader read, void *context, mp_error *err) {
  if (split != MP_TP_REPLICATED && source_size > 1) {
    /* The source layout must exist: the same divisibility a shard of it needs. */
    mp_tp_shard_block blocks[MP_TP_SHARD_MAX_BLOCKS];
    int n = 0;
    MP_TRY(mp_tp_shard_blocks(split, rows, cols, 0, source_size, blocks, &n, err));
  }
  shard_read r = {dest, first, split, rows, cols, source_size, read, context};
  return mp_tp_shard_runs(split, rows, cols, rank, size, first, count, read_run, &r, err);
}
