#include "pipeline/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "model/default_model.h"
#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "faults/injection.h"
#include "pipeline/perturb.h"
#include "pipeline/plan.h"
#include "targets/registry.h"
#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;

bool is_deployment_dir(const std::string& path) { return fs::is_directory(path) && fs::exists(fs::path(path) / "state.json"); }

namespace {

Executor open_deployment(const std::string& dir, const ExecutorOptions& opts) {
  Deployment dep = Deployment::open_existing(dir);
  const nlohmann::json& id = dep.identity();
  const std::string target = id.value("target", "");
  if (!opts.target.empty() && opts.target != target)
    fail("{} is a deployment on '{}', not '{}'", dir, target, opts.target);
  if (dep.phase_status(6) != "passed")
    fail("{} has not passed phase 6 (integrate) yet: run `tessera deploy` to finish it", dir);
  const nlohmann::json plan = read_json_file(dep.file("plan.json"));
  const std::string want = dep.phase_record(6).value("plan_sha256", "");
  if (!plan.value("frozen", false) || plan_hash(plan) != want)
    fail("{}/plan.json is not the plan phase 6 froze (its hash changed): re-run `tessera deploy --from-phase 1`", dir);
  const std::string model_path = id["model_path"].get<std::string>();
  if (model_fingerprint(model_path) != id["model_fingerprint"])
    fail("the model under {} ({}) changed since it was deployed: re-run `tessera deploy`", dir, model_path);
  // The deployment runs as it was gated: its target, faults, plan and device.
  TargetOptions o;
  o.threads = opts.threads;
  o.profile = opts.profile;
  FaultSet faults;
  for (const auto& f : id["faults"]) faults.insert(f.get<std::string>());
  o.plan_name = id.value("plan", "");
  o.device = id.value("device", "");
  const TargetDef& def = target_def(target);
  if (def.options_from_plan) def.options_from_plan(plan, o);
  Executor e;
  e.model = std::make_unique<Model>(Model::open(model_path));
  std::unique_ptr<StagedRunner> runner = make_runner_with_faults(target, *e.model, o, faults);
  runner->set_output_tap(perturbation_tap(id.value("perturbations", std::vector<std::string>{})));
  e.runner = std::move(runner);
  e.source = dir;
  e.deployment = true;
  e.description =
      fmt::format("{}, deployment {} (plan {} frozen, sha256 {}...; phase 0 reference: {})", target, dir, plan.value("name", ""),
                  want.substr(0, 12), dep.phase_status(0) == "passed" ? "verified" : dep.phase_status(0));
  return e;
}

}  // namespace

Executor open_executor(const std::string& what, const ExecutorOptions& opts) {
  if (is_deployment_dir(what)) return open_deployment(what, opts);
  Executor e;
  e.source = resolve_model_path(what);
  e.model = std::make_unique<Model>(Model::open(e.source));
  const std::string target = opts.target.empty() ? target_names().front() : opts.target;  // the registry's default
  const std::vector<std::string> targets = target_names();
  if (target != "oracle" && std::find(targets.begin(), targets.end(), target) == targets.end())
    fail("unknown target '{}' (targets: {}, oracle)", target, fmt::join(targets, ", "));
  TargetOptions o;
  o.threads = opts.threads;
  o.profile = opts.profile;
  o.plan_name = opts.plan_name;
  o.device = opts.device;
  if (target == "oracle") {
    e.runner = std::make_unique<OracleRunner>(*e.model, opts.threads);
    e.description = "oracle (FP32 reference)";
  } else {
    e.runner = make_target_runner(target, *e.model, o);
    e.description = fmt::format("{} (no deployment: not gated; `tessera deploy` gates it)", target);
  }
  return e;
}

Executor open_executor(const std::string& what, const std::string& target, int threads, bool profile) {
  ExecutorOptions o;
  o.target = target;
  o.threads = threads;
  o.profile = profile;
  return open_executor(what, o);
}

}  // namespace tessera
