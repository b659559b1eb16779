#!/usr/bin/env python3
"""tools/bench/safetensors_golden.py — writes the golden safetensors files that
tests/engine/safetensors_test.cc compares mpengine's safetensors reader and writer with, and the
seed corpus of the safetensors fuzz target.

Every golden comes from the reference implementation, Hugging Face's `safetensors` (0.4.5) with
PyTorch, the way `transformers` saves a checkpoint (`save_pretrained`): safetensors.torch.save_file
with metadata {"format": "pt"}, and for a sharded checkpoint one file per shard plus
model.safetensors.index.json written as json.dumps(index, indent=2, sort_keys=True) + "\\n". So CI
compares against the real library without installing it. To regenerate (a few KB in all):

  /usr/bin/python3 -m venv --system-site-packages /tmp/stv && /tmp/stv/bin/pip install safetensors==0.4.5
  apt-get install -y python3-torch          # Debian's torch 1.13 (and numpy)
  /tmp/stv/bin/python tools/bench/safetensors_golden.py [TESTDATA_DIR [CORPUS_DIR]]
      (defaults tests/engine/testdata/safetensors and tests/fuzz/corpus/safetensors)

Files:
  mixed.safetensors       F32, BF16 and F16 tensors of ranks 0, 1, 2 and an empty one, metadata
                          {"format": "pt"}. Every value is a multiple of 1/8 below 2^5 in
                          magnitude (value() below), exact in all three dtypes, so the test knows
                          them without this script and the writer, given them as fp32, must give
                          back these bytes.
  rounding.safetensors    "source" (F32, 1024 values: the edge cases of rounding to bf16 and fp16,
                          then random fp32 bit patterns over the whole finite range) and
                          "source_bf16", "source_f16": the same values converted by torch's
                          .to(torch.bfloat16) and .to(torch.float16), which round to nearest even.
                          No metadata. NaN is left out: torch's vectorized bf16 path writes 0xffff
                          and its scalar path 0x7fc0, so there is no one reference to match.
  escaping.safetensors    tensors whose names need JSON escaping (quotes, backslashes, control
                          characters, non-ASCII), and one metadata entry that does; F32 zeros.
  escaping.index.json     an index over those names, as transformers writes it (\\uXXXX escapes).
  sharded/                a two-shard bf16 checkpoint of a tiny Llama-shaped model
                          (model-0000{1,2}-of-00002.safetensors and model.safetensors.index.json).
Corpus: the goldens, and broken variants of mixed.safetensors (bad_*), one per refusal; and
the index, whole and broken (index_*), each after the 4 bytes "idx\\n" that tell the fuzz target
to read the rest as a model.safetensors.index.json beside the sharded goldens.
"""
import json
import os
import random
import struct
import sys

import torch
from safetensors.torch import save_file, load_file


def value(tensor_index, element):
    """Element `element` of the tensor numbered `tensor_index`: a multiple of 1/8 in (-32, 32),
    exact in fp32, bf16 (8 significant bits) and fp16. The test computes the same numbers."""
    return ((tensor_index * 37 + element * 11) % 509 - 254) / 8.0


def tensor_of(tensor_index, shape, dtype):
    count = 1
    for n in shape:
        count *= n
    values = [value(tensor_index, j) for j in range(count)]
    return torch.tensor(values, dtype=torch.float32).reshape(shape).to(dtype)


# (name, shape, dtype); the tensor index for value() is the position in this list.
MIXED = [
    ("model.embed_tokens.weight", (8, 6), torch.float32),
    ("model.layers.0.mlp.down_proj.weight", (6, 10), torch.bfloat16),
    ("model.layers.0.self_attn.q_proj.bias", (10,), torch.float16),
    ("model.norm.weight", (6,), torch.float32),
    ("lm_head.weight", (8, 6), torch.bfloat16),
    ("scale", (), torch.float32),
    ("empty", (0, 6), torch.float32),
]

# The tiny sharded model: hidden 4, 2 layers, vocab 8, ffn 6; names as transformers writes them.
SHARDED = [
    ("model.embed_tokens.weight", (8, 4)),
    ("model.layers.0.input_layernorm.weight", (4,)),
    ("model.layers.0.mlp.down_proj.weight", (4, 6)),
    ("model.layers.0.mlp.gate_proj.weight", (6, 4)),
    ("model.layers.0.self_attn.q_proj.weight", (4, 4)),
    ("model.layers.1.input_layernorm.weight", (4,)),
    ("model.layers.1.mlp.down_proj.weight", (4, 6)),
    ("model.layers.1.mlp.gate_proj.weight", (6, 4)),
    ("model.layers.1.self_attn.q_proj.weight", (4, 4)),
    ("model.norm.weight", (4,)),
    ("lm_head.weight", (8, 4)),
]
SHARD_OF_FIRST_LAYER1_TENSOR = 5  # tensors [0, 5) go to shard 1, the rest to shard 2


# Names the writers must escape as serde_json (the header) and Python's json (the index) do.
ESCAPING = ['plain', 'quote"backslash\\slash/', 'controls\b\f\n\r\t\x01\x1f\x7f',
            'utf8 \u00e9 \u20ac \U0001f600']
ESCAPING_METADATA = {'note "1"\n': 'caf\u00e9\t\\'}


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def rounding_source():
    """The fp32 values whose bf16 and fp16 conversions are compared byte for byte."""
    special = [
        0x00000000, 0x80000000,              # +0, -0
        0x7F800000, 0xFF800000,              # +-inf
        0x3F800000, 0x3F808000, 0x3F818000,  # 1, 1 + 2^-8 (bf16 tie, to even: 1), 1 + 3*2^-8 (tie, up)
        0x3F808001, 0x3F807FFF,              # just above / below the bf16 tie
        0x7F7FFFFF, 0xFF7FFFFF,              # largest finite: bf16 rounds it to inf
        0x7F7F7FFF, 0x00000001, 0x80000001,  # just below the bf16 overflow; smallest fp32 subnormal
        0x007FFFFF, 0x00800000,              # largest fp32 subnormal, smallest normal
        0x477FE000, 0x477FEFFF, 0x477FF000,  # fp16: 65504 (largest), just below the tie, the tie (inf)
        0x47800000, 0xC7800000,              # 65536: inf in fp16
        0x38800000, 0x387FFFFF, 0x387FC000,  # fp16 smallest normal 2^-14 and just below it
        0x33800000, 0x33000000, 0x33000001,  # fp16 smallest subnormal 2^-24; 2^-25 (tie, to 0); above
        0x33C00000, 0x34200000, 0x34400000,  # 1.5 * 2^-24 (tie, up to 2), 2.5 * 2^-24 (to 2), 3 * 2^-24
        0x3A800000, 0x3A801000, 0x3A803000,  # fp16 rounding in the normal range: exact, ties
        0x3A801001, 0xBA802FFF,
        0x3DCCCCCD, 0xBDCCCCCD, 0x40490FDB,  # 0.1, -0.1, pi
    ]
    rng = random.Random(20240520)
    values = [f32(b) for b in special]
    while len(values) < 1024:
        bits = rng.getrandbits(32)
        if (bits & 0x7F800000) == 0x7F800000:
            continue  # inf or NaN: the specials cover inf, NaN is left out (see the docstring)
        if len(values) % 2 == 0:
            # Half the random values near 1 and near the fp16 range, where rounding is busiest.
            bits = (bits & 0x807FFFFF) | ((rng.randrange(100, 150)) << 23)
        values.append(f32(bits))
    return torch.tensor(values, dtype=torch.float32)


def write_index(path, weight_map, total_size):
    # transformers 4.46 modeling_utils.save_pretrained, word for word.
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    with open(path, "w", encoding="utf-8") as f:
        content = json.dumps(index, indent=2, sort_keys=True) + "\n"
        f.write(content)


def header_of(data):
    n = struct.unpack("<Q", data[:8])[0]
    return n, data[8:8 + n]


def with_header(data, header_text, pad=True):
    """data with its JSON header replaced by header_text (bytes), padded with spaces to a
    multiple of 8 as the reference does, the data section kept."""
    n, _ = header_of(data)
    body = data[8 + n:]
    if pad and len(header_text) % 8:
        header_text += b" " * (8 - len(header_text) % 8)
    return struct.pack("<Q", len(header_text)) + header_text + body


def broken_variants(mixed):
    """name -> bytes: mixed.safetensors broken in one way each (the fuzz corpus seeds)."""
    n, header = header_of(mixed)
    text = header.decode().rstrip(" ")
    parsed = json.loads(text)
    def edit(fn):
        h = json.loads(text)
        fn(h)
        return with_header(mixed, json.dumps(h, separators=(",", ":")).encode())
    out = {}
    out["bad_short.safetensors"] = mixed[:5]
    out["bad_header_too_large.safetensors"] = struct.pack("<Q", 100_000_001) + mixed[8:]
    out["bad_header_beyond_file.safetensors"] = struct.pack("<Q", len(mixed)) + mixed[8:]
    out["bad_not_json.safetensors"] = with_header(mixed, b'{"a": [1, 2')
    out["bad_not_object.safetensors"] = with_header(mixed, b'[1, 2, 3]')
    out["bad_utf8.safetensors"] = with_header(mixed, b'{"\xff": 1}')
    out["bad_truncated.safetensors"] = mixed[:-3]
    out["bad_trailing.safetensors"] = mixed + b"\0" * 8
    out["bad_dtype.safetensors"] = edit(lambda h: h["model.norm.weight"].update(dtype="F33"))
    out["bad_shape.safetensors"] = edit(lambda h: h["model.norm.weight"].update(shape=[7]))
    def overlap(h):
        h["model.norm.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"][:]
        h["model.norm.weight"]["shape"] = [8, 6]
    out["bad_overlap.safetensors"] = edit(overlap)
    def gap(h):
        b, e = h["scale"]["data_offsets"]
        h["scale"]["data_offsets"] = [b + 4, e + 4]
    out["bad_gap.safetensors"] = edit(gap)
    out["bad_offsets_reversed.safetensors"] = edit(
        lambda h: h["empty"].update(data_offsets=[8, 0]))
    dup = text[:-1] + ',"scale":' + json.dumps(parsed["scale"], separators=(",", ":")) + "}"
    out["bad_duplicate.safetensors"] = with_header(mixed, dup.encode())
    out["bad_metadata_value.safetensors"] = edit(lambda h: h.update(__metadata__={"format": 1}))
    return out


def broken_indexes(index_text):
    """name -> bytes: the fuzz target's index inputs, "idx\\n" + an index JSON."""
    good = json.loads(index_text)
    def edit(fn):
        h = json.loads(index_text)
        fn(h)
        return b"idx\n" + json.dumps(h, indent=2, sort_keys=True).encode()
    out = {"index_valid.json": b"idx\n" + index_text.encode()}
    out["index_bad_missing_file.json"] = edit(
        lambda h: h["weight_map"].update({"model.norm.weight": "model-00003-of-00002.safetensors"}))
    out["index_bad_wrong_file.json"] = edit(
        lambda h: h["weight_map"].update({"model.norm.weight": "model-00001-of-00002.safetensors"}))
    out["index_bad_unlisted.json"] = edit(lambda h: h["weight_map"].pop("lm_head.weight"))
    out["index_bad_extra.json"] = edit(
        lambda h: h["weight_map"].update({"model.extra.weight": "model-00001-of-00002.safetensors"}))
    out["index_bad_traversal.json"] = edit(
        lambda h: h["weight_map"].update({"lm_head.weight": "../model-00002-of-00002.safetensors"}))
    out["index_bad_not_object.json"] = edit(lambda h: h.update(weight_map=[1, 2]))
    out["index_bad_value.json"] = edit(lambda h: h["weight_map"].update({"lm_head.weight": 2}))
    assert set(good["weight_map"]) == {n for n, _ in SHARDED}
    return out


def main():
    testdata = sys.argv[1] if len(sys.argv) > 1 else "tests/engine/testdata/safetensors"
    corpus = sys.argv[2] if len(sys.argv) > 2 else "tests/fuzz/corpus/safetensors"
    os.makedirs(os.path.join(testdata, "sharded"), exist_ok=True)
    os.makedirs(corpus, exist_ok=True)

    mixed = {name: tensor_of(k, shape, dtype) for k, (name, shape, dtype) in enumerate(MIXED)}
    mixed_path = os.path.join(testdata, "mixed.safetensors")
    save_file(mixed, mixed_path, metadata={"format": "pt"})

    source = rounding_source()
    rounding_path = os.path.join(testdata, "rounding.safetensors")
    save_file({"source": source, "source_bf16": source.to(torch.bfloat16),
               "source_f16": source.to(torch.float16)}, rounding_path)

    # transformers names shards model-XXXXX-of-YYYYY.safetensors and maps each tensor to its file.
    shards = [{}, {}]
    weight_map = {}
    total_size = 0
    for k, (name, shape) in enumerate(SHARDED):
        shard = 0 if k < SHARD_OF_FIRST_LAYER1_TENSOR else 1
        t = tensor_of(100 + k, shape, torch.bfloat16)
        shards[shard][name] = t
        weight_map[name] = "model-%05d-of-%05d.safetensors" % (shard + 1, len(shards))
        total_size += t.numel() * t.element_size()
    for s, tensors in enumerate(shards):
        save_file(tensors, os.path.join(testdata, "sharded",
                                        "model-%05d-of-%05d.safetensors" % (s + 1, len(shards))),
                  metadata={"format": "pt"})
    write_index(os.path.join(testdata, "sharded", "model.safetensors.index.json"), weight_map,
                total_size)

    save_file({name: torch.zeros(2, k + 1) for k, name in enumerate(ESCAPING)},
              os.path.join(testdata, "escaping.safetensors"), metadata=ESCAPING_METADATA)
    write_index(os.path.join(testdata, "escaping.index.json"),
                {name: "shard %d \u00e9.safetensors" % k for k, name in enumerate(ESCAPING)}, 96)

    # The reference reads back what it wrote (a check on this script).
    back = load_file(mixed_path)
    assert all(torch.equal(back[n], mixed[n]) for n in mixed)

    with open(mixed_path, "rb") as f:
        mixed_bytes = f.read()
    seeds = {"valid_mixed.safetensors": mixed_bytes}
    with open(rounding_path, "rb") as f:
        seeds["valid_rounding.safetensors"] = f.read()
    for s in range(len(shards)):
        with open(os.path.join(testdata, "sharded",
                               "model-%05d-of-00002.safetensors" % (s + 1)), "rb") as f:
            seeds["valid_shard%d.safetensors" % (s + 1)] = f.read()
    seeds.update(broken_variants(mixed_bytes))
    with open(os.path.join(testdata, "sharded", "model.safetensors.index.json")) as f:
        seeds.update(broken_indexes(f.read()))
    for name, data in seeds.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    for root, _, files in os.walk(testdata):
        for name in sorted(files):
            path = os.path.join(root, name)
            print("wrote %s: %d bytes" % (path, os.path.getsize(path)))
    print("wrote %d corpus files to %s" % (len(seeds), corpus))


if __name__ == "__main__":
    main()
