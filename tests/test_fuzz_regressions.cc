// Inputs the fuzz harnesses (fuzz/) found, each kept as a test of the fix. (The config.json
// one is in test_spec.cc: Spec.FuzzFloatInAnIntegerFieldIsRefused.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/audit.h"
#include "pipeline/deployment.h"
#include "pipeline/plan.h"
#include "util/error.h"
#include "util/sha256.h"

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

// manifest.json as `tessera audit` reads it (fuzz_manifest): a manifest of the wrong shape
// is a problem said as such, not a json exception out of the audit. (Before: `m.value(f, "")`
// threw type_error on an array or a number where a hash belongs.)
TEST(FuzzRegressions, DamagedManifestIsAProblemNotAnException) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessera_fuzz_regression_manifest";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path model = dir / "model.gguf";
  std::ofstream(model) << "GGUF model bytes\n";
  std::ofstream(dir / "state.json") << json{{"format", "tessera-deployment/1"},
                                            {"identity", {{"model_path", model.string()}, {"target", "cpu"}}},
                                            {"phases", json::object()}}.dump();
  std::ofstream(dir / "plan.json") << "{}\n";
  std::ofstream(dir / "report.json") << "{}\n";
  const Deployment dep = Deployment::open_existing(dir);
  const std::string h = sha256_file_hex((dir / "plan.json").string());
  const json good = {{"plan.json", h}, {"report.json", h}, {"model", {{"model.gguf", sha256_file_hex(model.string())}}}};
  EXPECT_TRUE(manifest_problems(good, dep).empty());
  for (const json& bad : {json::array({good}), json{{"plan.json", 1}, {"model", "x"}}, json(7),
                          json{{"plan.json", h}, {"report.json", h}, {"model", {{"model.gguf", 7}}}}}) {
    std::vector<std::string> problems;
    EXPECT_NO_THROW(problems = manifest_problems(bad, dep)) << bad.dump();
    EXPECT_FALSE(problems.empty()) << bad.dump();
  }
  EXPECT_EQ(manifest_problems(json::array(), dep).front(), "manifest.json is damaged: a JSON array, not an object");
}

}  // namespace
}  // namespace tessera
