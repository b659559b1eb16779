/* topology/partition.c — exact min-max contiguous partition by dynamic programming; see
 * partition.h. */
#include "topology/partition.h"

#include <math.h>
#include <stdlib.h>

/* Entries of the (parts + 1, n + 1) tables of the dynamic programme. */
#define BEST(j, i) best[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(j, i) cut[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]

/* max for the costs here, which are finite: inline, where fmax is a library call. */
static inline double larger(double a, double b) { return a > b ? a : b; }

static mp_status check_chain(const double *costs, int n, int k, mp_error *err) {
  if (k < 1 || k > n) {
    return mp_fail(err, MP_ERR_INPUT,
                   "cannot cut %d layers into %d stages: every stage needs at least one layer "
                   "(use at most %d stages)",
                   n, k, n);
  }
  for (int i = 0; i < n; ++i) {
    if (!(costs[i] >= 0.0) || !isfinite(costs[i])) {
      return mp_fail(err, MP_ERR_INPUT, "layer %d: cost %g is not a finite non-negative number",
                     i, costs[i]);
    }
  }
  return MP_OK;
}

/* The dynamic programme for 1 .. max_parts parts, every row over the whole chain: best(j, i) is
 * the smallest bottleneck of the first i layers in j parts (i >= j) and cut(j, i) where its last
 * part starts. Row j reads only row j - 1 at indices below i, so an entry does not depend on how
 * many rows are computed: one table answers every k <= max_parts with the split a table of k rows
 * gives. best and cut are (max_parts + 1, n + 1). */
static void solve(const double *prefix, int n, int max_parts, double *best, int *cut) {
  for (int i = 1; i <= n; ++i) {
    BEST(1, i) = prefix[i];
    CUT(1, i) = 0;
  }
  for (int j = 2; j <= max_parts; ++j) {
    /* The last part is layers s..i-1 with s in [j-1, i-1]. best(j-1, s) grows with s and
     * cost(s..i-1) shrinks with s (also in floating point: the prefix sums of non-negative costs
     * only grow, and rounding keeps order), so the optimum sits at the first s where best(j-1, s)
     * >= cost(s..i-1), or just before it (i - 1 when there is none before it). That crossing only
     * moves right as i grows, so one pointer walks each row once: O(n) per row. */
    int lo = j - 1;
    for (int i = j; i <= n; ++i) {
      while (lo < i - 1 && BEST(j - 1, lo) < prefix[i] - prefix[lo]) ++lo;
      int best_s = lo;
      double best_value = larger(BEST(j - 1, lo), prefix[i] - prefix[lo]);
      if (lo - 1 >= j - 1) {
        const double value = larger(BEST(j - 1, lo - 1), prefix[i] - prefix[lo - 1]);
        if (value <= best_value) { /* prefer the earlier cut: later parts as large as allowed */
          best_value = value;
          best_s = lo - 1;
        }
      }
      BEST(j, i) = best_value;
      CUT(j, i) = best_s;
    }
  }
}

/* The k part sizes of the whole chain, walking the cuts back from the end. */
static void trace_back(const int *cut, int n, int k, int *counts) {
  int end = n;
  for (int j = k; j >= 1; --j) {
    const int start = CUT(j, end);
    counts[j - 1] = end - start;
    end = start;
  }
}

static mp_status partition(const double *costs, int n, int max_parts, int only_k, int *counts,
                           double *bottlenecks, mp_error *err) {
  MP_TRY(check_chain(costs, n, max_parts, err));
  double *prefix = malloc(sizeof(double) * (size_t)(n + 1));
  double *best = malloc(sizeof(double) * (size_t)(n + 1) * (size_t)(max_parts + 1));
  int *cut = malloc(sizeof(int) * (size_t)(n + 1) * (size_t)(max_parts + 1));
  if (prefix == NULL || best == NULL || cut == NULL) {
    free(prefix);
    free(best);
    free(cut);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory partitioning %d layers", n);
  }
  prefix[0] = 0.0;
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  solve(prefix, n, max_parts, best, cut);
  if (only_k > 0) {
    trace_back(cut, n, only_k, counts);
    bottlenecks[0] = BEST(only_k, n);
  } else {
    for (int k = 1; k <= max_parts; ++k) {
      trace_back(cut, n, k, counts + (size_t)k * (size_t)(k - 1) / 2);
      if (bottlenecks != NULL) bottlenecks[k] = BEST(k, n);
    }
  }
  free(prefix);
  free(best);
  free(cut);
  return MP_OK;
}

#undef BEST
#undef CUT

mp_status mp_partition_chain(const double *costs, int n, int k, int *counts, double *bottleneck,
                             mp_error *err) {
  return partition(costs, n, k, k, counts, bottleneck, err);
}

mp_status mp_partition_chain_all(const double *costs, int n, int max_parts, int *counts,
                                 double *bottlenecks, mp_error *err) {
  return partition(costs, n, max_parts, 0, counts, bottlenecks, err);
}

static mp_status check_values(const char *what, const double *values, int count, mp_error *err) {
  for (int i = 0; i < count; ++i) {
    if (!(values[i] >= 0.0) || !isfinite(values[i])) {
      return mp_fail(err, MP_ERR_INPUT, "%s %d: %g is not a finite non-negative number", what, i,
                     values[i]);
    }
  }
  return MP_OK;
}

mp_status mp_partition_chain_staged(const double *a, const double *b, int n, int k,
                                    const double *a_weight, const double *b_weight,
                                    const double *fixed, int *counts, double *bottleneck,
                                    mp_error *err) {
  MP_TRY(check_chain(a, n, k, err));
  MP_TRY(check_values("layer", b, n, err));
  MP_TRY(check_values("stage", a_weight, k, err));
  MP_TRY(check_values("stage", b_weight, k, err));
  MP_TRY(check_values("stage", fixed, k, err));
  const size_t n1 = (size_t)n + 1;
  double *pa = malloc(sizeof(double) * n1), *pb = malloc(sizeof(double) * n1);
  double *best = malloc(sizeof(double) * n1 * (size_t)(k + 1));
  int *cut = malloc(sizeof(int) * n1 * (size_t)(k + 1));
  if (pa == NULL || pb == NULL || best == NULL || cut == NULL) {
    free(pa);
    free(pb);
    free(best);
    free(cut);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory partitioning %d layers", n);
  }
  pa[0] = pb[0] = 0.0;
  for (int i = 0; i < n; ++i) {
    pa[i + 1] = pa[i] + a[i];
    pb[i + 1] = pb[i] + b[i];
  }
#define BEST(j, i) best[(size_t)(j) * n1 + (size_t)(i)]
#define CUT(j, i) cut[(size_t)(j) * n1 + (size_t)(i)]
#define STAGE_COST(j, s, i) \
  (fixed[j] + a_weight[j] * (pa[i] - pa[s]) + b_weight[j] * (pb[i] - pb[s]))
  /* Row j (its first j stages) is needed over i in [j, n - (k - j)] only: the other k - j
   * stages need a layer each. */
  for (int i = 1; i <= n - (k - 1); ++i) {
    BEST(1, i) = STAGE_COST(0, 0, i);
    CUT(1, i) = 0;
  }
  for (int j = 2; j <= k; ++j) {
    /* Row j's last stage is stage j - 1 over layers [s, i), s in [j - 1, i - 1]. Unlike
     * solve()'s, best(j - 1, s) need not grow with s here (one more layer can let a heavy layer
     * move to a stage that weighs it less), so no pointer walks to the crossing; but walking s
     * down from i - 1 the stage's own cost only grows, and once it alone is above the best found
     * no smaller s can win. */
    for (int i = j == k ? n : j; i <= n - (k - j); ++i) { /* the last row: the whole chain */
      double best_value = INFINITY;
      int best_s = i - 1;
      for (int s0 = i - 1; s0 >= j - 1; --s0) {
        const double stage = STAGE_COST(j - 1, s0, i);
        if (stage > best_value) break;
        const double value = larger(BEST(j - 1, s0), stage);
        if (value <= best_value) { /* ties: the earlier cut, later stages as large as allowed */
          best_value = value;
          best_s = s0;
        }
      }
      BEST(j, i) = best_value;
      CUT(j, i) = best_s;
    }
  }
  trace_back(cut, n, k, counts);
  *bottleneck = BEST(k, n);
#undef STAGE_COST
#undef BEST
#undef CUT
  free(pa);
  free(pb);
  free(best);
  free(cut);
  return MP_OK;
}
