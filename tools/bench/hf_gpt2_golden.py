#!/usr/bin/env python3
"""tools/bench/hf_gpt2_golden.py — the Hugging Face GPT-2 golden that
tests/tools/hf_checkpoint_test.sh holds `mpengine run --init-from HF_DIR` and
`mpengine export --format hf` to.

Writes, with transformers' own GPT2LMHeadModel (4.46.3) and save_pretrained (safetensors):
  tests/engine/testdata/hf_gpt2_tiny/            config.json + model.safetensors: a GPT-2 of
      examples/models/tiny-gpt.json's shape (vocab 128, 64 channels, 4 heads, 4 layers, 64
      positions), randomly initialised and then every parameter perturbed (layernorm weights
      1 + N(0, 0.1), biases N(0, 0.1)), so a misplaced bias, norm or transposition changes the
      loss
  tests/engine/testdata/hf_gpt2_tiny_tokens.bin  an llm.c token shard (256 x int32 header: magic
      20240520, version 1, count; then uint16 tokens) of exactly G T + 1 = 65 tokens, so the
      shard holds exactly G = 4 samples of T = 16: the global batch of step 1 is all of them
      (in an order the data loader shuffles, which the mean loss does not depend on)
  tests/engine/testdata/hf_gpt2_tiny_loss.txt    HF's mean cross-entropy over those (4, 16)
      inputs and targets, computed in float64 (the model .double()), %.9g
  tests/engine/testdata/hf_gpt2_tiny_loss_bf16.txt  the same with every weight first rounded to
      bfloat16 (torch's round to nearest even), for the test's BF16 copy of the golden
  tests/engine/testdata/hf_gpt2_tiny_loss_f16.txt   likewise rounded to float16 (F16 copy)
  tests/engine/testdata/hf_gpt2_tiny_200KB/      what save_pretrained(max_shard_size="200KB")
      writes of the golden, but only its model.safetensors.index.json and SHA256SUMS of the
      shard files (the shards themselves would double the test data)
  tests/engine/testdata/hf_gpt2_tiny_grads.json  transformers' gradients of the golden checkpoint
      (GPT2LMHeadModel in fp32, loss.backward() of the mean cross-entropy over the same (4, 16)
      batch), for tests/engine/hf_gpt2_reference_test.cc: the fp32 loss and, per parameter, in
      mpengine's orientation (Conv1D weights transposed to (out, in)), the gradient's L2 norm, its
      first values and values spread through it (element (k n) / SPREAD for k < SPREAD)

  /tmp/hfv2/bin/python tools/bench/hf_gpt2_golden.py            (writes the files above)
  /tmp/hfv2/bin/python tools/bench/hf_gpt2_golden.py --grads   (only the gradients, of the
      committed checkpoint: the other files stay as they are)
  /tmp/hfv2/bin/python tools/bench/hf_gpt2_golden.py --check DIR (loads DIR with
      from_pretrained, e.g. an `mpengine export --format hf`, and prints its loss and the largest
      logit difference against the golden; not part of CI)
"""
import hashlib
import json
import os
import shutil
import tempfile
import struct
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "engine", "testdata")
GOLDEN = os.path.join(DATA, "hf_gpt2_tiny")
TOKENS = os.path.join(DATA, "hf_gpt2_tiny_tokens.bin")
LOSS = os.path.join(DATA, "hf_gpt2_tiny_loss.txt")
LOSS_BF16 = os.path.join(DATA, "hf_gpt2_tiny_loss_bf16.txt")
LOSS_F16 = os.path.join(DATA, "hf_gpt2_tiny_loss_f16.txt")
GRADS = os.path.join(DATA, "hf_gpt2_tiny_grads.json")
FIRST, SPREAD = 8, 16  # gradient values kept per tensor
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
V, C, NH, L, P = 128, 64, 4, 4, 64
G, T = 4, 16


def batch():
    """(inputs, targets), each (G, T): sample k is tokens [k T, k T + T]."""
    with open(TOKENS, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        assert header[0] == 20240520 and header[1] == 1 and header[2] == G * T + 1
        tokens = list(struct.unpack("<%dH" % header[2], f.read(2 * header[2])))
    x = torch.tensor([tokens[k * T:k * T + T] for k in range(G)])
    y = torch.tensor([tokens[k * T + 1:k * T + T + 1] for k in range(G)])
    return x, y


def loss_of(model, x, y):
    logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return loss, logits


def write():
    torch.manual_seed(1234)
    config = GPT2Config(vocab_size=V, n_positions=P, n_ctx=P, n_embd=C, n_layer=L, n_head=NH,
                        n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        tie_word_embeddings=True)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(GOLDEN, safe_serialization=True)
    if os.path.exists(os.path.join(GOLDEN, "generation_config.json")):
        os.remove(os.path.join(GOLDEN, "generation_config.json"))  # not needed; keep it small
    sharded = os.path.join(DATA, "hf_gpt2_tiny_200KB")
    os.makedirs(sharded, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size="200KB")
        shutil.copy(os.path.join(tmp, "model.safetensors.index.json"), sharded)
        with open(os.path.join(sharded, "SHA256SUMS"), "w") as f:
            for name in sorted(os.listdir(tmp)):
                if name.endswith(".safetensors"):
                    with open(os.path.join(tmp, name), "rb") as shard:
                        f.write("%s  %s\n" % (hashlib.sha256(shard.read()).hexdigest(), name))
    tokens = torch.randint(0, V, (G * T + 1,), generator=torch.Generator().manual_seed(7))
    with open(TOKENS, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, G * T + 1, *([0] * 253)))
        f.write(struct.pack("<%dH" % (G * T + 1), *tokens.tolist()))
    x, y = batch()
    with torch.no_grad():
        loss32, _ = loss_of(model, x, y)
        loss64, _ = loss_of(model.double(), x, y)
        loss_bf16, _ = loss_of(model.to(torch.bfloat16).double(), x, y)
        model = GPT2LMHeadModel.from_pretrained(GOLDEN).eval()
        loss_f16, _ = loss_of(model.half().double(), x, y)
    with open(LOSS, "w") as f:
        f.write("%.9g\n" % loss64.item())
    with open(LOSS_BF16, "w") as f:
        f.write("%.9g\n" % loss_bf16.item())
    with open(LOSS_F16, "w") as f:
        f.write("%.9g\n" % loss_f16.item())
    print("wrote %s; loss fp64 %.9g, fp32 %.9g, bf16 weights %.9g, f16 weights %.9g"
          % (GOLDEN, loss64.item(), loss32.item(), loss_bf16.item(), loss_f16.item()))
    write_grads()


def write_grads():
    """transformers' fp32 gradients of the committed golden on batch() (GRADS)."""
    model = GPT2LMHeadModel.from_pretrained(GOLDEN).float().eval()
    model.config._attn_implementation = "eager"
    x, y = batch()
    model.zero_grad()
    loss, _ = loss_of(model, x, y)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():  # the tied lm_head is wte: one entry
        g = p.grad.detach()
        if name.endswith(CONV1D):
            g = g.t()  # Conv1D keeps (in, out); mpengine (out, in)
        flat = g.contiguous().flatten().double()
        n = flat.numel()
        grads[name] = {"shape": list(g.shape), "norm": float(flat.norm()),
                       "first": [float(v) for v in flat[:FIRST]],
                       "spread": [float(flat[(k * n) // SPREAD]) for k in range(SPREAD)]}
    golden = {"source": "tools/bench/hf_gpt2_golden.py, transformers %s, torch %s" %
                        (transformers.__version__, torch.__version__),
              "B": G, "T": T, "loss": float(loss), "spread": SPREAD, "grads": None}
    with open(GRADS, "w") as f:  # one line per tensor
        text = json.dumps(golden, indent=1).split('\n "grads"')[0]
        f.write(text + '\n "grads": {\n')
        f.write(",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in grads.items()))
        f.write("\n }\n}\n")
    print("wrote %s: fp32 loss %.9g, %d gradients" % (GRADS, float(loss), len(grads)))


def check(path):
    x, y = batch()
    golden = GPT2LMHeadModel.from_pretrained(GOLDEN).eval().double()
    other = GPT2LMHeadModel.from_pretrained(path).eval().double()
    with torch.no_grad():
        l0, z0 = loss_of(golden, x, y)
        l1, z1 = loss_of(other, x, y)
    print(json.dumps({"golden_loss": l0.item(), "loss": l1.item(),
                      "max_abs_logit_diff": (z0 - z1).abs().max().item()}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "--grads":
        write_grads()
    else:
        write()
