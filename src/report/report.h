// The deployment report (`tessera report DIR`, written by `deploy` at its end and refreshed
// by `audit`): one self-contained HTML page (inline CSS and SVG charts, no scripts, no
// external reference) built from the deployment directory alone: state.json, plan.json,
// report.json, phase<N>.json, diagnosis.json, evaluation.json, issues.md. A section whose
// phase did not run says so; a file that cannot be read is named in the page, not fatal.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::report {

// The page for deployment directory `dir`. Throws tessera::Error when `dir` has no
// state.json (not a deployment).
std::string deployment_report_html(const std::filesystem::path& dir);

// Writes the page atomically to `out` (default: dir/report.html) and returns the path.
std::filesystem::path write_deployment_report(const std::filesystem::path& dir, const std::filesystem::path& out = {});

// `tessera report A B`: two deployments side by side (identity, every phase's verdict, the
// figures, phase 1's worst kernels) and phase 3's per-layer cosines of both overlaid.
std::string comparison_report_html(const std::filesystem::path& a, const std::filesystem::path& b);

// `tessera campaign`'s WORK/results.html from its results.json (eval/campaign.h): the table,
// eta_scale per model and target (prefill and decode, the reference at 1), and each
// deployment's wall time.
std::string campaign_results_html(const nlohmann::json& results);

// The page's frame: <!DOCTYPE html>, the inline style, `body` (already escaped HTML).
std::string html_page(const std::string& title, const std::string& body);

}  // namespace tessera::report
