// The preset table against the seed models' configurations (values copied from
// shared/reference/models.md), and the tiny forms against the features they must keep.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/presets.h"
#include "util/error.h"

namespace tessera {
namespace {

struct Row {
  const char* name;
  Arch arch;
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
  double rope_theta;
  bool llama3_scaling;
  double eps;
  int64_t max_pos;
  int64_t params;  // with tied embeddings: embedding + layers + final norm
};

// models.md, row by row. Parameter counts are the published ones (tied embeddings).
const std::vector<Row> kTable = {
    {"Llama-3.2-1B", Arch::Llama, 2048, 8192, 16, 32, 8, 64, 128256, 500000, true, 1e-5, 131072, 1235814400},
    {"Llama-3.2-3B", Arch::Llama, 3072, 8192, 28, 24, 8, 128, 128256, 500000, true, 1e-5, 131072, 3212749824},
    {"SmolLM2-135M", Arch::Llama, 576, 1536, 30, 9, 3, 64, 49152, 100000, false, 1e-5, 8192, 134515008},
    {"SmolLM2-360M", Arch::Llama, 960, 2560, 32, 15, 5, 64, 49152, 100000, false, 1e-5, 8192, 361821120},
    {"SmolLM2-1.7B", Arch::Llama, 2048, 8192, 24, 32, 32, 64, 49152, 130000, false, 1e-5, 8192, 1711376384},
    {"Qwen2.5-0.5B", Arch::Qwen2, 896, 4864, 24, 14, 2, 64, 151936, 1e6, false, 1e-6, 32768, 494032768},
    {"Qwen2.5-1.5B", Arch::Qwen2, 1536, 8960, 28, 12, 2, 128, 151936, 1e6, false, 1e-6, 32768, 1543714304},
    {"Qwen2.5-3B", Arch::Qwen2, 2048, 11008, 36, 16, 2, 128, 151936, 1e6, false, 1e-6, 32768, 3085938688},
    {"Qwen3-0.6B", Arch::Qwen3, 1024, 3072, 28, 16, 8, 128, 151936, 1e6, false, 1e-6, 40960, 596049920},
    {"Qwen3-1.7B", Arch::Qwen3, 2048, 6144, 28, 16, 8, 128, 151936, 1e6, false, 1e-6, 40960, 1720574976},
    {"Qwen3-4B", Arch::Qwen3, 2560, 9728, 36, 32, 8, 128, 151936, 1e6, false, 1e-6, 40960, 4022468096},
};

TEST(Presets, ElevenInTableOrder) {
  ASSERT_EQ(presets().size(), kTable.size());
  for (size_t i = 0; i < kTable.size(); ++i) EXPECT_EQ(presets()[i].name, kTable[i].name);
}

TEST(Presets, FullSpecsMatchModelsMd) {
  for (const Row& r : kTable) {
    SCOPED_TRACE(r.name);
    const ModelSpec& s = find_preset(r.name).full;
    EXPECT_EQ(s.arch, r.arch);
    EXPECT_EQ(s.hidden, r.hidden);
    EXPECT_EQ(s.intermediate, r.intermediate);
    EXPECT_EQ(s.n_layers, r.layers);
    EXPECT_EQ(s.n_heads, r.heads);
    EXPECT_EQ(s.n_kv_heads, r.kv_heads);
    EXPECT_EQ(s.head_dim, r.head_dim);
    EXPECT_EQ(s.vocab, r.vocab);
    EXPECT_EQ(s.rope_theta, r.rope_theta);
    EXPECT_EQ(s.rms_eps, r.eps);
    EXPECT_EQ(s.max_position, r.max_pos);
    EXPECT_TRUE(s.tie_embeddings);
    EXPECT_FALSE(s.o_bias);
    EXPECT_FALSE(s.mlp_bias);
    EXPECT_EQ(s.qkv_bias, r.arch == Arch::Qwen2);
    EXPECT_EQ(s.qk_norm, r.arch == Arch::Qwen3);
    EXPECT_EQ(s.model_type, std::string(r.arch == Arch::Llama ? "llama"
                                        : r.arch == Arch::Qwen2 ? "qwen2"
                                                                : "qwen3"));
    if (r.llama3_scaling) {
      EXPECT_EQ(s.rope_scaling.type, RopeScaling::Type::Llama3);
      EXPECT_EQ(s.rope_scaling.factor, 32.0);
      EXPECT_EQ(s.rope_scaling.low_freq_factor, 1.0);
      EXPECT_EQ(s.rope_scaling.high_freq_factor, 4.0);
      EXPECT_EQ(s.rope_scaling.original_max_position, 8192);
    } else {
      EXPECT_EQ(s.rope_scaling.type, RopeScaling::Type::None);
    }
    EXPECT_NO_THROW(s.validate());
  }
}

TEST(Presets, DecoupledHeadDimOfQwen3) {
  // models.md notes: o_proj 2048 -> 1024 (0.6B) and 4096 -> 2560 (4B).
  EXPECT_EQ(find_preset("Qwen3-0.6B").full.q_dim(), 2048);
  EXPECT_EQ(find_preset("Qwen3-4B").full.q_dim(), 4096);
}

TEST(Presets, SpecialTokenIds) {
  for (const Preset& p : presets()) {
    SCOPED_TRACE(p.name);
    for (const ModelSpec* s : {&p.full, &p.tiny}) {
      if (p.family == "llama3") {
        EXPECT_EQ(s->bos_id, 128000);
        EXPECT_EQ(s->eos_ids, (std::vector<int64_t>{128001, 128008, 128009}));
      } else if (p.family == "qwen") {
        EXPECT_EQ(s->bos_id, -1);
        EXPECT_EQ(s->eos_ids, (std::vector<int64_t>{151643, 151645}));
      } else {
        ASSERT_EQ(p.family, "smollm2");
        EXPECT_EQ(s->bos_id, 1);
        EXPECT_EQ(s->eos_ids, (std::vector<int64_t>{2, 0}));
      }
    }
  }
}

TEST(Presets, ParameterCountsArePublishedOnes) {
  for (const Row& r : kTable) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(count_params(find_preset(r.name).full), r.params);
  }
}

TEST(Presets, TinyFormsKeepEveryFeature) {
  for (const Preset& p : presets()) {
    SCOPED_TRACE(p.name);
    const ModelSpec& f = p.full;
    const ModelSpec& t = p.tiny;
    EXPECT_NO_THROW(t.validate());
    EXPECT_EQ(t.arch, f.arch);
    EXPECT_EQ(t.model_type, f.model_type);
    EXPECT_GE(t.n_layers, 2);
    EXPECT_LE(t.n_layers, 4);
    EXPECT_LT(t.n_layers, f.n_layers);
    EXPECT_LE(t.hidden, f.hidden);
    EXPECT_EQ(t.n_heads % t.n_kv_heads, 0);
    EXPECT_EQ(t.gqa_group(), f.gqa_group());
    EXPECT_EQ(t.head_dim, f.head_dim);
    EXPECT_EQ(t.vocab, f.vocab);  // the family's real tokenizer must fit
    EXPECT_EQ(t.rope_theta, f.rope_theta);
    EXPECT_EQ(t.rms_eps, f.rms_eps);
    EXPECT_EQ(t.rope_scaling.type, f.rope_scaling.type);
    EXPECT_EQ(t.rope_scaling.factor, f.rope_scaling.factor);
    EXPECT_EQ(t.rope_scaling.low_freq_factor, f.rope_scaling.low_freq_factor);
    EXPECT_EQ(t.rope_scaling.high_freq_factor, f.rope_scaling.high_freq_factor);
    EXPECT_EQ(t.rope_scaling.original_max_position, f.rope_scaling.original_max_position);
    EXPECT_EQ(t.qkv_bias, f.qkv_bias);
    EXPECT_EQ(t.o_bias, f.o_bias);
    EXPECT_EQ(t.mlp_bias, f.mlp_bias);
    EXPECT_EQ(t.qk_norm, f.qk_norm);
    EXPECT_EQ(t.tie_embeddings, f.tie_embeddings);
    EXPECT_EQ(t.max_position, f.max_position);
    EXPECT_EQ(t.intermediate % 64, 0);
    EXPECT_GE(t.intermediate, 2 * t.hidden);
    EXPECT_LE(t.intermediate, 3 * t.hidden);
    // A decoupled q dim (Qwen3-0.6B, -4B) stays decoupled; a coupled one stays coupled.
    EXPECT_EQ(t.q_dim() == t.hidden, f.q_dim() == f.hidden);
    EXPECT_LT(count_params(t), 200000000);
  }
}

TEST(Presets, OddGroupsKeptExactly) {
  // The uncommon GQA shapes are where head-mapping bugs hide: keep them verbatim.
  const ModelSpec& smol = find_preset("SmolLM2-135M").tiny;
  EXPECT_EQ(smol.n_heads, 9);
  EXPECT_EQ(smol.n_kv_heads, 3);
  const ModelSpec& qwen = find_preset("Qwen2.5-0.5B").tiny;
  EXPECT_EQ(qwen.n_heads, 14);
  EXPECT_EQ(qwen.n_kv_heads, 2);
  EXPECT_EQ(find_preset("SmolLM2-1.7B").tiny.gqa_group(), 1);  // plain MHA
}

TEST(Presets, FindIsExactThenCaseInsensitive) {
  EXPECT_EQ(find_preset("Qwen3-4B").name, "Qwen3-4B");
  EXPECT_EQ(find_preset("qwen3-4b").name, "Qwen3-4B");
  EXPECT_EQ(find_preset("smollm2-135m").family, "smollm2");
}

TEST(Presets, UnknownNameListsValidOnes) {
  try {
    find_preset("Llama-2-7B");
    FAIL() << "no error for an unknown preset";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Llama-2-7B"), std::string::npos) << msg;
    for (const Row& r : kTable) EXPECT_NE(msg.find(r.name), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace tessera
