/* engine/train/save_llmc.c — the collective llm.c save (--save-weights): every rank streams its
 * shard in bounded pieces to world rank 0, which writes one llm.c file. */
#include "engine/train/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/model/param_layout.h"
#include "engine/weights/llmc_file.h"
#include "tensor_parallel/shard.h"

/* A streamed save moves each shard in pieces of at most this many floats per tp rank. */
enum { SAVE_PIECE_FLOATS = 1 << 18 };

/* What a pipeline rank sends world rank 0 before each piece: the tensor (layout index; -1 ends
 * the rank's pieces), the first element of every tp rank's piece in its shard, and their floats
 * (replicated tensors: tp rank 0's only). */
typedef struct {
  int64_t tensor, first, count, ranks;
} save_piece;

/* Writes piece (ranks x count floats, rank r's at r x count) of a tensor into the file: each tp
 * rank's elements [first, first + count) of its shard, run by run. */
typedef struct {
  mp_llmc_writer *writer;
  int tensor;
  const float *data; /* element `first` of the rank's shard */
  size_t first;
} piece_sink;

static mp_status write_run(void *context, size_t full_offset, size_t shard_offset, size_t count,
                           mp_error *err) {
  const piece_sink *sink = context;
  mp_llmc_writer_write(sink->writer, sink->tensor, full_offset,
                       sink->data + (shard_offset - sink->first), count);
  return MP_OK;
}

static mp_status write_piece(mp_llmc_writer *writer, const mp_param_layout *layout,
                             const save_piece *piece, const float *data, int tp_size,
                             mp_error *err) {
  if (writer == NULL) return MP_OK; /* the file could not be opened: pieces are drained */
  const mp_param_tensor *t = mp_param_layout_tensor(layout, (int)piece->tensor);
  for (int r = 0; r < (int)piece->ranks; ++r) {
    const piece_sink sink = {writer, (int)piece->tensor, data + (size_t)r * (size_t)piece->count,
                             (size_t)piece->first};
    MP_TRY(mp_tp_shard_runs(t->split, t->rows, t->cols, r, piece->ranks == 1 ? 1 : tp_size,
                            (size_t)piece->first, (size_t)piece->count, write_run, (void *)&sink,
                            err));
  }
  return MP_OK;
}

/* The parallel save: every pipeline rank at dp rank 0 walks its chunks' tensors in pieces; the
 * tp group all-gathers each piece of a split tensor; tp rank 0 writes it (pipeline rank 0, which
 * is world rank 0) or sends it to pipeline rank 0, which takes the other pipeline ranks' pieces
 * in turn. No rank holds more than its state and tp x SAVE_PIECE_FLOATS floats. */
static mp_status save_parallel(mp_trainer *trainer, const char *path, mp_error *err) {
  const mp_trainer_options *o = &trainer->options;
  /* Every dp x cp replica holds the same parameters; with ZeRO-3 the blocks' are spread over the
   * replicas, which send replica 0 their parts of each piece. */
  const int replica_rank = trainer->replica_rank;
  if (replica_rank != 0 && !trainer->zero3) return MP_OK;
  const mp_tp_comm *tp = &trainer->tp_table;
  const int P = trainer->plan->pp;
  const bool writer_rank = replica_rank == 0 && o->pp_rank == 0 && tp->rank == 0;
  mp_status status = MP_OK, file_status = MP_OK;
  mp_error file_err = MP_ERROR_INITIALIZER;
  mp_llmc_writer *writer = NULL;
  if (writer_rank) file_status = mp_llmc_writer_open(trainer->layout, path, &writer, &file_err);
  float *gathered = malloc((size_t)(tp->size + 1) * SAVE_PIECE_FLOATS * sizeof(float));
  if (gathered == NULL) {
    if (writer != NULL) mp_llmc_writer_abort(writer);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory for a save's piece");
  }
  /* This rank's piece, read from wherever it keeps it (host memory, the GPU) or with ZeRO-3
   * collected from the dp ranks' parts. */
  float *own = gathered + (size_t)tp->size * SAVE_PIECE_FLOATS;
  for (int c = 0; c < trainer->num_chunks && status == MP_OK; ++c) {
    size_t blocks_first = 0, blocks_end = 0, largest = 0;
    mp_stage_layout_blocks_range(trainer->layouts[c], &blocks_first, &blocks_end, &largest);
    /* Each chunk has its own copy of the layout: indices, not pointers, cross between them. */
    const mp_param_tensor *first_tensor =
        mp_param_layout_tensor(mp_stage_layout_model(trainer->layouts[c]), 0);
    for (int j = 0; j < mp_stage_layout_num_tensors(trainer->layouts[c]) && status == MP_OK;
         ++j) {
      const mp_stage_tensor *t = mp_stage_layout_tensor(trainer->layouts[c], j);
      if (t->tied_copy) continue; /* the first stage writes wte */
      const bool replicated = t->split == MP_TP_REPLICATED;
      for (size_t at = 0; at < t->count && status == MP_OK; at += SAVE_PIECE_FLOATS) {
        const size_t n = t->count - at < SAVE_PIECE_FLOATS ? t->count - at : SAVE_PIECE_FLOATS;
        const save_piece piece = {t->full - first_tensor, (int64_t)at, (int64_t)n,
                                  replicated ? 1 : tp->size};
        if (trainer->zero3 && t->offset >= blocks_first && t->offset < blocks_end) {
          status = mp_train_zero3_collect(trainer, c, t->offset + at, n, own, err);
        } else if (replica_rank == 0) {
          status = mp_train_read_params(trainer, c, t->offset + at, n, own, err);
        }
        if (status != MP_OK || replica_rank != 0) continue;
        if (replicated) {
          if (tp->rank == 0) memcpy(gathered, own, n * sizeof(float));
        } else {
          status = mp_tp_all_gather(tp, own, gathered, n, err);
        }
        if (status != MP_OK || tp->rank != 0) continue;
        if (o->pp_rank == 0) {
          status = write_piece(writer, trainer->layout, &piece, gathered, tp->size, err);
        } else {
          status = mp_comm_send(o->pp, &piece, sizeof piece, 0, err);
          if (status == MP_OK) {
            status = mp_comm_send(o->pp, gathered, (size_t)piece.ranks * n * sizeof(float), 0,
                                  err);
          }
        }
      }
    }
  }
  if (status == MP_OK && replica_rank == 0 && tp->rank == 0 && o->pp_rank > 0) {
    const save_piece end = {-1, 0, 0, 0};
    status = mp_comm_send(o->pp, &end, sizeof end, 0, err);
  }
  /* Pipeline rank 0 takes the other pipeline ranks' pieces, in pipeline-rank order. */
  for (int p = 1; p < P && writer_rank && status == MP_OK; ++p) {
    for (;;) {
      save_piece piece;
      status = mp_comm_recv(o->pp, &piece, sizeof piece, p, err);
      if (status != MP_OK || piece.tensor < 0) break;
      const mp_param_tensor *t = mp_param_layout_tensor(trainer->layout, (int)piece.tensor);
      if (t == NULL || piece.ranks < 1 || piece.ranks > tp->size || piece.count < 0 ||
          piece.count > SAVE_PIECE_FLOATS) {
        status = mp_fail(err, MP_ERR_RUNTIME, "pipeline rank %d sent a bad piece of a save", p);
        break;
      }
      status = mp_comm_recv(o->pp, gathered, (size_t)(piece.ranks * piece.count) * sizeof(float),
                            p, err);
      if (status == MP_OK) {
        status = write_piece(writer, trainer->layout, &piece, gathered, tp->size, err);
      }
    }
  }
  free(gathered);
  if (writer != NULL) {
    if (status == MP_OK) {
      status = mp_llmc_writer_commit(writer, err);
    } else {
      mp_llmc_writer_abort(writer);
    }
  }
  if (status == MP_OK && file_status != MP_OK) {
    if (err != NULL) *err = file_err;
    status = file_status;
  }
  return status;
}

mp_status mp_trainer_save_llmc(mp_trainer *trainer, const char *path, mp_error *err) {
  return save_parallel(trainer, path, err);
}
