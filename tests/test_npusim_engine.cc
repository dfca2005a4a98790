// npusim engine: mapped kernels give the right numbers, and mapping bugs (a wrong access
// pattern, a stale buffer) give wrong ones, as on the device.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "targets/npusim/checker.h"
#include "targets/npusim/engine.h"
#include "npusim_examples.h"
#include "targets/npusim/mappings_gemm.h"
#include "targets/npusim/timing.h"
#include "util/error.h"
#include "util/half.h"
#include "test_support.h"

namespace tessera::npusim {
namespace {

using testing_support::xdna2;

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = f32_to_bf16(dist(g));
  return v;
}

// C = A . B in fp32 from the bf16 values; B is [K, N] or, with b_nk, [N, K].
std::vector<float> reference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int64_t M, int64_t K,
                             int64_t N, bool b_nk) {
  std::vector<float> c(size_t(M * N), 0.0f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p)
        s += double(bf16_to_f32(a[size_t(i * K + p)])) * bf16_to_f32(b[size_t(b_nk ? j * K + p : p * N + j)]);
      c[size_t(i * N + j)] = float(s);
    }
  return c;
}

struct Err {
  double max_rel = 0;  // max |c - ref| / max |ref|
  double cosine = 0;
};
template <typename T>
Err compare(const std::vector<T>& c, const std::vector<float>& ref) {
  double dot = 0, na = 0, nb = 0, maxdiff = 0, maxref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = std::is_same_v<T, uint16_t> ? double(bf16_to_f32(uint16_t(c[i]))) : double(c[i]);
    dot += x * ref[i];
    na += x * x;
    nb += double(ref[i]) * ref[i];
    maxdiff = std::max(maxdiff, std::fabs(x - ref[i]));
    maxref = std::max(maxref, double(std::fabs(ref[i])));
  }
  return {maxdiff / maxref, (na > 0 && nb > 0) ? dot / std::sqrt(na * nb) : 0.0};
}

struct GemmCase {
  GemmShape s;
  GemmTiles t;
  GemmHerd h;
  bool b_nk;
  ElemType c_type;
};

class NpusimEngineGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(NpusimEngineGemm, MatchesFp32ReferenceWithinBf16Tolerance) {
  const auto& p = GetParam();
  Engine eng(xdna2(), 2);
  register_gemm_kernels(eng);
  const Launch l = gemm_launch(p.s, p.t, p.h, xdna2(), {.c_type = p.c_type, .b_nk = p.b_nk});
  auto a = random_bf16(p.s.M * p.s.K, 1), b = random_bf16(p.s.K * p.s.N, 2);
  const auto ref = reference(a, b, p.s.M, p.s.K, p.s.N, p.b_nk);
  Err e;
  if (p.c_type == ElemType::BF16) {
    std::vector<uint16_t> c(size_t(p.s.M * p.s.N), 0xffff);
    eng.run(l, {{"A", DdrTensor::bf16(a.data(), int64_t(a.size()))},
                {"B", DdrTensor::bf16(b.data(), int64_t(b.size()))},
                {"C", DdrTensor::bf16(c.data(), int64_t(c.size()))}});
    e = compare(c, ref);
    // bf16 output rounded once per k block: a few bf16 ulps of the largest value.
    EXPECT_LT(e.max_rel, 0.02);
  } else {
    std::vector<float> c(size_t(p.s.M * p.s.N), NAN);
    eng.run(l, {{"A", DdrTensor::bf16(a.data(), int64_t(a.size()))},
                {"B", DdrTensor::bf16(b.data(), int64_t(b.size()))},
                {"C", DdrTensor::f32(c.data(), int64_t(c.size()))}});
    e = compare(c, ref);
    EXPECT_LT(e.max_rel, 1e-5);  // fp32 accumulation, only the summation order differs
  }
  EXPECT_GT(e.cosine, 0.9999);
}

INSTANTIATE_TEST_SUITE_P(
    Npusim, NpusimEngineGemm,
    ::testing::Values(GemmCase{{128, 96, 128}, {32, 32, 32, 0}, {2, 2, true}, false, ElemType::BF16},
                      GemmCase{{128, 128, 64}, {32, 32, 16, 64}, {2, 2, false}, false, ElemType::F32},
                      GemmCase{{64, 128, 128}, {16, 32, 32, 0}, {4, 2, true}, true, ElemType::BF16},
                      GemmCase{{128, 64, 96}, {16, 16, 16, 0}, {4, 3, false}, true, ElemType::F32}));

TEST(NpusimEngine, TransposedAccessPatternGivesWrongNumbers) {
  const GemmShape s{64, 64, 64};
  Engine eng(xdna2(), 2);
  register_gemm_kernels(eng);
  Launch l = gemm_launch(s, {32, 32, 32, 0}, {2, 2, true}, xdna2(), {.c_type = ElemType::F32});
  auto a = random_bf16(s.M * s.K, 3), b = random_bf16(s.K * s.N, 4);
  const auto ref = reference(a, b, s.M, s.K, s.N, false);
  auto run = [&](const Launch& launch) {
    std::vector<float> c(size_t(s.M * s.N), 0.0f);
    eng.run(launch, {{"A", DdrTensor::bf16(a.data(), int64_t(a.size()))},
                     {"B", DdrTensor::bf16(b.data(), int64_t(b.size()))},
                     {"C", DdrTensor::f32(c.data(), int64_t(c.size()))}});
    return compare(c, ref);
  };
  EXPECT_GT(run(l).cosine, 0.99999);
  // Swap the two innermost dimensions of every A pattern: the DMA now reads A's tiles
  // transposed (a classic layout bug); every size still fits, the checker is satisfied.
  for (auto& f : l.fifos)
    if (f.tensor == "A")
      for (auto& p : f.ddr) {
        const size_t n = p.sizes.size();
        std::swap(p.strides[n - 1], p.strides[n - 2]);
      }
  const Err bad = run(l);
  EXPECT_LT(bad.cosine, 0.5) << "a transposed A pattern went unnoticed";
  EXPECT_GT(bad.max_rel, 0.3);
}

TEST(NpusimEngine, ElementwiseAddAndStaleResidentSlot) {
  const int64_t n = 8 * 2 * 256;
  Engine eng(xdna2(), 2);
  register_example_kernels(eng);
  auto x = random_bf16(n, 5), y = random_bf16(n, 6);
  std::vector<uint16_t> z(static_cast<size_t>(n));
  auto expect_sum = [&](const std::vector<uint16_t>& xs) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += z[size_t(i)] != f32_to_bf16(bf16_to_f32(xs[size_t(i)]) + bf16_to_f32(y[size_t(i)]));
    return wrong;
  };
  Bindings bind = {{"X", DdrTensor::bf16(x.data(), n)},
                   {"Y", DdrTensor::bf16(y.data(), n)},
                   {"Z", DdrTensor::bf16(z.data(), n)}};
  // X marked resident: correct on the first call...
  const Launch l = example_add_launch(n, 8, 256, xdna2(), /*resident_x=*/true);
  eng.run(l, bind);
  EXPECT_EQ(expect_sum(x), 0);
  const int64_t in_first = eng.stats().dma_in_bytes;
  // ...but X is an activation, not a weight: new X, and the L1 slots still hold the old one.
  const auto x_old = x;
  x = random_bf16(n, 7);
  bind["X"] = DdrTensor::bf16(x.data(), n);
  eng.run(l, bind);
  EXPECT_GT(expect_sum(x), n / 2) << "a stale resident slot gave right numbers";
  EXPECT_EQ(expect_sum(x_old), 0);  // exactly the previous call's X
  EXPECT_EQ(eng.stats().dma_in_bytes - in_first, n * 2);  // only Y moved on the second call
  // The correct mapping refills X every call.
  const Launch ok = example_add_launch(n, 8, 256, xdna2(), false);
  eng.run(ok, bind);
  EXPECT_EQ(expect_sum(x), 0);
}

// Worker-to-worker fifos (issue 17 item 3): a two-stage pipeline through a link computes
// 2x + 1; a consumer that holds more objects than the link's depth, and two workers that
// each wait for the other's object first, are reported with the tiles and fifos involved.
TEST(NpusimEngine, LinkFifoPipelineOrderAndDepth) {
  const int64_t n = 4 * 256;
  Engine eng(xdna2(), 2);
  register_example_kernels(eng);
  auto x = random_bf16(n, 11);
  std::vector<uint16_t> z(static_cast<size_t>(n));
  const Bindings bind = {{"X", DdrTensor::bf16(x.data(), n)}, {"Z", DdrTensor::bf16(z.data(), n)}};
  for (const auto& [depth, hold] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 2}}) {
    const Launch l = example_pipeline_launch(n, 64, depth, hold, xdna2());
    EXPECT_TRUE(check(l, xdna2()).empty()) << describe(check(l, xdna2()));
    std::fill(z.begin(), z.end(), uint16_t(0));
    eng.run(l, bind);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += z[size_t(i)] != f32_to_bf16(bf16_to_f32(f32_to_bf16(2.0f * bf16_to_f32(x[size_t(i)]))) + 1.0f);
    EXPECT_EQ(wrong, 0) << "depth " << depth << ", hold " << hold;
  }
  // Too shallow: the consumer holds 2 objects of a 1-deep link.
  try {
    eng.run(example_pipeline_launch(n, 64, 1, 2, xdna2()), bind);
    ADD_FAILURE() << "a consumer holding two objects of a one-deep link ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tile (0,3)"), std::string::npos) << m;
    EXPECT_NE(m.find("fifo L (depth 1)"), std::string::npos) << m;
  }
  // The right order completes; each waiting for the other first deadlocks, both tiles named.
  EXPECT_NO_THROW(eng.run(example_ring_launch(3, false, xdna2()), {}));
  try {
    eng.run(example_ring_launch(3, true, xdna2()), {});
    ADD_FAILURE() << "a cycle of consumers waiting first ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlocks"), std::string::npos) << m;
    EXPECT_NE(m.find("worker A on tile (0,2) waits for object 0 of fifo BA"), std::string::npos) << m;
    EXPECT_NE(m.find("worker B on tile (0,3) waits for object 0 of fifo AB"), std::string::npos) << m;
  }
  // A link of depth 0 is refused by the checker, naming the producer's tile.
  Launch zero = example_pipeline_launch(n, 64, 1, 1, xdna2());
  zero.links[0].depth = 0;
  const auto refusals = check(zero, xdna2());
  ASSERT_FALSE(refusals.empty());
  EXPECT_NE(describe(refusals).find("link fifo L: depth must be >= 1"), std::string::npos) << describe(refusals);
  // The timing model prices the link's legs (tile to tile, no DDR).
  const LaunchTiming t1 = time_launch(example_pipeline_launch(n, 64, 2, 1, xdna2()), xdna2());
  EXPECT_GT(t1.dma_us, 0);
  EXPECT_EQ(t1.ddr_bytes, 2 * n * 2);  // X in, Z out; L moves no DDR bytes
}

TEST(NpusimEngine, DispatchOnceSyncedBufferGoesStaleZeroCopyDoesNot) {
  const int64_t n = 4 * 512;
  Engine eng(xdna2(), 1);
  register_example_kernels(eng);
  auto x = random_bf16(n, 8), y = random_bf16(n, 9);
  std::vector<uint16_t> z(static_cast<size_t>(n));
  auto make = [&](Sync x_sync) {
    Dispatch d;
    d.name = std::string("add_") + sync_name(x_sync);
    d.buffers = {{"X", ElemType::BF16, n, x_sync, true, false},
                 {"Y", ElemType::BF16, n, Sync::EveryCall, true, false},
                 {"Z", ElemType::BF16, n, Sync::EveryCall, false, true}};
    d.launches = {example_add_launch(n, 4, 512, xdna2())};
    return d;
  };
  const Bindings bind = {{"X", DdrTensor::bf16(x.data(), n)},
                         {"Y", DdrTensor::bf16(y.data(), n)},
                         {"Z", DdrTensor::bf16(z.data(), n)}};
  auto correct = [&] {
    for (int64_t i = 0; i < n; ++i)
      if (z[size_t(i)] != f32_to_bf16(bf16_to_f32(x[size_t(i)]) + bf16_to_f32(y[size_t(i)]))) return false;
    return true;
  };
  for (Sync s : {Sync::Once, Sync::ZeroCopy, Sync::EveryCall}) {
    const Dispatch d = make(s);
    auto fresh = random_bf16(n, 10);
    std::copy(fresh.begin(), fresh.end(), x.begin());  // bound memory stays where it is
    eng.run(d, bind);
    EXPECT_TRUE(correct()) << sync_name(s);
    fresh = random_bf16(n, 11);  // the host changes X in place between calls
    std::copy(fresh.begin(), fresh.end(), x.begin());
    eng.run(d, bind);
    EXPECT_EQ(correct(), s != Sync::Once) << sync_name(s);
  }
}

TEST(NpusimEngine, GemvMatchesAndHangsAreRefused) {
  const int64_t N = 64, K = 256;
  Engine eng(xdna2(), 2);
  register_example_kernels(eng);
  auto w = random_bf16(N * K, 12), x = random_bf16(K, 13);
  std::vector<uint16_t> y(static_cast<size_t>(N));
  Launch l = example_gemv_launch(N, K, 4, 2, xdna2());
  Bindings bind = {{"W", DdrTensor::bf16(w.data(), N * K)},
                   {"x", DdrTensor::bf16(x.data(), K)},
                   {"y", DdrTensor::bf16(y.data(), N)}};
  eng.run(l, bind);
  const auto ref = reference(w, x, N, K, 1, false);
  EXPECT_GT(compare(y, ref).cosine, 0.9999);
  EXPECT_LT(compare(y, ref).max_rel, 0.01);
  // The runtime sequence moves half the weights: the worker's acquire would hang the device.
  Launch short_fill = l;
  for (auto& f : short_fill.fifos)
    if (f.name == "W1") f.ddr[0].sizes[0] /= 2;
  try {
    eng.run(short_fill, bind);
    FAIL() << "an acquire past the transfer's end ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hang"), std::string::npos) << e.what();
  }
  // A pattern outside its tensor is refused before anything moves.
  Launch oob = l;
  oob.fifos[0].ddr[0].offset = N * K;
  EXPECT_THROW(eng.run(oob, bind), Error);
  // A launch the checker refuses does not run.
  Launch big = example_gemv_launch(N, 8192, 4, 1, xdna2());
  EXPECT_THROW(eng.run(big, bind), Error);
}

// The engine's DMA and kernels must be fast enough for a full Llama-3.2-1B decode step
// (2.5 GB of weights through GEMVs) in under 2 s on 2 cores: >= 1.25 GB/s of weights.
// 16 MiB here; the bound is loose (0.25 GB/s) so that sanitizer builds pass too.
TEST(NpusimEngine, GemvThroughputIsUsable) {
  const int64_t N = 4096, K = 2048;
  Engine eng(xdna2(), 2);
  register_example_kernels(eng);
  std::vector<uint16_t> w(size_t(N * K), f32_to_bf16(0.5f)), x(size_t(K), f32_to_bf16(1.0f)), y(static_cast<size_t>(N));
  const Launch l = example_gemv_launch(N, K, 8, 4, xdna2());
  const Bindings bind = {{"W", DdrTensor::bf16(w.data(), N * K)},
                         {"x", DdrTensor::bf16(x.data(), K)},
                         {"y", DdrTensor::bf16(y.data(), N)}};
  eng.run(l, bind);  // warm
  const auto t0 = std::chrono::steady_clock::now();
  eng.run(l, bind);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(bf16_to_f32(y[0]), 1024.0f);
  const double gbs = double(N * K * 2) / s / 1e9;
  RecordProperty("weights_GBps", std::to_string(gbs));
  EXPECT_GT(gbs, 0.25) << gbs << " GB/s";
}

}  // namespace
}  // namespace tessera::npusim
