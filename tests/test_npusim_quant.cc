// npusim W4A16 / W8A16: quantized weights move through the DMA as the file's GGML blocks and
// are unpacked on the compute tile. The tile's weights are the oracle's bit for bit; the
// GEMV and GEMM compute with them exactly (no bf16 rounding of a weight); the timing model's
// decode reads the blocks' bytes; and tiny presets quantized to Q4_0 and Q8_0 deploy through
// phases 0-6 (a representative pair here; scripts/npusim_quant_presets.sh runs all eleven).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "io/gguf_quantize.h"
#include "io/quant_plan.h"
#include "io/quantize.h"
#include "io/weights.h"
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
  for (const char* scheme : {"q4_0", "q8_0"}) {
    SCOPED_TRACE(scheme);
    const Model m = Model::open(quantized_tiny("Llama-3.2-1B", scheme));
    TargetOptions o;
    o.threads = 2;
    NpuSimRunner npu(m, o);
    const npusim::ElemType want = std::string(scheme) == "q4_0" ? npusim::ElemType::Q4_0 : npusim::ElemType::Q8_0;
    for (const char* b : {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"})
      EXPECT_EQ(npu.weight_formats().of(b), want) << b;
    int64_t checked = 0, permuted = 0;
    std::vector<float> ref;
    for (const auto& [name, w] : m.weights()) {
      if (!npu.weights().in_blocks(name)) continue;
      const npusim::BlockMatrix& bm = npu.weights().blocks(name);
      ASSERT_EQ(bm.rows, w.rows());
      ASSERT_EQ(bm.cols, w.cols());
      permuted += w.unpermute_head_dim > 0;
      ref.resize(size_t(w.cols()));
      const int64_t per_row = bm.cols / 32;
      for (int64_t r = 0; r < bm.rows; ++r) {
        w.row_f32(r, ref.data());
        for (int64_t b = 0; b < per_row; ++b) {
          const npusim::BlockTerms t = npusim::unpack_block(bm.type, bm.data + (r * per_row + b) * npusim::elem_bytes(bm.type));
          for (int i = 0; i < 32; ++i) {
            const float v = float(t.v[i]);
            ASSERT_EQ(bf16_to_f32(f32_to_bf16(v)), v);
            const float got = t.scale * v;
            const float want_w = ref[size_t(b * 32 + i)];
            ASSERT_EQ(std::memcmp(&got, &want_w, 4), 0)
                << name << " row " << r << " value " << b * 32 + i << ": " << got << " vs " << want_w;
            ++checked;
          }
        }
      }
    }
    EXPECT_GT(permuted, 0);  // the GGUF's q and k (stored permuted) were among them
    int64_t matrix_values = 0;  // every matrix of the model: 7 per layer and the (tied) head
    for (const auto& [name, w] : m.weights())
      if (w.info.shape.size() == 2) matrix_values += w.rows() * w.cols();
    EXPECT_EQ(checked, matrix_values);
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
  for (const auto& [dt, et] : {std::pair{DType::Q4_0, npusim::ElemType::Q4_0}, std::pair{DType::Q8_0, npusim::ElemType::Q8_0}}) {
    SCOPED_TRACE(npusim::elem_type_name(et));
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
        EXPECT_EQ(f.object_bytes() % (et == npusim::ElemType::Q4_0 ? 18 : 34), 0);
      }
    std::vector<float> y(size_t(N), -1.0f);
    engine.run(gv, {{"W", npusim::DdrTensor::blocks(et, blocks.data(), N * K / 32)},
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
                    {"B", npusim::DdrTensor::blocks(et, blocks.data(), N * K / 32)},
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

// Tiny presets quantized to Q4_0 and Q8_0 deploy on npusim through phases 0-6 with every
// projection in blocks (plan.json says so) and every gate passing. A representative pair in the
// default suite (GQA Llama with a tied head; Qwen3's q/k norm and decoupled head_dim);
// scripts/npusim_quant_presets.sh deploys every preset at both.
class NpusimQuantDeploy : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(NpusimQuantDeploy, PhasesZeroToSixPass) {
  const auto& [preset, scheme] = GetParam();
  ScratchDir out("npusim_quant_deploy");
  DeployOptions o = testing_support::deploy_options(quantized_tiny(preset, scheme), out.str("dep"));
  o.target = "npusim";
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const nlohmann::json plan = read_json_file(out.path() / "dep" / "plan.json");
  for (const char* b : {"w.q", "w.k", "w.v", "w.o", "w.gate", "w.up", "w.down", "w.lm_head"})
    EXPECT_EQ(plan["npusim"]["weight_formats"].value(b, ""), scheme) << b;
  EXPECT_EQ(plan["weights"]["bf16_converted_bytes"].get<int64_t>() > 0, true);  // the embedding's bf16 rows
}

std::vector<std::pair<std::string, std::string>> quant_deploys() {
#ifdef TESSERA_SANITIZED
  return {{"Llama-3.2-1B", "q4_0"}};  // several times slower under ASan/UBSan: one here, both in Release
#else
  return {{"Llama-3.2-1B", "q4_0"}, {"Qwen3-0.6B", "q8_0"}};
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
