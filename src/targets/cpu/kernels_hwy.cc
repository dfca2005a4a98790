// Highway-dispatched cpu kernels (AVX3, AVX2, SSE4, EMU128): the matmul fallback for CPUs
// without AVX-512 BF16 (bf16 GEMM, quantized GEMV), and the element-wise kernels and
// attention for every CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "targets/cpu/kernels_internal.h"
#include "targets/cpu/quant.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3)  // SSE4 covers the same machines' era well enough
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "targets/cpu/kernels_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU32 = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;

int64_t CurrentTarget() { return HWY_TARGET; }

// ---------------------------------------------------------------- activation quantization
// Q8Row::quantize's arithmetic (cpu/quant.h) on vectors: the same products and
// round-to-nearest-even steps per value, so every target writes the plain loop's bytes. It runs
// once per GEMV ahead of the weights' pass (each activation row on one thread): as scalar code
// it took 3.3 ns per value (about 8% of the default model's decode step). The portable form,
// one block at a time; AVX-512 targets take QuantizeQ8Avx512 below.
void QuantizeQ8Blocks(const float* x, int64_t blocks, float* d, int32_t* sum_hi, int32_t* sum_lo, int8_t* hi,
                      int8_t* lo) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, decltype(di)> d8;
  const size_t L = hn::Lanes(df);  // 4..16: a 16-value half is whole vectors
  const VF lo_scale = hn::Set(df, 254.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    VF vmax = hn::Zero(df);
    auto finite = hn::IsFinite(hn::LoadU(df, xb));
    for (size_t k = 0; k < 32; k += L) {
      const VF v = hn::LoadU(df, xb + k);
      vmax = hn::Max(vmax, hn::Abs(v));
      finite = hn::And(finite, hn::IsFinite(v));
    }
    int8_t* hb = hi + 32 * b;
    int8_t* lb = lo + 32 * b;
    if (!hn::AllTrue(df, finite)) {  // the block's scale is NaN and its terms 0 (see quant.cc)
      std::memset(hb, 0, 32);
      std::memset(lb, 0, 32);
      d[b] = std::numeric_limits<float>::quiet_NaN();
      sum_hi[2 * b] = sum_hi[2 * b + 1] = sum_lo[2 * b] = sum_lo[2 * b + 1] = 0;
      continue;
    }
    const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    const VF id = hn::Set(df, amax > 0 ? 127.0f / amax : 0.0f);
    for (int h = 0; h < 2; ++h) {
      auto acc_h = hn::Zero(di), acc_l = hn::Zero(di);
      for (size_t k = size_t(16 * h); k < size_t(16 * h + 16); k += L) {
        const VF v = hn::Mul(hn::LoadU(df, xb + k), id);
        const VF vh = hn::Round(v);
        const auto ih = hn::ConvertTo(di, vh);
        const auto il = hn::ConvertTo(di, hn::Round(hn::Mul(hn::Sub(v, vh), lo_scale)));
        acc_h = hn::Add(acc_h, ih);
        acc_l = hn::Add(acc_l, il);
        hn::StoreU(hn::DemoteTo(d8, ih), d8, hb + k);
        hn::StoreU(hn::DemoteTo(d8, il), d8, lb + k);
      }
      sum_hi[2 * b + h] = hn::GetLane(hn::SumOfLanes(di, acc_h));
      sum_lo[2 * b + h] = hn::GetLane(hn::SumOfLanes(di, acc_l));
    }
    d[b] = amax / 127.0f;
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// AVX-512: 16 blocks at a time. Their 16 maxima of |x| come out of one transposing reduction
// (integer max on the bit patterns: the float order for non-negative values, and NaN's and
// infinity's patterns above every finite one), so one division serves 16 scales; each
// half-block's sums come from a byte SAD. Per value the plain loop's operations: x * id,
// nearest-even conversions (the default rounding), (v - h) * 254. Q8Row::quantize of 8 rows of
// 2048 values in L1: 29 ns a block with the portable form (Highway's rounding and conversion
// guards, a horizontal reduction per maximum and per sum), 7 with this.
inline __m512i Max16x16(__m512i m[16]) {  // lane i: the maximum of m[i]'s lanes (m clobbered)
  for (int i = 0; i < 8; ++i)  // lanes 0-7: block 2i's partial maxima, 8-15: 2i + 1's
    m[i] = _mm512_max_epi32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x44),
                            _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane q: block 4i + q's 4 partial maxima
    m[i] = _mm512_max_epi32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x88),
                            _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // lane q, dwords 0-1: block 8i + q's 2, dwords 2-3: 8i + 4 + q's
    m[i] = _mm512_max_epi32(_mm512_unpacklo_epi64(m[2 * i], m[2 * i + 1]), _mm512_unpackhi_epi64(m[2 * i], m[2 * i + 1]));
  const __m512 a = _mm512_castsi512_ps(m[0]), b = _mm512_castsi512_ps(m[1]);
  const __m512i r = _mm512_max_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                                     _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
  // Lane 4q + j holds block q + 4j: back to block order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, r);
}

void QuantizeQ8Avx512(const float* x, int64_t blocks, float* d, int32_t* sum_hi, int32_t* sum_lo, int8_t* hi,
                      int8_t* lo) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf_bits = _mm512_set1_epi32(0x7F800000);
  const __m512 lo_scale = _mm512_set1_ps(254.0f);
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const __m512i sum_order = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  alignas(64) float ids[16];
  int64_t b0 = 0;
  for (; b0 + 16 <= blocks; b0 += 16) {
    const float* xb = x + 32 * b0;
    __m512i m[16];
    for (int i = 0; i < 16; ++i)
      m[i] = _mm512_max_epi32(_mm512_and_si512(_mm512_loadu_si512(xb + 32 * i), abs_mask),
                              _mm512_and_si512(_mm512_loadu_si512(xb + 32 * i + 16), abs_mask));
    const __m512i amax_bits = Max16x16(m);
    const __mmask16 finite = _mm512_cmplt_epi32_mask(amax_bits, inf_bits);
    const __mmask16 scaled = finite & _mm512_cmpgt_epi32_mask(amax_bits, _mm512_setzero_si512());
    const __m512 amax = _mm512_castsi512_ps(amax_bits);
    _mm512_store_ps(ids, _mm512_maskz_div_ps(scaled, _mm512_set1_ps(127.0f), amax));
    _mm512_storeu_ps(d + b0, _mm512_mask_blend_ps(finite, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                                                  _mm512_div_ps(amax, _mm512_set1_ps(127.0f))));
    for (int i = 0; i < 16; ++i) {
      const int64_t b = b0 + i;
      int8_t* hb = hi + 32 * b;
      int8_t* lb = lo + 32 * b;
      if (!((finite >> i) & 1)) {  // a non-finite block: the portable form's treatment
        QuantizeQ8Blocks(xb + 32 * i, 1, d + b, sum_hi + 2 * b, sum_lo + 2 * b, hb, lb);
        continue;
      }
      const __m512 id = _mm512_set1_ps(ids[i]);
      __m128i t[4];  // hi 0-15, hi 16-31, lo 0-15, lo 16-31
      for (int h = 0; h < 2; ++h) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + 32 * i + 16 * h), id);
        const __m512i ih = _mm512_cvtps_epi32(v);  // nearest even: v is within +-127
        const __m512 r = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_cvtepi32_ps(ih)), lo_scale);
        t[h] = _mm512_cvtepi32_epi8(ih);
        t[2 + h] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hb), t[0]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hb + 16), t[1]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lb), t[2]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lb + 16), t[3]);
      // The four 16-byte sums: SAD of the biased bytes (two 8-byte sums a 16), paired up.
      __m512i all = _mm512_castsi128_si512(t[0]);
      all = _mm512_inserti32x4(all, t[1], 1);
      all = _mm512_inserti32x4(all, t[2], 2);
      all = _mm512_inserti32x4(all, t[3], 3);
      const __m512i sad = _mm512_sad_epu8(_mm512_xor_si512(all, bias), _mm512_setzero_si512());
      const __m512i pairs = _mm512_add_epi64(sad, _mm512_shuffle_epi32(sad, _MM_PERM_BADC));
      const __m128i sums = _mm_sub_epi32(_mm512_castsi512_si128(_mm512_permutexvar_epi32(sum_order, pairs)),
                                         _mm_set1_epi32(16 * 128));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(sum_hi + 2 * b), sums);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(sum_lo + 2 * b), _mm_unpackhi_epi64(sums, sums));
    }
  }
  if (b0 < blocks) QuantizeQ8Blocks(x + 32 * b0, blocks - b0, d + b0, sum_hi + 2 * b0, sum_lo + 2 * b0, hi + 32 * b0,
                                    lo + 32 * b0);
}
#endif

void QuantizeQ8(const float* x, int64_t blocks, float* d, int32_t* sum_hi, int32_t* sum_lo, int8_t* hi,
                int8_t* lo) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  QuantizeQ8Avx512(x, blocks, d, sum_hi, sum_lo, hi, lo);
#else
  QuantizeQ8Blocks(x, blocks, d, sum_hi, sum_lo, hi, lo);
#endif
}

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------- matmul
// Activations are rearranged per block of 2L values (L = f32 lanes) into [even | odd] halves,
// so a u32 load of 2L bf16 weights splits into two f32 vectors with a shift and a mask, no
// shuffles: acc += x_even * (w << 16) + x_odd * (w & 0xFFFF0000). Accumulation is fp32 with
// fp32 activations (no rounding of x).
template <int MR, int NR>
HWY_NOINLINE void MatmulTile(const float* xe, int64_t xes, const float* x, int64_t K, const uint16_t* w,
                             int64_t Kv, float* y, int64_t N, const float* bias) {
  const DF df;
  const DU32 du;
  const size_t L = hn::Lanes(df);
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  VF acc[MR][NR];
  for (int t = 0; t < MR; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(df);
  for (int64_t k = 0; k < Kv; k += int64_t(2 * L)) {
    VF we[NR], wo[NR];
    for (int r = 0; r < NR; ++r) {
      const auto wv = hn::LoadU(du, reinterpret_cast<const uint32_t*>(w + r * K + k));
      we[r] = hn::BitCast(df, hn::ShiftLeft<16>(wv));
      wo[r] = hn::BitCast(df, hn::And(wv, hi_mask));
    }
    for (int t = 0; t < MR; ++t) {
      const VF xv_e = hn::LoadU(df, xe + t * xes + k);
      const VF xv_o = hn::LoadU(df, xe + t * xes + k + L);
      for (int r = 0; r < NR; ++r) {
        acc[t][r] = hn::MulAdd(xv_e, we[r], acc[t][r]);
        acc[t][r] = hn::MulAdd(xv_o, wo[r], acc[t][r]);
      }
    }
  }
  for (int t = 0; t < MR; ++t)
    for (int r = 0; r < NR; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
      for (int64_t k = Kv; k < K; ++k) s += x[t * K + k] * bf16_to_f32(w[r * K + k]);
      y[t * N + r] = bias ? s + bias[r] : s;
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, const uint16_t*, int64_t, float*, int64_t,
                        const float*);
constexpr int kMR = 4, kNR = 2;
const TileFn kTiles[kMR][kNR] = {
    {&MatmulTile<1, 1>, &MatmulTile<1, 2>},
    {&MatmulTile<2, 1>, &MatmulTile<2, 2>},
    {&MatmulTile<3, 1>, &MatmulTile<3, 2>},
    {&MatmulTile<4, 1>, &MatmulTile<4, 2>},
};

// Weight row wr against RT activation rows (xe[t] rearranged as Matmul does, x[t] as given),
// each exactly the one-row GEMV's sums whatever RT is: four accumulators over steps of 4L
// values, then 2L, reduced as (a0 + a1) + (a2 + a3), then the tail; the weights are loaded
// once for the RT rows.
template <int RT>
HWY_INLINE void GemvRowBf16(const float* const* xe, const float* const* x, const uint16_t* wr, int64_t K,
                            int64_t Kv, float* const* y, int64_t n, const float* bias) {
  const DF df;
  const DU32 du;
  const int64_t L = int64_t(hn::Lanes(df));
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  VF a0[RT], a1[RT], a2[RT], a3[RT];
  for (int t = 0; t < RT; ++t) a0[t] = a1[t] = a2[t] = a3[t] = hn::Zero(df);
  int64_t k = 0;
  for (; k + 4 * L <= Kv; k += 4 * L) {
    const auto w0 = hn::LoadU(du, reinterpret_cast<const uint32_t*>(wr + k));
    const auto w1 = hn::LoadU(du, reinterpret_cast<const uint32_t*>(wr + k + 2 * L));
    const VF we0 = hn::BitCast(df, hn::ShiftLeft<16>(w0)), wo0 = hn::BitCast(df, hn::And(w0, hi_mask));
    const VF we1 = hn::BitCast(df, hn::ShiftLeft<16>(w1)), wo1 = hn::BitCast(df, hn::And(w1, hi_mask));
    for (int t = 0; t < RT; ++t) {
      a0[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k), we0, a0[t]);
      a1[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k + L), wo0, a1[t]);
      a2[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k + 2 * L), we1, a2[t]);
      a3[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k + 3 * L), wo1, a3[t]);
    }
  }
  for (; k < Kv; k += 2 * L) {
    const auto w0 = hn::LoadU(du, reinterpret_cast<const uint32_t*>(wr + k));
    const VF we0 = hn::BitCast(df, hn::ShiftLeft<16>(w0)), wo0 = hn::BitCast(df, hn::And(w0, hi_mask));
    for (int t = 0; t < RT; ++t) {
      a0[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k), we0, a0[t]);
      a1[t] = hn::MulAdd(hn::LoadU(df, xe[t] + k + L), wo0, a1[t]);
    }
  }
  for (int t = 0; t < RT; ++t) {
    float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0[t], a1[t]), hn::Add(a2[t], a3[t]))));
    for (int64_t kk = k; kk < K; ++kk) s += x[t][kk] * bf16_to_f32(wr[kk]);
    y[t][n] = bias ? s + bias[n] : s;
  }
}

// The decode GEMV of T <= kMaxGemvRows independent rows: each weight row is read from memory
// once for all of them (while it sits in L1), each row's result the one-row GEMV's.
void GemvRowsBf16(const float* xe, int64_t Kv, const float* x, int64_t T, const Bf16Matrix& w, const float* bias,
                  float* y, ThreadPool* pool) {
  const int64_t N = w.rows, K = w.cols;
  const int RT = hn::Lanes(DF()) >= 16 ? 4 : 2;  // rows whose accumulators fit beside the weights
  const float* xes[kMaxGemvRows];
  const float* xs[kMaxGemvRows];
  float* ys[kMaxGemvRows];
  for (int64_t t = 0; t < T; ++t) {
    xes[t] = xe + t * Kv;
    xs[t] = x + t * K;
    ys[t] = y + t * N;
  }
  // One weight row at a time, so the matrix is read as one sequential stream.
  const int64_t unit = 16;
  pool->parallel_for((N + unit - 1) / unit, [&](int64_t b, int64_t e) {
    for (int64_t n = b * unit; n < std::min(N, e * unit); ++n) {
      const uint16_t* wr = w.data + n * K;
      int64_t t = 0;
      if (RT >= 4)
        for (; t + 4 <= T; t += 4) GemvRowBf16<4>(xes + t, xs + t, wr, K, Kv, ys + t, n, bias);
      for (; t + 2 <= T; t += 2) GemvRowBf16<2>(xes + t, xs + t, wr, K, Kv, ys + t, n, bias);
      for (; t < T; ++t) GemvRowBf16<1>(xes + t, xs + t, wr, K, Kv, ys + t, n, bias);
    }
  });
}

// rows: each of the T rows computed as the one-row GEMV computes it (a batched decode step,
// T <= kMaxGemvRows); otherwise T > 1 runs the blocked GEMM.
void Matmul(const float* x, int64_t T, const Bf16Matrix* wp, const float* bias, float* y, ThreadPool* pool,
            bool rows) {
  const Bf16Matrix& w = *wp;
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t N = w.rows, K = w.cols;
  const int64_t Kv = K / (2 * L) * (2 * L);
  thread_local std::vector<float> xe_buf;
  if (xe_buf.size() < size_t(T * Kv + 1)) xe_buf.resize(size_t(T * Kv + 1));
  float* xe = xe_buf.data();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < Kv; k += 2 * L)
      for (int64_t i = 0; i < L; ++i) {
        xe[t * Kv + k + i] = x[t * K + k + 2 * i];
        xe[t * Kv + k + L + i] = x[t * K + k + 2 * i + 1];
      }
  if (T == 1 || rows) return GemvRowsBf16(xe, Kv, x, T, w, bias, y, pool);
  const int64_t unit = kNR;
  const int64_t units = (N + unit - 1) / unit;
  pool->parallel_for(units, [&](int64_t b, int64_t e) {
    const int64_t n0 = b * unit, n1 = std::min(N, e * unit);
    const int64_t Tc = 64;
    for (int64_t t0 = 0; t0 < T; t0 += Tc) {
      const int64_t t1 = std::min(T, t0 + Tc);
      for (int64_t n = n0; n < n1; n += kNR) {
        const int nr = int(std::min<int64_t>(kNR, n1 - n));
        for (int64_t t = t0; t < t1; t += kMR) {
          const int mr = int(std::min<int64_t>(kMR, t1 - t));
          kTiles[mr - 1][nr - 1](xe + t * Kv, Kv, x + t * K, K, w.data + n * K, Kv, y + t * N + n, N,
                                 bias ? bias + n : nullptr);
        }
      }
    }
  });
}

// ---------------------------------------------------------------- element-wise
void Rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    VF a0 = hn::Zero(df), a1 = hn::Zero(df);
    int64_t i = 0;
    for (; i + 2 * L <= n; i += 2 * L) {
      const VF v0 = hn::LoadU(df, xr + i), v1 = hn::LoadU(df, xr + i + L);
      a0 = hn::MulAdd(v0, v0, a0);
      a1 = hn::MulAdd(v1, v1, a1);
    }
    double ss = double(hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))));
    for (; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    const VF vi = hn::Set(df, inv);
    i = 0;
    for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(df, w + i), hn::Mul(hn::LoadU(df, xr + i), vi)), df, o + i);
    for (; i < n; ++i) o[i] = w[i] * (xr[i] * inv);
  }
}

void Rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t half = head_dim / 2;
  thread_local std::vector<float> cs;
  cs.resize(size_t(2 * half));
  float* c = cs.data();
  float* s = c + half;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos0 + t) * inv_freq[i];
      c[i] = std::cos(angle);
      s[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      int64_t i = 0;
      for (; i + L <= half; i += L) {
        const VF a = hn::LoadU(df, v + i), b = hn::LoadU(df, v + i + half);
        const VF cv = hn::LoadU(df, c + i), sv = hn::LoadU(df, s + i);
        hn::StoreU(hn::MulSub(a, cv, hn::Mul(b, sv)), df, v + i);
        hn::StoreU(hn::MulAdd(b, cv, hn::Mul(a, sv)), df, v + i + half);
      }
      for (; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const VF one = hn::Set(df, 1.0f), lim = hn::Set(df, 88.0f);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const VF g = hn::LoadU(df, gate + i);
    const VF e = hn::Exp(df, hn::Min(hn::Neg(g), lim));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void Add(float* h, const float* x, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(df, h + i), hn::LoadU(df, x + i)), df, h + i);
  for (; i < n; ++i) h[i] += x[i];
}

void Bf16ToF32(const uint16_t* src, float* dst, int64_t n) {
  const DF df;
  const DU32 du32;
  const hn::Rebind<uint16_t, DF> du16;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + i)))), df, dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// ---------------------------------------------------------------- attention
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t u;
  if (exp == 0) {
    float f = float(man) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Tile-width vectors (kKTile positions of a key tile hold a whole number of them).
using DT = hn::CappedTag<float, kKTile>;

// NB query heads (qs[g], hd values) against keys/values [j0, j1) of the tiled key cache k
// and value rows v of one kv head's block (KvCache::Storage). s: scratch of NB * ns floats.
template <int NB>
HWY_INLINE void AttnChunkHeads(const float* const* qs, const uint16_t* k, const uint16_t* v, int64_t hd, int64_t j0,
                               int64_t j1, float scale, float* s, int64_t ns, float* m, float* l, float* const* os) {
  const DF df;
  const DT dt;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<hwy::float16_t, DT> dht;
  const int64_t L = int64_t(hn::Lanes(df)), Lt = int64_t(hn::Lanes(dt));
  const int64_t tb0 = j0 / kKTile, tb1 = (j1 + kKTile - 1) / kKTile;
  // Scores of whole tiles: lanes are positions, so no horizontal sums.
  const auto vst = hn::Set(dt, scale);
  // In a decode step the cache rows come from DRAM (the weights streamed since evicted them)
  // and the hardware prefetchers stop at 4 KiB pages: ask for the keys two tiles ahead, and
  // for each tile's value rows while its scores are computed.
  const int64_t tile_bytes = hd * kKTile * 2;
  for (int64_t tb = tb0; tb < tb1; ++tb) {
    const uint16_t* kb = k + tb * kKTile * hd;
    if (tb + 2 < tb1) {
      const char* ahead = reinterpret_cast<const char*>(kb + 2 * kKTile * hd);
      for (int64_t line = 0; line < tile_bytes; line += 64) hwy::Prefetch(ahead + line);
    }
    // The tile's value rows into L2: the value loop below is too short per row for its own
    // prefetch, 16 rows ahead, to cover a DRAM miss (tessera_kernel_bench --only attn, 1
    // thread, 8 sequences of the 1B model at context 128, caches evicted: 255-267 us per layer
    // against 300-317 without).
    for (int64_t j = std::max(j0, tb * kKTile); j < std::min(j1, (tb + 1) * kKTile); ++j)
      for (int64_t line = 0; line < hd * 2; line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(v + j * hd) + line, 0, 2);
    for (int64_t i0 = 0; i0 < kKTile; i0 += Lt) {
      hn::Vec<DT> a[NB], b[NB];
      for (int g = 0; g < NB; ++g) a[g] = b[g] = hn::Zero(dt);
      int64_t d = 0;
      for (; d + 2 <= hd; d += 2) {
        const auto k0 = hn::PromoteTo(dt, hn::LoadU(dht, reinterpret_cast<const hwy::float16_t*>(kb + d * kKTile + i0)));
        const auto k1 =
            hn::PromoteTo(dt, hn::LoadU(dht, reinterpret_cast<const hwy::float16_t*>(kb + (d + 1) * kKTile + i0)));
        for (int g = 0; g < NB; ++g) {
          a[g] = hn::MulAdd(hn::Set(dt, qs[g][d]), k0, a[g]);
          b[g] = hn::MulAdd(hn::Set(dt, qs[g][d + 1]), k1, b[g]);
        }
      }
      if (d < hd) {
        const auto k0 = hn::PromoteTo(dt, hn::LoadU(dht, reinterpret_cast<const hwy::float16_t*>(kb + d * kKTile + i0)));
        for (int g = 0; g < NB; ++g) a[g] = hn::MulAdd(hn::Set(dt, qs[g][d]), k0, a[g]);
      }
      for (int g = 0; g < NB; ++g)
        hn::StoreU(hn::Mul(hn::Add(a[g], b[g]), vst), dt, s + g * ns + (tb - tb0) * kKTile + i0);
    }
  }
  // Softmax numerators over [j0, j1), per head.
  const int64_t n = j1 - j0, off = j0 - tb0 * kKTile;
  float* sg[NB];
  for (int g = 0; g < NB; ++g) {
    sg[g] = s + g * ns + off;
    float* x = sg[g];
    VF vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
    int64_t j = 0;
    for (; j + L <= n; j += L) vmax = hn::Max(vmax, hn::LoadU(df, x + j));
    float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
    for (; j < n; ++j) mx = std::max(mx, x[j]);
    const VF vm = hn::Set(df, mx);
    VF vsum = hn::Zero(df);
    for (j = 0; j + L <= n; j += L) {
      const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + j), vm));
      hn::StoreU(e, df, x + j);
      vsum = hn::Add(vsum, e);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
    for (; j < n; ++j) {
      x[j] = std::exp(x[j] - mx);
      sum += x[j];
    }
    m[g] = mx;
    l[g] = sum;
  }
  // o[g] = sum_j p[g][j] * v[j], accumulated in registers (up to 4 vectors of hd at a time).
  const int64_t hdv = hd / L * L;
  for (int64_t d0 = 0; d0 < hdv; d0 += 4 * L) {
    const int nd = int(std::min<int64_t>(4, (hdv - d0) / L));
    VF acc[NB][4];
    for (int g = 0; g < NB; ++g)
      for (int bb = 0; bb < 4; ++bb) acc[g][bb] = hn::Zero(df);
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* vr = v + (j0 + j) * hd + d0;
      if (d0 == 0 && j + 16 < n)
        for (int64_t line = 0; line < hd * 2; line += 64) hwy::Prefetch(reinterpret_cast<const char*>(vr + 16 * hd) + line);
      VF p[NB];
      for (int g = 0; g < NB; ++g) p[g] = hn::Set(df, sg[g][j]);
      for (int bb = 0; bb < 4; ++bb) {
        if (bb >= nd) break;
        const VF vv = hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(vr + bb * L)));
        for (int g = 0; g < NB; ++g) acc[g][bb] = hn::MulAdd(p[g], vv, acc[g][bb]);
      }
    }
    for (int g = 0; g < NB; ++g)
      for (int bb = 0; bb < nd; ++bb) hn::StoreU(acc[g][bb], df, os[g] + d0 + bb * L);
  }
  for (int64_t d = hdv; d < hd; ++d) {
    float acc[NB] = {};
    for (int64_t j = 0; j < n; ++j) {
      const float vd = f16_to_f32(v[(j0 + j) * hd + d]);
      for (int g = 0; g < NB; ++g) acc[g] += sg[g][j] * vd;
    }
    for (int g = 0; g < NB; ++g) os[g][d] = acc[g];
  }
}

// Up to 4 query heads at a time against keys/values [j0, j1).
void AttnChunk(const float* q, int64_t q_stride, int ng, const uint16_t* k, const uint16_t* v, int64_t hd, int64_t j0,
               int64_t j1, float scale, float* m, float* l, float* o) {
  const int64_t n = j1 - j0;
  if (n <= 0) {
    for (int g = 0; g < ng; ++g) {
      m[g] = -std::numeric_limits<float>::infinity();
      l[g] = 0;
      std::fill(o + g * hd, o + (g + 1) * hd, 0.0f);
    }
    return;
  }
  const int64_t ns = ((j1 + kKTile - 1) / kKTile - j0 / kKTile) * kKTile;
  thread_local std::vector<float> sbuf;
  if (sbuf.size() < size_t(4 * ns)) sbuf.resize(size_t(4 * ns));
  float* s = sbuf.data();
  for (int g0 = 0; g0 < ng; g0 += 4) {
    const int nb = std::min(4, ng - g0);
    const float* qs[4];
    float* os[4];
    for (int g = 0; g < nb; ++g) {
      qs[g] = q + (g0 + g) * q_stride;
      os[g] = o + (g0 + g) * hd;
    }
    switch (nb) {
      case 1: AttnChunkHeads<1>(qs, k, v, hd, j0, j1, scale, s, ns, m + g0, l + g0, os); break;
      case 2: AttnChunkHeads<2>(qs, k, v, hd, j0, j1, scale, s, ns, m + g0, l + g0, os); break;
      case 3: AttnChunkHeads<3>(qs, k, v, hd, j0, j1, scale, s, ns, m + g0, l + g0, os); break;
      default: AttnChunkHeads<4>(qs, k, v, hd, j0, j1, scale, s, ns, m + g0, l + g0, os); break;
    }
  }
}

// Keys [0, n) of one kv head's block (tiled fp16) -> fp32 transposed kt[d * ld + j]; columns
// [n, ld) are zeroed. Values (rows of hd) -> fp32 rows vf[j * hd + d].
void KTranspose(const uint16_t* k, const uint16_t* v, int64_t hd, int64_t n, int64_t ld, float* kt, float* vf) {
  const DF df;
  const DT dt;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<hwy::float16_t, DT> dht;
  const int64_t L = int64_t(hn::Lanes(df)), Lt = int64_t(hn::Lanes(dt));
  const int64_t ntiles = (n + kKTile - 1) / kKTile;  // ld >= ntiles * kKTile
  for (int64_t tb = 0; tb < ntiles; ++tb) {
    const uint16_t* kb = k + tb * kKTile * hd;
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t i0 = 0; i0 < kKTile; i0 += Lt)
        hn::StoreU(hn::PromoteTo(dt, hn::LoadU(dht, reinterpret_cast<const hwy::float16_t*>(kb + d * kKTile + i0))),
                   dt, kt + d * ld + tb * kKTile + i0);
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* vr = v + j * hd;
    float* vo = vf + j * hd;
    int64_t d = 0;
    for (; d + L <= hd; d += L)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(vr + d))), df, vo + d);
    for (; d < hd; ++d) vo[d] = f16_to_f32(vr[d]);
  }
  for (int64_t d = 0; d < hd; ++d)
    for (int64_t j = n; j < ld; ++j) kt[d * ld + j] = 0.0f;
}

// Causal attention for R query rows sharing one kv head. Row r has its query at q_rows[r]
// (hd values), may see keys [0, limit[r]) and writes out_rows[r]. kt: transposed fp32 keys
// [hd][ld] (ld a multiple of 2L, zero beyond the keys); v: fp16 rows. Needs hd % L == 0.
void AttnRows(const float* const* q_rows, float* const* out_rows, const int64_t* limit, int R, const float* kt,
              int64_t ld, const float* v, int64_t hd, float scale) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t nmax = 0;
  for (int r = 0; r < R; ++r) nmax = std::max(nmax, limit[r]);
  const int64_t nk = (nmax + 2 * L - 1) / (2 * L) * (2 * L);
  thread_local std::vector<float> sbuf;
  if (sbuf.size() < size_t(4 * nk + 4 * 256)) sbuf.resize(size_t(4 * nk + 4 * 256));
  float* S = sbuf.data();
  const VF ninf = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF vs = hn::Set(df, scale);
  for (int r0 = 0; r0 < R; r0 += 4) {
    const int nr = std::min(4, R - r0);
    const float* qr[4];
    int64_t lim[4];
    for (int i = 0; i < 4; ++i) {
      qr[i] = q_rows[r0 + std::min(i, nr - 1)];
      lim[i] = limit[r0 + std::min(i, nr - 1)];
    }
    const int64_t n4 = std::max({lim[0], lim[1], lim[2], lim[3]});
    const int64_t nk4 = (n4 + 2 * L - 1) / (2 * L) * (2 * L);
    // Scores: S[i][j] = q_i . k_j, 4 rows x 2L keys per step, broadcasting q.
    for (int64_t jb = 0; jb < nk4; jb += 2 * L) {
      VF a00 = hn::Zero(df), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
      const float* kp = kt + jb;
      for (int64_t d = 0; d < hd; ++d) {
        const VF k0 = hn::LoadU(df, kp + d * ld), k1 = hn::LoadU(df, kp + d * ld + L);
        const VF q0 = hn::Set(df, qr[0][d]), q1 = hn::Set(df, qr[1][d]);
        const VF q2 = hn::Set(df, qr[2][d]), q3 = hn::Set(df, qr[3][d]);
        a00 = hn::MulAdd(q0, k0, a00);
        a01 = hn::MulAdd(q0, k1, a01);
        a10 = hn::MulAdd(q1, k0, a10);
        a11 = hn::MulAdd(q1, k1, a11);
        a20 = hn::MulAdd(q2, k0, a20);
        a21 = hn::MulAdd(q2, k1, a21);
        a30 = hn::MulAdd(q3, k0, a30);
        a31 = hn::MulAdd(q3, k1, a31);
      }
      hn::StoreU(a00, df, S + 0 * nk4 + jb);
      hn::StoreU(a01, df, S + 0 * nk4 + jb + L);
      hn::StoreU(a10, df, S + 1 * nk4 + jb);
      hn::StoreU(a11, df, S + 1 * nk4 + jb + L);
      hn::StoreU(a20, df, S + 2 * nk4 + jb);
      hn::StoreU(a21, df, S + 2 * nk4 + jb + L);
      hn::StoreU(a30, df, S + 3 * nk4 + jb);
      hn::StoreU(a31, df, S + 3 * nk4 + jb + L);
    }
    // Softmax numerators (scaled, max subtracted, masked beyond each row's limit).
    float inv_sum[4];
    for (int i = 0; i < 4; ++i) {
      float* si = S + i * nk4;
      VF vmax = ninf;
      int64_t j = 0;
      for (; j + L <= lim[i]; j += L) vmax = hn::Max(vmax, hn::Mul(hn::LoadU(df, si + j), vs));
      float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
      for (; j < lim[i]; ++j) mx = std::max(mx, si[j] * scale);
      const VF vm = hn::Set(df, mx);
      VF vsum = hn::Zero(df);
      const auto iota = hn::Iota(hn::RebindToSigned<DF>(), 0);
      for (int64_t j = 0; j < nk4; j += L) {
        const auto idx = hn::Add(iota, hn::Set(hn::RebindToSigned<DF>(), int32_t(j)));
        const auto valid = hn::RebindMask(df, hn::Lt(idx, hn::Set(hn::RebindToSigned<DF>(), int32_t(lim[i]))));
        const VF x = hn::IfThenElse(valid, hn::MulSub(hn::LoadU(df, si + j), vs, vm), ninf);
        const VF e = hn::Exp(df, hn::Max(x, hn::Set(df, -104.0f)));
        const VF em = hn::IfThenElseZero(valid, e);
        hn::StoreU(em, df, si + j);
        vsum = hn::Add(vsum, em);
      }
      inv_sum[i] = 1.0f / hn::GetLane(hn::SumOfLanes(df, vsum));
    }
    // Output: o_i = sum_j p_ij v_j, 4 rows x (hd / L) vectors, d blocks of up to 4 vectors.
    for (int64_t d0 = 0; d0 < hd; d0 += 4 * L) {
      const int nd = int(std::min<int64_t>(4, (hd - d0) / L));
      VF o[4][4];
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < 4; ++b) o[i][b] = hn::Zero(df);
      for (int64_t j = 0; j < n4; ++j) {
        const float* vr = v + j * hd + d0;
        const VF p0 = hn::Set(df, S[j]), p1 = hn::Set(df, S[nk4 + j]);
        const VF p2 = hn::Set(df, S[2 * nk4 + j]), p3 = hn::Set(df, S[3 * nk4 + j]);
        for (int b = 0; b < 4; ++b) {
          if (b >= nd) break;
          const VF vv = hn::LoadU(df, vr + b * L);
          o[0][b] = hn::MulAdd(p0, vv, o[0][b]);
          o[1][b] = hn::MulAdd(p1, vv, o[1][b]);
          o[2][b] = hn::MulAdd(p2, vv, o[2][b]);
          o[3][b] = hn::MulAdd(p3, vv, o[3][b]);
        }
      }
      for (int i = 0; i < nr; ++i) {
        const VF inv = hn::Set(df, inv_sum[i]);
        for (int b = 0; b < nd; ++b) hn::StoreU(hn::Mul(o[i][b], inv), df, out_rows[r0 + i] + d0 + b * L);
      }
    }
  }
}

int64_t F32Lanes() { return int64_t(hn::Lanes(DF())); }

// ---------------------------------------------------------------- quantized GEMM
// The portable quantized kernel for R activation rows at once (a decode GEMV: R = 1; a
// batched decode step or a prefill tile: up to kMaxGemvRows), each row exactly what
// x16_gemv_rows (cpu/quant.cc) computes for it alone, bit for bit, whatever R is: per row and
// 32-value chunk (16 for Q6_K), the integer dot of the stored bytes with x's terms as one
// int16 per value (Q8Row::term; the weights' offset taken out with x's sums), then the same
// fp32 operations in the same order; only the 16 weight rows of a tile run in parallel lanes.
// A chunk's value vectors (four values of each of 16 rows per 32-bit lane) are unpacked to
// i16 once per call and serve every activation row: a widening pairwise multiply-add
// (pmaddwd on x86) against a row's four terms repeated sums each weight row's products in two
// i32 lanes, which one ConcatEven + ConcatOdd per chunk folds into one lane per row. The dots
// are exact on every target (a pair's products < 2^25, a chunk's dot < 2^31: Q8Row::dot_value).
#if HWY_TARGET != HWY_SCALAR
using DI16 = hn::ScalableTag<int16_t>;
using DI32 = hn::Repartition<int32_t, DI16>;
using DU8H = hn::Rebind<uint8_t, DI16>;  // the bytes one i16 vector widens
using DI8H = hn::Rebind<int8_t, DI16>;
using DU64 = hn::Repartition<uint64_t, DI16>;
using VI16 = hn::Vec<DI16>;
using VI32 = hn::Vec<DI32>;
constexpr int kMaxParts = 8;  // 64-byte value vector / the narrowest (128-bit) i16 vector
// Activation rows that share each load of an unpacked weight vector: as many as keep the
// rows' i32 sums (parts per value vector of each) in registers beside it.
constexpr int RowsPerPass(size_t parts) { return parts <= 2 ? 4 : parts <= 4 ? 2 : 1; }

// The stored bytes (value + offset, high bits included) of value vector v of chunk j, the
// `at`-th byte onward (Lanes(DI16) of them: Lanes / 4 rows), as i16.
template <DType kType>
HWY_INLINE VI16 ValuePart(const uint8_t* tile, int j, int v, size_t at) {
  constexpr X16Layout L = x16_layout(kType);
  const DU8H d8;
  const DI16 d16;
  if constexpr (kType == DType::Q8_0) return hn::PromoteTo(d16, hn::LoadU(d8, tile + L.qs + v * 64 + at));
  const auto b = hn::LoadU(d8, tile + L.qs + j * 256 + (v / 2) * 64 + at);
  VI16 q = hn::PromoteTo(d16, (v & 1) ? hn::ShiftRight<4>(b) : hn::And(b, hn::Set(d8, uint8_t(0x0F))));
  if constexpr (x16_fifth_bit(kType)) {
    const VI16 qh = hn::PromoteTo(d16, hn::LoadU(d8, tile + L.qh + (kType == DType::Q5_K ? j * 64 : 0) + at));
    q = hn::Or(q, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(qh, v), hn::Set(d16, int16_t(1)))));
  }
  if constexpr (kType == DType::Q6_K) {
    const VI16 qh = hn::PromoteTo(d16, hn::LoadU(d8, tile + L.qh + j * 128 + (v / 4) * 64 + at));
    q = hn::Or(q, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(qh, 2 * (v % 4)), hn::Set(d16, int16_t(3)))));
  }
  return q;
}

// Chunk j's eight value vectors as i16, [v][64].
template <DType kType>
HWY_INLINE void UnpackChunk(const uint8_t* tile, int j, int16_t* out) {
  const DI16 d16;
  const size_t N16 = hn::Lanes(d16);
  for (int v = 0; v < 8; ++v)
    for (size_t at = 0; at < 64; at += N16) hn::Store(ValuePart<kType>(tile, j, v, at), d16, out + v * 64 + at);
}

// Where ChunkDots reads a chunk's value vectors: unpacked before (UnpackChunk), for many
// activation rows; or from the tile itself, for a single pass of rows (a decode GEMV).
struct UnpackedValues {
  const int16_t* wq;
  HWY_INLINE VI16 operator()(int v, size_t at) const { return hn::Load(DI16(), wq + v * 64 + at); }
};
template <DType kType>
struct TileValues {
  const uint8_t* tile;
  int j;
  HWY_INLINE VI16 operator()(int v, size_t at) const { return ValuePart<kType>(tile, j, v, at); }
};

// RT rows' integer dots of value vectors [v0, v1) of a chunk: row t's terms at a[t] (the
// chunk's first value), its dots in dots[t][f] (lane i: weight row f * NF + i).
template <int RT, typename Values>
HWY_INLINE void ChunkDots(const Values& values, int v0, int v1, const int16_t* const* a, VI32 (*dots)[kMaxParts / 2]) {
  const DI16 d16;
  const DI32 d32;
  const DU64 d64;
  const size_t N16 = hn::Lanes(d16), P = 64 / N16;
  VI32 s0[RT][kMaxParts], s1[RT][kMaxParts];
  for (int t = 0; t < RT; ++t)
    for (size_t s = 0; s < P; ++s) s0[t][s] = s1[t][s] = hn::Zero(d32);
  for (int v = v0; v < v1; ++v) {
    VI16 av[RT];  // row t's four terms of vector v, repeated
    for (int t = 0; t < RT; ++t) {
      uint64_t p;
      std::memcpy(&p, a[t] + 4 * v, 8);
      av[t] = hn::BitCast(d16, hn::Set(d64, p));
    }
    for (size_t s = 0; s < P; ++s) {
      const VI16 q = values(v, s * N16);
      for (int t = 0; t < RT; ++t) s0[t][s] = hn::ReorderWidenMulAccumulate(d32, q, av[t], s0[t][s], s1[t][s]);
    }
  }
  for (int t = 0; t < RT; ++t)
    for (size_t f = 0; f < P / 2; ++f) {
      const VI32 h0 = hn::RearrangeToOddPlusEven(s0[t][2 * f], s1[t][2 * f]);
      const VI32 h1 = hn::RearrangeToOddPlusEven(s0[t][2 * f + 1], s1[t][2 * f + 1]);
      dots[t][f] = hn::Add(hn::ConcatEven(d32, h1, h0), hn::ConcatOdd(d32, h1, h0));
    }
}

#if HWY_TARGET == HWY_AVX2
// The decode GEMV's dots on AVX2 (one activation row, the tile read directly): the stored
// bytes stay bytes and multiply x's two int8 terms with vpmaddubsw (u8 x s8, pairs summed to
// i16), summed in i16 over as many value vectors as cannot overflow (a pair <= 2 * 127 * max
// stored value), then widened and joined by vpmaddwd against 254 and 1, which also sums each
// weight row's two pairs: the same integers as ChunkDots (254 x hi-dot + lo-dot), exactly,
// with no widening of the weights and no fold. Q8_0 (stored bytes up to 255) would saturate:
// it keeps ChunkDots.
template <DType kType>
constexpr int MaddubsSpan() {  // value vectors summed in i16 before widening
  constexpr int max_stored = kType == DType::Q6_K ? 63 : x16_fifth_bit(kType) ? 31 : 15;
  return 32767 / (2 * 127 * max_stored);
}

// Value vector v of chunk j, weight rows [8 part, 8 part + 8), as the stored bytes.
template <DType kType>
HWY_INLINE __m256i ValueBytes(const uint8_t* tile, int j, int v, int part) {
  constexpr X16Layout L = x16_layout(kType);
  const int at = 32 * part;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + L.qs + j * 256 + (v / 2) * 64 + at));
  __m256i q = (v & 1) ? _mm256_and_si256(_mm256_srli_epi16(b, 4), low4) : _mm256_and_si256(b, low4);
  if constexpr (x16_fifth_bit(kType)) {
    const __m256i qh =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + L.qh + (kType == DType::Q5_K ? j * 64 : 0) + at));
    // Bit v of each byte to bit 4 (16-bit shifts: bits crossing a byte are masked off).
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(v)), _mm256_set1_epi8(1));
    q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
  }
  if constexpr (kType == DType::Q6_K) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + L.qh + j * 128 + (v / 4) * 64 + at));
    const __m256i two = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * (v % 4))), _mm256_set1_epi8(3));
    q = _mm256_or_si256(q, _mm256_slli_epi16(two, 4));
  }
  return q;
}

template <DType kType>
HWY_INLINE void ChunkDotsBytes(const uint8_t* tile, int j, int v0, int v1, const int8_t* hi, const int8_t* lo,
                               VI32* dots) {
  constexpr int kSpan = MaddubsSpan<kType>();
  const __m256i w_hi = _mm256_set1_epi16(Q8Row::kLoSteps), w_lo = _mm256_set1_epi16(1);
  __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // weight rows 0-7, 8-15
  for (int v = v0; v < v1; v += kSpan) {
    __m256i acc_hi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256i acc_lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int u = v; u < std::min(v1, v + kSpan); ++u) {
      int32_t ph, pl;
      std::memcpy(&ph, hi + 4 * u, 4);
      std::memcpy(&pl, lo + 4 * u, 4);
      const __m256i bh = _mm256_set1_epi32(ph), bl = _mm256_set1_epi32(pl);
      for (int part = 0; part < 2; ++part) {
        const __m256i q = ValueBytes<kType>(tile, j, u, part);
        acc_hi[part] = _mm256_add_epi16(acc_hi[part], _mm256_maddubs_epi16(q, bh));
        acc_lo[part] = _mm256_add_epi16(acc_lo[part], _mm256_maddubs_epi16(q, bl));
      }
    }
    for (int part = 0; part < 2; ++part)
      sum[part] = _mm256_add_epi32(
          sum[part], _mm256_add_epi32(_mm256_madd_epi16(acc_hi[part], w_hi), _mm256_madd_epi16(acc_lo[part], w_lo)));
  }
  dots[0] = VI32{sum[0]};
  dots[1] = VI32{sum[1]};
}
#endif  // HWY_TARGET == HWY_AVX2

// Per-row bytes (16 of them, f of the float vectors' share) as floats: Q4_K's unsigned
// scales and mins, Q6_K's signed scales.
template <typename T>
HWY_INLINE VF BytesF32(const T* p) {
  const DF df;
  const hn::Rebind<int32_t, DF> d32;
  return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(hn::Rebind<T, DF>(), p)));
}

HWY_INLINE VF HalfF32(const uint8_t* p) {
  return hn::PromoteTo(DF(), hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), reinterpret_cast<const hwy::float16_t*>(p)));
}

// One chunk (or Q6_K half) of RT rows: their dots, the weights' offset taken out, as fp32,
// times the chunk's scale and the row's x scale, added to the row's accumulator acc[t]
// (16 floats). Inlined into GemmX16T, whose fp-contract=off keeps these roundings apart.
template <DType kType, int RT, typename Values>
HWY_INLINE void ChunkRows(const Values& values, int v0, int v1, const int16_t* const* a, const Q8Row* const* x,
                          int64_t xb, int h, const VF* scale, float* const* acc) {
  constexpr bool kHalves = kType == DType::Q6_K;
  constexpr int32_t kOffset = x16_layout(kType).offset;
  const DF df;
  const DI32 d32;
  const size_t NF = hn::Lanes(df), F = 16 / NF;
  VI32 dots[RT][kMaxParts / 2];
#if HWY_TARGET == HWY_AVX2
  if constexpr (RT == 1 && kType != DType::Q8_0 && std::is_same_v<Values, TileValues<kType>>)
    ChunkDotsBytes<kType>(values.tile, values.j, v0, v1, x[0]->hi.data() + xb * 32, x[0]->lo.data() + xb * 32,
                          dots[0]);
  else
#endif
    ChunkDots<RT>(values, v0, v1, a, dots);
  const VF inv = hn::Set(df, 1.0f / Q8Row::kLoScale);
  for (int t = 0; t < RT; ++t) {
    const int32_t sum = kHalves ? x[t]->term_sum(2 * xb + h) : x[t]->term_sum(2 * xb) + x[t]->term_sum(2 * xb + 1);
    const VI32 off = hn::Set(d32, -kOffset * sum);
    const VF xd = hn::Set(df, x[t]->d[size_t(xb)]);
    for (size_t f = 0; f < F; ++f) {
      const VF dot = hn::Mul(hn::ConvertTo(df, hn::Add(dots[t][f], off)), inv);  // Q8Row::dot_value
      float* at = acc[t] + f * NF;
      hn::Store(hn::Add(hn::Load(df, at), hn::Mul(dot, hn::Mul(scale[f], xd))), df, at);
    }
  }
}

template <DType kType>
__attribute__((optimize("fp-contract=off"))) HWY_NOINLINE void GemmX16T(const Q8Row* const* x,
                                                                         const int16_t* const* a, int R,
                                                                         const uint8_t* tiles, int64_t N, int64_t K,
                                                                         const float* bias, float* const* y,
                                                                         int64_t g0, int64_t g1) {
  constexpr X16Layout L = x16_layout(kType);
  constexpr int kChunks = int(L.values / 32);
  constexpr bool kHalves = kType == DType::Q6_K;  // a scale per 16 values
  const DF df;
  const size_t NF = hn::Lanes(df), F = 16 / NF;
  const int rt = RowsPerPass(64 / hn::Lanes(DI16()));
  // One pass of rows (a decode GEMV) reads the tiles directly and prefetches them; more rows
  // share one unpacking of each chunk.
  const bool one_pass = R <= rt;
  const int64_t blocks = K / L.values;
  alignas(64) int16_t wq[8 * 64];
  alignas(64) float acc_buf[kMaxGemvRows][2][kTileRows];  // per row: the sum, the min term's sum
  float* acc[kMaxGemvRows];
  float* acc_min[kMaxGemvRows];
  for (int t = 0; t < R; ++t) {
    acc[t] = acc_buf[t][0];
    acc_min[t] = acc_buf[t][1];
  }
  for (int64_t g = g0; g < g1; ++g) {
    std::memset(acc_buf, 0, sizeof(float) * 2 * kTileRows * size_t(R));
    const uint8_t* tile = tiles + g * blocks * L.bytes;
    // A decode GEMV streams the tiles once: fetch ~2 KiB ahead, across the page boundaries
    // where the hardware prefetcher stops.
    constexpr int64_t kAhead = (2048 + L.bytes - 1) / L.bytes;
    const uint8_t* end = tiles + (g1 * blocks) * L.bytes;
    for (int64_t b = 0; b < blocks; ++b, tile += L.bytes) {
      if (one_pass)
        for (int64_t off = 0; off < L.bytes && tile + kAhead * L.bytes + off < end; off += 64)
          hwy::Prefetch(tile + kAhead * L.bytes + off);
      VF d[kMaxParts / 2];
      for (size_t f = 0; f < F; ++f) d[f] = HalfF32(tile + 2 * f * NF);
      for (int j = 0; j < kChunks; ++j) {
        const int64_t xb = b * kChunks + j;  // x's 32-value block
        if (!one_pass) UnpackChunk<kType>(tile, j, wq);
        const UnpackedValues unpacked{wq};
        const TileValues<kType> direct{tile, j};
        const int16_t* at[kMaxGemvRows];  // each row's terms of this chunk
        for (int t = 0; t < R; ++t) at[t] = a[t] + xb * 32;
        for (int h = 0; h < (kHalves ? 2 : 1); ++h) {
          VF scale[kMaxParts / 2];
          for (size_t f = 0; f < F; ++f) {
            scale[f] = d[f];
            if constexpr (x16_k_scales(kType)) scale[f] = hn::Mul(d[f], BytesF32(tile + L.sc + j * 16 + f * NF));
            if constexpr (kType == DType::Q6_K)
              scale[f] = hn::Mul(d[f], BytesF32(reinterpret_cast<const int8_t*>(tile + L.sc + (2 * j + h) * 16 + f * NF)));
          }
          const int v0 = kHalves ? 4 * h : 0, v1 = kHalves ? v0 + 4 : 8;
          if (one_pass) {
            switch (R) {
              case 4: ChunkRows<kType, 4>(direct, v0, v1, at, x, xb, h, scale, acc); break;
              case 3: ChunkRows<kType, 3>(direct, v0, v1, at, x, xb, h, scale, acc); break;
              case 2: ChunkRows<kType, 2>(direct, v0, v1, at, x, xb, h, scale, acc); break;
              default: ChunkRows<kType, 1>(direct, v0, v1, at, x, xb, h, scale, acc); break;
            }
            continue;
          }
          int t = 0;
          if (rt >= 4)
            for (; t + 4 <= R; t += 4) ChunkRows<kType, 4>(unpacked, v0, v1, at + t, x + t, xb, h, scale, acc + t);
          if (rt >= 3)
            for (; t + 3 <= R; t += 3) ChunkRows<kType, 3>(unpacked, v0, v1, at + t, x + t, xb, h, scale, acc + t);
          if (rt >= 2)
            for (; t + 2 <= R; t += 2) ChunkRows<kType, 2>(unpacked, v0, v1, at + t, x + t, xb, h, scale, acc + t);
          for (; t < R; ++t) ChunkRows<kType, 1>(unpacked, v0, v1, at + t, x + t, xb, h, scale, acc + t);
        }
        if constexpr (x16_has_min(kType) || x16_k_scales(kType)) {
          VF m[kMaxParts / 2];
          for (size_t f = 0; f < F; ++f) {
            if constexpr (x16_has_min(kType)) m[f] = HalfF32(tile + L.m + 2 * f * NF);
            else m[f] = hn::Neg(hn::Mul(HalfF32(tile + 32 + 2 * f * NF), BytesF32(tile + L.m + j * 16 + f * NF)));
          }
          for (int t = 0; t < R; ++t) {
            const VF xsum = hn::Set(df, x[t]->d[size_t(xb)] * x[t]->block_sum(xb));
            for (size_t f = 0; f < F; ++f) {
              float* am = acc_min[t] + f * NF;
              hn::Store(hn::Add(hn::Load(df, am), hn::Mul(m[f], xsum)), df, am);
            }
          }
        }
      }
    }
    const int64_t n = g * kTileRows, rows = std::min<int64_t>(kTileRows, N - n);
    for (int t = 0; t < R; ++t)
      for (int64_t i = 0; i < rows; ++i) {
        const float v = acc[t][i] + acc_min[t][i];
        y[t][n + i] = bias ? v + bias[n + i] : v;
      }
  }
}

void CombineTerms(const int8_t* hi, const int8_t* lo, int64_t n, int16_t* a) {
  const DI16 d16;
  const DI8H d8;
  const int64_t N = int64_t(hn::Lanes(d16));
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Add(hn::Mul(hn::PromoteTo(d16, hn::LoadU(d8, hi + i)), hn::Set(d16, int16_t(Q8Row::kLoSteps))),
                       hn::PromoteTo(d16, hn::LoadU(d8, lo + i))),
               d16, a + i);
  for (; i < n; ++i) a[i] = int16_t(hi[i] * Q8Row::kLoSteps + lo[i]);
}
#else
void CombineTerms(const int8_t* hi, const int8_t* lo, int64_t n, int16_t* a) {
  for (int64_t i = 0; i < n; ++i) a[i] = int16_t(hi[i] * Q8Row::kLoSteps + lo[i]);
}
#endif  // HWY_TARGET != HWY_SCALAR

void GemmX16(const Q8Row* const* x, const int16_t* const* a, int R, const WeightMatrix* w, const float* bias,
             float* const* y, int64_t g0, int64_t g1) {
  const int64_t N = w->rows, K = w->cols;
#if HWY_TARGET != HWY_SCALAR
  if (64 / hn::Lanes(DI16()) <= size_t(kMaxParts) && hn::Lanes(DI16()) <= 32 && R <= kMaxGemvRows) {
    switch (w->dtype) {
      case DType::Q4_0: return GemmX16T<DType::Q4_0>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q4_1: return GemmX16T<DType::Q4_1>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q5_0: return GemmX16T<DType::Q5_0>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q5_1: return GemmX16T<DType::Q5_1>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q5_K: return GemmX16T<DType::Q5_K>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q8_0: return GemmX16T<DType::Q8_0>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q4_K: return GemmX16T<DType::Q4_K>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      case DType::Q6_K: return GemmX16T<DType::Q6_K>(x, a, R, w->tiles(), N, K, bias, y, g0, g1);
      default: break;
    }
  }
#endif
  (void)a;
  // A target too narrow (HWY_SCALAR) or too wide for the lane arithmetic above: the plain loops.
  const int64_t r0 = g0 * kTileRows, r1 = std::min(N, g1 * kTileRows);
  for (int t = 0; t < R; ++t) {
    x16_gemv_rows(*x[t], w->dtype, w->tiles(), K, r0, r1, y[t]);
    if (bias)
      for (int64_t r = r0; r < r1; ++r) y[t][r] += bias[r];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu::detail {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(Matmul);
HWY_EXPORT(Rmsnorm);
HWY_EXPORT(Rope);
HWY_EXPORT(SiluMul);
HWY_EXPORT(Add);
HWY_EXPORT(Bf16ToF32);
HWY_EXPORT(AttnChunk);
HWY_EXPORT(KTranspose);
HWY_EXPORT(AttnRows);
HWY_EXPORT(F32Lanes);
HWY_EXPORT(GemmX16);
HWY_EXPORT(CombineTerms);
HWY_EXPORT(QuantizeQ8);

void matmul_hwy(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y, ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(Matmul)(x, T, &w, bias, y, &pool, false);
}
void gemv_rows_bf16_hwy(const float* x, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                        ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(Matmul)(x, T, &w, bias, y, &pool, true);
}
void rmsnorm_hwy(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(Rmsnorm)(x, w, out, rows, n, eps);
}
void rope_hwy(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t pos0, const float* inv_freq) {
  HWY_DYNAMIC_DISPATCH(Rope)(x, T, n_heads, head_dim, pos0, inv_freq);
}
void silu_mul_hwy(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMul)(gate, up, out, n);
}
void add_hwy(float* h, const float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(Add)(h, x, n); }
void bf16_rows_to_f32_hwy(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Bf16ToF32)(src, dst, n);
}
void attn_chunk_hwy(const float* q, int64_t q_stride, int ng, const uint16_t* k, const uint16_t* v, int64_t hd,
                    int64_t j0, int64_t j1, float scale, float* m, float* l, float* o) {
  HWY_DYNAMIC_DISPATCH(AttnChunk)(q, q_stride, ng, k, v, hd, j0, j1, scale, m, l, o);
}

void k_transpose_hwy(const uint16_t* k, const uint16_t* v, int64_t hd, int64_t n, int64_t ld, float* kt, float* vf) {
  HWY_DYNAMIC_DISPATCH(KTranspose)(k, v, hd, n, ld, kt, vf);
}
void attn_rows_hwy(const float* const* q_rows, float* const* out_rows, const int64_t* limit, int R, const float* kt,
                   int64_t ld, const float* v, int64_t hd, float scale) {
  HWY_DYNAMIC_DISPATCH(AttnRows)(q_rows, out_rows, limit, R, kt, ld, v, hd, scale);
}
int64_t f32_lanes_hwy() { return HWY_DYNAMIC_DISPATCH(F32Lanes)(); }
void gemm_x16_hwy(const Q8Row* const* x, const int16_t* const* a, int R, const WeightMatrix& w, const float* bias,
                  float* const* y, int64_t g0, int64_t g1) {
  HWY_DYNAMIC_DISPATCH(GemmX16)(x, a, R, &w, bias, y, g0, g1);
}
void combine_terms_hwy(const Q8Row& x, int16_t* a) {
  HWY_DYNAMIC_DISPATCH(CombineTerms)(x.hi.data(), x.lo.data(), int64_t(x.hi.size()), a);
}

void quantize_q8_hwy(const float* x, int64_t blocks, float* d, int32_t* sum_hi, int32_t* sum_lo, int8_t* hi,
                     int8_t* lo) {
  HWY_DYNAMIC_DISPATCH(QuantizeQ8)(x, blocks, d, sum_hi, sum_lo, hi, lo);
}

int64_t hwy_supported_targets() {
  static const int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  return all;
}
void hwy_restrict_targets(int64_t mask) {
  (void)hwy_supported_targets();  // computed before any restriction
  hwy::SetSupportedTargetsForTest(mask);
}
int64_t hwy_current_target() { return HWY_DYNAMIC_DISPATCH(CurrentTarget)(); }
const char* hwy_target_name(int64_t target) { return hwy::TargetName(target); }

}  // namespace tessera::cpu::detail
#endif  // HWY_ONCE
