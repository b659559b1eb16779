/*
 * engine/comm/dp_comm_internal.h — dp_comm.h's private header: the table each implementation
 * (dp_comm_mpi.c, dp_comm_nccl.c) fills, and the handle dp_comm.c dispatches through.
 */
#ifndef MPENGINE_ENGINE_COMM_DP_COMM_INTERNAL_H
#define MPENGINE_ENGINE_COMM_DP_COMM_INTERNAL_H

#include "engine/comm/dp_comm.h"

typedef struct {
  void (*free)(void *impl);
  int (*rank)(const void *impl);
  int (*size)(const void *impl);
  const char *(*name)(const void *impl);
  bool enqueues;
  mp_cuda_stream (*stream)(const void *impl);
  mp_status (*after_compute)(void *impl, mp_error *err);
  mp_status (*before_compute)(void *impl, mp_error *err);
  mp_status (*synchronize)(void *impl, const mp_dp_comm_observer *observer, mp_error *err);
  mp_status (*mark)(void *impl, int slot, mp_error *err);
  mp_status (*before_compute_to_mark)(void *impl, int slot, mp_error *err);
  mp_status (*post_all_reduce_sum_f32)(void *impl, float *buffer, size_t count,
                                       const mp_dp_comm_observer *observer, mp_error *err);
  mp_status (*all_reduce_sum_f32)(void *impl, float *buffer, size_t count, mp_error *err);
  mp_status (*reduce_scatter_v_sum_f32)(void *impl, const float *input, float *output,
                                        const size_t *counts, mp_error *err);
  mp_status (*all_gather_f32)(void *impl, const float *input, float *output, size_t count,
                              mp_error *err);
  mp_status (*all_gather_v)(void *impl, const void *input, void *output, const size_t *counts,
                            mp_dp_dtype dtype, mp_error *err);
} mp_dp_comm_ops;

/* A handle over impl (which ops->free releases); observer may be NULL. */
mp_status mp_dp_comm_wrap(const mp_dp_comm_ops *ops, void *impl,
                          const mp_dp_comm_observer *observer, mp_dp_comm **out, mp_error *err);

/* Elements [at, at + n) of an uneven all-gather's output (counts[r] from rank r, the runs in rank
 * order, size ranks): counts_out[r] = how many of rank r's run fall in it, *mine_from = where
 * this rank's part of it starts inside its own run. Shared logic of MPI's staged pieces. */
void mp_dp_comm_piece_counts(const size_t *counts, int size, int rank, size_t at, size_t n,
                             size_t *counts_out, size_t *mine_from);

#endif /* MPENGINE_ENGINE_COMM_DP_COMM_INTERNAL_H */
