/*
 * engine/model/stage_layout.h — where one rank's shard of one pipeline stage puts each number,
 * without any memory or communicator: the stage's span of the chain, its tensors' shards in the
 * flat shard array (cut from the one-rank layout, engine/model/param_layout.h, by each tensor's
 * tensor-parallel split), the micro-batch and the activation at the stage boundary, and ZeRO's
 * cuts (the block-gradient windows of ZeRO 2, the held block parameters of ZeRO-3).
 *
 * The stage chain (engine/model/stage_chain.h), the CPU stage (stage_cpu.h), the GPU stage
 * (stage_gpu.h), the trainer and checkpoints all read this one layout, so a shard means the same
 * thing on every backend; it is a pure function of (model, span, micro-batch, tp rank and size,
 * sequence parallelism, ZeRO's cut), testable without MPI.
 *
 * The shard array holds the stage's tensors in the layout's order, each one's shard contiguous,
 * so the optimizer and clipping walk one buffer as on one rank. wte is cut by vocabulary rows,
 * q/k/v by heads, attn_proj and fc_proj by columns, fc (gate, up) by rows; wpe, norms and the
 * row-parallel biases are replicated. With expert parallelism (ep_size > 1) a mixture of experts'
 * stacked experts (expert_fc1, expert_fc2) are cut by rows over the ep group instead: the rank
 * holds its ep rank's E / ep experts, whole over tp.
 */
#ifndef MPENGINE_ENGINE_MODEL_STAGE_LAYOUT_H
#define MPENGINE_ENGINE_MODEL_STAGE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/model/param_layout.h"
#include "tensor_parallel/shard.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor's shard inside the flat shard array. */
typedef struct {
  const mp_param_tensor *full; /* the one-rank tensor: name, rows, cols, weight_decay, offset */
  mp_tp_split split;           /* how it is cut (replicated: every rank holds all of it) */
  size_t offset;               /* floats from the start of the shard array */
  size_t count;                /* floats of this rank's shard */
  int ep_rank, ep_size;        /* expert parallelism: a mixture of experts' stacked experts
                                  (expert_fc1, expert_fc2) hold rows [ep_rank R/ep_size,
                                  (ep_rank + 1) R/ep_size) of the full (R, cols) tensor, the
                                  experts of this ep rank (split is then replicated: whole over
                                  tp); ep_size 1 for every other tensor */
  bool tied_copy;              /* the LM head's copy of wte on a last stage without the
                                  embedding: its gradient is summed with the first stage's over
                                  the embedding group, and the global norm counts wte once, on
                                  the first stage */
} mp_stage_tensor;

/* A pipeline stage's span (one model chunk): a contiguous piece of the chain embedding, blocks
 * 0..L-1, final norm, LM head (with its loss) — the chain topology/cost_model.h's
 * layers_per_stage counts, one position each. */
typedef struct {
  bool embedding;   /* token + position embedding; the stage reads tokens, not activations */
  int first_layer;  /* its blocks: [first_layer, first_layer + num_layers) */
  int num_layers;   /* may be 0 */
  bool final_norm;  /* the final norm after its blocks */
  bool head;        /* LM head and the loss; the stage ends in a loss */
} mp_stage_span;

/* The whole model as one stage. */
mp_stage_span mp_stage_span_whole(int num_layers);

/* The span of chain positions [first, end) of a model with num_layers blocks (chain length
 * num_layers + 3). MP_ERR_INPUT when the range is empty or outside the chain. */
mp_status mp_stage_span_of_chain(int num_layers, int first, int end, mp_stage_span *out,
                                 mp_error *err);

/* ZeRO's cut of a stage over dp_size data-parallel ranks (NULL: none). The stage's dp part is
 * elements [first, first + count) of its flat layout (mp_zero_part). */
typedef struct mp_stage_zero {
  int dp_size, dp_rank;
  bool window_block_grads;  /* ZeRO 2 and 3: block gradients through a window (mp_grad_window) */
  bool shard_block_params;  /* ZeRO-3: of its blocks' parameters the stage holds only those of
                               its dp part (mp_stage_layout_held_params); the chain gathers each
                               block's into a weights window through its weights hook */
} mp_stage_zero;

/* ZeRO's part of dp rank `rank` of `size` over n floats: [*first, *first + *count), ceil(n /
 * size) floats each, the last ones shorter (or empty). */
void mp_zero_part(size_t n, int size, int rank, size_t *first, size_t *count);

/* Which gradients of a stage pass through a one-block window (ZeRO-2) instead of its gradient
 * array: none; every block tensor's (whole backwards); or with a zero-bubble schedule's deferred
 * weight gradients the blocks' GEMM weights' only (q, k, v, attn_proj, fc, up, fc_proj: W forms
 * them block by block, while B forms the norms' and biases', which then stay in the array until
 * the step's end). */
typedef enum {
  MP_GRAD_WINDOW_NONE = 0,
  MP_GRAD_WINDOW_BLOCKS,
  MP_GRAD_WINDOW_BLOCK_WEIGHTS,
} mp_grad_window;

/* The kind a stage with windowed block gradients and deferred weights uses. */
mp_grad_window mp_grad_window_for(bool windowed_block_grads, bool deferred_weights);

/* What a stage layout is cut by. */
typedef struct {
  int micro_batch, seq_len;   /* (B, T) of one micro-batch: T this rank's tokens of a sequence
                                 (seq_len / cp with context parallelism) */
  int tp_rank, tp_size;       /* this rank's place in its tensor-parallel group */
  bool sequence_parallel;     /* norms, residuals and the boundary hold B*T/tp tokens */
  mp_stage_span span;
  const mp_stage_zero *zero;  /* NULL: no ZeRO cut of the parameters */
  int cp_rank, cp_size;       /* context parallelism: this rank's place in the group that shares
                                 each sequence (context_parallel/sequence_split.h); cp_size 0 or 1:
                                 none */
  int ep_rank, ep_size;       /* expert parallelism: this rank's place in its ep group, whose
                                 ranks split each block's experts (E / ep_size each, ep rank r
                                 experts [r E/ep, (r+1) E/ep)); ep_size 0 or 1: none */
} mp_stage_layout_config;

typedef struct mp_stage_layout mp_stage_layout;

/* Lays out this rank's shard of config->span of model. MP_ERR_INPUT, naming the model file and
 * what to change, when the runtime cannot train the model (mp_param_layout_create), the span's
 * blocks are not the model's, the heads, kv heads, ffn_hidden or padded vocabulary do not divide
 * over tp, or with sequence parallelism micro_batch x seq_len does not. */
mp_status mp_stage_layout_create(const mp_model *model, const mp_stage_layout_config *config,
                                 mp_stage_layout **out, mp_error *err);
void mp_stage_layout_free(mp_stage_layout *layout);

/* The one-rank layout the shard is cut from (config, full tensor table). */
const mp_param_layout *mp_stage_layout_model(const mp_stage_layout *layout);
const mp_stage_span *mp_stage_layout_span(const mp_stage_layout *layout);
void mp_stage_layout_micro_batch(const mp_stage_layout *layout, int *micro_batch, int *seq_len);
void mp_stage_layout_tp(const mp_stage_layout *layout, int *tp_rank, int *tp_size);
bool mp_stage_layout_sequence_parallel(const mp_stage_layout *layout);
/* Context parallelism: this rank's cp rank and the group's size (1: none); the whole sequence is
 * cp_size x the layout's T tokens. */
void mp_stage_layout_cp(const mp_stage_layout *layout, int *cp_rank, int *cp_size);
/* Expert parallelism: this rank's ep rank and the group's size (1: none). */
void mp_stage_layout_ep(const mp_stage_layout *layout, int *ep_rank, int *ep_size);

/* Floats of the activation a stage sends to the next one (and the gradient it gets back):
 * (B*T, C), or with sequence parallelism this rank's (B*T/tp, C); with mixture-of-experts
 * blocks followed by the micro-batch's router statistics (engine/model/router_stats.h). */
size_t mp_stage_layout_boundary_floats(const mp_stage_layout *layout);

/* The flat shard array's floats, and its tensor table (index in the stage, not the model). */
size_t mp_stage_layout_num_params(const mp_stage_layout *layout);
int mp_stage_layout_num_tensors(const mp_stage_layout *layout);
const mp_stage_tensor *mp_stage_layout_tensor(const mp_stage_layout *layout, int index);
/* The stage's index of the one-rank layout's tensor full_index, or -1 if it does not hold it. */
int mp_stage_layout_index_of(const mp_stage_layout *layout, int full_index);

/* [*first, *end): the floats of the flat array the stage's blocks hold (contiguous, in the
 * layout's order; *first == *end without blocks), and *largest, the floats of its largest
 * block. */
void mp_stage_layout_blocks_range(const mp_stage_layout *layout, size_t *first, size_t *end,
                                  size_t *largest);

/* ZeRO-3's parameters (zero->shard_block_params): the stage holds the tensors outside its
 * blocks whole and of its blocks only the elements of its dp part, so its stored array is not in
 * the shard's layout. Without ZeRO-3 the stored array is the flat array.
 *   sharded_params  whether the cut is ZeRO-3's
 *   params_floats   floats of the stored array: num_params, or under ZeRO-3 the outside tensors
 *                   and the held block elements
 *   params_stretch  the stretch of the stored array that holds flat element `flat`: its first
 *                   flat element, its end, and where the first is stored; false when the stage
 *                   does not hold the element
 *   params_index    where flat elements [first, first + count) are stored when they are one
 *                   stretch there; false otherwise
 *   held_params     of tensor index: its elements [*first, *first + *count) that the stage
 *                   holds (all unless it is a block tensor of a ZeRO-3 stage; *count 0: none)
 *   held_blocks     [*first, *end): the held block elements of the flat layout */
bool mp_stage_layout_sharded_params(const mp_stage_layout *layout);
size_t mp_stage_layout_params_floats(const mp_stage_layout *layout);
bool mp_stage_layout_params_stretch(const mp_stage_layout *layout, size_t flat, size_t *first,
                                    size_t *end, size_t *stored);
bool mp_stage_layout_params_index(const mp_stage_layout *layout, size_t first, size_t count,
                                  size_t *at);
void mp_stage_layout_held_params(const mp_stage_layout *layout, int index, size_t *first,
                                 size_t *count);
void mp_stage_layout_held_blocks(const mp_stage_layout *layout, size_t *first, size_t *end);

/* Windowed block gradients: whether tensor index's gradient passes through the window (constant
 * time), where it sits in a gradient array packed for window (its offset for
 * MP_GRAD_WINDOW_NONE; false for a tensor of the window), and that array's floats. */
bool mp_stage_layout_grad_in_window(const mp_stage_layout *layout, int index,
                                    mp_grad_window window);
bool mp_stage_layout_grad_offset(const mp_stage_layout *layout, int index, mp_grad_window window,
                                 size_t *offset);
size_t mp_stage_layout_grad_array_floats(const mp_stage_layout *layout, mp_grad_window window);

/* A rectangle of a one-rank tensor: rows x cols at (row, col), which are flat elements
 * [flat_first, flat_first + rows x cols) of the shard, row-major. */
typedef struct {
  int tensor; /* the one-rank layout's index */
  size_t row, rows, col, cols;
  size_t flat_first;
} mp_stage_rect;

/* Calls visit for the rectangles of each of the stage's shards that it holds, in tensor order,
 * each at most max_floats (SIZE_MAX: whole shard blocks): initialisation and loading fill a
 * shard block by block, so no rank ever holds a full tensor, and a source whose file is laid out
 * otherwise (GPT-2's transposed weights) still reads whole rows. With ZeRO-3 a block tensor's
 * held elements are a range of the shard: each shard block's part of it is a partial row, whole
 * rows and a partial row. Stops at visit's first error. */
typedef mp_status (*mp_stage_rect_visit)(void *context, const mp_stage_rect *rect,
                                         mp_error *err);
mp_status mp_stage_layout_for_each_held_rect(const mp_stage_layout *layout, size_t max_floats,
                                             mp_stage_rect_visit visit, void *context,
                                             mp_error *err);

/* A backend's stored parameter array, seen from host memory: read copies count floats at stored
 * index `at` (mp_stage_layout_params_index) into dest, write the other way. */
typedef struct {
  void *context;
  mp_status (*read)(void *context, size_t at, size_t count, float *dest, mp_error *err);
  mp_status (*write)(void *context, size_t at, size_t count, const float *src, mp_error *err);
} mp_stage_param_io;

/* Flat elements [first, first + count) between host memory (dest, or src) and a stored array,
 * stretch by stretch. MP_ERR_INPUT naming the element when the stage does not hold them all
 * (ZeRO-3: another dp rank's); io's errors. */
mp_status mp_stage_layout_read_params(const mp_stage_layout *layout, const mp_stage_param_io *io,
                                      size_t first, size_t count, float *dest, mp_error *err);
mp_status mp_stage_layout_write_params(const mp_stage_layout *layout,
                                       const mp_stage_param_io *io, size_t first, size_t count,
                                       const float *src, mp_error *err);

/* Every parameter the stage holds, from fill: fill writes the (rows, cols) block at (row, col) of
 * the one-rank tensor of layout index `tensor` into dest (rows x cols, row-major), rectangle by
 * rectangle of at most piece_floats into piece (host memory the caller owns), which io then
 * writes. So no rank ever holds a full tensor, nor a host copy of its shard. Errors of fill and
 * of io. */
typedef mp_status (*mp_stage_fill_fn)(void *context, int tensor, size_t row, size_t rows,
                                      size_t col, size_t cols, float *dest, mp_error *err);
mp_status mp_stage_layout_fill_params(const mp_stage_layout *layout, mp_stage_fill_fn fill,
                                      void *fill_context, float *piece, size_t piece_floats,
                                      const mp_stage_param_io *io, mp_error *err);

/* A fill function (mp_stage_fill_fn) of the initial values: context is an
 * mp_stage_init_context, its numbers those of mp_param_tensor_init_block from seed. */
typedef struct {
  const mp_param_layout *model;
  uint64_t seed;
} mp_stage_init_context;
mp_status mp_stage_init_fill(void *context, int tensor, size_t row, size_t rows, size_t col,
                             size_t cols, float *dest, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_MODEL_STAGE_LAYOUT_H */
