#!/usr/bin/env bash
# tools/test_asan.sh — tools/test.sh under AddressSanitizer + UndefinedBehaviorSanitizer
# (.bazelrc's configs "asan" and "asan_emulated"): builds everything sanitized, runs every test
# and the emulated-CUDA set, and ends with the line
#   N passed, N failed[, N skipped]
# counted over individual test cases. A sanitizer report fails its test (ASan and LSan exit
# non-zero; UB aborts). Exits non-zero when anything fails to build or any test fails. Extra
# arguments go to `bazel test` (a target pattern, say: tools/test_asan.sh //topology/...); the
# emulated set runs only in the full run. Outputs go to trees of their own: bazel-bin keeps the
# normal build.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

if [ "${CI:-}" = "true" ]; then
  # CI must leave no Bazel server behind.
  trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(//...); fi

# Exit 1 means the build failed, 3 that a test failed.
bazel test --config=asan --keep_going "${targets[@]}"
test_status=$?
build_status=0
if [ $test_status -ne 0 ] && [ $test_status -ne 3 ]; then build_status=$test_status; fi

# The GPU code above the kernels on the emulated CUDA APIs, sanitized (tools/test.sh's set).
emulated=()
if [ "$#" -eq 0 ]; then
  emulated=(//tests/engine:gpt_model_gpu_test //tests/engine:gpt_stage_gpu_test
            //tests/engine:comm_nccl_emulated_test //tests/tools:cuda_emulated_run_test)
  bazel test --config=asan_emulated --keep_going "${emulated[@]}"
  emulated_status=$?
  if [ $emulated_status -ne 0 ] && [ $emulated_status -ne 3 ]; then build_status=$emulated_status; fi
  if [ $emulated_status -eq 3 ] && [ $test_status -eq 0 ]; then test_status=3; fi
fi

# Count test cases from each target's XML report, as tools/test.sh does.
passed=0 failed=0 skipped=0
failed_names=()
tests=$(bazel query "tests(set(${targets[*]}))" 2>/dev/null)
testlogs=$(bazel info --config=asan bazel-testlogs 2>/dev/null)
emulated_testlogs=$(bazel info --config=asan_emulated bazel-testlogs 2>/dev/null)
for target in $tests; do
  xml_root=$testlogs
  for e in "${emulated[@]}"; do [ "$e" = "$target" ] && xml_root=$emulated_testlogs; done
  path=${target#//}
  path=${path/://}
  xml="$xml_root/$path/test.xml"
  if [ ! -f "$xml" ]; then
    failed=$((failed + 1))
    failed_names+=("$target (did not build or run)")
    continue
  fi
  read -r p f s names < <(awk -v target="$target" '
    function finish() {
      if (!open) return
      if (bad) { f++; names = names " " target ":" name } else if (skip) s++; else p++
      open = 0
    }
    /<testcase / {
      finish(); open = 1; bad = 0; skip = ($0 ~ /result="skipped"/)
      name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
      if ($0 ~ /\/>[[:space:]]*$/) { finish(); next }
    }
    open && /<(failure|error)[ >]/ { bad = 1 }
    open && /<skipped/ { skip = 1 }
    /<\/testcase>/ { finish() }
    END { finish(); printf "%d %d %d%s\n", p, f, s, names }' "$xml")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  for n in $names; do failed_names+=("$n"); done
done

if [ $build_status -ne 0 ] && [ $failed -eq 0 ]; then
  failed=$((failed + 1))
  failed_names+=("the build")
fi
# A target that failed without a failing case in its XML (a sanitizer report after the last
# GoogleTest case, at exit: LeakSanitizer) still counts as failed.
if [ $test_status -ne 0 ] && [ $failed -eq 0 ]; then
  failed=$((failed + 1))
  failed_names+=("a test target (see bazel's summary above)")
fi
if [ ${#failed_names[@]} -gt 0 ]; then
  echo "failed:"
  for n in "${failed_names[@]}"; do echo "  $n"; done
fi
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
if [ $failed -ne 0 ] || [ $test_status -ne 0 ] || [ $build_status -ne 0 ]; then exit 1; fi
exit 0
