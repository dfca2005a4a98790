// `tessera kernels`: every row of the op table (pipeline/op_table.h) on a target, checked
// against its oracle twin and the limits its declared numerics give (mode test), or also
// timed (mode perf). On a deployment directory it runs the frozen plan: the kernels the
// deployment executes, fused ones included.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "cli/commands.h"
#include "model/default_model.h"
#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "pipeline/op_table.h"
#include "faults/injection.h"
#include "pipeline/perturb.h"
#include "pipeline/phases.h"
#include "targets/registry.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct KernelsArgs {
  std::string what;  // a model or a deployment directory
  std::string target = "cpu";
  std::string plan;
  std::string mode = "test";
  int repeats = 5;
  int threads = 0;
  bool json = false;
  std::vector<std::string> perturb;
};

std::string g3(double v) { return fmt::format("{:.3g}", v); }

// "value (limit)" of one check of a row.
std::string value_and_limit(const gates::GateResult& g, const std::string& metric) {
  const gates::Check* c = g.check(metric);
  return c ? fmt::format("{} ({})", g3(c->value), g3(c->limit)) : "-";
}

int run_kernels(const KernelsArgs& a) {
  if (a.mode != "test" && a.mode != "perf") fail("--mode must be test or perf, not '{}'", a.mode);
  TargetOptions o;
  o.threads = a.threads;
  std::string target = a.target, model_path, source;
  const bool deployment = std::filesystem::exists(std::filesystem::path(a.what) / "state.json");
  std::vector<std::string> perturbations;
  FaultSet faults;
  if (deployment) {
    const Deployment dep = Deployment::open_existing(a.what);
    const nlohmann::json& id = dep.identity();
    target = id.at("target");
    model_path = id.at("model_path");
    for (const auto& f : id.value("faults", nlohmann::json::array())) faults.insert(f.get<std::string>());
    perturbations = id.value("perturbations", std::vector<std::string>{});
    o.plan = read_json_file(dep.file("plan.json"));
    source = fmt::format("deployment {} (plan {}{})", a.what, o.plan.value("name", ""),
                         o.plan.value("frozen", false) ? ", frozen" : ", not frozen yet");
  } else {
    model_path = resolve_model_path(a.what);
    o.plan_name = a.plan;
    source = fmt::format("model {} (plan {})", model_path, a.plan.empty() ? "the target's default" : a.plan);
  }
  for (const std::string& p : a.perturb) perturbations.push_back(parse_perturbation(p).spec);
  const Model model = Model::open(model_path);
  std::unique_ptr<StagedRunner> runner = make_runner_with_faults(target, model, o, faults);
  runner->set_output_tap(perturbation_tap(perturbations));
  const Tokenizer tok = Tokenizer::for_model(model);
  OracleRunner oracle(model, a.threads);
  const OpInputs in = op_table_inputs(model, tok, oracle, a.threads);
  OpHarnessOptions opt;
  opt.gate = "kernels";
  opt.perf_repeats = a.mode == "perf" ? a.repeats : 0;
  const std::vector<OpResult> rows = run_op_table(*runner, in, opt);
  int failed = 0;
  for (const OpResult& r : rows) failed += !r.gate.pass();

  if (a.json) {
    nlohmann::json j = {{"target", target}, {"description", runner->description()}, {"source", source},
                        {"mode", a.mode},   {"failed", failed},                     {"rows", nlohmann::json::array()}};
    for (const OpResult& r : rows) j["rows"].push_back(r.to_json());
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{} on {}; {} tokens of real layer-0 activations; limits: margin {} above the error of the declared "
               "numerics (never looser than the outer bounds)\n\n",
               runner->description(), source, in.T, gates::threshold("phase1.margin"));
    fmt::print("| kernel | role | shape | numerics | expected nmse | measured nmse | nmse limit | gain error (limit) | "
               "max err (limit) |{} verdict |\n|---|---|---|---|---|---|---|---|---|{}---|\n",
               a.mode == "perf" ? " median time |" : "", a.mode == "perf" ? "---|" : "");
    for (const OpResult& r : rows) {
      const gates::Check* nmse = r.gate.check("nmse");
      fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} |{} {} |\n", r.kernel, gates::markdown_cell(r.role), r.shape,
                 r.numerics, g3(r.expected.nmse), g3(r.measured.nmse), nmse ? g3(nmse->limit) : "-",
                 value_and_limit(r.gate, "gain_error"), value_and_limit(r.gate, "max_err"),
                 a.mode == "perf" ? fmt::format(" {:.3f} ms |", r.seconds * 1e3) : "", r.gate.pass() ? "PASS" : "FAIL");
    }
    fmt::print("\n{} rows, {} failed\n", rows.size(), failed);
  }
  return failed ? 3 : 0;
}

}  // namespace

void add_kernels_command(CLI::App& app) {
  auto a = std::make_shared<KernelsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "kernels",
      "Every row of the op table on a target: each kernel (fused ones included) on the oracle's real layer-0\n"
      "activations against its oracle twin, with the error its declared numerics lead to expect, the error\n"
      "measured, and the limit (mode test); mode perf also times each. On a deployment directory: the frozen plan.\n"
      "Exit status: 0 every row passes, 3 a row fails, 1 bad input.");
  cmd->add_option("model", a->what, "Model (Hugging Face directory or .gguf; default SmolLM2-135M-Instruct) or a deployment directory");
  cmd->add_option("--target", a->target, fmt::format("Target for a model: {}", fmt::join(target_names(), ", ")))->capture_default_str();
  cmd->add_option("--plan", a->plan, "Named plan for a model (default: the target's)");
  cmd->add_option("--mode", a->mode, "test: check every row; perf: check and time every row")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Timed calls per row in perf mode (the median is shown)")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_option("--perturb", a->perturb, "A perturbation from outside the target (see `tessera deploy --help`)");
  cmd->add_flag("--json", a->json, "Print the rows as JSON");
  cmd->callback([a] {
    const int rc = run_kernels(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
