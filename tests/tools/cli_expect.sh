# tests/tools/cli_expect.sh — the checks every shell test of the mpengine command uses; sourced.
#
#   expect EXIT_CODE PATTERN... -- COMMAND...   runs COMMAND once and checks its exit code and that
#                                               its combined output contains every PATTERN (fixed
#                                               strings); on a mismatch prints the output
#   fail MESSAGE                                records a failed check
#   mpi_ranks_env                               the environment of a test that starts several
#                                               ranks on this machine (below)
# Both count into $failures, which the script reports at its end.
#
# expect needs at least one PATTERN, and no empty one: a call with none used to check nothing at
# all, exit code included (the check lived inside the loop over patterns), and an empty pattern
# matches any output; both are refused as a failed check. The exit code is checked on its own,
# before the patterns.
failures=${failures:-0}

expect() {
  local want_code=$1
  shift
  local patterns=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  if [ $# -eq 0 ]; then
    echo "FAIL: expect $want_code ${patterns[*]}: no '--' before the command"
    failures=$((failures + 1))
    return
  fi
  shift
  if [ ${#patterns[@]} -eq 0 ]; then
    echo "FAIL: expect $want_code -- $*: no pattern to expect in the output (give at least one)"
    failures=$((failures + 1))
    return
  fi
  for pattern in "${patterns[@]}"; do
    if [ -z "$pattern" ]; then
      echo "FAIL: expect $want_code '' -- $*: an empty pattern matches any output; say what to expect"
      failures=$((failures + 1))
      return
    fi
  done
  local output code pattern
  output=$("$@" 2>&1)
  code=$?
  if [ "$code" -ne "$want_code" ]; then
    echo "FAIL: $* -> exit $code (want $want_code), output:"
    echo "$output" | head -20
    failures=$((failures + 1))
    return
  fi
  for pattern in "${patterns[@]}"; do
    if ! grep -qF -- "$pattern" <<<"$output"; then
      echo "FAIL: $* -> exit $code, output:"
      echo "$output" | head -20
      echo "  (wanted to contain: $pattern)"
      failures=$((failures + 1))
      return
    fi
  done
}

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# One BLAS thread per rank (the ranks share the cores), Open MPI's shared-memory transport and no
# ssh agent, and its session directory in Bazel's private TMPDIR.
mpi_ranks_env() {
  export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
  export OMPI_MCA_plm_rsh_agent=
  export OMPI_MCA_btl=self,vader
  export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
}
