#include "pipeline/phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "oracle/ops.h"
#include "pipeline/capture.h"
#include "targets/registry.h"
#include "util/error.h"

namespace tessera {

using gates::GateResult;
using gates::TensorMetrics;

namespace {

struct BlockScenario {
  std::string name;
  int64_t start;
  std::vector<int32_t> ids;
  int64_t prefill;  // the rest are decoded one at a time
  std::vector<float> embed, expected;  // [T, H] from the oracle
};

std::vector<BlockScenario> block_scenarios(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  const std::vector<int32_t> ids = long_prompt(ctx, 24);
  const int64_t T = int64_t(ids.size());
  const int64_t decode = std::min<int64_t>(4, T - 1);
  std::vector<BlockScenario> out = {{"position 0", 0, ids, T - decode, {}, {}},
                                    {"", long_position(s, T), ids, T - decode, {}, {}}};
  out[1].name = fmt::format("position {}", out[1].start);
  OracleRunner& oracle = ctx.oracle();
  for (BlockScenario& sc : out) {
    Capture cap;
    const ProbeFn fn = cap.fn([](const std::string& n) { return n == "embed" || n == "layers.0.out"; });
    oracle.reset(sc.start);
    oracle.forward(std::span(sc.ids).first(size_t(sc.prefill)), false, fn, ProbeLevel::All);
    for (size_t i = size_t(sc.prefill); i < sc.ids.size(); ++i) oracle.forward(std::span(sc.ids).subspan(i, 1), false, fn, ProbeLevel::All);
    sc.embed = cap.at("embed");
    sc.expected = cap.at("layers.0.out");
  }
  return out;
}

// Layer 0 on the target, fed the oracle's embeddings: prefill, then decode steps.
std::vector<float> run_block(StagedRunner& target, const BlockScenario& sc, int64_t H) {
  std::vector<float> h = sc.embed;
  target.reset(sc.start);
  target.forward_layers(h.data(), sc.prefill, 1);
  for (int64_t t = sc.prefill; t < int64_t(sc.ids.size()); ++t) target.forward_layers(h.data() + t * H, 1, 1);
  return h;
}

GateResult block_gate(const BlockScenario& sc, const std::vector<float>& got, const ModelSpec& s, TensorMetrics* m_out) {
  const int64_t T = int64_t(sc.ids.size());
  const TensorMetrics m = gates::compare(sc.expected.data(), got.data(), T, s.hidden);
  GateResult g;
  g.gate = "phase2.block";
  g.subject = fmt::format("layer 0, {} tokens ({} prefill + {} decode) at {}", T, sc.prefill, T - sc.prefill, sc.name);
  g.require("cosine", m.cosine, ">=", "phase2.cosine_min");
  const int64_t hd = s.head_dim;
  g.require("min_row_cosine", m.min_row_cosine, ">=",
            hd <= 64 ? "phase2.row_cosine_min.hd64" : hd <= 128 ? "phase2.row_cosine_min.hd128" : "phase2.row_cosine_min.hd256");
  g.require_fixed("nonfinite", double(m.nan_got + m.inf_got), "<=", double(m.nan_ref + m.inf_ref));
  if (m_out) *m_out = m;
  return g;
}

}  // namespace

std::string BisectResult::text() const {
  std::string t = named ? fmt::format("bisect names stage '{}' (kernel {}): swapping it alone for the oracle's kernel makes the block pass.",
                                      stage, kernel)
                        : fmt::format("bisect: no single stage explains the failure; the closest swap is '{}' (kernel {}).",
                                      stage, kernel);
  t += "\n\n| swapped stage | kernel | worst cosine | worst nmse | block gate |\n|---|---|---|---|---|\n";
  for (const auto& tr : trials)
    t += fmt::format("| {} | {} | {:.6g} | {:.6g} | {} |\n", tr["stage"].get<std::string>(), tr["kernel"].get<std::string>(),
                     tr["cosine"].get<double>(), tr["nmse"].get<double>(), tr["pass"].get<bool>() ? "PASS" : "FAIL");
  return t;
}

BisectResult bisect_block(PhaseContext& ctx) {
  const ModelSpec& s = ctx.model.spec();
  const auto scenarios = block_scenarios(ctx);
  StagedRunner& target = ctx.target();
  BisectResult r;
  r.trials = nlohmann::json::array();
  double best = INFINITY;
  for (Stage st : layer_stages()) {
    target.set_oracle_stages({st});
    bool pass = true;
    double worst_cos = 1, worst_nmse = 0;
    for (const BlockScenario& sc : scenarios) {
      TensorMetrics m;
      pass = block_gate(sc, run_block(target, sc, s.hidden), s, &m).pass() && pass;
      worst_cos = std::min(worst_cos, m.cosine);
      worst_nmse = std::max(worst_nmse, std::isfinite(m.nmse) ? m.nmse : 1e300);
    }
    r.trials.push_back({{"stage", stage_name(st)}, {"kernel", stage_kernel(st)}, {"cosine", worst_cos}, {"nmse", worst_nmse}, {"pass", pass}});
    // The culprit is the swap that passes; among several (or none), the lowest error.
    const double score = (pass ? 0.0 : 1e6) + worst_nmse;
    if (score < best) {
      best = score;
      r.stage = stage_name(st);
      r.kernel = stage_kernel(st);
      r.named = pass;
    }
  }
  target.set_oracle_stages({});
  return r;
}

std::vector<GateResult> block_rows(PhaseContext& ctx, StagedRunner& target, const std::string& gate,
                                   nlohmann::json* scenario_details) {
  const ModelSpec& s = ctx.model.spec();
  std::vector<GateResult> rows;
  target.set_oracle_stages({});
  for (const BlockScenario& sc : block_scenarios(ctx)) {
    ctx.progress(fmt::format("[{}] layer 0 at {}", gate, sc.name));
    TensorMetrics m;
    rows.push_back(block_gate(sc, run_block(target, sc, s.hidden), s, &m));
    rows.back().gate = gate;
    if (scenario_details) scenario_details->push_back({{"scenario", sc.name}, {"metrics", m.to_json()}});
  }
  return rows;
}

PhaseOutcome run_phase2_block(PhaseContext& ctx) {
  PhaseOutcome out;
  out.details["scenarios"] = nlohmann::json::array();
  out.gates = block_rows(ctx, ctx.target(), "phase2.block", &out.details["scenarios"]);
  const size_t n_scenarios = out.gates.size();
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  if (!out.pass) {
    ctx.progress("[phase 2] block gate failed: bisecting (one stage at a time swapped for the oracle's kernel)");
    const BisectResult b = bisect_block(ctx);
    out.details["bisect"] = {{"named", b.named}, {"stage", b.stage}, {"kernel", b.kernel}, {"trials", b.trials}};
    out.diagnosis = b.text();
  }
  double worst = 1;
  for (const auto& d : out.details["scenarios"]) {
    const double c = gates::read_json_number(d["metrics"]["cosine"]);
    worst = std::isnan(c) || std::isnan(worst) ? std::nan("") : std::min(worst, c);
  }
  out.summary = fmt::format("layer 0 over {} scenarios, worst cosine {}{}", n_scenarios, fmt::format("{:.6g}", worst),
                            out.pass ? "" : "; " + out.details["bisect"]["stage"].get<std::string>() + " named by bisect");
  return out;
}

}  // namespace tessera
