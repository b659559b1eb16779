#!/usr/bin/env bash
# tools/bench/plan_vs_run.sh — the planner against the machine: for a handful of CPU plans, the
# step time and per-rank memory `mpengine plan` predicts beside what `mpengine run` measures on
# this machine (issue 19, "This machine"; target: within +-20% on each).
#
# It first calibrates this machine into a temporary file (`mpengine calibrate --out F`,
# then MPENGINE_CALIBRATION=F for plan and run), so the figures never depend on, nor touch, the
# user's cached calibration. Then for each case:
#   mpengine plan MODEL --gpus N --dp D --pp P --tp T ... --out PLAN.json
#   mpengine run --config PLAN.json --steps S --trace TRACE.json
#   mpengine timeline TRACE.json --against PLAN.json --step K   for every step K but the first
# and prints one row: the plan's predicted step time, the median over the steps of the measured one
# (the run's step slices: data, actions, gradient reduction and optimizer, as timeline reports it),
# the predicted pipeline time against the measured median, the largest predicted memory of a
# pipeline rank against the largest peak resident memory (VmHWM) of any rank, and the errors
# (predicted - measured) / measured. Cases:
#   1rank    gpt2-124m on one rank (micro-batch 1 of 128 tokens)
#   pp2      gpt2-124m, pp = 2, 1f1b, 4 micro-batches
#   tp2      gpt2-124m, tp = 2
#   dp2      gpt2-124m, dp = 2
#   quick8   the quickstart's tiny-gpt on 8 ranks, dp = pp = tp = 2, 1f1b, global batch 16
#   dp4-zero0 .. dp4-zero3   gpt2-124m, dp = 4, ZeRO 0, 1, 2 and 3 (issue 17: the cost of
#            ZeRO-2's reduce-scatter in every micro-batch, of ZeRO-3's block gathers before every
#            forward and backward, and of the parameter gather, measured), 2 micro-batches per dp
#            rank
#
#   tools/bench/plan_vs_run.sh                    # after `bazel build //tools:mpengine`
#   CASES="1rank quick8" REPEATS=3 tools/bench/plan_vs_run.sh
#   MPENGINE=/path/to/other/mpengine tools/bench/plan_vs_run.sh
#   CALIBRATION=cluster.json tools/bench/plan_vs_run.sh   # cpu-local from this file, no calibrate
#
# REPEATS runs each case that many times and takes the median over all their steps. Each row also
# shows the load average before the case and the cores the run kept busy (its processes' CPU time
# over wall time): other work on the cores makes a run slower than any plan (the model assumes the
# cores are this job's), so read a row under load, or with fewer cores busy than the run's ranks
# could use, with that in mind. It prints figures; it is not a test and never fails on an error
# above the target.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${MPENGINE:-bazel-bin/tools/mpengine}
read -r -a cases <<< "${CASES:-1rank pp2 tp2 dp2 quick8 dp4-zero0 dp4-zero1 dp4-zero2 dp4-zero3}"
repeats=${REPEATS:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-plan-vs-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The BLAS threads `run` gives each rank (cores / ranks, at least 1), which the model assumes.
unset OPENBLAS_NUM_THREADS OMP_NUM_THREADS
py=/usr/bin/python3
[ -x "$py" ] || py=python3

if [ -n "${CALIBRATION:-}" ]; then
  echo "== cpu-local: $CALIBRATION (CALIBRATION; not calibrated again)"
  cp "$CALIBRATION" "$tmp/cpu-local.json" || exit 1
else
  echo "== mpengine calibrate --out $tmp/cpu-local.json"
  "$bin" calibrate --out "$tmp/cpu-local.json" || exit 1
fi
export MPENGINE_CALIBRATION=$tmp/cpu-local.json

gpt2=examples/models/gpt2-124m.json
tiny=examples/models/tiny-gpt.json
fixed="--schedule 1f1b --virtual-stages 1 --recompute none --zero 0"
case_args() { # case_args NAME: prints "MODEL STEPS PLAN-OPTIONS..."
  case $1 in
    1rank) echo "$gpt2 6 --gpus 1 --global-batch 1 --micro-batch 1 --seq-len 128 $fixed" ;;
    pp2) echo "$gpt2 5 --gpus 2 --dp 1 --pp 2 --tp 1 --global-batch 4 --micro-batch 1 --seq-len 128 $fixed" ;;
    tp2) echo "$gpt2 5 --gpus 2 --dp 1 --pp 1 --tp 2 --global-batch 2 --micro-batch 1 --seq-len 128 --sequence-parallel off $fixed" ;;
    dp2) echo "$gpt2 5 --gpus 2 --dp 2 --pp 1 --tp 1 --global-batch 2 --micro-batch 1 --seq-len 128 $fixed" ;;
    quick8) echo "$tiny 40 --gpus 8 --dp 2 --pp 2 --tp 2 --schedule 1f1b --global-batch 16" ;;
    dp4-zero[0-3]) echo "$gpt2 4 --gpus 4 --dp 4 --pp 1 --tp 1 --global-batch 8 --micro-batch 1 --seq-len 128 --schedule 1f1b --virtual-stages 1 --recompute none --zero ${1#dp4-zero}" ;;
    *) return 1 ;;
  esac
}

# One row from the plan, the run's output and the timelines of its steps.
summarise() { # summarise NAME PLAN LOAD RUN-OUTPUTS... (each followed by its timelines file)
  "$py" - "$@" <<'PY'
import json, re, statistics, sys
name, plan_path, load = sys.argv[1:4]
files = sys.argv[4:]
plan = json.load(open(plan_path))
p = plan["predicted"]
par = plan["parallel"]
ranks = par["dp"] * par["pp"] * par["tp"]
pred_mem = max(p["memory_bytes_per_pp_rank"]) / 2**20
step_pred = pipe_pred = None
steps, pipes, mems, busy = [], [], [], []
for run_out, timelines in zip(files[0::2], files[1::2]):
    text = open(run_out).read()
    cpu = re.search(r"^cpu ([\d.]+) ([\d.]+) ([\d.]+)$", text, re.M)
    if cpu and float(cpu.group(1)) > 0:
        busy.append((float(cpu.group(2)) + float(cpu.group(3))) / float(cpu.group(1)))
    line = re.search(r"memory: peak resident per rank \(VmHWM\):(.*)", text)
    if line:
        mems += [int(m) for m in re.findall(r"\) (\d+) MiB", line.group(1))]
    for row in open(timelines):
        m = re.match(r"(step|pipeline) ms\s+([\d.]+)\s+([\d.]+)", row)
        if not m:
            continue
        if m.group(1) == "step":
            step_pred = float(m.group(2)) / 1e3
            steps.append(float(m.group(3)) / 1e3)
        else:
            pipe_pred = float(m.group(2)) / 1e3
            pipes.append(float(m.group(3)) / 1e3)
def err(pred, meas):
    return f"{100 * (pred - meas) / meas:+.1f}%" if pred is not None and meas else "-"
step = statistics.median(steps) if steps else None
pipe = statistics.median(pipes) if pipes else None
mem = max(mems) if mems else None
fmt = lambda v, f: f.format(v) if v is not None else "-"
print(f"{name:<8} {ranks:>5} {fmt(step_pred, '{:.4f}'):>10} {fmt(step, '{:.4f}'):>10} "
      f"{err(step_pred, step):>8} {fmt(pipe_pred, '{:.4f}'):>10} {fmt(pipe, '{:.4f}'):>10} "
      f"{err(pipe_pred, pipe):>8} {pred_mem:>9.0f} {fmt(mem, '{}'):>9} {err(pred_mem, mem):>8} "
      f"{len(steps):>5} {load:>5} {fmt(statistics.median(busy) if busy else None, '{:.2f}'):>5}")
PY
}

rows=$tmp/rows
: > "$rows"
for name in "${cases[@]}"; do
  args_text=$(case_args "$name") || { echo "unknown case $name" >&2; exit 2; }
  read -r -a args <<< "$args_text"
  model=${args[0]} steps=${args[1]}
  plan=$tmp/$name.json
  echo "== $name: mpengine plan $model ${args[*]:2} --out $name.json"
  "$bin" plan "$model" "${args[@]:2}" --top 1 --out "$plan" > "$tmp/$name.plan" 2>&1 || {
    cat "$tmp/$name.plan" >&2
    exit 1
  }
  outputs=()
  load=$(cut -d' ' -f1 /proc/loadavg)
  for r in $(seq 1 "$repeats"); do
    echo "== $name: mpengine run --config $name.json --steps $steps --trace (run $r of $repeats)"
    out=$tmp/$name.$r.out
    if ! /usr/bin/time -f "cpu %e %U %S" -o "$tmp/$name.$r.cpu" "$bin" run --config "$plan" \
      --steps "$steps" --trace "$tmp/$name.$r.trace.json" > "$out" 2>&1; then
      echo "$name: mpengine run failed:" >&2
      tail -20 "$out" >&2
      exit 1
    fi
    grep -E "^(done|time|memory): " "$out" | sed 's/^/   /'
    for k in $(seq 1 $((steps - 1))); do
      "$bin" timeline "$tmp/$name.$r.trace.json" --against "$plan" --step "$k" 2>&1 |
        grep -E "^(step|pipeline) ms"
    done > "$tmp/$name.$r.timelines"
    cat "$tmp/$name.$r.cpu" >> "$out"
    outputs+=("$out" "$tmp/$name.$r.timelines")
  done
  summarise "$name" "$plan" "$load" "${outputs[@]}" >> "$rows"
done

echo
echo "predicted (mpengine plan) against measured (mpengine run --trace, median over the steps but"
echo "the first); memory: the fullest pipeline rank's prediction against the largest VmHWM of any rank"
printf '%-8s %5s %10s %10s %8s %10s %10s %8s %9s %9s %8s %5s %5s %5s\n' plan ranks "step s" \
  "measured" error "pipe s" measured error "plan MiB" "VmHWM" error steps load cores
cat "$rows"
echo "error = (predicted - measured) / measured; target +-20%. load: the 1-minute load average"
echo "before the case ran; cores: the cores the run's processes kept busy on average (CPU time over"
echo "wall time, start-up included) of the $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) here: other work on them slows a run beyond any plan."
