// Phases 4 and 5: the optimization skills rewrite the plan, each rewrite gated and measured,
// reverted when it breaks the numbers or is not faster, every step in perf_opt_traj.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "targets/npusim/npusim_runner.h"
#include "targets/npusim/plans.h"
#include "targets/cpu/cpu_runner.h"
#include "targets/registry.h"
#include "targets/cpu/kernels.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::deploy_options;
using testing_support::ScratchDir;
using testing_support::slurp;
using testing_support::tiny_model;
namespace fs = std::filesystem;

// The steps phase `id` recorded, as (skill, result) pairs.
std::vector<std::pair<std::string, std::string>> steps(const fs::path& dep, int id) {
  std::vector<std::pair<std::string, std::string>> out;
  const nlohmann::json phase = read_json_file(dep / fmt::format("phase{}.json", id));  // (not a temporary in the loop)
  for (const auto& s : phase["details"]["steps"])
    out.emplace_back(s["skill"].get<std::string>(), s["result"].get<std::string>());
  return out;
}

// A tiny preset deployed on `target` from the named `plan`.
DeployOptions from_plan(const std::string& target, const std::string& plan, const std::string& preset, const std::string& out,
                        FaultSet faults = {}) {
  DeployOptions o = deploy_options(tiny_model(preset), out, std::move(faults));
  o.target = target;
  o.plan_name = plan;
  return o;
}

bool has_step(const std::vector<std::pair<std::string, std::string>>& steps, const std::string& skill, const std::string& prefix) {
  for (const auto& [k, r] : steps)
    if (k == skill && r.rfind(prefix, 0) == 0) return true;
  return false;
}

// From cpu-naive, merge is tried for each pass; every step is gated and logged, and the plan
// the phases hand to phase 6 is the one they kept.
TEST(Optimize, CpuPhasesTryMergeFromTheNaivePlan) {
  ScratchDir out("opt_cpu");
  DeployOptions o = from_plan("cpu", "cpu-naive", "SmolLM2-360M", out.str("dep"));
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const fs::path dep = out.path() / "dep";
  for (int id : {4, 5}) {
    const auto s = steps(dep, id);
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s[0].first, "merge");  // the skills in their order: merge, then tile-tune
    // Kept or not depends on the machine's timing; either way the gate ran and passed, and a
    // wall-time decision says how many of its interleaved rounds the rewrite won.
    EXPECT_TRUE(s[0].second.rfind("kept (", 0) == 0 || s[0].second.rfind("reverted: faster in ", 0) == 0) << s[0].second;
    EXPECT_NE(s[0].second.find("interleaved rounds"), std::string::npos) << s[0].second;
    for (const auto& [skill, result] : s) EXPECT_TRUE(skill == "merge" || skill == "tile-tune") << skill;
  }
  // tile-tune searches the prefill GEMM's blocking where the kernel path has one (not the
  // portable path: TESSERA_ISA=hwy); decode has none to search.
  if (cpu::gemm_has_cache_blocking())
    EXPECT_TRUE(has_step(steps(dep, 4), "tile-tune", "kept") || has_step(steps(dep, 4), "tile-tune", "reverted: faster in "));
  else
    EXPECT_TRUE(has_step(steps(dep, 4), "tile-tune", "skipped"));
  EXPECT_TRUE(has_step(steps(dep, 5), "tile-tune", "skipped"));
  const std::string traj = slurp(dep / "perf_opt_traj.md");
  EXPECT_NE(traj.find("## Phase 4: prefill"), std::string::npos) << traj;
  EXPECT_NE(traj.find("## Phase 5: decode"), std::string::npos) << traj;
  EXPECT_NE(traj.find("| merge | fuse q\\|k\\|v"), std::string::npos) << traj;
  // The frozen plan records the fusion per pass the phases settled on, and its name says so.
  const nlohmann::json plan = read_json_file(dep / "plan.json");
  const bool fp = plan["cpu"]["kernels"]["fused_linears"]["prefill"], fd = plan["cpu"]["kernels"]["fused_linears"]["decode"];
  EXPECT_EQ(plan["name"], cpu_plan_name(fp, fd));
  EXPECT_TRUE(plan["frozen"].get<bool>());
  EXPECT_TRUE(plan["optimized"].contains("prefill") && plan["optimized"].contains("decode")) << plan["optimized"];
  // The validated starting plan is kept aside.
  EXPECT_EQ(read_json_file(dep / "plan_validated.json")["name"], "cpu-naive");
  const nlohmann::json report = read_json_file(dep / "report.json");
  EXPECT_TRUE(report["optimization"].contains("4") && report["optimization"].contains("5"));
}

// A rewrite that breaks the numbers is reverted: fused-qkv-swap leaves cpu-naive's kernels
// alone (phases 0-3 pass) but corrupts the fused kernel the merge rewrite turns on.
TEST(Optimize, CpuRewriteThatBreaksTheNumbersIsReverted) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (a whole deploy; Optimize.CpuPhasesTryMerge* runs the cpu optimizer under sanitizers)";
#endif
  ScratchDir out("opt_cpu_bad");
  DeployOptions o = from_plan("cpu", "cpu-naive", "SmolLM2-360M", out.str("dep"), {"fused-qkv-swap"});
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const fs::path dep = out.path() / "dep";
  for (int id : {4, 5})
    EXPECT_TRUE(has_step(steps(dep, id), "merge", "reverted: the gate failed")) << id << slurp(dep / "perf_opt_traj.md");
  const nlohmann::json plan = read_json_file(dep / "plan.json");
  EXPECT_EQ(plan["name"], "cpu-naive");
  EXPECT_NE(slurp(dep / "perf_opt_traj.md").find("| FAIL | reverted: the gate failed"), std::string::npos);
}

// npusim from naive: promote, merge, buffer-reuse and zero-copy are tried in order; the
// decisions follow the timing model (deterministic), and the plan that reaches phase 6 is
// the optimized one.
TEST(Optimize, NpusimFromNaiveReachesAFasterPlan) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (Optimize.NpusimMerge* runs the same phases from naive under sanitizers)";
#endif
  ScratchDir out("opt_npu");
  DeployOptions o = from_plan("npusim", "naive", "Llama-3.2-1B", out.str("dep"));
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const fs::path dep = out.path() / "dep";
  const auto p4 = steps(dep, 4), p5 = steps(dep, 5);
  const std::string traj = slurp(dep / "perf_opt_traj.md");
  // promote is tried first; whether moving a host op onto the array pays is the model's call.
  EXPECT_TRUE(has_step(p4, "promote", "kept") || has_step(p4, "promote", "reverted: not faster")) << traj;
  EXPECT_TRUE(has_step(p4, "merge", "kept"));
  EXPECT_TRUE(has_step(p4, "zero-copy", "kept"));
  EXPECT_TRUE(has_step(p5, "merge", "kept"));
  EXPECT_TRUE(has_step(p5, "zero-copy", "skipped")) << "phase 4 mapped the buffers already";
  // The prediction comes first on npusim: a rewrite it does not make faster skips the gate.
  for (const auto& st : read_json_file(dep / "phase4.json")["details"]["steps"])
    if (st.value("result", "") == "reverted: not faster") {
      EXPECT_EQ(st.value("gate", ""), "not run") << st.dump();
    }
  const nlohmann::json d4 = read_json_file(dep / "phase4.json")["details"], d5 = read_json_file(dep / "phase5.json")["details"];
  EXPECT_LT(d4["final_s"].get<double>(), d4["start_s"].get<double>());
  EXPECT_LT(d5["final_s"].get<double>(), d5["start_s"].get<double>());
  // What phase 6 ran and froze is phase 5's plan: its predicted figures are the final ones.
  const nlohmann::json plan = read_json_file(dep / "plan.json");
  EXPECT_EQ(plan["name"], "naive+opt");
  EXPECT_EQ(plan["npusim"]["plan"]["name"], "naive+opt");
  const nlohmann::json predicted = read_json_file(dep / "report.json")["figures"]["predicted"];
  EXPECT_NEAR(predicted["decode_ms_per_token"].get<double>(), d5["final_s"].get<double>() * 1e3, 1e-6);
  // The rewritten plan is a plan the target reads back as is.
  const npusim::NpuPlan np = npusim::plan_from_json(plan["npusim"]["plan"]);
  EXPECT_EQ(np.dispatches_per_layer(false), 1);
  EXPECT_TRUE(np.zero_copy);
}

// The merge rewrite lowered without the residual add's wait for the O projection (the add
// reads `o` as the dispatch call began) fails phase 4's gate through the executor's own
// semantics and is reverted; the deployment passes on the unmerged plan.
TEST(Optimize, NpusimMergeThatBreaksTheNumbersIsReverted) {
  ScratchDir out("opt_npu_bad");
  DeployOptions o = from_plan("npusim", "naive", "SmolLM2-360M", out.str("dep"), {"merged-stale-intermediate"});
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const fs::path dep = out.path() / "dep";
  EXPECT_TRUE(has_step(steps(dep, 4), "merge", "reverted: the gate failed"));
  EXPECT_TRUE(has_step(steps(dep, 5), "merge", "reverted: the gate failed"));
  // The debug skills ran on the reverted rewrite and name the fault, alone.
  for (const int id : {4, 5})
    for (const auto& [skill, result] : steps(dep, id))
      if (result.starts_with("reverted: the gate failed")) {
        EXPECT_TRUE(result.ends_with("(named cause: merged-stale-intermediate)")) << skill << ": " << result;
      }
  const std::string issues = slurp(dep / "issues.md");
  EXPECT_NE(issues.find("Named cause(s): merged-stale-intermediate"), std::string::npos);
  // The stale data came from the executor (the merge was lowered without the add's wait), and
  // the diagnosis names the dispatch and the buffer.
  EXPECT_NE(issues.find("buffer `o`"), std::string::npos) << issues;
  EXPECT_NE(issues.find("dispatch `layer."), std::string::npos) << issues;
  const npusim::NpuPlan np = npusim::plan_from_json(read_json_file(dep / "plan.json")["npusim"]["plan"]);
  EXPECT_FALSE(np.shares_dispatch(Stage::OProj, Stage::AttnResidual, false));
  EXPECT_FALSE(np.shares_dispatch(Stage::OProj, Stage::AttnResidual, true));
}

// The buffer-reuse rewrite with an allocator that ends live ranges at the producer (the O
// projection writes o over the attention output it still reads): phase 4's gate fails
// through the executor's shared memory-tile bytes, the rewrite is reverted, and the
// reused-live-buffer skill names the dispatch and the two buffers.
TEST(Optimize, NpusimReuseWhileLiveIsReverted) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (a whole deploy of the 128k-vocabulary Llama; Optimize.NpusimMerge* runs the npusim optimizer under sanitizers)";
#endif
  ScratchDir out("opt_npu_reuse");
  DeployOptions o = from_plan("npusim", "baseline", "Llama-3.2-1B", out.str("dep"), {"reuse-while-live"});
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const fs::path dep = out.path() / "dep";
  bool reverted = false;
  for (const auto& [skill, result] : steps(dep, 4))
    if (skill == "buffer-reuse" && result.starts_with("reverted: the gate failed")) {
      reverted = true;
      EXPECT_TRUE(result.ends_with("(named cause: reuse-while-live)")) << result;
    }
  EXPECT_TRUE(reverted);
  const std::string issues = slurp(dep / "issues.md");
  EXPECT_NE(issues.find("buffer `attn`"), std::string::npos) << issues;
  EXPECT_NE(issues.find("overwritten by `o`"), std::string::npos) << issues;
  const npusim::NpuPlan np = npusim::plan_from_json(read_json_file(dep / "plan.json")["npusim"]["plan"]);
  EXPECT_FALSE(np.intermediates_on_device);
}

// --from-phase 4 starts again from the plan phases 1-3 validated, not from the one phase 6 froze.
TEST(Optimize, FromPhase4StartsFromTheValidatedPlan) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (two deploys; the code paths are the other tests')";
#endif
  ScratchDir out("opt_again");
  DeployOptions o = from_plan("npusim", "naive", "SmolLM2-360M", out.str("dep"));
  ASSERT_TRUE(deploy(o).pass);
  const fs::path dep = out.path() / "dep";
  const nlohmann::json first = read_json_file(dep / "plan.json");
  o.from_phase = 4;
  ASSERT_TRUE(deploy(o).pass);
  EXPECT_EQ(read_json_file(dep / "phase4.json")["details"]["start_plan"], "naive");
  // The model's figures are deterministic: the same path, the same plan.
  EXPECT_EQ(read_json_file(dep / "plan.json")["npusim"], first["npusim"]);
  // --from-phase 5 starts from phase 4's result (the same start figure as the first time),
  // not from the plan phase 5 itself produced.
  const nlohmann::json d5 = read_json_file(dep / "phase5.json")["details"];
  o.from_phase = 5;
  ASSERT_TRUE(deploy(o).pass);
  EXPECT_EQ(read_json_file(dep / "phase5.json")["details"]["start_s"], d5["start_s"]);
  EXPECT_EQ(read_json_file(dep / "phase5.json")["details"]["steps"], d5["steps"]);
  EXPECT_EQ(read_json_file(dep / "plan.json")["npusim"], first["npusim"]);
}

}  // namespace
}  // namespace tessera
