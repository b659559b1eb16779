#!/usr/bin/env bash
# tests/tools/run_trace_timeline_test.sh — what a user does after a pipeline run: `mpengine run
# --trace` on tiny-gpt with pp = 2 (1F1B, 4 micro-batches, 3 steps; mpengine launches its two
# ranks under mpirun itself), then `mpengine timeline` on the very file it recorded. The
# timeline_cli_test draws traces made in one process with times known in advance; this one
# checks that a real run's trace holds both ranks, every step and every action, and that the
# timeline reads it: a row per pipeline rank, each rank's busy and idle time, the step time from
# the run's step slices, the actions of each stage against the plan, and the refusal of a step
# the run did not record.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/run_trace_timeline
rm -rf "$tmp"
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cat > "$tmp/pp2.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 1, "pp": 2, "tp": 1}, "schedule": "1f1b",
 "batch": {"global_batch": 4, "micro_batch": 1, "num_micro_batches": 4, "seq_len": 16},
 "training": {"steps": 3, "learning_rate": 3e-3, "warmup_steps": 1}}
JSON
trace=$tmp/trace.json

expect 0 "trace: wrote $trace" "done: 3 steps" -- \
  timeout 120 $mpengine run --backend cpu --config "$tmp/pp2.json" --trace "$trace"
# One process per rank in the merged file, named with its place in the grid.
expect 0 '"rank 0 (dp 0, pp 0, tp 0)"' '"rank 1 (dp 0, pp 1, tp 0)"' -- cat "$trace"

# The last step by default, drawn with one row per pipeline rank, the recorded actions checked
# against the schedule's rules, and the steps the run recorded (step 0 is the warm-up).
expect 0 "$trace, step 2 (measured): 1f1b, pp = 2, m = 4" \
  "its actions checked complete, ordered, no deadlock under eager point-to-point" \
  "measured step 2 of $trace (steps 0 to 2 recorded" \
  "step time: " "(the run's step slices" -- $mpengine timeline "$trace"
out=$($mpengine timeline "$trace" 2>&1)
for r in 0 1; do
  # The row of pipeline rank r holds forwards and backwards, and the table its busy and idle
  # time: both positive-sized, the bubble a fraction.
  if ! grep -qE "^rank $r \| .*F[0-3].*B[0-3]" <<<"$out"; then
    fail "timeline: no row for rank $r with its F and B actions:
$out"
  fi
  if ! awk -v r="$r" '
      /^ pp rank +busy ms +idle ms +bubble/ { table = 1; next }
      table && $1 == r { found = ($2 > 0 && $3 >= 0 && $4 >= 0 && $4 < 1); exit }
      END { exit !found }' <<<"$out"; then
    fail "timeline: pp rank $r's busy / idle / bubble row is missing or out of range:
$out"
  fi
done

# Against the plan: each stage ran its 4 forwards and 4 backwards of the step, as recorded.
out=$($mpengine timeline "$trace" --against "$tmp/pp2.json" 2>&1)
code=$?
if [ $code -ne 0 ]; then fail "timeline --against: exit $code: $out"; fi
for row in "0 F" "0 B" "1 F" "1 B"; do
  if ! awk -v s="${row% *}" -v k="${row#* }" '
      /^stage +kind +predicted ms/ { table = 1; next }
      table && $1 == s && $2 == k { found = ($NF == 4 && $3 > 0 && $4 > 0); exit }
      END { exit !found }' <<<"$out"; then
    fail "timeline --against: stage ${row% *} ${row#* }: want 4 actions with predicted and measured times:
$out"
  fi
done

# Every step the run recorded can be drawn; the next one is refused naming what is there.
expect 0 "$trace, step 0 (measured)" -- $mpengine timeline "$trace" --step 0
expect 2 "step 3 is not in the trace (it recorded steps 0 to 2)" -- $mpengine timeline "$trace" --step 3

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "run_trace_timeline_test: all checks passed"
