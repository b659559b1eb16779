#!/usr/bin/env bash
# tests/tools/moe_hf_checkpoint_test.sh — mixture-of-experts Hugging Face checkpoints through the
# CLI (issue 33): the MixtralForCausalLM and Qwen2MoeForCausalLM goldens of
# tools/bench/moe_model_golden.py are imported (`mpengine import`) and trained from
# (`run --init-from HF_DIR`, each rank reading only its tensors' bytes) on the golden's token
# shard, whose 4 samples are step 1's one micro-batch: at (dp, pp, tp) = (1,1,1), (1,2,1) and
# (1,1,2) (with sequence parallelism) step 1's loss is transformers' own, cross-entropy plus
# router_aux_loss_coef x the load-balancing loss (golden.json's float64 shard_loss), within 1e-5
# relative; a checkpoint after that step, at a learning rate too small to move any weight
# (1e-30), exports (`export --format hf`) to exactly transformers' model.safetensors, byte for
# byte, with a config.json of the same architecture, which loads back to the same loss. At dp 2 x
# ep 2 (expert parallelism: each rank reads and holds half of the experts) the same export is
# transformers' bytes too. Routing ties (zero routers) at dp 2 x ep 2 equal one rank (below).
# (One micro-batch: the auxiliary loss is per micro-batch, transformers' over its whole batch.)
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/engine/testdata}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/moe_hf_checkpoint
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

plan() { # plan FILE MODEL PP TP LAYERS_PER_STAGE
  cat > "$1" <<JSON
{"model": "$2", "parallel": {"dp": 1, "pp": $3, "tp": $4, "sequence_parallel": $([ "$4" = 1 ] && echo false || echo true)},
 "layers_per_stage": $5,
 "batch": {"global_batch": 4, "micro_batch": 4, "num_micro_batches": 1, "seq_len": 16},
 "schedule": "1f1b",
 "training": {"steps": 1, "learning_rate": 1e-30, "weight_decay": 0}}
JSON
}

step1_loss() { awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$1" 2> /dev/null; }

check_model() { # check_model NAME ARCHITECTURE LAYERS LAYOUTS... (each PPxTP)
  local name=$1 architecture=$2 layers=$3
  shift 3
  local golden=$testdata/$name model=$tmp/$name.json
  local hf_loss
  hf_loss=$(awk -F': ' '/"shard_loss"/ { sub(",", "", $2); print $2 }' "$golden/golden.json")
  expect 0 "mpengine import: wrote $model: $name ($architecture" -- \
    $mpengine import "$golden" --out "$model" --seq-len 16
  for layout in "$@"; do
    local pp=${layout%x*} tp=${layout#*x} stages="[$layers]"
    # pp 2: the embedding and the first block, then the rest.
    [ "$pp" = 2 ] && stages="[2, $((layers - 2))]"
    plan "$tmp/$name-$layout.json" "$model" "$pp" "$tp" "$stages"
    rm -rf "$tmp/ck-$name-$layout"
    expect 0 "initialised from $golden" -- \
      $mpengine run --config "$tmp/$name-$layout.json" --init-from "$golden" --data "$golden/shard.bin" \
      --metrics "$tmp/$name-$layout.jsonl" --checkpoint-dir "$tmp/ck-$name-$layout" --backend cpu
    local loss
    loss=$(step1_loss "$tmp/$name-$layout.jsonl")
    if ! awk -v a="${loss:-nan}" -v b="${hf_loss:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b > 0 && d <= 1e-5 * b) }'; then
      fail "$name $layout: step 1 loss ${loss:-none}, transformers' ${hf_loss:-none} (want within 1e-5 relative)"
    fi
    rm -rf "$tmp/export-$name-$layout"
    expect 0 "(Hugging Face checkpoint: config.json and safetensors, fp32)" -- \
      $mpengine export --checkpoint "$tmp/ck-$name-$layout" --format hf --out "$tmp/export-$name-$layout"
    cmp -s "$tmp/export-$name-$layout/model.safetensors" "$golden/model.safetensors" ||
      fail "$name $layout: the exported model.safetensors differs from transformers'"
    grep -q "\"architectures\":.*\"$architecture\"" "$tmp/export-$name-$layout/config.json" ||
      fail "$name: the exported config.json is not $architecture's: $(cat "$tmp/export-$name-$layout/config.json")"
    echo "$name $layout: step 1 loss $loss (transformers $hf_loss), export identical to transformers'"
  done
  # Expert parallelism: at dp 2 x ep 2 each rank reads only its half of the experts' bytes
  # (--init-from), and the checkpoint, which gathers them back, exports to transformers' bytes.
  plan "$tmp/$name-ep2.json" "$model" 1 1 "[$layers]"
  sed -i 's/"dp": 1,/"dp": 2, "ep": 2,/; s/"micro_batch": 4/"micro_batch": 2/' "$tmp/$name-ep2.json"
  rm -rf "$tmp/ck-$name-ep2" "$tmp/export-$name-ep2"
  expect 0 "initialised from $golden" -- \
    $mpengine run --config "$tmp/$name-ep2.json" --init-from "$golden" --data "$golden/shard.bin" \
    --checkpoint-dir "$tmp/ck-$name-ep2" --backend cpu
  expect 0 "(Hugging Face checkpoint: config.json and safetensors, fp32)" -- \
    $mpengine export --checkpoint "$tmp/ck-$name-ep2" --format hf --out "$tmp/export-$name-ep2"
  cmp -s "$tmp/export-$name-ep2/model.safetensors" "$golden/model.safetensors" ||
    fail "$name dp 2 x ep 2: the exported model.safetensors differs from transformers'"
  expect 0 "initialised from $tmp/export-$name-1x1" -- \
    $mpengine run --config "$tmp/$name-1x1.json" --init-from "$tmp/export-$name-1x1" \
    --data "$golden/shard.bin" --metrics "$tmp/$name-back.jsonl" --backend cpu
  [ "$(step1_loss "$tmp/$name-back.jsonl")" = "$(step1_loss "$tmp/$name-1x1.jsonl")" ] ||
    fail "$name: the export loads back to loss $(step1_loss "$tmp/$name-back.jsonl"), not $(step1_loss "$tmp/$name-1x1.jsonl")"
}

# Layers of the chain: the embedding, the blocks, the final norm, the head.
check_model hf_tiny_mixtral MixtralForCausalLM 5 1x1 2x1 1x2
check_model hf_tiny_qwen2_moe Qwen2MoeForCausalLM 6 1x1 2x1 1x2

# Routing ties: the tiny Mixtral with every router weight zero gives every token the same
# probability for each of its 4 experts, so step 1's top 2 is a four-way tie for every token,
# broken to the lowest indices (experts 0 and 1; 2 and 3 get no token). Three steps at dp 2 x ep 2
# equal the one-rank run's within 1e-5 relative (the router learns from step 1's gradient, so
# later steps route for real).
tied=$tmp/hf_tied_mixtral
rm -rf "$tied" && mkdir -p "$tied"
cp "$testdata/hf_tiny_mixtral/config.json" "$testdata/hf_tiny_mixtral/shard.bin" "$tied/"
python3 - "$testdata/hf_tiny_mixtral/model.safetensors" "$tied/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
header_bytes = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + header_bytes])
body = bytearray(data[8 + header_bytes:])
routers = [name for name in header if name.endswith("block_sparse_moe.gate.weight")]
assert routers, "no router tensors"
for name in routers:
    begin, end = header[name]["data_offsets"]
    body[begin:end] = bytes(end - begin)
open(sys.argv[2], "wb").write(data[:8 + header_bytes] + bytes(body))
print("zeroed", len(routers), "routers")
PY
tie_plan() { # tie_plan FILE DP EP MICRO
  cat > "$1" <<JSON
{"model": "hf_tiny_mixtral.json", "parallel": {"dp": $2, "ep": $3, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": $4, "num_micro_batches": $((4 / ($2 * $4))), "seq_len": 16},
 "schedule": "1f1b", "training": {"steps": 3, "learning_rate": 1e-2, "warmup_steps": 0}}
JSON
}
tie_plan "$tmp/tie-one.json" 1 1 2  # the same micro-batches: the aux loss is per micro-batch
tie_plan "$tmp/tie-ep2.json" 2 2 2
for name in tie-one tie-ep2; do
  expect 0 "done: 3 steps" -- $mpengine run --config "$tmp/$name.json" --init-from "$tied" \
    --data "$tied/shard.bin" --metrics "$tmp/$name.jsonl" --backend cpu
done
verdict=$(paste -d' ' <(awk -F'"loss": ' '{ split($2, a, ","); print a[1] }' "$tmp/tie-one.jsonl") \
                      <(awk -F'"loss": ' '{ split($2, a, ","); print a[1] }' "$tmp/tie-ep2.jsonl") | awk '
  { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
  END { printf "%s %d %.3g", (n == 3 && worst <= 1e-5 ? "ok" : "bad"), n, worst }')
if [ "${verdict%% *}" = ok ]; then
  echo "routing ties (zero routers): dp 2 x ep 2 equals one rank over 3 steps, worst loss difference ${verdict##* } relative"
else
  fail "routing ties (zero routers): dp 2 x ep 2 against one rank: steps and worst difference ${verdict#* } (want 3 steps within 1e-5)"
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
