// The gated pipeline end to end on the cpu target: every tiny preset and the real default
// model deploy with every gate passing; each injected fault is caught by the phase that
// must catch it and phase 2's bisect names its kernel; interruption and --from-phase
// resume without losing work; a deployment edited after the fact is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "model/presets.h"
#include "eval/audit.h"
#include "faults/catalogue.h"
#include "faults/injection.h"
#include "pipeline/deploy.h"
#include "pipeline/executor.h"
#include "synth/synth.h"
#include "targets/registry.h"
#include "util/error.h"
#include "test_support.h"

namespace tessera {
namespace {

using testing_support::run_tessera;
using testing_support::slurp;
using testing_support::deploy_options;
using testing_support::ScratchDir;
using testing_support::tiny_model;
using testing_support::named_causes;
using testing_support::names_cause;
namespace fs = std::filesystem;

bool have_default_model() { return fs::exists(testing_support::default_gguf()); }

class DeployTiny : public ::testing::TestWithParam<std::string> {};

TEST_P(DeployTiny, EveryGatePasses) {
  ScratchDir out("deploy");
  const DeployResult r = deploy(deploy_options(tiny_model(GetParam()), out.str("dep")));
  EXPECT_TRUE(r.pass) << "phase " << r.failed_phase << ": " << r.diagnosis;
  const Deployment dep = Deployment::open_existing(out.str("dep"));
  for (int id : {0, 1, 2, 3, 6}) EXPECT_EQ(dep.phase_status(id), "passed") << "phase " << id;
  for (const char* f : {"state.json", "plan.json", "plan.md", "kernel_registry.md", "kernel_registry.json", "phase_timing.md",
                        "report.json", "gates.md", "issues.md", "manifest.json"})
    EXPECT_TRUE(fs::exists(out.path() / "dep" / f)) << f;
  // Phase 7: the independent evaluator passes the untouched deployment.
  testing_support::expect_audit_passes(out.str("dep"));
}

std::vector<std::string> tiny_presets() {
#ifdef TESSERA_SANITIZED
  // Under ASan/UBSan (several times slower) one preset, deployed and audited (CI time);
  // the Release run deploys and audits all eleven.
  return {"SmolLM2-360M"};  // every stage's kernel and the audit once; the families in Release
#else
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
#endif
}
INSTANTIATE_TEST_SUITE_P(Presets, DeployTiny, ::testing::ValuesIn(tiny_presets()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// The README's main job: the real default model deploys, and the deployment answers.
TEST(Deploy, DefaultModelDeploysAndRunsFromTheDeployment) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the real model end to end is the Release run's; tiny presets cover the same code under sanitizers";
#endif
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  ScratchDir out("deploy_default");
  auto r = run_tessera("deploy --out " + out.str("dep") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* row : {"| 0 | oracle | passed |", "| 1 | kernels | passed |", "| 2 | block | passed |", "| 3 | model | passed |",
                          "| 6 | integrate | passed |"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_EQ(slurp(out.path() / "dep" / "gates.md").find("| FAIL |"), std::string::npos);
  auto run = run_tessera("run " + out.str("dep") + " --chat --prompt 'What is the capital of France?' -n 12 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto j = nlohmann::json::parse(run.out);
  EXPECT_NE(j["text"].get<std::string>().find("Paris"), std::string::npos) << j["text"];
  EXPECT_EQ(j["executor"], "cpu");
  EXPECT_EQ(j["source"], out.str("dep"));
}

// ---- faults: the first phase that must catch each one does, and bisect names the kernel

struct FaultCase {
  std::string fault;
  std::string preset;  // a model where the fault changes the numbers at all
  // Whether phase 2's bisect must name the fault's stage: not where one block shows the
  // fault too faintly to single a stage out, or not at all (layer 0's block cannot show
  // layers sharing layer 0's cache rows); phase 1 and the debug skills name it.
  bool bisect = true;
};

class DeployFault : public ::testing::TestWithParam<FaultCase> {};

std::string fault_case_name(const ::testing::TestParamInfo<FaultCase>& info) {
  std::string n = info.param.fault;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

TEST_P(DeployFault, CaughtByItsPhaseAndNamedByBisect) {
  const FaultCase& c = GetParam();
  const FaultInfo& info = target_fault_info("cpu", c.fault);
  ScratchDir out("fault");
  const std::string model_path = tiny_model(c.preset);
  const DeployResult r = deploy(deploy_options(model_path, out.str("dep"), {c.fault}));
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failed_phase, info.first_phase) << c.fault << ": " << r.diagnosis;
  const Deployment dep = Deployment::open_existing(out.str("dep"));
  for (int id = 0; id < info.first_phase; ++id)
    if (phase_def(id).implemented()) {
      EXPECT_EQ(dep.phase_status(id), "passed") << "phase " << id;
    }
  EXPECT_TRUE(fs::exists(out.path() / "dep" / "issues.md"));
  // The debug skills that match the failure ran by themselves and name the fault first, and
  // no other fault (error-shape may add what the error looks like).
  const std::string issues = slurp(out.path() / "dep" / "issues.md");
  const std::vector<std::string> causes = named_causes(issues);
  ASSERT_FALSE(causes.empty()) << issues;
  EXPECT_EQ(causes.front(), c.fault) << issues;
  for (const std::string& cause : causes)
    for (const FaultInfo& f : target_faults("cpu"))
      if (cause == f.name) {
        EXPECT_EQ(cause, c.fault) << issues;
      }
  // `tessera diagnose DIR` runs them again on demand (a second process: the Release run's).
#ifndef TESSERA_SANITIZED
  const auto again = run_tessera("diagnose " + out.str("dep") + " --quiet");
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(names_cause(again.out, c.fault)) << again.out;
#endif

  // Phase 2's bisect on this fault (run directly: a phase-1 catch stops the pipeline first),
  // where one block can show it: not the LM head (outside the block), not a fault only
  // later phases see (the debug skills named those above).
  if (info.first_phase > 2 || info.kernel == "lm_head" || !c.bisect) return;
  Model model = Model::open(model_path);
  DeployOptions o = deploy_options(model_path, out.str("dep"), {c.fault});
  Deployment d2 = Deployment::open_existing(out.str("dep"));
  PhaseContext ctx(d2, model, o);
  const BisectResult b = bisect_block(ctx);
  EXPECT_TRUE(b.stage == info.kernel || b.kernel == info.kernel)
      << c.fault << ": bisect named " << b.stage << " (" << b.kernel << "), expected " << info.kernel << "\n" << b.text();
  // Without the fault the same block passes: the experiment itself is sound.
  DeployOptions clean = deploy_options(model_path, out.str("dep"));
  PhaseContext ctx_clean(d2, model, clean);
  EXPECT_TRUE(run_phase2_block(ctx_clean).pass);
}

std::vector<FaultCase> earlier_fault_cases() {
#ifdef TESSERA_SANITIZED
  // Under ASan/UBSan (several times slower): one fault phase 1 catches and one phase 2
  // catches, each through bisect and the debug skills; the Release run deploys every one.
  return {{"rope-interleaved", "SmolLM2-360M"}, {"stale-kv", "SmolLM2-360M"}};
#else
  return {{"rope-interleaved", "SmolLM2-360M"}, {"rope-scaling-prefill-only", "Llama-3.2-1B"},
          {"drop-qkv-bias", "Qwen2.5-0.5B"},    {"qk-norm-after-rope", "Qwen3-0.6B"},
          {"gqa-modulo", "Qwen3-0.6B"},         {"attn-scale-hidden", "Qwen3-0.6B"},
          {"stale-kv", "SmolLM2-360M"},         {"bf16-accumulate", "SmolLM2-360M"},
          {"fused-qkv-swap", "SmolLM2-360M"}};
#endif
}
INSTANTIATE_TEST_SUITE_P(Faults, DeployFault, ::testing::ValuesIn(earlier_fault_cases()), fault_case_name);

// One more fault per row of porting-pitfalls.md (rows 1-10, 12, 13 here; 11 on npusim),
// each named by the debug skills. Several times slower under ASan/UBSan: the Release run's.
#ifndef TESSERA_SANITIZED
INSTANTIATE_TEST_SUITE_P(
    PitfallFaults, DeployFault,
    ::testing::Values(FaultCase{"qk-rows-permuted", "SmolLM2-360M"}, FaultCase{"rope-scaling-missing", "Llama-3.2-1B", false},
                      FaultCase{"qkv-bias-after-rope", "Qwen2.5-0.5B", false}, FaultCase{"qk-norm-whole-projection", "Qwen3-0.6B"},
                      FaultCase{"attn-scale-no-sqrt", "Qwen3-0.6B"}, FaultCase{"gqa-head0", "Qwen3-0.6B"},
                      FaultCase{"lm-head-untied", "SmolLM2-360M"}, FaultCase{"mask-off-by-one", "SmolLM2-360M"},
                      FaultCase{"kv-layer-aliased", "SmolLM2-360M", false}, FaultCase{"softmax-unshifted", "SmolLM2-360M", false},
                      FaultCase{"double-bos", "Llama-3.2-1B", false}, FaultCase{"eos-first-only", "SmolLM2-360M"}),
    fault_case_name);
#endif

TEST(Deploy, EveryKnownFaultHasACase) {
  // The list above must cover the porting faults; a new fault without a test fails here. The
  // evaluator's faults (first phase 7) have theirs in test_audit.cc.
  const std::set<std::string> covered = {"rope-interleaved", "rope-scaling-prefill-only", "drop-qkv-bias", "qk-norm-after-rope",
                                         "gqa-modulo", "attn-scale-hidden", "stale-kv", "bf16-accumulate", "fused-qkv-swap",
                                         "qk-rows-permuted", "rope-scaling-missing", "qkv-bias-after-rope",
                                         "qk-norm-whole-projection", "attn-scale-no-sqrt", "gqa-head0", "lm-head-untied",
                                         "mask-off-by-one", "kv-layer-aliased", "softmax-unshifted", "double-bos", "eos-first-only",
                                         "oracle-fallback",
                                         "nondeterministic"};
  for (const FaultInfo& f : porting_faults()) EXPECT_TRUE(covered.count(f.name)) << f.name;
}

// Phase 0's tokenizer row on a bad input: a fixture whose text no longer gives its ids (the
// ids, and so the logits rows, are untouched) fails, and the prompt-ids skill names it.
TEST(Deploy, FixtureTextTokenizedDifferentlyFailsPhase0) {
  ScratchDir out("fxtext");
  const fs::path ref = out.path() / "ref" / "SmolLM2-360M";
  fs::create_directories(ref.parent_path());
  fs::copy(fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "oracle" / "SmolLM2-360M", ref, fs::copy_options::recursive);
  nlohmann::json fx = read_json_file(ref / "fixture.json");
  fx["prompts"][0]["text"] = fx["prompts"][0]["text"].get<std::string>() + " today";
  write_json_atomic(ref / "fixture.json", fx);
  DeployOptions o = deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"));
  o.reference_dir = (out.path() / "ref").string();
  const DeployResult r = deploy(o);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failed_phase, 0);
  const std::string issues = slurp(out.path() / "dep" / "issues.md");
  EXPECT_NE(issues.find("texts_tokenized_differently 1 == 0 FAIL"), std::string::npos) << issues;
  EXPECT_EQ(named_causes(issues), std::vector<std::string>{"tokenizer differs from transformers"}) << issues;
}

TEST(Deploy, UnknownFaultIsRefused) {
  auto r = run_tessera("deploy --inject rope-sideways --out /tmp/never");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown fault 'rope-sideways'"), std::string::npos) << r.err;
}

// ---- the target registry: the pipeline makes runners only through it

TEST(Targets, RegistryMakesCpuAndRefusesWhatNoTargetHas) {
  const std::vector<std::string> names = target_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "cpu");  // the default
  // The cpu has no faults of its own: it takes the porting faults, in order; npusim its own
  // mapping faults first, then the same porting faults.
  ASSERT_EQ(target_faults("cpu").size(), porting_faults().size());
  for (size_t i = 0; i < porting_faults().size(); ++i) EXPECT_EQ(target_faults("cpu")[i].name, porting_faults()[i].name);
  EXPECT_EQ(target_faults("npusim").size(), target_def("npusim").faults().size() + porting_faults().size());
  EXPECT_TRUE(is_targets_own_fault("npusim", "l1-overflow"));
  EXPECT_FALSE(is_targets_own_fault("npusim", "stale-kv"));
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([] { target_def("tpu"); }).find("unknown target 'tpu' (targets: cpu"), std::string::npos);
  EXPECT_NE(message([] { target_fault_info("cpu", "rope-sideways"); }).find("stale-kv"), std::string::npos);
  TargetOptions bad_device;
  bad_device.device = "xdna2";
  EXPECT_THROW(check_target_options("cpu", bad_device), Error);
  TargetOptions bad_plan;
  bad_plan.plan_name = "paper";
  EXPECT_THROW(check_target_options("cpu", bad_plan), Error);

  // A runner from the registry is the generic StagedRunner the phases drive.
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  TargetOptions o;
  o.threads = 2;
  const std::unique_ptr<StagedRunner> r = make_runner_with_faults("cpu", model, o, {"stale-kv"});
  EXPECT_EQ(r->target(), "cpu");
  EXPECT_EQ(r->description().rfind("cpu (", 0), 0u) << r->description();
  EXPECT_NE(r->description().find("2 threads"), std::string::npos) << r->description();
  const nlohmann::json plan = r->build_plan(model);
  EXPECT_EQ(plan["name"], "cpu-fused");  // the default plan
  EXPECT_EQ(plan["dispatches"].size(), size_t(3 + model.spec().n_layers * int64_t(layer_stages().size())));
  EXPECT_GT(r->weight_bytes_per_token(), 0);
  EXPECT_GT(r->kv_bytes_per_position(), 0);
  EXPECT_THROW(make_runner_with_faults("cpu", model, o, {"no-such-fault"}), Error);
  o.faults = {"stale-kv"};  // the registry takes a target's own faults only: the others are applied from outside
  EXPECT_THROW(make_target_runner("cpu", model, o), Error);
}

// Deploy options name a plan and a device only when asked: the identity (state.json) of a
// default deployment is what it always was, and a deployment refuses another device.
// Phases and targets are registry entries: a toy phase and a toy target, registered here,
// run in a deploy with no change to the deploy loop.
PhaseOutcome run_toy_phase(PhaseContext& ctx) {
  PhaseOutcome o;
  gates::GateResult g;
  g.gate = "phase8.toy";
  g.subject = "the toy phase saw the target " + ctx.target().target();
  g.require_fixed("phases_before_passed", double(phase_done(ctx.dep.phase_status(6))), "==", 1);
  o.gates.push_back(g);
  o.pass = g.pass();
  o.summary = "toy phase ran after phase 6";
  return o;
}
void record_toy_phase(Deployment& dep, PhaseContext&, const PhaseOutcome& o) {
  write_file_atomic(dep.file("toy.txt"), o.summary + "\n");
}

TEST(Registries, AToyPhaseAndAToyTargetRunInADeploy) {
  register_phase({8, "toy", "a phase a test registers", run_toy_phase, record_toy_phase});
  EXPECT_THROW(register_phase({8, "again", "the same id"}), Error);
  TargetDef toy = target_def("cpu");
  toy.name = "toy";  // the cpu's runner under another name: what the loop knows of a target is its entry
  register_target(toy);
  EXPECT_THROW(register_target(toy), Error);
  ScratchDir out("registries");
  DeployOptions o = deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"));
  o.target = "toy";
  const DeployResult r = deploy(o);
  ASSERT_TRUE(r.pass) << r.diagnosis;
  const Deployment dep = Deployment::open_existing(out.str("dep"));
  EXPECT_EQ(dep.identity()["target"], "toy");
  EXPECT_EQ(dep.phase_status(8), "passed");
  EXPECT_EQ(slurp(out.path() / "dep" / "toy.txt"), "toy phase ran after phase 6\n");
  EXPECT_NE(slurp(out.path() / "dep" / "gates.md").find("the toy phase saw the target cpu"), std::string::npos);
}

TEST(Targets, DeploymentIdentityCarriesPlanAndDeviceOnlyWhenChosen) {
  const Model model = Model::open(tiny_model("SmolLM2-360M"));
  DeployOptions o = deploy_options(model.path(), "unused");
  nlohmann::json id = deployment_identity(model, o);
  EXPECT_FALSE(id.contains("plan"));
  EXPECT_FALSE(id.contains("device"));
  o.device = "xdna2";
  o.plan_name = "paper";
  id = deployment_identity(model, o);
  EXPECT_EQ(id["device"], "xdna2");
  EXPECT_EQ(id["plan"], "paper");
  // The cpu has neither: refused before the deployment directory is made.
  ScratchDir out("deploy_device");
  DeployOptions on_device = deploy_options(model.path(), out.str("dep"));
  on_device.device = "xdna2";
  EXPECT_THROW(deploy(on_device), Error);
  EXPECT_FALSE(fs::exists(out.path() / "dep"));
}

// ---- resume

TEST(Deploy, KilledInPhase3ResumesWithoutLosingWork) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the real model end to end is the Release run's; tiny presets cover the same code under sanitizers";
#endif
  if (!have_default_model()) GTEST_SKIP() << "run scripts/setup.sh";
  ScratchDir out("resume");
  const std::string dir = out.str("dep");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(TESSERA_BINARY, TESSERA_BINARY, "deploy", "--out", dir.c_str(), "--quiet", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill it as soon as phase 3 has finished its first prompt (and before it finishes).
  const fs::path first = fs::path(dir) / "phase3" / "prompt_0.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!fs::exists(first) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(first)) << "phase 3 never started";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the deploy finished before it could be killed";
  const Deployment killed = Deployment::open_existing(dir);
  EXPECT_EQ(killed.phase_status(2), "passed");
  EXPECT_EQ(killed.phase_status(3), "running");

  auto r = run_tessera("deploy --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("phase 2 block: passed in an earlier run (resumed)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed from disk"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("prompt 1/"), std::string::npos) << "prompt 1 was redone:\n" << r.err;
  // Said on stderr, not recorded: the resumed deployment's record is an uninterrupted one's.
  const std::string summary = Deployment::open_existing(dir).phase_record(3).value("summary", "");
  EXPECT_EQ(summary.find("resumed"), std::string::npos) << summary;
}

TEST(Deploy, FromPhaseRerunsThatPhaseAndLater) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "pipeline bookkeeping on whole deploys: the Release run's (CI time)";
#endif
  ScratchDir out("from");
  const std::string model = tiny_model("SmolLM2-360M");
  ASSERT_TRUE(deploy(deploy_options(model, out.str("dep"))).pass);
  const std::string before = Deployment::open_existing(out.str("dep")).phase_record(1).value("finished", "");
  DeployOptions o = deploy_options(model, out.str("dep"));
  o.from_phase = 3;
  ASSERT_TRUE(deploy(o).pass);
  const Deployment dep = Deployment::open_existing(out.str("dep"));
  EXPECT_EQ(dep.phase_record(1).value("finished", ""), before) << "phase 1 should not have re-run";
  for (int id : {3, 6}) EXPECT_EQ(dep.phase_status(id), "passed");
}

// ---- a deployment is bound to its model and its frozen plan

TEST(Deploy, RunRefusesAnEditedPlan) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "pipeline bookkeeping on whole deploys: the Release run's (CI time)";
#endif
  ScratchDir out("edited");
  const std::string model = tiny_model("SmolLM2-360M");
  ASSERT_TRUE(deploy(deploy_options(model, out.str("dep"))).pass);
  EXPECT_EQ(run_tessera("run " + out.str("dep") + " --prompt hi -n 2").exit_code, 0);
  nlohmann::json plan = read_json_file(out.path() / "dep" / "plan.json");
  plan["cpu"]["threads"] = 64;
  write_json_atomic(out.path() / "dep" / "plan.json", plan);
  auto r = run_tessera("run " + out.str("dep") + " --prompt hi -n 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not the plan phase 6 froze"), std::string::npos) << r.err;
}

TEST(Deploy, RefusesADirectoryOfAnotherDeployment) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "pipeline bookkeeping on whole deploys: the Release run's (CI time)";
#endif
  ScratchDir out("other");
  ASSERT_TRUE(deploy(deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"))).pass);
  EXPECT_THROW(deploy(deploy_options(tiny_model("Qwen3-0.6B"), out.str("dep"))), Error);
  EXPECT_THROW(deploy(deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"), {"stale-kv"})), Error);
}

TEST(Deploy, RunRefusesAnUnfinishedDeployment) {
  ScratchDir out("unfinished");
  deploy(deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"), {"stale-kv"}));  // stops at phase 2
  auto r = run_tessera("run " + out.str("dep") + " --prompt hi -n 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has not passed phase 6"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
