#!/usr/bin/env bash
# tests/tools/gpu_host_memory_test.sh — shard-first on the CUDA backend (DESIGN.md principle 6):
# the device holds a GPU rank's state, and its host holds no copy of it, only bounded pieces.
# Run on an mpengine built with `--define mpengine_cuda=emulated` (device memory is host memory
# there, so each rank's peak resident memory includes what its stages hold on the "device"; run
# prints both). A 25M-parameter model whose fp32 weights (96.5 MiB) are several times the
# bounded pieces runs at pp = 2 (12.6M parameters a rank): initialised, trained a step, saved
# (--save-weights and a checkpoint), loaded from the llm.c file (--init-from) and resumed from the
# checkpoint; and at dp = 2 with ZeRO-1 and ZeRO-3, saved and resumed (over NCCL, and ZeRO-1 over
# MPI, whose staging may add two gradient buckets). Each rank's host memory
# outside its device memory (peak resident minus what the emulated allocator itself counts live,
# which the stages' own totals must match within 1 MiB) minus the same rank's in the same run of
# tiny-gpt (the baseline: libraries, MPI, the emulation's own) must stay under 32 MiB, the
# emulated NCCL's copy of a ZeRO-3 block gather (12 MiB here) included. One host fp32 copy of a
# pp = 2 rank's weights adds 48 MiB; host copies of a ZeRO-1 rank's moments 96 MiB, and of a
# ZeRO-3 rank's part of the parameters 48 MiB.
# Run by tools/test.sh in its emulated pass; built normally (no GPU) it fails, saying so.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/gpu_host_memory
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/memory_models.sh" || { echo "cannot load memory_models.sh"; exit 1; }
mpi_ranks_env
memory_models "$tmp"

plan() { # plan FILE MODEL DP PP ZERO_STAGE LAYERS_PER_STAGE
  cat > "$1" <<JSON
{"model": "$2", "cluster": "cpu-local",
 "parallel": {"dp": $3, "pp": $4, "tp": 1, "zero_stage": $5},
 "batch": {"global_batch": $((2 * $3)), "micro_batch": 1, "num_micro_batches": 2, "seq_len": 32},
 "schedule": "1f1b", "layers_per_stage": $6,
 "training": {"steps": 2, "learning_rate": 1e-3}}
JSON
}
for m in wide tiny; do
  plan "$tmp/$m-pp2.json" "$m.json" 1 2 0 "[5, 6]"
  plan "$tmp/$m-dp2-zero1.json" "$m.json" 2 1 1 "[11]"
  plan "$tmp/$m-dp2-zero3.json" "$m.json" 2 1 3 "[11]"
done
margin=32

# outside NAME: "rank host_mib_outside_the_device" lines from a run's output file: the device
# memory is what the emulated allocator itself counts live at the end of the run (run prints it),
# not what the stages say they hold, so a stage that undercounted its device memory cannot hide
# a host copy here. (The stages' own totals must agree with it: checked below.)
outside() {
  join <(peaks "$1" | sort) \
       <(grep '^memory: device allocator per rank' "$1" | grep -o 'rank [0-9]* [0-9.]* / ' |
         sed 's/^rank \([0-9]*\) \([0-9.]*\) \/ /\1 \2/' | sort) |
    awk '{ printf "%s %.0f\n", $1, $2 - $3 }'
}

# phase FILE NAME ARGS_WIDE -- ARGS_TINY: both runs on the (emulated) GPU, then each rank's
# host memory outside the stages against the baseline's.
phase() {
  local file=$1 name=$2
  shift 2
  local wide=() tiny=()
  while [ "$1" != "--" ]; do wide+=("$1"); shift; done
  shift
  tiny=("$@")
  "$mpengine" run --backend cuda "${wide[@]}" > "$tmp/$file-wide.out" 2>&1 || {
    fail "$name: wide run failed:"; tail -5 "$tmp/$file-wide.out"; return; }
  "$mpengine" run --backend cuda "${tiny[@]}" > "$tmp/$file-tiny.out" 2>&1 || {
    fail "$name: tiny run failed:"; tail -5 "$tmp/$file-tiny.out"; return; }
  # The stages' own totals agree with the allocator's count (within 1 MiB: cuBLAS's and the
  # trainer's small buffers): device memory they did not count would not show above.
  local stages allocator
  stages=$(grep '^memory: device held by the stages' "$tmp/$file-wide.out" | grep -o 'rank [0-9]* [0-9.]* MiB' | awk '{ print $3 }' | tr '\n' ' ')
  allocator=$(grep '^memory: device allocator per rank' "$tmp/$file-wide.out" | grep -o 'rank [0-9]* [0-9.]* / ' | awk '{ print $3 }' | tr '\n' ' ')
  if ! awk -v a="$stages" -v b="$allocator" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ")
         if (n != m || n == 0) exit 1
         for (i = 1; i <= n; i++) if (x[i] > y[i] + 0.05 || y[i] - x[i] > 1) exit 1 }'; then
    fail "$name: the stages say they hold [$stages] MiB of device memory, the allocator counts [$allocator]"
  fi
  local lines
  lines=$(join <(outside "$tmp/$file-wide.out") <(outside "$tmp/$file-tiny.out"))
  if [ "$(wc -l <<< "$lines")" -ne 2 ] || [ -z "$lines" ]; then
    fail "$name: no per-rank host and device memory lines for 2 ranks in the runs' output"
    grep '^memory' "$tmp/$file-wide.out"
    return
  fi
  while read -r rank wide_mib tiny_mib; do
    local extra=$((wide_mib - tiny_mib))
    echo "$name: rank $rank host outside the stages $wide_mib MiB, baseline $tiny_mib MiB: +$extra MiB (bound $margin)"
    if [ "$extra" -gt "$margin" ]; then
      fail "$name: rank $rank holds $extra MiB of host memory over its baseline outside what its GPU stages hold: a host copy of the state"
    fi
  done <<< "$lines"
}

out=$("$mpengine" run --config "$tmp/tiny-pp2.json" --backend cuda --steps 1 2>&1)
if grep -q "no CUDA GPU is visible\|built without CUDA" <<<"$out"; then
  echo "FAIL: this mpengine has no (emulated) GPU: build it with --define mpengine_cuda=emulated"
  echo "$out" | tail -3
  exit 1
fi

phase init "init, step, --save-weights, checkpoint (pp 2)" \
  --config "$tmp/wide-pp2.json" --steps 1 --save-weights "$tmp/wide.bin" --checkpoint-dir "$tmp/ck-wide" -- \
  --config "$tmp/tiny-pp2.json" --steps 1 --save-weights "$tmp/tiny.bin" --checkpoint-dir "$tmp/ck-tiny"
phase load "--init-from the llm.c file (pp 2)" \
  --config "$tmp/wide-pp2.json" --steps 1 --init-from "$tmp/wide.bin" -- \
  --config "$tmp/tiny-pp2.json" --steps 1 --init-from "$tmp/tiny.bin"
phase resume "resume from the checkpoint (pp 2)" \
  --config "$tmp/wide-pp2.json" --steps 2 --checkpoint-dir "$tmp/ck-wide" --resume --override-training -- \
  --config "$tmp/tiny-pp2.json" --steps 2 --checkpoint-dir "$tmp/ck-tiny" --resume --override-training
# Over MPI (ranks sharing a GPU) the gradients' all-reduces are staged through pinned host blocks,
# one per bucket (16 MiB) in flight: at most two in flight (MP_TRAINER_STAGED_IN_FLIGHT), so
# the bound is two buckets more. Every bucket in flight at once staged the whole 96 MiB.
margin=$((margin + 32)) phase zero1mpi "ZeRO-1 over dp 2 (MPI, staged): a step, --save-weights" \
  --config "$tmp/wide-dp2-zero1.json" --steps 1 --save-weights "$tmp/wide-zm.bin" -- \
  --config "$tmp/tiny-dp2-zero1.json" --steps 1 --save-weights "$tmp/tiny-zm.bin"
# ZeRO over the (emulated) NCCL communicators, a GPU per rank as on a real node.
for z in 1 3; do
  phase zero$z "ZeRO-$z over dp 2 (NCCL): a step, --save-weights, checkpoint" \
    --config "$tmp/wide-dp2-zero$z.json" --gpu-comm nccl --steps 1 --save-weights "$tmp/wide-z$z.bin" --checkpoint-dir "$tmp/ckz$z-wide" -- \
    --config "$tmp/tiny-dp2-zero$z.json" --gpu-comm nccl --steps 1 --save-weights "$tmp/tiny-z$z.bin" --checkpoint-dir "$tmp/ckz$z-tiny"
  phase resume$z "ZeRO-$z over dp 2 (NCCL): resumed from the checkpoint" \
    --config "$tmp/wide-dp2-zero$z.json" --gpu-comm nccl --steps 2 --checkpoint-dir "$tmp/ckz$z-wide" --resume --override-training -- \
    --config "$tmp/tiny-dp2-zero$z.json" --gpu-comm nccl --steps 2 --checkpoint-dir "$tmp/ckz$z-tiny" --resume --override-training
done

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "every GPU rank's host held no copy of its state"
