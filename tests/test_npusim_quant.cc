// npusim W4A16 / W8A16: quantized weights move through the DMA as the file's GGML blocks and
// are unpacked on the compute tile. The tile's weights are the oracle's bit for bit; the
// GEMV and GEMM compute with them exactly (no bf16 rounding of a weight); the timing model's
// decode reads the blocks' bytes; and tiny presets quantized to Q4_0 and Q8_0 deploy through
// phases 0-6 (a representative pair here; scripts/npusim_quant_presets.sh runs all eleven).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "convert/gguf_quantize.h"
#include "io/quant_plan.h"
#include "io/quantize.h"
#include "model/weights.h"
#include "model/presets.h"
#include "pipeline/deploy.h"
#include "synth/synth.h"
#include "targets/npusim/checker.h"
#include "targets/npusim/engine.h"
#include "targets/npusim/mappings.h"
#include "targets/npusim/npusim_runner.h"
#include "targets/npusim/predict.h"
#include "targets/npusim/weight_blocks.h"
#include "test_support.h"
#include "util/half.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_support::ScratchDir;
using testing_support::xdna2;

// A tiny preset quantized to `scheme` (one file per preset and scheme per test process).
const std::string& quantized_tiny(const std::string& preset, const std::string& scheme) {
  static std::mutex mu;
  static std::map<std::string, std::string> made;
  static ScratchDir root("npusim_quant_models");
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = preset + "." + scheme;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const Model src = Model::open(testing_support::tiny_model(preset));
  QuantizeOptions q;
  q.out_path = root.str(key + ".gguf");
  q.threads = 2;
  quantize_model(src, *find_quant_scheme(scheme), q);
  return made[key] = q.out_path;
}

// Every matrix the array runs in blocks, unpacked as the tile does, equals the oracle's upcast
// of the same rows (io/tensor.cc, the gguf package's numerics) bit for bit; each integer term is
// exact in bf16 (what lets the bf16 MAC unit multiply it exactly). The q/k rows of a GGUF llama
// file are stored permuted: the store's reordered copy is checked row by row too.
TEST(NpusimQuant, UnpackedBlocksAreTheOraclesWeights) {
  using npusim::ElemType;
  // Each scheme's expected formats of w.q w.k w.v w.o w.gate w.up w.down w.lm_head. The tiny
  // Llama-3.2-1B (hidden 256, intermediate 768: every K whole super-blocks) at q4_k_m holds its
  // q/k/o/gate/up in Q4_K, its tied head in Q6_K and v/down in Q4_K in layer 0 and Q6_K in
  // layer 1 (llama.cpp's use_more_bits): those two buffers differ across layers, so bf16.
  const std::vector<std::pair<std::string, std::vector<ElemType>>> cases = {
      {"q4_0", std::vector<ElemType>(8, ElemType::Q4_0)},
      {"q8_0", std::vector<ElemType>(8, ElemType::Q8_0)},
      {"q4_1", std::vector<ElemType>(8, ElemType::Q4_1)},
      {"q5_0", std::vector<ElemType>(8, ElemType::Q5_0)},
      {"q5_1", std::vector<ElemType>(8, ElemType::Q5_1)},
      {"q4_k", std::vector<ElemType>(8, ElemType::Q4_K)},
      {"q5_k", std::vector<ElemType>(8, ElemType::Q5_K)},
      {"q6_k", std::vector<ElemType>(8, ElemType::Q6_K)},
      {"q4_k_m", {ElemType::Q4_K, ElemType::Q4_K, ElemType::BF16, ElemType::Q4_K, ElemType::Q4_K, ElemType::Q4_K,
                  ElemType::BF16, ElemType::Q6_K}},
  };
  const char* buffers[] = {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"};
  for (const auto& [scheme, want] : cases) {
    SCOPED_TRACE(scheme);
    const Model m = Model::open(quantized_tiny("Llama-3.2-1B", scheme));
    TargetOptions o;
    o.threads = 2;
    NpuSimRunner npu(m, o);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(npu.weight_formats().of(buffers[i]), want[i]) << buffers[i];
    int64_t checked = 0, permuted = 0, matrix_values = 0;
    std::vector<float> ref;
    for (const auto& [name, w] : m.weights()) {
      if (!npu.weights().in_blocks(name)) continue;
      const npusim::BlockMatrix& bm = npu.weights().blocks(name);
      ASSERT_EQ(bm.rows, w.rows());
      ASSERT_EQ(bm.cols, w.cols());
      matrix_values += w.rows() * w.cols();
      permuted += w.unpermute_head_dim > 0;
      ref.resize(size_t(w.cols()));
      const int64_t ev = npusim::block_values(bm.type), per_row = bm.cols / ev;
      for (int64_t r = 0; r < bm.rows; ++r) {
        w.row_f32(r, ref.data());
        for (int64_t b = 0; b < per_row; ++b) {
          const npusim::BlockTerms t =
              npusim::unpack_block(bm.type, bm.data + (r * per_row + b) * npusim::elem_bytes(bm.type));
          ASSERT_EQ(t.values, ev);
          for (int i = 0; i < ev; ++i) {
            const float v = float(t.v[i]);
            ASSERT_EQ(bf16_to_f32(f32_to_bf16(v)), v);
            const float got = t.weight(i);
            const float want_w = ref[size_t(b * ev + i)];
            ASSERT_EQ(std::memcmp(&got, &want_w, 4), 0)
                << name << " row " << r << " value " << b * ev + i << ": " << got << " vs " << want_w;
            ++checked;
          }
        }
      }
    }
    EXPECT_GT(permuted, 0);  // the GGUF's q and k (stored permuted) were among them
    EXPECT_EQ(checked, matrix_values);
    int64_t expected_values = 0;  // the matrices of the buffers held in blocks
    for (const auto& [name, w] : m.weights())
      if (w.info.shape.size() == 2 && npu.weights().in_blocks(name)) expected_values += w.rows() * w.cols();
    if (std::count(want.begin(), want.end(), ElemType::BF16) == 0) {
      int64_t all_values = 0;  // every matrix of the model: 7 per layer and the (tied) head
      for (const auto& [name, w] : m.weights())
        if (w.info.shape.size() == 2) all_values += w.rows() * w.cols();
      EXPECT_EQ(checked, all_values);
    }
    EXPECT_EQ(checked, expected_values);
    EXPECT_GT(checked, 0);
  }
}

// The K-quants' sub-block scales and mins, unpacked on the tile, against the oracle's dequant
// (io/tensor.cc's to_f32) over blocks the quantizer made from weights with very different
// ranges per 32 (so every one of the 8 packed 6-bit scales and mins, and Q6_K's 16 int8 scales,
// differ): every weight bit for bit, and each group's scale and min are not all alike.
TEST(NpusimQuant, SubBlockScalesAndMinsMatchTheOracle) {
  const int64_t n = 256 * 64;
  std::mt19937 rng(11);
  std::vector<float> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = i / 16;
    std::normal_distribution<float> dist(float(int(g % 5) - 2) * 0.01f, 0.002f + 0.01f * float(g % 7));
    src[size_t(i)] = dist(rng);
  }
  for (const auto& [dt, et] : {std::pair{DType::Q4_K, npusim::ElemType::Q4_K}, std::pair{DType::Q5_K, npusim::ElemType::Q5_K},
                               std::pair{DType::Q6_K, npusim::ElemType::Q6_K}, std::pair{DType::Q4_1, npusim::ElemType::Q4_1},
                               std::pair{DType::Q5_0, npusim::ElemType::Q5_0}, std::pair{DType::Q5_1, npusim::ElemType::Q5_1}}) {
    SCOPED_TRACE(npusim::elem_type_name(et));
    ASSERT_EQ(dtype_block_bytes(dt), npusim::elem_bytes(et));
    ASSERT_EQ(dtype_block_values(dt), npusim::block_values(et));
    std::vector<uint8_t> blocks(size_t(dtype_bytes(dt, n)));
    quantize_f32(dt, src.data(), blocks.data(), n);
    std::vector<float> want(static_cast<size_t>(n));
    to_f32(dt, blocks.data(), want.data(), n);
    const int64_t ev = npusim::block_values(et);
    std::set<float> scales, mins;
    for (int64_t e = 0; e < n / ev; ++e) {
      const npusim::BlockTerms t = npusim::unpack_block(et, blocks.data() + e * npusim::elem_bytes(et));
      for (int g = 0; g < t.groups(); ++g) scales.insert(t.scale[g]), mins.insert(t.min[g]);
      for (int i = 0; i < ev; ++i) {
        const float got = t.weight(i), w = want[size_t(e * ev + i)];
        ASSERT_EQ(std::memcmp(&got, &w, 4), 0) << "element " << e << " value " << i << ": " << got << " vs " << w;
      }
    }
    // A K-quant's sub-blocks have scales (and mins) of their own: more distinct ones than
    // super-blocks; a 32-weight type's blocks mostly differ.
    const size_t at_least = ev == 256 ? size_t(n / ev) : size_t(n / ev / 2);
    EXPECT_GT(scales.size(), at_least);
    if (npusim::has_min(et)) {
      EXPECT_GT(mins.size(), at_least);
    }
  }
}

// Random weights quantized by the gguf-package quantizer (io/quantize.h), a GEMV and a GEMM on
// their blocks through the engine: within fp32 accumulation of the exact product (x rounded to
// bf16, the weights the oracle's), and much closer to it than a bf16 copy of the weights gets.
TEST(NpusimQuant, GemvAndGemmComputeWithTheExactWeights) {
  const npusim::Device& d = xdna2();
  const int64_t N = 256, K = 512, M = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> wsrc(size_t(N * K)), x(size_t(M * K));
  for (float& v : wsrc) v = g(rng);
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(g(rng) * 20.0f));  // bf16 values: what the array reads
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  const std::pair<DType, npusim::ElemType> types[] = {
      {DType::Q4_0, npusim::ElemType::Q4_0}, {DType::Q8_0, npusim::ElemType::Q8_0}, {DType::Q4_1, npusim::ElemType::Q4_1},
      {DType::Q5_0, npusim::ElemType::Q5_0}, {DType::Q5_1, npusim::ElemType::Q5_1}, {DType::Q4_K, npusim::ElemType::Q4_K},
      {DType::Q5_K, npusim::ElemType::Q5_K}, {DType::Q6_K, npusim::ElemType::Q6_K}};
  for (const auto& [dt, et] : types) {
    SCOPED_TRACE(npusim::elem_type_name(et));
    const int64_t nel = N * K / npusim::block_values(et);  // elements of W
    std::vector<uint8_t> blocks(size_t(dtype_bytes(dt, N * K)));
    quantize_f32(dt, wsrc.data(), blocks.data(), N * K);
    std::vector<float> w(size_t(N * K));
    to_f32(dt, blocks.data(), w.data(), N * K);  // the oracle's weights
    // References in double: the exact weights, and their bf16 rounding (what a bf16 copy computes with).
    auto ref = [&](int64_t row_x, bool bf16_w, std::vector<double>& out) {
      out.assign(size_t(N), 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const float wk = bf16_w ? bf16_to_f32(f32_to_bf16(w[size_t(n * K + k)])) : w[size_t(n * K + k)];
          out[size_t(n)] += double(wk) * double(x[size_t(row_x * K + k)]);
        }
    };
    auto rel_err = [&](const float* got, const std::vector<double>& r) {
      double e = 0, s = 0;
      for (int64_t n = 0; n < N; ++n) e += (got[n] - r[size_t(n)]) * (got[n] - r[size_t(n)]), s += r[size_t(n)] * r[size_t(n)];
      return std::sqrt(e / s);
    };
    std::vector<double> exact, rounded;
    npusim::Engine engine(d, 2);
    npusim::register_kernel_set(engine);
    // GEMV: the mapping's default tiles for the block type, checked and run.
    const npusim::GemvShape s{N, K, false, et};
    const npusim::Launch gv = npusim::gemv_launch(s, npusim::default_gemv_tiles(s, d), d);
    ASSERT_TRUE(npusim::check(gv, d).empty()) << npusim::describe(npusim::check(gv, d));
    for (const npusim::ObjectFifo& f : gv.fifos)
      if (f.tensor == "W") {
        EXPECT_EQ(f.type, et);
        EXPECT_EQ(f.object_bytes() % dtype_block_bytes(dt), 0);
      }
    std::vector<float> y(size_t(N), -1.0f);
    engine.run(gv, {{"W", npusim::DdrTensor::blocks(et, blocks.data(), nel)},
                    {"X", npusim::DdrTensor::bf16(xb.data(), K)},
                    {"Y", npusim::DdrTensor::f32(y.data(), N)}});
    ref(0, false, exact);
    ref(0, true, rounded);
    const double e_exact = rel_err(y.data(), exact), e_bf16 = rel_err(y.data(), rounded);
    EXPECT_LT(e_exact, 1e-6);
    EXPECT_GT(e_bf16, 20 * e_exact);  // a bf16 copy of the weights would be this far off
    // GEMM: M rows against B = the blocks as [N, K].
    const npusim::GemmPlan p = npusim::default_gemm_plan(M, K, N, d, npusim::ElemType::F32, et);
    npusim::GemmOptions go;
    go.c_type = npusim::ElemType::F32;
    go.b_nk = true;
    go.b_type = et;
    const npusim::Launch gm = npusim::gemm_launch(p.shape, p.tiles, p.herd, d, go);
    ASSERT_TRUE(npusim::check(gm, d).empty()) << npusim::describe(npusim::check(gm, d));
    std::vector<uint16_t> a(size_t(p.shape.M * K), 0);
    std::copy(xb.begin(), xb.end(), a.begin());
    std::vector<float> c(size_t(p.shape.M * N), -1.0f);
    engine.run(gm, {{"A", npusim::DdrTensor::bf16(a.data(), int64_t(a.size()))},
                    {"B", npusim::DdrTensor::blocks(et, blocks.data(), nel)},
                    {"C", npusim::DdrTensor::f32(c.data(), int64_t(c.size()))}});
    for (int64_t r = 0; r < M; ++r) {
      ref(r, false, exact);
      ref(r, true, rounded);
      EXPECT_LT(rel_err(c.data() + r * N, exact), 1e-6) << "row " << r;
      EXPECT_GT(rel_err(c.data() + r * N, rounded), 20 * rel_err(c.data() + r * N, exact)) << "row " << r;
    }
  }
}

// The timing model's decode step of full-size Llama-3.2-1B with every matrix in Q4_0 blocks:
// its weight fifos move exactly the blocks' bytes (18 per 32 weights, counted here from the
// config, not from the code), the bf16 program 2 per weight, and the whole step reads fewer
// DDR bytes and is predicted faster. Dry: no weights needed.
TEST(NpusimQuant, Q4DecodeReadsTheBlocksBytes) {
  const ModelSpec s = find_preset("Llama-3.2-1B").full;
  const npusim::Device& d = xdna2();
  const int64_t H = s.hidden, I = s.intermediate, Q = s.n_heads * s.head_dim, KV = s.n_kv_heads * s.head_dim;
  const int64_t weights = s.n_layers * (Q * H + 2 * KV * H + H * Q + 3 * I * H) + s.vocab * H;
  npusim::WeightFormats q4;
  for (const char* b : {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"})
    q4.by_buffer[b] = npusim::ElemType::Q4_0;
  for (const char* plan : {"baseline", "merged"}) {
    SCOPED_TRACE(plan);
    const npusim::NpuPlan np = npusim::named_plan(plan);
    auto weight_bytes = [&](const npusim::WeightFormats& f) {
      const npusim::Program p = npusim::lower(np, s, d, {true, 1, 512, 1}, {}, f);
      int64_t bytes = 0;
      for (const npusim::ProgramDispatch& pd : p.dispatches)
        for (const npusim::ProgramStep& st : pd.steps)
          for (const npusim::LaunchCall& c : st.launches)
            for (const npusim::ObjectFifo& fi : c.launch.fifos)
              if (fi.tensor == "W") bytes += pd.count * fi.stream_elements() * npusim::elem_bytes(fi.type);
      return bytes;
    };
    EXPECT_EQ(weight_bytes(q4), weights / 32 * 18);
    EXPECT_EQ(weight_bytes({}), weights * 2);
    const npusim::PassPrediction pq = npusim::predict_decode(np, s, d, 512, q4);
    const npusim::PassPrediction pb = npusim::predict_decode(np, s, d, 512);
    EXPECT_LT(pq.ddr_bytes, pb.ddr_bytes);
    EXPECT_GE(pb.ddr_bytes - pq.ddr_bytes, (weights * 2 - weights / 32 * 18) * 9 / 10);  // mostly the weights' saving
    EXPECT_LT(pq.total_us, pb.total_us);
  }
}

// The same decode step with the K-quants: every matrix in Q4_K, Q5_K or Q6_K super-blocks moves
// 144, 176 or 210 bytes per 256 weights; and the Q4_K_M file's formats (q/k/o/gate/up Q4_K,
// the tied head Q6_K, v/down bf16: their layers mix Q4_K and Q6_K) move the sum of each
// buffer's own bytes, all counted from the config and the block sizes.
TEST(NpusimQuant, KQuantDecodeReadsTheSuperBlocksBytes) {
  const ModelSpec s = find_preset("Llama-3.2-1B").full;
  const npusim::Device& d = xdna2();
  const int64_t H = s.hidden, I = s.intermediate, Q = s.n_heads * s.head_dim, KV = s.n_kv_heads * s.head_dim,
                L = s.n_layers, V = s.vocab;
  const int64_t weights = L * (Q * H + 2 * KV * H + H * Q + 3 * I * H) + V * H;
  const npusim::NpuPlan np = npusim::named_plan("merged");
  auto weight_bytes = [&](const npusim::WeightFormats& f) {
    const npusim::Program p = npusim::lower(np, s, d, {true, 1, 512, 1}, {}, f);
    int64_t bytes = 0;
    for (const npusim::ProgramDispatch& pd : p.dispatches)
      for (const npusim::ProgramStep& st : pd.steps)
        for (const npusim::LaunchCall& c : st.launches)
          for (const npusim::ObjectFifo& fi : c.launch.fifos)
            if (fi.tensor == "W") bytes += pd.count * fi.stream_elements() * npusim::elem_bytes(fi.type);
    return bytes;
  };
  const char* buffers[] = {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"};
  for (const auto& [t, per256] : {std::pair{npusim::ElemType::Q4_K, int64_t(144)}, std::pair{npusim::ElemType::Q5_K, int64_t(176)},
                                  std::pair{npusim::ElemType::Q6_K, int64_t(210)}}) {
    SCOPED_TRACE(npusim::elem_type_name(t));
    npusim::WeightFormats f;
    for (const char* b : buffers) f.by_buffer[b] = t;
    EXPECT_EQ(weight_bytes(f), weights / 256 * per256);
  }
  npusim::WeightFormats km;
  for (const char* b : {"w.q", "w.k", "w.o", "w.gate", "w.up"}) km.by_buffer[b] = npusim::ElemType::Q4_K;
  km.by_buffer["w.lm_head"] = npusim::ElemType::Q6_K;
  const int64_t q4k = L * (Q * H + KV * H + H * Q + 2 * I * H), bf16 = L * (KV * H + H * I), q6k = V * H;
  EXPECT_EQ(weight_bytes(km), q4k / 256 * 144 + bf16 * 2 + q6k / 256 * 210);
  const npusim::PassPrediction pk = npusim::predict_decode(np, s, d, 512, km);
  const npusim::PassPrediction pb = npusim::predict_decode(np, s, d, 512);
  EXPECT_LT(pk.total_us, pb.total_us);
  EXPECT_GE(pb.ddr_bytes - pk.ddr_bytes, (weights * 2 - weight_bytes(km)) * 9 / 10);
}

// A worker's L1 holds the blocks it streams, scales included: this GEMV tile (one worker, 64
// rows x a 480-weight K chunk of Q8_0, double-buffered) would fit the 64 KiB if only the int8
// values counted (2 x 64 x 480 = 61440 B of W, 64896 B in all), but its 15 blocks per row at 34 B
// (2 of them the f16 scale) make 65280 B of W and 68736 B in all: refused.
TEST(NpusimQuant, CheckerCountsTheScalesInL1) {
  const npusim::Device& d = xdna2();
  const npusim::GemvShape s{64, 960, false, npusim::ElemType::Q8_0};
  const npusim::Launch l = npusim::gemv_launch(s, {64, 480, {1, 1}}, d);
  const int64_t w = 2 * 64 * 15 * 34, x = 2 * 480 * 2, y = 2 * 64 * 4, stack = 1024;
  ASSERT_LE(2 * 64 * 480 + x + y + stack, d.l1_bytes);
  const auto r = npusim::check(l, d);
  ASSERT_EQ(r.size(), 1u) << npusim::describe(r);
  EXPECT_EQ(r[0].code, "l1-overflow");
  EXPECT_EQ(r[0].needed, w + x + y + stack);
  // The default tiles for the same shape fit.
  EXPECT_TRUE(npusim::check(npusim::gemv_launch(s, npusim::default_gemv_tiles(s, d), d), d).empty());
}

// The same for a K-quant: one Q4_K GEMV worker of 11 rows x a 4096-weight K chunk (16
// super-blocks), double-buffered, would fit if only the nibbles counted (2 x 11 x 16 x 128 =
// 45056 B of W, 62552 B in all) but its super-blocks carry d, dmin and the 12 bytes of 6-bit
// sub-block scales and mins (144 B each): 50688 B of W, 68184 B in all, refused.
TEST(NpusimQuant, CheckerCountsTheSubBlockScalesAndMinsInL1) {
  const npusim::Device& d = xdna2();
  const npusim::GemvShape s{11, 8192, false, npusim::ElemType::Q4_K};
  const npusim::Launch l = npusim::gemv_launch(s, {11, 4096, {1, 1}}, d);
  const int64_t w = 2 * 11 * 16 * 144, x = 2 * 4096 * 2, y = 2 * 11 * 4, stack = 1024;
  ASSERT_LE(2 * 11 * 16 * 128 + x + y + stack, d.l1_bytes);
  const auto r = npusim::check(l, d);
  ASSERT_EQ(r.size(), 1u) << npusim::describe(r);
  EXPECT_EQ(r[0].code, "l1-overflow");
  EXPECT_EQ(r[0].needed, w + x + y + stack);
  EXPECT_TRUE(npusim::check(npusim::gemv_launch(s, npusim::default_gemv_tiles(s, d), d), d).empty());
}

// Tiny presets quantized to Q4_0 and Q8_0 deploy on npusim through phases 0-6 with every
// projection in blocks (plan.json says so) and every gate passing. A representative pair in the
// default suite (GQA Llama with a tied head; Qwen3's q/k norm and decoupled head_dim);
// scripts/npusim_quant_presets.sh deploys every preset at both.
class NpusimQuantDeploy : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// The formats plan.json lists for a scheme: every buffer in the scheme's blocks, but q4_k_m
// (tiny Llama-3.2-1B: q/k/o/gate/up Q4_K, the tied head Q6_K; v and down mix Q4_K and Q6_K
// over the layers, so bf16, not listed).
std::map<std::string, std::string> expected_formats(const std::string& scheme) {
  std::map<std::string, std::string> f;
  if (scheme == "q4_k_m") {
    for (const char* b : {"w.q", "w.k", "w.o", "w.gate", "w.up"}) f[b] = "q4_k";
    f["w.lm_head"] = "q6_k";
    return f;
  }
  for (const char* b : {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"}) f[b] = scheme;
  return f;
}

TEST_P(NpusimQuantDeploy, PhasesZeroToSixPass) {
  const auto& [preset, scheme] = GetParam();
  ScratchDir out("npusim_quant_deploy");
  DeployOptions o = testing_support::deploy_options(quantized_tiny(preset, scheme), out.str("dep"));
  o.target = "npusim";
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const nlohmann::json plan = read_json_file(out.path() / "dep" / "plan.json");
  const std::map<std::string, std::string> want = expected_formats(scheme);
  EXPECT_EQ(plan["npusim"]["weight_formats"].size(), want.size()) << plan["npusim"]["weight_formats"].dump();
  for (const auto& [b, t] : want) EXPECT_EQ(plan["npusim"]["weight_formats"].value(b, ""), t) << b;
  EXPECT_EQ(plan["weights"]["bf16_converted_bytes"].get<int64_t>() > 0, true);  // the embedding's bf16 rows
  if (scheme == "q4_k_m")  // why v and down are bf16
    EXPECT_NE(plan["weights"]["held"]["w.down"].get<std::string>().find("Q4_K, Q6_K"), std::string::npos)
        << plan["weights"]["held"].dump();
}

std::vector<std::pair<std::string, std::string>> quant_deploys() {
#ifdef TESSERA_SANITIZED
  return {{"Llama-3.2-1B", "q4_0"}};  // several times slower under ASan/UBSan: one here, all in Release
#else
  return {{"Llama-3.2-1B", "q4_0"}, {"Qwen3-0.6B", "q8_0"}, {"Llama-3.2-1B", "q4_k_m"}};
#endif
}

INSTANTIATE_TEST_SUITE_P(Presets, NpusimQuantDeploy, ::testing::ValuesIn(quant_deploys()),
                         [](const auto& info) {
                           std::string n = info.param.first + "_" + info.param.second;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessera
