#!/usr/bin/env bash
# tests/tools/moe_plan_test.sh — planning mixture-of-experts models with expert parallelism
# (issue 33's planner): `plan --ep` fixes ep (folded over dp x cp), --explain shows it and the
# all-to-all time, the plan file carries "ep", `schedule` draws it, and `run` trains it; every
# refusal names its numbers, exit 2.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
mpi_ranks_env

mixtral=examples/models/mixtral-8x7b.json
# Megatron-Core's Mixtral 8x7B layout (64 H100s, ep 8): planned, explained and written.
expect 0 "model mixtral-8x7b on 64 GPUs of h100-sxm" \
  "rank   dp   cp   ep   pp   tp" \
  "expert parallelism: ep 8, folded over the dp x cp = 16 ranks: each rank holds 1/8 of every mixture-of-experts block's experts" \
  "all-to-all (dispatch + combine)" \
  "over the ep group of 8 on the intra-node link" \
  "ep a2a" \
  "wrote the winner to $tmp/mixtral-plan.json" \
  -- $mpengine plan $mixtral --gpus 64 --cluster h100-sxm --ep 8 --tp 1 --pp 4 --global-batch 256 \
     --seq-len 4096 --explain --out "$tmp/mixtral-plan.json"
expect 0 '"ep":	8' -- cat "$tmp/mixtral-plan.json"
expect 0 '"ep":	8' '"tflops_per_gpu"' \
  -- $mpengine plan $mixtral --gpus 64 --cluster h100-sxm --ep 8 --global-batch 256 --json
# The simulated pipeline of the plan: the cost model takes MoE models now.
expect 0 "pp = 4" "checked: complete, ordered, no deadlock" \
  -- $mpengine schedule --config "$tmp/mixtral-plan.json"
# ...which the runtime trains (moe_parallel_equals_serial_test checks the numbers): a hand-written
# ep 2 plan of a tiny MoE model runs, and says how it splits the experts.
cat > "$tmp/ep2-zero1.json" <<JSON
{"model": "$PWD/tests/tools/testdata/tiny-moe.json", "cluster": "cpu-local",
 "parallel": {"dp": 2, "pp": 1, "tp": 1, "ep": 2, "zero_stage": 1},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 1, "seq_len": 32}}
JSON
expect 0 "2 ranks (dp 2 x pp 1 x tp 1, ep 2: 4 of the 8 experts a rank;" "done: 1 steps" \
  -- $mpengine run --config "$tmp/ep2-zero1.json" --steps 1 --backend cpu

# Refusals: an ep that does not split the experts, a dense model, an ep the fixed dp x cp cannot take.
expect 2 "mpengine plan: --ep: ep 3 does not divide the 8 experts of block.0 ($mixtral: \$.layers[1].moe.experts); each expert-parallel rank holds experts / ep whole experts" \
  -- $mpengine plan $mixtral --gpus 64 --cluster h100-sxm --ep 3
expect 2 "mpengine plan: --ep: ep 2 splits the experts of mixture-of-experts blocks over ranks, but model llama3-8b (examples/models/llama3-8b.json) has no such block; use ep 1" \
  -- $mpengine plan examples/models/llama3-8b.json --gpus 8 --cluster h100-sxm --ep 2
expect 2 "mpengine plan: --ep 4 does not divide dp x cp = 2 x 1 = 2 (the expert-parallel groups are cut out of the dp x cp ranks); choose an --ep that divides it" \
  -- $mpengine plan $mixtral --gpus 64 --cluster h100-sxm --dp 2 --cp 1 --ep 4

# Plans written by hand: ep must divide dp x cp (the plan reader), and a dense model takes none
# (the cost model, through schedule).
cat > "$tmp/ep3.json" <<JSON
{"model": "$PWD/examples/models/tiny-gpt.json", "cluster": "cpu-local",
 "parallel": {"dp": 2, "pp": 1, "tp": 1, "ep": 3},
 "batch": {"global_batch": 4, "micro_batch": 2, "num_micro_batches": 1, "seq_len": 64}}
JSON
expect 2 "$tmp/ep3.json: \$.parallel.ep: 3 does not divide dp x cp = 2 x 1 = 2 (the expert-parallel groups are cut out of the dp x cp ranks that share the other weights)" \
  -- $mpengine run --config "$tmp/ep3.json" --steps 1 --backend cpu
sed 's/"ep": 3/"ep": 2/' "$tmp/ep3.json" > "$tmp/dense-ep2.json"
expect 2 "$tmp/dense-ep2.json: \$.parallel.ep: ep 2 splits the experts of mixture-of-experts blocks over ranks, but model tiny-gpt ($PWD/examples/models/tiny-gpt.json) has no such block; use ep 1" \
  -- $mpengine schedule --config "$tmp/dense-ep2.json"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
