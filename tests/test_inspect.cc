// `tessera inspect` on every preset's config shows the right architecture features, and on
// a MoE config refuses and says why. Expected features are models.md's table.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::run_tessera;
using testing_support::ScratchDir;
using testing_support::write_file;

struct ExpectedFeatures {
  const char* preset;
  const char* attention;  // as inspect prints it
  int head_dim;
  const char* bias;
  bool qk_norm;
  bool llama3;
};

// From ../shared/reference/models.md.
const ExpectedFeatures kExpected[] = {
    {"Llama-3.2-1B", "GQA 32/8 (group of 4)", 64, "none", false, true},
    {"Llama-3.2-3B", "GQA 24/8 (group of 3)", 128, "none", false, true},
    {"SmolLM2-135M", "GQA 9/3 (group of 3)", 64, "none", false, false},
    {"SmolLM2-360M", "GQA 15/5 (group of 3)", 64, "none", false, false},
    {"SmolLM2-1.7B", "MHA, 32 heads", 64, "none", false, false},
    {"Qwen2.5-0.5B", "GQA 14/2 (group of 7)", 64, "q, k, v", false, false},
    {"Qwen2.5-1.5B", "GQA 12/2 (group of 6)", 128, "q, k, v", false, false},
    {"Qwen2.5-3B", "GQA 16/2 (group of 8)", 128, "q, k, v", false, false},
    {"Qwen3-0.6B", "GQA 16/8 (group of 2)", 128, "none", true, false},
    {"Qwen3-1.7B", "GQA 16/8 (group of 2)", 128, "none", true, false},
    {"Qwen3-4B", "GQA 32/8 (group of 4)", 128, "none", true, false},
};

nlohmann::json inspect_json(const ScratchDir& dir, const ModelSpec& spec) {
  write_file(dir.path() / "config.json", spec_to_hf_config(spec).dump());
  auto r = run_tessera("inspect " + dir.str("config.json") + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(Inspect, EveryPresetShowsItsFeatures) {
  ASSERT_EQ(presets().size(), std::size(kExpected));
  for (const ExpectedFeatures& e : kExpected) {
    const Preset& p = find_preset(e.preset);
    ScratchDir dir("inspect");
    const auto j = inspect_json(dir, p.full);
    const auto& f = j["features"];
    EXPECT_EQ(f["attention"], e.attention) << e.preset;
    EXPECT_TRUE(f["head_dim"].get<std::string>().starts_with(std::to_string(e.head_dim))) << e.preset;
    EXPECT_EQ(f["projection bias"], e.bias) << e.preset;
    EXPECT_EQ(f["q/k norm"] != "none", e.qk_norm) << e.preset;
    EXPECT_EQ(f["rope"].get<std::string>().find("llama3") != std::string::npos, e.llama3) << e.preset;
    EXPECT_EQ(f["embeddings"], "tied (lm_head = embed_tokens)") << e.preset;
    // The kernels list carries the shapes of this model.
    bool saw_q = false;
    for (const auto& k : j["kernels"])
      if (k["role"] == "q_proj") {
        saw_q = true;
        EXPECT_NE(k["shape"].get<std::string>().find(std::to_string(p.full.q_dim())), std::string::npos);
      }
    EXPECT_TRUE(saw_q);

    // The tiny form shows the same features but the width and the GQA ratio's numbers.
    const auto t = inspect_json(dir, p.tiny)["features"];
    EXPECT_EQ(t["projection bias"], f["projection bias"]) << e.preset;
    EXPECT_EQ(t["q/k norm"], f["q/k norm"]) << e.preset;
    EXPECT_EQ(t["embeddings"], f["embeddings"]) << e.preset;
    EXPECT_EQ(t["rope"].get<std::string>().find("llama3") != std::string::npos, e.llama3) << e.preset;
  }
}

TEST(Inspect, MoeConfigRefusedWithReason) {
  ScratchDir dir("inspect_moe");
  auto c = spec_to_hf_config(find_preset("Qwen3-0.6B").full);
  c["model_type"] = "qwen3_moe";
  c["num_experts"] = 128;
  write_file(dir.path() / "config.json", c.dump());
  auto r = run_tessera("inspect " + dir.str("config.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unsupported feature: mixture of experts"), std::string::npos) << r.err;
}

TEST(Inspect, DefaultModelWithoutArgument) {
  if (!std::filesystem::exists(testing_support::default_gguf())) GTEST_SKIP() << "run scripts/setup.sh";
  auto r = run_tessera("inspect");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GQA 9/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gguf"), std::string::npos);
}

}  // namespace
}  // namespace tessera
