#!/usr/bin/env bash
# tools/bench/llama_cpu_speed.sh — one-rank CPU training speed of a ~100M Llama-shaped model
# (issue 16): 12 layers, hidden 768, 12 heads over 4 kv heads, ffn 2048, vocabulary 32000, an
# untied head, B = 4 sequences of T = 64, one thread; mpengine (`run`, fp32, OpenBLAS with
# OPENBLAS_NUM_THREADS=1) against Hugging Face transformers' LlamaForCausalLM in eager mode with
# torch.optim.AdamW (tools/bench/llama_cpu_speed.py, torch.set_num_threads(1)) in the same run.
# Prints each median step time (steps 2..STEPS) and the ratio; the target is mpengine >= 1.5x.
#
#   PYTHON=V/bin/python tools/bench/llama_cpu_speed.sh [STEPS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/../.."
mpengine=${MPENGINE:-bazel-bin/tools/mpengine}
python=${PYTHON:-python3}
steps=${1:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
L=12 C=768 NH=12 KVH=4 F=2048 V=32000 B=4 T=64
cat > "$tmp/model.json" <<JSON
{"name": "llama-100m", "vocab_size": $V, "seq_len": $T, "layers": [
  {"type": "embedding", "hidden": $C, "max_positions": 0},
  {"type": "transformer", "hidden": $C, "heads": $NH, "kv_heads": $KVH, "ffn_hidden": $F, "norm": "rmsnorm", "norm_eps": 1e-5, "activation": "swiglu", "bias": false, "rope_theta": 10000, "repeat": $L},
  {"type": "layernorm", "hidden": $C, "norm": "rmsnorm", "norm_eps": 1e-5},
  {"type": "lm_head", "hidden": $C, "tie_embedding": false}]}
JSON
cat > "$tmp/plan.json" <<JSON
{"model": "$tmp/model.json", "cluster": "cpu-local", "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"global_batch": $B, "micro_batch": $B, "num_micro_batches": 1, "seq_len": $T},
 "training": {"steps": $steps, "learning_rate": 3e-4, "weight_decay": 0.1}}
JSON
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$mpengine" run --config "$tmp/plan.json" \
  --metrics "$tmp/metrics.jsonl" > "$tmp/run.log"
ours=$(awk -F'"ms": ' 'NR > 1 { split($2, a, ","); print a[1] / 1000 }' "$tmp/metrics.jsonl" |
       sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
params=$(grep -o '[0-9]* parameters' "$tmp/run.log" | head -1)
theirs_json=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$python" tools/bench/llama_cpu_speed.py \
              $L $C $NH $KVH $F $V $B $T "$steps" 2> /dev/null)
theirs=$(sed 's/.*"step_s": \([0-9.e+-]*\).*/\1/' <<<"$theirs_json")
echo "model: $L layers, hidden $C, $NH heads ($KVH kv), ffn $F, vocab $V, untied; B $B, T $T; one thread; mpengine: $params"
echo "transformers: $theirs_json"
awk -v a="$ours" -v b="$theirs" 'BEGIN {
  printf "median step: mpengine %.3f s, transformers eager + AdamW %.3f s: mpengine %.2fx faster (target >= 1.5x: %s)\n",
         a, b, b / a, (b / a >= 1.5 ? "met" : "missed") }'
