#!/usr/bin/env bash
# tests/tools/describe_cli_test.sh — `mpengine describe` and the command's shell as a user meets
# them: exit codes 0 / 2, the messages, and the numbers in the table.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

expect 0 "parameters: 124,439,808 (124.4 M)" -- $mpengine describe examples/models/gpt2-124m.json
expect 0 "block.11" -- $mpengine describe examples/models/gpt2-124m.json
expect 0 '"params":	124439808' -- $mpengine describe examples/models/gpt2-124m.json --format json
expect 0 "micro-batch 4 x sequence 128" -- $mpengine describe examples/models/tiny-gpt.json --micro-batch 4 --seq-len 128
expect 0 "usage: mpengine describe MODEL.json" -- $mpengine describe --help
expect 2 "missing argument (usage: mpengine describe MODEL.json" -- $mpengine describe
expect 2 "examples/models/nope.json: cannot open: No such file or directory" -- $mpengine describe examples/models/nope.json
expect 2 "unknown option '--micro-bath'; did you mean '--micro-batch'?" -- $mpengine describe examples/models/tiny-gpt.json --micro-bath 2
expect 2 "--micro-batch: must be at least 1, got 0" -- $mpengine describe examples/models/tiny-gpt.json --micro-batch 0
expect 2 "--dtype: expected bf16 or fp32, got 'fp8'" -- $mpengine describe examples/models/tiny-gpt.json --dtype fp8

cat > "$tmp/bad.json" <<'JSON'
{
  "name": "bad",
  "vocab_size": 100,
  "seq_len": 16,
  "layers": [
    {"type": "transformer", "hidden": 64, "heads": 4, "repaet": 2}
  ]
}
JSON
expect 2 "bad.json: \$.layers[0]: unknown key \"repaet\"; did you mean \"repeat\"?" -- $mpengine describe "$tmp/bad.json"
printf '{"name": "x",\n  "layers": [\n' > "$tmp/truncated.json"
expect 2 "truncated.json:3:1: JSON syntax error: expected a value, found the end of the file" -- $mpengine describe "$tmp/truncated.json"

# The command shell: every subcommand has --help; unknown commands are named; pending ones exit 2.
for sub in describe plan schedule run timeline calibrate version data; do
  expect 0 "usage: mpengine $sub" -- $mpengine $sub --help
done
expect 0 "commands:" -- $mpengine --help
expect 2 "unknown command 'descibe'; did you mean 'describe'?" -- $mpengine descibe
expect 2 "usage: mpengine <command>" -- $mpengine
expect 0 "model tiny-gpt on 8 GPUs of cpu-local" -- $mpengine plan examples/models/tiny-gpt.json --gpus 8
expect 0 "mpengine 0.1.0" -- $mpengine version

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
