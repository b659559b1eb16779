#!/usr/bin/env bash
# tools/device_check.sh — everything mpengine checks on a real GPU, in one call, printing one report.
#
# Runs on the lent GPU machine (no Bazel, no apt, no network) from the repository root, with the
# binaries that tools/device_bundle.sh built here in .device/. Sections grow with the GPU
# issues: today it proves that CUDA code built here runs there (device query, library versions,
# a kernel checked against the CPU) and measures the bf16 matrix peak that MFU figures divide by.
set -uo pipefail
cd "$(dirname "$0")/.."

section() { printf '\n== %s ==\n' "$*"; }

if [ ! -x .device/bin/mpengine ]; then
  echo "device_check: .device/bin/mpengine missing; run tools/device_bundle.sh here first" >&2
  exit 2
fi

# CUDA libraries: the machine's toolkit, and NCCL from wherever it is installed (the CUDA image
# ships it in a Python package when not in the toolkit).
libdirs=(.device/lib)
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  [ -d "$dir" ] && libdirs+=("$dir")
done
for lib in libnccl.so.2 libcublasLt.so.13 libcudart.so.13; do
  found=$(find / -xdev -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -n 1)
  [ -n "$found" ] && libdirs+=("$(dirname "$found")")
done
LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
failures=0

section "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
nproc

section "shared libraries"
if ldd .device/bin/mpengine | grep "not found"; then
  echo "MISSING libraries above"
  failures=$((failures + 1))
else
  echo "all resolved"
fi

section "mpengine version --smoke-test"
.device/bin/mpengine version --smoke-test || failures=$((failures + 1))

section "bf16 matrix peak (PyTorch, 8192^3, median of 20)"
timeout 120 python3 - <<'PY' || echo "(PyTorch measurement unavailable)"
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
median = times[len(times) // 2]
print(f"bf16 GEMM 8192^3: {2 * 8192**3 / median / 1e12:.0f} TFLOP/s (median {median * 1e3:.3f} ms)")
PY

section "describe (CPU path, for completeness)"
.device/bin/mpengine describe examples/models/gpt2-1.5b.json | tail -4 || failures=$((failures + 1))

section "summary"
echo "device_check: $failures failed section(s)"
exit $(( failures > 0 ? 1 : 0 ))
