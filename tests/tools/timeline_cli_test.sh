#!/usr/bin/env bash
# tests/tools/timeline_cli_test.sh — `mpengine timeline` as a user meets it, on traces written by
# trace_fixture (the real recorder, with the unit-cost times of the generated schedule in
# milliseconds, step 0 1.5 times slower): the ascii drawing of the last step with its bubble per
# rank and step time, another step, svg and chrome files, the prediction of the plan against the
# measurement, and exit 2 with the exact refusal for a file that is not JSON, not an mpengine
# trace, missing a key, a step that is not there, and a plan of another layout.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
fixture=${2:-tests/tools/trace_fixture}
plan=${3:-examples/plans/tiny-gpt-pp4-1f1b.json}
other_plan=${4:-examples/plans/tiny-gpt-1rank.json}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/timeline_cli
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

# The plan's layout (1F1B, pp = 4, m = 8), 3 steps: F = 1 ms, B = 2 ms, so the last step draws
# like `mpengine schedule` and idles (p - 1) / (m + p - 1) = 3 / 11 on every rank.
trace="$tmp/pp4.json"
"$fixture" "$trace" --kind 1f1b --pp 4 --micro-batches 8 --steps 3 --plan "$plan" ||
  fail "trace_fixture could not write $trace"
if command -v python3 >/dev/null; then
  python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$trace" || fail "the trace is not JSON"
fi

expect 0 "$trace, step 2 (measured): 1f1b, pp = 4, m = 8" \
  "rank 0 | F0 F1 F2 F3 .. .. .. .. .. .. B0--- F4 B1---" \
  "rank 3 | .. .. .. F0 B0--- F1 B1---" \
  "pipeline time (first action to last): 33 ms" \
  "bubble fraction: 0.2727" \
  "measured: times recorded by the run; its actions checked complete, ordered, no deadlock" \
  "measured step 2 of $trace (steps 0 to 2 recorded; each pipeline rank shown by its rank at dp 0, tp 0)" \
  " pp rank      busy ms      idle ms   bubble" \
  "       0       24.000        9.000   0.2727" \
  "       3       24.000        9.000   0.2727" \
  "pipeline time: 33.000 ms (first action to last); bubble fraction 0.2727 (mean over pipeline ranks)" \
  "step time: 33.500 ms (the run's step slices: data, actions, gradient reduction and optimizer)" -- \
  $mpengine timeline "$trace"

# Step 0, the warm-up: the same picture 1.5 times slower.
expect 0 "step 0 (measured)" "pipeline time: 49.500 ms" "step time: 50.000 ms" \
  "       1       36.000       13.500   0.2727" -- \
  $mpengine timeline "$trace" --step 0

# Zero-bubble with dp = tp = 2: W actions, the replicas drawn once.
zb="$tmp/zb.json"
"$fixture" "$zb" --kind zb-h1 --pp 2 --micro-batches 4 --dp 2 --tp 2 --steps 2 ||
  fail "trace_fixture could not write $zb"
expect 0 "rank 0 | F0 F1 .. B0 W0 F2 B1 W1 F3 B2 W2 B3 W3" "W weight-gradient backward" \
  "pipeline time: 13.000 ms" "bubble fraction 0.0769" -- \
  $mpengine timeline "$zb"

# Files: svg with a lane per pipeline rank; chrome trace JSON; with the drawing on stdout the
# measurement goes to stderr.
expect 0 "mpengine timeline: wrote the svg timeline of step 2 to $tmp/pp4.svg" \
  "bubble fraction 0.2727" -- \
  $mpengine timeline "$trace" --format svg --out "$tmp/pp4.svg"
head -c 5 "$tmp/pp4.svg" | grep -qF "<svg " || fail "the svg does not start with <svg"
[ "$(grep -c 'class="lane"' "$tmp/pp4.svg")" -eq 4 ] || fail "the svg has no 4 lanes"
ls "$tmp" | grep -q "tmp-" && fail "a temporary file was left next to the output"
$mpengine timeline "$trace" --format chrome >"$tmp/drawn.json" 2>"$tmp/drawn.err" ||
  fail "timeline --format chrome failed: $(cat "$tmp/drawn.err")"
grep -qF '"generator": "mpengine timeline", "measured": true' "$tmp/drawn.json" ||
  fail "the chrome drawing does not say it is measured"
[ "$(grep -c '"ph": "X"' "$tmp/drawn.json")" -eq 64 ] || fail "the chrome drawing has not 64 slices"
grep -qF "step time: 33.500 ms" "$tmp/drawn.err" || fail "the measurement is not on stderr"
if command -v python3 >/dev/null; then
  python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$tmp/drawn.json" ||
    fail "the chrome drawing on stdout is not JSON alone"
fi

# Against the plan: the cost model's per-stage times beside the measured ones (1 ms, 2 ms over 8
# micro-batches), the pipeline and step time and the bubble.
out=$($mpengine timeline "$trace" --against "$plan" 2>&1)
code=$?
[ "$code" -eq 0 ] || fail "timeline --against exited $code: $out"
for pattern in \
  "prediction of $plan (cost model on cluster cpu-local) against step 2 measured" \
  "stage  kind  predicted ms  measured ms     error  actions" \
  "error = (predicted - measured) / measured"; do
  grep -qF -- "$pattern" <<<"$out" || fail "timeline --against: missing '$pattern' in: $out"
done
for stage in 0 1 2 3; do
  grep -qE "^ +$stage +F +[0-9]+\.[0-9]{3} +1\.000 +[-+][0-9]+\.[0-9]% +8$" <<<"$out" ||
    fail "timeline --against: no F row for stage $stage measured at 1.000 ms over 8 in: $out"
  grep -qE "^ +$stage +B +[0-9]+\.[0-9]{3} +2\.000 +[-+][0-9]+\.[0-9]% +8$" <<<"$out" ||
    fail "timeline --against: no B row for stage $stage measured at 2.000 ms over 8"
done
grep -qE "^pipeline ms +[0-9]+\.[0-9]{3} +33\.000 +[-+][0-9]+\.[0-9]%$" <<<"$out" ||
  fail "timeline --against: no pipeline row measuring 33.000 ms"
grep -qE "^step ms +[0-9]+\.[0-9]{3} +33\.500 +[-+][0-9]+\.[0-9]%$" <<<"$out" ||
  fail "timeline --against: no step row measuring 33.500 ms"
grep -qE "^bubble +0\.[0-9]{4} +0\.2727 +[-+][0-9]\.[0-9]{4} \(predicted - measured\)$" <<<"$out" ||
  fail "timeline --against: no bubble row measuring 0.2727"

# Refusals: exit 2 naming the file, the JSON path or the option.
expect 2 "mpengine timeline: --against $other_plan: the plan's layout differs from the one $trace recorded (pp 1 in the plan, 4 in the trace; micro-batches 4 in the plan, 8 in the trace); give the plan the run used: $plan" -- \
  $mpengine timeline "$trace" --against "$other_plan"
expect 2 "mpengine timeline: $trace: step 7 is not in the trace (it recorded steps 0 to 2)" -- \
  $mpengine timeline "$trace" --step 7
printf '{"mpengine": {"format": "mpengine-trace",\n  "version" 1}}\n' >"$tmp/broken.json"
expect 2 "mpengine timeline: $tmp/broken.json:2:13: JSON syntax error" -- \
  $mpengine timeline "$tmp/broken.json"
$mpengine schedule --config "$plan" --format chrome --out "$tmp/drawing.json" 2>/dev/null ||
  fail "mpengine schedule could not write a chrome drawing"
expect 2 "mpengine timeline: $tmp/drawing.json: \$: not an mpengine trace: no \"mpengine\" object (record one with \`mpengine run --config PLAN.json --trace TRACE.json\`; the chrome timeline of \`mpengine schedule\` is a drawing, not a measurement)" -- \
  $mpengine timeline "$tmp/drawing.json"
sed 's/"num_micro_batches":8,//' "$trace" >"$tmp/no_m.json"
expect 2 "mpengine timeline: $tmp/no_m.json: \$.mpengine: missing required key \"num_micro_batches\" (an integer)" -- \
  $mpengine timeline "$tmp/no_m.json"
# The first event after the 16 metadata events of the 4 ranks is rank 0's F0 of step 0.
sed '0,/,"stage":0}/s//}/' "$trace" >"$tmp/no_stage.json"
expect 2 "mpengine timeline: $tmp/no_stage.json: \$.traceEvents[16].args: missing required key \"stage\" (an integer)" -- \
  $mpengine timeline "$tmp/no_stage.json"
expect 2 "mpengine timeline: $tmp/absent.json: cannot open: No such file or directory" -- \
  $mpengine timeline "$tmp/absent.json"
expect 2 "mpengine timeline: --format: unknown timeline format 'png' (formats: ascii, svg, chrome)" -- \
  $mpengine timeline "$trace" --format png
expect 2 "mpengine timeline: $tmp/missing-dir/t.svg: cannot create" -- \
  $mpengine timeline "$trace" --format svg --out "$tmp/missing-dir/t.svg"
expect 0 "Show what a run really did" "--against PLAN.json" -- $mpengine timeline --help

if [ "$failures" -ne 0 ]; then
  echo "timeline_cli_test: $failures check(s) failed"
  exit 1
fi
echo "timeline_cli_test: all checks passed"
