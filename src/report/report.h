// The deployment report (`tessera report DIR`, written by `deploy` at its end and refreshed
// by `audit`): one self-contained HTML page (inline CSS and SVG charts, no scripts, no
// external reference) built from the deployment directory alone: state.json, plan.json,
// report.json, phase<N>.json, diagnosis.json, evaluation.json, issues.md. A section whose
// phase did not run says so; a file that cannot be read is named in the page, not fatal.
#pragma once
#include <filesystem>
#include <string>

namespace tessera::report {

// The page for deployment directory `dir`. Throws tessera::Error when `dir` has no
// state.json (not a deployment).
std::string deployment_report_html(const std::filesystem::path& dir);

// Writes the page atomically to `out` (default: dir/report.html) and returns the path.
std::filesystem::path write_deployment_report(const std::filesystem::path& dir, const std::filesystem::path& out = {});

}  // namespace tessera::report
