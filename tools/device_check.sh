#!/usr/bin/env bash
# tools/device_check.sh — everything mpengine checks on a real GPU, in one call, printing one report.
#
# Runs on the lent GPU machine (no Bazel, no apt, no network) from the repository root, with the
# binaries that tools/device_bundle.sh built here in .device/. It prints:
#   - the machine, the library versions, a smoke kernel checked against the CPU;
#   - every CUDA kernel checked against its CPU twin (max relative error), and the GPU model
#     against the CPU model;
#   - the measured bf16 GEMM peak (PyTorch), the figure MFU is also given against;
#   - one-GPU training of tiny-gpt (loss against the entropy floor), gpt2-124m and gpt2-1.5b
#     (tokens/s, MFU), and PyTorch eager on the same model and batch for the tokens/s ratio.
# Usage: bash tools/device_check.sh [--quick]   (--quick: kernels and tiny-gpt only)
set -uo pipefail
cd "$(dirname "$0")/.."
quick=${1:-}

section() { printf '\n== %s ==\n' "$*"; }

if [ ! -x .device/bin/mpengine ]; then
  echo "device_check: .device/bin/mpengine missing; run tools/device_bundle.sh here first" >&2
  exit 2
fi

# CUDA libraries: the machine's toolkit, and NCCL from wherever it is installed (the CUDA image
# ships it in a Python package when not in the toolkit).
libdirs=(.device/lib)
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
for binary in .device/bin/*; do
  if ldd "$binary" | grep "not found"; then fail "$binary has missing libraries"; fi
done
echo "checked $(ls .device/bin | wc -l) binaries"

section "mpengine version --smoke-test"
.device/bin/mpengine version --smoke-test || fail "smoke test"

section "CUDA kernels against their CPU twins"
for test in cuda_elementwise_test cuda_gemm_test flash_attention_test gpt_model_gpu_test; do
  if [ -x ".device/bin/$test" ]; then
    timeout 300 ".device/bin/$test" 2>&1 | grep -E "kernel |model |gpu training|FAILED|Failure|Expected|Which is|error|PASSED|SKIPPED|tests? ran" \
      || fail "$test printed nothing"
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "$test"
  else
    fail "$test not bundled"
  fi
done

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
timeout 300 .device/bin/mpengine run --config examples/plans/tiny-gpt-1rank.json --backend cuda \
  | grep -E "^(model|backend|entropy|done)|step (1|100|200|300)/" || fail "tiny-gpt on cuda"

if [ "$quick" != "--quick" ]; then
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
