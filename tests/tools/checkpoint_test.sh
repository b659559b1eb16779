#!/usr/bin/env bash
# tests/tools/checkpoint_test.sh — sharded checkpoints through `mpengine run` and `mpengine export`
# (issue 7; every layout: issue 11): a resumed run continues bit-for-bit (the loss strings of steps
# 10..19 equal those of a run that never stopped) on one rank, with tp = 2, with (dp, pp, tp) =
# (2, 2, 2) and ZeRO-1, with (2, 2, 1) and ZeRO-2, and with pp = 2 interleaved over v = 2
# chunks; a checkpoint resumes under another layout (tp 2 -> 1, 1 -> 2, 2 -> 4; (2,2,2) ZeRO-1 ->
# one rank and -> (2,2,1) ZeRO-2; (2,2,1) ZeRO-2 -> (4,1,1) ZeRO-2 and -> one rank; one rank ->
# (1,2,2); pp 2 interleaved -> (2,1,2) ZeRO-1) with the losses of the uninterrupted run within 1e-6
# relative; --keep, SIGTERM (finish the step, save, exit 0), export to llm.c's format (of a pp = 2
# checkpoint: the very weights --save-weights wrote) and --init-from of it, and the refusals (exit
# 2 with the reason): no checkpoint to resume, a corrupted shard, a missing shard, a checkpoint of
# another model, a manifest that is not a checkpoint manifest; a used --checkpoint-dir refused to
# a fresh run, --metrics appended on resume and never truncated, changed training settings refused
# on resume (issue 18).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/checkpoint
rm -rf "$tmp"
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

plan() { # plan FILE DP PP TP [SCHEDULE] [VIRTUAL] [ZERO] [MODEL]: global batch 8 on every layout
  cat > "$1" <<JSON
{"model": "${8:-tiny-gpt.json}", "cluster": "cpu-local",
 "parallel": {"dp": $2, "pp": $3, "tp": $4, "virtual_stages": ${6:-1}, "sequence_parallel": false, "zero_stage": ${7:-0}},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": $((4 / $2)), "seq_len": 32},
 "schedule": "${5:-1f1b}",
 "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
}
cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
# edited SED_EXPRESSION SOURCE TARGET: sed, refusing an expression that matched nothing (a plan
# left as it was would test the plain layout under another name).
edited() {
  sed "$1" "$2" > "$3"
  cmp -s "$2" "$3" && fail "sed '$1' changed nothing in $2"
}
edited 's/"repeat": 4/"repeat": 2/' examples/models/tiny-gpt.json "$tmp/tiny-gpt-2.json"
plan "$tmp/tp1.json" 1 1 1
plan "$tmp/tp2.json" 1 1 2
plan "$tmp/tp4.json" 1 1 4
plan "$tmp/other.json" 1 1 1 1f1b 1 0 tiny-gpt-2.json
plan "$tmp/dp2-pp2-tp2-zero1.json" 2 2 2 1f1b 1 1
plan "$tmp/pp2-v2.json" 1 2 1 interleaved-1f1b 2
plan "$tmp/pp2-tp2.json" 1 2 2
plan "$tmp/dp2-tp2-zero1.json" 2 1 2 1f1b 1 1
plan "$tmp/dp2-pp2-zero2.json" 2 2 1 1f1b 1 2
plan "$tmp/dp4-zero2.json" 4 1 1 1f1b 1 2
plan "$tmp/dp2-pp2-zero3.json" 2 2 1 1f1b 1 3
# Hybrid sharding: ZeRO-2 in two groups of 2 dp ranks (zero_shard_size 2).
edited 's/"zero_stage": 2}/"zero_stage": 2, "zero_shard_size": 2}/' "$tmp/dp4-zero2.json" "$tmp/dp4-zero2-hsdp.json"
run() { $mpengine run --backend cpu "$@"; }

# The loss field of each line of a --metrics file.
losses() { awk -F'"loss": ' '{ split($2, a, ","); print a[1] }' "$1"; }

# exact NAME FULL RESUMED [FULL_DIR RESUMED_DIR]: the resumed run's 10 metrics lines (step, loss,
# learning rate, gradient norm) equal the full run's steps 10..19; given the two checkpoint
# directories, their step-20 shard files (parameters and AdamW moments) are byte-identical too.
exact() {
  if [ "$(wc -l < "$3")" -ne 10 ]; then fail "$1: resumed run wrote $(wc -l < "$3") lines, want 10"; return; fi
  if diff <(tail -n 10 "$2" | cut -d, -f1-4) <(cut -d, -f1-4 "$3") > /dev/null; then
    echo "$1: steps 10..19 after --resume equal the uninterrupted run's (loss and norm strings identical)"
  else
    fail "$1: resumed losses differ:"; paste <(tail -n 10 "$2" | cut -d, -f1-4) <(cut -d, -f1-4 "$3")
  fi
  [ $# -ge 5 ] || return
  local file count=0
  for file in "$4"/step-20/*.bin; do
    count=$((count + 1))
    cmp -s "$file" "$5/step-20/${file##*/}" || fail "$1: step-20/${file##*/} differs after --resume"
  done
  [ $count -gt 0 ] && echo "$1: the $count shard files of step 20 are byte-identical"
}

# close NAME FULL RESUMED: within 1e-6 relative; prints the worst.
close() {
  if [ "$(wc -l < "$3")" -ne 10 ]; then fail "$1: resumed run wrote $(wc -l < "$3") lines, want 10"; return; fi
  local verdict
  verdict=$(paste -d' ' <(tail -n 10 "$2" | losses /dev/stdin) <(losses "$3") | awk '
    { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r }
    END { printf "%s %.3g", (worst <= 1e-6 ? "ok" : "bad"), worst }')
  echo "$1: max relative loss difference over steps 10..19: ${verdict#* }"
  [ "${verdict%% *}" = ok ] || fail "$1: differs by more than 1e-6 relative (${verdict#* })"
}

# resume_from NAME CHECKPOINT PLAN OUT: copies one saved checkpoint into a fresh directory and
# resumes it to step 20.
resume_from() {
  rm -rf "$tmp/$1" && mkdir -p "$tmp/$1" && cp -r "$2" "$tmp/$1/"
  expect 0 "resumed from $tmp/$1/step-10: 10 of 20 steps done" "done: 20 steps" -- \
    run --config "$3" --checkpoint-dir "$tmp/$1" --resume --metrics "$4"
}

# One rank: 20 steps saving every 10, against 10 steps then --resume.
expect 0 "checkpoint: saved $tmp/one/step-10" "checkpoint: saved $tmp/one/step-20" -- \
  run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/one" --save-every 10 --metrics "$tmp/one.jsonl"
[ -f "$tmp/one/step-10/manifest.json" ] && [ -f "$tmp/one/step-10/pp-00000-tp-00000.bin" ] || fail "one rank: step-10 files missing"
grep -q '"format":	"mpengine-checkpoint"' "$tmp/one/step-10/manifest.json" || fail "manifest has no format"
grep -q '"version":	3' "$tmp/one/step-10/manifest.json" || fail "manifest is not version 3"
resume_from one-resumed "$tmp/one/step-10" "$tmp/tp1.json" "$tmp/one-resumed.jsonl"
exact "tp = 1" "$tmp/one.jsonl" "$tmp/one-resumed.jsonl" "$tmp/one" "$tmp/one-resumed"

# tp = 2 (mpengine relaunches itself under mpirun).
expect 0 "checkpoint: saved $tmp/two/step-10" "done: 20 steps" -- \
  run --config "$tmp/tp2.json" --checkpoint-dir "$tmp/two" --save-every 10 --metrics "$tmp/two.jsonl"
[ -f "$tmp/two/step-10/pp-00000-tp-00001.bin" ] || fail "tp = 2: tp rank 1's shard missing"
resume_from two-resumed "$tmp/two/step-10" "$tmp/tp2.json" "$tmp/two-resumed.jsonl"
exact "tp = 2" "$tmp/two.jsonl" "$tmp/two-resumed.jsonl" "$tmp/two" "$tmp/two-resumed"

# Resharding.
resume_from two-to-one "$tmp/two/step-10" "$tmp/tp1.json" "$tmp/two-to-one.jsonl"
close "saved tp = 2, resumed tp = 1" "$tmp/two.jsonl" "$tmp/two-to-one.jsonl"
resume_from one-to-two "$tmp/one/step-10" "$tmp/tp2.json" "$tmp/one-to-two.jsonl"
close "saved tp = 1, resumed tp = 2" "$tmp/one.jsonl" "$tmp/one-to-two.jsonl"
resume_from two-to-four "$tmp/two/step-10" "$tmp/tp4.json" "$tmp/two-to-four.jsonl"
close "saved tp = 2, resumed tp = 4" "$tmp/two.jsonl" "$tmp/two-to-four.jsonl"

# (dp, pp, tp) = (2, 2, 2) with ZeRO-1: one file per (pp rank, tp rank), written by dp rank 0 with
# the moments gathered over dp; bit-exact under the same layout, then resharded to one rank.
expect 0 "checkpoint: saved $tmp/3d/step-10" "done: 20 steps" -- \
  run --config "$tmp/dp2-pp2-tp2-zero1.json" --checkpoint-dir "$tmp/3d" --save-every 10 --metrics "$tmp/3d.jsonl"
[ "$(ls "$tmp/3d/step-10" | tr '\n' ' ')" = "manifest.json pp-00000-tp-00000.bin pp-00000-tp-00001.bin pp-00001-tp-00000.bin pp-00001-tp-00001.bin " ] ||
  fail "(2,2,2): step-10 holds $(ls "$tmp/3d/step-10" | tr '\n' ' ')"
resume_from 3d-resumed "$tmp/3d/step-10" "$tmp/dp2-pp2-tp2-zero1.json" "$tmp/3d-resumed.jsonl"
exact "(2,2,2) ZeRO-1" "$tmp/3d.jsonl" "$tmp/3d-resumed.jsonl" "$tmp/3d" "$tmp/3d-resumed"
resume_from 3d-to-one "$tmp/3d/step-10" "$tmp/tp1.json" "$tmp/3d-to-one.jsonl"
close "saved (2,2,2) ZeRO-1, resumed on one rank" "$tmp/3d.jsonl" "$tmp/3d-to-one.jsonl"
resume_from one-to-pp2-tp2 "$tmp/one/step-10" "$tmp/pp2-tp2.json" "$tmp/one-to-pp2-tp2.jsonl"
close "saved on one rank, resumed (1,2,2)" "$tmp/one.jsonl" "$tmp/one-to-pp2-tp2.jsonl"

# (2, 2, 1) with ZeRO-2 (issue 17): each dp rank keeps its part of the gradients and moments; the
# files are the same as ZeRO-1's (the moments gathered over dp), so the checkpoint resumes
# bit-exact under its own layout, and under another ZeRO stage and dp size: ZeRO-2 on dp 4, and
# a ZeRO-1 checkpoint as ZeRO-2.
expect 0 "checkpoint: saved $tmp/z2/step-10" "done: 20 steps" -- \
  run --config "$tmp/dp2-pp2-zero2.json" --checkpoint-dir "$tmp/z2" --save-every 10 --metrics "$tmp/z2.jsonl"
resume_from z2-resumed "$tmp/z2/step-10" "$tmp/dp2-pp2-zero2.json" "$tmp/z2-resumed.jsonl"
exact "(2,2,1) ZeRO-2" "$tmp/z2.jsonl" "$tmp/z2-resumed.jsonl" "$tmp/z2" "$tmp/z2-resumed"
resume_from z2-to-dp4 "$tmp/z2/step-10" "$tmp/dp4-zero2.json" "$tmp/z2-to-dp4.jsonl"
close "saved (2,2,1) ZeRO-2, resumed (4,1,1) ZeRO-2" "$tmp/z2.jsonl" "$tmp/z2-to-dp4.jsonl"
resume_from z2-to-one "$tmp/z2/step-10" "$tmp/tp1.json" "$tmp/z2-to-one.jsonl"
close "saved (2,2,1) ZeRO-2, resumed on one rank" "$tmp/z2.jsonl" "$tmp/z2-to-one.jsonl"
resume_from 3d-to-z2 "$tmp/3d/step-10" "$tmp/dp2-pp2-zero2.json" "$tmp/3d-to-z2.jsonl"
close "saved (2,2,2) ZeRO-1, resumed (2,2,1) ZeRO-2" "$tmp/3d.jsonl" "$tmp/3d-to-z2.jsonl"
# ZeRO-3 (the blocks' parameters in parts too): each file's parameters and moments come from
# every dp rank's part; bit-exact under its own layout, resumed on one rank, and a ZeRO-2
# checkpoint resumed as ZeRO-3.
expect 0 "checkpoint: saved $tmp/z3/step-10" "done: 20 steps" -- \
  run --config "$tmp/dp2-pp2-zero3.json" --checkpoint-dir "$tmp/z3" --save-every 10 --metrics "$tmp/z3.jsonl"
resume_from z3-resumed "$tmp/z3/step-10" "$tmp/dp2-pp2-zero3.json" "$tmp/z3-resumed.jsonl"
exact "(2,2,1) ZeRO-3" "$tmp/z3.jsonl" "$tmp/z3-resumed.jsonl" "$tmp/z3" "$tmp/z3-resumed"
for file in "$tmp/z2"/step-10/*.bin; do
  cmp -s "$file" "$tmp/z3/step-10/${file##*/}" || fail "ZeRO-3's step-10/${file##*/} differs from ZeRO-2's"
done
resume_from z3-to-one "$tmp/z3/step-10" "$tmp/tp1.json" "$tmp/z3-to-one.jsonl"
close "saved (2,2,1) ZeRO-3, resumed on one rank" "$tmp/z3.jsonl" "$tmp/z3-to-one.jsonl"
resume_from z2-to-z3 "$tmp/z2/step-10" "$tmp/dp2-pp2-zero3.json" "$tmp/z2-to-z3.jsonl"
close "saved (2,2,1) ZeRO-2, resumed ZeRO-3" "$tmp/z2.jsonl" "$tmp/z2-to-z3.jsonl"

# HSDP: the first shard group's moments make the files (its replicas hold the same); bit-exact
# under its own layout, and resumed with ZeRO-2 over all 4 dp ranks.
expect 0 "checkpoint: saved $tmp/hsdp/step-10" "done: 20 steps" \
  "state: ZeRO-2 (optimizer state and gradients cut over groups of 2 ranks, 2 replicas: hybrid sharding)" -- \
  run --config "$tmp/dp4-zero2-hsdp.json" --checkpoint-dir "$tmp/hsdp" --save-every 10 --metrics "$tmp/hsdp.jsonl"
resume_from hsdp-resumed "$tmp/hsdp/step-10" "$tmp/dp4-zero2-hsdp.json" "$tmp/hsdp-resumed.jsonl"
exact "(4,1,1) ZeRO-2 in groups of 2" "$tmp/hsdp.jsonl" "$tmp/hsdp-resumed.jsonl" "$tmp/hsdp" "$tmp/hsdp-resumed"
resume_from hsdp-to-dp4 "$tmp/hsdp/step-10" "$tmp/dp4-zero2.json" "$tmp/hsdp-to-dp4.jsonl"
close "saved (4,1,1) ZeRO-2 in groups of 2, resumed over all of dp" "$tmp/hsdp.jsonl" "$tmp/hsdp-to-dp4.jsonl"

# pp = 2 interleaved, v = 2 chunks per pipeline rank (the tied copy of wte on the last stage is
# not saved; it loads from the first stage's): bit-exact, resharded to (2,1,2) with ZeRO-1, and
# export equals the run's own --save-weights.
expect 0 "checkpoint: saved $tmp/il/step-10" "done: 20 steps" -- \
  run --config "$tmp/pp2-v2.json" --checkpoint-dir "$tmp/il" --save-every 10 --metrics "$tmp/il.jsonl" \
  --save-weights "$tmp/il-weights.bin"
resume_from il-resumed "$tmp/il/step-10" "$tmp/pp2-v2.json" "$tmp/il-resumed.jsonl"
exact "pp = 2 interleaved v = 2" "$tmp/il.jsonl" "$tmp/il-resumed.jsonl" "$tmp/il" "$tmp/il-resumed"
resume_from il-to-dp2-tp2 "$tmp/il/step-10" "$tmp/dp2-tp2-zero1.json" "$tmp/il-to-dp2-tp2.jsonl"
close "saved pp = 2 interleaved, resumed (2,1,2) ZeRO-1" "$tmp/il.jsonl" "$tmp/il-to-dp2-tp2.jsonl"
expect 0 "exported $tmp/il/step-20 (step 20, 212352 parameters) to $tmp/il-export.bin" -- \
  $mpengine export --checkpoint "$tmp/il" --out "$tmp/il-export.bin"
if cmp -s "$tmp/il-export.bin" "$tmp/il-weights.bin"; then
  echo "export of the pp = 2 checkpoint: byte-identical to the run's --save-weights"
else
  fail "export of the pp = 2 checkpoint differs from --save-weights: $(cmp "$tmp/il-export.bin" "$tmp/il-weights.bin" 2>&1)"
fi

# --keep 2 keeps the two newest.
expect 0 "done: 6 steps" -- run --config "$tmp/tp1.json" --steps 6 --checkpoint-dir "$tmp/keep" --save-every 2 --keep 2
[ "$(ls "$tmp/keep")" = "$(printf 'step-4\nstep-6')" ] || fail "--keep 2 left: $(ls "$tmp/keep" | tr '\n' ' ')"

# SIGTERM: finish the step, save, exit 0; the checkpoint resumes. (--log-every 1: the wait below
# reads step 3's line, which a run of 100000 steps would not print by default.)
$mpengine run --backend cpu --config "$tmp/tp1.json" --steps 100000 --log-every 1 --checkpoint-dir "$tmp/sig" > "$tmp/sig.log" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q '^step 3/' "$tmp/sig.log" && break; sleep 0.2; done
kill -TERM $pid
wait $pid
code=$?
if [ $code -ne 0 ] || ! grep -q "stopped by SIGTERM after step" "$tmp/sig.log"; then
  fail "SIGTERM: exit $code, log:"; tail -5 "$tmp/sig.log"
fi
saved=$(ls "$tmp/sig" | sed -n 's/^step-\([0-9]*\)$/\1/p' | head -1)
[ -n "$saved" ] || fail "SIGTERM: no checkpoint saved"
[ -n "$saved" ] && expect 0 "resumed from $tmp/sig/step-$saved: $saved of $((saved + 1)) steps done" "done: $((saved + 1)) steps" -- \
  run --config "$tmp/tp1.json" --steps $((saved + 1)) --checkpoint-dir "$tmp/sig" --resume --override-training

# Under tp = 2, SIGTERM to `mpengine run` (the launcher) reaches every rank: they finish the same
# step (agreeing through an all-reduce), save, and the run exits 0.
$mpengine run --backend cpu --config "$tmp/tp2.json" --steps 100000 --log-every 1 --checkpoint-dir "$tmp/sig2" > "$tmp/sig2.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^step 3/' "$tmp/sig2.log" && break; sleep 0.2; done
kill -TERM $pid
wait $pid
code=$?
if [ $code -ne 0 ] || ! grep -q "stopped by SIGTERM after step" "$tmp/sig2.log" ||
   ! ls "$tmp/sig2" | grep -q '^step-[0-9]*$'; then
  fail "tp = 2 SIGTERM: exit $code, log:"; tail -5 "$tmp/sig2.log"
fi

# A save killed half-way leaves a step-<N>.tmp-<pid> directory (maybe without a manifest); a
# resume ignores it and takes the newest complete checkpoint.
rm -rf "$tmp/crash" && mkdir -p "$tmp/crash" && cp -r "$tmp/one/step-10" "$tmp/crash/"
mkdir -p "$tmp/crash/step-15.tmp-4242" && head -c 1000 "$tmp/one/step-10/pp-00000-tp-00000.bin" > "$tmp/crash/step-15.tmp-4242/pp-00000-tp-00000.bin"
expect 0 "resumed from $tmp/crash/step-10: 10 of 20 steps done" -- run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/crash" --resume --metrics "$tmp/crash.jsonl"
exact "tp = 1 after a crashed save" "$tmp/one.jsonl" "$tmp/crash.jsonl"

# Export to llm.c's format (from the tp = 2 shards), and --init-from of it.
expect 0 "exported $tmp/two/step-20 (step 20, 212352 parameters) to $tmp/model.bin" -- \
  $mpengine export --checkpoint "$tmp/two" --out "$tmp/model.bin"
expect 0 "initialised from $tmp/model.bin" "done: 1 steps" -- run --config "$tmp/tp1.json" --steps 1 --init-from "$tmp/model.bin"
expect 0 "to $tmp/model10.bin" -- $mpengine export --checkpoint "$tmp/two/step-10" --out "$tmp/model10.bin"

# Refusals.
expect 2 "--resume: no checkpoint in $tmp/empty (no step-<N> directory with a valid manifest.json); drop --resume to start from scratch" -- \
  run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/empty" --resume
expect 2 "--resume needs --checkpoint-dir DIR" -- run --config "$tmp/tp1.json" --resume
rm -rf "$tmp/bad" && mkdir -p "$tmp/bad" && cp -r "$tmp/two/step-10" "$tmp/bad/"
shard="$tmp/bad/step-10/pp-00000-tp-00001.bin"
printf '\x01' | dd of="$shard" bs=1 seek=1000 conv=notrunc 2>/dev/null
expect 2 "$shard: checksum mismatch" "the shard is corrupted" -- \
  run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/bad" --resume
expect 2 "$shard: checksum mismatch" -- \
  run --config "$tmp/tp2.json" --checkpoint-dir "$tmp/bad" --resume
expect 2 "$shard: checksum mismatch" -- $mpengine export --checkpoint "$tmp/bad" --out "$tmp/bad.bin"
rm "$shard"
expect 2 "$shard: missing shard file of pp rank 0, tp rank 1" -- \
  run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/bad" --resume
# Under 8 ranks, the error reaches rank 0 whichever rank checked the file, and all stop.
rm -rf "$tmp/bad3d" && mkdir -p "$tmp/bad3d" && cp -r "$tmp/3d/step-10" "$tmp/bad3d/"
printf '\x01' | dd of="$tmp/bad3d/step-10/pp-00001-tp-00001.bin" bs=1 seek=1000 conv=notrunc 2>/dev/null
expect 2 "$tmp/bad3d/step-10/pp-00001-tp-00001.bin: checksum mismatch" -- \
  run --config "$tmp/dp2-pp2-tp2-zero1.json" --checkpoint-dir "$tmp/bad3d" --resume
expect 2 "$tmp/one/step-20 is a checkpoint of another model: num_layers 4 in the checkpoint (model 'tiny-gpt'), 2 in $tmp/tiny-gpt-2.json" -- \
  run --config "$tmp/other.json" --checkpoint-dir "$tmp/one" --resume
rm -rf "$tmp/fake" && mkdir -p "$tmp/fake/step-5" && echo '{"format": "something-else"}' > "$tmp/fake/step-5/manifest.json"
expect 2 "$tmp/fake/step-5/manifest.json: not a checkpoint manifest (want an object with \"format\": \"mpengine-checkpoint\")" -- \
  $mpengine export --checkpoint "$tmp/fake/step-5" --out "$tmp/fake.bin"
expect 2 "--resume: no checkpoint in $tmp/fake" -- run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/fake" --resume
edited 's/"global_batch": 8, "micro_batch": 2, "num_micro_batches": 4/"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2/' "$tmp/tp1.json" "$tmp/batch4.json"
expect 2 "$tmp/one/step-20 was saved with global batch 8 x seq_len 32, $tmp/batch4.json has 4 x 32" -- \
  run --config "$tmp/batch4.json" --checkpoint-dir "$tmp/one" --resume
expect 0 "done: $tmp/one/step-20 already has all 20 steps; nothing to run" -- run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/one" --resume
expect 2 "has 20 steps done, more than --steps 5" -- run --config "$tmp/tp1.json" --steps 5 --checkpoint-dir "$tmp/one" --resume --override-training

# A user's files (issue 18). A second run into a directory of another run's checkpoints is
# refused before anything is written: a 30-step run saving at 10, 20, 30, then a 20-step run.
expect 0 "checkpoint: saved $tmp/used/step-30" -- run --config "$tmp/tp1.json" --steps 30 --checkpoint-dir "$tmp/used" --save-every 10
before=$(cat "$tmp"/used/step-*/manifest.json | md5sum)
expect 2 "--checkpoint-dir $tmp/used holds 3 checkpoints of another run (step-10, step-20, step-30, run " \
  "Continue that run with --resume, or choose another --checkpoint-dir" -- \
  run --config "$tmp/tp1.json" --steps 20 --checkpoint-dir "$tmp/used" --save-every 10
[ "$(cat "$tmp"/used/step-*/manifest.json | md5sum)" = "$before" ] || fail "the refused run changed $tmp/used"
# The killed save's left-over of the crash test above is gone after that run's save.
[ -e "$tmp/crash/step-15.tmp-4242" ] && fail "step-15.tmp-4242 of a killed save is still in $tmp/crash"
# --metrics: a fresh run refuses a file that holds lines; a resume appends, so the 10 + 10 lines
# of a run stopped at step 10 and resumed equal the uninterrupted run's 20.
expect 2 "--metrics $tmp/one.jsonl already holds" "--overwrite-metrics to replace it" -- \
  run --config "$tmp/tp1.json" --steps 2 --metrics "$tmp/one.jsonl"
[ "$(wc -l < "$tmp/one.jsonl")" -eq 20 ] || fail "the refused run changed $tmp/one.jsonl"
expect 0 "done: 10 steps" -- run --config "$tmp/tp1.json" --steps 10 --checkpoint-dir "$tmp/app" --metrics "$tmp/app.jsonl"
expect 0 "resumed from $tmp/app/step-10: 10 of 20 steps done" -- \
  run --config "$tmp/tp1.json" --checkpoint-dir "$tmp/app" --resume --override-training --metrics "$tmp/app.jsonl"
[ "$(wc -l < "$tmp/app.jsonl")" -eq 20 ] || fail "--resume did not append to --metrics: $(wc -l < "$tmp/app.jsonl") lines, want 20"
expect 0 "done: 2 steps" -- run --config "$tmp/tp1.json" --steps 2 --metrics "$tmp/app.jsonl" --overwrite-metrics
[ "$(wc -l < "$tmp/app.jsonl")" -eq 2 ] || fail "--overwrite-metrics: $(wc -l < "$tmp/app.jsonl") lines, want 2"
# A resume under another learning rate or step count is refused naming both values of each.
edited 's/"learning_rate": 3e-3/"learning_rate": 1e-3/' "$tmp/tp1.json" "$tmp/lr.json"
expect 2 "$tmp/one/step-20 was saved with other training settings than $tmp/lr.json (with --steps): steps 20 (now 30), learning_rate 0.003 (now 0.001)" \
  "give --override-training to continue with the new ones" -- \
  run --config "$tmp/lr.json" --steps 30 --checkpoint-dir "$tmp/one" --resume

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "checkpoint_test: all checks passed"
