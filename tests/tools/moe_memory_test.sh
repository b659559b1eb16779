#!/usr/bin/env bash
# tests/tools/moe_memory_test.sh — expert parallelism divides the experts' state (issue 33):
# tools/bench/moe_memory.sh trains one step of a 16-expert model (12.6 M of its 12.9 M parameters
# in experts) at dp 4 with ep 1, 2 and 4. Every rank's peak resident memory must be within 1.15 x
# the plan's prediction + 200 MiB, and what ep saves against ep 1 (measured per rank) within 15%
# of what the plan says it saves: the fp32 weights, gradients and two AdamW moments of the experts
# a rank no longer holds (ep 2: half of them, 96 MiB; ep 4: three quarters, 144 MiB). Holding every
# expert on every rank saves nothing and fails.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
bench=${2:-tools/bench/moe_memory.sh}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env
# AddressSanitizer (tools/test_asan.sh): freed blocks would stay resident in its quarantine.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
mpengine=$(cd "$(dirname "$mpengine")" && pwd)/$(basename "$mpengine")
out=$(MPENGINE=$mpengine "$bench" 2>&1)
code=$?
echo "$out"
[ $code = 0 ] || fail "moe_memory.sh exited $code"
grep -q "^every rank within 1.15 x its prediction + 200 MiB" <<<"$out" ||
  fail "some rank's peak is over 1.15 x its prediction + 200 MiB"
# Rows "EP RANK PEAK PLAN yes SAVED / PLANNED" of ep 2 and 4: the saving within 15% of the plan's.
verdict=$(awk '$1 ~ /^[24]$/ && $7 == "/" {
    rows++; s = $6 / $8; if (s < 0.85 || s > 1.15) bad = bad " ep " $1 " rank " $2 ": " $6 " of " $8 " MiB"
  } END { print rows + 0, (bad == "" ? "ok" : bad) }' <<<"$out")
[ "${verdict%% *}" = 8 ] || fail "want the ep 2 and ep 4 rows of all 4 ranks, got ${verdict%% *}"
[ "${verdict#* }" = ok ] || fail "what ep saves is not what the plan says:${verdict#* }"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS"
