#!/usr/bin/env python3
"""tools/bench/tokenize_cli_golden.py — the shards `mpengine data tokenize` must write for the small
inputs of tests/tools/testdata/tokenize/, built from Hugging Face tokenizers' own ids, for
tests/tools/tokenize_cli_test.sh.

Inputs: three text files (English, Chinese, and Esperanto in ISO-8859-3, which is not UTF-8),
each one document, read as Python's bytes.decode("utf-8", "replace"). For gpt2_style (uint16 ids)
and big_vocab (over 65,536 ids: uint32) the stream is, per document in the order given, the
separator (<|endoftext|>; big_vocab's template prefix <|begin_of_text|>) and then
`encode(text, add_special_tokens=False).ids`; its first VAL tokens go to PREFIX_val_000000.bin and
the rest to PREFIX_train_000001.bin, ... of SHARD tokens each, as llm.c's shards are laid out (a
256 x int32 header: magic 20240520 version 1 with uint16 ids, or 20240801 version 7 with uint32).

  V/bin/python tools/bench/tokenize_cli_golden.py
"""
import os
import struct

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
INPUTS = ["computers.txt", "chinese.txt", "proverbaro-latin3.txt"]
VAL, SHARD = 100, 300
CASES = {"gpt2_style": "<|endoftext|>", "big_vocab": "<|begin_of_text|>"}


def write_shard(path, ids, vocab):
    wide = vocab > 65536
    header = [0] * 256
    header[0], header[1], header[2] = (20240801, 7, len(ids)) if wide else (20240520, 1, len(ids))
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%d%s" % (len(ids), "I" if wide else "H"), *ids))


def main():
    data = os.path.join(ROOT, "tests", "tools", "testdata", "tokenize")
    for name, separator in CASES.items():
        tokenizer = Tokenizer.from_file(
            os.path.join(ROOT, "tests", "engine", "testdata", "tokenizers", name, "tokenizer.json"))
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        stream = []
        for file_name in INPUTS:
            with open(os.path.join(data, file_name), "rb") as f:
                text = f.read().decode("utf-8", "replace")
            stream.append(tokenizer.token_to_id(separator))
            stream.extend(tokenizer.encode(text, add_special_tokens=False).ids)
        out = os.path.join(data, "expected_" + name)
        write_shard(out + "_val_000000.bin", stream[:VAL], vocab)
        rest, index = stream[VAL:], 1
        for start in range(0, len(rest), SHARD):
            write_shard(out + "_train_%06d.bin" % index, rest[start:start + SHARD], vocab)
            index += 1
        print(name, "vocab", vocab, "tokens", len(stream), "train shards", index - 1,
              "ids over 65535:", sum(1 for i in stream if i > 65535))


if __name__ == "__main__":
    main()
