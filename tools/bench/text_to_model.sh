#!/usr/bin/env bash
# tools/bench/text_to_model.sh — the README's text-to-model path with its reference: tokenize the
# Debian fortunes with a committed tokenizer, plan fortune-gpt onto 2 CPU ranks, train, and
# compare mpengine's held-out loss on the val shard with transformers' loss on the same shard
# through the model `export --format hf` wrote (tools/bench/hf_shard_loss.py). The val shard holds
# exactly global batch x eval batches samples, so both losses average the same tokens.
#
#   tools/bench/text_to_model.sh [STEPS]        (needs V/bin/python with transformers 4.46.3:
#                                                 PYTHON=V/bin/python; docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-200}
python=${PYTHON:-/work/venv-golden/bin/python}
mpengine=${MPENGINE:-bazel-bin/tools/mpengine}
tokenizer=tests/engine/testdata/tokenizers/gpt2_style
fortunes=/usr/share/games/fortunes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
global_batch=8 seq_len=128 eval_batches=4
val_tokens=$((global_batch * seq_len * eval_batches + 1))

"$mpengine" data tokenize --tokenizer "$tokenizer" --out "$tmp/fortunes" --val-tokens "$val_tokens" \
  "$fortunes/computers" "$fortunes/science" "$fortunes/linux" "$fortunes/fortunes" "$fortunes/literature"
"$mpengine" plan examples/models/fortune-gpt.json --gpus 2 --cluster cpu-local \
  --global-batch "$global_batch" --out "$tmp/plan.json" > /dev/null
"$mpengine" run --config "$tmp/plan.json" --steps "$steps" --data "$tmp/fortunes_train_*.bin" \
  --val-data "$tmp/fortunes_val_000000.bin" --eval-every "$steps" --eval-batches "$eval_batches" \
  --checkpoint-dir "$tmp/ck" > "$tmp/run.log" 2>&1
mpengine_loss=$(sed -n 's/^eval after step .* held-out loss \([0-9.]*\) .*/\1/p' "$tmp/run.log" | tail -1)
"$mpengine" export --checkpoint "$tmp/ck" --format hf --out "$tmp/hf" > /dev/null
hf_loss=$("$python" tools/bench/hf_shard_loss.py "$tmp/hf" "$tmp/fortunes_val_000000.bin" "$seq_len" 2>/dev/null)
"$mpengine" sample --checkpoint "$tmp/ck" --tokenizer "$tokenizer" --prompt "Computers are" \
  --tokens 40 --temperature 0.8 --top-k 40 2>/dev/null | sed 's/^/sample: /'
grep -E "^step 1/|^done:" "$tmp/run.log"
awk -v a="$mpengine_loss" -v b="$hf_loss" 'BEGIN {
  printf "held-out loss after the run: mpengine %s, transformers on the export %s, relative difference %.2e\n",
    a, b, (a > b ? a - b : b - a) / b }'
