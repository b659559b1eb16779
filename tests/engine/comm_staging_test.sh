#!/bin/sh
# tests/engine/comm_staging_test.sh — runs comm_staging_test (its only argument) under mpirun with
# 1, 2 and 3 ranks: engine/comm/comm.h's staging of GPU buffers against a fake device that crashes
# any direct use of a device buffer. Runs as root and with more ranks than cores; shared memory
# and self transports only.
set -eu
binary="$1"
shift
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
for np in 1 2 3; do
  echo "=== comm_staging_test under mpirun -np $np"
  if ! timeout 120 mpirun --oversubscribe $root --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "comm_staging_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "comm_staging_test: passed with 1, 2 and 3 ranks"
