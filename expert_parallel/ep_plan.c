/* expert_parallel/ep_plan.c — the counts, offsets and row order of an expert-parallel exchange;
 * see ep_plan.h. */
#include "expert_parallel/ep_plan.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t count, size_t size, bool *ok) {
  if (count == 0) count = 1;
  void *p = calloc(count, size);
  if (p == NULL) *ok = false;
  return p;
}

void mp_ep_plan_free(mp_ep_plan *plan) {
  if (plan == NULL) return;
  free(plan->recv_rows);
  free(plan->send_rows);
  free(plan->recv_rows_from);
  free(plan->local_offset);
  free(plan->source_row);
  memset(plan, 0, sizeof *plan);
}

/* From the counts every rank sent (recv_rows), the received buffer's layout (by source rank,
 * then local expert) and the experts' (by local expert, then source rank): local_offset and
 * source_row. */
static void group_received(mp_ep_plan *p) {
  const int ep = p->ep, El = p->local_experts;
  p->local_offset[0] = 0;
  for (int e = 0; e < El; ++e) {
    int rows = 0;
    for (int s = 0; s < ep; ++s) rows += p->recv_rows[s * El + e];
    p->local_offset[e + 1] = p->local_offset[e] + rows;
  }
  int at = 0; /* the start of block (s, e) in the received buffer */
  for (int s = 0; s < ep; ++s) {
    for (int e = 0; e < El; ++e) {
      const int count = p->recv_rows[s * El + e];
      int row = p->local_offset[e]; /* after the rows of sources before s */
      for (int s2 = 0; s2 < s; ++s2) row += p->recv_rows[s2 * El + e];
      for (int i = 0; i < count; ++i) p->source_row[row + i] = at + i;
      at += count;
    }
  }
}

mp_status mp_ep_plan_exchange(mp_ep_plan *plan, const int *expert_offset, int experts,
                              int channels, int widest, const mp_ep_comm *ep, mp_error *err) {
  memset(plan, 0, sizeof *plan);
  const int size = ep->size, E = experts, El = E / size;
  plan->ep = size;
  plan->local_experts = El;
  plan->first_expert = ep->rank * El;
  bool ok = true;
  int32_t *send_counts = zalloc((size_t)E, sizeof(int32_t), &ok); /* (E) rows per expert */
  plan->recv_rows = zalloc((size_t)E, sizeof(int32_t), &ok);
  plan->send_rows = zalloc((size_t)size, sizeof(size_t), &ok);
  plan->recv_rows_from = zalloc((size_t)size, sizeof(size_t), &ok);
  plan->local_offset = zalloc((size_t)El + 1, sizeof(int), &ok);
  mp_status status = MP_OK;
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for the expert-parallel counts");
    goto done;
  }
  for (int e = 0; e < E; ++e) send_counts[e] = expert_offset[e + 1] - expert_offset[e];
  status = mp_ep_all_to_all_i32(ep, send_counts, plan->recv_rows, (size_t)El, err);
  if (status != MP_OK) goto done;
  size_t total = 0; /* R */
  for (int r = 0; r < size; ++r) {
    plan->send_rows[r] = (size_t)(expert_offset[(r + 1) * El] - expert_offset[r * El]);
    size_t rows = 0;
    for (int e = 0; e < El; ++e) rows += (size_t)plan->recv_rows[r * El + e];
    plan->recv_rows_from[r] = rows;
    total += rows;
  }
  if (total * (size_t)channels > (size_t)INT_MAX || total * (size_t)widest > (size_t)INT_MAX) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "moe: expert-parallel rank %d receives %zu rows of %d floats, more than one "
                     "exchange carries; use smaller micro-batches",
                     ep->rank, total, channels);
    goto done;
  }
  plan->received = (int)total;
  plan->source_row = zalloc(total, sizeof(int), &ok);
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME,
                     "moe: out of memory for the %d rows expert-parallel rank %d receives",
                     plan->received, ep->rank);
    goto done;
  }
  group_received(plan);
done:
  free(send_counts);
  if (status != MP_OK) mp_ep_plan_free(plan);
  return status;
}

int mp_ep_plan_run(const mp_ep_plan *plan, int s, int e, int *received_start, int *expert_start) {
  const int El = plan->local_experts;
  int at = 0;
  for (int i = 0; i < s * El + e; ++i) at += plan->recv_rows[i];
  int row = plan->local_offset[e];
  for (int s2 = 0; s2 < s; ++s2) row += plan->recv_rows[s2 * El + e];
  *received_start = at;
  *expert_start = row;
  return plan->recv_rows[s * El + e];
}

void mp_ep_plan_counts(size_t *counts, const size_t *rows, int ep, size_t row_floats) {
  for (int r = 0; r < ep; ++r) counts[r] = rows[r] * row_floats;
}

void mp_ep_plan_permute(const mp_ep_plan *plan, void *dst, const void *src, size_t row_bytes,
                        int to_experts) {
  char *d = dst;
  const char *s = src;
  for (int i = 0; i < plan->received; ++i) {
    const size_t to = (size_t)(to_experts ? i : plan->source_row[i]) * row_bytes;
    const size_t from = (size_t)(to_experts ? plan->source_row[i] : i) * row_bytes;
    memcpy(d + to, s + from, row_bytes);
  }
}
