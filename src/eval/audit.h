// Phase 7, the independent evaluator (ARCHITECTURE sections 1 and 6): `tessera audit DIR`.
// It trusts nothing the deployment wrote. It re-derives every verdict from the model file,
// the frozen plan and the built-in threshold table, in its own process, and writes
// evaluation_report.md (and evaluation.json) into DIR; it never changes anything else there.
//
// Checks, each a finding with a verdict:
//   complete      phases 0-6 recorded as passed and the plan frozen;
//   hashes        plan.json, report.json and every model file against manifest.json, and the
//                 plan against the hash phase 6 recorded;
//   thresholds    every stored gate row's limits against the built-in table, and every stored
//                 verdict against its own value (a row recorded as passing must pass);
//   phase3, phase6  the model and integration gates re-run here on the frozen plan;
//   adversarial   prompts no earlier phase used, through phase 3's gate;
//   determinism   the same prompt twice: identical logits, bit for bit, and identical tokens;
//   op-counters   every op the plan puts on the target ran there: no stage by the oracle, no
//                 host op the plan does not list, no target op that never ran;
//   figures       every figure in report.json re-measured: a modelled target's predictions
//                 must reproduce exactly; a measured one must be reached within 10% by the
//                 best of a few runs (a claim beyond that warns; more than twice what is
//                 measured fails; measuring faster than claimed overstates nothing; under
//                 50 ms of measured work only the 2x rule applies: the rest is noise).
// Verdict: FAIL if any finding fails, PASS-with-warnings if any warns, else PASS.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera {

struct AuditFinding {
  std::string check;    // "hashes", "thresholds", ...
  std::string verdict;  // "pass", "warn", "fail"
  std::string detail;   // one line: what was found
};

struct AuditResult {
  std::string dir;
  std::vector<AuditFinding> findings;
  std::string verdict() const;  // "PASS", "PASS-with-warnings", "FAIL"
  int exit_code() const;        // 0 PASS, 2 PASS-with-warnings, 3 FAIL
  const AuditFinding* first_failure() const;
  nlohmann::json to_json() const;
  std::string markdown() const;  // evaluation_report.md
};

struct AuditOptions {
  std::string dir;
  int threads = 0;
  bool quiet = false;
  // Re-measure wall-time figures (the cpu's). Off where the machine is shared with other
  // work (a CI runner's parallel tests): those figures are then listed as not re-measured
  // in the report, and only the deterministic ones (npusim's predictions) are checked.
  bool remeasure_wall_time = true;
  // Perturbations (pipeline/perturb.h) added to the deployment's own when the gates are
  // re-run: what the evaluator would see if the executable had that bug.
  std::vector<std::string> perturbations;
};

class Deployment;

// What manifest.json (parsed) says against the files it hashes: plan.json, report.json and
// every model file, one line per file that does not hash as recorded. A manifest of the wrong
// shape (not an object, a hash that is not a string, no model table) is a problem said as
// such, never an exception: the file comes from disk and may have been edited or damaged.
std::vector<std::string> manifest_problems(const nlohmann::json& manifest, const Deployment& dep);

// Runs every check (a check that cannot run is a failing finding, never skipped) and writes
// DIR/evaluation_report.md and DIR/evaluation.json. Throws only if DIR is not a deployment.
AuditResult audit_deployment(const AuditOptions& opts);

}  // namespace tessera
