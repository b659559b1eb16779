#!/usr/bin/env bash
# tools/bench/plan_speed.sh — how fast the planner searches: times `mpengine plan ... --json` on
# one core for the README's large cases and prints, per case, the wall time, the planner's own
# search time, and the candidates it considered and simulated. The issue's bar: gpt-1t on 3072
# a100-80g GPUs, full search, under one second on one core.
#
# usage: tools/bench/plan_speed.sh [MPENGINE]   (default bazel-bin/tools/mpengine)
set -euo pipefail
mpengine=${1:-bazel-bin/tools/mpengine}
if [ ! -x "$mpengine" ]; then
  echo "plan_speed.sh: $mpengine not found; run: bazel build //tools:mpengine" >&2
  exit 2
fi
pin=()
if command -v taskset >/dev/null 2>&1; then pin=(taskset -c 0); fi

printf '%-12s %6s %8s %10s %10s %11s %10s\n' model gpus batch wall_s search_s candidates simulated
run_case() {
  local model=$1 gpus=$2 batch=$3 cluster=$4
  local start end out
  start=$(date +%s.%N)
  out=$("${pin[@]}" "$mpengine" plan "examples/models/$model.json" --gpus "$gpus" \
        --cluster "$cluster" --global-batch "$batch" --json)
  end=$(date +%s.%N)
  local search candidates simulated
  field() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\([-0-9.e+]*\),*\$/\1/p" <<<"$out" | head -1; }
  search=$(field search_seconds)
  candidates=$(field candidates)
  simulated=$(field simulated)
  printf '%-12s %6d %8d %10.3f %10.3f %11d %10d\n' "$model" "$gpus" "$batch" \
    "$(echo "$end - $start" | bc -l)" "$search" "$candidates" "$simulated"
}
run_case gpt-1t 3072 3072 a100-80g
run_case gpt3-175b 1024 1536 a100-80g
run_case gpt2-1.5b 64 512 h100-sxm
