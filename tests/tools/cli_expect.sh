# tests/tools/cli_expect.sh — the checks every shell test of the mpengine command uses; sourced.
#
#   expect EXIT_CODE PATTERN... -- COMMAND...   runs COMMAND once and checks its exit code and that
#                                               its combined output contains every PATTERN (fixed
#                                               strings); on a mismatch prints the output
#   fail MESSAGE                                records a failed check
# Both count into $failures, which the script reports at its end.
failures=${failures:-0}

expect() {
  local want_code=$1
  shift
  local patterns=()
  while [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  shift
  local output code pattern
  output=$("$@" 2>&1)
  code=$?
  for pattern in "${patterns[@]}"; do
    if [ "$code" -ne "$want_code" ] || ! grep -qF -- "$pattern" <<<"$output"; then
      echo "FAIL: $* -> exit $code (want $want_code), output:"
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
