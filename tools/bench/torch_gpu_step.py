#!/usr/bin/env python3
"""tools/bench/torch_gpu_step.py — PyTorch eager's training step for a GPT-2 model on one GPU.

The peer figure for `mpengine run --backend cuda`: the same model (from an mpengine model
description), batch and sequence length, bf16 autocast with fp32 master weights (PyTorch's usual
mixed precision), AdamW (fused when available), gradient clipping at 1.0. Prints tokens/s and ms
per step as the median over the timed steps, so tools/device_check.sh can print the ratio.

usage: torch_gpu_step.py MODEL.json --batch B --seq-len T [--steps N] [--warmup W]
"""
import argparse
import json
import math
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def gpt2_shape(description):
    """(vocab, max_positions, layers, heads, channels) of an mpengine GPT-2 description."""
    layers = description["layers"]
    blocks = [node for node in layers if node["type"] == "transformer"]
    embedding = next(node for node in layers if node["type"] == "embedding")
    repeat = sum(node.get("repeat", 1) for node in blocks)
    return (description["vocab_size"], embedding.get("max_positions", description["seq_len"]),
            repeat, blocks[0]["heads"], blocks[0]["hidden"])


def main():
    args = parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    with open(args.model) as file:
        vocab, max_positions, num_layers, num_heads, channels = gpt2_shape(json.load(file))
    padded_vocab = (vocab + 63) // 64 * 64

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(channels)
            self.qkv = nn.Linear(channels, 3 * channels)
            self.proj = nn.Linear(channels, channels)
            self.ln2 = nn.LayerNorm(channels)
            self.fc = nn.Linear(channels, 4 * channels)
            self.fc_proj = nn.Linear(4 * channels, channels)

        def forward(self, x):
            batch, seq, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(channels, dim=2)
            shape = (batch, seq, num_heads, channels // num_heads)
            q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, channels))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(padded_vocab, channels)
            self.wpe = nn.Embedding(max_positions, channels)
            self.blocks = nn.ModuleList(Block() for _ in range(num_layers))
            self.ln_f = nn.LayerNorm(channels)

        def forward(self, tokens, targets):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            logits = logits[..., :vocab].float()
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    device = "cuda"
    model = GPT().to(device)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                      weight_decay=0.0, fused=True)
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                      weight_decay=0.0)
    tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    tokens_per_step = args.batch * args.seq_len
    print(f"pytorch {torch.__version__} eager, bf16 autocast: {median * 1e3:.1f} ms/step, "
          f"{tokens_per_step / median:.0f} tok/s (median of {args.steps}; loss {loss.item():.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
