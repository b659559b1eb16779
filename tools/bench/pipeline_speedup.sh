#!/usr/bin/env bash
# tools/bench/pipeline_speedup.sh — pipeline efficiency on this machine: the same model and global
# batch trained with pp = 1 (one rank, one core) and with pp = 2 (two ranks, one core each),
# m = 8 micro-batches, 1F1B. Prints the measured speed-up next to 1F1B's ideal 2m / (m + p - 1)
# and its share of it (the issue's target: at least 90%), and the measured bubble of each
# pipeline rank (from --trace, drawn by mpengine timeline) next to the simulated one,
# (p - 1) / (m + p - 1).
#
# The model (bench-gpt: 8 blocks of 256 channels, vocab 512, T = 64) is large enough that a stage's
# GEMMs, not the messages between the two processes, set the time. Step times are the median of
# the steps after the first two (warm-up).
#
# usage: tools/bench/pipeline_speedup.sh [MPENGINE] [STEPS]   (default bazel-bin/tools/mpengine, 12)
set -euo pipefail
mpengine=${1:-bazel-bin/tools/mpengine}
steps=${2:-12}
if [ ! -x "$mpengine" ]; then
  echo "pipeline_speedup.sh: $mpengine not found; run: bazel build //tools:mpengine" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cat > "$tmp/bench-gpt.json" <<'JSON'
{"name": "bench-gpt", "vocab_size": 512, "seq_len": 64,
 "layers": [
   {"type": "embedding", "hidden": 256, "max_positions": 64},
   {"type": "transformer", "hidden": 256, "heads": 4, "ffn_hidden": 1024, "repeat": 8},
   {"type": "layernorm", "hidden": 256},
   {"type": "lm_head", "hidden": 256, "tie_embedding": true}]}
JSON
plan() { # plan NAME PP
  cat > "$tmp/$1.json" <<JSON
{"model": "bench-gpt.json", "cluster": "cpu-local",
 "parallel": {"dp": 1, "pp": $2, "tp": 1},
 "batch": {"global_batch": 16, "micro_batch": 2, "num_micro_batches": 8, "seq_len": 64},
 "schedule": "1f1b", "training": {"steps": $steps}}
JSON
}
plan pp1 1
plan pp2 2
# Median step time in ms of a --metrics file, without the first two steps.
median_ms() {
  awk -F'"ms": ' 'NR > 2 { split($2, a, ","); print a[1] }' "$1" | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
echo "== pp = 1 (one rank)"
"$mpengine" run --config "$tmp/pp1.json" --metrics "$tmp/pp1.jsonl" | tail -1
echo "== pp = 2 (two ranks under mpirun, traced)"
"$mpengine" run --config "$tmp/pp2.json" --metrics "$tmp/pp2.jsonl" --trace "$tmp/pp2-trace.json" | tail -2
pp1_ms=$(median_ms "$tmp/pp1.jsonl")
pp2_ms=$(median_ms "$tmp/pp2.jsonl")
echo "== measured timeline of the last step (pp = 2)"
"$mpengine" timeline "$tmp/pp2-trace.json" --against "$tmp/pp2.json" || true
awk -v a="$pp1_ms" -v b="$pp2_ms" -v m=8 -v p=2 'BEGIN {
  ideal = p * m / (m + p - 1); speedup = a / b
  printf "\npipeline efficiency: m = %d micro-batches, 1F1B\n", m
  printf "  step time pp = 1: %.1f ms, pp = 2: %.1f ms (medians after 2 warm-up steps)\n", a, b
  printf "  speed-up %.3f, ideal 2m/(m+p-1) = %.3f: %.1f%% of ideal (target 90%%)\n", speedup, ideal, 100 * speedup / ideal
  printf "  simulated bubble (p-1)/(m+p-1) = %.3f\n", (p - 1) / (m + p - 1) }'
