#include "pipeline/phases.h"

#include <fmt/format.h>

#include "oracle/oracle.h"
#include "pipeline/op_table.h"
#include "pipeline/perturb.h"
#include "faults/injection.h"

namespace tessera {

PhaseContext::PhaseContext(Deployment& d, const Model& m, const DeployOptions& o) : dep(d), model(m), opts(o) {}
PhaseContext::~PhaseContext() = default;

const Tokenizer& PhaseContext::tokenizer() {
  if (!tokenizer_) tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::for_model(model));
  return *tokenizer_;
}
std::vector<CanonicalPrompt> PhaseContext::prompts() {
  std::vector<CanonicalPrompt> out = canonical_prompts(tokenizer());
  out.push_back(long_context_prompt(tokenizer(), model.spec()));
  for (CanonicalPrompt& p : out) p.ids = runtime_prompt_ids(opts.faults, tokenizer(), std::move(p.ids));
  return out;
}
std::vector<int32_t> PhaseContext::stop_ids() { return runtime_stop_ids(opts.faults, tokenizer(), model.spec()); }
OracleRunner& PhaseContext::oracle() {
  if (!oracle_) oracle_ = std::make_unique<OracleRunner>(model, opts.threads);
  return *oracle_;
}
TargetOptions target_options(const DeployOptions& opts) {
  TargetOptions o;
  o.threads = opts.threads;
  o.plan_name = opts.plan_name;
  o.device = opts.device;
  return o;
}

StagedRunner& PhaseContext::target() {
  if (!target_) {
    TargetOptions o = target_options(opts);
    o.plan = plan_;
    target_ = make_runner_with_faults(opts.target, model, o, opts.faults);
    target_->set_output_tap(perturbation_tap(opts.perturbations));
  }
  return *target_;
}

void PhaseContext::use_plan(const nlohmann::json& plan) {
  plan_ = plan;
  target_.reset();
}

std::unique_ptr<StagedRunner> PhaseContext::make_runner(const nlohmann::json& plan) const {
  TargetOptions o = target_options(opts);
  o.plan = plan;
  std::unique_ptr<StagedRunner> r = make_runner_with_faults(opts.target, model, o, opts.faults);
  r->set_output_tap(perturbation_tap(opts.perturbations));
  return r;
}
const std::map<Stage, double>& PhaseContext::expected_stage_errors(const StagedRunner& t) {
  // The declared numerics of every stage at a prefill and a decode step, layer 0: what the
  // emulation depends on.
  std::string key;
  for (int i = 0; i < int(Stage::Count); ++i)
    for (const int64_t T : {int64_t(2), int64_t(1)}) {
      const oracle::Numerics n = t.numerics(Stage(i), T, 0);
      key += n.name + "|" + n.describe() + "\n";
    }
  auto it = expected_stage_errors_.find(key);
  if (it == expected_stage_errors_.end())
    it = expected_stage_errors_.emplace(key, tessera::expected_stage_errors(t, op_inputs())).first;
  return it->second;
}

void PhaseContext::progress(const std::string& line) const {
  if (!opts.quiet) fmt::print(stderr, "  {}\n", line);
}

}  // namespace tessera
