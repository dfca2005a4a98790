#include "pipeline/phases.h"

#include <fmt/format.h>

#include "oracle/oracle.h"
#include "pipeline/op_table.h"
#include "pipeline/perturb.h"
#include "targets/registry.h"

namespace tessera {

PhaseContext::PhaseContext(Deployment& d, const Model& m, const DeployOptions& o) : dep(d), model(m), opts(o) {}
PhaseContext::~PhaseContext() = default;

const Tokenizer& PhaseContext::tokenizer() {
  if (!tokenizer_) {
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::for_model(model));
    if (opts.faults.count("double-bos")) tokenizer_->inject_double_bos();
  }
  return *tokenizer_;
}
OracleRunner& PhaseContext::oracle() {
  if (!oracle_) oracle_ = std::make_unique<OracleRunner>(model, opts.threads);
  return *oracle_;
}
TargetOptions target_options(const DeployOptions& opts) {
  TargetOptions o;
  o.threads = opts.threads;
  o.faults = opts.faults;
  o.plan_name = opts.plan_name;
  o.device = opts.device;
  return o;
}

StagedRunner& PhaseContext::target() {
  if (!target_) {
    TargetOptions o = target_options(opts);
    o.plan = plan_;
    target_ = make_target_runner(opts.target, model, o);
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
  std::unique_ptr<StagedRunner> r = make_target_runner(opts.target, model, o);
  r->set_output_tap(perturbation_tap(opts.perturbations));
  return r;
}
void PhaseContext::progress(const std::string& line) const {
  if (!opts.quiet) fmt::print(stderr, "  {}\n", line);
}

}  // namespace tessera
