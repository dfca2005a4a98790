// Phase 1: every row of the op table (pipeline/op_table.h) on the target, on the oracle's
// real layer-0 activations, against its oracle twin, each held to limits derived from the
// target's declared numerics.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipeline/op_table.h"
#include "pipeline/phases.h"
#include "util/parallel.h"

namespace tessera {

PhaseOutcome kernel_rows_outcome(StagedRunner& target, const OpInputs& in, const std::string& gate,
                                 const std::function<void(const std::string&)>& progress) {
  PhaseOutcome out;
  out.details["kernels"] = nlohmann::json::array();
  OpHarnessOptions opt;
  opt.gate = gate;
  opt.progress = progress;
  int64_t n_failed = 0;
  std::vector<std::string> failed;
  for (const OpResult& r : run_op_table(target, in, opt)) {
    out.gates.push_back(r.gate);
    out.details["kernels"].push_back(r.to_json());
    if (!r.gate.pass()) {
      ++n_failed;
      failed.push_back(r.gate.subject);
    }
  }
  out.pass = n_failed == 0;
  out.summary = fmt::format("{} kernel cases on {} ({}), {} failed", out.gates.size(), target.target(), target.isa(), n_failed);
  if (!out.pass) out.diagnosis = fmt::format("kernel(s) disagree with their oracle twin: {}", fmt::join(failed, "; "));
  return out;
}

OpInputs op_table_inputs(const Model& model, const Tokenizer& tok, OracleRunner& oracle, int threads) {
  return op_inputs(model, oracle, long_prompt(tok, 64), threads > 0 ? threads : default_threads());
}

const OpInputs& PhaseContext::op_inputs() {
  if (!op_inputs_) {
    progress("[op table] the oracle's layer-0 activations on the long prompt");
    op_inputs_ = std::make_unique<OpInputs>(op_table_inputs(model, tokenizer(), oracle(), opts.threads));
  }
  return *op_inputs_;
}

PhaseOutcome run_phase1_kernels(PhaseContext& ctx) {
  return kernel_rows_outcome(ctx.target(), ctx.op_inputs(), "phase1.kernel",
                             [&](const std::string& line) { ctx.progress("[phase 1] " + line); });
}

}  // namespace tessera
