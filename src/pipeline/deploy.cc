#include "pipeline/deploy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "pipeline/diagnose.h"
#include "pipeline/plan.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/sha256.h"

namespace tessera {

namespace fs = std::filesystem;

std::vector<std::filesystem::path> model_files(const std::string& model_path) {
  std::vector<fs::path> out;
  const fs::path path(model_path);
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && (e.path().extension() == ".safetensors" || e.path().filename() == "config.json"))
        out.push_back(e.path());
    std::sort(out.begin(), out.end());
  } else {
    out.push_back(path);
  }
  return out;
}

nlohmann::json model_fingerprint(const std::string& model_path) {
  // Size and modification time of every file the model is read from: cheap, and enough to
  // notice a checkpoint replaced under a deployment.
  nlohmann::json files = nlohmann::json::object();
  auto add = [&](const fs::path& p) {
    files[p.filename().string()] = {{"bytes", int64_t(fs::file_size(p))},
                                    {"mtime", int64_t(fs::last_write_time(p).time_since_epoch().count())}};
  };
  for (const fs::path& p : model_files(model_path)) add(p);
  return files;
}

nlohmann::json deployment_manifest(const Deployment& dep, const std::string& model_path) {
  nlohmann::json m = {{"format", "tessera-manifest/1"},
                      {"plan.json", sha256_file_hex(dep.file("plan.json").string())},
                      {"report.json", sha256_file_hex(dep.file("report.json").string())}};
  for (const fs::path& f : model_files(model_path)) m["model"][f.filename().string()] = sha256_file_hex(f.string());
  return m;
}

nlohmann::json deployment_identity(const Model& model, const DeployOptions& opts) {
  nlohmann::json id = {{"model_path", fs::absolute(model.path()).lexically_normal().string()},
                       {"model_fingerprint", model_fingerprint(model.path())},
                       {"target", opts.target},
                       {"faults", std::vector<std::string>(opts.faults.begin(), opts.faults.end())}};
  // A chosen plan or device is part of what was gated (absent: the target's defaults).
  if (!opts.plan_name.empty()) id["plan"] = opts.plan_name;
  if (!opts.device.empty()) id["device"] = opts.device;
  if (!opts.perturbations.empty()) id["perturbations"] = opts.perturbations;  // test scaffolding, from outside
  return id;
}

DeployOptions options_from_identity(const nlohmann::json& id) {
  DeployOptions d;
  d.model_path = id.at("model_path");
  d.target = id.at("target");
  for (const auto& f : id.value("faults", nlohmann::json::array())) d.faults.insert(f.get<std::string>());
  d.plan_name = id.value("plan", "");
  d.device = id.value("device", "");
  d.perturbations = id.value("perturbations", std::vector<std::string>{});
  return d;
}

std::string gate_summary_markdown(const Deployment& dep) {
  std::string md = "# Gate results\n\nEvery row names its thresholds (keys of the one table in src/gates).\n";
  for (const PhaseDef& p : phase_defs()) {
    const fs::path f = dep.file(fmt::format("phase{}.json", p.id));
    if (!fs::exists(f)) continue;
    const nlohmann::json j = read_json_file(f);
    md += fmt::format("\n## Phase {} ({}): {}\n\n{}\n", p.id, p.name, j.value("pass", false) ? "PASS" : "FAIL",
                      gates::GateResult::markdown_header());
    for (const auto& g : j["gates"]) md += gates::GateResult::from_json(g).markdown_row() + "\n";
  }
  return md;
}

namespace {

void write_kernel_registry(Deployment& dep, const StagedRunner& target, const PhaseOutcome& o) {
  nlohmann::json reg = {{"target", target.target()}, {"isa", target.isa()},
                        {"kernels", o.details.value("kernels", nlohmann::json::array())}};
  write_json_atomic(dep.file("kernel_registry.json"), reg);
  std::string md = fmt::format("# Kernel registry (phase 1)\n\nTarget {}, ISA {}. Each row of the op table: the target kernel "
                               "on the oracle's real layer-0 activations vs its oracle twin; \"expected\" is the error of the "
                               "twin emulated under the target's declared numerics, each limit a margin of {} above it (never "
                               "looser than the table's outer bound). kernel_registry.json has every metric and limit.\n\n",
                               target.target(), target.isa(), gates::threshold("phase1.margin"));
  md += "| kernel | role | shape | numerics | expected nmse | measured nmse | nmse limit | gain (expected) | pearson | "
        "verdict |\n|---|---|---|---|---|---|---|---|---|---|\n";
  // Metrics travel as numbers, or as "nan" / "inf" strings when not finite (gates.h).
  auto g3 = [](const nlohmann::json& v) { return v.is_number() ? fmt::format("{:.3g}", v.get<double>()) : v.get<std::string>(); };
  auto f6 = [](const nlohmann::json& v) { return v.is_number() ? fmt::format("{:.6f}", v.get<double>()) : v.get<std::string>(); };
  for (const auto& k : reg["kernels"]) {
    const auto& m = k["metrics"];
    const nlohmann::json none = "-";
    const auto& e = k.value("expected", nlohmann::json::object());
    const auto& l = k.value("limits", nlohmann::json::object());
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |\n", k["kernel"].get<std::string>(),
                      gates::markdown_cell(k["role"].get<std::string>()), k["shape"].get<std::string>(), k.value("numerics", ""),
                      g3(e.value("nmse", none)), g3(m["nmse"]), g3(l.value("nmse", none)), f6(m["gain"]),
                      f6(e.value("gain", none)), f6(m["pearson"]), k["pass"].get<bool>() ? "PASS" : "FAIL");
  }
  write_file_atomic(dep.file("kernel_registry.md"), md);
}

void write_report(Deployment& dep) {
  nlohmann::json report = {{"format", "tessera-report/1"}, {"identity", dep.identity()}, {"phases", nlohmann::json::object()}};
  for (const PhaseDef& p : phase_defs()) {
    nlohmann::json r = dep.phase_record(p.id);
    const fs::path f = dep.file(fmt::format("phase{}.json", p.id));
    if (fs::exists(f)) {
      const nlohmann::json j = read_json_file(f);
      int passed = 0;
      for (const auto& g : j["gates"]) passed += gates::GateResult::from_json(g).pass();
      r["gates_passed"] = passed;
      r["gates_total"] = j["gates"].size();
      // The figures, trajectories and reference status the phases recorded, by what they are.
      const nlohmann::json& d = j["details"];
      if (d.contains("target_timing")) report["figures"]["phase6_target_timing"] = d["target_timing"];
      if (d.contains("target_predicted")) report["figures"]["predicted"] = d["target_predicted"];
      if (d.contains("steps")) report["optimization"][std::to_string(p.id)] = d;
      if (d.contains("reference")) report["reference"] = d["reference"];
    }
    report["phases"][std::to_string(p.id)] = r;
  }
  write_json_atomic(dep.file("report.json"), report);
}

void write_plan_files(Deployment& dep, const nlohmann::json& plan) {
  write_json_atomic(dep.file("plan.json"), plan);
  write_file_atomic(dep.file("plan.md"), plan_markdown(plan, dep.state()));
}

// What is rendered from state.json and the phase records (plan.md, phase_timing.md,
// gates.md, report.json): rewritten after every phase, and idempotent.
void write_derived_files(Deployment& dep) {
  if (fs::exists(dep.file("plan.json"))) write_file_atomic(dep.file("plan.md"), plan_markdown(read_json_file(dep.file("plan.json")), dep.state()));
  dep.write_phase_timing();
  write_file_atomic(dep.file("gates.md"), gate_summary_markdown(dep));
  write_report(dep);
}

// What phases 1, 4-5 and 6 leave beside their records.
void record_kernels_and_first_plan(Deployment& dep, PhaseContext& ctx, const PhaseOutcome& o) {
  write_kernel_registry(dep, ctx.target(), o);
  write_plan_files(dep, ctx.target().build_plan(ctx.model));
  fs::remove(dep.file("plan_validated.json"));  // phase 4 keeps aside the plan phases 1-3 gate
}
void record_trajectory(Deployment& dep, PhaseContext&, const PhaseOutcome&) { write_perf_trajectory(dep); }
void record_frozen_plan(Deployment& dep, PhaseContext& ctx, const PhaseOutcome& o) {
  if (!o.pass) return;
  nlohmann::json plan = read_json_file(dep.file("plan.json"));
  plan["frozen"] = true;
  plan["op_counters_phase6"] = ctx.target().op_counters();
  write_json_atomic(dep.file("plan.json"), plan);
  dep.set_phase(6, {{"plan_sha256", plan_hash(plan)}});
}

std::vector<PhaseDef>& phase_registry() {
  static std::vector<PhaseDef> defs = {
      {0, "oracle", "load the model, build the FP32 oracle, check it", run_phase0_oracle},
      {1, "kernels", "every (kernel, shape) the model needs on the target vs the oracle's kernel", run_phase1_kernels,
       record_kernels_and_first_plan},
      {2, "block", "layer 0 wired on the target with real prompt activations; bisect on failure", run_phase2_block},
      {3, "model", "all layers on the target over the canonical prompts, and each layer alone from the oracle's input",
       run_phase3_model},
      {4, "prefill-opt", "the target's optimization skills rewrite the plan for prefill, each gated and measured",
       run_phase4_prefill_opt, record_trajectory, true},
      {5, "decode-opt", "the target's optimization skills rewrite the plan for decode, each gated and measured",
       run_phase5_decode_opt, record_trajectory, true},
      {6, "integrate", "one prefill+decode runner, greedy match vs the oracle, plan frozen", run_phase6_integrate,
       record_frozen_plan},
      {7, "evaluate", "independent evaluator: `tessera audit DIR`, in its own process"},
  };
  return defs;
}

}  // namespace

const std::vector<PhaseDef>& phase_defs() { return phase_registry(); }

void register_phase(const PhaseDef& def) {
  std::vector<PhaseDef>& defs = phase_registry();
  for (const PhaseDef& d : defs)
    if (d.id == def.id) fail("phase {} is already registered ({})", def.id, d.name);
  defs.insert(std::upper_bound(defs.begin(), defs.end(), def, [](const PhaseDef& a, const PhaseDef& b) { return a.id < b.id; }),
              def);
}

DeployResult deploy(const DeployOptions& opts) {
  const std::vector<std::string> targets = target_names();
  if (std::find(targets.begin(), targets.end(), opts.target) == targets.end())
    fail("target '{}' is not available in this version (targets: {})", opts.target, fmt::join(targets, ", "));
  check_target_options(opts.target, target_options(opts));
  if (opts.from_phase >= 0 && !phase_def(opts.from_phase).implemented())
    fail("--from-phase {}: phase {} ({}) is not implemented in this version", opts.from_phase, opts.from_phase,
         phase_def(opts.from_phase).name);
  Model model = Model::open(opts.model_path);
  Deployment dep = Deployment::open_for_deploy(opts.out_dir, deployment_identity(model, opts));
  if (opts.from_phase >= 0) dep.invalidate_from(opts.from_phase);
  PhaseContext ctx(dep, model, opts);
  auto say = [&](const std::string& s) {
    if (!opts.quiet) fmt::print(stderr, "{}\n", s);
  };
  say(fmt::format("tessera deploy: {} ({}) on {} -> {}", model.path(), arch_name(model.spec().arch), opts.target, opts.out_dir));
  if (!opts.faults.empty()) say(fmt::format("  injected faults: {}", fmt::join(opts.faults, ", ")));
  if (!opts.perturbations.empty()) say(fmt::format("  perturbations: {}", fmt::join(opts.perturbations, ", ")));

  DeployResult result;
  for (const PhaseDef& p : phase_defs()) {
    if (!p.implemented()) continue;
    if (phase_done(dep.phase_status(p.id))) {
      say(fmt::format("phase {} {}: {} in an earlier run (resumed)", p.id, p.name, dep.phase_status(p.id)));
      // The later phases run the plan the optimization phases left.
      if (p.rewrites_plan) ctx.use_plan(read_json_file(dep.file("plan.json")));
      continue;
    }
    say(fmt::format("phase {} {}: {}", p.id, p.name, p.does));
    const auto t0 = std::chrono::steady_clock::now();
    dep.set_phase(p.id, {{"status", "running"}, {"started", now_iso8601()}});
    PhaseOutcome o;
    try {
      o = p.run(ctx);
    } catch (const IoError&) {
      throw;  // a full disk or a read-only directory: not the phase's verdict (state says it is still running)
    } catch (const Error& e) {
      // The target refused to run what the phase asked (npusim's checker refusing a
      // mapping, a kernel without a mapping for a shape): the phase fails with the reason.
      const std::string what = e.what();
      o = PhaseOutcome{};
      o.summary = "the target refused: " + what.substr(0, what.find('\n'));
      o.diagnosis = "The target refused to run this phase's work:\n\n" + what;
      o.details = {{"refused", what}};
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& g : o.gates) rows.push_back(g.to_json());
    const nlohmann::json record = {{"phase", p.id}, {"name", p.name}, {"pass", o.pass}, {"summary", o.summary},
                                   {"gates", rows}, {"details", o.details}, {"diagnosis", o.diagnosis}};
    write_json_atomic(dep.file(fmt::format("phase{}.json", p.id)), record);
    if (p.record) p.record(dep, ctx, o);
    const std::string status = !o.pass ? "failed" : o.status.empty() ? "passed" : o.status;
    dep.set_phase(p.id, {{"status", status}, {"finished", now_iso8601()}, {"wall_s", wall}, {"summary", o.summary}});
    write_derived_files(dep);
    say(fmt::format("  -> {} ({:.1f} s): {}", !o.pass ? "FAIL" : status == "passed" ? "PASS" : "UNVERIFIED", wall, o.summary));
    if (!o.pass) {
      std::string body = o.diagnosis + "\n\nFailing gate rows:\n\n" + gates::GateResult::markdown_header() + "\n";
      for (const auto& g : o.gates)
        if (!g.pass()) body += g.markdown_row() + "\n";
      // The debug skills that match the failure run by themselves (their experiments use
      // a fresh runner, so the failing one's state does not leak into them).
      say("  running the debug skills that match the failure");
      const std::vector<Diagnosis> ds = run_debug_skills(ctx, Failure{p.id, record});
      nlohmann::json dj = nlohmann::json::array();
      for (const Diagnosis& d : ds) dj.push_back(d.to_json());
      write_json_atomic(dep.file("diagnosis.json"), {{"phase", p.id}, {"diagnoses", dj}});
      const std::string skills_md = diagnoses_markdown(ds);
      body += "\n" + skills_md;
      dep.append_issue(p.id, "gate failed", body);
      result.failed_phase = p.id;
      result.diagnosis = o.diagnosis + "\n" + skills_md.substr(0, skills_md.find('\n'));
      return result;
    }
  }
  // The derived files once more: a run killed after the last phase's status was saved but
  // before they were rewritten left them one phase behind, and the manifest hashes report.json.
  write_derived_files(dep);
  // What phase 7 checks the deployment against: hashes of what was gated and reported.
  write_json_atomic(dep.file("manifest.json"), deployment_manifest(dep, model.path()));
  result.pass = true;
  return result;
}

}  // namespace tessera
