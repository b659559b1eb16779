#!/usr/bin/env bash
# tools/quickstart.sh — from a fresh clone to mpengine's main job on the embedded default model,
# examples/models/tiny-gpt.json: install what is missing, build, measure this machine for the cost
# model (into a temporary file), describe the model, plan it onto 8 ranks of the cpu-local
# cluster, draw the 1F1B schedule of a 4-stage plan, train it on one rank down to its synthetic
# source's entropy floor, then plan it onto 8 ranks as dp = pp = tp = 2, train that 3D-parallel on
# this machine's CPUs with a trace, and draw the measured timeline against the plan's prediction.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-examples/models/tiny-gpt.json}

echo "== setup"
tools/setup.sh

echo "== build"
bazel build //tools:mpengine
mpengine=bazel-bin/tools/mpengine

echo "== mpengine version"
$mpengine version

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The cost model needs this machine's figures (cores, GEMM peak, memory bandwidth). They go into a
# temporary file that plan and run read for cpu-local (MPENGINE_CALIBRATION), so a calibration
# you keep (~/.cache/mpengine/cpu-local.json) is neither used nor replaced.
echo "== mpengine calibrate --out cpu-local.json (this machine, for plan and run's cpu-local)"
$mpengine calibrate --out "$work/cpu-local.json"
export MPENGINE_CALIBRATION=$work/cpu-local.json

echo "== mpengine describe $model"
$mpengine describe "$model"

echo "== mpengine plan $model --gpus 8 (the cpu-local cluster: 8 ranks on this machine)"
$mpengine plan "$model" --gpus 8 --global-batch 16 --top 3

echo "== mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json (4 pipeline stages, 8 micro-batches)"
$mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json --format ascii

echo "== mpengine run --config examples/plans/tiny-gpt-1rank.json (one rank, synthetic Markov source)"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} $mpengine run --config examples/plans/tiny-gpt-1rank.json

echo "== mpengine plan $model --gpus 8 --dp 2 --pp 2 --tp 2 (3D parallel on 8 ranks of cpu-local)"
$mpengine plan "$model" --gpus 8 --dp 2 --pp 2 --tp 2 --schedule 1f1b --global-batch 16 --top 1 \
  --out "$work/plan-3d.json"

echo "== mpengine run --config plan-3d.json --steps 40 --trace trace.json (8 ranks under mpirun)"
$mpengine run --config "$work/plan-3d.json" --steps 40 --trace "$work/trace.json"

echo "== mpengine timeline trace.json --against plan-3d.json (what really happened, and the prediction's error)"
$mpengine timeline "$work/trace.json" --against "$work/plan-3d.json"
