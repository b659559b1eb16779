#!/bin/sh
# tests/tensor_parallel/tp_layers_test.sh — runs tp_layers_test (its only argument) under mpirun
# with 1, 2 and 4 ranks: tp = 1, 2, 4, each against the one-rank reference it computes itself.
#
# Runs as root (OMPI_ALLOW_RUN_AS_ROOT in .bazelrc's test env) and with more ranks than cores
# (oversubscription); shared memory and self transports only, so nothing probes the network and
# no ssh agent is looked for. Stops at the first failing world size.
set -eu
binary="$1"
shift

export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"

for np in 1 2 4; do
  echo "=== tp_layers_test under mpirun -np $np"
  if ! mpirun --oversubscribe --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "tp_layers_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "tp_layers_test: passed with 1, 2 and 4 ranks"
