// tests/layers/finite_difference.cc — central differences and gradient comparison; see
// finite_difference.h.
#include "tests/layers/finite_difference.h"

#include <cmath>
#include <sstream>

namespace mp_test {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float Rng::uniform(float lo, float hi) {
  // 24 random bits: every value is exactly representable in float.
  const float unit = static_cast<float>(next() >> 40) / 16777216.0f;
  return lo + (hi - lo) * unit;
}

int Rng::below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }

std::vector<float> Rng::uniform_vector(size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (float &x : v) x = uniform(lo, hi);
  return v;
}

double weighted_sum(const float *out, const float *weights, size_t n) {
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += static_cast<double>(out[i]) * weights[i];
  return sum;
}

std::vector<double> central_differences(float *x, size_t n, float h,
                                        const std::function<double()> &loss) {
  std::vector<double> grad(n);
  for (size_t i = 0; i < n; i++) {
    const float saved = x[i];
    const float plus = saved + h;
    const float minus = saved - h;
    x[i] = plus;
    const double loss_plus = loss();
    x[i] = minus;
    const double loss_minus = loss();
    x[i] = saved;
    grad[i] = (loss_plus - loss_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
  }
  return grad;
}

::testing::AssertionResult GradientsMatch(const char *name, const float *analytic,
                                          const std::vector<double> &numeric, Tolerance tol) {
  double scale = 0.0;
  for (double g : numeric) scale = std::fmax(scale, std::fabs(g));
  if (scale == 0.0) {
    return ::testing::AssertionFailure()
           << name << ": the numeric gradient is all zero, so the check would prove nothing";
  }
  size_t failures = 0;
  size_t worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < numeric.size(); i++) {
    const double err = std::fabs(analytic[i] - numeric[i]);
    const double allowed = tol.rel * std::fabs(numeric[i]) + tol.abs * scale;
    if (!(err <= allowed)) failures++;  // NaN fails too
    const double excess = std::isnan(err) ? INFINITY : err / allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << failures << " of " << numeric.size()
         << " gradient elements differ from central differences; worst at [" << worst
         << "]: backward " << analytic[worst] << ", finite difference " << numeric[worst]
         << " (allowed " << tol.rel << " relative + " << tol.abs * scale << " absolute)";
}

::testing::AssertionResult GradientMatchesFiniteDifferences(const char *name, float *x, size_t n,
                                                            const float *analytic,
                                                            const std::function<double()> &loss,
                                                            Tolerance tol, float h) {
  return GradientsMatch(name, analytic, central_differences(x, n, h, loss), tol);
}

std::vector<double> to_double(const float *x, size_t n) { return std::vector<double>(x, x + n); }

::testing::AssertionResult NearlyEqual(const char *name, const float *actual,
                                       const std::vector<double> &expected, double tol) {
  size_t failures = 0;
  size_t worst = 0;
  double worst_err = -1.0;
  for (size_t i = 0; i < expected.size(); i++) {
    const double err = std::fabs(actual[i] - expected[i]) / (1.0 + std::fabs(expected[i]));
    if (!(err <= tol)) failures++;
    if (std::isnan(err) || err > worst_err) {
      worst_err = std::isnan(err) ? INFINITY : err;
      worst = i;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << failures << " of " << expected.size()
         << " values differ from the double reference; worst at [" << worst << "]: got "
         << actual[worst] << ", expected " << expected[worst] << " (tolerance " << tol << ")";
}

}  // namespace mp_test
