#include "eval/campaign.h"

#include <fmt/format.h>

#include <filesystem>

#include "model/presets.h"
#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "pipeline/executor.h"
#include "synth/synth.h"
#include "targets/registry.h"
#include "targets/staged_runner.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr const char* kReference = "Llama-3.2-1B";

bool is_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return true;
  return false;
}

// A preset's checkpoint in WORK/models/<name>[-tiny], synthesized once; a path as it is.
std::string model_path_for(const CampaignOptions& o, const std::string& model) {
  if (!is_preset(model)) return model;
  const fs::path dir = fs::path(o.work_dir) / "models" / (model + (o.tiny ? "-tiny" : ""));
  if (!fs::exists(dir / "config.json")) {
    if (!o.quiet) fmt::print(stderr, "campaign: synthesizing {}{} into {}\n", model, o.tiny ? " (tiny)" : "", dir.string());
    SynthOptions s;
    s.preset = model;
    s.tiny = o.tiny;
    s.out_dir = dir.string();
    synth(s);
  }
  return dir.string();
}

std::string label(const std::string& model) { return fs::path(model).filename().string(); }

// What a finished (or failed) deployment directory says, plus its figures when it passed.
void read_deployment(CampaignRow& row, const fs::path& dir, int threads) {
  const Deployment dep = Deployment::open_existing(dir);
  for (const PhaseDef& p : phase_defs()) {
    if (!p.implemented()) continue;
    ++row.phases_total;
    row.wall_s += dep.phase_record(p.id).value("wall_s", 0.0);  // the last run of each phase, as phase_timing.md
    if (phase_done(dep.phase_status(p.id))) ++row.phases_passed;
    else if (row.failure.empty() && dep.phase_status(p.id) == "failed")
      row.failure = fmt::format("phase {}: {}", p.id, dep.phase_record(p.id).value("summary", ""));
  }
  const nlohmann::json report = read_json_file(dep.file("report.json"));
  const nlohmann::json phases = report.value("phases", nlohmann::json::object());
  for (const auto& [id, r] : phases.items()) {
    row.gates_passed += int(json_integer_or(r, "gates_passed", "report.json: 'gates_passed'", 0, 0, 1 << 20));
    row.gates_total += int(json_integer_or(r, "gates_total", "report.json: 'gates_total'", 0, 0, 1 << 20));
  }
  row.deployed = row.phases_passed == row.phases_total;
  if (!row.deployed) return;
  const nlohmann::json plan = read_json_file(dep.file("plan.json"));
  // A plan of dispatches (a modelled NPU's section names its plan): dispatches per layer.
  const nlohmann::json own = plan.value(plan.value("target", ""), nlohmann::json::object());
  if (own.is_object() && own.contains("plan") && own.at("plan").contains("prefill")) {
    const nlohmann::json& np = own.at("plan");  // at(): a const operator[] on a missing key is undefined
    auto per_layer = [&](const char* pass) {
      return json_integer_or(np.at(pass), "npu_dispatches_per_layer", "plan.json: npu_dispatches_per_layer", 0);
    };
    row.dispatches_per_layer = fmt::format("{}/{}", per_layer("prefill"), per_layer("decode"));
  } else {
    row.dispatches_per_layer = "-";
  }
  // The frozen plan's own figures, through what `tessera run` executes.
  ExecutorOptions eo;
  eo.threads = threads;
  Executor ex = open_executor(dir.string(), eo);
  auto* runner = dynamic_cast<StagedRunner*>(ex.runner.get());
  if (!runner) fail("campaign: {} does not run on a staged target", dir.string());
  const PassFigure pf = runner->measure(Pass::Prefill), df = runner->measure(Pass::Decode);
  row.figures = pf.predicted ? "predicted" : "measured";
  // measure() reports seconds per pass: prefill of a fixed token count, decode per token.
  const int64_t prefill_tokens = pf.predicted ? 2048 : std::max<int64_t>(1, std::min<int64_t>(128, runner->spec().max_position - 9));
  row.prefill_tok_s = double(prefill_tokens) / pf.seconds;
  row.decode_tok_s = 1.0 / df.seconds;
}

std::string fmt_rate(double v) { return v <= 0 ? "-" : v >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.2f}", v); }
std::string fmt_eta(double v) { return v <= 0 ? "-" : fmt::format("{:.2f}", v); }

void fill_eta(std::vector<CampaignRow>& rows) {
  for (CampaignRow& r : rows) {
    r.eta_prefill = r.eta_decode = 0;
    const CampaignRow* ref = nullptr;
    for (const CampaignRow& q : rows)
      if (q.target == r.target && q.model == kReference && q.deployed) ref = &q;
    if (!ref || !r.deployed) continue;
    const double rp = double(ref->parameters);
    r.eta_prefill = double(r.parameters) * r.prefill_tok_s / (rp * ref->prefill_tok_s);
    r.eta_decode = double(r.parameters) * r.decode_tok_s / (rp * ref->decode_tok_s);
  }
}

}  // namespace

nlohmann::json CampaignResult::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (const CampaignRow& r : rows)
    rows_j.push_back({{"model", r.model},
                      {"target", r.target},
                      {"parameters", r.parameters},
                      {"phases_passed", r.phases_passed},
                      {"phases_total", r.phases_total},
                      {"gates_passed", r.gates_passed},
                      {"gates_total", r.gates_total},
                      {"deployed", r.deployed},
                      {"failure", r.failure},
                      {"prefill_tokens_per_s", r.prefill_tok_s},
                      {"decode_tokens_per_s", r.decode_tok_s},
                      {"figures", r.figures},
                      {"dispatches_per_layer", r.dispatches_per_layer},
                      {"deploy_wall_s", r.wall_s},
                      {"eta_scale_prefill", r.eta_prefill},
                      {"eta_scale_decode", r.eta_decode}});
  return {{"format", "tessera-campaign/1"}, {"reference", kReference}, {"rows", rows_j}};
}

std::string CampaignResult::markdown() const {
  std::string md =
      "# Campaign results\n\n"
      "Per model and target: phases passed (0-6), gate rows passed, prefill and decode tokens/s (npusim: the timing "
      "model's prediction for a 2048-token prefill and a decode step at 512; cpu: measured wall time of the frozen plan, "
      "128-token prefill), NPU dispatches per layer (prefill/decode), the deployment's wall time (its phases' last runs), "
      "and eta_scale = "
      "(parameters x tokens/s) / (Llama-3.2-1B's parameters x tokens/s) on the same target.\n\n"
      "| model | target | params | phases | gates | prefill tok/s | decode tok/s | figures | dispatches/layer | deploy wall s | "
      "eta prefill | eta decode |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const CampaignRow& r : rows)
    md += fmt::format("| {} | {} | {:.2f}B | {}/{} | {}/{} | {} | {} | {} | {} | {:.1f} | {} | {} |\n", r.model, r.target,
                      double(r.parameters) / 1e9, r.phases_passed, r.phases_total, r.gates_passed, r.gates_total,
                      fmt_rate(r.prefill_tok_s), fmt_rate(r.decode_tok_s), r.figures.empty() ? "-" : r.figures,
                      r.dispatches_per_layer.empty() ? "-" : r.dispatches_per_layer, r.wall_s, fmt_eta(r.eta_prefill),
                      fmt_eta(r.eta_decode));
  for (const CampaignRow& r : rows)
    if (!r.failure.empty()) md += fmt::format("\n- {} on {}: {}", r.model, r.target, r.failure);
  return md + "\n";
}

CampaignResult run_campaign(const CampaignOptions& o) {
  if (o.models.empty() || o.targets.empty()) fail("campaign: name at least one model and one target");
  for (const std::string& t : o.targets) target_def(t);  // throws listing the targets
  fs::create_directories(o.work_dir);
  CampaignResult result;
  auto save = [&] {
    fill_eta(result.rows);
    write_file_atomic(fs::path(o.work_dir) / "results.md", result.markdown());
    write_json_atomic(fs::path(o.work_dir) / "results.json", result.to_json());
  };
  for (const std::string& model : o.models) {
    const std::string path = model_path_for(o, model);
    for (const std::string& target : o.targets) {
      CampaignRow row;
      row.model = is_preset(model) ? model : label(model);
      row.target = target;
      row.parameters = count_params(Model::open(path).spec());
      const fs::path dir = fs::path(o.work_dir) / fmt::format("{}-{}", row.model, target);
      DeployOptions d;
      d.model_path = path;
      d.out_dir = dir.string();
      d.target = target;
      d.threads = o.threads;
      d.quiet = o.quiet;
      if (!o.quiet) fmt::print(stderr, "campaign: {} on {} -> {}\n", row.model, target, dir.string());
      try {
        deploy(d);
        read_deployment(row, dir, o.threads);
      } catch (const Error& e) {
        row.failure = e.what();
      }
      result.rows.push_back(std::move(row));
      save();
    }
  }
  return result;
}

}  // namespace tessera
