// Hand-written AVX-512 BF16 matmul (vdpbf16ps, AMX-BF16 for prefill) and, for quantized
// weights, the AVX-512 VNNI GEMV (vpdpbusd) with AMX-INT8 for several rows (the batched GEMV
// and the prefill GEMM), selected at run time by cpuid. Highway
// 1.0.3 has no dot-product-of-bf16 op, so this path uses intrinsics under function target
// attributes; the file compiles without any special flags.
//
// Activations are rounded to bf16 once per call ([T, Kp], K padded with zeros); weights are
// read in place (row-major [N, K] bf16, never repacked into a second copy), masked loads
// handle the K tail. Three kernels:
//  - T == 1 (decode GEMV): one weight row at a time so the matrix streams sequentially,
//    4 accumulators per row, 16 rows reduced together by a shuffle tree;
//  - 1 < T < 16: 4 tokens x 4 rows of dot-product accumulators, same reduction;
//  - T >= 16 (prefill GEMM): 64-row x 256-k panels transposed into an L1 scratch tile of
//    bf16 pairs; a 6-token x 64-row micro-kernel broadcasts activation pairs and accumulates
//    straight into output lanes (no horizontal reductions), with the next panel prefetched.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// GCC 12's avx512fintrin.h shuffles use an intentionally undefined pass-through operand,
// which -Wuninitialized reports once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "targets/cpu/kernels_internal.h"
#include "targets/cpu/quant.h"
#include "util/error.h"
#include "util/half.h"

#define TS_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni,fma")))
#define TS_BF16_INLINE TS_BF16 inline __attribute__((always_inline))
#define TS_AMX                                                                                             \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni,fma,amx-tile,amx-bf16")))

#define TS_AMX_INT8                                                                                        \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni,fma,amx-tile,amx-int8")))

namespace tessera::cpu::detail {

bool cpu_has_avx512bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    // Every CPU with AVX-512 BF16 also has VNNI (the quantized GEMV's dot products).
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

bool cpu_has_amx() {
  static const bool has = [] {
    if (!cpu_has_avx512bf16()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tile || !bf16) return false;
    // Linux hands out the 8 KiB of tile state only on request (once per process, for every
    // thread); a kernel that refuses it (or predates 5.16) leaves AMX off.
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return has;
}

bool cpu_has_amx_int8() {
  static const bool has = [] {
    if (!cpu_has_amx()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 25) & 1);
  }();
  return has;
}

namespace {

template <typename T>
struct AlignedAlloc {
  using value_type = T;
  AlignedAlloc() = default;
  template <typename U>
  AlignedAlloc(const AlignedAlloc<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const AlignedAlloc&) const { return true; }
};

// out[j] = sum of the lanes of v[j] for j < 16, as one vector.
TS_BF16_INLINE __m512 reduce16(const __m512 (&a)[16]) {
  // Feed the tree transposed (4x4) so the result comes out in natural order.
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = a[4 * (i % 4) + i / 4];
  __m512 s[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 x = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    s[i] = _mm512_add_ps(x, y);
  }
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 x = _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 y = _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1));
    u[i] = _mm512_add_ps(x, y);
  }
  __m512 w[2];
  for (int i = 0; i < 2; ++i) {
    const __m512 x = _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 y = _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    w[i] = _mm512_add_ps(x, y);
  }
  const __m512 x = _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 y = _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1));
  return _mm512_add_ps(x, y);
}

TS_BF16_INLINE __m512bh as_bh(__m512i v) { return (__m512bh)v; }

// Rounds x[T, K] to bf16 rows of Kp (multiple of 32) with zero padding.
TS_BF16 void convert_rows(const float* x, int64_t rows, int64_t K, int64_t Kp, uint16_t* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * K;
    uint16_t* o = out + t * Kp;
    for (int64_t k = 0; k < Kp; k += 32) {
      const int64_t rem = K - k;
      __m512 lo, hi;
      if (rem >= 32) {
        lo = _mm512_loadu_ps(xr + k);
        hi = _mm512_loadu_ps(xr + k + 16);
      } else {
        const __mmask16 mlo = rem >= 16 ? __mmask16(0xFFFF) : __mmask16(rem > 0 ? (1u << rem) - 1 : 0);
        const int64_t rh = rem - 16;
        const __mmask16 mhi = rh >= 16 ? __mmask16(0xFFFF) : __mmask16(rh > 0 ? (1u << rh) - 1 : 0);
        lo = _mm512_maskz_loadu_ps(mlo, xr + k);
        hi = _mm512_maskz_loadu_ps(mhi, xr + k + 16);
      }
      const __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(reinterpret_cast<void*>(o + k), (__m512i)b);
    }
  }
}

// Writes or accumulates an MR x NR tile of sums: y[t * N + n + r].
TS_BF16_INLINE void store_tile(const float* sums, int mr, int nr, float* y, int64_t N, const float* bias,
                               bool accumulate) {
  for (int t = 0; t < mr; ++t)
    for (int r = 0; r < nr; ++r) {
      float v = sums[t * nr + r];
      float& dst = y[t * N + r];
      if (accumulate)
        dst += v;
      else
        dst = bias ? v + bias[r] : v;
    }
}

// One MR x NR tile over k in [k0, k1) (k0 a multiple of 32; k1 == K may end in a tail).
// xb: bf16 activations, row stride xs; w: weight row n, row stride K.
template <int MR, int NR>
TS_BF16 void tile(const uint16_t* xb, int64_t xs, const uint16_t* w, int64_t K, int64_t k0, int64_t k1, float* y,
                  int64_t N, const float* bias, bool accumulate) {
  static_assert(MR * NR <= 16);
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = as_bh(_mm512_loadu_si512(w + r * K + k));
    for (int t = 0; t < MR; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(xb + t * xs + k));
      for (int r = 0; r < NR; ++r) acc[t * NR + r] = _mm512_dpbf16_ps(acc[t * NR + r], xv, wv[r]);
    }
  }
  if (k < k1) {
    const __mmask32 m = __mmask32((uint64_t(1) << (k1 - k)) - 1);
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = as_bh(_mm512_maskz_loadu_epi16(m, w + r * K + k));
    for (int t = 0; t < MR; ++t) {
      const __m512bh xv = as_bh(_mm512_maskz_loadu_epi16(m, xb + t * xs + k));
      for (int r = 0; r < NR; ++r) acc[t * NR + r] = _mm512_dpbf16_ps(acc[t * NR + r], xv, wv[r]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, reduce16(acc));
  store_tile(sums, MR, NR, y, N, bias, accumulate);
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t,
                        const float*, bool);

constexpr int kMR = 4, kNR = 4;

template <int MR, int NR>
constexpr TileFn tile_ptr() {
  return &tile<MR, NR>;
}

const TileFn kTiles[kMR][kNR] = {
    {tile_ptr<1, 1>(), tile_ptr<1, 2>(), tile_ptr<1, 3>(), tile_ptr<1, 4>()},
    {tile_ptr<2, 1>(), tile_ptr<2, 2>(), tile_ptr<2, 3>(), tile_ptr<2, 4>()},
    {tile_ptr<3, 1>(), tile_ptr<3, 2>(), tile_ptr<3, 3>(), tile_ptr<3, 4>()},
    {tile_ptr<4, 1>(), tile_ptr<4, 2>(), tile_ptr<4, 3>(), tile_ptr<4, 4>()},
};

// GEMV: one weight row at a time (the matrix is read as one sequential stream, which the
// hardware prefetchers follow best), 4 independent accumulators per row; the 16 rows'
// vectors are then reduced together.
constexpr int64_t kPrefetchBytes = 4096;

// One weight row against R activation rows; each row's four accumulators see the same
// instructions in the same order whatever R is (a batched decode step's sums are the single
// step's, bit for bit), the weight row loaded once for all of them.
template <int R>
TS_BF16_INLINE void row_dots(const uint16_t* const* xb, const uint16_t* w, int64_t K, __m512* out) {
  __m512 a0[R], a1[R], a2[R], a3[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = a2[r] = a3[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 128 <= K; k += 128) {
    // The hardware prefetchers stop at 4 KiB page boundaries, and mapped weights sit in 4 KiB
    // pages: asking for the lines ahead keeps the stream going across them (measured on 1B
    // shapes: about 10% more GEMV bandwidth; a prefetch past the matrix's end is harmless).
    // Into L2 and 4 KiB ahead rather than into L1 2 KiB ahead: default model decode 81.6 ->
    // 86.6 tok/s (medians of 3), as the quantized GEMV below.
    const char* ahead = reinterpret_cast<const char*>(w + k) + kPrefetchBytes;
    for (int line = 0; line < 4; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T1);
    const __m512bh w0 = as_bh(_mm512_loadu_si512(w + k)), w1 = as_bh(_mm512_loadu_si512(w + k + 32)),
                   w2 = as_bh(_mm512_loadu_si512(w + k + 64)), w3 = as_bh(_mm512_loadu_si512(w + k + 96));
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm512_dpbf16_ps(a0[r], as_bh(_mm512_loadu_si512(xb[r] + k)), w0);
      a1[r] = _mm512_dpbf16_ps(a1[r], as_bh(_mm512_loadu_si512(xb[r] + k + 32)), w1);
      a2[r] = _mm512_dpbf16_ps(a2[r], as_bh(_mm512_loadu_si512(xb[r] + k + 64)), w2);
      a3[r] = _mm512_dpbf16_ps(a3[r], as_bh(_mm512_loadu_si512(xb[r] + k + 96)), w3);
    }
  }
  for (; k + 32 <= K; k += 32) {
    const __m512bh w0 = as_bh(_mm512_loadu_si512(w + k));
    for (int r = 0; r < R; ++r) a0[r] = _mm512_dpbf16_ps(a0[r], as_bh(_mm512_loadu_si512(xb[r] + k)), w0);
  }
  if (k < K) {
    const __mmask32 m = __mmask32((uint64_t(1) << (K - k)) - 1);
    const __m512bh w0 = as_bh(_mm512_maskz_loadu_epi16(m, w + k));
    for (int r = 0; r < R; ++r) a1[r] = _mm512_dpbf16_ps(a1[r], as_bh(_mm512_maskz_loadu_epi16(m, xb[r] + k)), w0);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_add_ps(_mm512_add_ps(a0[r], a1[r]), _mm512_add_ps(a2[r], a3[r]));
}

// Weight rows [n, e) (at most 16) for R activation rows.
template <int R>
TS_BF16 void gemv_rows(const uint16_t* const* xb, const uint16_t* wd, int64_t K, const float* bias, float* const* y,
                       int64_t n, int64_t e) {
  const int nr = int(e - n);
  __m512 acc[R][16];
  for (int i = 0; i < 16; ++i) {
    __m512 dots[R];
    if (i < nr) row_dots<R>(xb, wd + (n + i) * K, K, dots);
    for (int r = 0; r < R; ++r) acc[r][i] = i < nr ? dots[r] : _mm512_setzero_ps();
  }
  const __mmask16 om = nr == 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  for (int r = 0; r < R; ++r) {
    __m512 s = reduce16(acc[r]);
    if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(om, bias + n));
    _mm512_mask_storeu_ps(y[r] + n, om, s);
  }
}

// y[r][n0, n1) for `rows` activation rows: 16 weight rows at a time, kGemvRows activation
// rows per pass over them (the 16 rows stay in L2 for the next pass).
constexpr int kGemvRows = 4;
void gemv_range(const uint16_t* const* xb, int rows, const uint16_t* wd, int64_t K, const float* bias,
                float* const* y, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 16) {
    const int64_t e = std::min(n1, n + 16);
    for (int r0 = 0; r0 < rows; r0 += kGemvRows) {
      switch (std::min(kGemvRows, rows - r0)) {
        case 1: gemv_rows<1>(xb + r0, wd, K, bias, y + r0, n, e); break;
        case 2: gemv_rows<2>(xb + r0, wd, K, bias, y + r0, n, e); break;
        case 3: gemv_rows<3>(xb + r0, wd, K, bias, y + r0, n, e); break;
        default: gemv_rows<4>(xb + r0, wd, K, bias, y + r0, n, e); break;
      }
    }
  }
}

// Rows [n0, n1) of y (row stride N) for all T tokens.
void gemm_range(const uint16_t* xb, int64_t Kp, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                int64_t N, int64_t n0, int64_t n1) {
  const int64_t K = w.cols;
  // K blocks keep a weight panel (NR x Kc) in L1; T blocks keep activations (Tc x Kc) in L2.
  const int64_t Kc = K <= 3072 ? K : 2048;
  const int64_t Tc = std::max<int64_t>(kMR, (std::min<int64_t>(T, 256 * 1024 / (2 * std::min(Kc, K)) / kMR * kMR)));
  for (int64_t k0 = 0; k0 < K; k0 += Kc) {
    const int64_t k1 = std::min(K, k0 + Kc);
    const bool acc = k0 > 0;
    for (int64_t t0 = 0; t0 < T; t0 += Tc) {
      const int64_t t1 = std::min(T, t0 + Tc);
      for (int64_t n = n0; n < n1; n += kNR) {
        const int nr = int(std::min<int64_t>(kNR, n1 - n));
        const uint16_t* wp = w.data + n * K;
        const float* bp = bias ? bias + n : nullptr;
        for (int64_t t = t0; t < t1; t += kMR) {
          const int mr = int(std::min<int64_t>(kMR, t1 - t));
          kTiles[mr - 1][nr - 1](xb + t * Kp, Kp, wp, K, k0, k1, y + t * N + n, N, bp, acc);
        }
      }
    }
  }
}

// ---- Packed GEMM for larger T. A block of up to 64 weight rows x Kc is transposed into a
// small L1-resident scratch panel P[k/2][64] of bf16 pairs (a transient tile, not a copy of
// the weights), so one zmm holds the (k, k+1) pairs of 16 output rows. The micro-kernel
// broadcasts an activation pair and accumulates MR tokens x NB groups of 16 rows straight
// into output lanes: no horizontal reductions, and partial sums across K blocks are plain
// vector adds on y.
constexpr int kPackRows = 64;  // rows per packed panel (NB <= 4 groups of 16)
// K per packed panel and tokens per block: GemmBlocking (kc, default 256; tc, default 512).
constexpr int kPMR = 6;           // token rows per micro-kernel
constexpr int64_t kPackedMinT = 16;  // below: the dot-product tiles (no packing)

// 16x16 transpose of 32-bit elements, in place.
TS_BF16_INLINE void transpose16(__m512i (&m)[16]) {
  __m512i r[16];
  for (int i = 0; i < 8; ++i) {
    r[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
    r[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    m[4 * i] = _mm512_unpacklo_epi64(r[4 * i], r[4 * i + 2]);
    m[4 * i + 1] = _mm512_unpackhi_epi64(r[4 * i], r[4 * i + 2]);
    m[4 * i + 2] = _mm512_unpacklo_epi64(r[4 * i + 1], r[4 * i + 3]);
    m[4 * i + 3] = _mm512_unpackhi_epi64(r[4 * i + 1], r[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(m[i], m[4 + i], 0x88);
    r[4 + i] = _mm512_shuffle_i32x4(m[i], m[4 + i], 0xdd);
    r[8 + i] = _mm512_shuffle_i32x4(m[8 + i], m[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_i32x4(m[8 + i], m[12 + i], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    m[i] = _mm512_shuffle_i32x4(r[i], r[8 + i], 0x88);
    m[8 + i] = _mm512_shuffle_i32x4(r[i], r[8 + i], 0xdd);
  }
}

// Packs rows [0, rows) (rows <= 64) x k in [0, kc) of w (row stride K) into P[kp * 64 + row]
// as 32-bit pairs; kc2 = ceil(kc / 32) * 16 pairs are written, zero beyond kc or rows.
TS_BF16 void pack_panel(const uint16_t* w, int64_t K, int rows, int64_t kc, uint32_t* P) {
  const int groups = (rows + 15) / 16;
  for (int64_t kb = 0; kb < kc; kb += 32) {
    const int64_t rem = kc - kb;
    const __mmask32 km = rem >= 32 ? ~__mmask32(0) : __mmask32((uint64_t(1) << rem) - 1);
    for (int g = 0; g < groups; ++g) {
      __m512i m[16];
      for (int i = 0; i < 16; ++i) {
        const int r = g * 16 + i;
        m[i] = r < rows ? (rem >= 32 ? _mm512_loadu_si512(w + r * K + kb) : _mm512_maskz_loadu_epi16(km, w + r * K + kb))
                        : _mm512_setzero_si512();
      }
      transpose16(m);
      uint32_t* dst = P + (kb / 2) * kPackRows + g * 16;
      for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + j * kPackRows, m[j]);
    }
  }
}

// y[t0 + t, n + 16 g + i] (+)= sum_kp P[kp][16 g + i] . xb[t][2 kp, 2 kp + 1] for MR tokens
// and NB groups; the last group stores lanes in `last_mask` only.
// y is the thread's contiguous scratch tile (row stride N = 64 floats, 64-byte aligned).
template <int MR, int NB>
TS_BF16 void packed_kernel(const uint16_t* xb, int64_t xs, const uint32_t* P, int64_t kc2, float* y, int64_t N,
                           bool first) {
  __m512 c[MR][NB];
  for (int t = 0; t < MR; ++t)
    for (int g = 0; g < NB; ++g) c[t][g] = _mm512_setzero_ps();
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(xb);
  const int64_t xs2 = xs / 2;
  for (int64_t kp = 0; kp < kc2; ++kp) {
    if ((kp & 15) == 0)  // activations come from L2/L3: fetch each row two lines ahead
      for (int t = 0; t < MR; ++t) _mm_prefetch(reinterpret_cast<const char*>(xp + t * xs2 + kp + 32), _MM_HINT_T0);
    __m512bh wv[NB];
    for (int g = 0; g < NB; ++g) wv[g] = as_bh(_mm512_load_si512(P + kp * kPackRows + g * 16));
    for (int t = 0; t < MR; ++t) {
      const __m512bh xv = as_bh(_mm512_set1_epi32(int(xp[t * xs2 + kp])));
      for (int g = 0; g < NB; ++g) c[t][g] = _mm512_dpbf16_ps(c[t][g], xv, wv[g]);
    }
  }
  for (int t = 0; t < MR; ++t)
    for (int g = 0; g < NB; ++g) {
      float* dst = y + t * N + g * 16;
      _mm512_store_ps(dst, first ? c[t][g] : _mm512_add_ps(c[t][g], _mm512_load_ps(dst)));
    }
}

using PackedFn = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, bool);
template <int MR>
constexpr std::array<PackedFn, 4> packed_row() {
  return {&packed_kernel<MR, 1>, &packed_kernel<MR, 2>, &packed_kernel<MR, 3>, &packed_kernel<MR, 4>};
}
const std::array<PackedFn, 4> kPacked[kPMR] = {packed_row<1>(), packed_row<2>(), packed_row<3>(),
                                               packed_row<4>(), packed_row<5>(), packed_row<6>()};

// ---- AMX. The packed panel P is already in the layout of an AMX B tile: 16 consecutive k
// pairs of one group of 16 rows are 16 tile rows of 64 bytes (row stride 256). An A tile is 16
// tokens x 32 bf16 of the activations as they are, a C tile 16 tokens x 16 rows in fp32.
// One block: 32 tokens x 32 rows (C tiles 0-3, A tiles 4-5, B tiles 6-7), each k step four
// tile products of 16 x 16 x 32. Tokens past T and groups past the panel's rows compute
// garbage lanes that are never stored (the activations have 32 rows to spare past T).
constexpr int kAmxTokens = 32;
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TS_AMX void amx_begin() {
  AmxConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  // GCC 12 does not see ldtilecfg read the rows and widths and drops their stores: say so.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
TS_AMX void amx_end() { _tile_release(); }

// C[t][16 g + i] (+)= over kp < kc2 (a multiple of 16) for 32 tokens and groups g0, g0 + 1;
// C: the scratch tile (row stride kPackRows floats).
TS_AMX void amx_block(const uint16_t* xb, int64_t xs, const uint32_t* P, int g0, int64_t kc2, float* C,
                      bool first) {
  constexpr int64_t cs = kPackRows * sizeof(float);
  float* c0 = C + g0 * 16;
  float* c2 = c0 + 16 * kPackRows;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c0, cs);
    _tile_loadd(1, c0 + 16, cs);
    _tile_loadd(2, c2, cs);
    _tile_loadd(3, c2 + 16, cs);
  }
  const int64_t xstride = xs * 2;
  const uint16_t* x0 = xb;
  const uint16_t* x1 = xb + 16 * xs;
  for (int64_t kp = 0; kp < kc2; kp += 16) {
    _tile_loadd(4, x0 + 2 * kp, xstride);
    _tile_loadd(5, x1 + 2 * kp, xstride);
    _tile_loadd(6, P + kp * kPackRows + g0 * 16, kPackRows * 4);
    _tile_loadd(7, P + kp * kPackRows + g0 * 16 + 16, kPackRows * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c0, cs);
  _tile_stored(1, c0 + 16, cs);
  _tile_stored(2, c2, cs);
  _tile_stored(3, c2 + 16, cs);
}

// Copies rows of the scratch tile c [rows, 64] into y[., n..n + cols] adding the bias.
TS_BF16 void store_scratch(const float* c, int64_t rows, int cols, float* y, int64_t N, const float* bias) {
  for (int64_t t = 0; t < rows; ++t)
    for (int g = 0; g * 16 < cols; ++g) {
      const int rem = cols - g * 16;
      const __mmask16 m = rem >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1);
      __m512 v = _mm512_load_ps(c + t * kPackRows + g * 16);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + g * 16));
      _mm512_mask_storeu_ps(y + t * N + g * 16, m, v);
    }
}

// Rows [n0, n1) of y (row stride N) for all T tokens.
void gemm_packed_range(const uint16_t* xb, int64_t xs, int64_t T, const Bf16Matrix& w, const float* bias, float* y,
                       int64_t N, int64_t n0, int64_t n1, const GemmBlocking& blk) {
  const int64_t K = w.cols;
  const int64_t Kc = blk.kc;  // K per packed panel (a multiple of 32): the panel stays in L1
  const int64_t Tc = blk.tc;       // activations [Tc, Kc] and the scratch tile [Tc, 64] stay in L2
  const bool amx = use_amx();
  thread_local std::vector<uint32_t, AlignedAlloc<uint32_t>> pbuf;
  thread_local std::vector<float, AlignedAlloc<float>> cbuf;
  const int64_t c_rows = (Tc + kAmxTokens - 1) / kAmxTokens * kAmxTokens;
  if (pbuf.size() < size_t(kPackRows * Kc / 2)) pbuf.resize(size_t(kPackRows * Kc / 2));
  if (cbuf.size() < size_t(c_rows * kPackRows)) cbuf.resize(size_t(c_rows * kPackRows));
  uint32_t* P = pbuf.data();
  float* C = cbuf.data();
  if (amx) amx_begin();
  for (int64_t t0 = 0; t0 < T; t0 += Tc) {
    const int64_t t1 = std::min(T, t0 + Tc);
    for (int64_t nb = n0; nb < n1; nb += kPackRows) {
      const int rows = int(std::min<int64_t>(kPackRows, n1 - nb));
      const int groups = (rows + 15) / 16;
      for (int64_t k0 = 0; k0 < K; k0 += Kc) {
        const int64_t kc = std::min(Kc, K - k0);
        const int64_t kc2 = (kc + 31) / 32 * 16;
        pack_panel(w.data + nb * K + k0, K, rows, kc, P);
        const bool first = k0 == 0;
        // The next panel's weights come from DRAM: prefetch them (into L2) a slice per
        // micro-kernel call so they arrive while this panel computes.
        int64_t pn = nb, pk = k0 + Kc;
        if (pk >= K) {
          pn = nb + kPackRows;
          pk = 0;
        }
        const int prow = pn < n1 ? int(std::min<int64_t>(kPackRows, n1 - pn)) : 0;
        const int64_t lpr = (std::min(Kc, K - pk) * 2 + 63) / 64;  // lines per row
        const int64_t plines = prow * lpr;
        const char* pbase = reinterpret_cast<const char*>(w.data + pn * K + pk);
        if (amx) {
          const int64_t blocks = (t1 - t0 + kAmxTokens - 1) / kAmxTokens;
          int64_t i = 0;
          for (int64_t t = t0; t < t1; t += kAmxTokens, ++i) {
            for (int64_t l = plines * i / blocks; l < plines * (i + 1) / blocks; ++l)
              _mm_prefetch(pbase + (l / lpr) * K * 2 + (l % lpr) * 64, _MM_HINT_T1);
            for (int g = 0; g < groups; g += 2)
              amx_block(xb + t * xs + k0, xs, P, g, kc2, C + (t - t0) * kPackRows, first);
          }
          continue;
        }
        const int64_t tiles = (t1 - t0 + kPMR - 1) / kPMR;
        int64_t i = 0;
        for (int64_t t = t0; t < t1; t += kPMR, ++i) {
          const int mr = int(std::min<int64_t>(kPMR, t1 - t));
          for (int64_t l = plines * i / tiles; l < plines * (i + 1) / tiles; ++l)
            _mm_prefetch(pbase + (l / lpr) * K * 2 + (l % lpr) * 64, _MM_HINT_T1);
          kPacked[mr - 1][groups - 1](xb + t * xs + k0, xs, P, kc2, C + (t - t0) * kPackRows, kPackRows, first);
        }
      }
      store_scratch(C, t1 - t0, rows, y + t0 * N + nb, N, bias ? bias + nb : nullptr);
    }
  }
  if (amx) amx_end();
}

// ---- Quantized weights (x16 tiles, quant.h). Decode: x as two int8 terms per block (Q8Row);
// a tile's values are vectors whose 32-bit lane i holds four consecutive values of row i, so
// one vpdpbusd advances 16 rows by four values against four broadcast bytes of x. Per 32
// values x 16 rows: the unpacking (3 instructions per 64 bytes of nibbles, 3 more per vector
// for Q5_0's and Q6_K's high bits), 16 dot products (x's two terms), the scales (6-10);
// measured, the GEMV stays bound by the memory, not by them.

// Moves bits [from, from + width) of every byte to bits [4, 4 + width) (width 1 or 2), the
// rest cleared. 16-bit shifts of at most 4 never carry a bit across a byte here.
TS_BF16_INLINE __m512i high_bits(__m512i h, int from, int width) {
  const __m512i mask = _mm512_set1_epi8(char(((1 << width) - 1) << 4));
  const __m512i moved = from <= 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - from))
                                  : _mm512_srl_epi16(h, _mm_cvtsi32_si128(from - 4));
  return _mm512_and_si512(moved, mask);
}

// Unsigned bytes (16 lanes x 4) -> fp32 lanes: 16 u8 or i8 scales, one per row.
TS_BF16_INLINE __m512 scales_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
TS_BF16_INLINE __m512 scales_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Value vectors 2c and 2c + 1 of chunk j (32 values) of a tile: unsigned bytes, q + offset,
// 32-bit lane i holding four consecutive values of row i.
template <DType kType>
TS_BF16_INLINE void value_vectors(const uint8_t* tile, int j, int c, __m512i& v0, __m512i& v1) {
  constexpr X16Layout L = x16_layout(kType);
  if constexpr (kType == DType::Q8_0) {
    v0 = _mm512_loadu_si512(tile + L.qs + 64 * (2 * c));
    v1 = _mm512_loadu_si512(tile + L.qs + 64 * (2 * c + 1));
    return;
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_loadu_si512(tile + L.qs + j * 256 + 64 * c);
    v0 = _mm512_and_si512(v, low4);
    v1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if constexpr (x16_fifth_bit(kType)) {
      const __m512i h = _mm512_loadu_si512(tile + L.qh + (kType == DType::Q5_K ? j * 64 : 0));
      v0 = _mm512_or_si512(v0, high_bits(h, 2 * c, 1));
      v1 = _mm512_or_si512(v1, high_bits(h, 2 * c + 1, 1));
    }
    if constexpr (kType == DType::Q6_K) {
      const __m512i h = _mm512_loadu_si512(tile + L.qh + j * 128 + (c / 2) * 64);
      v0 = _mm512_or_si512(v0, high_bits(h, 2 * ((2 * c) % 4), 2));
      v1 = _mm512_or_si512(v1, high_bits(h, 2 * ((2 * c + 1) % 4), 2));
    }
  }
}

// Value vectors 2c and 2c + 1 of chunk j as signed bytes: the quantized values themselves.
template <DType kType>
TS_BF16_INLINE void signed_value_vectors(const uint8_t* tile, int j, int c, __m512i& v0, __m512i& v1) {
  constexpr int kOffset = x16_layout(kType).offset;
  value_vectors<kType>(tile, j, c, v0, v1);
  if constexpr (kOffset != 0) {
    const __m512i off = _mm512_set1_epi8(char(kOffset));  // 128 wraps: q + 128 - 128 = q as int8
    v0 = _mm512_sub_epi8(v0, off);
    v1 = _mm512_sub_epi8(v1, off);
  }
}

// One activation row's share of chunk j (32 values) of a tile, from the chunk's integer
// dots with x's two terms (the weights' offset already taken out; sh[h], sl[h]: per 16-value
// half for Q6_K): scaled and summed in fp32. Both decode GEMVs (VNNI and AMX) end each chunk
// here, so their rows are the same numbers bit for bit.
template <DType kType>
TS_BF16_INLINE void finish_chunk(float x_d, float x_dsum, const uint8_t* tile, int j, const __m512i* sh,
                                 const __m512i* sl, __m512 d, __m512 lo_scale, __m512& blk, __m512& blk_min,
                                 __m512& acc0, __m512& acc1) {
  constexpr X16Layout L = x16_layout(kType);
  constexpr bool kHalves = kType == DType::Q6_K;
  const __m512 xd = _mm512_set1_ps(x_d);
  for (int h = 0; h < (kHalves ? 2 : 1); ++h) {
    const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl[h]), lo_scale, _mm512_cvtepi32_ps(sh[h]));
    if constexpr (x16_k_scales(kType)) {
      blk = _mm512_fmadd_ps(dot, _mm512_mul_ps(scales_u8(tile + L.sc + j * 16), xd), blk);
    } else if constexpr (kType == DType::Q6_K) {
      blk = _mm512_fmadd_ps(dot, _mm512_mul_ps(scales_i8(tile + L.sc + (2 * j + h) * 16), xd), blk);
    } else {
      acc0 = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, xd), acc0);
    }
  }
  if constexpr (x16_has_min(kType))
    acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + L.m))),
                           _mm512_set1_ps(x_dsum), acc1);
  if constexpr (x16_k_scales(kType))
    blk_min = _mm512_fmadd_ps(scales_u8(tile + L.m + j * 16), _mm512_set1_ps(x_dsum), blk_min);
}

// The end of a tile: a super-block's scale (and min scale) once per 256 values, not per chunk.
template <DType kType>
TS_BF16_INLINE void finish_block(const uint8_t* tile, __m512 d, __m512 blk, __m512 blk_min, __m512& acc0,
                                 __m512& acc1) {
  if constexpr (x16_k_scales(kType) || kType == DType::Q6_K) acc0 = _mm512_fmadd_ps(d, blk, acc0);
  if constexpr (x16_k_scales(kType)) {
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32)));
    acc1 = _mm512_fnmadd_ps(dmin, blk_min, acc1);
  }
}

// Tile group g's 16 outputs of one activation row (masked at the matrix's last row N).
TS_BF16_INLINE void store_group(__m512 acc0, __m512 acc1, const float* bias, float* y, int64_t g, int64_t N) {
  const int64_t n = g * kTileRows, rows = std::min<int64_t>(kTileRows, N - n);
  const __mmask16 m = rows == 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
  __m512 out = _mm512_add_ps(acc0, acc1);
  if (bias) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, bias + n));
  _mm512_mask_storeu_ps(y + n, m, out);
}

// y[r][16 g + i] for R activation rows x[r] and tile group g (16 weight rows), masked at the
// matrix's last row. Each row's sums are the same instructions in the same order whatever R
// is, so a batched decode step computes what R single steps compute, bit for bit; the tiles'
// loads and unpacking are shared by the rows.
template <DType kType, int R>
TS_BF16 void gemv_x16_group(const Q8Row* const* x, const uint8_t* tiles, int64_t N, int64_t K, const float* bias,
                            float* const* y, int64_t g, bool prefetch) {
  constexpr X16Layout L = x16_layout(kType);
  static_assert(L.bytes > 0);
  constexpr int kChunks = int(L.values / 32);
  constexpr int64_t kLines = (L.bytes + 63) / 64, kAhead = 4096;
  constexpr int32_t kOffset = L.offset;
  constexpr bool kHalves = kType == DType::Q6_K;  // a scale per 16 values
  const int64_t blocks = K / L.values;
  const __m512 lo_scale = _mm512_set1_ps(1.0f / Q8Row::kLoScale);
  const int32_t* xh[R];
  const int32_t* xl[R];
  for (int r = 0; r < R; ++r) {
    xh[r] = reinterpret_cast<const int32_t*>(x[r]->hi.data());
    xl[r] = reinterpret_cast<const int32_t*>(x[r]->lo.data());
  }
  const uint8_t* tile = tiles + g * blocks * L.bytes;
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, tile += L.bytes) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
    // K-quants: the chunks' sums before the super-block's d (and dmin) scale them.
    __m512 blk[R], blk_min[R];
    for (int r = 0; r < R; ++r) blk[r] = blk_min[r] = _mm512_setzero_ps();
    for (int j = 0; j < kChunks; ++j) {
      // Ask for the stream ahead, across the 4 KiB pages where the hardware prefetchers stop:
      // into L2, 4 KiB ahead, a few lines per chunk. Measured on 1B Q4_K_M / Q8_0 decode (2
      // threads, medians of 3): 21.2 / 16.5 tok/s with L1 prefetches 2 KiB ahead, a K-quant
      // tile's 37 lines at once; 26.6 / 19.9 so (the L1's few miss buffers were the limit).
      if (prefetch)
        for (int64_t line = j * kLines / kChunks; line < (j + 1) * kLines / kChunks; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(tile) + kAhead + 64 * line, _MM_HINT_T1);
      const int64_t xb = b * kChunks + j;  // x's 32-value block
      // [r][0]: the chunk (or its first 16 values), [r][1]: its second 16 values (Q6_K).
      __m512i sh[R][2], sl[R][2];
      for (int r = 0; r < R; ++r) {
        const int32_t* s16h = x[r]->sum_hi.data() + 2 * xb;
        const int32_t* s16l = x[r]->sum_lo.data() + 2 * xb;
        if constexpr (kHalves) {
          for (int h = 0; h < 2; ++h) {
            sh[r][h] = _mm512_set1_epi32(-kOffset * s16h[h]);
            sl[r][h] = _mm512_set1_epi32(-kOffset * s16l[h]);
          }
        } else {
          sh[r][0] = _mm512_set1_epi32(-kOffset * (s16h[0] + s16h[1]));
          sl[r][0] = _mm512_set1_epi32(-kOffset * (s16l[0] + s16l[1]));
        }
      }
      for (int c = 0; c < 4; ++c) {  // value vectors 2c and 2c + 1
        __m512i v0, v1;
        value_vectors<kType>(tile, j, c, v0, v1);
        const int h = kHalves ? c / 2 : 0;
        for (int r = 0; r < R; ++r) {
          const int32_t* bh = xh[r] + xb * 8;  // x's 32 values of each term as 8 groups of four
          const int32_t* bl = xl[r] + xb * 8;
          sh[r][h] = _mm512_dpbusd_epi32(sh[r][h], v0, _mm512_set1_epi32(bh[2 * c]));
          sl[r][h] = _mm512_dpbusd_epi32(sl[r][h], v0, _mm512_set1_epi32(bl[2 * c]));
          sh[r][h] = _mm512_dpbusd_epi32(sh[r][h], v1, _mm512_set1_epi32(bh[2 * c + 1]));
          sl[r][h] = _mm512_dpbusd_epi32(sl[r][h], v1, _mm512_set1_epi32(bl[2 * c + 1]));
        }
      }
      for (int r = 0; r < R; ++r)
        finish_chunk<kType>(x[r]->d[size_t(xb)], x[r]->dsum[size_t(xb)], tile, j, sh[r], sl[r], d, lo_scale, blk[r],
                            blk_min[r], acc0[r], acc1[r]);
    }
    for (int r = 0; r < R; ++r) finish_block<kType>(tile, d, blk[r], blk_min[r], acc0[r], acc1[r]);
  }
  for (int r = 0; r < R; ++r) store_group(acc0[r], acc1[r], bias, y[r], g, N);
}

// ---- The batched decode GEMV on AMX tiles (AMX-INT8). A chunk's 16 weight rows x 32 values
// in the x16 layout (lane i: four consecutive values of row i), unpacked to signed bytes (the
// stored offset taken out), are an AMX B tile; an A tile holds the chunk's 32 values of x's
// hi terms for R rows and of its lo terms below them (2R <= 16 tile rows); one TDPBSSD makes
// every row's two integer dots at once, which the vector unit then scales exactly as the
// VNNI GEMV does (finish_chunk). The integer dots are exact whatever their order, so each
// row is its one-row GEMV's result bit for bit; the AMX unit takes the dot products off the
// vector ports, and signed weights spare each row the offset's correction. Measured
// (tessera_kernel_bench --only bgemv, 2 threads, [2048 x 2048] out of cache), 8 rows: Q4_0
// 190 us (unsigned weights with the offset corrected per row: 220-235; VNNI 266), Q4_K 216
// (VNNI 271), Q8_0 250 (VNNI 324); 2 and 4 rows stay on VNNI. What limits 8 rows is the
// per-row scaling in finish_chunk, which both paths share, more than the dot products.
constexpr int kAmxGemvRows = 8;  // activation rows per A tile (hi and lo: 16 tile rows)
// The decode GEMV's smallest chunk of work for a thread, in blocks of 16 weight rows: even,
// so the AMX GEMV's pairs of groups stay pairs.
constexpr int64_t kGemvMinGrain = 2;

// A round is two tile products: two chunks of one tile group, Q6_K's two halves of one chunk
// (a scale per 16 values), or one chunk of two tile groups. Tiles 0/1: A (x's
// terms) of product 0/1, 2/3: B (the weights), 4/5 and 6/7: C (the dots) of even and odd
// rounds, so that a round's products wait neither for each other nor for the previous round's
// stores.
TS_AMX_INT8 void amx_gemv_config(int R, int sub) {
  AmxConfig cfg;
  for (int i = 0; i < 2; ++i) {
    cfg.colsb[i] = uint16_t(sub);
    cfg.rows[i] = uint8_t(2 * R);
    cfg.colsb[2 + i] = 64;
    cfg.rows[2 + i] = uint8_t(sub / 4);
  }
  for (int i = 4; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = uint8_t(2 * R);
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // as amx_begin: ldtilecfg reads cfg
  _tile_loadconfig(&cfg);
}

// One product: C = A . B (A: 2R rows of x's terms, lda apart; B: value vectors 64 bytes
// apart), left in tile C for a later _tile_stored. A macro: the tile intrinsics take the tile
// numbers as literal text.
#define TS_AMX_PRODUCT(A, B, C, a, lda, w) \
  do {                                     \
    _tile_loadd(A, a, lda);                \
    _tile_loadd(B, w, 64);                 \
    _tile_zero(C);                         \
    _tile_dpbssd(C, A, B);                 \
  } while (0)
// The same with A already in its tile (a pair's second group: the chunk's terms serve both).
#define TS_AMX_PRODUCT_SAME_A(A, B, C, w) \
  do {                                    \
    _tile_loadd(B, w, 64);                \
    _tile_zero(C);                        \
    _tile_dpbssd(C, A, B);                \
  } while (0)

// A block of kAmxGemvRows rows as the AMX GEMV reads it (amx_gemv_terms writes it): per
// 32-value chunk, 512 bytes of terms (the R rows' hi terms, 32 bytes each, then their lo
// terms: an A tile of 8 whole cache lines read in order); after every chunk's terms, per
// chunk the R rows' scales d, then their d * block sums: the scaling reads one array at fixed
// offsets rather than each row's vectors.
constexpr int64_t amx_gemv_block_bytes(int64_t K) {
  return 2 * kAmxGemvRows * K + K / 32 * 2 * kAmxGemvRows * int64_t(sizeof(float));
}

// gemv_x16_group for R = kAmxGemvRows rows given as one block of amx_gemv_block_bytes (a), for
// kGroups (1 or 2) tile groups from g on, as a pipeline over rounds: round k + 2's weights are
// unpacked, round k + 1's products started and round k's dots stored and scaled in the same
// step, so the AMX unit's latency and the stores it reads and writes overlap the vector unit's
// work. Two groups share each A tile load and read the weights as two streams at once, which
// the memory system serves faster than one stream while the kernel computes (measured on
// tessera_kernel_bench --only bgemv, 2 threads, [2048 x 2048] out of cache, 8 rows, medians of
// 3 interleaved: Q4_0 159 us against 186, Q8_0 199 against 220, Q4_K 194 against 200; in L2
// the two are alike, and three groups were slower, their 24 accumulators spilling). The steady
// rounds run without a branch (their scaling then keeps the accumulators in registers); the
// last two rounds and a chunk past the end (an odd count: the last chunk again, not scaled)
// apart.
template <DType kType, int kGroups>
TS_AMX_INT8 void gemv_x16_group_amx(const int8_t* a, const uint8_t* tiles, int64_t N, int64_t K, const float* bias,
                                    float* const* y, int64_t g, bool prefetch) {
  constexpr int R = kAmxGemvRows;  // a constant: the accumulators stay in registers
  constexpr X16Layout L = x16_layout(kType);
  constexpr int kChunks = int(L.values / 32);
  constexpr int64_t kLines = (L.bytes + 63) / 64, kAhead = 4096;
  constexpr bool kHalves = kType == DType::Q6_K;
  static_assert(kGroups == 1 || (kGroups == 2 && !kHalves), "a pair of groups takes a whole chunk per product");
  constexpr int kHalvesPer = kHalves ? 2 : 1;
  constexpr int kRound = kGroups == 2 ? 1 : 2 / kHalvesPer;  // chunks per round
  constexpr int kUnits = kGroups * kRound;  // (chunk, group) pairs a round unpacks and scales
  const int64_t blocks = K / L.values, chunks = blocks * kChunks, rounds = (chunks + kRound - 1) / kRound;
  const int64_t group_bytes = blocks * L.bytes;
  const float* scales = reinterpret_cast<const float*>(a + 2 * R * K);  // [chunk][d: R, dsum: R]
  const __m512 lo_scale = _mm512_set1_ps(1.0f / Q8Row::kLoScale);
  const uint8_t* first_tile = tiles + g * group_bytes;
  alignas(64) uint8_t unpacked[3][2][512];  // a round's value vectors (per unit), three rounds in turn
  alignas(64) int32_t dots[2][2][16 * 16];  // [round parity][product][tile row][weight row]
  __m512 acc0[kGroups][R], acc1[kGroups][R], blk[kGroups][R], blk_min[kGroups][R];
  for (int p = 0; p < kGroups; ++p)
    for (int r = 0; r < R; ++r) acc0[p][r] = acc1[p][r] = blk[p][r] = blk_min[p][r] = _mm512_setzero_ps();
  // Unit i of round k: its chunk (past the end for the last round of an odd count) and group.
  auto chunk_at = [&](int64_t k, int i) { return kGroups == 2 ? k : k * kRound + i; };
  auto chunk_of = [&](int64_t k, int i) { return std::min(chunk_at(k, i), chunks - 1); };
  auto group_of = [](int i) { return kGroups == 2 ? i : 0; };
  auto tile_of = [&](int64_t q, int p) { return first_tile + p * group_bytes + (q / kChunks) * L.bytes; };

  auto unpack_round = [&](int64_t k, uint8_t (*out)[512]) TS_AMX_INT8 __attribute__((always_inline)) {
    for (int i = 0; i < kUnits; ++i) {
      const int p = group_of(i);
      const int64_t q = chunk_of(k, i);
      const int j = int(q % kChunks);
      const uint8_t* tile = tile_of(q, p);
      if (prefetch) {  // as gemv_x16_group; past a group's end into the next pass's group p
        const bool past = (q / kChunks) * L.bytes + kAhead >= group_bytes;
        const char* ahead = reinterpret_cast<const char*>(tile) + kAhead + (past ? (kGroups - 1) * group_bytes : 0);
        for (int64_t line = j * kLines / kChunks; line < (j + 1) * kLines / kChunks; ++line)
          _mm_prefetch(ahead + 64 * line, _MM_HINT_T1);
      }
      for (int c = 0; c < 4; ++c) {
        __m512i v0, v1;
        signed_value_vectors<kType>(tile, j, c, v0, v1);
        _mm512_store_si512(out[i] + 128 * c, v0);
        _mm512_store_si512(out[i] + 128 * c + 64, v1);
      }
    }
  };
  auto dot_round = [&](int64_t k, const uint8_t (*w)[512]) TS_AMX_INT8 __attribute__((always_inline)) {
    const int8_t* a0 = a + chunk_of(k, 0) * (2 * R * 32);
    const int8_t* a1 = kHalves ? a0 + 16 : a + chunk_of(k, 1) * (2 * R * 32);  // a pair: a0
    const uint8_t* w0 = w[0];
    const uint8_t* w1 = kHalves ? w0 + 256 : w[1];
    if constexpr (kGroups == 2) {
      if (k & 1) {
        TS_AMX_PRODUCT(0, 2, 6, a0, 32, w0);
        TS_AMX_PRODUCT_SAME_A(0, 3, 7, w1);
      } else {
        TS_AMX_PRODUCT(0, 2, 4, a0, 32, w0);
        TS_AMX_PRODUCT_SAME_A(0, 3, 5, w1);
      }
    } else if (k & 1) {
      TS_AMX_PRODUCT(0, 2, 6, a0, 32, w0);
      TS_AMX_PRODUCT(1, 3, 7, a1, 32, w1);
    } else {
      TS_AMX_PRODUCT(0, 2, 4, a0, 32, w0);
      TS_AMX_PRODUCT(1, 3, 5, a1, 32, w1);
    }
  };
  // Round k's dots to memory, issued after round k + 1's products: the AMX unit has had a
  // round's time to finish them, so the stores do not wait on the products.
  auto store_round = [&](int64_t k) TS_AMX_INT8 __attribute__((always_inline)) {
    int32_t(*out)[256] = dots[k & 1];
    if (k & 1) {
      _tile_stored(6, out[0], 64);
      _tile_stored(7, out[1], 64);
    } else {
      _tile_stored(4, out[0], 64);
      _tile_stored(5, out[1], 64);
    }
  };
  // Scales unit i of round k (Q6_K: both halves, its two products, of the round's one chunk).
  auto scale_chunk = [&](int64_t k, int i) TS_AMX_INT8 __attribute__((always_inline)) {
    const int32_t(*in)[256] = dots[k & 1];
    const int p = group_of(i);
    const int64_t q = chunk_at(k, i);
    const int j = int(q % kChunks);
    const uint8_t* tile = tile_of(q, p);
    const float* xs = scales + q * 2 * R;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
    for (int r = 0; r < R; ++r) {
      __m512i sh[2], sl[2];
      for (int h = 0; h < kHalvesPer; ++h) {
        const int32_t* c = in[kHalves ? h : i];
        sh[h] = _mm512_load_si512(c + 16 * r);
        sl[h] = _mm512_load_si512(c + 16 * (R + r));
      }
      finish_chunk<kType>(xs[r], xs[R + r], tile, j, sh, sl, d, lo_scale, blk[p][r], blk_min[p][r], acc0[p][r],
                          acc1[p][r]);
      if (j == kChunks - 1) {
        finish_block<kType>(tile, d, blk[p][r], blk_min[p][r], acc0[p][r], acc1[p][r]);
        blk[p][r] = blk_min[p][r] = _mm512_setzero_ps();
      }
    }
  };
  uint8_t(*u0)[512] = unpacked[0];  // round k's value vectors
  uint8_t(*u1)[512] = unpacked[1];  // round k + 1's
  uint8_t(*u2)[512] = unpacked[2];  // round k + 2's
  unpack_round(0, u0);
  if (rounds > 1) unpack_round(1, u1);
  dot_round(0, u0);
  int64_t k = 0;
  for (; k + 2 < rounds; ++k) {  // the steady rounds: every chunk of round k is in the matrix
    unpack_round(k + 2, u2);
    dot_round(k + 1, u1);
    store_round(k);
    for (int i = 0; i < kUnits; ++i) scale_chunk(k, i);
    uint8_t(*t)[512] = u0;
    u0 = u1;
    u1 = u2;
    u2 = t;
  }
  for (; k < rounds; ++k) {
    if (k + 1 < rounds) dot_round(k + 1, u1);
    store_round(k);
    for (int i = 0; i < kUnits && chunk_at(k, i) < chunks; ++i) scale_chunk(k, i);
    std::swap(u0, u1);
  }
  for (int p = 0; p < kGroups; ++p)
    for (int r = 0; r < R; ++r) store_group(acc0[p][r], acc1[p][r], bias, y[r], g + p, N);
}

// Groups [g0, g1) for `rows` (a multiple of kAmxGemvRows) activation rows, kAmxGemvRows at a
// time (a: their blocks, see amx_gemv_block_bytes), two groups a pass but for Q6_K and an odd
// group left at the end.
template <DType kType>
TS_AMX_INT8 void gemv_x16_amx(int rows, const int8_t* a, const uint8_t* tiles, int64_t N, int64_t K, const float* bias,
                              float* const* y, int64_t g0, int64_t g1) {
  constexpr bool kPairs = kType != DType::Q6_K;
  amx_gemv_config(kAmxGemvRows, kType == DType::Q6_K ? 16 : 32);
  for (int64_t g = g0; g < g1;) {
    const bool pair = kPairs && g + 1 < g1;
    for (int r0 = 0; r0 < rows; r0 += kAmxGemvRows) {
      const int8_t* block = a + r0 / kAmxGemvRows * amx_gemv_block_bytes(K);
      if constexpr (kPairs)
        if (pair) {
          gemv_x16_group_amx<kType, 2>(block, tiles, N, K, bias, y + r0, g, r0 == 0);
          continue;
        }
      gemv_x16_group_amx<kType, 1>(block, tiles, N, K, bias, y + r0, g, r0 == 0);
    }
    g += pair ? 2 : 1;
  }
  _tile_release();
}

// Groups [g0, g1) for `rows` activation rows: whole blocks of kAmxGemvRows rows on AMX when a
// (their terms) is given, the rest kGemvRows at a time on VNNI. A group's tiles come from
// memory once and stay in L2 for the next rows.
template <DType kType>
void gemv_x16(const Q8Row* const* x, int rows, const int8_t* a, const uint8_t* tiles, int64_t N, int64_t K,
              const float* bias, float* const* y, int64_t g0, int64_t g1) {
  const int on_amx = a ? rows / kAmxGemvRows * kAmxGemvRows : 0;
  if (on_amx) gemv_x16_amx<kType>(on_amx, a, tiles, N, K, bias, y, g0, g1);
  if (on_amx == rows) return;
  for (int64_t g = g0; g < g1; ++g)
    for (int r0 = on_amx; r0 < rows; r0 += kGemvRows) {
      const bool first = r0 == 0;  // after AMX rows: the tiles are in L2
      switch (std::min(kGemvRows, rows - r0)) {
        case 1: gemv_x16_group<kType, 1>(x + r0, tiles, N, K, bias, y + r0, g, first); break;
        case 2: gemv_x16_group<kType, 2>(x + r0, tiles, N, K, bias, y + r0, g, first); break;
        case 3: gemv_x16_group<kType, 3>(x + r0, tiles, N, K, bias, y + r0, g, first); break;
        default: gemv_x16_group<kType, 4>(x + r0, tiles, N, K, bias, y + r0, g, first); break;
      }
    }
}

// Calls f(std::integral_constant<DType, t>{}) for w's block type t: the one switch from a
// matrix to the kernels templated on their block type.
template <typename F>
void with_block_type(const WeightMatrix& w, F&& f) {
  switch (w.dtype) {
    case DType::Q4_0: return f(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q4_1: return f(std::integral_constant<DType, DType::Q4_1>{});
    case DType::Q5_0: return f(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1: return f(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q5_K: return f(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q8_0: return f(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q6_K: return f(std::integral_constant<DType, DType::Q6_K>{});
    default: fail("cpu kernels: no AVX-512 kernel reads {} weights", dtype_name(w.dtype));
  }
}

// a: x's terms for the AMX GEMV (amx_gemv_terms), or null: the VNNI GEMV.
void gemv_quantized(const Q8Row* const* x, int rows, const int8_t* a, const WeightMatrix& w, const float* bias,
                    float* const* y, int64_t g0, int64_t g1) {
  with_block_type(w, [&](auto type) {
    gemv_x16<decltype(type)::value>(x, rows, a, w.tiles(), w.rows, w.cols, bias, y, g0, g1);
  });
}

// ---- Prefill on quantized weights: AMX-INT8 GEMM, each row the decode GEMV's numbers. x's
// rows are quantized as for the GEMV (Q8Row); an A tile holds 16 rows' hi terms of one 32-value
// chunk, a second their lo terms; the chunk's value vectors, unpacked to signed bytes (q, the
// stored offset taken out: TDPBSSD), are the B tile; the two products are every row's integer
// dots for 16 weight rows, exactly the GEMV's (integers, whatever the order), which
// finish_chunk scales as the GEMV does. So a row of a prefill call is the same fp32 result
// as that row alone in a decode step, whatever T is: the weights are never expanded to bf16,
// and one unpacked B tile serves up to kAmxGemmPanel rows.
constexpr int kAmxGemmRows = 16;   // activation rows per A tile
constexpr int kAmxGemmPanel = 64;  // activation rows that share each unpacked B tile

// Tiles 0/1: A (hi, lo terms; sub bytes wide), 2/3: B (Q6_K: the chunk's two halves), 4/5 and
// 6/7: C (hi and lo dots) of even and odd steps (Q6_K: all four in every step).
TS_AMX_INT8 void amx_gemm_config(int sub) {
  AmxConfig cfg;
  for (int i = 0; i < 2; ++i) {
    cfg.colsb[i] = uint16_t(sub);
    cfg.rows[i] = kAmxGemmRows;
    cfg.colsb[2 + i] = 64;
    cfg.rows[2 + i] = uint8_t(sub / 4);
  }
  for (int i = 4; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = kAmxGemmRows;
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // as amx_begin: ldtilecfg reads cfg
  _tile_loadconfig(&cfg);
}

// One step's products: A tiles from x's hi and lo terms at a (tile row stride lda, the lo
// terms 512 bytes on), B from tile B, into C tiles CH and CL. A macro: literal tile numbers.
#define TS_AMX_DOTS(B, CH, CL, a, lda) \
  do {                                 \
    _tile_loadd(0, a, lda);            \
    _tile_loadd(1, (a) + 512, lda);    \
    _tile_zero(CH);                    \
    _tile_zero(CL);                    \
    _tile_dpbssd(CH, 0, B);            \
    _tile_dpbssd(CL, 1, B);            \
  } while (0)
#define TS_AMX_STORE(CH, CL, out)      \
  do {                                 \
    _tile_stored(CH, (out)[0], 64);    \
    _tile_stored(CL, (out)[1], 64);    \
  } while (0)

// y[t][16 g + i] for the `rows` (<= kAmxGemmPanel) activation rows x[t] whose terms are
// `terms` (amx_gemm_terms), tile group g. Steps run over (chunk, block of 16 rows); step
// s + 1's products are started before step s's are stored and scaled, so the AMX unit works
// while the vector unit scales.
template <DType kType>
TS_AMX_INT8 void gemm_x16_group_amx(const Q8Row* const* x, int rows, const int8_t* terms, const uint8_t* tiles,
                                    int64_t N, int64_t K, const float* bias, float* y, int64_t g, bool prefetch) {
  constexpr X16Layout L = x16_layout(kType);
  constexpr int kChunks = int(L.values / 32);
  constexpr int64_t kLines = (L.bytes + 63) / 64, kAhead = 4096;
  constexpr bool kHalves = kType == DType::Q6_K;
  constexpr int kHalvesPer = kHalves ? 2 : 1;
  const int64_t blocks = K / L.values, chunks = blocks * kChunks;
  const int mblocks = (rows + kAmxGemmRows - 1) / kAmxGemmRows;
  const int64_t steps = chunks * mblocks;
  const __m512 lo_scale = _mm512_set1_ps(1.0f / Q8Row::kLoScale);
  const uint8_t* first_tile = tiles + g * blocks * L.bytes;
  struct Acc {
    __m512 acc0, acc1, blk, blk_min;
  };
  alignas(64) Acc acc[kAmxGemmPanel];
  for (int t = 0; t < rows; ++t) acc[t].acc0 = acc[t].acc1 = acc[t].blk = acc[t].blk_min = _mm512_setzero_ps();
  alignas(64) uint8_t b_tile[512];           // the chunk's value vectors, signed
  alignas(64) int32_t dots[2][4][16 * 16];   // [step parity][hi, lo (, second half's hi, lo)][row][weight row]
  auto tile_of = [&](int64_t q) { return first_tile + (q / kChunks) * L.bytes; };

  auto dot_step = [&](int64_t s) TS_AMX_INT8 {
    const int64_t q = s / mblocks;
    const int m = int(s % mblocks);
    if (m == 0) {  // a new chunk: its weights unpacked once for every block of rows
      const uint8_t* tile = tile_of(q);
      const int j = int(q % kChunks);
      if (prefetch)  // as gemv_x16_group
        for (int64_t line = j * kLines / kChunks; line < (j + 1) * kLines / kChunks; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(tile) + kAhead + 64 * line, _MM_HINT_T1);
      for (int c = 0; c < 4; ++c) {
        __m512i v0, v1;
        signed_value_vectors<kType>(tile, j, c, v0, v1);
        _mm512_store_si512(b_tile + 128 * c, v0);
        _mm512_store_si512(b_tile + 128 * c + 64, v1);
      }
      _tile_loadd(2, b_tile, 64);
      if constexpr (kHalves) _tile_loadd(3, b_tile + 256, 64);
    }
    const int8_t* a = terms + (int64_t(m) * chunks + q) * 1024;
    if constexpr (kHalves) {
      TS_AMX_DOTS(2, 4, 5, a, 32);  // the halves' products wait for each other's A tiles
      TS_AMX_STORE(4, 5, dots[s & 1]);
      TS_AMX_DOTS(3, 6, 7, a + 16, 32);
      TS_AMX_STORE(6, 7, dots[s & 1] + 2);
    } else if (s & 1) {
      TS_AMX_DOTS(2, 6, 7, a, 32);
    } else {
      TS_AMX_DOTS(2, 4, 5, a, 32);
    }
  };
  auto store_step = [&](int64_t s) TS_AMX_INT8 {
    if constexpr (!kHalves) {
      if (s & 1)
        TS_AMX_STORE(6, 7, dots[1]);
      else
        TS_AMX_STORE(4, 5, dots[0]);
    }
  };
  auto scale_step = [&](int64_t s) TS_AMX_INT8 {
    const int64_t q = s / mblocks;
    const int m = int(s % mblocks);
    const int j = int(q % kChunks);
    const uint8_t* tile = tile_of(q);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
    int32_t(*in)[256] = dots[s & 1];
    const int t1 = std::min(rows, (m + 1) * kAmxGemmRows);
    for (int t = m * kAmxGemmRows; t < t1; ++t) {
      const int r = t - m * kAmxGemmRows;
      __m512i sh[2], sl[2];
      for (int h = 0; h < kHalvesPer; ++h) {
        sh[h] = _mm512_load_si512(in[2 * h] + 16 * r);
        sl[h] = _mm512_load_si512(in[2 * h + 1] + 16 * r);
      }
      Acc& a = acc[t];
      finish_chunk<kType>(x[t]->d[size_t(q)], x[t]->dsum[size_t(q)], tile, j, sh, sl, d, lo_scale, a.blk, a.blk_min,
                          a.acc0, a.acc1);
      if (j == kChunks - 1) {
        finish_block<kType>(tile, d, a.blk, a.blk_min, a.acc0, a.acc1);
        a.blk = a.blk_min = _mm512_setzero_ps();
      }
    }
  };
  dot_step(0);
  for (int64_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) dot_step(s + 1);
    store_step(s);
    scale_step(s);
  }
  for (int t = 0; t < rows; ++t) store_group(acc[t].acc0, acc[t].acc1, bias, y + int64_t(t) * N, g, N);
}
#undef TS_AMX_DOTS
#undef TS_AMX_STORE

// x's terms as the AMX GEMM's A tiles: per block of 16 rows and 32-value chunk, 1 KiB: the
// 16 rows' hi terms (32 bytes each), then their lo terms; rows past T zero. Contiguous, so a
// step's two A tiles are 16 whole cache lines.
void amx_gemm_terms(const Q8Row& x, int64_t t, int64_t K, int8_t* terms) {
  const int64_t chunks = K / 32;
  int8_t* at = terms + (t / kAmxGemmRows) * chunks * 1024 + (t % kAmxGemmRows) * 32;
  for (int64_t q = 0; q < chunks; ++q, at += 1024) {
    std::memcpy(at, x.hi.data() + q * 32, 32);
    std::memcpy(at + 512, x.lo.data() + q * 32, 32);
  }
}

// Groups [g0, g1) for T activation rows (terms: amx_gemm_terms), a panel of kAmxGemmPanel
// rows at a time; a group's tiles stay in L1/L2 for the next panel.
template <DType kType>
TS_AMX_INT8 void gemm_x16_amx(const Q8Row* const* x, int64_t T, const int8_t* terms, const uint8_t* tiles, int64_t N,
                              int64_t K, const float* bias, float* y, int64_t g0, int64_t g1) {
  amx_gemm_config(kType == DType::Q6_K ? 16 : 32);
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t t0 = 0; t0 < T; t0 += kAmxGemmPanel)
      gemm_x16_group_amx<kType>(x + t0, int(std::min<int64_t>(kAmxGemmPanel, T - t0)), terms + t0 / 16 * (K / 32) * 1024,
                                tiles, N, K, bias, y + t0 * N, g, t0 == 0);
  _tile_release();
}

void gemm_quantized_amx(const Q8Row* const* x, int64_t T, const int8_t* terms, const WeightMatrix& w,
                        const float* bias, float* y, int64_t g0, int64_t g1) {
  with_block_type(w, [&](auto type) {
    gemm_x16_amx<decltype(type)::value>(x, T, terms, w.tiles(), w.rows, w.cols, bias, y, g0, g1);
  });
}

// ---- The bf16 decode GEMV on AMX-BF16 (1 to 16 activation rows). A bf16 weight matrix's
// rows are row-major, which is what an A tile holds: 16 weight rows x 32 values, loaded in
// place. The activation rows, their values interleaved in pairs (B[kp][2r + e] =
// x[r][32q + 2kp + e]), are the B tile (R <= 16 columns). One TDPBF16PS per 16 x 32 weights
// makes every row's partial dots whatever R is, so the compute no longer grows with R.
// Measured (tessera_kernel_bench --only bgemv, 2 threads, [2048 x 2048] out of cache), 1 / 8 /
// 16 rows: 355 / 391 / 518 us, against the `vdpbf16ps` GEMV's 353 / 681 / 1037. Chunk q accumulates into C tile 4 + q % 4, summed (C4 + C5) + (C6 + C7) at the
// end: each output's order of operations depends on K alone, so a row alone and in a batch
// gives the same numbers bit for bit (bf16 products, fp32 sums: the GEMM's numerics class).
constexpr int kAmxBf16Rows = 16;  // activation rows per B tile

// Whether the AMX-BF16 GEMV reads a bf16 matrix of K columns (its chunks are whole: the A
// tiles read rows in place, 32 values at a time).
bool amx_bf16_gemv(int64_t K) { return use_amx() && K % 32 == 0; }

// Activation row r (bf16, x), chunks [q0, q1), where the B tiles of its block of kAmxBf16Rows
// rows (R of them) hold it: per 32-value chunk, 16 pair rows of R columns (4 bytes each). One row alone is its
// own B tiles (R = 1: the pairs in order), so only batches are laid out.
TS_AMX void amx_bf16_terms(const uint16_t* x, int r, int R, uint32_t* block, int64_t q0, int64_t q1) {
  const __m512i at = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(R));
  for (int64_t q = q0; q < q1; ++q)
    _mm512_i32scatter_epi32(block + q * 16 * R + r, at, _mm512_loadu_si512(x + q * 32), 4);
}

TS_AMX void amx_bf16_gemv_config(int R, int rows) {
  AmxConfig cfg;
  for (int i = 0; i < 2; ++i) {
    cfg.colsb[i] = 64;  // A: weight rows x 32 bf16
    cfg.rows[i] = uint8_t(rows);
    cfg.colsb[2 + i] = uint16_t(R * 4);  // B: 16 pair rows x R columns
    cfg.rows[2 + i] = 16;
  }
  for (int i = 4; i < 8; ++i) {
    cfg.colsb[i] = uint16_t(R * 4);  // C: weight rows x R fp32
    cfg.rows[i] = uint8_t(rows);
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // as amx_begin: ldtilecfg reads cfg
  _tile_loadconfig(&cfg);
}

// y[r][n, n + rows) for R activation rows whose B tiles are xt, weight rows n.. of w.
TS_AMX void amx_bf16_gemv_group(const uint32_t* xt, int R, const uint16_t* w, int64_t K, int64_t n, int rows,
                                const float* bias, float* const* y) {
  const int64_t chunks = K / 32, ldw = K * 2, ldx = R * 4;
  const uint16_t* a = w + n * K;
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  // The weights' 16 row streams, 4 KiB ahead of each (the prefetchers stop at page ends).
  auto prefetch = [&](int64_t q) TS_AMX {
    for (int i = 0; i < rows; ++i) _mm_prefetch(reinterpret_cast<const char*>(a + i * K + q * 32) + 4096, _MM_HINT_T1);
  };
  int64_t q = 0;
  for (; q + 4 <= chunks; q += 4) {
    prefetch(q);
    prefetch(q + 2);
    _tile_loadd(0, a + q * 32, ldw);
    _tile_loadd(2, xt + q * 16 * R, ldx);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(1, a + (q + 1) * 32, ldw);
    _tile_loadd(3, xt + (q + 1) * 16 * R, ldx);
    _tile_dpbf16ps(5, 1, 3);
    _tile_loadd(0, a + (q + 2) * 32, ldw);
    _tile_loadd(2, xt + (q + 2) * 16 * R, ldx);
    _tile_dpbf16ps(6, 0, 2);
    _tile_loadd(1, a + (q + 3) * 32, ldw);
    _tile_loadd(3, xt + (q + 3) * 16 * R, ldx);
    _tile_dpbf16ps(7, 1, 3);
  }
  // The last chunks (K / 32 not a multiple of 4) go to C tiles 4, 5, 6 in order.
  if (q < chunks) {
    _tile_loadd(0, a + q * 32, ldw);
    _tile_loadd(2, xt + q * 16 * R, ldx);
    _tile_dpbf16ps(4, 0, 2);
    ++q;
  }
  if (q < chunks) {
    _tile_loadd(1, a + q * 32, ldw);
    _tile_loadd(3, xt + q * 16 * R, ldx);
    _tile_dpbf16ps(5, 1, 3);
    ++q;
  }
  if (q < chunks) {
    _tile_loadd(0, a + q * 32, ldw);
    _tile_loadd(2, xt + q * 16 * R, ldx);
    _tile_dpbf16ps(6, 0, 2);
  }
  alignas(64) float c[4][16 * kAmxBf16Rows];
  _tile_stored(4, c[0], ldx);
  _tile_stored(5, c[1], ldx);
  _tile_stored(6, c[2], ldx);
  _tile_stored(7, c[3], ldx);
  for (int i = 0; i < rows; ++i)
    for (int r = 0; r < R; ++r) {
      const int e = i * R + r;
      float s = (c[0][e] + c[1][e]) + (c[2][e] + c[3][e]);
      if (bias) s += bias[n + i];
      y[r][n + i] = s;
    }
}

// Weight rows [n0, n1) (n0 a multiple of 16) for R activation rows (xt: amx_bf16_terms).
TS_AMX void amx_bf16_gemv_range(const uint32_t* xt, int R, const uint16_t* w, int64_t K, const float* bias,
                                float* const* y, int64_t n0, int64_t n1) {
  int configured = 0;
  for (int64_t n = n0; n < n1; n += 16) {
    const int rows = int(std::min<int64_t>(16, n1 - n));
    if (rows != configured) amx_bf16_gemv_config(R, configured = rows);
    amx_bf16_gemv_group(xt, R, w, K, n, rows, bias, y);
  }
  _tile_release();
}

// Row r's terms and scales of chunks [q0, q1) where the AMX GEMV reads them: its block of
// kAmxGemvRows rows, laid out as amx_gemv_block_bytes says.
void amx_gemv_terms(const Q8Row& x, int64_t r, int64_t K, int8_t* terms, int64_t q0, int64_t q1) {
  constexpr int R = kAmxGemvRows;
  int8_t* block = terms + r / R * amx_gemv_block_bytes(K);
  int8_t* at = block + r % R * 32 + q0 * 2 * R * 32;
  float* scales = reinterpret_cast<float*>(block + 2 * R * K) + r % R + q0 * 2 * R;
  for (int64_t q = q0; q < q1; ++q, at += 2 * R * 32, scales += 2 * R) {
    std::memcpy(at, x.hi.data() + q * 32, 32);
    std::memcpy(at + R * 32, x.lo.data() + q * 32, 32);
    scales[0] = x.d[size_t(q)];
    scales[R] = x.dsum[size_t(q)];
  }
}

// The decode GEMV of `rows` activation rows (x fp32, xb their bf16 copies, row stride Kp)
// against every matrix of outs: row r of each output exactly as a one-row call computes it.
void gemv_outs(const float* x, int64_t rows, const uint16_t* xb, int64_t Kp, std::span<const MatmulOut> outs,
               ThreadPool& pool) {
  const int64_t K = outs[0].w->cols;
  bool any_quantized = false;
  for (const MatmulOut& o : outs) any_quantized = any_quantized || o.w->quantized();
  thread_local std::vector<Q8Row> xq_buf;
  if (xq_buf.size() < size_t(rows)) xq_buf.resize(size_t(rows));
  // Several rows on quantized weights: the AMX GEMV, which reads x's terms as A tiles (whole
  // blocks of kAmxGemvRows rows; the rest run on VNNI).
  thread_local std::vector<int8_t> terms_buf;
  const int64_t on_amx =
      any_quantized && rows >= kAmxGemvRows && use_amx() && cpu_has_amx_int8() ? rows / kAmxGemvRows * kAmxGemvRows : 0;
  const size_t terms_bytes = size_t(on_amx / kAmxGemvRows * amx_gemv_block_bytes(K));
  if (on_amx && terms_buf.size() < terms_bytes) terms_buf.resize(terms_bytes);
  // The workers read and write these (a name of a thread_local would be their own).
  Q8Row* xq_rows = xq_buf.data();
  int8_t* terms_data = terms_buf.data();
  const int8_t* terms = on_amx ? terms_data : nullptr;
  std::array<const Q8Row*, kMaxGemvRows> xq;
  std::array<const uint16_t*, kMaxGemvRows> xr;
  for (int64_t r = 0; r < rows; ++r) {
    xq[size_t(r)] = xq_rows + r;
    xr[size_t(r)] = xb ? xb + r * Kp : nullptr;
  }
  // Rows on bf16 weights: the AMX-BF16 GEMV, which reads x's rows as B tiles, blocks of
  // kAmxBf16Rows rows (one row alone: its bf16 copy as it is).
  bool any_bf16 = false;
  for (const MatmulOut& o : outs) any_bf16 = any_bf16 || !o.w->quantized();
  const bool bf16_amx = any_bf16 && amx_bf16_gemv(K);
  const bool bf16_tiles = bf16_amx && rows > 1;  // x's rows laid out as B tiles (one row is its own)
  const int64_t bt_block = K / 32 * 16 * kAmxBf16Rows;  // uint32 per block of rows
  thread_local std::vector<uint32_t, AlignedAlloc<uint32_t>> bt_buf;
  if (bf16_tiles) {
    const size_t need = size_t((rows + kAmxBf16Rows - 1) / kAmxBf16Rows * bt_block);
    if (bt_buf.size() < need) bt_buf.resize(need);
  }
  uint32_t* bt = bt_buf.data();
  auto block_rows = [&](int64_t blk) { return int(std::min<int64_t>(kAmxBf16Rows, rows - blk * kAmxBf16Rows)); };
  // x quantized (and laid out as A or B tiles) by every thread, each taking a range of K's
  // 32-value chunks of every row: the rows of a tile block share cache lines (the A tiles'
  // scales, the B tiles' pairs), which threads taking rows would write in turns.
  if (any_quantized || bf16_tiles) {
    if (any_quantized)
      for (int64_t r = 0; r < rows; ++r) xq_rows[r].resize(K);
    auto quantize = [&](int64_t q0, int64_t q1) {
      for (int64_t r = 0; r < rows; ++r) {
        if (any_quantized) xq_rows[r].quantize_blocks(x + r * K, q0, q1);
        if (r < on_amx) amx_gemv_terms(xq_rows[r], r, K, terms_data, q0, q1);
        if (bf16_tiles) {
          const int64_t blk = r / kAmxBf16Rows;
          amx_bf16_terms(xr[size_t(r)], int(r % kAmxBf16Rows), block_rows(blk), bt + blk * bt_block, q0, q1);
        }
      }
    };
    if (rows > 1)
      pool.parallel_for(K / 32, quantize);
    else
      quantize(0, K / 32);
  }
  // Every matrix's rows in blocks of 16, numbered across the matrices in order, handed
  // out dynamically in chunks that shrink to kGemvMinGrain blocks: a thread that the memory
  // system serves faster takes more, and the two finish a small chunk apart.
  std::array<int64_t, 9> first{};  // first[i]: the first block of outs[i]
  if (outs.size() + 1 > first.size()) {
    for (const MatmulOut& o : outs) gemv_outs(x, rows, xb, Kp, std::span<const MatmulOut>(&o, 1), pool);
    return;
  }
  for (size_t i = 0; i < outs.size(); ++i) first[i + 1] = first[i] + (outs[i].w->rows + 15) / 16;
  const int64_t blocks = first[outs.size()];
  pool.parallel_for_guided(
      blocks,
      [&](int64_t b, int64_t e) {
        std::array<float*, kMaxGemvRows> y;  // row r's output of the matrix at hand
        for (size_t i = 0; i < outs.size() && b < e; ++i) {
          if (b >= first[i + 1]) continue;
          const MatmulOut& o = outs[i];
          for (int64_t r = 0; r < rows; ++r) y[size_t(r)] = o.y + r * o.w->rows;
          const int64_t b0 = b - first[i], b1 = std::min(e, first[i + 1]) - first[i];
          if (o.w->quantized())
            gemv_quantized(xq.data(), int(rows), terms, *o.w, o.bias, y.data(), b0, b1);
          else if (bf16_amx)
            for (int64_t blk = 0; blk * kAmxBf16Rows < rows; ++blk) {
              const uint32_t* xt = rows > 1 ? bt + blk * bt_block : reinterpret_cast<const uint32_t*>(xr[0]);
              amx_bf16_gemv_range(xt, block_rows(blk), o.w->bf16().data, K, o.bias, y.data() + blk * kAmxBf16Rows,
                                  b0 * 16, std::min(o.w->rows, b1 * 16));
            }
          else
            gemv_range(xr.data(), int(rows), o.w->bf16().data, K, o.bias, y.data(), b0 * 16,
                       std::min(o.w->rows, b1 * 16));
          b = first[i + 1];
        }
      },
      kGemvMinGrain);
}

// Quantized matrices at T > 1 (one shared input x): every row exactly as the decode GEMV
// computes it alone (so a row's numbers never depend on T). From kAmxGemmRows rows on with
// AMX-INT8: the GEMM above; otherwise the batched GEMV, kMaxGemvRows rows per pass.
void matmul_quantized(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool) {
  const int64_t K = outs[0].w->cols;
  if (T < kAmxGemmRows || !use_amx() || !cpu_has_amx_int8()) {
    std::vector<MatmulOut> part(outs.begin(), outs.end());
    for (int64_t t0 = 0; t0 < T; t0 += kMaxGemvRows) {
      for (size_t i = 0; i < outs.size(); ++i) part[i].y = outs[i].y + t0 * outs[i].w->rows;
      gemv_outs(x + t0 * K, std::min(kMaxGemvRows, T - t0), nullptr, 0, part, pool);
    }
    return;
  }
  // x's rows quantized, and their terms as A tiles (rows past T: zeros).
  thread_local std::vector<Q8Row> xq_buf;
  thread_local std::vector<int8_t, AlignedAlloc<int8_t>> terms_buf;
  const int64_t Tp = (T + kAmxGemmRows - 1) / kAmxGemmRows * kAmxGemmRows;
  if (xq_buf.size() < size_t(T)) xq_buf.resize(size_t(T));
  if (terms_buf.size() < size_t(Tp * K * 2)) terms_buf.resize(size_t(Tp * K * 2));
  // The workers write these (a name of a thread_local would be their own).
  Q8Row* xq = xq_buf.data();
  int8_t* terms = terms_buf.data();
  pool.parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      xq[t].quantize(x + t * K, K);
      amx_gemm_terms(xq[t], t, K, terms);
    }
  });
  if (Tp > T) {  // the last block's rows past T
    for (int64_t t = T; t < Tp; ++t)
      for (int64_t q = 0; q < K / 32; ++q) {
        int8_t* at = terms + (t / kAmxGemmRows * (K / 32) + q) * 1024 + (t % kAmxGemmRows) * 32;
        std::memset(at, 0, 32);
        std::memset(at + 512, 0, 32);
      }
  }
  std::vector<const Q8Row*> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[size_t(t)] = xq + t;
  // Every matrix's groups of 16 rows, numbered across the matrices, handed out dynamically.
  std::vector<int64_t> first(outs.size() + 1, 0);
  for (size_t i = 0; i < outs.size(); ++i) first[i + 1] = first[i] + (outs[i].w->rows + 15) / 16;
  const int64_t groups = first.back();
  pool.parallel_for(
      groups,
      [&](int64_t b, int64_t e) {
        for (size_t i = 0; i < outs.size() && b < e; ++i) {
          if (b >= first[i + 1]) continue;
          const MatmulOut& o = outs[i];
          const int64_t b1 = std::min(e, first[i + 1]);
          gemm_quantized_amx(rows.data(), T, terms, *o.w, o.bias, o.y, b - first[i], b1 - first[i]);
          b = b1;
        }
      },
      std::max<int64_t>(1, groups / (8 * pool.size())));
}

}  // namespace

void matmul_rows_avx512bf16(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool) {
  if (outs.empty() || T == 0) return;
  const int64_t K = outs[0].w->cols;
  const int64_t Kp = (K + 31) / 32 * 32 + 32;  // as matmul_avx512bf16's
  bool any_bf16 = false;
  for (const MatmulOut& o : outs) any_bf16 = any_bf16 || !o.w->quantized();
  thread_local std::vector<uint16_t> xb_buf;
  if (any_bf16) {
    if (xb_buf.size() < size_t(T * Kp)) xb_buf.resize(size_t(T * Kp));
    convert_rows(x, T, K, Kp, xb_buf.data());
  }
  gemv_outs(x, T, any_bf16 ? xb_buf.data() : nullptr, Kp, outs, pool);
}

void matmul_avx512bf16(const float* x, int64_t T, std::span<const MatmulOut> outs, ThreadPool& pool,
                       const GemmBlocking& blocking) {
  if (outs.empty()) return;
  const int64_t K = outs[0].w->cols;
  // Row stride of the bf16 activations: K padded to 32, plus 32 so that rows are not a power
  // of two apart (which would alias cache sets for K = 2048, 8192, ...).
  const int64_t Kp = (K + 31) / 32 * 32 + 32;
  bool any_bf16 = false;
  for (const MatmulOut& o : outs) any_bf16 = any_bf16 || !o.w->quantized();
  thread_local std::vector<uint16_t> xb_buf;
  uint16_t* xb = nullptr;
  if (any_bf16) {
    // A block of AMX tokens starting before T reads rows up to 31 past it: keep them inside.
    const int64_t rows = T + kAmxTokens;
    if (xb_buf.size() < size_t(rows * Kp)) xb_buf.resize(size_t(rows * Kp));
    xb = xb_buf.data();
    if (T >= 16)
      pool.parallel_for(T, [&](int64_t b, int64_t e) { convert_rows(x + b * K, e - b, K, Kp, xb + b * Kp); });
    else
      convert_rows(x, T, K, Kp, xb);
  }
  if (T == 1) return gemv_outs(x, 1, xb, Kp, outs, pool);  // decode: no allocation on its path
  std::vector<MatmulOut> quantized, bf16;
  for (const MatmulOut& o : outs) (o.w->quantized() ? quantized : bf16).push_back(o);
  if (!quantized.empty()) matmul_quantized(x, T, quantized, pool);
  for (const MatmulOut& o : bf16) {
    const WeightMatrix& w = *o.w;
    const int64_t N = w.rows;
    if (T >= kPackedMinT) {
      const int64_t units = (N + 15) / 16;  // threads split N in groups of 16 rows
      pool.parallel_for(units, [&](int64_t b, int64_t e) {
        gemm_packed_range(xb, Kp, T, w.bf16(), o.bias, o.y, N, b * 16, std::min(N, e * 16), blocking);
      });
    } else {
      const int64_t panels = (N + kNR - 1) / kNR;
      pool.parallel_for(panels, [&](int64_t b, int64_t e) {
        gemm_range(xb, Kp, T, w.bf16(), o.bias, o.y, N, b * kNR, std::min(N, e * kNR));
      });
    }
  }
}

}  // namespace tessera::cpu::detail
