#!/bin/sh
# tests/engine/stage_cpu_test.sh — runs stage_cpu_test (its only argument) under mpirun with
# 1, 2 and 4 ranks: tp = 1, 2, 4 against the one-rank model and trainer. Runs as root and with
# more ranks than cores; shared memory and self transports only. Stops at the first failure.
set -eu
binary="$1"
shift
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
for np in 1 2 4; do
  echo "=== stage_cpu_test under mpirun -np $np"
  if ! mpirun --oversubscribe $root --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "stage_cpu_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "stage_cpu_test: passed with 1, 2 and 4 ranks"
