#!/usr/bin/env bash
# tools/fuzz.sh — builds the libFuzzer targets of tests/fuzz/ with clang (AddressSanitizer,
# UndefinedBehaviorSanitizer, leak checking) straight from the sources, runs each over its corpus
# in tests/fuzz/corpus/<target>/, and prints a table: target, executions, seconds, crashes.
#
#   tools/fuzz.sh [--quick] [--runs N] [--merge] [TARGET...]
#
#   --runs N   executions per target (default 1000000, as issue 7 asks)
#   --quick    10000 executions per target: a smoke run
#   --merge    after fuzzing, add to the committed corpus the new inputs that reach new coverage
#              (libFuzzer's -merge=1; existing files stay); review the diff before committing
#   TARGET     model_json cluster_json plan_json token_shard llmc_checkpoint checkpoint_manifest
#              trace_json safetensors tokenizer_json
#              (default: all)
#
# Work files (binaries, new inputs, logs, crash-* reproducers) go to $FUZZ_WORK (default
# /tmp/mpengine-fuzz). Exits 1 when any target crashed, hung, leaked or reported undefined
# behaviour; the reproducer's path is printed, and `<binary> <reproducer>` replays it. CI does not
# fuzz: it replays the committed corpora with gcc (bazel test //tests/fuzz/...).
set -uo pipefail
cd "$(dirname "$0")/.."

runs=1000000
merge=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) runs=10000 ;;
    --runs) runs="$2"; shift ;;
    --merge) merge=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "tools/fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
all_targets=(model_json cluster_json plan_json token_shard llmc_checkpoint checkpoint_manifest
  trace_json safetensors tokenizer_json)
if [ ${#targets[@]} -eq 0 ]; then targets=("${all_targets[@]}"); fi

CLANG=${CLANG:-clang}
if ! command -v "$CLANG" >/dev/null 2>&1; then
  echo "tools/fuzz.sh: clang not found; install Debian's clang and libclang-rt-14-dev:" >&2
  echo "  sudo apt-get install clang libclang-rt-14-dev" >&2
  exit 2
fi
work=${FUZZ_WORK:-/tmp/mpengine-fuzz}
mkdir -p "$work"
probe="$work/probe.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }' > "$probe"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe" -o "$work/probe" 2>"$work/probe.log"; then
  echo "tools/fuzz.sh: $CLANG cannot link libFuzzer with the sanitizers:" >&2
  sed 's/^/  /' "$work/probe.log" >&2
  echo "install Debian's libclang-rt-14-dev (the fuzzer and sanitizer runtimes) and clang:" >&2
  echo "  sudo apt-get install clang libclang-rt-14-dev" >&2
  exit 2
fi

json=(common/error.c common/json_reader.c)
sources_model_json=("${json[@]}" topology/model.c topology/layer_cost.c)
sources_cluster_json=("${json[@]}" topology/cluster.c topology/cluster_presets.c)
sources_plan_json=("${json[@]}" topology/plan.c topology/layer_cost.c topology/model.c)
sources_token_shard=(common/error.c common/atomic_file.c engine/data/token_shard.c)
sources_llmc_checkpoint=("${json[@]}" topology/model.c engine/model/param_layout.c engine/weights/llmc_file.c common/float16.c engine/model/param_init.c
  common/rng.c common/atomic_file.c)
# The manifest checks live with the rest of the on-disk format in checkpoint_format.c, which calls
# neither the trainer nor MPI (saving and loading, in checkpoint.c, do).
sources_checkpoint_manifest=("${sources_llmc_checkpoint[@]}" topology/plan.c topology/layer_cost.c
  tensor_parallel/shard.c engine/checkpoint/checkpoint_format.c)
# The trace reader checks steps with the schedule checker and the target draws them: schedules/.
sources_trace_json=("${json[@]}" engine/trace/trace_reader.c schedules/schedule.c schedules/generate.c
  schedules/p2p.c schedules/checker.c schedules/simulator.c schedules/text.c schedules/timeline.c
  schedules/timeline_svg.c schedules/timeline_chrome.c)
# The safetensors reader and writer (the target writes accepted files back through the writer).
sources_safetensors=("${json[@]}" common/atomic_file.c engine/weights/safetensors.c)
# Hugging Face tokenizer.json files, loaded, encoded and decoded.
sources_tokenizer_json=("${json[@]}" common/text_buffer.c $(ls engine/data/tokenizer/*.c))
# Largest input worth trying: JSON files of a few KiB; a whole valid shard of a few hundred
# tokens; a whole fp32 checkpoint of the tiny fuzz layout (3120 bytes) with room to spare; a whole
# manifest of tiny-gpt at tp = 2 (19 KB); a trace of a few steps of a small pipeline (2 to 11 KB);
# the safetensors goldens (0.7 to 8.4 KB); the cut-down tokenizer.json seeds (5 to 7 KB).
declare -A max_len=([model_json]=4096 [cluster_json]=4096 [plan_json]=4096 [token_shard]=4096
  [llmc_checkpoint]=4096 [checkpoint_manifest]=32768 [trace_json]=16384 [safetensors]=16384
  [tokenizer_json]=16384)

cflags=(-g -O1 -std=gnu11 -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
  -fno-omit-frame-pointer)
libs=(-lcjson -lopenblas -lpcre2-8 -licuuc -licudata -lm)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OPENBLAS_NUM_THREADS=1

status=0
rows=()
for target in "${targets[@]}"; do
  sources_var="sources_${target}[@]"
  if ! declare -p "sources_${target}" >/dev/null 2>&1; then
    echo "tools/fuzz.sh: unknown target $target (known: ${all_targets[*]})" >&2
    exit 2
  fi
  binary="$work/${target}_fuzz"
  if ! "$CLANG" "${cflags[@]}" "tests/fuzz/${target}_fuzz.c" "${!sources_var}" "${libs[@]}" \
      -o "$binary" 2>"$work/$target.build.log"; then
    echo "tools/fuzz.sh: $target does not build:" >&2
    cat "$work/$target.build.log" >&2
    rows+=("$(printf '%-16s %12s %8s %8s' "$target" "-" "-" "build")")
    status=1
    continue
  fi
  corpus="tests/fuzz/corpus/$target"
  new="$work/$target.new"
  rm -rf "$new"
  mkdir -p "$new" "$work/$target.artifacts"
  # JSON targets get a dictionary: the format's keys and the numbers at the readers' bounds.
  dict=()
  if [ -f "tests/fuzz/$target.dict" ]; then
    cat tests/fuzz/json.dict "tests/fuzz/$target.dict" > "$work/$target.dict"
    dict=(-dict="$work/$target.dict")
  fi
  log="$work/$target.log"
  start=$(date +%s.%N)
  # New inputs go to $new (listed first); the committed corpus is only read.
  "$binary" "$new" "$corpus" -runs="$runs" -max_len="${max_len[$target]}" -timeout=5 \
    -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" -artifact_prefix="$work/$target.artifacts/" \
    >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=0
  if [ $rc -ne 0 ]; then
    crashes=$(ls "$work/$target.artifacts" | wc -l)
    [ "$crashes" -gt 0 ] || crashes=1
    status=1
    echo "tools/fuzz.sh: $target failed (exit $rc); log $log; reproducers:" >&2
    ls "$work/$target.artifacts"/* 2>/dev/null | sed 's/^/  /' >&2
    grep -m3 -E "ERROR|runtime error|SUMMARY" "$log" | sed 's/^/  /' >&2
  elif [ $merge -eq 1 ]; then
    # Merging into the committed corpus keeps every file there (the named seeds and regression
    # inputs) and adds only the new inputs that reach coverage it lacks.
    "$binary" -merge=1 -max_len="${max_len[$target]}" "$corpus" "$new" \
      >"$work/$target.merge.log" 2>&1 ||
      echo "tools/fuzz.sh: merging $target failed; see $work/$target.merge.log" >&2
  fi
  rows+=("$(printf '%-16s %12s %8.1f %8s' "$target" "${execs:-?}" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$crashes")")
done

printf '%-16s %12s %8s %8s\n' target executions seconds crashes
for row in "${rows[@]}"; do echo "$row"; done
exit $status
