#!/usr/bin/env bash
# tests/tools/run_cli_test.sh — `mpengine run` as a user meets it: a short one-rank training run
# with its log lines (thinned by --log-every on long runs) and --metrics file, --data shards, --init-from llm.c checkpoints, and exit 2
# with the file named for a bad plan, bad data and a checkpoint of another model.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/run_cli
mkdir -p "$tmp"
export OPENBLAS_NUM_THREADS=1
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

plan() { # plan FILE MODEL [extra top-level JSON]
  cat > "$1" <<JSON
{"model": "$2", "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 3, "learning_rate": 1e-3}${3:-}}
JSON
}
cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
plan "$tmp/plan.json" tiny-gpt.json

expect 0 "entropy floor of the source:" -- $mpengine run --config "$tmp/plan.json"
expect 0 "step 3/3 | loss " -- $mpengine run --config "$tmp/plan.json"
expect 0 "done: 2 steps" -- $mpengine run --config "$tmp/plan.json" --steps 2 --metrics "$tmp/metrics.jsonl"
if [ "$(wc -l < "$tmp/metrics.jsonl")" -ne 2 ] || ! grep -q '"step": 1, "loss": ' "$tmp/metrics.jsonl"; then
  echo "FAIL: --metrics wrote:"; cat "$tmp/metrics.jsonl"; failures=$((failures + 1))
fi
# The same plan twice gives the same losses: the run is a pure function of the seed.
$mpengine run --config "$tmp/plan.json" --steps 2 --metrics "$tmp/again.jsonl" > /dev/null
if ! diff <(cut -d, -f1-2 "$tmp/metrics.jsonl") <(cut -d, -f1-2 "$tmp/again.jsonl") > /dev/null; then
  echo "FAIL: two runs of one plan differ"; failures=$((failures + 1))
fi

# --log-every (issue 29): a run of at most 50 steps prints every step; a longer one about 50
# lines (every ceil(steps / 50)-th step: 3 of 150) and always its first and last; --metrics keeps
# every step; held-out lines are not thinned; a resumed run prints the step it resumes at.
steps_printed() { grep -c '^step [0-9]*/' <<<"$1"; }
out=$($mpengine run --config "$tmp/plan.json" --steps 150 --eval-every 25 --metrics "$tmp/long.jsonl" 2>&1)
[ "$(steps_printed "$out")" -eq 51 ] || fail "150 steps: $(steps_printed "$out") step lines, want 51 (step 1, then every 3rd)"
for step in 1 3 6 75 147 150; do
  grep -q "^step $step/150 | loss " <<<"$out" || fail "150 steps: no line for step $step"
done
for step in 2 4 149; do
  grep -q "^step $step/150 " <<<"$out" && fail "150 steps: step $step printed, want every 3rd"
done
grep -qF "150 steps (a line every 3: --log-every)" <<<"$out" || fail "150 steps: the banner does not say --log-every 3: $(grep '^plan' <<<"$out")"
[ "$(grep -c '^eval after step ' <<<"$out")" -eq 6 ] || fail "150 steps, --eval-every 25: $(grep -c '^eval after step ' <<<"$out") held-out lines, want 6"
[ "$(grep -c '"loss": ' "$tmp/long.jsonl")" -eq 150 ] || fail "--metrics of 150 steps: $(grep -c '"loss": ' "$tmp/long.jsonl") step lines, want 150"
out=$($mpengine run --config "$tmp/plan.json" --steps 50 2>&1)
[ "$(steps_printed "$out")" -eq 50 ] || fail "50 steps: $(steps_printed "$out") step lines, want every step"
grep -q "(a line every" <<<"$out" && fail "50 steps: the banner mentions --log-every"
out=$($mpengine run --config "$tmp/plan.json" --steps 150 --log-every 1 2>&1)
[ "$(steps_printed "$out")" -eq 150 ] || fail "--log-every 1: $(steps_printed "$out") step lines, want 150"
out=$($mpengine run --config "$tmp/plan.json" --steps 150 --log-every 40 2>&1)
[ "$(grep '^step ' <<<"$out" | cut -d' ' -f2 | tr '\n' ' ')" = "1/150 40/150 80/150 120/150 150/150 " ] ||
  fail "--log-every 40: printed $(grep '^step ' <<<"$out" | cut -d' ' -f2 | tr '\n' ' '), want 1 40 80 120 150"
expect 0 "checkpoint: saved $tmp/log-every/step-100" -- \
  $mpengine run --config "$tmp/plan.json" --steps 100 --checkpoint-dir "$tmp/log-every"
out=$($mpengine run --config "$tmp/plan.json" --steps 120 --checkpoint-dir "$tmp/log-every" --resume --override-training 2>&1)
[ "$(grep '^step ' <<<"$out" | head -2 | cut -d' ' -f2 | tr '\n' ' ')" = "101/120 102/120 " ] ||
  fail "resumed at step 100 of 120: first lines $(grep '^step ' <<<"$out" | head -2 | cut -d' ' -f2 | tr '\n' ' '), want 101 (the first) and 102"
grep -q "^step 120/120 " <<<"$out" || fail "resumed run: no line for its last step"
expect 2 "--log-every: must be at least 1, got 0" -- $mpengine run --config "$tmp/plan.json" --log-every 0
expect 2 "--log-every: expected an integer, got 'often'" -- $mpengine run --config "$tmp/plan.json" --log-every often

# Token shards.
$mpengine data synth --out "$tmp/train.bin" --vocab 128 --tokens 5000 > /dev/null
expect 0 "data: $tmp/train*.bin (1 file), 5000 tokens" -- $mpengine run --config "$tmp/plan.json" --data "$tmp/train*.bin"
# --eval-every: the held-out part of --data is cut off the training stream (4871 + 129 tokens:
# 2 batches of 4 x 16-token samples, a tenth of the stream at most), or --val-data's shards; the held-out loss is printed and logged.
expect 0 "data: $tmp/train*.bin (1 file), 4871 tokens" \
  "held-out data: $tmp/train*.bin, its last 129 tokens (held out), 129 tokens (evaluated every 2 steps over 2 batches)" \
  "eval after step 2/" "| held-out loss " -- \
  $mpengine run --config "$tmp/plan.json" --data "$tmp/train*.bin" --eval-every 2 --eval-batches 2 --metrics "$tmp/eval.jsonl"
grep -q '^{"step": 1, "val_loss": [0-9.]*, "val_batches": 2}$' "$tmp/eval.jsonl" ||
  fail "--metrics has no held-out line for step 2: $(head -3 "$tmp/eval.jsonl")"
$mpengine data synth --out "$tmp/val.bin" --vocab 128 --tokens 3000 --seed 9 > /dev/null
expect 0 "data: $tmp/train*.bin (1 file), 5000 tokens" "held-out data: $tmp/val.bin, 3000 tokens" -- \
  $mpengine run --config "$tmp/plan.json" --data "$tmp/train*.bin" --eval-every 2 --val-data "$tmp/val.bin"
expect 0 "held-out data: held-out sample of the synthetic Markov source" "| held-out loss " -- \
  $mpengine run --config "$tmp/plan.json" --steps 2 --eval-every 1
expect 2 "--eval-batches needs --eval-every K" -- $mpengine run --config "$tmp/plan.json" --eval-batches 3
expect 2 "--val-data: $tmp/nothing*.bin: no file matches this pattern" -- \
  $mpengine run --config "$tmp/plan.json" --eval-every 1 --val-data "$tmp/nothing*.bin"
expect 2 "--val-data needs --eval-every K" -- $mpengine run --config "$tmp/plan.json" --val-data "$tmp/val.bin"
expect 2 "$tmp/nothing*.bin: no file matches this pattern" -- $mpengine run --config "$tmp/plan.json" --data "$tmp/nothing*.bin"
$mpengine data synth --out "$tmp/wide.bin" --vocab 300 --tokens 5000 > /dev/null
expect 2 "$tmp/wide.bin: token" -- $mpengine run --config "$tmp/plan.json" --data "$tmp/wide.bin"
head -c 2000 "$tmp/train.bin" > "$tmp/short.bin"
expect 2 "$tmp/short.bin:" -- $mpengine run --config "$tmp/plan.json" --data "$tmp/short.bin"
# uint32 shards (magic 20240801) for a vocabulary over 65,536: ids are checked against the
# model's vocab_size as windows are read; one past it is named with its file and byte offset.
sed 's/"vocab_size": 128/"vocab_size": 70000/' examples/models/tiny-gpt.json > "$tmp/wide-vocab.json"
plan "$tmp/wide-plan.json" wide-vocab.json
python3 - "$tmp" <<'PY'
import struct, sys
def shard(path, ids):
    header = [0] * 256
    header[0:3] = [20240801, 7, len(ids)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack("<%dI" % len(ids), *ids))
shard(sys.argv[1] + "/u32.bin", [(i * 7919) % 70000 for i in range(5000)])
shard(sys.argv[1] + "/u32_over.bin", [70000] * 5000)
PY
expect 0 "data: $tmp/u32.bin (1 file), 5000 tokens" "step 3/3 | loss " -- \
  $mpengine run --config "$tmp/wide-plan.json" --data "$tmp/u32.bin"
expect 2 "$tmp/u32_over.bin: token id 70000 at token " "is outside the vocabulary of 70000 ids" -- \
  $mpengine run --config "$tmp/wide-plan.json" --data "$tmp/u32_over.bin"

# llm.c checkpoints: our own export of the initial weights loads; another model's is refused.
expect 0 "wrote $tmp/dump/{model.bin, grads.bin, tokens.bin, loss.txt}" -- $mpengine bench step examples/models/tiny-gpt.json --micro-batch 1 --seq-len 16 --steps 1 --dump "$tmp/dump"
expect 0 "initialised from $tmp/dump/model.bin" -- $mpengine run --config "$tmp/plan.json" --init-from "$tmp/dump/model.bin"
sed 's/"repeat": 4/"repeat": 3/' examples/models/tiny-gpt.json > "$tmp/three.json"
plan "$tmp/three-plan.json" three.json
expect 2 "$tmp/dump/model.bin: num_layers is 4 in the checkpoint but 3 in the model description" -- $mpengine run --config "$tmp/three-plan.json" --init-from "$tmp/dump/model.bin"
printf 'not a checkpoint at all, just some text padding it out to more than a kilobyte %01024d' 0 > "$tmp/junk.bin"
expect 2 "$tmp/junk.bin: bad magic" -- $mpengine run --config "$tmp/plan.json" --init-from "$tmp/junk.bin"

# Plans and options.
expect 2 "missing --config PLAN.json" -- $mpengine run
expect 2 "$tmp/none.json: cannot open" -- $mpengine run --config "$tmp/none.json"
plan "$tmp/bad.json" tiny-gpt.json ', "trainig": {}'
expect 2 "unknown key \"trainig\"; did you mean \"training\"?" -- $mpengine run --config "$tmp/bad.json"
cat > "$tmp/dp2.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 2, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 1, "num_micro_batches": 2, "seq_len": 16}}
JSON
expect 0 "checkpoint: saved $tmp/dp2-checkpoints/step-2" -- $mpengine run --config "$tmp/dp2.json" --steps 2 --checkpoint-dir "$tmp/dp2-checkpoints"
# What the launcher can check it refuses before any rank starts: the reason once, exit 2.
cat > "$tmp/dp2-long.json" <<JSON
{"model": "tiny-gpt.json", "parallel": {"dp": 2, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 1, "num_micro_batches": 2, "seq_len": 128}}
JSON
expect 2 "$tmp/dp2-long.json: \$.batch.seq_len 128 exceeds the model's seq_len 64" -- $mpengine run --config "$tmp/dp2-long.json"
# ZeRO-3 does not run with zb-h1 (issue 17): refused before any rank starts.
sed 's/"tp": 1}/"tp": 1, "zero_stage": 3}/; s/"batch"/"schedule": "zb-h1", "batch"/' "$tmp/dp2.json" > "$tmp/dp2-zero3-zb.json"
expect 2 "$tmp/dp2-zero3-zb.json: parallel.zero_stage 3 gathers each block's parameters around its whole backward, but schedule zb-h1 splits the backward and defers the weight gradients; use 1f1b or interleaved-1f1b, or zero_stage 2" -- \
  $mpengine run --config "$tmp/dp2-zero3-zb.json"
# Hybrid sharding runs on the CPU backend only, for now.
sed 's/"tp": 1}/"tp": 1, "zero_stage": 1, "zero_shard_size": 1}/' "$tmp/dp2.json" > "$tmp/dp2-hsdp.json"
expect 2 "$tmp/dp2-hsdp.json: parallel.zero_shard_size 1 (hybrid sharding) runs on the CPU backend only for now; drop it, or use --backend cpu" -- \
  $mpengine run --config "$tmp/dp2-hsdp.json" --backend cuda
for args in "--config $tmp/dp2-long.json" "--config $tmp/dp2.json --gpu-comm gloo"; do
  said=$($mpengine run $args 2>&1 | grep -c "mpengine run: ")
  [ "$said" = 1 ] || fail "run $args: the reason printed $said times, want once (by the launcher)"
done
expect 2 "--backend: expected auto, cpu or cuda, got 'tpu'" -- $mpengine run --config "$tmp/plan.json" --backend tpu
expect 2 "--gpu-comm: expected auto, nccl or mpi, got 'gloo'" -- $mpengine run --config "$tmp/plan.json" --gpu-comm gloo --steps 1
expect 2 "--resume needs --checkpoint-dir DIR" -- $mpengine run --config "$tmp/plan.json" --resume
# A parallel run whose --save-weights file cannot be written stops on every rank with rank 0's
# reason (the others must not wait for it in a later collective).
cat > "$tmp/pp2.json" <<'JSON'
{"model": "tiny-gpt.json", "parallel": {"dp": 1, "pp": 2, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-3}}
JSON
expect 2 "rank 0: $tmp/missing/w.bin: cannot create: No such file or directory" -- \
  timeout 120 $mpengine run --config "$tmp/pp2.json" --save-weights "$tmp/missing/w.bin"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
