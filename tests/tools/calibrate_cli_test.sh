#!/usr/bin/env bash
# tests/tools/calibrate_cli_test.sh — cpu-local as this machine (issue 19, in part): without a
# calibration file plan and run say its figures are placeholders, and run never prints an MFU
# above 100% (tiny-gpt beats the 0.05 TFLOP/s placeholder here); `mpengine calibrate` keeps its
# measurement where MPENGINE_CALIBRATION points, and plan and run then use it for cpu-local; with
# MPENGINE_CALIBRATION empty there is nowhere to keep it, and calibrate says so (exit 2). The
# description it writes has this machine's cores (cores_per_node), its memory (node_memory_gib)
# and a bare rank's workspace.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/calibrate_cli
rm -rf "$tmp"
mkdir -p "$tmp"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cat > "$tmp/plan.json" <<'JSON'
{"model": "tiny-gpt.json", "cluster": "cpu-local", "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"global_batch": 8, "micro_batch": 8, "num_micro_batches": 1, "seq_len": 64},
 "training": {"steps": 4, "learning_rate": 1e-3}}
JSON
export MPENGINE_CALIBRATION="$tmp/cache/mpengine/cpu-local.json"

# No MFU of more than three digits before the point, nor 100.x%, in any step line.
no_mfu_over_100() {
  if grep -E "MFU (1[0-9]{2}|[2-9][0-9]{2}|[0-9]{4,})\.[0-9]%" <<<"$1" | grep -qv "MFU 100.0%"; then
    fail "$2: an MFU above 100% was printed: $(grep -E 'MFU' <<<"$1" | tail -1)"
  fi
}

expect 0 "cpu-local is uncalibrated: its figures are placeholders, not this machine's" -- \
  $mpengine plan "$tmp/tiny-gpt.json" --gpus 2 --cluster cpu-local
out=$($mpengine run --config "$tmp/plan.json" 2>&1)
code=$?
# The MFU checks below read a finished run's lines: a run that failed prints none, so they must
# not pass on it.
[ $code -eq 0 ] && grep -q "^done: 4 steps" <<<"$out" ||
  fail "run on the placeholder cpu-local: exit $code, no 'done: 4 steps': $(tail -3 <<<"$out")"
grep -qF "(uncalibrated placeholder: \`mpengine calibrate\` measures it)" <<<"$out" ||
  fail "run on the placeholder cpu-local does not say so: $(grep backend <<<"$out")"
no_mfu_over_100 "$out" "placeholder cpu-local"

expect 0 "mpengine calibrate: wrote $MPENGINE_CALIBRATION" "plan and run use it for cpu-local from now on" -- \
  $mpengine calibrate --quick --no-comm
[ -s "$MPENGINE_CALIBRATION" ] || fail "calibrate wrote no $MPENGINE_CALIBRATION"
out=$($mpengine plan "$tmp/tiny-gpt.json" --gpus 2 --cluster cpu-local 2>&1)
grep -q "GPUs of cpu-local-calibrated" <<<"$out" || fail "plan does not use the calibration: $(head -1 <<<"$out")"
grep -q "uncalibrated" <<<"$out" && fail "plan still calls the calibrated cpu-local uncalibrated"
out=$($mpengine run --config "$tmp/plan.json" 2>&1)
code=$?
[ $code -eq 0 ] && grep -q "^done: 4 steps" <<<"$out" ||
  fail "run on the calibrated cpu-local: exit $code, no 'done: 4 steps': $(tail -3 <<<"$out")"
# Against the cores the run keeps busy (one rank's two BLAS threads here), never one core's peak.
grep -qE "MFU against [0-9]+ busy cores? x cpu-local-calibrated's fp32 peak" <<<"$out" || fail "run does not use the calibration: $(grep backend <<<"$out")"
# (n/a is allowed: a --quick calibration on a loaded machine may measure less than a step reaches.)
grep -qE "^step 4/4 .*\| MFU ([0-9]+\.[0-9]%|n/a \(above the peak\))" <<<"$out" ||
  fail "run prints no MFU against the measured peak: $(grep 'step 4/4' <<<"$out")"
no_mfu_over_100 "$out" "calibrated cpu-local"

expect 0 '"name":	"cpu-local-calibrated"' -- $mpengine calibrate --quick --no-comm --out -
# This machine's cores (the ranks of run share them) and a bare rank's memory, as optional keys.
out=$($mpengine calibrate --quick --no-comm --out - 2>/dev/null)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # the affinity mask's, as calibrate's
grep -qE "\"cores_per_node\":[[:space:]]+$cores," <<<"$out" ||
  fail "calibrate does not write this machine's $cores cores: $(grep cores_per <<<"$out")"
grep -qE "\"workspace_gib\":[[:space:]]+0\.[0-9]+" <<<"$out" ||
  fail "calibrate writes no workspace_gib below 1 GiB: $(grep workspace <<<"$out")"
# The machine's memory, which the ranks of a job share (node_memory_gib, issue 29): the same
# figure as device_memory_gib (one rank alone may use all of it).
node_gib=$(grep -oE '"node_memory_gib":[[:space:]]+[0-9.]+' <<<"$out" | grep -oE '[0-9.]+$')
device_gib=$(grep -oE '"device_memory_gib":[[:space:]]+[0-9.]+' <<<"$out" | grep -oE '[0-9.]+$')
[ -n "$node_gib" ] && [ "$node_gib" = "$device_gib" ] ||
  fail "calibrate writes node_memory_gib '${node_gib}', device_memory_gib '${device_gib}': want the machine's memory in both"
MPENGINE_CALIBRATION= expect 2 "no calibration file to write (MPENGINE_CALIBRATION is empty, or no HOME)" -- \
  $mpengine calibrate --quick --no-comm

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "calibrate_cli_test: all checks passed"
