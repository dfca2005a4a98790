// `tessera campaign`: deploy models on targets and write one results table (eval/campaign.h).
#include <fmt/format.h>

#include "cli/commands.h"
#include "eval/campaign.h"
#include "model/presets.h"
#include "pipeline/deployment.h"
#include "report/report.h"
#include "targets/registry.h"

namespace tessera::cli {

namespace {

struct CampaignArgs {
  std::vector<std::string> models;
  std::vector<std::string> targets;
  std::string work = "campaign";
  bool tiny = false;
  int threads = 0;
  bool quiet = false;
};

int run_campaign_cmd(const CampaignArgs& a) {
  CampaignOptions o;
  o.models = a.models;
  if (o.models.empty())
    for (const Preset& p : presets()) o.models.push_back(p.name);
  o.targets = a.targets.empty() ? target_names() : a.targets;
  o.work_dir = a.work;
  o.tiny = a.tiny;
  o.threads = a.threads;
  o.quiet = a.quiet;
  const CampaignResult r = run_campaign(o);
  // The pages: each deployment's report.html and WORK/results.html (the table and its charts).
  const std::filesystem::path work(a.work);
  for (const CampaignRow& row : r.rows) {
    const std::filesystem::path dir = work / fmt::format("{}-{}", row.model, row.target);
    try {
      if (std::filesystem::exists(dir / "state.json")) report::write_deployment_report(dir);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}/report.html not written: {}\n", dir.string(), e.what());
    }
  }
  write_file_atomic(work / "results.html", report::campaign_results_html(r.to_json()));
  fmt::print("{}\n(written to {}/results.md, results.json and results.html)\n", r.markdown(), a.work);
  for (const CampaignRow& row : r.rows)
    if (!row.deployed) return 3;
  return 0;
}

}  // namespace

void add_campaign_command(CLI::App& app) {
  auto a = std::make_shared<CampaignArgs>();
  CLI::App* cmd = app.add_subcommand(
      "campaign",
      "Deploy models on targets through every gate and write one results table (WORK/results.md, .json, and .html\n"
      "with charts of eta_scale and deploy wall time; each deployment's report.html beside it): phases and\n"
      "gates passed, prefill and decode tokens/s, dispatches per layer, deployment wall time, and eta_scale against\n"
      "Llama-3.2-1B on the same target. Presets are synthesized (full size, or --tiny) into WORK/models; deployments\n"
      "resume. Exit status: 0 every deployment passed, 3 one did not, 1 bad input.");
  cmd->add_option("--models", a->models, "Preset names or model paths (default: all 11 presets)")->delimiter(',');
  cmd->add_option("--targets", a->targets, "Targets (default: all)")->delimiter(',');
  cmd->add_option("--work", a->work, "Work directory: models, deployments, results")->capture_default_str();
  cmd->add_flag("--tiny", a->tiny, "Presets in their tiny form");
  cmd->add_option("--threads", a->threads, "Worker threads (default: all cores)");
  cmd->add_flag("--quiet", a->quiet, "No progress lines on stderr");
  cmd->callback([a] {
    const int rc = run_campaign_cmd(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace tessera::cli
