// `tessera convert --to gguf --dtype bf16`: tiny synth checkpoints written as llama.cpp GGUFs
// and read back by tessera give the same logits; the q/k permutation is exact both ways.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/gguf.h"
#include "convert/gguf_export.h"
#include "model/weights.h"
#include "oracle/oracle.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"
#include "test_support.h"
#include "util/half.h"

namespace tessera {
namespace {

using testing_support::run_tessera;
using testing_support::ScratchDir;
namespace fs = std::filesystem;

using testing_support::tokenizers_dir;

// A tiny synth checkpoint of `preset` in dir/hf.
std::string synth_tiny(const ScratchDir& dir, const std::string& preset) {
  SynthOptions o;
  o.preset = preset;
  o.out_dir = dir.str("hf");
  o.tiny = true;
  o.seed = 7;
  o.tokenizers_dir = tokenizers_dir();
  synth(o);
  return o.out_dir;
}

// Largest |a - b| relative to the range of a.
double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, lo = a.at(0), hi = a.at(0);
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    lo = std::min(lo, double(a[i]));
    hi = std::max(hi, double(a[i]));
  }
  return diff / std::max(hi - lo, 1e-30);
}

std::vector<float> logits(const Model& m, const std::vector<int32_t>& ids) {
  Oracle o(m, 2);
  return o.forward(ids);
}

const GgufValue& meta(const GgufFile& g, const std::string& k) { return g.get(k); }

void round_trip(const std::string& preset, const std::string& arch, const std::string& pre) {
  ScratchDir dir("convert_" + arch);
  const std::string hf = synth_tiny(dir, preset);
  const std::string out = dir.str("model.bf16.gguf");
  const auto r = run_tessera("convert " + hf + " --to gguf --dtype bf16 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const Model src = Model::open(hf);
  const Model dst = Model::open(out);
  const GgufFile& g = *dst.gguf();
  EXPECT_EQ(meta(g, "general.architecture").as_string(), arch);
  EXPECT_EQ(meta(g, "general.file_type").as_int(), 32);
  EXPECT_EQ(meta(g, "tokenizer.ggml.model").as_string(), "gpt2");
  EXPECT_EQ(meta(g, "tokenizer.ggml.pre").as_string(), pre);
  EXPECT_EQ(int64_t(meta(g, "tokenizer.ggml.tokens").strings.size()), src.spec().vocab);
  EXPECT_EQ(meta(g, arch + ".block_count").as_int(), src.spec().n_layers);
  EXPECT_EQ(g.has("output.weight"), !src.spec().tie_embeddings);

  // Same spec as tessera reads it (rope scaling travels as per-frequency factors).
  const ModelSpec& a = src.spec();
  const ModelSpec& b = dst.spec();
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_FLOAT_EQ(float(a.rms_eps), float(b.rms_eps));

  // Every weight reads back bit-identical in Hugging Face layout (the source is BF16).
  std::vector<float> ra, rb;
  for (const auto& [name, w] : src.weights()) {
    const Weight& v = dst.get(name);
    ASSERT_EQ(w.info.shape, v.info.shape) << name;
    EXPECT_EQ(w.to_f32(), v.to_f32()) << name;
  }

  // The tokenizer rebuilt from tokenizer.ggml.* encodes as tokenizer.json does, and
  // generation prompts get the same BOS rule.
  const Tokenizer ta = Tokenizer::for_model(src), tb = Tokenizer::for_model(dst);
  for (const char* text : {"Hello world, 12345 tokens!", "<|im_start|>user\n\u00e9t\u00e9 \U0001F680<|im_end|>"}) {
    EXPECT_EQ(ta.encode_raw(text), tb.encode_raw(text)) << text;
    EXPECT_EQ(ta.encode_prompt(text), tb.encode_prompt(text)) << text;
  }
  EXPECT_EQ(tb.vocab_size(), src.spec().vocab);  // padded with [PAD<id>] as llama.cpp's converter does
  EXPECT_EQ(ta.bos_id(), tb.bos_id());
  EXPECT_EQ(ta.eos_ids(), tb.eos_ids());
  EXPECT_EQ(ta.chat_template(), tb.chat_template());

  const std::vector<int32_t> ids = {1, 17, 300, 4242, 99, 5, 1000, 2};
  const double d = rel_max_diff(logits(src, ids), logits(dst, ids));
  // BF16 weights carry over exactly; only llama3 scaling's factors (a division instead of
  // a blend) may move an angle by an ulp.
  EXPECT_LT(d, 1e-6) << preset;
  ::testing::Test::RecordProperty("logits_rel_max_diff", fmt::format("{:.3g}", d));
}

TEST(Convert, LlamaTinyRoundTripLogits) { round_trip("Llama-3.2-1B", "llama", "llama-bpe"); }
TEST(Convert, Qwen3TinyRoundTripLogits) { round_trip("Qwen3-0.6B", "qwen3", "qwen2"); }
TEST(Convert, Qwen25TinyRoundTripLogits) { round_trip("Qwen2.5-0.5B", "qwen2", "qwen2"); }

TEST(Convert, PermutationHelpersAreInverse) {
  for (int64_t hd : {4, 64, 128}) {
    Weight w;
    w.unpermute_head_dim = hd;  // how tessera reads a llama GGUF's q/k rows
    for (int64_t r = 0; r < 3 * hd; ++r) {
      EXPECT_EQ(llama_unpermuted_row(llama_permuted_row(r, hd), hd), r);
      EXPECT_EQ(llama_permuted_row(r, hd), w.source_row(r));
    }
  }
  EXPECT_EQ(canonical_to_gguf("model.layers.3.self_attn.q_proj.weight"), "blk.3.attn_q.weight");
  EXPECT_EQ(canonical_to_gguf("model.layers.0.self_attn.k_norm.weight"), "blk.0.attn_k_norm.weight");
  EXPECT_EQ(canonical_to_gguf("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_to_canonical(canonical_to_gguf("model.layers.11.mlp.down_proj.weight")),
            "model.layers.11.mlp.down_proj.weight");
}

// The q/k rows in the file are the source's rows permuted exactly as llama.cpp's converter
// does, and converting the GGUF again reproduces every tensor byte for byte.
TEST(Convert, LlamaQkPermutationExact) {
  ScratchDir dir("convert_perm");
  const std::string hf = synth_tiny(dir, "Llama-3.2-1B");
  const std::string g1 = dir.str("a.gguf"), g2 = dir.str("b.gguf");
  ASSERT_EQ(run_tessera("convert " + hf + " --out " + g1 + " --quiet").exit_code, 0);
  ASSERT_EQ(run_tessera("convert " + g1 + " --out " + g2 + " --quiet").exit_code, 0);

  const Model src = Model::open(hf);
  const int64_t hd = src.spec().head_dim;
  const GgufFile a = GgufFile::open(g1);
  for (const char* part : {"attn_q", "attn_k"}) {
    const std::string gname = fmt::format("blk.0.{}.weight", part);
    const auto it = std::find_if(a.tensors().begin(), a.tensors().end(),
                                 [&](const TensorInfo& t) { return t.name == gname; });
    ASSERT_NE(it, a.tensors().end());
    ASSERT_EQ(it->dtype, DType::BF16);
    const Weight& w = src.get(std::string("model.layers.0.self_attn.") + (part[5] == 'q' ? "q" : "k") + "_proj.weight");
    ASSERT_EQ(w.info.dtype, DType::BF16);
    const int64_t cols = w.cols(), half = hd / 2;
    for (int64_t f = 0; f < w.rows(); ++f) {
      // llama.cpp: reshape(n_head, 2, hd/2, cols).swapaxes(1, 2): file row (h, i, j) = HF row (h, j, i).
      const int64_t h = f / hd, i = (f % hd) / 2, j = f % 2;
      const int64_t hf_row = h * hd + j * half + i;
      ASSERT_EQ(std::memcmp(it->data + f * cols * 2, w.info.data + hf_row * cols * 2, size_t(cols) * 2), 0)
          << gname << " row " << f;
    }
  }
  const GgufFile b = GgufFile::open(g2);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorInfo &x = a.tensors()[i], &y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.nbytes, y.nbytes) << x.name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << x.name;
  }
  // llama3 rope scaling became rope_freqs.weight, which reads back as the same frequencies.
  EXPECT_TRUE(std::any_of(a.tensors().begin(), a.tensors().end(),
                          [](const TensorInfo& t) { return t.name == "rope_freqs.weight"; }));
  // The GGUF source's tokenizer keys travel verbatim.
  for (const auto& [k, v] : a.metadata())
    if (k.starts_with("tokenizer.")) {
      ASSERT_TRUE(b.has(k)) << k;
      EXPECT_EQ(v.strings, b.get(k).strings) << k;
      EXPECT_EQ(v.numbers, b.get(k).numbers) << k;
    }
}

// A quantized GGUF (the default model, Q4_1) is dequantized and rounded to BF16.
TEST(Convert, QuantizedGgufToBf16) {
  const std::string src_path = testing_support::default_gguf();
  if (!fs::exists(src_path)) GTEST_SKIP() << "default model not downloaded (scripts/setup.sh)";
  ScratchDir dir("convert_q41");
  const std::string out = dir.str("smollm2.bf16.gguf");
  const auto r = run_tessera("convert " + src_path + " --out " + out + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Model src = Model::open(src_path);
  const Model dst = Model::open(out);
  EXPECT_EQ(dst.get("model.layers.0.self_attn.q_proj.weight").info.dtype, DType::BF16);
  EXPECT_EQ(dst.gguf()->get("tokenizer.ggml.pre").as_string(), src.gguf()->get("tokenizer.ggml.pre").as_string());
  // Each value is the source's, rounded to BF16.
  const Weight& a = src.get("model.layers.0.self_attn.q_proj.weight");
  const Weight& b = dst.get("model.layers.0.self_attn.q_proj.weight");
  std::vector<float> x(size_t(a.cols())), y(size_t(a.cols()));
  for (int64_t r0 = 0; r0 < a.rows(); ++r0) {
    a.row_f32(r0, x.data());
    b.row_f32(r0, y.data());
    for (size_t c = 0; c < x.size(); ++c) ASSERT_EQ(bf16_to_f32(f32_to_bf16(x[c])), y[c]) << r0 << "," << c;
  }
  const std::vector<int32_t> ids = {1, 504, 3458, 28, 260, 1345, 30};
  EXPECT_LT(rel_max_diff(logits(src, ids), logits(dst, ids)), 0.05);
}

TEST(Convert, BadOptionsRefused) {
  const auto r = run_tessera("convert /nonexistent --to gguf --dtype q4_0 --out /tmp/x.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unsupported --dtype 'q4_0'"), std::string::npos) << r.err;
  const auto r2 = run_tessera("convert /nonexistent --to onnx --out /tmp/x.gguf");
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_NE(r2.err.find("unsupported --to 'onnx'"), std::string::npos) << r2.err;
  const auto r4 = run_tessera("convert /nonexistent --out /tmp/x.gguf --tokenizer-pre bogus");
  EXPECT_EQ(r4.exit_code, 1);
  EXPECT_NE(r4.err.find("unsupported --tokenizer-pre 'bogus'"), std::string::npos) << r4.err;
  const auto r3 = run_tessera("convert /nonexistent --to gguf");
  EXPECT_EQ(r3.exit_code, 1);
  EXPECT_NE(r3.err.find("--out"), std::string::npos) << r3.err;
}

TEST(Convert, RefusesToOverwriteItsInput) {
  ScratchDir dir("convert_self");
  const std::string hf = synth_tiny(dir, "Llama-3.2-1B");
  const std::string g = dir.str("a.gguf");
  ASSERT_EQ(run_tessera("convert " + hf + " --out " + g + " --quiet").exit_code, 0);
  const auto r = run_tessera("convert " + g + " --out " + g + " --quiet");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("overwrite the input"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(g));
  EXPECT_NO_THROW(Model::open(g));
}

}  // namespace
}  // namespace tessera
