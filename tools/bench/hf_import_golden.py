#!/usr/bin/env python3
"""tools/bench/hf_import_golden.py — writes the Hugging Face config.json fixtures that
tests/tools/import_cli_test.sh feeds to `mpengine import`, and the parameter counts that
transformers itself gives each model, so the test (and CI) needs no Python.

Why: `mpengine import` maps a checkpoint's config.json onto mpengine's model description. The
check that the mapping is right is that the description has exactly as many parameters as the
model transformers builds from the same file. Hand-written configs would only test our reading
of the format against itself, so every fixture here is written by transformers' own config
classes (LlamaConfig, MistralConfig, Qwen2Config, GPT2Config, MixtralConfig) with
save_pretrained, then read back with AutoConfig.from_pretrained (as a user's checkpoint would
be) to build the model whose num_parameters() is recorded.

What it writes under OUT (default tests/tools/testdata/hf):
  import/<name>/config.json   configs the description can represent: tiny ones of every family
                              and variant (GQA, MQA, tied, biases, Llama 3.1 rope scaling, an
                              absent num_key_value_heads, a window as long as the context,
                              _name_or_path, GPT-2 with and without dropout), and the real
                              published shapes of Llama-3.1-8B, Llama-3.2-1B, Mistral-7B-v0.3,
                              Qwen2.5-0.5B and GPT-2 124M
  refuse/<name>/config.json   configs it cannot represent (sliding windows, MoE, unknown
                              architectures, rope scalings, activations, head_dim, biases on
                              attention only, dropout where mpengine has none, ...); the test
                              holds the exact message for each
  expected_params.tsv         name, architecture, transformers' num_parameters(), and the
                              published count for the real shapes ("-" for the tiny ones)

The tiny models are built whole. The real ones would need up to 32 GB in fp32, so they are built
with one and with two decoder layers (bf16, weights not initialised) and the count extrapolated
over the depth: every decoder layer has the same tensors, so count(L) = count(1) + (L - 1) *
(count(2) - count(1)) exactly. The script fails if that disagrees with the published count.

  /usr/bin/python3 -m venv --system-site-packages /tmp/hfv
  /tmp/hfv/bin/pip install transformers==4.46.3 safetensors    (torch from Debian's python3-torch)
  /tmp/hfv/bin/python tools/bench/hf_import_golden.py [OUT]
"""
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig,
                          MistralConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig)
from transformers.modeling_utils import no_init_weights
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

TINY_LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
TINY_GPT2 = dict(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def tiny_llama(**changes):
    return LlamaConfig(**{**TINY_LLAMA, **changes})


def tiny_mistral(**changes):
    base = {**TINY_LLAMA, "num_key_value_heads": 1, "sliding_window": None}
    return MistralConfig(**{**base, **changes})


def tiny_qwen2(**changes):
    base = {**TINY_LLAMA, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "use_sliding_window": False}
    return Qwen2Config(**{**base, **changes})


def tiny_mixtral(**changes):
    base = {**TINY_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": None}
    return MixtralConfig(**{**base, **changes})


def tiny_qwen2_moe(**changes):
    base = {**TINY_LLAMA, "rms_norm_eps": 1e-6, "use_sliding_window": False, "num_experts": 6,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 96, "decoder_sparse_step": 1,
            "mlp_only_layers": []}
    return Qwen2MoeConfig(**{**base, **changes})


def tiny_gpt2(**changes):
    return GPT2Config(**{**TINY_GPT2, **changes})


# (name, config, keys to delete from the written config.json, published parameter count).
# Deleting a key shows what transformers does when a checkpoint leaves it out.
IMPORTS = [
    ("tiny-llama", tiny_llama(), [], None),  # = examples/models/tiny-llama.json
    ("tiny-llama-mha", tiny_llama(num_key_value_heads=None), ["num_key_value_heads"], None),
    ("tiny-llama-tied-biased",
     tiny_llama(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                max_position_embeddings=128,
                rope_scaling={**LLAMA3_SCALING, "factor": 4.0,
                              "original_max_position_embeddings": 32}), [], None),
    ("tiny-llama-legacy-type",  # rope_scaling's pre-4.43 spelling: "type" instead of "rope_type"
     tiny_llama(rope_scaling={"type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
     ["rope_scaling.rope_type"], None),
    ("tiny-mistral", tiny_mistral(), [], None),
    ("tiny-mistral-full-window", tiny_mistral(sliding_window=64), [], None),
    ("tiny-qwen2", tiny_qwen2(name_or_path="Qwen/Qwen2.5-tiny-test"), [], None),
    ("tiny-gpt2", tiny_gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), [], None),
    ("tiny-gpt2-dropout", tiny_gpt2(n_inner=96, activation_function="gelu_pytorch_tanh"), [],
     None),
    # The published shapes (the configs on the Hugging Face Hub).
    ("llama3-8b",  # meta-llama/Llama-3.1-8B
     LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                 rope_scaling=LLAMA3_SCALING, tie_word_embeddings=False, bos_token_id=128000,
                 eos_token_id=128001, torch_dtype="bfloat16"), [], 8030261248),
    ("llama3.2-1b",  # meta-llama/Llama-3.2-1B: tied, head_dim 64, rope factor 32
     LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                 num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                 rope_theta=500000.0, rope_scaling={**LLAMA3_SCALING, "factor": 32.0},
                 tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
                 torch_dtype="bfloat16"), [], 1235814400),
    ("mistral-7b-v0.3",  # mistralai/Mistral-7B-v0.3: no sliding window
     MistralConfig(vocab_size=32768, hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
                   sliding_window=None, tie_word_embeddings=False, torch_dtype="bfloat16"), [],
     7248023552),
    ("qwen2.5-0.5b",  # Qwen/Qwen2.5-0.5B
     Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                 use_sliding_window=False, sliding_window=32768, max_window_layers=24,
                 tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643,
                 torch_dtype="bfloat16"), [], 494032768),
    ("gpt2-124m", GPT2Config(n_ctx=1024), [], 124439808),  # openai-community/gpt2
    # Mixtures of experts (issue 33). Mixtral's count is its model.safetensors.index.json
    # total_size (93,405,585,408 bf16 bytes) / 2, "46.7B"; Qwen publishes "14.3B" only (0: count
    # by depth, nothing to hold it to but transformers).
    ("tiny-mixtral", tiny_mixtral(), [], None),
    ("tiny-mixtral-aux", tiny_mixtral(output_router_logits=True, router_aux_loss_coef=0.02), [],
     None),
    ("tiny-qwen2-moe", tiny_qwen2_moe(), [], None),
    ("tiny-qwen2-moe-norm", tiny_qwen2_moe(norm_topk_prob=True, output_router_logits=True), [],
     None),
    ("mixtral-8x7b",  # mistralai/Mixtral-8x7B-v0.1
     MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1e6,
                   sliding_window=None, num_local_experts=8, num_experts_per_tok=2,
                   router_aux_loss_coef=0.02, output_router_logits=False,
                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                   torch_dtype="bfloat16"), [], 46702792704),
    ("qwen1.5-moe-a2.7b",  # Qwen/Qwen1.5-MoE-A2.7B
     Qwen2MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                    num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                    max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    use_sliding_window=False, sliding_window=32768, max_window_layers=21,
                    num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                    shared_expert_intermediate_size=5632, norm_topk_prob=False,
                    decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                    output_router_logits=False, tie_word_embeddings=False,
                    bos_token_id=151643, eos_token_id=151643, torch_dtype="bfloat16"), [], 0),
]

# Configs that name something the model description cannot represent.
REFUSALS = [
    ("mistral-7b-v0.1",  # mistralai/Mistral-7B-v0.1: a 4096-token sliding window
     MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
                   sliding_window=4096, tie_word_embeddings=False, torch_dtype="bfloat16"), []),
    # No sliding_window key at all: MistralConfig's default, 4096, applies.
    ("mistral-window-absent", tiny_mistral(max_position_embeddings=8192), ["sliding_window"]),
    ("qwen2-sliding", tiny_qwen2(use_sliding_window=True, sliding_window=32,
                                 max_window_layers=0), []),
    ("llama-moe", tiny_llama(num_local_experts=4, num_experts_per_tok=2), []),
    ("mixtral-jitter", tiny_mixtral(router_jitter_noise=0.1), []),
    ("qwen2-moe-sparse-step", tiny_qwen2_moe(decoder_sparse_step=2), []),
    ("qwen2-moe-mlp-only", tiny_qwen2_moe(mlp_only_layers=[1]), []),
    ("llama-yarn", tiny_llama(rope_scaling={"rope_type": "yarn", "factor": 4.0}), []),
    ("llama-dynamic", tiny_llama(rope_scaling={"type": "dynamic", "factor": 2.0}),
     ["rope_scaling.rope_type"]),
    ("llama-gelu", tiny_llama(hidden_act="gelu"), []),
    ("llama-head-dim", tiny_llama(head_dim=32), []),
    ("llama-attention-bias-only", tiny_llama(attention_bias=True, mlp_bias=False), []),
    ("llama-attention-dropout", tiny_llama(attention_dropout=0.1), []),
    ("mistral-rope-scaling", tiny_mistral(rope_scaling=LLAMA3_SCALING), []),
    ("gpt2-relu", tiny_gpt2(activation_function="relu"), []),
    ("gpt2-erf-gelu", tiny_gpt2(activation_function="gelu"), []),
    ("gpt2-inverse-layer-idx", tiny_gpt2(scale_attn_by_inverse_layer_idx=True), []),
    ("gpt2-dropouts-differ", tiny_gpt2(attn_pdrop=0.0), []),
]


QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def write_config(directory, config, drop_keys):
    """save_pretrained, then the keys a checkpoint might leave out removed from the file."""
    os.makedirs(directory, exist_ok=True)
    if not config.architectures:
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(directory)
    path = os.path.join(directory, "config.json")
    if drop_keys:
        with open(path) as f:
            data = json.load(f)
        for key in drop_keys:  # "a.b" is key b of the object under a
            *parents, last = key.split(".")
            node = data
            for parent in parents:
                node = node[parent]
            node.pop(last, None)
        with open(path, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
    return path


def count_tiny(directory):
    """num_parameters() of the model transformers builds from the config file, as a user would."""
    config = AutoConfig.from_pretrained(directory)
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == config.architectures[0], type(model).__name__
    return model.num_parameters()


def count_by_depth(directory):
    """num_parameters() of the full-depth model, from models one and two layers deep."""
    config = AutoConfig.from_pretrained(directory)
    depth_key = "n_layer" if config.model_type == "gpt2" else "num_hidden_layers"
    depth = getattr(config, depth_key)
    counts = []
    for layers in (1, 2):
        shallow = AutoConfig.from_pretrained(directory, **{depth_key: layers})
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(shallow, torch_dtype=torch.bfloat16)
        model.tie_weights()  # skipped with the initialisation under no_init_weights
        assert type(model).__name__ == config.architectures[0], type(model).__name__
        counts.append(model.num_parameters())
        del model
    return counts[0] + (depth - 1) * (counts[1] - counts[0])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/tools/testdata/hf"
    for part in ("import", "refuse"):
        shutil.rmtree(os.path.join(out, part), ignore_errors=True)
    rows = []
    for name, config, drop_keys, published in IMPORTS:
        directory = os.path.join(out, "import", name)
        write_config(directory, config, drop_keys)
        count = count_tiny(directory) if published is None else count_by_depth(directory)
        if published == 0:
            published = None
        if published is not None and count != published:
            sys.exit("%s: transformers counts %d parameters, published %d" %
                     (name, count, published))
        rows.append((name, config.architectures[0], count, published))
        print("%-26s %-18s %14d%s" % (name, config.architectures[0], count,
                                      "" if published is None else " (published %d)" % published))
    for name, config, drop_keys in REFUSALS:
        write_config(os.path.join(out, "refuse", name), config, drop_keys)
        print("%-26s %-18s refused by mpengine import" % (name, config.architectures[0]))
    # Qwen3-MoE came in transformers 4.51: its config (Qwen/Qwen3-30B-A3B's) written by hand.
    os.makedirs(os.path.join(out, "refuse", "qwen3-moe"), exist_ok=True)
    with open(os.path.join(out, "refuse", "qwen3-moe", "config.json"), "w") as f:
        json.dump(QWEN3_30B_A3B, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "expected_params.tsv"), "w") as f:
        f.write("# written by tools/bench/hf_import_golden.py with transformers %s, torch %s\n" %
                (transformers.__version__, torch.__version__))
        f.write("# name\tarchitecture\thf_num_parameters\tpublished\n")
        for name, architecture, count, published in rows:
            f.write("%s\t%s\t%d\t%s\n" % (name, architecture, count,
                                         "-" if published is None else str(published)))


if __name__ == "__main__":
    main()
