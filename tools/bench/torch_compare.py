#!/usr/bin/python3
"""tools/bench/torch_compare.py — checks mpengine's GPT-2 against an independent PyTorch one, then
times one training step of each.

Why: our forward and backward are hand-written C (layers/), checked so far only against
themselves. A second implementation written from the same definition of GPT-2 (token + position
embedding, pre-norm blocks with causal self-attention and a tanh-GELU MLP, final layernorm, LM
head tied to the token embedding; layernorm eps 1e-5) but with PyTorch's autograd computing the
gradients catches a wrong derivative that a self-consistent test cannot. The model below is ours,
written for this check from that definition, not copied from anywhere.

What it does:
  1. runs `mpengine bench step MODEL --dump DIR --steps 0`, which writes into DIR
       model.bin   the weights, llm.c's GPT-2 checkpoint (256 x int32 header: magic 20240326,
                   version 3, max_seq_len, vocab, layers, heads, channels, padded vocab; then the
                   16 tensors in llm.c's order, fp32)
       grads.bin   d(mean loss)/d(weights) of one forward + backward, same header and order
       tokens.bin  4 x int32 header (magic 20250517, version 1, B, T), then inputs (B, T) and
                   targets (B, T), int32 little endian
       loss.txt    the mean cross-entropy in nats
  2. loads the weights and tokens into the PyTorch model, in float32 and in float64, computes the
     loss and every gradient with autograd, and compares: the loss's relative difference, and per
     tensor ||g_ours - g_torch|| / ||g_torch||. PASS when every one is <= --tolerance (1e-4)
     against both the float32 and the float64 model. The padded vocabulary rows (llm.c pads 50257
     to 50304) take part in the tied LM head but their logits are sliced off before the loss,
     which is the same as masking them to -inf.
  3. times full training steps of both at the same thread count (default 1): zero grads, forward,
     backward, clip_grad_norm_(1.0), AdamW(lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0),
     median over --steps after --warmup; ours via `mpengine bench step`. Prints both and the ratio
     torch / ours (> 1: we are faster), in wall time and in process CPU time (which does not count
     waiting for a core, so it is steadier on a shared machine). With --rounds R the two alternate
     R times and the fastest median of each counts, which damps that noise further. Both start
     from the same weights and batch, so the loss after the last step is compared too: a check of
     clipping and AdamW.

Both sides use the same OpenBLAS (Debian's python3-torch links libopenblas), whose kernels are
chosen when it loads, from OPENBLAS_CORETYPE or the CPU model. mpengine replaces OpenBLAS's slow
SSE3 ("Prescott") fallback on CPUs that OpenBLAS 0.3.21 does not know (tools/blas_kernels.h), so
by default torch is given the kernels mpengine ends up with; --openblas-coretype sets them for
both (--openblas-coretype Prescott measures the fallback). The report names the kernels of each.

Needs Debian's PyTorch: run with /usr/bin/python3 (`apt-get install python3-torch`). CI does not
run this; it is a benchmark a person runs and reads.

    tools/bench/torch_compare.py --model examples/models/tiny-gpt.json --seq-len 32
    tools/bench/torch_compare.py                      # gpt2-124m, batch 4, sequence 64
    tools/bench/torch_compare.py --openblas-coretype SkylakeX --rounds 2

Exit code: 0 when the gradients agree, 1 when they do not (or mpengine failed), 2 bad usage or
PyTorch missing.
"""

import argparse
import importlib.util
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LLMC_MAGIC = 20240326
LLMC_VERSION_FP32 = 3
LLMC_HEADER_INTS = 256
TOKENS_MAGIC = 20250517
TOKENS_VERSION = 1

LEARNING_RATE = 1e-4
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0
LAYERNORM_EPS = 1e-5

# llm.c's per-layer tensors in file order: (llm.c name, our name's suffix, shape from (C, F)).
BLOCK_TENSORS = [
    ("ln1w", "ln1.weight", lambda C, F: (C,)),
    ("ln1b", "ln1.bias", lambda C, F: (C,)),
    ("qkvw", "qkv.weight", lambda C, F: (3 * C, C)),
    ("qkvb", "qkv.bias", lambda C, F: (3 * C,)),
    ("attprojw", "attn_proj.weight", lambda C, F: (C, C)),
    ("attprojb", "attn_proj.bias", lambda C, F: (C,)),
    ("ln2w", "ln2.weight", lambda C, F: (C,)),
    ("ln2b", "ln2.bias", lambda C, F: (C,)),
    ("fcw", "fc.weight", lambda C, F: (F, C)),
    ("fcb", "fc.bias", lambda C, F: (F,)),
    ("fcprojw", "fc_proj.weight", lambda C, F: (C, F)),
    ("fcprojb", "fc_proj.bias", lambda C, F: (C,)),
]


class CompareError(Exception):
    """A failure to report in one line and exit 1 on."""


def parse_args():
    parser = argparse.ArgumentParser(
        description="Compare mpengine's GPT-2 loss and gradients with PyTorch's, then time a "
        "training step of each.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mpengine", default="bazel-bin/tools/mpengine",
                        help="the mpengine binary")
    parser.add_argument("--model", default="examples/models/gpt2-124m.json",
                        help="model description (one the runtime can train)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per batch (B)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (T)")
    parser.add_argument("--seed", type=int, default=1337, help="seed of weights and tokens")
    parser.add_argument("--init-from", default=None,
                        help="llm.c GPT-2 checkpoint to start from instead of the seed")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate the two timings this many times; the fastest counts")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS / intra-op threads of both sides")
    parser.add_argument("--openblas-coretype", default=None,
                        help="set OPENBLAS_CORETYPE for both sides (e.g. SkylakeX); default: "
                        "leave the environment's")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest relative error that passes")
    parser.add_argument("--dir", default=None,
                        help="where mpengine dumps its files (default: a temporary directory, "
                        "removed afterwards)")
    parser.add_argument("--all-tensors", action="store_true",
                        help="print every tensor of every layer, not one row per llm.c tensor")
    parser.add_argument("--no-timing", action="store_true", help="only compare the numbers")
    args = parser.parse_args()
    for name in ("batch", "seq_len", "steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if not os.access(args.mpengine, os.X_OK):
        parser.error(f"--mpengine {args.mpengine}: not an executable; build it with "
                     "`bazel build //tools:mpengine` or give its path")
    if not os.path.isfile(args.model):
        parser.error(f"--model {args.model}: no such file")
    return args


def import_torch():
    """Returns (torch, numpy), or exits 2 saying how to get them."""
    try:
        import numpy
        import torch
    except ImportError as error:
        print(f"torch_compare.py: cannot import PyTorch ({error}). Install Debian's "
              "(`apt-get install python3-torch`) and run this script with /usr/bin/python3, "
              f"not {sys.executable}.", file=sys.stderr)
        sys.exit(2)
    return torch, numpy


# ------------------------------------------------------------------------------------------------
# Files written by `mpengine bench step --dump`.

def read_llmc(path, numpy):
    """Reads an llm.c fp32 checkpoint: returns (config, {our tensor name: float32 array}) with the
    tensors in llm.c's file order."""
    data = numpy.fromfile(path, dtype="<i4", count=LLMC_HEADER_INTS)
    if data.size != LLMC_HEADER_INTS or data[0] != LLMC_MAGIC:
        raise CompareError(f"{path}: not an llm.c GPT-2 checkpoint (magic "
                           f"{data[0] if data.size else None}, expected {LLMC_MAGIC})")
    if data[1] != LLMC_VERSION_FP32:
        raise CompareError(f"{path}: version {data[1]}, expected {LLMC_VERSION_FP32} (fp32)")
    max_t, vocab, layers, heads, channels, padded_vocab = (int(x) for x in data[2:8])
    config = {"max_seq_len": max_t, "vocab": vocab, "layers": layers, "heads": heads,
              "channels": channels, "padded_vocab": padded_vocab, "ffn": 4 * channels}
    C, F, L = channels, 4 * channels, layers
    layout = [("embedding.wte", (padded_vocab, C)), ("embedding.wpe", (max_t, C))]
    for _, suffix, shape in BLOCK_TENSORS:
        layout.extend((f"block.{l}.{suffix}", shape(C, F)) for l in range(L))
    layout += [("final_norm.weight", (C,)), ("final_norm.bias", (C,))]
    total = sum(math.prod(shape) for _, shape in layout)
    values = numpy.fromfile(path, dtype="<f4", offset=4 * LLMC_HEADER_INTS)
    if values.size != total:
        raise CompareError(f"{path}: holds {values.size} floats after the header, but the header's "
                           f"model has {total} parameters")
    tensors, offset = {}, 0
    for name, shape in layout:
        count = math.prod(shape)
        tensors[name] = values[offset:offset + count].reshape(shape)
        offset += count
    return config, tensors


def read_tokens(path, numpy):
    """Returns (inputs, targets), int64 arrays of shape (B, T), from tokens.bin."""
    data = numpy.fromfile(path, dtype="<i4")
    if data.size < 4 or data[0] != TOKENS_MAGIC or data[1] != TOKENS_VERSION:
        raise CompareError(f"{path}: not a tokens.bin of `mpengine bench step --dump` (magic "
                           f"{TOKENS_MAGIC}, version {TOKENS_VERSION})")
    B, T = int(data[2]), int(data[3])
    if data.size != 4 + 2 * B * T:
        raise CompareError(f"{path}: {data.size - 4} tokens after the header, expected "
                           f"2 x {B} x {T}")
    inputs = data[4:4 + B * T].reshape(B, T).astype(numpy.int64)
    targets = data[4 + B * T:].reshape(B, T).astype(numpy.int64)
    return inputs, targets


# ------------------------------------------------------------------------------------------------
# The PyTorch GPT-2.

def build_model(torch, config, weights, dtype):
    """A GPT-2 whose parameters are copies of weights ({our name: array}) in dtype."""
    F = torch.nn.functional

    class GPT2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = list(weights)
            self.tensors = torch.nn.ParameterList(
                torch.nn.Parameter(torch.tensor(weights[name], dtype=dtype))
                for name in self.names)
            self.p = dict(zip(self.names, self.tensors))

        def attention(self, x, prefix, causal):
            """Causal multi-head self-attention of x (B, T, C), written out."""
            B, T, C = x.shape
            NH = config["heads"]
            HS = C // NH
            qkv = F.linear(x, self.p[prefix + "qkv.weight"], self.p[prefix + "qkv.bias"])
            q, k, v = qkv.split(C, dim=2)                                   # (B, T, C) each
            q, k, v = (a.view(B, T, NH, HS).transpose(1, 2) for a in (q, k, v))  # (B, NH, T, HS)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))        # (B, NH, T, T)
            scores = scores.masked_fill(~causal, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v                             # (B, NH, T, HS)
            y = y.transpose(1, 2).reshape(B, T, C)
            return F.linear(y, self.p[prefix + "attn_proj.weight"],
                            self.p[prefix + "attn_proj.bias"])

        def mlp(self, x, prefix):
            h = F.linear(x, self.p[prefix + "fc.weight"], self.p[prefix + "fc.bias"])  # (B, T, F)
            h = F.gelu(h, approximate="tanh")
            return F.linear(h, self.p[prefix + "fc_proj.weight"], self.p[prefix + "fc_proj.bias"])

        def norm(self, x, prefix):
            C = config["channels"]
            return F.layer_norm(x, (C,), self.p[prefix + "weight"], self.p[prefix + "bias"],
                                eps=LAYERNORM_EPS)

        def forward(self, inputs, targets):
            """Mean cross-entropy (nats) of targets (B, T) given inputs (B, T)."""
            B, T = inputs.shape
            V = config["vocab"]
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            x = self.p["embedding.wte"][inputs] + self.p["embedding.wpe"][:T]  # (B, T, C)
            for layer in range(config["layers"]):
                prefix = f"block.{layer}."
                x = x + self.attention(self.norm(x, prefix + "ln1."), prefix, causal)
                x = x + self.mlp(self.norm(x, prefix + "ln2."), prefix)
            x = self.norm(x, "final_norm.")
            logits = F.linear(x, self.p["embedding.wte"])                    # (B, T, Vp)
            # The padded vocabulary's logits take no part in the loss (llm.c masks them).
            return F.cross_entropy(logits[:, :, :V].reshape(B * T, V), targets.reshape(B * T))

    return GPT2()


# ------------------------------------------------------------------------------------------------
# Comparison.

def relative(numpy, ours, reference):
    """||ours - reference|| / ||reference||, in float64 (the absolute norm if reference is 0)."""
    ours = ours.astype(numpy.float64, copy=False)
    reference = reference.astype(numpy.float64, copy=False)
    diff = float(numpy.linalg.norm(ours - reference))
    norm = float(numpy.linalg.norm(reference))
    return diff / norm if norm > 0 else diff


def squared_norms(numpy, ours, reference):
    ours = ours.astype(numpy.float64, copy=False)
    reference = reference.astype(numpy.float64, copy=False)
    return float(numpy.sum((ours - reference) ** 2)), float(numpy.sum(reference ** 2))


def group_of(name):
    """The llm.c tensor that one of ours belongs to: block.3.qkv.weight -> block.*.qkv.weight."""
    return re.sub(r"^block\.\d+\.", "block.*.", name)


def compare_gradients(torch, numpy, config, weights, our_grads, inputs, targets, our_loss, args):
    """Prints the loss and gradient agreement; returns (passed, worst relative error)."""
    results = {}
    for dtype, label in ((torch.float32, "fp32"), (torch.float64, "fp64")):
        start = time.perf_counter()
        model = build_model(torch, config, weights, dtype)
        loss = model(torch.from_numpy(inputs), torch.from_numpy(targets))
        loss.backward()
        grads = {name: p.grad.numpy().copy() for name, p in zip(model.names, model.tensors)}
        results[label] = (float(loss), grads)
        print(f"  torch {label}: forward + backward in {time.perf_counter() - start:.2f} s")
        del model, loss

    loss32, grads32 = results["fp32"]
    loss64, grads64 = results["fp64"]
    print()
    print(f"loss (mean cross-entropy, nats): ours {our_loss:.9g}, torch fp32 {loss32:.9g}, "
          f"torch fp64 {loss64:.9g}")
    loss_rel32 = abs(our_loss - loss32) / abs(loss32)
    loss_rel64 = abs(our_loss - loss64) / abs(loss64)
    print(f"  relative difference: ours vs fp32 {loss_rel32:.2e}, ours vs fp64 {loss_rel64:.2e}, "
          f"torch fp32 vs fp64 {abs(loss32 - loss64) / abs(loss64):.2e}")

    # Per tensor (every layer), then grouped by llm.c tensor with the worst layer named.
    rows = {}
    for name in weights:
        rows[name] = (relative(numpy, our_grads[name], grads32[name]),
                      relative(numpy, our_grads[name], grads64[name]),
                      relative(numpy, grads32[name], grads64[name]),
                      float(numpy.linalg.norm(grads64[name])))
    print()
    print("gradients: relative error ||g_ours - g_torch|| / ||g_torch|| per tensor")
    header = (f"  {'tensor':<24} {'shape':>16} {'||g|| (fp64)':>13} {'ours/fp32':>10} "
              f"{'ours/fp64':>10} {'fp32/fp64':>10}")
    if args.all_tensors:
        print(header)
        for name, (r32, r64, t32, norm) in rows.items():
            shape = "x".join(str(d) for d in weights[name].shape)
            print(f"  {name:<24} {shape:>16} {norm:>13.4e} {r32:>10.2e} {r64:>10.2e} {t32:>10.2e}")
    else:
        print(header + "  worst layer (ours/fp64)")
        groups = {}
        for name in weights:
            groups.setdefault(group_of(name), []).append(name)
        for group, names in groups.items():
            sums = {}
            for label, reference in (("32", grads32), ("64", grads64)):
                d = n = 0.0
                for name in names:
                    dd, nn = squared_norms(numpy, our_grads[name], reference[name])
                    d += dd
                    n += nn
                sums[label] = math.sqrt(d / n) if n > 0 else math.sqrt(d)
            d = n = 0.0
            for name in names:
                dd, nn = squared_norms(numpy, grads32[name], grads64[name])
                d += dd
                n += nn
            torch_self = math.sqrt(d / n) if n > 0 else math.sqrt(d)
            norm = math.sqrt(sum(rows[name][3] ** 2 for name in names))
            shape = "x".join(str(d) for d in weights[names[0]].shape)
            if len(names) > 1:
                shape = f"{len(names)}x" + shape
            worst = max(names, key=lambda name: rows[name][1])
            worst_text = ""
            if len(names) > 1:
                worst_text = f"  {worst.split('.')[1]}: {rows[worst][1]:.2e}"
            print(f"  {group:<24} {shape:>16} {norm:>13.4e} {sums['32']:>10.2e} "
                  f"{sums['64']:>10.2e} {torch_self:>10.2e}{worst_text}")

    worst32 = max(rows.items(), key=lambda item: item[1][0])
    worst64 = max(rows.items(), key=lambda item: item[1][1])
    worst = max(worst32[1][0], worst64[1][1], loss_rel32, loss_rel64)
    passed = worst <= args.tolerance
    print()
    print(f"max over {len(rows)} tensors: ours vs torch fp32 {worst32[1][0]:.2e} ({worst32[0]}), "
          f"ours vs torch fp64 {worst64[1][1]:.2e} ({worst64[0]})")
    print(f"{'PASS' if passed else 'FAIL'}: loss and every gradient agree to "
          f"{worst:.2e} relative (tolerance {args.tolerance:g})")
    return passed, worst


# ------------------------------------------------------------------------------------------------
# Timing.

def run_mpengine(args, extra):
    command = [args.mpengine, "bench", "step", args.model, "--micro-batch", str(args.batch),
               "--seq-len", str(args.seq_len), "--seed", str(args.seed)] + extra
    if args.init_from:
        command += ["--init-from", args.init_from]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompareError(f"{' '.join(command)} exited {result.returncode}:\n"
                           f"{result.stdout}{result.stderr}")
    return result.stdout


def parse_our_timing(output):
    """{median, mean, forward, backward, optimizer} in ms and first/last loss from bench step."""
    step = re.search(r"step: median ([0-9.]+) ms/step, mean ([0-9.]+) ms", output)
    phases = re.search(r"forward ([0-9.]+), backward ([0-9.]+), optimizer ([0-9.]+)", output)
    losses = re.search(r"loss (\S+) at the first step, (\S+) at the last", output)
    cpu = re.search(r"cpu: median ([0-9.]+) ms/step", output)
    if not (step and phases and losses and cpu):
        raise CompareError(f"cannot read the timing of `mpengine bench step`:\n{output}")
    return {"median": float(step[1]), "mean": float(step[2]), "forward": float(phases[1]),
            "backward": float(phases[2]), "optimizer": float(phases[3]), "cpu": float(cpu[1]),
            "first_loss": float(losses[1]), "last_loss": float(losses[2])}


def time_torch(torch, config, weights, inputs, targets, args):
    """Times training steps of a fresh float32 model; same keys as parse_our_timing."""
    model = build_model(torch, config, weights, torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=BETAS, eps=ADAM_EPS,
                                  weight_decay=WEIGHT_DECAY)
    inputs, targets = torch.from_numpy(inputs), torch.from_numpy(targets)
    totals, forwards, backwards, optimizers, cpus, losses = [], [], [], [], [], []
    for step in range(args.warmup + args.steps):
        cpu_start = time.process_time()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = model(inputs, targets)
        forward_done = time.perf_counter()
        loss.backward()
        backward_done = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        end = time.perf_counter()
        cpu = time.process_time() - cpu_start
        losses.append(float(loss))
        if step >= args.warmup:
            totals.append(end - start)
            forwards.append(forward_done - start)
            backwards.append(backward_done - forward_done)
            optimizers.append(end - backward_done)
            cpus.append(cpu)
    def ms(values):
        return 1e3 * statistics.median(values)

    return {"median": ms(totals), "mean": 1e3 * statistics.mean(totals), "forward": ms(forwards),
            "backward": ms(backwards), "optimizer": ms(optimizers), "cpu": ms(cpus),
            "first_loss": losses[0], "last_loss": losses[-1]}


def report_timing(torch, config, weights, inputs, targets, args):
    tokens = args.batch * args.seq_len
    ours_rounds, torch_rounds = [], []
    print(f"timing: {args.steps} steps after {args.warmup} warmup, {args.rounds} round(s), "
          f"{args.threads} thread(s); load average {os.getloadavg()[0]:.2f} before")
    for r in range(args.rounds):
        output = run_mpengine(args, ["--steps", str(args.steps), "--warmup", str(args.warmup)])
        ours = parse_our_timing(output)
        theirs = time_torch(torch, config, weights, inputs, targets, args)
        ours_rounds.append(ours)
        torch_rounds.append(theirs)
        print(f"  round {r + 1}: ours {ours['median']:.1f} ms, torch {theirs['median']:.1f} ms, "
              f"ratio {theirs['median'] / ours['median']:.2f}; CPU time ours {ours['cpu']:.1f} "
              f"ms, torch {theirs['cpu']:.1f} ms (load {os.getloadavg()[0]:.2f})")
    ours = min(ours_rounds, key=lambda t: t["median"])
    theirs = min(torch_rounds, key=lambda t: t["median"])
    ours_cpu = min(t["cpu"] for t in ours_rounds)
    theirs_cpu = min(t["cpu"] for t in torch_rounds)
    print()
    print(f"  {'median ms per step':<20} {'ours':>10} {'torch':>10} {'torch/ours':>11}")
    for key in ("forward", "backward", "optimizer", "median"):
        label = "step (total)" if key == "median" else key
        print(f"  {label:<20} {ours[key]:>10.1f} {theirs[key]:>10.1f} "
              f"{theirs[key] / ours[key]:>11.2f}")
    print(f"  {'step CPU time':<20} {ours_cpu:>10.1f} {theirs_cpu:>10.1f} "
          f"{theirs_cpu / ours_cpu:>11.2f}")
    print(f"  {'tokens/s':<20} {1e3 * tokens / ours['median']:>10.0f} "
          f"{1e3 * tokens / theirs['median']:>10.0f}")
    ratio = theirs["median"] / ours["median"]
    print(f"  mean ms per step: ours {ours['mean']:.1f}, torch {theirs['mean']:.1f}")
    last_rel = abs(ours["last_loss"] - theirs["last_loss"]) / abs(theirs["last_loss"])
    print(f"  loss after {args.warmup + args.steps} AdamW steps on the batch: ours "
          f"{ours['last_loss']:.7f}, torch {theirs['last_loss']:.7f} "
          f"(relative difference {last_rel:.1e}; from {theirs['first_loss']:.7f})")
    print()
    print(f"RATIO torch / ours = {ratio:.2f} ({'we are faster' if ratio > 1 else 'torch is faster'}"
          f"; the target is >= 1.3 at one thread); in CPU time "
          f"{theirs_cpu / ours_cpu:.2f}")


def openblas_core():
    """The kernel family the OpenBLAS loaded into this process uses ("SkylakeX", "Prescott")."""
    import ctypes
    try:
        library = ctypes.CDLL("libopenblas.so.0")
        library.openblas_get_corename.restype = ctypes.c_char_p
        return library.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


def main():
    args = parse_args()
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None:
        import_torch()  # exits 2 saying how to get them
    # Thread counts and the OpenBLAS kernels are read when the libraries load (numpy and torch
    # both load OpenBLAS): set them before importing either. mpengine inherits the same
    # environment. Without --openblas-coretype, torch is given the kernels mpengine ends up with
    # (mpengine replaces OpenBLAS's SSE3 fallback on CPUs it does not know), so both sides run
    # the same GEMM code and the comparison measures everything else.
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    if args.openblas_coretype:
        os.environ["OPENBLAS_CORETYPE"] = args.openblas_coretype
    coretype_origin = "given" if "OPENBLAS_CORETYPE" in os.environ else None

    directory = args.dir or tempfile.mkdtemp(prefix="torch_compare_")
    passed = False
    try:
        output = run_mpengine(args, ["--steps", "0", "--dump", directory])
        our_core = re.search(r"BLAS: .*core (\S+)", output)
        our_core = our_core[1] if our_core else "unknown"
        if coretype_origin is None and our_core != "unknown":
            os.environ["OPENBLAS_CORETYPE"] = our_core
            coretype_origin = "set to mpengine's choice"
        torch, numpy = import_torch()
        torch.set_num_threads(args.threads)
        torch_core = openblas_core()

        cpu = platform.processor() or "cpu"
        try:
            with open("/proc/cpuinfo") as cpuinfo:
                cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo
                           if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        print("mpengine vs PyTorch: GPT-2 loss, gradients and training-step time")
        print(f"  model {args.model}, batch {args.batch} x {args.seq_len} tokens, seed {args.seed}"
              + (f", weights {args.init_from}" if args.init_from else ""))
        print(f"  torch {torch.__version__} ({torch.get_num_threads()} thread(s)), numpy "
              f"{numpy.__version__}, {os.cpu_count()} cpus ({cpu})")
        print(f"  OpenBLAS kernels: ours {our_core}, torch {torch_core} (OPENBLAS_CORETYPE="
              f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}, {coretype_origin or 'unset'})")
        if our_core.lower() != torch_core.lower():
            print("  WARNING: the two sides use different GEMM kernels; the timing compares "
                  "them too (give --openblas-coretype to make them equal)")
        print("".join(f"  | {line}\n" for line in output.splitlines()), end="")
        config, weights = read_llmc(os.path.join(directory, "model.bin"), numpy)
        grads_config, our_grads = read_llmc(os.path.join(directory, "grads.bin"), numpy)
        if grads_config != config:
            raise CompareError("grads.bin and model.bin have different headers")
        inputs, targets = read_tokens(os.path.join(directory, "tokens.bin"), numpy)
        with open(os.path.join(directory, "loss.txt")) as file:
            our_loss = float(file.read())
        if inputs.max() >= config["vocab"] or inputs.min() < 0:
            raise CompareError("tokens.bin holds ids outside the vocabulary")
        print()
        passed, _ = compare_gradients(torch, numpy, config, weights, our_grads, inputs, targets,
                                      our_loss, args)
        del our_grads
        if not args.no_timing:
            print()
            report_timing(torch, config, weights, inputs, targets, args)
    except CompareError as error:
        print(f"torch_compare.py: {error}", file=sys.stderr)
        return 1
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
