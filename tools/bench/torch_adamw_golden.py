#!/usr/bin/env python3
"""tools/bench/torch_adamw_golden.py — PyTorch's own optimizer on a few steps, the reference
tests/engine/torch_adamw_reference_test.cc holds mpengine's optimizer path to (in CI, with no
PyTorch: this script's output is committed).

The parameters are the tensors of a tiny GPT-2 (vocab 8, 4 positions, 4 channels, 1 head, 1
layer: TENSORS below, in mpengine's names and (rows, cols) orientation, the vocabulary table
without its padding rows). Their starting values and each step's gradients are not stored: both
sides compute them from a small integer hash (value(), which the test repeats), exact in float32.
Five steps, each:
  - the gradients of the step set (their global norm about 3, 0.5, 2, 0.2, 1.5: clipped on
    steps 1, 3 and 5, not on 2 and 4)
  - torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
  - the learning rate of the step set on every group: linear warmup over WARMUP steps, then
    cosine decay to MIN_LR_RATIO x LR at the last step (topology/plan.h's training section)
  - torch.optim.AdamW(betas, eps) .step() with two groups: weight decay on the matrices and
    embeddings (dim 2), none on biases and norm weights
and the parameters after it are written (float32).

Writes tests/engine/testdata/torch_adamw_golden.json (the settings, the tensors with their offset
in the flat array and whether they decay, per step the learning rate and torch's gradient norm)
and torch_adamw_golden.f32 (STEPS x N little-endian float32: the flat parameters after each step).

Needs torch (Debian's python3-torch, 1.13; docs/benchmarks.md, "References and their versions"):
  /usr/bin/python3 tools/bench/torch_adamw_golden.py
"""
import json
import math
import os
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "engine",
                   "testdata")
V, T, C = 8, 4, 4
TENSORS = [  # (name, shape): mpengine's orientation, (out, in) for the linear layers
    ("embedding.wte", [V, C]), ("embedding.wpe", [T, C]),
    ("block.0.ln1.weight", [C]), ("block.0.ln1.bias", [C]),
    ("block.0.qkv.weight", [3 * C, C]), ("block.0.qkv.bias", [3 * C]),
    ("block.0.attn_proj.weight", [C, C]), ("block.0.attn_proj.bias", [C]),
    ("block.0.ln2.weight", [C]), ("block.0.ln2.bias", [C]),
    ("block.0.fc.weight", [4 * C, C]), ("block.0.fc.bias", [4 * C]),
    ("block.0.fc_proj.weight", [C, 4 * C]), ("block.0.fc_proj.bias", [C]),
    ("final_norm.weight", [C]), ("final_norm.bias", [C]),
]
STEPS = 5
GRAD_SCALE = [0.3, 0.05, 0.2, 0.02, 0.15]  # global norms about 3, 0.5, 2, 0.2, 1.5
LR, WARMUP, MIN_LR_RATIO = 1e-2, 2, 0.1
WEIGHT_DECAY, BETA1, BETA2, EPS, GRAD_CLIP = 0.1, 0.9, 0.95, 1e-8, 1.0
MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def value(stream, k):
    """Element k of stream (0: the starting parameters, s: step s's gradients), in [-1, 1], a
    double; the test computes the same double and rounds it to float as torch does."""
    return ((splitmix64((stream << 32) + k) % 20001) - 10000) / 10000.0


def lr_at(step):
    """The learning rate of 0-based step `step` of STEPS."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP - 1)
    min_lr = LR * MIN_LR_RATIO
    return min_lr + 0.5 * (LR - min_lr) * (1 + math.cos(math.pi * progress))


def main():
    params, tensors, offset = [], [], 0
    for name, shape in TENSORS:
        n = math.prod(shape)
        p = torch.tensor([value(0, offset + k) for k in range(n)], dtype=torch.float32)
        params.append(torch.nn.Parameter(p.view(shape)))
        tensors.append({"name": name, "shape": shape, "offset": offset, "decay": len(shape) == 2})
        offset += n
    decay = [p for p, t in zip(params, tensors) if t["decay"]]
    no_decay = [p for p, t in zip(params, tensors) if not t["decay"]]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(BETA1, BETA2), eps=EPS)
    after, steps = [], []
    for step in range(STEPS):
        for p, t in zip(params, tensors):
            g = [value(step + 1, t["offset"] + k) * GRAD_SCALE[step] for k in range(p.numel())]
            p.grad = torch.tensor(g, dtype=torch.float32).view(p.shape)
        norm = float(torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        optimizer.step()
        after.append(torch.cat([p.detach().flatten() for p in params]))
        steps.append({"learning_rate": lr_at(step), "grad_norm": norm})
    golden = {
        "source": "tools/bench/torch_adamw_golden.py, torch %s" % torch.__version__,
        "model": {"vocab_size": V, "seq_len": T, "hidden": C, "heads": 1, "layers": 1},
        "training": {"steps": STEPS, "learning_rate": LR, "warmup_steps": WARMUP,
                     "min_lr_ratio": MIN_LR_RATIO, "weight_decay": WEIGHT_DECAY, "beta1": BETA1,
                     "beta2": BETA2, "eps": EPS, "grad_clip": GRAD_CLIP},
        "grad_scale": GRAD_SCALE,
        "num_params": offset,
        "tensors": tensors,
        "steps": steps,
    }
    with open(os.path.join(OUT, "torch_adamw_golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "torch_adamw_golden.f32"), "wb") as f:
        f.write(torch.stack(after).numpy().astype("<f4").tobytes())
    print("wrote torch_adamw_golden.json and .f32: %d parameters, %d steps, norms %s" %
          (offset, STEPS, ", ".join("%.3f" % s["grad_norm"] for s in steps)))


if __name__ == "__main__":
    sys.exit(main())
