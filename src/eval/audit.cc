#include "eval/audit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "gates/gates.h"
#include "pipeline/deploy.h"
#include "pipeline/deployment.h"
#include "pipeline/phases.h"
#include "pipeline/plan.h"
#include "util/error.h"
#include "util/sha256.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr int kLastPhase = 6;
constexpr double kMeasuredTolerance = 0.10;  // a measured figure must reproduce within 10%
constexpr int kMeasureTries = 5;             // re-measurements a measured figure gets
// Below this much measured work a 10% difference is timer and scheduler noise (a tiny
// model's step takes microseconds): only the 2x rule applies there.
constexpr double kNoiseFloorS = 0.05;
constexpr int kDeterminismTokens = 8;  // greedy tokens compared between the two runs

// Prompts no earlier phase feeds the model (canonical_prompts are phases 3-6's): empty-ish
// whitespace, non-Latin scripts and emoji, a long repetition, digits, markup.
const char* const kAdversarialPrompts[] = {
    "\n\n\t  \n",
    "Ünïcödé: 東京, Ελλάδα, Москва 🙂🚀",
    "again and again and again and again and again and again and again and again and again and again and again",
    "3.14159265358979323846264338327950288419716939937510",
    "<html><body><p class=\"x\">{{ }}</p></body></html>",
};

struct Auditor {
  AuditResult& r;
  void add(const std::string& check, const std::string& verdict, const std::string& detail) {
    r.findings.push_back({check, verdict, detail});
  }
};

bool check_holds(double value, const std::string& op, double limit) {
  if (op == ">=") return value >= limit;
  if (op == "<=") return value <= limit;
  if (op == "==") return value == limit;
  return false;
}

// Every stored gate row: limits from the built-in table, verdicts that follow from values.
void audit_thresholds(Auditor& a, const Deployment& dep) {
  int rows = 0;
  std::vector<std::string> problems;
  for (int p = 0; p <= kLastPhase; ++p) {
    const fs::path f = dep.file(fmt::format("phase{}.json", p));
    if (!fs::exists(f)) continue;
    const nlohmann::json phase = read_json_file(f);
    for (const nlohmann::json& row : phase.at("gates")) {
      ++rows;
      const gates::GateResult g = gates::GateResult::from_json(row);
      for (const gates::Check& c : g.checks) {
        double limit = c.limit;
        if (c.threshold.starts_with("derived:")) {
          // A limit derived for the row (phase 1): held to the table's outer bound, never looser.
          const std::string key = c.threshold.substr(8);
          const auto it = gates::thresholds().find(key);
          if (it == gates::thresholds().end()) {
            problems.push_back(fmt::format("phase {} '{}': outer bound '{}' is not in the built-in table", p, g.subject, key));
            continue;
          }
          const double outer = it->second.value;
          const bool upper = c.op == "<=" || c.op == "<";
          if (upper ? !(c.limit <= outer) : !(c.limit >= outer))
            problems.push_back(fmt::format("phase {} '{}': {} held to {} {}, looser than the outer bound {} ({})", p, g.subject,
                                           c.metric, c.op, c.limit, outer, key));
        } else if (!c.threshold.empty()) {
          const auto it = gates::thresholds().find(c.threshold);
          if (it == gates::thresholds().end()) {
            problems.push_back(fmt::format("phase {} '{}': threshold '{}' is not in the built-in table", p, g.subject,
                                           c.threshold));
            continue;
          }
          limit = it->second.value;
          if (c.limit != limit)
            problems.push_back(fmt::format("phase {} '{}': {} held to {} {} (stored '{}'), built-in {}", p, g.subject,
                                           c.metric, c.op, c.limit, c.threshold, limit));
        }
        if (c.pass && !check_holds(c.value, c.op, limit))
          problems.push_back(fmt::format("phase {} '{}': {} = {} recorded as passing {} {}", p, g.subject, c.metric,
                                         c.value, c.op, limit));
      }
    }
  }
  if (problems.empty())
    a.add("thresholds", "pass", fmt::format("{} stored gate rows: every limit is the built-in one and every verdict "
                                            "follows from its value", rows));
  else
    a.add("thresholds", "fail", fmt::format("{} problem(s): {}", problems.size(), problems.front()));
}

}  // namespace

std::vector<std::string> manifest_problems(const nlohmann::json& m, const Deployment& dep) {
  if (!m.is_object()) return {fmt::format("manifest.json is damaged: a JSON {}, not an object", m.type_name())};
  std::vector<std::string> bad;
  // The recorded hash of `key` in `table`, or "" when it is absent or not a string.
  auto recorded = [](const nlohmann::json& table, const std::string& key) {
    const auto it = table.find(key);
    return it != table.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const char* f : {"plan.json", "report.json"})
    if (recorded(m, f) != sha256_file_hex(dep.file(f).string())) bad.push_back(fmt::format("{} edited after the deploy", f));
  const auto model = m.find("model");
  if (model == m.end() || !model->is_object()) {
    bad.push_back("manifest.json is damaged: no table of the model's files");
    return bad;
  }
  const nlohmann::json identity = dep.identity();
  const auto path = identity.find("model_path");
  if (path == identity.end() || !path->is_string()) {
    bad.push_back("state.json names no model path to check the model's files");
    return bad;
  }
  for (const fs::path& f : model_files(path->get<std::string>())) {
    const std::string name = f.filename().string();
    if (!model->contains(name))
      bad.push_back(fmt::format("model file {} is not in the manifest", name));
    else if (recorded(*model, name) != sha256_file_hex(f.string()))
      bad.push_back(fmt::format("model file {} changed since the deploy", name));
  }
  return bad;
}

namespace {

void audit_hashes(Auditor& a, const Deployment& dep, const nlohmann::json& plan) {
  std::vector<std::string> bad;
  const nlohmann::json rec6 = dep.phase_record(6);
  if (rec6.value("plan_sha256", "") != plan_hash(plan)) bad.push_back("plan.json differs from the plan phase 6 froze");
  if (!fs::exists(dep.file("manifest.json"))) {
    a.add("hashes", "fail", "no manifest.json: the deployment did not finish (or it was removed)");
    return;
  }
  try {
    for (std::string& p : manifest_problems(read_json_file(dep.file("manifest.json")), dep)) bad.push_back(std::move(p));
  } catch (const Error& e) {  // not JSON at all
    bad.push_back(e.what());
  }
  if (bad.empty())
    a.add("hashes", "pass", "plan.json, report.json and the model's files hash as recorded");
  else
    a.add("hashes", "fail", fmt::format("{}", fmt::join(bad, "; ")));
}

// The stages a plan runs on the target and the host ops it lists.
void audit_op_counters(Auditor& a, const nlohmann::json& plan, const std::map<std::string, int64_t>& counters) {
  std::set<std::string> on_target, host_ops;
  for (const auto& h : plan.value("host_ops", nlohmann::json::array())) host_ops.insert(h.get<std::string>());
  const nlohmann::json dispatches = plan.value("dispatches", nlohmann::json::array());
  for (const auto& d : dispatches)
    for (const auto& op : d.at("ops"))
      if (op.value("on", "") != "host") on_target.insert(op.at("op").get<std::string>());
  if (on_target.empty())  // a plan without dispatches (the cpu's): every stage on the target
    for (int i = 0; i < kStageCount; ++i) on_target.insert(stage_name(Stage(i)));
  // A host op that no pass places on the target is not expected among the target's counters.
  for (const std::string& h : host_ops)
    if (std::all_of(dispatches.begin(), dispatches.end(), [&](const nlohmann::json& d) {
          for (const auto& op : d.at("ops"))
            if (op.at("op") == h && op.value("on", "") != "host") return false;
          return true;
        }))
      on_target.erase(h);
  std::vector<std::string> bad;
  for (const auto& [name, n] : counters) {
    if (name.starts_with("oracle:")) bad.push_back(fmt::format("{} ran {} times by the oracle", name.substr(7), n));
    if (name.starts_with("host:")) {
      std::string op = name.substr(5);
      if (op.ends_with(".softmax")) op = op.substr(0, op.size() - 8);
      if (!host_ops.count(op) && !host_ops.count(op + " (softmax)"))
        bad.push_back(fmt::format("{} ran {} times on the host, which the plan does not list", op, n));
    }
  }
  for (const std::string& op : on_target)
    if (!counters.count(op)) bad.push_back(fmt::format("{} never ran on the target", op));
  if (bad.empty())
    a.add("op-counters", "pass", fmt::format("{} ops the plan puts on the target all ran there; host ops as listed ({})",
                                             on_target.size(), host_ops.size()));
  else
    a.add("op-counters", "fail", fmt::format("{}", fmt::join(bad, "; ")));
}

// Every numeric leaf of `claimed` found in `now` at the same path and exactly equal.
void compare_exact(const nlohmann::json& claimed, const nlohmann::json& now, const std::string& path,
                   std::vector<std::string>& bad) {
  if (claimed.is_object()) {
    for (const auto& [k, v] : claimed.items()) {
      if (!now.contains(k)) {
        if (v.is_number()) bad.push_back(fmt::format("{}{} is not re-derived", path, k));
        continue;
      }
      compare_exact(v, now.at(k), path + k + ".", bad);
    }
  } else if (claimed.is_number() && (!now.is_number() || claimed.get<double>() != now.get<double>())) {
    bad.push_back(fmt::format("{} claims {} but reproduces as {}", path.substr(0, path.size() - 1), claimed.dump(), now.dump()));
  }
}

// Tokens per second of the target on phase 6's prompts, computed the way phase 6 does, and
// the seconds all of it took.
struct Rates {
  double prefill = 0, decode = 0, seconds = 0;
};
Rates measure_phase6_rates(PhaseContext& ctx) {
  const int n = int(gates::threshold("phase6.tokens")), k = int(gates::threshold("phase6.topk"));
  double pt = 0, ps = 0, dt = 0, ds = 0;
  for (const CanonicalPrompt& p : phase6_prompts(ctx)) {
    const Greedy g = greedy(ctx.target(), p.ids, n, k);
    pt += double(p.ids.size());
    ps += g.prefill_s;
    dt += double(g.tokens.size() - 1);
    ds += g.decode_s;
  }
  return {ps > 0 ? pt / ps : 0, ds > 0 ? dt / ds : 0, ps + ds};
}

void audit_figures(Auditor& a, PhaseContext& ctx, const nlohmann::json& report, bool remeasure) {
  const nlohmann::json figures = report.value("figures", nlohmann::json::object());
  std::vector<std::string> bad, warn, skipped;
  int checked = 0;
  if (figures.contains("predicted")) {  // a modelled target: deterministic, so exact
    compare_exact(figures["predicted"], ctx.target().predicted_figures(), "predicted.", bad);
    ++checked;
  }
  if (report.contains("optimization") && report["optimization"].contains("5")) {
    const nlohmann::json& o = report["optimization"]["5"];
    const double claimed = o.value("final_s", 0.0);
    if (o.value("predicted", false)) {  // the timing model's: exact
      const double now = ctx.target().measure(Pass::Decode).seconds;
      ++checked;
      if (claimed != now)
        bad.push_back(fmt::format("phase 5's final decode figure claims {:.6f} ms, reproduces as {:.6f} ms", claimed * 1e3,
                                  now * 1e3));
    } else if (!remeasure) {
      skipped.push_back("phase 5's final decode figure");
    } else {  // a wall time: best of a few
      double now = ctx.target().measure(Pass::Decode).seconds;
      for (int i = 1; i < kMeasureTries && now / claimed - 1 > kMeasuredTolerance; ++i)
        now = std::min(now, ctx.target().measure(Pass::Decode).seconds);
      ++checked;
      if (now / claimed - 1 > (now < kNoiseFloorS ? 1.0 : kMeasuredTolerance))  // claimed faster than it measures
        (claimed * 2 < now ? bad : warn)
            .push_back(fmt::format("phase 5's final decode figure {:.3f} ms measures {:.3f} ms now", claimed * 1e3, now * 1e3));
    }
  }
  if (figures.contains("phase6_target_timing") && !remeasure) {
    skipped.push_back("phase 6 timing");
  } else if (figures.contains("phase6_target_timing")) {
    const nlohmann::json& t = figures["phase6_target_timing"];
    const double cp = t.value("prefill_tokens_per_s", 0.0), cd = t.value("decode_tokens_per_s", 0.0);
    // Best of a few runs: the question is whether this machine reaches the claim. Only a
    // claim above what the machine does is a finding; a figure that measures faster now
    // than phase 6 recorded (its runs start cold) overstates nothing.
    double over = 1e9, mp = 0, md = 0, ms = 0;
    for (int i = 0; i < kMeasureTries && over > kMeasuredTolerance; ++i) {
      const Rates m = measure_phase6_rates(ctx);
      const double o = std::max(cp / std::max(m.prefill, 1e-12), cd / std::max(m.decode, 1e-12)) - 1;
      if (o < over) over = o, mp = m.prefill, md = m.decode, ms = m.seconds;
    }
    checked += 2;
    if (over > (ms < kNoiseFloorS ? 1.0 : kMeasuredTolerance)) {
      const std::string line = fmt::format("phase 6 timing claims prefill {:.1f} / decode {:.1f} tok/s, best of {} runs "
                                           "measures {:.1f} / {:.1f}",
                                           cp, cd, kMeasureTries, mp, md);
      (over > 1 ? bad : warn).push_back(line);
    }
  }
  if (!bad.empty())
    a.add("figures", "fail", fmt::format("{}", fmt::join(bad, "; ")));
  else if (!warn.empty())
    a.add("figures", "warn", fmt::format("off by more than {:.0f}%: {}", kMeasuredTolerance * 100, fmt::join(warn, "; ")));
  else
    a.add("figures", "pass",
          fmt::format("{} report figures reproduced{}", checked,
                      skipped.empty() ? "" : fmt::format("; not re-measured (--no-remeasure): {}", fmt::join(skipped, ", "))));
}

void audit_adversarial(Auditor& a, PhaseContext& ctx) {
  std::set<std::string> used;
  for (const CanonicalPrompt& p : ctx.prompts()) used.insert(p.text);
  int n = 0;
  std::vector<std::string> bad;
  for (const char* text : kAdversarialPrompts) {
    if (used.count(text)) continue;
    const CanonicalPrompt p{text, ctx.tokenizer().encode_prompt(text)};
    ctx.progress(fmt::format("[audit] adversarial prompt ({} tokens)", p.ids.size()));
    const nlohmann::json rec = model_gate_record(ctx, ctx.target(), p);
    const gates::GateResult g = gates::GateResult::from_json(rec.at("gate"));
    ++n;
    if (!g.pass()) bad.push_back(g.markdown_row());
  }
  if (bad.empty())
    a.add("adversarial", "pass", fmt::format("{} prompts no earlier phase used pass phase 3's gate", n));
  else
    a.add("adversarial", "fail", fmt::format("{} of {} fail phase 3's gate: {}", bad.size(), n, bad.front()));
}

void audit_determinism(Auditor& a, PhaseContext& ctx) {
  const CanonicalPrompt p = ctx.prompts().back();
  StagedRunner& t = ctx.target();
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> tokens;
  for (int run = 0; run < 2; ++run) {
    t.reset();
    logits.push_back(t.forward(p.ids, false));
    tokens.push_back(greedy(t, p.ids, kDeterminismTokens, 1).tokens);
  }
  const bool same_logits = logits[0].size() == logits[1].size() &&
                           std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
  if (same_logits && tokens[0] == tokens[1]) {
    a.add("determinism", "pass", fmt::format("\"{}\" twice: identical logits (bit for bit) and {} identical tokens", p.text, kDeterminismTokens));
    return;
  }
  int64_t differ = 0;
  for (size_t i = 0; i < std::min(logits[0].size(), logits[1].size()); ++i) differ += logits[0][i] != logits[1][i];
  a.add("determinism", "fail",
        fmt::format("\"{}\" twice: {} logits differ between the runs{}", p.text, differ,
                    tokens[0] == tokens[1] ? " (the tokens agree)" : " and the tokens differ"));
}

}  // namespace

std::string AuditResult::verdict() const {
  bool warn = false;
  for (const AuditFinding& f : findings) {
    if (f.verdict == "fail") return "FAIL";
    warn |= f.verdict == "warn";
  }
  return warn ? "PASS-with-warnings" : "PASS";
}

int AuditResult::exit_code() const {
  const std::string v = verdict();
  return v == "PASS" ? 0 : v == "FAIL" ? 3 : 2;
}

const AuditFinding* AuditResult::first_failure() const {
  for (const AuditFinding& f : findings)
    if (f.verdict == "fail") return &f;
  return nullptr;
}

nlohmann::json AuditResult::to_json() const {
  nlohmann::json j = {{"format", "tessera-evaluation/1"}, {"dir", dir}, {"verdict", verdict()}, {"findings", nlohmann::json::array()}};
  for (const AuditFinding& f : findings) j["findings"].push_back({{"check", f.check}, {"verdict", f.verdict}, {"detail", f.detail}});
  return j;
}

std::string AuditResult::markdown() const {
  std::string md = fmt::format("# Evaluation (phase 7)\n\nDeployment: `{}`\n\n**Verdict: {}**\n\n", dir, verdict());
  md += "Every check re-derived in a fresh process from the model file, the frozen plan and the built-in thresholds "
        "(`tessera audit`).\n\n| check | verdict | finding |\n|---|---|---|\n";
  for (const AuditFinding& f : findings) {
    std::string d = f.detail;
    std::replace(d.begin(), d.end(), '\n', ' ');
    std::string cell;
    for (char c : d) cell += c == '|' ? std::string("\\|") : std::string(1, c);
    md += fmt::format("| {} | {} | {} |\n", f.check, f.verdict == "pass" ? "pass" : f.verdict == "warn" ? "WARN" : "FAIL", cell);
  }
  return md;
}

AuditResult audit_deployment(const AuditOptions& opts) {
  Deployment dep = Deployment::open_existing(opts.dir);
  AuditResult r;
  r.dir = opts.dir;
  Auditor a{r};
  auto progress = [&](const std::string& line) {
    if (!opts.quiet) fmt::print(stderr, "  [audit] {}\n", line);
  };

  std::vector<std::string> missing;
  for (int p = 0; p <= kLastPhase; ++p)
    if (!phase_done(dep.phase_status(p))) missing.push_back(fmt::format("phase {} {}", p, dep.phase_status(p)));
  // Phase 0 without an independent reference: nothing proved the oracle equal to
  // transformers for this checkpoint, so the deployment is at best PASS-with-warnings.
  if (dep.phase_status(0) == "unverified")
    a.add("reference", "warn", "phase 0 is unverified: no transformers reference for this checkpoint (make one with "
                               "tools/reference/make_reference.py and pass it to deploy --reference)");
  else if (dep.phase_status(0) == "passed")
    a.add("reference", "pass", "phase 0 compared the oracle with a transformers reference made for this checkpoint");
  // A deployment made with injected faults or perturbations is a test of the gates, however
  // well it passed them; the evaluator's own perturbations (--perturb here) are a demonstration.
  if (const std::string altered = altered_on_purpose(dep.identity()); !altered.empty())
    a.add("provenance", "fail", "the deployment was " + altered);
  else
    a.add("provenance", "pass", "made from the model as it is: no injected fault, no perturbation");
  if (!opts.perturbations.empty())
    a.add("demonstration", "warn",
          fmt::format("the gates re-ran with the evaluator's perturbation(s) {} added: the findings below are "
                      "about that, not the deployment as made", fmt::join(opts.perturbations, ", ")));
  const bool have_plan = fs::exists(dep.file("plan.json"));
  const nlohmann::json plan = have_plan ? read_json_file(dep.file("plan.json")) : nlohmann::json::object();
  if (!plan.value("frozen", false)) missing.push_back("plan not frozen");
  a.add("complete", missing.empty() ? "pass" : "fail",
        missing.empty() ? "phases 0-6 passed; the plan is frozen" : fmt::format("{}", fmt::join(missing, "; ")));
  auto write_reports = [&] {
    write_file_atomic(dep.file("evaluation_report.md"), r.markdown());
    // Which state of the deployment was audited: a later deploy rewrites state.json, and the
    // report page then calls this evaluation stale.
    nlohmann::json j = r.to_json();
    if (fs::exists(dep.file("state.json"))) j["state_json_sha256"] = sha256_file_hex(dep.file("state.json").string());
    write_json_atomic(dep.file("evaluation.json"), j);
  };
  if (!missing.empty()) {  // nothing to re-check
    write_reports();
    return r;
  }

  progress("hashes");
  audit_hashes(a, dep, plan);
  audit_thresholds(a, dep);

  // A scratch deployment for the phases' own files: DIR is only read.
  const nlohmann::json& id = dep.identity();
  const fs::path scratch_dir = fs::temp_directory_path() / fmt::format("tessera-audit-{}", ::getpid());
  fs::remove_all(scratch_dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{scratch_dir};
  Deployment scratch = Deployment::open_for_deploy(scratch_dir, id);
  DeployOptions d = options_from_identity(id);
  d.threads = opts.threads;
  d.quiet = opts.quiet;
  for (const std::string& p : opts.perturbations) d.perturbations.push_back(p);
  d.out_dir = scratch_dir.string();
  const Model model = Model::open(d.model_path);
  PhaseContext ctx(scratch, model, d);
  ctx.use_plan(plan);

  auto rerun = [&](const char* name, PhaseOutcome (*phase)(PhaseContext&)) {
    progress(fmt::format("re-running the {} gate", name));
    try {
      const PhaseOutcome o = phase(ctx);
      a.add(name, o.pass ? "pass" : "fail", o.summary);
      return o;
    } catch (const Error& e) {
      a.add(name, "fail", fmt::format("the target refused: {}", e.what()));
      return PhaseOutcome{};
    }
  };
  rerun("phase3", run_phase3_model);
  const PhaseOutcome p6 = rerun("phase6", run_phase6_integrate);
  std::map<std::string, int64_t> counters;
  if (p6.details.contains("op_counters")) counters = p6.details["op_counters"].get<std::map<std::string, int64_t>>();
  audit_op_counters(a, plan, counters);
  try {
    progress("adversarial prompts");
    audit_adversarial(a, ctx);
    progress("determinism");
    audit_determinism(a, ctx);
    progress("figures");
    audit_figures(a, ctx, read_json_file(dep.file("report.json")), opts.remeasure_wall_time);
  } catch (const Error& e) {
    a.add("rerun", "fail", fmt::format("the target refused: {}", e.what()));
  }

  write_reports();
  return r;
}

}  // namespace tessera
