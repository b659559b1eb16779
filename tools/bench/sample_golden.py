#!/usr/bin/env python3
"""tools/bench/sample_golden.py — transformers' greedy continuations, the reference
tests/tools/sample_test.sh holds `mpengine sample --temperature 0` to.

For each model below it builds a seeded random transformers model whose vocabulary is that of one
of the committed tokenizers (tests/engine/testdata/tokenizers/NAME), saves it with save_pretrained
(config.json + model.safetensors, fp32) under tests/engine/testdata/<model>/, and writes
sample_golden.json there: for a few prompts, the prompt's ids as `mpengine sample` builds them
(the document separator, then `Tokenizer.encode(prompt, add_special_tokens=False)`), and the ids
greedy decoding appends (what `model.generate(..., do_sample=False)` gives), with the smallest gap between the largest and the
second largest logit over all steps (so a reader sees that no step was a near tie that float
rounding could flip). Weights are drawn wider than the 0.02 init so the logits are spread out.

Needs torch and transformers 4.46.3; CI only reads the committed files:
  /usr/bin/python3 -m venv --system-site-packages V && V/bin/pip install transformers==4.46.3 safetensors
  V/bin/python tools/bench/sample_golden.py [MODEL ...]     # all of them, or the ones named
"""
import json
import os

import torch
import transformers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "..", "..", "tests", "engine", "testdata")

PROMPTS = ["The meaning of life is", "Q: What is a computer?\nA:", "", "Ünïcödé und 中文"]
NEW_TOKENS = 24

MODELS = {
    # GPT-2 at toy size over gpt2_style's 4,002 ids; <|endoftext|> starts every document.
    "hf_gpt2_sample": ("gpt2_style", "GPT2LMHeadModel", "<|endoftext|>", dict(
        n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.3)),
    # Llama 3 at toy size over llama3_style's ids; its template's <|begin_of_text|> starts them.
    "hf_llama3_sample": ("llama3_style", "LlamaForCausalLM", "<|begin_of_text|>", dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, initializer_range=0.3)),
    # Mixtral at toy size over mistral_style's ids (its template's <s> starts them): 4 experts,
    # top 2, renormalised.
    "hf_mixtral_sample": ("mistral_style", "MixtralForCausalLM", "<s>", dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=1000000.0,
        tie_word_embeddings=False, initializer_range=0.3)),
    # Qwen2-MoE at toy size over qwen2_style's ids (<|endoftext|> starts them): 8 experts, top 2
    # not renormalised, a shared expert with its sigmoid gate.
    "hf_qwen2_moe_sample": ("qwen2_style", "Qwen2MoeForCausalLM", "<|endoftext|>", dict(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
        tie_word_embeddings=False, initializer_range=0.3)),
}


def build(name, tokenizer_name, architecture, separator, config_args):
    tokenizer_path = os.path.join(TESTDATA, "tokenizers", tokenizer_name, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    torch.manual_seed(31)
    cls = getattr(transformers, architecture)
    config_cls = cls.config_class
    config = config_cls(vocab_size=vocab, **config_args)
    model = cls(config).eval()
    out_dir = os.path.join(TESTDATA, name)
    model.save_pretrained(out_dir, safe_serialization=True)
    separator_id = tokenizer.token_to_id(separator)
    cases = []
    for prompt in PROMPTS:
        ids = [separator_id] + tokenizer.encode(prompt, add_special_tokens=False).ids
        # Greedy decoding by hand: model.generate imports torch.distributed, which Debian's
        # torch 1.13 cannot import under Python 3.11. argmax picks the first largest logit, as
        # generate's greedy search does.
        sequence, gaps = list(ids), []
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([sequence])).logits[0, -1]
                top2 = logits.topk(2).values
                gaps.append(float(top2[0] - top2[1]))
                sequence.append(int(logits.argmax()))
        new_ids = sequence[len(ids):]
        gap = min(gaps)
        cases.append({"prompt": prompt, "prompt_ids": ids, "generated_ids": new_ids,
                      "smallest_top2_logit_gap": gap})
    golden = {
        "tokenizer": "tests/engine/testdata/tokenizers/%s" % tokenizer_name,
        "architecture": architecture,
        "transformers": transformers.__version__,
        "cases": cases,
    }
    with open(os.path.join(out_dir, "sample_golden.json"), "w") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(name, vocab, [c["smallest_top2_logit_gap"] for c in cases])


if __name__ == "__main__":
    import sys
    wanted = sys.argv[1:] or list(MODELS)  # names to (re)build; all of them by default
    for model_name in wanted:
        build(model_name, *MODELS[model_name])
