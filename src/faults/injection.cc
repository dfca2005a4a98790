#include "faults/injection.h"

#include "faults/catalogue.h"
#include "faults/kernel_faults.h"
#include "runtime/generate.h"
#include "targets/registry.h"
#include "util/parallel.h"

namespace tessera {

std::unique_ptr<StagedRunner> make_runner_with_faults(const std::string& target, const Model& model, TargetOptions options,
                                          const FaultSet& faults) {
  options.faults.clear();
  for (const std::string& f : faults) {
    target_fault_info(target, f);  // throws naming the target's faults
    if (is_targets_own_fault(target, f)) options.faults.insert(f);
  }
  // oracle-fallback: a stage computed by the oracle's kernel without a word (only the op
  // counters show it; phase 7 must catch it, every gate before passes).
  if (faults.count("oracle-fallback")) options.oracle_stages.insert(Stage::SiluMul);
  std::unique_ptr<StagedRunner> runner = make_target_runner(target, model, options);
  runner->set_kernel_interceptor(
      kernel_fault_interceptor(model, faults, options.threads > 0 ? options.threads : default_threads()));
  return runner;
}

std::vector<int32_t> runtime_prompt_ids(const FaultSet& faults, const Tokenizer& tok, std::vector<int32_t> ids) {
  // Porting pitfall 12 on purpose: a runtime that adds BOS to ids the tokenizer already began.
  if (faults.count("double-bos") && tok.adds_bos() && tok.bos_id()) ids.insert(ids.begin(), *tok.bos_id());
  return ids;
}

std::vector<int32_t> runtime_stop_ids(const FaultSet& faults, const Tokenizer& tok, const ModelSpec& spec) {
  // Porting pitfall 13 on purpose: only the tokenizer's own eos_token stops generation.
  if (faults.count("eos-first-only")) {
    const std::optional<int32_t> eos = tok.token_id(tok.eos_token());
    return eos ? std::vector<int32_t>{*eos} : std::vector<int32_t>{};
  }
  return stop_ids(tok, spec);
}

}  // namespace tessera
