#!/usr/bin/env bash
# tests/tools/moe_cli_test.sh — mixture-of-experts models at the command line (issue 33):
# `describe` counts them (total and active parameters); `run` trains a model whose blocks are all
# MoE blocks on the CPU backend at ep 1 (tests/tools/testdata/tiny-moe.json), refuses one that
# mixes dense and MoE blocks naming the layer, and a capacity factor with cp > 1, each with
# exit 2 (a capacity factor trains) (planning them: tests/tools/moe_plan_test.sh; on the CUDA backend:
# tests/tools/cuda_emulated_run_test.sh).
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

expect 0 "parameters: 46,702,792,704 (46.7 B)" \
  "active parameters per token: 12,879,925,248 (12.9 B) of the 46.7 B total: each mixture-of-experts block routes a token to 2 of its 8 experts" \
  -- $mpengine describe examples/models/mixtral-8x7b.json
expect 0 "parameters: 14,315,784,192 (14.3 B)" \
  "active parameters per token: 2,689,173,504 (2.7 B) of the 14.3 B total: each mixture-of-experts block routes a token to 4 of its 60 experts plus its shared MLP" \
  -- $mpengine describe examples/models/qwen1.5-moe-a2.7b.json
expect 0 '"active_params":	12879925248' -- $mpengine describe examples/models/mixtral-8x7b.json --format json


# A tiny MoE model and a one-rank plan of it, as a user would write them by hand.
cat > "$tmp/tiny-moe.json" <<'JSON'
{
  "name": "tiny-moe",
  "vocab_size": 256,
  "seq_len": 64,
  "layers": [
    {"type": "embedding", "hidden": 64, "max_positions": 0},
    {"type": "transformer", "hidden": 64, "heads": 4, "kv_heads": 2, "norm": "rmsnorm", "activation": "swiglu", "bias": false, "rope_theta": 10000, "repeat": 2},
    {"type": "transformer", "hidden": 64, "heads": 4, "kv_heads": 2, "norm": "rmsnorm", "activation": "swiglu", "bias": false, "rope_theta": 10000, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 96}},
    {"type": "layernorm", "hidden": 64, "norm": "rmsnorm"},
    {"type": "lm_head", "hidden": 64, "tie_embedding": false}
  ]
}
JSON
cat > "$tmp/tiny-moe-plan.json" <<'JSON'
{
  "format": "mpengine-plan",
  "version": 1,
  "model": "tiny-moe.json",
  "cluster": "cpu-local",
  "parallel": {"dp": 1, "pp": 1, "tp": 1},
  "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 64},
  "schedule": "1f1b",
  "recompute": "none"
}
JSON
expect 0 "active parameters per token" -- $mpengine describe "$tmp/tiny-moe.json"
expect 2 "tiny-moe.json: \$.layers[2] (block.2): blocks of different shapes (dense and mixture-of-experts MLPs mixed" \
  -- $mpengine run --config "$tmp/tiny-moe-plan.json" --steps 1 --backend cpu
expect 2 "tiny-moe.json: \$.layers[2] (block.2): blocks of different shapes (dense and mixture-of-experts MLPs mixed" \
  -- $mpengine bench step "$tmp/tiny-moe.json" --steps 1

# A model of MoE blocks only trains on the CPU at ep 1: one rank, and pp 2 x tp 2 with sequence
# parallelism.
moe_model=$(dirname "${BASH_SOURCE[0]}")/testdata/tiny-moe.json
cp "$moe_model" "$tmp/all-moe.json"
for layout in "1 1 [7]" "2 2 [3,4]"; do
  set -- $layout
  cat > "$tmp/all-moe-plan-$1x$2.json" <<JSON
{"model": "all-moe.json", "cluster": "cpu-local",
 "parallel": {"dp": 1, "pp": $1, "tp": $2, "sequence_parallel": true}, "layers_per_stage": $3,
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 32},
 "schedule": "1f1b", "recompute": "none", "training": {"steps": 3, "learning_rate": 1e-3}}
JSON
  expect 0 "done: 3 steps" -- $mpengine run --config "$tmp/all-moe-plan-$1x$2.json" --backend cpu
done
# A capacity factor (layers/moe.h: each expert keeps its first ceil(1.25 x N x K / E) pairs)
# trains on the CPU; with cp > 1 it is refused naming the field, since a cp rank routes only
# part of each sequence.
sed 's/"z_loss_coeff": 0.001}/"z_loss_coeff": 0.001, "capacity_factor": 1.25}/' "$moe_model" > "$tmp/all-moe.json"
expect 0 "done: 3 steps" -- $mpengine run --config "$tmp/all-moe-plan-1x1.json" --backend cpu
cat > "$tmp/all-moe-plan-cp2.json" <<JSON
{"model": "all-moe.json", "cluster": "cpu-local",
 "parallel": {"dp": 1, "cp": 2, "pp": 1, "tp": 1}, "layers_per_stage": [7],
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 2, "seq_len": 32},
 "schedule": "1f1b", "recompute": "none", "training": {"steps": 3, "learning_rate": 1e-3}}
JSON
expect 2 "all-moe.json: \$.layers[1].moe.capacity_factor with cp = 2: a context-parallel rank routes only part of each sequence" \
  -- $mpengine run --config "$tmp/all-moe-plan-cp2.json" --backend cpu

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
