/*
 * layers/moe_cuda.h — the GPU twin of the mixture-of-experts MLP (layers/moe.h), step by step, on
 * device buffers: the router, softmax and top-k, the permutation of token rows to their experts,
 * the experts' GEMM pairs with the SwiGLU between them, the inverse permutation with the weighted
 * combine, the shared MLP with its sigmoid gate, and the backward of each. The same steps as the
 * CPU layer (route, experts, combine and their backwards, mp_moe_forward_cuda and
 * mp_moe_backward_cuda their one-device composition), so that expert parallelism can move the
 * grouped rows between them later. The GPU stage runs it at ep 1 (engine/model/
 * stage_kernels_gpu.c).
 *
 * Precision (the project's mixed precision, layers/matmul.h):
 *   - activations bf16: x, routed_in / fc1 / act / out, the shared MLP's, out, dx; each rounded
 *     once where it is written, a bf16 += one rounding of old + new (the new part summed in fp32);
 *   - the router in fp32: logits = x @ router^T accumulate in fp32 and stay fp32 (cuBLAS, bf16
 *     inputs, fp32 output), as do the probabilities, the combine weights and the router's
 *     gradients (Megatron-Core's fp32 router: a bf16 logit would flip the top-k choice of nearly
 *     tied experts). softmax and top-k are moe.c's formulas (double exp and sums), ties to the
 *     lowest expert index;
 *   - weight gradients fp32, added to (+=).
 * Which expert a token reaches can differ from the CPU layer's only where two probabilities are
 * within the fp32 summation-order error of the logits (~1e-7 relative).
 *
 * The permutation is deterministic without atomics: per expert a count, the offsets by one scan,
 * then each expert's rows written in token order by a block-wide prefix sum (the CPU's order).
 * The experts' GEMMs: cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, CUDA 12.5 and later),
 * one call for fc1 of every expert with rows, one for fc2, and in the backward one for each input
 * gradient (bf16 in and out, fp32 accumulation, one rounding), with the SwiGLU between them once
 * over all rows. The weight gradients (fp32 +=) stay the matmul twin's, one GEMM per expert with
 * rows: the grouped GEMM is asked for bf16 outputs only (its documented bf16 case; an fp32 output
 * from bf16 operands is not assumed of it). Without the grouped GEMM's pointer scratch
 * (gemm_pointers NULL) every GEMM is the matmul twin's (cuBLASLt), a loop over the experts with
 * rows. Counts are copied to the host once per layer (mp_moe_route_cuda synchronises its stream
 * for it): the GEMMs' shapes need them.
 *
 * Every step is deterministic: no floating-point atomics, fixed-order reductions, so two runs
 * give the same bits (same shapes, buffers, GPU and cuBLAS). All pointers are device pointers
 * unless a field says host. Launchers that return void are asynchronous on `stream`; cuBLAS
 * failures are kept in the mp_cublas (mp_cublas_check), kernel launch failures by
 * layers/cuda_launch.h (mp_cuda_take_launch_failure). Implemented by moe_cuda.c (the
 * compositions, //layers:cuda_moe) over moe_cuda_kernels.cu (//layers:cuda_moe_kernels);
 * emulated by moe_cuda_emulated.c (moe.c's CPU steps on the widened bf16 inputs, rounded where
 * the CUDA build rounds), stubs in moe_cuda_none.c without CUDA.
 */
#ifndef MPENGINE_LAYERS_MOE_CUDA_H
#define MPENGINE_LAYERS_MOE_CUDA_H

#include <stddef.h>

#include "common/error.h"
#include "layers/cublas_context.h"
#include "layers/cuda_types.h"
#include "layers/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The weights, bf16 on the device, the shapes of mp_moe_params. The shared ones NULL without. */
typedef struct {
  const mp_bf16 *router;      /* (E, C) */
  const mp_bf16 *expert_fc1;  /* (E, 2F, C) [gate | up] rows per expert */
  const mp_bf16 *expert_fc2;  /* (E, C, F) */
  const mp_bf16 *shared_fc1;  /* (2Fs, C) */
  const mp_bf16 *shared_fc2;  /* (C, Fs) */
  const mp_bf16 *shared_gate; /* (1, C) */
} mp_moe_weights_cuda;

/* Their gradients, fp32 on the device (added to). */
typedef struct {
  float *router;      /* (E, C) */
  float *expert_fc1;  /* (E, 2F, C) */
  float *expert_fc2;  /* (E, C, F) */
  float *shared_fc1;  /* (2Fs, C) */
  float *shared_fc2;  /* (C, Fs) */
  float *shared_gate; /* (1, C) */
} mp_moe_grads_cuda;

/* What the forward keeps for the backward: mp_moe_cache's arrays on the device, cut out of one
 * allocation of mp_moe_cache_cuda_bytes (mp_moe_cache_cuda_carve). */
typedef struct {
  mp_moe_shape shape;
  float *logits;           /* (N, E) fp32 router logits */
  float *probs;            /* (N, E) their softmax */
  int *selected;           /* (N, K) the chosen experts, by falling probability */
  float *weights;          /* (N, K) their combine weights */
  int *expert_offset;      /* (E + 1) where each expert's rows start in the routed arrays */
  int *expert_offset_host; /* (E + 1) HOST, the caller's storage: the same, copied by the route */
  int *routed_slot;        /* (N K) routed row -> token * K + slot, grouped by expert */
  int *slot_row;           /* (N K) token * K + slot -> its routed row (the inverse) */
  mp_bf16 *routed_in;      /* (N K, C) the tokens gathered to their experts */
  mp_bf16 *routed_fc1;     /* (N K, 2F) */
  mp_bf16 *routed_act;     /* (N K, F) */
  mp_bf16 *routed_out;     /* (N K, C) each expert's output, before its weight */
  mp_bf16 *shared_fc1;     /* (N, 2Fs) (NULL without a shared MLP, as the three below) */
  mp_bf16 *shared_act;     /* (N, Fs) */
  mp_bf16 *shared_out;     /* (N, C) before its gate */
  float *shared_gate;      /* (N) sigmoid of the gate's logit (1 without a gate) */
  void **gemm_pointers;    /* device scratch of the grouped GEMMs (set by the carve); NULL: the
                              experts' GEMMs as a loop of the matmul twin's instead */
} mp_moe_cache_cuda;

/* Device scratch of the backward, cut out of one allocation of mp_moe_workspace_cuda_bytes. */
typedef struct {
  float *dweights;     /* (N K) the combine weights' gradients */
  mp_bf16 *drouted;    /* (N K, C) the gradient of routed_out */
  mp_bf16 *drouted_in; /* (N K, C) the gradient of routed_in */
  mp_bf16 *dact;       /* (max(N K, N), max(F, Fs)) an MLP's d(act) */
  mp_bf16 *dfc1;       /* (max(N K, N), 2 max(F, Fs)) an MLP's d(fc1) */
  mp_bf16 *dshared;    /* (N, C) the shared MLP's output gradient (after its gate) */
  float *dlogits;      /* (N, E) */
  float *dx_router;    /* (N, C) the router's input gradient, fp32 */
  float *x_wide;       /* (N, C) x widened to fp32 (the router's weight gradient) */
  float *router_wide;  /* (E, C) the router widened to fp32 */
  double *aux_grad;    /* (E) the load-balancing loss's gradient on each probability */
} mp_moe_workspace_cuda;

/* Bytes of device memory for a cache / a workspace of this shape (each array 256-byte aligned
 * within). */
size_t mp_moe_cache_cuda_bytes(const mp_moe_shape *shape);
size_t mp_moe_workspace_cuda_bytes(const mp_moe_shape *shape);

/* Points the cache's arrays into `device` (mp_moe_cache_cuda_bytes(shape) bytes, 256-byte
 * aligned) and expert_offset_host at offset_host (E + 1 ints, host). */
void mp_moe_cache_cuda_carve(mp_moe_cache_cuda *cache, const mp_moe_shape *shape, void *device,
                             int *offset_host);
void mp_moe_workspace_cuda_carve(mp_moe_workspace_cuda *workspace, const mp_moe_shape *shape,
                                 void *device);

/* Rows grouped by expert on the device (mp_moe_expert_rows' twin): expert e owns the rows
 * [offset[e], offset[e + 1]), offset on the HOST. */
typedef struct {
  int experts;       /* El */
  const int *offset; /* (El + 1) host */
  mp_bf16 *in;       /* (R, C) */
  mp_bf16 *fc1;      /* (R, 2F) written by the forward */
  mp_bf16 *act;      /* (R, F) written by the forward */
  mp_bf16 *out;      /* (R, C) written by the forward */
  void **gemm_pointers; /* device, 3 * 64 pointers: the input-side GEMMs grouped (one
                           cublasGemmGroupedBatchedEx per 64 experts); NULL: a loop of the
                           matmul twin's GEMMs */
} mp_moe_expert_rows_cuda;

/* ---- the steps ---- */

/* Route: checks the shape (cache->shape, as mp_moe_forward_cpu; MP_ERR_INPUT, and for a capacity
 * factor, which the kernels do not drop by), then logits,
 * probs, selected, weights, the grouping (expert_offset, routed_slot, slot_row) and routed_in
 * from x (N, C) and weights->router. Synchronises `stream` to copy the offsets to
 * cache->expert_offset_host (MP_ERR_RUNTIME naming the CUDA call if that fails, or an earlier
 * kernel did). */
mp_status mp_moe_route_cuda(mp_cublas *cublas, const mp_bf16 *x,
                            const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                            mp_cuda_stream stream, mp_error *err);

/* The experts over rows grouped by expert: fc1, act and out from in, expert e's GEMMs with
 * weights->expert_fc1 + e (2F C) and expert_fc2 + e (C F). shape gives C and F. */
void mp_moe_experts_forward_cuda(mp_cublas *cublas, const mp_moe_weights_cuda *weights,
                                 const mp_moe_shape *shape, const mp_moe_expert_rows_cuda *rows,
                                 mp_cuda_stream stream);

/* Combine: the shared MLP of x and its gate into the cache, then out (N, C) = each token's
 * routed_out rows times their weights (in slot order, fp32) + gate * shared_out, rounded once. */
void mp_moe_combine_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *x,
                         const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                         mp_cuda_stream stream);

/* Backward of the weighted sum: drouted (N K, C) = weight * dout of its token (bf16), dweights
 * (N K) = dout . routed_out (fp32). Both written. */
void mp_moe_combine_backward_cuda(mp_bf16 *drouted, float *dweights, const mp_bf16 *dout,
                                  const mp_moe_cache_cuda *cache, mp_cuda_stream stream);

/* Backward of the experts: din (R, C) += the rows' input gradients (bf16, one rounding per
 * GEMM), grads->expert_fc1 / expert_fc2 += (fp32) from dout (R, C). dact (R, F) and dfc1 (R, 2F)
 * are scratch (overwritten). */
void mp_moe_experts_backward_cuda(mp_cublas *cublas, mp_bf16 *din, mp_moe_grads_cuda *grads,
                                  const mp_bf16 *dout, const mp_moe_weights_cuda *weights,
                                  const mp_moe_shape *shape, const mp_moe_expert_rows_cuda *rows,
                                  mp_bf16 *dact, mp_bf16 *dfc1, mp_cuda_stream stream);

/* Backward of the route: dx (N, C) += (one rounding) drouted_in (N K, C) summed back to the
 * tokens plus the router's input gradient; drouter (E, C) += its weight gradient (fp32), from
 * dweights (N K) and the auxiliary losses of stats (host; as mp_moe_backward_cpu). Uses
 * workspace's dlogits, dx_router, x_wide, router_wide and aux_grad. MP_ERR_RUNTIME when the
 * upload of the loss's per-expert terms fails. */
mp_status mp_moe_route_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, float *drouter,
                                     const mp_bf16 *drouted_in, const float *dweights,
                                     const mp_bf16 *x, const mp_bf16 *router,
                                     const mp_moe_cache_cuda *cache, const mp_moe_stats *stats,
                                     double aux_coeff, double z_coeff,
                                     mp_moe_workspace_cuda *workspace, mp_cuda_stream stream,
                                     mp_error *err);

/* Backward of the shared MLP and its gate (nothing without one): dx += its input gradient (the
 * gate's, then the MLP's: two roundings), grads->shared_* += (fp32). Uses workspace's dshared,
 * dact and dfc1. */
void mp_moe_shared_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                                 const mp_bf16 *dout, const mp_bf16 *x,
                                 const mp_moe_weights_cuda *weights,
                                 const mp_moe_cache_cuda *cache,
                                 mp_moe_workspace_cuda *workspace, mp_cuda_stream stream);

/* Adds the layer's router statistics to stats (host), as mp_moe_stats_add: routed counts from
 * the host offsets, the probability sums and the sum of logsumexp^2 reduced on the device in a
 * fixed order (in double). Synchronises `stream`; MP_ERR_RUNTIME naming the CUDA call when the
 * copy fails. scratch: device memory of E + 1 doubles. */
mp_status mp_moe_stats_add_cuda(mp_moe_stats *stats, const mp_moe_cache_cuda *cache,
                                double *scratch, mp_cuda_stream stream, mp_error *err);

/* ---- the one-device composition (every expert local) ---- */

/* out (N, C) bf16 written from x (N, C). Fills *cache (carved by the caller); fails as
 * mp_moe_route_cuda. */
mp_status mp_moe_forward_cuda(mp_cublas *cublas, mp_bf16 *out, const mp_bf16 *x,
                              const mp_moe_weights_cuda *weights, mp_moe_cache_cuda *cache,
                              mp_cuda_stream stream, mp_error *err);

/* Backward of  sum(out * dout) + aux_coeff * aux + z_coeff * z  (mp_moe_backward_cpu's loss):
 * dx (N, C) += (bf16), every gradient of grads += (fp32). Fails as mp_moe_route_backward_cuda. */
mp_status mp_moe_backward_cuda(mp_cublas *cublas, mp_bf16 *dx, mp_moe_grads_cuda *grads,
                               const mp_bf16 *dout, const mp_bf16 *x,
                               const mp_moe_weights_cuda *weights, const mp_moe_cache_cuda *cache,
                               const mp_moe_stats *stats, double aux_coeff, double z_coeff,
                               mp_moe_workspace_cuda *workspace, mp_cuda_stream stream,
                               mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_LAYERS_MOE_CUDA_H */
