// Optimization skills (ARCHITECTURE section 5; phases 4 and 5): each a named plan rewrite
// with a precondition. A target lists its skills in its TargetDef; the pipeline proposes
// each skill's rewrites in turn, re-runs the gate (every op-table row, then phase 3's) on a
// runner built from the rewritten plan, measures it (StagedRunner::measure), and keeps the
// rewrite only when the gate passes and the pass got faster (predicted faster, or faster in
// every interleaved round of wall time). The same names mean the hardware moves on
// npusim and their CPU equivalents on cpu.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

enum class Pass { Prefill, Decode };
inline const char* pass_name(Pass p) { return p == Pass::Prefill ? "prefill" : "decode"; }

// One proposed rewrite: the whole plan after it (the target's build_plan JSON; the runner
// built from it writes the plan again with every derived field refreshed).
struct PlanRewrite {
  std::string what;  // "attention onto the NPU", "weights resident per layer"
  nlohmann::json plan;
};

struct OptSkill {
  std::string name;  // merge, buffer-reuse, zero-copy, layout-align, tile-tune, promote
  std::string does;  // one line
  // The rewrites to try, in order, on `pass` of `plan`; empty when the precondition does
  // not hold, with the reason in `why_not`.
  std::function<std::vector<PlanRewrite>(const nlohmann::json& plan, Pass pass, std::string& why_not)> propose;
};

// A pass's figure of merit (lower is better): measured wall time on a real target,
// predicted time on a modelled one.
struct PassFigure {
  double seconds = 0;
  std::string what;       // "prefill of 128 tokens (median of 5)", "predicted decode step at 512"
  bool predicted = false;  // from a timing model, not a clock
};

}  // namespace tessera
