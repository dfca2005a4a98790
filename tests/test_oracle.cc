// The FP32 oracle's own properties: KV-cache decode equals prefill, probes are complete,
// RoPE behaves like a rotation, and GGUF's permuted q/k rows are read back in HF layout.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "io/gguf_writer.h"
#include "model/weights.h"
#include "model/tensors.h"
#include "oracle/ops.h"
#include "oracle/oracle.h"
#include "synth/synth.h"
#include "targets/npusim/numerics.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::ScratchDir;
using testing_support::write_file;

ModelSpec micro_spec(Arch arch) {
  ModelSpec s;
  s.arch = arch;
  s.model_type = arch_name(arch);
  s.hidden = 32;
  s.intermediate = 64;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.vocab = 48;
  s.max_position = 128;
  s.rope_theta = 10000;
  s.tie_embeddings = true;
  s.qkv_bias = arch == Arch::Qwen2;
  s.qk_norm = arch == Arch::Qwen3;
  return s;
}

std::string write_micro(const ScratchDir& dir, const ModelSpec& s) {
  write_file(dir.path() / "config.json", spec_to_hf_config(s).dump());
  write_synth_weights(s, dir.str(), /*seed=*/7);
  return dir.str();
}

float max_abs_diff(const std::vector<float>& a, const float* b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

class OracleArch : public ::testing::TestWithParam<Arch> {};

TEST_P(OracleArch, DecodeWithKvCacheMatchesPrefill) {
  ScratchDir dir("kv");
  Model m = Model::open(write_micro(dir, micro_spec(GetParam())));
  const std::vector<int32_t> ids = {3, 17, 5, 40, 11, 2, 29};
  Oracle prefill(m, 2);
  const std::vector<float> all = prefill.forward(ids);
  Oracle decode(m, 1);
  for (size_t t = 0; t < ids.size(); ++t) {
    std::vector<float> step = decode.forward(std::span(&ids[t], 1), /*all_logits=*/false);
    EXPECT_LT(max_abs_diff(step, all.data() + t * m.spec().vocab), 1e-5) << "position " << t;
  }
  EXPECT_EQ(decode.position(), int64_t(ids.size()));
  decode.reset();
  std::vector<float> again = decode.forward(ids);
  EXPECT_EQ(again, all) << "reset must clear the cache";
}

TEST_P(OracleArch, ProbesNameEveryKernelOutput) {
  ScratchDir dir("probes");
  Model m = Model::open(write_micro(dir, micro_spec(GetParam())));
  Oracle o(m, 1);
  std::set<std::string> seen;
  const std::vector<int32_t> ids = {1, 2, 3};
  o.forward(ids, true, [&](const std::string& n, const float*, int64_t rows, int64_t) {
    EXPECT_EQ(rows, 3) << n;
    seen.insert(n);
  }, ProbeLevel::All);
  for (int l = 0; l < 2; ++l)
    for (const std::string& s : layer_probe_suffixes()) EXPECT_TRUE(seen.count("layers." + std::to_string(l) + "." + s)) << s;
  EXPECT_TRUE(seen.count("embed"));
  EXPECT_TRUE(seen.count("final_norm"));
  EXPECT_TRUE(seen.count("logits"));

  std::set<std::string> layers_only;
  o.reset();
  o.forward(ids, true, [&](const std::string& n, const float*, int64_t, int64_t) { layers_only.insert(n); },
            ProbeLevel::Layers);
  EXPECT_EQ(layers_only, (std::set<std::string>{"layers.0.out", "layers.1.out", "final_norm", "logits"}));
}

INSTANTIATE_TEST_SUITE_P(Families, OracleArch, ::testing::Values(Arch::Llama, Arch::Qwen2, Arch::Qwen3),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

// The hot loops check their whole ranges once instead of every access (util/sanitize.h):
// under ASan a read one value past a buffer is still reported, for each such loop.
TEST(RangeChecked, ReadsPastABufferAreStillReportedUnderAddressSanitizer) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> f(16, 1.0f);
  std::vector<uint16_t> h(32, 0x3F80);
  std::vector<float> out(32);
  EXPECT_EQ(oracle::dot(f.data(), f.data(), 16), 16.0f);
  EXPECT_DEATH(oracle::dot(f.data(), f.data(), 17), "AddressSanitizer: heap-buffer-overflow");
  EXPECT_EQ(npusim::dot_bf16(h.data(), h.data(), 32), 32.0f);
  EXPECT_DEATH(npusim::dot_bf16(h.data(), h.data(), 33), "AddressSanitizer: heap-buffer-overflow");
  to_f32(DType::BF16, reinterpret_cast<const uint8_t*>(h.data()), out.data(), 32);
  EXPECT_EQ(out[31], 1.0f);
  EXPECT_DEATH(to_f32(DType::BF16, reinterpret_cast<const uint8_t*>(h.data()), out.data(), 33),
               "AddressSanitizer: heap-buffer-overflow");
#else
  GTEST_SKIP() << "an AddressSanitizer build checks this";
#endif
}

TEST(OracleOps, RopeIsARotationWithRelativePositions) {
  ModelSpec s = micro_spec(Arch::Llama);
  const auto inv = oracle::rope_inv_freq(s);
  std::vector<float> q(8), k(8);
  for (int i = 0; i < 8; ++i) {
    q[size_t(i)] = 0.3f * float(i) - 1.0f;
    k[size_t(i)] = 0.7f - 0.2f * float(i);
  }
  auto at = [&](std::vector<float> v, int64_t pos) {
    oracle::rope(v.data(), 1, 1, 8, pos, inv);
    return v;
  };
  EXPECT_EQ(at(q, 0), q) << "position 0 is the identity";
  // Half-split pairs (i, i + 4) keep their norm.
  auto r = at(q, 5);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(std::hypot(r[size_t(i)], r[size_t(i + 4)]), std::hypot(q[size_t(i)], q[size_t(i + 4)]), 1e-5);
  // q.k depends only on the distance between the positions.
  const float d1 = oracle::dot(at(q, 9).data(), at(k, 4).data(), 8);
  const float d2 = oracle::dot(at(q, 25).data(), at(k, 20).data(), 8);
  EXPECT_NEAR(d1, d2, 1e-4);
}

TEST(OracleOps, Llama3ScalingKeepsHighAndSlowsLowFrequencies) {
  ModelSpec s = micro_spec(Arch::Llama);
  s.head_dim = 64;
  s.rope_theta = 500000;
  ModelSpec scaled = s;
  scaled.rope_scaling = {RopeScaling::Type::Llama3, 32.0, 1.0, 4.0, 8192};
  const auto base = oracle::rope_inv_freq(s), inv = oracle::rope_inv_freq(scaled);
  EXPECT_EQ(inv.front(), base.front());               // wavelength 2*pi: kept
  EXPECT_FLOAT_EQ(inv.back(), base.back() / 32.0f);   // longest wavelength: divided by factor
  int blended = 0;
  for (size_t i = 0; i < inv.size(); ++i) {
    EXPECT_LE(inv[i], base[i]);
    EXPECT_GE(inv[i], base[i] / 32.0f * (1 - 1e-6f));
    if (inv[i] < base[i] && inv[i] > base[i] / 32.0f * (1 + 1e-6f)) ++blended;
  }
  EXPECT_GT(blended, 0) << "some frequencies fall in the blended band";
}

// GGUF llama files store q/k rows permuted for interleaved RoPE: write the micro model as a
// GGUF with that permutation and check the oracle reads back the same model.
TEST(OracleGguf, PermutedLlamaQkRowsAreUndone) {
  ScratchDir dir("gguf_perm");
  const ModelSpec s = micro_spec(Arch::Llama);
  Model hf = Model::open(write_micro(dir, s));

  const std::string gguf_path = dir.str("micro.gguf");
  {
    GgufWriter w(gguf_path);
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.embedding_length", uint32_t(s.hidden));
    w.add_u32("llama.feed_forward_length", uint32_t(s.intermediate));
    w.add_u32("llama.block_count", uint32_t(s.n_layers));
    w.add_u32("llama.attention.head_count", uint32_t(s.n_heads));
    w.add_u32("llama.attention.head_count_kv", uint32_t(s.n_kv_heads));
    w.add_u32("llama.context_length", uint32_t(s.max_position));
    w.add_f32("llama.rope.freq_base", float(s.rope_theta));
    w.add_f32("llama.attention.layer_norm_rms_epsilon", float(s.rms_eps));
    std::vector<std::pair<std::string, std::vector<float>>> tensors;
    auto gguf_name = [](const std::string& canonical) {
      static const std::pair<const char*, const char*> map[] = {
          {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
          {"self_attn.k_proj.weight", "attn_k.weight"},    {"self_attn.v_proj.weight", "attn_v.weight"},
          {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},     {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
      if (canonical == "model.embed_tokens.weight") return std::string("token_embd.weight");
      if (canonical == "model.norm.weight") return std::string("output_norm.weight");
      const std::string layer = canonical.substr(13, canonical.find('.', 13) - 13);  // "model.layers.N."
      const std::string rest = canonical.substr(13 + layer.size() + 1);
      for (auto [hf_part, g] : map)
        if (rest == hf_part) return "blk." + layer + "." + g;
      return std::string();
    };
    for (const ExpectedTensor& e : expected_tensors(s)) {
      const Weight& src = hf.get(e.name);
      std::vector<float> v = src.to_f32();
      const bool is_q = e.name.find("q_proj") != std::string::npos, is_k = e.name.find("k_proj") != std::string::npos;
      if (is_q || is_k) {  // HF row (h, half, i) goes to GGUF row (h, i, half)
        const int64_t hd = s.head_dim, cols = src.cols();
        std::vector<float> p(v.size());
        for (int64_t r = 0; r < src.rows(); ++r) {
          const int64_t h = r / hd, half = (r % hd) / (hd / 2), i = r % (hd / 2);
          const int64_t dst = h * hd + 2 * i + half;
          std::copy_n(v.begin() + r * cols, cols, p.begin() + dst * cols);
        }
        v = p;
      }
      w.add_tensor(gguf_name(e.name), DType::F32, e.shape);
      tensors.emplace_back(gguf_name(e.name), std::move(v));
    }
    for (const auto& [name, v] : tensors) w.write(name, v.data(), v.size() * sizeof(float));
    w.close();
  }
  Model gg = Model::open(gguf_path);
  EXPECT_TRUE(gg.spec().tie_embeddings);
  const std::vector<int32_t> ids = {4, 8, 15, 16, 23, 42};
  Oracle a(hf, 1), b(gg, 1);
  const auto la = a.forward(ids), lb = b.forward(ids);
  EXPECT_LT(max_abs_diff(la, lb.data()), 1e-6);
}

}  // namespace
}  // namespace tessera
