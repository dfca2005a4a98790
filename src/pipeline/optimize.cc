// Phases 4 and 5 (ARCHITECTURE section 5): the target's optimization skills rewrite the plan
// phase 3 validated, one rewrite at a time, prefill first (phase 4), then decode (phase 5).
// Every rewrite is gated (the op table's rows and phase 3's gate, re-run on a runner built
// from the rewritten plan: reverted on failure) and measured (a prediction must get faster;
// a wall time must be faster in every interleaved round); every step is logged in
// perf_opt_traj.md and in the phase's record (report.json).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "pipeline/diagnose.h"
#include "pipeline/op_table.h"
#include "pipeline/phases.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/stats.h"

namespace tessera {

namespace fs = std::filesystem;
using gates::GateResult;

namespace {

constexpr const char* kValidatedPlan = "plan_validated.json";  // the plan phases 1-3 gated
constexpr const char* kPrefillPlan = "plan_phase4.json";         // phase 4's result: where phase 5 starts

struct Gated {
  bool pass = true;
  std::vector<GateResult> rows;
  std::string first_failure;
};

// The gate on `runner`: every op-table row first (a rewrite changes kernels: fused linears,
// merged dispatches, tiles; each is re-checked against its numerics-derived limits), then
// phase 3's rows (for the decode pass, each prompt's last token runs as a decode step).
Gated model_gate(PhaseContext& ctx, StagedRunner& runner, Pass pass) {
  Gated g;
  const std::string kernel_gate = pass == Pass::Prefill ? "phase4.kernel" : "phase5.kernel";
  OpHarnessOptions opt;
  opt.gate = kernel_gate;
  for (const OpResult& r : run_op_table(runner, ctx.op_inputs(), opt)) {
    if (!r.gate.pass() && g.first_failure.empty()) g.first_failure = r.gate.subject;
    g.pass = g.pass && r.gate.pass();
    g.rows.push_back(r.gate);
  }
  // The short prompts, as phase 3 runs them (the long-context prompt and the layer-scoped rows
  // hold the frozen plan in phase 6: each rewrite here is plan-wide).
  for (const CanonicalPrompt& p : ctx.prompts()) {
    if (p.long_context) continue;
    GateResult row =
        GateResult::from_json(model_gate_record(ctx, runner, p, pass == Pass::Decode, /*layer_scoped=*/false)["gate"]);
    if (!row.pass() && g.first_failure.empty()) g.first_failure = row.subject;
    g.pass = g.pass && row.pass();
    g.rows.push_back(std::move(row));
  }
  return g;
}

// Figures of the current plan and a candidate. A model's predictions are deterministic: one
// each, and both passes (a plan-wide rewrite must not slow the other pass). Wall times are
// noisy (runs on the 2-core VM differ by a third), so they are sampled in interleaved
// rounds, current then candidate, and a rewrite is kept only when it wins every round: a
// one-sided sign test, which a rewrite that changes nothing passes with probability
// 2^-rounds (1/32 for 5 rounds).
constexpr int kRounds = 5;
struct Comparison {
  PassFigure before, after;
  double other_before = 0, other_after = 0;  // the other pass (predicted figures only)
  bool keep = false;
  int wins = 0, rounds = 0;                   // measured figures: rounds the candidate was faster
  double ratio_min = 0, ratio_max = 0;        // the spread of the per-round ratios after/before
};

Comparison compare(StagedRunner& cur, StagedRunner& cand, Pass pass) {
  Comparison c;
  c.before = cur.measure(pass);
  c.after = cand.measure(pass);
  if (c.before.predicted) {
    const Pass other = pass == Pass::Prefill ? Pass::Decode : Pass::Prefill;
    c.other_before = cur.measure(other).seconds;
    c.other_after = cand.measure(other).seconds;
    c.keep = c.after.seconds < c.before.seconds && c.other_after <= c.other_before;
    return c;
  }
  std::vector<double> a = {c.before.seconds}, b = {c.after.seconds};
  for (int round = 1; round < kRounds; ++round) {
    a.push_back(cur.measure(pass).seconds);
    b.push_back(cand.measure(pass).seconds);
  }
  c.rounds = kRounds;
  c.ratio_min = 1e300;
  for (size_t i = 0; i < a.size(); ++i) {
    const double r = b[i] / std::max(a[i], 1e-12);
    c.wins += r < 1;
    c.ratio_min = std::min(c.ratio_min, r);
    c.ratio_max = std::max(c.ratio_max, r);
  }
  c.before.seconds = median(a);
  c.after.seconds = median(b);
  c.before.what += fmt::format(", median of {} interleaved with the candidate", kRounds);
  c.after.what = c.before.what;
  c.keep = c.wins == c.rounds;
  return c;
}

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

// Why a gated-or-predicted rewrite was not kept.
std::string not_kept(const Comparison& c) {
  if (c.rounds > 0)
    return fmt::format("reverted: faster in {} of {} interleaved rounds (kept only when faster in all; after/before "
                       "{:.3f}-{:.3f})",
                       c.wins, c.rounds, c.ratio_min, c.ratio_max);
  return c.after.seconds >= c.before.seconds
             ? "reverted: not faster"
             : fmt::format("reverted: slows the other pass ({} -> {})", ms(c.other_before), ms(c.other_after));
}

}  // namespace

// perf_opt_traj.md: one section per optimization phase that has run, from its phase record.
void write_perf_trajectory(Deployment& dep) {
  std::string md = "# Optimization trajectory\n\nEvery plan rewrite phases 4 and 5 tried: the skill, the figure before "
                   "and after, the gate on the rewritten plan (every op-table row, then phase 3's), and whether it "
                   "was kept (gate passed; predicted faster, or measured faster in every one of 5 interleaved rounds, "
                   "with the spread of the per-round ratios) or reverted. On a modelled target (npusim) the prediction "
                   "comes first, and a "
                   "rewrite it does not make faster is reverted without the gate (\"not run\").\n";
  for (int id : {4, 5}) {
    const fs::path f = dep.file(fmt::format("phase{}.json", id));
    if (!fs::exists(f)) continue;
    const nlohmann::json d = read_json_file(f)["details"];
    if (!d.contains("steps")) continue;
    md += fmt::format("\n## Phase {}: {}\n\nFigure: {}. Starting plan `{}`: {}.\n\n", id, id == 4 ? "prefill" : "decode",
                      d.value("figure", ""), d.value("start_plan", ""), ms(d.value("start_s", 0.0)));
    md += "| step | skill | rewrite | before | after | gate | result |\n|---|---|---|---|---|---|---|\n";
    int n = 0;
    for (const auto& s : d["steps"]) {
      const bool tried = s.contains("after_s");
      md += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", ++n, s.value("skill", ""), gates::markdown_cell(s.value("what", "")),
                        tried ? ms(s.value("before_s", 0.0)) : "-", tried ? ms(s.value("after_s", 0.0)) : "-",
                        s.value("gate", "-"), gates::markdown_cell(s.value("result", "")));
    }
    md += fmt::format("\nFinal plan `{}`: {} ({:.2f}x the start).\n", d.value("final_plan", ""), ms(d.value("final_s", 0.0)),
                      d.value("start_s", 0.0) / std::max(d.value("final_s", 1.0), 1e-12));
  }
  write_file_atomic(dep.file("perf_opt_traj.md"), md);
}

namespace {

// A rewrite the gate reverted broke the numbers in a way no earlier phase saw (the plans
// phases 1-3 validated did not have it): the debug skills run on the rewritten plan, and
// their diagnosis goes to issues.md and the step's record.
std::vector<std::string> diagnose_rewrite(PhaseContext& ctx, const PlanRewrite& rw, const Gated& g, int phase_id) {
  const nlohmann::json keep = ctx.plan();
  ctx.use_plan(rw.plan);
  nlohmann::json rows = nlohmann::json::array();
  for (const GateResult& r : g.rows) rows.push_back(r.to_json());
  ctx.progress(fmt::format("[phase {}] the gate reverted '{}': running the debug skills", phase_id, rw.what));
  const std::vector<Diagnosis> ds = run_debug_skills(ctx, Failure{phase_id, {{"gates", rows}, {"details", nlohmann::json::object()}}});
  ctx.use_plan(keep);
  std::vector<std::string> causes;
  for (const Diagnosis& d : ds)
    for (const std::string& c : d.confirmed_causes())
      if (std::find(causes.begin(), causes.end(), c) == causes.end()) causes.push_back(c);
  ctx.dep.append_issue(phase_id, "rewrite reverted by the gate",
                       fmt::format("Rewrite '{}' failed the gate (op table, then phase 3) on {} and was reverted.\n\n{}", rw.what,
                                   g.first_failure, diagnoses_markdown(ds)));
  return causes;
}

PhaseOutcome optimize_pass(PhaseContext& ctx, Pass pass, int phase_id) {
  PhaseOutcome out;
  const TargetDef& def = target_def(ctx.opts.target);
  // Phase 4 starts from the plan phases 1-3 validated, phase 5 from phase 4's result; both
  // are kept aside, so that --from-phase 4 or 5 starts from the same plan again.
  nlohmann::json plan;
  if (pass == Pass::Prefill) {
    if (!fs::exists(ctx.dep.file(kValidatedPlan))) write_json_atomic(ctx.dep.file(kValidatedPlan), read_json_file(ctx.dep.file("plan.json")));
    plan = read_json_file(ctx.dep.file(kValidatedPlan));
  } else {
    plan = read_json_file(ctx.dep.file(fs::exists(ctx.dep.file(kPrefillPlan)) ? kPrefillPlan : "plan.json"));
  }
  plan.erase("frozen");
  plan.erase("op_counters_phase6");

  const std::string start_plan = plan.value("name", "");
  std::unique_ptr<StagedRunner> cur = ctx.make_runner(plan);
  ctx.progress(fmt::format("[phase {}] gating the starting plan '{}'", phase_id, plan.value("name", "")));
  Gated cur_gate = model_gate(ctx, *cur, pass);
  PassFigure start = cur->measure(pass);
  if (!start.predicted) {  // a wall time: the median of as many rounds as each comparison takes
    std::vector<double> t = {start.seconds};
    for (int round = 1; round < kRounds; ++round) t.push_back(cur->measure(pass).seconds);
    start.seconds = median(t);
    start.what += fmt::format(", median of {}", kRounds);
  }
  double cur_s = start.seconds;
  nlohmann::json steps = nlohmann::json::array();
  int tried = 0, kept = 0;
  const std::vector<OptSkill> none;
  for (const OptSkill& skill : def.skills ? def.skills() : none) {
    if (skill.name == "merge" && ctx.opts.faults.count("merge-skipped")) {  // porting pitfall 14 on purpose
      steps.push_back({{"skill", skill.name}, {"what", "not tried (--inject merge-skipped)"}, {"result", "skipped: injected fault"}});
      continue;
    }
    // Proposals are re-drawn from the current plan after every kept rewrite (a rewrite is a
    // whole plan: one drawn from an older plan would undo what was kept since).
    std::set<std::string> done;
    std::string why_not;
    for (;;) {
      const std::vector<PlanRewrite> rewrites = skill.propose(plan, pass, why_not);
      auto next = std::find_if(rewrites.begin(), rewrites.end(), [&](const PlanRewrite& r) { return !done.count(r.what); });
      if (next == rewrites.end()) break;
      const PlanRewrite& rw = *next;
      done.insert(rw.what);
      ++tried;
      ctx.progress(fmt::format("[phase {}] {}: {}", phase_id, skill.name, rw.what));
      nlohmann::json step = {{"skill", skill.name}, {"what", rw.what}};
      std::unique_ptr<StagedRunner> cand;
      Gated g;
      std::optional<Comparison> early;
      try {
        cand = ctx.make_runner(rw.plan);
        // A modelled target's figure costs nothing and decides alone: a rewrite it does not
        // make faster is reverted without running the gate. (A measured target is gated
        // first: its wall time could call a broken rewrite slower by noise, and the gate
        // must still see it.)
        if (start.predicted) {
          early = compare(*cur, *cand, pass);
          if (!early->keep) {
            step["gate"] = "not run";
            step["before_s"] = early->before.seconds;
            step["after_s"] = early->after.seconds;
            step["other_pass_before_s"] = early->other_before;
            step["other_pass_after_s"] = early->other_after;
            step["result"] = not_kept(*early);
            steps.push_back(step);
            continue;
          }
        }
        g = model_gate(ctx, *cand, pass);
      } catch (const Error& e) {
        const std::string what = e.what();
        step["gate"] = "refused";
        step["result"] = "reverted: the target refused the plan: " + what.substr(0, what.find('\n'));
        steps.push_back(step);
        continue;
      }
      step["gate"] = g.pass ? "pass" : "FAIL";
      if (!g.pass) {
        step["result"] = "reverted: the gate failed on " + g.first_failure;
        const std::vector<std::string> causes = diagnose_rewrite(ctx, rw, g, phase_id);
        step["named_causes"] = causes;
        if (!causes.empty()) step["result"] = fmt::format("{} (named cause: {})", step["result"].get<std::string>(), fmt::join(causes, ", "));
        steps.push_back(step);
        continue;
      }
      const Comparison c = early ? *early : compare(*cur, *cand, pass);
      step["before_s"] = c.before.seconds;
      step["after_s"] = c.after.seconds;
      if (c.before.predicted) {
        step["other_pass_before_s"] = c.other_before;
        step["other_pass_after_s"] = c.other_after;
      }
      if (c.rounds > 0) {  // the spread of a measured comparison (the report draws it)
        step["rounds"] = c.rounds;
        step["ratio_min"] = c.ratio_min;
        step["ratio_max"] = c.ratio_max;
      }
      if (c.keep) {
        ++kept;
        nlohmann::json next = cand->build_plan(ctx.model);
        if (plan.contains("optimized")) next["optimized"] = plan["optimized"];  // phase 4's record, in phase 5
        plan = std::move(next);
        cur = std::move(cand);
        cur_gate = std::move(g);
        cur_s = c.after.seconds;
        step["result"] = c.rounds > 0 ? fmt::format("kept ({:.2f}x; faster in all {} interleaved rounds, after/before "
                                                    "{:.3f}-{:.3f})",
                                                    c.before.seconds / std::max(c.after.seconds, 1e-12), c.rounds,
                                                    c.ratio_min, c.ratio_max)
                                      : fmt::format("kept ({:.2f}x)", c.before.seconds / std::max(c.after.seconds, 1e-12));
      } else {
        step["result"] = not_kept(c);
      }
      steps.push_back(step);
    }
    if (done.empty()) steps.push_back({{"skill", skill.name}, {"what", why_not}, {"result", "skipped: precondition not met"}});
  }
  // The plan this phase hands on, with its own record of how it came about.
  plan["optimized"][pass_name(pass)] = {{"phase", phase_id}, {"start_s", start.seconds}, {"final_s", cur_s}, {"figure", start.what},
                                        {"rewrites_tried", tried}, {"rewrites_kept", kept}};
  write_json_atomic(ctx.dep.file("plan.json"), plan);
  if (pass == Pass::Prefill) write_json_atomic(ctx.dep.file(kPrefillPlan), plan);
  ctx.use_plan(plan);

  out.gates = cur_gate.rows;
  out.pass = cur_gate.pass;  // every kept rewrite passed the gate and was faster than the plan before it
  out.details = {{"pass", pass_name(pass)}, {"figure", start.what}, {"predicted", start.predicted},
                 {"start_plan", start_plan},
                 {"final_plan", plan.value("name", "")},  {"start_s", start.seconds}, {"final_s", cur_s}, {"steps", steps}};
  out.summary = fmt::format("{} rewrites tried, {} kept: {} {} -> {} ({:.2f}x){}", tried, kept, pass_name(pass), ms(start.seconds),
                            ms(cur_s), start.seconds / std::max(cur_s, 1e-12), start.predicted ? ", predicted" : "");
  if (!out.pass) out.diagnosis = "the plan this phase starts from fails the gate (op table, then phase 3): " + cur_gate.first_failure;
  return out;
}

}  // namespace

PhaseOutcome run_phase4_prefill_opt(PhaseContext& ctx) { return optimize_pass(ctx, Pass::Prefill, 4); }

PhaseOutcome run_phase5_decode_opt(PhaseContext& ctx) { return optimize_pass(ctx, Pass::Decode, 5); }

}  // namespace tessera
