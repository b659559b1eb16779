// tests/layers/cuda_testing.cc — host helpers of the CUDA kernel tests; see cuda_testing.h.
#include "tests/layers/cuda_testing.h"

namespace mp_test {

std::vector<float> RoundToBf16(std::vector<float> values) {
  for (float &v : values) v = mp_bf16_to_float(mp_bf16_from_float(v));
  return values;
}

std::vector<mp_bf16> ToBf16(const std::vector<float> &values) {
  std::vector<mp_bf16> out(values.size());
  mp_bf16_from_floats(out.data(), values.data(), values.size());
  return out;
}

std::vector<float> ToFloat(const std::vector<mp_bf16> &values) {
  std::vector<float> out(values.size());
  mp_bf16_to_floats(out.data(), values.data(), values.size());
  return out;
}

std::vector<float> Plus(const std::vector<float> &a, const std::vector<float> &b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); i++) out[i] = a[i] + b[i];
  return out;
}

double MaxRelErr(const std::vector<float> &gpu, const std::vector<float> &cpu) {
  if (gpu.size() != cpu.size()) return NAN;
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < gpu.size(); i++) {
    if (!std::isfinite(gpu[i])) return NAN;
    max_diff = std::fmax(max_diff, std::fabs((double)gpu[i] - cpu[i]));
    max_ref = std::fmax(max_ref, std::fabs((double)cpu[i]));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

::testing::AssertionResult WithinTolerance(const std::string &name, const std::vector<float> &gpu,
                                           const std::vector<float> &cpu, double tolerance) {
  const double err = MaxRelErr(gpu, cpu);
  std::printf("kernel %s: max rel err %.3e (tolerance %.1e)\n", name.c_str(), err, tolerance);
  std::fflush(stdout);
  if (err <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": max rel err " << err << " exceeds " << tolerance
         << (std::isnan(err) ? " (a NaN or infinity, or an element never written)" : "");
}

std::vector<float> Part(const std::vector<float> &qkv, int part, int BT, int C) {
  std::vector<float> out((size_t)BT * C);
  for (int r = 0; r < BT; r++) {
    std::memcpy(&out[(size_t)r * C], &qkv[(size_t)r * 3 * C + (size_t)part * C],
                (size_t)C * sizeof(float));
  }
  return out;
}

std::vector<float> QkvPart(const std::vector<float> &qkv, int part, int BT, int NH, int KVH,
                           int HS) {
  const size_t W = (size_t)(NH + 2 * KVH) * HS;
  const size_t first = part == 0 ? 0 : (size_t)(part == 1 ? NH : NH + KVH) * HS;
  const size_t width = (size_t)(part == 0 ? NH : KVH) * HS;
  std::vector<float> out((size_t)BT * width);
  for (int r = 0; r < BT; r++) {
    std::memcpy(&out[r * width], &qkv[r * W + first], width * sizeof(float));
  }
  return out;
}

std::vector<float> SumGroups(const std::vector<float> &repeated, int BT, int NH, int KVH, int HS) {
  std::vector<float> summed((size_t)BT * KVH * HS, 0.0f);
  for (int r = 0; r < BT; r++) {
    for (int h = 0; h < NH; h++) {
      for (int i = 0; i < HS; i++) {
        summed[((size_t)r * KVH + h / (NH / KVH)) * HS + i] +=
            repeated[((size_t)r * NH + h) * HS + i];
      }
    }
  }
  return summed;
}

}  // namespace mp_test
