#!/usr/bin/env bash
# tests/tools/bench_comm_cli_test.sh — `mpengine bench comm` under mpirun prints its nccl-tests
# style table with no wrong elements, and on one rank explains how to run it (exit 2). Its GPU
# variants (--backend cuda, --buffers device) on a machine without a GPU, or from a build without
# CUDA, exit 2 saying so, once per job; bad --backend / --buffers values are refused.
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

# Refusals of the GPU variants where no GPU is visible (CI). On a GPU machine they would run, so
# there only the bad values are checked (tools/device_check.sh runs the GPU variants).
expect_refusal() { # expected exit code, expected text, command...
  local want=$1 text=$2; shift 2
  local out; out=$("$@" 2>&1); local got=$?
  if [ $got -ne "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* -> exit $got (wanted $want with '$text'): $out"; failures=$((failures + 1))
  fi
}
if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  for variant in "--backend cuda" "--buffers device"; do
    # shellcheck disable=SC2086
    out=$("$mpengine" bench comm $variant 2>&1); code=$?
    if [ $code -ne 2 ] || ! grep -qE -- "^mpengine bench comm: $variant needs a GPU, and (none is visible on this machine|this mpengine was built without CUDA/NCCL)" <<<"$out"; then
      echo "FAIL: bench comm $variant without a GPU -> exit $code: $out"; failures=$((failures + 1))
    fi
  done
  # Under mpirun the refusal comes before MPI starts, from rank 0 only.
  out=$(timeout 60 mpirun --oversubscribe -np 2 "$mpengine" bench comm --backend cuda 2>&1)
  code=$?
  count=$(grep -c "^mpengine bench comm: --backend cuda needs a GPU" <<<"$out")
  if [ $code -eq 0 ] || [ "$count" -ne 1 ]; then
    echo "FAIL: mpirun -np 2 bench comm --backend cuda without a GPU -> exit $code, $count refusals: $out"
    failures=$((failures + 1))
  fi
fi
expect_refusal 2 "--backend: expected mpi or cuda, got 'nccl'" "$mpengine" bench comm --backend nccl
expect_refusal 2 "--buffers: expected host or device, got 'gpu'" "$mpengine" bench comm --buffers gpu
expect_refusal 2 "--buffers host: NCCL (--backend cuda) works on GPU buffers only" \
  "$mpengine" bench comm --backend cuda --buffers host

if [ $failures -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
