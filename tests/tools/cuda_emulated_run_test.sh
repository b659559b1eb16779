#!/usr/bin/env bash
# tests/tools/cuda_emulated_run_test.sh — `mpengine run --backend cuda` on every layout the CUDA
# backend runs, on an mpengine built with `--define mpengine_cuda=emulated` (third_party/cuda.bzl:
# the CUDA C APIs run on the CPU, device memory is host memory, bf16 stays bf16). What it checks is
# everything above the kernels, which a GPU-less machine cannot otherwise run: the GPU pipeline
# stage (engine/model/stage_gpu.h) with its slots, boundaries, tensor-parallel collectives on device
# buffers and vocabulary-parallel loss, and the trainer's GPU step (dp sums, the tied embedding,
# the global norm, AdamW on the device).
#
#   - tiny-gpt, 10 steps: the one-rank GPU run's losses within 8e-3 relative of the CPU run's
#     (bf16 activations against fp32);
#   - every layout below also against the CPU run of the same layout (within 8e-3);
#   - pp = 2, tp = 2, pp = 2 x tp = 2, interleaved pp = 2 with v = 2, dp = 2 (the one-GPU model,
#     gradients over MPI) and dp = 2 x pp = 2: each within 3e-3 of the one-rank GPU run (the same
#     bf16 kernels, other rounding points around the collectives), the 4-rank run also within 8e-3
#     of the CPU run of the same plan, and its --save-weights within 1e-2 relative L2 of the CPU's;
#   - sequence parallelism on the GPU (tp = 2, pp = 2 x tp = 2): each within 3e-3 of the one-rank
#     GPU run and within 1e-6 of the same layout without it, the 4-rank one also within 8e-3 of
#     the CPU run of the same plan;
#   - pp = 2 x tp = 2 (with and without sequence parallelism), dp = 2 x pp = 2 and interleaved over
#     the NCCL communicators (emulated on MPI, so the losses equal the MPI runs' within 1e-6);
#   - the watchdog over NCCL: a hung pipeline or tensor-parallel rank makes its peer fail after
#     --comm-timeout naming the action, group and peer, with the communicators aborted (exit 1);
#   - ZeRO-1 on the GPU (dp = 2, dp = 2 x pp = 2): AdamW on this rank's part, parameters gathered;
#   - ZeRO-2 on the GPU (dp = 2, dp = 2 x pp = 2, also over NCCL and with zb-h1, and a checkpoint
#     resumed bit for bit): each block's gradients reduce-scattered from a device window into this rank's part,
#     the rest at the step's end, the norm and AdamW on the part; within 3e-3 of the one-rank GPU
#     run and 1e-4 of the same layout's ZeRO-1 (the same sums in another order, then bf16);
#   - ZeRO-3 on the GPU (dp = 2, dp = 2 x pp = 2, also over NCCL and resumed from a checkpoint bit
#     for bit, and dp = 2 x tp = 2 with sequence parallelism): the device holds its part of the
#     blocks' parameters, each block's bf16 weights gathered into a device window before every
#     pass; the same numbers as ZeRO-2 (1e-6, and --save-weights byte-identical: the gathered bf16
#     weights are the ones ZeRO-2's whole copy holds);
#   - zero-bubble zb-h1 on the GPU (pp = 2, pp = 2 x tp = 2 with and without sequence parallelism,
#     dp = 2 x pp = 2; the last two over NCCL too), B and W split (deferred weight gradients), and
#     full recomputation (pp = 4): each within 3e-3 of the
#     one-rank GPU run and within 1e-6 of the same layout on 1f1b / without recomputation (B then
#     W adds what the whole backward adds, the recomputed forward gives the kept activations: the
#     same numbers);
#   - checkpoints: a GPU run resumed from its step-5 checkpoint continues bit for bit (one rank,
#     pp = 2 x tp = 2, dp = 2 x pp = 2 with ZeRO-1), and the pp x tp checkpoint resumes on one CPU rank (within 3e-3);
#   - the held-out loss (--eval-every: the forward-only schedule) of every run above compared as its
#     losses are, and at fixed weights against the one-rank GPU run within 1e-6 (1e-4 with tp);
#   - refusals: full recomputation with zb-h1 on the cuda backend, as on the CPU (exit 2, naming
#     why); --backend auto runs a zb-h1 plan on the (emulated) GPU.
#   - tiny-llama (the Llama family's kernels and tensors on the GPU): one rank against the CPU
#     within 8e-3, pp = 2 x tp = 2 (also with sequence parallelism and zb-h1) and dp = 2 x pp = 2
#     within 3e-3 of its one-rank GPU run;
#   - context parallelism (cp 2, cp 4, cp 2 with tp 2 and sequence parallelism, with dp 2 and
#     ZeRO-2; tiny-llama cp 2 x pp 2): within 3e-3 of the one-rank GPU run and 8e-3 of the CPU
#     run of the same layout; cp 2 x tp 2 over NCCL equal to over MPI (1e-6);
#   - mixture of experts on the GPU (issue 33, ep 1: tests/tools/testdata/tiny-moe.json, 8 experts
#     top-1 with a gated shared expert, aux and z losses, layers/moe_cuda.h in the stage chain):
#     one rank within 8e-3 of the CPU run; pp = 2 on zb-h1, tp = 2 with sequence parallelism,
#     dp = 2 with ZeRO-2 (also x pp = 2 on zb-h1), pp = 2 x tp = 2 with full recomputation and
#     cp = 2 within 3e-3 of its one-rank GPU run, and dp = 2 with ZeRO-3 the same numbers as
#     with ZeRO-2 (1e-6); with expert parallelism (ep 2 folded over dp 2, alone, with pp 2 on
#     zb-h1 or tp 2 with sequence parallelism; dp 4 x ep 2 with ZeRO-1) within 3e-3 of the
#     one-rank GPU run, dp 2 x ep 2 (also x pp 2) within 8e-3 of the CPU run of the same layout,
#     over NCCL equal to over MPI (1e-6), dp 2 x ep 2 x pp 2's checkpoint resumed on the GPU bit
#     for bit and on one CPU rank within 8e-3, and dp 4 x ep 2 with ZeRO-2 and ZeRO-3 within
#     3e-3 of the one-rank GPU run (ZeRO-3 the same numbers as ZeRO-2, 1e-6; ZeRO-2 over NCCL
#     the same numbers as over MPI);
#   - transformers' tiny Llama 3 golden loaded into the GPU (--init-from, pp = 2 x tp = 2): step
#     1's loss within 1e-3 of transformers', its checkpoint exported byte for byte to the golden.
#     The same for the tiny Mixtral and Qwen2-MoE goldens at pp = 2 x tp = 2 with sequence
#     parallelism (the load-balancing loss in step 1's loss).
# Run by tools/test.sh in its emulated pass; built normally (no GPU) it fails, saying so.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/engine/testdata}
tmp=${TEST_TMPDIR:-$(mktemp -d)}/cuda_emulated
mkdir -p "$tmp"
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env
cp examples/models/tiny-gpt.json "$tmp/tiny-gpt.json"
cp examples/models/tiny-llama.json "$tmp/tiny-llama.json"

# The run's "state:" line (what the trainer really runs, read from its GPU stages) must say what
# the plan asks for: ZeRO 2 and 3 and recomputation change no number, so only this shows them.
declare -A state_of
plan() { # plan NAME DP PP TP [SCHEDULE] [VIRTUAL] [SEQUENCE_PARALLEL] [ZERO_STAGE] [RECOMPUTE]
  # (MODEL=tiny-llama for the Llama family's model)
  # (CP=N for context parallelism, EP=N for expert parallelism folded over dp)
  local dp=$2 zero=${8:-0} replicas=$(($2 * ${CP:-1}))
  local cut=("" "optimizer state" "optimizer state and gradients"
             "optimizer state, gradients and block parameters")
  if [ "$zero" = 0 ] || [ $replicas = 1 ]; then
    state_of[$1]="state: no ZeRO (each rank keeps its shard's whole state); recomputation ${9:-none}"
  else
    state_of[$1]="state: ZeRO-$zero (${cut[$zero]} cut over $replicas ranks); recomputation ${9:-none}"
  fi
  cat > "$tmp/$1.json" <<JSON
{"model": "${MODEL:-tiny-gpt}.json", "cluster": "cpu-local",
 "parallel": {"dp": $dp, "cp": ${CP:-1}, "ep": ${EP:-1}, "pp": $3, "tp": $4, "virtual_stages": ${6:-1}, "sequence_parallel": ${7:-false}, "zero_stage": ${8:-0}},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": $((4 / dp)), "seq_len": 32},
 "schedule": "${5:-1f1b}", "recompute": "${9:-none}",
 "training": {"steps": 10, "learning_rate": 3e-3, "warmup_steps": 2, "seed": 5}}
JSON
}

# column KEY FILE: the values of "KEY" in a --metrics file, one per line.
column() { grep "\"$1\"" "$2" | awk -F"\"$1\": " '{ split($2, a, ","); print a[1] }'; }
losses() { column loss "$1"; }
floats() { od -An -v -f -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }

# compare NAME REFERENCE.jsonl RUN.jsonl BOUND: every step's loss and both held-out losses (after
# steps 5 and 10: the layout's forward-only schedule on the GPU stage) within BOUND relative, and its
# gradient norm (which AdamW's scale invariance would hide from the loss: a gradient summed twice
# doubles it) within 5e-2, or BOUND when that is tighter (bf16 gradients move the norm by ~2%).
# The bounds (issue 34): the emulation is deterministic, so each comparison is bounded at about
# ten times what it measures here, not at what a real GPU's noise would need (tools/
# device_check.sh keeps those): a GPU layout against the one-rank GPU run, measured at most
# 3.3e-4 (loss; tensor parallelism's bf16 rounding points), bound 3e-3; the GPU against the CPU
# run of the same layout (bf16 against fp32), measured at most 7.8e-4, bound 8e-3.
VS_ONE=3e-3 VS_CPU=8e-3
compare() {
  local name=$1 reference=$2 run=$3 loss_bound=$4 verdict field bound
  if [ "$(grep -c '"loss"' "$run" 2>/dev/null)" != 10 ] || [ "$(grep -c '"val_loss"' "$run")" != 2 ]; then
    fail "$name: want 10 step lines and 2 held-out lines of --metrics in $run"
    return
  fi
  for field in loss grad_norm val_loss; do
    bound=$loss_bound
    [ $field = grad_norm ] && bound=$(awk -v b="$loss_bound" 'BEGIN { print (b < 5e-2 && b > 1e-6 ? 5e-2 : b) }')
    verdict=$(paste -d' ' <(column $field "$reference") <(column $field "$run") | awk -v bound="$bound" '
      { d = $2 - $1; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) { worst = r; at = NR } }
      END { printf "%s %.3g %d", (worst <= bound ? "ok" : "bad"), worst, at }')
    echo "$name: max relative $field difference ${verdict#* } (step; bound $bound)"
    [ "${verdict%% *}" = ok ] || fail "$name: $field differs by more than $bound relative (${verdict#* })"
  done
}

# run NAME BACKEND [ARGS...]: mpengine run of plan NAME (it launches its ranks under mpirun) into
# NAME-BACKEND.jsonl, communicating over MPI; with GPU_COMM=nccl over the (emulated) NCCL
# communicators instead, into NAME-BACKEND-nccl.jsonl.
run() {
  local name=$1 backend=$2 out code comm=${GPU_COMM:-mpi} suffix=""
  shift 2
  [ "$comm" = nccl ] && suffix=-nccl
  out=$($mpengine run --config "$tmp/$name.json" --backend "$backend" --gpu-comm "$comm" \
        --metrics "$tmp/$name-$backend$suffix.jsonl" --overwrite-metrics --comm-timeout 60 \
        --eval-every 5 --eval-batches 2 "$@" 2>&1)
  code=$?
  if [ $code -ne 0 ] || ! grep -q "^done: 10 steps" <<<"$out"; then
    fail "$name on $backend: exit $code, output:"
    echo "$out" | tail -15
  fi
  if [ -n "${state_of[$name]:-}" ] && ! grep -qxF -- "${state_of[$name]}" <<<"$out"; then
    fail "$name on $backend: want the line '${state_of[$name]}', got '$(grep '^state:' <<<"$out")'"
  fi
}

plan one 1 1 1
out=$($mpengine run --config "$tmp/one.json" --backend cuda --steps 1 2>&1)
if grep -q "no CUDA GPU is visible\|built without CUDA" <<<"$out"; then
  echo "FAIL: this mpengine has no (emulated) GPU: build it with --define mpengine_cuda=emulated"
  echo "$out" | tail -3
  exit 1
fi

run one cpu
run one cuda
compare "one rank: GPU (emulated bf16) vs CPU" "$tmp/one-cpu.jsonl" "$tmp/one-cuda.jsonl" $VS_CPU

plan pp2 1 2 1
plan tp2 1 1 2
plan pp2tp2 1 2 2
plan interleaved 1 2 1 interleaved-1f1b 2
plan dp2 2 1 1
plan dp2pp2 2 2 1
plan dp2zero1 2 1 1 1f1b 1 false 1
plan dp2pp2zero1 2 2 1 1f1b 1 false 1
plan dp2zero2 2 1 1 1f1b 1 false 2
plan dp2pp2zero2 2 2 1 1f1b 1 false 2
plan dp2zero3 2 1 1 1f1b 1 false 3
plan dp2pp2zero3 2 2 1 1f1b 1 false 3
plan dp2tp2spzero3 2 1 2 1f1b 1 true 3
plan tp2sp 1 1 2 1f1b 1 true
plan pp2tp2sp 1 2 2 1f1b 1 true
# Each against the one-rank GPU run and against the CPU run of the same layout (so a layout
# whose GPU and CPU runs were wrong alike would still differ from one rank).
for name in pp2 tp2 interleaved dp2 dp2pp2 dp2zero1 dp2pp2zero1 dp2zero2 dp2pp2zero2 dp2zero3 \
  dp2tp2spzero3 tp2sp; do
  run $name cuda
  run $name cpu
  compare "$name on the GPU vs one rank" "$tmp/one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
  compare "$name on the GPU vs on the CPU" "$tmp/$name-cpu.jsonl" "$tmp/$name-cuda.jsonl" $VS_CPU
done
# ZeRO-1 runs AdamW's same operations on each element, only on another rank: the same numbers.
compare "dp2zero1 vs dp2 on the GPU" "$tmp/dp2-cuda.jsonl" "$tmp/dp2zero1-cuda.jsonl" 1e-6
compare "dp2pp2zero1 vs dp2pp2 on the GPU" "$tmp/dp2pp2-cuda.jsonl" "$tmp/dp2pp2zero1-cuda.jsonl" 1e-6
compare "dp2zero2 vs dp2zero1 on the GPU" "$tmp/dp2zero1-cuda.jsonl" "$tmp/dp2zero2-cuda.jsonl" 1e-4
compare "dp2pp2zero2 vs dp2pp2zero1 on the GPU" "$tmp/dp2pp2zero1-cuda.jsonl" \
  "$tmp/dp2pp2zero2-cuda.jsonl" 1e-4
# ZeRO-3: the block weights each pass gathers are the bf16 of the same master weights ZeRO-2
# keeps whole, and the gradients take the same reduce-scatters: the same numbers, the same file.
compare "dp2zero3 vs dp2zero2 on the GPU" "$tmp/dp2zero2-cuda.jsonl" "$tmp/dp2zero3-cuda.jsonl" 1e-6
run dp2pp2zero2 cuda --save-weights "$tmp/dp2pp2zero2-cuda.bin"
run dp2pp2zero3 cuda --save-weights "$tmp/dp2pp2zero3-cuda.bin"
compare "dp2pp2zero3 vs one rank on the GPU" "$tmp/one-cuda.jsonl" "$tmp/dp2pp2zero3-cuda.jsonl" $VS_ONE
compare "dp2pp2zero3 vs dp2pp2zero2 on the GPU" "$tmp/dp2pp2zero2-cuda.jsonl" \
  "$tmp/dp2pp2zero3-cuda.jsonl" 1e-6
if [ -s "$tmp/dp2pp2zero3-cuda.bin" ] && cmp -s "$tmp/dp2pp2zero2-cuda.bin" "$tmp/dp2pp2zero3-cuda.bin"; then
  echo "dp2pp2zero3 on the GPU: --save-weights byte-identical to ZeRO-2's"
else
  fail "dp2pp2zero3 on the GPU: --save-weights missing or not ZeRO-2's"
fi
run pp2tp2 cuda --save-weights "$tmp/pp2tp2-cuda.bin"
run pp2tp2 cpu --save-weights "$tmp/pp2tp2-cpu.bin"
compare "pp2tp2 on the GPU vs one rank" "$tmp/one-cuda.jsonl" "$tmp/pp2tp2-cuda.jsonl" $VS_ONE
compare "pp2tp2 on the GPU vs on the CPU" "$tmp/pp2tp2-cpu.jsonl" "$tmp/pp2tp2-cuda.jsonl" $VS_CPU
if [ -s "$tmp/pp2tp2-cuda.bin" ] && [ -s "$tmp/pp2tp2-cpu.bin" ]; then
  verdict=$(paste -d' ' <(floats "$tmp/pp2tp2-cpu.bin") <(floats "$tmp/pp2tp2-cuda.bin") | awk '
    NF != 2 { bad = 1 }
    { d = $2 - $1; squares += d * d; norm += $1 * $1; n++ }
    END { r = sqrt(squares / norm); printf "%s %.3g %d", (!bad && n > 0 && r <= 1e-2 ? "ok" : "bad"), r, n }')
  echo "pp2tp2 final weights, GPU vs CPU: relative L2 difference ${verdict#* } floats"
  [ "${verdict%% *}" = ok ] || fail "pp2tp2 weights: GPU vs CPU relative L2 over 1e-2 (${verdict#* })"
else
  fail "pp2tp2: --save-weights wrote no file"
fi
# Sequence parallelism: layernorms and residuals on each rank's token slice, the GEMM inputs
# all-gathered and the row-parallel outputs reduce-scattered, the layernorm gradients summed over
# tp once per step; the boundaries between the stages are token slices.
run pp2tp2sp cuda
run pp2tp2sp cpu
compare "pp2tp2sp on the GPU vs one rank" "$tmp/one-cuda.jsonl" "$tmp/pp2tp2sp-cuda.jsonl" $VS_ONE
compare "pp2tp2sp on the GPU vs on the CPU" "$tmp/pp2tp2sp-cpu.jsonl" "$tmp/pp2tp2sp-cuda.jsonl" $VS_CPU
# Against the same layouts without it: the same bf16 roundings at the same points (a reduce-scatter
# sums what the all-reduce sums), only the layernorm gradients' fp32 sums run in another order. So
# 1e-6 (measured: equal in every printed digit), which a missing sum of the layernorm gradients over
# tp (1e-4 in the loss, 1e-3 in the norm) would fail where the 1e-2 bounds above do not.
compare "tp2sp vs tp2 on the GPU" "$tmp/tp2-cuda.jsonl" "$tmp/tp2sp-cuda.jsonl" 1e-6
compare "pp2tp2sp vs pp2tp2 on the GPU" "$tmp/pp2tp2-cuda.jsonl" "$tmp/pp2tp2sp-cuda.jsonl" 1e-6

# Zero-bubble (zb-h1: B and W split, each slot keeping the GEMMs' output gradients until its W) and
# full recomputation (light slots, the forward rerun at each backward) on the GPU: close to the
# one-rank run, and the same numbers as the same layout on 1f1b / keeping its activations (1e-6:
# each gradient gets the same terms in the same order; measured equal in every printed digit).
plan pp2zb 1 2 1 zb-h1
plan pp2tp2zb 1 2 2 zb-h1
plan pp2tp2spzb 1 2 2 zb-h1 1 true
plan dp2pp2zb 2 2 1 zb-h1
plan dp2pp2zbzero2 2 2 1 zb-h1 1 false 2
plan pp4 1 4 1
plan pp4full 1 4 1 1f1b 1 false 0 full
for name in pp2zb pp2tp2zb pp2tp2spzb dp2pp2zb dp2pp2zbzero2 pp4 pp4full; do
  run $name cuda
  run $name cpu
  compare "$name on the GPU vs one rank" "$tmp/one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
  compare "$name on the GPU vs on the CPU" "$tmp/$name-cpu.jsonl" "$tmp/$name-cuda.jsonl" $VS_CPU
done
# dp2pp2zb: the blocks' all-reduces go during the chunk's last W (not its B), the rest after it.
for twin in pp2:pp2zb pp2tp2:pp2tp2zb pp2tp2sp:pp2tp2spzb dp2pp2:dp2pp2zb; do
  compare "${twin#*:} vs ${twin%:*} (1f1b) on the GPU" "$tmp/${twin%:*}-cuda.jsonl" \
    "$tmp/${twin#*:}-cuda.jsonl" 1e-6
done
compare "pp4full vs pp4 (recompute none) on the GPU" "$tmp/pp4-cuda.jsonl" \
  "$tmp/pp4full-cuda.jsonl" 1e-6
# ZeRO-2 with zb-h1: the GEMM weights' gradients through the window in W, the norms' and biases'
# from B at the step's end.
compare "dp2pp2zbzero2 vs dp2pp2zero2 (1f1b) on the GPU" "$tmp/dp2pp2zero2-cuda.jsonl" \
  "$tmp/dp2pp2zbzero2-cuda.jsonl" 1e-4

# The same layouts over the NCCL communicators (emulated over MPI: the same sums, so the same
# losses): the tensor-parallel table on NCCL, the pipeline's sends grouped with receives, dp.
for name in pp2tp2 pp2tp2sp dp2pp2 interleaved dp2pp2zero1 dp2pp2zero2 dp2pp2zero3 pp2tp2zb \
  dp2pp2zb; do
  GPU_COMM=nccl run $name cuda
  compare "$name over NCCL vs over MPI" "$tmp/$name-cuda.jsonl" "$tmp/$name-cuda-nccl.jsonl" 1e-6
done

# The held-out loss alone (issue 18): at the initial weights (a learning rate of 1e-30 leaves them
# as they are), every layout's forward-only schedule on the GPU gives the one-rank GPU run's number:
# within 1e-6 where no tensor parallelism changes the rounding points (pp, dp, interleaving: the
# same bf16 kernels on the same tokens), within 1e-4 with tp = 2 (the row-parallel partial sums are
# rounded to bf16 before they are added: measured 1.8e-5).
eval_plan() { # eval_plan NAME DP PP TP [SCHEDULE] [VIRTUAL]
  plan "$@"
  sed -i 's/"learning_rate": 3e-3/"learning_rate": 1e-30/; s/"steps": 10/"steps": 1/' "$tmp/$1.json"
}
held_out() { # held_out NAME: the held-out loss of one step of plan NAME on the GPU
  $mpengine run --config "$tmp/$1.json" --backend cuda --gpu-comm mpi --eval-every 1 \
    --eval-batches 2 --metrics "$tmp/$1.jsonl" --overwrite-metrics > "$tmp/$1.log" 2>&1 ||
    fail "$1: exit $?: $(tail -3 "$tmp/$1.log")"
  column val_loss "$tmp/$1.jsonl"
}
eval_plan eval-one 1 1 1
eval_plan eval-pp2 1 2 1
eval_plan eval-dp2pp2 2 2 1
eval_plan eval-interleaved 1 2 1 interleaved-1f1b 2
eval_plan eval-tp2 1 1 2
eval_plan eval-pp2tp2 1 2 2
reference=$(held_out eval-one)
for spec in eval-pp2:1e-6 eval-dp2pp2:1e-6 eval-interleaved:1e-6 eval-tp2:1e-4 eval-pp2tp2:1e-4; do
  name=${spec%:*} bound=${spec#*:}
  value=$(held_out "$name")
  verdict=$(awk -v a="$reference" -v b="$value" -v bound="$bound" 'BEGIN {
    if (a == "" || b == "") { print "bad missing"; exit }
    d = b - a; if (d < 0) d = -d; r = d / a; printf "%s %.3g", (r <= bound ? "ok" : "bad"), r }')
  echo "$name: held-out loss at the initial weights $value against one rank's $reference: relative ${verdict#* } (bound $bound)"
  [ "${verdict%% *}" = ok ] || fail "$name: held-out loss $value differs from one rank's $reference by ${verdict#* } (bound $bound)"
done

# The watchdog on the NCCL path: a hung pipeline rank makes the next stage's receive fail after
# --comm-timeout, naming the action, the group and the peer, aborting the communicators; a hung
# tensor-parallel rank does the same to its peer's all-reduce. The run exits 1, never hangs.
expect 1 "rank 1: pipeline rank 1, F micro-batch 0: " "recv from rank 0 in group pp" \
  "timed out after 2.0 s" "communicators aborted" -- \
  timeout 60 env MPENGINE_FAULT=hang:0:3 $mpengine run --config "$tmp/pp2.json" --backend cuda \
  --gpu-comm nccl --comm-timeout 2
expect 1 "rank 0: pipeline rank 0, F micro-batch 0: " "in group tp (ranks 0,1)" \
  "timed out after 2.0 s" "communicators aborted" -- \
  timeout 60 env MPENGINE_FAULT=hang:1:3 $mpengine run --config "$tmp/tp2.json" --backend cuda \
  --gpu-comm nccl --comm-timeout 2

plan fullzb 1 2 1 zb-h1 1 false 0 full
expect 2 "$tmp/fullzb.json: recompute \"full\" cannot run schedule zb-h1" \
  -- $mpengine run --config "$tmp/fullzb.json" --backend cuda --steps 1
expect 0 "backend: cuda" "done: 1 steps" -- $mpengine run --config "$tmp/pp2zb.json" --steps 1

# Checkpoints on the GPU: 10 steps saving at 5, against a resume from step 5 (bit for bit: the
# emulation is deterministic, and the state goes to the host and back exactly), one rank and
# pp = 2 x tp = 2; then the GPU's pp x tp checkpoint resumed on the CPU's one rank.
for name in one pp2tp2 dp2pp2zero1 dp2pp2zero2 dp2pp2zero3; do
  expect 0 "checkpoint: saved $tmp/ckpt-$name/step-5" "done: 10 steps" -- \
    $mpengine run --config "$tmp/$name.json" --backend cuda --gpu-comm mpi \
    --checkpoint-dir "$tmp/ckpt-$name" --save-every 5 --metrics "$tmp/ckpt-$name.jsonl"
  rm -rf "$tmp/resume-$name" && mkdir -p "$tmp/resume-$name"
  cp -r "$tmp/ckpt-$name/step-5" "$tmp/resume-$name/"
  expect 0 "resumed from $tmp/resume-$name/step-5: 5 of 10 steps done" "done: 10 steps" -- \
    $mpengine run --config "$tmp/$name.json" --backend cuda --gpu-comm mpi \
    --checkpoint-dir "$tmp/resume-$name" --resume --metrics "$tmp/resume-$name.jsonl"
  if diff <(tail -n 5 "$tmp/ckpt-$name.jsonl" | cut -d, -f1-4) <(cut -d, -f1-4 "$tmp/resume-$name.jsonl") > /dev/null; then
    echo "$name on the GPU: steps 5..9 after --resume equal the uninterrupted run's (loss and norm strings identical)"
  else
    fail "$name on the GPU: resumed steps differ:"
    paste <(tail -n 5 "$tmp/ckpt-$name.jsonl" | cut -d, -f1-4) <(cut -d, -f1-4 "$tmp/resume-$name.jsonl")
  fi
done
rm -rf "$tmp/gpu-to-cpu" && mkdir -p "$tmp/gpu-to-cpu" && cp -r "$tmp/ckpt-pp2tp2/step-5" "$tmp/gpu-to-cpu/"
expect 0 "resumed from $tmp/gpu-to-cpu/step-5: 5 of 10 steps done" "done: 10 steps" -- \
  $mpengine run --config "$tmp/one.json" --backend cpu --checkpoint-dir "$tmp/gpu-to-cpu" --resume \
  --metrics "$tmp/gpu-to-cpu.jsonl"
verdict=$(paste -d' ' <(tail -n 5 "$tmp/ckpt-pp2tp2.jsonl" | losses /dev/stdin) <(losses "$tmp/gpu-to-cpu.jsonl") | awk '
  { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
  END { printf "%s %.3g", (n == 5 && worst <= 3e-3 ? "ok" : "bad"), worst }')
echo "pp2tp2 GPU checkpoint resumed on one CPU rank: max relative loss difference ${verdict#* } (bound 3e-3; measured 2.6e-4)"
[ "${verdict%% *}" = ok ] || fail "GPU checkpoint resumed on the CPU: losses differ (${verdict#* })"

# The Llama family on the GPU (issue 16: RMSNorm, SwiGLU, rotary embeddings, 4 query heads over
# 2 kv heads, an untied head): the one-rank GPU run within 2e-2 of the CPU's, and pp = 2 x tp = 2
# (with sequence parallelism and zb-h1 too) and dp = 2 x pp = 2 within 1e-2 of the one-rank GPU
# run.
MODEL=tiny-llama plan llama-one 1 1 1
MODEL=tiny-llama plan llama-pp2tp2 1 2 2
MODEL=tiny-llama plan llama-pp2tp2spzb 1 2 2 zb-h1 1 true
MODEL=tiny-llama plan llama-dp2pp2 2 2 1
run llama-one cpu
run llama-one cuda
compare "tiny-llama, one rank: GPU (emulated bf16) vs CPU" "$tmp/llama-one-cpu.jsonl" "$tmp/llama-one-cuda.jsonl" $VS_CPU
for name in llama-pp2tp2 llama-pp2tp2spzb llama-dp2pp2; do
  run $name cuda
  compare "$name on the GPU vs one rank" "$tmp/llama-one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
done

# Mixture of experts on the GPU (issue 33, ep 1): every block's MLP is 8 experts (top-1) and a
# gated shared expert, with the load-balancing and z losses (tiny-moe.json); each tp rank runs the
# whole layer over the micro-batch's tokens (gathered first with sequence parallelism), the
# router statistics travel with the boundaries (and are summed over the cp group), zb-h1 runs the
# layer's whole backward in B, and full recomputation reruns it. The one-rank GPU run against the CPU's (bf16 against fp32), the
# layouts against the one-rank GPU run.
cp tests/tools/testdata/tiny-moe.json "$tmp/tiny-moe.json"
MODEL=tiny-moe plan moe-one 1 1 1
MODEL=tiny-moe plan moe-pp2zb 1 2 1 zb-h1
MODEL=tiny-moe plan moe-tp2sp 1 1 2 1f1b 1 true
MODEL=tiny-moe plan moe-dp2zero2 2 1 1 1f1b 1 false 2
MODEL=tiny-moe plan moe-pp2tp2full 1 2 2 1f1b 1 false 0 full
CP=2 MODEL=tiny-moe plan moe-cp2 1 1 1
MODEL=tiny-moe plan moe-dp2pp2zbzero2 2 2 1 zb-h1 1 false 2
run moe-one cpu
run moe-one cuda
compare "tiny-moe, one rank: GPU (emulated bf16) vs CPU" "$tmp/moe-one-cpu.jsonl" "$tmp/moe-one-cuda.jsonl" $VS_CPU
for name in moe-pp2zb moe-tp2sp moe-dp2zero2 moe-dp2pp2zbzero2 moe-pp2tp2full moe-cp2; do
  run $name cuda
  compare "$name on the GPU vs one rank" "$tmp/moe-one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
done
# ZeRO-3: the experts' bf16 weights gathered into the block window before each pass, the same
# numbers as ZeRO-2's whole copy (1e-6, as for the dense blocks above).
MODEL=tiny-moe plan moe-dp2zero3 2 1 1 1f1b 1 false 3
run moe-dp2zero3 cuda
compare "moe-dp2zero3 vs moe-dp2zero2 on the GPU" "$tmp/moe-dp2zero2-cuda.jsonl" "$tmp/moe-dp2zero3-cuda.jsonl" 1e-6

# Expert parallelism on the GPU (ep 2 folded over dp): each rank holds 4 of the 8 experts; the
# GPU MoE entries route on the device, exchange the counts and then the rows over the ep group
# (staged through the host as fp32, in expert_parallel/ep_plan.h's order, as the CPU does), run
# the local experts and send their outputs back; the backward mirrored. dp 2 x ep 2 (alone, and
# with pp 2 on zb-h1 or tp 2 with sequence parallelism), and dp 4 x ep 2 with ZeRO-1 (the
# experts' gradients summed over an expert-data-parallel group of 2, the state cut over it)
# within VS_ONE of the one-rank GPU run (measured at most 1.8e-4, 3.3e-5 without tp); dp 2 x ep 2
# and its pp 2 layout within VS_CPU of the CPU run of the same layout (measured 3.0e-4); over NCCL
# (the dp sums; ZeRO-1's cut over expert-dp and the rows still over MPI) the same numbers as over
# MPI.
EP=2 MODEL=tiny-moe plan moe-dp2ep2 2 1 1
EP=2 MODEL=tiny-moe plan moe-dp2ep2pp2zb 2 2 1 zb-h1
EP=2 MODEL=tiny-moe plan moe-dp2ep2tp2sp 2 1 2 1f1b 1 true
EP=2 MODEL=tiny-moe plan moe-dp4ep2zero1 4 1 1 1f1b 1 false 1
# (with ep, ZeRO cuts the state over the expert-data-parallel group: dp / ep = 2 ranks)
state_of[moe-dp4ep2zero1]="state: ZeRO-1 (optimizer state cut over 2 ranks); recomputation none"
for name in moe-dp2ep2 moe-dp2ep2pp2zb moe-dp2ep2tp2sp moe-dp4ep2zero1; do
  run $name cuda
  compare "$name on the GPU vs one rank" "$tmp/moe-one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
done
for name in moe-dp2ep2 moe-dp2ep2pp2zb; do
  run $name cpu
  compare "$name on the GPU vs on the CPU" "$tmp/$name-cpu.jsonl" "$tmp/$name-cuda.jsonl" $VS_CPU
done
for name in moe-dp2ep2 moe-dp4ep2zero1; do
  GPU_COMM=nccl run $name cuda
  compare "$name over NCCL vs over MPI" "$tmp/$name-cuda.jsonl" "$tmp/$name-cuda-nccl.jsonl" 1e-6
done
# A checkpoint of dp 2 x ep 2 x pp 2 on the GPU (each rank saves its ep rank's experts): resumed
# from step 5 on the GPU, steps 5..9 bit for bit; resumed on one CPU rank (ep 1, all 8 experts
# gathered), within VS_CPU of the GPU run.
expect 0 "checkpoint: saved $tmp/ckpt-moe-ep/step-5" "done: 10 steps" -- \
  $mpengine run --config "$tmp/moe-dp2ep2pp2zb.json" --backend cuda --gpu-comm mpi \
  --checkpoint-dir "$tmp/ckpt-moe-ep" --save-every 5 --metrics "$tmp/ckpt-moe-ep.jsonl"
for backend in cuda cpu; do
  rm -rf "$tmp/resume-moe-ep-$backend" && mkdir -p "$tmp/resume-moe-ep-$backend"
  cp -r "$tmp/ckpt-moe-ep/step-5" "$tmp/resume-moe-ep-$backend/"
done
expect 0 "resumed from $tmp/resume-moe-ep-cuda/step-5: 5 of 10 steps done" "done: 10 steps" -- \
  $mpengine run --config "$tmp/moe-dp2ep2pp2zb.json" --backend cuda --gpu-comm mpi \
  --checkpoint-dir "$tmp/resume-moe-ep-cuda" --resume --metrics "$tmp/resume-moe-ep-cuda.jsonl"
if diff <(tail -n 5 "$tmp/ckpt-moe-ep.jsonl" | cut -d, -f1-4) <(cut -d, -f1-4 "$tmp/resume-moe-ep-cuda.jsonl") > /dev/null; then
  echo "moe-dp2ep2pp2zb on the GPU: steps 5..9 after --resume equal the uninterrupted run's"
else
  fail "moe-dp2ep2pp2zb on the GPU: resumed steps differ:"
  paste <(tail -n 5 "$tmp/ckpt-moe-ep.jsonl" | cut -d, -f1-4) <(cut -d, -f1-4 "$tmp/resume-moe-ep-cuda.jsonl")
fi
expect 0 "resumed from $tmp/resume-moe-ep-cpu/step-5: 5 of 10 steps done" "done: 10 steps" -- \
  $mpengine run --config "$tmp/moe-one.json" --backend cpu \
  --checkpoint-dir "$tmp/resume-moe-ep-cpu" --resume --metrics "$tmp/resume-moe-ep-cpu.jsonl"
verdict=$(paste -d' ' <(tail -n 5 "$tmp/ckpt-moe-ep.jsonl" | losses /dev/stdin) <(losses "$tmp/resume-moe-ep-cpu.jsonl") | awk -v bound=$VS_CPU '
  { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
  END { printf "%s %.3g %d", (n == 5 && worst <= bound ? "ok" : "bad"), worst, n }')
echo "moe-dp2ep2pp2zb's GPU checkpoint resumed on one CPU rank: max relative loss difference ${verdict#* } (steps; bound $VS_CPU)"
[ "${verdict%% *}" = ok ] || fail "moe-dp2ep2pp2zb's GPU checkpoint on one CPU rank: losses differ (${verdict#* })"

# ZeRO 2 and 3 with ep on the GPU: dp 4 x ep 2, the gradients reduce-scattered over the
# expert-data-parallel group of 2 block by block into each rank's part, the parts' tensors other
# than the experts then summed over the ep group (staged through the host), with ZeRO-3 the block
# weights gathered over expert-dp around each pass; within VS_ONE of the one-rank GPU run, and
# ZeRO-3 the same numbers as ZeRO-2 (1e-6: the gathered bf16 weights are ZeRO-2's whole copy's).
EP=2 MODEL=tiny-moe plan moe-dp4ep2zero2 4 1 1 1f1b 1 false 2
EP=2 MODEL=tiny-moe plan moe-dp4ep2zero3 4 1 1 1f1b 1 false 3
state_of[moe-dp4ep2zero2]="state: ZeRO-2 (optimizer state and gradients cut over 2 ranks); recomputation none"
state_of[moe-dp4ep2zero3]="state: ZeRO-3 (optimizer state, gradients and block parameters cut over 2 ranks); recomputation none"
for name in moe-dp4ep2zero2 moe-dp4ep2zero3; do
  run $name cuda
  compare "$name on the GPU vs one rank" "$tmp/moe-one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
done
compare "moe-dp4ep2zero3 vs moe-dp4ep2zero2 on the GPU" "$tmp/moe-dp4ep2zero2-cuda.jsonl" "$tmp/moe-dp4ep2zero3-cuda.jsonl" 1e-6
# Over NCCL (the dp x cp sums; ZeRO's cut over expert-dp and its sums over ep still over MPI) the
# same numbers as over MPI.
GPU_COMM=nccl run moe-dp4ep2zero2 cuda
compare "moe-dp4ep2zero2 over NCCL vs over MPI" "$tmp/moe-dp4ep2zero2-cuda.jsonl" "$tmp/moe-dp4ep2zero2-cuda-nccl.jsonl" 1e-6

# Context parallelism on the GPU (issue 32): each sequence's tokens over cp ranks, the whole
# sequence's qkv rows gathered over the cp group for the attention kernels, the key and value
# gradients reduce-scattered back, rotary angles and learned positions at global positions. Each
# within 1e-3 of the one-rank GPU run (other bf16 rounding points: the attention's output and
# gradients pass through the exchange; measured up to 3.7e-4), and within 2e-2 of the CPU run of
# the same layout, for both families; cp 2 with tp 2 and sequence parallelism, with dp 2 and
# ZeRO-2, and cp 4.
CP=2 plan cp2 1 1 1
CP=4 plan cp4 1 1 1
CP=2 plan cp2tp2sp 1 1 2 1f1b 1 true
CP=2 plan cp2dp2zero2 2 1 1 1f1b 1 false 2
CP=2 MODEL=tiny-llama plan llama-cp2pp2 1 2 1
for name in cp2 cp4 cp2tp2sp cp2dp2zero2 llama-cp2pp2; do
  reference=one
  [[ $name == llama-* ]] && reference=llama-one
  run $name cuda
  run $name cpu
  compare "$name on the GPU vs one rank" "$tmp/$reference-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
  compare "$name on the GPU vs on the CPU" "$tmp/$name-cpu.jsonl" "$tmp/$name-cuda.jsonl" $VS_CPU
done
# The key/value exchange over the cp group's NCCL communicator (emulated over MPI: the same sums).
GPU_COMM=nccl run cp2tp2sp cuda
compare "cp2tp2sp over NCCL vs over MPI" "$tmp/cp2tp2sp-cuda.jsonl" "$tmp/cp2tp2sp-cuda-nccl.jsonl" 1e-6

# The fused attention's windows under context parallelism (issue 32): a head size the fused
# kernels have (32: 2 query heads over 1 kv head), so each cp rank runs its two chunks as windows
# against the gathered prefix (layers/attention.h, mp_attention_window) instead of the whole
# sequence. cp 2, cp 4 and cp 2 x pp 2 against the one-rank GPU run and the CPU run.
sed 's/"heads": 4, "kv_heads": 2/"heads": 2, "kv_heads": 1/; s/"tiny-llama"/"fused-llama"/' \
  "$tmp/tiny-llama.json" > "$tmp/fused-llama.json"
MODEL=fused-llama plan fused-one 1 1 1
CP=2 MODEL=fused-llama plan fused-cp2 1 1 1
CP=4 MODEL=fused-llama plan fused-cp4 1 1 1
CP=2 MODEL=fused-llama plan fused-cp2pp2 1 2 1
run fused-one cuda
for name in fused-cp2 fused-cp4 fused-cp2pp2; do
  run $name cuda
  run $name cpu
  compare "$name on the GPU vs one rank" "$tmp/fused-one-cuda.jsonl" "$tmp/$name-cuda.jsonl" $VS_ONE
  compare "$name on the GPU vs on the CPU" "$tmp/$name-cpu.jsonl" "$tmp/$name-cuda.jsonl" $VS_CPU
done

# Hugging Face weights into and out of the GPU, which keeps the only copy (the GPU stage reads
# and writes its master weights in pieces): transformers' tiny Llama 3 golden (4 query
# heads over 2 kv heads, untied head) loaded at pp = 2 x tp = 2, step 1's loss within 2e-2 (bf16)
# of transformers' own on that batch, and its checkpoint (a learning rate too small to move a
# weight) exported to exactly transformers' model.safetensors, byte for byte.
golden=$testdata/hf_tiny_llama3
hf_loss=$(awk -F': ' '/"shard_loss"/ { sub(",", "", $2); print $2 }' "$golden/golden.json")
expect 0 "wrote $tmp/hf-llama.json" -- $mpengine import "$golden" --out "$tmp/hf-llama.json" --seq-len 16
cat > "$tmp/hf-pp2tp2.json" <<JSON
{"model": "hf-llama.json", "parallel": {"dp": 1, "pp": 2, "tp": 2},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-30, "weight_decay": 0}}
JSON
rm -rf "$tmp/ck-hf"
expect 0 "initialised from $golden" -- \
  $mpengine run --config "$tmp/hf-pp2tp2.json" --backend cuda --init-from "$golden" \
  --data "$golden/shard.bin" --metrics "$tmp/hf-pp2tp2.jsonl" --checkpoint-dir "$tmp/ck-hf"
hf_gpu_loss=$(losses "$tmp/hf-pp2tp2.jsonl" | head -1)
# Measured 9e-5 relative; bound 1e-3, which a model with uniform logits (ln 100 = 4.605 against
# transformers' 4.661, 1.2e-2) fails.
if awk -v a="${hf_gpu_loss:-nan}" -v b="${hf_loss:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b > 0 && d <= 1e-3 * b) }'; then
  echo "Llama 3 golden at pp2tp2 on the GPU: step 1 loss $hf_gpu_loss, transformers' $hf_loss (bound 1e-3 relative)"
else
  fail "Llama 3 golden at pp2tp2 on the GPU: step 1 loss ${hf_gpu_loss:-none}, transformers' ${hf_loss:-none}"
fi
rm -rf "$tmp/export-hf"
expect 0 "Hugging Face checkpoint" -- \
  $mpengine export --checkpoint "$tmp/ck-hf" --format hf --out "$tmp/export-hf"
if cmp -s "$tmp/export-hf/model.safetensors" "$golden/model.safetensors"; then
  echo "Llama 3 golden through the GPU and a checkpoint: exported model.safetensors byte-identical to transformers'"
else
  fail "Llama 3 golden through the GPU: the exported model.safetensors differs from transformers'"
fi

# The mixture-of-experts goldens (issue 33: transformers' tiny MixtralForCausalLM and
# Qwen2MoeForCausalLM, tools/bench/moe_model_golden.py) the same way at pp = 2 x tp = 2 with
# sequence parallelism: step 1's loss (cross-entropy plus the load-balancing loss, one
# micro-batch) within 1e-3 of transformers' (bf16; measured 9.6e-5 and 2.0e-4, while uniform
# logits are 4e-2 off), and the checkpoint exported byte for byte.
for golden_name in hf_tiny_mixtral:3 hf_tiny_qwen2_moe:4; do
  golden=$testdata/${golden_name%:*} rest_of_chain=${golden_name#*:} name=${golden_name%:*}
  hf_loss=$(awk -F': ' '/"shard_loss"/ { sub(",", "", $2); print $2 }' "$golden/golden.json")
  expect 0 "wrote $tmp/$name.json" -- $mpengine import "$golden" --out "$tmp/$name.json" --seq-len 16
  cat > "$tmp/$name-pp2tp2sp.json" <<JSON
{"model": "$name.json", "parallel": {"dp": 1, "pp": 2, "tp": 2, "sequence_parallel": true},
 "layers_per_stage": [2, $rest_of_chain],
 "batch": {"global_batch": 4, "micro_batch": 4, "num_micro_batches": 1, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-30, "weight_decay": 0}}
JSON
  rm -rf "$tmp/ck-$name" "$tmp/export-$name"
  expect 0 "initialised from $golden" -- \
    $mpengine run --config "$tmp/$name-pp2tp2sp.json" --backend cuda --init-from "$golden" \
    --data "$golden/shard.bin" --metrics "$tmp/$name-pp2tp2sp.jsonl" --checkpoint-dir "$tmp/ck-$name"
  gpu_loss=$(losses "$tmp/$name-pp2tp2sp.jsonl" | head -1)
  if awk -v a="${gpu_loss:-nan}" -v b="${hf_loss:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b > 0 && d <= 1e-3 * b) }'; then
    echo "$name at pp2tp2sp on the GPU: step 1 loss $gpu_loss, transformers' $hf_loss (bound 1e-3 relative)"
  else
    fail "$name at pp2tp2sp on the GPU: step 1 loss ${gpu_loss:-none}, transformers' ${hf_loss:-none}"
  fi
  expect 0 "Hugging Face checkpoint" -- \
    $mpengine export --checkpoint "$tmp/ck-$name" --format hf --out "$tmp/export-$name"
  cmp -s "$tmp/export-$name/model.safetensors" "$golden/model.safetensors" ||
    fail "$name through the GPU: the exported model.safetensors differs from transformers'"
done

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "cuda_emulated_run_test: all checks passed"
