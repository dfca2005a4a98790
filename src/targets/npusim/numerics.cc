#include "targets/npusim/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/sanitize.h"

namespace tessera::npusim {

float exp2_bf16(float x) {
  if (std::isnan(x)) return x;
  x = std::clamp(x, -200.0f, 127.0f);
  const float k = std::nearbyint(x);
  const float f = round_bf16(x - k);  // |f| <= 1/2, bf16 operand of the MACs
  // Cubic for 2^f on [-1/2, 1/2] (Taylor-like coefficients as the kernel uses), each Horner
  // step leaving the accumulator as bf16 before it is multiplied again.
  float t = round_bf16(0.0555041087f * f + 0.2402265069f);
  t = round_bf16(t * f + 0.6931471805f);
  t = t * f + 1.0f;  // fp32 accumulator
  int32_t bits;
  std::memcpy(&bits, &t, 4);
  bits += int32_t(k) * (1 << 23);  // 2^k into the exponent field
  if (bits <= (1 << 23)) return 0.0f;  // below the normal range: +0, as the kernel clamps
  float r;
  std::memcpy(&r, &bits, 4);
  return round_bf16(r);
}

float exp_bf16(float x) { return exp2_bf16(round_bf16(x) * kLog2eBf16); }

float rsqrt_approx(float x) {
  int32_t i;
  std::memcpy(&i, &x, 4);
  i = 0x5f3759df - (i >> 1);
  float y;
  std::memcpy(&y, &i, 4);
  return y * (1.5f - 0.5f * x * y * y);
}

float tanh_bf16(float x) {
  const float a = std::fabs(x);
  const float e = exp2_bf16(2.0f * a * 1.4426950409f);  // e^(2|x|)
  const float t = 1.0f - 2.0f / (1.0f + e);
  return round_bf16(x < 0 ? -t : t);
}

float silu_bf16(float x) {
  const float half = round_bf16(x * 0.5f);
  const float th = tanh_bf16(half);
  const float sig = round_bf16(round_bf16(th + 1.0f) * 0.5f);
  return round_bf16(x * sig);
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(in[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
}

void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = tessera::f32_to_bf16(in[i]);
}

// Run-time dispatched clones (the default build targets baseline x86-64): the 32 lanes
// vectorize as they are, so every clone adds in the same order and gives the same bits.
// Not under ThreadSanitizer: the clones' ifunc resolver runs during relocation, before the
// TSan runtime is up, and its instrumented code crashes there (tools/tsan.sh).
#if defined(__SANITIZE_THREAD__)
#define TS_DOT_CLONES
#else
#define TS_DOT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
TS_DOT_CLONES TS_RANGE_CHECKED float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  const size_t bytes = size_t(std::max<int64_t>(n, 0)) * sizeof(uint16_t);
  check_range(a, bytes, false);
  check_range(b, bytes, false);
  constexpr int kLanes = 32;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const uint32_t ua = uint32_t(a[i + l]) << 16, ub = uint32_t(b[i + l]) << 16;
      float fa, fb;
      std::memcpy(&fa, &ua, 4);
      std::memcpy(&fb, &ub, 4);
      acc[l] += fa * fb;
    }
  for (int l = 0; i < n; ++i, ++l) acc[l] += tessera::bf16_to_f32(a[i]) * tessera::bf16_to_f32(b[i]);
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

void mmul_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t k, int64_t n) {
  constexpr int64_t kMaxN = 1024;
  float brow[kMaxN];
  for (int64_t j0 = 0; j0 < n; j0 += kMaxN) {
    const int64_t nn = std::min(kMaxN, n - j0);
    for (int64_t p = 0; p < k; ++p) {
      bf16_to_f32(b + p * n + j0, brow, nn);
      for (int64_t i = 0; i < m; ++i) {
        const float av = tessera::bf16_to_f32(a[i * k + p]);
        float* ci = c + i * n + j0;
        for (int64_t j = 0; j < nn; ++j) ci[j] += av * brow[j];
      }
    }
  }
}

}  // namespace tessera::npusim
