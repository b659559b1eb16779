#!/usr/bin/env bash
# tests/tools/import_cli_test.sh — `mpengine import HF_DIR --out MODEL.json` against Hugging Face
# transformers itself: every config.json under testdata/hf/import was written by transformers'
# config classes (tools/bench/hf_import_golden.py), and the description imported from it must
# have the parameter count transformers' num_parameters() gave the model it built from the same
# file (testdata/hf/expected_params.tsv), as `mpengine describe` counts it. The imports of the
# published Llama-3.1-8B, Qwen2.5-0.5B and tiny Llama shapes equal examples/models byte for byte.
# Every config under testdata/hf/refuse is refused with exit 2 and its exact message, and so are
# missing keys, wrong types, an unknown model_type and an existing --out file.
set -uo pipefail
mpengine=${1:-${MPENGINE:-tools/mpengine}}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/cli_expect.sh" || { echo "cannot load cli_expect.sh"; exit 1; }
hf=tests/tools/testdata/hf

# The total parameter count `mpengine describe --format json` reports (the last "params").
described_params() {
  $mpengine describe "$1" --format json | grep -o '"params":[[:space:]]*[0-9]*' | tail -1 |
    grep -o '[0-9]*$'
}

# 1. Every importable fixture: the import succeeds, loads with describe, and has as many
#    parameters as transformers built; for the real shapes that is also the published count.
imported=0
while IFS=$'\t' read -r name architecture hf_params published; do
  case "$name" in '#'* | '') continue ;; esac
  out="$tmp/$name.json"
  rm -f "$out"
  expect 0 "mpengine import: wrote $out: " "($architecture from $hf/import/$name/config.json)" \
    -- $mpengine import "$hf/import/$name" --out "$out"
  ours=$(described_params "$out")
  if [ "$ours" != "$hf_params" ]; then
    fail "$name: mpengine describe counts ${ours:-nothing} parameters, transformers $hf_params"
  fi
  if [ "$published" != "-" ] && [ "$hf_params" != "$published" ]; then
    fail "$name: expected_params.tsv: transformers $hf_params, published $published"
  fi
  imported=$((imported + 1))
done <"$hf/expected_params.tsv"
# A shorter or broken table would pass the loop above vacuously.
[ "$imported" -eq 20 ] || fail "expected_params.tsv: $imported fixtures, want 20"
for dir in "$hf"/import/*/; do
  grep -q "^$(basename "$dir")	" "$hf/expected_params.tsv" ||
    fail "$dir has no line in expected_params.tsv"
done
expect 0 "8,030,261,248 parameters" -- $mpengine import "$hf/import/llama3-8b" --out - --seq-len 8192
expect 0 "494,032,768 parameters" -- $mpengine import "$hf/import/qwen2.5-0.5b" --out - --seq-len 4096

# 2. Byte for byte the hand-written examples, at their seq_len (the checkpoints allow more).
compare_example() {  # name example extra-args...
  local name=$1 example=$2
  shift 2
  if ! $mpengine import "$hf/import/$name" --out - "$@" 2>/dev/null | cmp -s - "$example"; then
    fail "import of $name $* differs from $example:"
    $mpengine import "$hf/import/$name" --out - "$@" 2>/dev/null | diff - "$example" | head -20
  fi
}
compare_example llama3-8b examples/models/llama3-8b.json --seq-len 8192
compare_example qwen2.5-0.5b examples/models/qwen2.5-0.5b.json --seq-len 4096
compare_example tiny-llama examples/models/tiny-llama.json
compare_example mixtral-8x7b examples/models/mixtral-8x7b.json --name mixtral-8x7b
compare_example qwen1.5-moe-a2.7b examples/models/qwen1.5-moe-a2.7b.json --name qwen1.5-moe-a2.7b
expect 0 "ffn 8 experts x 14336 swiglu (top 2), rmsnorm, no biases" "46,702,792,704 parameters (12,879,925,248 active)" \
  -- $mpengine import "$hf/import/mixtral-8x7b" --out -
expect 0 "ffn 60 experts x 1408 swiglu (top 4) + shared 5632 gated" "14,315,784,192 parameters (2,689,173,504 active)" \
  -- $mpengine import "$hf/import/qwen1.5-moe-a2.7b" --out -

# 3. The fields themselves, where the count alone would not tell a mapping apart.
field() {  # fixture pattern...: the imported description contains each pattern
  local name=$1
  shift
  local text
  text=$(cat "$tmp/$name.json")
  for pattern in "$@"; do
    grep -qF -- "$pattern" <<<"$text" || fail "$name: the import lacks '$pattern':
$text"
  done
}
field llama3-8b '"seq_len": 131072' '"max_positions": 0' '"kv_heads": 8' '"rope_theta": 500000' \
  '"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}' \
  '"tie_embedding": false' '"bias": false'
field llama3.2-1b '"tie_embedding": true' '"factor": 32' '"kv_heads": 8' '"repeat": 16'
field mistral-7b-v0.3 '"seq_len": 32768' '"rope_theta": 1000000' '"vocab_size": 32768' '"bias": false'
field qwen2.5-0.5b '"bias": "qkv"' '"norm_eps": 1e-06' '"tie_embedding": true' '"seq_len": 32768'
field gpt2-124m '{"type": "embedding", "hidden": 768, "max_positions": 1024}' \
  '"ffn_hidden": 3072' '"norm": "layernorm"' '"activation": "gelu"' '"bias": true' \
  '"dropout": 0.1' '"tie_embedding": true' '"seq_len": 1024'
field tiny-llama-mha '"heads": 4, "kv_heads": 4'
field tiny-llama-tied-biased '"bias": true' '"tie_embedding": true' '"factor": 4' \
  '"original_max_position_embeddings": 32'
field tiny-llama-legacy-type '"rope_scaling": {"rope_type": "llama3", "factor": 2'
field tiny-mistral '"kv_heads": 1' '"bias": false'
field tiny-qwen2 '"name": "Qwen2.5-tiny-test"' '"bias": "qkv"'
# Mixtures of experts: the aux loss counts only with output_router_logits (as in transformers).
field tiny-mixtral '"moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 128, "shared_ffn_hidden": 0, "shared_gate": false, "router": "softmax", "normalize_top_k": true, "aux_loss_coeff": 0,' '"bias": false'
field tiny-mixtral-aux '"aux_loss_coeff": 0.02,'
field tiny-qwen2-moe '"moe": {"experts": 6, "top_k": 2, "expert_ffn_hidden": 32, "shared_ffn_hidden": 96, "shared_gate": true, "router": "softmax", "normalize_top_k": false, "aux_loss_coeff": 0,' '"bias": "qkv"'
field tiny-qwen2-moe-norm '"normalize_top_k": true, "aux_loss_coeff": 0.001,'
field tiny-gpt2 '"ffn_hidden": 256' '"max_positions": 64'
field tiny-gpt2-dropout '"ffn_hidden": 96' '"dropout": 0.1'
if grep -q dropout "$tmp/tiny-gpt2.json"; then fail "tiny-gpt2: dropout 0 is written"; fi
# The import plans like any description.
expect 0 "model tiny-llama on 8 GPUs of cpu-local" -- $mpengine plan "$tmp/tiny-llama.json" --gpus 8

# 4. What the description cannot represent: exit 2, the exact message, nothing written.
refuse() {  # fixture message
  local name=$1 message=$2
  rm -f "$tmp/refused.json"
  expect 2 "mpengine import: $hf/refuse/$name/config.json: $message" \
    -- $mpengine import "$hf/refuse/$name" --out "$tmp/refused.json"
  [ ! -e "$tmp/refused.json" ] || fail "$name: refused, but $tmp/refused.json was written"
}
window_tail="which the model description cannot represent (every token attends to the whole sequence); only no window, or one of at least max_position_embeddings"
refuse mistral-7b-v0.1 "\$.sliding_window: 4096: attention sees only the last 4096 tokens, $window_tail (32768), imports"
refuse mistral-window-absent "\$.sliding_window: absent, so MistralConfig's default 4096 applies: attention sees only the last 4096 tokens, $window_tail (8192), imports"
refuse qwen2-sliding "\$.use_sliding_window: true with sliding_window 32: attention sees only the last 32 tokens, $window_tail (64), imports"
refuse llama-moe '$.num_local_experts: 4 makes the blocks mixtures of experts, which the model description cannot represent (each block has one dense MLP)'
refuse mixtral-jitter '$.router_jitter_noise: 0.1 cannot be imported; the model description'"'"'s router has no input noise (set it to 0)'
refuse qwen2-moe-sparse-step '$.decoder_sparse_step: 2 makes only one block in 2 a mixture of experts, which the import cannot represent yet (it writes one block shape for every layer); only 1 imports'
refuse qwen2-moe-mlp-only '$.mlp_only_layers: [1] gives those blocks a dense MLP, which the import cannot represent yet (it writes one block shape for every layer); only [] imports'
refuse qwen3-moe '$.architectures[0]: "Qwen3MoeForCausalLM" cannot be imported: its attention applies an RMSNorm to each head'"'"'s queries and keys (q_norm, k_norm), which the model description cannot represent'
refuse llama-yarn '$.rope_scaling.rope_type: "yarn" cannot be imported; the model description knows "llama3" (Llama 3.1'"'"'s frequency scaling) and "default" (none)'
refuse llama-dynamic '$.rope_scaling.type: "dynamic" cannot be imported; the model description knows "llama3"'
refuse mistral-rope-scaling '$.rope_scaling.rope_type: "llama3" cannot be imported for MistralForCausalLM: transformers 4.46 ignores rope_scaling there and later versions apply it'
refuse llama-gelu '$.hidden_act: "gelu" cannot be imported; the model description'"'"'s SwiGLU gates with silu (hidden_act "silu")'
refuse llama-head-dim '$.head_dim: 32 differs from hidden_size / num_attention_heads = 16, which the model description cannot represent (its head size is hidden / heads)'
refuse llama-attention-bias-only '$.attention_bias: true with mlp_bias false puts biases on the attention projections (q, k, v, o) only, which the model description cannot represent (its bias is on every linear layer, on none, or on q, k and v only)'
refuse llama-attention-dropout '$.attention_dropout: 0.1 cannot be imported; the model description'"'"'s dropout applies to the hidden states as well as to attention, and LlamaForCausalLM has attention dropout only; set it to 0'
refuse gpt2-relu '$.activation_function: "relu" cannot be imported; the model description'"'"'s GELU is the tanh approximation (activation_function "gelu_new" or "gelu_pytorch_tanh")'
refuse gpt2-erf-gelu '$.activation_function: "gelu" cannot be imported; the model description'"'"'s GELU is the tanh approximation (activation_function "gelu_new" or "gelu_pytorch_tanh"), and "gelu" is the exact erf form'
refuse gpt2-inverse-layer-idx '$.scale_attn_by_inverse_layer_idx: true cannot be imported: the model description scales attention scores by 1/sqrt(head size) only, not by the layer index'
refuse gpt2-dropouts-differ '$.attn_pdrop: 0 differs from resid_pdrop 0.1; the model description has one dropout probability for the embedding, attention and residual dropout'
refused=$(ls -d "$hf"/refuse/*/ | wc -l)
[ "$refused" -eq 19 ] || fail "testdata/hf/refuse holds $refused configs, the checks above 19"

# 5. Configs edited from a good one (sed on transformers' one-key-per-line files).
variant() {  # name sed-script: $tmp/variants/name/config.json from tiny-llama's
  mkdir -p "$tmp/variants/$1"
  sed "$2" "$hf/import/tiny-llama/config.json" >"$tmp/variants/$1/config.json"
  cmp -s "$hf/import/tiny-llama/config.json" "$tmp/variants/$1/config.json" &&
    fail "variant $1: the sed script '$2' changed nothing"
}
refuse_variant() {  # name message
  expect 2 "mpengine import: $tmp/variants/$1/config.json: $2" \
    -- $mpengine import "$tmp/variants/$1" --out "$tmp/refused.json"
}
variant no-hidden '/"hidden_size"/d'
refuse_variant no-hidden '$: missing required key "hidden_size" (a positive integer)'
variant no-max-positions '/"max_position_embeddings"/d'
refuse_variant no-max-positions '$: missing required key "max_position_embeddings" (a positive integer)'
variant hidden-string 's/"hidden_size": 64/"hidden_size": "64"/'
refuse_variant hidden-string '$.hidden_size: must be a positive integer, got a string ("64"); drop the quotes'
variant tie-string 's/"tie_word_embeddings": false/"tie_word_embeddings": "no"/'
refuse_variant tie-string '$.tie_word_embeddings: must be true or false, got a string'
variant eps-null 's/"rms_norm_eps": 1e-05/"rms_norm_eps": null/'
refuse_variant eps-null '$.rms_norm_eps: must be a positive number, got null'
variant heads-6 's/"num_attention_heads": 4/"num_attention_heads": 6/'
refuse_variant heads-6 '$.num_attention_heads: 6 does not divide hidden_size 64; the head size must be a whole number'
variant kv-3 's/"num_key_value_heads": 2/"num_key_value_heads": 3/'
refuse_variant kv-3 '$.num_key_value_heads: 3 does not divide num_attention_heads 4; each key/value head serves a whole group of query heads'
variant mlp-bias-only 's/"mlp_bias": false/"mlp_bias": true/'
refuse_variant mlp-bias-only '$.mlp_bias: true with attention_bias false puts biases on the MLP (gate, up, down) only'
variant partial-rotary 's/"pretraining_tp": 1/"partial_rotary_factor": 0.5/'
refuse_variant partial-rotary '$.partial_rotary_factor: 0.5 cannot be imported; the model description rotates the whole head'
variant experts-per-tok 's/"pretraining_tp": 1/"num_experts_per_tok": 2/'
refuse_variant experts-per-tok '$.num_experts_per_tok: 2 makes the blocks mixtures of experts'
variant no-experts 's/"pretraining_tp": 1/"num_local_experts": null, "num_experts": 0/'
expect 0 "mpengine import: wrote" -- $mpengine import "$tmp/variants/no-experts" --out - --name no-experts
variant mistral-type 's/"model_type": "llama"/"model_type": "mistral"/'
refuse_variant mistral-type '$.model_type: "mistral" does not match $.architectures[0] "LlamaForCausalLM" (whose model_type is "llama"); transformers would build the model_type'"'"'s class'
variant two-architectures 's/"LlamaForCausalLM"/"LlamaForCausalLM", "MistralForCausalLM"/'
refuse_variant two-architectures '$.architectures: ["LlamaForCausalLM","MistralForCausalLM"] names 2 classes; a checkpoint to import names one'
variant architectures-string 's/^  "architectures": \[/  "architectures": "LlamaForCausalLM", "unused": [/'
refuse_variant architectures-string '$.architectures: must be a list naming the model class (one of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, MixtralForCausalLM, Qwen2MoeForCausalLM), got "LlamaForCausalLM"'
# Without an architectures list transformers goes by model_type, and so does import.
variant by-model-type '/"architectures"/,/\]/d'
expect 0 "(LlamaForCausalLM from $tmp/variants/by-model-type/config.json)" -- $mpengine import "$tmp/variants/by-model-type" --out -
variant unknown-model-type '/"architectures"/,/\]/d; s/"model_type": "llama"/"model_type": "gemma"/'
refuse_variant unknown-model-type '$.model_type: "gemma" cannot be imported (and there is no architectures list); supported model types: llama, mistral, qwen2, gpt2, mixtral, qwen2_moe'
variant nothing-to-go-by '/"architectures"/,/\]/d; /"model_type"/d'
refuse_variant nothing-to-go-by '$: missing required key "architectures" (a list naming one of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, MixtralForCausalLM, Qwen2MoeForCausalLM)'
variant huge-vocab 's/"vocab_size": 128/"vocab_size": 33554432/'
refuse_variant huge-vocab 'cannot be imported: the imported description: $.vocab_size: 33554432 is larger than the supported 16777216'
variant truncated '/"vocab_size"/,$d'
expect 2 "mpengine import: $tmp/variants/truncated/config.json:27:1: JSON syntax error: expected a key in double quotes, found the end of the file" \
  -- $mpengine import "$tmp/variants/truncated" --out "$tmp/refused.json"
variant rope-no-type 's/"rope_scaling": null/"rope_scaling": {"factor": 2.0}/'
refuse_variant rope-no-type '$.rope_scaling: has no rope_type (or type); give "llama3", or set rope_scaling to null for none'
variant rope-default 's/"rope_scaling": null/"rope_scaling": {"rope_type": "default"}/'
expect 0 "rope 10000, vocab 128" -- $mpengine import "$tmp/variants/rope-default" --out - --name rope-default
variant llama3-no-factor 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}/'
refuse_variant llama3-no-factor '$.rope_scaling: missing required key "factor" (a positive number)'
variant llama3-bands-swapped 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 32}/'
refuse_variant llama3-bands-swapped '$.rope_scaling.high_freq_factor: 1 must be above low_freq_factor 4'

# 6. The command: --out handling, --seq-len, --name, the name from the directory, HF_DIR forms.
printf 'my edits\n' >"$tmp/mine.json"
expect 2 "mpengine import: --out $tmp/mine.json: the file exists; import does not replace it (give --force to, or another --out)" \
  -- $mpengine import "$hf/import/tiny-llama" --out "$tmp/mine.json"
[ "$(cat "$tmp/mine.json")" = "my edits" ] || fail "an existing --out file was changed without --force"
expect 0 "mpengine import: wrote $tmp/mine.json: tiny-llama" -- $mpengine import "$hf/import/tiny-llama" --out "$tmp/mine.json" --force
cmp -s "$tmp/mine.json" examples/models/tiny-llama.json || fail "--force did not write the description"
# --out - : the description alone on stdout (it loads), the report on stderr.
$mpengine import "$hf/import/tiny-gpt2" --out - >"$tmp/stdout.json" 2>"$tmp/stderr.txt" ||
  fail "import --out - failed: $(cat "$tmp/stderr.txt")"
expect 0 "parameters: 112,384" -- $mpengine describe "$tmp/stdout.json"
grep -qF "mpengine import: wrote stdout: tiny-gpt2 (GPT2LMHeadModel" "$tmp/stderr.txt" ||
  fail "import --out -: no report on stderr: $(cat "$tmp/stderr.txt")"
expect 2 "mpengine import: $hf/import/tiny-gpt2/config.json: seq_len 65 exceeds \$.n_positions 64, the rows of the learned position table; choose at most 64" \
  -- $mpengine import "$hf/import/tiny-gpt2" --out - --seq-len 65
expect 0 "seq_len 32, tied head" -- $mpengine import "$hf/import/tiny-gpt2" --out - --seq-len 32
expect 0 '"name": "my-model"' -- $mpengine import "$hf/import/tiny-qwen2" --out - --name my-model
expect 0 '"name": "tiny-gpt2"' -- $mpengine import "$hf/import/tiny-gpt2/" --out -
expect 0 '"name": "tiny-gpt2"' -- $mpengine import "$hf/import/tiny-gpt2/config.json" --out -
mpengine_path=$(cd "$(dirname "$mpengine")" && pwd)/$(basename "$mpengine")
expect 0 '"name": "tiny-gpt2"' -- bash -c "cd '$hf/import/tiny-gpt2' && '$mpengine_path' import . --out -"
expect 2 "mpengine import: $tmp/nowhere: cannot open: No such file or directory" -- $mpengine import "$tmp/nowhere" --out -
mkdir -p "$tmp/empty"
expect 2 "mpengine import: $tmp/empty: no config.json in it; give the directory of a Hugging Face checkpoint (config.json beside model.safetensors) or the config.json itself" \
  -- $mpengine import "$tmp/empty" --out -
expect 2 "mpengine import: missing --out MODEL.json (or --out - for stdout)" -- $mpengine import "$hf/import/tiny-llama"
expect 2 "missing argument (usage: mpengine import HF_DIR" -- $mpengine import --out -
expect 2 "--seq-len: must be at least 1, got 0" -- $mpengine import "$hf/import/tiny-llama" --out - --seq-len 0
expect 0 "usage: mpengine import HF_DIR --out MODEL.json|-" -- $mpengine import --help
expect 0 "  import     write the model description of a Hugging Face checkpoint" -- $mpengine --help

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
