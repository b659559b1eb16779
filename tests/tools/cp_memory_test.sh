#!/usr/bin/env bash
# tests/tools/cp_memory_test.sh — context parallelism divides a sequence's activation memory
# (issue 32): tiny-llama at a 2048-token sequence, one step on one rank and on cp = 4 ranks. Each
# cp rank's peak resident memory (VmHWM, run's memory line) above a process's own (the same
# layout at 64 tokens, whose activations are a few MiB: an MPI rank maps more libraries than a
# lone process) is at most 0.30 of the one-rank run's above its own: its
# tokens are a quarter of the sequence, its attention scores (B, heads, T/cp, T) a quarter of
# the whole's, and what it adds (the gathered keys and values of one block, the exchange's
# buffers) is small. The losses of the two runs agree within 1e-5 relative.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/cp_memory
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env
sed 's/"seq_len": 64/"seq_len": 2048/; s/"name": "tiny-llama"/"name": "tiny-llama-2k"/' \
  examples/models/tiny-llama.json > "$tmp/tiny-llama-2k.json"

plan() { # plan NAME CP SEQ_LEN
  cat > "$tmp/$1.json" <<JSON
{"model": "tiny-llama-2k.json", "cluster": "cpu-local",
 "parallel": {"dp": 1, "cp": $2, "pp": 1, "tp": 1},
 "batch": {"global_batch": 1, "micro_batch": 1, "num_micro_batches": 1, "seq_len": $3},
 "schedule": "1f1b", "recompute": "none", "training": {"steps": 1, "seed": 5}}
JSON
}
# peaks NAME: the MiB of every rank's VmHWM from its run's memory line, one per line.
peaks() { grep '^memory: peak resident' "$tmp/$1.log" | grep -o ') [0-9]* MiB' | tr -dc '0-9\n'; }
run() {
  if ! $mpengine run --config "$tmp/$1.json" --metrics "$tmp/$1.jsonl" --overwrite-metrics \
       > "$tmp/$1.log" 2>&1 || [ -z "$(peaks "$1")" ]; then
    fail "$1: the run failed or printed no memory line:"; tail -5 "$tmp/$1.log"
  fi
}
plan one-base 1 64
plan cp4-base 4 64
plan one 1 2048
plan cp4 4 2048
for name in one-base cp4-base one cp4; do run $name; done
one_base=$(peaks one-base | head -1)
cp4_base=$(peaks cp4-base | sort -n | tail -1)
one=$(peaks one | head -1)
for rank_peak in $(peaks cp4); do
  verdict=$(awk -v ob="$one_base" -v cb="$cp4_base" -v o="$one" -v c="$rank_peak" \
    'BEGIN { r = (c - cb) / (o - ob); printf "%s %.3f", (o > ob && r <= 0.30 ? "ok" : "bad"), r }')
  echo "cp 4 rank: $rank_peak MiB ($cp4_base at 64 tokens); one rank: $one MiB ($one_base at 64 tokens): ${verdict#* } of the one rank's activations"
  [ "${verdict%% *}" = ok ] || fail "a cp rank holds more than 0.30 of the one-rank run's activation memory (${verdict#* })"
done
[ "$(peaks cp4 | wc -l)" -eq 4 ] || fail "cp4: want 4 ranks' peaks"
loss() { awk -F'"loss": ' '{ split($2, a, ","); print a[1] }' "$tmp/$1.jsonl"; }
awk -v a="$(loss one)" -v b="$(loss cp4)" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d / a <= 1e-5) }' ||
  fail "the losses differ: one rank $(loss one), cp 4 $(loss cp4)"
if [ $failures -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "cp_memory_test: all checks passed"
