// The npusim kernel set against the oracle, in the style of llama.cpp's test-backend-ops:
// every op of the set, a few shapes each (tiny models and a SmolLM2-135M-like shape), run
// through the op layer (mapping -> checker -> engine) and through the oracle's FP32 op on the
// same random inputs, gated with phase 1's metrics; every default mapping passes the
// checker. Then the mapping faults: each must be caught (wrong numbers or a refusal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "gates/gates.h"
#include "model/weights.h"
#include "oracle/ops.h"
#include "targets/npusim/checker.h"
#include "targets/npusim/mappings.h"
#include "npusim_ops.h"
#include "util/error.h"
#include "util/half.h"
#include "test_support.h"

namespace tessera::npusim {
namespace {

using testing_support::xdna2;

std::vector<float> random_vec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

struct Bf16Weight {
  std::vector<uint16_t> bits;
  Weight w;
  Bf16Weight(int64_t N, int64_t K, uint32_t seed, float scale = 0.1f) {
    const auto v = random_vec(N * K, seed, -scale, scale);
    bits.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = tessera::f32_to_bf16(v[i]);
    w.name = "w";
    w.info.name = "w";
    w.info.dtype = DType::BF16;
    w.info.shape = {N, K};
    w.info.data = reinterpret_cast<const uint8_t*>(bits.data());
    w.info.nbytes = uint64_t(bits.size() * 2);
  }
};

// Phase 1's gate: pearson and NMSE against the table ("gemm" or "kernel").
::testing::AssertionResult gate(const std::vector<float>& ref, const std::vector<float>& got, int64_t rows,
                                const std::string& cls) {
  const int64_t cols = int64_t(ref.size()) / rows;
  const auto m = gates::compare(ref.data(), got.data(), rows, cols);
  const double pmin = gates::threshold("phase1." + cls + ".pearson_min");
  const double nmax = gates::threshold("phase1." + cls + ".nmse_max");
  if (std::getenv("TESSERA_TEST_VERBOSE"))
    std::fprintf(stderr, "  %s: pearson %.6f nmse %.3g\n", cls.c_str(), m.pearson, m.nmse);
  if (m.pearson >= pmin && m.nmse <= nmax && m.nan_got == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "pearson " << m.pearson << " (min " << pmin << "), nmse " << m.nmse
                                       << " (max " << nmax << "), nan " << m.nan_got;
}

void expect_all_fit(const NpuOps& ops) {
  for (const auto& [key, l] : ops.launches()) {
    const auto r = check(l, xdna2());
    EXPECT_TRUE(r.empty()) << key << ":\n" << describe(r);
  }
}

TEST(NpusimKernels, Gemv) {
  NpuOps ops(xdna2(), 2);
  struct S { int64_t N, K; bool bias; };
  for (const S s : {S{64, 64, false}, S{128, 256, true}, S{576, 576, false}, S{1536, 576, false}, S{576, 1536, false},
                    S{192, 576, true}, S{96, 16384, false}}) {
    SCOPED_TRACE(::testing::Message() << s.N << "x" << s.K);
    Bf16Weight w(s.N, s.K, uint32_t(s.N * 7 + s.K));
    const auto x = random_vec(s.K, 1);
    const auto bias = random_vec(s.N, 2);
    std::vector<float> ref(size_t(s.N)), got(size_t(s.N));
    oracle::linear(x.data(), 1, w.w, s.bias ? bias.data() : nullptr, ref.data(), 1);
    ops.gemv(w.bits.data(), s.N, s.K, x.data(), s.bias ? bias.data() : nullptr, got.data());
    EXPECT_TRUE(gate(ref, got, 1, "gemm"));
  }
  // The K split is a real split: 16384 > gemv_max_k.
  EXPECT_GT(16384, xdna2().gemv_max_k);
  expect_all_fit(ops);
  ASSERT_FALSE(ops.timings().empty());
  EXPECT_GT(ops.timings().back().total_us, 0);
}

TEST(NpusimKernels, GemvResidentAndLmHead) {
  NpuOps ops(xdna2(), 2);
  Bf16Weight w(256, 64, 5);
  ASSERT_TRUE(gemvs_fit_resident({{256, 64}}, 1, xdna2()));
  // Every layer's slices at once: a 1B model's projections never fit a tile's 64 KiB; one
  // small layer does, sixteen of them do not.
  EXPECT_FALSE(gemvs_fit_resident({{2048, 2048}}, 1, xdna2()));
  EXPECT_TRUE(gemvs_fit_resident({{256, 256}}, 1, xdna2()));
  EXPECT_FALSE(gemvs_fit_resident({{256, 256}}, 64, xdna2()));
  for (int call = 0; call < 2; ++call) {  // the second call reuses W from L1
    const auto x = random_vec(64, 10 + call);
    std::vector<float> ref(256), got(256);
    oracle::linear(x.data(), 1, w.w, nullptr, ref.data(), 1);
    ops.gemv(w.bits.data(), 256, 64, x.data(), nullptr, got.data(), "layer0.q", true);
    EXPECT_TRUE(gate(ref, got, 1, "gemm")) << "call " << call;
  }
  const Launch* l = ops.last_launch();
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(l->fifo("W0")->resident);
  // LM head: vocab 4096 over all 8 columns.
  Bf16Weight e(4096, 64, 6);
  const auto x = random_vec(64, 12);
  std::vector<float> ref(4096), got(4096);
  oracle::linear(x.data(), 1, e.w, nullptr, ref.data(), 1);
  ops.lm_head(e.bits.data(), 4096, 64, x.data(), got.data());
  EXPECT_TRUE(gate(ref, got, 1, "gemm"));
  EXPECT_EQ(ops.last_launch()->herd_cols, 8);
  expect_all_fit(ops);
}

TEST(NpusimKernels, Gemm) {
  NpuOps ops(xdna2(), 2);
  struct S { int64_t T, N, K; bool bias; };
  for (const S s : {S{5, 64, 64, true}, S{16, 128, 256, false}, S{7, 576, 576, false}}) {
    SCOPED_TRACE(::testing::Message() << s.T << "x" << s.K << "->" << s.N);
    Bf16Weight w(s.N, s.K, uint32_t(s.N + s.K));
    const auto x = random_vec(s.T * s.K, 3);
    const auto bias = random_vec(s.N, 4);
    std::vector<float> ref(size_t(s.T * s.N)), got(size_t(s.T * s.N));
    oracle::linear(x.data(), s.T, w.w, s.bias ? bias.data() : nullptr, ref.data(), 1);
    ops.linear(w.bits.data(), s.N, s.K, x.data(), s.T, s.bias ? bias.data() : nullptr, got.data());
    EXPECT_TRUE(gate(ref, got, s.T, "gemm"));
  }
  expect_all_fit(ops);
}

TEST(NpusimKernels, RmsNorm) {
  NpuOps ops(xdna2(), 2);
  struct S { int64_t rows, n; };
  // hidden rows (decode, prefill) and per-head (Qwen3 q_norm: T * heads rows of head_dim)
  for (const S s : {S{1, 576}, S{3, 64}, S{1, 2048}, S{18, 64}, S{8, 16}}) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.n);
    const auto x = random_vec(s.rows * s.n, 5, -2, 2);
    const auto g = random_vec(s.n, 6, 0.5f, 1.5f);
    std::vector<float> ref(x.size()), got(x.size());
    oracle::rmsnorm(x.data(), g.data(), ref.data(), s.rows, s.n, 1e-6);
    ops.rmsnorm(x.data(), g.data(), got.data(), s.rows, s.n, 1e-6);
    EXPECT_TRUE(gate(ref, got, s.rows, "kernel"));
  }
  expect_all_fit(ops);
}

TEST(NpusimKernels, Rope) {
  NpuOps ops(xdna2(), 2);
  ModelSpec spec;
  spec.rope_theta = 10000;
  struct S { int64_t T, heads, hd, pos0; bool llama3; };
  for (const S s : {S{1, 9, 64, 17, false}, S{1, 3, 64, 17, false}, S{3, 4, 16, 0, false}, S{4, 8, 32, 1000, true}}) {
    SCOPED_TRACE(::testing::Message() << s.T << "x" << s.heads << "x" << s.hd << " at " << s.pos0);
    spec.head_dim = s.hd;
    spec.rope_scaling = {};
    if (s.llama3) {
      spec.rope_theta = 500000;
      spec.rope_scaling.type = RopeScaling::Type::Llama3;
      spec.rope_scaling.factor = 32;
    }
    const auto inv = oracle::rope_inv_freq(spec);
    auto ref = random_vec(s.T * s.heads * s.hd, 7);
    auto got = ref;
    oracle::rope(ref.data(), s.T, s.heads, s.hd, s.pos0, inv);
    ops.rope(got.data(), s.T, s.heads, s.hd, s.pos0, inv);
    EXPECT_TRUE(gate(ref, got, s.T, "kernel"));
  }
  expect_all_fit(ops);
}

void attention_case(NpuOps& ops, int64_t T, int64_t pos0, int64_t heads, int64_t kv_heads, int64_t hd) {
  SCOPED_TRACE(::testing::Message() << "T " << T << " pos0 " << pos0 << " heads " << heads << "/" << kv_heads << " hd "
                                    << hd);
  ModelSpec spec;
  spec.n_heads = heads;
  spec.n_kv_heads = kv_heads;
  spec.head_dim = hd;
  const int64_t keys = pos0 + T, kvd = kv_heads * hd, rows = NpuOps::kv_rows_for(keys);
  const auto q = random_vec(T * heads * hd, 8);
  const auto k = random_vec(keys * kvd, 9);
  const auto v = random_vec(keys * kvd, 10);
  std::vector<uint16_t> cache(size_t(rows * 2 * kvd), 0x7fc0);  // unwritten rows hold NaN
  NpuOps::kv_store(cache.data(), kvd, 0, k.data(), v.data(), keys);
  std::vector<float> ref(q.size()), got(q.size());
  oracle::attention(q.data(), T, pos0, k.data(), v.data(), spec, ref.data(), 1);
  if (T == 1)
    ops.attention_decode(q.data(), pos0, heads, kv_heads, hd, cache.data(), rows, got.data());
  else
    ops.attention_prefill(q.data(), T, pos0, heads, kv_heads, hd, cache.data(), rows, got.data());
  EXPECT_TRUE(gate(ref, got, T, "kernel"));
  const auto r = check(*ops.last_launch(), xdna2());
  EXPECT_TRUE(r.empty()) << describe(r);
}

TEST(NpusimKernels, AttentionDecode) {
  NpuOps ops(xdna2(), 2);
  attention_case(ops, 1, 0, 4, 2, 16);
  attention_case(ops, 1, 37, 9, 3, 64);    // SmolLM2-135M-like
  attention_case(ops, 1, 100, 32, 8, 64);  // Llama-3.2-1B-like
  attention_case(ops, 1, 9, 4, 4, 32);     // MHA
}

TEST(NpusimKernels, AttentionPrefill) {
  NpuOps ops(xdna2(), 2);
  attention_case(ops, 8, 0, 4, 2, 16);
  attention_case(ops, 8, 5, 4, 2, 16);  // start position offset
  attention_case(ops, 6, 0, 9, 3, 64);
  attention_case(ops, 70, 3, 2, 1, 32);  // several query and key tiles
}

TEST(NpusimKernels, SoftmaxSiluAddEmbedding) {
  NpuOps ops(xdna2(), 2);
  {  // softmax: rows of scores
    const auto x = random_vec(4 * 96, 11, -4, 4);
    std::vector<float> ref(x.size()), got(x.size());
    for (int64_t r = 0; r < 4; ++r) {
      float mx = -1e30f, sum = 0;
      for (int64_t i = 0; i < 96; ++i) mx = std::max(mx, x[size_t(r * 96 + i)]);
      for (int64_t i = 0; i < 96; ++i) sum += (ref[size_t(r * 96 + i)] = std::exp(x[size_t(r * 96 + i)] - mx));
      for (int64_t i = 0; i < 96; ++i) ref[size_t(r * 96 + i)] /= sum;
    }
    ops.softmax(x.data(), got.data(), 4, 96);
    EXPECT_TRUE(gate(ref, got, 4, "kernel"));
  }
  for (int64_t n : {int64_t(128), int64_t(1536), int64_t(3 * 1536)}) {  // SiLU x mul
    const auto g = random_vec(n, 12, -4, 4), u = random_vec(n, 13, -2, 2);
    std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    oracle::silu_mul(g.data(), u.data(), ref.data(), n);
    ops.silu_mul(g.data(), u.data(), got.data(), n);
    EXPECT_TRUE(gate(ref, got, 1, "kernel")) << n;
  }
  for (int64_t n : {int64_t(64), int64_t(3 * 576)}) {  // residual add
    auto acc = random_vec(n, 14);
    const auto x = random_vec(n, 15);
    std::vector<float> ref(acc);
    for (int64_t i = 0; i < n; ++i) ref[size_t(i)] += x[size_t(i)];
    ops.add(acc.data(), x.data(), n);
    EXPECT_TRUE(gate(ref, acc, 1, "kernel")) << n;
  }
  for (int64_t T : {int64_t(3), int64_t(130)}) {  // embedding: a row gather (130 tokens: several launches)
    const int64_t vocab = 1000, hidden = 576;
    Bf16Weight table(vocab, hidden, 16, 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7919 + 13) % vocab);
    std::vector<float> got(size_t(T * hidden));
    ops.embedding(table.bits.data(), vocab, hidden, ids.data(), T, got.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < hidden; i += 97)
        ASSERT_EQ(got[size_t(t * hidden + i)], tessera::bf16_to_f32(table.bits[size_t(ids[size_t(t)] * hidden + i)]));
  }
  expect_all_fit(ops);
}

TEST(NpusimKernels, DefaultMappingsFitSmolLM2Shapes) {
  // Every generator's defaults on the SmolLM2-135M-like shapes pass the checker.
  const Device& d = xdna2();
  std::vector<Launch> ls;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}})
    ls.push_back(gemv_launch({N, K}, default_gemv_tiles({N, K}, d), d));
  const GemmPlan p = default_gemm_plan(32, 576, 1536, d);
  ls.push_back(gemm_launch(p.shape, p.tiles, p.herd, d, {.c_type = ElemType::F32, .b_nk = true}));
  ls.push_back(row_launch(RowOp::RmsNorm, {32, 576}, default_row_tiles(RowOp::RmsNorm, {32, 576}, d), d));
  ls.push_back(row_launch(RowOp::Softmax, {9, 512}, default_row_tiles(RowOp::Softmax, {9, 512}, d), d));
  ls.push_back(elt_launch(EltOp::SiluMul, 32 * 1536, default_elt_tiles(EltOp::SiluMul, 32 * 1536, d), d));
  ls.push_back(elt_launch(EltOp::Add, 32 * 576, default_elt_tiles(EltOp::Add, 32 * 576, d), d));
  ls.push_back(rope_launch({32, 9, 64}, default_rope_tiles({32, 9, 64}, d), d));
  const AttnShape a{32, 0, 9, 3, 64};
  ls.push_back(attention_launch(a, default_attn_tiles(a, d), d));
  const AttnShape a2{2048, 0, 32, 8, 64};  // the measured flash-attention shape
  ls.push_back(attention_launch(a2, default_attn_tiles(a2, d), d));
  for (const auto& l : ls) {
    const auto r = check(l, d);
    EXPECT_TRUE(r.empty()) << l.name << ": " << describe(r);
    EXPECT_GT(time_launch(l, d).total_us, 0) << l.name;
  }
}

// ---- faults: each mapping bug must be caught ----

TEST(NpusimKernels, FaultTransposedPatternFailsTheGate) {
  NpuOps ops(xdna2(), 2);
  ops.set_faults("gemv", {.transposed_pattern = true});
  Bf16Weight w(256, 256, 21);
  const auto x = random_vec(256, 22);
  std::vector<float> ref(256), got(256);
  oracle::linear(x.data(), 1, w.w, nullptr, ref.data(), 1);
  ops.gemv(w.bits.data(), 256, 256, x.data(), nullptr, got.data());
  EXPECT_FALSE(gate(ref, got, 1, "gemm"));
  // Row ops too: x read transposed.
  ops.set_faults("rmsnorm", {.transposed_pattern = true});
  const auto xr = random_vec(8 * 64, 23, -2, 2);
  const auto g = random_vec(64, 24, 0.5f, 1.5f);
  std::vector<float> rr(xr.size()), rg(xr.size());
  oracle::rmsnorm(xr.data(), g.data(), rr.data(), 8, 64, 1e-6);
  ops.rmsnorm(xr.data(), g.data(), rg.data(), 8, 64, 1e-6);
  EXPECT_FALSE(gate(rr, rg, 8, "kernel"));
}

TEST(NpusimKernels, FaultStaleBufferGivesWrongNumbersOnTheSecondCall) {
  NpuOps ops(xdna2(), 2);
  ops.set_faults("gemv", {.stale_buffer = true});
  Bf16Weight w(128, 128, 31);
  for (int call = 0; call < 2; ++call) {
    const auto x = random_vec(128, 32 + call);
    std::vector<float> ref(128), got(128);
    oracle::linear(x.data(), 1, w.w, nullptr, ref.data(), 1);
    ops.gemv(w.bits.data(), 128, 128, x.data(), nullptr, got.data());
    if (call == 0)
      EXPECT_TRUE(gate(ref, got, 1, "gemm"));
    else
      EXPECT_FALSE(gate(ref, got, 1, "gemm"));  // x was never refilled
  }
}

TEST(NpusimKernels, FaultOversizeTileIsRefusedAsL1Overflow) {
  const Device& d = xdna2();
  GemvOptions o;
  o.faults.l1_overflow = true;
  const Launch l = gemv_launch({2048, 2048}, default_gemv_tiles({2048, 2048}, d), d, o);
  const auto r = check(l, d);
  bool found = false;
  for (const auto& x : r)
    if (x.code == "l1-overflow") {
      found = true;
      EXPECT_GT(x.needed, x.available);
      EXPECT_EQ(x.available, d.l1_bytes);
      EXPECT_NE(x.text.find("L1 needs"), std::string::npos) << x.text;
    }
  EXPECT_TRUE(found) << describe(r);
  // The engine refuses to run it.
  NpuOps ops(d, 1);
  ops.set_faults("gemv", o.faults);
  Bf16Weight w(2048, 2048, 41);
  const auto x = random_vec(2048, 42);
  std::vector<float> y(2048);
  EXPECT_THROW(ops.gemv(w.bits.data(), 2048, 2048, x.data(), nullptr, y.data()), Error);
}

TEST(NpusimKernels, FaultBdHungryPatternIsRefusedAsBdExhaustion) {
  const Device& d = xdna2();
  for (int which = 0; which < 2; ++which) {
    Launch l;
    if (which == 0) {
      GemvOptions o;
      o.faults.bd_exhaustion = true;
      l = gemv_launch({576, 576}, default_gemv_tiles({576, 576}, d), d, o);
    } else {
      RowOptions o;
      o.faults.bd_exhaustion = true;
      l = row_launch(RowOp::RmsNorm, {32, 576}, default_row_tiles(RowOp::RmsNorm, {32, 576}, d), d, o);
    }
    const auto r = check(l, d);
    bool found = false;
    for (const auto& x : r)
      if (x.code == "bd-exhaustion") {
        found = true;
        EXPECT_GT(x.needed, x.available);
      }
    EXPECT_TRUE(found) << describe(r);
  }
}

}  // namespace
}  // namespace tessera::npusim
