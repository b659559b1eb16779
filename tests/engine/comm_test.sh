#!/bin/bash
# tests/engine/comm_test.sh — runs the communicator tests (comm_test.cc) under Open MPI's mpirun on
# 2 and on 4 ranks (more ranks than cores is fine: --oversubscribe), as root where CI runs as
# root, with only the shared-memory and self transports (no network probing, no ssh), then checks
# that a collective one rank never joins ends the whole job with the timeout message.
set -u
binary="$1"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no CMA/ptrace rights inside sandboxes
export OMPI_MCA_mpi_yield_when_idle=1

failed=0
for ranks in 2 4; do
  echo "=== mpirun -np $ranks comm_test"
  if ! timeout 60 mpirun --oversubscribe -np "$ranks" "$binary"; then
    echo "FAILED: comm_test on $ranks ranks"
    failed=1
  fi
done

echo "=== mpirun -np 3 comm_test --collective-timeout-demo"
log="${TEST_TMPDIR:-/tmp}/collective_timeout.log"
start=$(date +%s)
timeout 30 mpirun --oversubscribe -np 3 "$binary" --collective-timeout-demo >"$log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
  echo "FAILED: the demo should end the job with an error, exit status $status"
  failed=1
fi
for rank in 1 2; do
  for expected in \
    "rank $rank: all-reduce in group world (ranks 0,1,2) timed out after 1.0 s (16 bytes); a member may have died or hung (the operation cannot be withdrawn, so group world can no longer be used)" \
    "rank $rank: group world (ranks 0,1,2) can no longer be used: an earlier all-reduce timed out and is still pending inside MPI; stop the run"; do
    if ! grep -qF "$expected" "$log"; then
      echo "FAILED: missing from the demo's output: $expected"
      failed=1
    fi
  done
done
if [ "$elapsed" -gt 20 ]; then
  echo "FAILED: the demo took ${elapsed} s to end"
  failed=1
fi
exit "$failed"
