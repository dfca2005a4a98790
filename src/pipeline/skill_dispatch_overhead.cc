// Debug skill dispatch-overhead: an advisory skill on a passing deployment (porting-pitfalls row 14).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "pipeline/skill_support.h"
#include "targets/registry.h"

namespace tessera {

// No gate fails when a modelled NPU spends its time launching small dispatches: on a
// passing deployment, the target's own merge skill is proposed on the frozen plan and both
// plans are priced. Confirmed when merging would make a pass at least
// diagnose.dispatch_gain_min times faster.
std::vector<Hypothesis> dispatch_overhead(PhaseContext& ctx, const Failure&) {
  Hypothesis h{"dispatch overhead not amortized: too many small dispatches", "dispatch-overhead", "ruled out", ""};
  const TargetDef& def = target_def(ctx.opts.target);
  const OptSkill* merge = nullptr;
  if (def.skills)
    for (const OptSkill& s : def.skills())
      if (s.name == "merge") merge = &s;
  if (!merge) return {not_applicable(h.name, h.cause, "the target has no merge skill")};
  std::unique_ptr<StagedRunner> cur = ctx.fresh_target();
  const double min_gain = gates::threshold("diagnose.dispatch_gain_min");
  for (const Pass pass : {Pass::Prefill, Pass::Decode}) {
    const PassFigure before = cur->measure(pass);
    if (!before.predicted)
      return {not_applicable(h.name, h.cause, "a measured target: dispatch overhead is a modelled NPU's figure")};
    std::string why;
    const std::vector<PlanRewrite> rws = merge->propose(ctx.plan(), pass, why);
    if (rws.empty()) {
      h.evidence += fmt::format("{}: {}; ", pass_name(pass), why);
      continue;
    }
    const PassFigure after = ctx.make_runner(rws.front().plan)->measure(pass);
    const double gain = before.seconds / std::max(after.seconds, 1e-12);
    h.evidence += fmt::format("{}: {:.3f} ms, {} would be {:.3f} ms ({:.2f}x); ", pass_name(pass), before.seconds * 1e3,
                              rws.front().what, after.seconds * 1e3, gain);
    if (gain >= min_gain) h.verdict = "confirmed";
  }
  h.evidence += fmt::format("confirmed at {:.2f}x or more", min_gain);
  return {h};
}

}  // namespace tessera
