#!/usr/bin/env bash
# tools/bench/memory.sh — per-rank peak resident memory (VmHWM) of `mpengine run` against the
# planner's prediction for that rank, shard-first's benchmark (docs/benchmarks.md, "Memory per rank").
#
# For each layout (pp, tp) of LAYOUTS (default 1,1 2,1 1,2 2,2 4,1) it plans MODEL (default
# examples/models/gpt2-350m.json) on cpu-local (with 6 GiB per rank) with that layout fixed (1F1B, micro-batch 1, 4
# micro-batches of 64 tokens, no recomputation, no ZeRO) and runs two phases:
#   train   mpengine run --steps 1 --save-weights W.bin --checkpoint-dir CK   (init, step, saves)
#   resume  the next layout's plan resumes CK (--resume --steps 2): a resharded load and a step
# and prints every rank's peak beside the plan's memory for its pipeline rank, the time of each
# phase (start-up, steps, saves) and the targets: peak <= 1.15 x prediction + 200 MiB, and with
# pp x tp = 4 every rank's peak <= 35% of the one-rank run's in the same phase.
#
#   tools/bench/memory.sh                      # after `bazel build //tools:mpengine`
#   MPENGINE=/path/to/old/mpengine tools/bench/memory.sh   # a build without the per-rank line:
#                                              # peaks from /usr/bin/time, rank order unknown
#   LAYOUTS="1,1 2,2:13-14 4,1:5-8-8-6" tools/bench/memory.sh   # layers_per_stage of your own
#                                              # (no prediction: the plan's is for its own split)
#   SPLIT=memory tools/bench/memory.sh         # the planner's split by memory (plan --split
#                                              # memory) instead of by time
#
# Then ZeRO over dp = 4 (issue 17): ZERO_MODEL (default examples/models/gpt2-124m.json, four full
# replicas must fit this machine) at (dp, pp, tp) = (4, 1, 1) with each of ZERO_STAGES (default
# "0 1 2 3"), one step and a checkpoint save: every rank's peak beside the
# plan's prediction (target: <= 1.15 x prediction + 200 MiB) and the model state (weights,
# gradients, moments) the plan gives a rank, which ZeRO divides by dp. ZERO_STAGES= skips it.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${MPENGINE:-bazel-bin/tools/mpengine}
model=${MODEL:-examples/models/gpt2-350m.json}
read -r -a layouts <<< "${LAYOUTS:-1,1 2,1 1,2 2,2 4,1}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-memory.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# cpu-local with room for the one-rank run: 6 GiB per rank instead of its placeholder 2 GiB (the
# planner's workspace is 5% of it: 307 MiB, about the process's own libraries and buffers).
cat > "$tmp/cluster.json" <<'JSON'
{"name": "cpu-local-6g", "device": "CPU process", "nodes": 1, "devices_per_node": 4096,
 "device_memory_gib": 6, "memory_bandwidth_gbytes_per_s": 10, "peak_tflops": {"fp32": 0.05},
 "intra_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2},
 "inter_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2}}
JSON

plan_for() { # plan_for PP TP OUT [SPLIT] [DP ZERO MODEL]: SPLIT (say 5-8-8-6) replaces the plan's layers_per_stage,
  # and with it the prediction, which is for the planner's own split
  local dp=${5:-1}
  "$bin" plan "${7:-$model}" --gpus $((dp * $1 * $2)) --cluster "$tmp/cluster.json" --dp "$dp" \
    --pp "$1" --tp "$2" --micro-batch 1 --global-batch 4 --seq-len 64 --schedule 1f1b \
    --virtual-stages 1 --recompute none --sequence-parallel off --zero "${6:-0}" \
    --split "${SPLIT:-time}" --out "$3" > /dev/null || return 1
  [ -n "${4:-}" ] || return 0
  "$py" - "$3" "$4" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
plan["layers_per_stage"] = [int(n) for n in sys.argv[2].split("-")]
del plan["predicted"]
json.dump(plan, open(sys.argv[1], "w"), indent=1)
PY
}

# run_phase NAME PLAN ARGS...: runs, then prints "rank pp tp peak_mib" lines into $tmp/NAME.peaks
# and the time line into $tmp/NAME.time.
run_phase() {
  local name=$1 plan=$2
  shift 2
  local np
  np=$("$py" -c 'import json,sys; p=json.load(open(sys.argv[1]))["parallel"]; print(p["dp"]*p["pp"]*p["tp"])' "$plan")
  local out=$tmp/$name.out
  mpirun -np "$np" --oversubscribe /usr/bin/time -f "peak-kib %M" \
    "$bin" run --config "$plan" "$@" > "$out" 2>&1
  local status=$?
  if [ $status -ne 0 ]; then
    echo "$name: mpengine run exited $status:" >&2
    tail -20 "$out" >&2
    return 1
  fi
  "$py" - "$out" > "$tmp/$name.peaks" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
line = re.search(r"memory: peak resident per rank \(VmHWM\):(.*)", text)
if line:
    for r, dp, pp, tp, mib in re.findall(r"rank (\d+) \(dp (\d+), pp (\d+), tp (\d+)\) (\d+) MiB", line.group(1)):
        print(r, pp, tp, mib)
else:  # an older build: /usr/bin/time's figures, rank order unknown
    for i, kib in enumerate(sorted(int(k) for k in re.findall(r"peak-kib (\d+)", text))):
        print("?", "?", "?", kib // 1024)
PY
  grep -E "^time: |^done: " "$out" | tr '\n' ' ' > "$tmp/$name.time"
}

printf '%s, plans for cpu-local with 6 GiB per rank, global batch 4 x 64 tokens, 1f1b, micro-batch 1, split by %s\n' "$model" "${SPLIT:-time}"
printf '%-18s %-7s %5s %4s %4s %10s %10s %7s %s\n' layout phase rank pp tp "peak MiB" "plan MiB" "peak/1r" target
declare -A one_rank
all_ok=1
report() { # report PHASE PP TP PLAN
  local phase=$1 lp=$2 lt=$3 cur=$4
  while read -r rank rpp rtp mib; do
    pred=$("$py" -c 'import json,sys; p=json.load(open(sys.argv[1])).get("predicted"); r=sys.argv[2]; print(int(p["memory_bytes_per_pp_rank"][int(r)]/1048576) if p and r != "?" else 0)' "$cur" "$rpp")
    if [ "$lp,$lt" = "1,1" ]; then one_rank[$phase]=$mib; fi
    ratio="-"
    ok=yes
    if [ "$pred" -gt 0 ] && [ "$mib" -gt $((pred * 115 / 100 + 200)) ]; then ok="no (> 1.15 x plan + 200)"; fi
    if [ -n "${one_rank[$phase]:-}" ] && [ "$lp,$lt" != "1,1" ]; then
      ratio=$("$py" -c "print(f'{$mib / ${one_rank[$phase]}:.3f}')")
      if [ $((lp * lt)) -eq 4 ] && [ "$mib" -gt $((one_rank[$phase] * 35 / 100)) ]; then
        ok="no (> 35% of one rank)"
      fi
    fi
    [ "$ok" = yes ] || all_ok=0
    printf '%-18s %-7s %5s %4s %4s %10s %10s %7s %s\n' "$label" "$phase" "$rank" "$rpp" "$rtp" "$mib" "$pred" "$ratio" "$ok"
  done < "$tmp/$phase.peaks"
  printf '%-18s %-7s %s\n' "$label" "$phase" "$(sed -E 's/done: [^,]*, //' "$tmp/$phase.time")"
}
n=${#layouts[@]}
for i in "${!layouts[@]}"; do
  IFS=: read -r shape split <<< "${layouts[$i]}"
  IFS=, read -r pp tp <<< "$shape"
  label="($pp,$tp)${split:+ $split}"
  plan_for "$pp" "$tp" "$tmp/plan-$i.json" "$split" || exit 1
  rm -rf "$tmp/w.bin"
  run_phase train "$tmp/plan-$i.json" --steps 1 --save-weights "$tmp/w.bin" --checkpoint-dir "$tmp/ck-$i" || exit 1
  report train "$pp" "$tp" "$tmp/plan-$i.json"
done
rm -f "$tmp/w.bin"
# Each layout resumes the checkpoint the layout before it saved (the first: the last one's).
for i in "${!layouts[@]}"; do
  IFS=: read -r shape split <<< "${layouts[$i]}"
  IFS=, read -r pp tp <<< "$shape"
  label="($pp,$tp)${split:+ $split}"
  from=$(((i + n - 1) % n))
  run_phase resume "$tmp/plan-$i.json" --steps 2 --checkpoint-dir "$tmp/ck-$from" --resume \
    --override-training || exit 1
  echo "(resumed the checkpoint of (${layouts[$from]}))"
  report resume "$pp" "$tp" "$tmp/plan-$i.json"
done

# ZeRO over dp = 4.
zero_model=${ZERO_MODEL:-examples/models/gpt2-124m.json}
read -r -a zero_stages <<< "${ZERO_STAGES-0 1 2 3}"
if [ ${#zero_stages[@]} -gt 0 ]; then
  printf '\n%s at (dp, pp, tp) = (4, 1, 1), one step and a checkpoint save, per ZeRO stage\n' "$zero_model"
  printf '%-8s %5s %10s %10s %16s %s\n' zero rank "peak MiB" "plan MiB" "state MiB/rank" target
fi
for zero in "${zero_stages[@]}"; do
  plan_for 1 1 "$tmp/zero-$zero.json" "" 4 "$zero" "$zero_model" || exit 1
  run_phase "zero-$zero" "$tmp/zero-$zero.json" --steps 1 --checkpoint-dir "$tmp/ck-zero-$zero" || exit 1
  # The plan's model state of a rank: weights + gradients + optimizer, from --explain's memory
  # table (GiB).
  "$bin" plan --explain "$zero_model" --gpus 4 --cluster "$tmp/cluster.json" --dp 4 --pp 1 --tp 1 \
    --micro-batch 1 --global-batch 4 --seq-len 64 --schedule 1f1b --virtual-stages 1 \
    --recompute none --sequence-parallel off --zero "$zero" > "$tmp/zero-$zero.explain" 2>&1
  read -r pred state <<< "$("$py" - "$tmp/zero-$zero.json" "$tmp/zero-$zero.explain" <<'PY'
import json, re, sys
p = json.load(open(sys.argv[1]))["predicted"]
text = open(sys.argv[2]).read()
row = re.search(r"memory per GPU of each pipeline rank.*\n.*\n\s+0\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text)
state = sum(float(x) for x in row.groups()) * 1024 if row else 0
print(int(p["memory_bytes_per_pp_rank"][0] / 1048576), int(state))
PY
)"
  while read -r rank rpp rtp mib; do
    ok=yes
    if [ "$mib" -gt $((pred * 115 / 100 + 200)) ]; then ok="no (> 1.15 x plan + 200)"; all_ok=0; fi
    printf '%-8s %5s %10s %10s %16s %s\n' "zero $zero" "$rank" "$mib" "$pred" "$state" "$ok"
  done < "$tmp/zero-$zero.peaks"
  printf '%-8s %s\n' "zero $zero" "$(sed -E 's/done: [^,]*, //' "$tmp/zero-$zero.time")"
  rm -rf "$tmp/ck-zero-$zero"
done
if [ $all_ok -eq 1 ]; then echo "every rank within its targets"; else echo "some rank missed a target"; fi
