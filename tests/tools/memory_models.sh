#!/usr/bin/env bash
# tests/tools/memory_models.sh — what the shard-first memory tests (shard_memory_test.sh,
# gpu_host_memory_test.sh) share: the two models they compare and the run output they read.
#
#   memory_models DIR   writes DIR/wide.json, 8 blocks of C = 512, F = 2048 (3,152,384
#                       parameters each; vocabulary 128: 25M parameters, 96.5 MiB of fp32
#                       weights), and DIR/tiny.json, tiny-gpt with 8 blocks: the same process
#                       with almost no state, whose peak is a rank's baseline (libraries, MPI,
#                       BLAS)
#   peaks FILE          "rank peak_mib" lines from run's "memory: peak resident" line in FILE
#
# Sourcing it also sets what AddressSanitizer needs for such a test: freed blocks wait in its
# quarantine, still resident, so the pieces a rank allocates and frees one after another would add
# up in VmHWM without quarantine_size_mb=0.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"

memory_models() {
  cat > "$1/wide.json" <<'JSON'
{"name": "wide", "vocab_size": 128, "seq_len": 64,
 "layers": [
   {"type": "embedding", "hidden": 512, "max_positions": 64},
   {"type": "transformer", "hidden": 512, "heads": 8, "ffn_hidden": 2048, "repeat": 8},
   {"type": "layernorm", "hidden": 512},
   {"type": "lm_head", "hidden": 512, "tie_embedding": true}]}
JSON
  sed 's/"repeat": 4/"repeat": 8/' examples/models/tiny-gpt.json > "$1/tiny.json"
}

peaks() { grep '^memory: peak resident per rank' "$1" | grep -o 'rank [0-9]* ([^)]*) [0-9]* MiB' |
          sed 's/^rank \([0-9]*\) ([^)]*) \([0-9]*\) MiB/\1 \2/'; }
