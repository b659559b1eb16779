#!/usr/bin/env bash
# tools/quickstart.sh — from a fresh clone to mpengine's main job on the embedded default model,
# examples/models/tiny-gpt.json: install what is missing, build, and show what mpengine knows
# about the model and how a pipeline would run it. Later capabilities extend this script (plan it
# onto 8 ranks of the cpu-local cluster, train it, show the measured timeline).
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

echo "== mpengine describe $model"
$mpengine describe "$model"

echo "== mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json (4 pipeline stages, 8 micro-batches)"
$mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json --format ascii

echo "== mpengine run --config examples/plans/tiny-gpt-1rank.json (one rank, synthetic Markov source)"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} $mpengine run --config examples/plans/tiny-gpt-1rank.json
