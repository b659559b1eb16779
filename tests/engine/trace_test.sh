#!/bin/sh
# tests/engine/trace_test.sh — runs trace_test (its only argument) under mpirun with 1 and 2
# ranks: the recorder and reader on every rank, and the gather of every rank's events into rank 0's
# file. Runs as root and with more ranks than cores; shared memory and self transports only.
set -eu
binary="$1"
shift
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Bazel's sandbox has a private TMPDIR; Open MPI's session directory goes there.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
for np in 1 2; do
  echo "=== trace_test under mpirun -np $np"
  if ! timeout 120 mpirun --oversubscribe $root --mca btl self,vader -np "$np" "$binary" "$@"; then
    echo "trace_test: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "trace_test: passed with 1 and 2 ranks"
