// Inputs the fuzz harnesses (fuzz/) found, each kept as a test of the fix. (The config.json
// one is in test_spec.cc: Spec.FuzzFloatInAnIntegerFieldIsRefused.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipeline/deployment.h"
#include "pipeline/plan.h"
#include "util/error.h"

namespace tessera {
namespace {

using nlohmann::json;

// fuzz_plan and fuzz_state: plan_markdown looked keys up with const operator[], undefined
// (an assertion in a debug build) when plan.json or state.json lacks one; now a json
// out_of_range naming the key. Found on the harnesses' seeds (a real cpu plan.json with an
// empty state, a real state.json with an empty plan), cut down here to what triggers it.
TEST(FuzzRegressions, PlanMarkdownMissingKeysThrow) {
  EXPECT_THROW(plan_markdown(json::object(), json::object()), json::out_of_range);
  const json plan = {{"model", {{"spec", json::object()}, {"path", "m.gguf"}, {"arch", "llama"}, {"format", "gguf"}}},
                     {"target", "cpu"}};
  EXPECT_THROW(plan_markdown(plan, json::object()), json::out_of_range);
}

// fuzz_state: a state.json without its phases or identity object is refused when opened.
TEST(FuzzRegressions, DamagedStateJsonIsRefused) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessera_fuzz_regression_state";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* text : {R"({"format": "tessera-deployment/1"})",
                           R"({"format": "tessera-deployment/1", "phases": [], "identity": {}})",
                           R"({"format": "tessera-deployment/1", "phases": {}, "identity": 3})"}) {
    std::ofstream(dir / "state.json", std::ios::trunc) << text;
    EXPECT_THROW(Deployment::open_existing(dir), Error) << text;
    EXPECT_THROW(Deployment::open_for_deploy(dir, {{"model_path", "m"}}), Error) << text;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
