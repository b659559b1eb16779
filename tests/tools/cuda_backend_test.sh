#!/usr/bin/env bash
# tests/tools/cuda_backend_test.sh — the CUDA backend is a library the binary loads only when a GPU
# is asked for (engine/cuda_backend/cuda_backend.h):
#   - the binary links no CUDA library, and `describe`, `plan` and a CPU run never open one;
#   - `run --backend cuda` opens libmpengine_cuda.so from beside the binary;
#   - a backend that cannot be loaded is named with what is missing (the file, a library it needs,
#     a library that is not a backend, one from another build), exit 2, and CPU runs still work.
# Runs in both builds (real CUDA: the run stops at "no CUDA GPU"; emulated: it trains).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
plan=examples/plans/tiny-gpt-1rank.json
cuda_libraries='libcudart|libcublas|libnccl|libmpengine_cuda'

# The dynamic loader's record of every file a command opens (LD_DEBUG=files), on stderr.
opened_files() { LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -oE "file=[^ ]+" | sort -u; }

if ldd "$mpengine" | grep -E "$cuda_libraries"; then
  fail "the mpengine binary links a CUDA library (ldd above)"
fi
[ -f "$(dirname "$(readlink -f "$mpengine")")/libmpengine_cuda.so" ] ||
  fail "no libmpengine_cuda.so beside $(readlink -f "$mpengine")"

for command in "describe examples/models/gpt2-124m.json" \
               "plan examples/models/gpt2-124m.json --gpus 8 --cluster h100-sxm" \
               "run --config $plan --steps 1 --backend cpu"; do
  opened=$(opened_files $mpengine $command)
  if grep -qE "$cuda_libraries" <<<"$opened"; then
    fail "mpengine $command opened a CUDA library: $(grep -E "$cuda_libraries" <<<"$opened" | tr '\n' ' ')"
  fi
  grep -q "file=libc.so.6" <<<"$opened" || fail "LD_DEBUG=files recorded nothing for mpengine $command"
done

# Asking for a GPU loads the backend (and on a machine without one says so).
opened=$(opened_files $mpengine run --config $plan --steps 1 --backend cuda)
grep -q "libmpengine_cuda.so" <<<"$opened" || fail "run --backend cuda did not open libmpengine_cuda.so"

# A copy of the binary without the backend beside it: CPU runs work, GPU runs name the file.
mkdir -p "$tmp/alone"
cp "$(readlink -f "$mpengine")" "$tmp/alone/mpengine"
alone=$tmp/alone/mpengine
expect 0 "done: 1 steps" -- $alone run --config $plan --steps 1 --backend cpu
expect 2 "the CUDA backend $tmp/alone/libmpengine_cuda.so is missing" "MPENGINE_CUDA_BACKEND" \
  -- $alone run --config $plan --steps 1 --backend cuda
expect 0 "cuda: the CUDA backend $tmp/alone/libmpengine_cuda.so is missing" -- $alone version

# Backends that cannot load, through MPENGINE_CUDA_BACKEND: one needing a library that is gone,
# one that is no backend, one from another build.
if command -v cc >/dev/null; then
  mkdir -p "$tmp/fake"
  echo 'int mpengine_test_gone_dependency;' | cc -shared -fPIC -x c - -o "$tmp/fake/libmpengine_test_gone.so"
  echo 'extern int mpengine_test_gone_dependency; int *stub = &mpengine_test_gone_dependency;' |
    cc -shared -fPIC -x c - -o "$tmp/fake/needs_gone.so" -L"$tmp/fake" -Wl,--no-as-needed \
      -lmpengine_test_gone
  rm "$tmp/fake/libmpengine_test_gone.so"
  echo 'int not_a_backend;' | cc -shared -fPIC -x c - -o "$tmp/fake/not_backend.so"
  echo 'const struct { const char *signature; } mp_cuda_backend_table_v1 = {"mp_status other(void);"};' |
    cc -shared -fPIC -x c - -o "$tmp/fake/other_build.so"
  MPENGINE_CUDA_BACKEND=$tmp/fake/needs_gone.so expect 2 \
    "cannot load the CUDA backend $tmp/fake/needs_gone.so: libmpengine_test_gone.so: cannot open shared object file" \
    "LD_LIBRARY_PATH" -- $mpengine run --config $plan --steps 1 --backend cuda
  MPENGINE_CUDA_BACKEND=$tmp/fake/not_backend.so expect 2 \
    "$tmp/fake/not_backend.so is not an mpengine CUDA backend (it has no mp_cuda_backend_table_v1)" \
    -- $mpengine run --config $plan --steps 1 --backend cuda
  MPENGINE_CUDA_BACKEND=$tmp/fake/other_build.so expect 2 \
    "the CUDA backend $tmp/fake/other_build.so comes from another build of mpengine" \
    -- $mpengine run --config $plan --steps 1 --backend cuda
  MPENGINE_CUDA_BACKEND=$tmp/fake/other_build.so expect 0 "done: 1 steps" \
    -- $mpengine run --config $plan --steps 1 --backend cpu
else
  echo "no C compiler: the fake backends are not built"
fi

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
