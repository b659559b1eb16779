#!/usr/bin/env bash
# tests/tools/parallel_equals_serial_test.sh — DESIGN.md principle 2 for 3D parallelism (issue 10):
# tiny-gpt trained for 20 steps on (dp, pp, tp) in (2,1,1), (1,2,1), (1,1,2), (2,2,2), (1,4,2),
# (1,2,1) interleaved with v = 2 and (1,2,1) zb-h1 — plus gpipe, sequence parallelism, ZeRO-1,
# (2,2,1) interleaved, and selective and full recomputation — gives the loss of the one-rank run
# at every step within 1e-5 relative, and the same final weights (--save-weights, llm.c format)
# within 1e-5: the relative L2 difference of the whole weight vector is at most 1e-5.
# Elementwise the bound is 5% of one learning-rate step (1.5e-4): AdamW moves a weight by about
# lr x m / sqrt(v) whatever the gradient's size, so a weight whose gradient is float round-off
# (sums taken in another order on another layout) moves by a different fraction of lr in each
# run; measured, one weight in 212,352 differs by up to 1.5e-5 after 20 steps, the rest by less
# than 1e-5. The held-out loss (--eval-every 10, 2 batches of a held-out sample: the forward-only
# schedule of each layout, issue 18) equals the one-rank run's within 1e-5 relative at both
# evaluations. Every run has the same global batch of 8 sequences; micro-batches per dp rank =
# 8 / (dp x 2). The stage split of pp > 1 plans is the cost model's (no layers_per_stage).
#
# A second argument names another model of examples/models: tiny-llama (issue 16: RMSNorm,
# SwiGLU, rotary embeddings, 4 query heads over 2 kv heads, an untied head) runs the layouts its
# 2 kv heads and 2 blocks allow, its final weights compared through a checkpoint exported as a
# Hugging Face model.safetensors (llm.c files hold GPT-2 only).
#
# A third argument `zero` runs the ZeRO-2 layouts instead (issue 17): (dp, pp, tp) = (2,1,1),
# (4,1,1), (2,2,1), (2,1,2) with sequence parallelism, (2,2,2) with 1f1b, (2,2,1) interleaved
# with v = 2, and zb-h1 at (2,2,1) and (2,2,2) with sequence parallelism, each with zero_stage 2:
# every rank keeps only its part of the gradients between steps, and the numbers are the
# one-rank run's; hybrid sharding (HSDP) at dp = 4 in groups of 2 (zero_shard_size 2) with
# ZeRO 2 and 1; and ZeRO-3 (the blocks' parameters sharded too) at (2,1,1), (4,1,1), (2,2,1),
# (2,1,2) with sequence parallelism, (2,2,2), (2,2,1) interleaved and (2,2,1) with full
# recomputation.
#
# Every run's "state:" line must name the ZeRO stage, its shard group and the recomputation its
# plan asks for (run reads them from what the trainer built), and a zb-h1 run's trace must hold
# its W actions: options that by design give the same numbers are seen to take effect.
#
# A third argument `cp` runs context parallelism instead (issue 32): each sequence's tokens over
# cp ranks, alone at cp 2 and 4, and with tp 2 (and sequence parallelism), pp 2 (1f1b,
# interleaved, zb-h1), dp 2, ZeRO 1 to 3 and both recomputations; then a checkpoint saved at
# cp 4 resumes at cp 1 and one saved at cp 1 resumes at cp 4, within 1e-5 of the uninterrupted
# runs; and a sequence length that does not cut into 2 x cp chunks is refused before any rank
# starts, naming both numbers.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
model=${2:-tiny-gpt}
mode=${3:-layouts}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/parallel_equals_serial_$model-$mode
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env
cp "examples/models/$model.json" "$tmp/$model.json"
weights=llmc
[ "$model" = tiny-gpt ] || weights=hf

# plan NAME DP PP TP SCHEDULE [VIRTUAL] [SEQUENCE_PARALLEL] [ZERO] [RECOMPUTE] [SHARD]; the
# context-parallel size is $cp (1 unless set).
# The run's "state:" line must say what the plan asks for (run prints what its trainer really
# does: an option dropped on the way shows there even where the numbers cannot show it).
cp=1
declare -A state_of
plan() {
  local name=$1 dp=$2 pp=$3 tp=$4 schedule=$5 v=${6:-1} sp=${7:-false} zero=${8:-0}
  local recompute=${9:-none} shard_json=""
  [ -n "${10:-}" ] && shard_json=", \"zero_shard_size\": ${10}"
  [ "$cp" -gt 1 ] && shard_json="$shard_json, \"cp\": $cp"
  local replicas=$((dp * cp)) cut=("" "optimizer state" "optimizer state and gradients"
                                   "optimizer state, gradients and block parameters")
  if [ "$zero" = 0 ] || [ $replicas = 1 ]; then
    state_of[$name]="state: no ZeRO (each rank keeps its shard's whole state); recomputation $recompute"
  elif [ -n "${10:-}" ]; then
    state_of[$name]="state: ZeRO-$zero (${cut[$zero]} cut over groups of ${10} ranks, $((dp / ${10})) replicas: hybrid sharding); recomputation $recompute"
  else
    state_of[$name]="state: ZeRO-$zero (${cut[$zero]} cut over $replicas ranks); recomputation $recompute"
  fi
  cat > "$tmp/$name.json" <<JSON
{"model": "$model.json", "cluster": "cpu-local",
 "parallel": {"dp": $dp, "pp": $pp, "tp": $tp, "virtual_stages": $v, "sequence_parallel": $sp, "zero_stage": $zero$shard_json},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": $((4 / dp)), "seq_len": 32},
 "schedule": "$schedule", "recompute": "$recompute",
 "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2, "seed": 11}}
JSON
}

losses() { grep -v '"val_loss"' "$1" | awk -F'"loss": ' '{ split($2, a, ","); print a[1] }'; }
grad_norms() { grep -v '"val_loss"' "$1" | awk -F'"grad_norm": ' '{ split($2, a, ","); print a[1] }'; }
val_losses() { grep '"val_loss"' "$1" | awk -F'"val_loss": ' '{ split($2, a, ","); print a[1] }'; }
# The floats of an llm.c checkpoint after its 1024-byte header, or of a Hugging Face directory's
# model.safetensors after its header (8 bytes of length, then that much JSON), one per line.
floats() {
  local skip=1024 file=$1
  if [ -d "$1" ]; then
    file=$1/model.safetensors
    skip=$((8 + $(od -An -t u8 -N 8 "$file")))
  fi
  od -An -v -f -j "$skip" "$file" | tr -s ' ' '\n' | sed '/^$/d'
}

# compare NAME: its losses and final weights against the one-rank run's.
compare() {
  local name=$1 verdict
  if [ "$(grep -c '"loss"' "$tmp/$name.jsonl" 2>/dev/null)" != 20 ] ||
     [ "$(grep -c '"val_loss"' "$tmp/$name.jsonl" 2>/dev/null)" != 2 ]; then
    fail "$name: want 20 step lines and 2 held-out lines of --metrics"
    return
  fi
  local held_out
  held_out=$(paste -d' ' <(val_losses "$tmp/serial.jsonl") <(val_losses "$tmp/$name.jsonl") | awk '
    NF != 2 { bad = 1 }
    { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
    END { printf "%s %.3g", (!bad && n == 2 && worst <= 1e-5 ? "ok" : "bad"), worst }')
  [ "${held_out%% *}" = ok ] || fail "$name: held-out loss differs from one rank by more than 1e-5 relative (${held_out#* })"
  verdict=$(paste -d' ' <(losses "$tmp/serial.jsonl") <(losses "$tmp/$name.jsonl") | awk '
    { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) { worst = r; at = NR } }
    END { printf "%s %.3g %d", (worst <= 1e-5 ? "ok" : "bad"), worst, at }')
  # The gradient norm before clipping (what clipping and a user's curves see): within 1e-5 too.
  local norms
  norms=$(paste -d' ' <(grad_norms "$tmp/serial.jsonl") <(grad_norms "$tmp/$name.jsonl") | awk '
    { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) { worst = r; at = NR } }
    END { printf "%s %.3g %d", (NR == 20 && worst <= 1e-5 ? "ok" : "bad"), worst, at }')
  [ "${norms%% *}" = ok ] || fail "$name: gradient norm differs from one rank by more than 1e-5 relative (${norms#* })"
  local weights
  weights=$(paste -d' ' <(floats "$tmp/serial.bin") <(floats "$tmp/$name.bin") | awk '
    NF != 2 { bad = 1 }
    { d = $2 - $1; squares += d * d; norm += $1 * $1; if (d < 0) d = -d
      if (d > worst) worst = d; if (d > 1e-5) over++; n++ }
    END { l2 = norm > 0 ? sqrt(squares / norm) : 1
          printf "%s relative L2 %.3g, max %.3g, %d of %d over 1e-5",
                 (!bad && n > 0 && l2 <= 1e-5 && worst <= 1.5e-4 ? "ok" : "bad"), l2, worst, over, n }')
  echo "$name: loss max rel diff ${verdict#* } (step); norm ${norms#* }; held-out ${held_out#* }; weights ${weights#* }"
  [ "${verdict%% *}" = ok ] || fail "$name: loss differs from one rank by more than 1e-5 relative (${verdict#* })"
  [ "${weights%% *}" = ok ] || fail "$name: final weights differ from one rank: ${weights#* }"
}

run() { # run NAME: trains the plan NAME, keeping metrics and weights (in $tmp/NAME.bin)
  local name=$1 out code
  local save=(--save-weights "$tmp/$name.bin")
  if [ "$weights" = hf ]; then
    rm -rf "$tmp/ck-$name" "$tmp/$name.bin"
    save=(--checkpoint-dir "$tmp/ck-$name")
  fi
  out=$($mpengine run --config "$tmp/$name.json" --metrics "$tmp/$name.jsonl" --overwrite-metrics \
        "${save[@]}" --comm-timeout 120 --eval-every 10 --eval-batches 2 2>&1)
  code=$?
  if [ $code -ne 0 ] || ! grep -q "^done: 20 steps" <<<"$out"; then
    fail "$name: exit $code, output:"; echo "$out" | tail -15
  fi
  if ! grep -qxF -- "${state_of[$name]}" <<<"$out"; then
    fail "$name: want the line '${state_of[$name]}', got '$(grep '^state:' <<<"$out")'"
  fi
  if [ "$weights" = hf ] && ! $mpengine export --checkpoint "$tmp/ck-$name" --format hf \
       --out "$tmp/$name.bin" > /dev/null; then
    fail "$name: export --format hf of its checkpoint failed"
  fi
}

layouts=("dp2 2 1 1 1f1b" "pp2 1 2 1 1f1b" "tp2 1 1 2 1f1b" "dp2-pp2-tp2 2 2 2 1f1b"
         "pp4-tp2 1 4 2 1f1b" "pp2-interleaved-v2 1 2 1 interleaved-1f1b 2"
         "pp2-zb-h1 1 2 1 zb-h1" "pp2-gpipe 1 2 1 gpipe"
         "dp2-tp2-sp-zero1 2 1 2 1f1b 1 true 1" "pp2-tp2-sp-zb-h1 1 2 2 zb-h1 1 true"
         "pp2-tp2-recompute-selective 1 2 2 zb-h1 1 false 0 selective"
         "pp4-recompute-full 1 4 1 1f1b 1 false 0 full"
         "dp2-pp2-interleaved-v2 2 2 1 interleaved-1f1b 2")
if [ "$model" != tiny-gpt ]; then
  # Two blocks: a pipeline of at most 2 stages of blocks (pp 4 puts the embedding and the head
  # on stages of their own).
  layouts=("dp2 2 1 1 1f1b" "pp2 1 2 1 1f1b" "tp2 1 1 2 1f1b" "dp2-pp2-tp2 2 2 2 1f1b"
           "pp2-interleaved-v2 1 2 1 interleaved-1f1b 2" "pp2-zb-h1 1 2 1 zb-h1"
           "dp2-tp2-sp-zero1 2 1 2 1f1b 1 true 1" "pp2-tp2-sp-zb-h1 1 2 2 zb-h1 1 true"
           "pp2-tp2-recompute-selective 1 2 2 zb-h1 1 false 0 selective"
           "pp4-recompute-full 1 4 1 1f1b 1 false 0 full")
fi
if [ "$mode" = zero ]; then
  layouts=("dp2-zero2 2 1 1 1f1b 1 false 2" "dp4-zero2 4 1 1 1f1b 1 false 2"
           "dp2-pp2-zero2 2 2 1 1f1b 1 false 2" "dp2-tp2-sp-zero2 2 1 2 1f1b 1 true 2"
           "dp2-pp2-tp2-zero2 2 2 2 1f1b 1 false 2"
           "dp2-pp2-interleaved-v2-zero2 2 2 1 interleaved-1f1b 2 false 2"
           "dp2-pp2-zb-h1-zero2 2 2 1 zb-h1 1 false 2"
           "dp2-pp2-tp2-sp-zb-h1-zero2 2 2 2 zb-h1 1 true 2"
           "dp4-zero2-hsdp2 4 1 1 1f1b 1 false 2 none 2"
           "dp4-zero1-hsdp2 4 1 1 1f1b 1 false 1 none 2"
           "dp2-zero3 2 1 1 1f1b 1 false 3" "dp4-zero3 4 1 1 1f1b 1 false 3"
           "dp2-pp2-zero3 2 2 1 1f1b 1 false 3" "dp2-tp2-sp-zero3 2 1 2 1f1b 1 true 3"
           "dp2-pp2-tp2-zero3 2 2 2 1f1b 1 false 3"
           "dp2-pp2-interleaved-v2-zero3 2 2 1 interleaved-1f1b 2 false 3"
           "dp2-pp2-recompute-full-zero3 2 2 1 1f1b 1 false 3 full")
fi
if [ "$mode" = cp ]; then
  # NAME CP DP PP TP SCHEDULE [VIRTUAL] [SEQUENCE_PARALLEL] [ZERO] [RECOMPUTE]
  layouts=("cp2 2 1 1 1 1f1b" "cp4 4 1 1 1 1f1b" "cp2-tp2-sp 2 1 1 2 1f1b 1 true"
           "cp2-pp2 2 1 2 1 1f1b" "cp2-pp2-interleaved-v2 2 1 2 1 interleaved-1f1b 2"
           "cp2-pp2-zb-h1 2 1 2 1 zb-h1" "cp2-dp2 2 2 1 1 1f1b"
           "cp2-dp2-zero1 2 2 1 1 1f1b 1 false 1" "cp2-dp2-zero2 2 2 1 1 1f1b 1 false 2"
           "cp2-dp2-zero3 2 2 1 1 1f1b 1 false 3" "cp4-zero3 4 1 1 1 1f1b 1 false 3"
           "cp2-pp2-tp2-recompute-selective 2 1 2 2 1f1b 1 false 0 selective"
           "cp2-pp2-recompute-full 2 1 2 1 1f1b 1 false 0 full")
fi
plan serial 1 1 1 1f1b
run serial
for spec in "${layouts[@]}"; do
  set -- $spec
  if [ "$mode" = cp ]; then
    name=$1 cp=$2
    shift 2
    set -- "$name" "$@"
  fi
  plan "$@"
  run "$1"
  compare "$1"
  cp=1
done
if [ "$mode" = cp ]; then
  # The banner and the memory line name the cp size and each rank's cp rank.
  out=$($mpengine run --config "$tmp/cp2-dp2.json" --steps 1 2>&1)
  grep -qF "4 ranks (dp 2 x cp 2 x pp 1 x tp 1; schedule 1f1b" <<<"$out" ||
    { fail "cp2-dp2: the banner does not name cp:"; echo "$out" | head -5; }
  grep -qF "rank 3 (dp 1, cp 1, pp 0, tp 0)" <<<"$out" ||
    { fail "cp2-dp2: the memory line does not name rank 3's cp rank:"; echo "$out" | tail -3; }
  # Checkpoints: the weights are replicated over cp, so a checkpoint does not depend on it.
  cp=4; plan cp4-zero1 1 1 1 1f1b 1 false 1; cp=1
  for name in serial cp4-zero1; do
    rm -rf "$tmp/ck-save-$name"
    $mpengine run --config "$tmp/$name.json" --checkpoint-dir "$tmp/ck-save-$name" --save-every 10 \
      --metrics "$tmp/save-$name.jsonl" --overwrite-metrics > "$tmp/save-$name.log" 2>&1 ||
      { fail "$name: the run saving checkpoints failed:"; tail -5 "$tmp/save-$name.log"; }
  done
  resumed() { # resumed NAME FROM PLAN: FROM's step-10 resumed under PLAN, steps 10..19 vs FROM's
    rm -rf "$tmp/ck-$1" && mkdir -p "$tmp/ck-$1" && cp -r "$tmp/ck-save-$2/step-10" "$tmp/ck-$1/"
    if ! $mpengine run --config "$tmp/$3.json" --checkpoint-dir "$tmp/ck-$1" --resume \
         --metrics "$tmp/$1.jsonl" --overwrite-metrics > "$tmp/$1.log" 2>&1; then
      fail "$1: the resumed run failed:"; tail -5 "$tmp/$1.log"; return
    fi
    local verdict
    verdict=$(paste -d' ' <(tail -n 10 "$tmp/save-$2.jsonl" | losses /dev/stdin) <(losses "$tmp/$1.jsonl") | awk '
      { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++ }
      END { printf "%s %.3g", (n == 10 && worst <= 1e-5 ? "ok" : "bad"), worst }')
    echo "$1: steps 10..19 against the uninterrupted run, max relative loss difference ${verdict#* }"
    [ "${verdict%% *}" = ok ] || fail "$1: resumed losses differ by more than 1e-5 (${verdict#* })"
  }
  resumed cp4-to-one cp4-zero1 serial
  resumed one-to-cp4 serial cp4-zero1
  # A sequence that does not cut into 2 x cp chunks: refused before any rank starts.
  cp=4; plan bad-cp 1 1 1 1f1b; cp=1
  sed -i 's/"seq_len": 32/"seq_len": 36/' "$tmp/bad-cp.json"
  expect 2 "$tmp/bad-cp.json: \$.batch.seq_len: 36 tokens do not divide into 2 x cp = 8 chunks" -- $mpengine run --config "$tmp/bad-cp.json" --steps 1
fi
if [ "$model" != tiny-gpt ] || [ "$mode" != layouts ]; then
  if [ $failures -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "parallel_equals_serial_test ($model, $mode): all checks passed"
  exit 0
fi

# zb-h1 really splits the backward: its trace holds a weight-gradient action (W) for every
# micro-batch on every pipeline rank, each step (2 ranks x 4 micro-batches x 2 steps), where
# 1f1b's holds none. Their numbers are the same by design, so only the trace can tell.
for name in pp2-zb-h1 pp2; do
  rm -f "$tmp/$name-trace.json"
  $mpengine run --config "$tmp/$name.json" --steps 2 --trace "$tmp/$name-trace.json" > /dev/null 2>&1 ||
    fail "$name: the traced run failed"
done
w_actions() { grep -o '"name":"W[0-9]*"' "$1" 2>/dev/null | wc -l; }
[ "$(w_actions "$tmp/pp2-zb-h1-trace.json")" -eq 16 ] ||
  fail "pp2-zb-h1: its trace holds $(w_actions "$tmp/pp2-zb-h1-trace.json") W actions, want 16"
[ "$(w_actions "$tmp/pp2-trace.json")" -eq 0 ] ||
  fail "pp2 (1f1b): its trace holds $(w_actions "$tmp/pp2-trace.json") W actions, want none"

# The log of a 3D run names the layout once, from rank 0.
out=$($mpengine run --config "$tmp/dp2-pp2-tp2.json" --steps 2 2>&1)
expect_text() { grep -qF -- "$1" <<<"$out" || { fail "want '$1' in:"; echo "$out" | tail -8; }; }
expect_text "8 ranks (dp 2 x pp 2 x tp 2; schedule 1f1b, 1 chunk per pipeline rank)"
expect_text "TFLOP/s/rank"
expect_text "MiB/rank max"
[ "$(grep -c '^step 2/2 ' <<<"$out")" -eq 1 ] || fail "want one 'step 2/2' line (rank 0 only)"

# Bad layouts are refused before any rank starts, naming the plan and the numbers.
plan bad-split 1 2 1 1f1b
sed -i 's/"schedule": "1f1b"/"schedule": "1f1b", "layers_per_stage": [7, 0]/' "$tmp/bad-split.json"
expect 2 "bad-split.json: $.layers_per_stage[1]: must be a positive integer" -- $mpengine run --config "$tmp/bad-split.json" --steps 1
sed -i 's/\[7, 0\]/[3, 3]/' "$tmp/bad-split.json"
expect 2 "$tmp/bad-split.json: layers_per_stage sums to 6, but model tiny-gpt has 7 layers (embedding, 4 blocks, final norm and LM head each count one)" -- $mpengine run --config "$tmp/bad-split.json" --steps 1
plan bad-interleave 1 2 1 interleaved-1f1b 2
sed -i 's/"num_micro_batches": 4/"num_micro_batches": 4/; s/"global_batch": 8/"global_batch": 6/; s/"num_micro_batches": 4/"num_micro_batches": 3/' "$tmp/bad-interleave.json"
expect 2 "interleaved-1f1b needs the number of micro-batches to be a multiple of pp = 2; got 3" -- $mpengine run --config "$tmp/bad-interleave.json" --steps 1
plan full-zb 1 2 1 zb-h1 1 false 0 full
expect 2 "$tmp/full-zb.json: recompute \"full\" cannot run schedule zb-h1" -- $mpengine run --config "$tmp/full-zb.json" --steps 1
# The CUDA backend runs every layout above (engine/model/stage_gpu.h; checked by
# tests/tools/cuda_emulated_run_test.sh); this one it refuses as the CPU does, before any GPU is
# looked for.
expect 2 "$tmp/full-zb.json: recompute \"full\" cannot run schedule zb-h1" -- $mpengine run --config "$tmp/full-zb.json" --backend cuda --steps 1

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "parallel_equals_serial_test: all checks passed"
