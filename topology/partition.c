/* topology/partition.c — exact min-max contiguous partition by dynamic programming; see
 * partition.h. */
#include "topology/partition.h"

#include <math.h>
#include <stdlib.h>

mp_status mp_partition_chain(const double *costs, int n, int k, int *counts, double *bottleneck,
                             mp_error *err) {
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
  double *prefix = malloc(sizeof(double) * (size_t)(n + 1));
  double *best = malloc(sizeof(double) * (size_t)(n + 1) * (size_t)(k + 1)); /* (k+1, n+1) */
  int *cut = malloc(sizeof(int) * (size_t)(n + 1) * (size_t)(k + 1));       /* (k+1, n+1) */
  if (prefix == NULL || best == NULL || cut == NULL) {
    free(prefix);
    free(best);
    free(cut);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory partitioning %d layers", n);
  }
  prefix[0] = 0.0;
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
#define BEST(j, i) best[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(j, i) cut[(size_t)(j) * (size_t)(n + 1) + (size_t)(i)]
  /* best(j, i): the smallest bottleneck of the first i layers in j parts (i >= j). */
  for (int i = 1; i <= n; ++i) {
    BEST(1, i) = prefix[i];
    CUT(1, i) = 0;
  }
  for (int j = 2; j <= k; ++j) {
    for (int i = j; i <= n - (k - j); ++i) {
      /* The last part is layers s..i-1 with s in [j-1, i-1]. Bisection for the first s where
       * best(j-1, s) >= cost(s..i-1); the optimum is there or just before it. */
      int lo = j - 1, hi = i - 1;
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (BEST(j - 1, mid) >= prefix[i] - prefix[mid]) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      int best_s = lo;
      double best_value = fmax(BEST(j - 1, lo), prefix[i] - prefix[lo]);
      if (lo - 1 >= j - 1) {
        const double value = fmax(BEST(j - 1, lo - 1), prefix[i] - prefix[lo - 1]);
        if (value <= best_value) { /* prefer the earlier cut: later parts as large as allowed */
          best_value = value;
          best_s = lo - 1;
        }
      }
      BEST(j, i) = best_value;
      CUT(j, i) = best_s;
    }
  }
  *bottleneck = BEST(k, n);
  int end = n;
  for (int j = k; j >= 1; --j) {
    const int start = CUT(j, end);
    counts[j - 1] = end - start;
    end = start;
  }
#undef BEST
#undef CUT
  free(prefix);
  free(best);
  free(cut);
  return MP_OK;
}
