#!/bin/sh
# tests/expert_parallel/ep_dispatch_test.sh — runs ep_dispatch_test (its only argument) under
# mpirun with 2 and 4 ranks: ep 2, then ep 4 and ep 2 (two groups), each against the one-device
# layer it computes itself.
#
# Runs as root (OMPI_ALLOW_RUN_AS_ROOT in .bazelrc's test env) and with more ranks than cores
# (oversubscription); shared memory and self transports only, so nothing probes the network and
# no ssh agent is looked for. Stops at the first failing world size.
set -eu
binary="$1"
shift

export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA/ptrace rights inside sandboxes
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"

for np in 2 4; do
  echo "=== ep_dispatch_test under mpirun -np $np"
  if ! mpirun --oversubscribe --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "ep_dispatch_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "ep_dispatch_test: passed with 2 and 4 ranks"
