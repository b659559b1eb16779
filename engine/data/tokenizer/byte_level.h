/*
 * engine/data/tokenizer/byte_level.h — GPT-2's byte-to-unicode map (HF's ByteLevel): every byte
 * stands for one printable code point, so that byte-level BPE vocabularies are text. Bytes that
 * are printable Latin-1 ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other 68 map to
 * U+0100 onwards in byte order ("Ġ" is the space, U+0120).
 */
#ifndef MPENGINE_ENGINE_DATA_TOKENIZER_BYTE_LEVEL_H
#define MPENGINE_ENGINE_DATA_TOKENIZER_BYTE_LEVEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The code point byte b stands for. */
uint32_t mp_byte_level_char(uint8_t b);

/* Its UTF-8 (2 bytes at most) written to out; returns the length. */
size_t mp_byte_level_utf8(uint8_t b, char *out);

/* The byte code point c stands for, or -1 when c is none of the 256. */
int mp_byte_level_byte(uint32_t c);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_DATA_TOKENIZER_BYTE_LEVEL_H */
