/*
 * schedules/generate.c — the generators behind mp_schedule_generate (schedule.h): each is a pure
 * function of (pp, num_micro_batches, virtual_stages) that appends every rank's actions in order.
 *
 * The orders follow the systems users know, so a timeline drawn here matches what they have seen
 * elsewhere: GPipe (Huang et al. 2019), Megatron-LM's 1F1B and interleaved 1F1B
 * (forward_backward_pipelining_without_interleaving / _with_interleaving), and ZB-H1 from "Zero
 * Bubble Pipeline Parallelism" (Qi et al. 2023). Refusals are decided before anything is
 * allocated and say which numbers would work.
 */
#include <stdio.h>

#include "schedules/schedule.h"

static int min_int(int a, int b) { return a < b ? a : b; }

/* GPipe: every forward, then every backward in the same micro-batch order. */
static mp_status generate_gpipe(mp_schedule *s, mp_error *err) {
  for (int r = 0; r < s->pp; ++r) {
    for (int mb = 0; mb < s->num_micro_batches; ++mb) {
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, mb, 0, err));
    }
    for (int mb = 0; mb < s->num_micro_batches; ++mb) {
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD, mb, 0, err));
    }
  }
  return MP_OK;
}

/* 1F1B: rank r runs pp - r - 1 warm-up forwards (fewer when m is smaller), then alternates one
 * forward and one backward, then runs the backwards left (the cool-down). At most pp micro-batches
 * are alive on rank 0. */
static mp_status generate_1f1b(mp_schedule *s, mp_error *err) {
  int m = s->num_micro_batches;
  for (int r = 0; r < s->pp; ++r) {
    int num_warmup = min_int(s->pp - r - 1, m);
    int num_steady = m - num_warmup;
    for (int mb = 0; mb < num_warmup; ++mb) {
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, mb, 0, err));
    }
    for (int i = 0; i < num_steady; ++i) {
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, num_warmup + i, 0, err));
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD, i, 0, err));
    }
    for (int mb = num_steady; mb < m; ++mb) {
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD, mb, 0, err));
    }
  }
  return MP_OK;
}

/* Interleaved 1F1B (Megatron's virtual pipeline). Each rank walks m * v "virtual micro-batches":
 * the k-th forward is micro-batch (k / (pp v)) * pp + k % pp of chunk (k % (pp v)) / pp, i.e.
 * groups of pp micro-batches go through chunk 0, then chunk 1, ...; the k-th backward takes the
 * same micro-batch through the chunks in reverse (chunk v - 1 - (k % (pp v)) / pp). */
static void interleaved_unit(int pp, int v, int k, bool forward, int *micro_batch, int *chunk) {
  int group_size = pp * v;
  int chunk_in_group = (k % group_size) / pp;
  *chunk = forward ? chunk_in_group : v - 1 - chunk_in_group;
  *micro_batch = (k / group_size) * pp + k % pp;
}

static mp_status generate_interleaved(mp_schedule *s, mp_error *err) {
  int pp = s->pp, v = s->virtual_stages, m = s->num_micro_batches;
  int total = m * v;
  for (int r = 0; r < pp; ++r) {
    /* Megatron runs every forward first when m == pp; otherwise the warm-up fills the pipeline of
     * all pp * v stages once (2 per rank downstream for the F/B round trip) before 1F1B starts. */
    int num_warmup = m == pp ? total : min_int((pp - r - 1) * 2 + (v - 1) * pp, total);
    int num_steady = total - num_warmup;
    int micro_batch, chunk;
    for (int k = 0; k < num_warmup; ++k) {
      interleaved_unit(pp, v, k, true, &micro_batch, &chunk);
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, micro_batch, chunk, err));
    }
    for (int k = 0; k < num_steady; ++k) {
      interleaved_unit(pp, v, num_warmup + k, true, &micro_batch, &chunk);
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, micro_batch, chunk, err));
      interleaved_unit(pp, v, k, false, &micro_batch, &chunk);
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD, micro_batch, chunk, err));
    }
    for (int k = num_steady; k < total; ++k) {
      interleaved_unit(pp, v, k, false, &micro_batch, &chunk);
      MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD, micro_batch, chunk, err));
    }
  }
  return MP_OK;
}

/* ZB-H1: at its step x (0 .. m + pp - 2) rank r runs F of micro-batch x, B (input gradient) of
 * x - (pp - 1 - r) and W of x - (pp - 1), each when it exists. So the first pp - 1 - r steps are
 * 1F1B's warm-up forwards, every B runs as early as the one of 1F1B would, and each W runs r steps
 * after its B, filling the gaps that 1F1B leaves in the cool-down; F of x and W of x - (pp - 1)
 * keep at most pp micro-batches alive on every rank, 1F1B's peak (on rank 0). */
static mp_status generate_zb_h1(mp_schedule *s, mp_error *err) {
  int pp = s->pp, m = s->num_micro_batches;
  for (int r = 0; r < pp; ++r) {
    for (int x = 0; x < m + pp - 1; ++x) {
      int backward_micro_batch = x - (pp - 1 - r);
      int weight_micro_batch = x - (pp - 1);
      if (x < m) MP_TRY(mp_schedule_append(s, r, MP_ACTION_FORWARD, x, 0, err));
      if (backward_micro_batch >= 0 && backward_micro_batch < m) {
        MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD_INPUT, backward_micro_batch, 0, err));
      }
      if (weight_micro_batch >= 0 && weight_micro_batch < m) {
        MP_TRY(mp_schedule_append(s, r, MP_ACTION_BACKWARD_WEIGHT, weight_micro_batch, 0, err));
      }
    }
  }
  return MP_OK;
}

/* Refuses numbers the kind cannot run, saying which would work. */
static mp_status check_kind_applies(mp_schedule_kind kind, int pp, int m, int v, mp_error *err) {
  const char *name = mp_schedule_kind_name(kind);
  switch (kind) {
    case MP_SCHEDULE_GPIPE:
    case MP_SCHEDULE_1F1B:
    case MP_SCHEDULE_ZB_H1:
      if (v != 1) {
        return mp_fail(err, MP_ERR_INPUT,
                       "%s runs one model chunk per rank, so virtual stages must be 1 (got %d); "
                       "for %d chunks per rank use interleaved-1f1b",
                       name, v, v);
      }
      return MP_OK;
    case MP_SCHEDULE_INTERLEAVED_1F1B:
      if (v < 2) {
        return mp_fail(err, MP_ERR_INPUT,
                       "interleaved-1f1b needs at least 2 model chunks per rank (virtual stages); "
                       "got %d: use virtual stages 2 or more, or 1f1b for one chunk per rank",
                       v);
      }
      if (pp < 2) {
        return mp_fail(err, MP_ERR_INPUT,
                       "interleaved-1f1b needs pp of at least 2 (with one pipeline rank there is "
                       "no bubble to shrink); got pp = %d: use 1f1b",
                       pp);
      }
      if (m % pp != 0) {
        int below = m / pp * pp;
        if (below == 0) {
          return mp_fail(err, MP_ERR_INPUT,
                         "interleaved-1f1b needs the number of micro-batches to be a multiple of "
                         "pp = %d; got %d: use %d",
                         pp, m, pp);
        }
        return mp_fail(err, MP_ERR_INPUT,
                       "interleaved-1f1b needs the number of micro-batches to be a multiple of "
                       "pp = %d; got %d: use %d or %d",
                       pp, m, below, below + pp);
      }
      return MP_OK;
    case MP_SCHEDULE_CUSTOM:
      break;
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "a %s schedule is built action by action, not generated; generate gpipe, 1f1b, "
                 "interleaved-1f1b or zb-h1",
                 name);
}

mp_status mp_schedule_generate(mp_schedule_kind kind, int pp, int num_micro_batches,
                               int virtual_stages, mp_schedule *out, mp_error *err) {
  *out = (mp_schedule)MP_SCHEDULE_INITIALIZER;
  /* mp_schedule_init refuses out-of-range numbers before the kind looks at them. */
  MP_TRY(mp_schedule_init(out, kind, pp, num_micro_batches, virtual_stages, err));
  mp_status status = check_kind_applies(kind, pp, num_micro_batches, virtual_stages, err);
  if (status == MP_OK) {
    switch (kind) {
      case MP_SCHEDULE_GPIPE: status = generate_gpipe(out, err); break;
      case MP_SCHEDULE_1F1B: status = generate_1f1b(out, err); break;
      case MP_SCHEDULE_INTERLEAVED_1F1B: status = generate_interleaved(out, err); break;
      case MP_SCHEDULE_ZB_H1: status = generate_zb_h1(out, err); break;
      case MP_SCHEDULE_CUSTOM: break;
    }
  }
  if (status != MP_OK) mp_schedule_free(out);
  return status;
}

mp_status mp_schedule_generate_forward_only(mp_schedule_kind kind, int pp, int num_micro_batches,
                                            int virtual_stages, mp_schedule *out, mp_error *err) {
  *out = (mp_schedule)MP_SCHEDULE_INITIALIZER;
  MP_TRY(mp_schedule_init(out, kind, pp, num_micro_batches, virtual_stages, err));
  out->forward_only = true;
  mp_status status = MP_OK;
  for (int r = 0; r < pp && status == MP_OK; ++r) {
    for (int mb = 0; mb < num_micro_batches && status == MP_OK; ++mb) {
      for (int c = 0; c < virtual_stages && status == MP_OK; ++c) {
        status = mp_schedule_append(out, r, MP_ACTION_FORWARD, mb, c, err);
      }
    }
  }
  if (status != MP_OK) mp_schedule_free(out);
  return status;
}
