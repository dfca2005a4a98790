#include "pipeline/diagnose.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "gates/gates.h"
#include "pipeline/skill_support.h"
#include "model/tensors.h"
#include "oracle/ops.h"
#include "runtime/generate.h"
#include "targets/registry.h"
#include "util/error.h"
#include "util/half.h"

namespace tessera {

namespace {

std::string stage_of_kernel_row(const nlohmann::json& row) {
  if (row.contains("stage")) return row["stage"].get<std::string>();  // op-table rows name their stage
  const std::string kernel = row.value("kernel", ""), role = row.value("role", "");
  if (kernel == "gemm") {
    for (const char* r : {"q_proj", "k_proj", "v_proj"})
      if (role.starts_with(r)) return "qkv_proj";
    if (role.starts_with("gate_proj") || role.starts_with("up_proj")) return "gate_up_proj";
    if (role.starts_with("down_proj")) return "down_proj";
    if (role.starts_with("o_proj")) return "o_proj";
    if (role.starts_with("lm_head")) return "lm_head";
  }
  if (kernel == "rmsnorm") return role;  // attn_norm, mlp_norm, final_norm
  if (kernel == "add") return role;
  return kernel;  // embedding, rope, kv_write, attention, silu_mul
}


}  // namespace

std::set<Stage> Failure::suspects() const {
  std::set<Stage> out;
  if (!record.is_object()) return out;
  const nlohmann::json d = record.value("details", nlohmann::json::object());
  for (const auto& row : d.value("kernels", nlohmann::json::array()))
    if (!row.value("pass", true)) {
      const std::string name = stage_of_kernel_row(row);
      for (int i = 0; i < kStageCount; ++i)
        if (name == stage_name(Stage(i))) out.insert(Stage(i));
    }
  if (d.contains("bisect") && d["bisect"].value("named", false)) {
    const std::string name = d["bisect"].value("stage", "");
    for (int i = 0; i < kStageCount; ++i)
      if (name == stage_name(Stage(i))) out.insert(Stage(i));
  }
  return out;
}

std::vector<std::string> Diagnosis::reported_causes() const {
  std::vector<std::string> out;
  for (const Hypothesis& h : hypotheses)
    if (h.verdict == "reported") out.push_back(h.cause);
  return out;
}

std::vector<std::string> Diagnosis::confirmed_causes() const {
  std::vector<std::string> out;
  for (const Hypothesis& h : hypotheses)
    if (h.verdict == "confirmed") out.push_back(h.cause);
  return out;
}

nlohmann::json Diagnosis::to_json() const {
  nlohmann::json j = {{"skill", skill}, {"symptom", symptom}, {"where", where}, {"hypotheses", nlohmann::json::array()}};
  for (const Hypothesis& h : hypotheses)
    j["hypotheses"].push_back({{"name", h.name}, {"cause", h.cause}, {"verdict", h.verdict}, {"evidence", h.evidence}});
  return j;
}

std::string Diagnosis::markdown() const {
  std::string md = fmt::format("### Debug skill `{}`\n\nSymptom: {}. Where to look: {}.\n\n| hypothesis | cause | verdict | evidence |\n"
                               "|---|---|---|---|\n",
                               skill, symptom, where);
  for (const Hypothesis& h : hypotheses)
    md += fmt::format("| {} | `{}` | {} | {} |\n", h.name, h.cause, h.verdict == "confirmed" ? "**confirmed**" : h.verdict == "reported" ? "*reported*" : h.verdict,
                      h.evidence);
  return md;
}

const std::vector<DebugSkill>& debug_skills() {
  static const std::vector<DebugSkill> skills = {
      {"rope-variant", "RoPE output wrong (phase 1 rope rows, or bisect names rope): from position 1, only far out, or only in decode",
       "the target's RoPE kernel and the inverse frequencies it was given", {Stage::Rope}, nullptr, rope_variant},
      {"qkv-projection", "q/k/v projections wrong (phase 1 gemm rows of q/k/v_proj, or bisect names qkv_proj)",
       "the target's linear / fused shared-input kernels, bias handling, weight access pattern", {Stage::QkvProj}, nullptr,
       qkv_projection},
      {"attention-variant", "attention output wrong (phase 1 attention rows, or bisect names attention)",
       "the target's attention kernel: kv-head index, score scale", {Stage::Attention}, nullptr, attention_variant},
      {"numeric-range", "NaN or inf from an attention kernel right on the model's own scores (phase 1's large-score row)",
       "the softmax's max subtraction; accumulator and storage types along the graph", {Stage::Attention}, nullptr,
       numeric_range},
      {"gemm-precision", "every projection off by a smooth, K-dependent error (phase 1 gemm rows)",
       "the target's GEMM/GEMV accumulator type",
       {Stage::QkvProj, Stage::OProj, Stage::GateUpProj, Stage::DownProj, Stage::LmHead}, nullptr, gemm_precision},
      {"kv-cache-state", "right on the first call, wrong after (decode scenarios, or bisect names kv_write); or the "
       "target refused to read a layer's cache back",
       "the target's KV write path for single-row (decode) steps; which layer's rows a write lands in",
       {Stage::KvWrite, Stage::Attention}, refused_reading_the_cache, kv_cache_state},
      {"stale-operand", "a kernel right on its first call and wrong on a later call of the same shape",
       "input fifos marked resident, buffers reused across calls", {Stage::AttnNorm, Stage::MlpNorm}, nullptr,
       stale_operand},
      {"stale-intermediate", "right on the first call, wrong after, only in a plan that merges the O projection with the "
       "residual add (a phase 4/5 rewrite reverted by the gate)",
       "the merged dispatch's intermediate buffers: which are refreshed per call", {Stage::OProj, Stage::AttnResidual},
       nullptr, stale_intermediate},
      {"unsynced-handover", "a producer right on the device whose consumer on the host sees other values (decode "
       "scenarios; bisect names the producer)",
       "which buffers a dispatch keeps on the device that host code reads next (the lowering's hand-overs)",
       {Stage::QkvProj, Stage::Rope}, nullptr, unsynced_handover},
      {"reused-live-buffer", "a stage of a merged dispatch right by itself and wrong in the pass (a phase 4/5 rewrite "
       "that keeps intermediates on the device, reverted by the gate)",
       "the dispatch's memory-tile buffers: which share bytes, and their live ranges",
       {Stage::OProj, Stage::AttnResidual, Stage::MlpNorm, Stage::GateUpProj, Stage::SiluMul, Stage::DownProj}, nullptr,
       reused_live_buffer},
      {"lm-head", "the LM head's logits wrong (phase 1 lm_head row)", "which matrix the head reads; tie_word_embeddings",
       {Stage::LmHead}, nullptr, lm_head},
      {"mapping-refused", "the target refused a mapping (npusim checker)", "the refusal's tile and numbers; the mapping's tiles",
       {}, [](const Failure& f) { return f.record.contains("details") && f.record["details"].contains("refused"); },
       refusal},
      {"prompt-ids", "phase 0's prompt-ids rows fail: a prompt starts with two BOS, or the tokenizer disagrees with "
       "transformers' ids", "Tokenizer::encode_prompt (the BOS rule), the pre-tokenizer and normalizer", {},
       prompt_ids_failed, prompt_ids},
      {"stop-set", "phase 6's stop-set row fails: generation would not stop on a declared end-of-sequence id",
       "tokenizer_config.json / generation_config.json / config.json eos ids; runtime/generate.cc stop_ids", {},
       stop_set_failed, stop_set},
      {"dispatch-overhead", "a passing deployment on a modelled NPU whose passes are mostly dispatch overhead (advisory: "
       "no gate fails)", "dispatches per layer in plan.md; the merge rows of perf_opt_traj.md", {},
       [](const Failure& f) { return f.phase < 0; }, dispatch_overhead},
      {"audit-finding", "the independent evaluator (phase 7) failed the deployment", "evaluation_report.md; the named check",
       {}, [](const Failure& f) { return f.phase == 7; }, audit_findings},
      // Last: the fault-specific skills name a cause first; error-shape describes the error's shape.
      {"error-shape", "a kernel row fails its limits (phase 1, a rewrite's op table, or the frozen plan's in phase 6)",
       "the failing kernel: its constants and scales, per-head and per-position indexing, loop bounds, layout",
       {Stage::Embedding, Stage::AttnNorm, Stage::QkvProj, Stage::Rope, Stage::KvWrite, Stage::Attention, Stage::OProj,
        Stage::AttnResidual, Stage::MlpNorm, Stage::GateUpProj, Stage::SiluMul, Stage::DownProj, Stage::MlpResidual,
        Stage::FinalNorm, Stage::LmHead},
       nullptr, error_shape},
  };
  return skills;
}

std::vector<Diagnosis> run_debug_skills(PhaseContext& ctx, const Failure& f) {
  const std::set<Stage> suspects = f.suspects();
  const bool refused = f.record.contains("details") && f.record["details"].contains("refused");
  std::vector<Diagnosis> out;
  for (const DebugSkill& skill : debug_skills()) {
    bool match = skill.matches ? skill.matches(f) : false;
    if (!skill.stages.empty() && f.phase >= 1 && f.phase <= 6 && !refused && numbers_failed(f)) {
      // A record that names stages picks the skills for them; one that names none (phases
      // 3 and later, a bisect without a verdict) runs every stage skill.
      match = suspects.empty() ||
              std::any_of(skill.stages.begin(), skill.stages.end(), [&](Stage s) { return suspects.count(s) > 0; });
    }
    if (!match) continue;
    ctx.progress(fmt::format("[diagnose] {}", skill.name));
    Diagnosis d{skill.name, skill.symptom, skill.where, {}};
    try {
      d.hypotheses = skill.run(ctx, f);
    } catch (const Error& e) {
      d.hypotheses.push_back({"the experiment itself", "experiment failed", "ruled out", e.what()});
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::string diagnoses_markdown(const std::vector<Diagnosis>& ds) {
  std::vector<std::string> causes, reported;
  auto add = [](std::vector<std::string>& to, const std::vector<std::string>& from) {
    for (const std::string& c : from)
      if (std::find(to.begin(), to.end(), c) == to.end()) to.push_back(c);
  };
  for (const Diagnosis& d : ds) {
    add(causes, d.confirmed_causes());
    add(reported, d.reported_causes());
  }
  std::string md;
  if (!causes.empty()) md += fmt::format("Named cause(s): {}\n", fmt::join(causes, "; "));
  // Read from the failure's own text (a refusal code, an evaluator finding), not shown by an experiment.
  if (!reported.empty()) md += fmt::format("Reported cause(s): {}\n", fmt::join(reported, "; "));
  if (md.empty()) md = "Debug skills ran; no hypothesis was confirmed (see the tables).\n";
  for (const Diagnosis& d : ds) md += "\n" + d.markdown();
  return md;
}

}  // namespace tessera
