// tests/common/float16_test.cc — the one host definition of bf16 and fp16 rounding: every 16-bit
// pattern round-trips, random floats round to the nearest value (ties to even), and the edges
// (NaN, infinities, overflow, subnormals) give the bits torch's scalar conversions give.
#include "common/float16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

namespace {

float from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0; }
bool fp16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }

TEST(Float16, EveryBf16PatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float wide = mp_float16_bf16_to_float((uint16_t)h);
    EXPECT_EQ(to_bits(wide), h << 16) << std::hex << h;
    const uint16_t back = mp_float16_bf16_from_float(wide);
    if (bf16_is_nan((uint16_t)h)) {
      EXPECT_EQ(back, (h & 0x8000) | 0x7fc0) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Float16, EveryFp16PatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float wide = mp_float16_fp16_to_float((uint16_t)h);
    const uint16_t back = mp_float16_fp16_from_float(wide);
    if (fp16_is_nan((uint16_t)h)) {
      EXPECT_TRUE(std::isnan(wide)) << std::hex << h;
      EXPECT_EQ(back, (h & 0x8000) | 0x7e00) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

// A finite x rounds to one of the two neighbouring 16-bit values, the nearer, ties to the even one.
template <typename From, typename To>
void expect_nearest(float x, From from_float, To to_float, const char *what) {
  const uint16_t r = from_float(x);
  const double got = to_float(r);
  if (std::isinf(got)) return;  // overflow is checked at the edges
  const double error = std::fabs((double)x - got);
  for (int step : {-1, 1}) {
    const uint16_t other_bits = (uint16_t)(r + step);
    const double other = to_float(other_bits);
    if (std::isnan(other) || ((r ^ other_bits) & 0x8000)) continue;  // past the sign or inf
    const double other_error = std::fabs((double)x - other);
    ASSERT_LE(error, other_error) << what << " " << std::hexfloat << x;
    if (error == other_error) {
      ASSERT_EQ(r & 1, 0) << what << " tie " << std::hexfloat << x;
    }
  }
}

TEST(Float16, RandomFloatsRoundToNearestEven) {
  std::mt19937 rng(20240520);
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits((uint32_t)rng());
    if (!std::isfinite(x)) continue;
    expect_nearest(x, mp_float16_bf16_from_float, mp_float16_bf16_to_float, "bf16");
    if (std::fabs(x) < 65504.0f) {
      expect_nearest(x, mp_float16_fp16_from_float, mp_float16_fp16_to_float, "fp16");
    }
  }
}

TEST(Float16, Bf16Edges) {
  EXPECT_EQ(mp_float16_bf16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x3f808000u)), 0x3f80);  // tie, to even
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x3f818000u)), 0x3f82);  // tie, to even
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX: inf
  EXPECT_EQ(mp_float16_bf16_from_float(INFINITY), 0x7f80);
  EXPECT_EQ(mp_float16_bf16_from_float(-INFINITY), 0xff80);
  EXPECT_EQ(mp_float16_bf16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x00000001u)), 0x0000);
  // NaN: the canonical quiet NaN with its sign, whatever the payload.
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0xffc00000u)), 0xffc0);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x7f800001u)), 0x7fc0);  // signalling
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0xffffffffu)), 0xffc0);
  EXPECT_EQ(mp_float16_bf16_from_float(from_bits(0x7fa5a5a5u)), 0x7fc0);
}

TEST(Float16, Fp16Edges) {
  EXPECT_EQ(mp_float16_fp16_from_float(1.0f), 0x3c00);
  EXPECT_EQ(mp_float16_fp16_from_float(65504.0f), 0x7bff);
  EXPECT_EQ(mp_float16_fp16_from_float(65519.996f), 0x7bff);
  EXPECT_EQ(mp_float16_fp16_from_float(65520.0f), 0x7c00);  // half-way past the largest: inf
  EXPECT_EQ(mp_float16_fp16_from_float(-1e30f), 0xfc00);
  EXPECT_EQ(mp_float16_fp16_from_float(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(mp_float16_fp16_from_float(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(mp_float16_fp16_from_float(std::ldexp(1.0f, -25)), 0x0000);  // tie, to even (zero)
  EXPECT_EQ(mp_float16_fp16_from_float(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(mp_float16_fp16_from_float(std::ldexp(3.0f, -25)), 0x0002);  // tie 1.5 ulp: to even
  EXPECT_EQ(mp_float16_fp16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(mp_float16_fp16_from_float(from_bits(0x7fc00000u)), 0x7e00);
  EXPECT_EQ(mp_float16_fp16_from_float(from_bits(0xff800001u)), 0xfe00);
  EXPECT_EQ(mp_float16_fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(mp_float16_fp16_to_float(0x7c00), INFINITY);
  EXPECT_EQ(to_bits(mp_float16_fp16_to_float(0x8000)), 0x80000000u);
}

TEST(Float16, BulkConversionsMatchScalar) {
  const float in[] = {1.0f, -2.5f, from_bits(0x3f808000u), from_bits(0xff800001u), 3e38f, 0.0f};
  uint16_t bits[6];
  float back[6];
  mp_float16_bf16_from_floats(bits, in, 6);
  mp_float16_bf16_to_floats(back, bits, 6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(bits[i], mp_float16_bf16_from_float(in[i])) << i;
    EXPECT_EQ(to_bits(back[i]), (uint32_t)bits[i] << 16) << i;
  }
}

}  // namespace
