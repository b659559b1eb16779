#!/usr/bin/env bash
# tools/device_bundle.sh — prepare .device/ for the lent GPU machine, which has CUDA and PyTorch
# but no Bazel, no apt and no network.
#
# Builds the binaries here, copies them to .device/bin, and copies into .device/lib every shared
# library they need that the GPU machine lacks (Debian's cJSON, OpenBLAS, Open MPI, ...). The
# CUDA libraries (cudart, cuBLAS, NCCL) are not carried: they are hundreds of MiB, and the GPU
# machine has its own, which tools/device_check.sh finds. glibc and libstdc++ are not carried
# either: the GPU machine's are newer and compatible.
#
# Then: the device tool's run with carry [".device"] and command "bash tools/device_check.sh".
set -euo pipefail
cd "$(dirname "$0")/.."

binaries=(
  //tools:mpengine
  //tests/layers:cuda_elementwise_test
  //tests/layers:cuda_gemm_test
  //tests/layers:flash_attention_test
  //tests/engine:gpt_model_gpu_test
)
bazel build "${binaries[@]}"

rm -rf .device
mkdir -p .device/bin .device/lib
for target in "${binaries[@]}"; do
  path=bazel-bin/${target#//}
  path=${path/://}
  cp "$path" .device/bin/
done

skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl)'
for binary in .device/bin/*; do
  ldd "$binary" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $skip ]]; then continue; fi
    cp -L "$path" ".device/lib/$name"
  done
done
du -sh .device
ls .device/bin .device/lib
