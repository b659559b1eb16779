#!/usr/bin/env bash
# tools/quickstart.sh — from a fresh clone to mpengine's main job on the embedded default model,
# examples/models/tiny-gpt.json: install what is missing, build, describe the model, plan it onto 8
# ranks of the cpu-local cluster, draw the 1F1B schedule of a 4-stage plan, train it on one rank
# down to its synthetic source's entropy floor, and train it tensor-parallel over 2 ranks. The
# measured timeline joins when issue 10 lands.
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

echo "== mpengine plan $model --gpus 8 (the cpu-local cluster: 8 ranks on this machine)"
$mpengine plan "$model" --gpus 8 --global-batch 16 --top 3

echo "== mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json (4 pipeline stages, 8 micro-batches)"
$mpengine schedule --config examples/plans/tiny-gpt-pp4-1f1b.json --format ascii

echo "== mpengine run --config examples/plans/tiny-gpt-1rank.json (one rank, synthetic Markov source)"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} $mpengine run --config examples/plans/tiny-gpt-1rank.json

echo "== mpengine run --config examples/plans/tiny-gpt-tp2.json --steps 20 (tensor parallel over 2 ranks, launched through mpirun)"
$mpengine run --config examples/plans/tiny-gpt-tp2.json --steps 20
