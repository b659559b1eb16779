#!/usr/bin/env bash
# tests/tools/bench_comm_cli_test.sh — `mpengine bench comm` under mpirun prints its nccl-tests
# style table with no wrong elements, and on one rank explains how to run it (exit 2).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_plm_rsh_agent= OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1
failures=0

output=$(timeout 120 mpirun --oversubscribe -np 2 "$mpengine" bench comm --min-bytes 1K --max-bytes 4K 2>&1)
code=$?
for pattern in "# all_reduce (sum, in place), busbw factor 2(n-1)/n" "# reduce_scatter" "# all_gather" \
               "# #wrong in total: 0 OK"; do
  if ! grep -qF -- "$pattern" <<<"$output"; then
    echo "FAIL: bench comm output lacks '$pattern'"; failures=$((failures + 1))
  fi
done
if [ $code -ne 0 ]; then echo "FAIL: bench comm exited $code"; echo "$output" | tail; failures=$((failures + 1)); fi

output=$("$mpengine" bench comm 2>&1)
code=$?
if [ $code -ne 2 ] || ! grep -qF "run it under mpirun, for example: mpirun -np 2 mpengine bench comm" <<<"$output"; then
  echo "FAIL: one-rank bench comm -> exit $code: $output"; failures=$((failures + 1))
fi

if [ $failures -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
