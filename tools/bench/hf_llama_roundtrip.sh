#!/usr/bin/env bash
# tools/bench/hf_llama_roundtrip.sh — a Llama-family model through mpengine and back into Hugging
# Face transformers (issue 16): the LlamaForCausalLM golden of tools/bench/hf_llama_golden.py is
# imported, trained for 20 steps at (dp, pp, tp) = (1, 2, 2) from its weights (on the synthetic
# Markov source), and exported with `export --format hf`; then transformers' from_pretrained loads
# the export and computes its loss on a batch that training never saw (the golden's shard.bin, in
# float64), and mpengine computes its own on the same batch (a one-rank run from the export, step
# 1). Prints both and their relative difference; the target is 1e-5.
#
#   PYTHON=V/bin/python tools/bench/hf_llama_roundtrip.sh   (V: a venv with transformers 4.46.3,
#                                                            see docs/benchmarks.md, References)
# Uses bazel-bin/tools/mpengine (bazel build //tools:mpengine) unless MPENGINE says otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
mpengine=${MPENGINE:-bazel-bin/tools/mpengine}
python=${PYTHON:-python3}
name=${1:-hf_tiny_llama3}
golden=tests/engine/testdata/$name
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

"$mpengine" import "$golden" --out "$tmp/model.json" --seq-len 16 > /dev/null 2>&1
plan() { # plan FILE PP TP STEPS LEARNING_RATE
  cat > "$1" <<JSON
{"model": "$tmp/model.json", "parallel": {"dp": 1, "pp": $2, "tp": $3},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": $4, "learning_rate": $5, "weight_decay": 0.1, "warmup_steps": 2}}
JSON
}
plan "$tmp/train.json" 2 2 20 3e-3
plan "$tmp/eval.json" 1 1 1 1e-30
"$mpengine" run --config "$tmp/train.json" --init-from "$golden" --checkpoint-dir "$tmp/ck" |
  grep -E "^step (1|20)/"
"$mpengine" export --checkpoint "$tmp/ck" --format hf --out "$tmp/export"
"$mpengine" run --config "$tmp/eval.json" --init-from "$tmp/export" --data "$golden/shard.bin" \
  --metrics "$tmp/eval.jsonl" > /dev/null
ours=$(awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$tmp/eval.jsonl")
theirs=$("$python" tools/bench/hf_llama_golden.py --check "$name" "$tmp/export" 2> /dev/null |
         sed 's/.*"shard_loss": \([0-9.e+-]*\).*/\1/')
awk -v a="$ours" -v b="$theirs" 'BEGIN {
  d = a - b; if (d < 0) d = -d
  printf "held-out loss after 20 steps at (1, 2, 2), exported: mpengine %.8f, transformers %.8f, relative difference %.2e (target 1e-5): %s\n",
         a, b, d / b, (d <= 1e-5 * b ? "met" : "MISSED") }'
