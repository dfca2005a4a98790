// The cpu target's kernels against their oracle twins, on every ISA path this CPU has.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "util/error.h"
#include "model/weights.h"
#include "model/spec.h"
#include "oracle/ops.h"
#include "targets/cpu/kernels.h"

namespace tessera {
namespace {

using cpu::Bf16Matrix;
using cpu::ThreadPool;

struct Stats {
  double nmse = 0, pearson = 0, cosine = 0;
};

Stats compare(const float* got, const float* ref, size_t n) {
  double se = 0, ss = 0, sg = 0, sr = 0, sgg = 0, srr = 0, sgr = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    se += (g - r) * (g - r);
    ss += r * r;
    sg += g;
    sr += r;
    sgg += g * g;
    srr += r * r;
    sgr += g * r;
  }
  Stats s;
  s.nmse = ss > 0 ? se / ss : se;
  const double m = double(n);
  const double cov = sgr / m - (sg / m) * (sr / m);
  const double vg = sgg / m - (sg / m) * (sg / m), vr = srr / m - (sr / m) * (sr / m);
  s.pearson = (vg > 0 && vr > 0) ? cov / std::sqrt(vg * vr) : 1.0;
  s.cosine = (sgg > 0 && srr > 0) ? sgr / std::sqrt(sgg * srr) : 1.0;
  return s;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

std::vector<uint16_t> randn_bf16(size_t n, uint32_t seed, float scale) {
  const auto f = randn(n, seed, scale);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_bf16(f[i]);
  return out;
}

Weight bf16_weight(const std::vector<uint16_t>& data, int64_t rows, int64_t cols) {
  Weight w;
  w.name = w.source_name = "test.weight";
  w.info.name = w.name;
  w.info.dtype = DType::BF16;
  w.info.shape = {rows, cols};
  w.info.data = reinterpret_cast<const uint8_t*>(data.data());
  w.info.nbytes = uint64_t(rows * cols * 2);
  return w;
}

// Runs `body` once per ISA path this CPU has, with that path forced.
template <typename F>
void for_each_isa(F&& body) {
  const auto isas = cpu::available_isas();
  ASSERT_FALSE(isas.empty());
  for (const auto& name : isas) {
    SCOPED_TRACE("isa " + name);
    cpu::set_isa(name);
    ASSERT_EQ(cpu::isa(), name);
    body(name);
  }
  cpu::set_isa(cpu::isa_from_environment());
}

TEST(CpuKernels, IsaSelection) {
  const auto isas = cpu::available_isas();
  ASSERT_FALSE(isas.empty());
  for (const auto& name : isas) {
    cpu::set_isa(name);
    EXPECT_EQ(cpu::isa(), name);
  }
  cpu::set_isa("scalar");
  EXPECT_EQ(cpu::isa(), isas.back());
  cpu::set_isa("hwy");
  EXPECT_NE(cpu::isa(), "avx512bf16");
  EXPECT_NE(cpu::isa(), "amx");
  EXPECT_THROW(cpu::set_isa("quantum"), std::exception);
  cpu::set_isa("auto");
  EXPECT_EQ(cpu::isa(), isas.front());
  cpu::set_isa(cpu::isa_from_environment());
}

TEST(CpuKernels, MatmulMatchesOracle) {
  ThreadPool pool(2);
  struct Shape {
    int64_t T, N, K;
  };
  const Shape shapes[] = {{1, 7, 72},   {3, 7, 72},    {1, 33, 576},  {2, 17, 31},  {5, 20, 100},
                          {17, 50, 129}, {64, 96, 576}, {1, 40, 4100}, {9, 12, 4100}, {6, 5, 1},
                          {40, 130, 300}, {16, 16, 32}, {23, 70, 4100}};
  for_each_isa([&](const std::string& isa) {
    for (const Shape& s : shapes) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE("T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                     (with_bias ? " bias" : ""));
        const auto wdata = randn_bf16(size_t(s.N * s.K), uint32_t(s.N * 31 + s.K), 0.05f);
        const auto x = randn(size_t(s.T * s.K), uint32_t(s.T + 7));
        const auto bias = randn(size_t(s.N), 99, 0.5f);
        const Weight w = bf16_weight(wdata, s.N, s.K);
        std::vector<float> ref(size_t(s.T * s.N)), got(size_t(s.T * s.N), -1.0f);
        oracle::linear(x.data(), s.T, w, with_bias ? bias.data() : nullptr, ref.data(), 1);
        cpu::matmul(x.data(), s.T, Bf16Matrix{wdata.data(), s.N, s.K}, with_bias ? bias.data() : nullptr, got.data(),
                    pool);
        const Stats st = compare(got.data(), ref.data(), got.size());
        EXPECT_LE(st.nmse, (isa == "avx512bf16" || isa == "amx") ? 2e-5 : 1e-10);
        EXPECT_GE(st.pearson, 0.9999);
      }
    }
  });
}

// Every cache blocking tile-tune may choose computes the same product (within the packed
// path's rounding), including panels wider than K, K not a multiple of the panel, and token
// blocks smaller than T; a blocking the kernel cannot run is refused.
TEST(CpuKernels, MatmulAnyCacheBlockingMatchesOracle) {
  ThreadPool pool(2);
  const int64_t T = 70, N = 80, K = 1100;
  const auto wdata = randn_bf16(size_t(N * K), 5, 0.05f);
  const auto x = randn(size_t(T * K), 6);
  const Weight w = bf16_weight(wdata, N, K);
  std::vector<float> ref(size_t(T * N));
  oracle::linear(x.data(), T, w, nullptr, ref.data(), 1);
  for_each_isa([&](const std::string& isa) {
    for (const cpu::GemmBlocking b : {cpu::GemmBlocking{128, 512}, cpu::GemmBlocking{512, 16}, cpu::GemmBlocking{2048, 64},
                                      cpu::GemmBlocking{32, 7}}) {
      SCOPED_TRACE(isa + " kc=" + std::to_string(b.kc) + " tc=" + std::to_string(b.tc));
      std::vector<float> got(size_t(T * N), -1.0f);
      cpu::matmul(x.data(), T, Bf16Matrix{wdata.data(), N, K}, nullptr, got.data(), pool, b);
      const Stats st = compare(got.data(), ref.data(), got.size());
      EXPECT_LE(st.nmse, (isa == "avx512bf16" || isa == "amx") ? 2e-5 : 1e-10);
    }
  });
  std::vector<float> y(size_t(T * N));
  EXPECT_THROW(cpu::matmul(x.data(), T, Bf16Matrix{wdata.data(), N, K}, nullptr, y.data(), pool, {100, 512}), tessera::Error);
  EXPECT_THROW(cpu::matmul(x.data(), T, Bf16Matrix{wdata.data(), N, K}, nullptr, y.data(), pool, {128, 0}), tessera::Error);
}

// The AMX path multiplies the same bf16 activations and weights as the AVX-512 BF16 path, only
// in another order of fp32 sums: the two agree far inside the bf16 rounding both share, on
// token counts and row counts that leave partial tiles (T or N not a multiple of 16 or 32) and
// K tails (quantized weights reach the same GEMM: CpuQuant.* run it on every ISA).
TEST(CpuKernels, AmxAgreesWithAvx512Bf16) {
  const auto isas = cpu::available_isas();
  if (std::find(isas.begin(), isas.end(), "amx") == isas.end()) GTEST_SKIP() << "no AMX on this CPU";
  ThreadPool pool(2);
  struct Shape {
    int64_t T, N, K;
  };
  // T = 1: the decode GEMV (AMX-BF16 where K is whole 32-value chunks), a partial last group.
  for (const Shape s : {Shape{1, 50, 576}, Shape{1, 37, 2080}, Shape{16, 16, 32}, Shape{17, 50, 129},
                        Shape{33, 70, 576}, Shape{64, 96, 576}, Shape{100, 130, 1100}, Shape{600, 40, 300}}) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    const auto wdata = randn_bf16(size_t(s.N * s.K), uint32_t(s.N + s.K), 0.05f);
    const auto x = randn(size_t(s.T * s.K), uint32_t(s.T));
    const auto bias = randn(size_t(s.N), 3, 0.5f);
    std::vector<float> amx(size_t(s.T * s.N), -1.0f), bf16(size_t(s.T * s.N), -2.0f);
    cpu::set_isa("amx");
    cpu::matmul(x.data(), s.T, Bf16Matrix{wdata.data(), s.N, s.K}, bias.data(), amx.data(), pool);
    cpu::set_isa("avx512bf16");
    cpu::matmul(x.data(), s.T, Bf16Matrix{wdata.data(), s.N, s.K}, bias.data(), bf16.data(), pool);
    cpu::set_isa(cpu::isa_from_environment());
    const Stats st = compare(amx.data(), bf16.data(), amx.size());
    EXPECT_LE(st.nmse, 1e-11);
    double worst = 0;
    for (size_t i = 0; i < amx.size(); ++i) worst = std::max(worst, double(std::fabs(amx[i] - bf16[i])));
    EXPECT_LE(worst, 1e-4);
  }
}

TEST(CpuKernels, MatmulSingleThreadAndManyThreadsAgree) {
  ThreadPool one(1), three(3);
  const int64_t T = 7, N = 45, K = 200;
  const auto wdata = randn_bf16(size_t(N * K), 5, 0.05f);
  const auto x = randn(size_t(T * K), 6);
  std::vector<float> a(size_t(T * N)), b(size_t(T * N));
  for (int64_t t : {int64_t(1), T}) {
    cpu::matmul(x.data(), t, Bf16Matrix{wdata.data(), N, K}, nullptr, a.data(), one);
    cpu::matmul(x.data(), t, Bf16Matrix{wdata.data(), N, K}, nullptr, b.data(), three);
    for (int64_t i = 0; i < t * N; ++i) EXPECT_EQ(a[size_t(i)], b[size_t(i)]);
  }
}

// q|k|v and gate|up run as one call: the same numbers as one matmul per matrix, bit for bit
// (each output row is the same dot product, whichever thread computes it).
TEST(CpuKernels, MatmulSharedInputEqualsOneMatmulPerMatrix) {
  ThreadPool pool(2);
  const int64_t K = 200;
  const int64_t rows[] = {33, 7, 0, 70};
  std::vector<std::vector<uint16_t>> w;
  for (int64_t n : rows) w.push_back(randn_bf16(size_t(std::max<int64_t>(n, 1) * K), uint32_t(n + 3), 0.05f));
  const auto bias = randn(70, 4, 0.5f);
  for_each_isa([&](const std::string& isa) {
    for (int64_t T : {1, 3, 20}) {
      SCOPED_TRACE("T=" + std::to_string(T));
      const auto x = randn(size_t(T * K), uint32_t(T));
      std::vector<std::vector<float>> want, got;
      std::vector<cpu::WeightMatrix> m;
      std::vector<cpu::MatmulOut> outs;
      for (size_t i = 0; i < std::size(rows); ++i) {
        m.push_back(Bf16Matrix{w[i].data(), rows[i], K});
        want.emplace_back(size_t(T * rows[i]), -1.0f);
        got.emplace_back(size_t(T * rows[i]), -2.0f);
      }
      for (size_t i = 0; i < m.size(); ++i) {
        const float* b = i % 2 ? bias.data() : nullptr;
        cpu::matmul(x.data(), T, m[i], b, want[i].data(), pool);
        outs.push_back({&m[i], b, got[i].data()});
      }
      cpu::matmul_shared_input(x.data(), T, outs, pool);
      for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(got[i], want[i]) << "matrix " << i;
    }
  });
  // Matrices of different widths cannot share one input.
  const cpu::WeightMatrix narrow = Bf16Matrix{w[0].data(), 1, K - 1};
  std::vector<float> y(size_t(rows[0]) + 1);
  const cpu::MatmulOut mixed[] = {{&narrow, nullptr, y.data()}, {&narrow, nullptr, y.data()}};
  EXPECT_NO_THROW(cpu::matmul_shared_input(randn(size_t(K), 1).data(), 1, mixed, pool));
  const cpu::WeightMatrix wide = Bf16Matrix{w[0].data(), 1, K};
  const cpu::MatmulOut bad[] = {{&narrow, nullptr, y.data()}, {&wide, nullptr, y.data()}};
  EXPECT_THROW(cpu::matmul_shared_input(randn(size_t(K), 1).data(), 1, bad, pool), std::exception);
}

TEST(CpuKernels, RmsnormMatchesOracle) {
  for_each_isa([&](const std::string&) {
    for (int64_t n : {1, 7, 64, 72, 576, 2051}) {
      const int64_t rows = 3;
      const auto x = randn(size_t(rows * n), uint32_t(n), 2.0f);
      const auto w = randn(size_t(n), uint32_t(n + 1), 1.0f);
      std::vector<float> ref(x.size()), got(x.size());
      oracle::rmsnorm(x.data(), w.data(), ref.data(), rows, n, 1e-5);
      cpu::rmsnorm(x.data(), w.data(), got.data(), rows, n, 1e-5f);
      EXPECT_LE(compare(got.data(), ref.data(), got.size()).nmse, 1e-10) << "n=" << n;
      std::vector<float> inplace = x;  // in place
      cpu::rmsnorm(inplace.data(), w.data(), inplace.data(), rows, n, 1e-5f);
      EXPECT_LE(compare(inplace.data(), ref.data(), got.size()).nmse, 1e-10) << "n=" << n;
    }
  });
}

TEST(CpuKernels, RopeMatchesOracle) {
  for_each_isa([&](const std::string&) {
    for (int64_t hd : {8, 64, 72, 128}) {
      for (int64_t pos0 : {0, 1000}) {
        const int64_t T = 5, nh = 3;
        std::vector<float> inv(size_t(hd / 2));
        for (int64_t i = 0; i < hd / 2; ++i) inv[size_t(i)] = float(1.0 / std::pow(10000.0, double(2 * i) / double(hd)));
        auto ref = randn(size_t(T * nh * hd), uint32_t(hd + pos0));
        auto got = ref;
        oracle::rope(ref.data(), T, nh, hd, pos0, inv);
        cpu::rope(got.data(), T, nh, hd, pos0, inv.data());
        EXPECT_LE(compare(got.data(), ref.data(), got.size()).nmse, 1e-10) << "hd=" << hd << " pos0=" << pos0;
      }
    }
  });
}

TEST(CpuKernels, SiluMulAddEmbeddingMatchOracle) {
  cpu::ThreadPool pool(2);
  for_each_isa([&](const std::string&) {
    for (int64_t n : {1, 5, 16, 67, 1536, 5000}) {  // 5000: split across the pool, a partial last piece
      auto g = randn(size_t(n), uint32_t(n), 4.0f);
      if (n > 3) {
        g[0] = -120.0f;
        g[1] = 120.0f;
        g[2] = -90.0f;
      }
      const auto u = randn(size_t(n), uint32_t(n + 3));
      std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      oracle::silu_mul(g.data(), u.data(), ref.data(), n);
      cpu::silu_mul(g.data(), u.data(), got.data(), n, pool);
      EXPECT_LE(compare(got.data(), ref.data(), got.size()).nmse, 1e-10) << "n=" << n;
      for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i]));
      auto inplace = g;
      cpu::silu_mul(inplace.data(), u.data(), inplace.data(), n, pool);
      EXPECT_LE(compare(inplace.data(), ref.data(), got.size()).nmse, 1e-10);

      auto h = randn(size_t(n), 11);
      auto h_ref = h;
      for (int64_t i = 0; i < n; ++i) h_ref[size_t(i)] += u[size_t(i)];
      cpu::add(h.data(), u.data(), n);
      EXPECT_EQ(h, h_ref);
    }
    const int64_t rows = 10, cols = 77;
    const auto table = randn_bf16(size_t(rows * cols), 3, 1.0f);
    const Weight wt = bf16_weight(table, rows, cols);
    const std::vector<int32_t> ids = {3, 0, 9, 3};
    std::vector<float> got(ids.size() * cols), ref(cols);
    cpu::embedding(Bf16Matrix{table.data(), rows, cols}, ids.data(), int64_t(ids.size()), got.data());
    for (size_t t = 0; t < ids.size(); ++t) {
      wt.row_f32(ids[t], ref.data());
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[t * cols + size_t(c)], ref[size_t(c)]);
    }
    const int32_t bad = 10;
    EXPECT_THROW(cpu::embedding(Bf16Matrix{table.data(), rows, cols}, &bad, 1, got.data()), std::exception);
  });
}

// Attention over a cache holding positions [0, pos0 + T), against the oracle with fp32 K/V.
void check_attention(int64_t n_heads, int64_t n_kv, int64_t hd, int64_t pos0, int64_t T, ThreadPool& pool) {
  SCOPED_TRACE("heads " + std::to_string(n_heads) + "/" + std::to_string(n_kv) + " pos0=" + std::to_string(pos0) +
               " T=" + std::to_string(T));
  ModelSpec spec;
  spec.n_heads = n_heads;
  spec.n_kv_heads = n_kv;
  spec.head_dim = hd;
  const int64_t kv_dim = n_kv * hd, ctx = pos0 + T;
  const auto k = randn(size_t(ctx * kv_dim), uint32_t(ctx), 1.5f);
  const auto v = randn(size_t(ctx * kv_dim), uint32_t(ctx + 1));
  const auto q = randn(size_t(T * n_heads * hd), uint32_t(ctx + 2), 1.5f);
  cpu::KvCache cache(2, n_kv, hd);
  // Earlier positions first (as a prefill would), then this call's rows.
  if (pos0 > 0) cache.write(1, 0, k.data(), v.data(), pos0);
  cache.write(1, pos0, k.data() + pos0 * kv_dim, v.data() + pos0 * kv_dim, T);
  std::vector<float> ref(q.size()), got(q.size());
  oracle::attention(q.data(), T, pos0, k.data(), v.data(), spec, ref.data(), 1);
  cpu::attention(q.data(), T, pos0, cache, 1, n_heads, n_kv, hd, float(spec.attn_scale()), got.data(), pool);
  const Stats st = compare(got.data(), ref.data(), got.size());
  EXPECT_GE(st.cosine, 0.9999);
  EXPECT_LE(st.nmse, 1e-5);
}

TEST(CpuKernels, AttentionPrefillAndDecodeMatchOracle) {
  ThreadPool pool(2);
  for_each_isa([&](const std::string& isa) {
    check_attention(8, 2, 64, 0, 37, pool);    // prefill, GQA 4
    check_attention(9, 3, 64, 0, 20, pool);    // prefill, GQA 3
    check_attention(8, 2, 64, 300, 1, pool);   // decode (keys split in chunks)
    check_attention(9, 3, 64, 1000, 1, pool);  // decode
    check_attention(8, 2, 64, 50, 6, pool);    // continuing prefill over a filled cache
    check_attention(8, 2, 64, 50, 16, pool);   // a second prefill chunk after 50 cached positions
    check_attention(4, 4, 24, 3, 3, pool);     // no GQA, head_dim not a multiple of 16
    check_attention(4, 4, 24, 3, 12, pool);    // the same, prefill-sized
    check_attention(2, 1, 128, 0, 9, pool);    // GQA 2, head_dim 128
  });
}

// A batched decode step attends each sequence's row over its own cache in one call: every
// row must be attention() of that row alone, bit for bit (short contexts: one key chunk;
// long ones: keys split in chunks and merged).
TEST(CpuKernels, AttentionRowsAreEachRowAloneBitForBit) {
  ThreadPool pool(2);
  const int64_t n_heads = 8, n_kv = 2, hd = 64, kv_dim = n_kv * hd, layers = 2;
  const float scale = 0.125f;
  const std::vector<int64_t> positions = {0, 40, 300, 1000, 7};
  std::vector<std::unique_ptr<cpu::KvCache>> caches;
  std::vector<std::vector<float>> qs;
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t ctx = positions[i] + 1;
    caches.push_back(std::make_unique<cpu::KvCache>(layers, n_kv, hd));
    const auto k = randn(size_t(ctx * kv_dim), uint32_t(10 + i), 1.5f);
    const auto v = randn(size_t(ctx * kv_dim), uint32_t(20 + i));
    caches.back()->write(1, 0, k.data(), v.data(), ctx);
    qs.push_back(randn(size_t(n_heads * hd), uint32_t(30 + i), 1.5f));
  }
  for_each_isa([&](const std::string& isa) {
    SCOPED_TRACE(isa);
    std::vector<std::vector<float>> got(positions.size(), std::vector<float>(size_t(n_heads * hd)));
    std::vector<cpu::AttentionRow> rows;
    for (size_t i = 0; i < positions.size(); ++i) rows.push_back({qs[i].data(), caches[i].get(), positions[i], got[i].data()});
    cpu::attention_rows(rows, 1, n_heads, n_kv, hd, scale, pool);
    for (size_t i = 0; i < positions.size(); ++i) {
      std::vector<float> alone(size_t(n_heads * hd));
      cpu::attention(qs[i].data(), 1, positions[i], *caches[i], 1, n_heads, n_kv, hd, scale, alone.data(), pool);
      for (size_t j = 0; j < alone.size(); ++j) ASSERT_EQ(got[i][j], alone[j]) << "row " << i << " value " << j;
    }
  });
  // A row past its cache's positions is refused.
  std::vector<float> out(size_t(n_heads * hd));
  const cpu::AttentionRow bad[] = {{qs[0].data(), caches[0].get(), 5, out.data()}};
  EXPECT_THROW(cpu::attention_rows(bad, 1, n_heads, n_kv, hd, scale, pool), Error);
}

TEST(CpuKernels, AttentionRejectsMissingPositions) {
  ThreadPool pool(2);
  cpu::KvCache cache(1, 1, 16);
  std::vector<float> kv(16 * 4, 0.5f), q(2 * 2 * 16, 1.0f), out(q.size());
  cache.write(0, 0, kv.data(), kv.data(), 3);
  EXPECT_THROW(cpu::attention(q.data(), 2, 2, cache, 0, 2, 1, 16, 0.25f, out.data(), pool), std::exception);
  EXPECT_NO_THROW(cpu::attention(q.data(), 2, 1, cache, 0, 2, 1, 16, 0.25f, out.data(), pool));
}

TEST(CpuKernels, KvCacheGrowsAcrossManyWrites) {
  // Two kv heads: each head's block moves to its new place when the cache grows.
  const int64_t layers = 3, heads = 2, hd = 20, kv_dim = heads * hd, steps = 700;
  cpu::KvCache cache(layers, heads, hd);
  EXPECT_EQ(cache.bytes_per_position(), layers * kv_dim * 2 * 2);
  const auto k = randn(size_t(steps * kv_dim), 1, 3.0f);
  const auto v = randn(size_t(steps * kv_dim), 2, 3.0f);
  // A prefill of 5 rows, then one row at a time.
  for (int64_t l = 0; l < layers; ++l) cache.write(l, 0, k.data(), v.data(), 5);
  for (int64_t p = 5; p < steps; ++p)
    for (int64_t l = 0; l < layers; ++l) cache.write(l, p, k.data() + p * kv_dim, v.data() + p * kv_dim, 1);
  std::vector<float> row(static_cast<size_t>(kv_dim));
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t p = 0; p < steps; p += 37) {
      cache.read_k(l, p, row.data());
      EXPECT_LE(compare(row.data(), k.data() + p * kv_dim, row.size()).nmse, 1e-6);
      cache.read_v(l, p, row.data());
      EXPECT_LE(compare(row.data(), v.data() + p * kv_dim, row.size()).nmse, 1e-6);
    }
  EXPECT_THROW(cache.read_k(0, steps, row.data()), std::exception);
  // Overwriting a position (a rewound generation) replaces it.
  std::vector<float> ones(size_t(kv_dim), 1.0f);
  cache.write(2, 10, ones.data(), ones.data(), 1);
  cache.read_v(2, 10, row.data());
  EXPECT_EQ(row, ones);
  cache.read_k(2, 10, row.data());
  EXPECT_EQ(row, ones);
  // A write past the end leaves a zeroed gap (keys are stored in tiles of positions).
  cache.write(1, steps + 20, ones.data(), ones.data(), 1);
  const std::vector<float> zeros(size_t(kv_dim), 0.0f);
  for (int64_t p : {steps, steps + 3, steps + 19}) {
    cache.read_k(1, p, row.data());
    EXPECT_EQ(row, zeros);
    cache.read_v(1, p, row.data());
    EXPECT_EQ(row, zeros);
  }
  cache.read_k(1, steps + 20, row.data());
  EXPECT_EQ(row, ones);
}

TEST(CpuKernels, ThreadPoolCoversRangeAndPropagatesExceptions) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {1, 2, 3, 4, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads " << threads << " n " << n;
      for (auto& h : hits) h = 0;
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      }, 3);
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
    EXPECT_THROW(pool.parallel_for(10, [&](int64_t b, int64_t) {
      if (b == 0) throw std::runtime_error("chunk failed");
    }), std::runtime_error);
    // The pool still works after an exception, and many tiny regions stay correct.
    std::atomic<int64_t> sum{0};
    for (int rep = 0; rep < 2000; ++rep)
      pool.parallel_for(3, [&](int64_t b, int64_t e) { sum += e - b; });
    EXPECT_EQ(sum.load(), 6000);
    // Nested regions run inline instead of deadlocking.
    std::atomic<int64_t> nested{0};
    pool.parallel_for(4, [&](int64_t b, int64_t e) {
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { nested += e2 - b2; });
    });
    EXPECT_GE(nested.load(), 10);
  }
}

}  // namespace
}  // namespace tessera
