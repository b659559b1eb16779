#!/usr/bin/env bash
# tests/tools/text_to_model_test.sh — the README's path from text to a trained model, end to end
# on this machine's Debian fortunes (tools/setup.sh installs them): data tokenize (with a val
# split) -> plan onto 2 CPU ranks -> run with --eval-every and checkpoints -> sample from the
# checkpoint -> export --format hf -> sample from the export. Checks that training on the shards
# lowers the loss and that the held-out loss is reported, that sampling from the checkpoint (saved
# at dp 2) and from its Hugging Face export give the same greedy tokens, and that the shards hold
# exactly what tokenize reported. tools/bench/text_to_model.sh runs the same path and checks the
# held-out loss against transformers on the export.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tokenizer=${2:-tests/engine/testdata/tokenizers/gpt2_style}
model=${3:-examples/models/fortune-gpt.json}
fortunes=${FORTUNES:-/usr/share/games/fortunes}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/text_to_model
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

for f in computers science linux; do
  [ -f "$fortunes/$f" ] || { echo "FAIL: $fortunes/$f missing: run tools/setup.sh (Debian's fortunes)"; exit 1; }
done

expect 0 "tokenized 3 documents" "(4000 val)" \
  -- "$mpengine" data tokenize --tokenizer "$tokenizer" --out "$tmp/fortunes" --val-tokens 4000 \
  "$fortunes/computers" "$fortunes/science" "$fortunes/linux"
expect 0 "wrote the winner to $tmp/plan.json" \
  -- "$mpengine" plan "$model" --gpus 2 --cluster cpu-local --global-batch 8 --out "$tmp/plan.json"
"$mpengine" run --config "$tmp/plan.json" --steps 30 --data "$tmp/fortunes_train_*.bin" \
  --val-data "$tmp/fortunes_val_000000.bin" --eval-every 30 --eval-batches 2 \
  --checkpoint-dir "$tmp/ck" > "$tmp/run.log" 2>&1 || fail "run failed: $(tail -20 "$tmp/run.log")"
grep -q "held-out loss" "$tmp/run.log" || fail "run printed no held-out loss: $(tail "$tmp/run.log")"
first=$(sed -n 's/^step 1\/30 | loss \([0-9.]*\).*/\1/p' "$tmp/run.log")
last=$(sed -n 's/^done: 30 steps .* final loss \([0-9.]*\).*/\1/p' "$tmp/run.log")
if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then
  fail "30 steps on the fortunes should lower the loss by more than a nat: step 1 '$first', final '$last'"
fi

sample() { "$mpengine" sample "$@" --tokenizer "$tokenizer" --prompt "Computers are" --tokens 12 \
  --temperature 0 --print-ids 2>"$tmp/sample.err" | sed -n 's/^ids: //p'; }
from_checkpoint=$(sample --checkpoint "$tmp/ck")
[ -n "$from_checkpoint" ] || fail "sample --checkpoint printed no ids: $(cat "$tmp/sample.err")"
expect 0 "exported" -- "$mpengine" export --checkpoint "$tmp/ck" --format hf --out "$tmp/hf"
from_export=$(sample --init-from "$tmp/hf")
[ "$from_checkpoint" = "$from_export" ] ||
  fail "greedy tokens from the checkpoint ($from_checkpoint) and from its export ($from_export) differ"
ls "${TMPDIR:-/tmp}"/mpengine-sample-* >/dev/null 2>&1 && fail "sample left its export behind"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "text to model: loss $first -> $last; greedy tokens $from_checkpoint"
