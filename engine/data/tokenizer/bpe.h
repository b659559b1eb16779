/*
 * engine/data/tokenizer/bpe.h — the BPE model of tokenizer.json, as `tokenizers` runs it
 * (models/bpe/model.rs, word.rs): a word is cut into characters, each looked up in the vocabulary
 * (with continuing_subword_prefix after the first and end_of_word_suffix on the last; else its
 * UTF-8 bytes as <0xNN> tokens when byte_fallback; else the unknown token, fused when fuse_unk),
 * then adjacent pairs are merged lowest rank first (leftmost on ties) through a priority queue,
 * one merge at a time, exactly as HF's Word::merge_all. With ignore_merges a word that is in the
 * vocabulary is that one token.
 *
 * Words already encoded are kept in each encoder's cache (HF caches words too); dropout must be
 * absent or 0, so the result of a word never changes.
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_BPE_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/data/tokenizer/string_table.h"
#include "engine/data/tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One merge: the pair (left, right) of ids becomes merged, with priority rank. */
typedef struct {
  uint32_t left, right;
  uint32_t rank, merged; /* rank UINT32_MAX: empty slot */
} mp_bpe_merge;

typedef struct {
  mp_string_table vocab;      /* token text -> id */
  const char **id_to_token;   /* [id_count]; NULL for ids the vocabulary skips */
  uint32_t id_count;          /* one more than the largest id */
  mp_bpe_merge *merges;       /* open addressing on (left, right) */
  size_t merge_mask;
  char *unk_token;            /* NULL: unknown characters are dropped, as HF does */
  char *continuing_subword_prefix, *end_of_word_suffix; /* NULL when absent */
  bool fuse_unk, byte_fallback, ignore_merges;
  int64_t byte_fallback_ids[256]; /* id of "<0xNN>", -1 when absent */
  int64_t byte_level_ids[256];    /* id of the byte map's character of each byte, or -1 */
  bool byte_level_direct;         /* all 256 present, no prefix/suffix: read bytes directly */
} mp_bpe;

typedef struct mp_bpe_scratch mp_bpe_scratch;

/* Adds merge number `rank` of (left, right) -> merged; a pair given twice keeps the later rank,
 * as HF's map does. False when memory runs out. */
bool mp_bpe_add_merge(mp_bpe *bpe, uint32_t left, uint32_t right, uint32_t rank,
                      uint32_t merged);

/* Sizes the merge table for count merges (call once before adding them). */
bool mp_bpe_reserve_merges(mp_bpe *bpe, size_t count);

/* Fills id_to_token, the <0xNN> and byte-map id tables once vocab and options are set. */
bool mp_bpe_finish(mp_bpe *bpe);

void mp_bpe_free(mp_bpe *bpe);

mp_bpe_scratch *mp_bpe_scratch_create(void);
void mp_bpe_scratch_free(mp_bpe_scratch *scratch);

/* Appends the ids of one word to out. byte_level: word stands for its GPT-2 byte map.
 * MP_ERR_INPUT when the unknown token is needed but not in the vocabulary; MP_ERR_RUNTIME when
 * memory runs out. */
mp_status mp_bpe_encode_word(const mp_bpe *bpe, mp_bpe_scratch *scratch, const char *word,
                             size_t bytes, bool byte_level, mp_token_ids *out, mp_error *err);

/* Appends count ids to out; false when memory runs out. */
bool mp_token_ids_append(mp_token_ids *out, const uint32_t *ids, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_BPE_H */
