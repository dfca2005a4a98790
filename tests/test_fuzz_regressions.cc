// Inputs the fuzz harnesses (fuzz/) found, each kept as a test of the fix. (The config.json
// one is in test_spec.cc: Spec.FuzzFloatInAnIntegerFieldIsRefused.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/audit.h"
#include "pipeline/deployment.h"
#include "pipeline/plan.h"
#include "targets/npusim/plans.h"
#include "targets/registry.h"
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

// fuzz_plan (the CI smoke run, 2026-12-06): a plan.json whose op "layer" was an integer
// literal too large for 64 bits (JSON reads it as 2.8e34, a float) was converted to int64_t,
// undefined behaviour; plan.json's integers now take JSON integers only, else an Error.
TEST(FuzzRegressions, PlanIntegersTakeJsonIntegersOnly) {
  const json op = {{"op", "q_proj"}, {"kernel", "gemm"}, {"shape", "[1 x 2]"}};
  json plan = {{"model", {{"spec", {{"hidden", 64}}}, {"path", "m.gguf"}, {"arch", "llama"}, {"format", "gguf"}}},
               {"target", "npusim"}, {"name", "baseline"}, {"dispatches", json::array({{{"ops", json::array({op})}}})}};
  EXPECT_NO_THROW(plan_markdown(plan, {{"phases", json::object()}}));
  for (const json& bad : {json(2.77778e34), json(1.5), json("0")}) {
    plan["dispatches"][0]["ops"][0]["layer"] = bad;
    EXPECT_THROW(plan_markdown(plan, {{"phases", json::object()}}), Error) << bad.dump();
  }
  plan["dispatches"][0]["ops"][0].erase("layer");
  plan["model"]["spec"]["hidden"] = 6.1e60;
  EXPECT_THROW(plan_markdown(plan, {{"phases", json::object()}}), Error);
}

// fuzz_plan (the long campaign, 2026-12-06): an npusim plan's GEMV tile "rb" written as an
// integer literal too large for 64 bits (JSON reads it as the float 1.5e23) was converted
// to int64_t, undefined behaviour. Every integer a plan.json reader takes (npusim's GEMV
// tiles, the cpu plan's threads here; its GEMM blocking, read when the runner is made, the
// same way) is now a JSON integer in range, else an Error naming the field.
TEST(FuzzRegressions, PlanReadersTakeJsonIntegersOnly) {
  json np = npusim::named_plan("baseline").to_json();
  np["tiles"]["gemv"] = json::array({{{"N", 256}, {"K", 768}, {"cols", 8}, {"rows", 4}, {"kc", 384}, {"rb", 1}}});
  EXPECT_NO_THROW(npusim::plan_from_json(np));
  for (const char* key : {"rb", "kc", "cols", "rows", "N", "K"})
    for (const json& bad : {json::parse("146667667333333383333334"), json(1.5), json(0), json("1"), json(int64_t(1) << 40)}) {
      json j = np;
      j["tiles"]["gemv"][0][key] = bad;
      EXPECT_THROW(npusim::plan_from_json(j), Error) << key << " = " << bad.dump();
    }
  const std::string verbatim = std::string(TESSERA_SOURCE_DIR) + "/fuzz/corpus/plan/crash-gemv-rb-float";
  std::ifstream in(verbatim);
  ASSERT_TRUE(in) << verbatim;
  EXPECT_THROW(npusim::plan_from_json(json::parse(in).at("npusim").at("plan")), Error);
  const TargetDef* cpu = &target_def("cpu");
  ASSERT_TRUE(cpu->options_from_plan);
  const json plan = {{"cpu", {{"threads", 2}}}};
  TargetOptions o;
  cpu->options_from_plan(plan, o);
  EXPECT_EQ(o.threads, 2);
  for (const json& bad : {json(6.1e60), json(2.5), json(-1)}) {
    json p = plan;
    p["cpu"]["threads"] = bad;
    TargetOptions t;
    EXPECT_THROW(cpu->options_from_plan(p, t), Error) << bad.dump();
  }
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
