#!/bin/sh
# tests/engine/comm_nccl_emulated_test.sh — runs comm_nccl_emulated_test (its only argument, built
# with --config=emulated) under mpirun on 2 and on 3 ranks, every rank on the one emulated GPU:
# first every test but the abort, then the abort alone (it is final for a process). Runs as root
# and with more ranks than cores; shared memory and self transports only.
set -eu
binary="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA/ptrace rights inside sandboxes
export OMPI_MCA_mpi_yield_when_idle=1
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
for np in 2 3; do
  for filter in '-CommNcclEmulatedAbort.*' 'CommNcclEmulatedAbort.*'; do
    echo "=== mpirun -np $np comm_nccl_emulated_test --gtest_filter=$filter"
    if ! timeout 120 mpirun --oversubscribe --mca btl self,vader -np "$np" "$binary" \
        "--gtest_filter=$filter" "$@"; then
      echo "comm_nccl_emulated_test: FAILED with $np ranks ($filter)" >&2
      exit 1
    fi
  done
done
echo "comm_nccl_emulated_test: passed with 2 and 3 ranks"
