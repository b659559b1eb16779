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
# The working tree that reaches the GPU machine is limited to 64 MiB, so libraries over 4 MiB
# (OpenBLAS: 35 MiB) travel gzipped as .device/lib/NAME.gz, and tools/device_check.sh unpacks them.
#
# The GPU machine has no MPI either. For the checks that run several ranks on its one GPU, Open
# MPI's launcher (mpirun) and the runtime it loads at run time (its components, PMIx and its
# plugins, help texts, the default parameters) travel as .device/mpi.tar.gz: the components whose
# libraries are all carried (the shared-memory and TCP transports, the launcher's own; not UCX,
# OFI or InfiniBand), unpacked there and pointed at with OPAL_* and PMIX_* variables. Without
# Open MPI here the archive is left out and device_check.sh runs its one-rank steps only.
#
# Then: the device tool's run with carry [".device"] and command "bash tools/device_check.sh".
set -euo pipefail
cd "$(dirname "$0")/.."

binaries=(
  //tools:mpengine
  //tests/layers:cuda_elementwise_test
  //tests/layers:cuda_gemm_test
  //tests/layers:flash_attention_test
  //tests/layers:flash_attention_window_test
  //tests/layers:cuda_tensor_parallel_test
  //tests/layers:moe_cuda_test
  //tests/layers:moe_cuda_throughput_test
  //tests/engine:stage_gpu_test
  //tests/engine:comm_nccl_test
  //tests/engine:comm_nccl_watchdog_test
)
bazel build "${binaries[@]}"

rm -rf .device
mkdir -p .device/bin .device/lib
for target in "${binaries[@]}"; do
  path=bazel-bin/${target#//}
  path=${path/://}
  cp "$path" .device/bin/
done
# The CUDA backend mpengine loads from beside itself (engine/cuda_backend/cuda_backend.h).
cp bazel-bin/tools/libmpengine_cuda.so .device/bin/

skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl)'
carry_libraries() { # the non-CUDA, non-libc libraries the given binaries load, into .device/lib
  local binary name path
  for binary in "$@"; do
    ldd "$binary" | awk '/=> \// {print $1, $3}' | while read -r name path; do
      if [[ "$name" =~ $skip ]]; then continue; fi
      [ -e ".device/lib/$name" ] || cp -L "$path" ".device/lib/$name"
    done
  done
}
carry_libraries .device/bin/*

# Open MPI's launcher and runtime (Debian's layout: components under $libdir/openmpi/lib/openmpi3,
# PMIx under $libdir/pmix2), for the multi-rank steps of device_check.sh.
triplet_lib=/usr/lib/x86_64-linux-gnu
ompi_components=$triplet_lib/openmpi/lib/openmpi3
if command -v orterun >/dev/null && [ -d "$ompi_components" ]; then
  stage=$(mktemp -d)
  mpi=$stage/mpi
  mkdir -p "$mpi/bin" "$mpi/lib/openmpi3" "$mpi/lib/pmix" "$mpi/share/openmpi" "$mpi/share/pmix" \
    "$mpi/etc"
  cp -L "$(command -v orterun)" "$mpi/bin/mpirun"
  carry_libraries "$mpi/bin/mpirun"
  # The libraries the components may use: what is carried already, PMIx and the components'
  # common helpers, which travel in the archive.
  allowed='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libgcc_s|libz\.|libudev|libevent|libhwloc|libopen-pal|libopen-rte|libmpi\.|libpmix\.|libmunge\.|libmca_common_(sm|ompio|monitoring))'
  for component in "$ompi_components"/mca_*.so; do
    usable=1
    for dep in $(ldd "$component" | awk '/=>/ {print $1}'); do
      [[ "$dep" =~ $allowed ]] || { usable=0; break; }
    done
    if [ $usable -eq 1 ]; then cp "$component" "$mpi/lib/openmpi3/"; fi
  done
  for lib in libpmix.so.2 libmunge.so.2; do
    if [ -e "$triplet_lib/$lib" ]; then cp -L "$triplet_lib/$lib" "$mpi/lib/"; fi
  done
  for common in "$triplet_lib"/libmca_common_{sm,ompio,monitoring}.so.[0-9]*; do
    if [[ "$common" =~ \.so\.[0-9]+$ ]]; then cp -L "$common" "$mpi/lib/"; fi # the soname
  done
  cp "$triplet_lib"/pmix2/lib/pmix/*.so "$mpi/lib/pmix/" 2>/dev/null || true
  cp /usr/share/openmpi/*.txt "$mpi/share/openmpi/" 2>/dev/null || true
  cp -r "$triplet_lib"/pmix2/share/pmix/. "$mpi/share/pmix/" 2>/dev/null || true
  cp /etc/openmpi/openmpi-mca-params.conf "$mpi/etc/" 2>/dev/null || true
  tar czf .device/mpi.tar.gz -C "$stage" mpi
  rm -rf "$stage"
  echo "Open MPI runtime: $(tar tzf .device/mpi.tar.gz | grep -c 'openmpi3/mca_') components in .device/mpi.tar.gz"
else
  echo "no Open MPI here (orterun, $ompi_components): .device/mpi.tar.gz left out; device_check.sh runs one rank only"
fi

# Large libraries travel gzipped; device_check.sh unpacks them.
for lib in .device/lib/*; do
  if [ "$(stat -c %s "$lib")" -gt $((4 << 20)) ]; then gzip -9 "$lib"; fi
done
du -sh .device
ls .device/bin .device/lib
