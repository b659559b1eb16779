#!/bin/sh
# tests/expert_parallel/ep_comm_nccl_test.sh — runs ep_comm_nccl_test (its only argument, built
# with --config=emulated) under mpirun on 2 and on 3 ranks, every rank on the one emulated GPU.
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
  echo "=== mpirun -np $np ep_comm_nccl_test"
  if ! timeout 120 mpirun --oversubscribe --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "ep_comm_nccl_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "ep_comm_nccl_test: passed with 2 and 3 ranks"
