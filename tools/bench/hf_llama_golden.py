#!/usr/bin/env python3
"""tools/bench/hf_llama_golden.py — Hugging Face transformers' own numbers for tiny Llama-family
checkpoints, the reference tests/engine/hf_llama_reference_test.cc holds mpengine to.

For each model below it builds the transformers model (LlamaForCausalLM, Qwen2ForCausalLM) from
a seeded random init, saves it with save_pretrained (config.json + model.safetensors, fp32) under
tests/engine/testdata/<name>/, and writes golden.json there: a fixed batch of token ids
and next-token targets, the mean cross-entropy of the logits against those targets, and, for each
parameter, the gradient of that loss (its L2 norm and its first values in mpengine's orientation).
Weights are scaled up from the 0.02 init so every path carries a visible gradient. Beside it,
shard.bin: an llm.c token shard (256 x int32 header: magic 20240520, version 1, count; uint16
tokens) of exactly G T + 1 = 65 tokens, so a run with global batch G = 4 of T = 16 takes all of
it at step 1, and golden.json's "shard_loss": transformers' mean cross-entropy over those four
samples (sample k is tokens [k T, k T + T]), in float64, for tests/tools/hf_llama_checkpoint_test.sh.

  V/bin/python tools/bench/hf_llama_golden.py --check NAME DIR
loads DIR (an `mpengine export --format hf`) with from_pretrained and prints transformers' float64
loss over NAME's shard.bin (tools/bench/hf_llama_roundtrip.sh compares it with mpengine's).

Needs torch and transformers 4.46.3 (docs/benchmarks.md, "References and their versions"); CI only reads the committed files:
  /usr/bin/python3 -m venv --system-site-packages V && V/bin/pip install transformers==4.46.3 safetensors
  V/bin/python tools/bench/hf_llama_golden.py
"""
import copy
import json
import os
import struct
import sys

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "engine", "testdata")

MODELS = {
    # Llama 3's block at toy size: grouped-query attention (2 query heads per kv head), Llama
    # 3.1's rope scaling, no biases, an untied head, a vocabulary that needs padding (100 -> 128).
    "hf_tiny_llama3": ("LlamaForCausalLM", dict(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    # Qwen2's: q-k-v biases, multi-query attention (one kv head), a tied head.
    "hf_tiny_qwen2": ("Qwen2ForCausalLM", dict(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=True,
        use_sliding_window=False)),
}

B, T = 2, 16
FIRST = 8  # gradient values kept per tensor
G = 4  # samples of T in shard.bin


def shard_batch(path):
    """(inputs, targets), each (G, T), of an llm.c shard of G T + 1 tokens."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        tokens = list(struct.unpack("<%dH" % header[2], f.read(2 * header[2])))
    x = torch.tensor([tokens[k * T:k * T + T] for k in range(G)])
    y = torch.tensor([tokens[k * T + 1:k * T + T + 1] for k in range(G)])
    return x, y


def loss64(model, x, y):
    with torch.no_grad():
        logits = model.double()(input_ids=x).logits
        return float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))


def tokens(seed, n, below):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, below, (n,), generator=g)


def check(name, path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    loss = loss64(model, *shard_batch(os.path.join(ROOT, name, "shard.bin")))
    print(json.dumps({"checkpoint": path, "architecture": type(model).__name__,
                      "shard_loss": loss}))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        return check(sys.argv[2], sys.argv[3])
    torch.manual_seed(1234)
    for name, (arch, kwargs) in MODELS.items():
        config_class = transformers.AutoConfig.for_model(
            "llama" if arch.startswith("Llama") else "qwen2", **kwargs)
        config_class.architectures = [arch]
        config_class.torch_dtype = "float32"
        model = getattr(transformers, arch)(config_class).float()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            for p_name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in p_name:
                    p.add_(0.2 * torch.randn_like(p))  # off their init of 1
                elif p.dim() == 1:
                    p.copy_(0.1 * torch.randn_like(p))  # biases off 0
                else:
                    p.mul_(3.0)
        out_dir = os.path.join(ROOT, name)
        os.makedirs(out_dir, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        generation = os.path.join(out_dir, "generation_config.json")
        if os.path.exists(generation):
            os.remove(generation)  # not a part of the weights
        inputs = tokens(7, B * T, kwargs["vocab_size"]).view(B, T)
        targets = tokens(8, B * T, kwargs["vocab_size"]).view(B, T)
        model.zero_grad()
        logits = model(input_ids=inputs).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                 targets.view(-1))
        loss.backward()
        shard = os.path.join(out_dir, "shard.bin")
        shard_tokens = tokens(9, G * T + 1, kwargs["vocab_size"])
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, G * T + 1, *([0] * 253)))
            f.write(struct.pack("<%dH" % (G * T + 1), *shard_tokens.tolist()))
        shard_loss = loss64(copy.deepcopy(model).eval(), *shard_batch(shard))
        grads = {}
        for p_name, p in model.named_parameters():
            g = p.grad.detach().double()
            grads[p_name] = {"norm": float(g.norm()), "first": [float(x) for x in g.flatten()[:FIRST]]}
        golden = {
            "source": "tools/bench/hf_llama_golden.py, transformers %s, torch %s" %
                      (transformers.__version__, torch.__version__),
            "architecture": arch,
            "B": B, "T": T,
            "inputs": inputs.flatten().tolist(),
            "targets": targets.flatten().tolist(),
            "loss": float(loss),
            "shard_loss": shard_loss,
            "grads": grads,
        }
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        print("%s (%s): loss %.6f, %d tensors, written to %s" %
              (name, arch, float(loss), len(grads), out_dir))


if __name__ == "__main__":
    sys.exit(main())
