#!/usr/bin/env bash
# tools/test_asan.sh — tools/test.sh under AddressSanitizer + UndefinedBehaviorSanitizer
# (.bazelrc's configs "asan" and "asan_emulated"): builds everything sanitized, runs every test
# and the emulated-CUDA set, and ends with the line
#   N passed, N failed[, N skipped]
# counted as tools/test.sh counts. A sanitizer report fails its test (ASan and LSan exit non-zero;
# UB aborts). Extra arguments go to `bazel test` (a target pattern: tools/test_asan.sh
# //topology/...); the emulated set runs only in the full run. Outputs go to trees of their own:
# bazel-bin keeps the normal build.
exec "$(dirname "$0")/test.sh" --asan "$@"
