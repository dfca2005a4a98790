// Phase 7 (`tessera audit`): PASS on an untouched deployment, FAIL with the finding named on
// each tampering. The untouched deployments of every tiny preset on both targets are audited
// by Presets/DeployTiny and Presets/NpusimDeployTiny.
#include <gtest/gtest.h>

#include "eval/audit.h"
#include "pipeline/deploy.h"
#include "test_support.h"
#include "util/error.h"

namespace tessera {
namespace {

using namespace testing_support;
namespace fs = std::filesystem;

const char* kPreset = "SmolLM2-360M";

// Under ASan/UBSan the audit runs on the tiny-preset deploys (Presets/DeployTiny,
// Presets/NpusimDeployTiny); each tampering needs a deploy and an audit of its own, which is
// the Release run's (CI time).
#ifdef TESSERA_SANITIZED
#define SKIP_UNDER_SANITIZERS() GTEST_SKIP() << "tampering cases run in the Release build (CI time)"
#else
#define SKIP_UNDER_SANITIZERS() (void)0
#endif

// One deployment per target and fault set, made once per test process; each test audits a copy.
const fs::path& deployed(const std::string& target, FaultSet faults = {}) {
  static ScratchDir root("audit");
  static std::map<std::string, fs::path> made;
  std::string key = target;
  for (const std::string& f : faults) key += "+" + f;
  if (auto it = made.find(key); it != made.end()) return it->second;
  DeployOptions o = deploy_options(tiny_model(kPreset), root.str(key), faults);
  o.target = target;
  const DeployResult r = deploy(o);
  EXPECT_TRUE(r.pass) << key << ": phase " << r.failed_phase << ": " << r.diagnosis;
  return made[key] = root.path() / key;
}

fs::path copy_of(const fs::path& dep, const ScratchDir& out) {
  const fs::path to = out.path() / "dep";
  fs::copy(dep, to, fs::copy_options::recursive);
  return to;
}

// remeasure: wall-time figures re-measured (off where the test only needs the others: ctest
// runs two tests at once, so wall times do not reproduce).
AuditResult audit(const fs::path& dir, bool remeasure = false) {
  AuditOptions o;
  o.dir = dir.string();
  o.quiet = true;
  o.remeasure_wall_time = remeasure;
  return audit_deployment(o);
}

const AuditFinding* finding(const AuditResult& r, const std::string& check) {
  for (const AuditFinding& f : r.findings)
    if (f.check == check) return &f;
  return nullptr;
}

void expect_fails_on(const AuditResult& r, const std::string& check) {
  EXPECT_EQ(r.verdict(), "FAIL") << nlohmann::json(r.to_json()).dump(1);
  EXPECT_EQ(r.exit_code(), 3);
  const AuditFinding* f = finding(r, check);
  ASSERT_NE(f, nullptr) << check;
  EXPECT_EQ(f->verdict, "fail") << check << ": " << f->detail;
}

void edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = read_json_file(file);
  edit(j);
  write_json_atomic(file, j);
}

TEST(Audit, UntouchedDeploymentPassesAndWritesItsReport) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_clean");
  const fs::path dir = copy_of(deployed("cpu"), out);
  const AuditResult r = audit(dir);
  EXPECT_EQ(r.verdict(), "PASS") << r.to_json().dump(1);
  for (const char* check : {"provenance", "complete", "hashes", "thresholds", "phase3", "phase6", "op-counters", "adversarial",
                            "determinism", "figures"})
    EXPECT_NE(finding(r, check), nullptr) << check;
  EXPECT_NE(slurp(dir / "evaluation_report.md").find("**Verdict: PASS**"), std::string::npos);
}

TEST(Audit, DeploymentMadeWithAPerturbationIsNotPassed) {
  SKIP_UNDER_SANITIZERS();
  // A perturbation far below what any gate sees: every phase passes, yet the deployment is
  // a test of the gates, and the audit, issues.md and the report page say so.
  ScratchDir out("audit_perturbed");
  DeployOptions o = deploy_options(tiny_model(kPreset), out.str("dep"));
  o.perturbations = {"down_proj:gain:0.000001"};
  const DeployResult d = deploy(o);
  ASSERT_TRUE(d.pass) << d.diagnosis;
  const AuditResult r = audit(out.path() / "dep");
  expect_fails_on(r, "provenance");
  EXPECT_NE(finding(r, "provenance")->detail.find("down_proj:gain:"), std::string::npos) << finding(r, "provenance")->detail;
  EXPECT_NE(slurp(out.path() / "dep" / "issues.md").find("--perturb"), std::string::npos);
  const CliResult report = run_tessera("report " + (out.path() / "dep").string());
  EXPECT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(slurp(out.path() / "dep" / "report.html").find("This deployment was made with perturbation"), std::string::npos);
  // An untouched deployment's provenance passes.
  ScratchDir clean("audit_provenance_clean");
  EXPECT_EQ(finding(audit(copy_of(deployed("cpu"), clean)), "provenance")->verdict, "pass");
}

TEST(Audit, ReportFigureEditedUpwardFails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_figure");
  const fs::path dir = copy_of(deployed("npusim"), out);
  edit_json(dir / "report.json", [](nlohmann::json& r) {
    double& tps = r["figures"]["predicted"]["decode_tokens_per_s"].get_ref<double&>();
    tps *= 1.5;
  });
  const AuditResult r = audit(dir);
  expect_fails_on(r, "figures");  // the modelled figure does not reproduce
  expect_fails_on(r, "hashes");   // and report.json no longer hashes as recorded
}

TEST(Audit, CpuFigureEditedFarUpwardFailsEvenWithTheManifestRewritten) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_cpu_figure");
  const fs::path dir = copy_of(deployed("cpu"), out);
  edit_json(dir / "report.json", [](nlohmann::json& r) {
    double& tps = r["figures"]["phase6_target_timing"]["decode_tokens_per_s"].get_ref<double&>();
    tps *= 10;
  });
  // A forger who also rewrites the manifest is still caught by the re-measurement.
  Deployment dep = Deployment::open_existing(dir);
  write_json_atomic(dir / "manifest.json", deployment_manifest(dep, dep.identity()["model_path"]));
  expect_fails_on(audit(dir, true), "figures");
}

TEST(Audit, ThresholdLoosenedInTheStoredGateTableFails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_threshold");
  const fs::path dir = copy_of(deployed("cpu"), out);
  edit_json(dir / "phase3.json", [](nlohmann::json& p) {
    for (auto& c : p["gates"][0]["checks"])
      if (c["threshold"] == "phase3.layer_cosine_min") c["limit"] = 0.1;
  });
  const AuditResult r = audit(dir);
  expect_fails_on(r, "thresholds");
  EXPECT_NE(finding(r, "thresholds")->detail.find("phase3.layer_cosine_min"), std::string::npos);
}

// A limit derived for a kernel row (phase 1) may be tighter than its outer bound, never looser.
TEST(Audit, DerivedKernelLimitLoosenedPastItsOuterBoundFails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_derived");
  const fs::path dir = copy_of(deployed("cpu"), out);
  edit_json(dir / "phase1.json", [](nlohmann::json& p) {
    for (auto& c : p["gates"][0]["checks"])
      if (c["threshold"] == "derived:phase1.kernel.nmse_max") c["limit"] = 0.5;
  });
  const AuditResult r = audit(dir);
  expect_fails_on(r, "thresholds");
  EXPECT_NE(finding(r, "thresholds")->detail.find("looser than the outer bound"), std::string::npos)
      << finding(r, "thresholds")->detail;
}

TEST(Audit, PlanEditedAfterPhase6Fails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_plan");
  const fs::path dir = copy_of(deployed("npusim"), out);
  edit_json(dir / "plan.json", [](nlohmann::json& p) {
    nlohmann::json& zc = p["npusim"]["plan"]["zero_copy"];
    zc = !zc.get<bool>();
  });
  expect_fails_on(audit(dir), "hashes");
}

TEST(Audit, OpSilentlyExecutedByTheOracleFails) {
  SKIP_UNDER_SANITIZERS();
  // Every gate of the deploy passes: only the per-op counters show the oracle's hand.
  ScratchDir out("audit_oracle");
  const fs::path dir = copy_of(deployed("cpu", {"oracle-fallback"}), out);
  const AuditResult r = audit(dir);
  expect_fails_on(r, "op-counters");
  EXPECT_NE(finding(r, "op-counters")->detail.find("silu_mul ran"), std::string::npos) << finding(r, "op-counters")->detail;
  const auto d = run_tessera("diagnose " + dir.string() + " --quiet");  // the audit's failure, diagnosed
  EXPECT_TRUE(reports_cause(d.out, "oracle-fallback")) << d.out << d.err;
}

TEST(Audit, NonDeterministicOutputFails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_nondet");
  const fs::path dir = copy_of(deployed("npusim", {"nondeterministic"}), out);
  expect_fails_on(audit(dir), "determinism");
  const auto d = run_tessera("diagnose " + dir.string() + " --quiet");
  EXPECT_TRUE(reports_cause(d.out, "nondeterministic")) << d.out << d.err;
}

TEST(Audit, IncompleteDeploymentFails) {
  SKIP_UNDER_SANITIZERS();
  ScratchDir out("audit_incomplete");
  const fs::path dir = copy_of(deployed("cpu"), out);
  edit_json(dir / "state.json", [](nlohmann::json& s) { s["phases"]["6"]["status"] = "failed"; });
  expect_fails_on(audit(dir), "complete");
}

TEST(Audit, NotADeploymentIsAnError) {
  ScratchDir out("audit_none");
  AuditOptions o;
  o.dir = out.str("nothing");
  EXPECT_THROW(audit_deployment(o), Error);
}

}  // namespace
}  // namespace tessera
