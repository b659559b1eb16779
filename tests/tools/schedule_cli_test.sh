#!/usr/bin/env bash
# tests/tools/schedule_cli_test.sh — `mpengine schedule` as a user meets it: the timeline of a plan
# and of --pp/--micro-batches/--kind with its bubble fraction, the svg and chrome files it writes,
# and exit 2 with the refusal for each mistake (a bad kind, m not a multiple of pp when
# interleaving, a plan missing a key, ...).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
plan=${2:-examples/plans/tiny-gpt-pp4-1f1b.json}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/schedule_cli
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

# The example plan: 1F1B, pp = 4, m = 8 — bubble (p - 1) / (m + p - 1) = 3 / 11.
expect 0 "1f1b, pp = 4, m = 8" \
  "rank 0 | F0 F1 F2 F3 .. .. .. .. .. .. B0--- F4 B1---" \
  "rank 3 | .. .. .. F0 B0--- F1 B1---" \
  "bubble fraction: 0.2727" \
  "peak micro-batches alive: rank 0: 4, rank 1: 3, rank 2: 2, rank 3: 1" \
  "checked: complete, ordered, no deadlock under eager point-to-point" -- \
  $mpengine schedule --config "$plan" --unit-costs

# A plan by default: the cost model's durations of its stages on its cluster (milliseconds), the
# same prediction `mpengine plan` makes; the bubble grows past the unit-cost 3/11 because the
# first and last stages carry the embedding and the LM head. The step time and the bubble are
# not pinned: they are recomputed here, independently of the simulator, from the stage
# durations its chrome timeline holds (one F and one B duration per stage, the point-to-point
# latency from rank 1's first wait) by running 1F1B's action lists with their dependencies.
expect 0 "1f1b, pp = 4, m = 8" "one cell = 0.5 ms" "peak micro-batches alive: rank 0: 4" -- \
  $mpengine schedule --config "$plan"
out=$($mpengine schedule --config "$plan" 2>&1)
$mpengine schedule --config "$plan" --format chrome --out "$tmp/plan-1f1b.json" > /dev/null 2>&1 ||
  fail "schedule --config --format chrome failed"
printed_step=$(sed -n 's/^step time: \([0-9.]*\) ms$/\1/p' <<<"$out")
printed_bubble=$(sed -n 's/^bubble fraction: \([0-9.]*\) .*/\1/p' <<<"$out")
verdict=$(python3 - "$tmp/plan-1f1b.json" "$printed_step" "$printed_bubble" <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
p, m = 4, 8
dur = {}  # (kind, stage) -> microseconds, the same for every micro-batch
for e in events:
    dur[(e["name"][0], e["tid"])] = e["dur"]
start = {(e["name"][0], e["tid"], e["args"]["micro_batch"]): e["ts"] for e in events}
latency = start[("F", 1, 0)] - dur[("F", 0)]  # rank 1 waits for F0 of rank 0, then the message
# 1F1B on rank r: p - 1 - r warm-up forwards, then one forward and one backward in turn, then the
# remaining backwards (Narayanan et al. 2021).
def actions(r):
    warm = min(p - 1 - r, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            order.append(("F", f)); f += 1
        order.append(("B", b)); b += 1
    return order
lists = [actions(r) for r in range(p)]
done, free, nxt = {}, [0.0] * p, [0] * p
while any(nxt[r] < len(lists[r]) for r in range(p)):
    moved = False
    for r in range(p):
        if nxt[r] == len(lists[r]):
            continue
        kind, mb = lists[r][nxt[r]]
        dep = None if (kind == "F" and r == 0) or (kind == "B" and r == p - 1) else \
            (("F", r - 1, mb) if kind == "F" else ("B", r + 1, mb))
        if kind == "B" and ("F", r, mb) not in done:
            continue
        if dep is not None and dep not in done:
            continue
        ready = free[r] if dep is None else max(free[r], done[dep] + latency)
        done[(kind, r, mb)] = ready + dur[(kind, r)]
        free[r] = done[(kind, r, mb)]
        nxt[r] += 1
        moved = True
    assert moved, "deadlock"
step = max(free)
busy = [m * (dur[("F", r)] + dur[("B", r)]) for r in range(p)]
bubble = sum(1 - b / step for b in busy) / p
ok = abs(step / 1000 - float(sys.argv[2])) <= 1e-4 * step / 1000 and abs(bubble - float(sys.argv[3])) <= 1e-4
print("ok" if ok else "bad", "%.4f ms %.4f" % (step / 1000, bubble))
PY
)
echo "schedule of the example plan: recomputed step time and bubble ${verdict#* } against the printed $printed_step ms $printed_bubble"
[ "${verdict%% *}" = ok ] || fail "schedule --config: printed step time $printed_step ms and bubble $printed_bubble, recomputed ${verdict#* }"

# Without a plan, every kind; interleaving divides the bubble by v, zb-h1 keeps a third of it.
expect 0 "step time: 33 time units" "bubble fraction: 0.2727" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --kind gpipe
expect 0 "bubble fraction: 0.1579" "step time: 28.5 time units" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --virtual 2 --kind interleaved-1f1b
expect 0 "bubble fraction: 0.1111" "step time: 27 time units" "W weight-gradient backward" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --kind zb-h1
# --eval: the forward-only list a held-out loss runs on the same layout (a fill, no drain).
expect 0 "1f1b forward only (evaluation), pp = 4, m = 8" "rank 0 | F0 F1 F2 F3 F4 F5 F6 F7 .. .. .." \
  "rank 3 | .. .. .. F0 F1 F2 F3 F4 F5 F6 F7" "step time: 11 time units" \
  "peak micro-batches alive: rank 0: 1, rank 1: 1, rank 2: 1, rank 3: 1" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --kind 1f1b --eval
expect 0 "bubble fraction: 0.0000" "rank 0 | F0 B0---" -- \
  $mpengine schedule --pp 1 --micro-batches 1 --kind 1f1b
expect 0 "bubble fraction: 0.7500" -- $mpengine schedule --pp 4 --micro-batches 1 --kind 1f1b
expect 0 "step time: 7 time units" -- \
  $mpengine schedule --pp 2 --micro-batches 1 --kind 1f1b --latency 0.5

# Files: svg with a lane per rank, chrome trace JSON with a slice per action and flows.
expect 0 "wrote the svg timeline to $tmp/1f1b.svg (bubble fraction 0.2727)" -- \
  $mpengine schedule --config "$plan" --unit-costs --format svg --out "$tmp/1f1b.svg"
head -c 5 "$tmp/1f1b.svg" | grep -qF "<svg " || fail "the svg does not start with <svg"
[ "$(grep -c 'class="lane"' "$tmp/1f1b.svg")" -eq 4 ] || fail "the svg has no 4 lanes"
grep -qF "warm-up" "$tmp/1f1b.svg" && grep -qF "cool-down" "$tmp/1f1b.svg" ||
  fail "the svg does not name the phases"
tail -n 1 "$tmp/1f1b.svg" | grep -qxF "</svg>" || fail "the svg does not end with </svg>"
ls "$tmp" | grep -q "tmp-" && fail "a temporary file was left next to the output"
expect 0 "wrote the chrome timeline" -- \
  $mpengine schedule --config "$plan" --unit-costs --format chrome --out "$tmp/1f1b.json"
grep -qF '"traceEvents": [' "$tmp/1f1b.json" || fail "the trace has no traceEvents"
[ "$(grep -c '"ph": "X"' "$tmp/1f1b.json")" -eq 64 ] || fail "the trace has not 64 slices"
[ "$(grep -c '"ph": "s"' "$tmp/1f1b.json")" -eq 48 ] || fail "the trace has not 48 flow starts"
[ "$(grep -c '"ph": "f"' "$tmp/1f1b.json")" -eq 48 ] || fail "the trace has not 48 flow ends"
if command -v python3 >/dev/null; then
  python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$tmp/1f1b.json" ||
    fail "the chrome trace is not JSON"
fi

# Refusals: exit 2 with what would work.
expect 2 "mpengine schedule: unknown schedule kind '1fb1'; did you mean '1f1b'? (kinds: gpipe, 1f1b, interleaved-1f1b, zb-h1)" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --kind 1fb1
expect 2 "mpengine schedule: interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 4; got 6: use 4 or 8" -- \
  $mpengine schedule --pp 4 --micro-batches 6 --virtual 2 --kind interleaved-1f1b
expect 2 "mpengine schedule: interleaved-1f1b needs at least 2 model chunks per rank (virtual stages); got 1" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --kind interleaved-1f1b
expect 2 "mpengine schedule: 1f1b runs one model chunk per rank, so virtual stages must be 1 (got 2)" -- \
  $mpengine schedule --pp 4 --micro-batches 8 --virtual 2 --kind 1f1b
expect 2 "mpengine schedule: missing option --micro-batches and --kind: give --pp, --micro-batches and --kind, or --config PLAN.json" -- \
  $mpengine schedule --pp 4
expect 2 "give either --config PLAN.json or --pp, --micro-batches and --kind, not both (--pp with --config)" -- \
  $mpengine schedule --config "$plan" --pp 2
expect 2 "--pp: must be at least 1, got 0" -- $mpengine schedule --pp 0 --micro-batches 8 --kind 1f1b
expect 2 "--format: unknown timeline format 'png' (formats: ascii, svg, chrome)" -- \
  $mpengine schedule --config "$plan" --format png
expect 2 "unknown option '--micro-batch'; did you mean '--micro-batches'?" -- \
  $mpengine schedule --pp 4 --micro-batch 8 --kind 1f1b
expect 2 "deadlock under rendezvous point-to-point: rank 0, after action 5" -- \
  $mpengine schedule --pp 2 --micro-batches 4 --virtual 2 --kind interleaved-1f1b --p2p rendezvous
expect 2 "$tmp/missing/out.svg: cannot create: No such file or directory" -- \
  $mpengine schedule --config "$plan" --format svg --out "$tmp/missing/out.svg"

# Plans (read by topology/plan.h): the file and the JSON path of each mistake.
plan_with() {  # plan_with FILE PARALLEL BATCH SCHEDULE: a plan with these three parts
  printf '{"format": "mpengine-plan", "version": 1, "model": "../models/tiny-gpt.json",\n' >"$1"
  printf ' "parallel": %s, "batch": %s, "schedule": "%s"}\n' "$2" "$3" "$4" >>"$1"
}
plan_with "$tmp/interleaved.json" '{"dp": 1, "pp": 4, "tp": 1, "virtual_stages": 2}' \
  '{"global_batch": 12, "micro_batch": 2, "num_micro_batches": 6, "seq_len": 64}' interleaved-1f1b
expect 2 "$tmp/interleaved.json: interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 4; got 6: use 4 or 8" -- \
  $mpengine schedule --config "$tmp/interleaved.json"
plan_with "$tmp/interleaved-ok.json" '{"dp": 1, "pp": 4, "tp": 1, "virtual_stages": 2}' \
  '{"global_batch": 16, "micro_batch": 2, "num_micro_batches": 8, "seq_len": 64}' interleaved-1f1b
expect 0 "interleaved-1f1b, pp = 4, m = 8, v = 2" "bubble fraction: 0.1579" -- \
  $mpengine schedule --config "$tmp/interleaved-ok.json" --unit-costs
# The cost model needs the plan's model: a missing one is named.
expect 2 "$tmp/../models/tiny-gpt.json: cannot open" -- \
  $mpengine schedule --config "$tmp/interleaved-ok.json"
plan_with "$tmp/typo.json" '{"dp": 1, "pp": 4, "tp": 1, "virtual_stage": 2}' \
  '{"global_batch": 16, "micro_batch": 2, "num_micro_batches": 8, "seq_len": 64}' 1f1b
expect 2 "$tmp/typo.json: \$.parallel: unknown key \"virtual_stage\"; did you mean \"virtual_stages\"?" -- \
  $mpengine schedule --config "$tmp/typo.json"
plan_with "$tmp/no-micro-batches.json" '{"dp": 1, "pp": 4, "tp": 1}' \
  '{"global_batch": 16, "micro_batch": 2, "seq_len": 64}' 1f1b
expect 2 "$tmp/no-micro-batches.json: \$.batch: missing required key \"num_micro_batches\" (a positive integer)" -- \
  $mpengine schedule --config "$tmp/no-micro-batches.json"
plan_with "$tmp/bad-kind.json" '{"dp": 1, "pp": 2, "tp": 1}' \
  '{"global_batch": 16, "micro_batch": 2, "num_micro_batches": 8, "seq_len": 64}' zero-bubble
expect 2 "$tmp/bad-kind.json: \$.schedule: \"zero-bubble\" is not one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\"" -- \
  $mpengine schedule --config "$tmp/bad-kind.json"
expect 2 "$tmp/absent.json: cannot open: No such file or directory" -- \
  $mpengine schedule --config "$tmp/absent.json"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
