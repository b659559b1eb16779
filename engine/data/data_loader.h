/*
 * engine/data/data_loader.h — training batches of (input, target) token windows, drawn so that the
 * batch of a step is a pure function of (seed, step, global batch size, sequence length).
 *
 * Why stateless: a run resumed from a checkpoint must see exactly the batches it would have seen
 * had it not stopped, and a run on any (dp, pp, tp) layout must see the same global batch as a
 * one-rank run ("parallel equals serial"). So there is no cursor to save: every call names the
 * step and the slice of the global batch it wants, and a data-parallel rank asks for its own
 * rows, a micro-batch for a sub-slice of them.
 *
 * The token stream is the concatenation of the shards matched by a glob (sorted by file name),
 * or an in-memory array (the synthetic Markov source of `run` without --data). Windows cross
 * shard boundaries: the stream is treated as one sequence, as llm.c's shards are documents
 * separated by an end-of-text token anyway.
 *
 * Samples: for a sequence length T the stream of N tokens holds S = floor((N - 1) / T) samples;
 * sample k is tokens [k T, k T + T] (T + 1 tokens, stride T): inputs its first T tokens, targets
 * its last T. The tail that does not fill a sample is never used.
 *
 * Order: the global batch of step s, size G, is positions p = s G + j for j = 0 .. G - 1 of an
 * endless sequence of epochs; position p belongs to epoch e = p / S and is sample
 * order_e(p mod S), where order_e is a keyed bijection of 0 .. S - 1 computed per position
 * (sample_order.h: a cycle-walking Feistel permutation keyed by (seed, e)). So every sample
 * appears exactly once per epoch, the order changes every epoch (PyTorch's DistributedSampler
 * with set_epoch, without its padding: epochs are whole because positions flow on into the next
 * epoch rather than being dropped), and a batch may straddle two epochs. This is data order
 * MP_DATA_ORDER_VERSION; checkpoints record it, and a resume refuses another.
 *
 * Memory: nothing grows with the corpus. Shards are opened (header and size checked) and mapped,
 * never read whole; a call reads only the windows of the rows it asks for (token_shard.h), and
 * checks their ids then; the order is computed, never stored. A held-out split is a range of the
 * same stream, not a copy.
 */
#ifndef MPENGINE_ENGINE_DATA_LOADER_H
#define MPENGINE_ENGINE_DATA_LOADER_H

#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_data_loader mp_data_loader;

/* The data order this loader draws, recorded in checkpoints ($.data.order): 1 was a Fisher-Yates
 * shuffle of each epoch, materialised; 2 is the Feistel order of sample_order.h. */
enum { MP_DATA_ORDER_FISHER_YATES = 1, MP_DATA_ORDER_FEISTEL = 2 };
#define MP_DATA_ORDER_VERSION MP_DATA_ORDER_FEISTEL
#define MP_DATA_ORDER_NAME "Feistel"

/* Opens every file matching the glob pattern (glob(3): *, ?, [...]), sorted by name, as llm.c
 * token shards of uint16 or uint32 ids for a vocabulary of vocab_size ids (1 .. 2^31, so that an
 * id fits the int32 batches): each header and size is checked now (token_shard.h), each id when
 * a window holding it is read. Fails with MP_ERR_INPUT naming the pattern when nothing matches,
 * or the first bad shard's own error; MP_ERR_RUNTIME when memory runs out. On success *out is
 * freed with mp_data_loader_free. */
mp_status mp_data_loader_open_glob(const char *pattern, int64_t vocab_size, mp_data_loader **out,
                                   mp_error *err);

/* A loader over count in-memory tokens (copied), each checked to be < vocab_size. `name`
 * describes them in messages and logs ("synthetic Markov source (seed 1337)"). */
mp_status mp_data_loader_from_tokens(const uint16_t *tokens, int64_t count, int64_t vocab_size,
                                     const char *name, mp_data_loader **out, mp_error *err);

void mp_data_loader_free(mp_data_loader *loader);

/* Splits the last `count` tokens off the stream into a loader of their own (*out), for a held-out
 * loss: `loader` keeps the first N - count tokens, so no training batch ever reads one of them (a
 * window never crosses the cut: the held-out part is a stream of its own). Both read the same
 * shards (or tokens), which stay open until both are freed, in either order; nothing is copied.
 * MP_ERR_INPUT when count is not in 1 .. N - 1. */
mp_status mp_data_loader_hold_out(mp_data_loader *loader, int64_t count, mp_data_loader **out,
                                  mp_error *err);

/* What the tokens came from: the glob pattern, or the name given to from_tokens. */
const char *mp_data_loader_name(const mp_data_loader *loader);

/* Number of shard files (0 for in-memory tokens), and the i-th in the order they are read (a
 * held-out split lists the files of the stream it is a range of). */
int mp_data_loader_num_files(const mp_data_loader *loader);
const char *mp_data_loader_file(const mp_data_loader *loader, int index);

/* N, the number of tokens in the stream. */
int64_t mp_data_loader_num_tokens(const mp_data_loader *loader);

/* S, the samples per epoch for sequence length seq_len: floor((N - 1) / seq_len), 0 when the
 * stream is shorter than seq_len + 1 tokens or seq_len < 1. */
int64_t mp_data_loader_num_samples(const mp_data_loader *loader, int64_t seq_len);

/* MP_OK when seq_len >= 1 and the stream holds at least one sample of seq_len + 1 tokens;
 * otherwise MP_ERR_INPUT naming the data, its token count and what would fix it. */
mp_status mp_data_loader_check(const mp_data_loader *loader, int64_t seq_len, mp_error *err);

/* The epoch that position p = step * global_batch + sample falls in (for logs). */
int64_t mp_data_loader_epoch(const mp_data_loader *loader, int64_t seq_len, int64_t global_batch,
                             int64_t step, int64_t sample);

/* Writes rows first_sample .. first_sample + num_samples - 1 of the global batch of `step`
 * (global_batch rows in all, seq_len = T tokens each):
 *   inputs  (num_samples, T) int32   tokens [k T, k T + T)       of each row's sample k
 *   targets (num_samples, T) int32   tokens [k T + 1, k T + T]   the next token of each input
 * The result depends only on (tokens, seed, seq_len, global_batch, step, first_sample,
 * num_samples), never on earlier calls. It reads only those rows' windows. The loader caches the
 * round keys of the last epoch it used and a window's buffer, so one loader must not be shared
 * between threads without a lock. Fails with MP_ERR_INPUT when the stream holds no sample (see
 * mp_data_loader_check), or step < 0, global_batch < 1, or the rows are not inside
 * 0 .. global_batch - 1, or a window holds an id outside the vocabulary (the shard's message:
 * file, token index, byte offset); MP_ERR_RUNTIME when memory for a window runs out. */
mp_status mp_data_loader_batch(mp_data_loader *loader, uint64_t seed, int64_t seq_len,
                               int64_t global_batch, int64_t step, int64_t first_sample,
                               int64_t num_samples, int32_t *inputs, int32_t *targets,
                               mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_LOADER_H */
