// `tessera profile DIR`: where an npusim deployment's time goes, as its device's timing
// model predicts it for the deployment's plan: time per dispatch and per launch, tiles
// used, bytes moved through DDR and host copies, for a prefill and a decode step; with
// --json also the lowered Programs priced (dispatches, launches with their arguments and
// waits, buffers with their syncs), the same the runner executes.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "pipeline/executor.h"
#include "targets/staged_runner.h"
#include "util/error.h"

namespace tessera::cli {

namespace {

struct ProfileArgs {
  std::string what;
  std::string plan;
  std::string device;
  int prompt_len = 2048;
  int context = 512;
  bool json = false;
};

void run_profile(const ProfileArgs& a) {
  ExecutorOptions eo;
  eo.target = "npusim";
  eo.plan_name = a.plan;
  eo.device = a.device;
  Executor ex = open_executor(a.what, eo);
  auto* staged = dynamic_cast<StagedRunner*>(ex.runner.get());
  if (!staged || staged->predict_pass(true, 0).is_null())
    fail("{}: not on a modelled target (profile predicts an NPU's time; use `tessera bench --profile` on cpu)", a.what);
  const ModelSpec& s = staged->spec();
  if (a.prompt_len < 1 || a.prompt_len > s.max_position) fail("--prompt-len {} is outside [1, {}]", a.prompt_len, s.max_position);
  if (a.context < 0 || a.context >= s.max_position) fail("--context {} is outside [0, {})", a.context, s.max_position);
  // The dry mode: the plan lowered at these shapes and priced, nothing executed.
  const nlohmann::json prefill = staged->predict_pass(false, a.prompt_len, a.json);
  const nlohmann::json decode = staged->predict_pass(true, a.context, a.json);
  if (a.json) {
    fmt::print("{}\n", nlohmann::json{{"source", ex.source},
                                      {"device", prefill["device"]},
                                      {"plan", prefill["plan_spec"]},
                                      {"prefill", prefill["prediction"]},
                                      {"decode", decode["prediction"]},
                                      {"programs", {{"prefill", prefill["program"]}, {"decode", decode["program"]}}}}
                           .dump(2));
    return;
  }
  fmt::print("tessera profile: {} on {}\n", ex.source, ex.description);
  fmt::print("plan {}: {}\n", prefill["plan"].get<std::string>(), prefill["plan_description"].get<std::string>());
  fmt::print("(predicted by the timing model of device profile {}, calibrated on kernel-level measurements only; "
             "not a measurement)\n\n",
             prefill["device"].get<std::string>());
  fmt::print("{}\n{}", prefill["describe"].get<std::string>(), decode["describe"].get<std::string>());
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto a = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Predicted time per dispatch and launch of an npusim deployment (or model), tiles used, bytes moved");
  cmd->add_option("what", a->what, "An npusim deployment directory, or a model (profiled under --plan)")->required();
  cmd->add_option("--plan", a->plan, "For a model: baseline (default), naive or merged");
  cmd->add_option("--device", a->device, "For a model: the device profile (default xdna2)");
  cmd->add_option("--prompt-len", a->prompt_len, "Prefill tokens")->capture_default_str();
  cmd->add_option("--context", a->context, "Cached positions before the decode step")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON, with the lowered programs (dispatches, launches, buffers, waits)");
  cmd->callback([a] { run_profile(*a); });
}

}  // namespace tessera::cli
