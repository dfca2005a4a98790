// `tessera quantize` and the quantizers under it, against independent references:
// - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 byte for byte against the gguf package's quantize;
// - Q2_K..Q6_K (and the five above) byte for byte against llama.cpp's llama-quantize;
// - the q4_k_m / q5_k_m per-tensor types of the default model's architecture against
//   the types llama-quantize chose for the default model;
// all in tests/fixtures/quantize/, made by tools/reference/quantize_fixtures.py (the
// inputs are 256-value rows: slices of the default model's weights and synthetic rows
// with outliers, zero blocks, negative extremes, constant blocks and exact ties).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "convert/gguf_quantize.h"
#include "io/quant_plan.h"
#include "io/quantize.h"
#include "model/weights.h"
#include "model/presets.h"
#include "synth/synth.h"
#include "test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing_support::run_tessera;
using testing_support::ScratchDir;

constexpr int64_t kRow = 256;

std::string fixture(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/quantize/" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ADD_FAILURE() << "missing fixture " << path << " (tools/reference/quantize_fixtures.py)";
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
std::vector<T> read_array(const std::string& path) {
  const std::vector<uint8_t> b = read_bytes(path);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

std::vector<float> fixture_rows() {
  std::vector<float> rows = read_array<float>(fixture("rows.f32"));
  EXPECT_EQ(rows.size() % kRow, 0u);
  return rows;
}

std::vector<uint8_t> quantize_rows(DType t, const std::vector<float>& rows) {
  const int64_t n = int64_t(rows.size());
  std::vector<uint8_t> out(dtype_bytes(t, n));
  // Row by row, as tessera quantize does (each row on its own).
  const uint64_t row_bytes = dtype_bytes(t, kRow);
  for (int64_t r = 0; r < n / kRow; ++r) quantize_f32(t, rows.data() + r * kRow, out.data() + r * row_bytes, kRow);
  return out;
}

// Compares block by block; returns the number of blocks that differ and says which.
int64_t differing_blocks(DType t, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                         const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const int64_t bytes = dtype_block_bytes(t), per_row = kRow / dtype_block_values(t);
  int64_t bad = 0;
  for (size_t b = 0; b * size_t(bytes) < std::min(got.size(), want.size()); ++b) {
    if (std::memcmp(got.data() + b * bytes, want.data() + b * bytes, size_t(bytes)) == 0) continue;
    if (++bad <= 4) {
      std::string diff;
      for (int64_t k = 0; k < bytes; ++k)
        if (got[b * bytes + k] != want[b * bytes + k])
          diff += fmt::format(" [{}] {:02x}/{:02x}", k, got[b * bytes + k], want[b * bytes + k]);
      ADD_FAILURE() << what << " " << dtype_name(t) << ": row " << b / per_row << " block " << b % per_row
                    << " differs (byte: tessera/reference):" << diff;
    }
  }
  return bad;
}

TEST(Quantize, F16RoundingMatchesNumpy) {
  const auto x = read_array<float>(fixture("f16.f32"));
  const auto h = read_array<uint16_t>(fixture("f16.u16"));
  ASSERT_EQ(x.size(), h.size());
  ASSERT_GT(x.size(), 100u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(f32_to_f16(x[i]), h[i]) << i << ": " << x[i];
}

// Byte identity with gguf.quants.quantize on every row (real and synthetic).
TEST(Quantize, SimpleTypesMatchGgufPackage) {
  const std::vector<float> rows = fixture_rows();
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    const auto want = read_bytes(fixture(std::string(dtype_name(t)) + ".gguf-py"));
    EXPECT_EQ(differing_blocks(t, quantize_rows(t, rows), want, "gguf-py"), 0) << dtype_name(t);
  }
}

// Byte identity with llama.cpp's reference quantizers (llama-quantize --pure, no imatrix).
// Every block is identical (both are plain fp32 arithmetic in the same order): the test
// holds them to exact equality.
TEST(Quantize, AllTypesMatchLlamaCpp) {
  const std::vector<float> rows = fixture_rows();
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const auto want = read_bytes(fixture(std::string(dtype_name(t)) + ".llama-cpp"));
    EXPECT_EQ(differing_blocks(t, quantize_rows(t, rows), want, "llama.cpp"), 0) << dtype_name(t);
  }
}

// What the bytes mean: dequantized by tessera's reader (bit-exact with gguf-py's), each type
// stays within its resolution of the input (relative RMS error per row, a sanity bound: a
// layout mistake gives errors of order 1), and a split of a row into whole blocks does not
// change the bytes. The "tiny" row (values of sd 1e-6) is left out of the bound: its f16
// scales underflow and every quantizer, llama.cpp's and the gguf package's included,
// returns junk for it (the byte tests above cover it).
TEST(Quantize, RoundTripErrorWithinResolution) {
  const std::vector<float> rows = fixture_rows();
  const int64_t n = int64_t(rows.size());
  const std::map<DType, double> bound = {{DType::Q8_0, 0.02}, {DType::Q6_K, 0.04}, {DType::Q5_0, 0.10},
                                         {DType::Q5_1, 0.10}, {DType::Q5_K, 0.10}, {DType::Q4_0, 0.20},
                                         {DType::Q4_1, 0.20}, {DType::Q4_K, 0.20}, {DType::Q3_K, 0.30},
                                         {DType::Q2_K, 0.45}, {DType::F16, 1e-3}, {DType::BF16, 1e-2}};
  std::ifstream manifest_in(fixture("manifest.json"));
  ASSERT_TRUE(manifest_in);
  const auto rows_desc = nlohmann::json::parse(manifest_in)["rows"];
  ASSERT_EQ(int64_t(rows_desc.size()) * kRow, n);
  for (const auto& [t, limit] : bound) {
    const std::vector<uint8_t> q = quantize_rows(t, rows);
    std::vector<float> back(rows.size());
    to_f32(t, q.data(), back.data(), n);
    for (int64_t r = 0; r < n / kRow; ++r) {
      if (rows_desc[size_t(r)].get<std::string>().find("tiny") != std::string::npos) continue;
      double err2 = 0, ref2 = 0;
      for (int64_t i = r * kRow; i < (r + 1) * kRow; ++i) {
        err2 += (double(back[i]) - rows[i]) * (double(back[i]) - rows[i]);
        ref2 += double(rows[i]) * rows[i];
      }
      if (ref2 == 0) {
        EXPECT_EQ(err2, 0) << dtype_name(t) << " row " << r;  // zeros stay zeros
        continue;
      }
      EXPECT_LT(std::sqrt(err2 / ref2), limit) << dtype_name(t) << " row " << r;
    }
    // One call over all rows (blocks are independent) gives the same bytes.
    std::vector<uint8_t> whole(q.size());
    quantize_f32(t, rows.data(), whole.data(), n);
    EXPECT_EQ(whole, q) << dtype_name(t);
  }
  EXPECT_THROW(quantize_f32(DType::Q4_K, rows.data(), nullptr, 32), Error);
  EXPECT_THROW(quantize_f32(DType::IQ4_NL, rows.data(), nullptr, 32), Error);
}

// The per-tensor types of q4_k_m and q5_k_m for the default model's architecture
// (SmolLM2-135M: 30 layers, rows of 576 and 1536), against what llama-quantize chose when it
// quantized the default model (converted to BF16 by tessera convert).
void expect_plan_matches_llama_cpp(const std::string& scheme) {
  std::ifstream in(fixture(scheme + ".types.json"));
  ASSERT_TRUE(in) << "missing fixture " << scheme << ".types.json";
  const nlohmann::json want = nlohmann::json::parse(in);
  const QuantScheme* s = find_quant_scheme(scheme);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(want["file_type"].get<uint32_t>(), s->file_type);
  const auto plan = plan_quantized_export(find_preset("SmolLM2-135M").full, *s);
  ASSERT_EQ(plan.size(), want["tensors"].size());
  std::map<std::string, int> mix;
  for (const QuantizedTensor& q : plan) {
    ASSERT_TRUE(want["tensors"].contains(q.tensor.gguf_name)) << q.tensor.gguf_name;
    EXPECT_EQ(dtype_name(q.choice.type), want["tensors"][q.tensor.gguf_name].get<std::string>())
        << scheme << " " << q.tensor.gguf_name << " (" << q.choice.note << ")";
    mix[dtype_name(q.choice.type)]++;
  }
  std::string summary;
  for (const auto& [t, c] : mix) summary += fmt::format("{} {} ", c, t);
  ::testing::Test::RecordProperty(scheme + "_types", summary);
}

TEST(Quantize, Q4KMRecipeMatchesLlamaCpp) { expect_plan_matches_llama_cpp("q4_k_m"); }
TEST(Quantize, Q5KMRecipeMatchesLlamaCpp) { expect_plan_matches_llama_cpp("q5_k_m"); }

// The recipe's rules on shapes the default model does not have: rows of 256 (no fallback),
// an untied output, and rows that split into neither 256s nor 32s.
TEST(Quantize, RecipeRulesAndFallbacks) {
  const QuantScheme& q4km = *find_quant_scheme("Q4_K_M");  // case-insensitive
  std::vector<PlanTensor> t = {
      {"token_embd.weight", {1000, 256}, DType::BF16},   {"output.weight", {1000, 256}, DType::BF16},
      {"output_norm.weight", {256}, DType::F32},         {"blk.0.attn_v.weight", {64, 256}, DType::BF16},
      {"blk.0.ffn_down.weight", {256, 512}, DType::BF16}, {"blk.0.attn_q.weight", {256, 80}, DType::BF16},
      {"blk.0.attn_k.weight", {64, 96}, DType::BF16},
  };
  // 16 layers: use_more_bits is true for 0, 1, 14, 15 and 4, 7, 10, 13.
  for (int l = 1; l < 16; ++l) {
    t.push_back({fmt::format("blk.{}.attn_v.weight", l), {64, 256}, DType::BF16});
    t.push_back({fmt::format("blk.{}.ffn_down.weight", l), {256, 512}, DType::BF16});
  }
  const auto c = plan_quant_types(q4km, t, 16);
  EXPECT_EQ(c[0].type, DType::Q4_K);  // untied embedding: the base type
  EXPECT_EQ(c[1].type, DType::Q6_K);  // output projection
  EXPECT_EQ(c[2].type, DType::F32);
  EXPECT_FALSE(c[2].quantized);
  EXPECT_EQ(c[3].type, DType::Q6_K);  // layer 0: more bits
  EXPECT_EQ(c[4].type, DType::Q6_K);
  EXPECT_EQ(c[5].type, DType::F16);   // 80: neither 256s nor 32s
  EXPECT_EQ(c[6].type, DType::Q5_0);  // 96: Q4_K -> Q5_0
  for (int l = 1; l < 16; ++l) {
    const bool more = l < 2 || l >= 14 || (l - 2) % 3 == 2;
    const DType want = more ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(c[size_t(7 + 2 * (l - 1))].type, want) << "attn_v " << l;
    EXPECT_EQ(c[size_t(8 + 2 * (l - 1))].type, want) << "ffn_down " << l;
  }
  // A single type applies everywhere, falling back per row length.
  const auto pure = plan_quant_types(*find_quant_scheme("q6_k"), t, 16);
  EXPECT_EQ(pure[0].type, DType::Q6_K);
  EXPECT_EQ(pure[6].type, DType::Q8_0);
  EXPECT_EQ(plan_quant_types(*find_quant_scheme("q3_k"), t, 16)[6].type, DType::Q4_0);
  EXPECT_EQ(plan_quant_types(*find_quant_scheme("q5_k"), t, 16)[6].type, DType::Q5_1);
  EXPECT_EQ(plan_quant_types(*find_quant_scheme("q8_0"), t, 16)[5].type, DType::F16);
  EXPECT_EQ(find_quant_scheme("q4_k_s"), nullptr);
}

// A tiny Llama (rows of 256 and 768: K-quants apply) quantized by the CLI: loads in tessera
// with the planned types, the file type recorded, values within each type's resolution of the
// source, no temporary file left.
TEST(Quantize, CliQuantizesTinyModel) {
  ScratchDir dir("quantize_tiny");
  SynthOptions o;
  o.preset = "Llama-3.2-1B";
  o.out_dir = dir.str("hf");
  o.tiny = true;
  o.seed = 3;
  o.tokenizers_dir = testing_support::tokenizers_dir();
  synth(o);
  const Model src = Model::open(o.out_dir);
  for (const char* scheme : {"q8_0", "q4_k_m"}) {
    const std::string out = dir.str(std::string(scheme) + ".gguf");
    const auto r = run_tessera(fmt::format("quantize {} --to {} --out {} --threads 2", o.out_dir, scheme, out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("quantize: [ 1/21] token_embd.weight"), std::string::npos) << r.err;
    const Model m = Model::open(out);
    const QuantScheme& s = *find_quant_scheme(scheme);
    EXPECT_EQ(m.gguf()->get("general.file_type").as_int(), s.file_type);
    const auto plan = plan_quantized_export(src.spec(), s);
    for (const QuantizedTensor& q : plan) {
      if (q.tensor.canonical.empty()) continue;
      const Weight& w = m.get(q.tensor.canonical);
      EXPECT_EQ(w.info.dtype, q.choice.type) << scheme << " " << q.tensor.gguf_name;
      // Row 1 of each tensor (Hugging Face layout on both sides) within the type's resolution.
      const Weight& a = src.get(q.tensor.canonical);
      const int64_t row = a.rows() > 1 ? 1 : 0;
      std::vector<float> x(size_t(a.cols())), y(size_t(a.cols()));
      if (a.info.shape.size() == 1) {
        x = a.to_f32();
        y = w.to_f32();
      } else {
        a.row_f32(row, x.data());
        w.row_f32(row, y.data());
      }
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err2 += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
        ref2 += double(x[i]) * x[i];
      }
      EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-30)), q.choice.quantized ? 0.1 : 0.0) << q.tensor.gguf_name;
    }
    for (const auto& e : fs::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().string().find(".part"), std::string::npos) << e.path();
  }
  const Model q4 = Model::open(dir.str("q4_k_m.gguf"));
  EXPECT_EQ(q4.get("model.embed_tokens.weight").info.dtype, DType::Q6_K);  // tied: the output's type
  EXPECT_EQ(q4.get("model.layers.0.mlp.down_proj.weight").info.dtype, DType::Q4_K);
  EXPECT_EQ(q4.get("model.layers.1.mlp.down_proj.weight").info.dtype, DType::Q6_K);  // last eighth
  // inspect names each role's types and, where the layers differ, which layers have which.
  const auto ins = run_tessera("inspect " + dir.str("q4_k_m.gguf"));
  ASSERT_EQ(ins.exit_code, 0) << ins.err;
  EXPECT_NE(ins.out.find("model.layers.N.mlp.down_proj.weight"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("Q4_K (layers 0); Q6_K (layers 1)"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("model.embed_tokens.weight"), std::string::npos) << ins.out;

  // Requantizing is refused, naming the tensor and its type.
  const auto again = run_tessera("quantize " + dir.str("q8_0.gguf") + " --to q4_0 --out " + dir.str("x.gguf"));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already quantized (Q8_0)"), std::string::npos) << again.err;
  EXPECT_EQ(again.err.find('\n'), again.err.size() - 1) << again.err;
  EXPECT_FALSE(fs::exists(dir.str("x.gguf")));

  // An output that cannot be written: refused before any work, naming the path given.
  for (const std::string& bad : {dir.str("no/such/dir/x.gguf"), dir.str()}) {
    const auto r = run_tessera("quantize " + o.out_dir + " --to q8_0 --out " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("quantize: ["), std::string::npos) << "work began: " << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
}

// Bad command lines: one line naming the problem, exit 1.
TEST(Quantize, CliErrors) {
  struct Case {
    std::string args, needle;
  };
  const Case cases[] = {
      {"quantize /nonexistent --to q7 --out /tmp/x.gguf",
       "unknown type 'q7' (accepted: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)"},
      {"quantize /nonexistent --out /tmp/x.gguf", "needs --to TYPE"},
      {"quantize /nonexistent --to q8_0", "needs --out"},
      {"quantize --to q8_0 --out /tmp/x.gguf", "needs MODEL"},
      {"quantize /nonexistent --to q8_0 --out /tmp/x.gguf", "/nonexistent: no such file or directory"},
      {"quantize /nonexistent --to q8_0 --out /tmp/x.gguf --threads -2", "--threads must be positive"},
  };
  for (const Case& c : cases) {
    const auto r = run_tessera(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  }
}

}  // namespace
}  // namespace tessera
