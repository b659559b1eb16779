// tests/layers/finite_difference.h — the yardstick every backward in layers/ is measured with:
// central finite differences of a scalar loss, taken in double precision.
//
// A test runs the float forward under test and reduces its output to a double loss, usually
// sum(out * w) with fixed random weights w, so d(loss)/d(out) = w is what it feeds the backward.
// central_differences nudges one input element at a time and re-evaluates that loss; the
// analytic gradient from the backward must then match within a tolerance (Tolerance, below).
#ifndef MPENGINE_TESTS_LAYERS_FINITE_DIFFERENCE_H
#define MPENGINE_TESTS_LAYERS_FINITE_DIFFERENCE_H

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace mp_test {

// Pseudo-random numbers from splitmix64, so test inputs are the same on every machine and
// standard library (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  float uniform(float lo, float hi);  // in [lo, hi)
  int below(int n);                   // in [0, n)
  std::vector<float> uniform_vector(size_t n, float lo, float hi);

 private:
  uint64_t state_;
};

// sum_i out[i] * weights[i] in double: a scalar loss whose gradient with respect to out is weights.
double weighted_sum(const float *out, const float *weights, size_t n);

// d(loss)/d(x[i]) for each of the n elements of x. For each i, x[i] is set to x[i] + h and to
// x[i] - h in turn and loss() is called, which must run the forward again from x. The difference
// of the two losses is divided by the difference of the two float values actually stored, so
// the rounding of x[i] +- h to float does not enter the quotient. x[i] is restored bit for bit.
std::vector<double> central_differences(float *x, size_t n, float h,
                                        const std::function<double()> &loss);

// How close an analytic gradient must be to the numeric one. Element i passes when
//   |analytic[i] - numeric[i]| <= rel * |numeric[i]| + abs * max_j |numeric[j]|.
// abs is relative to the tensor's largest gradient, so a tensor of small gradients (the mean
// cross-entropy's 1/(B*T)) is held to the same standard as one of large gradients.
struct Tolerance {
  double rel;
  double abs;
};

// The step and tolerance for float32 forwards on inputs of size about 1. Two errors pull on h:
// the forward rounds each output at about 6e-8 of its size, and dividing by 2h turns that into
// noise of order 1e-7 / h of the gradient's scale; truncation of the central difference grows as
// h^2 times the third derivative. Measured over these tests, the worst element used 24% of the
// tolerance below at h = 1e-3 (rounding noise: up to 7e-4 of the largest gradient), 13% at
// h = 1e-2 (truncation), and 8% at h = 3e-3, the step chosen.
// 1e-2 relative plus 1e-3 of the largest gradient still fails a gradient that is 5% off or that
// lacks a term (finite_difference_test), which is what a wrong backward looks like.
constexpr float kStep = 3e-3f;
constexpr Tolerance kFloatTolerance = {1e-2, 1e-3};

// Passes when analytic (n floats) matches numeric element by element within tol, and numeric is
// not all zero (a check against zeros checks nothing). On failure says which tensor, how many
// elements failed, and the worst one.
::testing::AssertionResult GradientsMatch(const char *name, const float *analytic,
                                          const std::vector<double> &numeric, Tolerance tol);

// Convenience: central_differences of loss over x, then GradientsMatch against analytic.
::testing::AssertionResult GradientMatchesFiniteDifferences(const char *name, float *x, size_t n,
                                                            const float *analytic,
                                                            const std::function<double()> &loss,
                                                            Tolerance tol = kFloatTolerance,
                                                            float h = kStep);

// The values as doubles, for the double-precision references.
std::vector<double> to_double(const float *x, size_t n);
inline std::vector<double> to_double(const std::vector<float> &x) {
  return to_double(x.data(), x.size());
}

// Passes when |actual[i] - expected[i]| <= tol * (1 + |expected[i]|) for all i; names the worst.
::testing::AssertionResult NearlyEqual(const char *name, const float *actual,
                                       const std::vector<double> &expected, double tol);

}  // namespace mp_test

#endif  // MPENGINE_TESTS_LAYERS_FINITE_DIFFERENCE_H
