#include "pipeline/phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "pipeline/capture.h"
#include "pipeline/deployment.h"
#include "pipeline/sublayer_check.h"
#include "util/error.h"

namespace tessera {

namespace fs = std::filesystem;
using gates::GateResult;

namespace {
// Phase 3's gate compares every layer's output ("layers.N.out").
bool is_layer_output(const std::string& probe_name) { return probe_name.ends_with(".out"); }
}  // namespace

const PhaseContext::OracleRun& PhaseContext::oracle_run(const std::vector<int32_t>& ids) {
  auto it = oracle_runs_.find(ids);
  if (it != oracle_runs_.end()) return it->second;
  Capture ref;
  OracleRunner& o = oracle();
  o.reset();
  OracleRun run;
  // The residual stream at every layer boundary and between each layer's two sublayers.
  run.logits = o.forward(
      ids, false,
      ref.fn([](const std::string& n) { return is_layer_output(n) || n.ends_with(".attn_residual") || n == "embed"; }),
      ProbeLevel::All);
  run.embed = ref.at("embed");
  for (int64_t l = 0; l < model.spec().n_layers; ++l) {
    run.mids.push_back(ref.at(fmt::format("layers.{}.attn_residual", l)));
    run.layers.push_back(ref.at(fmt::format("layers.{}.out", l)));
  }
  return oracle_runs_.emplace(ids, std::move(run)).first->second;
}

std::string first_failing_sublayer_text(const nlohmann::json& rec) {
  const auto it = rec.find("first_failing_sublayer");
  if (it == rec.end() || it->is_null()) return "";
  const nlohmann::json& f = *it;
  return sublayer_diagnosis(rec["text"].get<std::string>(),
                            {f["layer"].get<int64_t>(), f["sublayer"].get<std::string>(), gates::read_json_number(f["error"]),
                             f["far_positions"].get<bool>()});
}

nlohmann::json model_gate_record(PhaseContext& ctx, StagedRunner& target, const CanonicalPrompt& p, bool last_as_decode,
                                 bool layer_scoped) {
  const ModelSpec& s = ctx.model.spec();
  const PhaseContext::OracleRun& ref = ctx.oracle_run(p.ids);
  const std::vector<float>& lr = ref.logits;
  Capture got;
  const ProbeFn probe = got.fn(is_layer_output);
  target.reset();
  std::vector<float> lg;
  if (last_as_decode && p.ids.size() > 1) {
    // The prompt but its last token as a prefill, then the last token as a decode step: the
    // capture appends the step's rows, so the comparison is the same [T, hidden] per layer.
    prefill_in_chunks(target, std::span<const int32_t>(p.ids.data(), p.ids.size() - 1), false, probe, ProbeLevel::Layers);
    lg = target.forward(std::span<const int32_t>(&p.ids.back(), 1), false, probe, ProbeLevel::Layers);
  } else {
    lg = prefill_in_chunks(target, p.ids, false, probe, ProbeLevel::Layers);
  }
  const int64_t T = int64_t(p.ids.size());
  std::vector<double> cos;
  double cliff = 0;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string n = fmt::format("layers.{}.out", l);
    cos.push_back(gates::compare(ref.layers[size_t(l)].data(), got.at(n).data(), T, s.hidden).cosine);
    if (l > 0) cliff = std::max(cliff, cos[size_t(l - 1)] - cos[size_t(l)]);
  }
  nlohmann::json cosines_json = nlohmann::json::array();
  for (double c : cos) cosines_json.push_back(gates::json_number(c));
  // Per position, the lowest cosine of its row over the layers (the report draws it: a
  // position that goes wrong alone, as a decode step or a far RoPE position would).
  nlohmann::json position_min_json = nlohmann::json::array();
  for (int64_t t = 0; t < T; ++t) {
    double m = 1;
    for (int64_t l = 0; l < s.n_layers; ++l) {
      const std::vector<float>& got_l = got.at(fmt::format("layers.{}.out", l));
      const double c = gates::cosine(ref.layers[size_t(l)].data() + t * s.hidden, got_l.data() + t * s.hidden, s.hidden);
      m = std::isnan(c) || std::isnan(m) ? std::nan("") : std::min(m, c);
    }
    position_min_json.push_back(gates::json_number(m));
  }
  const double p1 = gates::softmax_max_prob(lr.data(), s.vocab);
  const bool is_decisive = p1 > gates::threshold("phase3.decisive_prob");
  GateResult g;
  g.gate = "phase3.model";
  g.subject = fmt::format("\"{}\" ({} tokens{}, {} p={:.3f})", p.text, T, last_as_decode && T > 1 ? ", the last as a decode step" : "",
                          is_decisive ? "decisive" : "competitive", p1);
  // A NaN cosine (a non-finite layer output) is the minimum: it must fail the check.
  double min_cos = 1;
  for (double c : cos) min_cos = std::isnan(c) || std::isnan(min_cos) ? std::nan("") : std::min(min_cos, c);
  if (std::isnan(cliff)) cliff = std::numeric_limits<double>::infinity();
  g.require("min_layer_cosine", min_cos, ">=", "phase3.layer_cosine_min");
  g.require("cliff", cliff, "<=", "phase3.cliff_max");
  g.require("logits_cosine", gates::cosine(lr.data(), lg.data(), s.vocab), ">=", "phase3.logits_cosine_min");
  if (is_decisive) g.require_fixed("top1_match", gates::top1_match(lr.data(), lg.data(), s.vocab) ? 1 : 0, "==", 1);
  else
    g.require_fixed("top5_two_way", gates::topk_two_way(lr.data(), lg.data(), s.vocab, int(gates::threshold("phase3.topk"))) ? 1 : 0,
                    "==", 1);
  nlohmann::json rec = {{"ids", p.ids}, {"text", p.text}, {"decisive", is_decisive}, {"top1_prob", p1},
                        {"layer_cosines", cosines_json}, {"position_min_cosines", position_min_json}};
  if (layer_scoped) {
    // One layer at a time: what each sublayer adds, from the oracle's input to its layer.
    const SublayerErrors sub = sublayer_errors(ctx, target, p, last_as_decode);
    const SublayerLimits limits = sublayer_limits(ctx, target);
    const SublayerErrors::Worst worst = sub.worst(), first = sub.first_over(limits);
    require_sublayer_limits(g, sub, limits);
    rec["sublayer_errors"] = sub.to_json();
    rec["worst_sublayer"] = {{"layer", worst.layer}, {"sublayer", worst.sublayer}, {"error", gates::json_number(worst.error)},
                             {"far_positions", worst.far}};
    rec["sublayer_expected"] = {{"attention", limits.attention_expected}, {"mlp", limits.mlp_expected}};
    if (first.layer >= 0)
      rec["first_failing_sublayer"] = {{"layer", first.layer}, {"sublayer", first.sublayer},
                                       {"error", gates::json_number(first.error)}, {"far_positions", first.far}};
  }
  rec["gate"] = g.to_json();
  return rec;
}

PhaseOutcome run_phase3_model(PhaseContext& ctx) {
  PhaseOutcome out;
  const auto prompts = ctx.prompts();
  const fs::path resume_dir = ctx.dep.file("phase3");
  std::error_code ec;
  fs::create_directories(resume_dir, ec);
  if (ec) throw IoError(io_error_message("create", resume_dir, ec.value()));
  int decisive = 0, resumed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const CanonicalPrompt& p = prompts[i];
    const fs::path item = resume_dir / fmt::format("prompt_{}.json", i);
    nlohmann::json rec;
    if (fs::exists(item) && (rec = read_json_file(item)).value("ids", std::vector<int32_t>{}) == p.ids) {
      ++resumed;  // done before an interruption: the gate row is on disk
    } else {
      ctx.progress(fmt::format("[phase 3] prompt {}/{}: \"{}\" ({} tokens)", i + 1, prompts.size(), p.text, p.ids.size()));
      rec = model_gate_record(ctx, ctx.target(), p);
      write_json_atomic(item, rec);  // one prompt at a time: an interruption loses at most this one
    }
    decisive += rec["decisive"].get<bool>();
    out.gates.push_back(GateResult::from_json(rec["gate"]));
    out.details["prompts"].push_back(rec);
  }
  out.pass = std::all_of(out.gates.begin(), out.gates.end(), [](const GateResult& g) { return g.pass(); });
  // How many prompts an interrupted run had done is said, not recorded: a resumed
  // deployment's records are those of an uninterrupted one.
  if (resumed) ctx.progress(fmt::format("[phase 3] {} of {} prompts resumed from disk", resumed, prompts.size()));
  out.summary = fmt::format("{} prompts ({} decisive, {} competitive): {}", prompts.size(), decisive,
                            prompts.size() - size_t(decisive), out.pass ? "all pass" : "failures");
  if (!out.pass) {
    // Where along the depth does it go wrong? First the layer-scoped check: the first layer
    // (in depth) whose sublayer, started from the oracle's input, adds what the oracle does not.
    for (const auto& rec : out.details["prompts"])
      if (out.diagnosis.empty()) out.diagnosis = first_failing_sublayer_text(rec);
    for (const auto& rec : out.details["prompts"]) {
      if (!out.diagnosis.empty()) break;
      std::vector<double> cos;
      for (const auto& c : rec["layer_cosines"]) cos.push_back(gates::read_json_number(c));
      for (size_t l = 0; l < cos.size(); ++l)
        if (!(cos[l] >= gates::threshold("phase3.layer_cosine_min"))) {
          out.diagnosis = fmt::format("\"{}\": hidden states first fall below the cosine limit at layer {} ({:.4f}); "
                                      "phases 1-2 passed, so suspect state carried across layers or positions",
                                      rec["text"].get<std::string>(), l, cos[l]);
          break;
        }
      if (!out.diagnosis.empty()) break;
    }
    if (out.diagnosis.empty()) out.diagnosis = "layers agree but the logits or tokens do not: suspect the final norm or LM head";
  }
  return out;
}

}  // namespace tessera
