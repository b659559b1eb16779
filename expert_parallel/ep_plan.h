/*
 * expert_parallel/ep_plan.h — the host-side bookkeeping of one expert-parallel exchange, shared by
 * the CPU dispatch (ep_dispatch.h) and the GPU one (engine/model/stage_kernels_gpu.c): from this
 * rank's rows per expert and the counts every rank sent it, how many rows go to and come from
 * each rank, where each local expert's rows start, and which received row each expert-grouped row
 * is.
 *
 * Why one place: the two backends must order the received rows the same way (by local expert,
 * then source rank, then the source's order), so their results agree and stay deterministic
 * whatever the timing; the arithmetic is backend-independent, only the buffers differ.
 *
 * Layouts (ep ranks, El = E / ep local experts, R rows received in all):
 *   - the sent rows (this rank's routed rows grouped by global expert): run r, to rank r, is the
 *     rows of experts [r El, (r+1) El);
 *   - the received buffer: by source rank s, then local expert e, then s's order;
 *   - the experts' rows: by local expert e, then source rank s, then s's order.
 */
#ifndef MPENGINE_EXPERT_PARALLEL_EP_PLAN_H
#define MPENGINE_EXPERT_PARALLEL_EP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "expert_parallel/ep_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int ep;             /* the group's size */
  int local_experts;  /* El = E / ep */
  int first_expert;   /* ep rank x El */
  int32_t *recv_rows; /* (ep, El) rows received from rank s for local expert e */
  size_t *send_rows;  /* (ep) rows sent to each rank */
  size_t *recv_rows_from; /* (ep) rows received from each rank */
  int *local_offset;  /* (El + 1) where each local expert's rows start among the R rows */
  int *source_row;    /* (R) expert-grouped row -> its row in the received buffer */
  int received;       /* R */
} mp_ep_plan;

/* Collective over ep: exchanges the counts (an all-to-all of El ints to each rank) from
 * expert_offset (E + 1, host: this rank's routed rows of expert e are [offset[e], offset[e+1]))
 * and fills *plan (free with mp_ep_plan_free; zeroed first). channels (C) and widest (the widest
 * row the experts keep, 2F) bound R: MP_ERR_INPUT when R x C or R x widest exceeds INT_MAX (more
 * than one exchange carries). E must be a multiple of ep (the caller checks it). MP_ERR_RUNTIME
 * when out of memory or the exchange fails. */
mp_status mp_ep_plan_exchange(mp_ep_plan *plan, const int *expert_offset, int experts,
                              int channels, int widest, const mp_ep_comm *ep, mp_error *err);
void mp_ep_plan_free(mp_ep_plan *plan);

/* counts (ep) = rows (ep) x row_floats: an all-to-all-v's counts for rows of row_floats. */
void mp_ep_plan_counts(size_t *counts, const size_t *rows, int ep, size_t row_floats);

/* The run of rows source rank s sent for local expert e: returns its rows, *received_start its
 * first row in the received buffer, *expert_start in the experts' order (the blocks a device
 * permutation copies whole). */
int mp_ep_plan_run(const mp_ep_plan *plan, int s, int e, int *received_start, int *expert_start);

/* Between the received buffer and the experts' order, rows of row_bytes each: to_experts, dst row
 * i = src row source_row[i]; else (back) dst row source_row[i] = src row i. */
void mp_ep_plan_permute(const mp_ep_plan *plan, void *dst, const void *src, size_t row_bytes,
                        int to_experts);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_EXPERT_PARALLEL_EP_PLAN_H */
