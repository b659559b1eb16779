/* layers/moe.c — the mixture-of-experts MLP on the CPU; see moe.h. The expert GEMMs and the
 * SwiGLU are layers/matmul.c's and layers/swiglu.c's, run once per expert over its gathered rows,
 * so the experts compute exactly what a dense Llama MLP of the same weights would. */
#include "layers/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers/matmul.h"
#include "layers/swiglu.h"

static void *zalloc(size_t count, size_t size, bool *ok) {
  if (count == 0) count = 1;
  void *p = calloc(count, size);
  if (p == NULL) *ok = false;
  return p;
}

void mp_moe_cache_free(mp_moe_cache *c) {
  if (c == NULL) return;
  free(c->logits);
  free(c->probs);
  free(c->selected);
  free(c->weights);
  free(c->expert_offset);
  free(c->routed_slot);
  free(c->routed_in);
  free(c->routed_fc1);
  free(c->routed_act);
  free(c->routed_out);
  free(c->shared_fc1);
  free(c->shared_act);
  free(c->shared_out);
  free(c->shared_gate);
  memset(c, 0, sizeof *c);
}

int mp_moe_capacity(const mp_moe_shape *shape) {
  const double pairs = (double)shape->tokens * (double)shape->top_k;
  if (!(shape->capacity_factor > 0.0)) return (int)pairs;
  const double capacity = ceil(shape->capacity_factor * pairs / (double)shape->experts);
  return capacity < pairs ? (int)capacity : (int)pairs;
}

static float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

/* The K largest of p (E), by falling value, ties to the lowest index. */
static void top_k(const float *p, int E, int K, int *chosen) {
  for (int s = 0; s < K; ++s) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < s; ++j) taken = taken || chosen[j] == e;
      if (taken) continue;
      if (best < 0 || p[e] > p[best]) best = e; /* strict: an equal later index loses */
    }
    chosen[s] = best;
  }
}

/* The shape's checks, shared by the forward and the route. */
static mp_status check_shape(const mp_moe_params *params, const mp_moe_shape *shape,
                             mp_error *err) {
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  const int F = shape->expert_ffn, Fs = shape->shared_ffn;
  if (N < 0 || C < 1 || E < 1 || K < 1 || K > E || F < 1 || Fs < 0 ||
      (shape->shared_gate && Fs == 0) ||
      (Fs > 0 && (params->shared_fc1 == NULL || params->shared_fc2 == NULL)) ||
      (shape->shared_gate && params->shared_gate == NULL)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "moe: shape out of range (tokens %d, channels %d, experts %d, top_k %d, "
                   "expert_ffn %d, shared_ffn %d) or shared weights missing",
                   N, C, E, K, F, Fs);
  }
  return MP_OK;
}

mp_status mp_moe_route_cpu(const float *x, const mp_moe_params *params, const mp_moe_shape *shape,
                           mp_moe_cache *cache, mp_error *err) {
  memset(cache, 0, sizeof *cache);
  MP_TRY(check_shape(params, shape, err));
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  const int Fs = shape->shared_ffn;
  cache->shape = *shape;
  const size_t NK = (size_t)N * (size_t)K;
  bool ok = true;
  cache->logits = zalloc((size_t)N * E, sizeof(float), &ok);
  cache->probs = zalloc((size_t)N * E, sizeof(float), &ok);
  cache->selected = zalloc(NK, sizeof(int), &ok);
  cache->weights = zalloc(NK, sizeof(float), &ok);
  cache->expert_offset = zalloc((size_t)E + 1, sizeof(int), &ok);
  cache->routed_slot = zalloc(NK, sizeof(int), &ok);
  cache->routed_in = zalloc(NK * C, sizeof(float), &ok);
  cache->routed_out = zalloc(NK * C, sizeof(float), &ok);
  if (Fs > 0) {
    cache->shared_fc1 = zalloc((size_t)N * 2 * Fs, sizeof(float), &ok);
    cache->shared_act = zalloc((size_t)N * Fs, sizeof(float), &ok);
    cache->shared_out = zalloc((size_t)N * C, sizeof(float), &ok);
    cache->shared_gate = zalloc((size_t)N, sizeof(float), &ok);
  }
  if (!ok) {
    mp_moe_cache_free(cache);
    return mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for %d tokens", N);
  }

  /* Router: logits, softmax over all experts, the top k and their weights. */
  mp_matmul_forward_cpu(cache->logits, x, params->router, NULL, N, C, E);
  for (int t = 0; t < N; ++t) {
    const float *l = cache->logits + (size_t)t * E;
    float *p = cache->probs + (size_t)t * E;
    float max = l[0];
    for (int e = 1; e < E; ++e) max = l[e] > max ? l[e] : max;
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += exp((double)(l[e] - max));
    for (int e = 0; e < E; ++e) p[e] = (float)(exp((double)(l[e] - max)) / sum);
    int *chosen = cache->selected + (size_t)t * K;
    float *w = cache->weights + (size_t)t * K;
    top_k(p, E, K, chosen);
    double chosen_sum = 0.0;
    for (int s = 0; s < K; ++s) chosen_sum += p[chosen[s]];
    for (int s = 0; s < K; ++s) {
      w[s] = shape->normalize_top_k ? (float)(p[chosen[s]] / chosen_sum) : p[chosen[s]];
    }
  }

  /* Group the (token, slot) pairs by expert, tokens in order, and gather their inputs.
   * With a capacity, an expert keeps its first `capacity` pairs in token order, drops the rest. */
  const int capacity = mp_moe_capacity(shape);
  int *counts = cache->expert_offset; /* counted in [e + 1], then made offsets */
  for (size_t i = 0; i < NK; ++i) {
    int *count = &counts[cache->selected[i] + 1];
    if (*count < capacity) ++*count;
  }
  for (int e = 0; e < E; ++e) counts[e + 1] += counts[e];
  for (int e = 0; e < E; ++e) {
    int row = cache->expert_offset[e];
    const int end = cache->expert_offset[e + 1];
    for (size_t i = 0; i < NK && row < end; ++i) {
      if (cache->selected[i] == e) cache->routed_slot[row++] = (int)i;
    }
  }
  const size_t R = (size_t)cache->expert_offset[E];
  for (size_t row = 0; row < R; ++row) {
    const int t = cache->routed_slot[row] / K;
    memcpy(cache->routed_in + row * C, x + (size_t)t * C, sizeof(float) * (size_t)C);
  }
  return MP_OK;
}

void mp_moe_experts_forward_cpu(const mp_moe_params *params, const mp_moe_shape *shape,
                                mp_moe_expert_rows *rows) {
  const int C = shape->channels, F = shape->expert_ffn;
  /* One GEMM pair per expert over its rows; an expert with none is skipped. */
  for (int e = 0; e < rows->experts; ++e) {
    const int first = rows->offset[e], count = rows->offset[e + 1] - first;
    if (count == 0) continue;
    float *fc1 = rows->fc1 + (size_t)first * 2 * F;
    float *act = rows->act + (size_t)first * F;
    mp_matmul_forward_cpu(fc1, rows->in + (size_t)first * C,
                          params->expert_fc1 + (size_t)e * 2 * F * C, NULL, count, C, 2 * F);
    mp_swiglu_forward_cpu(act, fc1, count, F);
    mp_matmul_forward_cpu(rows->out + (size_t)first * C, act,
                          params->expert_fc2 + (size_t)e * C * F, NULL, count, F, C);
  }
}

void mp_moe_combine_cpu(float *out, const float *x, const mp_moe_params *params,
                        mp_moe_cache *cache) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, K = shape->top_k, Fs = shape->shared_ffn;
  const size_t R = (size_t)cache->expert_offset[shape->experts]; /* the kept rows */
  /* Each token's expert outputs by their weights, then the shared MLP. */
  if (N > 0) memset(out, 0, sizeof(float) * (size_t)N * C); /* out may be NULL for no token */
  for (size_t row = 0; row < R; ++row) {
    const int slot = cache->routed_slot[row], t = slot / K;
    const float w = cache->weights[slot];
    const float *y = cache->routed_out + row * C;
    float *o = out + (size_t)t * C;
    for (int c = 0; c < C; ++c) o[c] += w * y[c];
  }
  if (Fs > 0) {
    mp_matmul_forward_cpu(cache->shared_fc1, x, params->shared_fc1, NULL, N, C, 2 * Fs);
    mp_swiglu_forward_cpu(cache->shared_act, cache->shared_fc1, N, Fs);
    mp_matmul_forward_cpu(cache->shared_out, cache->shared_act, params->shared_fc2, NULL, N, Fs,
                          C);
    for (int t = 0; t < N; ++t) {
      float g = 1.0f;
      if (shape->shared_gate) {
        double dot = 0.0;
        for (int c = 0; c < C; ++c) dot += (double)x[(size_t)t * C + c] * params->shared_gate[c];
        g = sigmoidf((float)dot);
      }
      cache->shared_gate[t] = g;
      const float *shared = cache->shared_out + (size_t)t * C;
      for (int c = 0; c < C; ++c) out[(size_t)t * C + c] += g * shared[c];
    }
  }
}

mp_status mp_moe_forward_cpu(float *out, const float *x, const mp_moe_params *params,
                             const mp_moe_shape *shape, mp_moe_cache *cache, mp_error *err) {
  MP_TRY(mp_moe_route_cpu(x, params, shape, cache, err));
  const size_t NK = (size_t)shape->tokens * (size_t)shape->top_k;
  bool ok = true;
  cache->routed_fc1 = zalloc(NK * 2 * shape->expert_ffn, sizeof(float), &ok);
  cache->routed_act = zalloc(NK * shape->expert_ffn, sizeof(float), &ok);
  if (!ok) {
    mp_moe_cache_free(cache);
    return mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for %d tokens", shape->tokens);
  }
  /* Every expert is here: the rows are this device's own. */
  mp_moe_expert_rows rows = {shape->experts,     cache->expert_offset, cache->routed_in,
                             cache->routed_fc1, cache->routed_act,    cache->routed_out};
  mp_moe_experts_forward_cpu(params, shape, &rows);
  mp_moe_combine_cpu(out, x, params, cache);
  return MP_OK;
}

void mp_moe_stats_clear(mp_moe_stats *stats) {
  for (int e = 0; e < stats->experts; ++e) stats->routed[e] = stats->prob_sum[e] = 0.0;
  stats->tokens = 0.0;
  stats->logsumexp_sq = 0.0;
}

void mp_moe_stats_add(mp_moe_stats *stats, const mp_moe_cache *cache) {
  const int N = cache->shape.tokens, E = cache->shape.experts, K = cache->shape.top_k;
  for (size_t i = 0; i < (size_t)N * K; ++i) stats->routed[cache->selected[i]] += 1.0;
  for (int t = 0; t < N; ++t) {
    const float *l = cache->logits + (size_t)t * E;
    float max = l[0];
    for (int e = 0; e < E; ++e) {
      stats->prob_sum[e] += cache->probs[(size_t)t * E + e];
      max = l[e] > max ? l[e] : max;
    }
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += exp((double)(l[e] - max));
    const double lse = (double)max + log(sum);
    stats->logsumexp_sq += lse * lse;
  }
  stats->tokens += N;
}

double mp_moe_aux_loss(const mp_moe_stats *stats) {
  if (stats->tokens <= 0.0) return 0.0;
  double sum = 0.0;
  for (int e = 0; e < stats->experts; ++e) sum += stats->routed[e] * stats->prob_sum[e];
  return (double)stats->experts * sum / (stats->tokens * stats->tokens);
}

double mp_moe_z_loss(const mp_moe_stats *stats) {
  return stats->tokens > 0.0 ? stats->logsumexp_sq / stats->tokens : 0.0;
}

/* Backward of one SwiGLU MLP (fc1 then fc2) over rows: dinp (rows, C) += ...; the weight
 * gradients +=. scratch holds rows x 3F floats. */
static void mlp_backward(float *dinp, float *dfc1_w, float *dfc2_w, const float *dout,
                         const float *inp, const float *fc1, const float *act,
                         const float *fc1_w, const float *fc2_w, int rows, int C, int F,
                         float *scratch) {
  float *dact = scratch, *dfc1 = scratch + (size_t)rows * F;
  memset(scratch, 0, sizeof(float) * (size_t)rows * 3 * F);
  mp_matmul_backward_cpu(dact, dfc2_w, NULL, dout, act, fc2_w, rows, F, C);
  mp_swiglu_backward_cpu(dfc1, fc1, dact, rows, F);
  mp_matmul_backward_cpu(dinp, dfc1_w, NULL, dfc1, inp, fc1_w, rows, C, 2 * F);
}

void mp_moe_combine_backward_cpu(float *drouted, float *dweights, const float *dout,
                                 const mp_moe_cache *cache) {
  const int N = cache->shape.tokens, C = cache->shape.channels, K = cache->shape.top_k;
  const size_t R = (size_t)cache->expert_offset[cache->shape.experts]; /* the kept rows */
  /* Each routed row's output gradient is its weight times the token's, and each weight's
   * gradient the dot product of the token's gradient with the expert's output; a dropped pair's
   * weight has none. */
  if (N > 0) memset(dweights, 0, sizeof(float) * (size_t)N * K);
  for (size_t row = 0; row < R; ++row) {
    const int slot = cache->routed_slot[row], t = slot / K;
    const float *g = dout + (size_t)t * C, *y = cache->routed_out + row * C;
    const float w = cache->weights[slot];
    double dot = 0.0;
    for (int c = 0; c < C; ++c) {
      drouted[row * C + c] = w * g[c];
      dot += (double)g[c] * y[c];
    }
    dweights[slot] = (float)dot;
  }
}

mp_status mp_moe_experts_backward_cpu(float *din, mp_moe_params *grads, const float *dout,
                                      const mp_moe_params *params, const mp_moe_shape *shape,
                                      const mp_moe_expert_rows *rows, mp_error *err) {
  const int C = shape->channels, F = shape->expert_ffn;
  int widest = 0; /* the most rows of one expert */
  for (int e = 0; e < rows->experts; ++e) {
    const int count = rows->offset[e + 1] - rows->offset[e];
    widest = count > widest ? count : widest;
  }
  bool ok = true;
  float *scratch = zalloc((size_t)widest * 3 * F, sizeof(float), &ok);
  if (!ok) {
    return mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for the backward of %d expert rows",
                   widest);
  }
  for (int e = 0; e < rows->experts; ++e) {
    const int first = rows->offset[e], count = rows->offset[e + 1] - first;
    if (count == 0) continue;
    mlp_backward(din + (size_t)first * C, grads->expert_fc1 + (size_t)e * 2 * F * C,
                 grads->expert_fc2 + (size_t)e * C * F, dout + (size_t)first * C,
                 rows->in + (size_t)first * C, rows->fc1 + (size_t)first * 2 * F,
                 rows->act + (size_t)first * F, params->expert_fc1 + (size_t)e * 2 * F * C,
                 params->expert_fc2 + (size_t)e * C * F, count, C, F, scratch);
  }
  free(scratch);
  return MP_OK;
}

mp_status mp_moe_route_backward_cpu(float *dx, float *drouter, const float *drouted_in,
                                    const float *dweights, const float *x, const float *router,
                                    const mp_moe_cache *cache, const mp_moe_stats *stats,
                                    double aux_coeff, double z_coeff, mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, E = shape->experts, K = shape->top_k;
  bool ok = true;
  float *dlogits = zalloc((size_t)N * E, sizeof(float), &ok); /* (N, E) */
  double *dp = zalloc((size_t)E, sizeof(double), &ok); /* (E) one token's d(probabilities) */
  if (!ok) {
    free(dlogits);
    free(dp);
    return mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for the backward of %d tokens", N);
  }
  /* The gathered (kept) rows' gradients back to their tokens. */
  const size_t R = (size_t)cache->expert_offset[E];
  for (size_t row = 0; row < R; ++row) {
    const int t = cache->routed_slot[row] / K;
    for (int c = 0; c < C; ++c) dx[(size_t)t * C + c] += drouted_in[row * C + c];
  }

  /* Router: the weights' gradient through the (renormalised) top-k to the probabilities, plus
   * the load-balancing loss's (E routed_e / n^2 on every probability), through the softmax to
   * the logits; plus the z-loss's 2 lse softmax / n. */
  const double n = stats->tokens > 0.0 ? stats->tokens : 1.0;
  for (int t = 0; t < N; ++t) {
    const float *p = cache->probs + (size_t)t * E;
    const int *chosen = cache->selected + (size_t)t * K;
    const float *dw = dweights + (size_t)t * K;
    for (int e = 0; e < E; ++e) {
      dp[e] = aux_coeff * (double)E * stats->routed[e] / (n * n);
    }
    if (shape->normalize_top_k) {
      double sum = 0.0, dot = 0.0;
      for (int s = 0; s < K; ++s) sum += p[chosen[s]];
      for (int s = 0; s < K; ++s) dot += (double)dw[s] * (p[chosen[s]] / sum);
      for (int s = 0; s < K; ++s) dp[chosen[s]] += ((double)dw[s] - dot) / sum;
    } else {
      for (int s = 0; s < K; ++s) dp[chosen[s]] += dw[s];
    }
    double p_dot_dp = 0.0;
    for (int e = 0; e < E; ++e) p_dot_dp += p[e] * dp[e];
    const float *l = cache->logits + (size_t)t * E;
    double lse = 0.0;
    if (z_coeff != 0.0) {
      float max = l[0];
      for (int e = 0; e < E; ++e) max = l[e] > max ? l[e] : max;
      double sum = 0.0;
      for (int e = 0; e < E; ++e) sum += exp((double)(l[e] - max));
      lse = (double)max + log(sum);
    }
    for (int e = 0; e < E; ++e) {
      dlogits[(size_t)t * E + e] =
          (float)(p[e] * (dp[e] - p_dot_dp) + z_coeff * 2.0 * lse * p[e] / n);
    }
  }
  mp_matmul_backward_cpu(dx, drouter, NULL, dlogits, x, router, N, C, E);
  free(dlogits);
  free(dp);
  return MP_OK;
}

mp_status mp_moe_shared_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                                     const float *x, const mp_moe_params *params,
                                     const mp_moe_cache *cache, mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels, Fs = shape->shared_ffn;
  if (Fs == 0) return MP_OK;
  bool ok = true;
  float *dshared = zalloc((size_t)N * C, sizeof(float), &ok);       /* (N, C) */
  float *scratch = zalloc((size_t)N * 3 * Fs, sizeof(float), &ok);  /* (N, 3Fs) */
  if (!ok) {
    free(dshared);
    free(scratch);
    return mp_fail(err, MP_ERR_RUNTIME,
                   "moe: out of memory for the shared MLP's backward of %d tokens", N);
  }
  for (int t = 0; t < N; ++t) {
    const float g = cache->shared_gate[t];
    const float *gout = dout + (size_t)t * C, *so = cache->shared_out + (size_t)t * C;
    double dg = 0.0;
    for (int c = 0; c < C; ++c) {
      dshared[(size_t)t * C + c] = g * gout[c];
      dg += (double)gout[c] * so[c];
    }
    if (shape->shared_gate) {
      const float dlogit = (float)(dg * g * (1.0f - g));
      for (int c = 0; c < C; ++c) {
        grads->shared_gate[c] += dlogit * x[(size_t)t * C + c];
        dx[(size_t)t * C + c] += dlogit * params->shared_gate[c];
      }
    }
  }
  mlp_backward(dx, grads->shared_fc1, grads->shared_fc2, dshared, x, cache->shared_fc1,
               cache->shared_act, params->shared_fc1, params->shared_fc2, N, C, Fs, scratch);
  free(dshared);
  free(scratch);
  return MP_OK;
}

mp_status mp_moe_backward_cpu(float *dx, mp_moe_params *grads, const float *dout,
                              const float *x, const mp_moe_params *params,
                              const mp_moe_cache *cache, const mp_moe_stats *stats,
                              double aux_coeff, double z_coeff, mp_error *err) {
  const mp_moe_shape *shape = &cache->shape;
  const int N = shape->tokens, C = shape->channels;
  const size_t NK = (size_t)N * shape->top_k;
  bool ok = true;
  float *dweights = zalloc(NK, sizeof(float), &ok);       /* (N, K) */
  float *drouted = zalloc(NK * C, sizeof(float), &ok);    /* (N K, C) d(expert output) */
  float *drouted_in = zalloc(NK * C, sizeof(float), &ok); /* (N K, C) */
  mp_status status = MP_OK;
  if (!ok) {
    status = mp_fail(err, MP_ERR_RUNTIME, "moe: out of memory for the backward of %d tokens", N);
  } else {
    mp_moe_combine_backward_cpu(drouted, dweights, dout, cache);
    /* Every expert is here: the rows are this device's own. */
    const mp_moe_expert_rows rows = {shape->experts,     cache->expert_offset, cache->routed_in,
                                     cache->routed_fc1, cache->routed_act,    cache->routed_out};
    status = mp_moe_experts_backward_cpu(drouted_in, grads, drouted, params, shape, &rows, err);
  }
  if (status == MP_OK) {
    status = mp_moe_route_backward_cpu(dx, grads->router, drouted_in, dweights, x, params->router,
                                       cache, stats, aux_coeff, z_coeff, err);
  }
  if (status == MP_OK) {
    status = mp_moe_shared_backward_cpu(dx, grads, dout, x, params, cache, err);
  }
  free(dweights);
  free(drouted);
  free(drouted_in);
  return status;
}
