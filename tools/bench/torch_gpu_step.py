#!/usr/bin/env python3
"""tools/bench/torch_gpu_step.py — PyTorch eager's training step for a GPT-2 or Llama-family model
on one GPU.

The peer figure for `mpengine run --backend cuda`: the same model (from an mpengine model
description: GPT-2, or RMSNorm, SwiGLU, rotary embeddings with Llama 3.1's scaling, grouped-query
attention, biases none / q-k-v / all, a tied or untied head), batch and sequence length, bf16
autocast with fp32 master weights (PyTorch's usual mixed precision),
F.scaled_dot_product_attention, AdamW (fused when available), gradient clipping at 1.0. Prints
tokens/s and ms per step as the median over the timed steps, so tools/device_check.sh can print
the ratio. --device cpu runs it on the CPU (fp32, for checking the script without a GPU).

usage: torch_gpu_step.py MODEL.json --batch B --seq-len T [--steps N] [--warmup W] [--device D]
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
    parser.add_argument("--device", default="cuda")
    return parser.parse_args()


def gpt2_shape(description):
    """(vocab, max_positions, layers, heads, channels) of an mpengine GPT-2 description."""
    layers = description["layers"]
    blocks = [node for node in layers if node["type"] == "transformer"]
    embedding = next(node for node in layers if node["type"] == "embedding")
    repeat = sum(node.get("repeat", 1) for node in blocks)
    return (description["vocab_size"], embedding.get("max_positions", description["seq_len"]),
            repeat, blocks[0]["heads"], blocks[0]["hidden"])


def llama_model(description, torch, nn, F, attention):
    """The Llama-family model of an mpengine description (its loss as forward)."""
    layers = description["layers"]
    block = next(node for node in layers if node["type"] == "transformer")
    head = next(node for node in layers if node["type"] == "lm_head")
    num_layers = sum(node.get("repeat", 1) for node in layers if node["type"] == "transformer")
    vocab = description["vocab_size"]
    padded_vocab = (vocab + 63) // 64 * 64
    C, NH = block["hidden"], block["heads"]
    KVH, F_ = block.get("kv_heads", NH), block["ffn_hidden"]
    HS = C // NH
    eps = block.get("norm_eps", 1e-5)
    bias = block.get("bias", True)
    qkv_bias, all_bias = bias in (True, "qkv"), bias is True
    tied = head.get("tie_embedding", True)
    # Hugging Face's inv_freq (fp32), with Llama 3.1's scaling.
    inv_freq = 1.0 / (block["rope_theta"] ** (torch.arange(0, HS, 2).float() / HS))
    scaling = block.get("rope_scaling")
    if scaling:
        old = scaling["original_max_position_embeddings"]
        low, high = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old / wavelen - scaling["low_freq_factor"]) / (
            scaling["high_freq_factor"] - scaling["low_freq_factor"])
        scaled = (1 - smooth) * inv_freq / scaling["factor"] + smooth * inv_freq
        inv_freq = torch.where(wavelen > low, inv_freq / scaling["factor"],
                               torch.where(wavelen < high, inv_freq, scaled))

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * x32.to(x.dtype)

    def rotate(x, cos, sin):  # rotate-half
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(C, NH * HS, bias=qkv_bias)
            self.k = nn.Linear(C, KVH * HS, bias=qkv_bias)
            self.v = nn.Linear(C, KVH * HS, bias=qkv_bias)
            self.o = nn.Linear(C, C, bias=all_bias)
            self.gate = nn.Linear(C, F_, bias=all_bias)
            self.up = nn.Linear(C, F_, bias=all_bias)
            self.down = nn.Linear(F_, C, bias=all_bias)

        def forward(self, x, cos, sin):
            batch, seq, _ = x.shape
            h = self.ln1(x)
            q = self.q(h).view(batch, seq, NH, HS).transpose(1, 2)
            k = self.k(h).view(batch, seq, KVH, HS).transpose(1, 2)
            v = self.v(h).view(batch, seq, KVH, HS).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k = k.repeat_interleave(NH // KVH, dim=1)
            v = v.repeat_interleave(NH // KVH, dim=1)
            y = attention(q, k, v)
            x = x + self.o(y.transpose(1, 2).reshape(batch, seq, C))
            h = self.ln2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(padded_vocab, C)
            self.blocks = nn.ModuleList(Block() for _ in range(num_layers))
            self.norm = RMSNorm()
            self.head = None if tied else nn.Linear(C, padded_vocab, bias=False)
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, tokens, targets):
            angles = torch.arange(tokens.shape[1], device=tokens.device).float()[:, None] * \
                self.inv_freq[None, :]
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            x = self.wte(tokens)
            for block in self.blocks:
                x = block(x, cos, sin)
            weight = self.wte.weight if self.head is None else self.head.weight
            logits = (self.norm(x) @ weight.t())[..., :vocab].float()
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return Llama(), vocab


def main():
    args = parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def attention(q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # torch < 2.0: the causal softmax by hand
        seq = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    with open(args.model) as file:
        description = json.load(file)
    block_node = next(node for node in description["layers"] if node["type"] == "transformer")
    llama = block_node.get("norm") == "rmsnorm" or block_node.get("activation") == "swiglu"
    if not llama:
        vocab, max_positions, num_layers, num_heads, channels = gpt2_shape(description)
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
            y = attention(q, k, v)
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

    device = args.device
    if llama:
        model, vocab = llama_model(description, torch, nn, F, attention)
        model = model.to(device)
    else:
        model = GPT().to(device)
    # GPT-2's (and mpengine's) init: N(0, 0.02) matrices and embeddings, zero biases, unit norms.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                parameter.zero_()
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
        if device == "cuda":
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = model(inputs, targets)
        else:
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    synchronize()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    tokens_per_step = args.batch * args.seq_len
    precision = "bf16 autocast" if device == "cuda" else "fp32 on " + device
    print(f"pytorch {torch.__version__} eager, {precision}: {median * 1e3:.1f} ms/step, "
          f"{tokens_per_step / median:.0f} tok/s (median of {args.steps}; loss {loss.item():.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
