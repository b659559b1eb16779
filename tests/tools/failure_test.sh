#!/usr/bin/env bash
# tests/tools/failure_test.sh — failures of a tensor-parallel run under mpirun (issue 7), made
# with the test-only fault injection of tools/cmd_run.c (MPENGINE_FAULT):
#   - a rank that dies (SIGKILL from itself, or kill -9 from outside) ends the run with exit 1
#     within 30 s, and `mpengine run` prints a line naming the lost rank (rank 1, and rank 0);
#   - a rank that hangs makes the other fail with the --comm-timeout error (2 s here) naming the
#     operation and the group's ranks, prefixed with its rank, and the run exits 1 — through the
#     launcher's re-launch and under `mpirun -np 2` directly;
#   - a pipeline rank that hangs makes the next stage's receive time out, naming the action, the
#     pp group and the peer;
#   - no rank outlives the run; a malformed MPENGINE_FAULT is an input error naming the variable.
# Every case is bounded by `timeout 60`, so a launcher that waits forever fails instead of hanging.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/failure
rm -rf "$tmp"
mkdir -p "$tmp"
unset MPENGINE_FAULT
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cat > "$tmp/tp2.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 1, "pp": 1, "tp": 2, "sequence_parallel": false},
 "batch": {"global_batch": 2, "micro_batch": 1, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 6, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
root=()
if [ "$(id -u)" -eq 0 ]; then root=(--allow-run-as-root); fi

# timed NAME MAX_SECONDS EXIT_CODE PATTERN... -- COMMAND...: expect, and the run takes less than
# MAX_SECONDS.
timed() {
  local name=$1 max=$2
  shift 2
  local start end
  start=$(date +%s.%N)
  expect "$@"
  end=$(date +%s.%N)
  if ! awk -v a="$start" -v b="$end" -v m="$max" 'BEGIN { exit !(b - a < m) }'; then
    fail "$name: took $(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') s, want < $max s"
  fi
}

# No process of this test's runs may outlive them.
no_leftovers() {
  sleep 0.5
  if pgrep -f "$tmp/tp2.json" >/dev/null 2>&1; then
    fail "$1: ranks still running after the run ended: $(pgrep -af "$tmp/tp2.json")"
    pgrep -f "$tmp/tp2.json" | xargs -r kill -KILL 2>/dev/null
  fi
}

# The healthy run first: the faults below are what makes the others fail.
expect 0 "done: 6 steps" -- timeout 60 $mpengine run --backend cpu --config "$tmp/tp2.json"

# A rank dies (SIGKILL before step 3), with the default --comm-timeout of 300 s: mpirun ends the
# job and the launcher names the lost rank.
timed "rank 1 killed" 30 1 "rank 1: MPENGINE_FAULT: SIGKILL before step 3" \
  "mpengine run: rank 1 was lost: its process died (signal 9)" -- \
  timeout 60 env MPENGINE_FAULT=kill:1:3 $mpengine run --backend cpu --config "$tmp/tp2.json"
no_leftovers "rank 1 killed"
timed "rank 0 killed" 30 1 "mpengine run: rank 0 was lost: its process died (signal 9)" -- \
  timeout 60 env MPENGINE_FAULT=kill:0:2 $mpengine run --backend cpu --config "$tmp/tp2.json"
no_leftovers "rank 0 killed"
# Open MPI 5's launcher (PRRTE) words its report "prterun noticed ..."; and whatever mpirun
# prints, or if it prints nothing, the ranks' own word names the lost one: an mpirun whose report
# is reworded, and one whose report is dropped.
cat > "$tmp/mpirun-prrte" <<'SH'
#!/usr/bin/env bash
mpirun "$@" 2> >(sed -u 's/^mpirun noticed/prterun noticed/' >&2)
SH
cat > "$tmp/mpirun-silent" <<'SH'
#!/usr/bin/env bash
mpirun "$@" 2> >(grep --line-buffered -v 'noticed that process rank' >&2)
SH
chmod +x "$tmp/mpirun-prrte" "$tmp/mpirun-silent"
timed "rank 1 killed, PRRTE's words" 30 1 "mpengine run: rank 1 was lost: its process died (signal 9)" -- \
  timeout 60 env MPENGINE_FAULT=kill:1:3 $mpengine run --backend cpu --config "$tmp/tp2.json" --mpirun "$tmp/mpirun-prrte"
no_leftovers "rank 1 killed, PRRTE's words"
timed "rank 1 killed, no report from mpirun" 30 1 \
  "mpengine run: rank 1 was lost: its process ended without a word from mpengine (killed by a signal, or crashed)" -- \
  timeout 60 env MPENGINE_FAULT=kill:1:3 $mpengine run --backend cpu --config "$tmp/tp2.json" --mpirun "$tmp/mpirun-silent"
no_leftovers "rank 1 killed, no report from mpirun"

# The same with a real kill -9 from outside, while the run trains: rank 1's process is found by
# its OMPI_COMM_WORLD_RANK. (--log-every 1: the wait reads step 2's line.)
rank_pid() { # rank_pid RANK: the pid of that rank of this test's run, or nothing
  local p
  for p in $(pgrep -f "$tmp/tp2.json"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"
      return
    fi
  done
}
timeout 60 $mpengine run --backend cpu --config "$tmp/tp2.json" --steps 1000000 --log-every 1 \
  > "$tmp/kill9.log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 100); do
  victim=$(rank_pid 1)
  if [ -n "$victim" ] && grep -q "step 2/" "$tmp/kill9.log"; then break; fi
  sleep 0.2
done
if [ -z "$victim" ]; then
  fail "kill -9: rank 1 never started"
  kill "$launcher" 2>/dev/null
  wait "$launcher"
else
  start=$(date +%s.%N)
  kill -9 "$victim"
  wait "$launcher"
  code=$?
  end=$(date +%s.%N)
  [ "$code" -eq 1 ] || fail "kill -9 of rank 1: exit $code, want 1; log $(cat "$tmp/kill9.log")"
  grep -qF "mpengine run: rank 1 was lost: its process died (signal 9)" "$tmp/kill9.log" ||
    fail "kill -9 of rank 1: no line naming the lost rank; log: $(tail -5 "$tmp/kill9.log")"
  awk -v a="$start" -v b="$end" 'BEGIN { exit !(b - a < 30) }' ||
    fail "kill -9 of rank 1: the run ended $(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') s after the kill, want < 30 s"
fi
no_leftovers "kill -9 of rank 1"

# A rank hangs before step 3: rank 0 waits in the tensor-parallel all-reduce, times out after
# 2 s and exits 1; mpirun then ends the hung rank.
timeout_error="rank 0: pipeline rank 0, F micro-batch 0: tensor-parallel rank 0 of 2: all-reduce of"
timeout_peer="all-reduce in group tp (ranks 0,1) timed out after 2.0 s"
timed "rank 1 hung" 30 1 "$timeout_error" "$timeout_peer" -- \
  timeout 60 env MPENGINE_FAULT=hang:1:3 $mpengine run --backend cpu --config "$tmp/tp2.json" \
  --comm-timeout 2
no_leftovers "rank 1 hung"
timed "rank 1 hung, mpirun directly" 30 1 "$timeout_error" "$timeout_peer" -- \
  timeout 60 env MPENGINE_FAULT=hang:1:3 mpirun -np 2 --oversubscribe "${root[@]}" \
  $mpengine run --backend cpu --config "$tmp/tp2.json" --comm-timeout 2
no_leftovers "rank 1 hung, mpirun directly"

# A pipeline rank hangs: the next stage waits in its receive of micro-batch 0's activation, times
# out after 2 s naming the action, the group and the peer, and the run exits 1.
cat > "$tmp/pp2.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 1, "pp": 2, "tp": 1},
 "batch": {"global_batch": 2, "micro_batch": 1, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 6, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
timed "pipeline rank 0 hung" 30 1 "rank 1: pipeline rank 1, F micro-batch 0: " \
  "recv from rank 0 in group pp timed out after 2.0 s (4096 bytes); the peer may have died or hung" -- \
  timeout 60 env MPENGINE_FAULT=hang:0:3 $mpengine run --backend cpu --config "$tmp/pp2.json" \
  --comm-timeout 2
no_leftovers "pipeline rank 0 hung"

# Malformed values are input errors naming the variable (before any rank starts).
for bad in kill:1 boom:0:1 kill:-1:1 kill:0:0 kill:0:1x "hang: 0:1" kill::1; do
  expect 2 "MPENGINE_FAULT='$bad': expected kill:RANK:STEP or hang:RANK:STEP" -- \
    env MPENGINE_FAULT="$bad" $mpengine run --backend cpu --config "$tmp/tp2.json"
done

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "failure_test: all checks passed"
