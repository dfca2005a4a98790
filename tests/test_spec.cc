// ModelSpec from config.json: the fields of each family, legacy spellings, and refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/spec.h"
#include "util/error.h"

namespace tessera {
namespace {

using nlohmann::json;

json llama_1b_config() {
  // Llama-3.2-1B's config.json fields (../shared/reference/models.md).
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rms_norm_eps": 1e-05, "max_position_embeddings": 131072, "tie_word_embeddings": true,
    "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
}

std::string refusal(const json& c) {
  try {
    spec_from_hf_config(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Spec, LlamaFields) {
  ModelSpec s = spec_from_hf_config(llama_1b_config());
  EXPECT_EQ(s.arch, Arch::Llama);
  EXPECT_EQ(s.hidden, 2048);
  EXPECT_EQ(s.n_kv_heads, 8);
  EXPECT_EQ(s.gqa_group(), 4);
  EXPECT_EQ(s.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_DOUBLE_EQ(s.rope_scaling.factor, 32.0);
  EXPECT_EQ(s.rope_scaling.original_max_position, 8192);
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_EQ(s.eos_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_DOUBLE_EQ(s.attn_scale(), 0.125);
}

TEST(Spec, LegacyRopeScalingTypeKey) {
  json c = llama_1b_config();
  c["rope_scaling"].erase("rope_type");
  c["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(spec_from_hf_config(c).rope_scaling.type, RopeScaling::Type::Llama3);
}

TEST(Spec, HeadDimDefaultsToHiddenOverHeads) {
  json c = llama_1b_config();
  c.erase("head_dim");
  EXPECT_EQ(spec_from_hf_config(c).head_dim, 64);
}

TEST(Spec, LlamaAttentionAndMlpBias) {
  json c = llama_1b_config();
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  ModelSpec s = spec_from_hf_config(c);
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_TRUE(s.o_bias);
  EXPECT_TRUE(s.mlp_bias);
}

TEST(Spec, Qwen2AlwaysHasQkvBiasNeverOBias) {
  json c = llama_1b_config();
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = false;
  c["sliding_window"] = 4096;  // present but disabled, as in real Qwen2.5 configs
  c.erase("rope_scaling");
  ModelSpec s = spec_from_hf_config(c);
  EXPECT_EQ(s.arch, Arch::Qwen2);
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_FALSE(s.o_bias);
  EXPECT_FALSE(s.qk_norm);
}

TEST(Spec, Qwen3QkNormAndDecoupledHeadDim) {
  json c = llama_1b_config();
  c["model_type"] = "qwen3";
  c["hidden_size"] = 1024;
  c["num_attention_heads"] = 16;
  c["head_dim"] = 128;
  c.erase("rope_scaling");
  ModelSpec s = spec_from_hf_config(c);
  EXPECT_TRUE(s.qk_norm);
  EXPECT_EQ(s.q_dim(), 2048);
  EXPECT_NE(s.q_dim(), s.hidden);
  EXPECT_NEAR(s.attn_scale(), 1.0 / std::sqrt(128.0), 1e-12);
}

TEST(Spec, RoundTripThroughHfConfigForEveryPreset) {
  for (const Preset& p : presets()) {
    for (const ModelSpec* s : {&p.full, &p.tiny}) {
      ModelSpec back = spec_from_hf_config(spec_to_hf_config(*s));
      EXPECT_EQ(back.to_json(), s->to_json()) << p.name;
    }
  }
}

TEST(Spec, MissingHiddenSize) {
  json c = llama_1b_config();
  c.erase("hidden_size");
  EXPECT_NE(refusal(c).find("hidden_size"), std::string::npos);
}

TEST(Spec, RefusesMixtureOfExperts) {
  json c = llama_1b_config();
  c["model_type"] = "qwen2_moe";
  EXPECT_NE(refusal(c).find("mixture of experts"), std::string::npos);
  c = llama_1b_config();
  c["num_local_experts"] = 8;
  EXPECT_NE(refusal(c).find("mixture of experts"), std::string::npos);
}

TEST(Spec, RefusesSlidingWindow) {
  json c = llama_1b_config();
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = true;
  c["sliding_window"] = 4096;
  EXPECT_NE(refusal(c).find("sliding-window"), std::string::npos);
  c = llama_1b_config();
  c["sliding_window"] = 4096;  // mistral-style: no switch, window below the context
  EXPECT_NE(refusal(c).find("sliding-window"), std::string::npos);
}

TEST(Spec, RefusesMlaUnknownTypeAndUnknownRopeScaling) {
  json c = llama_1b_config();
  c["kv_lora_rank"] = 512;
  EXPECT_NE(refusal(c).find("latent attention"), std::string::npos);
  c = llama_1b_config();
  c["model_type"] = "gpt2";
  EXPECT_NE(refusal(c).find("unsupported architecture: model_type 'gpt2'"), std::string::npos);
  c = llama_1b_config();
  c["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_NE(refusal(c).find("rope scaling type 'yarn'"), std::string::npos);
}

TEST(Spec, RefusesInconsistentHeads) {
  json c = llama_1b_config();
  c["num_key_value_heads"] = 5;
  EXPECT_NE(refusal(c).find("not a multiple"), std::string::npos);
}

// fuzz/fuzz_config.cc's first finding: a float far out of int64_t's range in an integer field
// (head_dim) was cast to int64_t (undefined behaviour, UBSan); now refused by name. The
// input is the fuzzer's, as it wrote it.
TEST(Spec, FuzzFloatInAnIntegerFieldIsRefused) {
  const json c = json::parse(R"fuzz({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": [
    2,
    0
  ],
  "head_dim": 6111111111111111111111111111111111111111111111111111111111114,
  "hidden_act": "silu",
  "hidden_size": 192,
  "initializer_range": 0.02,
  "intermediate_size": 512,
  "max_position_embeddings": 8192,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 3,
  "num_hidden_layers": 3,
  "num_key_value_heads": 1,
  "rms_norm_eps": 1e-05,
  ",,,,,,,,,,,,,,,,,,,,,,,rope_scaling": null,
  "rope_thetmax_position_emb;a": 100001.0,
  "tie_word_embeddings": true,
  "vocab_size": 49152
}
)fuzz");
  try {
    spec_from_hf_config(c);
    FAIL() << "accepted a float head_dim";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'head_dim' must be an integer"), std::string::npos) << e.what();
  }
  json ok = c;
  ok["head_dim"] = 64.0;  // a float, even a whole one, is not an integer field's value
  EXPECT_THROW(spec_from_hf_config(ok), Error);
}

}  // namespace
}  // namespace tessera
