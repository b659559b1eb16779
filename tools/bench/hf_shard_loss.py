#!/usr/bin/env python3
"""tools/bench/hf_shard_loss.py — transformers' mean next-token loss over every sample of an llm.c
token shard, for checking mpengine's held-out loss against the model it exported.

  V/bin/python tools/bench/hf_shard_loss.py HF_DIR SHARD SEQ_LEN

Samples are cut as mpengine's loader cuts them (engine/data/data_loader.h): sample k is tokens
[k T, k T + T] (inputs its first T, targets its last T), S = floor((N - 1) / T) of them. Prints
the mean cross-entropy over all S x T targets in float64: the held-out loss of a run whose
evaluation covers each of the S samples exactly once (--eval-batches x the global batch = S).
Reads both shard versions (uint16, magic 20240520; uint32, magic 20240801).
"""
import struct
import sys

import torch
import transformers


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        wide = header[0] == 20240801
        count = header[2]
        data = f.read()
    return list(struct.unpack("<%d%s" % (count, "I" if wide else "H"), data))


def main():
    hf_dir, shard, seq_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tokens = read_shard(shard)
    samples = (len(tokens) - 1) // seq_len
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float64).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(samples):
            window = torch.tensor([tokens[k * seq_len:k * seq_len + seq_len + 1]])
            logits = model(window[:, :-1]).logits
            total += float(torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), window[:, 1:].reshape(-1), reduction="sum"))
            count += seq_len
    print("%.9f" % (total / count))


if __name__ == "__main__":
    main()
