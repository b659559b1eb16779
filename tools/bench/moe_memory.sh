#!/usr/bin/env bash
# tools/bench/moe_memory.sh — expert parallelism's memory per rank (issue 33): an MoE model whose
# experts dominate its state (16 experts of 3 x 128 x 512 in each of 4 blocks: 12.6 M of its
# 13.0 M parameters), planned at dp 4 with ep fixed (1, 2, 4) on cpu-local with 6 GiB per rank,
# one step. Prints every rank's peak resident memory (VmHWM, run's memory line) beside the plan's
# prediction, the target peak <= 1.15 x prediction + 200 MiB, and the state ep saves: the drop of
# the ranks' peak from ep 1 against the drop the plan predicts (fp32 weights, gradients and two
# AdamW moments of the experts a rank no longer holds: 16 bytes a parameter).
#
#   tools/bench/moe_memory.sh                 # after `bazel build //tools:mpengine`
#   EPS="1 2 4" tools/bench/moe_memory.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${MPENGINE:-bazel-bin/tools/mpengine}
read -r -a eps <<< "${EPS:-1 2 4}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-moe-memory.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > "$tmp/cluster.json" <<'JSON'
{"name": "cpu-local-6g", "device": "CPU process", "nodes": 1, "devices_per_node": 4096,
 "device_memory_gib": 6, "memory_bandwidth_gbytes_per_s": 10, "peak_tflops": {"fp32": 0.05},
 "intra_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2},
 "inter_node": {"bandwidth_gbytes_per_s": 5, "latency_us": 2}}
JSON
cat > "$tmp/model.json" <<'JSON'
{"name": "moe-16x512", "vocab_size": 512, "seq_len": 64,
 "layers": [
  {"type": "embedding", "hidden": 128, "max_positions": 0},
  {"type": "transformer", "hidden": 128, "heads": 4, "kv_heads": 2, "norm": "rmsnorm",
   "activation": "swiglu", "bias": false, "rope_theta": 10000, "repeat": 4,
   "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 512, "aux_loss_coeff": 0.01}},
  {"type": "layernorm", "hidden": 128, "norm": "rmsnorm"},
  {"type": "lm_head", "hidden": 128, "tie_embedding": false}]}
JSON

# run EP: plans dp 4 at that ep, trains one step; prints "rank peak_mib predicted_mib" lines.
run() {
  local ep=$1 plan=$tmp/plan-$1.json
  "$bin" plan "$tmp/model.json" --gpus 4 --cluster "$tmp/cluster.json" --dp 4 --ep "$ep" \
    --pp 1 --tp 1 --micro-batch 2 --global-batch 8 --schedule 1f1b --virtual-stages 1 \
    --recompute none --sequence-parallel off --zero 0 --out "$plan" > /dev/null 2>&1 ||
    { echo "plan failed at ep $ep" >&2; return 1; }
  "$bin" run --config "$plan" --steps 1 > "$tmp/out" 2>&1 || { tail -5 "$tmp/out" >&2; return 1; }
  local predicted
  predicted=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["predicted"]["memory_bytes_per_pp_rank"][0] / 1048576))' "$plan")
  grep '^memory: peak resident' "$tmp/out" | grep -o 'rank [0-9]* ([^)]*) [0-9]* MiB' |
    awk -v p="$predicted" '{ print $2, $(NF - 1), p }'
}

"$bin" describe "$tmp/model.json" | grep -E "^parameters|active"
printf 'dp 4, micro-batch 2, one step on cpu-local (6 GiB per rank)\n'
printf '%3s %5s %9s %9s %-24s %s\n' ep rank "peak MiB" "plan MiB" "target" "saved vs ep 1: measured / planned MiB"
all_ok=1 peak1="" plan1=""
for ep in "${eps[@]}"; do
  run "$ep" > "$tmp/peaks" || exit 1
  max_peak=$(awk '{ print $2 }' "$tmp/peaks" | sort -n | tail -1)
  predicted=$(awk 'NR == 1 { print $3 }' "$tmp/peaks")
  if [ "$ep" = 1 ]; then peak1=$max_peak plan1=$predicted; fi
  while read -r rank peak predicted; do
    ok=yes
    [ "$peak" -le $((predicted * 115 / 100 + 200)) ] || { ok="no (> 1.15 x plan + 200)"; all_ok=0; }
    saved="-"
    [ -n "$peak1" ] && [ "$ep" != 1 ] && saved="$((peak1 - peak)) / $((plan1 - predicted))"
    printf '%3s %5s %9s %9s %-24s %s\n' "$ep" "$rank" "$peak" "$predicted" "$ok" "$saved"
  done < "$tmp/peaks"
done
[ $all_ok = 1 ] && echo "every rank within 1.15 x its prediction + 200 MiB" || echo "some rank over its target"
