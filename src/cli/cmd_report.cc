// `tessera report DIR [--out FILE] [--open]`: the deployment's report as one self-contained
// HTML page (report/report.h), built from the directory alone. `deploy` writes DIR/report.html
// at its end and `audit` refreshes it. `tessera report A B` compares two deployments.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "cli/commands.h"
#include "pipeline/deployment.h"
#include "report/report.h"

namespace tessera::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> dirs;
  std::string out;
  bool open = false;
};

// The path as one shell word.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run_report(const ReportArgs& a) {
  std::filesystem::path path;
  if (a.dirs.size() == 1) {
    path = report::write_deployment_report(a.dirs[0], a.out);
  } else {  // two deployments compared: written where asked, else in the current directory
    path = a.out.empty() ? std::filesystem::path("compare.html") : std::filesystem::path(a.out);
    write_file_atomic(path, report::comparison_report_html(a.dirs[0], a.dirs[1]));
  }
  fmt::print("{}\n", path.string());
  if (a.open) {
    const std::string cmd = fmt::format("xdg-open {} >/dev/null 2>&1", shell_quote(std::filesystem::absolute(path).string()));
    if (std::system(cmd.c_str()) != 0) fmt::print(stderr, "could not open it (xdg-open failed); open {} in a browser\n", path.string());
  }
  return 0;
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Write a deployment's report: one self-contained HTML page (inline CSS and SVG, no scripts, nothing fetched)\n"
      "built from the deployment directory alone: the header (model, target, plan, every phase's verdict and the\n"
      "audit's, reference status, figures labelled measured or predicted), phase 1's kernel errors against their\n"
      "limits, phase 3's per-layer and per-position cosines, phases 4-5's optimization trajectory, the target (npusim:\n"
      "the dispatch timeline of a prefill layer and a decode step and each launch's tile map; cpu: decode against the\n"
      "bandwidth roof, prefill against the GEMM kernel's measured rate), issues and diagnoses, the audit's checks. A phase that did not run is said so. `deploy` writes\n"
      "DIR/report.html at its end and `audit` refreshes it. Prints the page's path.\n"
      "With two directories A B: one page comparing them (every phase's verdict and the figures side by side,\n"
      "phase 3's per-layer cosines overlaid), written to --out (default: compare.html here).");
  cmd->add_option("dirs", a->dirs, "A deployment directory (from `tessera deploy`), or two to compare")->required()->expected(1, 2);
  cmd->add_option("--out", a->out, "Where to write the page (default: DIR/report.html; two directories: compare.html)");
  cmd->add_flag("--open", a->open, "Open the page with xdg-open afterwards");
  cmd->callback([a] {
    const int rc = run_report(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
