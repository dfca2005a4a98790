// `tessera audit DIR [--json]`: phase 7, the independent evaluator (eval/audit.h). Re-derives
// every verdict of a finished deployment in this fresh process and prints the findings.
#include <fmt/format.h>

#include "cli/commands.h"
#include "eval/audit.h"
#include "pipeline/perturb.h"
#include "report/report.h"

namespace tessera::cli {

namespace {

struct AuditArgs {
  std::string dir;
  bool json = false;
  int threads = 0;
  bool quiet = false;
  bool no_remeasure = false;
  std::vector<std::string> perturb;
};

int run_audit(const AuditArgs& a) {
  AuditOptions o;
  o.dir = a.dir;
  o.threads = a.threads;
  o.quiet = a.quiet || a.json;
  o.remeasure_wall_time = !a.no_remeasure;
  for (const std::string& p : a.perturb) o.perturbations.push_back(parse_perturbation(p).spec);
  const AuditResult r = audit_deployment(o);
  try {  // the report page shows the audit's checks: refreshed with them
    report::write_deployment_report(a.dir);
  } catch (const std::exception& e) {
    fmt::print(stderr, "report.html not refreshed: {}\n", e.what());
  }
  if (a.json) {
    fmt::print("{}\n", r.to_json().dump(2));
  } else {
    for (const AuditFinding& f : r.findings)
      fmt::print("{:<12} {:<4}  {}\n", f.check, f.verdict == "pass" ? "pass" : f.verdict == "warn" ? "WARN" : "FAIL", f.detail);
    fmt::print("\nverdict: {} (written to {}/evaluation_report.md)\n", r.verdict(), a.dir);
  }
  return r.exit_code();
}

}  // namespace

void add_audit_command(CLI::App& app) {
  auto a = std::make_shared<AuditArgs>();
  CLI::App* cmd = app.add_subcommand(
      "audit",
      "Phase 7: re-check a finished deployment in a fresh process that trusts nothing on disk (hashes, stored\n"
      "thresholds against the built-in ones, phase 3 and 6 gates re-run, adversarial prompts, determinism, per-op\n"
      "counters, every report figure re-measured). Writes DIR/evaluation_report.md and refreshes DIR/report.html.\n"
      "Exit status: 0 PASS, 2 PASS-with-warnings, 3 FAIL, 1 bad input.");
  cmd->add_option("dir", a->dir, "A deployment directory (from `tessera deploy`)")->required();
  cmd->add_flag("--json", a->json, "Print the findings as JSON");
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  cmd->add_option("--perturb", a->perturb,
                  "Re-run the gates as if the executable had this bug (repeatable; see `tessera deploy --help`): "
                  "STAGE:KIND:SIZE[:SCOPE...]");
  cmd->add_flag("--no-remeasure", a->no_remeasure,
                "Do not re-measure wall-time figures (a machine busy with other work cannot reproduce them); the report "
                "lists them as not re-measured. Predicted figures are still checked exactly");
  cmd->callback([a] {
    const int rc = run_audit(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
