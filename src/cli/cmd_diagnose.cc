// `tessera diagnose DIR [--json]`: runs the debug skills (pipeline/diagnose.h) on a
// deployment's failure: the first failed phase, or a failing audit (evaluation.json).
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.h"
#include "pipeline/deploy.h"
#include "pipeline/diagnose.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct DiagnoseArgs {
  std::string dir;
  bool json = false;
  int threads = 0;
  bool quiet = false;
};

int run_diagnose(const DiagnoseArgs& a) {
  namespace fs = std::filesystem;
  Deployment dep = Deployment::open_existing(a.dir);
  if (const std::string altered = altered_on_purpose(dep.identity()); !altered.empty() && !a.json)
    fmt::print("note: this deployment was {}.\n", altered);
  Failure f;
  for (const PhaseDef& p : phase_defs())
    if (dep.phase_status(p.id) == "failed") {
      f.phase = p.id;
      f.record = read_json_file(dep.file(fmt::format("phase{}.json", p.id)));
      break;
    }
  if (f.phase < 0 && fs::exists(dep.file("evaluation.json"))) {
    const nlohmann::json ev = read_json_file(dep.file("evaluation.json"));
    if (ev.value("verdict", "") == "FAIL") f = {7, ev};
  }
  // Nothing failed: the advisory skills (porting pitfall 14) look at the passing deployment.
  if (f.phase < 0 && dep.phase_status(6) != "passed") {
    fmt::print("{}: no failed gate, no failing audit, and not finished: nothing to diagnose\n", a.dir);
    return 0;
  }
  DeployOptions o = options_from_identity(dep.identity());
  o.threads = a.threads;
  o.quiet = a.quiet || a.json;
  const Model model = Model::open(o.model_path);
  PhaseContext ctx(dep, model, o);
  if (fs::exists(dep.file("plan.json"))) ctx.use_plan(read_json_file(dep.file("plan.json")));
  const std::vector<Diagnosis> ds = run_debug_skills(ctx, f);
  if (a.json) {
    nlohmann::json j = {{"phase", f.phase}, {"diagnoses", nlohmann::json::array()}};
    for (const Diagnosis& d : ds) j["diagnoses"].push_back(d.to_json());
    fmt::print("{}\n", j.dump(2));
  } else if (f.phase < 0) {
    fmt::print("no failed gate and no failing audit; advisory skills: {}", diagnoses_markdown(ds));
  } else {
    fmt::print("phase {} failed. {}", f.phase, diagnoses_markdown(ds));
  }
  return 0;
}

}  // namespace

void add_diagnose_command(CLI::App& app) {
  auto a = std::make_shared<DiagnoseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "diagnose",
      "Run the debug skills on a deployment's failure (the first failed phase, or a failing `tessera audit`): each\n"
      "skill's hypotheses with the experiment that confirms or rules each out, and the named cause(s). On a finished\n"
      "deployment with no failure, the advisory skills (dispatch-overhead) instead.");
  cmd->add_option("dir", a->dir, "A deployment directory")->required();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  cmd->callback([a] {
    const int rc = run_diagnose(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
