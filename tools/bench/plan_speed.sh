#!/usr/bin/env bash
# tools/bench/plan_speed.sh — how fast the planner searches: times `mpengine plan ... --json` on
# one core for the large cases of docs/plan.md (Speed of the search) and prints, per case, the wall time, the planner's own
# search time, the candidates it considered, those it simulated and those a bound ruled out
# without simulating. The bar (issue 19): gpt-1t on 3072 a100-80g GPUs, full search, under 0.2 s
# of wall time on one core. The wall time includes starting the process (loading the CUDA, NCCL,
# MPI and OpenBLAS libraries the binary links): about 75 ms of CPU here, whatever is planned.
#
# On the 2-core development machine, shared with other builds (wall times move by 2x with its
# load; CPU time from `perf stat` moves little):
#   before (a partition DP per cost table and stage count, a time bound without the pipeline's
#   drain, each simulated layout's schedule generated, checked and matched afresh):
#     gpt-1t    3072  wall 0.28 .. 0.88 s, search 0.19 .. 0.35 s, 249 ms CPU; 11 of 20532 simulated
#     gpt3-175b 1024  wall 0.56 .. 0.90 s, search 0.46 .. 0.75 s;            263 of 12060 simulated
#     gpt2-1.5b   64  wall 0.16 .. 0.20 s, search 0.04 .. 0.05 s;            347 of 1158 simulated
#   after (one DP per cost table for all stage counts, a time bound with fill and drain, schedules
#   checked once per kind, pp, micro-batches and virtual stages):
#     gpt-1t    3072  wall 0.12 .. 0.24 s, search 0.03 .. 0.07 s, 108 ms CPU; 6 of 20532 simulated
#     gpt3-175b 1024  wall 0.13 .. 0.23 s, search 0.05 .. 0.09 s;            180 of 12060 simulated
#     gpt2-1.5b   64  wall 0.09 .. 0.16 s, search 0.01 s;                    262 of 1158 simulated
#   Of gpt-1t's 108 ms of CPU, 75 ms are the process's start (`mpengine version` alone; most of
#   it libcublasLt's static constructors): the wall time passes 0.2 s only when the two cores are
#   oversubscribed (load above 4), when `mpengine version` alone takes 0.12 .. 0.15 s.
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

printf '%-12s %6s %8s %10s %10s %11s %10s %8s\n' model gpus batch wall_s search_s candidates \
  simulated pruned
run_case() {
  local model=$1 gpus=$2 batch=$3 cluster=$4
  local start end out
  start=$(date +%s.%N)
  out=$("${pin[@]}" "$mpengine" plan "examples/models/$model.json" --gpus "$gpus" \
        --cluster "$cluster" --global-batch "$batch" --json)
  end=$(date +%s.%N)
  local search candidates simulated pruned
  field() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\([-0-9.e+]*\),*\$/\1/p" <<<"$out" | head -1; }
  search=$(field search_seconds)
  candidates=$(field candidates)
  simulated=$(field simulated)
  pruned=$(field pruned)  # absent from the JSON of binaries before issue 19's pruning counts
  printf '%-12s %6d %8d %10.3f %10.3f %11d %10d %8s\n' "$model" "$gpus" "$batch" \
    "$(echo "$end - $start" | bc -l)" "$search" "$candidates" "$simulated" "${pruned:--}"
}
run_case gpt-1t 3072 3072 a100-80g
run_case gpt3-175b 1024 1536 a100-80g
run_case gpt2-1.5b 64 512 h100-sxm
