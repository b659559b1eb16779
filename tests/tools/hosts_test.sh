#!/usr/bin/env bash
# tests/tools/hosts_test.sh — `mpengine run --hostfile` across two test hosts (network namespaces
# of the test's own, tests/support/netns_cluster.sh; skipped by name where namespaces are
# forbidden), issue 30:
#   - two hosts x 4 ranks at (dp, pp, tp) = (2, 2, 2): every step's loss equals the one-host run's
#     within 1e-6 relative; the log says which ranks run on which host and the memory line names
#     both hosts;
#   - a rejecting pair (a prohibit route) and a dropping pair (an iptables DROP rule) fail the
#     run within --comm-timeout (plus start-up), naming both hosts and pointing at doctor;
#   - kill -9 of a rank on node2: named with its host within 30 s; with --max-restarts 1 the job
#     resumes from its latest checkpoint and ends with the uninterrupted run's final loss, bit
#     for bit.
# Every run is bounded by `timeout`, so the test never hangs.
set -uo pipefail
mpengine=$(realpath "${1:-${MPENGINE:-tools/mpengine}}")
source "$(dirname "${BASH_SOURCE[0]}")/../support/netns_cluster.sh" ||
  { echo "cannot load netns_cluster.sh"; exit 1; }
netns_sandbox "$0" "$@"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
tmp=${TEST_TMPDIR:-$(mktemp -d)}/hosts
rm -rf "$tmp"
mkdir -p "$tmp"
export TMPDIR=$tmp OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMPI_MCA_btl MPENGINE_FAULT
NETNS_DIR=$tmp/netns netns_cluster_up 2
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cat > "$tmp/plan.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 2, "pp": 2, "tp": 2, "sequence_parallel": true},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 32},
 "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
printf '# the test hosts\nnode1 slots=4\nnode2 slots=4   # pipeline stage 1\n' > "$tmp/hosts"
run() { timeout 120 "$mpengine" run --config "$tmp/plan.json" "$@"; }

# 1. Two hosts against one.
run --steps 8 --metrics "$tmp/one.jsonl" > "$tmp/one.log" 2>&1 || fail "one-host run: $(tail -5 "$tmp/one.log")"
expect 0 "host node1: ranks 0-3 (dp 0-1, pp 0, tp 0-1)" "host node2: ranks 4-7 (dp 0-1, pp 1, tp 0-1)" -- \
  run --steps 8 --hostfile "$tmp/hosts" --metrics "$tmp/two.jsonl"
run --steps 1 --hostfile "$tmp/hosts" > "$tmp/two.log" 2>&1
grep '^memory: peak resident' "$tmp/two.log" | grep -q "rank 3 (dp 1, pp 0, tp 1) [0-9]* MiB on node1, rank 4 (dp 0, pp 1, tp 0) [0-9]* MiB on node2" ||
  fail "the memory line does not name each rank's host: $(grep '^memory: peak' "$tmp/two.log")"
losses() { grep -o '"loss": [^,]*' "$1" | awk '{ print $2 }'; }
paste <(losses "$tmp/one.jsonl") <(losses "$tmp/two.jsonl") > "$tmp/pairs"
steps=$(wc -l < "$tmp/pairs")
worst=$(awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.3g", w + 0 }' "$tmp/pairs")
echo "two hosts vs one: $steps steps, largest relative loss difference $worst"
[ "$steps" -eq 8 ] || fail "two hosts vs one: $steps steps compared, want 8"
awk -v w="$worst" 'BEGIN { exit !(w <= 1e-6) }' || fail "two hosts vs one: losses differ by $worst relative (> 1e-6)"

# 2. Hosts that cannot reach each other: within --comm-timeout, both hosts named, doctor pointed at.
# bounded NAME HOW MAX: a run between blocked hosts ends non-zero within MAX seconds naming both.
bounded() {
  local name=$1 how=$2 max=$3 start code
  netns_block node2 node1 "$how"
  start=$(date +%s.%N)
  run --steps 2 --hostfile "$tmp/hosts" --comm-timeout 5 > "$tmp/$name.log" 2>&1
  code=$?
  local took
  took=$(seconds_since "$start")
  netns_unblock node2 node1
  echo "$name: exit $code after $took s: $(grep 'mpengine run:' "$tmp/$name.log" | tail -1)"
  [ "$code" -ne 0 ] && [ "$code" -ne 124 ] || fail "$name: exit $code (124: the run hung), want a failure"
  awk -v t="$took" -v m="$max" 'BEGIN { exit !(t < m) }' || fail "$name: took $took s, want < $max s"
  for word in node1 node2 "mpengine doctor"; do
    grep 'mpengine run:' "$tmp/$name.log" | grep -qF "$word" ||
      fail "$name: no mpengine line names '$word'; log: $(tail -5 "$tmp/$name.log")"
  done
}
bounded rejecting reject 20
grep -qF "host node2 cannot reach host node1" "$tmp/rejecting.log" || fail "rejecting: not said in mpengine's words"
bounded dropping drop 20
grep -qF "start-up: no connection within 5 s (--comm-timeout)" "$tmp/dropping.log" || fail "dropping: no start-up deadline message"
grep -q "^mpengine run: host node[12] (rank [0-9]) and host node[12] (rank [0-9]) could not connect within --comm-timeout 5 s" "$tmp/dropping.log" ||
  fail "dropping: no summary naming both hosts; log: $(tail -3 "$tmp/dropping.log")"

# 3. A rank lost on node2, and --max-restarts 1.
run --hostfile "$tmp/hosts" --checkpoint-dir "$tmp/whole" --save-every 5 --metrics "$tmp/whole.jsonl" \
  > "$tmp/whole.log" 2>&1 ||
  fail "uninterrupted run: $(tail -5 "$tmp/whole.log")"
# Rank 5 (on node2) stops answering before step 13; the test kills it with kill -9 there.
MPENGINE_FAULT=hang:5:13 run --hostfile "$tmp/hosts" --checkpoint-dir "$tmp/cut" --save-every 5 \
  --max-restarts 1 --comm-timeout 100 --metrics "$tmp/cut.jsonl" > "$tmp/cut.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "hanging before step 13" "$tmp/cut.log" && break; sleep 0.1; done
victim=
for environ in /proc/[0-9]*/environ; do
  if { tr '\0' '\n' < "$environ"; } 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=5; then
    pid=${environ#/proc/}
    pid=${pid%/environ}
    grep -q mpengine "/proc/$pid/cmdline" 2>/dev/null && victim=$pid
  fi
done
if [ -z "$victim" ]; then
  fail "no process of rank 5 found; log: $(tail -5 "$tmp/cut.log")"
  kill "$job"
else
  start=$(date +%s.%N)
  kill -9 "$victim"
  named=
  for _ in $(seq 600); do
    if grep -q "rank 5 was lost" "$tmp/cut.log"; then named=$(seconds_since "$start"); break; fi
    sleep 0.1
  done
  echo "kill -9 of rank 5 on node2: named after ${named:-never} s: $(grep -m1 'rank 5 was lost' "$tmp/cut.log")"
  [ -n "$named" ] && awk -v t="$named" 'BEGIN { exit !(t < 30) }' || fail "the lost rank was not named within 30 s"
  grep -q "rank 5 was lost.* on host node2" "$tmp/cut.log" || fail "the lost rank's host is not named"
fi
wait "$job"
code=$?
final() { grep -o 'final loss [0-9.]*' "$1" | tail -1; }
echo "restarted: exit $code, $(grep -m1 'restart 1 of 1' "$tmp/cut.log"); $(final "$tmp/cut.log") against the uninterrupted $(final "$tmp/whole.log")"
[ "$code" -eq 0 ] || fail "--max-restarts 1: exit $code; log: $(tail -8 "$tmp/cut.log")"
grep -q "restart 1 of 1: resuming from $tmp/cut/step-10" "$tmp/cut.log" || fail "no restart from step 10"
[ -n "$(final "$tmp/whole.log")" ] && [ "$(final "$tmp/cut.log")" = "$(final "$tmp/whole.log")" ] ||
  fail "the restarted run's $(final "$tmp/cut.log") is not the uninterrupted run's $(final "$tmp/whole.log")"
# Every step either attempt ran (steps 1-12, then 11-20 after the restart) against the
# uninterrupted run's, as --metrics prints them (8 significant digits).
step_losses() { sed 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/' "$1"; }
compared=$(awk 'NR == FNR { want[$1] = $2; next } { ++n; if (!($1 in want) || want[$1] != $2) bad = bad " step " $1 + 1 ": " $2 " vs " want[$1] }
  END { print n, (bad == "" ? "equal" : bad) }' <(step_losses "$tmp/whole.jsonl") <(step_losses "$tmp/cut.jsonl"))
echo "restarted run's step losses against the uninterrupted run's: ${compared#* } (${compared%% *} steps)"
[ "${compared#* }" = equal ] && [ "${compared%% *}" -eq 22 ] || fail "restarted run's losses: $compared"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
