#!/usr/bin/env bash
# tests/tools/hf_llama_checkpoint_test.sh — Llama-family Hugging Face checkpoints through the CLI
# (issue 16): the LlamaForCausalLM and Qwen2ForCausalLM goldens of tools/bench/hf_llama_golden.py
# are imported (`mpengine import`) and trained from (`run --init-from HF_DIR`, each rank reading
# its own slices) on the golden's token shard, whose 4 samples are step 1's global batch: at
# (dp, pp, tp) = (1,1,1), (2,1,1), (1,2,1), (1,1,2), (2,2,2), pp = 2 zb-h1 and pp = 2 interleaved
# (Qwen2's one kv head allows tp = 1 only) step 1's loss is transformers' own on that batch
# (golden.json's float64 shard_loss) within 1e-5 relative; a checkpoint after that step, at a
# learning rate too small to move any weight (1e-30), exports (`export --format hf`) to exactly
# transformers' model.safetensors, byte for byte, with a config.json of the same architecture,
# which loads back to the same loss; a (dp, pp, tp) = (2, 2, 2) checkpoint resumes on one rank. The
# refusals: kv_heads that tp does not divide (at plan time, naming both), --save-weights of a
# Llama-family model (llm.c files hold GPT-2, refused before training), a config.json of another
# model (naming the key).
#
# Runs as root and with more ranks than cores (mpengine adds --allow-run-as-root and
# --oversubscribe itself); one BLAS thread per rank.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/engine/testdata}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/hf_llama_checkpoint
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

plan() { # plan FILE MODEL DP PP TP [SCHEDULE [VIRTUAL]]
  cat > "$1" <<JSON
{"model": "$2", "parallel": {"dp": $3, "pp": $4, "tp": $5, "virtual_stages": ${7:-1}},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": $((2 / $3)), "seq_len": 16},
 "schedule": "${6:-1f1b}",
 "training": {"steps": 1, "learning_rate": 1e-30, "weight_decay": 0}}
JSON
}

# step1_loss METRICS: the loss of the first line.
step1_loss() { awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$1" 2> /dev/null; }

check_model() { # check_model NAME ARCHITECTURE LAYOUTS... (each DPxPPxTP[:SCHEDULE[:V]])
  local name=$1 architecture=$2
  shift 2
  local golden=$testdata/$name model=$tmp/$name.json
  local hf_loss
  hf_loss=$(awk -F': ' '/"shard_loss"/ { sub(",", "", $2); print $2 }' "$golden/golden.json")
  expect 0 "mpengine import: wrote $model: $name ($architecture" -- \
    $mpengine import "$golden" --out "$model" --seq-len 16
  for spec in "$@"; do
    local layout=${spec%%:*} schedule="" v=""
    [ "$spec" = "$layout" ] || { schedule=${spec#*:}; v=${schedule#*:}; schedule=${schedule%%:*}; }
    [ "$v" != "$schedule" ] || v=""
    local dp=${layout%%x*} rest=${layout#*x}
    local pp=${rest%x*} tp=${rest#*x}
    layout=${spec//:/-}
    plan "$tmp/$name-$layout.json" "$model" "$dp" "$pp" "$tp" "${schedule:-1f1b}" "${v:-1}"
    rm -rf "$tmp/ck-$name-$layout"
    expect 0 "initialised from $golden" -- \
      $mpengine run --config "$tmp/$name-$layout.json" --init-from "$golden" --data "$golden/shard.bin" \
      --metrics "$tmp/$name-$layout.jsonl" --checkpoint-dir "$tmp/ck-$name-$layout"
    local loss
    loss=$(step1_loss "$tmp/$name-$layout.jsonl")
    if ! awk -v a="${loss:-nan}" -v b="${hf_loss:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b > 0 && d <= 1e-5 * b) }'; then
      fail "$name $spec: step 1 loss ${loss:-none}, transformers' ${hf_loss:-none} (want within 1e-5 relative)"
    fi
    rm -rf "$tmp/export-$name-$layout"
    expect 0 "(Hugging Face checkpoint: config.json and safetensors, fp32)" -- \
      $mpengine export --checkpoint "$tmp/ck-$name-$layout" --format hf --out "$tmp/export-$name-$layout"
    cmp -s "$tmp/export-$name-$layout/model.safetensors" "$golden/model.safetensors" ||
      fail "$name $spec: the exported model.safetensors differs from transformers'"
    grep -q "\"architectures\":.*\"$architecture\"" "$tmp/export-$name-$layout/config.json" ||
      fail "$name: the exported config.json is not $architecture's: $(cat "$tmp/export-$name-$layout/config.json")"
    echo "$name $spec: step 1 loss $loss (transformers $hf_loss), export identical to transformers'"
  done
  # The export loads back: its config.json is this model's, its tensors the run's.
  expect 0 "initialised from $tmp/export-$name-1x1x1" -- \
    $mpengine run --config "$tmp/$name-1x1x1.json" --init-from "$tmp/export-$name-1x1x1" \
    --data "$golden/shard.bin" --metrics "$tmp/$name-back.jsonl"
  [ "$(step1_loss "$tmp/$name-back.jsonl")" = "$(step1_loss "$tmp/$name-1x1x1.jsonl")" ] ||
    fail "$name: the export loads back to loss $(step1_loss "$tmp/$name-back.jsonl"), not $(step1_loss "$tmp/$name-1x1x1.jsonl")"
}

check_model hf_tiny_llama3 LlamaForCausalLM 1x1x1 2x1x1 1x2x1 1x1x2 2x2x2 1x2x1:zb-h1 \
  1x2x1:interleaved-1f1b:2
check_model hf_tiny_qwen2 Qwen2ForCausalLM 1x1x1 2x1x1 1x2x1 1x2x1:zb-h1

# Resharding: a (dp, pp, tp) = (2, 2, 2) checkpoint after step 1 of 2 (a real learning rate)
# resumes on one rank to the uninterrupted one-rank run's step-2 loss.
for layout in 1x1x1 2x2x2; do
  sed 's/"steps": 1, "learning_rate": 1e-30, "weight_decay": 0/"steps": 2, "learning_rate": 1e-3/' \
    "$tmp/hf_tiny_llama3-$layout.json" > "$tmp/train-$layout.json"
done
rm -rf "$tmp/ck-train"
expect 0 "done: 2 steps" -- $mpengine run --config "$tmp/train-1x1x1.json" --init-from "$testdata/hf_tiny_llama3" --metrics "$tmp/train-serial.jsonl"
expect 0 "done: 2 steps" -- $mpengine run --config "$tmp/train-2x2x2.json" --init-from "$testdata/hf_tiny_llama3" --checkpoint-dir "$tmp/ck-train" --save-every 1
rm -rf "$tmp/ck-train/step-2"
expect 0 "resumed from $tmp/ck-train/step-1: 1 of 2 steps done" -- \
  $mpengine run --config "$tmp/train-1x1x1.json" --checkpoint-dir "$tmp/ck-train" --resume --metrics "$tmp/train-resumed.jsonl"
serial=$(awk -F'"loss": ' 'NR == 2 { split($2, a, ","); print a[1] }' "$tmp/train-serial.jsonl")
resumed=$(step1_loss "$tmp/train-resumed.jsonl")
awk -v a="${resumed:-nan}" -v b="${serial:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b > 0 && d <= 1e-5 * b) }' ||
  fail "a (2, 2, 2) checkpoint resumed on one rank: step 2 loss ${resumed:-none}, the uninterrupted run's ${serial:-none}"

# Refusals.
expect 2 "--tp 4 does not divide the 2 kv heads of model tiny-llama" -- \
  $mpengine plan examples/models/tiny-llama.json --gpus 4 --tp 4
expect 2 "--save-weights $tmp/w.bin: llm.c's files hold GPT-2 models, and $tmp/hf_tiny_llama3.json is a Llama-family model; save a checkpoint (--checkpoint-dir) and write it as a Hugging Face checkpoint with mpengine export --format hf" -- \
  $mpengine run --config "$tmp/hf_tiny_llama3-1x1x1.json" --save-weights "$tmp/w.bin"
[ ! -e "$tmp/w.bin" ] || fail "--save-weights of a Llama-family model wrote $tmp/w.bin"
expect 2 "$testdata/hf_tiny_qwen2/config.json: num_key_value_heads is 1 in the checkpoint but 2 in the model description ($tmp/hf_tiny_llama3.json)" -- \
  $mpengine run --config "$tmp/hf_tiny_llama3-1x1x1.json" --init-from "$testdata/hf_tiny_qwen2"

if [ "$failures" -ne 0 ]; then
  echo "hf_llama_checkpoint_test: $failures failure(s)"
  exit 1
fi
echo "hf_llama_checkpoint_test: all passed"
