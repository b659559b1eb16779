#!/usr/bin/env bash
# tools/bench/cp_memory.sh — context parallelism's memory per rank (issue 32): tiny-llama with a
# long sequence, planned with cp fixed (1 and 4) on cpu-local with 6 GiB per rank, one step; every
# rank's peak resident memory (VmHWM, run's memory line) beside the plan's prediction for it, the
# target peak <= 1.15 x prediction + 200 MiB, and each cp rank's activations (peak above a
# process's own, measured at 64 tokens) as a share of the one-rank run's.
#
#   tools/bench/cp_memory.sh                  # after `bazel build //tools:mpengine`
#   SEQS="4096 8192" CPS="1 2 4" tools/bench/cp_memory.sh
#
# The CPU attention keeps its probabilities, (B, heads, T / cp, T) floats a block, and its backward
# two more of that size as scratch: a one-rank run at 16,384 tokens needs about 16 GiB, so the
# default stops at 8192.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${MPENGINE:-bazel-bin/tools/mpengine}
read -r -a seqs <<< "${SEQS:-4096 8192}"
read -r -a cps <<< "${CPS:-1 4}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-cp-memory.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > "$tmp/cluster.json" <<'JSON'
{"name": "cpu-local-6g", "device": "CPU process", "nodes": 1, "devices_per_node": 4096,
 "device_memory_gib": 6, "memory_bandwidth_gbytes_per_s": 10, "peak_tflops": {"fp32": 0.05},
 "intra_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2},
 "inter_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2}}
JSON
max_seq=${seqs[-1]}
sed "s/\"seq_len\": 64/\"seq_len\": $max_seq/; s/\"name\": \"tiny-llama\"/\"name\": \"tiny-llama-long\"/" \
  examples/models/tiny-llama.json > "$tmp/model.json"

# run SEQ CP: plans the layout, trains one step; prints "rank peak_mib predicted_mib" lines.
run() {
  local seq=$1 cp=$2 plan=$tmp/plan-$1-$2.json
  "$bin" plan "$tmp/model.json" --gpus "$cp" --cluster "$tmp/cluster.json" --dp 1 --cp "$cp" \
    --pp 1 --tp 1 --micro-batch 1 --global-batch 1 --seq-len "$seq" --schedule 1f1b \
    --virtual-stages 1 --recompute none --sequence-parallel off --zero 0 --out "$plan" \
    > /dev/null || { echo "plan failed for seq $seq cp $cp" >&2; return 1; }
  "$bin" run --config "$plan" --steps 1 > "$tmp/out" 2>&1 || { tail -5 "$tmp/out" >&2; return 1; }
  local predicted
  predicted=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["predicted"]["memory_bytes_per_pp_rank"][0] / 1048576))' "$plan")
  grep '^memory: peak resident' "$tmp/out" | grep -o 'rank [0-9]* ([^)]*) [0-9]* MiB' |
    awk -v p="$predicted" '{ print $2, $(NF - 1), p }'
}

printf 'tiny-llama (4 heads over 2 kv heads, 2 blocks), micro-batch 1, one step on cpu-local (6 GiB per rank)\n'
printf '%6s %3s %5s %9s %9s %-22s %s\n' seq cp rank "peak MiB" "plan MiB" "target" "activations vs cp 1"
all_ok=1
for cp in "${cps[@]}"; do
  run 64 "$cp" > "$tmp/base-$cp" || exit 1
done
for seq in "${seqs[@]}"; do
  one=""
  for cp in "${cps[@]}"; do
    run "$seq" "$cp" > "$tmp/peaks" || exit 1
    base=$(awk '{ print $2 }' "$tmp/base-$cp" | sort -n | tail -1)
    while read -r rank peak predicted; do
      [ "$cp" = 1 ] && one=$((peak - base))
      ok=yes
      [ "$peak" -le $((predicted * 115 / 100 + 200)) ] || { ok="no (> 1.15 x plan + 200)"; all_ok=0; }
      share="-"
      [ -n "$one" ] && [ "$cp" != 1 ] && share=$(awk -v a=$((peak - base)) -v o="$one" 'BEGIN { printf "%.3f", a / o }')
      printf '%6s %3s %5s %9s %9s %-22s %s\n' "$seq" "$cp" "$rank" "$peak" "$predicted" "$ok" "$share"
    done < "$tmp/peaks"
  done
done
[ $all_ok = 1 ] && echo "every rank within 1.15 x its prediction + 200 MiB" || echo "some rank over its target"
