#include "pipeline/executor.h"

#include <fmt/format.h>

#include <filesystem>

#include "model/default_model.h"
#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "pipeline/plan.h"
#include "targets/cpu/cpu_runner.h"
#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;

bool is_deployment_dir(const std::string& path) { return fs::is_directory(path) && fs::exists(fs::path(path) / "state.json"); }

namespace {

Executor open_deployment(const std::string& dir, const std::string& target, int threads, bool profile) {
  Deployment dep = Deployment::open_existing(dir);
  const nlohmann::json& id = dep.identity();
  if (!target.empty() && target != id.value("target", ""))
    fail("{} is a deployment on '{}', not '{}'", dir, id.value("target", ""), target);
  if (dep.phase_status(6) != "passed")
    fail("{} has not passed phase 6 (integrate) yet: run `tessera deploy` to finish it", dir);
  const nlohmann::json plan = read_json_file(dep.file("plan.json"));
  const std::string want = dep.phase_record(6).value("plan_sha256", "");
  if (!plan.value("frozen", false) || plan_hash(plan) != want)
    fail("{}/plan.json is not the plan phase 6 froze (its hash changed): re-run `tessera deploy --from-phase 1`", dir);
  const std::string model_path = id["model_path"].get<std::string>();
  if (model_fingerprint(model_path) != id["model_fingerprint"])
    fail("the model under {} ({}) changed since it was deployed: re-run `tessera deploy`", dir, model_path);
  Executor e;
  e.model = std::make_unique<Model>(Model::open(model_path));
  CpuOptions o;
  o.threads = threads > 0 ? threads : plan["cpu"].value("threads", 0);
  o.profile = profile;
  for (const auto& f : id["faults"]) o.faults.insert(f.get<std::string>());
  e.runner = std::make_unique<CpuRunner>(*e.model, o);
  e.source = dir;
  e.deployment = true;
  e.description = fmt::format("cpu, deployment {} (plan {} frozen, sha256 {}...)", dir, plan.value("name", ""), want.substr(0, 12));
  return e;
}

}  // namespace

Executor open_executor(const std::string& what, const std::string& target, int threads, bool profile) {
  if (is_deployment_dir(what)) return open_deployment(what, target, threads, profile);
  Executor e;
  e.source = resolve_model_path(what);
  e.model = std::make_unique<Model>(Model::open(e.source));
  if (target.empty() || target == "cpu") {
    CpuOptions o;
    o.threads = threads;
    o.profile = profile;
    e.runner = std::make_unique<CpuRunner>(*e.model, o);
    e.description = "cpu (no deployment: not gated; `tessera deploy` gates it)";
  } else if (target == "oracle") {
    e.runner = std::make_unique<OracleRunner>(*e.model, threads);
    e.description = "oracle (FP32 reference)";
  } else {
    fail("unknown target '{}' (targets: cpu, oracle)", target);
  }
  return e;
}

}  // namespace tessera
