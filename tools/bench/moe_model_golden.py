#!/usr/bin/env python3
"""tools/bench/moe_model_golden.py — Hugging Face transformers' own numbers for tiny
mixture-of-experts checkpoints, the reference tests/engine/hf_moe_reference_test.cc holds
mpengine's runtime to (`run --init-from`'s loader, the stage chain's MoE blocks and the
per-micro-batch auxiliary loss).

For each model below it builds the transformers model (MixtralForCausalLM, Qwen2MoeForCausalLM)
from a seeded random init with output_router_logits=True and router_aux_loss_coef set, saves it
with save_pretrained (config.json + model.safetensors, fp32) under tests/engine/testdata/<name>/,
and writes golden.json there: a fixed batch of token ids and next-token targets (one
micro-batch), the loss transformers trains on, mean cross-entropy + router_aux_loss_coef x
load_balancing_loss_func over every layer's router logits (the model's own aux_loss output), and
for each parameter the gradient of that loss (its L2 norm and its first values; nn.Linear is
(out, in) as mpengine's tensors are). Weights are scaled up from the 0.02 init so every path
carries a visible gradient, and the routers more, so routing is far from uniform.

Beside it, shard.bin: an llm.c token shard (256 x int32 header: magic 20240520, version 1, count;
uint16 tokens) of exactly G T + 1 = 65 tokens, so a run with global batch G = 4 of T = 16 in ONE
micro-batch takes all of it at step 1, and golden.json's "shard_loss": transformers' loss with
the aux loss over those four samples as one batch (sample k is tokens [k T, k T + T]), in
float64, for tests/tools/moe_hf_checkpoint_test.sh.

Needs torch and transformers 4.46.3 (docs/benchmarks.md); CI only reads the committed files:
  /work/venv-golden/bin/python tools/bench/moe_model_golden.py
"""
import copy
import json
import os
import struct
import sys

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "engine",
                    "testdata")

MODELS = {
    # Mixtral's block at toy size: 4 experts, top 2 renormalised, grouped-query attention.
    "hf_tiny_mixtral": ("MixtralForCausalLM", "mixtral", dict(
        vocab_size=100, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
        num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
        router_aux_loss_coef=0.05, sliding_window=None)),
    # Qwen2-MoE's: 8 experts, top 2 not renormalised, a shared expert with its sigmoid gate,
    # q-k-v biases, 3 layers.
    "hf_tiny_qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe", dict(
        vocab_size=100, hidden_size=64, intermediate_size=48, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], output_router_logits=True, router_aux_loss_coef=0.05,
        use_sliding_window=False)),
}

B, T = 2, 16
FIRST = 8  # gradient values kept per tensor
G = 4  # samples of T in shard.bin


def shard_loss64(model, path):
    """transformers' loss (cross-entropy + router_aux_loss_coef x aux) of shard.bin's G samples
    as one batch, in float64."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        toks = list(struct.unpack("<%dH" % header[2], f.read(2 * header[2])))
    x = torch.tensor([toks[k * T:k * T + T] for k in range(G)])
    y = torch.tensor([toks[k * T + 1:k * T + T + 1] for k in range(G)])
    model = model.double().eval()
    with torch.no_grad():
        out = model(input_ids=x, output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]),
                                               y.reshape(-1))
        return float(ce + model.config.router_aux_loss_coef * out.aux_loss)


def tokens(seed, n, below):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, below, (n,), generator=g)


def main():
    torch.manual_seed(4321)
    for name, (arch, model_type, kwargs) in MODELS.items():
        config = transformers.AutoConfig.for_model(model_type, **kwargs)
        config.architectures = [arch]
        config.torch_dtype = "float32"
        model = getattr(transformers, arch)(config).float()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            for p_name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in p_name:
                    p.add_(0.2 * torch.randn_like(p))  # off their init of 1
                elif p.dim() == 1:
                    p.copy_(0.1 * torch.randn_like(p))  # biases off 0
                elif p_name.endswith(".gate.weight"):
                    p.mul_(20.0)  # routers: confident, uneven routing
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
        out = model(input_ids=inputs, output_router_logits=True)
        logits = out.logits.float()
        ce = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                               targets.view(-1))
        loss = ce + config.router_aux_loss_coef * out.aux_loss
        loss.backward()
        routed = [0] * (kwargs.get("num_local_experts") or kwargs.get("num_experts"))
        for layer_logits in out.router_logits:
            top = torch.topk(torch.softmax(layer_logits.float(), -1), kwargs["num_experts_per_tok"], -1).indices
            for e in top.flatten().tolist():
                routed[e] += 1
        shard = os.path.join(out_dir, "shard.bin")
        shard_tokens = tokens(9, G * T + 1, kwargs["vocab_size"])
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, G * T + 1, *([0] * 253)))
            f.write(struct.pack("<%dH" % (G * T + 1), *shard_tokens.tolist()))
        shard_loss = shard_loss64(copy.deepcopy(model), shard)
        grads = {}
        for p_name, p in model.named_parameters():
            g = p.grad.detach().double()
            grads[p_name] = {"norm": float(g.norm()),
                             "first": [float(x) for x in g.flatten()[:FIRST]]}
        golden = {
            "source": "tools/bench/moe_model_golden.py, transformers %s, torch %s" %
                      (transformers.__version__, torch.__version__),
            "architecture": arch,
            "B": B, "T": T,
            "inputs": inputs.flatten().tolist(),
            "targets": targets.flatten().tolist(),
            "cross_entropy": float(ce),
            "aux_loss": float(out.aux_loss),
            "router_aux_loss_coef": config.router_aux_loss_coef,
            "loss": float(loss),
            "shard_loss": shard_loss,
            "routed_per_expert": routed,
            "grads": grads,
        }
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        print("%s (%s): loss %.6f (aux %.6f), routed %s, %d tensors, written to %s" %
              (name, arch, float(loss), float(out.aux_loss), routed, len(grads), out_dir))


if __name__ == "__main__":
    sys.exit(main())
