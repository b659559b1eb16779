#!/usr/bin/env bash
# tools/bench/data_memory.sh — data that never has to fit in memory (issue 31, item 2): `mpengine
# run` at dp 4 on a corpus of 2 billion tokens on disk and on one of 1 million, side by side:
# each rank's peak resident memory (VmHWM, run's memory line) and the time to the first step
# (run's start-up, which opens the data, plus the first step's own time).
#
# Targets: every rank's peak on the big corpus within 10% of the same rank's on the small one, and
# the time to the first step independent of the corpus size (the big corpus's within 1.5 x the
# small one's + 0.1 s). The loader before issue 31 read every shard whole and kept a permutation of
# every sample: 2 bytes a token and 8 a sample on every rank, printed below for comparison.
#
#   tools/bench/data_memory.sh              # after `bazel build //tools:mpengine`
#   TOKENS=4000000000 SHARD_TOKENS=200000000 RUNS=5 tools/bench/data_memory.sh
#
# The corpus is synthesised with `mpengine data synth` (shards of SHARD_TOKENS uint16 tokens, one
# seed each; about 3 s a shard of 100 million) in a temporary directory under TMPDIR that is
# removed at the end; it needs 2 bytes a token of free disk (4 GB for the default). The model is
# tiny-gpt (a few steps of global batch 8 x 64 tokens), so the peaks are the process's own memory
# plus whatever the data costs it.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${MPENGINE:-bazel-bin/tools/mpengine}
tokens=${TOKENS:-2000000000}
shard_tokens=${SHARD_TOKENS:-100000000}
small_tokens=${SMALL_TOKENS:-1000000}
steps=${STEPS:-5}
runs=${RUNS:-3}
dp=4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-data-memory.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
[ -x "$bin" ] || { echo "no $bin: run 'bazel build //tools:mpengine' first" >&2; exit 2; }

need_kib=$((tokens * 2 / 1024 + 1048576))
free_kib=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
if [ "$free_kib" -lt "$need_kib" ]; then
  echo "$tmp: $((free_kib / 1048576)) GiB free, the corpus needs $((need_kib / 1048576)) GiB; set TMPDIR or TOKENS" >&2
  exit 2
fi

# The corpora: vocabulary 128, tiny-gpt's.
began=$(date +%s.%N)
mkdir -p "$tmp/big" "$tmp/small"
"$bin" data synth --out "$tmp/small/train_000000.bin" --vocab 128 --tokens "$small_tokens" \
  --seed 1 > /dev/null || exit 1
shards=$(((tokens + shard_tokens - 1) / shard_tokens))
left=$tokens
for ((i = 0; i < shards; ++i)); do
  n=$((left < shard_tokens ? left : shard_tokens))
  "$bin" data synth --out "$tmp/big/train_$(printf %06d "$i").bin" --vocab 128 --tokens "$n" \
    --seed $((i + 1)) > /dev/null || exit 1
  left=$((left - n))
done
synth_s=$(echo "$(date +%s.%N) - $began" | bc)
big_bytes=$(du -sb "$tmp/big" | cut -f1)
printf 'corpora: %d tokens in %d shards (%.2f GB on disk, synthesised in %.0f s) and %d tokens in 1 shard\n' \
  "$tokens" "$shards" "$(echo "$big_bytes / 1000000000" | bc -l)" "$synth_s" "$small_tokens"

"$bin" plan examples/models/tiny-gpt.json --gpus $dp --cluster examples/clusters/cpu-local.json \
  --dp $dp --pp 1 --tp 1 --micro-batch 1 --global-batch 8 --seq-len 64 --schedule 1f1b \
  --virtual-stages 1 --recompute none --sequence-parallel off --zero 0 --out "$tmp/plan.json" \
  > "$tmp/plan.out" 2>&1 || { cat "$tmp/plan.out" >&2; exit 1; }

# measure NAME GLOB: RUNS runs; writes "rank peak_mib" lines (the largest peak over the runs) to
# $tmp/NAME.peaks and "startup_s first_step_s" lines (one a run) to $tmp/NAME.times.
measure() {
  local name=$1 glob=$2
  : > "$tmp/$name.times"
  : > "$tmp/$name.all-peaks"
  for ((r = 0; r < runs; ++r)); do
    local out=$tmp/$name.out
    if ! mpirun -np $dp --oversubscribe "$bin" run --config "$tmp/plan.json" --steps "$steps" \
        --data "$glob" > "$out" 2>&1; then
      echo "$name: mpengine run failed:" >&2
      tail -20 "$out" >&2
      return 1
    fi
    grep '^memory: peak resident' "$out" | grep -o 'rank [0-9]* ([^)]*) [0-9]* MiB' |
      awk '{ print $2, $(NF - 1) }' >> "$tmp/$name.all-peaks"
    local startup first_ms
    startup=$(sed -n 's/^time: start-up \([0-9.]*\) s.*/\1/p' "$out")
    first_ms=$(sed -n "s/^step 1\/$steps | .* | \([0-9.]*\) ms | .*/\1/p" "$out")
    echo "$startup $(echo "$first_ms / 1000" | bc -l)" >> "$tmp/$name.times"
    [ "$name" = big ] && grep '^data: ' "$out" > "$tmp/big.data-line"
  done
  sort -k1,1n -k2,2n "$tmp/$name.all-peaks" | awk '{ peak[$1] = $2 } END { for (r in peak) print r, peak[r] }' |
    sort -n > "$tmp/$name.peaks"
}
measure small "$tmp/small/*.bin" || exit 1
measure big "$tmp/big/*.bin" || exit 1
cat "$tmp/big.data-line"

# The median over the runs of start-up + first step, and its parts.
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
first_step() { awk '{ printf "%.4f\n", $1 + $2 }' "$tmp/$1.times" | median; }
startup() { awk '{ print $1 }' "$tmp/$1.times" | median; }
step1() { awk '{ print $2 }' "$tmp/$1.times" | median; }

printf '\ntiny-gpt at dp %d (mpirun -np %d, cpu), global batch 8 x 64 tokens, %d steps, %d runs each (peak: the largest, times: the median)\n' \
  $dp $dp "$steps" "$runs"
printf '%-6s %16s %16s %8s %s\n' rank "peak MiB 1M tok" "peak MiB $((tokens / 1000000))M" ratio "within 10%"
all_ok=1
while read -r rank small_mib; do
  big_mib=$(awk -v r="$rank" '$1 == r { print $2 }' "$tmp/big.peaks")
  ratio=$(echo "$big_mib / $small_mib" | bc -l)
  ok=$(echo "$ratio <= 1.10 && $ratio >= 0.90" | bc)
  [ "$ok" = 1 ] && ok=yes || { ok=no; all_ok=0; }
  printf '%-6s %16s %16s %8.3f %s\n' "$rank" "$small_mib" "$big_mib" "$ratio" "$ok"
done < "$tmp/small.peaks"
small_first=$(first_step small)
big_first=$(first_step big)
time_ok=$(echo "$big_first <= 1.5 * $small_first + 0.1" | bc)
[ "$time_ok" = 1 ] && time_ok=yes || { time_ok=no; all_ok=0; }
printf '%-26s %10s %10s\n' "time to the first step" "1M tok" "$((tokens / 1000000))M tok"
printf '%-26s %10.3f %10.3f\n' "  start-up (data, model) s" "$(startup small)" "$(startup big)"
printf '%-26s %10.3f %10.3f\n' "  first step s" "$(step1 small)" "$(step1 big)"
printf '%-26s %10.3f %10.3f   independent of the corpus (<= 1.5 x + 0.1 s): %s\n' "  total s" \
  "$small_first" "$big_first" "$time_ok"
samples=$(((tokens - 1) / 64))
printf 'the loader before issue 31 on the big corpus: %.2f GiB of tokens + %.0f MiB of permutation per rank\n' \
  "$(echo "$tokens * 2 / 1073741824" | bc -l)" "$(echo "$samples * 8 / 1048576" | bc -l)"
[ $all_ok = 1 ] && echo "targets met" || { echo "targets NOT met"; exit 1; }
