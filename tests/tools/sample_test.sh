#!/usr/bin/env bash
# tests/tools/sample_test.sh — `mpengine sample --temperature 0` continues a prompt with exactly
# the tokens transformers' greedy decoding gives (tools/bench/sample_golden.py: GPT-2, Llama 3,
# Mixtral and Qwen2-MoE models over the committed tokenizers' vocabularies, four prompts each, 24
# tokens), from a Hugging Face directory; sampling with a seed repeats itself; and each bad input exits 2 with its
# message.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
testdata=${2:-tests/engine/testdata}
python=${PYTHON:-python3}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }

field() { # field GOLDEN CASE KEY: a case's prompt, or its generated ids joined by spaces
  "$python" -c '
import json, sys
case = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
value = case[sys.argv[3]]
print(" ".join(map(str, value)) if isinstance(value, list) else value, end="")' "$1" "$2" "$3"
}

compared=0
for model in hf_gpt2_sample hf_llama3_sample hf_mixtral_sample hf_qwen2_moe_sample; do
  golden=$testdata/$model/sample_golden.json
  tokenizer=$testdata/tokenizers/$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokenizer"].rsplit("/", 1)[1])' "$golden")
  cases=$("$python" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["cases"]))' "$golden")
  for ((i = 0; i < cases; ++i)); do
    prompt=$(field "$golden" "$i" prompt)
    want=$(field "$golden" "$i" generated_ids)
    output=$("$mpengine" sample --init-from "$testdata/$model" --tokenizer "$tokenizer" \
      --prompt "$prompt" --tokens 24 --temperature 0 --print-ids 2>&1)
    got=$(printf '%s\n' "$output" | sed -n 's/^ids: //p')
    if [ "$got" != "$want" ]; then
      fail "$model prompt $i ('$prompt'): mpengine's greedy ids differ from transformers'
  want: $want
  got:  $got
$output"
    fi
    compared=$((compared + 1))
  done
done
echo "compared $compared greedy continuations with transformers'"

# Sampling: the same seed gives the same tokens, another seed others.
gpt2=$testdata/hf_gpt2_sample
gpt2_tokenizer=$testdata/tokenizers/gpt2_style
draw() {
  "$mpengine" sample --init-from "$gpt2" --tokenizer "$gpt2_tokenizer" --prompt "Hello" \
    --tokens 16 --temperature 1 --top-k 50 --seed "$1" --print-ids 2>/dev/null | sed -n 's/^ids: //p'
}
first=$(draw 7)
[ -n "$first" ] || fail "sampling printed no ids"
[ "$first" = "$(draw 7)" ] || fail "sampling with seed 7 twice gave two different continuations"
[ "$first" != "$(draw 8)" ] || fail "seeds 7 and 8 gave the same 16 sampled tokens: $first"

# Bad input, exit 2 each.
expect 2 "its vocabulary has 8012 ids but the model's has 4002" \
  -- "$mpengine" sample --init-from "$gpt2" --tokenizer "$testdata/tokenizers/llama3_style" --prompt x
expect 2 "give the weights with --checkpoint DIR or --init-from HF_DIR (neither was given)" \
  -- "$mpengine" sample --tokenizer "$gpt2_tokenizer" --prompt x
expect 2 "(not both)" \
  -- "$mpengine" sample --init-from "$gpt2" --checkpoint "$gpt2" --tokenizer "$gpt2_tokenizer"
expect 2 "missing option --tokenizer" -- "$mpengine" sample --init-from "$gpt2"
expect 2 "--temperature: expected a number >= 0, got '-1'" \
  -- "$mpengine" sample --init-from "$gpt2" --tokenizer "$gpt2_tokenizer" --temperature -1
expect 2 "--checkpoint /nonexistent: neither a checkpoint" \
  -- "$mpengine" sample --checkpoint /nonexistent --tokenizer "$gpt2_tokenizer"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all sample checks passed"
