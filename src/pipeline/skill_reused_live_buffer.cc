// Debug skill reused-live-buffer: inside one dispatch call a stage computes right by itself
// yet wrong in the pass, because another buffer of the dispatch took the bytes of one of its
// inputs before the stage read them (intermediate reuse with a live range cut short).
#include <fmt/format.h>

#include <functional>

#include "model/tensors.h"
#include "pipeline/skill_support.h"

namespace tessera {

std::vector<Hypothesis> reused_live_buffer(PhaseContext& ctx, const Failure&) {
  const ModelSpec& s = ctx.model.spec();
  const Acts a = layer0_acts(ctx);
  const int64_t H = s.hidden, I = s.intermediate;
  const double match = gates::threshold("diagnose.match_nmse_max"), sep = gates::threshold("diagnose.separation_min");
  std::unique_ptr<StagedRunner> t = ctx.fresh_target();
  auto f32 = [&](const std::string& n) {
    const Weight* w = ctx.model.find(layer_tensor(0, n));
    return w ? w->to_f32() : std::vector<float>{};
  };
  const std::string wo = layer_tensor(0, "self_attn.o_proj.weight"), wg = layer_tensor(0, "mlp.gate_proj.weight"),
                    wu = layer_tensor(0, "mlp.up_proj.weight"), wd = layer_tensor(0, "mlp.down_proj.weight");
  const std::vector<float> bo = f32("self_attn.o_proj.bias"), bg = f32("mlp.gate_proj.bias"),
                           bu = f32("mlp.up_proj.bias"), bd = f32("mlp.down_proj.bias");
  std::vector<Hypothesis> out;
  for (const int64_t T : {a.T, int64_t(1)}) {
    // Layer 0 in a pass: every output as the pass left it.
    std::map<std::string, std::vector<float>> p;
    const int64_t off = (a.T - T) * H;
    const std::vector<float>& embed = a.probe.at("embed");
    std::vector<float> h(embed.begin() + off, embed.begin() + off + T * H);
    p["in"] = h;
    t->reset(T == 1 ? a.T : 0);  // a decode step: one row after a cached prompt's worth of positions
    t->forward_layers(h.data(), T, 1, [&](const std::string& name, const float* d, int64_t rows, int64_t cols) {
      if (name.starts_with("layers.0.")) p[name.substr(9)].assign(d, d + rows * cols);
    }, ProbeLevel::All);
    // Each consumer again by itself (its kernel alone: every buffer its own, synced) on the
    // inputs the pass gave it; the first one that disagrees read something else in the pass.
    using Outs = std::vector<std::vector<float>>;
    struct Consumer {
      Stage stage;
      std::vector<std::string> outs;
      std::function<Outs()> alone;
    };
    auto linear = [&](Stage st, const std::string& x, const std::string& w, const std::vector<float>& b, int64_t n) {
      std::vector<float> y(size_t(T * n));
      t->op_linear(st, p.at(x).data(), T, w, b, y.data());
      return y;
    };
    const std::vector<Consumer> consumers = {
        {Stage::OProj, {"o_proj"}, [&] { return Outs{linear(Stage::OProj, "attn", wo, bo, H)}; }},
        {Stage::AttnResidual, {"attn_residual"}, [&] {
           std::vector<float> acc = p.at("in");
           t->op_add(Stage::AttnResidual, acc.data(), p.at("o_proj").data(), T);
           return Outs{acc};
         }},
        {Stage::MlpNorm, {"mlp_norm"}, [&] {
           std::vector<float> y(size_t(T * H));
           t->op_rmsnorm(Stage::MlpNorm, 0, p.at("attn_residual").data(), T, y.data());
           return Outs{y};
         }},
        {Stage::GateUpProj, {"gate", "up"}, [&] {
           std::vector<float> g(size_t(T * I)), u(size_t(T * I));
           const StagedRunner::LinearOut lo[] = {{wg, bg.empty() ? nullptr : bg.data(), g.data()},
                                                 {wu, bu.empty() ? nullptr : bu.data(), u.data()}};
           t->op_linears(Stage::GateUpProj, p.at("mlp_norm").data(), T, lo);
           return Outs{g, u};
         }},
        {Stage::SiluMul, {"act"}, [&] {
           std::vector<float> y(size_t(T * I));
           t->op_silu_mul(p.at("gate").data(), p.at("up").data(), T, y.data());
           return Outs{y};
         }},
        {Stage::DownProj, {"down"}, [&] { return Outs{linear(Stage::DownProj, "act", wd, bd, H)}; }},
    };
    const std::string pass = T == 1 ? "decode steps" : "prefill calls";
    std::string evidence;
    const Consumer* first = nullptr;
    double worst = 0;
    for (const Consumer& c : consumers) {
      bool have = true;
      for (const std::string& o : c.outs) have &= p.count(o) > 0;
      if (!have) continue;
      const Outs alone = c.alone();
      double d = 0;
      for (size_t i = 0; i < c.outs.size(); ++i) d = std::max(d, nmse(alone[i], p.at(c.outs[i])));
      evidence += fmt::format("{}{} {:.3g}", evidence.empty() ? "" : ", ", stage_name(c.stage), d);
      if (!first && d >= sep * match) first = &c, worst = d;
    }
    t->reset();
    if (evidence.empty()) {
      out.push_back(not_applicable(pass + ": an intermediate reused while still live", "reuse-while-live",
                                   "the forward pass exposes none of the layer's intermediates"));
      continue;
    }
    // Which of the consumer's inputs the target let another buffer overwrite while live.
    const std::string where = first ? t->shared_memory(first->stage, T) : "";
    Hypothesis hyp{fmt::format("{}: {} reads an input that another buffer of its dispatch overwrote before the read (an "
                               "intermediate reused while still live{})",
                               pass, first ? stage_name(first->stage) : "a stage", where.empty() ? "" : ": " + where),
                   "reuse-while-live", "", ""};
    hyp.evidence = fmt::format("NMSE of each stage in the pass against its kernel alone on the pass's own inputs: {}{}",
                               evidence,
                               !first            ? "; every stage agrees"
                               : where.empty()   ? fmt::format("; {} disagrees ({:.3g}), but the target shares no bytes "
                                                               "between its inputs and a buffer written while they live",
                                                               stage_name(first->stage), worst)
                                                 : "");
    hyp.verdict = first && !where.empty() ? "confirmed" : "ruled out";
    out.push_back(hyp);
  }
  return out;
}

}  // namespace tessera
