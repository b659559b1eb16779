/*
 * engine/weights/weight_source.h — where `run --init-from` takes a GPT's weights from: one
 * interface, read tensor by tensor in the model's own tensor table (engine/model/param_layout.h),
 * with an implementation per file format. Two today: llm.c's GPT-2 checkpoint file (mp_llmc_reader)
 * and a Hugging Face GPT2LMHeadModel directory (config.json and model.safetensors, or a sharded set
 * through model.safetensors.index.json, read with engine/weights/safetensors.h). The next model
 * family adds a third implementation, not a second loader: the stages (mp_weight_source_fill)
 * and the trainer only see mp_weight_source_read. The Llama family's directories (LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM) are the Hugging Face implementation's second name table.
 *
 * Shard-first (DESIGN.md, principle 6): opening reads headers only (the llm.c header, the
 * safetensors headers and config.json); a read asks for a block of rows x columns of one tensor
 * of the layout, in mpengine's shape (a tensor-parallel shard is at most a few such blocks:
 * tensor_parallel/shard.h), and the implementation preads just the bytes behind it: for GPT-2's
 * transposed weights a row-parallel rank's columns are whole rows of the file.
 *
 * Hugging Face GPT-2 names, per block l (the "transformer." prefix is optional, as transformers
 * accepts both): h.l.ln_1.{weight,bias} -> block.l.ln1.*, h.l.attn.c_attn.{weight,bias} -> qkv.*,
 * h.l.attn.c_proj.* -> attn_proj.*, h.l.ln_2.* -> ln2.*, h.l.mlp.c_fc.* -> fc.*,
 * h.l.mlp.c_proj.* -> fc_proj.*; wte.weight, wpe.weight, ln_f.* -> embedding.wte,
 * embedding.wpe, final_norm.*. GPT-2's Conv1D weights are stored (in, out), mpengine's (out, in),
 * so those four are read transposed. wte has vocab_size rows in the file; the layout's padding
 * rows read as zero. lm_head.weight is tied to wte and not read (it may be absent).
 *
 * The Llama family's names, per block l (the "model." prefix is optional):
 * layers.l.input_layernorm.weight -> block.l.ln1.weight, layers.l.self_attn.{q,k,v}_proj.{weight,
 * bias} -> q.*, k.*, v.*, self_attn.o_proj.* -> attn_proj.*, post_attention_layernorm.weight ->
 * ln2.weight, mlp.{gate,up,down}_proj.* -> gate.*, up.*, fc_proj.*; embed_tokens.weight,
 * norm.weight -> embedding.wte, final_norm.weight; lm_head.weight (no prefix) when the head is
 * untied. nn.Linear stores (out, in) as mpengine does: nothing is transposed, and the rotate-half
 * rope needs no permutation of q and k.
 */
#ifndef MPENGINE_ENGINE_WEIGHT_SOURCE_H
#define MPENGINE_ENGINE_WEIGHT_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/model/param_layout.h"
#include "engine/weights/llmc_file.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_weight_source mp_weight_source;

/* What an implementation supplies. */
typedef struct {
  const char *kind; /* "llm.c checkpoint", "Hugging Face checkpoint" */
  /* The block rows [row, row + rows) x columns [col, col + cols) of layout tensor t (index
   * `tensor`, inside it), fp32 into dest (rows, cols). */
  mp_status (*read)(void *impl, int tensor, const mp_param_tensor *t, size_t row, size_t rows,
                    size_t col, size_t cols, float *dest, mp_error *err);
  void (*close)(void *impl);
} mp_weight_source_ops;

/* Opens path for layout: a directory is a Hugging Face checkpoint (mp_weight_source_open_hf),
 * anything else an llm.c file (mp_llmc_reader_open). Errors are the implementation's. Free *out
 * with mp_weight_source_close. */
mp_status mp_weight_source_open(const mp_param_layout *layout, const char *path,
                                mp_weight_source **out, mp_error *err);

/* llm.c's GPT-2 checkpoint (engine/model/param_layout.h's reader; its checks and messages). */
mp_status mp_weight_source_open_llmc(const mp_param_layout *layout, const char *path,
                                     mp_weight_source **out, mp_error *err);

/* A Hugging Face directory of layout's family. Checks, all before any tensor is read, failing with
 * MP_ERR_INPUT: config.json as topology/hf_config.h reads it (its refusals), then that it
 * describes layout's model, naming the first key that differs:
 *   "DIR/config.json: n_layer is 2 in the checkpoint but 4 in the model description (MODEL)"
 * (GPT-2: vocab_size, n_positions, n_layer, n_head, n_embd, n_inner, layer_norm_epsilon; the
 * Llama family: vocab_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
 * hidden_size, intermediate_size, rms_norm_eps, tie_word_embeddings, rope_theta, rope_scaling's
 * four numbers, and the norm, activation and biases; the dropouts are the run's to choose and
 * not compared: GPT-2's own config has 0.1); then that every tensor the layout
 * reads is in the file with a float dtype and the shape the config implies (mp_safetensors_expect's
 * messages, which name the file and the tensor). */
mp_status mp_weight_source_open_hf(const mp_param_layout *layout, const char *dir,
                                   mp_weight_source **out, mp_error *err);

/* The block rows [row, row + rows) x columns [col, col + cols) of layout tensor `tensor` (its
 * (rows, cols) shape in the layout), fp32, into dest (rows, cols) row-major. Errors of the
 * implementation (MP_ERR_INPUT naming the file for a short or unreadable file); MP_ERR_RUNTIME
 * for a block outside the tensor. */
mp_status mp_weight_source_read(mp_weight_source *source, int tensor, size_t row, size_t rows,
                                size_t col, size_t cols, float *dest, mp_error *err);

/* mp_weight_source_read as a stage's fill function (engine/model/stage_layout.h's
 * mp_stage_fill_fn; context: the source, opened for the stage's model), so that a stage reads
 * only its shard's elements: mp_stage_cpu_fill_params(stage, mp_weight_source_fill, source, err),
 * or mp_stage_gpu_fill_params. */
mp_status mp_weight_source_fill(void *source, int tensor, size_t row, size_t rows, size_t col,
                                size_t cols, float *dest, mp_error *err);

/* "llm.c checkpoint" or "Hugging Face checkpoint", for messages. */
const char *mp_weight_source_kind(const mp_weight_source *source);

/* Frees source (NULL is fine). */
void mp_weight_source_close(mp_weight_source *source);

/* ---------------------------------------------------------------------------------------------
 * Sinks: where `mpengine export` writes a model's weights, the same formats the other way. A sink
 * takes each tensor of the layout once, whole and row-major in mpengine's shape (the exporter
 * holds one tensor at a time), and streams it out; nothing else of the model is held. */

typedef enum {
  MP_WEIGHT_FORMAT_LLMC = 0, /* llm.c's GPT-2 file, version 3 (fp32) */
  MP_WEIGHT_FORMAT_HF,       /* a Hugging Face GPT2LMHeadModel directory */
} mp_weight_format;

typedef struct mp_weight_sink mp_weight_sink;

/* How a sink writes. */
typedef struct {
  /* HF: > 0 splits model.safetensors into model-0000i-of-0000n.safetensors files of at most this
   * many bytes of tensor data each (a larger tensor gets a file of its own), assigned as
   * transformers' save_pretrained(max_shard_size=...) assigns them, with
   * model.safetensors.index.json; 0: one file. LLMC: ignored. */
  int64_t max_shard_bytes;
} mp_weight_sink_options;
#define MP_WEIGHT_SINK_OPTIONS_INITIALIZER {0}

/* Starts writing layout's weights to path in format. LLMC: the file path (written to a
 * temporary and renamed into place at commit). HF: the directory path (created when absent;
 * what it holds of ours is replaced): model.safetensors through engine/weights/safetensors.h's
 * writer (fp32, metadata {"format": "pt"}, the names and shapes mp_weight_source_open_hf reads, the
 * Conv1D weights transposed back to (in, out), wte without its padding rows, no lm_head.weight: it
 * is tied), then at commit config.json (GPT2Config: architectures ["GPT2LMHeadModel"], model_type
 * gpt2, n_embd, n_head, n_layer, n_positions = n_ctx, vocab_size, n_inner (null for 4 x n_embd),
 * gelu_new, layer_norm_epsilon 1e-5, dropouts 0, tie_word_embeddings, torch_dtype float32). A
 * Llama-family layout writes LlamaForCausalLM (Qwen2ForCausalLM when only q, k and v have biases):
 * the Llama names above, the vocabulary tables without their padding rows, lm_head.weight when
 * untied, and LlamaConfig's / Qwen2Config's keys (rope_scaling's factors as floats, as transformers
 * checks them); a layout with layernorm, GELU or no rotary embeddings in the Llama family has no
 * Hugging Face architecture and is refused (MP_ERR_INPUT naming the model). llm.c's files hold
 * GPT-2 only (mp_llmc_writer_open refuses the rest). options may be NULL (one file). MP_ERR_INPUT
 * when path cannot be created; MP_ERR_RUNTIME when out of memory. */
mp_status mp_weight_sink_open(const mp_param_layout *layout, mp_weight_format format,
                              const char *path, const mp_weight_sink_options *options,
                              mp_weight_sink **out, mp_error *err);

/* Tensor `tensor` of the layout, all rows x cols of it, row-major. Each tensor once, in any
 * order. Errors of the writer (MP_ERR_RUNTIME). */
mp_status mp_weight_sink_write(mp_weight_sink *sink, int tensor, const float *data,
                               mp_error *err);

/* Finishes the files (every tensor must have been written) and frees sink either way;
 * MP_ERR_RUNTIME when writing fails. */
mp_status mp_weight_sink_commit(mp_weight_sink *sink, mp_error *err);

/* Gives up: removes what was being written and frees sink (NULL is fine). */
void mp_weight_sink_abort(mp_weight_sink *sink);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_WEIGHT_SOURCE_H */
