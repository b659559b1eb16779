// tests/layers/reference.cc — naive double-precision layer forwards; see reference.h.
#include "tests/layers/reference.h"

#include <cmath>

namespace mp_test {

dvec ref_matmul(const dvec &inp, const dvec &weight, const dvec &bias, int BT, int C, int OC) {
  dvec out(static_cast<size_t>(BT) * OC);
  for (int r = 0; r < BT; r++) {
    for (int o = 0; o < OC; o++) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < C; i++) sum += inp[r * C + i] * weight[o * C + i];
      out[r * OC + o] = sum;
    }
  }
  return out;
}

dvec ref_layernorm(const dvec &inp, const dvec &weight, const dvec &bias, int N, int C, double eps,
                   dvec *mean, dvec *rstd) {
  dvec out(static_cast<size_t>(N) * C);
  if (mean) mean->assign(N, 0.0);
  if (rstd) rstd->assign(N, 0.0);
  for (int r = 0; r < N; r++) {
    double m = 0.0;
    for (int i = 0; i < C; i++) m += inp[r * C + i];
    m /= C;
    double var = 0.0;
    for (int i = 0; i < C; i++) var += (inp[r * C + i] - m) * (inp[r * C + i] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int i = 0; i < C; i++) out[r * C + i] = (inp[r * C + i] - m) * s * weight[i] + bias[i];
    if (mean) (*mean)[r] = m;
    if (rstd) (*rstd)[r] = s;
  }
  return out;
}

dvec ref_gelu(const dvec &inp) {
  const double pi = std::acos(-1.0);
  dvec out(inp.size());
  for (size_t i = 0; i < inp.size(); i++) {
    const double x = inp[i];
    out[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
  }
  return out;
}

dvec ref_attention(const dvec &inp, int B, int T, int NH, int HS, dvec *att, int KVH) {
  if (KVH <= 0) KVH = NH;
  const int C = NH * HS, W = (NH + 2 * KVH) * HS, group = NH / KVH;
  dvec out(static_cast<size_t>(B) * T * C, 0.0);
  if (att) att->assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  auto q = [&](int b, int t, int h, int i) { return inp[(b * T + t) * W + h * HS + i]; };
  auto k = [&](int b, int t, int h, int i) {
    return inp[(b * T + t) * W + (NH + h / group) * HS + i];
  };
  auto v = [&](int b, int t, int h, int i) {
    return inp[(b * T + t) * W + (NH + KVH + h / group) * HS + i];
  };
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        dvec score(t + 1);
        double denom = 0.0;
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0.0;
          for (int i = 0; i < HS; i++) dot += q(b, t, h, i) * k(b, t2, h, i);
          score[t2] = std::exp(dot / std::sqrt(static_cast<double>(HS)));
          denom += score[t2];
        }
        for (int t2 = 0; t2 <= t; t2++) {
          const double a = score[t2] / denom;
          if (att) (*att)[((b * NH + h) * T + t) * T + t2] = a;
          for (int i = 0; i < HS; i++) out[(b * T + t) * C + h * HS + i] += a * v(b, t2, h, i);
        }
      }
    }
  }
  return out;
}

dvec ref_rmsnorm(const dvec &inp, const dvec &weight, int N, int C, double eps) {
  dvec out(inp.size());
  for (int n = 0; n < N; n++) {
    double squares = 0.0;
    for (int i = 0; i < C; i++) squares += inp[n * C + i] * inp[n * C + i];
    const double s = 1.0 / std::sqrt(squares / C + eps);
    for (int i = 0; i < C; i++) out[n * C + i] = inp[n * C + i] * s * weight[i];
  }
  return out;
}

dvec ref_swiglu(const dvec &inp, int N, int F) {
  dvec out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; n++) {
    for (int f = 0; f < F; f++) {
      const double g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
      out[n * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  return out;
}

dvec ref_rope(const dvec &x, const dvec &inv_freq, int B, int T, int heads, int HS, int stride) {
  dvec out = x;
  const int half = HS / 2;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < heads; h++) {
        const int at = (b * T + t) * stride + h * HS;
        for (int i = 0; i < half; i++) {
          const double angle = t * inv_freq[i];
          const double lo = x[at + i], hi = x[at + i + half];
          out[at + i] = lo * std::cos(angle) - hi * std::sin(angle);
          out[at + i + half] = hi * std::cos(angle) + lo * std::sin(angle);
        }
      }
    }
  }
  return out;
}

dvec ref_embedding(const std::vector<int32_t> &tokens, const dvec &wte, const dvec &wpe, int B,
                   int T, int C) {
  dvec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int i = 0; i < C; i++) {
        out[(b * T + t) * C + i] = wte[tokens[b * T + t] * C + i] + wpe[t * C + i];
      }
    }
  }
  return out;
}

dvec ref_cross_entropy(const dvec &logits, const std::vector<int32_t> &targets, int N, int V,
                       int Vp, dvec *probs) {
  dvec losses(N);
  if (probs) probs->assign(static_cast<size_t>(N) * Vp, 0.0);
  for (int r = 0; r < N; r++) {
    double denom = 0.0;
    for (int i = 0; i < V; i++) denom += std::exp(logits[r * Vp + i]);
    losses[r] = -std::log(std::exp(logits[r * Vp + targets[r]]) / denom);
    if (probs) {
      for (int i = 0; i < V; i++) (*probs)[r * Vp + i] = std::exp(logits[r * Vp + i]) / denom;
    }
  }
  return losses;
}

dvec ref_gpt_block(const dvec &inp, const dvec &params, int B, int T, int C, int NH, int F) {
  const int BT = B * T;
  size_t at = 0;
  auto take = [&](size_t n) {
    dvec piece(params.begin() + at, params.begin() + at + n);
    at += n;
    return piece;
  };
  const dvec ln1w = take(C), ln1b = take(C);
  const dvec qkvw = take(3 * C * C), qkvb = take(3 * C);
  const dvec attprojw = take(C * C), attprojb = take(C);
  const dvec ln2w = take(C), ln2b = take(C);
  const dvec fcw = take(F * C), fcb = take(F);
  const dvec fcprojw = take(C * F), fcprojb = take(C);

  const double eps = 1e-5;
  const dvec ln1 = ref_layernorm(inp, ln1w, ln1b, BT, C, eps);
  const dvec qkv = ref_matmul(ln1, qkvw, qkvb, BT, C, 3 * C);
  const dvec atty = ref_attention(qkv, B, T, NH, C / NH);
  const dvec attproj = ref_matmul(atty, attprojw, attprojb, BT, C, C);
  dvec residual2(inp.size());
  for (size_t i = 0; i < inp.size(); i++) residual2[i] = inp[i] + attproj[i];
  const dvec ln2 = ref_layernorm(residual2, ln2w, ln2b, BT, C, eps);
  const dvec fch_gelu = ref_gelu(ref_matmul(ln2, fcw, fcb, BT, C, F));
  const dvec fcproj = ref_matmul(fch_gelu, fcprojw, fcprojb, BT, F, C);
  dvec out(inp.size());
  for (size_t i = 0; i < inp.size(); i++) out[i] = residual2[i] + fcproj[i];
  return out;
}

}  // namespace mp_test
