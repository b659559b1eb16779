#!/usr/bin/env bash
# tools/bench/plan_fidelity.sh — the planner's predictions against published measurements: for
# each row of Korthikanti et al. 2022, Table 5 (tools/bench/korthikanti2022_table5.csv: Megatron-LM
# on A100 80GB, tp 8, dp 1), `mpengine plan` on the a100-80g preset with the paper's parallel
# settings fixed, with full recomputation and with sequence parallelism + selective recomputation;
# prints the measured and predicted iteration time, the error, and the predicted memory per GPU.
# tests/topology/fidelity_test.cc holds the same errors in CI (mean <= 5%, largest <= 10%).
#
# usage: tools/bench/plan_fidelity.sh [MPENGINE]   (default bazel-bin/tools/mpengine)
set -euo pipefail
cd "$(dirname "$0")/../.."
mpengine=${1:-bazel-bin/tools/mpengine}
if [ ! -x "$mpengine" ]; then
  echo "plan_fidelity.sh: $mpengine not found; run: bazel build //tools:mpengine" >&2
  exit 2
fi
table=tools/bench/korthikanti2022_table5.csv

printf '%-14s %5s %4s %3s %-13s %10s %10s %8s %11s\n' model gpus pp v recompute "paper s" \
  predicted error "memory GiB"
errors=()
while IFS=, read -r model hidden heads layers gpus pp global_batch micro_batch v full_s sel_s; do
  case "$model" in \#*|model|"") continue ;; esac
  schedule=1f1b
  if [ "$v" -gt 1 ]; then schedule=interleaved-1f1b; fi
  for mode in full sp+selective; do
    if [ "$mode" = full ]; then
      fixed=(--recompute full --sequence-parallel off)
      measured=$full_s
    else
      fixed=(--recompute selective --sequence-parallel on)
      measured=$sel_s
    fi
    json=$("$mpengine" plan "examples/models/$model.json" --gpus "$gpus" --cluster a100-80g \
      --tp 8 --dp 1 --pp "$pp" --global-batch "$global_batch" --micro-batch "$micro_batch" \
      --virtual-stages "$v" --schedule "$schedule" --zero 0 "${fixed[@]}" --top 1 --json)
    read -r predicted memory < <(python3 -c '
import json, sys
plans = json.load(sys.stdin)["plans"]
if not plans:
    sys.exit("the paper'"'"'s layout does not fit")
print(plans[0]["step_time_s"], plans[0]["memory_bytes"] / 2**30)' <<<"$json")
    error=$(python3 -c "print(100 * ($predicted / $measured - 1))")
    errors+=("$error")
    printf '%-14s %5d %4d %3d %-13s %10.2f %10.2f %+7.1f%% %11.1f\n' "$model" "$gpus" "$pp" "$v" \
      "$mode" "$measured" "$predicted" "$error" "$memory"
  done
done <"$table"
python3 -c "
import sys
e = [abs(float(x)) for x in sys.argv[1:]]
print('mean |error| %.1f%%, largest %.1f%% (targets: 5%%, 10%%)' % (sum(e) / len(e), max(e)))
" "${errors[@]}"
