/*
 * layers/tensor_parallel_cuda_none.c — //layers:cuda_tensor_parallel in a build without CUDA.
 *
 * Without nvcc there is no device memory (engine/device/device_none.c fails every allocation and counts
 * no device), so no caller can hold the device pointers these calls take: the launchers are
 * unreachable and do nothing. It exists so that code and tests naming them still link, and the
 * tests report themselves skipped.
 */
#include "layers/tensor_parallel_cuda.h"

void mp_float_from_bf16_cuda(float *out, const mp_bf16 *in, size_t n, mp_cuda_stream stream) {}

void mp_bf16_from_float_bias_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *bias, int rows,
                                  int cols, mp_cuda_stream stream) {}

void mp_add_f32_cuda(float *out, const float *in, size_t n, mp_cuda_stream stream) {}

void mp_vocab_embedding_lookup_cuda(float *out, const int32_t *tokens, const mp_bf16 *wte_shard,
                                    int vocab_start, int Vl, int BT, int C,
                                    mp_cuda_stream stream) {}

void mp_add_position_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int B, int T, int C,
                          mp_cuda_stream stream) {}

void mp_add_position_rows_cuda(mp_bf16 *out, const float *sum, const mp_bf16 *wpe, int first_row,
                               int rows, int T, int C, mp_cuda_stream stream) {}

void mp_vocab_ce_max_cuda(float *row_max, const mp_bf16 *logits, int BT, int Vl, int vocab_start,
                          int V, mp_cuda_stream stream) {}

void mp_max_over_ranks_cuda(float *row_max, const float *gathered, int ranks, int BT,
                            mp_cuda_stream stream) {}

void mp_vocab_ce_partials_cuda(float *stats, const mp_bf16 *logits, const int32_t *targets,
                               const float *row_max, int BT, int Vl, int vocab_start, int V,
                               mp_cuda_stream stream) {}

void mp_vocab_ce_finish_cuda(float *losses, mp_bf16 *logits, const int32_t *targets,
                             const float *row_max, const float *stats, float dloss, int BT, int Vl,
                             int vocab_start, int V, mp_cuda_stream stream) {}
