// Every phase gate fed a bad input fails: a NaN weight and a wrong reference for phase 0,
// and for phases 2, 3 and 6 the target made wrong on purpose (each phase run on its own,
// so an earlier gate cannot stop it first). Phase 1's rows are failed by the fault tests
// in test_deploy.cc; the metrics themselves by test_gates.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "pipeline/deploy.h"
#include "synth/synth.h"
#include "test_support.h"
#include "util/npy.h"

namespace tessera {
namespace {

using testing_support::deploy_options;
using testing_support::ScratchDir;
using testing_support::CliResult;
using testing_support::run_tessera;
namespace fs = std::filesystem;

std::string synth_tiny(const ScratchDir& dir, const std::string& preset) {
  SynthOptions o;
  o.preset = preset;
  o.tiny = true;
  o.out_dir = dir.str("model");
  synth(o);
  return o.out_dir;
}

// Overwrites the first value of `tensor` in a single-file safetensors checkpoint.
void poke_bf16(const std::string& file, const std::string& tensor, uint16_t bits) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const auto j = nlohmann::json::parse(header);
  const uint64_t at = 8 + n + j[tensor]["data_offsets"][0].get<uint64_t>();
  f.seekp(std::streamoff(at));
  f.write(reinterpret_cast<const char*>(&bits), 2);
}

TEST(PhaseGates, Phase0FailsOnANanWeight) {
  ScratchDir dir("p0nan");
  const std::string model = synth_tiny(dir, "SmolLM2-360M");
  poke_bf16(model + "/model.safetensors", "model.layers.1.mlp.down_proj.weight", 0x7FC0);  // bf16 NaN
  const DeployResult r = deploy(deploy_options(model, dir.str("dep")));
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failed_phase, 0);
  const auto p0 = read_json_file(dir.path() / "dep" / "phase0.json");
  EXPECT_EQ(p0["details"]["nonfinite_tensors"][0]["tensor"], "model.layers.1.mlp.down_proj.weight");
}

TEST(PhaseGates, Phase0FailsAgainstAWrongReference) {
  ScratchDir dir("p0ref");
  const std::string model = synth_tiny(dir, "SmolLM2-360M");
  // A copy of the true fixture whose hidden states are scrambled (same shape, same hash).
  const fs::path src = fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "oracle" / "SmolLM2-360M";
  ASSERT_TRUE(fs::exists(src / "fixture.json"));
  const fs::path ref = dir.path() / "ref" / "SmolLM2-360M";
  fs::create_directories(ref);
  fs::copy(src / "fixture.json", ref / "fixture.json");
  fs::copy(src / "logits.npy", ref / "logits.npy");
  NpyArray hidden = read_npy((src / "hidden.npy").string());
  std::reverse(hidden.data.begin(), hidden.data.end());
  write_npy((ref / "hidden.npy").string(), hidden.data.data(), hidden.shape);

  DeployOptions o = deploy_options(model, dir.str("dep"));
  o.reference_dir = (dir.path() / "ref").string();
  const DeployResult r = deploy(o);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failed_phase, 0);

  // The untouched fixture passes: the gate failed on the reference, not on the harness.
  o.reference_dir = src.parent_path().string();
  o.out_dir = dir.str("dep2");
  o.from_phase = -1;
  DeployOptions only0 = o;
  Model m = Model::open(model);
  Deployment dep = Deployment::open_for_deploy(o.out_dir, deployment_identity(m, o));
  PhaseContext ctx(dep, m, o);
  const PhaseOutcome ok = run_phase0_oracle(ctx);
  EXPECT_TRUE(ok.pass) << ok.summary;
  EXPECT_TRUE(ok.status.empty()) << ok.status;  // passed, not merely unverified
  EXPECT_TRUE(ok.summary.starts_with("verified: ")) << ok.summary;
}

// A checkpoint no reference was made for (another seed): phase 0's own checks pass, but its
// status is "unverified", never "passed"; the deploy goes on and says so in its summary, in
// report.json, on `tessera run`'s first line, and the audit gives at best PASS-with-warnings.
TEST(PhaseGates, Phase0WithoutAReferenceIsUnverifiedEverywhere) {
  ScratchDir dir("p0unverified");
  SynthOptions so;
  so.preset = "SmolLM2-360M";
  so.tiny = true;
  so.seed = 5;  // no reference exists for this seed
  so.out_dir = dir.str("model");
  synth(so);
  const DeployResult r = deploy(deploy_options(so.out_dir, dir.str("dep")));
  ASSERT_TRUE(r.pass) << r.diagnosis;
  const Deployment dep = Deployment::open_existing(dir.path() / "dep");
  EXPECT_EQ(dep.phase_status(0), "unverified");
  EXPECT_EQ(dep.phase_status(6), "passed");
  const nlohmann::json report = read_json_file(dir.path() / "dep" / "report.json");
  EXPECT_EQ(report["reference"]["status"], "unverified") << report.dump();
  const CliResult run = run_tessera("run " + dir.str("dep") + " --prompt Hello -n 2");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.substr(0, run.err.find('\n')).find("phase 0 reference: unverified"), std::string::npos) << run.err;
  AuditOptions ao;
  ao.dir = dir.str("dep");
  ao.quiet = true;
  ao.remeasure_wall_time = false;
  EXPECT_EQ(audit_deployment(ao).verdict(), "PASS-with-warnings");
}

// Phases 2, 3 and 6 each run alone on a wrong target must fail. (Not every fault reaches
// every gate: on random weights attention is nearly uniform, so a RoPE pairing fault moves
// the hidden states too little for phase 3's 0.95 layer cosine; phases 1 and 2 catch it.)
struct PhaseFault {
  int phase;
  std::string fault;
  std::string preset;
};
class PhaseGateFails : public ::testing::TestWithParam<PhaseFault> {};

TEST_P(PhaseGateFails, OnAWrongTarget) {
  const PhaseFault& c = GetParam();
  ScratchDir dir("pfail");
  const std::string model = synth_tiny(dir, c.preset);
  Model m = Model::open(model);
  const DeployOptions o = deploy_options(model, dir.str("dep"), {c.fault});
  Deployment dep = Deployment::open_for_deploy(o.out_dir, deployment_identity(m, o));
  PhaseContext ctx(dep, m, o);
  const PhaseOutcome r = c.phase == 2 ? run_phase2_block(ctx) : c.phase == 3 ? run_phase3_model(ctx) : run_phase6_integrate(ctx);
  EXPECT_FALSE(r.pass) << "phase " << c.phase << " with " << c.fault << ": " << r.summary;
  EXPECT_FALSE(r.diagnosis.empty());

  // The same phase on the clean target passes.
  const DeployOptions clean = deploy_options(model, dir.str("dep_clean"));
  Deployment dep2 = Deployment::open_for_deploy(clean.out_dir, deployment_identity(m, clean));
  PhaseContext ctx2(dep2, m, clean);
  const PhaseOutcome ok = c.phase == 2 ? run_phase2_block(ctx2) : c.phase == 3 ? run_phase3_model(ctx2) : run_phase6_integrate(ctx2);
  EXPECT_TRUE(ok.pass) << ok.summary;
}

INSTANTIATE_TEST_SUITE_P(Phases, PhaseGateFails,
                         ::testing::Values(PhaseFault{2, "rope-interleaved", "SmolLM2-135M"},
                                           PhaseFault{3, "gqa-modulo", "Qwen3-0.6B"},
                                           PhaseFault{6, "stale-kv", "SmolLM2-360M"}),
                         [](const auto& info) {
                           std::string n = "phase" + std::to_string(info.param.phase) + "_" + info.param.fault;
                           for (char& ch : n) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessera
