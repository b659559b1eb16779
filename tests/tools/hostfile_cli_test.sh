#!/usr/bin/env bash
# tests/tools/hostfile_cli_test.sh — `mpengine run --hostfile` refuses a bad hostfile before any
# rank starts, exit 2 naming FILE:LINE and the fix: a malformed line, slots=0, a host twice, a
# host that does not resolve, fewer slots than the plan's ranks, slots that would split a tensor-
# parallel group across hosts; and --max-restarts without --checkpoint-dir. Needs no hosts: the
# checks run in the launcher (tools/hostfile.h).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/hostfile_cli
rm -rf "$tmp"
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cat > "$tmp/plan.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 2, "pp": 2, "tp": 2, "sequence_parallel": false},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 2, "learning_rate": 3e-3, "warmup_steps": 1}}
JSON
run() { "$mpengine" run --config "$tmp/plan.json" --hostfile "$@"; }

printf '# two hosts\nlocalhost slots=4\nlocalhost, slots=4\n' > "$tmp/malformed"
expect 2 "$tmp/malformed:3: 'localhost,' is not a host name" "HOST slots=N" -- run "$tmp/malformed"
printf 'localhost slots=4 gpus=4\n' > "$tmp/field"
expect 2 "$tmp/field:1: unknown field 'gpus=4'" -- run "$tmp/field"
printf 'localhost slots=8\n\nip6-localhost slots=0\n' > "$tmp/zero"
expect 2 "$tmp/zero:3: slots=0 for host ip6-localhost" -- run "$tmp/zero"
printf 'localhost slots=4\nlocalhost slots=4\n' > "$tmp/twice"
expect 2 "$tmp/twice:2: host localhost is named twice (first on line 1)" -- run "$tmp/twice"
printf 'localhost slots=4\nno-such-host.invalid slots=4\n' > "$tmp/unknown"
expect 2 "$tmp/unknown:2: host no-such-host.invalid does not resolve" -- run "$tmp/unknown"
printf 'localhost slots=6\n' > "$tmp/few"
expect 2 "$tmp/few:1: the hosts have 6 slots in whole tp groups of 2, fewer than the plan's 8 ranks" \
  -- run "$tmp/few"
printf 'localhost slots=5\n127.0.0.1 slots=3\n' > "$tmp/split"
expect 2 "$tmp/split:1: host localhost has slots=5, which does not hold whole tensor-parallel groups of tp 2" \
  "give localhost a multiple of 2 slots" -- run "$tmp/split"
expect 2 "--hostfile $tmp/missing: cannot open it" -- run "$tmp/missing"
printf 'localhost slots=8\n' > "$tmp/good"
expect 2 "--max-restarts 1: a restart resumes from the latest checkpoint, so it needs --checkpoint-dir DIR" \
  -- run "$tmp/good" --max-restarts 1

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
