// Debug skills (ARCHITECTURE section 5; porting-pitfalls.md): each is a symptom, the
// hypotheses that could explain it, and an experiment per hypothesis that confirms it or
// rules it out. `tessera deploy` runs the skills that match a failing gate by itself and
// writes their diagnosis to issues.md; `tessera diagnose DIR` runs them on demand.
//
// The experiments see the target only through StagedRunner (its op_* calls, the KV cache,
// forward_layers with probes) and the oracle's ops: they never read the injected fault
// set. A hypothesis is confirmed when the target's output matches a reference variant
// built from oracle ops (NMSE <= diagnose.match_nmse_max) and is diagnose.separation_min
// times closer to it than to the correct reference; a variant that the model's shapes
// cannot tell apart from the right answer (closer to it than the match limit over the
// separation) is "not applicable", never a guess. A confirmed hypothesis names its cause; where tessera has a fault that commits
// it, the cause is that fault's name.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "pipeline/phases.h"

namespace tessera {

struct Hypothesis {
  std::string name;     // "pairs interleaved"
  std::string cause;    // the named cause: a fault name ("rope-interleaved") or a plain cause
  // "confirmed" (an experiment showed it), "reported" (read from the failure's own text: a
  // refusal code, an evaluator finding; no experiment), "ruled out", "not applicable"
  std::string verdict;
  std::string evidence;  // the numbers the verdict rests on
};

struct Diagnosis {
  std::string skill;    // "rope-variant"
  std::string symptom;  // what matched
  std::string where;    // where to look in the code
  std::vector<Hypothesis> hypotheses;
  std::vector<std::string> confirmed_causes() const;
  std::vector<std::string> reported_causes() const;
  nlohmann::json to_json() const;
  std::string markdown() const;
};

// What failed: the phase and its record (phaseN.json as deploy writes it), or the
// evaluator's findings (phase 7: evaluation.json). Phase -1: nothing failed; the advisory
// skills (dispatch-overhead) look at a passing deployment.
struct Failure {
  int phase = -1;
  nlohmann::json record;
  std::set<Stage> suspects() const;  // stages the record points at (failed kernel rows, bisect)
};

struct DebugSkill {
  std::string name;
  std::string symptom;  // the pattern it answers
  std::string where;
  std::set<Stage> stages;  // a failure whose suspects meet these matches; empty: by `matches`
  std::function<bool(const Failure&)> matches;  // extra matching rule (refusals, phase 7)
  std::function<std::vector<Hypothesis>(PhaseContext&, const Failure&)> run;
};

const std::vector<DebugSkill>& debug_skills();

// Runs every skill that matches `f` (all stage skills when the record names no stage).
std::vector<Diagnosis> run_debug_skills(PhaseContext& ctx, const Failure& f);
// "Named cause(s): ..." (confirmed by an experiment), "Reported cause(s): ..." (read from the
// failure's text) and each diagnosis, for issues.md.
std::string diagnoses_markdown(const std::vector<Diagnosis>& d);

}  // namespace tessera
