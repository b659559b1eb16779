#!/usr/bin/env python3
"""tools/bench/llmc_golden.py — writes the golden llm.c GPT-2 checkpoint that
tests/engine/gpt_model_test.cc compares mpengine's llm.c writer and reader with.

It follows llm.c's train_gpt2.py write_model / write_tensors (version 3, fp32) for a tiny GPT-2,
independently of mpengine's tensor table: a header of 256 int32 (magic 20240326, version 3,
max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size), then the
parameters in llm.c's order, each per-layer tensor stacked over the layers:
wte (padded with zero rows), wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw,
fcb, fcprojw, fcprojb, lnfw, lnfb. Element j of the k-th tensor (0-based, in that order; j
counts over the whole stacked tensor, so it also tells the layers apart) is (k + 1) * 1000 + j,
an integer exact in fp32, so a tensor or a layer in the wrong place changes bytes. Only the
standard library (struct), so it runs anywhere:

  python3 tools/bench/llmc_golden.py [OUT]   (default tests/engine/testdata/llmc_tiny_gpt2.bin)
"""
import struct
import sys

# The tiny config (the test's model: vocab 10, seq_len 4, 8 channels, 2 heads, 2 layers).
T, V, L, NH, C = 4, 10, 2, 2, 8
VP = 64  # llm.c pads the vocabulary to a multiple of 64 (128 for the real GPT-2)

# llm.c's tensors in file order: (name, shape). Per-layer tensors carry the layer dimension.
TENSORS = [
    ("wte", (VP, C)), ("wpe", (T, C)),
    ("ln1w", (L, C)), ("ln1b", (L, C)),
    ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
    ("attprojw", (L, C, C)), ("attprojb", (L, C)),
    ("ln2w", (L, C)), ("ln2b", (L, C)),
    ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
    ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
    ("lnfw", (C,)), ("lnfb", (C,)),
]


def value(k, j):
    return float((k + 1) * 1000 + j)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/engine/testdata/llmc_tiny_gpt2.bin"
    header = [0] * 256
    header[:8] = [20240326, 3, T, V, L, NH, C, VP]
    data = [struct.pack("<256i", *header)]
    for k, (name, shape) in enumerate(TENSORS):
        count = 1
        for n in shape:
            count *= n
        values = [value(k, j) for j in range(count)]
        if name == "wte":
            # write_model pads wte with zero rows: torch.cat((wte, torch.zeros(VP - V, C))).
            values[V * C:] = [0.0] * ((VP - V) * C)
        data.append(struct.pack("<%df" % count, *values))
    with open(out, "wb") as f:
        f.write(b"".join(data))
    print("wrote %s: %d bytes" % (out, sum(len(d) for d in data)))


if __name__ == "__main__":
    main()
