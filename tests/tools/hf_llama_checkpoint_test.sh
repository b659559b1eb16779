#!/usr/bin/env bash
# tests/tools/hf_llama_checkpoint_test.sh — Llama-family Hugging Face checkpoints through the CLI
# (issue 16): the LlamaForCausalLM and Qwen2ForCausalLM goldens of tools/bench/hf_llama_golden.py
# are imported (`mpengine import`), trained from (`run --init-from HF_DIR`) at one rank, pp = 2,
# tp = 2 and pp = 2 x tp = 2 (each rank reading its own slices; Qwen2's one kv head allows tp = 1
# only), and a checkpoint after a step at a learning rate too small to move any weight (1e-30)
# exports (`export --format hf`) to exactly transformers' model.safetensors, byte for byte, with
# a config.json of the same architecture; every layout's step-1 loss is the one-rank run's. The
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

plan() { # plan FILE MODEL PP TP
  cat > "$1" <<JSON
{"model": "$2", "parallel": {"dp": 1, "pp": $3, "tp": $4},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-30, "weight_decay": 0}}
JSON
}

# step1_loss METRICS: the loss of the first line.
step1_loss() { awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$1" 2> /dev/null; }

check_model() { # check_model NAME ARCHITECTURE LAYOUTS...
  local name=$1 architecture=$2
  shift 2
  local golden=$testdata/$name model=$tmp/$name.json
  expect 0 "mpengine import: wrote $model: $name ($architecture" -- \
    $mpengine import "$golden" --out "$model" --seq-len 16
  local reference=""
  for layout in "$@"; do
    local pp=${layout%x*} tp=${layout#*x}
    plan "$tmp/$name-$layout.json" "$model" "$pp" "$tp"
    rm -rf "$tmp/ck-$name-$layout"
    expect 0 "initialised from $golden" -- \
      $mpengine run --config "$tmp/$name-$layout.json" --init-from "$golden" \
      --metrics "$tmp/$name-$layout.jsonl" --checkpoint-dir "$tmp/ck-$name-$layout"
    local loss
    loss=$(step1_loss "$tmp/$name-$layout.jsonl")
    if [ -z "$reference" ]; then reference=$loss; fi
    if ! awk -v a="${loss:-nan}" -v b="$reference" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && d <= 1e-5 * b) }'; then
      fail "$name (pp, tp) = ($pp, $tp): step 1 loss ${loss:-none}, one rank's $reference"
    fi
    rm -rf "$tmp/export-$name-$layout"
    expect 0 "(Hugging Face checkpoint: config.json and safetensors, fp32)" -- \
      $mpengine export --checkpoint "$tmp/ck-$name-$layout" --format hf --out "$tmp/export-$name-$layout"
    cmp -s "$tmp/export-$name-$layout/model.safetensors" "$golden/model.safetensors" ||
      fail "$name (pp, tp) = ($pp, $tp): the exported model.safetensors differs from transformers'"
    grep -q "\"architectures\":.*\"$architecture\"" "$tmp/export-$name-$layout/config.json" ||
      fail "$name: the exported config.json is not $architecture's: $(cat "$tmp/export-$name-$layout/config.json")"
    echo "$name (pp, tp) = ($pp, $tp): step 1 loss $loss, export identical to transformers'"
  done
  # The export loads back: its config.json is this model's, its tensors the run's.
  expect 0 "initialised from $tmp/export-$name-1x1" -- \
    $mpengine run --config "$tmp/$name-1x1.json" --init-from "$tmp/export-$name-1x1" --metrics "$tmp/$name-back.jsonl"
  [ "$(step1_loss "$tmp/$name-back.jsonl")" = "$reference" ] ||
    fail "$name: the export loads back to loss $(step1_loss "$tmp/$name-back.jsonl"), not $reference"
}

check_model hf_tiny_llama3 LlamaForCausalLM 1x1 2x1 1x2 2x2
check_model hf_tiny_qwen2 Qwen2ForCausalLM 1x1 2x1

# Refusals.
expect 2 "--tp 4 does not divide the 2 kv heads of model tiny-llama" -- \
  $mpengine plan examples/models/tiny-llama.json --gpus 4 --tp 4
expect 2 "--save-weights $tmp/w.bin: llm.c's files hold GPT-2 models, and $tmp/hf_tiny_llama3.json is a Llama-family model; save a checkpoint (--checkpoint-dir) and write it as a Hugging Face checkpoint with mpengine export --format hf" -- \
  $mpengine run --config "$tmp/hf_tiny_llama3-1x1.json" --save-weights "$tmp/w.bin"
[ ! -e "$tmp/w.bin" ] || fail "--save-weights of a Llama-family model wrote $tmp/w.bin"
expect 2 "$testdata/hf_tiny_qwen2/config.json: num_key_value_heads is 1 in the checkpoint but 2 in the model description ($tmp/hf_tiny_llama3.json)" -- \
  $mpengine run --config "$tmp/hf_tiny_llama3-1x1.json" --init-from "$testdata/hf_tiny_qwen2"

if [ "$failures" -ne 0 ]; then
  echo "hf_llama_checkpoint_test: $failures failure(s)"
  exit 1
fi
echo "hf_llama_checkpoint_test: all passed"
