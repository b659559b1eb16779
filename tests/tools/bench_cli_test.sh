#!/usr/bin/env bash
# tests/tools/bench_cli_test.sh — `mpengine bench step` as a user meets it: --dump writes the four
# files tools/bench/torch_compare.py reads, with the sizes their formats imply, the timing report
# prints, and mistakes exit 2 naming what is wrong. Tiny model, tiny batch: well under a second.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
model=${2:-examples/models/tiny-gpt.json}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/bench_cli
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

size_is() { # FILE BYTES
  local got
  got=$(stat -c %s "$1" 2>/dev/null || echo missing)
  [ "$got" = "$2" ] || fail "$1 is $got bytes, expected $2"
}

# tiny-gpt: vocab 128 (padded 128), 64 positions, C 64, 4 layers of 4C^2 + 2C(4C) + 9C + 4C
# = 12 C^2 + 13 C floats each, plus the final norm: 128*64 + 64*64 + 4*(12*64*64 + 13*64) + 2*64.
params=$((128 * 64 + 64 * 64 + 4 * (12 * 64 * 64 + 13 * 64) + 2 * 64))
expect 0 "4 layers, 4 heads, 64 channels, vocab 128 (padded 128), $params parameters" \
  "batch: 2 x 16 tokens from the markov source (seed 1337)" "dump: loss " \
  "timing: 2 steps after 2 warmup" "ms/step" "tokens/s" "phases (median ms): forward " -- \
  $mpengine bench step "$model" --micro-batch 2 --seq-len 16 --steps 2 --dump "$tmp/d"
size_is "$tmp/d/model.bin" $((1024 + 4 * params))
size_is "$tmp/d/grads.bin" $((1024 + 4 * params))
size_is "$tmp/d/tokens.bin" $((16 + 2 * 4 * 2 * 16))
[ -s "$tmp/d/loss.txt" ] || fail "loss.txt is missing or empty"
ls "$tmp/d" | grep -q '\.tmp\.' && fail "a temporary file was left behind: $(ls "$tmp/d")"
cmp -s "$tmp/d/model.bin" "$tmp/d/grads.bin" && fail "grads.bin holds the weights"

# Same seed, same files; the weights are dumped before any step, so --steps does not change them.
expect 0 "dump: loss $(cat "$tmp/d/loss.txt")" -- \
  $mpengine bench step "$model" --micro-batch 2 --seq-len 16 --steps 0 --dump "$tmp/e"
for file in model.bin grads.bin tokens.bin loss.txt; do
  cmp -s "$tmp/d/$file" "$tmp/e/$file" || fail "a second dump with the same seed changed $file"
done
# Reusing the directory replaces the files; the weights saved are loadable as --init-from.
expect 0 "weights from $tmp/d/model.bin" "dump: loss $(cat "$tmp/d/loss.txt")" -- \
  $mpengine bench step "$model" --micro-batch 2 --seq-len 16 --steps 0 --dump "$tmp/e" \
  --init-from "$tmp/d/model.bin"

# Mistakes: exit 2 and what is wrong.
expect 2 "unknown option '--stepz'; did you mean '--steps'?" -- \
  $mpengine bench step "$model" --stepz 2
expect 2 "missing argument (usage: mpengine bench step MODEL.json" -- $mpengine bench step
expect 2 "$tmp/none.json" -- $mpengine bench step "$tmp/none.json" --steps 1
expect 2 "--micro-batch: must be at least 1, got 0" -- \
  $mpengine bench step "$model" --micro-batch 0
expect 2 "sequence length 65 exceeds the position table" -- \
  $mpengine bench step "$model" --seq-len 65 --steps 1
expect 2 "--source: expected markov or uniform, got 'zipf'" -- \
  $mpengine bench step "$model" --source zipf
expect 2 "--steps 0 without --dump DIR does nothing" -- $mpengine bench step "$model" --steps 0
expect 2 "--dump $tmp/no/such/dir: cannot create the directory" -- \
  $mpengine bench step "$model" --steps 0 --dump "$tmp/no/such/dir"
expect 2 "mpengine bench: missing action: step" -- $mpengine bench
expect 2 "mpengine bench: unknown action 'stp'; did you mean 'step'?" -- $mpengine bench stp
expect 0 "usage: mpengine bench step MODEL.json" "--dump DIR" -- $mpengine bench step --help

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
