#!/usr/bin/env bash
# tools/device_check.sh — everything mpengine checks on a real GPU, in one call, printing one report.
#
# Runs on the lent GPU machine (no Bazel, no apt, no network) from the repository root, with the
# binaries that tools/device_bundle.sh built here in .device/. It prints:
#   - the machine, the library versions, a smoke kernel checked against the CPU;
#   - every CUDA kernel checked against its CPU twin (max relative error), and the GPU model
#     against the CPU model;
#   - the measured bf16 GEMM peak (PyTorch), the figure MFU is also given against;
#   - the NCCL communicators (engine/comm/comm_nccl.h) on one GPU: their tests, the watchdog's abort,
#     and `bench comm --backend cuda` on one rank; with the carried Open MPI (.device/mpi.tar.gz),
#     two ranks sharing the GPU through the MPI communicators' staging of GPU buffers
#     (`bench comm --backend mpi --buffers device`), and NCCL's refusal of two ranks on one GPU,
#     which must be an error, never a hang;
#   - with the carried Open MPI: data parallelism (dp = 2) and pipeline and tensor parallelism
#     ((pp, tp) = (2, 1), (1, 2), (2, 2), and (2, 2) with sequence parallelism) on ranks sharing
#     the GPU, against the one-rank GPU run and, for (2, 2), the CPU run of the same plan and the
#     run without sequence parallelism, and pp = 2 on zb-h1 against pp = 2 on 1f1b; one-rank
#     training over NCCL;
#   - one-GPU training of tiny-gpt (loss against the entropy floor), a checkpoint resumed bit for
#     bit, gpt2-124m and gpt2-1.5b (tokens/s, MFU), and PyTorch eager on the same model and batch
#     for the tokens/s ratio;
#   - the Llama family: the tiny LlamaForCausalLM and Qwen2ForCausalLM goldens' step-1 loss on the
#     GPU against transformers', and one-GPU training of llama3.2-1b (tokens/s, MFU) beside
#     PyTorch eager (bf16 autocast, F.scaled_dot_product_attention) on the same model and batch.
# Usage: bash tools/device_check.sh [--quick]   (--quick: kernels, communicators and tiny-gpt only)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=${1:-}

section() { printf '\n== %s ==\n' "$*"; }

if [ ! -x .device/bin/mpengine ]; then
  echo "device_check: .device/bin/mpengine missing; run tools/device_bundle.sh here first" >&2
  exit 2
fi

# Libraries that travel gzipped (device_bundle.sh) and the carried Open MPI runtime are unpacked
# outside the tree.
unpacked=$(mktemp -d /tmp/mpengine-device.XXXXXX)
trap 'rm -rf "$unpacked"' EXIT
mkdir -p "$unpacked/lib"
for packed in .device/lib/*.gz; do
  [ -e "$packed" ] || continue
  gzip -dc "$packed" > "$unpacked/lib/$(basename "$packed" .gz)"
done

# The carried libraries first.
libdirs=("$PWD/.device/lib" "$unpacked/lib")

# Open MPI (the machine has none): mpirun and its runtime from .device/mpi.tar.gz, found through
# Open MPI's and PMIx's installation-directory variables; shared memory between the ranks.
mpirun=""
mpi_env=()
if [ -f .device/mpi.tar.gz ] && tar xzf .device/mpi.tar.gz -C "$unpacked"; then
  mpi=$unpacked/mpi
  mpirun=$mpi/bin/mpirun
  libdirs+=("$mpi/lib")
  mpi_env=(OPAL_PREFIX="$mpi" OPAL_BINDIR="$mpi/bin" OPAL_LIBDIR="$mpi/lib"
           OPAL_PKGLIBDIR="$mpi/lib/openmpi3" OPAL_DATADIR="$mpi/share"
           OPAL_PKGDATADIR="$mpi/share/openmpi" OPAL_SYSCONFDIR="$mpi/etc"
           PMIX_PREFIX="$mpi" PMIX_LIBDIR="$mpi/lib" PMIX_PKGLIBDIR="$mpi/lib/pmix"
           PMIX_DATADIR="$mpi/share" PMIX_PKGDATADIR="$mpi/share/pmix" PMIX_SYSCONFDIR="$mpi/etc"
           OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=
           OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
           OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1)
fi

# CUDA libraries: the machine's toolkit, and NCCL from wherever it is installed (the CUDA image
# ships it in a Python package when not in the toolkit).
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$dir" ] && libdirs+=("$dir")
done
for lib in libnccl.so.2 libcublasLt.so.13 libcudart.so.13; do
  found=$(find / -xdev -name "$lib" -not -path '/proc/*' 2>/dev/null | head -n 1)
  [ -n "$found" ] && libdirs+=("$(dirname "$found")")
done
# Only our binaries see the carried libraries: PyTorch below keeps the machine's own.
LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
failures=0
fail() { failures=$((failures + 1)); echo "FAILED: $*"; }

section "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
echo "cpu cores: $(nproc)"

section "shared libraries"
for binary in .device/bin/* ${mpirun:+"$mpirun"}; do
  if ldd "$binary" | grep "not found"; then fail "$binary has missing libraries"; fi
done
echo "checked $(ls .device/bin | wc -l) binaries${mpirun:+ and the carried mpirun}"

section "mpengine version --smoke-test"
.device/bin/mpengine version --smoke-test || fail "smoke test"

section "CUDA kernels against their CPU twins"
for test in cuda_elementwise_test cuda_gemm_test flash_attention_test flash_attention_window_test \
            cuda_tensor_parallel_test moe_cuda_test moe_cuda_throughput_test \
            stage_gpu_test; do
  if [ -x ".device/bin/$test" ]; then
    timeout 300 ".device/bin/$test" 2>&1 | grep -E "kernel |model |gpu training|FAILED|Failure|Expected|Which is|error|PASSED|SKIPPED|tests? ran" \
      || fail "$test printed nothing"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "$test"
  else
    fail "$test not bundled"
  fi
done

section "NCCL communicators on one GPU (engine/comm/comm_nccl.h): tests, the watchdog"
for test in comm_nccl_test comm_nccl_watchdog_test; do
  if [ -x ".device/bin/$test" ]; then
    timeout 120 ".device/bin/$test" 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|error|PASSED|tests? ran" \
      || fail "$test printed nothing"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "$test"
  else
    fail "$test not bundled"
  fi
done

section "bench comm --backend cuda: NCCL on one rank, no MPI (nccl-tests style)"
timeout 180 .device/bin/mpengine bench comm --backend cuda --min-bytes 1K --max-bytes 256M \
  --factor 16 --comm-timeout 60 || fail "bench comm --backend cuda on one rank"

if [ -n "$mpirun" ]; then
  section "two ranks sharing the GPU: bench comm --backend mpi --buffers device (MPI staging)"
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine bench comm \
    --backend mpi --buffers device --max-bytes 64M --factor 16 --comm-timeout 60 \
    || fail "bench comm --backend mpi --buffers device on two ranks sharing the GPU"

  section "two ranks on one GPU with NCCL: to be refused (NCCL needs a GPU per rank), never to hang"
  log=$(mktemp)
  timeout 120 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine bench comm \
    --backend cuda --ops all_reduce --max-bytes 4K --comm-timeout 30 > "$log" 2>&1
  code=$?
  grep -E "^mpengine bench comm:|^# mpengine bench comm|#wrong in total" "$log" | head -n 4
  if [ $code -eq 124 ]; then
    fail "two NCCL ranks on one GPU hung past 120 s"
  elif [ $code -eq 0 ]; then
    echo "NCCL accepted two ranks on one GPU here (exit 0)"
  else
    echo "refused with an error, as expected (exit $code)"
  fi
  rm -f "$log"

  section "data parallelism on the GPU: dp = 2 sharing it (gradients over MPI through the host) vs one rank"
  work=$(mktemp -d)
  for dp in 1 2; do
    cat > "$work/dp$dp.json" <<JSON
{"model": "$PWD/examples/models/tiny-gpt.json", "parallel": {"dp": $dp, "pp": 1, "tp": 1},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": $((4 / dp)), "seq_len": 64},
 "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
  done
  timeout 120 .device/bin/mpengine run --config "$work/dp1.json" --backend cuda \
    --metrics "$work/dp1.jsonl" | tail -n 1 || fail "dp = 1 on cuda"
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine run \
    --config "$work/dp2.json" --backend cuda --gpu-comm mpi --metrics "$work/dp2.jsonl" \
    --comm-timeout 60 | grep -E "^backend|^done" || fail "dp = 2 on cuda"
  # bf16 activations: the same math in another accumulation order agrees to about 1e-3.
  paste -d' ' <(sed 's/.*"loss": \([^,]*\),.*/\1/' "$work/dp1.jsonl") \
              <(sed 's/.*"loss": \([^,]*\),.*/\1/' "$work/dp2.jsonl") | awk '
    { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
    END { printf "dp = 2 vs dp = 1 on the GPU: %d steps, max relative loss difference %.3g (bound 1e-2)\n", n, worst
          exit !(n == 20 && worst <= 1e-2) }' || fail "dp = 2 losses differ from dp = 1 on the GPU"

  section "one-rank NCCL training: dp = 1, gradients through a one-rank NCCL communicator"
  timeout 120 env "${mpi_env[@]}" "$mpirun" -np 1 --bind-to none .device/bin/mpengine run \
    --config "$work/dp1.json" --backend cuda --gpu-comm nccl --steps 5 --comm-timeout 60 \
    | grep -E "^backend|^step 5/|^done" || fail "one-rank NCCL training"

  # Pipeline and tensor parallelism on the GPU (engine/model/stage_gpu.h): every layout's ranks
  # share the one GPU, their activations and tensor-parallel sums going through the host over
  # MPI. Each is checked against the one-rank GPU run (the same bf16 kernels: close) and the
  # 4-rank run also against the CPU run of the same plan (fp32 there: looser).
  section "pipeline and tensor parallelism on the GPU: (pp, tp) = (2, 1), (1, 2), (2, 2) vs one rank and the CPU"
  layouts="1,1 2,1 1,2 2,2"
  for layout in $layouts; do
    pp=${layout%,*} tp=${layout#*,}
    cat > "$work/pp${pp}tp${tp}.json" <<JSON
{"model": "$PWD/examples/models/tiny-gpt.json", "parallel": {"dp": 1, "pp": $pp, "tp": $tp},
 "batch": {"global_batch": 8, "micro_batch": 2, "num_micro_batches": 4, "seq_len": 64},
 "schedule": "1f1b", "training": {"steps": 20, "learning_rate": 3e-3, "warmup_steps": 2}}
JSON
    timeout 240 env "${mpi_env[@]}" "$mpirun" -np $((pp * tp)) --bind-to none \
      .device/bin/mpengine run --config "$work/pp${pp}tp${tp}.json" --backend cuda --gpu-comm mpi \
      --metrics "$work/gpu-pp${pp}tp${tp}.jsonl" --comm-timeout 60 | grep -E "^backend|^step 20/|^done" \
      || fail "pp = $pp, tp = $tp on cuda"
  done
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 4 --bind-to none .device/bin/mpengine run \
    --config "$work/pp2tp2.json" --backend cpu --metrics "$work/cpu-pp2tp2.jsonl" \
    --comm-timeout 60 | grep -E "^step 20/|^done" || fail "pp = 2, tp = 2 on the CPU"
  compare_losses() { # compare_losses NAME A.jsonl B.jsonl BOUND
    paste -d' ' <(sed 's/.*"loss": \([^,]*\),.*/\1/' "$2") <(sed 's/.*"loss": \([^,]*\),.*/\1/' "$3") | awk \
      -v name="$1" -v bound="$4" '
      { d = $2 - $1; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r; n++ }
      END { printf "%s: %d steps, max relative loss difference %.3g (bound %s)\n", name, n, worst, bound
            exit !(n == 20 && worst <= bound) }' || fail "$1"
  }
  for layout in 2,1 1,2 2,2; do
    pp=${layout%,*} tp=${layout#*,}
    compare_losses "GPU pp = $pp, tp = $tp vs GPU one rank" "$work/gpu-pp1tp1.jsonl" \
      "$work/gpu-pp${pp}tp${tp}.jsonl" 1e-2
  done
  compare_losses "GPU pp = 2, tp = 2 vs CPU pp = 2, tp = 2 (bf16 vs fp32)" \
    "$work/cpu-pp2tp2.jsonl" "$work/gpu-pp2tp2.jsonl" 2e-2
  # Sequence parallelism: the same GEMMs on the same rows, only the layernorm gradients summed in
  # another order, so close to the run without it.
  section "sequence parallelism on the GPU: pp = 2, tp = 2 vs without it and vs one rank"
  sed 's/"tp": 2}/"tp": 2, "sequence_parallel": true}/' "$work/pp2tp2.json" > "$work/pp2tp2sp.json"
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 4 --bind-to none .device/bin/mpengine run \
    --config "$work/pp2tp2sp.json" --backend cuda --gpu-comm mpi \
    --metrics "$work/gpu-pp2tp2sp.jsonl" --comm-timeout 60 | grep -E "^plan|^step 20/|^done" \
    || fail "pp = 2, tp = 2 with sequence parallelism on cuda"
  compare_losses "GPU pp = 2, tp = 2 sequence parallel vs not" "$work/gpu-pp2tp2.jsonl" \
    "$work/gpu-pp2tp2sp.jsonl" 1e-3
  compare_losses "GPU pp = 2, tp = 2 sequence parallel vs GPU one rank" "$work/gpu-pp1tp1.jsonl" \
    "$work/gpu-pp2tp2sp.jsonl" 1e-2
  # Context parallelism on the GPU (issue 32): cp = 2 sharing the GPU over MPI, the whole
  # sequence's qkv gathered for the fused attention, each rank keeping its tokens' outputs.
  section "context parallelism on the GPU: cp = 2 vs one rank, tiny-gpt and tiny-llama"
  sed 's/"tp": 1}/"tp": 1, "cp": 2}/' "$work/pp1tp1.json" > "$work/cp2.json"
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine run \
    --config "$work/cp2.json" --backend cuda --gpu-comm mpi \
    --metrics "$work/gpu-cp2.jsonl" --comm-timeout 60 | grep -E "^plan|^step 20/|^done" \
    || fail "cp = 2 on cuda"
  compare_losses "GPU cp = 2 vs GPU one rank" "$work/gpu-pp1tp1.jsonl" "$work/gpu-cp2.jsonl" 1e-3
  sed 's/tiny-gpt.json/tiny-llama.json/' "$work/pp1tp1.json" > "$work/llama1.json"
  sed 's/tiny-gpt.json/tiny-llama.json/' "$work/cp2.json" > "$work/llama-cp2.json"
  # gpu_run NAME RANKS: plan NAME on the GPU over MPI into gpu-NAME.jsonl.
  gpu_run() {
    timeout 240 env "${mpi_env[@]}" "$mpirun" -np "$2" --bind-to none .device/bin/mpengine run \
      --config "$work/$1.json" --backend cuda --gpu-comm mpi \
      --metrics "$work/gpu-$1.jsonl" --comm-timeout 60 | grep -E "^step 20/|^done" \
      || fail "$1 on cuda"
  }
  gpu_run llama1 1
  gpu_run llama-cp2 2
  compare_losses "GPU tiny-llama cp = 2 vs GPU one rank" "$work/gpu-llama1.jsonl" \
    "$work/gpu-llama-cp2.jsonl" 1e-3
  # The fused attention's windows (head size 32: 2 query heads over 1 kv head): each cp rank's
  # two chunks against the gathered prefix, its share of the FLOPs.
  section "context parallelism with the fused attention's windows: cp = 2 vs one rank"
  sed 's/"heads": 4, "kv_heads": 2/"heads": 2, "kv_heads": 1/' examples/models/tiny-llama.json \
    > "$work/fused-llama.json"
  sed "s|[^\"]*tiny-llama.json|$work/fused-llama.json|" "$work/llama1.json" > "$work/fused1.json"
  sed "s|[^\"]*tiny-llama.json|$work/fused-llama.json|" "$work/llama-cp2.json" \
    > "$work/fused-cp2.json"
  gpu_run fused1 1
  gpu_run fused-cp2 2
  compare_losses "GPU fused-attention cp = 2 vs GPU one rank" "$work/gpu-fused1.jsonl" \
    "$work/gpu-fused-cp2.jsonl" 1e-3
  # Zero-bubble on the GPU: B and W split (each block's GEMM weight gradients deferred to W), which
  # adds what the whole backward adds: the same run as 1f1b's up to the GPU's own noise.
  section "zero-bubble zb-h1 on the GPU: pp = 2 vs pp = 2 on 1f1b"
  sed 's/"schedule": "1f1b"/"schedule": "zb-h1"/' "$work/pp2tp1.json" > "$work/pp2zb.json"
  timeout 240 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine run \
    --config "$work/pp2zb.json" --backend cuda --gpu-comm mpi \
    --metrics "$work/gpu-pp2zb.jsonl" --comm-timeout 60 | grep -E "^plan|^step 20/|^done" \
    || fail "pp = 2 zb-h1 on cuda"
  compare_losses "GPU pp = 2 zb-h1 vs 1f1b" "$work/gpu-pp2tp1.jsonl" "$work/gpu-pp2zb.jsonl" 1e-3
  # ZeRO on the GPU (issue 17): dp = 2 sharing the GPU over MPI; 1 shards the moments, 2 the
  # gradients (reduce-scattered from a device window per block), 3 the blocks' parameters (each
  # block's bf16 weights gathered into a device window before every pass). 2 and 3 run the same
  # sums on the same weights: the same numbers, up to the GPU's own noise.
  section "ZeRO 1, 2 and 3 on the GPU: dp = 2 vs dp = 2 without ZeRO, ZeRO-3 vs ZeRO-2"
  for zero in 1 2 3; do
    sed "s/\"tp\": 1}/\"tp\": 1, \"zero_stage\": $zero}/" "$work/dp2.json" > "$work/dp2zero$zero.json"
    timeout 240 env "${mpi_env[@]}" "$mpirun" -np 2 --bind-to none .device/bin/mpengine run \
      --config "$work/dp2zero$zero.json" --backend cuda --gpu-comm mpi \
      --metrics "$work/dp2zero$zero.jsonl" --comm-timeout 60 | grep -E "^step 20/|^done|^memory" \
      || fail "dp = 2, ZeRO-$zero on cuda"
    compare_losses "GPU dp = 2 ZeRO-$zero vs dp = 2" "$work/dp2.jsonl" "$work/dp2zero$zero.jsonl" 1e-3
  done
  compare_losses "GPU dp = 2 ZeRO-3 vs ZeRO-2" "$work/dp2zero2.jsonl" "$work/dp2zero3.jsonl" 1e-5
  rm -rf "$work"
else
  section "two ranks sharing the GPU"
  echo "skipped: no mpirun (.device/mpi.tar.gz was not bundled: tools/device_bundle.sh found no" \
       "Open MPI); the one-rank steps above ran"
fi

section "bf16 matrix peak (PyTorch, 8192^3, median of 20)"
peak=$(timeout 120 env -u LD_LIBRARY_PATH python3 - <<'PY'
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
times = []
for _ in range(20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); a @ b; end.record(); torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
times.sort()
print(f"{2 * 8192**3 / times[len(times) // 2] / 1e12:.0f}")
PY
)
echo "measured bf16 GEMM peak: ${peak:-unavailable} TFLOP/s (datasheet dense: 989)"

section "one-GPU training: tiny-gpt on its synthetic source (loss vs the entropy floor)"
timeout 300 .device/bin/mpengine run --config examples/plans/tiny-gpt-1rank.json --backend cuda --log-every 100 \
  | grep -E "^(model|backend|entropy|done)|step (1|100|200|300)/" || fail "tiny-gpt on cuda"

section "checkpoints on the GPU: 10 steps saving at 5 vs a resume from step 5 (bit for bit)"
ckpt=$(mktemp -d)
timeout 120 .device/bin/mpengine run --config examples/plans/tiny-gpt-1rank.json --backend cuda \
  --steps 10 --checkpoint-dir "$ckpt/full" --save-every 5 --metrics "$ckpt/full.jsonl" \
  | grep -E "^checkpoint|^done" || fail "tiny-gpt on cuda with checkpoints"
mkdir -p "$ckpt/resumed" && cp -r "$ckpt/full/step-5" "$ckpt/resumed/"
timeout 120 .device/bin/mpengine run --config examples/plans/tiny-gpt-1rank.json --backend cuda \
  --steps 10 --checkpoint-dir "$ckpt/resumed" --resume --metrics "$ckpt/resumed.jsonl" \
  | grep -E "^resumed|^done" || fail "tiny-gpt on cuda resumed"
if diff <(tail -n 5 "$ckpt/full.jsonl" | cut -d, -f1-4) <(cut -d, -f1-4 "$ckpt/resumed.jsonl"); then
  echo "resumed steps 5..9 equal the uninterrupted run's (loss and norm strings identical)"
else
  fail "resumed GPU run differs from the uninterrupted one"
fi
rm -rf "$ckpt"

section "Hugging Face GPT-2 weights on the GPU: step-1 loss against transformers' (bf16 compute)"
hf=$(mktemp -d)
cp examples/models/tiny-gpt.json "$hf/tiny-gpt.json"
cat > "$hf/one.json" <<'JSON'
{"model": "tiny-gpt.json", "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-3}}
JSON
hf_loss=$(cat tests/engine/testdata/hf_gpt2_tiny_loss.txt)
if timeout 120 .device/bin/mpengine run --config "$hf/one.json" --backend cuda --steps 1 \
     --data tests/engine/testdata/hf_gpt2_tiny_tokens.bin \
     --init-from tests/engine/testdata/hf_gpt2_tiny --metrics "$hf/m.jsonl" > "$hf/log" 2>&1; then
  loss=$(awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$hf/m.jsonl")
  echo "step-1 loss on cuda ${loss:-none}, transformers (fp64) $hf_loss"
  awk -v a="${loss:-nan}" -v b="$hf_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && d <= 1e-2 * b) }' \
    || fail "HF GPT-2 on cuda: loss beyond 1e-2 relative of transformers'"
else
  cat "$hf/log"
  fail "HF GPT-2 on cuda"
fi
rm -rf "$hf"

section "Hugging Face Llama-family weights on the GPU: step-1 loss against transformers' (bf16 compute)"
for name in hf_tiny_llama3 hf_tiny_qwen2; do
  golden=tests/engine/testdata/$name
  work=$(mktemp -d)
  .device/bin/mpengine import "$golden" --out "$work/model.json" --seq-len 16 > /dev/null 2>&1
  cat > "$work/one.json" <<JSON
{"model": "$work/model.json", "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 16},
 "training": {"steps": 1, "learning_rate": 1e-30}}
JSON
  hf_loss=$(awk -F': ' '/"shard_loss"/ { sub(",", "", $2); print $2 }' "$golden/golden.json")
  if timeout 120 .device/bin/mpengine run --config "$work/one.json" --backend cuda --steps 1 \
       --data "$golden/shard.bin" --init-from "$golden" --metrics "$work/m.jsonl" > "$work/log" 2>&1; then
    loss=$(awk -F'"loss": ' 'NR == 1 { split($2, a, ","); print a[1] }' "$work/m.jsonl")
    echo "$name: step-1 loss on cuda ${loss:-none}, transformers (fp64) $hf_loss"
    awk -v a="${loss:-nan}" -v b="$hf_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && d <= 1e-2 * b) }' \
      || fail "$name on cuda: loss beyond 1e-2 relative of transformers'"
  else
    cat "$work/log"
    fail "$name on cuda"
  fi
  rm -rf "$work"
done

if [ "$quick" != "--quick" ]; then
  section "one-GPU training: llama3.2-1b (20 steps, synthetic data; GQA 32/8, SwiGLU, RoPE, tied)"
  log=$(mktemp)
  timeout 500 .device/bin/mpengine run --config examples/plans/llama3.2-1b-1gpu.json --backend cuda > "$log" 2>&1 \
    || fail "llama3.2-1b on cuda"
  grep -E "^(model|plan|backend)|step (1|5|10|15|20)/|done|mpengine run" "$log"
  rm -f "$log"
  timeout 300 env -u LD_LIBRARY_PATH python3 tools/bench/torch_gpu_step.py examples/models/llama3.2-1b.json \
    --batch 8 --seq-len 2048 --steps 10 || echo "(PyTorch step unavailable)"
  for model in gpt2-124m gpt2-1.5b; do
    section "one-GPU training: $model (20 steps, synthetic data)"
    plan=examples/plans/$model-1gpu.json
    log=$(mktemp)
    timeout 400 .device/bin/mpengine run --config "$plan" --backend cuda > "$log" 2>&1 || fail "$model on cuda"
    grep -E "^(model|plan|backend)|step (1|5|10|15|20)/|done|mpengine run" "$log"
    # Steady state: the median of steps 6-20.
    awk -F'|' -v peak="${peak:-0}" 'BEGIN { n = 0 } /^step ([6-9]|1[0-9]|20)\// {
        for (i = 1; i <= NF; ++i) { if ($i ~ /tok\/s/) t[n] = $i + 0; if ($i ~ /TFLOP\/s/) f[n] = $i + 0 }
        n++ }
      function sort(a, k,   i, j, x) { for (i = 1; i < k; ++i) { x = a[i]; for (j = i - 1; j >= 0 && a[j] > x; --j) a[j + 1] = a[j]; a[j + 1] = x } }
      END { if (n == 0) exit; sort(t, n); sort(f, n); m = int(n / 2);
            printf "steady state (median of steps 6-20): %.0f tok/s, %.1f TFLOP/s, MFU %.1f%% of 989 (datasheet)", t[m], f[m], 100 * f[m] / 989;
            if (peak > 0) printf ", %.1f%% of %d (measured)", 100 * f[m] / peak, peak;
            printf "\n" }' "$log"
    batch=$(grep -o '"micro_batch": [0-9]*' "$plan" | grep -o '[0-9]*$')
    timeout 300 env -u LD_LIBRARY_PATH python3 tools/bench/torch_gpu_step.py "examples/models/$model.json" --batch "$batch" --seq-len 1024 --steps 10 \
      || echo "(PyTorch step unavailable)"
    rm -f "$log"
  done
  section "gpt2-1.5b with the unfused cuBLAS attention, for comparison (MPENGINE_ATTENTION=cublas)"
  MPENGINE_ATTENTION=cublas timeout 300 .device/bin/mpengine run --config examples/plans/gpt2-1.5b-1gpu.json \
    --backend cuda --steps 10 | grep -E "step (5|10)/" || fail "gpt2-1.5b with cuBLAS attention"
fi

section "summary"
echo "device_check: $failures failure(s)"
exit $(( failures > 0 ? 1 : 0 ))
