#!/usr/bin/env python3
"""tools/bench/tokenize_speed.py — how fast `mpengine data tokenize` is against Hugging Face
`tokenizers` (`Tokenizer.encode_batch`), on one thread and on all cores, for one tokenizer.json.

Every input file is one document (as for `mpengine data tokenize FILES...`): its bytes decoded
with bytes.decode("utf-8", "replace"). Hugging Face runs in a subprocess per setting, with
RAYON_NUM_THREADS set before `tokenizers` is imported (1, then N); it is timed on encode_batch
alone (best of --repeat), the tokenizer loaded and warmed up first. mpengine is timed wall-clock
on the whole command, tokenizer loading and shard writing included:

  mpengine data tokenize --tokenizer T --out TMP/shard --threads 1 FILES...
  mpengine data tokenize --tokenizer T --out TMP/shard --threads N FILES...

and its token count is read back from the llm.c shard headers it wrote (magic 20240520 with
uint16 ids, 20240801 with uint32), which the table sets beside Hugging Face's count (a
difference there is an error, or documents delimited by the CLI; it is printed, not hidden).

Prints a table a person can read, then one JSON line a program can read. Exit 2 when the
mpengine binary, the tokenizer or an input is missing (saying which); 1 when a run fails.

  /work/venv-golden/bin/python tools/bench/tokenize_speed.py \\
      --tokenizer tests/engine/testdata/tokenizers/llama3_style \\
      --mpengine bazel-bin/tools/mpengine [--threads N] [--repeat 3] FILE...
  ... --hf-only FILE...           (Hugging Face alone: no binary needed)
"""

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

SHARD_MAGIC_U16 = 20240520
SHARD_MAGIC_U32 = 20240801


def hf_worker(tokenizer_json, files, repeat):
    """Runs in the subprocess: RAYON_NUM_THREADS is already in the environment."""
    from tokenizers import Tokenizer  # imported only here, after the environment is set
    texts = []
    nbytes = 0
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        nbytes += len(data)
        texts.append(data.decode("utf-8", "replace"))
    tok = Tokenizer.from_file(tokenizer_json)
    tok.encode_batch(texts[:8])  # warm-up: thread pool started, pages touched
    best = None
    tokens = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        encs = tok.encode_batch(texts)
        dt = time.perf_counter() - t0
        tokens = sum(len(e.ids) for e in encs)
        best = dt if best is None else min(best, dt)
    json.dump({"tokens": tokens, "seconds": best, "bytes": nbytes, "documents": len(texts)},
              sys.stdout)
    sys.stdout.write("\n")


def run_hf(tokenizer_json, files, threads, repeat):
    env = dict(os.environ)
    env["RAYON_NUM_THREADS"] = str(threads)
    env.pop("TOKENIZERS_PARALLELISM", None)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lst:
        lst.write("\n".join(files) + "\n")
    try:
        cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", "--tokenizer",
               tokenizer_json, "--repeat", str(repeat), "--file-list", lst.name]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    finally:
        os.unlink(lst.name)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit("tokenize_speed: Hugging Face worker failed (RAYON_NUM_THREADS=%d)" % threads)
    return json.loads(p.stdout.strip().splitlines()[-1])


def shard_tokens(out_dir):
    """Sum of the token counts in the headers of the llm.c shards under out_dir."""
    total = 0
    found = 0
    for path in sorted(glob.glob(os.path.join(out_dir, "*"))):
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            head = f.read(12)
        if len(head) < 12:
            continue
        magic, version, count = struct.unpack("<iii", head)
        if magic in (SHARD_MAGIC_U16, SHARD_MAGIC_U32):
            total += count
            found += 1
    return total if found else None


def run_mpengine(binary, tokenizer, files, threads):
    out_dir = tempfile.mkdtemp(prefix="tokenize_speed_")
    try:
        cmd = [binary, "data", "tokenize", "--tokenizer", tokenizer, "--out",
               os.path.join(out_dir, "shard"), "--threads", str(threads)] + files
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            sys.stderr.write(p.stdout + p.stderr)
            print("tokenize_speed: `%s` failed with exit status %d" %
                  (" ".join(cmd[:8]) + " ...", p.returncode), file=sys.stderr)
            sys.exit(1)
        return {"tokens": shard_tokens(out_dir), "seconds": dt}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def tokenizer_json_path(path):
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory with one")
    ap.add_argument("--mpengine", help="path to the mpengine binary")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="the many-thread setting (default: all cores, %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="Hugging Face: best of this many")
    ap.add_argument("--hf-only", action="store_true", help="time Hugging Face alone")
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--file-list", help=argparse.SUPPRESS)
    ap.add_argument("files", nargs="*", help="text files, one document each")
    args = ap.parse_args()

    files = list(args.files)
    if args.file_list:
        with open(args.file_list) as f:
            files += [line.rstrip("\n") for line in f if line.rstrip("\n")]
    tok_json = tokenizer_json_path(args.tokenizer)
    if args.hf_worker:
        hf_worker(tok_json, files, args.repeat)
        return

    missing = []
    if not os.path.isfile(tok_json):
        missing.append("tokenizer %s" % tok_json)
    if not files:
        missing.append("input files (none given)")
    missing += ["input %s" % f for f in files if not os.path.isfile(f)]
    if not args.hf_only:
        if not args.mpengine:
            missing.append("--mpengine BINARY (or pass --hf-only)")
        elif not (os.path.isfile(args.mpengine) and os.access(args.mpengine, os.X_OK)):
            missing.append("mpengine binary %s (build it: bazel build //tools:mpengine)" %
                           args.mpengine)
    if missing:
        for m in missing:
            print("tokenize_speed: missing: %s" % m, file=sys.stderr)
        sys.exit(2)
    files = [os.path.abspath(f) for f in files]
    n = max(1, args.threads)

    rows = []
    hf1 = run_hf(tok_json, files, 1, args.repeat)
    rows.append(("hf encode_batch", 1, hf1))
    hfn = run_hf(tok_json, files, n, args.repeat)
    rows.append(("hf encode_batch", n, hfn))
    if not args.hf_only:
        mp1 = run_mpengine(args.mpengine, args.tokenizer, files, 1)
        rows.append(("mpengine data tokenize", 1, mp1))
        mpn = run_mpengine(args.mpengine, args.tokenizer, files, n)
        rows.append(("mpengine data tokenize", n, mpn))

    print("tokenizer %s: %d documents, %d bytes" % (tok_json, hf1["documents"], hf1["bytes"]))
    print("%-24s %7s %12s %9s %12s %9s" % ("", "threads", "tokens", "seconds", "tokens/s",
                                           "MB/s"))
    result = {"tokenizer": tok_json, "documents": hf1["documents"], "bytes": hf1["bytes"],
              "runs": []}
    for name, threads, r in rows:
        tokens = r["tokens"] if r["tokens"] is not None else hf1["tokens"]
        rate = tokens / r["seconds"] if r["seconds"] > 0 else float("inf")
        mbs = hf1["bytes"] / r["seconds"] / 1e6 if r["seconds"] > 0 else float("inf")
        r["rate"] = rate
        print("%-24s %7d %12d %9.3f %12.0f %9.2f%s" %
              (name, threads, tokens, r["seconds"], rate, mbs,
               "" if r["tokens"] is None or r["tokens"] == hf1["tokens"] or name.startswith("hf")
               else "  (HF: %d tokens)" % hf1["tokens"]))
        result["runs"].append({"engine": name.split()[0], "threads": threads, "tokens": tokens,
                               "seconds": r["seconds"], "tokens_per_s": rate})
    if not args.hf_only:
        r1 = mp1["rate"] / hf1["rate"]
        rn = mpn["rate"] / hfn["rate"]
        print("mpengine / hf tokens/s: %.2fx on 1 thread, %.2fx on %d threads" % (r1, rn, n))
        result["ratio_1_thread"] = r1
        result["ratio_n_threads"] = rn
        if mp1["tokens"] is not None and mp1["tokens"] != hf1["tokens"]:
            extra = mp1["tokens"] - hf1["tokens"]
            why = (" (one separator per document: data tokenize puts one before each, Hugging "
                   "Face's encode only through a template)" if extra == len(files) else "")
            print("note: mpengine wrote %d tokens, Hugging Face gives %d%s" %
                  (mp1["tokens"], hf1["tokens"], why))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
