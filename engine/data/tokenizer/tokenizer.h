/*
 * engine/data/tokenizer/tokenizer.h — a Hugging Face `tokenizer.json`, loaded and run in C: text to
 * the exact ids of the `tokenizers` library (`Tokenizer.from_file(path).encode(text).ids`), and
 * ids back to text (`Tokenizer.decode`).
 *
 * What is implemented is what the model families mpengine trains ship:
 *   - byte-level BPE behind a split regex (GPT-2; Llama 3 with `ignore_merges`; Qwen2 with NFC);
 *   - SentencePiece-style BPE: Prepend/Replace normalizers or the Metaspace pre-tokenizer, with
 *     byte fallback (`<0xNN>` tokens) and fused unknowns (Llama 2, Mistral);
 *   - added and special tokens, split out before everything else; the TemplateProcessing,
 *     ByteLevel, RobertaProcessing and BertProcessing post-processors; the decoders those files
 *     name.
 * In detail: the BPE model (merges as "a b" or ["a", "b"], unk_token, fuse_unk, byte_fallback,
 * ignore_merges, continuing_subword_prefix, end_of_word_suffix; dropout null or 0); normalizers
 * NFC, NFD, NFKC, NFKD, Prepend, Replace, Lowercase, Strip, ByteLevel, Sequence; pre-tokenizers
 * Split (every behavior, invert), ByteLevel, Metaspace, Digits, WhitespaceSplit,
 * CharDelimiterSplit, Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 * Sequence. Patterns are Oniguruma's (as in `tokenizers`), run on PCRE2 (hf_regex.h).
 * Anything else (WordPiece, Unigram, WordLevel, an unknown normalizer or pre-tokenizer, BPE
 * dropout, truncation or padding, a pattern PCRE2 cannot match the same way) is refused at load
 * time, naming the JSON path: never approximated.
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 are read as U+FFFD, one per maximal invalid
 * subpart, exactly as Python's `bytes.decode("utf-8", "replace")` and Rust's
 * `String::from_utf8_lossy` do, so the ids equal Hugging Face's for the decoded string.
 *
 * A loaded tokenizer is immutable: encode and decode may run on many threads at once, each with an
 * encoder of its own (which holds the regex match data and a word cache).
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_tokenizer mp_tokenizer;
typedef struct mp_token_encoder mp_token_encoder;

/* A growable array of token ids, owned by the caller: start zeroed, free with
 * mp_token_ids_free. */
typedef struct {
  uint32_t *ids;
  size_t count;
  size_t capacity;
} mp_token_ids;

void mp_token_ids_free(mp_token_ids *ids);

/* Loads `path`: a tokenizer.json, or a directory holding one. Fails with MP_ERR_INPUT naming the
 * file (and the JSON path, "$.model.type", for what is malformed or not implemented); with
 * MP_ERR_RUNTIME when memory runs out. On success *out is freed with mp_tokenizer_free. */
mp_status mp_tokenizer_load(const char *path, mp_tokenizer **out, mp_error *err);
void mp_tokenizer_free(mp_tokenizer *tokenizer);

/* The path it was loaded from (the tokenizer.json itself). */
const char *mp_tokenizer_path(const mp_tokenizer *tokenizer);

/* Number of ids: one more than the largest id of the model's vocabulary and the added tokens
 * (Hugging Face's `get_vocab_size(with_added_tokens=True)`). */
int64_t mp_tokenizer_vocab_size(const mp_tokenizer *tokenizer);

/* The id of token text `token` (a vocabulary entry or an added token), or -1. */
int64_t mp_tokenizer_token_to_id(const mp_tokenizer *tokenizer, const char *token);

/* The text of id `id` as the vocabulary spells it ("Ġthe", "<|endoftext|>", "<0x0A>"), or NULL
 * for an id out of range. */
const char *mp_tokenizer_id_to_token(const mp_tokenizer *tokenizer, int64_t id);

/* True when id is an added token marked special (skipped by decode with skip_special_tokens). */
int mp_tokenizer_is_special(const mp_tokenizer *tokenizer, int64_t id);

/* The special token ids the post-processor's template puts before a single sequence (Llama 3's
 * <|begin_of_text|>, Llama 2's <s>): count written to *out_count (0 .. max_ids), ids to out_ids.
 * 0 when there is no such template (GPT-2, Qwen2). */
void mp_tokenizer_template_prefix(const mp_tokenizer *tokenizer, int64_t *out_ids, int max_ids,
                                  int *out_count);

/* Per-thread scratch for encoding. */
mp_status mp_token_encoder_create(const mp_tokenizer *tokenizer, mp_token_encoder **out,
                                  mp_error *err);
void mp_token_encoder_free(mp_token_encoder *encoder);

/* Appends the ids of text[0 .. text_bytes) to *out: `encode(text, add_special_tokens=...)`.
 * add_special_tokens applies the post-processor's template (its prefix and suffix tokens).
 * MP_ERR_RUNTIME when memory runs out or the regex engine fails (its message named). */
mp_status mp_token_encoder_encode(mp_token_encoder *encoder, const char *text, size_t text_bytes,
                                  int add_special_tokens, mp_token_ids *out, mp_error *err);

/* Decodes count ids to UTF-8 text (`decode(ids, skip_special_tokens=...)`), malloc'ed into
 * *out_text (NUL-terminated, length in *out_bytes). MP_ERR_INPUT naming the first id that is
 * out of range (Hugging Face silently drops such ids; a shard holding one is corrupt). */
mp_status mp_tokenizer_decode(const mp_tokenizer *tokenizer, const uint32_t *ids, size_t count,
                              int skip_special_tokens, char **out_text, size_t *out_bytes,
                              mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_TOKENIZER_H */
