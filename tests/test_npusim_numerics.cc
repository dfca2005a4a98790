// npusim numerics: the AIE approximations stay within the error bounds numerics.h states,
// and are really approximations (not the exact functions in disguise).
#include <gtest/gtest.h>

#include <cmath>

#include "targets/npusim/numerics.h"

namespace tessera::npusim {
namespace {

TEST(NpusimNumerics, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(round_bf16(1.0f + 0.00390625f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * 0.00390625f), 1.0f + 4 * 0.00390625f);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
}

TEST(NpusimNumerics, Exp2AndExpWithinTheirBounds) {
  double worst2 = 0, worst = 0, worst_exact = 0;
  for (float x = -30.0f; x <= 30.0f; x += 0.0137f) {
    const double e2 = std::exp2(double(x));
    const double r2 = std::fabs(exp2_bf16(x) - e2) / e2;
    worst2 = std::max(worst2, r2);
    const float xb = round_bf16(x);
    const double e = std::exp(double(xb));
    const double r = std::fabs(exp_bf16(xb) - e) / e;
    EXPECT_LE(r, exp_rel_bound(xb)) << "x = " << xb;
    worst = std::max(worst, r);
    worst_exact = std::max(worst_exact, std::fabs(round_bf16(float(e)) - e) / e);
  }
  EXPECT_LE(worst2, kExp2RelBound);
  // It is an approximation: worse than exact-then-rounded, as the device's is.
  EXPECT_GT(worst, worst_exact);
  EXPECT_EQ(exp2_bf16(-150.0f), 0.0f);
  EXPECT_EQ(exp_bf16(0.0f), 1.0f);
}

TEST(NpusimNumerics, RsqrtWithinItsBound) {
  double worst = 0;
  for (float x = 1e-6f; x < 1e6f; x *= 1.0137f) {
    const double e = 1.0 / std::sqrt(double(x));
    worst = std::max(worst, std::fabs(rsqrt_approx(x) - e) / e);
  }
  EXPECT_LE(worst, kRsqrtRelBound);
  EXPECT_GT(worst, 1e-5);  // one Newton step, not the exact value
}

TEST(NpusimNumerics, TanhAndSiluWithinTheirBounds) {
  for (float x = -20.0f; x <= 20.0f; x += 0.0113f) {
    const float xb = round_bf16(x);
    EXPECT_LE(std::fabs(tanh_bf16(xb) - std::tanh(double(xb))), kTanhAbsBound) << xb;
    const double silu = double(xb) / (1.0 + std::exp(-double(xb)));
    EXPECT_LE(std::fabs(silu_bf16(xb) - silu), kSiluRelBound * std::fabs(double(xb)) + 1e-6) << xb;
  }
  EXPECT_EQ(silu_bf16(0.0f), 0.0f);
}

TEST(NpusimNumerics, VectorHelpersAccumulateInFp32) {
  std::vector<uint16_t> a(100), b(100);
  double ref = 0;
  for (int i = 0; i < 100; ++i) {
    a[size_t(i)] = f32_to_bf16(0.01f * float(i));
    b[size_t(i)] = f32_to_bf16(1.0f - 0.003f * float(i));
    ref += double(bf16_to_f32(a[size_t(i)])) * bf16_to_f32(b[size_t(i)]);
  }
  EXPECT_NEAR(dot_bf16(a.data(), b.data(), 100), ref, 1e-4);
  std::vector<float> c(4, 1.0f);  // [2,2] += [2,50] x [50,2]
  mmul_bf16(a.data(), b.data(), c.data(), 2, 50, 2);
  double c00 = 1;
  for (int p = 0; p < 50; ++p) c00 += double(bf16_to_f32(a[size_t(p)])) * bf16_to_f32(b[size_t(p * 2)]);
  EXPECT_NEAR(c[0], c00, 1e-4);
}

}  // namespace
}  // namespace tessera::npusim
