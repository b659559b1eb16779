#!/usr/bin/env python3
"""tools/bench/llama_cpu_speed.py — Hugging Face transformers' side of tools/bench/llama_cpu_speed.sh:
one-thread CPU training steps (forward, backward, torch.optim.AdamW) of LlamaForCausalLM in eager
mode, fp32, on random tokens. Prints one JSON line: the median step time in seconds.

  V/bin/python tools/bench/llama_cpu_speed.py LAYERS HIDDEN HEADS KV_HEADS FFN VOCAB B T STEPS
"""
import json
import statistics
import sys
import time

import torch
import transformers


def main():
    layers, hidden, heads, kv_heads, ffn, vocab, B, T, steps = map(int, sys.argv[1:10])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=T,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, vocab, (B, T))
    y = torch.randint(0, vocab, (B, T))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "params": sum(p.numel() for p in model.parameters()),
                      "step_s": statistics.median(times[1:] if steps > 1 else times)}))


if __name__ == "__main__":
    sys.exit(main())
