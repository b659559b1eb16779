/*
 * engine/model/stage_gpu.h — one rank's shard of one pipeline stage of the GPT on a CUDA GPU: its
 * device state, and the stage chain (engine/model/stage_chain.h, the CPU stage's too) over the CUDA
 * kernels. The one-GPU model is this stage at dp = pp = tp = 1 (the whole model, one slot).
 *
 * Mixed precision: fp32 master weights, AdamW moments and gradients on the device, a bf16 working
 * copy of the weights that the kernels read, and bf16 activations. GEMMs run on cuBLAS tensor
 * cores in bf16 with fp32 accumulation; weight gradients accumulate in fp32 across micro-batches.
 * Every kernel is a CUDA twin of a layers/ CPU kernel, tested against it. Attention is fused
 * (flash attention: no T x T matrix kept) for the head sizes the fused kernels support, and
 * cuBLAS batched GEMMs around a softmax otherwise; MPENGINE_ATTENTION=cublas in the environment
 * forces the latter, for benchmarks. A build without CUDA compiles stage_gpu_none.c, whose
 * create says so.
 *
 * Its shard is laid out by the stage layout (engine/model/stage_layout.h), the CPU stage's too: the
 * same tensor table, the same flat shard layout. The stage owns its state outright: the device
 * holds fp32 master weights, their bf16 copy, fp32 gradients, AdamW moments and the bf16
 * activation slots (with ZeRO-3 of the block parameters only this dp rank's part, each block
 * gathered into a window to run); the host holds none of them. Initialisation, llm.c and Hugging
 * Face files, saves and checkpoints read and write the device's master weights (the bf16 copy
 * refreshed) in bounded pieces (mp_stage_gpu_read_params, _write_params, _fill_params,
 * _init_params), and the moments through mp_stage_gpu_moments_at.
 *
 * Tensor parallelism is Megatron's, as on the CPU (tensor_parallel/): qkv and fc column-parallel,
 * attn_proj and fc_proj row-parallel (their bf16 partial products widened to fp32, summed over
 * the group, the bias added, rounded once), the column-parallel input gradients summed likewise;
 * the vocabulary-parallel embedding and cross-entropy never gather the (B*T, Vp) logits. The
 * collectives take device pointers: over NCCL (engine/comm/tp_comm_nccl.h) when each rank has a GPU
 * of its own, or the stage's MPI table, whose communicators stage GPU buffers through the host
 * so that several ranks may share one GPU. With tp = 1 no collective runs: the kernels are a
 * one-GPU model's.
 *
 * Sequence parallelism (the layout's; Korthikanti et al. 2022, as tensor_parallel/ does it on
 * the CPU): with tp > 1 the layernorms, residual adds and stage boundaries hold this rank's token
 * slice, rows [rank * B*T/tp, (rank + 1) * B*T/tp) of the micro-batch; the layernorm output is
 * all-gathered before each column-parallel GEMM (qkv, fc, the LM head) and each row-parallel
 * GEMM's partial product reduce-scattered to the slice (attn_proj, fc_proj, the embedding
 * lookup), the backward running the mirrors. The layernorm weight gradients are then each rank's
 * partial sums: mp_stage_gpu_finish_grads sums them once per step. Attention sees all B*T
 * tokens of this rank's heads, as without it. With tp = 1 it changes nothing.
 *
 * Boundaries between stages are fp32 arrays of
 * mp_stage_layout_boundary_floats(mp_stage_gpu_layout(gpu)) floats in device memory: (B*T, C), or
 * with sequence parallelism (B*T/tp, C), this rank's token slice (the stage worker's buffers, which
 * the trainer allocates on the GPU and sends over MPI or NCCL); the stage widens its bf16 output
 * into them exactly and rounds its input from them.
 *
 * Zero-bubble's split (Qi et al. 2023; the CPU twin's mp_stage_cpu_backward_stage with
 * defer_weights): with deferred weights, a backward may leave the four GEMM weight gradients of
 * every block (qkv, attn_proj, fc, fc_proj) to mp_stage_gpu_backward_weights, its slot keeping
 * those GEMMs' output gradients (bf16) until then; B then W adds exactly what the whole backward
 * adds, bit for bit (the same kernels on the same numbers, each gradient summed in the same order).
 *
 * Full recomputation: each slot keeps only its tokens, targets and input (the embedding's output
 * or the received boundary); the activations live in one shared set, which the backward refills
 * by running the slot's forward again (with its collectives, every tp rank together) before it
 * runs. Not with deferred weights (W would need activations a later recomputation overwrote).
 * Selective recomputation is what the fused attention does anyway (it keeps no T x T matrix).
 *
 * Every kernel runs on CUDA's default stream, in order; every call returns after its work is
 * enqueued, except where it says it synchronises.
 */
#ifndef MPENGINE_ENGINE_MODEL_STAGE_GPU_H
#define MPENGINE_ENGINE_MODEL_STAGE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "expert_parallel/ep_comm.h"
#include "engine/model/stage_chain.h"
#include "engine/model/stage_layout.h"
#include "engine/model/stage_state.h"
#include "tensor_parallel/tp_comm.h"
#include "topology/layer_cost.h"
#include "topology/model.h"
#include "layers/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_stage_gpu mp_stage_gpu;

/* One AdamW step's numbers. */
typedef struct {
  float learning_rate, beta1, beta2, eps, weight_decay; /* decay applies to decaying tensors only */
  int step;                                             /* 1-based, for bias correction */
  double grad_clip;                                     /* max global norm; 0 = none */
} mp_gpu_adamw;

/* What a GPU stage is made of. */
typedef struct {
  int micro_batch, seq_len;      /* (B, T) of one micro-batch */
  const mp_tp_comm *tp;          /* the tensor-parallel group's host-side table (MPI; the norm's
                                    sums), copied: its context must outlive the stage */
  const mp_tp_comm *device_tp;   /* the same ranks in the same order for collectives on device
                                    buffers (engine/comm/tp_comm_nccl.h), copied; NULL: tp (MPI,
                                    which stages device buffers through the host) */
  bool sequence_parallel;
  mp_stage_span span;            /* which piece of the chain */
  int num_slots;                 /* micro-batches in flight, >= 1 */
  bool deferred_weights;         /* slots keep what a zero-bubble W needs */
  mp_recompute recompute;
  const mp_stage_zero *zero;     /* ZeRO 2 and 3's cut, or NULL (ZeRO-1 keeps its moments'
                                    part with mp_stage_gpu_keep_moments) */
  const mp_tp_comm *cp;          /* the context-parallel group for collectives on device buffers
                                    (NCCL's, or MPI's, which stages them through the host),
                                    copied; NULL: none.
                                    seq_len is then this rank's tokens of a sequence */
  const mp_ep_comm *ep;          /* the expert-parallel group's host table (MPI), copied: the
                                    stage holds its ep rank's experts only and its MoE layers
                                    dispatch rows over it (staged through the host); NULL: ep 1 */
  const mp_ep_comm *ep_device;   /* the same ranks in the same order on device buffers (NCCL,
                                    engine/comm/ep_comm_nccl.h), copied: the rows go GPU to GPU;
                                    NULL: through the host over ep */
} mp_stage_gpu_config;

/* This rank's shard of config->span of model (mp_stage_layout_create's checks and messages) on the
 * current GPU, with num_slots activation slots of one (micro_batch, seq_len) micro-batch each.
 * recompute is the plan's (selective changes nothing; full keeps the slots light, see above);
 * deferred_weights: the slots also keep what a deferred backward's W needs (zero-bubble
 * schedules). Both together are refused with MP_ERR_INPUT, as on the CPU.
 * zero->window_block_grads (ZeRO 2 and 3; with deferred weights the GEMM weights' only): the
 * blocks' gradients pass through two one-block device windows in turn (so that one block's
 * reduce-scatter may overlap the next block's backward), which the chain's hook must take after
 * every block (engine/model/stage_chain.h), the device gradient array holds the tensors outside
 * the blocks packed (mp_stage_layout_grad_offset), and the stage keeps the gradients of its
 * moments' part (mp_stage_gpu_keep_moments), which the hook's sums are added into
 * (mp_stage_gpu_add_to_part); scaling, the norm's squares and AdamW then run on that part.
 * zero->shard_block_params (ZeRO-3; it needs window_block_grads and no deferred weights): the
 * device holds the layout's stored array (the tensors outside the blocks, then this dp rank's
 * block elements), and the chain takes each block's bf16 weights from two one-block device
 * windows in turn, which its weights hook fills before every pass, the next one's perhaps while
 * this one runs (mp_stage_chain_set_weights_hook; mp_stage_gpu_weights_at finds this rank's run
 * of them). Parameters start at zero: call an init, fill or write function. MP_ERR_INPUT, before
 * the GPU is looked for, for what the chain or the layout refuses, or device_tp not tp's ranks;
 * then without a visible GPU. */
mp_status mp_stage_gpu_create(const mp_model *model, const mp_stage_gpu_config *config,
                              mp_stage_gpu **out, mp_error *err);
void mp_stage_gpu_free(mp_stage_gpu *gpu);

/* Where each number of the stage goes (its span, micro-batch, tensor table, ZeRO's cuts). */
const mp_stage_layout *mp_stage_gpu_layout(const mp_stage_gpu *gpu);

/* The fp32 master weights by their place in the flat layout, between host memory and the device
 * (the bf16 copy refreshed on a write): MP_ERR_INPUT naming the element when the stage does not
 * hold them all (ZeRO-3). fill_params and init_params as the CPU stage's
 * (mp_stage_cpu_fill_params), through a 1 MiB host buffer. Each synchronises. */
mp_status mp_stage_gpu_read_params(mp_stage_gpu *gpu, size_t first, size_t count, float *dest,
                                   mp_error *err);
mp_status mp_stage_gpu_write_params(mp_stage_gpu *gpu, size_t first, size_t count,
                                    const float *src, mp_error *err);
mp_status mp_stage_gpu_fill_params(mp_stage_gpu *gpu, mp_stage_fill_fn fill, void *context,
                                   mp_error *err);
mp_status mp_stage_gpu_init_params(mp_stage_gpu *gpu, uint64_t seed, mp_error *err);

/* The stage's forward and backward (engine/model/stage_chain.h over the CUDA kernels); the calls
 * below that run a slot are the chain's. */
mp_stage_chain *mp_stage_gpu_chain(mp_stage_gpu *gpu);

/* Bytes of device memory the stage holds. */
size_t mp_stage_gpu_device_bytes(const mp_stage_gpu *gpu);

/* The gradients into dest (mp_stage_layout_num_params floats of host memory), for tests; not a
 * windowed stage's. Synchronises. */
mp_status mp_stage_gpu_download_grads(mp_stage_gpu *gpu, float *dest, mp_error *err);

/* The fp32 gradients on the device, mp_stage_layout_num_params(mp_stage_gpu_layout(gpu)) floats in
 * the layout's order (or windowed, mp_stage_gpu_grads_floats packed), for the data-parallel
 * all-reduce and the tied embedding's sum; mp_device_synchronize first. tensor_grad: tensor index's
 * gradient in it (NULL for a windowed block tensor). */
float *mp_stage_gpu_device_grads(mp_stage_gpu *gpu);
float *mp_stage_gpu_tensor_grad(mp_stage_gpu *gpu, int index);
size_t mp_stage_gpu_grads_floats(const mp_stage_gpu *gpu);

/* ZeRO-2 (a windowed stage): part += sums (count device floats, elements [first, first + count)
 * of the stage's flat layout, inside the moments' part; MP_ERR_INPUT otherwise), on stream (NULL:
 * the default stream; a communicator's, to follow the reduce-scatter that wrote sums there);
 * and each tensor's squares over the part into squares
 * (mp_stage_layout_num_tensors(mp_stage_gpu_layout(gpu)) doubles, host memory), for a norm the
 * caller sums over dp. */
mp_status mp_stage_gpu_add_to_part(mp_stage_gpu *gpu, const float *sums, size_t first,
                                       size_t count, mp_cuda_stream stream, mp_error *err);
mp_status mp_stage_gpu_part_squares(mp_stage_gpu *gpu, double *squares, mp_error *err);
/* ZeRO-2 (a windowed stage): the part's summed gradients (device floats, the moments' count), for
 * a sum over the ep group (expert parallelism sums the tensors other than the experts over it
 * too); NULL without a part. */
float *mp_stage_gpu_grad_part(mp_stage_gpu *gpu);

mp_status mp_stage_gpu_zero_grads(mp_stage_gpu *gpu, mp_error *err);
/* gradients *= scale (a data-parallel mean, a clip factor); windowed, the part's. */
void mp_stage_gpu_scale_grads(mp_stage_gpu *gpu, float scale);

/* mp_stage_cpu_finish_grads on the device: once per step, after the last micro-batch's backward
 * (and the data-parallel sums) and before the norm, with sequence parallelism every layernorm
 * gradient (each block's ln1 and ln2, the final norm's), partial over this rank's tokens, is summed
 * over the tensor-parallel group; without it (or with tp = 1) nothing happens. Collective. */
mp_status mp_stage_gpu_finish_grads(mp_stage_gpu *gpu, mp_error *err);

/* Forward of one micro-batch through the stage into slot (arguments as
 * mp_stage_cpu_forward_stage's; inputs and targets are host arrays, input and output device ones).
 * A head stage also leaves the gradient of dloss x its mean loss in place of the logits for the
 * backward (the fused cross-entropy), so dloss is given here; *loss is the mean over the B*T tokens
 * (synchronises). Collective over the tensor-parallel group. */
mp_status mp_stage_gpu_forward(mp_stage_gpu *gpu, int slot, const int32_t *inputs,
                                   const int32_t *targets, const float *input, float *output,
                                   float dloss, double *loss, mp_error *err);

/* ZeRO-1: the AdamW moments of elements [first, first + count) only (this data-parallel rank's
 * part), zeroed (call it before anything that needs the moments: AdamW and
 * mp_stage_gpu_moments_at otherwise make the whole stage's, as a run without ZeRO needs);
 * mp_stage_gpu_adamw then updates that part, and the caller gathers the
 * parameters over the group into mp_stage_gpu_device_params and refreshes the bf16 copy with
 * mp_stage_gpu_refresh_weights. MP_ERR_INPUT for a range outside the stage. */
mp_status mp_stage_gpu_keep_moments(mp_stage_gpu *gpu, size_t first, size_t count,
                                        mp_error *err);
/* The fp32 master weights on the device (mp_stage_layout_params_floats(mp_stage_gpu_layout(gpu))
 * floats, the layout's stored array: with ZeRO-3 not the flat layout). */
float *mp_stage_gpu_device_params(mp_stage_gpu *gpu);
/* The device's master (fp32) and working (bf16) copies of flat elements [first, first + count)
 * where the stage holds them as one stretch (mp_stage_layout_params_index's), else NULL. */
float *mp_stage_gpu_params_at(mp_stage_gpu *gpu, size_t first, size_t count);
void *mp_stage_gpu_weights_at(mp_stage_gpu *gpu, size_t first, size_t count);
/* The bf16 working copy from the master weights (after they changed on the device). */
void mp_stage_gpu_refresh_weights(mp_stage_gpu *gpu);
/* The AdamW moments of flat elements [first, first + count) on the device (made, zeroed, when
 * first needed), for checkpoints to copy; MP_ERR_INPUT when they are outside the kept part. */
mp_status mp_stage_gpu_moments_at(mp_stage_gpu *gpu, size_t first, size_t count,
                                      float **adam_m, float **adam_v, mp_error *err);

/* Forgets what slot holds (a forward whose backward will not run: evaluation); the slot is free. */
void mp_stage_gpu_discard(mp_stage_gpu *gpu, int slot);

/* Backward of slot's micro-batch (as mp_stage_cpu_backward_stage's; doutput and dinput are device
 * arrays), adding into the gradients; frees the slot. With full recomputation it first runs the
 * slot's forward again. defer_weights (zero-bubble's B; needs a stage created with deferred
 * weights, else MP_ERR_INPUT): adds the input gradient and every parameter gradient but the four
 * GEMM weights of each block, and keeps the slot until mp_stage_gpu_backward_weights.
 * MP_ERR_INPUT for an empty slot or one whose W is pending. Collective. */
mp_status mp_stage_gpu_backward(mp_stage_gpu *gpu, int slot, const float *doutput,
                                    float *dinput, bool defer_weights, mp_error *err);

/* Zero-bubble's W of slot: adds each block's qkv, attn_proj, fc and fc_proj weight gradients that
 * its deferred backward left out, and frees the slot. No collective. MP_ERR_INPUT when the slot
 * has no deferred backward pending. */
mp_status mp_stage_gpu_backward_weights(mp_stage_gpu *gpu, int slot, mp_error *err);

/* mp_stage_cpu_grad_norm_squared on the device's gradients: the same counting (sharded tensors
 * summed over the group, replicated ones once, a tied copy of wte not at all), bitwise the same
 * on every rank. Synchronises. Collective. */
mp_status mp_stage_gpu_grad_norm_squared(mp_stage_gpu *gpu, double *out, mp_error *err);

/* AdamW on every tensor of the stage (adamw->grad_clip is ignored: clip with
 * mp_stage_gpu_scale_grads first), refreshing the bf16 weights; with ZeRO-1
 * (mp_stage_gpu_keep_moments) on this rank's part only. Synchronises. */
mp_status mp_stage_gpu_adamw(mp_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err);

/* The GPU stage's state table (engine/model/stage_state.h), which the trainer drives as it drives
 * the CPU stage's: its calls are this header's (AdamW's clip factor a scale_grads pass first),
 * its memory the device's (engine/device/device.h). Built from their public calls alone
 * (stage_gpu_state.c), in a build without CUDA too. */
const mp_stage_state_ops *mp_stage_gpu_state_ops(void);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_STAGE_GPU_H */
