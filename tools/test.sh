#!/usr/bin/env bash
# tools/test.sh — set up, build everything, run every test, and end with the line
#   N passed, N failed[, N skipped]
# counted over individual test cases (GoogleTest cases, and one per shell test; the MPI suites'
# reports hold every rank's failures, tests/support/mpi_gtest_main.h; a target Bazel failed with
# no failed case in its report counts as one failure). Exits non-zero
# when anything fails to build or any test fails. Extra arguments go to `bazel test` (a target
# pattern, say: tools/test.sh //topology/...). A first argument --asan runs the same under
# AddressSanitizer + UndefinedBehaviorSanitizer (.bazelrc's configs "asan" and "asan_emulated",
# in output trees of their own): what tools/test_asan.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."

config=()
emulated_config=(--config=emulated --symlink_prefix=/)
if [ "${1:-}" = "--asan" ]; then
  shift
  config=(--config=asan)
  emulated_config=(--config=asan_emulated)
fi

tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

at_exit=()
if [ "${CI:-}" = "true" ]; then
  # CI must leave no Bazel server behind.
  at_exit+=("bazel shutdown >/dev/null 2>&1 || true")
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(//...); fi

# `bazel test` builds every target of the patterns, not only the tests: exit 1 means the build
# failed, 3 that a test failed.
# Bazel's own verdict per target, kept to catch a failure that no test case of its XML report
# shows (a wrapper script's own check, a rank that died before reporting).
bazel_log=$(mktemp)
at_exit+=("rm -f '$bazel_log'")
trap 'for c in "${at_exit[@]}"; do eval "$c"; done' EXIT
bazel test "${config[@]}" --keep_going "${targets[@]}" 2>&1 | tee "$bazel_log"
test_status=${PIPESTATUS[0]}
build_status=0
if [ $test_status -ne 0 ] && [ $test_status -ne 3 ]; then build_status=$test_status; fi

# The GPU code above the kernels, run on the CPU with the CUDA C APIs emulated (third_party/
# cuda.bzl), in its own output tree (.bazelrc's config "emulated"; no convenience symlinks, so
# bazel-bin keeps the real build). Part of the full run only. The kernel tests run there too, but
# what they check there is not a GPU kernel: an emulated "kernel" is its CPU twin, and the
# emulated NCCL is MPI underneath, so they check the launchers' shapes, strides and roundings and
# the plumbing around them. Their cases are counted apart in the summary, so that the number of
# passed tests does not read as GPU coverage; the kernels themselves run only on a GPU
# (tools/device_check.sh runs every one of these suites there, by name).
emulated=()
if [ "$#" -eq 0 ]; then
  emulated=(//tests/engine:stage_gpu_test
            //tests/engine:comm_nccl_emulated_test //tests/tools:cuda_emulated_run_test
            //tests/tools:gpu_host_memory_test
            //tests/layers:cuda_elementwise_test //tests/layers:cuda_gemm_test
            //tests/layers:cuda_tensor_parallel_test //tests/layers:flash_attention_window_test
            //tests/layers:moe_cuda_test //tests/expert_parallel:ep_comm_nccl_test)
  bazel test "${emulated_config[@]}" --keep_going "${emulated[@]}" 2>&1 |
    tee -a "$bazel_log"
  emulated_status=${PIPESTATUS[0]}
  if [ $emulated_status -ne 0 ] && [ $emulated_status -ne 3 ]; then build_status=$emulated_status; fi
  if [ $emulated_status -eq 3 ] && [ $test_status -eq 0 ]; then test_status=3; fi
fi

# Count test cases from each test target's XML report (an emulated target's from the emulated
# tree: its normal run skipped itself without a GPU).
passed=0 failed=0 skipped=0 emulated_passed=0
failed_names=()
tests=$(bazel query "tests(set(${targets[*]}))" 2>/dev/null)
testlogs=$(bazel info "${config[@]}" bazel-testlogs 2>/dev/null)
emulated_testlogs=$(bazel info "${emulated_config[@]}" bazel-testlogs 2>/dev/null)
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
  [ "$xml_root" = "$emulated_testlogs" ] && emulated_passed=$((emulated_passed + p))
  for n in $names; do failed_names+=("$n"); done
  # Bazel failed the target but no case of its report did: count the target itself.
  if [ "$f" -eq 0 ] && grep -qE "^(FAIL|TIMEOUT|NO STATUS|INCOMPLETE): $target( |\$)" "$bazel_log"; then
    failed=$((failed + 1))
    failed_names+=("$target (failed outside its test cases: see its test.log)")
  fi
done

if [ $build_status -ne 0 ] && [ $failed -eq 0 ]; then
  failed=$((failed + 1))
  failed_names+=("the build")
fi
if [ ${#failed_names[@]} -gt 0 ]; then
  echo "failed:"
  for n in "${failed_names[@]}"; do echo "  $n"; done
fi
if [ $emulated_passed -gt 0 ]; then
  echo "of the passed, $emulated_passed ran under emulated CUDA (CPU twins for the kernels, MPI" \
       "for NCCL): launchers and plumbing, not GPU kernels"
fi
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
if [ $failed -ne 0 ] || [ $test_status -ne 0 ] || [ $build_status -ne 0 ]; then exit 1; fi
exit 0
