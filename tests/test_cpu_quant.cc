// The cpu kernels on quantized weights: the x16 tiles hold exactly the file's values, and the
// GEMV / GEMM on them compute what their declared numerics say, on every ISA path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cctype>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "convert/gguf_quantize.h"
#include "model/weights.h"
#include "synth/synth.h"
#include "targets/cpu/cpu_runner.h"
#include "targets/target.h"
#include "test_support.h"
#include "oracle/emulate.h"
#include "targets/cpu/kernels.h"
#include "targets/cpu/quant.h"
#include "targets/cpu/weight_store.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera {
namespace {

uint16_t f16_bits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// A [rows, cols] matrix of random blocks of type t, as a file stores it: scales of either
// sign over two decades, every quantized value reachable (int8 -128 included).
std::vector<uint8_t> random_blocks(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(-4.6f, -2.3f);  // |d| in [0.01, 0.1]
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t bb = dtype_block_bytes(t), blocks = rows * cols / dtype_block_values(t);
  std::vector<uint8_t> out(size_t(blocks * bb));
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* p = out.data() + b * bb;
    for (int64_t i = 0; i < bb; ++i) p[i] = uint8_t(byte(rng));
    // The f16 scales: d first (Q6_K: last), then Q4_1's/Q5_1's m or Q4_K's/Q5_K's dmin.
    const uint16_t d = f16_bits((byte(rng) & 1 ? 1.0f : -1.0f) * std::exp(mag(rng)));
    std::memcpy(p + (t == DType::Q6_K ? 208 : 0), &d, 2);
    if (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K) {
      const uint16_t m = f16_bits((byte(rng) & 1 ? 0.5f : -0.5f) * std::exp(mag(rng)));
      std::memcpy(p + 2, &m, 2);
    }
  }
  return out;
}

Weight file_weight(const std::string& name, DType t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols,
                   int64_t unpermute_head_dim = 0) {
  Weight w;
  w.name = w.source_name = name;
  w.info.name = name;
  w.info.dtype = t;
  w.info.shape = {rows, cols};
  w.info.data = bytes.data();
  w.info.nbytes = bytes.size();
  w.unpermute_head_dim = unpermute_head_dim;
  return w;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename F>
void for_each_isa(F&& body) {
  for (const std::string& name : cpu::available_isas()) {
    SCOPED_TRACE("isa " + name);
    cpu::set_isa(name);
    body();
  }
  cpu::set_isa(cpu::isa_from_environment());
}

// n bf16 values of randn(n, seed) * 0.05: a bf16 weight matrix beside the quantized ones.
std::vector<uint16_t> small_bf16(size_t n, uint32_t seed) {
  const auto v = randn(n, seed);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(v[i] * 0.05f);
  return out;
}

const DType kTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                        DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

TEST(CpuQuant, TilesHoldTheFilesValuesBitForBit) {
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    for (const auto [rows, cols, hd] : {std::array<int64_t, 3>{37, 256, 0}, {64, 512, 16}, {16, 768, 0}}) {
      const auto bytes = random_blocks(t, rows, cols, uint32_t(rows + cols));
      const Weight w = file_weight("m", t, bytes, rows, cols, hd);
      CpuWeightStore store;
      const cpu::WeightMatrix& m = store.load(w);
      ASSERT_EQ(m.dtype, t);
      EXPECT_EQ(store.tiled_bytes(), cpu::x16_bytes(t, rows, cols));
      std::vector<float> want(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        w.row_f32(r, want.data());  // the oracle's dequantization, unpermuted
        cpu::x16_rows_f32(t, m.tiles(), cols, r, r + 1, 0, cols, got.data(), cols);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), size_t(cols) * 4)) << "row " << r;
      }
      // The embedding gathers the same values.
      const int32_t ids[] = {int32_t(rows - 1), 0};
      std::vector<float> emb(static_cast<size_t>(2 * cols));
      cpu::embedding(m, ids, 2, emb.data());
      w.row_f32(rows - 1, want.data());
      EXPECT_EQ(0, std::memcmp(want.data(), emb.data(), size_t(cols) * 4));
    }
  }
}

// y = x . W^T in double over the operands as the declared numerics round them.
std::vector<double> reference(const std::vector<float>& x, int64_t T, const Weight& w, const float* bias,
                              oracle::Precision inputs, oracle::Precision weights) {
  const int64_t N = w.rows(), K = w.cols();
  std::vector<float> xr = x, row(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) oracle::emulated::round_all(inputs, xr.data() + t * K, K);
  std::vector<double> y(size_t(T * N));
  for (int64_t n = 0; n < N; ++n) {
    w.row_f32(n, row.data());
    oracle::emulated::round_all(weights, row.data(), K);
    for (int64_t t = 0; t < T; ++t) {
      double s = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(xr[size_t(t * K + k)]) * row[size_t(k)];
      y[size_t(t * N + n)] = s;
    }
  }
  return y;
}

// Largest |got - want| over the scale of the products (sum of |x| |w| per output).
double worst_error(const std::vector<float>& got, const std::vector<double>& want, const std::vector<float>& x,
                   int64_t T, const Weight& w) {
  const int64_t N = w.rows(), K = w.cols();
  std::vector<float> row(static_cast<size_t>(K));
  double worst = 0;
  for (int64_t n = 0; n < N; ++n) {
    w.row_f32(n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double scale = 1e-30;
      for (int64_t k = 0; k < K; ++k) scale += std::fabs(double(x[size_t(t * K + k)]) * row[size_t(k)]);
      worst = std::max(worst, std::fabs(got[size_t(t * N + n)] - want[size_t(t * N + n)]) / scale);
    }
  }
  return worst;
}

TEST(CpuQuant, MatmulComputesItsDeclaredNumerics) {
  cpu::ThreadPool pool(2);
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t N = 37, K = 1536;
    const auto bytes = random_blocks(t, N, K, 7);
    const Weight w = file_weight("m", t, bytes, N, K);
    CpuWeightStore store;
    const cpu::WeightMatrix& m = store.load(w);
    const auto bias = randn(size_t(N), 3);
    for (const int64_t T : {1, 3, 20, 70}) {
      SCOPED_TRACE("T=" + std::to_string(T));
      auto x = randn(size_t(T * K), uint32_t(T));
      x[5] *= 40;  // an outlier: the block's scale follows it
      // Every T: x as two int8 terms per block, the weights exact.
      const auto want = reference(x, T, w, bias.data(), oracle::Precision::Q8x2_32, oracle::Precision::F32);
      // Against the exact product the int8 pair costs about max|x| / 64516 per value; one int8
      // term (max|x| / 254) would be 250x that, far outside this bound.
      const auto exact = reference(x, T, w, bias.data(), oracle::Precision::F32, oracle::Precision::F32);
      for_each_isa([&] {
        std::vector<float> y(size_t(T * N), -1.0f);
        cpu::matmul(x.data(), T, m, bias.data(), y.data(), pool);
        EXPECT_LT(worst_error(y, want, x, T, w), 2e-6);
        EXPECT_LT(worst_error(y, exact, x, T, w), 1e-4);
      });
    }
  }
}

// Off the AVX-512 path the decode GEMV runs on Highway's target (AVX3, AVX2, SSE4, EMU128):
// it promises x16_gemv_rows's arithmetic bit for bit, so every Highway target must give the
// plain loops' floats exactly, for every type, a partial last group of rows and a bias.
TEST(CpuQuant, PortableGemvIsThePlainLoopsBitForBit) {
  cpu::ThreadPool pool(2);
  int targets = 0;
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t N = 53, K = 768;  // 3 full groups of 16 and 5 rows; 3 K-quant blocks
    const auto bytes = random_blocks(t, N, K, 11);
    CpuWeightStore store;
    const cpu::WeightMatrix& m = store.load(file_weight("m", t, bytes, N, K));
    const auto bias = randn(size_t(N), 4);
    auto x = randn(size_t(K), 12);
    x[100] *= 60;  // an outlier, and a block of zeros (scale 0)
    for (int64_t k = 320; k < 352; ++k) x[size_t(k)] = 0;
    cpu::Q8Row xq;
    xq.quantize(x.data(), K);
    std::vector<float> want(static_cast<size_t>(N));
    cpu::x16_gemv_rows(xq, t, m.tiles(), K, 0, N, want.data());
    for (int64_t r = 0; r < N; ++r) want[size_t(r)] += bias[size_t(r)];
    for_each_isa([&] {
      // The VNNI GEMV (avx512bf16, and amx, whose GEMV is the same) fuses multiply-adds:
      // MatmulComputesItsDeclaredNumerics checks it.
      if (cpu::isa() == "avx512bf16" || cpu::isa() == "amx") return;
      ++targets;
      std::vector<float> y(size_t(N), -1.0f);
      cpu::matmul(x.data(), 1, m, bias.data(), y.data(), pool);
      for (int64_t r = 0; r < N; ++r) ASSERT_EQ(y[size_t(r)], want[size_t(r)]) << "row " << r;
    });
  }
  EXPECT_GE(targets, 1);  // at least one Highway target ran
}

// A batched decode step multiplies every sequence's row at once (matmul_rows): each row must
// come out exactly as the one-row GEMV computes it, for every block type and bf16, matrices
// sharing the input, a partial last group of rows, and row counts that are not multiples of
// the kernel's rows per pass; K of one, three and 25 chunks of 32 values (the AMX GEMV
// pairs chunks: an odd count ends in half a pair) and of one and two 256-value blocks. The
// AMX GEMV also takes two groups of 16 weight rows a pass: 53 rows end in a pair whose second
// group is partial; 69 rows leave a fifth group, partial, to a pass of its own.
TEST(CpuQuant, BatchedGemvRowsAreTheOneRowGemvBitForBit) {
  cpu::ThreadPool pool(2);
  const int64_t Nb = 40;
  for (const int64_t Na : {53, 69})
  for (const int64_t K : {32, 96, 256, 512, 800})
  for (DType t : kTypes) {
    if (K % dtype_block_values(t) != 0) continue;
    SCOPED_TRACE(fmt::format("{} K={} N={}", dtype_name(t), K, Na));
    const std::vector<uint16_t> bf = small_bf16(size_t(Nb * K), 30);
    const cpu::WeightMatrix wb = Bf16Matrix{bf.data(), Nb, K};
    const auto bytes = random_blocks(t, Na, K, 31);
    CpuWeightStore store;
    const cpu::WeightMatrix& wa = store.load(file_weight("a", t, bytes, Na, K));
    const auto bias = randn(size_t(Na), 32);
    for (const int64_t T : {1, 2, 5, 9, 16, 20}) {  // on AMX: one tile of rows, part of one, two
      SCOPED_TRACE("T=" + std::to_string(T));
      auto x = randn(size_t(T * K), uint32_t(33 + T));
      x[3] *= 50;
      for_each_isa([&] {
        std::vector<float> ya(size_t(T * Na), -1.0f), yb(size_t(T * Nb), -1.0f);
        const cpu::MatmulOut outs[] = {{&wa, bias.data(), ya.data()}, {&wb, nullptr, yb.data()}};
        cpu::matmul_rows(x.data(), T, outs, pool);
        for (int64_t r = 0; r < T; ++r) {
          std::vector<float> one_a(static_cast<size_t>(Na)), one_b(static_cast<size_t>(Nb));
          const cpu::MatmulOut one[] = {{&wa, bias.data(), one_a.data()}, {&wb, nullptr, one_b.data()}};
          cpu::matmul_shared_input(x.data() + r * K, 1, one, pool);
          for (int64_t n = 0; n < Na; ++n) ASSERT_EQ(ya[size_t(r * Na + n)], one_a[size_t(n)]) << "row " << r << " a " << n;
          for (int64_t n = 0; n < Nb; ++n) ASSERT_EQ(yb[size_t(r * Nb + n)], one_b[size_t(n)]) << "row " << r << " b " << n;
        }
      });
    }
  }
  const int64_t K = 512;
  const std::vector<uint16_t> bf = small_bf16(size_t(Nb * K), 30);
  const cpu::WeightMatrix wb = Bf16Matrix{bf.data(), Nb, K};
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(Nb));
  const cpu::MatmulOut out[] = {{&wb, nullptr, y.data()}};
  EXPECT_THROW(cpu::matmul_rows(x.data(), 0, out, pool), Error);
  EXPECT_THROW(cpu::matmul_rows(x.data(), cpu::kMaxGemvRows + 1, out, pool), Error);
}

// A prefill call (T > 1, matmul) on quantized weights computes each row as the one-row
// GEMV does, whatever T is (so a prompt's numbers do not depend on how it is chunked): for
// every block type, matrices sharing the input beside a bf16 one, a partial last group of
// rows, T below the AMX GEMM's 16 rows, one partial A tile, several and a second panel.
TEST(CpuQuant, PrefillRowsAreTheOneRowGemvBitForBit) {
  cpu::ThreadPool pool(2);
  const int64_t K = 512, Na = 53, Nb = 40;
  const std::vector<uint16_t> bf = small_bf16(size_t(Nb * K), 40);
  const cpu::WeightMatrix wb = Bf16Matrix{bf.data(), Nb, K};
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const auto bytes = random_blocks(t, Na, K, 41);
    const auto bytes2 = random_blocks(t, 19, K, 42);
    CpuWeightStore store;
    const cpu::WeightMatrix& wa = store.load(file_weight("a", t, bytes, Na, K));
    const cpu::WeightMatrix& wc = store.load(file_weight("c", t, bytes2, 19, K));
    const auto bias = randn(size_t(Na), 43);
    for (const int64_t T : {3, 16, 21, 67}) {
      SCOPED_TRACE("T=" + std::to_string(T));
      auto x = randn(size_t(T * K), uint32_t(44 + T));
      x[7] *= 80;
      for (int64_t k = 0; k < 32; ++k) x[size_t(K + k)] = 0;  // a block of zeros (scale 0) in row 1
      for_each_isa([&] {
        std::vector<float> ya(size_t(T * Na), -1.0f), yb(size_t(T * Nb), -1.0f), yc(size_t(T * 19), -1.0f);
        const cpu::MatmulOut outs[] = {{&wa, bias.data(), ya.data()}, {&wb, nullptr, yb.data()}, {&wc, nullptr, yc.data()}};
        cpu::matmul_shared_input(x.data(), T, outs, pool);
        for (int64_t r = 0; r < T; ++r) {
          std::vector<float> one_a(static_cast<size_t>(Na)), one_c(19);
          const cpu::MatmulOut one[] = {{&wa, bias.data(), one_a.data()}, {&wc, nullptr, one_c.data()}};
          cpu::matmul_shared_input(x.data() + r * K, 1, one, pool);
          for (int64_t n = 0; n < Na; ++n) ASSERT_EQ(ya[size_t(r * Na + n)], one_a[size_t(n)]) << "row " << r << " a " << n;
          for (int64_t n = 0; n < 19; ++n) ASSERT_EQ(yc[size_t(r * 19 + n)], one_c[size_t(n)]) << "row " << r << " c " << n;
        }
      });
    }
  }
}

// The activation quantizer is vectorized (Highway): on every target it must write the plain
// loop's bytes (Q8Row::quantize_plain), non-finite blocks, zero blocks and halfway values included.
// 44 blocks: AVX-512 takes 16 at a time and the rest one by one; the special blocks are in
// both 16s and in the rest.
TEST(CpuQuant, VectorQuantizerIsThePlainLoopBitForBit) {
  const int64_t K = 32 * 44;
  auto x = randn(size_t(K), 21);
  for (const int64_t at : {0, 16 * 32 + 3 * 32, 36 * 32}) {
    float* p = x.data() + at;
    p[7] *= 300;                                                         // an outlier
    for (int64_t k = 64; k < 96; ++k) p[k] = 0;                          // a block of zeros
    p[100] = NAN;                                                        // a NaN block
    p[170] = -INFINITY;                                                  // an infinite one
    for (int64_t k = 192; k < 224; ++k) p[k] = float(k - 208) * 0.5f;    // v lands on .5 steps
    for (int64_t k = 224; k < 256; ++k) p[k] = 1e-20f * float(k % 7 - 3);  // tiny values
  }
  for (int64_t k = 12 * 32; k < 13 * 32; ++k) x[size_t(k)] = -0.0f;  // negative zeros
  x[size_t(14 * 32 + 5)] = INFINITY;
  x[size_t(14 * 32 + 6)] = NAN;
  cpu::Q8Row want;
  want.quantize_plain(x.data(), K);
  int runs = 0;
  for_each_isa([&] {
    ++runs;
    cpu::Q8Row got;
    got.quantize(x.data(), K);
    ASSERT_EQ(got.hi, want.hi);
    ASSERT_EQ(got.lo, want.lo);
    ASSERT_EQ(got.sum_hi, want.sum_hi);
    ASSERT_EQ(got.sum_lo, want.sum_lo);
    ASSERT_EQ(0, std::memcmp(got.d.data(), want.d.data(), want.d.size() * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(got.dsum.data(), want.dsum.data(), want.dsum.size() * sizeof(float)));
  });
  EXPECT_GE(runs, 2);
}

TEST(CpuQuant, SharedInputMixesFormatsAndMatchesSeparateCalls) {
  cpu::ThreadPool pool(2);
  const int64_t K = 64;
  const auto q4 = random_blocks(DType::Q4_1, 20, K, 1), q8 = random_blocks(DType::Q8_0, 33, K, 2);
  CpuWeightStore store;
  const cpu::WeightMatrix& a = store.load(file_weight("a", DType::Q4_1, q4, 20, K));
  const cpu::WeightMatrix& b = store.load(file_weight("b", DType::Q8_0, q8, 33, K));
  std::vector<uint16_t> bf(size_t(9 * K));
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(float(int(i % 13) - 6) * 0.01f);
  const cpu::WeightMatrix c = Bf16Matrix{bf.data(), 9, K};
  for (const int64_t T : {1, 20}) {
    const auto x = randn(size_t(T * K), 9);
    std::vector<float> w0(size_t(T * 20)), w1(size_t(T * 33)), w2(size_t(T * 9));
    cpu::matmul(x.data(), T, a, nullptr, w0.data(), pool);
    cpu::matmul(x.data(), T, b, nullptr, w1.data(), pool);
    cpu::matmul(x.data(), T, c, nullptr, w2.data(), pool);
    std::vector<float> g0(w0.size()), g1(w1.size()), g2(w2.size());
    const cpu::MatmulOut outs[] = {{&a, nullptr, g0.data()}, {&b, nullptr, g1.data()}, {&c, nullptr, g2.data()}};
    cpu::matmul_shared_input(x.data(), T, outs, pool);
    EXPECT_EQ(g0, w0);
    EXPECT_EQ(g1, w1);
    EXPECT_EQ(g2, w2);
  }
}

TEST(CpuQuant, NonFiniteActivationsReachTheOutput) {
  cpu::ThreadPool pool(2);
  const auto bytes = random_blocks(DType::Q4_0, 16, 64, 5);
  CpuWeightStore store;
  const cpu::WeightMatrix& m = store.load(file_weight("m", DType::Q4_0, bytes, 16, 64));
  for_each_isa([&] {
    for (const float bad : {NAN, INFINITY}) {
      auto x = randn(64, 1);
      x[40] = bad;  // in the second block only
      std::vector<float> y(16, 0.0f);
      cpu::matmul(x.data(), 1, m, nullptr, y.data(), pool);
      for (float v : y) EXPECT_FALSE(std::isfinite(v));
    }
  });
}

TEST(CpuQuant, RefusesWhatItCannotRead) {
  cpu::ThreadPool pool(1);
  std::vector<uint8_t> bytes(size_t(dtype_bytes(DType::Q3_K, 256)));
  const cpu::WeightMatrix k(DType::Q3_K, bytes.data(), 1, 256);
  std::vector<float> x(256), y(1);
  EXPECT_THROW(cpu::matmul(x.data(), 1, k, nullptr, y.data(), pool), Error);
  // A block format the tiles do not take is converted to bf16 by the store instead.
  CpuWeightStore store;
  const auto q3k = std::vector<uint8_t>(size_t(dtype_bytes(DType::Q3_K, 256)), 0);
  EXPECT_FALSE(store.load(file_weight("k", DType::Q3_K, q3k, 1, 256)).quantized());
  EXPECT_EQ(store.formats().at("bf16 converted from Q3_K"), 1);
}

// KiB of this process's mappings of `path` resident now (/proc/self/smaps), or -1 where
// there is no smaps to read.
int64_t mapping_rss_kib(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  int64_t kib = 0;
  bool ours = false;
  for (std::string line; std::getline(smaps, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < line.find(' '))
      ours = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    else if (ours && line.rfind("Rss:", 0) == 0)
      kib += std::stoll(line.substr(4));
  }
  return kib;
}

// Tiles of the weights reserve() was given fill one arena, back to back, whichever order
// they load in; the tiles are the same as without the reservation.
TEST(CpuQuant, ReservedTilesFillOneArena) {
  const auto a = random_blocks(DType::Q4_1, 40, 256, 1), b = random_blocks(DType::Q6_K, 16, 512, 2);
  const Weight wa = file_weight("a", DType::Q4_1, a, 40, 256), wb = file_weight("b", DType::Q6_K, b, 16, 512);
  CpuWeightStore reserved, plain;
  reserved.reserve({&wa, &wb, &wa});  // a tied matrix is listed twice
  const cpu::WeightMatrix& rb = reserved.load(wb);
  const cpu::WeightMatrix& ra = reserved.load(wa);
  const int64_t b_bytes = cpu::x16_bytes(DType::Q6_K, 16, 512), a_bytes = cpu::x16_bytes(DType::Q4_1, 40, 256);
  EXPECT_EQ(ra.tiles(), rb.tiles() + (b_bytes + 63) / 64 * 64);
  // Exactly their bytes (to the page), where an unreserved store maps a 64 MiB arena.
  const int64_t page = ::sysconf(_SC_PAGESIZE), tiles = (b_bytes + 63) / 64 * 64 + (a_bytes + 63) / 64 * 64;
  EXPECT_EQ(reserved.arena_bytes(), (tiles + page - 1) / page * page);
  EXPECT_EQ(0, std::memcmp(ra.tiles(), plain.load(wa).tiles(), size_t(a_bytes)));
  EXPECT_EQ(0, std::memcmp(rb.tiles(), plain.load(wb).tiles(), size_t(b_bytes)));
  EXPECT_EQ(plain.arena_bytes(), int64_t(64) << 20);
  EXPECT_THROW(reserved.reserve({&wa}), Error);  // only before the first load
}

// A tiny Llama quantized as people download models (q4_k_m: Q4_K, Q6_K and Q8_0 mixed; q5_k_m;
// q4_0; q5_1;
// q8_0): the cpu target holds every matrix as tiles of the file's blocks (nothing converted
// to bf16), its logits follow the oracle's on the same blocks for a prompt and decode steps,
// and the weights it holds are about the file's size.
TEST(CpuQuant, QuantizedModelsRunInTheirBlocks) {
  testing_support::ScratchDir dir("cpu_quant_model");
  SynthOptions o;
  o.preset = "Llama-3.2-1B";
  o.out_dir = dir.str("hf");
  o.tiny = true;
  o.seed = 5;
  o.tokenizers_dir = testing_support::tokenizers_dir();
  synth(o);
  const Model src = Model::open(o.out_dir);
#if defined(TESSERA_SANITIZED_THREAD)
  // Under TSan one scheme: quantizing the 128k-row embedding into K-quants is minutes there,
  // and the K-quant GEMVs' threads run in BatchedDecode.QuantizedWeightsToo and
  // CpuQuant.MatmulComputesItsDeclaredNumerics. The quantizer's threads are the same for all.
  const std::vector<const char*> schemes = {"q4_0"};
#elif defined(TESSERA_SANITIZED)
  // Under ASan a K-quant and a legacy scheme; the Release run covers all five.
  const std::vector<const char*> schemes = {"q4_k_m", "q4_0"};
#else
  const std::vector<const char*> schemes = {"q4_k_m", "q5_k_m", "q4_0", "q5_1", "q8_0"};
#endif
  for (const char* scheme : schemes) {
    SCOPED_TRACE(scheme);
    QuantizeOptions q;
    q.out_path = dir.str(std::string(scheme) + ".gguf");
    quantize_model(src, *find_quant_scheme(scheme), q);
    const Model m = Model::open(q.out_path);
    CpuOptions co;
    co.threads = 2;
    co.fused_prefill = co.fused_decode = true;
    CpuRunner cpu(m, co);
    // Everything the runner reads is its own copy now: none of the file's pages stays
    // resident in this process (until the oracle below reads the file).
    if (const int64_t kib = mapping_rss_kib(q.out_path); kib >= 0) {
      EXPECT_EQ(kib, 0);
    }
    EXPECT_EQ(cpu.weights().converted_bytes(), 0);
    EXPECT_EQ(cpu.weights().mapped_bytes(), 0);
    int64_t file_matrix_bytes = 0;
    for (const auto& [name, w] : m.weights())
      if (w.info.shape.size() == 2) file_matrix_bytes += int64_t(w.info.nbytes);
    EXPECT_LE(cpu.weights().tiled_bytes(), file_matrix_bytes * 103 / 100);
    OracleRunner oracle(m, 2);
    const std::vector<int32_t> prompt = {1, 17, 42, 99, 7, 3, 250, 11};
    std::vector<float> a = cpu.forward(prompt, false), b = oracle.forward(prompt, false);
    for (int step = 0; step < 4; ++step) {
      ASSERT_EQ(a.size(), b.size());
      double dot = 0, na = 0, nb = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        dot += double(a[i]) * b[i];
        na += double(a[i]) * a[i];
        nb += double(b[i]) * b[i];
      }
      // The prompt runs the bf16 GEMM (weights rounded to bf16: relative 2^-9 each); decode
      // steps the GEMV on the exact blocks (x's two int8 terms: 1.5e-5 of max|x|).
      EXPECT_GT(dot / std::sqrt(na * nb), step == 0 ? 0.9999 : 0.99995) << "step " << step;
      const int32_t next = int32_t(step * 31 + 5);
      a = cpu.forward(std::span<const int32_t>(&next, 1), false);
      b = oracle.forward(std::span<const int32_t>(&next, 1), false);
    }
  }
}

}  // namespace
}  // namespace tessera
