// `tessera deploy MODEL --target TARGET --out DIR`: the gated pipeline (phases 0-3 and 6 in
// this version) on any registered target, resumable, with `--inject` to make the target
// wrong on purpose.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "cli/commands.h"
#include "faults/catalogue.h"
#include "model/default_model.h"
#include "pipeline/deploy.h"
#include "pipeline/perturb.h"
#include "report/report.h"
#include "targets/registry.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct DeployArgs {
  std::string model;
  std::string target = "cpu";
  std::string plan;
  std::string device;
  std::string out;
  int from_phase = -1;
  std::vector<std::string> inject;
  std::vector<std::string> perturb;
  int threads = 0;
  std::string reference;
  bool quiet = false;
};

// --inject's help: the faults every target takes, then each target's own.
std::string inject_help() {
  auto names = [](const std::vector<FaultInfo>& faults) {
    std::vector<std::string> n;
    for (const FaultInfo& f : faults) n.push_back(f.name);
    return fmt::format("{}", fmt::join(n, ", "));
  };
  std::string text = "Make the deployment wrong on purpose (repeatable): " + names(porting_faults());
  for (const TargetDef& d : target_defs())
    if (!d.faults().empty()) text += "; " + d.name + " also: " + names(d.faults());
  return text;
}

std::string default_out_dir(const std::string& model_path, const std::string& target) {
  std::string stem = std::filesystem::path(model_path).filename().string();
  if (stem.empty()) stem = std::filesystem::path(model_path).parent_path().filename().string();
  if (stem.ends_with(".gguf")) stem.resize(stem.size() - 5);
  return (std::filesystem::path("deployments") / (stem + "-" + target)).string();
}

int run_deploy(const DeployArgs& a) {
  DeployOptions o;
  o.model_path = resolve_model_path(a.model);
  o.target = a.target;
  o.out_dir = a.out.empty() ? default_out_dir(o.model_path, a.target) : a.out;
  o.from_phase = a.from_phase;
  for (const std::string& f : a.inject) o.faults.insert(target_fault_info(a.target, f).name);
  for (const std::string& p : a.perturb) o.perturbations.push_back(parse_perturbation(p).spec);  // refused early
  o.threads = a.threads;
  o.plan_name = a.plan;
  o.device = a.device;
  o.reference_dir = a.reference;
  o.quiet = a.quiet;
  const DeployResult r = deploy(o);
  const Deployment dep = Deployment::open_existing(o.out_dir);
  // The summary: one row per phase; every gate row is in DIR/gates.md.
  fmt::print("| phase | name | status | gates passed | summary |\n|---|---|---|---|---|\n");
  for (const PhaseDef& p : phase_defs()) {
    const nlohmann::json rec = dep.phase_record(p.id);
    std::string counts;
    const auto f = dep.file(fmt::format("phase{}.json", p.id));
    if (std::filesystem::exists(f)) {
      const nlohmann::json j = read_json_file(f);
      int passed = 0;
      for (const auto& g : j["gates"]) passed += gates::GateResult::from_json(g).pass();
      counts = fmt::format("{}/{}", passed, j["gates"].size());
    }
    fmt::print("| {} | {} | {} | {} | {} |\n", p.id, p.name, rec.value("status", "pending"), counts, rec.value("summary", ""));
  }
  fmt::print("\nEvery gate row, with the thresholds it was held to: {}/gates.md\n", o.out_dir);
  // The report page, from the directory alone (a failed deployment's too).
  try {
    fmt::print("The report (charts of every phase that ran): {}\n", report::write_deployment_report(o.out_dir).string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "report.html not written: {}\n", e.what());
  }
  // The target's speed: measured on the cpu (phase 6's short prompts), predicted on npusim.
  if (std::filesystem::exists(dep.file("phase6.json"))) {
    const nlohmann::json details = read_json_file(dep.file("phase6.json")).value("details", nlohmann::json::object());
    if (details.contains("target_predicted")) {
      const nlohmann::json& f = details["target_predicted"];
      fmt::print("predicted on {} (plan {}; the timing model, not a measurement): prefill {} tokens {:.1f} ms ({:.0f} tok/s), "
                 "decode at {} context {:.2f} ms/token ({:.1f} tok/s)\n",
                 f["device"].get<std::string>(), f["plan"].get<std::string>(), f["prefill_tokens"].get<int64_t>(),
                 f["prefill_ms"].get<double>(), f["prefill_tokens_per_s"].get<double>(), f["decode_context"].get<int64_t>(),
                 f["decode_ms_per_token"].get<double>(), f["decode_tokens_per_s"].get<double>());
    } else if (details.contains("target_timing")) {
      const nlohmann::json& f = details["target_timing"];
      fmt::print("measured on {} during phase 6 (its few prompts; `tessera bench` measures properly): prefill {:.0f} tok/s, "
                 "decode {:.1f} tok/s\n",
                 o.target, f["prefill_tokens_per_s"].get<double>(), f["decode_tokens_per_s"].get<double>());
    }
  }
  const std::string altered = altered_on_purpose(dep.identity());
  if (r.pass && !altered.empty()) {
    fmt::print("\nevery gate passed, but the deployment is NOT ready: it was {}\n", altered);
    return 0;
  }
  if (r.pass) {
    fmt::print("\ndeployment ready: {} (run it with `tessera run {} --prompt ...`)\n", o.out_dir, o.out_dir);
    return 0;
  }
  if (!altered.empty()) fmt::print("\n(this deployment was {})", altered);
  fmt::print("\nphase {} ({}) FAILED. Diagnosis:\n{}\n(also in {}/issues.md)\n", r.failed_phase,
             phase_def(r.failed_phase).name, r.diagnosis, o.out_dir);
  return 3;
}

}  // namespace

void add_deploy_command(CLI::App& app) {
  auto a = std::make_shared<DeployArgs>();
  CLI::App* cmd = app.add_subcommand(
      "deploy",
      "Deploy a model onto a target through the gated phases (0 oracle, 1 kernels, 2 block, 3 model, 4 prefill-opt,\n"
      "5 decode-opt, 6 integrate; phase 7 is `tessera audit DIR`). Phases 4 and 5 rewrite the plan with the target's\n"
      "optimization skills, keeping a rewrite only if the gate still passes and it is strictly faster\n"
      "(DIR/perf_opt_traj.md). Resumes at the first phase not passed.\n"
      "Exit status: 0 every gate passed, 3 a gate failed (diagnosis in DIR/issues.md), 1 bad input.");
  cmd->add_option("model", a->model, "Hugging Face directory or .gguf file (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--target", a->target, fmt::format("Target: {}", fmt::join(target_names(), ", ")))->capture_default_str();
  cmd->add_option("--plan", a->plan,
                  "The named plan phases 1-3 validate and phases 4-5 start from (cpu: cpu-fused (default), cpu-naive; "
                  "npusim: baseline (default), naive, merged)");
  cmd->add_option("--device", a->device, "Device profile of the target (npusim: xdna2 (default) or a profile JSON file)");
  cmd->add_option("--out", a->out, "Deployment directory (default: deployments/<model>-<target>)");
  cmd->add_option("--from-phase", a->from_phase, "Re-run from phase N (its results and later ones are discarded)");
  cmd->add_option("--inject", a->inject, inject_help());
  cmd->add_option("--perturb", a->perturb,
                  "Make one stage's output wrong from outside the target (repeatable): STAGE:KIND:SIZE[:SCOPE...], "
                  "KIND one of gain, offset, noise, element, tail, permute, stale, shift; SCOPE decode, prefill, fused, "
                  "layer=N, out=NAME (e.g. rmsnorm's 0.5% gain: attn_norm:gain:0.005)");
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_option("--reference", a->reference, "Phase 0's independent reference: a directory made by tools/reference/make_reference.py, or a directory of them (default: each directory in $TESSERA_REFERENCES, then $XDG_CACHE_HOME/tessera/references or ~/.cache/tessera/references; none for this checkpoint: phase 0 is unverified)");
  cmd->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  cmd->callback([a] {
    const int rc = run_deploy(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
